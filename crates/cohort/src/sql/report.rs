//! Statements behind `cohort report`: what the ledger says about one period,
//! read in a handful of set-based aggregates (never a query per run).
//!
//! Every statement takes the same [`Window`]: `$1` the first instant of the
//! period, `$2` the first instant after it, `$3` a tenant or NULL for all.
//! Runs belong to the period by when they started; dry runs are left out
//! (they changed nothing).

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use uuid::Uuid;

use super::statement::{Args, Params, Statement};
use crate::base::ident::{from_template, QualifiedName};
use crate::sql::tables::CohortTable;

/// The period and tenant a report covers.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    /// First instant of the period.
    pub(crate) from: DateTime<Utc>,
    /// First instant after the period.
    pub(crate) until: DateTime<Utc>,
    /// One tenant, or all.
    pub(crate) tenant: Option<String>,
}

impl Params for Window {
    fn bind(self, q: Args) -> Args {
        q.bind(self.from).bind(self.until).bind(self.tenant)
    }
}

fn tables(schema: &str) -> [(&'static str, QualifiedName); 4] {
    [
        ("sweep_run", CohortTable::SweepRun.qualified(schema)),
        (
            "sweep_run_entity_summary",
            CohortTable::EntitySummary.qualified(schema),
        ),
        ("retention_hold", CohortTable::Hold.qualified(schema)),
        (
            "erasure_request",
            CohortTable::ErasureRequest.qualified(schema),
        ),
    ]
}

fn statement(schema: &str, template: &'static str, window: Window) -> Statement<Window> {
    Statement::new(from_template(template, &tables(schema)), window)
}

/// Makes the report's transaction one read-only snapshot, so every
/// figure agrees with every other even while runs settle.
pub(crate) fn snapshot() -> Statement<()> {
    Statement::new(
        crate::base::ident::SqlText::new(
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY",
        ),
        (),
    )
}

/// The database's clock in that snapshot: when the report was generated.
pub(crate) fn generated_at() -> Statement<()> {
    Statement::new(
        crate::base::ident::SqlText::new("SELECT pg_catalog.now()"),
        (),
    )
}

/// Whether tenant `$1` (canonical text) appears in the ledger at all: a
/// run of any kind, or a hold (one column, boolean).
pub(crate) fn tenant_seen(schema: &str, tenant: String) -> Statement<(String,)> {
    Statement::new(
        from_template(
            "SELECT EXISTS (SELECT 1 FROM {sweep_run} WHERE tenant_id = $1) \
                 OR EXISTS (SELECT 1 FROM {retention_hold} WHERE tenant_id = $1)",
            &tables(schema),
        ),
        (tenant,),
    )
}

/// Prefixes a statement with `runs`, the sweeps of the period that every
/// entity statement reads.
macro_rules! concat_runs {
    ($rest:literal) => {
        concat!(
            "WITH runs AS (\
               SELECT run_id, status, started_at, settled_at, tenant_id FROM {sweep_run} \
               WHERE kind = 'sweep' AND NOT dry_run AND started_at >= $1 AND started_at < $2 \
                 AND ($3::text IS NULL OR tenant_id = $3)) ",
            $rest
        )
    };
}

/// The entity line a per-entity row belongs to: entity, category, stage.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, sqlx::FromRow)]
pub(crate) struct Line {
    pub(crate) retention_entity_id: Uuid,
    pub(crate) category: String,
    pub(crate) stage: Option<i16>,
}

/// Rows kept, and why, as [`entity_kept`] and [`erasures`] sum them.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Kept {
    pub(crate) held: i64,
    pub(crate) held_by_subject: i64,
    pub(crate) legal_minimum: i64,
    pub(crate) null_anchor: i64,
    pub(crate) skipped: i64,
    pub(crate) kept_by_policy: i64,
}

/// A row of [`entity_runs`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EntityRuns {
    #[sqlx(flatten)]
    pub(crate) line: Line,
    pub(crate) entity_type: String,
    pub(crate) runs: i64,
    pub(crate) succeeded: i64,
    pub(crate) failed: i64,
    pub(crate) last_success: Option<DateTime<Utc>>,
}

/// A row of [`entity_rules`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EntityRule {
    #[sqlx(flatten)]
    pub(crate) line: Line,
    pub(crate) strategy: String,
    pub(crate) resolved_period: PgInterval,
    pub(crate) legal_min: Option<PgInterval>,
    pub(crate) rule_source: Option<String>,
    pub(crate) rule_reason: Option<String>,
    pub(crate) runs: i64,
    pub(crate) last_used: DateTime<Utc>,
}

/// A row of [`entity_months`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EntityMonth {
    #[sqlx(flatten)]
    pub(crate) line: Line,
    pub(crate) month: String,
    pub(crate) strategy: String,
    pub(crate) affected: i64,
}

/// A row of [`entity_kept`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EntityKept {
    #[sqlx(flatten)]
    pub(crate) line: Line,
    #[sqlx(flatten)]
    pub(crate) kept: Kept,
}

/// A row of [`erasures`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Erasure {
    pub(crate) run_id: Uuid,
    pub(crate) status: String,
    pub(crate) erasure_subject_kind: Option<String>,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) settled_at: Option<DateTime<Utc>>,
    pub(crate) affected: i64,
    #[sqlx(flatten)]
    pub(crate) kept: Kept,
}

/// A row of [`holds`]: one target's counts.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct HoldCount {
    pub(crate) target: String,
    pub(crate) placed: i64,
    pub(crate) released: i64,
    pub(crate) expired: i64,
    pub(crate) in_force: i64,
}

/// A row of [`failures`]: the run's kind, the entity (`None`: the run's
/// own error) and the sanitised text.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Failure {
    pub(crate) kind: String,
    pub(crate) entity: Option<String>,
    pub(crate) error: String,
}

/// A row of [`request_deadlines`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct Deadline {
    pub(crate) reference: String,
    pub(crate) state: String,
    pub(crate) received_at: DateTime<Utc>,
    pub(crate) due_at: DateTime<Utc>,
    pub(crate) completed_at: Option<DateTime<Utc>>,
}

/// Per entity, category and stage: how many runs reached it, how many of
/// those finished it and how many failed on it, and the last success.
pub(crate) fn entity_runs(schema: &str, window: Window) -> Statement<Window> {
    statement(
        schema,
        concat_runs!(
            "SELECT s.retention_entity_id, s.entity_type, s.category, s.stage, \
               pg_catalog.count(DISTINCT s.run_id) AS runs, \
               pg_catalog.count(DISTINCT s.run_id) FILTER (WHERE s.error IS NULL \
                 AND r.status IN ('succeeded', 'partially_failed')) AS succeeded, \
               pg_catalog.count(DISTINCT s.run_id) FILTER (WHERE s.error IS NOT NULL) AS failed, \
               pg_catalog.max(r.settled_at) FILTER (WHERE s.error IS NULL \
                 AND r.status IN ('succeeded', 'partially_failed')) AS last_success \
             FROM {sweep_run_entity_summary} s JOIN runs r ON r.run_id = s.run_id \
             GROUP BY s.retention_entity_id, s.entity_type, s.category, s.stage \
             ORDER BY s.entity_type, s.category, s.stage NULLS FIRST"
        ),
        window,
    )
}

/// Per entity, category and stage, every distinct rule the runs resolved
/// (a tenant override or a changed policy shows as a second line), with
/// how many runs used it and when last.
pub(crate) fn entity_rules(schema: &str, window: Window) -> Statement<Window> {
    statement(
        schema,
        concat_runs!(
            "SELECT s.retention_entity_id, s.category, s.stage, s.strategy, \
               s.resolved_period, s.legal_min, s.rule_source, s.rule_reason, \
               pg_catalog.count(DISTINCT s.run_id) AS runs, pg_catalog.max(r.started_at) AS last_used \
             FROM {sweep_run_entity_summary} s JOIN runs r ON r.run_id = s.run_id \
             GROUP BY s.retention_entity_id, s.category, s.stage, s.strategy, \
               s.resolved_period, s.legal_min, s.rule_source, s.rule_reason \
             ORDER BY s.retention_entity_id, s.category, s.stage NULLS FIRST, \
               pg_catalog.max(r.started_at) DESC, s.strategy"
        ),
        window,
    )
}

/// Rows changed per entity, category, stage, calendar month (UTC) and
/// strategy.
pub(crate) fn entity_months(schema: &str, window: Window) -> Statement<Window> {
    statement(
        schema,
        concat_runs!(
            "SELECT s.retention_entity_id, s.category, s.stage, \
               pg_catalog.to_char(r.started_at AT TIME ZONE 'UTC', 'YYYY-MM') AS month, \
               s.strategy, pg_catalog.sum(s.affected_count)::int8 AS affected \
             FROM {sweep_run_entity_summary} s JOIN runs r ON r.run_id = s.run_id \
             GROUP BY 1, 2, 3, 4, 5 HAVING pg_catalog.sum(s.affected_count) > 0 \
             ORDER BY 1, 2, 3 NULLS FIRST, 4, 5"
        ),
        window,
    )
}

/// What each entity, category and stage kept, and why, as its last run in
/// the period for each tenant counted it, summed over tenants (a row kept
/// on every daily run is counted once, not thirty times a month).
pub(crate) fn entity_kept(schema: &str, window: Window) -> Statement<Window> {
    statement(
        schema,
        concat_runs!(
            ", last AS (\
               SELECT DISTINCT ON (s.retention_entity_id, s.category, s.stage, \
                   COALESCE(s.tenant_id, '')) s.* \
               FROM {sweep_run_entity_summary} s JOIN runs r ON r.run_id = s.run_id \
               WHERE s.error IS NULL \
               ORDER BY s.retention_entity_id, s.category, s.stage, COALESCE(s.tenant_id, ''), \
                 r.started_at DESC, s.summary_id DESC) \
             SELECT retention_entity_id, category, stage, \
               pg_catalog.sum(held_count)::int8 AS held, pg_catalog.sum(held_by_subject_count)::int8 AS held_by_subject, \
               pg_catalog.sum(kept_by_legal_min_count)::int8 AS legal_minimum, \
               pg_catalog.sum(null_anchor_count)::int8 AS null_anchor, pg_catalog.sum(skipped_count)::int8 AS skipped, \
               pg_catalog.sum(kept_by_policy_count)::int8 AS kept_by_policy \
             FROM last GROUP BY 1, 2, 3"
        ),
        window,
    )
}

/// Every erasure request served in the period, with what it changed and
/// kept (summed over its entities). The subject's value is not in the
/// ledger; its kind is.
pub(crate) fn erasures(schema: &str, window: Window) -> Statement<Window> {
    statement(
        schema,
        "SELECT r.run_id, r.status, r.erasure_subject_kind, r.started_at, r.settled_at, \
           COALESCE(pg_catalog.sum(s.affected_count), 0)::int8 AS affected, \
           COALESCE(pg_catalog.sum(s.held_count), 0)::int8 AS held, \
           COALESCE(pg_catalog.sum(s.held_by_subject_count), 0)::int8 AS held_by_subject, \
           COALESCE(pg_catalog.sum(s.kept_by_legal_min_count), 0)::int8 AS legal_minimum, \
           COALESCE(pg_catalog.sum(s.kept_by_policy_count), 0)::int8 AS kept_by_policy, \
           COALESCE(pg_catalog.sum(s.null_anchor_count), 0)::int8 AS null_anchor, \
           COALESCE(pg_catalog.sum(s.skipped_count), 0)::int8 AS skipped \
         FROM {sweep_run} r LEFT JOIN {sweep_run_entity_summary} s ON s.run_id = r.run_id \
         WHERE r.kind = 'erasure' AND NOT r.dry_run AND r.started_at >= $1 AND r.started_at < $2 \
           AND ($3::text IS NULL OR r.tenant_id = $3) \
         GROUP BY r.run_id ORDER BY r.started_at, r.run_id",
        window,
    )
}

/// The erasure requests live during the period (received before its end,
/// not completed before its start), with their deadlines: never the
/// subject or the requester's note.
pub(crate) fn request_deadlines(schema: &str, window: Window) -> Statement<Window> {
    statement(
        schema,
        "SELECT q.reference, q.state, q.received_at, q.due_at, q.completed_at          FROM {erasure_request} q          WHERE q.received_at < $2 AND (q.completed_at IS NULL OR q.completed_at >= $1)            AND ($3::text IS NULL OR q.tenant_id = $3)          ORDER BY q.received_at, q.reference",
        window,
    )
}

/// Holds placed, released and expired in the period, and in force at its
/// end, by what they name (a record or a subject). Counts only: never a
/// reason or a subject value. With a tenant, the holds that reach it: its
/// own and the tenantless ones.
pub(crate) fn holds(schema: &str, window: Window) -> Statement<Window> {
    statement(
        schema,
        "SELECT CASE WHEN subject_text IS NULL THEN 'record' ELSE 'subject' END AS target, \
           pg_catalog.count(*) FILTER (WHERE created_at >= $1 AND created_at < $2) AS placed, \
           pg_catalog.count(*) FILTER (WHERE released_at >= $1 AND released_at < $2) AS released, \
           pg_catalog.count(*) FILTER (WHERE expires_at >= $1 AND expires_at < $2 \
             AND (released_at IS NULL OR released_at > expires_at)) AS expired, \
           pg_catalog.count(*) FILTER (WHERE created_at < $2 AND (released_at IS NULL OR released_at >= $2) \
             AND (expires_at IS NULL OR expires_at >= $2)) AS in_force \
         FROM {retention_hold} \
         WHERE $3::text IS NULL OR tenant_id = $3 OR tenant_id IS NULL \
         GROUP BY 1 ORDER BY 1",
        window,
    )
}

/// Failures of the period's runs, sweeps and erasures: one line per
/// failed entity summary, and one per run whose own error is not an
/// entity's. The stored texts are already sanitised (kind, SQLSTATE,
/// diagnostic id); the caller drops the diagnostic id to group by code.
pub(crate) fn failures(schema: &str, window: Window) -> Statement<Window> {
    statement(
        schema,
        "WITH runs AS (\
           SELECT run_id, kind, status, error FROM {sweep_run} \
           WHERE NOT dry_run AND started_at >= $1 AND started_at < $2 \
             AND ($3::text IS NULL OR tenant_id = $3)) \
         SELECT r.kind, s.entity_type AS entity, s.error FROM runs r \
           JOIN {sweep_run_entity_summary} s ON s.run_id = r.run_id WHERE s.error IS NOT NULL \
         UNION ALL \
         SELECT r.kind, NULL, r.error FROM runs r \
         WHERE r.status IN ('failed', 'cancelled') AND r.error IS NOT NULL",
        window,
    )
}
