//! Statements over dead letters (`sweep_row_handler_status` rows in
//! `dead_lettered`): listing, locking for a retry, requeueing, and the
//! queue's depth by state.

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

/// Columns, in order: `handler_status_id, run_id, retention_entity_id,
/// entity_type, record_id, tenant_id, handler_id, attempts, last_error,
/// updated_at, action`; newest first.
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

/// The named work, locked: `(handler_status_id, status, has_payload,
/// skipped)`, `skipped` when its row was set aside by a failing
/// `on_before` (never mutated).
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

/// Counts of pending, in-flight and dead-lettered work (three columns).
pub(crate) fn depth(schema: &str) -> Statement<()> {
    let (hs, _) = tables(schema);
    let mut sql = SqlText::new("SELECT (SELECT pg_catalog.count(*) FROM ");
    sql.table(&hs)
        .push(" WHERE status = 'pending'), (SELECT pg_catalog.count(*) FROM ")
        .table(&hs)
        .push(" WHERE status = 'in_flight'), (SELECT pg_catalog.count(*) FROM ")
        .table(&hs)
        .push(" WHERE status = 'dead_lettered')");
    Statement::new(sql, ())
}
