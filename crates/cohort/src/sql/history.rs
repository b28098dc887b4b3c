//! Statements that read the ledger back: recent runs with their totals,
//! one run and its entity summaries, and a run found by an id prefix.

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use uuid::Uuid;

use super::statement::{Args, Params, Statement};
use crate::base::ident::SqlText;
use crate::sql::tables::CohortTable;

/// A row limit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limit(pub(crate) i64);

impl Params for Limit {
    fn bind(self, q: Args) -> Args {
        q.bind(self.0)
    }
}

/// A run id.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run(pub(crate) Uuid);

impl Params for Run {
    fn bind(self, q: Args) -> Args {
        q.bind(self.0)
    }
}

/// Hexadecimal digits a run id starts with (hyphens removed).
#[derive(Debug, Clone)]
pub(crate) struct Prefix(pub(crate) String);

impl Params for Prefix {
    fn bind(self, q: Args) -> Args {
        q.bind(self.0)
    }
}

/// A run with its totals, as [`recent_runs`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RunLineRow {
    pub(crate) run_id: Uuid,
    pub(crate) kind: String,
    pub(crate) trigger: String,
    pub(crate) status: String,
    pub(crate) dry_run: bool,
    pub(crate) tenant_id: Option<String>,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) settled_at: Option<DateTime<Utc>>,
    pub(crate) affected: i64,
    pub(crate) held: i64,
    pub(crate) skipped: i64,
}

/// One run's row, as [`run`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RunRow {
    pub(crate) kind: String,
    pub(crate) trigger: String,
    pub(crate) status: String,
    pub(crate) dry_run: bool,
    pub(crate) tenant_id: Option<String>,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) settled_at: Option<DateTime<Utc>>,
    pub(crate) error: Option<String>,
    pub(crate) failures: Option<serde_json::Value>,
    pub(crate) erasure_subject_kind: Option<String>,
}

/// An entity summary, as [`summaries`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SummaryRow {
    pub(crate) retention_entity_id: Uuid,
    pub(crate) entity_type: String,
    pub(crate) category: String,
    pub(crate) strategy: String,
    pub(crate) affected_count: i64,
    pub(crate) held_count: i64,
    pub(crate) skipped_count: i64,
    pub(crate) null_anchor_count: i64,
    pub(crate) kept_by_legal_min_count: i64,
    pub(crate) kept_by_policy_count: i64,
    pub(crate) held_by_subject_count: i64,
    pub(crate) cutoff: Option<DateTime<Utc>>,
    pub(crate) resolved_period: Option<PgInterval>,
    pub(crate) legal_min: Option<PgInterval>,
    pub(crate) stage: Option<i16>,
    pub(crate) batch_size: Option<i32>,
    pub(crate) note: Option<String>,
    pub(crate) dead_tuples_before: Option<i64>,
    pub(crate) dead_tuples_after: Option<i64>,
    pub(crate) table_bytes_before: Option<i64>,
    pub(crate) table_bytes_after: Option<i64>,
    pub(crate) vacuumed: Option<String>,
    pub(crate) throttled_ms: Option<i64>,
    pub(crate) paused: bool,
    pub(crate) lag_waited_ms: Option<i64>,
}

/// A detail row of one record with its run, as [`record_details`]
/// returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RecordDetailRow {
    pub(crate) run_id: Uuid,
    pub(crate) action: String,
    pub(crate) tenant_id: Option<String>,
    pub(crate) recorded_at: DateTime<Utc>,
    pub(crate) kind: String,
    pub(crate) trigger: String,
    pub(crate) status: String,
    pub(crate) dry_run: bool,
}

/// The newest runs with their totals ([`RunLineRow`]).
pub(crate) fn recent_runs(schema: &str, limit: Limit) -> Statement<Limit> {
    let mut sql = SqlText::new(
        "SELECT r.run_id, r.kind, r.trigger, r.status, r.dry_run, r.tenant_id, r.started_at, r.settled_at, \
         COALESCE(c.affected, 0)::int8 AS affected, COALESCE(c.held, 0)::int8 AS held, \
         COALESCE(c.skipped, 0)::int8 AS skipped FROM ",
    );
    sql.table(&CohortTable::SweepRun.qualified(schema))
        .push(
            " r CROSS JOIN LATERAL (SELECT pg_catalog.sum(s.affected_count) AS affected, \
             pg_catalog.sum(s.held_count) AS held, pg_catalog.sum(s.skipped_count) AS skipped FROM ",
        )
        .table(&CohortTable::EntitySummary.qualified(schema))
        .push(" s WHERE s.run_id = r.run_id) c ORDER BY r.started_at DESC, r.run_id LIMIT $1");
    Statement::new(sql, limit)
}

/// One run's row.
pub(crate) fn run(schema: &str, run: Run) -> Statement<Run> {
    let mut sql = SqlText::new(
        "SELECT kind, trigger, status, dry_run, tenant_id, started_at, settled_at, error, failures, \
         erasure_subject_kind FROM ",
    );
    sql.table(&CohortTable::SweepRun.qualified(schema))
        .push(" WHERE run_id = $1");
    Statement::new(sql, run)
}

/// One run's entity summaries, in the order they were written.
pub(crate) fn summaries(schema: &str, run: Run) -> Statement<Run> {
    let mut sql = SqlText::new(
        "SELECT retention_entity_id, entity_type, category, strategy, affected_count, held_count, \
         skipped_count, null_anchor_count, kept_by_legal_min_count, kept_by_policy_count, \
         held_by_subject_count, cutoff, \
         resolved_period, legal_min, stage, batch_size, note, dead_tuples_before, dead_tuples_after, \
         table_bytes_before, table_bytes_after, vacuumed, throttled_ms, paused, lag_waited_ms FROM ",
    );
    sql.table(&CohortTable::EntitySummary.qualified(schema))
        .push(" WHERE run_id = $1 ORDER BY summary_id");
    Statement::new(sql, run)
}

/// Up to six runs whose id starts with the prefix, newest first.
pub(crate) fn runs_by_prefix(schema: &str, prefix: Prefix) -> Statement<Prefix> {
    let mut sql = SqlText::new("SELECT run_id FROM ");
    sql.table(&CohortTable::SweepRun.qualified(schema)).push(
        " WHERE pg_catalog.replace(run_id::text, '-', '') LIKE $1 || '%' ORDER BY started_at DESC LIMIT 6",
    );
    Statement::new(sql, prefix)
}

/// Up to six hold ids starting with the hexadecimal `$1` (hyphens left
/// out), the newest first.
pub(crate) fn holds_by_prefix(schema: &str, prefix: Prefix) -> Statement<Prefix> {
    let mut sql = SqlText::new("SELECT hold_id FROM ");
    sql.table(&CohortTable::Hold.qualified(schema)).push(
        " WHERE pg_catalog.replace(hold_id::text, '-', '') LIKE $1 || '%' ORDER BY created_at DESC LIMIT 6",
    );
    Statement::new(sql, prefix)
}

/// The settle time of the last successful real run of each kind (columns
/// `kind`, `settled_at`; NULL when there is none): one row per kind, each
/// read backwards from the newest settled run on `sweep_run_settled_at_idx`
/// until a successful real run of that kind.
pub(crate) fn last_success(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("SELECT k.kind, (SELECT r.settled_at FROM ");
    sql.table(&CohortTable::SweepRun.qualified(schema)).push(
        " r WHERE r.kind = k.kind AND r.status = 'succeeded' AND NOT r.dry_run \
           AND r.settled_at IS NOT NULL ORDER BY r.settled_at DESC LIMIT 1) AS settled_at \
         FROM (VALUES ('sweep'), ('erasure')) AS k(kind) ORDER BY k.kind DESC",
    );
    Statement::new(sql, ())
}

/// The first day (UTC) of the rows-per-day window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Since(pub(crate) chrono::DateTime<chrono::Utc>);

impl Params for Since {
    fn bind(self, q: Args) -> Args {
        q.bind(self.0)
    }
}

/// Rows changed by real sweeps per UTC day and category, from runs settled
/// at `$1` or later (columns `day`, `category`, `rows`), oldest day first.
pub(crate) fn rows_per_day(schema: &str, since: Since) -> Statement<Since> {
    let mut sql = SqlText::new(
        "SELECT (r.settled_at AT TIME ZONE 'UTC')::date AS day, s.category, \
         pg_catalog.sum(s.affected_count)::int8 AS rows FROM ",
    );
    sql.table(&CohortTable::SweepRun.qualified(schema))
        .push(" r JOIN ")
        .table(&CohortTable::EntitySummary.qualified(schema))
        .push(
            " s ON s.run_id = r.run_id WHERE r.kind = 'sweep' AND NOT r.dry_run \
             AND r.settled_at >= $1 GROUP BY 1, 2 ORDER BY 1, 2",
        );
    Statement::new(sql, since)
}

/// One record of one entity, as the details name it.
#[derive(Debug, Clone)]
pub(crate) struct RecordOf {
    pub(crate) entity_id: Uuid,
    /// The record's canonical id.
    pub(crate) record_id: String,
    pub(crate) limit: i64,
}

impl Params for RecordOf {
    fn bind(self, q: Args) -> Args {
        q.bind(self.entity_id).bind(self.record_id).bind(self.limit)
    }
}

/// What happened to one record across runs, oldest first: each detail
/// with its run (`run_id, action, tenant_id, recorded_at, kind, trigger,
/// status, dry_run`). The hash index on `record_id` finds the details;
/// the entity is checked on the few it finds.
pub(crate) fn record_details(schema: &str, params: RecordOf) -> Statement<RecordOf> {
    let mut sql = SqlText::new(
        "SELECT d.run_id, d.action, d.tenant_id, d.recorded_at, r.kind, r.trigger, r.status, r.dry_run FROM ",
    );
    sql.table(&CohortTable::RowDetail.qualified(schema))
        .push(" d JOIN ")
        .table(&CohortTable::SweepRun.qualified(schema))
        .push(
            " r ON r.run_id = d.run_id WHERE d.record_id = $2 AND d.retention_entity_id = $1 \
             ORDER BY d.recorded_at, d.row_detail_id LIMIT $3",
        );
    Statement::new(sql, params)
}
