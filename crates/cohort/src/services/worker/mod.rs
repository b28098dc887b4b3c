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

use crate::base::cancel::Cancel;
use crate::context::{Context, Ready};
use crate::domain::schedule::{next_occurrence, parse_schedule, retry_delay, Latest};
use crate::error::{Error, Problems, Result};
use crate::run::RunStatus;
use crate::sql;

mod claimed;
mod occurrences;
mod orphans;

use self::occurrences::occurrence;

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

use super::events::{Events, ServiceEvent};

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
    crate::domain::telemetry::next_occurrence(next);
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
    cx: &Ready<'_>,
    conn: &mut sqlx::PgConnection,
    dry_run: bool,
    at: DateTime<Utc>,
) -> Result<Option<Latest>> {
    // An occurrence is done only for the policy that ran it: a replica
    // with another policy (other entities, other handlers) sweeps it too.
    // Runs from before schema version 5 have no fingerprint and count for
    // every policy.
    let prepared = cx.plans();
    let params = sql::worker::LatestScheduled {
        dry_run,
        at,
        fingerprint: crate::run::peers::fingerprint(cx, prepared),
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
