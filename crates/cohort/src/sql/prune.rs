//! Statements of the history pruner: settled runs (with their summaries,
//! row details and terminal handler work) and inactive holds, each
//! deleted in bounded batches, and the counts of a dry run.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::statement::{Args, Params, Statement};
use crate::base::ident::{QualifiedName, SqlText};
use crate::sql::tables::CohortTable;

/// A cutoff and a batch size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Batch {
    pub(crate) before: DateTime<Utc>,
    pub(crate) limit: i64,
}

impl Params for Batch {
    fn bind(self, q: Args) -> Args {
        q.bind(self.before).bind(self.limit)
    }
}

/// A cutoff alone.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Before(pub(crate) DateTime<Utc>);

impl Params for Before {
    fn bind(self, q: Args) -> Args {
        q.bind(self.0)
    }
}

/// The runs' cutoffs by outcome (settle time; `None`: that outcome is
/// never pruned).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunCutoffs {
    /// Runs that succeeded.
    pub(crate) succeeded: Option<DateTime<Utc>>,
    /// Runs that failed, partially failed or were cancelled.
    pub(crate) failed: Option<DateTime<Utc>>,
}

impl Params for RunCutoffs {
    fn bind(self, q: Args) -> Args {
        q.bind(self.succeeded).bind(self.failed)
    }
}

/// The runs' cutoffs and a batch size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunBatch {
    pub(crate) cutoffs: RunCutoffs,
    pub(crate) limit: i64,
}

impl Params for RunBatch {
    fn bind(self, q: Args) -> Args {
        self.cutoffs.bind(q).bind(self.limit)
    }
}

/// Runs, and (for the bounded deletes) a batch size.
#[derive(Debug, Clone)]
pub(crate) struct OfRuns {
    pub(crate) runs: Vec<Uuid>,
    pub(crate) limit: i64,
}

impl Params for OfRuns {
    fn bind(self, q: Args) -> Args {
        q.bind(self.runs).bind(self.limit)
    }
}

/// Runs alone.
#[derive(Debug, Clone)]
pub(crate) struct Runs(pub(crate) Vec<Uuid>);

impl Params for Runs {
    fn bind(self, q: Args) -> Args {
        q.bind(self.0)
    }
}

/// The pruner's statements, built once per pass for Cohort's schema.
pub(crate) struct PrunePlan {
    select_runs: SqlText,
    delete_work: SqlText,
    delete_details: SqlText,
    lock_runs: SqlText,
    delete_summaries: SqlText,
    delete_runs: SqlText,
    count_runs: SqlText,
    kept_runs: SqlText,
    delete_holds: SqlText,
    count_holds: SqlText,
    delete_occurrences: SqlText,
    count_occurrences: SqlText,
}

impl PrunePlan {
    pub(crate) fn build(schema: &str) -> Self {
        let t = Tables {
            run: CohortTable::SweepRun.qualified(schema),
            hs: CohortTable::HandlerStatus.qualified(schema),
            summary: CohortTable::EntitySummary.qualified(schema),
            detail: CohortTable::RowDetail.qualified(schema),
        };
        let (select_runs, count_runs, kept_runs) = old_runs(&t);
        let (delete_work, delete_details, lock_runs) = what_hangs(&t);
        let by_run = |t: &QualifiedName| {
            let mut s = SqlText::new("DELETE FROM ");
            s.table(t).push(" WHERE run_id = ANY($1)");
            s
        };
        let (delete_holds, count_holds) = inactive_holds(&CohortTable::Hold.qualified(schema));
        let (delete_occurrences, count_occurrences) =
            old_occurrences(&CohortTable::Occurrence.qualified(schema));
        PrunePlan {
            select_runs,
            delete_work,
            delete_details,
            lock_runs,
            delete_summaries: by_run(&t.summary),
            delete_runs: by_run(&t.run),
            count_runs,
            kept_runs,
            delete_holds,
            count_holds,
            delete_occurrences,
            count_occurrences,
        }
    }
}

/// The ledger tables the run statements name.
struct Tables {
    run: QualifiedName,
    hs: QualifiedName,
    summary: QualifiedName,
    detail: QualifiedName,
}

/// [`PrunePlan::select_runs`], [`PrunePlan::count_runs`] and
/// [`PrunePlan::kept_runs`].
fn old_runs(t: &Tables) -> (SqlText, SqlText, SqlText) {
    let Tables {
        run,
        hs,
        summary,
        detail,
    } = t;
    // Old settled runs (succeeded before $1, or failed, partially
    // failed or cancelled before $2; a NULL cutoff keeps that outcome),
    // not of the newest occurrence, with (EXISTS) or without (NOT
    // EXISTS) pending or in-flight work; `select_runs` takes the batch size
    // as `$3`.
    let old_runs = |s: &mut SqlText, exists: &'static str| {
        s.table(run)
            .push(
                " r WHERE ((r.status = 'succeeded' AND r.settled_at < $1::timestamptz) \
               OR (r.status IN ('failed', 'partially_failed', 'cancelled') \
                   AND r.settled_at < $2::timestamptz)) \
             AND (r.occurrence IS NULL OR r.occurrence < (SELECT pg_catalog.max(o.occurrence) FROM ",
            )
            .table(run)
            .push(" o)) AND ")
            .push(exists)
            .push(" (SELECT 1 FROM ")
            .table(hs)
            .push(" h WHERE h.run_id = r.run_id AND h.status IN ('pending', 'in_flight'))");
    };
    let mut select_runs = SqlText::new("SELECT r.run_id FROM ");
    old_runs(&mut select_runs, "NOT EXISTS");
    select_runs.push(" ORDER BY r.settled_at, r.run_id LIMIT $3");
    // What a real pass would delete, counted: those runs, and their
    // summaries, row details and (all terminal) handler work.
    let mut count_runs = SqlText::new("WITH doomed AS (SELECT r.run_id FROM ");
    old_runs(&mut count_runs, "NOT EXISTS");
    count_runs
    .push(") SELECT (SELECT pg_catalog.count(*) FROM doomed)::int8 AS runs, (SELECT pg_catalog.count(*) FROM ")
    .table(summary)
    .push(" s WHERE s.run_id IN (SELECT run_id FROM doomed))::int8 AS summaries, (SELECT pg_catalog.count(*) FROM ")
    .table(detail)
    .push(" d WHERE d.run_id IN (SELECT run_id FROM doomed))::int8 AS details, (SELECT pg_catalog.count(*) FROM ")
    .table(hs)
    .push(" h WHERE h.run_id IN (SELECT run_id FROM doomed))::int8 AS work");
    let mut kept_runs = SqlText::new("SELECT pg_catalog.count(*)::int8 FROM ");
    old_runs(&mut kept_runs, "EXISTS");
    (select_runs, count_runs, kept_runs)
}

/// [`PrunePlan::delete_work`], [`PrunePlan::delete_details`] and
/// [`PrunePlan::lock_runs`].
fn what_hangs(t: &Tables) -> (SqlText, SqlText, SqlText) {
    let Tables {
        run, hs, detail, ..
    } = t;
    // Terminal work of those runs, at most $2 rows.
    let mut delete_work = SqlText::new("DELETE FROM ");
    delete_work
        .table(hs)
        .push(" WHERE handler_status_id IN (SELECT handler_status_id FROM ")
        .table(hs)
        .push(
            " WHERE run_id = ANY($1) AND status IN ('succeeded', 'dead_lettered') LIMIT $2 \
         FOR UPDATE SKIP LOCKED) AND status IN ('succeeded', 'dead_lettered')",
        );
    // Row details no handler work hangs from any more, at most $2 rows.
    let mut delete_details = SqlText::new("DELETE FROM ");
    delete_details
        .table(detail)
        .push(" WHERE row_detail_id IN (SELECT d.row_detail_id FROM ")
        .table(detail)
        .push(" d WHERE d.run_id = ANY($1) AND NOT EXISTS (SELECT 1 FROM ")
        .table(hs)
        .push(" h WHERE h.row_detail_id = d.row_detail_id) LIMIT $2 FOR UPDATE OF d SKIP LOCKED)");
    // The runs left with neither work nor details, locked for the delete.
    let mut lock_runs = SqlText::new("SELECT r.run_id FROM ");
    lock_runs
        .table(run)
        .push(" r WHERE r.run_id = ANY($1) AND NOT EXISTS (SELECT 1 FROM ")
        .table(hs)
        .push(" h WHERE h.run_id = r.run_id) AND NOT EXISTS (SELECT 1 FROM ")
        .table(detail)
        .push(" d WHERE d.run_id = r.run_id) FOR UPDATE OF r SKIP LOCKED");
    (delete_work, delete_details, lock_runs)
}

/// [`PrunePlan::delete_holds`] and [`PrunePlan::count_holds`].
fn inactive_holds(hold: &QualifiedName) -> (SqlText, SqlText) {
    // Inactive since: the earlier of release and expiry, in the past.
    let inactive = " WHERE LEAST(released_at, expires_at) < $1 \
                AND LEAST(released_at, expires_at) <= pg_catalog.now()";
    let mut delete_holds = SqlText::new("DELETE FROM ");
    delete_holds
        .table(hold)
        .push(" WHERE hold_id IN (SELECT hold_id FROM ")
        .table(hold)
        .push(inactive)
        .push(" ORDER BY hold_id LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING hold_id");
    let mut count_holds = SqlText::new("SELECT pg_catalog.count(*)::int8 FROM ");
    count_holds.table(hold).push(inactive);
    (delete_holds, count_holds)
}

/// [`PrunePlan::delete_occurrences`] and [`PrunePlan::count_occurrences`].
fn old_occurrences(occurrence: &QualifiedName) -> (SqlText, SqlText) {
    // Shared occurrences written before $1, except the newest (a
    // replica may still be deciding about it); their passes go with
    // them (ON DELETE CASCADE).
    let old_occurrences = |s: &mut SqlText| {
        s.table(occurrence)
            .push(" o WHERE o.created_at < $1 AND o.occurrence < (SELECT pg_catalog.max(n.occurrence) FROM ")
            .table(occurrence)
            .push(" n)");
    };
    let mut delete_occurrences = SqlText::new("DELETE FROM ");
    delete_occurrences
        .table(occurrence)
        .push(" WHERE occurrence_id IN (SELECT o.occurrence_id FROM ");
    old_occurrences(&mut delete_occurrences);
    delete_occurrences
        .push(" ORDER BY o.occurrence LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING occurrence_id");
    let mut count_occurrences = SqlText::new("SELECT pg_catalog.count(*)::int8 FROM ");
    old_occurrences(&mut count_occurrences);
    (delete_occurrences, count_occurrences)
}

impl PrunePlan {
    /// Up to `limit` old settled runs without outstanding handler work
    /// (column `run_id`), oldest first.
    pub(crate) fn select_runs(&self, p: RunBatch) -> Statement<RunBatch> {
        Statement::new(self.select_runs.clone(), p)
    }

    /// Deletes up to `limit` terminal handler work rows of the runs.
    pub(crate) fn delete_work(&self, p: OfRuns) -> Statement<OfRuns> {
        Statement::new(self.delete_work.clone(), p)
    }

    /// Deletes up to `limit` row details of the runs nothing hangs from.
    pub(crate) fn delete_details(&self, p: OfRuns) -> Statement<OfRuns> {
        Statement::new(self.delete_details.clone(), p)
    }

    /// Locks the runs left with neither work nor details (column `run_id`).
    pub(crate) fn lock_runs(&self, p: Runs) -> Statement<Runs> {
        Statement::new(self.lock_runs.clone(), p)
    }

    /// Deletes the runs' entity summaries.
    pub(crate) fn delete_summaries(&self, p: Runs) -> Statement<Runs> {
        Statement::new(self.delete_summaries.clone(), p)
    }

    /// Deletes the runs.
    pub(crate) fn delete_runs(&self, p: Runs) -> Statement<Runs> {
        Statement::new(self.delete_runs.clone(), p)
    }

    /// What a real pass would delete: `(runs, summaries, details, work)`.
    pub(crate) fn count_runs(&self, p: RunCutoffs) -> Statement<RunCutoffs> {
        Statement::new(self.count_runs.clone(), p)
    }

    /// Old runs kept for their outstanding handler work (one count).
    pub(crate) fn kept_runs(&self, p: RunCutoffs) -> Statement<RunCutoffs> {
        Statement::new(self.kept_runs.clone(), p)
    }

    /// Deletes up to `limit` holds inactive since before the cutoff.
    /// Up to `limit` shared occurrences written before `before` (not
    /// the newest), with their passes.
    pub(crate) fn delete_occurrences(&self, p: Batch) -> Statement<Batch> {
        Statement::new(self.delete_occurrences.clone(), p)
    }

    /// How many shared occurrences [`Self::delete_occurrences`] would delete.
    pub(crate) fn count_occurrences(&self, p: Before) -> Statement<Before> {
        Statement::new(self.count_occurrences.clone(), p)
    }

    pub(crate) fn delete_holds(&self, p: Batch) -> Statement<Batch> {
        Statement::new(self.delete_holds.clone(), p)
    }

    /// Holds inactive since before the cutoff (one count).
    pub(crate) fn count_holds(&self, p: Before) -> Statement<Before> {
        Statement::new(self.count_holds.clone(), p)
    }
}
