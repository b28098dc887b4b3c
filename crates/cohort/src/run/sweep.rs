//! Sweeps and previews: each entity's work for one tenant (or the
//! tenantless entities) at a logical time.

use chrono::{DateTime, Utc};

use super::counts::{counts, kept_for_good, outcome};
use super::executor::execute;
use super::resolve::{check_now, pass_of, rule_for};
use super::work::{RunSpec, Work};
use super::{failure, PreviewRequest, PreviewResult, RunKind, SweepRequest, SweepResult};
use crate::base::diagnostic::Diagnostic;
use crate::context::{Prepared, Ready};
use crate::domain::model::EntityDescriptor;
use crate::domain::rules::RetentionRule;
use crate::error::Result;
use crate::sql::{KeyValue, RunParam, RunValue, Scope};

/// The sweep's work for one entity: one per stage of its rule (one for a
/// rule without stages), in stage order, so a run does each stage after the
/// ones before it. A stage measured from the entity's anchor uses the
/// entity's statements and its rule's cutoff (the legal minimum included);
/// a stage measured from the previous stage's marker uses the statements
/// planned on that marker, with the legal minimum as a floor on the
/// entity's own anchor.
fn entity_works<'a>(
    ready: &'a Prepared,
    e: &'a EntityDescriptor,
    rule: RetentionRule,
    now: DateTime<Utc>,
    tenant: Option<&KeyValue>,
    (batch_size, parallelism): (i64, u32),
) -> Vec<std::result::Result<Work<'a>, Diagnostic>> {
    let stages = rule.later_stages().len() + 1;
    (1..=stages)
        .map(|n| stage_of(ready, e, &rule, n, now, tenant, (batch_size, parallelism)))
        .collect()
}

/// A rule's stage `n` (1 first) as work: refused when the category does
/// not declare its strategy, a `{tenant}` literal does not fit, or its
/// cutoff is out of range.
fn stage_of<'a>(
    ready: &'a Prepared,
    e: &'a EntityDescriptor,
    rule: &RetentionRule,
    n: usize,
    now: DateTime<Utc>,
    tenant: Option<&KeyValue>,
    sizes: (i64, u32),
) -> std::result::Result<Work<'a>, Diagnostic> {
    let out_of_range = |err: crate::domain::rules::CutoffOutOfRange| {
        Diagnostic::capture("rule", Some("cutoff_out_of_range".into()), &err)
    };
    let undeclared = |what: String| {
        Diagnostic::capture(
            "rule",
            Some("undeclared_strategy".into()),
            &format!(
                "category {:?} resolved to {what}, which it does not declare",
                e.category
            ),
        )
    };
    let stage = rule.stage(n).expect("within the stages");
    let strategy = stage.strategy();
    if !ready.model.capabilities[&e.id].allows(strategy) {
        return Err(undeclared(format!("a {strategy} stage")));
    }
    literal_fits(ready, e, strategy, tenant)?;
    // A rule without stages is its own single stage, unnumbered.
    let position = rule.is_staged().then_some(n as u16);
    let Some((crate::domain::rules::StageAnchor::Previous, previous)) = rule.stage_anchor(n) else {
        let cutoff = stage.sweep_cutoff(now).map_err(out_of_range)?;
        let by_period = crate::domain::rules::cutoff(now, stage.period()).map_err(out_of_range)?;
        let plan = &ready.plans[&e.id];
        let bounds = (cutoff, None);
        let mut work = stage_work(plan, e, stage, bounds, position, now, tenant, sizes);
        work.period_cutoff = (by_period > cutoff).then_some(by_period);
        return Ok(work);
    };
    let Some((staged, plan)) = ready.stage_plans.get(&(e.id, strategy, previous)) else {
        return Err(undeclared(format!(
            "a {strategy} stage measured from the {previous} stage's marker"
        )));
    };
    // The same-run rule: the previous stage marks the rows it changes in
    // this run with `now` itself (the run's clock, bound into its
    // statement), and this stage takes only markers strictly before its
    // cutoff, which is never after `now`: a row marked in this run is
    // never taken by a later stage of the same run, however far `now` is
    // from the database clock.
    let cutoff = crate::domain::rules::cutoff(now, stage.period())
        .map_err(out_of_range)?
        .min(now);
    let floor = stage.erasure_cutoff(now).map_err(out_of_range)?;
    let bounds = (cutoff, Some(floor));
    let mut work = stage_work(plan, staged, stage, bounds, position, now, tenant, sizes);
    work.period_cutoff = floor.is_some().then_some(cutoff);
    Ok(work)
}

/// Refuses, before any batch, an anonymisation whose `{tenant}` literal
/// this tenant's id makes longer than its column holds (validation
/// refuses it for the tenants of the directory; a tenant found at run
/// time is checked here): `kind=rule code=literal_too_long`, instead of
/// every batch failing with SQLSTATE 22001.
pub(super) fn literal_fits(
    ready: &Prepared,
    e: &EntityDescriptor,
    strategy: crate::domain::rules::Strategy,
    tenant: Option<&KeyValue>,
) -> std::result::Result<(), Diagnostic> {
    let Some(tenant) = tenant else {
        return Ok(());
    };
    if !crate::validate::ValidatedModel::writes_literals(e, strategy) {
        return Ok(());
    }
    match ready.model.facts[&e.id].literal_misfit(&tenant.canonical()) {
        Some(why) => Err(Diagnostic::capture(
            "rule",
            Some("literal_too_long".into()),
            &format!("{}: {why}", e.name),
        )),
        None => Ok(()),
    }
}

/// One stage's work: the plan's statements for the rule's strategy, bound
/// to the cutoff, the tenant and, for a stage measured from a marker, the
/// legal minimum's floor (`Some(None)`: that stage has no floor).
#[allow(clippy::too_many_arguments)]
fn stage_work<'a>(
    plan: &crate::sql::EntityPlan,
    e: &'a EntityDescriptor,
    rule: RetentionRule,
    (cutoff, floor): (DateTime<Utc>, Option<Option<DateTime<Utc>>>),
    stage: Option<u16>,
    now: DateTime<Utc>,
    tenant: Option<&KeyValue>,
    (batch_size, parallelism): (i64, u32),
) -> Work<'a> {
    let strategy = rule.strategy();
    Work {
        entity: e,
        stage,
        cutoff: Some(cutoff),
        period_cutoff: None,
        statements: plan
            .statements(strategy)
            .cloned()
            .expect("checked: the category declares the strategy"),
        scope: Scope::Sweep {
            cutoff,
            tenant: tenant.cloned(),
            floor,
        },
        batch_size,
        auto_batch: false,
        parallelism,
        literals: render_literals(plan, e, now, tenant.map(|t| t.canonical()).as_deref()),
        rule,
    }
}

/// The plan's values computed once per run: literal templates rendered
/// (validated, so a template always renders) and per-run anonymisers
/// called, once each.
pub(super) fn render_literals(
    plan: &crate::sql::EntityPlan,
    e: &crate::domain::model::EntityDescriptor,
    now: DateTime<Utc>,
    tenant: Option<&str>,
) -> Vec<RunParam> {
    plan.values
        .literals
        .iter()
        .map(|v| match v {
            RunValue::Template(t) => RunParam::Text(
                crate::domain::model::render_literal(t, now, tenant).unwrap_or_else(|_| t.clone()),
            ),
            RunValue::PerRun(column, anonymiser) => {
                let cx = crate::domain::model::AnonymiseContext {
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

pub(crate) async fn preview(cx: &Ready<'_>, req: PreviewRequest) -> Result<PreviewResult> {
    let ready = cx.plans();
    let (pass, facts) = pass_of(ready, &req.tenancy)?;
    let mut conn = cx.pool.acquire().await?;
    let mut result = PreviewResult {
        tenant: pass.tenant.clone(),
        entities: Vec::new(),
        failures: Vec::new(),
    };
    let batch = i64::from(cx.config.sweep_batch_size.first());
    for e in pass.entities {
        let works = match rule_for(cx, ready, e, result.tenant.as_deref(), &facts, req.now).await {
            Ok(rule) => entity_works(ready, e, rule, req.now, pass.keys.get(&e.id), (batch, 1)),
            Err(d) => vec![Err(d)],
        };
        for work in works {
            let work = match work {
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
            let partitions =
                super::partitions::preview_note(cx, &mut conn, &work, result.tenant.is_some())
                    .await?;
            let notes: Vec<String> = kept_for_good(ready, &work, o.skipped)
                .into_iter()
                .chain(partitions)
                .collect();
            o.note = (!notes.is_empty()).then(|| notes.join("; "));
            o.kept_by_legal_min = c.kept_by_legal_min;
            if !work.rule.strategy().mutates() {
                o.kept_by_policy = c.eligible;
            }
            result.entities.push(o);
        }
    }
    Ok(result)
}

pub(crate) async fn sweep(cx: &Ready<'_>, req: SweepRequest) -> Result<SweepResult> {
    let ready = cx.plans();
    check_now(cx, req.now, !req.dry_run, req.allow_future_now).await?;
    let (pass, facts) = pass_of(ready, &req.tenancy)?;
    if !req.dry_run {
        if let Some(refused) =
            crate::validate::hash_key_missing(&cx.config, pass.entities.iter().copied())
        {
            return Err(refused);
        }
    }
    let batch = i64::from(cx.config.sweep_batch_size.first());
    let mut works = Vec::new();
    for e in &pass.entities {
        // The entity's own parallelism wins over the global one.
        let lanes = e.sweep_parallelism.unwrap_or(cx.config.sweep_parallelism);
        match rule_for(cx, ready, e, pass.tenant.as_deref(), &facts, req.now).await {
            Ok(rule) => works.extend(
                entity_works(
                    ready,
                    e,
                    rule,
                    req.now,
                    pass.keys.get(&e.id),
                    (batch, lanes),
                )
                .into_iter()
                .map(|w| {
                    w.map(|w| Work {
                        auto_batch: cx.config.sweep_batch_size.is_auto(),
                        ..w
                    })
                    .map_err(|d| failure(e.id, &e.name, &d))
                }),
            ),
            Err(d) => works.push(Err(failure(e.id, &e.name, &d))),
        }
    }
    execute(
        cx,
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

/// Each entity's backlog in one pass (a tenant, or the tenantless
/// entities) as of `req.now`: its rule's cutoff and one indexed read of its
/// oldest still-eligible row per stage. Nothing is written. An entity whose
/// rule cannot be resolved is left out (a sweep reports it as a failure).
pub(crate) async fn backlog(
    cx: &Ready<'_>,
    req: PreviewRequest,
) -> Result<Vec<crate::domain::telemetry::EntityBacklog>> {
    let ready = cx.plans();
    let (pass, facts) = pass_of(ready, &req.tenancy)?;
    let mut conn = cx.pool.acquire().await?;
    let batch = i64::from(cx.config.sweep_batch_size.first());
    let mut out = Vec::new();
    for e in pass.entities {
        let Ok(rule) = rule_for(cx, ready, e, pass.tenant.as_deref(), &facts, req.now).await else {
            continue;
        };
        let mut worst = crate::domain::telemetry::EntityBacklog {
            entity: e.name.clone(),
            age_seconds: 0.0,
            oldest: None,
            tenant: None,
        };
        for work in entity_works(ready, e, rule, req.now, pass.keys.get(&e.id), (batch, 1))
            .into_iter()
            .flatten()
        {
            let Some(cutoff) = work.cutoff else {
                continue;
            };
            let oldest = super::counts::oldest_eligible(&mut conn, &work).await?;
            let age = crate::domain::telemetry::backlog_age(cutoff, oldest);
            if oldest.is_some() && (worst.oldest.is_none() || age > worst.age_seconds) {
                worst.age_seconds = age;
                worst.oldest = oldest;
                worst.tenant = pass.tenant.clone();
            }
        }
        out.push(worst);
    }
    Ok(out)
}
