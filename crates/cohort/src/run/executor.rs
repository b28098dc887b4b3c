//! The run executor, shared by sweeps and erasure: the run's advisory lock
//! is taken on a dedicated connection and the `Started` row is committed
//! before any mutation; entities are processed dependents first; batches of
//! `sweep_batch_size` rows are locked, mutated and audited in one
//! transaction each; the run settles `Succeeded`, `PartiallyFailed`,
//! `Failed` or `Cancelled`. One entity's failure is recorded (sanitised) and
//! the run goes on. A batch that changes nothing ends that entity's loop, so
//! no loop can spin.

use crate::cancel::Cancel;
use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgConnection, Postgres, Row};
use tracing::Instrument;
use uuid::Uuid;

use super::partitions::{self, RowPath};
use super::{failure, EntityFailure, EntityOutcome, RunKind, RunStatus, SweepResult, Trigger};
use crate::context::{Context, Prepared};
use crate::diagnostic::Diagnostic;
use crate::error::{is_connection_error, Result};
use crate::ident::SqlText;
use crate::locks::LockKey;
use crate::model::EntityDescriptor;
use crate::observer::AuditEvent;
use crate::rules::AuditDetail;
use crate::rules::{RetentionRule, Strategy};
use crate::sql::ledger;
use crate::sql::locks;
use crate::sql::{bind_array, BindKey, DecodeKey, EntityPlan, KeyValue};

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

pub(crate) fn bind_all<'q>(
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
    /// Locks a batch; returns record keys (and, with `lock_after`, each
    /// row's anchor).
    pub(crate) lock: SqlText,
    /// Locks the next batch after a cursor, the previous batch's last
    /// (anchor, key), bound after `lock_args` (`None`: every batch uses
    /// `lock`).
    pub(crate) lock_after: Option<SqlText>,
    pub(crate) lock_args: Vec<Arg>,
    /// Mutates locked rows; binds keys, literals, custom values, then
    /// `mutate_args`; returns the changed keys as text.
    pub(crate) mutate: SqlText,
    /// `mutate` returning nothing (used when only the count is needed).
    pub(crate) mutate_count: Option<SqlText>,
    /// `mutate` writing the row details itself (per-row audit, handlers);
    /// binds the run id, entity name, tenant text and action after
    /// `mutate_args`.
    pub(crate) mutate_audited: Option<SqlText>,
    pub(crate) mutate_args: Vec<Arg>,
    /// Returns `eligible`, `held`, `null_anchor`.
    pub(crate) counts: SqlText,
    /// `counts` after a real run, through the active holds' keys (bound
    /// after `count_args`); `None`: always `counts`.
    pub(crate) counts_after: Option<SqlText>,
    pub(crate) count_args: Vec<Arg>,
}

impl Work<'_> {
    /// The same sweep work with the row path's cutoff moved earlier (the
    /// reported cutoff and the end-of-entity counts keep the rule's). A
    /// sweep binds its cutoff first in `lock_args` and `mutate_args`;
    /// partition purge, the only caller, runs for sweeps only.
    fn with_row_cutoff(&self, bound: DateTime<Utc>) -> Self {
        let earlier = |args: &[Arg]| -> Vec<Arg> {
            let mut args = args.to_vec();
            if let Some(first @ Arg::Time(_)) = args.first_mut() {
                *first = Arg::Time(bound);
            }
            args
        };
        Work {
            entity: self.entity,
            rule: self.rule.clone(),
            cutoff: self.cutoff,
            lock: self.lock.clone(),
            lock_after: self.lock_after.clone(),
            lock_args: earlier(&self.lock_args),
            mutate: self.mutate.clone(),
            mutate_count: self.mutate_count.clone(),
            mutate_audited: self.mutate_audited.clone(),
            mutate_args: earlier(&self.mutate_args),
            counts: self.counts.clone(),
            counts_after: self.counts_after.clone(),
            count_args: self.count_args.clone(),
        }
    }
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
    read_counts(q.fetch_one(conn).await?)
}

/// The most active holds of one entity whose keys are bound into one
/// statement; with more, the counts read the rows past the cutoff instead.
const MAX_BOUND_HOLDS: i64 = 10_000;

/// The keys of an entity's active holds, parsed in the record key's type;
/// `None` when there are more than [`MAX_BOUND_HOLDS`] or one cannot be a
/// key of this type (then only a statement that compares every row's key
/// text gives the exact answer).
pub(crate) async fn active_hold_keys(
    conn: &mut PgConnection,
    ready: &Prepared,
    entity: &EntityDescriptor,
) -> std::result::Result<Option<Vec<KeyValue>>, sqlx::Error> {
    let wanted = ledger::ActiveHolds {
        entity_id: entity.id,
        limit: MAX_BOUND_HOLDS + 1,
    };
    let ids: Vec<String> = ready
        .ledger
        .active_holds(wanted)
        .query_scalar()
        .fetch_all(conn)
        .await?;
    if ids.len() as i64 > MAX_BOUND_HOLDS {
        return Ok(None);
    }
    let key_type = ready.model.facts[&entity.id].record;
    Ok(ids.iter().map(|id| key_type.parse(id).ok()).collect())
}

/// The counts after a real run: through the active holds' keys when they
/// can be bound, else by reading the rows past the cutoff.
async fn counts_after_run(
    conn: &mut PgConnection,
    ready: &Prepared,
    work: &Work<'_>,
) -> std::result::Result<Counts, sqlx::Error> {
    let Some(after) = &work.counts_after else {
        return counts(conn, work).await;
    };
    let Some(keys) = active_hold_keys(conn, ready, work.entity).await? else {
        return counts(conn, work).await;
    };
    let key_type = ready.model.facts[&work.entity.id].record;
    let q = bind_all(
        sqlx::query(after.sql()).bind(work.entity.id),
        &work.count_args,
    );
    read_counts(bind_array(q, key_type, &keys).fetch_one(conn).await?)
}

fn read_counts(row: sqlx::postgres::PgRow) -> std::result::Result<Counts, sqlx::Error> {
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

/// What a run is, apart from its entities.
pub(crate) struct RunSpec {
    pub(crate) kind: RunKind,
    pub(crate) trigger: Trigger,
    pub(crate) dry_run: bool,
    pub(crate) tenant: Option<String>,
    pub(crate) now: DateTime<Utc>,
    pub(crate) cancel: Cancel,
    /// The cron occurrence of a scheduled run, and which of its passes.
    pub(crate) occurrence: Option<super::OccurrencePass>,
}

/// Why an entity stopped.
pub(crate) enum Stop {
    /// The entity failed; the run goes on.
    Entity(Diagnostic),
    /// Cancelled: the open batch was rolled back.
    Cancelled,
    /// The run cannot go on (its connection is gone).
    Run(sqlx::Error),
}

pub(crate) fn stop_from(e: sqlx::Error) -> Stop {
    if is_connection_error(&e) {
        Stop::Run(e)
    } else {
        Stop::Entity(Diagnostic::from_sqlx(&e))
    }
}

pub(crate) struct RunCtx<'a> {
    pub(crate) cx: &'a Context,
    pub(crate) ready: &'a Prepared,
    pub(crate) run_id: Uuid,
    pub(crate) spec: &'a RunSpec,
}

/// Runs the works of one run: lock, Started, entities, settle.
pub(crate) async fn execute(
    cx: &Context,
    ready: &Prepared,
    spec: RunSpec,
    works: Vec<std::result::Result<Work<'_>, EntityFailure>>,
) -> Result<SweepResult> {
    let run_id = Uuid::new_v4();
    let span = tracing::info_span!(
        "cohort.run",
        run_id = %run_id,
        kind = spec.kind.as_str(),
        trigger = spec.trigger.as_str(),
        tenant = spec.tenant.as_deref(),
        dry_run = spec.dry_run,
    );
    execute_in_span(cx, ready, spec, works, run_id)
        .instrument(span)
        .await
}

async fn execute_in_span(
    cx: &Context,
    ready: &Prepared,
    spec: RunSpec,
    works: Vec<std::result::Result<Work<'_>, EntityFailure>>,
    run_id: Uuid,
) -> Result<SweepResult> {
    let inner = cx;
    let clock = std::time::Instant::now();
    let mut conn = crate::locks::Held::new(inner.pool.acquire().await?);
    locks::lock(&mut conn, LockKey::Run(run_id)).await?;
    let insert = ledger::InsertRun {
        run_id,
        kind: spec.kind.as_str(),
        trigger: spec.trigger.as_str(),
        dry_run: spec.dry_run,
        tenant: spec.tenant.clone(),
        logical_now: spec.now,
        occurrence: spec.occurrence.map(|o| o.at),
        pass: spec.occurrence.map(|o| o.pass),
        passes: spec.occurrence.map(|o| o.passes),
        policy_fingerprint: spec
            .occurrence
            .map(|_| crate::peers::fingerprint(inner, ready)),
    };
    let started = ready
        .ledger
        .insert_run(insert)
        .query()
        .fetch_one(&mut *conn)
        .await
        .and_then(|row| row.try_get::<DateTime<Utc>, _>("started_at"));
    let started_at = match started {
        Ok(at) => at,
        Err(e) => {
            release_run_lock(conn.into_inner(), run_id).await;
            return Err(e.into());
        }
    };
    tracing::info!(entities = works.len(), now = %spec.now, "run started");
    inner.observers.emit(AuditEvent::Started {
        run_id,
        kind: spec.kind,
        dry_run: spec.dry_run,
        tenant: spec.tenant.clone(),
        now: spec.now,
    });

    let ctx = RunCtx {
        cx,
        ready,
        run_id,
        spec: &spec,
    };
    let mut outcomes = Vec::new();
    let mut failures = Vec::new();
    let mut status = RunStatus::Succeeded;
    let mut run_error: Option<String> = None;
    // The live peers, read once: an entity for which one of them has a
    // handler this process lacks is not mutated (fail closed; a failed
    // read fails every mutating entity the same way).
    let peers = if spec.dry_run {
        Ok(Vec::new())
    } else {
        crate::peers::live(cx, None).await
    };
    for work in works {
        if spec.cancel.is_cancelled() {
            status = RunStatus::Cancelled;
            break;
        }
        let work = match work {
            Ok(w) => w,
            Err(f) => {
                tracing::error!(entity = %f.entity, error = %f.error, "entity not run: its rule could not be resolved");
                failures.push(f);
                continue;
            }
        };
        if !spec.dry_run && work.rule.strategy().mutates() {
            let refused = match &peers {
                Ok(peers) => crate::peers::conflict(cx, peers, work.entity.id).map(|why| {
                    crate::telemetry::peer_conflict(&work.entity.name);
                    Diagnostic::capture(
                        "peer",
                        Some("handler_missing_here".into()),
                        &format!("{}: {why}", work.entity.name),
                    )
                }),
                Err(e) => Some(Diagnostic::capture(
                    "peer",
                    Some("peers_unreadable".into()),
                    &format!(
                        "{}: the peer records could not be read ({e}); its rows are left alone",
                        work.entity.name
                    ),
                )),
            };
            if let Some(d) = refused {
                outcomes.push(outcome(&work));
                failures.push(failure(work.entity.id, &work.entity.name, &d));
                continue;
            }
        }
        let mut out = outcome(&work);
        let span = tracing::info_span!(
            "cohort.entity",
            entity = %work.entity.name,
            strategy = work.rule.strategy().as_str(),
        );
        let result = run_entity(&ctx, &mut conn, &work, &mut out)
            .instrument(span.clone())
            .await;
        span.in_scope(|| report_entity(ctx.spec, &out, &result));
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
    let settled = settle(
        cx,
        ready,
        &mut conn,
        run_id,
        status,
        error.as_deref(),
        &failures,
    )
    .await;
    release_run_lock(conn.into_inner(), run_id).await;
    let settled_at = settled?;
    let took = clock.elapsed();
    crate::telemetry::run_settled(spec.kind, spec.trigger, status, took);
    let affected: u64 = outcomes.iter().map(|o| o.affected).sum();
    match status {
        RunStatus::Succeeded => {
            tracing::info!(
                status = status.as_str(),
                affected,
                duration_ms = took.as_millis() as u64,
                "run settled"
            )
        }
        RunStatus::Cancelled => {
            tracing::warn!(
                status = status.as_str(),
                affected,
                duration_ms = took.as_millis() as u64,
                "run settled"
            )
        }
        _ => tracing::error!(
            status = status.as_str(),
            affected,
            failures = failures.len(),
            error = error.as_deref().unwrap_or(""),
            duration_ms = took.as_millis() as u64,
            "run settled"
        ),
    }
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

/// An entity's outcome in the log and the metrics: info when all went as
/// designed; warn for rows left although eligible (skipped) and for an
/// erasure's subject rows kept by a hold; error for a failure (its
/// sanitised diagnostic; the full error was logged under the same id).
fn report_entity(spec: &RunSpec, out: &EntityOutcome, result: &std::result::Result<(), Stop>) {
    if !spec.dry_run {
        // `affected` was counted as each batch committed.
        crate::telemetry::entity_settled(out);
    }
    let (affected, held, skipped, null_anchor) =
        (out.affected, out.held, out.skipped, out.null_anchor);
    match result {
        Err(Stop::Entity(d)) => tracing::error!(
            affected,
            error = %d,
            "entity failed; its committed batches stay and the run goes on"
        ),
        Err(Stop::Cancelled) => tracing::warn!(affected, "entity cancelled"),
        Err(Stop::Run(_)) => tracing::error!(affected, "run failed during this entity"),
        Ok(()) if skipped > 0 => tracing::warn!(
            affected,
            held,
            skipped,
            null_anchor,
            "eligible rows skipped (still referenced, a failed before-handler, or a partition that could not be locked); the next run retries them"
        ),
        Ok(()) if held > 0 && spec.kind == RunKind::Erasure => tracing::warn!(
            affected,
            held,
            "the subject's rows under a legal hold were kept"
        ),
        Ok(()) => tracing::info!(affected, held, skipped, null_anchor, "entity done"),
    }
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
    let plan = &ctx.ready.ledger;
    let strategy = work.rule.strategy();
    let split = |p: crate::rules::Period| ledger::IntervalParts {
        months: p.months(),
        days: (p.fixed_seconds() / 86_400) as i32,
        secs: (p.fixed_seconds() % 86_400) as f64,
    };
    let summary = ledger::InsertSummary {
        run_id: ctx.run_id,
        entity_id: e.id,
        entity: e.name.clone(),
        category: e.category.clone(),
        tenant: ctx.spec.tenant.clone(),
        strategy: strategy.as_str(),
        cutoff: work.cutoff,
        period: split(work.rule.period()),
        legal_min: work.rule.legal_min().map(split),
        rule_source: work.rule.source().map(str::to_owned),
        rule_reason: work.rule.reason().map(str::to_owned),
    };
    let summary_id: i64 = plan
        .insert_summary(summary)
        .query()
        .fetch_one(&mut *conn)
        .await
        .map_err(stop_from)?
        .try_get("summary_id")
        .map_err(stop_from)?;

    let mut result = Ok(());
    let mut row_path = RowPath::UpToCutoff;
    if partitions::applies(ctx, work) {
        match partitions::drop_expired(ctx, conn, work, summary_id, out).await {
            Ok(left) => row_path = left,
            Err(stop) => result = Err(stop),
        }
    }
    if strategy.mutates() && !ctx.spec.dry_run && result.is_ok() {
        result = match row_path {
            RowPath::UpToCutoff => batches(ctx, conn, work, summary_id, out).await,
            RowPath::Before(bound) => {
                let earlier = work.with_row_cutoff(bound);
                batches(ctx, conn, &earlier, summary_id, out).await
            }
            RowPath::Nothing => Ok(()),
        };
    }
    if matches!(result, Err(Stop::Run(_))) {
        return result;
    }
    // Held and NULL-anchor rows are measured directly, after the batches.
    let measured = if strategy.mutates() && !ctx.spec.dry_run && row_path == RowPath::UpToCutoff {
        counts_after_run(conn, ctx.ready, work).await
    } else {
        counts(conn, work).await
    };
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
        if row_path != RowPath::UpToCutoff {
            // Past the cutoff and not held, but left for the next run with
            // the partition that could not be locked in time.
            out.skipped += c.eligible;
        }
    }
    let finish = plan
        .finish_summary(ledger::FinishSummary {
            summary_id,
            affected: out.affected as i64,
            held: out.held as i64,
            skipped: out.skipped as i64,
            null_anchor: out.null_anchor as i64,
            error,
            kept_by_legal_min: out.kept_by_legal_min as i64,
            kept_by_policy: out.kept_by_policy as i64,
        })
        .query()
        .execute(&mut *conn)
        .await;
    result?;
    measured.map_err(stop_from)?;
    finish.map_err(stop_from)?;
    ctx.cx.observers.emit(AuditEvent::EntitySummary {
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
    let handlers = ctx.cx.handlers.get(&e.id).filter(|h| !h.is_empty());
    // Where the previous batch's candidates ended, in (anchor, key) order:
    // each batch continues after it, so no batch walks again past the rows
    // earlier ones finished (anonymised or flagged rows stay in the anchor
    // index range). Rows passed over (locked by a concurrent sweep, or
    // held when re-checked) are left to that sweep or the next run.
    let mut cursor: Option<(DateTime<Utc>, KeyValue)> = None;
    loop {
        if cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        let batch_clock = std::time::Instant::now();
        // Open for the whole batch (its lifetime is the batch's), never
        // entered across an await: events name it as their parent.
        let batch_span = tracing::debug_span!("cohort.batch", rows = tracing::field::Empty);
        let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED)
            .await
            .map_err(stop_from)?;
        let locked = match (&work.lock_after, &cursor) {
            (Some(after), Some((anchor, key))) => {
                let q = bind_all(sqlx::query(after.sql()).bind(e.id), &work.lock_args);
                key.bind(q.bind(*anchor)).fetch_all(&mut *tx).await
            }
            _ => {
                bind_all(sqlx::query(work.lock.sql()).bind(e.id), &work.lock_args)
                    .fetch_all(&mut *tx)
                    .await
            }
        }
        .map_err(stop_from)?;
        let keys: Vec<KeyValue> = locked
            .iter()
            .map(|row| key_type.decode(row, 0))
            .collect::<std::result::Result<_, _>>()
            .map_err(stop_from)?;
        if keys.is_empty() {
            tx.rollback().await.map_err(stop_from)?;
            return Ok(());
        }
        if work.lock_after.is_some() {
            let last = locked.last().expect("not empty");
            let anchor: DateTime<Utc> = last.try_get(1).map_err(stop_from)?;
            cursor = Some((anchor, keys.last().expect("not empty").clone()));
        }

        // The locked rows are read into Rust (once) only when something
        // needs them: row handlers' capture, or values computed in Rust.
        let computes = strategy == Strategy::Anonymise && !plan.custom.is_empty();
        let rows = if handlers.is_some() || computes {
            bind_array(sqlx::query(plan.load_rows.sql()), key_type, &keys)
                .fetch_all(&mut *tx)
                .await
                .map_err(stop_from)?
        } else {
            Vec::new()
        };
        // Row handlers capture from the locked rows, before the mutation.
        let captured = match handlers {
            Some(hs) => Some(capture(ctx, work, hs, &rows).await?),
            None => None,
        };
        let custom = if computes {
            Some(custom_values(plan, key_type, &rows)?)
        } else {
            None
        };
        if cancel.is_cancelled() {
            tx.rollback().await.map_err(stop_from)?;
            return Err(Stop::Cancelled);
        }

        // Handler work needs a detail row per mutated row to hang from;
        // without either, only the count comes back.
        let wants_ids = work.rule.audit() == AuditDetail::PerRow || handlers.is_some();
        // With details wanted, one statement mutates and writes them (no
        // key travels back and forth); with only the count, nothing returns.
        let audited = work.mutate_audited.as_ref().filter(|_| wants_ids);
        let count_only = work.mutate_count.as_ref().filter(|_| !wants_ids);
        let sql = audited.or(count_only).unwrap_or(&work.mutate);
        let mut mutate = sqlx::query(sql.sql()).bind(e.id);
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
        }
        if let Some(values) = custom_json {
            mutate = mutate.bind(values);
        }
        let mut mutate = bind_all(mutate, &work.mutate_args);
        if audited.is_some() {
            mutate = mutate
                .bind(ctx.run_id)
                .bind(&e.name)
                .bind(ctx.spec.tenant.as_deref())
                .bind(strategy.as_str());
        }
        let (changed, n, written): (Vec<String>, u64, Option<Vec<sqlx::postgres::PgRow>>) =
            if audited.is_some() {
                let details = mutate.fetch_all(&mut *tx).await.map_err(stop_from)?;
                let changed = details
                    .iter()
                    .map(|r| r.try_get::<String, _>("record_id"))
                    .collect::<std::result::Result<_, _>>()
                    .map_err(stop_from)?;
                let n = details.len() as u64;
                (changed, n, Some(details))
            } else if count_only.is_none() {
                let changed: Vec<String> = mutate
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(stop_from)?
                    .iter()
                    .map(|r| r.try_get::<String, _>(0))
                    .collect::<std::result::Result<_, _>>()
                    .map_err(stop_from)?;
                let n = changed.len() as u64;
                (changed, n, None)
            } else {
                let n = mutate
                    .execute(&mut *tx)
                    .await
                    .map_err(stop_from)?
                    .rows_affected();
                (Vec::new(), n, None)
            };

        let plan = &ctx.ready.ledger;
        plan.add_affected(ledger::AddAffected {
            summary_id,
            rows: n as i64,
        })
        .query()
        .execute(&mut *tx)
        .await
        .map_err(stop_from)?;
        let per_row = wants_ids && n > 0;
        if per_row {
            let details = match written {
                Some(details) => details,
                None => plan
                    .insert_details(ledger::InsertDetails {
                        run_id: ctx.run_id,
                        entity_id: e.id,
                        entity: e.name.clone(),
                        tenant: ctx.spec.tenant.clone(),
                        action: strategy.as_str(),
                        record_ids: changed.clone(),
                    })
                    .query()
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(stop_from)?,
            };
            if let (Some(hs), Some(captured)) = (handlers, &captured) {
                enqueue(ctx, &mut tx, hs, captured, &details).await?;
            }
        }
        if cancel.is_cancelled() {
            tx.rollback().await.map_err(stop_from)?;
            return Err(Stop::Cancelled);
        }
        tx.commit().await.map_err(stop_from)?;
        batch_span.record("rows", n);
        let took = batch_clock.elapsed();
        tracing::debug!(parent: &batch_span, duration_ms = took.as_millis() as u64, "batch committed");
        crate::telemetry::batch(took);
        crate::telemetry::rows(&e.name, strategy, "affected", n);

        out.affected += n;
        let hub = &ctx.cx.observers;
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

/// Runs every handler's `on_before` on each locked row (decoded into the
/// entity's Rust type), in delivery order; returns each row's snapshots by
/// record id, aligned with the handlers. Any failure fails the batch:
/// nothing of it is mutated or queued.
async fn capture(
    ctx: &RunCtx<'_>,
    work: &Work<'_>,
    handlers: &[crate::handlers::Registered],
    rows: &[sqlx::postgres::PgRow],
) -> std::result::Result<std::collections::HashMap<String, Vec<serde_json::Value>>, Stop> {
    let key_type = ctx.ready.model.facts[&work.entity.id].record;
    let mut captured = std::collections::HashMap::with_capacity(rows.len());
    for row in rows {
        let record_id = key_type.decode(row, 0).map_err(stop_from)?.canonical();
        let mut payloads = Vec::with_capacity(handlers.len());
        for h in handlers {
            let mut before = crate::handlers::BeforeContext {
                snapshot: crate::handlers::Snapshot::new(),
                record_id: record_id.clone(),
                tenant: ctx.spec.tenant.clone(),
                run_id: ctx.run_id,
                strategy: work.rule.strategy(),
            };
            // Bounded: a hung capture would hold the batch's row locks and
            // the run lock, so that not even recovery could step in.
            let limit = std::time::Duration::from_secs_f64(
                ctx.cx.config.dispatch.claim_timeout.as_seconds() as f64 * 0.9,
            );
            match tokio::time::timeout(limit, h.handler.before(row, &mut before)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    return Err(Stop::Entity(Diagnostic::capture(
                        "handler",
                        Some("on_before_failed".into()),
                        &err,
                    )))
                }
                Err(_) => {
                    return Err(Stop::Entity(Diagnostic::capture(
                        "handler",
                        Some("on_before_timed_out".into()),
                        &"on_before did not finish within 9/10 of claim_timeout",
                    )))
                }
            }
            payloads.push(before.snapshot.to_json());
        }
        captured.insert(record_id, payloads);
    }
    Ok(captured)
}

/// Queues one piece of work per handler per mutated row, with its
/// snapshot, in the batch transaction.
async fn enqueue(
    ctx: &RunCtx<'_>,
    tx: &mut sqlx::Transaction<'_, Postgres>,
    handlers: &[crate::handlers::Registered],
    captured: &std::collections::HashMap<String, Vec<serde_json::Value>>,
    details: &[sqlx::postgres::PgRow],
) -> std::result::Result<(), Stop> {
    let mut detail_ids = Vec::new();
    let mut identities = Vec::new();
    let mut priorities: Vec<Option<i32>> = Vec::new();
    let mut phases = Vec::new();
    let mut requires_earlier = Vec::new();
    let mut payloads = Vec::new();
    for d in details {
        let detail_id: i64 = d.try_get("row_detail_id").map_err(stop_from)?;
        let record: String = d.try_get("record_id").map_err(stop_from)?;
        let Some(snapshots) = captured.get(&record) else {
            return Err(Stop::Entity(Diagnostic::capture(
                "handler",
                Some("capture_missing".into()),
                &format!("a mutated row was not among the rows its handlers captured ({record})"),
            )));
        };
        for (h, payload) in handlers.iter().zip(snapshots) {
            detail_ids.push(detail_id);
            identities.push(h.registration.identity.clone());
            priorities.push(h.registration.priority);
            phases.push(h.registration.phase.as_str());
            requires_earlier.push(h.registration.requires_earlier);
            payloads.push(payload.clone());
        }
    }
    let work = crate::sql::queue::Enqueue {
        row_detail_ids: detail_ids,
        run_id: ctx.run_id,
        handlers: identities,
        priorities,
        phases,
        payloads,
        requires_earlier,
    };
    ctx.ready
        .queue
        .enqueue(work)
        .query()
        .execute(&mut **tx)
        .await
        .map_err(stop_from)?;
    Ok(())
}

/// Computes each custom anonymiser's (and the hash's) value on the locked
/// rows. Returns the keys in row order and, per row, a JSON object of the
/// new values by column.
fn custom_values(
    plan: &EntityPlan,
    key_type: crate::sql::KeyType,
    rows: &[sqlx::postgres::PgRow],
) -> std::result::Result<(Vec<KeyValue>, Vec<serde_json::Value>), Stop> {
    let mut ordered = Vec::with_capacity(rows.len());
    let mut objects = Vec::with_capacity(rows.len());
    for row in rows {
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
    cx: &Context,
    ready: &Prepared,
    conn: &mut PgConnection,
    run_id: Uuid,
    status: RunStatus,
    error: Option<&str>,
    failures: &[EntityFailure],
) -> Result<DateTime<Utc>> {
    let structured = serde_json::to_value(failures).expect("failures serialise");
    let q = || {
        ready
            .ledger
            .settle_run(ledger::SettleRun {
                run_id,
                status: status.as_str(),
                error: error.map(str::to_owned),
                failures: structured.clone(),
            })
            .query()
    };
    let row = match q().fetch_one(&mut *conn).await {
        Ok(row) => row,
        Err(first) => {
            tracing::warn!(%run_id, error = %first, "settling on the run connection failed; retrying on a new connection");
            let mut fresh = cx.pool.acquire().await?;
            q().fetch_one(&mut *fresh).await?
        }
    };
    Ok(row.try_get("settled_at")?)
}

/// Releases the run lock. If that fails the connection is closed instead
/// (which releases the lock); the failure is logged, never returned over
/// the run's own result.
async fn release_run_lock(mut conn: PoolConnection<Postgres>, run_id: Uuid) {
    let unlock = locks::unlock(&mut conn, LockKey::Run(run_id)).await;
    if let Err(e) = unlock {
        tracing::warn!(%run_id, error = %e, "releasing the run lock failed; closing the connection instead");
        let raw = conn.detach();
        if let Err(close) = sqlx::Connection::close(raw).await {
            tracing::warn!(%run_id, error = %close, "closing the run connection failed too");
        }
    }
}
