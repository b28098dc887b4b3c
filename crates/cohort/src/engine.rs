//! The retention engine (private; the public surface is [`Cohort::sweep`],
//! [`Cohort::preview`] and [`Cohort::erase`]).
//!
//! Run model, shared by sweeps and erasure: every entity's rule is resolved
//! for the tenant and logical time and checked against the category's
//! declared strategies; the run's advisory lock is taken on a dedicated
//! connection and the `Started` row is committed before any mutation;
//! entities are processed dependents first; batches of `sweep_batch_size`
//! rows are locked, mutated and audited in one transaction each; the run
//! settles `Succeeded`, `PartiallyFailed`, `Failed` or `Cancelled`. One
//! entity's failure is recorded (sanitised) and the run goes on. A batch
//! that changes nothing ends that entity's loop, so no loop can spin.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgConnection, Postgres, Row};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::audit::AuditEvent;
use crate::cohort::{Cohort, Ready};
use crate::diagnostic::Diagnostic;
use crate::error::{Error, Result};
use crate::ident::SqlText;
use crate::model::EntityDescriptor;
use crate::rules::{ResolutionContext, ResolveError, RetentionRule, Strategy, TenantContext};
use crate::run::{
    failure, EntityFailure, EntityOutcome, PreviewRequest, RunKind, RunStatus, SweepRequest,
    SweepResult, Trigger,
};
use crate::sql::plan::EntityPlan;
use crate::sql::{bind_array, KeyValue};
use crate::AuditDetail;

/// Results of a preview: counts only, nothing written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PreviewResult {
    /// The tenant previewed, or `None` for the tenantless entities.
    pub tenant: Option<String>,
    /// Per-entity counts; `affected` is what a sweep would change now.
    pub entities: Vec<EntityOutcome>,
    /// Entities whose rule could not be resolved.
    pub failures: Vec<EntityFailure>,
}

/// A bound value of a planned statement.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    Key(KeyValue),
    Time(DateTime<Utc>),
    Int8(i64),
}

impl Arg {
    fn bind<'q>(&self, q: Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> {
        match self {
            Arg::Key(k) => k.bind(q),
            Arg::Time(t) => q.bind(*t),
            Arg::Int8(n) => q.bind(*n),
        }
    }
}

fn bind_all<'q>(
    mut q: Query<'q, Postgres, PgArguments>,
    args: &[Arg],
) -> Query<'q, Postgres, PgArguments> {
    for a in args {
        q = a.bind(q);
    }
    q
}

/// One entity's share of a run: its rule and the statements to run.
/// Every statement takes the entity id as `$1`.
pub(crate) struct Work<'a> {
    pub(crate) entity: &'a EntityDescriptor,
    pub(crate) rule: RetentionRule,
    /// The cutoff reported and stored (`None`: erasure without a legal minimum).
    pub(crate) cutoff: Option<DateTime<Utc>>,
    /// Locks a batch; returns record keys.
    pub(crate) lock: SqlText,
    pub(crate) lock_args: Vec<Arg>,
    /// Mutates locked rows; binds keys, literals, custom values, then `mutate_args`.
    pub(crate) mutate: SqlText,
    pub(crate) mutate_args: Vec<Arg>,
    /// Returns `eligible`, `held`, `null_anchor`.
    pub(crate) counts: SqlText,
    pub(crate) count_args: Vec<Arg>,
}

/// The entities of one pass with their canonical tenant keys.
pub(crate) struct Pass<'a> {
    pub(crate) entities: Vec<&'a EntityDescriptor>,
    pub(crate) keys: BTreeMap<Uuid, KeyValue>,
    /// The tenant's canonical text (as stored in the ledger).
    pub(crate) tenant: Option<String>,
}

/// Canonical tenant keys per entity of the pass, checked before anything
/// is written. The tenant is canonicalised once, by the tenant columns' type
/// (validation makes them agree): uuid spellings become one uuid, text is
/// kept exactly as written, citext is compared case-insensitively.
pub(crate) fn tenant_keys<'a>(ready: &'a Ready, tenant: Option<&str>) -> Result<Pass<'a>> {
    let entities: Vec<&EntityDescriptor> = ready
        .model
        .ordered()
        .filter(|e| e.tenant.is_some() == tenant.is_some())
        .collect();
    let mut keys = BTreeMap::new();
    let canonical = match (tenant, ready.model.tenant_key) {
        (Some(t), Some(ty)) => Some(
            ty.parse(t)
                .map_err(|msg| Error::InvalidInput(format!("tenant: {msg}")))?
                .canonical(),
        ),
        (Some(t), None) => Some(t.to_owned()),
        (None, _) => None,
    };
    if let Some(t) = tenant {
        for e in &entities {
            let ty = ready.model.facts[&e.id].tenant.expect("tenanted entity");
            let key = ty
                .parse(t)
                .map_err(|msg| Error::InvalidInput(format!("tenant for {}: {msg}", e.name)))?;
            keys.insert(e.id, key);
        }
    }
    Ok(Pass {
        entities,
        keys,
        tenant: canonical,
    })
}

/// Resolves and checks the rule of one entity; a sanitised failure otherwise.
pub(crate) async fn rule_for(
    cohort: &Cohort,
    ready: &Ready,
    e: &EntityDescriptor,
    tenant: Option<&str>,
    jurisdiction: Option<&str>,
    now: DateTime<Utc>,
) -> std::result::Result<RetentionRule, Diagnostic> {
    let mut tenant_ctx = match tenant {
        Some(t) => TenantContext::tenant(t).with_identity(ready.model.tenant_identity()),
        None => TenantContext::tenantless(),
    };
    if let Some(j) = jurisdiction {
        tenant_ctx = tenant_ctx.with_jurisdiction(j);
    }
    let ctx = ResolutionContext::new(&e.category, tenant_ctx, now);
    let rule = cohort.inner().rules.resolve(&ctx).await.map_err(|err| {
        let code = match &err {
            ResolveError::UnknownCategory(_) => "unknown_category",
            ResolveError::AliasCycle(_) => "alias_cycle",
            _ => "provider_error",
        };
        Diagnostic::capture("rule", Some(code.into()), &err)
    })?;
    let allowed = ready
        .model
        .capabilities
        .get(&e.id)
        .is_some_and(|c| c.allows(rule.strategy()));
    if !allowed {
        return Err(Diagnostic::capture(
            "rule",
            Some("undeclared_strategy".into()),
            &format!(
                "category {:?} resolved to {} which it does not declare",
                e.category,
                rule.strategy()
            ),
        ));
    }
    Ok(rule)
}

/// The sweep's work for one entity.
fn sweep_work<'a>(
    ready: &Ready,
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
        lock_args,
        mutate: plan.mutate.get(&strategy).cloned().unwrap_or_default(),
        mutate_args,
        counts: plan.counts[&strategy].clone(),
        count_args,
        rule,
    })
}

pub(crate) struct Counts {
    pub(crate) eligible: u64,
    pub(crate) held: u64,
    pub(crate) null_anchor: u64,
    /// Past the cutoff, not held, but still referenced by other rows
    /// through a NO ACTION / RESTRICT foreign key (purge leaves them).
    pub(crate) skipped: u64,
    /// Erasure: kept because the legal minimum has not passed.
    pub(crate) kept_by_legal_min: u64,
}

pub(crate) async fn counts(
    conn: &mut PgConnection,
    work: &Work<'_>,
) -> std::result::Result<Counts, sqlx::Error> {
    let q = bind_all(
        sqlx::query(work.counts.sql()).bind(work.entity.id),
        &work.count_args,
    );
    let row = q.fetch_one(conn).await?;
    let n = |name: &str| -> std::result::Result<u64, sqlx::Error> {
        Ok(row.try_get::<i64, _>(name)?.max(0) as u64)
    };
    Ok(Counts {
        eligible: n("eligible")?,
        held: n("held")?,
        null_anchor: n("null_anchor")?,
        skipped: n("skipped")?,
        kept_by_legal_min: n("kept_by_legal_min")?,
    })
}

pub(crate) fn outcome(work: &Work<'_>) -> EntityOutcome {
    let e = work.entity;
    EntityOutcome {
        entity_id: e.id,
        entity: e.name.clone(),
        category: e.category.clone(),
        strategy: work.rule.strategy(),
        affected: 0,
        held: 0,
        skipped: 0,
        null_anchor: 0,
        kept_by_legal_min: 0,
        kept_by_policy: 0,
        cutoff: work.cutoff,
        period: work.rule.period(),
        legal_min: work.rule.legal_min(),
    }
}

pub(crate) async fn preview(cohort: &Cohort, req: PreviewRequest) -> Result<PreviewResult> {
    let ready = cohort.prepared().await?;
    let pass = tenant_keys(&ready, req.tenant.as_deref())?;
    let jurisdiction = ready.jurisdiction(pass.tenant.as_deref(), req.jurisdiction.as_deref())?;
    let mut conn = cohort.inner().pool.acquire().await?;
    let mut result = PreviewResult {
        tenant: pass.tenant.clone(),
        entities: Vec::new(),
        failures: Vec::new(),
    };
    let batch = i64::from(cohort.inner().config.sweep_batch_size);
    for e in pass.entities {
        let work = match rule_for(
            cohort,
            &ready,
            e,
            result.tenant.as_deref(),
            jurisdiction.as_deref(),
            req.now,
        )
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

pub(crate) async fn sweep(cohort: &Cohort, req: SweepRequest) -> Result<SweepResult> {
    let ready = cohort.prepared().await?;
    let pass = tenant_keys(&ready, req.tenant.as_deref())?;
    let jurisdiction = ready.jurisdiction(pass.tenant.as_deref(), req.jurisdiction.as_deref())?;
    let batch = i64::from(cohort.inner().config.sweep_batch_size);
    let mut works = Vec::new();
    for e in &pass.entities {
        let work = rule_for(
            cohort,
            &ready,
            e,
            pass.tenant.as_deref(),
            jurisdiction.as_deref(),
            req.now,
        )
        .await
        .and_then(|rule| sweep_work(&ready, e, rule, req.now, pass.keys.get(&e.id), batch))
        .map_err(|d| failure(e.id, &e.name, &d));
        works.push(work);
    }
    execute(
        cohort,
        &ready,
        RunSpec {
            kind: RunKind::Sweep,
            trigger: req.trigger,
            dry_run: req.dry_run,
            tenant: pass.tenant,
            now: req.now,
            cancel: req.cancel,
        },
        works,
    )
    .await
}

/// What a run is, apart from its entities.
pub(crate) struct RunSpec {
    pub(crate) kind: RunKind,
    pub(crate) trigger: Trigger,
    pub(crate) dry_run: bool,
    pub(crate) tenant: Option<String>,
    pub(crate) now: DateTime<Utc>,
    pub(crate) cancel: CancellationToken,
}

/// Why an entity stopped.
enum Stop {
    /// The entity failed; the run goes on.
    Entity(Diagnostic),
    /// Cancelled: the open batch was rolled back.
    Cancelled,
    /// The run cannot go on (its connection is gone).
    Run(sqlx::Error),
}

fn is_connection_error(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolClosed
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::Protocol(_)
    ) || e
        .as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c.starts_with("08") || c == "57P01")
}

fn stop_from(e: sqlx::Error) -> Stop {
    if is_connection_error(&e) {
        Stop::Run(e)
    } else {
        Stop::Entity(Diagnostic::from_sqlx(&e))
    }
}

struct RunCtx<'a> {
    cohort: &'a Cohort,
    ready: &'a Ready,
    run_id: Uuid,
    spec: &'a RunSpec,
}

/// Runs the works of one run: lock, Started, entities, settle.
pub(crate) async fn execute(
    cohort: &Cohort,
    ready: &Ready,
    spec: RunSpec,
    works: Vec<std::result::Result<Work<'_>, EntityFailure>>,
) -> Result<SweepResult> {
    let inner = cohort.inner();
    let run_id = Uuid::new_v4();
    let mut conn: PoolConnection<Postgres> = inner.pool.acquire().await?;
    sqlx::query("SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended($1, 0))")
        .bind(format!("cohort.run:{run_id}"))
        .execute(&mut *conn)
        .await?;
    let started = sqlx::query(ready.ledger.insert_run.sql())
        .bind(run_id)
        .bind(spec.kind.as_str())
        .bind(spec.trigger.as_str())
        .bind(spec.dry_run)
        .bind(spec.tenant.as_deref())
        .bind(spec.now)
        .fetch_one(&mut *conn)
        .await
        .and_then(|row| row.try_get::<DateTime<Utc>, _>("started_at"));
    let started_at = match started {
        Ok(at) => at,
        Err(e) => {
            release_run_lock(conn, run_id).await;
            return Err(e.into());
        }
    };
    inner.observers.emit(AuditEvent::Started {
        run_id,
        kind: spec.kind,
        dry_run: spec.dry_run,
        tenant: spec.tenant.clone(),
        now: spec.now,
    });

    let ctx = RunCtx {
        cohort,
        ready,
        run_id,
        spec: &spec,
    };
    let mut outcomes = Vec::new();
    let mut failures = Vec::new();
    let mut status = RunStatus::Succeeded;
    let mut run_error: Option<String> = None;
    for work in works {
        if spec.cancel.is_cancelled() {
            status = RunStatus::Cancelled;
            break;
        }
        let work = match work {
            Ok(w) => w,
            Err(f) => {
                failures.push(f);
                continue;
            }
        };
        let mut out = outcome(&work);
        let result = run_entity(&ctx, &mut conn, &work, &mut out).await;
        outcomes.push(out);
        match result {
            Ok(()) => {}
            Err(Stop::Entity(d)) => failures.push(failure(work.entity.id, &work.entity.name, &d)),
            Err(Stop::Cancelled) => {
                status = RunStatus::Cancelled;
                break;
            }
            Err(Stop::Run(err)) => {
                run_error = Some(Diagnostic::from_sqlx(&err).to_string());
                status = RunStatus::Failed;
                break;
            }
        }
    }
    if status == RunStatus::Succeeded && !failures.is_empty() {
        status = RunStatus::PartiallyFailed;
    }
    // Entity failures first ("entity <id>: <diagnostic>", read back by
    // `runs show`), then the run-level failure, if any.
    let mut parts: Vec<String> = failures
        .iter()
        .map(|f| format!("entity {}: {}", f.entity_id, f.error))
        .collect();
    parts.extend(run_error.map(|e| format!("run: {e}")));
    let error = (!parts.is_empty()).then(|| parts.join("; "));
    let settled = settle(cohort, ready, &mut conn, run_id, status, error.as_deref()).await;
    release_run_lock(conn, run_id).await;
    let settled_at = settled?;
    inner.observers.emit(AuditEvent::Settled { run_id, status });
    Ok(SweepResult {
        run_id,
        kind: spec.kind,
        trigger: spec.trigger,
        status,
        dry_run: spec.dry_run,
        tenant: spec.tenant,
        started_at,
        settled_at: Some(settled_at),
        entities: outcomes,
        failures,
        not_reached: Vec::new(),
    })
}

/// One entity: summary row, batches (unless dry run or exempt), direct
/// counts, final summary. `out` holds only committed work.
async fn run_entity(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    out: &mut EntityOutcome,
) -> std::result::Result<(), Stop> {
    let e = work.entity;
    let ledger = &ctx.ready.ledger;
    let strategy = work.rule.strategy();
    let split = |p: crate::rules::Period| {
        (
            (p.as_seconds() / 86_400) as i32,
            (p.as_seconds() % 86_400) as f64,
        )
    };
    let (period_days, period_secs) = split(work.rule.period());
    let legal = work.rule.legal_min().map(split);
    let summary_id: i64 = sqlx::query(ledger.insert_summary.sql())
        .bind(ctx.run_id)
        .bind(e.id)
        .bind(&e.name)
        .bind(&e.category)
        .bind(ctx.spec.tenant.as_deref())
        .bind(strategy.as_str())
        .bind(work.cutoff)
        .bind(period_days)
        .bind(period_secs)
        .bind(legal.map(|l| l.0))
        .bind(legal.map(|l| l.1).unwrap_or(0.0))
        .bind(work.rule.source())
        .bind(work.rule.reason())
        .fetch_one(&mut *conn)
        .await
        .map_err(stop_from)?
        .try_get("summary_id")
        .map_err(stop_from)?;

    let mut result = Ok(());
    if strategy.mutates() && !ctx.spec.dry_run {
        result = batches(ctx, conn, work, summary_id, out).await;
    }
    if matches!(result, Err(Stop::Run(_))) {
        return result;
    }
    // Held and NULL-anchor rows are measured directly, after the batches.
    let measured = counts(conn, work).await;
    let error = match &result {
        Err(Stop::Entity(d)) => Some(d.to_string()),
        Err(Stop::Cancelled) => Some("cancelled".to_string()),
        _ => None,
    };
    if let Ok(c) = &measured {
        out.held = c.held;
        out.null_anchor = c.null_anchor;
        out.skipped = c.skipped;
        out.kept_by_legal_min = c.kept_by_legal_min;
        if ctx.spec.dry_run && strategy.mutates() {
            out.affected = c.eligible;
        }
        if !strategy.mutates() {
            out.kept_by_policy = c.eligible;
        }
    }
    let finish = sqlx::query(ledger.finish_summary.sql())
        .bind(summary_id)
        .bind(out.affected as i64)
        .bind(out.held as i64)
        .bind(out.skipped as i64)
        .bind(out.null_anchor as i64)
        .bind(error)
        .bind(out.kept_by_legal_min as i64)
        .bind(out.kept_by_policy as i64)
        .execute(&mut *conn)
        .await;
    result?;
    measured.map_err(stop_from)?;
    finish.map_err(stop_from)?;
    ctx.cohort
        .inner()
        .observers
        .emit(AuditEvent::EntitySummary {
            run_id: ctx.run_id,
            entity_id: e.id,
            affected: out.affected,
            held: out.held,
            null_anchor: out.null_anchor,
        });
    Ok(())
}

async fn batches(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    summary_id: i64,
    out: &mut EntityOutcome,
) -> std::result::Result<(), Stop> {
    let e = work.entity;
    let plan = &ctx.ready.plans[&e.id];
    let strategy = work.rule.strategy();
    let key_type = ctx.ready.model.facts[&e.id].record;
    let cancel = &ctx.spec.cancel;
    loop {
        if cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED)
            .await
            .map_err(stop_from)?;
        let keys: Vec<KeyValue> =
            bind_all(sqlx::query(work.lock.sql()).bind(e.id), &work.lock_args)
                .fetch_all(&mut *tx)
                .await
                .map_err(stop_from)?
                .iter()
                .map(|row| key_type.decode(row, 0))
                .collect::<std::result::Result<_, _>>()
                .map_err(stop_from)?;
        if keys.is_empty() {
            tx.rollback().await.map_err(stop_from)?;
            return Ok(());
        }

        let custom = if strategy == Strategy::Anonymise && !plan.custom.is_empty() {
            Some(custom_values(&mut tx, plan, key_type, &keys).await?)
        } else {
            None
        };
        if cancel.is_cancelled() {
            tx.rollback().await.map_err(stop_from)?;
            return Err(Stop::Cancelled);
        }

        let mut mutate = sqlx::query(work.mutate.sql()).bind(e.id);
        let custom_json = match custom {
            Some((ordered_keys, values)) => {
                mutate = bind_array(mutate, key_type, &ordered_keys);
                Some(values)
            }
            None => {
                mutate = bind_array(mutate, key_type, &keys);
                None
            }
        };
        if strategy == Strategy::Anonymise {
            for literal in &plan.literals {
                mutate = mutate.bind(literal.clone());
            }
            if plan.hashes {
                let pads = ctx
                    .ready
                    .hash_pads
                    .as_ref()
                    .expect("validated: hashing needs a key");
                mutate = mutate.bind(pads.inner.clone()).bind(pads.outer.clone());
            }
        }
        if let Some(values) = custom_json {
            mutate = mutate.bind(values);
        }
        let changed: Vec<String> = bind_all(mutate, &work.mutate_args)
            .fetch_all(&mut *tx)
            .await
            .map_err(stop_from)?
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<std::result::Result<_, _>>()
            .map_err(stop_from)?;
        let n = changed.len() as u64;

        let ledger = &ctx.ready.ledger;
        sqlx::query(ledger.add_affected.sql())
            .bind(summary_id)
            .bind(n as i64)
            .execute(&mut *tx)
            .await
            .map_err(stop_from)?;
        let per_row = work.rule.audit() == AuditDetail::PerRow && n > 0;
        if per_row {
            sqlx::query(ledger.insert_details.sql())
                .bind(ctx.run_id)
                .bind(e.id)
                .bind(&e.name)
                .bind(ctx.spec.tenant.as_deref())
                .bind(strategy.as_str())
                .bind(&changed)
                .execute(&mut *tx)
                .await
                .map_err(stop_from)?;
        }
        if cancel.is_cancelled() {
            tx.rollback().await.map_err(stop_from)?;
            return Err(Stop::Cancelled);
        }
        tx.commit().await.map_err(stop_from)?;

        out.affected += n;
        let hub = &ctx.cohort.inner().observers;
        hub.emit(AuditEvent::EntityProgress {
            run_id: ctx.run_id,
            entity_id: e.id,
            strategy,
            batch: n,
            total: out.affected,
        });
        if per_row {
            hub.emit(AuditEvent::RowDetail {
                run_id: ctx.run_id,
                entity_id: e.id,
                tenant: ctx.spec.tenant.clone(),
                record_ids: changed,
                action: strategy,
            });
        }
        if n == 0 {
            // Locked rows all became held or changed: no progress, stop here.
            return Ok(());
        }
    }
}

/// Reads the locked rows and computes each custom anonymiser's value.
/// Returns the keys in row order and, per row, a JSON object of the new
/// values by column.
async fn custom_values(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    plan: &EntityPlan,
    key_type: crate::sql::KeyType,
    keys: &[KeyValue],
) -> std::result::Result<(Vec<KeyValue>, Vec<serde_json::Value>), Stop> {
    let rows = bind_array(sqlx::query(plan.load_rows.sql()), key_type, keys)
        .fetch_all(&mut **tx)
        .await
        .map_err(stop_from)?;
    let mut ordered = Vec::with_capacity(rows.len());
    let mut objects = Vec::with_capacity(rows.len());
    for row in &rows {
        ordered.push(key_type.decode(row, 0).map_err(stop_from)?);
        let mut object = serde_json::Map::new();
        for (column, anonymiser) in &plan.custom {
            let value = anonymiser.apply(row, column).map_err(|err| {
                Stop::Entity(Diagnostic::capture(
                    "anonymiser",
                    Some("decode".into()),
                    &err,
                ))
            })?;
            object.insert(column.clone(), value.into_json());
        }
        objects.push(serde_json::Value::Object(object));
    }
    Ok((ordered, objects))
}

/// Writes the terminal status, on the run's connection or, if that is
/// gone, on a fresh one.
async fn settle(
    cohort: &Cohort,
    ready: &Ready,
    conn: &mut PgConnection,
    run_id: Uuid,
    status: RunStatus,
    error: Option<&str>,
) -> Result<DateTime<Utc>> {
    let q = || {
        sqlx::query(ready.ledger.settle_run.sql())
            .bind(run_id)
            .bind(status.as_str())
            .bind(error)
    };
    let row = match q().fetch_one(&mut *conn).await {
        Ok(row) => row,
        Err(first) => {
            tracing::warn!(%run_id, error = %first, "settling on the run connection failed; retrying on a new connection");
            let mut fresh = cohort.inner().pool.acquire().await?;
            q().fetch_one(&mut *fresh).await?
        }
    };
    Ok(row.try_get("settled_at")?)
}

/// Releases the run lock. If that fails the connection is closed instead
/// (which releases the lock); the failure is logged, never returned over
/// the run's own result.
async fn release_run_lock(mut conn: PoolConnection<Postgres>, run_id: Uuid) {
    let unlock =
        sqlx::query("SELECT pg_catalog.pg_advisory_unlock(pg_catalog.hashtextextended($1, 0))")
            .bind(format!("cohort.run:{run_id}"))
            .execute(&mut *conn)
            .await;
    if let Err(e) = unlock {
        tracing::warn!(%run_id, error = %e, "releasing the run lock failed; closing the connection instead");
        let raw = conn.detach();
        if let Err(close) = sqlx::Connection::close(raw).await {
            tracing::warn!(%run_id, error = %close, "closing the run connection failed too");
        }
    }
}
