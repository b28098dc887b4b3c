//! The run executor, shared by sweeps and erasure: the run's advisory lock
//! is taken on a dedicated connection and the `Started` row is committed
//! before any mutation; entities are processed dependents first; batches of
//! `sweep_batch_size` rows are locked, mutated and audited in one
//! transaction each (on the run's connection, or on several at once in
//! disjoint key ranges, `sweep_parallelism`); the run settles `Succeeded`, `PartiallyFailed`,
//! `Failed` or `Cancelled`. One entity's failure is recorded (sanitised) and
//! the run goes on. A batch that changes nothing ends that entity's loop, so
//! no loop can spin.

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};
use tracing::Instrument;
use uuid::Uuid;

use super::batches::Progress;
use super::counts::{counts, counts_after_run, outcome, Counts};
use super::ctx::RunCtx;
use super::lanes::sweep_rows;
use super::pacing::{Limits, Throttle};
use super::partitions::{self, RowPath};
use super::recorder::RunRecorder;
use super::work::{stop_from, RunSpec, Stop, Work};
use super::{failure, EntityFailure, EntityOutcome, RunStatus, SweepResult};
use crate::base::diagnostic::Diagnostic;
use crate::base::locks::LockKey;
use crate::context::{Prepared, Ready};
use crate::error::Result;
use crate::sql::locks;

/// Runs the works of one run: lock, Started, entities, settle.
pub(crate) async fn execute(
    cx: &Ready<'_>,
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
    execute_in_span(cx, spec, works, run_id)
        .instrument(span)
        .await
}

async fn execute_in_span(
    cx: &Ready<'_>,
    spec: RunSpec,
    works: Vec<std::result::Result<Work<'_>, EntityFailure>>,
    run_id: Uuid,
) -> Result<SweepResult> {
    let ready: &Prepared = cx.plans();
    let recorder = RunRecorder::new(cx, ready, run_id, &spec);
    let mut conn = crate::sql::locks::Held::new(cx.pool.acquire().await?);
    locks::lock(&mut conn, LockKey::Run(run_id)).await?;
    let started_at = match recorder.started(&mut conn, works.len()).await {
        Ok(at) => at,
        Err(e) => {
            release_run_lock(conn.into_inner(), run_id).await;
            return Err(e.into());
        }
    };
    let ctx = RunCtx {
        cx,
        ready,
        run_id,
        spec: &spec,
        recorder: &recorder,
    };
    let ran = run_works(&ctx, &mut conn, works).await;
    let error = ran.error_text();
    let settled = recorder
        .settled(
            &mut conn,
            ran.status,
            error.as_deref(),
            (&ran.outcomes, &ran.failures),
        )
        .await;
    release_run_lock(conn.into_inner(), run_id).await;
    let settled_at = settled?;
    Ok(SweepResult {
        run_id,
        kind: spec.kind,
        trigger: spec.trigger,
        status: ran.status,
        dry_run: spec.dry_run,
        tenant: spec.tenant,
        started_at,
        settled_at: Some(settled_at),
        entities: ran.outcomes,
        failures: ran.failures,
        erasure_kind: spec.erasure_kind,
    })
}

/// What the entities of a run came to.
struct Ran {
    status: RunStatus,
    outcomes: Vec<EntityOutcome>,
    failures: Vec<EntityFailure>,
    /// The run-level failure (its connection was lost), if any.
    run_error: Option<String>,
}

impl Ran {
    /// The run's error text: entity failures first ("entity <id>:
    /// <diagnostic>", read back by `runs show`), then the run-level
    /// failure, if any.
    fn error_text(&self) -> Option<String> {
        let mut parts: Vec<String> = self
            .failures
            .iter()
            .map(|f| format!("entity {}: {}", f.entity_id, f.error))
            .collect();
        parts.extend(self.run_error.as_ref().map(|e| format!("run: {e}")));
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// Runs each entity in order until the run is cancelled or cannot go on;
/// one entity's failure is recorded and the others go on.
async fn run_works(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    works: Vec<std::result::Result<Work<'_>, EntityFailure>>,
) -> Ran {
    let spec = ctx.spec;
    let mut ran = Ran {
        status: RunStatus::Succeeded,
        outcomes: Vec::new(),
        failures: Vec::new(),
        run_error: None,
    };
    // The live peers, read once: an entity for which one of them has a
    // handler this process lacks is not mutated (fail closed; a failed
    // read fails every mutating entity the same way).
    let peers = if spec.dry_run {
        Ok(Vec::new())
    } else {
        crate::run::peers::live(ctx.cx, None).await
    };
    for work in works {
        if spec.cancel.is_cancelled() {
            ran.status = RunStatus::Cancelled;
            break;
        }
        let work = match work {
            Ok(w) => w,
            Err(f) => {
                tracing::error!(entity = %f.entity, error = %f.error, "entity not run: its rule could not be resolved");
                ran.failures.push(f);
                continue;
            }
        };
        if let Some(d) = refused_by_peers(ctx, &peers, &work) {
            ctx.recorder.entity_not_run(&work);
            ran.outcomes.push(outcome(&work));
            ran.failures
                .push(failure(work.entity.id, &work.entity.name, &d));
            continue;
        }
        let mut out = outcome(&work);
        let span = tracing::info_span!(
            "cohort.entity",
            entity = %work.entity.name,
            strategy = work.rule.strategy().as_str(),
        );
        let result = run_entity(ctx, conn, &work, &mut out)
            .instrument(span.clone())
            .await;
        span.in_scope(|| ctx.recorder.entity_reported(&work, &out, &result));
        ran.outcomes.push(out);
        match result {
            Ok(()) => {}
            Err(Stop::Entity(d)) => {
                ran.failures
                    .push(failure(work.entity.id, &work.entity.name, &d))
            }
            Err(Stop::Cancelled) => {
                ran.status = RunStatus::Cancelled;
                break;
            }
            Err(Stop::Run(err)) => {
                ran.run_error = Some(Diagnostic::from_sqlx(&err).to_string());
                ran.status = RunStatus::Failed;
                break;
            }
        }
    }
    if ran.status == RunStatus::Succeeded && !ran.failures.is_empty() {
        ran.status = RunStatus::PartiallyFailed;
    }
    if ran.status == RunStatus::Succeeded && ran.outcomes.iter().any(|o| o.paused) {
        ran.status = RunStatus::Paused;
    }
    ran
}

/// Why a mutating entity must not run: a live peer has a handler for it
/// that this process lacks, or the peers could not be read.
fn refused_by_peers(
    ctx: &RunCtx<'_>,
    peers: &std::result::Result<Vec<crate::run::peers::Peer>, crate::error::Error>,
    work: &Work<'_>,
) -> Option<Diagnostic> {
    if ctx.spec.dry_run || !work.rule.strategy().mutates() {
        return None;
    }
    match peers {
        Ok(peers) => crate::run::peers::conflict(ctx.cx, peers, work.entity.id).map(|why| {
            crate::domain::telemetry::peer_conflict(&work.entity.name);
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
    let summary_id = ctx.recorder.entity_opened(conn, work).await?;
    let real = work.rule.strategy().mutates() && !ctx.spec.dry_run;
    let before = if real {
        super::health::measure(conn, work.entity).await
    } else {
        None
    };
    let (result, measured_after_run) = change_rows(ctx, conn, work, summary_id, out).await;
    if matches!(result, Err(Stop::Run(_))) {
        return result;
    }
    if let Some(before) = before {
        let done = (out.affected, out.throttled_ms);
        out.table = super::health::after(ctx, conn, work, summary_id, before, done).await;
    }
    // Held and NULL-anchor rows are measured directly, after the batches;
    // what is still eligible only when the loop may have left some (it
    // stalled, or a partition could not be locked).
    let measured = if measured_after_run {
        counts_after_run(conn, ctx.ready, work).await
    } else {
        counts(conn, work).await
    };
    if let Ok(c) = &measured {
        take_counts(ctx, work, c, out);
    }
    let error = match &result {
        Err(Stop::Entity(d)) => Some(d.to_string()),
        Err(Stop::Cancelled) => Some("cancelled".to_string()),
        _ => None,
    };
    let finish = ctx
        .recorder
        .entity_finished(conn, work, summary_id, out, error)
        .await;
    result?;
    measured.map_err(stop_from)?;
    finish.map_err(stop_from)?;
    ctx.recorder.backlog(conn, work).await;
    Ok(())
}

/// The entity's rows changed: expired partitions dropped, then the row
/// path's batches (unless a dry run or a strategy that changes nothing).
/// Also says whether the counts can be taken the cheap way after a run
/// (`counts_after`): only when the batches drained every candidate up to
/// the cutoff.
async fn change_rows(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    summary_id: i64,
    out: &mut EntityOutcome,
) -> (std::result::Result<(), Stop>, bool) {
    let throttle = throttle_of(ctx, work);
    if let Some(t) = &throttle {
        match t.paused(conn).await {
            Ok(true) => {
                out.paused = true;
                return (Ok(()), false);
            }
            Ok(false) => {}
            Err(e) => return (Err(stop_from(e)), false),
        }
    }
    let (result, after_run) =
        change_rows_unpaused(ctx, conn, work, summary_id, out, throttle.as_ref()).await;
    if let Some(t) = &throttle {
        out.throttled_ms = t.rate_waited().map(|d| d.as_millis() as u64);
        out.lag_waited_ms = t.lag_waited().map(|d| d.as_millis() as u64);
        out.pacing_notes = t.notes();
    }
    (result, after_run)
}

/// A real sweep's pause and limits (erasures, dry runs and strategies that
/// change nothing are never paced or paused: an erasure answers a request
/// with a deadline).
fn throttle_of(ctx: &RunCtx<'_>, work: &Work<'_>) -> Option<Throttle> {
    let real = work.rule.strategy().mutates() && !ctx.spec.dry_run;
    if !real || ctx.spec.kind != crate::domain::outcome::RunKind::Sweep {
        return None;
    }
    let config = &ctx.cx.config;
    let global = Limits {
        rate: config.max_rows_per_second,
        lag: config.max_replica_lag(),
    };
    let own = Limits {
        rate: work.entity.max_rows_per_second,
        lag: work.entity.max_replica_lag,
    };
    Some(Throttle::new(
        &work.entity.name,
        &config.schema,
        global.strictest(own),
        ctx.cx.signals.clone(),
    ))
}

/// [`change_rows`] once the entity is known not to be paused.
async fn change_rows_unpaused(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    summary_id: i64,
    out: &mut EntityOutcome,
    throttle: Option<&Throttle>,
) -> (std::result::Result<(), Stop>, bool) {
    let real = work.rule.strategy().mutates() && !ctx.spec.dry_run;
    let mut progress = Progress::Drained;
    let mut row_path = RowPath::UpToCutoff;
    if partitions::applies(ctx, work) {
        match partitions::drop_expired(ctx, conn, work, summary_id, out).await {
            Ok(left) => row_path = left,
            // As before this split: no batch ran, and the counts are
            // taken as after a run that drained its candidates.
            Err(stop) => return (Err(stop), real),
        }
    }
    if !real {
        return (Ok(()), false);
    }
    let looped = match row_path {
        RowPath::UpToCutoff => sweep_rows(ctx, conn, work, summary_id, out, throttle).await,
        RowPath::Before(bound) => {
            let earlier = work.with_row_cutoff(bound);
            sweep_rows(ctx, conn, &earlier, summary_id, out, throttle).await
        }
        RowPath::Nothing => Ok(Progress::Drained),
    };
    let result = looped.map(|p| progress = p);
    out.paused = progress == Progress::Paused;
    let after_run = row_path == RowPath::UpToCutoff && progress == Progress::Drained;
    (result, after_run)
}

/// The entity's counts into its outcome.
fn take_counts(ctx: &RunCtx<'_>, work: &Work<'_>, c: &Counts, out: &mut EntityOutcome) {
    let strategy = work.rule.strategy();
    let real = strategy.mutates() && !ctx.spec.dry_run;
    out.held = c.held;
    out.held_by_subject = c.held_by_subject;
    out.null_anchor = c.null_anchor;
    // Left although eligible: still referenced, plus either what is
    // still eligible (when measured: it includes every row a failing
    // `on_before` set aside, and, past a partition that could not be
    // locked, the rows left with it) or the rows the batches set aside.
    let left = match (real, c.eligible_measured) {
        (true, true) => c.eligible,
        (true, false) => out.skipped,
        (false, _) => 0,
    };
    // A paused entity's eligible rows are left by the pause, not skipped:
    // they are counted apart, with the pause as their reason.
    out.skipped = c.skipped + if out.paused { 0 } else { left };
    let kept = super::counts::kept_for_good(ctx.ready, work, out.skipped);
    let paused = out.paused.then(|| {
        format!(
            "paused (cohort pause): {left} eligible rows left by the pause, not skipped; they go after cohort resume"
        )
    });
    let notes: Vec<String> = kept
        .into_iter()
        .chain(paused)
        .chain(std::mem::take(&mut out.pacing_notes))
        .chain(std::mem::take(&mut out.partition_notes))
        .collect();
    out.note = (!notes.is_empty()).then(|| notes.join("; "));
    out.kept_by_legal_min = c.kept_by_legal_min;
    out.kept_by_legal_min_until = match (c.legal_min_oldest, out.legal_min) {
        (Some(oldest), Some(min)) if c.kept_by_legal_min > 0 => min.after(oldest),
        _ => None,
    };
    if ctx.spec.dry_run && strategy.mutates() {
        out.affected = c.eligible;
    }
    if !strategy.mutates() {
        out.kept_by_policy = c.eligible;
    }
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
