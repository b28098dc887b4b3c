//! Sweeps and previews: each entity's work for one tenant (or the
//! tenantless entities) at a logical time.

use chrono::{DateTime, Utc};

use super::counts::{counts, outcome};
use super::executor::execute;
use super::resolve::{check_now, rule_for, tenant_keys};
use super::work::{Arg, RunParam, RunSpec, Work};
use super::{failure, PreviewRequest, PreviewResult, RunKind, SweepRequest, SweepResult};
use crate::context::{Context, Prepared};
use crate::diagnostic::Diagnostic;
use crate::error::Result;
use crate::model::EntityDescriptor;
use crate::rules::RetentionRule;
use crate::sql::{KeyValue, RunValue};

/// The sweep's work for one entity.
fn sweep_work<'a>(
    ready: &Prepared,
    e: &'a EntityDescriptor,
    rule: RetentionRule,
    now: DateTime<Utc>,
    tenant: Option<&KeyValue>,
    batch_size: i64,
) -> std::result::Result<Work<'a>, Diagnostic> {
    let cutoff = rule
        .sweep_cutoff(now)
        .map_err(|err| Diagnostic::capture("rule", Some("cutoff_out_of_range".into()), &err))?;
    let plan = &ready.plans[&e.id];
    let strategy = rule.strategy();
    let tenant_arg: Vec<Arg> = tenant.cloned().map(Arg::Key).into_iter().collect();
    let mut lock_args = vec![Arg::Time(cutoff), Arg::Int8(batch_size)];
    lock_args.extend(tenant_arg.iter().cloned());
    let mut count_args = vec![Arg::Time(cutoff)];
    count_args.extend(tenant_arg.iter().cloned());
    // The mutation re-checks the cutoff and the tenant the candidates were chosen by.
    let mut mutate_args = vec![Arg::Time(cutoff)];
    mutate_args.extend(tenant_arg);
    Ok(Work {
        entity: e,
        cutoff: Some(cutoff),
        lock: plan.lock.get(&strategy).cloned().unwrap_or_default(),
        lock_after: plan.lock_after.get(&strategy).cloned(),
        cursor_anchor: true,
        lock_args,
        mutate: plan.mutate.get(&strategy).cloned().unwrap_or_default(),
        mutate_count: plan.mutate_count.get(&strategy).cloned(),
        mutate_audited: plan.mutate_audited.get(&strategy).cloned(),
        mutate_args,
        literals: render_literals(plan, e, now, tenant.map(|t| t.canonical()).as_deref()),
        counts: plan.counts[&strategy].clone(),
        counts_after: plan.counts_after.get(&strategy).cloned(),
        count_args,
        rule,
    })
}

/// The plan's values computed once per run: literal templates rendered
/// (validated, so a template always renders) and per-run anonymisers
/// called, once each.
pub(super) fn render_literals(
    plan: &crate::sql::EntityPlan,
    e: &crate::model::EntityDescriptor,
    now: DateTime<Utc>,
    tenant: Option<&str>,
) -> Vec<RunParam> {
    plan.literals
        .iter()
        .map(|v| match v {
            RunValue::Template(t) => RunParam::Text(
                crate::model::render_literal(t, now, tenant).unwrap_or_else(|_| t.clone()),
            ),
            RunValue::PerRun(column, anonymiser) => {
                let cx = crate::model::AnonymiseContext {
                    entity: &e.name,
                    entity_id: e.id,
                    column,
                    tenant,
                    now,
                    record_id: None,
                };
                let value = anonymiser.once(&cx).expect("a per-run anonymiser");
                let mut object = serde_json::Map::new();
                object.insert(column.clone(), value.into_json());
                RunParam::Json(serde_json::Value::Object(object))
            }
        })
        .collect()
}

pub(crate) async fn preview(cx: &Context, req: PreviewRequest) -> Result<PreviewResult> {
    let ready = cx.prepared().await?;
    let pass = tenant_keys(&ready, req.tenant.as_deref())?;
    let facts = ready.tenant_facts(
        pass.tenant.as_deref(),
        req.jurisdiction.as_deref(),
        req.tags.as_deref(),
    )?;
    let mut conn = cx.pool.acquire().await?;
    let mut result = PreviewResult {
        tenant: pass.tenant.clone(),
        entities: Vec::new(),
        failures: Vec::new(),
    };
    let batch = i64::from(cx.config.sweep_batch_size);
    for e in pass.entities {
        let work = match rule_for(cx, &ready, e, result.tenant.as_deref(), &facts, req.now)
            .await
            .and_then(|rule| sweep_work(&ready, e, rule, req.now, pass.keys.get(&e.id), batch))
        {
            Ok(w) => w,
            Err(d) => {
                result.failures.push(failure(e.id, &e.name, &d));
                continue;
            }
        };
        let c = counts(&mut conn, &work).await?;
        let mut o = outcome(&work);
        o.affected = if work.rule.strategy().mutates() {
            c.eligible
        } else {
            0
        };
        o.held = c.held;
        o.held_by_subject = c.held_by_subject;
        o.null_anchor = c.null_anchor;
        o.skipped = c.skipped;
        o.kept_by_legal_min = c.kept_by_legal_min;
        if !work.rule.strategy().mutates() {
            o.kept_by_policy = c.eligible;
        }
        result.entities.push(o);
    }
    Ok(result)
}

pub(crate) async fn sweep(cx: &Context, req: SweepRequest) -> Result<SweepResult> {
    let ready = cx.prepared().await?;
    check_now(cx, req.now, !req.dry_run, req.allow_future_now).await?;
    let pass = tenant_keys(&ready, req.tenant.as_deref())?;
    let facts = ready.tenant_facts(
        pass.tenant.as_deref(),
        req.jurisdiction.as_deref(),
        req.tags.as_deref(),
    )?;
    let batch = i64::from(cx.config.sweep_batch_size);
    let mut works = Vec::new();
    for e in &pass.entities {
        let work = rule_for(cx, &ready, e, pass.tenant.as_deref(), &facts, req.now)
            .await
            .and_then(|rule| sweep_work(&ready, e, rule, req.now, pass.keys.get(&e.id), batch))
            .map_err(|d| failure(e.id, &e.name, &d));
        works.push(work);
    }
    execute(
        cx,
        &ready,
        RunSpec {
            erasure_kind: None,
            kind: RunKind::Sweep,
            trigger: req.trigger,
            dry_run: req.dry_run,
            tenant: pass.tenant,
            now: req.now,
            cancel: req.cancel,
            occurrence: req.occurrence,
        },
        works,
    )
    .await
}
