//! The retention engine: preview and sweep (private; the public surface is
//! [`Cohort::sweep`] and [`Cohort::preview`]).
//!
//! Run model: the run's advisory lock is taken on a dedicated connection and
//! the `Started` row is committed before any mutation; entities are
//! processed dependents first; each entity's rule is resolved for the tenant
//! and logical time and checked against the category's declared strategies;
//! batches of `sweep_batch_size` rows are locked, mutated and audited in one
//! transaction each; the run settles `Succeeded`, `PartiallyFailed`,
//! `Failed` or `Cancelled`. One entity's failure is recorded (sanitised) and
//! the run goes on. A batch that changes nothing ends that entity's loop,
//! so no loop can spin.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::{Acquire, PgConnection, Postgres, Row};
use uuid::Uuid;

use crate::audit::AuditEvent;
use crate::cohort::{Cohort, Ready};
use crate::diagnostic::Diagnostic;
use crate::error::{Error, Result};
use crate::model::EntityDescriptor;
use crate::rules::{ResolutionContext, ResolveError, RetentionRule, Strategy, TenantContext};
use crate::run::{
    failure, EntityFailure, EntityOutcome, PreviewRequest, RunKind, RunStatus, SweepRequest,
    SweepResult,
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

/// The entities of one pass with their canonical tenant keys.
struct Pass<'a> {
    entities: Vec<&'a EntityDescriptor>,
    keys: BTreeMap<Uuid, KeyValue>,
    /// The tenant's canonical text (as stored in the ledger).
    tenant: Option<String>,
}

/// Canonical tenant keys per entity of the pass, checked before anything is written.
fn tenant_keys<'a>(ready: &'a Ready, tenant: Option<&str>) -> Result<Pass<'a>> {
    let entities: Vec<&EntityDescriptor> = ready
        .model
        .ordered()
        .filter(|e| e.tenant.is_some() == tenant.is_some())
        .collect();
    let mut keys = BTreeMap::new();
    let mut canonical = tenant.map(|t| t.trim().to_owned());
    if let Some(t) = tenant {
        for e in &entities {
            let ty = ready.model.facts[&e.id].tenant.expect("tenanted entity");
            let key = ty
                .parse(t)
                .map_err(|msg| Error::InvalidInput(format!("tenant for {}: {msg}", e.name)))?;
            if canonical.as_deref() == Some(t.trim()) {
                canonical = Some(key.canonical());
            }
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
async fn rule_for(
    cohort: &Cohort,
    ready: &Ready,
    e: &EntityDescriptor,
    tenant: Option<&str>,
    jurisdiction: Option<&str>,
    now: DateTime<Utc>,
) -> std::result::Result<(RetentionRule, DateTime<Utc>), Diagnostic> {
    let mut tenant_ctx = match tenant {
        Some(t) => TenantContext::tenant(t),
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
    let cutoff = rule
        .sweep_cutoff(now)
        .map_err(|err| Diagnostic::capture("rule", Some("cutoff_out_of_range".into()), &err))?;
    Ok((rule, cutoff))
}

struct Counts {
    eligible: u64,
    held: u64,
    null_anchor: u64,
}

async fn counts(
    conn: &mut PgConnection,
    plan: &EntityPlan,
    strategy: Strategy,
    e: &EntityDescriptor,
    cutoff: DateTime<Utc>,
    tenant: Option<&KeyValue>,
) -> std::result::Result<Counts, sqlx::Error> {
    let mut q = sqlx::query(plan.counts[&strategy].sql())
        .bind(e.id)
        .bind(cutoff);
    if let Some(t) = tenant {
        q = t.bind(q);
    }
    let row = q.fetch_one(conn).await?;
    let n = |name: &str| -> std::result::Result<u64, sqlx::Error> {
        Ok(row.try_get::<i64, _>(name)?.max(0) as u64)
    };
    Ok(Counts {
        eligible: n("eligible")?,
        held: n("held")?,
        null_anchor: n("null_anchor")?,
    })
}

fn outcome(e: &EntityDescriptor, rule: &RetentionRule, cutoff: DateTime<Utc>) -> EntityOutcome {
    EntityOutcome {
        entity_id: e.id,
        entity: e.name.clone(),
        category: e.category.clone(),
        strategy: rule.strategy(),
        affected: 0,
        held: 0,
        skipped: 0,
        null_anchor: 0,
        cutoff,
        period: rule.period(),
        legal_min: rule.legal_min(),
    }
}

pub(crate) async fn preview(cohort: &Cohort, req: PreviewRequest) -> Result<PreviewResult> {
    let ready = cohort.prepared().await?;
    let Pass {
        entities,
        keys,
        tenant,
    } = tenant_keys(&ready, req.tenant.as_deref())?;
    let mut conn = cohort.inner().pool.acquire().await?;
    let mut result = PreviewResult {
        tenant,
        entities: Vec::new(),
        failures: Vec::new(),
    };
    for e in entities {
        let (rule, cutoff) = match rule_for(
            cohort,
            &ready,
            e,
            result.tenant.as_deref(),
            req.jurisdiction.as_deref(),
            req.now,
        )
        .await
        {
            Ok(r) => r,
            Err(d) => {
                result.failures.push(failure(e.id, &e.name, &d));
                continue;
            }
        };
        let c = counts(
            &mut conn,
            &ready.plans[&e.id],
            rule.strategy(),
            e,
            cutoff,
            keys.get(&e.id),
        )
        .await?;
        let mut o = outcome(e, &rule, cutoff);
        o.affected = if rule.strategy().mutates() {
            c.eligible
        } else {
            0
        };
        o.held = c.held;
        o.null_anchor = c.null_anchor;
        result.entities.push(o);
    }
    Ok(result)
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
    tenant: Option<String>,
    req: &'a SweepRequest,
}

/// Sweeps one entity's batches. `out` is updated only with committed work.
async fn sweep_entity(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    e: &EntityDescriptor,
    tenant: Option<&KeyValue>,
    rule: &RetentionRule,
    cutoff: DateTime<Utc>,
    out: &mut EntityOutcome,
) -> std::result::Result<(), Stop> {
    let ledger = &ctx.ready.ledger;
    let plan = &ctx.ready.plans[&e.id];
    let strategy = rule.strategy();
    let split = |p: Option<crate::rules::Period>| {
        p.map(|p| {
            (
                (p.as_seconds() / 86_400) as i32,
                (p.as_seconds() % 86_400) as f64,
            )
        })
    };
    let (period_days, period_secs) = split(Some(rule.period())).expect("some");
    let legal = split(rule.legal_min());
    let summary_id: i64 = sqlx::query(ledger.insert_summary.sql())
        .bind(ctx.run_id)
        .bind(e.id)
        .bind(&e.name)
        .bind(&e.category)
        .bind(ctx.tenant.as_deref())
        .bind(strategy.as_str())
        .bind(cutoff)
        .bind(period_days)
        .bind(period_secs)
        .bind(legal.map(|l| l.0))
        .bind(legal.map(|l| l.1).unwrap_or(0.0))
        .bind(rule.source())
        .bind(rule.reason())
        .fetch_one(&mut *conn)
        .await
        .map_err(stop_from)?
        .try_get("summary_id")
        .map_err(stop_from)?;

    let mut result = Ok(());
    if strategy.mutates() && !ctx.req.dry_run {
        result = batches(ctx, conn, e, plan, tenant, rule, cutoff, summary_id, out).await;
    }
    // Held and NULL-anchor rows are measured directly, after the batches.
    let measured = counts(conn, plan, strategy, e, cutoff, tenant).await;
    let error = match &result {
        Err(Stop::Entity(d)) => Some(d.to_string()),
        Err(Stop::Cancelled) => Some("cancelled".to_string()),
        _ => None,
    };
    if let Ok(c) = &measured {
        out.held = c.held;
        out.null_anchor = c.null_anchor;
        if ctx.req.dry_run && strategy.mutates() {
            out.affected = c.eligible;
        }
    }
    let finish = sqlx::query(ledger.finish_summary.sql())
        .bind(summary_id)
        .bind(out.affected as i64)
        .bind(out.held as i64)
        .bind(out.skipped as i64)
        .bind(out.null_anchor as i64)
        .bind(error)
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

#[allow(clippy::too_many_arguments)]
async fn batches(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    e: &EntityDescriptor,
    plan: &EntityPlan,
    tenant: Option<&KeyValue>,
    rule: &RetentionRule,
    cutoff: DateTime<Utc>,
    summary_id: i64,
    out: &mut EntityOutcome,
) -> std::result::Result<(), Stop> {
    let strategy = rule.strategy();
    let key_type = ctx.ready.model.facts[&e.id].record;
    let batch_size = i64::from(ctx.cohort.inner().config.sweep_batch_size);
    loop {
        if ctx.req.cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        let mut tx = conn.begin().await.map_err(stop_from)?;
        let mut lock = sqlx::query(plan.lock[&strategy].sql())
            .bind(e.id)
            .bind(cutoff)
            .bind(batch_size);
        if let Some(t) = tenant {
            lock = t.bind(lock);
        }
        let keys: Vec<KeyValue> = lock
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

        let custom_values = if strategy == Strategy::Anonymise && !plan.custom.is_empty() {
            Some(custom_values(&mut tx, plan, key_type, &keys).await?)
        } else {
            None
        };
        if ctx.req.cancel.is_cancelled() {
            tx.rollback().await.map_err(stop_from)?;
            return Err(Stop::Cancelled);
        }

        let mut mutate = sqlx::query(plan.mutate[&strategy].sql()).bind(e.id);
        if let Some((ordered_keys, values)) = custom_values {
            mutate = bind_array(mutate, key_type, &ordered_keys);
            for literal in &plan.literals {
                mutate = mutate.bind(literal.clone());
            }
            mutate = mutate.bind(values);
        } else {
            mutate = bind_array(mutate, key_type, &keys);
            if strategy == Strategy::Anonymise {
                for literal in &plan.literals {
                    mutate = mutate.bind(literal.clone());
                }
            }
        }
        let changed: Vec<String> = mutate
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
        let per_row = rule.audit() == AuditDetail::PerRow && n > 0;
        if per_row {
            sqlx::query(ledger.insert_details.sql())
                .bind(ctx.run_id)
                .bind(e.id)
                .bind(&e.name)
                .bind(ctx.tenant.as_deref())
                .bind(strategy.as_str())
                .bind(&changed)
                .execute(&mut *tx)
                .await
                .map_err(stop_from)?;
        }
        if ctx.req.cancel.is_cancelled() {
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
                tenant: ctx.tenant.clone(),
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

pub(crate) async fn sweep(cohort: &Cohort, req: SweepRequest) -> Result<SweepResult> {
    let ready = cohort.prepared().await?;
    let Pass {
        entities,
        keys,
        tenant,
    } = tenant_keys(&ready, req.tenant.as_deref())?;
    let inner = cohort.inner();
    let run_id = Uuid::new_v4();
    let mut conn: PoolConnection<Postgres> = inner.pool.acquire().await?;
    sqlx::query("SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended($1, 0))")
        .bind(format!("cohort.run:{run_id}"))
        .execute(&mut *conn)
        .await?;
    let started_at: DateTime<Utc> = sqlx::query(ready.ledger.insert_run.sql())
        .bind(run_id)
        .bind(RunKind::Sweep.as_str())
        .bind(req.trigger.as_str())
        .bind(req.dry_run)
        .bind(tenant.as_deref())
        .bind(req.now)
        .fetch_one(&mut *conn)
        .await?
        .try_get("started_at")?;
    inner.observers.emit(AuditEvent::Started {
        run_id,
        kind: RunKind::Sweep,
        dry_run: req.dry_run,
        tenant: tenant.clone(),
        now: req.now,
    });

    let ctx = RunCtx {
        cohort,
        ready: &ready,
        run_id,
        tenant: tenant.clone(),
        req: &req,
    };
    let mut outcomes = Vec::new();
    let mut failures = Vec::new();
    let mut status = RunStatus::Succeeded;
    let mut run_error: Option<String> = None;
    for e in entities {
        if req.cancel.is_cancelled() {
            status = RunStatus::Cancelled;
            break;
        }
        let (rule, cutoff) = match rule_for(
            cohort,
            &ready,
            e,
            tenant.as_deref(),
            req.jurisdiction.as_deref(),
            req.now,
        )
        .await
        {
            Ok(r) => r,
            Err(d) => {
                failures.push(failure(e.id, &e.name, &d));
                continue;
            }
        };
        let mut out = outcome(e, &rule, cutoff);
        let result =
            sweep_entity(&ctx, &mut conn, e, keys.get(&e.id), &rule, cutoff, &mut out).await;
        outcomes.push(out);
        match result {
            Ok(()) => {}
            Err(Stop::Entity(d)) => failures.push(failure(e.id, &e.name, &d)),
            Err(Stop::Cancelled) => {
                status = RunStatus::Cancelled;
                break;
            }
            Err(Stop::Run(err)) => {
                let d = Diagnostic::from_sqlx(&err);
                run_error = Some(d.to_string());
                status = RunStatus::Failed;
                break;
            }
        }
    }
    if status == RunStatus::Succeeded && !failures.is_empty() {
        status = RunStatus::PartiallyFailed;
    }
    let error = run_error.or_else(|| {
        (!failures.is_empty()).then(|| {
            failures
                .iter()
                .map(|f| format!("entity {}: {}", f.entity_id, f.error))
                .collect::<Vec<_>>()
                .join("; ")
        })
    });
    let settled_at = settle(cohort, &ready, &mut conn, run_id, status, error.as_deref()).await?;
    release_run_lock(conn, run_id).await;
    inner.observers.emit(AuditEvent::Settled { run_id, status });
    Ok(SweepResult {
        run_id,
        kind: RunKind::Sweep,
        trigger: req.trigger,
        status,
        dry_run: req.dry_run,
        tenant,
        started_at,
        settled_at: Some(settled_at),
        entities: outcomes,
        failures,
    })
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
