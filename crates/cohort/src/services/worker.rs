//! The scheduled worker: sweeps every tenant, then the tenantless entities,
//! at each occurrence of a cron schedule (UTC), once across replicas.
//!
//! How replicas agree:
//! - Occurrences are computed from the database clock (read at the start
//!   of each iteration), never the replica's, and the wait until the next
//!   one is measured on the monotonic clock. A replica whose wall clock is
//!   off neither runs an occurrence twice nor skips one.
//! - The replica that runs an occurrence holds a session-level advisory
//!   lock keyed on the install's schema-qualified `sweep_run` table for the
//!   whole occurrence. The others poll for it until the next occurrence is
//!   due, then give up on this one.
//! - Under the lock, an occurrence whose latest Scheduled run of the same
//!   kind (dry or real) settled is skipped: it ran. One whose latest run is
//!   still `Started` (its owner died: the lock went with its session) or
//!   `Cancelled` is swept again, whole. Orphaned `Started` runs are settled
//!   `Failed` first.
//! - Missed occurrences are skipped, not caught up. A failed iteration is
//!   logged and tried again at the next occurrence; the worker never stops
//!   its host.

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
use crate::sql::locks;

/// How often a replica retries the occurrence lock while another holds it.
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

/// What the part of an occurrence under the lock asks of its caller.
enum Locked {
    /// The occurrence ended this way.
    Done(Occurrence),
    /// A `Started` run of a lost owner still holds its run lock (a killed
    /// process's session ends when its statement does): let go of the
    /// occurrence lock and try again shortly.
    OrphanStillLive,
}

/// One occurrence: take the lock (or give up when the next occurrence is
/// due), decide, recover orphans, run the passes.
pub(crate) async fn occurrence(
    cx: &Arc<Context>,
    config: &WorkerConfig,
    at: DateTime<Utc>,
    cancel: &Cancel,
) -> Result<Occurrence> {
    // Validation (first use) before the lock, not under it.
    let prepared = cx.prepared().await?;
    let table = CohortTable::SweepRun.qualified(&cx.config.schema);
    let key = LockKey::Worker(&table);
    let give_up = next_occurrence(&config.schedule, at, None);
    let too_late = |now: DateTime<Utc>| give_up.is_some_and(|g| now >= g);
    loop {
        if cancel.is_cancelled() {
            return Ok(Occurrence::Cancelled { passes: 0 });
        }
        // A connection per attempt: a waiting replica holds none. Whatever
        // happens once it holds the lock (a panic, an abort), the lock
        // never goes back to the pool with the connection.
        let mut conn = crate::locks::Held::new(cx.pool.acquire().await?);
        if locks::try_lock(&mut conn, key).await? {
            let result = if too_late(db_now(&mut *conn).await?) {
                tracing::info!(occurrence = %at, "the sweep lock came free after the next occurrence was due; skipped");
                Ok(Locked::Done(Occurrence::LockHeld))
            } else {
                locked(cx, &prepared, &mut conn, at, cancel).await
            };
            if locks::unlock(&mut conn, key).await.is_ok() {
                drop(conn.into_inner());
            }
            // Otherwise dropping `Held` closes the session, releasing it.
            match result? {
                Locked::Done(outcome) => return Ok(outcome),
                Locked::OrphanStillLive => {}
            }
        } else {
            drop(conn.into_inner());
        }
        if too_late(db_now(&cx.pool).await?) {
            tracing::info!(occurrence = %at, "another replica held the sweep lock until the next occurrence; skipped");
            return Ok(Occurrence::LockHeld);
        }
        cancel.sleep(LOCK_POLL).await;
    }
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

/// The part of an occurrence run under the lock.
async fn locked(
    cx: &Arc<Context>,
    prepared: &crate::context::Prepared,
    lock_conn: &mut sqlx::PgConnection,
    at: DateTime<Utc>,
    cancel: &Cancel,
) -> Result<Locked> {
    let settings = cx.live_settings().await?;
    if settings.kill_switch.effective {
        tracing::warn!(occurrence = %at, "kill switch is on; occurrence skipped");
        return Ok(Locked::Done(Occurrence::KillSwitch { passes: 0 }));
    }
    let dry_run = settings.dry_run.effective;
    let decision = decide(latest_run(cx, lock_conn, dry_run, at).await?);
    let live = recover_orphans(cx).await?;
    if decision == Decision::Skip {
        return Ok(Locked::Done(Occurrence::AlreadyRan));
    }
    if live > 0 {
        return Ok(Locked::OrphanStillLive);
    }
    let rerun = decision == Decision::Rerun;
    if rerun {
        tracing::warn!(occurrence = %at, dry_run, "occurrence's last attempt was interrupted; sweeping it again");
    }
    let list = crate::run::passes::pass_list(cx, prepared, &cx.tenant_source).await?;
    let round = crate::telemetry::backlog_round_started();
    let total = i32::try_from(list.passes.len()).unwrap_or(i32::MAX);
    let mut passes = 0;
    for pass in list.passes {
        if cancel.is_cancelled() {
            return Ok(Locked::Done(Occurrence::Cancelled { passes }));
        }
        if passes > 0 {
            let now = cx.live_settings().await?;
            if now.kill_switch.effective {
                tracing::warn!(occurrence = %at, passes, "kill switch turned on; later passes skipped");
                return Ok(Locked::Done(Occurrence::KillSwitch { passes }));
            }
            if now.dry_run.effective != dry_run {
                // One occurrence is of one kind: the rest runs at the next
                // occurrence as the setting now says.
                tracing::warn!(occurrence = %at, passes, dry_run = now.dry_run.effective, "dry_run changed; later passes skipped");
                return Ok(Locked::Done(Occurrence::DryRunChanged { passes }));
            }
        }
        // The lock's session must still be ours (a session lock lives
        // exactly as long as its session).
        sql::worker::keepalive()
            .query()
            .execute(&mut *lock_conn)
            .await?;
        passes += 1;
        let position = crate::run::OccurrencePass {
            at,
            pass: i32::try_from(passes).unwrap_or(i32::MAX),
            passes: total,
        };
        match pass.failure() {
            Some(failure) => {
                tracing::error!(occurrence = %at, position = failure.position, error = %failure.error, "scheduled pass cannot run; the other passes go on");
                let text = format!("pass: did not start: kind=invalid_input {}", failure.error);
                record_not_started(cx, None, position, dry_run, &text).await;
            }
            None => run_pass(cx, lock_conn, &pass, position, dry_run, cancel).await?,
        }
    }
    if cancel.is_cancelled() {
        return Ok(Locked::Done(Occurrence::Cancelled { passes }));
    }
    // Every pass ran: a backlog measured only by earlier occurrences (a
    // tenant no longer listed) stops counting.
    crate::telemetry::backlog_round_done(round);
    Ok(Locked::Done(Occurrence::Ran { passes, rerun }))
}

/// How often the occurrence lock's session is used during a long pass, so
/// no idle time-out (a proxy's, `idle_session_timeout`) can end it.
const LOCK_KEEPALIVE: Duration = Duration::from_secs(30);

/// Runs one pass in its own task (a panic in user code, such as a rule
/// provider or an anonymiser, fails the pass, not the occurrence), keeping
/// the lock's session alive meanwhile. A pass that fails before its run
/// exists is recorded as a failed run, so the occurrence still counts as
/// run to its last pass.
async fn run_pass(
    cx: &Arc<Context>,
    lock_conn: &mut sqlx::PgConnection,
    pass: &crate::run::passes::Pass,
    position: crate::run::OccurrencePass,
    dry_run: bool,
    cancel: &Cancel,
) -> Result<()> {
    let Some(mut req) = crate::run::passes::pass_request(pass, position.at) else {
        return Ok(());
    };
    let tenant = req.tenant.clone();
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
                    tracing::error!(error = %e, "lost the occurrence lock's session; another replica may start this occurrence");
                    lost = Some(e);
                }
            }
        }
    };
    let shown = tenant.as_deref().unwrap_or("(tenantless)");
    match joined {
        Ok(Ok(r)) => match r.status {
            RunStatus::Succeeded => {
                tracing::info!(tenant = shown, run_id = %r.run_id, affected = r.affected(), dry_run = r.dry_run, "scheduled pass succeeded")
            }
            status => {
                tracing::error!(tenant = shown, run_id = %r.run_id, status = status.as_str(), failures = r.failures.len(), "scheduled pass did not succeed; the other passes go on")
            }
        },
        Ok(Err(e)) => {
            tracing::error!(tenant = shown, error = %e, "scheduled pass failed before its run started; the other passes go on");
            let text = format!("pass: did not start: kind={} {e}", e.kind().as_str());
            record_not_started(cx, tenant.as_deref(), position, dry_run, &text).await;
        }
        Err(e) => {
            tracing::error!(tenant = shown, error = %e, "scheduled pass panicked; the other passes go on");
            // A run it had started is settled failed as soon as its
            // connection (closed as it unwound) has let go of its lock.
            let reason = "run: recovered: the scheduled pass panicked before it settled";
            let mut recovered = 0;
            for _ in 0..20 {
                let (done, live) = settle_orphans(cx, reason).await?;
                recovered += done;
                if live == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if recovered == 0 {
                // It panicked before its run existed.
                let text = "pass: did not start: kind=panic the pass panicked (a rule provider, anonymiser or handler with a bug)";
                record_not_started(cx, tenant.as_deref(), position, dry_run, text).await;
            }
        }
    }
    match lost {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// Records a pass that failed before its run existed as a settled failed
/// run of its occurrence: what failed stays in the ledger, and the
/// occurrence still counts as run to its last pass (otherwise every
/// replica would sweep it again). A failure to record is only logged.
async fn record_not_started(
    cx: &Context,
    tenant: Option<&str>,
    position: crate::run::OccurrencePass,
    dry_run: bool,
    text: &str,
) {
    let recorded = async {
        let prepared = cx.prepared().await?;
        // The tenant as the ledger stores every other run's: canonical (an
        // id that cannot be a tenant, often why the pass failed, as listed).
        let identity = prepared.model.tenant_identity();
        let tenant = tenant.map(|t| identity.canonical(t).unwrap_or_else(|| t.to_string()));
        let failed = sql::ledger::InsertNotStarted {
            run_id: uuid::Uuid::new_v4(),
            dry_run,
            tenant,
            occurrence: position.at,
            error: text.to_owned(),
            pass: position.pass,
            passes: position.passes,
            policy_fingerprint: crate::peers::fingerprint(cx, &prepared),
        };
        prepared
            .ledger
            .insert_not_started(failed)
            .query()
            .execute(&cx.pool)
            .await?;
        crate::telemetry::run_recorded_failed("sweep", "scheduled");
        Ok::<_, Error>(())
    };
    if let Err(e) = recorded.await {
        tracing::warn!(error = %e, "could not record the pass that did not start");
    }
}

/// Settles `failed` every scheduled sweep left `started` whose run lock is
/// free: under the occurrence lock nobody else runs scheduled sweeps, and
/// a live run holds its own lock, so such a run lost its owner. Returns
/// (recovered, still holding their lock).
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

/// [`settle_orphans`] for runs whose worker was lost; returns how many
/// still hold their run lock.
async fn recover_orphans(cx: &Context) -> Result<u64> {
    let reason = "run: recovered: the worker running this scheduled occurrence stopped before it settled (owner lost)";
    Ok(settle_orphans(cx, reason).await?.1)
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
