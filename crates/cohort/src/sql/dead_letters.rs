//! Statements over dead letters (`sweep_row_handler_status` rows in
//! `dead_lettered`): listing, locking for a retry, requeueing, and the
//! queue's depth by state.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::statement::{Args, Params, Statement};
use crate::base::ident::{QualifiedName, SqlText};
use crate::sql::tables::CohortTable;

fn tables(schema: &str) -> (QualifiedName, QualifiedName) {
    (
        CohortTable::HandlerStatus.qualified(schema),
        CohortTable::RowDetail.qualified(schema),
    )
}

/// Which dead letters to list.
#[derive(Debug)]
pub(crate) struct List {
    pub(crate) entity_id: Option<Uuid>,
    pub(crate) handler: Option<String>,
    pub(crate) limit: i64,
}

impl Params for List {
    fn bind(self, q: Args) -> Args {
        q.bind(self.entity_id).bind(self.handler).bind(self.limit)
    }
}

/// A dead letter as [`list`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DeadLetterRow {
    pub(crate) handler_status_id: i64,
    pub(crate) run_id: Uuid,
    pub(crate) retention_entity_id: Uuid,
    pub(crate) entity_type: String,
    pub(crate) record_id: String,
    pub(crate) tenant_id: Option<String>,
    pub(crate) handler_id: String,
    pub(crate) attempts: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) updated_at: DateTime<Utc>,
    pub(crate) action: String,
}

impl From<DeadLetterRow> for crate::domain::handlers::DeadLetter {
    fn from(r: DeadLetterRow) -> Self {
        Self {
            id: r.handler_status_id,
            run_id: r.run_id,
            entity_id: r.retention_entity_id,
            entity: r.entity_type,
            record_id: r.record_id,
            tenant: r.tenant_id,
            handler: r.handler_id,
            attempts: r.attempts,
            last_error: r.last_error,
            dead_lettered_at: r.updated_at,
            action: r.action,
        }
    }
}

/// The dead letters a [`List`] selects ([`DeadLetterRow`]), newest first.
pub(crate) fn list(schema: &str, params: List) -> Statement<List> {
    let (hs, detail) = tables(schema);
    let mut sql = SqlText::new(
        "SELECT h.handler_status_id, h.run_id, d.retention_entity_id, d.entity_type, d.record_id, \
                d.tenant_id, h.handler_id, h.attempts, h.last_error, h.updated_at, d.action FROM ",
    );
    sql.table(&hs).push(" h JOIN ").table(&detail).push(
        " d ON d.row_detail_id = h.row_detail_id \
         WHERE h.status = 'dead_lettered' \
           AND ($1::uuid IS NULL OR d.retention_entity_id = $1) \
           AND ($2::text IS NULL OR h.handler_id = $2) \
         ORDER BY h.updated_at DESC, h.handler_status_id DESC LIMIT $3",
    );
    Statement::new(sql, params)
}

/// A set of handler-work ids.
#[derive(Debug)]
pub(crate) struct Ids(pub(crate) Vec<i64>);

impl Params for Ids {
    fn bind(self, q: Args) -> Args {
        q.bind(self.0)
    }
}

/// The entity and handler of each of the ids: `(id, entity, handler)`.
pub(crate) fn owners(schema: &str, ids: Ids) -> Statement<Ids> {
    let (hs, detail) = tables(schema);
    let mut sql =
        SqlText::new("SELECT h.handler_status_id, d.retention_entity_id, h.handler_id FROM ");
    sql.table(&hs)
        .push(" h JOIN ")
        .table(&detail)
        .push(" d ON d.row_detail_id = h.row_detail_id WHERE h.handler_status_id = ANY($1)");
    Statement::new(sql, ids)
}

/// Every dead letter that still has its payload, locked (column
/// `handler_status_id`).
pub(crate) fn lock_retryable(schema: &str) -> Statement<()> {
    let (hs, _) = tables(schema);
    let mut sql = SqlText::new("SELECT handler_status_id FROM ");
    sql.table(&hs).push(
        " WHERE status = 'dead_lettered' AND captured_payload IS NOT NULL \
         ORDER BY handler_status_id FOR UPDATE",
    );
    Statement::new(sql, ())
}

/// Named work as [`lock_ids`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct LockedRow {
    pub(crate) handler_status_id: i64,
    pub(crate) status: String,
    /// Its payload is still there (not scrubbed).
    pub(crate) has_payload: bool,
    /// Its row was set aside by a failing `on_before` (never mutated).
    pub(crate) skipped: bool,
}

/// The named work, locked ([`LockedRow`]).
pub(crate) fn lock_ids(schema: &str, ids: Ids) -> Statement<Ids> {
    let (hs, detail) = tables(schema);
    let mut sql = SqlText::new(
        "SELECT h.handler_status_id, h.status, h.captured_payload IS NOT NULL AS has_payload, \
                d.action = 'skipped' AS skipped FROM ",
    );
    sql.table(&hs).push(" h JOIN ").table(&detail).push(
        " d ON d.row_detail_id = h.row_detail_id WHERE h.handler_status_id = ANY($1) \
             ORDER BY h.handler_status_id FOR UPDATE OF h",
    );
    Statement::new(sql, ids)
}

/// Requeues the named dead letters that still have their payload: due
/// now, attempts reset, error cleared.
pub(crate) fn requeue(schema: &str, ids: Ids) -> Statement<Ids> {
    let (hs, _) = tables(schema);
    let mut sql = SqlText::new("UPDATE ");
    sql.table(&hs).push(
        " SET status = 'pending', attempts = 0, next_attempt_at = pg_catalog.now(), \
           last_error = NULL, claim_token = NULL, claim_expires_at = NULL, updated_at = pg_catalog.now() \
         WHERE handler_status_id = ANY($1) AND status = 'dead_lettered' AND captured_payload IS NOT NULL",
    );
    Statement::new(sql, ids)
}

/// The queue's depth as [`depth`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DepthRow {
    pub(crate) pending: i64,
    pub(crate) in_flight: i64,
    pub(crate) dead_lettered: i64,
}

impl From<DepthRow> for crate::domain::telemetry::QueueDepth {
    fn from(r: DepthRow) -> Self {
        let n = |c: i64| c.max(0) as u64;
        Self {
            pending: n(r.pending),
            in_flight: n(r.in_flight),
            dead_lettered: n(r.dead_lettered),
        }
    }
}

/// Counts of pending, in-flight and dead-lettered work ([`DepthRow`]).
pub(crate) fn depth(schema: &str) -> Statement<()> {
    let (hs, _) = tables(schema);
    let mut sql = SqlText::new("SELECT (SELECT pg_catalog.count(*) FROM ");
    sql.table(&hs)
        .push(" WHERE status = 'pending') AS pending, (SELECT pg_catalog.count(*) FROM ")
        .table(&hs)
        .push(" WHERE status = 'in_flight') AS in_flight, (SELECT pg_catalog.count(*) FROM ")
        .table(&hs)
        .push(" WHERE status = 'dead_lettered') AS dead_lettered");
    Statement::new(sql, ())
}
