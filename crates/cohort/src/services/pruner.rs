//! The history pruner (`[cohort.prune]`): deletes settled runs with their
//! summaries and row details, those that succeeded once older than
//! `succeeded_runs_older_than` and those that failed, partially failed or
//! were cancelled once older than `failed_runs_older_than`
//! (`runs_older_than` sets both), and holds released or expired longer ago
//! than `inactive_holds_older_than`, in batches of `batch_size`, every
//! `interval`. The worker's shared occurrences (with their passes) go once
//! older than both run limits, never the newest.
//!
//! It never deletes a run that still has handler work that is not terminal
//! (pending or in flight): such a run is passed over until its work is
//! delivered or dead-lettered, and the schema itself refuses (its foreign
//! keys have no `ON DELETE` action) to delete queued work with its run.
//! Terminal handler work of a pruned run (delivered, or dead-lettered) goes
//! with it. It never deletes an active hold, nor the runs of the newest
//! scheduled occurrence (a worker replica may still be deciding about it).
//! Every statement deletes at most `batch_size` rows. Ages are measured on
//! the database clock.

pub use super::reports::PruneReport;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::base::cancel::Cancel;
use crate::config::CohortConfig;
use crate::context::Context;
use crate::domain::rules::Period;
use crate::error::{Error, Problems, Result};
use crate::sql::prune::{Batch, Before, OfRuns, PrunePlan, RunBatch, RunCutoffs, Runs};
use crate::sql::statement::Statement;

pub use crate::config::{DEFAULT_PRUNE_BATCH_SIZE, MAX_PRUNE_BATCH_SIZE};

/// The pruner's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunerConfig {
    succeeded_runs_older_than: Option<Period>,
    failed_runs_older_than: Option<Period>,
    inactive_holds_older_than: Option<Period>,
    batch_size: u32,
    interval: Duration,
}

impl PrunerConfig {
    /// The pruner of `config`'s `[prune]` table; `None` when neither limit
    /// is set (nothing is pruned unless configured).
    pub fn from_config(config: &CohortConfig) -> Result<Option<Self>> {
        let p = &config.prune;
        if !p.prunes_anything() {
            return Ok(None);
        }
        let problems = p.problems();
        if !problems.is_empty() {
            return Err(Error::Config(Problems::global(problems)));
        }
        Ok(Some(Self {
            succeeded_runs_older_than: p.succeeded_runs(),
            failed_runs_older_than: p.failed_runs(),
            inactive_holds_older_than: p.inactive_holds_older_than,
            batch_size: p.batch_size,
            interval: Duration::from_secs(p.interval.as_seconds().unsigned_abs()),
        }))
    }

    /// How often the pruner runs a pass.
    pub fn interval(&self) -> Duration {
        self.interval
    }
}

/// One explicit pruning pass: what to prune, whether only to count, and
/// what stops it between batches. An explicit pass does not read the kill
/// switch (the background pruner does).
#[derive(Debug, Clone)]
pub struct PruneRequest {
    pub(crate) config: PrunerConfig,
    pub(crate) dry_run: bool,
    pub(crate) cancel: Cancel,
}

impl PruneRequest {
    /// A pass with `config`'s limits that deletes.
    pub fn new(config: PrunerConfig) -> Self {
        Self {
            config,
            dry_run: false,
            cancel: Cancel::new(),
        }
    }

    /// Only counts what the pass would delete (the same selection).
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Stops the pass between batches when `cancel` fires.
    pub fn cancellation(mut self, cancel: Cancel) -> Self {
        self.cancel = cancel;
        self
    }
}

/// A pass's cutoffs: runs by outcome, and holds inactive since before.
type Cutoffs = (RunCutoffs, Option<DateTime<Utc>>);

/// The cutoffs of a pass: `now` minus each configured limit.
pub(crate) fn cutoffs(config: &PrunerConfig, db_now: DateTime<Utc>) -> Result<Cutoffs> {
    let back = |p: Option<Period>| -> Result<Option<DateTime<Utc>>> {
        p.map(|p| {
            p.before(db_now).ok_or_else(|| {
                Error::Config(Problems::one(format!(
                    "prune limit {p} reaches before the start of the calendar"
                )))
            })
        })
        .transpose()
    };
    Ok((
        RunCutoffs {
            succeeded: back(config.succeeded_runs_older_than)?,
            failed: back(config.failed_runs_older_than)?,
        },
        back(config.inactive_holds_older_than)?,
    ))
}

/// Whether the pass must stop before its next batch.
pub(crate) enum StopCheck<'a> {
    /// An explicit pass (`cohort prune`): only cancellation stops it.
    Explicit(&'a Cancel),
    /// The background pruner: the kill switch stops it too.
    Background(&'a Cancel),
}

impl StopCheck<'_> {
    async fn stop(&self, cx: &Context) -> Result<bool> {
        match self {
            StopCheck::Explicit(c) => Ok(c.is_cancelled()),
            StopCheck::Background(c) => {
                if c.is_cancelled() {
                    return Ok(true);
                }
                Ok(cx.live_settings().await?.kill_switch.effective)
            }
        }
    }
}

/// Runs a statement that returns one count.
async fn count<P: crate::sql::statement::Params>(
    cx: &Context,
    statement: Statement<P>,
) -> Result<u64> {
    let n: i64 = statement.query_scalar().fetch_one(&cx.pool).await?;
    Ok(n.max(0) as u64)
}

/// Runs `statement`, a delete of at most `limit` rows, until it deletes
/// fewer, adding what it deleted to `deleted`; checks `stop` before each.
/// Returns false when stopped first.
async fn delete_batches(
    cx: &Context,
    stop: &StopCheck<'_>,
    limit: u64,
    deleted: &mut u64,
    statement: impl Fn() -> Statement<Batch>,
    chained: Option<crate::domain::chain::PruneCutoffs>,
) -> Result<bool> {
    loop {
        if stop.stop(cx).await? {
            return Ok(false);
        }
        // The deleted rows' ids, and, for rows linked in the hash chain, a
        // checkpoint standing for their links in the same transaction.
        let mut conn = cx.pool.acquire().await?;
        let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
        let ids: Vec<uuid::Uuid> = statement().query_scalar().fetch_all(&mut *tx).await?;
        if let Some(cutoffs) = chained {
            crate::run::chain::checkpoint(
                &mut tx,
                &cx.config.schema,
                cx.config.ledger_key.as_ref(),
                &ids,
                cutoffs,
            )
            .await?;
        }
        tx.commit().await?;
        let done = ids.len() as u64;
        *deleted += done;
        if done < limit {
            return Ok(true);
        }
    }
}

/// One of the bounded deletes of a batch of runs.
type DeleteOf = fn(&PrunePlan, OfRuns) -> Statement<OfRuns>;

/// One pruning pass; `dry_run` only counts.
pub(crate) async fn pass(
    cx: &Context,
    config: &PrunerConfig,
    dry_run: bool,
    stop: StopCheck<'_>,
) -> Result<PruneReport> {
    let st = PrunePlan::build(&cx.config.schema);
    let db_now = crate::sql::database_now(&cx.pool).await?;
    let (runs_before, holds_before) = cutoffs(config, db_now)?;
    let mut report = PruneReport {
        dry_run,
        succeeded_runs_before: runs_before.succeeded,
        failed_runs_before: runs_before.failed,
        holds_before,
        ..PruneReport::default()
    };
    let batch = i64::from(config.batch_size);
    if runs_before.succeeded.is_some() || runs_before.failed.is_some() {
        report.runs_kept_for_handlers = count(cx, st.kept_runs(runs_before)).await?;
        if dry_run {
            count_runs(cx, &st, runs_before, &mut report).await?;
        } else if !prune_runs(cx, &st, runs_before, batch, &stop, &mut report).await? {
            report.stopped = true;
            return Ok(report);
        }
    }
    // Shared occurrences go when the runs of both outcomes could: before
    // the earlier of the two cutoffs (the only one, if one is set).
    let occurrences_before = match (runs_before.succeeded, runs_before.failed) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let tables: [OtherTable; 2] = [
        (
            occurrences_before,
            PrunePlan::count_occurrences,
            PrunePlan::delete_occurrences,
            |r| &mut r.occurrences,
            false,
        ),
        (
            holds_before,
            PrunePlan::count_holds,
            PrunePlan::delete_holds,
            |r| &mut r.holds,
            true,
        ),
    ];
    for (before, count_of, delete_of, counter, linked) in tables {
        let Some(before) = before else {
            continue;
        };
        if dry_run {
            *counter(&mut report) = count(cx, count_of(&st, Before(before))).await?;
            continue;
        }
        let delete = || {
            delete_of(
                &st,
                Batch {
                    before,
                    limit: batch,
                },
            )
        };
        let deleted = counter(&mut report);
        // Holds are linked in the hash chain: their checkpoint says the
        // cutoff they went under.
        let chained = linked.then(|| crate::domain::chain::PruneCutoffs {
            holds_before: Some(crate::domain::chain::micros(before)),
            ..Default::default()
        });
        if !delete_batches(cx, &stop, batch as u64, deleted, delete, chained).await? {
            report.stopped = true;
            return Ok(report);
        }
    }
    Ok(report)
}

/// A table pruned by time: its cutoff, its statements, its counter, and
/// whether its rows are linked in the hash chain (their checkpoint then
/// says the cutoff).
type OtherTable = (Option<DateTime<Utc>>, Counted, Deleted, Counter, bool);

/// Counts a table's rows before a time.
type Counted = fn(&PrunePlan, Before) -> Statement<Before>;

/// Deletes a bounded batch of a table's rows before a time.
type Deleted = fn(&PrunePlan, Batch) -> Statement<Batch>;

/// The report's count of a table's rows.
type Counter = fn(&mut PruneReport) -> &mut u64;

/// A dry run's counts of the runs the cutoffs reach, and of what hangs
/// from them.
async fn count_runs(
    cx: &Context,
    st: &PrunePlan,
    runs_before: RunCutoffs,
    report: &mut PruneReport,
) -> Result<()> {
    let (runs, summaries, details, work): (i64, i64, i64, i64) = st
        .count_runs(runs_before)
        .query_as()
        .fetch_one(&cx.pool)
        .await?;
    let n = |v: i64| v.max(0) as u64;
    report.runs = n(runs);
    report.summaries = n(summaries);
    report.row_details = n(details);
    report.handler_work = n(work);
    Ok(())
}

/// Deletes the runs the cutoffs reach, a batch at a time, each with what
/// hangs from it. `false`: stopped before the end.
async fn prune_runs(
    cx: &Context,
    st: &PrunePlan,
    runs_before: RunCutoffs,
    batch: i64,
    stop: &StopCheck<'_>,
    report: &mut PruneReport,
) -> Result<bool> {
    loop {
        if stop.stop(cx).await? {
            return Ok(false);
        }
        let ids: Vec<uuid::Uuid> = st
            .select_runs(RunBatch {
                cutoffs: runs_before,
                limit: batch,
            })
            .query_scalar()
            .fetch_all(&cx.pool)
            .await?;
        if ids.is_empty() {
            return Ok(true);
        }
        let of_runs = OfRuns {
            runs: ids.clone(),
            limit: batch,
        };
        prune_what_hangs(cx, st, of_runs, report).await?;
        let runs = delete_runs(cx, st, ids.clone(), runs_before, report).await?;
        if runs < ids.len() as u64 {
            // Some runs gained work meanwhile, or another pruner holds
            // them: not taken again in this pass.
            return Ok(true);
        }
    }
}

/// Bounded statements: finished handler work, then the row details
/// nothing hangs from any more. Work that turned pending meanwhile (a
/// dead letter retried) stays, with its row detail, and keeps its run.
async fn prune_what_hangs(
    cx: &Context,
    st: &PrunePlan,
    of_runs: OfRuns,
    report: &mut PruneReport,
) -> Result<()> {
    let batch = of_runs.limit;
    for (statement, counter) in [
        (PrunePlan::delete_work as DeleteOf, &mut report.handler_work),
        (PrunePlan::delete_details, &mut report.row_details),
    ] {
        loop {
            let done = statement(st, of_runs.clone())
                .query()
                .execute(&cx.pool)
                .await?
                .rows_affected();
            *counter += done;
            if done < batch as u64 {
                break;
            }
        }
    }
    Ok(())
}

/// Deletes the runs of `ids` nothing hangs from any more (locked, so no
/// other pruner takes them), with their summaries. Returns how many.
async fn delete_runs(
    cx: &Context,
    st: &PrunePlan,
    ids: Vec<uuid::Uuid>,
    runs_before: RunCutoffs,
    report: &mut PruneReport,
) -> Result<u64> {
    let mut conn = cx.pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
    let victims: Vec<uuid::Uuid> = st
        .lock_runs(Runs(ids))
        .query_scalar()
        .fetch_all(&mut *tx)
        .await?;
    let cutoffs = crate::domain::chain::PruneCutoffs {
        succeeded_before: runs_before.succeeded.map(crate::domain::chain::micros),
        failed_before: runs_before.failed.map(crate::domain::chain::micros),
        holds_before: None,
    };
    crate::run::chain::checkpoint(
        &mut tx,
        &cx.config.schema,
        cx.config.ledger_key.as_ref(),
        &victims,
        cutoffs,
    )
    .await?;
    report.summaries += st
        .delete_summaries(Runs(victims.clone()))
        .query()
        .execute(&mut *tx)
        .await?
        .rows_affected();
    let runs = st
        .delete_runs(Runs(victims))
        .query()
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    report.runs += runs;
    Ok(runs)
}

/// Runs a pass every interval until `cancel` fires; a failed pass is
/// logged and tried again at the next.
pub(crate) async fn run(
    cx: Arc<Context>,
    config: PrunerConfig,
    cancel: Cancel,
    events: super::events::Events,
) {
    tracing::info!(
        interval_s = config.interval.as_secs(),
        "history pruner started"
    );
    while !cancel.is_cancelled() {
        let done = pass(&cx, &config, false, StopCheck::Background(&cancel)).await;
        if let Ok(r) = &done {
            events.send(super::events::ServiceEvent::PrunerPass(r.clone()));
        }
        match done {
            Ok(r) if r.stopped => {
                tracing::warn!(
                    runs = r.runs,
                    holds = r.holds,
                    "pruning stopped after its batch (kill switch or shutdown)"
                )
            }
            Ok(r) => tracing::info!(
                runs = r.runs,
                holds = r.holds,
                kept_for_handlers = r.runs_kept_for_handlers,
                "pruning pass done"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "pruning pass failed; retrying at the next interval")
            }
        }
        if !cancel.sleep(config.interval).await {
            break;
        }
    }
    tracing::info!("history pruner stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PruneConfig;

    fn config(runs: Option<&str>, holds: Option<&str>, batch: u32) -> CohortConfig {
        CohortConfig {
            prune: PruneConfig {
                runs_older_than: runs.map(|r| r.parse().unwrap()),
                inactive_holds_older_than: holds.map(|h| h.parse().unwrap()),
                batch_size: batch,
                ..PruneConfig::default()
            },
            ..CohortConfig::default()
        }
    }

    #[test]
    fn nothing_is_pruned_unless_configured() {
        assert_eq!(
            PrunerConfig::from_config(&CohortConfig::default()).unwrap(),
            None
        );
        assert!(PrunerConfig::from_config(&config(Some("90d"), None, 10))
            .unwrap()
            .is_some());
        let e = PrunerConfig::from_config(&config(Some("90d"), None, 0)).unwrap_err();
        assert!(e.to_string().contains("prune.batch_size = 0"), "{e}");
    }

    #[test]
    fn cutoffs_subtract_each_limit_from_the_database_clock() {
        let now = DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let cases = [
            (Some("90d"), None, Some("2026-09-01T12:00:00Z"), None),
            (None, Some("1y"), None, Some("2025-11-30T12:00:00Z")),
            (
                Some("2h"),
                Some("30d"),
                Some("2026-11-30T10:00:00Z"),
                Some("2026-10-31T12:00:00Z"),
            ),
        ];
        for (runs, holds, want_runs, want_holds) in cases {
            let c = PrunerConfig::from_config(&config(runs, holds, 10))
                .unwrap()
                .unwrap();
            let (runs_before, holds_before) = cutoffs(&c, now).unwrap();
            assert_eq!(
                (runs_before.succeeded, runs_before.failed, holds_before),
                (want_runs.map(at), want_runs.map(at), want_holds.map(at)),
                "{runs:?} {holds:?}"
            );
        }
    }

    #[test]
    fn failed_runs_can_be_kept_longer_than_successes() {
        let now = DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let mut c = config(None, None, 10);
        c.prune.succeeded_runs_older_than = Some("30d".parse().unwrap());
        c.prune.failed_runs_older_than = Some("1y".parse().unwrap());
        let p = PrunerConfig::from_config(&c).unwrap().unwrap();
        let (runs, _) = cutoffs(&p, now).unwrap();
        assert_eq!(
            (
                runs.succeeded.unwrap().to_rfc3339(),
                runs.failed.unwrap().to_rfc3339()
            ),
            (
                "2026-10-31T12:00:00+00:00".to_string(),
                "2025-11-30T12:00:00+00:00".to_string()
            )
        );
        // Only one outcome configured: the other is never pruned.
        c.prune.failed_runs_older_than = None;
        let p = PrunerConfig::from_config(&c).unwrap().unwrap();
        assert_eq!(cutoffs(&p, now).unwrap().0.failed, None);
        // The old shorthand together with a specific limit is refused.
        c.prune.runs_older_than = Some("90d".parse().unwrap());
        let e = PrunerConfig::from_config(&c).unwrap_err();
        assert!(
            e.to_string().contains("replace it with the two of them"),
            "{e}"
        );
        assert!(c.validate().is_err());
    }
}
