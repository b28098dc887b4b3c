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
use crate::ident::SqlText;
use crate::locks::{self, LockKey};
use crate::run::{RunStatus, Trigger};
use crate::schema::CohortTable;

/// How often a replica retries the occurrence lock while another holds it.
const LOCK_POLL: Duration = Duration::from_millis(250);
/// Wall clocks further than this from the database's are logged.
const SKEW_WARNING: chrono::TimeDelta = chrono::TimeDelta::seconds(5);

/// The worker's settings: a validated cron schedule.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    schedule: croner::Cron,
    expression: String,
    local_clock_offset: chrono::TimeDelta,
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
            local_clock_offset: chrono::TimeDelta::zero(),
        })
    }

    /// The worker of `config`'s `schedule`; `None` when no schedule is set
    /// (the worker stays idle).
    pub fn from_config(config: &crate::CohortConfig) -> Result<Option<Self>> {
        config.schedule.as_deref().map(Self::new).transpose()
    }

    /// The cron expression.
    pub fn schedule(&self) -> &str {
        &self.expression
    }

    /// Test hook: pretends this replica's wall clock is off by `offset`.
    /// Scheduling never reads the wall clock, so this only changes the
    /// skew warning; the replica tests use it to prove exactly that.
    #[doc(hidden)]
    pub fn local_clock_offset(mut self, offset: chrono::TimeDelta) -> Self {
        self.local_clock_offset = offset;
        self
    }

    fn local_now(&self) -> DateTime<Utc> {
        Utc::now() + self.local_clock_offset
    }
}

/// Parses a schedule: five cron fields (minute first), six (second
/// first), or a nickname such as `@daily`; evaluated in UTC.
pub(crate) fn parse_schedule(schedule: &str) -> std::result::Result<croner::Cron, String> {
    let fields = schedule.split_whitespace().count();
    let nickname = fields == 1 && schedule.trim_start().starts_with('@');
    if !(nickname || fields == 5 || fields == 6) {
        return Err(format!(
            "schedule {schedule:?} is not a valid cron expression: expected five fields (minute hour day month weekday), six (second first) or a nickname such as @daily, not {fields}"
        ));
    }
    schedule
        .parse::<croner::Cron>()
        .map_err(|e| format!("schedule {schedule:?} is not a valid cron expression: {e}"))
}

/// The first occurrence of `schedule` strictly after both the database's
/// `now` and the occurrence this replica ran last (a replica never runs
/// one occurrence twice, even if the database clock were to step back).
pub(crate) fn next_occurrence(
    schedule: &croner::Cron,
    db_now: DateTime<Utc>,
    last: Option<DateTime<Utc>>,
) -> Option<DateTime<Utc>> {
    use chrono::{SubsecRound, Timelike};
    // Cron has whole seconds: search from the whole second (the search is
    // exclusive, so an occurrence at exactly that second is past).
    let from = last.map_or(db_now, |l| l.max(db_now)).trunc_subsecs(0);
    schedule
        .find_next_occurrence(&from, false)
        .ok()
        .map(|t| t.with_nanosecond(0).unwrap_or(t))
}

/// What a replica holding the occurrence lock does with an occurrence,
/// given the latest Scheduled run of the same kind for it (or a later
/// one): its status, and which pass of how many it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// No run for it yet.
    Run,
    /// Its latest run lost its owner (`Started` while nobody holds the
    /// lock), was cancelled, or was not its last pass (the owner stopped
    /// between passes): sweep it again, every pass.
    Rerun,
    /// It ran to its last pass (settled Succeeded, PartiallyFailed or
    /// Failed; failures are retried at the next occurrence).
    Skip,
}

/// The latest scheduled run of an occurrence, as [`decide`] needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Latest {
    pub(crate) status: RunStatus,
    pub(crate) pass: i32,
    pub(crate) passes: i32,
}

pub(crate) fn decide(latest: Option<Latest>) -> Decision {
    match latest {
        None => Decision::Run,
        Some(l) => match l.status {
            RunStatus::Started | RunStatus::Cancelled => Decision::Rerun,
            RunStatus::Succeeded | RunStatus::PartiallyFailed | RunStatus::Failed
                if l.pass < l.passes =>
            {
                Decision::Rerun
            }
            RunStatus::Succeeded | RunStatus::PartiallyFailed | RunStatus::Failed => Decision::Skip,
        },
    }
}

/// How long to wait before trying again after `failures` failed
/// iterations in a row (the database unreachable, say): 1 s doubling to
/// at most 60 s.
pub(crate) fn retry_delay(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(6);
    Duration::from_secs((1u64 << exponent).min(60))
}

/// How one occurrence ended on this replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Occurrence {
    /// Every pass ran (each pass's own outcome is in the ledger).
    Ran { passes: usize, rerun: bool },
    /// Another replica's run of it settled; nothing to do.
    AlreadyRan,
    /// Another replica held the lock until the next occurrence was due.
    LockHeld,
    /// The kill switch was on before the first pass, or turned on after
    /// `passes` passes.
    KillSwitch { passes: usize },
    /// `dry_run` changed after `passes` passes: one occurrence is of one
    /// kind, so the rest waits for the next occurrence.
    DryRunChanged { passes: usize },
    /// Shutdown stopped it after `passes` passes.
    Cancelled { passes: usize },
}

/// Aborts a spawned task when dropped (so aborting the worker aborts the
/// occurrence and pass it is running).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the worker until `cancel` fires.
pub(crate) async fn run(cx: Arc<Context>, config: WorkerConfig, cancel: Cancel) {
    tracing::info!(schedule = %config.expression, "scheduled worker started (UTC, database clock)");
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
        match (&mut task.0).await {
            Ok(Ok(outcome)) => {
                failures = 0;
                tracing::info!(occurrence = %next, outcome = ?outcome, "occurrence done");
            }
            Ok(Err(e)) => {
                failures += 1;
                tracing::error!(occurrence = %next, error = %e, "occurrence failed; retrying at the next occurrence");
            }
            Err(e) => {
                failures += 1;
                tracing::error!(occurrence = %next, error = %e, "occurrence panicked; retrying at the next occurrence");
            }
        }
    }
    tracing::info!("scheduled worker stopped");
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
        let mut conn = locks::Held::new(cx.pool.acquire().await?);
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
    let mut sql = SqlText::new("SELECT status, occurrence_pass, occurrence_passes FROM ");
    sql.table(&CohortTable::SweepRun.qualified(&cx.config.schema)).push(
        " WHERE kind = 'sweep' AND trigger = 'scheduled' AND dry_run = $1 AND occurrence >= $2 \
           AND (policy_fingerprint IS NULL OR policy_fingerprint = $3) \
         ORDER BY started_at DESC, run_id DESC LIMIT 1",
    );
    let prepared = cx.prepared().await?;
    let row: Option<(String, i32, i32)> = sqlx::query_as(sql.into_sql())
        .bind(dry_run)
        .bind(at)
        .bind(crate::peers::fingerprint(cx, &prepared))
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
    let settings = crate::settings::read(cx).await?;
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
    let total = i32::try_from(list.passes.len()).unwrap_or(i32::MAX);
    let mut passes = 0;
    for pass in list.passes {
        if cancel.is_cancelled() {
            return Ok(Locked::Done(Occurrence::Cancelled { passes }));
        }
        if passes > 0 {
            let now = crate::settings::read(cx).await?;
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
        sqlx::query("SELECT 1").execute(&mut *lock_conn).await?;
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
                if let Err(e) = sqlx::query("SELECT 1").execute(&mut *lock_conn).await {
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
        sqlx::query(prepared.ledger.insert_not_started.sql())
            .bind(uuid::Uuid::new_v4())
            .bind(dry_run)
            .bind(tenant)
            .bind(position.at)
            .bind(text)
            .bind(position.pass)
            .bind(position.passes)
            .bind(crate::peers::fingerprint(cx, &prepared))
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
    let mut sql = SqlText::new("SELECT run_id FROM ");
    sql.table(&CohortTable::SweepRun.qualified(&cx.config.schema))
        .push(" WHERE status = 'started' AND trigger = 'scheduled' AND kind = 'sweep'");
    let orphans: Vec<uuid::Uuid> = sqlx::query_scalar(sql.into_sql())
        .fetch_all(&cx.pool)
        .await?;
    let (mut recovered, mut live) = (0, 0);
    for run_id in orphans {
        match crate::handlers::recover_run(cx, run_id, reason).await? {
            crate::handlers::Recovery::Recovered => {
                tracing::warn!(%run_id, reason, "settled a scheduled run whose owner was lost as failed");
                recovered += 1;
            }
            crate::handlers::Recovery::Settled => {}
            crate::handlers::Recovery::Live => live += 1,
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

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn next_occurrence_follows_the_database_clock_and_never_repeats() {
        let daily: croner::Cron = "0 2 * * *".parse().unwrap();
        let every5s: croner::Cron = "*/5 * * * * *".parse().unwrap();
        let cases: &[(&croner::Cron, &str, Option<&str>, &str)] = &[
            // (schedule, database now, last run, expected next)
            (&daily, "2026-11-30T01:59:59Z", None, "2026-11-30T02:00:00Z"),
            // Exactly at an occurrence: that one is past, the next is due.
            (&daily, "2026-11-30T02:00:00Z", None, "2026-12-01T02:00:00Z"),
            // Missed occurrences are skipped, not caught up.
            (
                &daily,
                "2026-12-03T11:00:00Z",
                Some("2026-11-30T02:00:00Z"),
                "2026-12-04T02:00:00Z",
            ),
            // A database clock that stepped back never repeats the last run.
            (
                &every5s,
                "2026-11-30T10:00:03Z",
                Some("2026-11-30T10:00:05Z"),
                "2026-11-30T10:00:10Z",
            ),
            (
                &every5s,
                "2026-11-30T10:00:04.999Z",
                None,
                "2026-11-30T10:00:05Z",
            ),
            (
                &every5s,
                "2026-11-30T10:00:05.001Z",
                None,
                "2026-11-30T10:00:10Z",
            ),
            // Month and year ends.
            (&daily, "2026-12-31T23:00:00Z", None, "2027-01-01T02:00:00Z"),
        ];
        for (schedule, now, last, want) in cases {
            assert_eq!(
                next_occurrence(schedule, at(now), last.map(at)),
                Some(at(want)),
                "now {now}, last {last:?}"
            );
        }
    }

    #[test]
    fn the_decision_reruns_only_interrupted_occurrences() {
        let l = |status, pass, passes| {
            Some(Latest {
                status,
                pass,
                passes,
            })
        };
        use RunStatus::*;
        let cases = [
            (None, Decision::Run),
            // Owner lost mid-pass, or stopped by shutdown: again, whole.
            (l(Started, 3, 3), Decision::Rerun),
            (l(Started, 1, 3), Decision::Rerun),
            (l(Cancelled, 3, 3), Decision::Rerun),
            // Owner lost between passes.
            (l(Succeeded, 1, 3), Decision::Rerun),
            (l(PartiallyFailed, 2, 3), Decision::Rerun),
            // It ran to its last pass, whatever that pass's outcome.
            (l(Succeeded, 3, 3), Decision::Skip),
            (l(PartiallyFailed, 3, 3), Decision::Skip),
            (l(Failed, 3, 3), Decision::Skip),
            (l(Succeeded, 1, 1), Decision::Skip),
        ];
        for (latest, want) in cases {
            assert_eq!(decide(latest), want, "{latest:?}");
        }
    }

    #[test]
    fn retry_delay_doubles_and_saturates() {
        let got: Vec<u64> = [0, 1, 2, 3, 6, 7, 8, 100, u32::MAX]
            .iter()
            .map(|&n| retry_delay(n).as_secs())
            .collect();
        assert_eq!(got, [1, 1, 2, 4, 32, 60, 60, 60, 60]);
    }

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
        assert!(WorkerConfig::from_config(&crate::CohortConfig::default())
            .unwrap()
            .is_none());
        let skewed = WorkerConfig::new("0 2 * * *")
            .unwrap()
            .local_clock_offset(chrono::TimeDelta::hours(1));
        let diff = skewed.local_now() - Utc::now();
        assert!(diff > chrono::TimeDelta::minutes(59), "{diff}");
    }
}
