//! Statements of erasure requests (`erasure_request`) and their history
//! (`erasure_request_event`).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::statement::{Args, Params, Statement};
use crate::base::ident::SqlText;
use crate::sql::tables::CohortTable;

/// The columns every read of a request returns.
const COLUMNS: &str = "SELECT r.request_id, r.reference, r.tenant_id, r.subject_kind, \
     r.subject_text, r.subject_hash, r.allow_soft_delete, r.stage, r.note, r.state, \
     r.received_at, r.due_at, r.due_reason, r.attempted_at, r.resume_at, r.completed_at, \
     r.last_run_id, r.waiting, r.error FROM ";

/// A request as every read returns it ([`COLUMNS`]).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RequestRow {
    pub(crate) request_id: Uuid,
    pub(crate) reference: String,
    pub(crate) tenant_id: Option<String>,
    pub(crate) subject_kind: Option<String>,
    pub(crate) subject_text: Option<String>,
    pub(crate) subject_hash: String,
    pub(crate) allow_soft_delete: bool,
    pub(crate) stage: Option<i32>,
    pub(crate) note: Option<String>,
    pub(crate) state: String,
    pub(crate) received_at: DateTime<Utc>,
    pub(crate) due_at: DateTime<Utc>,
    pub(crate) due_reason: Option<String>,
    pub(crate) attempted_at: Option<DateTime<Utc>>,
    pub(crate) resume_at: Option<DateTime<Utc>>,
    pub(crate) completed_at: Option<DateTime<Utc>>,
    pub(crate) last_run_id: Option<Uuid>,
    pub(crate) waiting: serde_json::Value,
    pub(crate) error: Option<String>,
}

/// A line of a request's history as [`events`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EventRow {
    pub(crate) state: String,
    pub(crate) at: DateTime<Utc>,
    pub(crate) run_id: Option<Uuid>,
    pub(crate) detail: String,
    pub(crate) recorded_by: String,
}

/// One state's requests as [`by_state`] counts them.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct StateCount {
    pub(crate) state: String,
    pub(crate) requests: i64,
    pub(crate) overdue: i64,
}

/// A new request, in state `open`.
#[derive(Debug)]
pub(crate) struct Insert {
    pub(crate) request_id: Uuid,
    pub(crate) reference: String,
    pub(crate) tenant: Option<String>,
    pub(crate) kind: Option<String>,
    pub(crate) subject: String,
    pub(crate) subject_hash: String,
    pub(crate) allow_soft_delete: bool,
    pub(crate) stage: Option<i32>,
    pub(crate) note: Option<String>,
    pub(crate) received_at: DateTime<Utc>,
    pub(crate) due_at: DateTime<Utc>,
    pub(crate) due_reason: Option<String>,
    /// The journal entry that opened it (its place and hash), when it
    /// was journaled: the database's record of the journal.
    pub(crate) journal: Option<(i64, String)>,
}

impl Params for Insert {
    fn bind(self, q: Args) -> Args {
        q.bind(self.request_id)
            .bind(self.reference)
            .bind(self.tenant)
            .bind(self.kind)
            .bind(self.subject)
            .bind(self.subject_hash)
            .bind(self.allow_soft_delete)
            .bind(self.stage)
            .bind(self.note)
            .bind(self.received_at)
            .bind(self.due_at)
            .bind(self.due_reason)
            .bind(self.journal.as_ref().map(|j| j.0))
            .bind(self.journal.map(|j| j.1))
    }
}

/// Opens a request; returns its id, or nothing when the reference is taken.
pub(crate) fn insert(schema: &str, params: Insert) -> Statement<Insert> {
    let mut sql = SqlText::new("INSERT INTO ");
    sql.table(&CohortTable::ErasureRequest.qualified(schema))
        .push(
            " (request_id, reference, tenant_id, subject_kind, subject_text, subject_hash, \
         allow_soft_delete, stage, note, state, received_at, due_at, due_reason, \
         journal_entry, journal_hash) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'open', $10, $11, $12, $13, $14) \
         ON CONFLICT (reference) DO NOTHING RETURNING request_id",
        );
    Statement::new(sql, params)
}

/// One request by its reference.
pub(crate) fn by_reference(schema: &str, reference: String) -> Statement<(String,)> {
    let mut sql = SqlText::new(COLUMNS);
    sql.table(&CohortTable::ErasureRequest.qualified(schema))
        .push(" r WHERE r.reference = $1");
    Statement::new(sql, (reference,))
}

/// One request by its id.
pub(crate) fn by_id(schema: &str, request_id: Uuid) -> Statement<(Uuid,)> {
    let mut sql = SqlText::new(COLUMNS);
    sql.table(&CohortTable::ErasureRequest.qualified(schema))
        .push(" r WHERE r.request_id = $1");
    Statement::new(sql, (request_id,))
}

/// One request by its id, locked for the transaction that changes it.
pub(crate) fn lock(schema: &str, request_id: Uuid) -> Statement<(Uuid,)> {
    let mut sql = SqlText::new(COLUMNS);
    sql.table(&CohortTable::ErasureRequest.qualified(schema))
        .push(" r WHERE r.request_id = $1 FOR UPDATE");
    Statement::new(sql, (request_id,))
}

/// A request's new state, with what its last attempt left.
#[derive(Debug)]
pub(crate) struct SetState {
    pub(crate) request_id: Uuid,
    pub(crate) state: &'static str,
    /// The attempt's logical `now`, recorded as the completion time.
    pub(crate) now: DateTime<Utc>,
    pub(crate) resume_at: Option<DateTime<Utc>>,
    pub(crate) waiting: serde_json::Value,
    pub(crate) run_id: Option<Uuid>,
    pub(crate) error: Option<String>,
    /// Starting an attempt: record the database clock as its start.
    pub(crate) starting: bool,
}

impl Params for SetState {
    fn bind(self, q: Args) -> Args {
        q.bind(self.request_id)
            .bind(self.state)
            .bind(self.now)
            .bind(self.resume_at)
            .bind(self.waiting)
            .bind(self.run_id)
            .bind(self.error)
            .bind(self.starting)
    }
}

/// Moves a request to a state. Completed, it forgets the subject's
/// identifier (its keyed hash stays) and the requester's note, and records
/// when. An attempt that starts records the database clock (for people)
/// and its snapshot: a hold released by a transaction that snapshot could
/// not see was released after the attempt looked, whatever its
/// `released_at` says (see [`to_resume`]).
pub(crate) fn set_state(schema: &str, params: SetState) -> Statement<SetState> {
    let mut sql = SqlText::new("UPDATE ");
    sql.table(&CohortTable::ErasureRequest.qualified(schema))
        .push(
            " SET state = $2::text, resume_at = $4, waiting = $5, \
         last_run_id = coalesce($6, last_run_id), error = $7, \
         attempted_at = CASE WHEN $8 THEN pg_catalog.clock_timestamp() ELSE attempted_at END, \
         attempt_snapshot = CASE WHEN $8 THEN pg_catalog.pg_current_snapshot() ELSE attempt_snapshot END, \
         completed_at = CASE WHEN $2::text = 'completed' THEN $3 END, \
         subject_text = CASE WHEN $2::text = 'completed' THEN NULL ELSE subject_text END, \
         note = CASE WHEN $2::text = 'completed' THEN NULL ELSE note END, \
         updated_at = pg_catalog.clock_timestamp() \
         WHERE request_id = $1",
        );
    Statement::new(sql, params)
}

/// A line of a request's history.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) request_id: Uuid,
    pub(crate) state: &'static str,
    pub(crate) run_id: Option<Uuid>,
    pub(crate) detail: String,
}

impl Params for Event {
    fn bind(self, q: Args) -> Args {
        q.bind(self.request_id)
            .bind(self.state)
            .bind(self.run_id)
            .bind(self.detail)
    }
}

/// Appends a line to a request's history.
pub(crate) fn event(schema: &str, params: Event) -> Statement<Event> {
    let mut sql = SqlText::new("INSERT INTO ");
    sql.table(&CohortTable::ErasureRequestEvent.qualified(schema))
        .push(" (request_id, state, run_id, detail) VALUES ($1, $2, $3, $4) RETURNING event_id");
    Statement::new(sql, params)
}

/// A request's history, oldest first.
pub(crate) fn events(schema: &str, request_id: Uuid) -> Statement<(Uuid,)> {
    let mut sql =
        SqlText::new("SELECT e.event_id, e.state, e.at, e.run_id, e.detail, e.recorded_by FROM ");
    sql.table(&CohortTable::ErasureRequestEvent.qualified(schema))
        .push(" e WHERE e.request_id = $1 ORDER BY e.event_id");
    Statement::new(sql, (request_id,))
}

/// A new due date and why.
#[derive(Debug)]
pub(crate) struct SetDue {
    pub(crate) request_id: Uuid,
    pub(crate) due_at: DateTime<Utc>,
    pub(crate) reason: String,
}

impl Params for SetDue {
    fn bind(self, q: Args) -> Args {
        q.bind(self.request_id).bind(self.due_at).bind(self.reason)
    }
}

/// Moves a request's due date, recording why.
pub(crate) fn set_due(schema: &str, params: SetDue) -> Statement<SetDue> {
    let mut sql = SqlText::new("UPDATE ");
    sql.table(&CohortTable::ErasureRequest.qualified(schema))
        .push(
            " SET due_at = $2, due_reason = $3, updated_at = pg_catalog.clock_timestamp() \
         WHERE request_id = $1",
        );
    Statement::new(sql, params)
}

/// Which requests to list.
#[derive(Debug)]
pub(crate) struct List {
    pub(crate) state: Option<&'static str>,
    /// Only those not completed whose due date is before this.
    pub(crate) overdue_at: Option<DateTime<Utc>>,
    pub(crate) limit: i64,
}

impl Params for List {
    fn bind(self, q: Args) -> Args {
        q.bind(self.state).bind(self.overdue_at).bind(self.limit)
    }
}

/// Requests, oldest received first.
pub(crate) fn list(schema: &str, params: List) -> Statement<List> {
    let mut sql = SqlText::new(COLUMNS);
    sql.table(&CohortTable::ErasureRequest.qualified(schema))
        .push(
            " r WHERE ($1::text IS NULL OR r.state = $1::text) \
         AND ($2::timestamptz IS NULL OR (r.state <> 'completed' AND r.due_at < $2::timestamptz)) \
         ORDER BY r.received_at, r.reference LIMIT $3",
        );
    Statement::new(sql, params)
}

/// Requests the maintenance service should run again at `$1` (a logical
/// `now`), at most `$2`: waiting ones whose `resume_at` has come (a legal
/// minimum passed, a NULL anchor or reference to look at again), or for
/// which a hold was released that their last attempt could not see
/// released, or expired since it began (a record hold of an entity a part
/// waits in, or any hold not tied to an entity: subject holds); and open
/// or in-progress ones (their run lock, taken by the caller, tells a live
/// attempt from one a lost process left).
///
/// A release is judged by transaction, never by comparing its
/// `released_at` (its transaction's start) with the attempt's clock: the
/// release's transaction stamped `written_xid` (the stamp trigger), and a
/// transaction the attempt's snapshot could not see committed after the
/// attempt began looking, so it may have kept a row the release frees.
/// At worst a request is tried once more and waits again.
pub(crate) fn to_resume(
    schema: &str,
    now: DateTime<Utc>,
    limit: i64,
) -> Statement<(DateTime<Utc>, i64)> {
    let mut sql = SqlText::new("SELECT r.request_id FROM ");
    sql.table(&CohortTable::ErasureRequest.qualified(schema))
        .push(
            " r WHERE r.state IN ('open', 'in_progress') \
             OR (r.state = 'waiting' AND (r.resume_at <= $1 OR EXISTS (SELECT 1 FROM ",
        )
        .table(&CohortTable::Hold.qualified(schema))
        .push(
            " h WHERE (h.released_at IS NOT NULL AND h.released_at <= pg_catalog.clock_timestamp() \
                    AND (r.attempt_snapshot IS NULL \
                         OR NOT pg_catalog.pg_visible_in_snapshot(h.written_xid, r.attempt_snapshot)) \
               OR h.expires_at > r.attempted_at AND h.expires_at <= pg_catalog.clock_timestamp()) \
             AND (h.retention_entity_id IS NULL OR h.retention_entity_id::text IN \
               (SELECT p->>'entity_id' FROM pg_catalog.jsonb_array_elements(r.waiting) p \
                WHERE p->>'reason' = 'held'))))) \
             ORDER BY r.due_at, r.reference LIMIT $2",
        );
    Statement::new(sql, (now, limit))
}

/// Requests per state, and how many not completed are past due at `$1`.
pub(crate) fn by_state(schema: &str, now: DateTime<Utc>) -> Statement<(DateTime<Utc>,)> {
    let mut sql = SqlText::new(
        "SELECT r.state, pg_catalog.count(*)::int8 AS requests, \
         pg_catalog.count(*) FILTER (WHERE r.state <> 'completed' AND r.due_at < $1)::int8 AS overdue FROM ",
    );
    sql.table(&CohortTable::ErasureRequest.qualified(schema))
        .push(" r GROUP BY r.state ORDER BY r.state");
    Statement::new(sql, (now,))
}

/// A request's state, as [`states`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct StateRow {
    pub(crate) request_id: Uuid,
    pub(crate) state: String,
}

/// A hold's state, as [`hold_states`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct HoldStateRow {
    pub(crate) hold_id: Uuid,
    pub(crate) released_at: Option<DateTime<Utc>>,
}

/// A journal entry a row recorded, as [`journal_records`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct JournalRecordRow {
    /// `hold …` or `erasure request …`.
    pub(crate) what: String,
    pub(crate) entry: i64,
    pub(crate) hash: Option<String>,
}

/// Every request's id and state ([`StateRow`]): what `restore-check`
/// compares with the journal.
pub(crate) fn states(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("SELECT r.request_id, r.state FROM ");
    sql.table(&CohortTable::ErasureRequest.qualified(schema))
        .push(" r ORDER BY r.received_at, r.reference");
    Statement::new(sql, ())
}

/// Every hold's id and whether (when) it was released.
pub(crate) fn hold_states(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("SELECT h.hold_id, h.released_at FROM ");
    sql.table(&CohortTable::Hold.qualified(schema))
        .push(" h ORDER BY h.created_at, h.hold_id");
    Statement::new(sql, ())
}

/// Every journal entry the database recorded (holds and requests that
/// were journaled first): columns `what` (`hold …` or `erasure request
/// …`), `entry` and `hash`, by entry.
pub(crate) fn journal_records(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new(
        "SELECT 'hold ' || h.hold_id::text AS what, h.journal_entry AS entry, h.journal_hash AS hash FROM ",
    );
    sql.table(&CohortTable::Hold.qualified(schema))
        .push(
            " h WHERE h.journal_entry IS NOT NULL UNION ALL \
             SELECT 'erasure request ' || r.reference, r.journal_entry, r.journal_hash FROM ",
        )
        .table(&CohortTable::ErasureRequest.qualified(schema))
        .push(" r WHERE r.journal_entry IS NOT NULL ORDER BY 2");
    Statement::new(sql, ())
}
