//! The scheduled worker: sweeps every tenant, then the tenantless entities,
//! at each occurrence of a cron schedule (UTC), sharing the passes of one
//! occurrence among the replicas.
//!
//! How replicas agree:
//! - Occurrences are computed from the database clock (read at the start
//!   of each iteration), never the replica's, and the wait until the next
//!   one is measured on the monotonic clock. A replica whose wall clock is
//!   off neither runs an occurrence twice nor skips one.
//! - The first replica to reach an occurrence writes it (`sweep_occurrence`,
//!   one per time, kind and policy) with its passes (`sweep_occurrence_pass`:
//!   each tenant, the rows of the tenant source that cannot be tenants, the
//!   tenantless entities), under a transaction lock the others wait on, so
//!   the tenants are listed once for all of them.
//! - Every replica then claims pending passes one at a time (`FOR UPDATE
//!   SKIP LOCKED`) and holds a session advisory lock on each while it runs
//!   it. A settled pass is done and never swept again; a cancelled one goes
//!   back to pending. A claimed pass whose lock is free lost its replica: its
//!   run is settled `Failed` (owner lost) and the pass is swept again whole
//!   by whoever takes it over, unless its run had finished first.
//! - An occurrence is complete when every pass is done (each done pass
//!   names the replica that ran it and its run). A replica with no pass
//!   left to claim waits for the others, taking over any that is lost, until
//!   the next occurrence is due. The history pruner deletes old occurrences
//!   with their passes.
//! - An occurrence older than one already started is skipped (missed
//!   occurrences are not caught up). A failed iteration is logged and tried
//!   again at the next occurrence; the worker never stops its host.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::cancel::Cancel;
use crate::context::Context;
use crate::error::{Error, Problems, Result};
use crate::locks::LockKey;
use crate::run::{RunStatus, Trigger};
use crate::schedule::{decide, next_occurrence, parse_schedule, retry_delay, Decision, Latest};
use crate::schema::CohortTable;
use crate::sql;
use crate::sql::{locks, occurrences};
use uuid::Uuid;

/// How often a replica looks again at passes other replicas hold.
const LOCK_POLL: Duration = Duration::from_millis(250);
/// Wall clocks further than this from the database's are logged.
const SKEW_WARNING: chrono::TimeDelta = chrono::TimeDelta::seconds(5);

/// The worker's settings: a validated cron schedule.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    schedule: croner::Cron,
    expression: String,
}

impl WorkerConfig {
    /// A worker for `schedule`, a cron expression evaluated in UTC (five
    /// fields, or six with seconds first). A bad expression is a
    /// configuration error.
    pub fn new(schedule: &str) -> Result<Self> {
        let cron = parse_schedule(schedule).map_err(|e| Error::Config(Problems::one(e)))?;
        if cron.find_next_occurrence(&Utc::now(), false).is_err() {
            return Err(Error::Config(Problems::one(format!(
                "schedule {schedule:?} never fires"
            ))));
        }
        Ok(Self {
            schedule: cron,
            expression: schedule.to_string(),
        })
    }

    /// The worker of `config`'s `schedule`; `None` when no schedule is set
    /// (the worker stays idle).
    pub fn from_config(config: &crate::config::CohortConfig) -> Result<Option<Self>> {
        config.schedule.as_deref().map(Self::new).transpose()
    }

    /// The cron expression.
    pub fn schedule(&self) -> &str {
        &self.expression
    }

    /// This replica's wall clock: read only to warn when it disagrees
    /// with the database's, never to schedule.
    fn local_now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

use super::events::{Events, OccurrenceOutcome as Occurrence, ServiceEvent};

/// Aborts a spawned task when dropped (so aborting the worker aborts the
/// occurrence and pass it is running).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the worker until `cancel` fires.
pub(crate) async fn run(cx: Arc<Context>, config: WorkerConfig, cancel: Cancel, events: Events) {
    tracing::info!(schedule = %config.expression, "scheduled worker started (UTC, database clock)");
    refresh_last_success(&cx).await;
    let mut last: Option<DateTime<Utc>> = None;
    let mut failures = 0u32;
    let mut skew_reported = false;
    while !cancel.is_cancelled() {
        let next = match wait_for_next(&cx, &config, last, &cancel, &mut skew_reported).await {
            Ok(Some(next)) => next,
            Ok(None) => break,
            Err(e) => {
                failures += 1;
                let delay = retry_delay(failures);
                tracing::warn!(error = %e, retry_in_s = delay.as_secs(), "worker could not read the database clock");
                if !cancel.sleep(delay).await {
                    break;
                }
                continue;
            }
        };
        last = Some(next);
        // Its own task: a panic ends this occurrence, never the worker.
        let mut task = AbortOnDrop(tokio::spawn({
            let (cx, config, cancel) = (Arc::clone(&cx), config.clone(), cancel.clone());
            async move { occurrence(&cx, &config, next, &cancel).await }
        }));
        let done = (&mut task.0).await;
        // Whoever ran this occurrence (this replica or another), the
        // ledger now says when the last success was.
        refresh_last_success(&cx).await;
        match done {
            Ok(Ok(outcome)) => {
                failures = 0;
                tracing::info!(
                    occurrence = %next,
                    outcome = %outcome.as_str(),
                    passes = outcome.passes(),
                    rerun = outcome.is_rerun(),
                    "occurrence done"
                );
                events.send(ServiceEvent::Occurrence { at: next, outcome });
            }
            Ok(Err(e)) => {
                failures += 1;
                tracing::error!(occurrence = %next, error = %e, "occurrence failed; retrying at the next occurrence");
                events.send(ServiceEvent::OccurrenceFailed {
                    at: next,
                    error: e.to_string(),
                });
            }
            Err(e) => {
                failures += 1;
                tracing::error!(occurrence = %next, error = %e, "occurrence panicked; retrying at the next occurrence");
                events.send(ServiceEvent::OccurrenceFailed {
                    at: next,
                    error: e.to_string(),
                });
            }
        }
    }
    tracing::info!("scheduled worker stopped");
}

/// Reads the last successes from the ledger into the gauge; a failed read
/// is logged (the gauge keeps its value) and never stops the worker.
async fn refresh_last_success(cx: &Context) {
    if let Err(e) = crate::run::status::last_success(cx).await {
        tracing::warn!(error = %e, "reading the last successful runs failed; the gauge keeps its value");
    }
}

async fn db_now(executor: impl sqlx::PgExecutor<'_>) -> Result<DateTime<Utc>> {
    Ok(crate::sql::database_now(executor).await?)
}

/// Waits until the database clock reaches the next occurrence; `None`
/// when cancelled first.
async fn wait_for_next(
    cx: &Context,
    config: &WorkerConfig,
    last: Option<DateTime<Utc>>,
    cancel: &Cancel,
    skew_reported: &mut bool,
) -> Result<Option<DateTime<Utc>>> {
    let now = db_now(&cx.pool).await?;
    let skew = config.local_now() - now;
    if skew.abs() > SKEW_WARNING && !std::mem::replace(skew_reported, true) {
        tracing::warn!(
            skew_s = skew.num_milliseconds() as f64 / 1000.0,
            "this replica's clock differs from the database's; occurrences follow the database clock"
        );
    }
    let Some(next) = next_occurrence(&config.schedule, now, last) else {
        return Err(Error::Config(Problems::one(format!(
            "schedule {:?} has no next occurrence",
            config.expression
        ))));
    };
    crate::telemetry::next_occurrence(next);
    let mut now = now;
    // The monotonic clock and the database's may drift apart slightly:
    // re-read after waking and wait out any remainder.
    while now < next {
        let wait = (next - now).to_std().unwrap_or_default();
        if !cancel.sleep(wait).await {
            return Ok(None);
        }
        now = db_now(&cx.pool).await?;
    }
    Ok(Some(next))
}

/// The latest Scheduled run of kind `dry_run` for occurrence `at` or later.
async fn latest_run(
    cx: &Context,
    conn: &mut sqlx::PgConnection,
    dry_run: bool,
    at: DateTime<Utc>,
) -> Result<Option<Latest>> {
    // An occurrence is done only for the policy that ran it: a replica
    // with another policy (other entities, other handlers) sweeps it too.
    // Runs from before schema version 5 have no fingerprint and count for
    // every policy.
    let prepared = cx.prepared().await?;
    let params = sql::worker::LatestScheduled {
        dry_run,
        at,
        fingerprint: crate::peers::fingerprint(cx, &prepared),
    };
    let row: Option<(String, i32, i32)> = sql::worker::latest_scheduled(&cx.config.schema, params)
        .query_as()
        .fetch_optional(&mut *conn)
        .await?;
    row.map(|(status, pass, passes)| {
        Ok(Latest {
            status: RunStatus::parse(&status).ok_or_else(|| {
                Error::Migration(format!("unknown run status {status:?} in the ledger"))
            })?,
            pass,
            passes,
        })
    })
    .transpose()
}

/// An occurrence as written for every replica: its id, its passes, and
/// the kind (dry or real) and policy it is of.
struct Shared {
    id: Uuid,
    at: DateTime<Utc>,
    passes: i32,
    dry_run: bool,
    fingerprint: String,
}

/// What a replica found when it came to an occurrence.
enum Joined {
    /// Its passes are under way (or about to be): take some.
    Shared(Shared),
    /// Every pass is done (or a replica from before shared occurrences
    /// ran it to its last pass).
    Completed,
    /// A later occurrence was started: this one was missed.
    Missed,
}

/// Finds the occurrence of this kind and policy, or writes it with its
/// passes. The first replica to arrive lists the tenants once, for every
/// replica, under a transaction lock the others wait on.
async fn join(
    cx: &Context,
    prepared: &crate::context::Prepared,
    at: DateTime<Utc>,
    dry_run: bool,
) -> Result<Joined> {
    let schema = &cx.config.schema;
    let fingerprint = crate::peers::fingerprint(cx, prepared);
    let key = || occurrences::Key {
        at,
        dry_run,
        fingerprint: fingerprint.clone(),
    };
    let table = CohortTable::SweepRun.qualified(schema);
    let mut tx = cx.pool.begin().await?;
    locks::xact_lock(LockKey::Worker(&table))
        .query()
        .execute(&mut *tx)
        .await?;
    let found: Option<(Uuid, i32, bool)> = occurrences::find(schema, key())
        .query_as()
        .fetch_optional(&mut *tx)
        .await?;
    if let Some((id, passes, completed)) = found {
        tx.commit().await?;
        if completed {
            return Ok(Joined::Completed);
        }
        return Ok(Joined::Shared(Shared {
            id,
            at,
            passes,
            dry_run,
            fingerprint,
        }));
    }
    let later: bool = occurrences::later_started(schema, key())
        .query_scalar()
        .fetch_one(&mut *tx)
        .await?;
    if later {
        tx.commit().await?;
        return Ok(Joined::Missed);
    }
    // Runs without an occurrence record come from a replica of schema
    // version 9 or older: as it ran to its last pass, it is done.
    if decide(latest_run(cx, &mut tx, dry_run, at).await?) == Decision::Skip {
        tx.commit().await?;
        return Ok(Joined::Completed);
    }
    let (id, passes) = write_occurrence(cx, prepared, &mut tx, key()).await?;
    tx.commit().await?;
    Ok(Joined::Shared(Shared {
        id,
        at,
        passes,
        dry_run,
        fingerprint,
    }))
}

/// Lists the tenants once and writes the occurrence with its passes, in
/// the first replica's transaction. Returns its id and how many passes.
async fn write_occurrence(
    cx: &Context,
    prepared: &crate::context::Prepared,
    tx: &mut sqlx::PgConnection,
    key: occurrences::Key,
) -> Result<(Uuid, i32)> {
    let schema = &cx.config.schema;
    let list = crate::run::passes::pass_list(cx, prepared, &cx.tenant_source).await?;
    let passes = i32::try_from(list.passes.len()).map_err(|_| {
        Error::InvalidInput(format!(
            "an occurrence of {} passes is more than the ledger can number",
            list.passes.len()
        ))
    })?;
    let id = Uuid::new_v4();
    occurrences::insert(
        schema,
        occurrences::Insert {
            occurrence_id: id,
            at: key.at,
            dry_run: key.dry_run,
            fingerprint: key.fingerprint,
            passes,
            created_by: crate::peers::process_name(),
        },
    )
    .query()
    .execute(&mut *tx)
    .await?;
    let specs = serde_json::to_value(&list.passes).expect("passes serialise");
    occurrences::insert_passes(
        schema,
        occurrences::InsertPasses {
            occurrence_id: id,
            specs,
        },
    )
    .query()
    .execute(&mut *tx)
    .await?;
    Ok((id, passes))
}

/// A pass this replica holds: its lock is held on `conn` until the claim
/// (`token`) is settled.
struct Claimed {
    conn: crate::sql::locks::Held,
    pass: i32,
    spec: crate::run::passes::Pass,
    attempts: i32,
    token: Uuid,
}

/// What a replica can do next for an occurrence.
enum Next {
    /// Run this pass.
    Run(Box<Claimed>),
    /// Every pass left is being run by a live replica (or was just
    /// released): look again shortly.
    Wait,
    /// Every pass is done.
    Done,
}

/// The pass to run, holding `conn` (with the pass's lock) until settled;
/// `spec` is the pass as stored.
fn run_next(
    conn: crate::sql::locks::Held,
    pass: i32,
    spec: serde_json::Value,
    attempts: i32,
    token: Uuid,
) -> Result<Next> {
    let spec = serde_json::from_value(spec).map_err(|e| {
        Error::Migration(format!("a pass of a shared occurrence cannot be read: {e}"))
    })?;
    Ok(Next::Run(Box::new(Claimed {
        conn,
        pass,
        spec,
        attempts,
        token,
    })))
}

/// Claims the first pending pass (`FOR UPDATE SKIP LOCKED`, so replicas
/// never wait on each other), or else takes over a claimed pass whose
/// replica was lost (its lock is free). A pending pass is locked by the
/// statement that claims it, so a claim other replicas can see always has
/// a live holder or a free lock.
async fn next_pass(cx: &Context, occurrence: &Shared) -> Result<Next> {
    let schema = &cx.config.schema;
    let by = crate::peers::process_name();
    let token = Uuid::new_v4();
    let mut conn = crate::sql::locks::Held::new(cx.pool.acquire().await?);
    let pending = claim_pending(cx, occurrence, &mut conn, token, &by).await?;
    if let Some((pass, spec, attempts, locked)) = pending {
        if locked {
            return run_next(conn, pass, spec, attempts, token);
        }
        // A replica checking whether the pass lost its holder has its
        // lock for a moment: give the pass back.
        occurrences::unclaim(
            schema,
            occurrences::Unclaim {
                occurrence_id: occurrence.id,
                pass,
                token,
            },
        )
        .query()
        .execute(&mut *conn)
        .await?;
        drop(conn.into_inner());
        return Ok(Next::Wait);
    }
    let claimed: Vec<(i32, DateTime<Utc>)> = occurrences::claimed(
        schema,
        occurrences::Of {
            occurrence_id: occurrence.id,
        },
    )
    .query_as()
    .fetch_all(&mut *conn)
    .await?;
    for (pass, claimed_at) in claimed {
        let key = LockKey::Pass(occurrence.id, pass);
        if !locks::try_lock(&mut conn, key).await? {
            continue;
        }
        match take_over(cx, occurrence, &mut conn, pass, claimed_at, token, &by).await? {
            TakeOver::Taken(spec, attempts) => {
                return run_next(conn, pass, spec, attempts, token);
            }
            TakeOver::NotTaken => locks::unlock(&mut conn, key).await?,
            TakeOver::Settled => {}
        }
    }
    finish_or_wait(cx, occurrence, conn).await
}

/// Claims the first pending pass, locking it in the same statement:
/// its number, spec, attempts and whether its lock was taken.
async fn claim_pending(
    cx: &Context,
    occurrence: &Shared,
    conn: &mut crate::sql::locks::Held,
    token: Uuid,
    by: &str,
) -> Result<Option<(i32, serde_json::Value, i32, bool)>> {
    Ok(occurrences::claim_pending(
        &cx.config.schema,
        occurrences::Claim {
            occurrence_id: occurrence.id,
            token,
            by: by.to_owned(),
            lock_prefix: crate::locks::pass_prefix(occurrence.id),
        },
    )
    .query_as()
    .fetch_optional(&mut **conn)
    .await?)
}

/// No pass to take: the occurrence is complete when none is left (marked
/// so), otherwise its last passes are still running elsewhere.
async fn finish_or_wait(
    cx: &Context,
    occurrence: &Shared,
    mut conn: crate::sql::locks::Held,
) -> Result<Next> {
    let schema = &cx.config.schema;
    let of = || occurrences::Of {
        occurrence_id: occurrence.id,
    };
    let left: i64 = occurrences::remaining(schema, of())
        .query_scalar()
        .fetch_one(&mut *conn)
        .await?;
    if left > 0 {
        drop(conn.into_inner());
        return Ok(Next::Wait);
    }
    occurrences::complete(schema, of())
        .query()
        .execute(&mut *conn)
        .await?;
    drop(conn.into_inner());
    Ok(Next::Done)
}

/// What became of a claimed pass whose lock a replica took.
enum TakeOver {
    /// Run it (its spec and attempt number); its lock is held.
    Taken(serde_json::Value, i32),
    /// Settled, or its lost run is still ending: its lock is still held.
    NotTaken,
    /// Marked done with the run that finished it; its lock is released.
    Settled,
}

/// With the lock of a claimed pass taken (its replica was lost, or it
/// settled the pass a moment ago): settles the lost replica's run of it
/// failed, and takes the pass over (its spec and attempt number), unless
/// it was settled meanwhile, its run finished before its replica was lost
/// (the pass is then done with that run: a finished pass is never swept
/// again), or that run's session is still ending (try again shortly).
async fn take_over(
    cx: &Context,
    occurrence: &Shared,
    conn: &mut sqlx::PgConnection,
    pass: i32,
    claimed_at: DateTime<Utc>,
    token: Uuid,
    by: &str,
) -> Result<TakeOver> {
    let schema = &cx.config.schema;
    let of_pass = || occurrences::PassRuns {
        at: occurrence.at,
        pass,
        dry_run: occurrence.dry_run,
        fingerprint: occurrence.fingerprint.clone(),
    };
    let started: Vec<Uuid> = occurrences::started_of_pass(schema, of_pass())
        .query_scalar()
        .fetch_all(&mut *conn)
        .await?;
    let reason = "run: recovered: the worker replica running this pass stopped before it settled (owner lost)";
    for run_id in started {
        match crate::services::rescuer::recover_run(cx, run_id, reason).await? {
            crate::services::rescuer::Recovery::Recovered => {
                tracing::warn!(%run_id, occurrence = %occurrence.at, pass, "settled the run of a pass whose replica was lost as failed");
            }
            crate::services::rescuer::Recovery::Settled => {}
            crate::services::rescuer::Recovery::Live => return Ok(TakeOver::NotTaken),
        }
    }
    let taken: Option<(serde_json::Value, i32)> = occurrences::take_over(
        schema,
        occurrences::TakeOver {
            occurrence_id: occurrence.id,
            pass,
            token,
            by: by.to_owned(),
        },
    )
    .query_as()
    .fetch_optional(&mut *conn)
    .await?;
    let Some(taken) = taken else {
        return Ok(TakeOver::NotTaken);
    };
    let finished: Option<Uuid> = occurrences::finished_run(
        schema,
        occurrences::FinishedRun {
            runs: of_pass(),
            since: claimed_at,
        },
    )
    .query_scalar()
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(run_id) = finished {
        tracing::info!(%run_id, occurrence = %occurrence.at, pass, "the pass's run had finished before its replica was lost; not swept again");
        settle_claim(cx, occurrence, conn, pass, token, Some(run_id), true, true).await?;
        return Ok(TakeOver::Settled);
    }
    tracing::warn!(occurrence = %occurrence.at, pass, attempt = taken.1, "took over a pass whose replica was lost; sweeping it again, whole");
    Ok(TakeOver::Taken(taken.0, taken.1))
}

/// Ends a claim: done (with its run), or back to pending; releases the
/// pass's lock in the same statement when `conn` holds it (`holds_lock`).
/// Returns whether the lock was released.
#[allow(clippy::too_many_arguments)]
async fn settle_claim(
    cx: &Context,
    occurrence: &Shared,
    conn: &mut sqlx::PgConnection,
    pass: i32,
    token: Uuid,
    run_id: Option<Uuid>,
    done: bool,
    holds_lock: bool,
) -> Result<bool> {
    let (_, unlocked): (i64, Option<bool>) = occurrences::settle(
        &cx.config.schema,
        occurrences::Settle {
            occurrence_id: occurrence.id,
            pass,
            token,
            run_id,
            done,
            lock: holds_lock.then(|| LockKey::Pass(occurrence.id, pass).text()),
        },
    )
    .query_as()
    .fetch_one(&mut *conn)
    .await?;
    Ok(unlocked == Some(true))
}

/// One occurrence: write it or join it, then take its passes one at a
/// time until none is left; wait for passes other replicas run (taking
/// over any whose replica is lost) until the next occurrence is due.
pub(crate) async fn occurrence(
    cx: &Arc<Context>,
    config: &WorkerConfig,
    at: DateTime<Utc>,
    cancel: &Cancel,
) -> Result<Occurrence> {
    // Validation (first use) before anything is written.
    let prepared = cx.prepared().await?;
    let give_up = next_occurrence(&config.schedule, at, None);
    let too_late = |now: DateTime<Utc>| give_up.is_some_and(|g| now >= g);
    if cancel.is_cancelled() {
        return Ok(Occurrence::Cancelled { passes: 0 });
    }
    let settings = cx.live_settings().await?;
    if settings.kill_switch.effective {
        tracing::warn!(occurrence = %at, "kill switch is on; occurrence skipped");
        return Ok(Occurrence::KillSwitch { passes: 0 });
    }
    let dry_run = settings.dry_run.effective;
    let shared = match join(cx, &prepared, at, dry_run).await? {
        Joined::Shared(shared) => shared,
        Joined::Completed => return Ok(Occurrence::AlreadyRan),
        Joined::Missed => {
            tracing::info!(occurrence = %at, "a later occurrence was started; skipped");
            return Ok(Occurrence::LockHeld);
        }
    };
    // Runs of earlier occurrences whose replica was lost.
    recover_orphans(cx).await?;
    let round = crate::telemetry::backlog_round_started();
    let (mut ran, mut rerun) = (0usize, false);
    loop {
        if cancel.is_cancelled() {
            return Ok(Occurrence::Cancelled { passes: ran });
        }
        if ran > 0 {
            let now = cx.live_settings().await?;
            if now.kill_switch.effective {
                tracing::warn!(occurrence = %at, passes = ran, "kill switch turned on; later passes skipped");
                return Ok(Occurrence::KillSwitch { passes: ran });
            }
            if now.dry_run.effective != dry_run {
                // One occurrence is of one kind: the rest runs at the next
                // occurrence as the setting now says.
                tracing::warn!(occurrence = %at, passes = ran, dry_run = now.dry_run.effective, "dry_run changed; later passes skipped");
                return Ok(Occurrence::DryRunChanged { passes: ran });
            }
        }
        match next_pass(cx, &shared).await? {
            Next::Run(claimed) => {
                ran += 1;
                rerun |= claimed.attempts > 1;
                run_claimed(cx, &shared, *claimed, cancel).await?;
            }
            Next::Wait => {
                if too_late(db_now(&cx.pool).await?) {
                    tracing::info!(occurrence = %at, passes = ran, "other replicas still ran passes of this occurrence when the next was due; left to them");
                    return Ok(if ran > 0 {
                        Occurrence::Ran { passes: ran, rerun }
                    } else {
                        Occurrence::LockHeld
                    });
                }
                cancel.sleep(LOCK_POLL).await;
            }
            Next::Done => break,
        }
    }
    if ran == 0 {
        return Ok(Occurrence::AlreadyRan);
    }
    if ran == usize::try_from(shared.passes).unwrap_or(usize::MAX) {
        // This replica ran every pass: a backlog measured only by earlier
        // occurrences (a tenant no longer listed) stops counting.
        crate::telemetry::backlog_round_done(round);
    }
    Ok(Occurrence::Ran { passes: ran, rerun })
}

/// Runs a claimed pass and settles the claim: done, or back to pending
/// when its run was cancelled (another replica sweeps it again, whole).
/// The pass's lock is released with the claim; if its session was lost
/// meanwhile, the claim is settled on a fresh connection (only if no
/// replica took it over) and the occurrence fails.
async fn run_claimed(
    cx: &Arc<Context>,
    occurrence: &Shared,
    mut claimed: Claimed,
    cancel: &Cancel,
) -> Result<()> {
    let position = crate::run::OccurrencePass {
        at: occurrence.at,
        pass: claimed.pass,
        passes: occurrence.passes,
    };
    let (end, lost) = match claimed.spec.failure() {
        Some(failure) => {
            tracing::error!(occurrence = %occurrence.at, position = failure.position, error = %failure.error, "scheduled pass cannot run; the other passes go on");
            let text = format!("pass: did not start: kind=invalid_input {}", failure.error);
            let run_id = record_not_started(cx, None, position, occurrence.dry_run, &text).await;
            (
                PassEnd {
                    run_id,
                    cancelled: false,
                },
                None,
            )
        }
        None => {
            run_pass(
                cx,
                &mut claimed.conn,
                &claimed.spec,
                position,
                occurrence.dry_run,
                cancel,
            )
            .await
        }
    };
    let done = !end.cancelled;
    if lost.is_none() {
        let settled = settle_claim(
            cx,
            occurrence,
            &mut claimed.conn,
            claimed.pass,
            claimed.token,
            end.run_id,
            done,
            true,
        )
        .await;
        if matches!(settled, Ok(true)) {
            drop(claimed.conn.into_inner());
        }
        // Otherwise dropping `Held` closes the session, releasing the lock.
        return settled.map(drop);
    }
    // The claim's session is gone (and its lock with it): settle on
    // another connection; a replica that took the pass over meanwhile
    // holds another token, and this changes nothing.
    let mut fresh = cx.pool.acquire().await?;
    settle_claim(
        cx,
        occurrence,
        &mut fresh,
        claimed.pass,
        claimed.token,
        end.run_id,
        done,
        false,
    )
    .await?;
    Err(lost.expect("checked").into())
}

/// How a pass ended: its run (if one was written) and whether it was
/// cancelled (the pass goes back to pending).
struct PassEnd {
    run_id: Option<Uuid>,
    cancelled: bool,
}

/// How often the pass lock's session is used during a long pass, so
/// no idle time-out (a proxy's, `idle_session_timeout`) can end it.
const LOCK_KEEPALIVE: Duration = Duration::from_secs(30);

/// Runs one pass in its own task (a panic in user code, such as a rule
/// provider or an anonymiser, fails the pass, not the occurrence), keeping
/// the lock's session alive meanwhile. A pass that fails before its run
/// exists is recorded as a failed run, so the occurrence still counts as
/// run to its last pass. Returns how it ended, and the error that ended
/// the lock's session if it was lost meanwhile.
async fn run_pass(
    cx: &Arc<Context>,
    lock_conn: &mut sqlx::PgConnection,
    pass: &crate::run::passes::Pass,
    position: crate::run::OccurrencePass,
    dry_run: bool,
    cancel: &Cancel,
) -> (PassEnd, Option<sqlx::Error>) {
    let nothing = PassEnd {
        run_id: None,
        cancelled: false,
    };
    let Some(mut req) = crate::run::passes::pass_request(pass, position.at) else {
        return (nothing, None);
    };
    let tenant = req.tenancy.tenant.clone();
    req.dry_run = dry_run;
    req.trigger = Trigger::Scheduled;
    req.occurrence = Some(position);
    req.cancel = cancel.clone();
    let mut task = AbortOnDrop(tokio::spawn({
        let cx = Arc::clone(cx);
        async move { crate::run::sweep::sweep(&cx, req).await }
    }));
    let mut lost: Option<sqlx::Error> = None;
    let joined = loop {
        tokio::select! {
            joined = &mut task.0 => break joined,
            _ = tokio::time::sleep(LOCK_KEEPALIVE), if lost.is_none() => {
                if let Err(e) = sql::worker::keepalive().query().execute(&mut *lock_conn).await {
                    tracing::error!(error = %e, "lost the pass lock's session; another replica may take the pass over");
                    lost = Some(e);
                }
            }
        }
    };
    let shown = tenant.as_deref().unwrap_or("(tenantless)");
    let end = match joined {
        Ok(Ok(r)) => {
            match r.status {
                RunStatus::Succeeded => {
                    tracing::info!(tenant = shown, run_id = %r.run_id, affected = r.affected(), dry_run = r.dry_run, "scheduled pass succeeded")
                }
                status => {
                    tracing::error!(tenant = shown, run_id = %r.run_id, status = status.as_str(), failures = r.failures.len(), "scheduled pass did not succeed; the other passes go on")
                }
            }
            PassEnd {
                run_id: Some(r.run_id),
                cancelled: r.status == RunStatus::Cancelled,
            }
        }
        Ok(Err(e)) => {
            tracing::error!(tenant = shown, error = %e, "scheduled pass failed before its run started; the other passes go on");
            let text = format!("pass: did not start: kind={} {e}", e.kind().as_str());
            PassEnd {
                run_id: record_not_started(cx, tenant.as_deref(), position, dry_run, &text).await,
                cancelled: false,
            }
        }
        Err(e) => {
            tracing::error!(tenant = shown, error = %e, "scheduled pass panicked; the other passes go on");
            PassEnd {
                run_id: after_panic(cx, tenant.as_deref(), position, dry_run).await,
                cancelled: false,
            }
        }
    };
    (end, lost)
}

/// After a pass panicked: a run it had started is settled failed as soon
/// as its connection (closed as it unwound) has let go of its lock; if it
/// panicked before its run existed, that is recorded as a failed run
/// (whose id is returned).
async fn after_panic(
    cx: &Context,
    tenant: Option<&str>,
    position: crate::run::OccurrencePass,
    dry_run: bool,
) -> Option<Uuid> {
    let reason = "run: recovered: the scheduled pass panicked before it settled";
    let mut recovered = 0;
    for _ in 0..20 {
        let Ok((done, live)) = settle_orphans(cx, reason).await else {
            break;
        };
        recovered += done;
        if live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if recovered > 0 {
        return None;
    }
    // It panicked before its run existed.
    let text = "pass: did not start: kind=panic the pass panicked (a rule provider, anonymiser or handler with a bug)";
    record_not_started(cx, tenant, position, dry_run, text).await
}

/// Records a pass that failed before its run existed as a settled failed
/// run of its occurrence: what failed stays in the ledger, and the
/// occurrence still counts as run to its last pass (otherwise every
/// replica would sweep it again). A failure to record is only logged.
/// Returns the run's id when it was recorded.
async fn record_not_started(
    cx: &Context,
    tenant: Option<&str>,
    position: crate::run::OccurrencePass,
    dry_run: bool,
    text: &str,
) -> Option<Uuid> {
    let run_id = Uuid::new_v4();
    let recorded = async {
        let prepared = cx.prepared().await?;
        // The tenant as the ledger stores every other run's: canonical (an
        // id that cannot be a tenant, often why the pass failed, as listed).
        let identity = prepared.model.tenant_identity();
        let tenant = tenant.map(|t| identity.canonical(t).unwrap_or_else(|| t.to_string()));
        let failed = sql::ledger::InsertNotStarted {
            run_id,
            dry_run,
            tenant,
            occurrence: position.at,
            error: text.to_owned(),
            pass: position.pass,
            passes: position.passes,
            policy_fingerprint: crate::peers::fingerprint(cx, &prepared),
        };
        let mut conn = cx.pool.acquire().await?;
        let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
        prepared
            .ledger
            .insert_not_started(failed)
            .query()
            .execute(&mut *tx)
            .await?;
        crate::run::chain::link_run(
            &mut tx,
            &cx.config.schema,
            cx.config.ledger_key.as_ref(),
            run_id,
        )
        .await?;
        tx.commit().await?;
        crate::telemetry::run_recorded_failed("sweep", "scheduled");
        Ok::<_, Error>(())
    };
    match recorded.await {
        Ok(()) => Some(run_id),
        Err(e) => {
            tracing::warn!(error = %e, "could not record the pass that did not start");
            None
        }
    }
}

/// Settles `failed` every scheduled sweep left `started` whose run lock is
/// free: a live run holds its own lock from before it is written as
/// started, so such a run lost its owner. Returns (recovered, still
/// holding their lock: live, on this replica or another).
async fn settle_orphans(cx: &Context, reason: &str) -> Result<(u64, u64)> {
    let orphans: Vec<uuid::Uuid> = sql::worker::started_scheduled(&cx.config.schema)
        .query_scalar()
        .fetch_all(&cx.pool)
        .await?;
    let (mut recovered, mut live) = (0, 0);
    for run_id in orphans {
        match crate::services::rescuer::recover_run(cx, run_id, reason).await? {
            crate::services::rescuer::Recovery::Recovered => {
                tracing::warn!(%run_id, reason, "settled a scheduled run whose owner was lost as failed");
                recovered += 1;
            }
            crate::services::rescuer::Recovery::Settled => {}
            crate::services::rescuer::Recovery::Live => live += 1,
        }
    }
    Ok((recovered, live))
}

/// [`settle_orphans`] for runs whose worker replica was lost.
async fn recover_orphans(cx: &Context) -> Result<()> {
    let reason = "run: recovered: the worker running this scheduled occurrence stopped before it settled (owner lost)";
    settle_orphans(cx, reason).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_are_validated() {
        assert!(WorkerConfig::new("0 2 * * *").is_ok());
        assert!(WorkerConfig::new("*/5 * * * * *").is_ok());
        assert!(WorkerConfig::new("@daily").is_ok());
        for bad in ["", "every day", "61 * * * *", "0 2 * *", "0 0 2 * * * 2030"] {
            let e = WorkerConfig::new(bad).unwrap_err();
            assert!(
                e.to_string().contains("not a valid cron expression"),
                "{bad}: {e}"
            );
        }
        assert!(
            WorkerConfig::from_config(&crate::config::CohortConfig::default())
                .unwrap()
                .is_none()
        );
    }
}
