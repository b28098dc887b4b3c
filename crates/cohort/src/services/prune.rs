//! The history pruner (`[cohort.prune]`): deletes settled runs older than
//! `runs_older_than` with their summaries and row details, and holds
//! released or expired longer ago than `inactive_holds_older_than`, in
//! batches of `batch_size`, every `interval`.
//!
//! It never deletes a run that still has handler work that is not terminal
//! (pending or in flight): such a run is passed over until its work is
//! delivered or dead-lettered, and the schema itself refuses (`ON DELETE
//! RESTRICT`) to delete queued work with its run. Terminal handler work of
//! a pruned run (delivered, or dead-lettered) goes with it. It never
//! deletes an active hold. Ages are measured on the database clock.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::cancel::Cancel;
use crate::config::CohortConfig;
use crate::context::Context;
use crate::error::{Error, Problems, Result};
use crate::ident::SqlText;
use crate::rules::Period;
use crate::schema::CohortTable;

/// Default rows per pruning batch.
pub const DEFAULT_PRUNE_BATCH_SIZE: u32 = 1000;
/// Largest accepted pruning batch.
pub const MAX_PRUNE_BATCH_SIZE: u32 = 100_000;

/// The pruner's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunerConfig {
    runs_older_than: Option<Period>,
    inactive_holds_older_than: Option<Period>,
    batch_size: u32,
    interval: Duration,
}

impl PrunerConfig {
    /// The pruner of `config`'s `[prune]` table; `None` when neither limit
    /// is set (nothing is pruned unless configured).
    pub fn from_config(config: &CohortConfig) -> Result<Option<Self>> {
        let p = &config.prune;
        if p.runs_older_than.is_none() && p.inactive_holds_older_than.is_none() {
            return Ok(None);
        }
        let mut problems = Vec::new();
        if !(1..=MAX_PRUNE_BATCH_SIZE).contains(&p.batch_size) {
            problems.push(format!(
                "prune.batch_size = {} is out of range 1..={MAX_PRUNE_BATCH_SIZE}",
                p.batch_size
            ));
        }
        for (name, v) in [
            ("prune.runs_older_than", p.runs_older_than),
            (
                "prune.inactive_holds_older_than",
                p.inactive_holds_older_than,
            ),
            ("prune.interval", Some(p.interval)),
        ] {
            if v.is_some_and(|v| v.as_seconds() <= 0) {
                problems.push(format!("{name} must be greater than zero"));
            }
        }
        if !problems.is_empty() {
            return Err(Error::Config(Problems::global(problems)));
        }
        Ok(Some(Self {
            runs_older_than: p.runs_older_than,
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

/// What one pruning pass deleted (or, dry, would delete).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PruneReport {
    /// Whether this was a count-only pass.
    pub dry_run: bool,
    /// Runs deleted, with their summaries and row details.
    pub runs: u64,
    /// Entity summaries deleted with those runs.
    pub summaries: u64,
    /// Row details deleted with those runs.
    pub row_details: u64,
    /// Terminal handler work deleted with those runs.
    pub handler_work: u64,
    /// Old enough runs kept because they still have pending or in-flight
    /// handler work.
    pub runs_kept_for_handlers: u64,
    /// Holds deleted.
    pub holds: u64,
    /// Runs deleted before this cutoff (settle time), if configured.
    pub runs_before: Option<DateTime<Utc>>,
    /// Holds inactive since before this cutoff, if configured.
    pub holds_before: Option<DateTime<Utc>>,
    /// The pass stopped early: the kill switch turned on (or shutdown).
    pub stopped: bool,
}

/// A pass's cutoffs: (runs settled before, holds inactive since before).
type Cutoffs = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// The cutoffs of a pass: `now` minus each configured limit.
pub(crate) fn cutoffs(config: &PrunerConfig, db_now: DateTime<Utc>) -> Result<Cutoffs> {
    let back = |p: Option<Period>| -> Result<Option<DateTime<Utc>>> {
        p.map(|p| {
            db_now.checked_sub_signed(p.as_time_delta()).ok_or_else(|| {
                Error::Config(Problems::one(format!(
                    "prune limit {p} reaches before the start of the calendar"
                )))
            })
        })
        .transpose()
    };
    Ok((
        back(config.runs_older_than)?,
        back(config.inactive_holds_older_than)?,
    ))
}

struct Statements {
    select_runs: SqlText,
    delete_work: SqlText,
    remaining_work: SqlText,
    delete_summaries: SqlText,
    delete_details: SqlText,
    delete_runs: SqlText,
    count_runs: SqlText,
    kept_runs: SqlText,
    delete_holds: SqlText,
    count_holds: SqlText,
}

fn statements(schema: &str) -> Statements {
    let run = CohortTable::SweepRun.qualified(schema);
    let hs = CohortTable::HandlerStatus.qualified(schema);
    let summary = CohortTable::EntitySummary.qualified(schema);
    let detail = CohortTable::RowDetail.qualified(schema);
    let hold = CohortTable::Hold.qualified(schema);
    // Old settled runs with (EXISTS) or without (NOT EXISTS) pending or
    // in-flight work.
    let old_runs = |s: &mut SqlText, exists: &'static str| {
        s.table(&run)
            .push(" r WHERE r.status <> 'started' AND r.settled_at < $1 AND ")
            .push(exists)
            .push(" (SELECT 1 FROM ")
            .table(&hs)
            .push(" h WHERE h.run_id = r.run_id AND h.status IN ('pending', 'in_flight'))");
    };
    let mut select_runs = SqlText::new("SELECT r.run_id FROM ");
    old_runs(&mut select_runs, "NOT EXISTS");
    // Locked, so two pruners never take the same batch.
    select_runs.push(" ORDER BY r.settled_at, r.run_id LIMIT $2 FOR UPDATE OF r SKIP LOCKED");
    let mut count_runs = SqlText::new("SELECT count(*)::int8 FROM ");
    old_runs(&mut count_runs, "NOT EXISTS");
    let mut kept_runs = SqlText::new("SELECT count(*)::int8 FROM ");
    old_runs(&mut kept_runs, "EXISTS");
    let mut delete_work = SqlText::new("DELETE FROM ");
    delete_work
        .table(&hs)
        .push(" WHERE run_id = ANY($1) AND status IN ('succeeded', 'dead_lettered')");
    let mut remaining_work = SqlText::new("SELECT DISTINCT run_id FROM ");
    remaining_work.table(&hs).push(" WHERE run_id = ANY($1)");
    let by_run = |t: &crate::QualifiedName| {
        let mut s = SqlText::new("DELETE FROM ");
        s.table(t).push(" WHERE run_id = ANY($1)");
        s
    };
    // Inactive since: the earlier of release and expiry, in the past.
    let inactive = " WHERE LEAST(released_at, expires_at) < $1 \
                    AND LEAST(released_at, expires_at) <= pg_catalog.now()";
    let mut delete_holds = SqlText::new("DELETE FROM ");
    delete_holds
        .table(&hold)
        .push(" WHERE hold_id IN (SELECT hold_id FROM ")
        .table(&hold)
        .push(inactive)
        .push(" ORDER BY hold_id LIMIT $2 FOR UPDATE SKIP LOCKED)");
    let mut count_holds = SqlText::new("SELECT count(*)::int8 FROM ");
    count_holds.table(&hold).push(inactive);
    Statements {
        select_runs,
        delete_work,
        remaining_work,
        delete_summaries: by_run(&summary),
        delete_details: by_run(&detail),
        delete_runs: by_run(&run),
        count_runs,
        kept_runs,
        delete_holds,
        count_holds,
    }
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
                Ok(crate::settings::read(cx).await?.kill_switch.effective)
            }
        }
    }
}

/// One pruning pass; `dry_run` only counts.
pub(crate) async fn pass(
    cx: &Context,
    config: &PrunerConfig,
    dry_run: bool,
    stop: StopCheck<'_>,
) -> Result<PruneReport> {
    let st = statements(&cx.config.schema);
    let db_now: DateTime<Utc> = sqlx::query_scalar("SELECT pg_catalog.now()")
        .fetch_one(&cx.pool)
        .await?;
    let (runs_before, holds_before) = cutoffs(config, db_now)?;
    let mut report = PruneReport {
        dry_run,
        runs_before,
        holds_before,
        ..PruneReport::default()
    };
    let batch = i64::from(config.batch_size);
    if let Some(before) = runs_before {
        report.runs_kept_for_handlers = sqlx::query_scalar::<_, i64>(st.kept_runs.sql())
            .bind(before)
            .fetch_one(&cx.pool)
            .await?
            .max(0) as u64;
        if dry_run {
            report.runs = sqlx::query_scalar::<_, i64>(st.count_runs.sql())
                .bind(before)
                .fetch_one(&cx.pool)
                .await?
                .max(0) as u64;
        } else {
            loop {
                if stop.stop(cx).await? {
                    report.stopped = true;
                    return Ok(report);
                }
                let mut tx = cx.pool.begin().await?;
                let ids: Vec<uuid::Uuid> = sqlx::query_scalar(st.select_runs.sql())
                    .bind(before)
                    .bind(batch)
                    .fetch_all(&mut *tx)
                    .await?;
                if ids.is_empty() {
                    break;
                }
                // Terminal work first; work that turned pending meanwhile
                // (a dead letter retried) stays, and keeps its run.
                let exec =
                    |sql: &SqlText, ids: &[uuid::Uuid]| sqlx::query(sql.sql()).bind(ids.to_vec());
                report.handler_work += exec(&st.delete_work, &ids)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                let remaining: Vec<uuid::Uuid> = sqlx::query_scalar(st.remaining_work.sql())
                    .bind(&ids)
                    .fetch_all(&mut *tx)
                    .await?;
                let victims: Vec<uuid::Uuid> = ids
                    .iter()
                    .copied()
                    .filter(|id| !remaining.contains(id))
                    .collect();
                report.summaries += exec(&st.delete_summaries, &victims)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                report.row_details += exec(&st.delete_details, &victims)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                report.runs += exec(&st.delete_runs, &victims)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                if !remaining.is_empty() {
                    // Work turned pending meanwhile: those runs are kept,
                    // and not taken again in this pass.
                    break;
                }
            }
        }
    }
    if let Some(before) = holds_before {
        if dry_run {
            report.holds = sqlx::query_scalar::<_, i64>(st.count_holds.sql())
                .bind(before)
                .fetch_one(&cx.pool)
                .await?
                .max(0) as u64;
        } else {
            loop {
                if stop.stop(cx).await? {
                    report.stopped = true;
                    return Ok(report);
                }
                let done = sqlx::query(st.delete_holds.sql())
                    .bind(before)
                    .bind(batch)
                    .execute(&cx.pool)
                    .await?
                    .rows_affected();
                report.holds += done;
                if done < config.batch_size as u64 {
                    break;
                }
            }
        }
    }
    Ok(report)
}

/// Runs a pass every interval until `cancel` fires; a failed pass is
/// logged and tried again at the next.
pub(crate) async fn run(cx: Arc<Context>, config: PrunerConfig, cancel: Cancel) {
    tracing::info!(
        interval_s = config.interval.as_secs(),
        "history pruner started"
    );
    while !cancel.is_cancelled() {
        match pass(&cx, &config, false, StopCheck::Background(&cancel)).await {
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
            assert_eq!(
                cutoffs(&c, now).unwrap(),
                (want_runs.map(at), want_holds.map(at)),
                "{runs:?} {holds:?}"
            );
        }
    }
}
