//! The hold statements of the ledger's plan (placing, listing, releasing
//! and reading holds; the active ones a sweep and a subject check read),
//! with their parameters and the row they return.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::statement::{Args, Params};
use crate::base::ident::{QualifiedName, SqlText};

/// A hold as the hold statements return it ([`HOLD_COLUMNS`]), `active`
/// judged by the database clock.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct HoldRow {
    pub(crate) hold_id: Uuid,
    pub(crate) retention_entity_id: Option<Uuid>,
    pub(crate) record_id: Option<String>,
    pub(crate) subject_kind: Option<String>,
    pub(crate) subject_text: Option<String>,
    pub(crate) tenant_id: Option<String>,
    pub(crate) reason: String,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    pub(crate) released_at: Option<DateTime<Utc>>,
    pub(crate) active: bool,
}

const HOLD_COLUMNS: &str = concat!(
    " hold_id, retention_entity_id, record_id, subject_kind, subject_text, tenant_id, reason, \
    created_at, expires_at, released_at, ",
    active_hold!(),
    " AS active"
);

/// The statement of `LedgerPlan::insert_hold`.
pub(super) fn insert_hold(hold: &QualifiedName) -> SqlText {
    let mut insert_hold = SqlText::new("INSERT INTO ");
    insert_hold
        .table(hold)
        .push(
            " (hold_id, retention_entity_id, record_id, tenant_id, reason, created_at, expires_at, \
               subject_kind, subject_text, subject_citext, subject_uuid, subject_int, \
               journal_entry, journal_hash) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::uuid, $12::int8, $13::int8, $14::text \
             WHERE $7::timestamptz IS NULL OR $7::timestamptz > pg_catalog.now() RETURNING",
        )
        .push(HOLD_COLUMNS);
    insert_hold
}

/// The statement of `LedgerPlan::list_holds`.
pub(super) fn list_holds(hold: &QualifiedName) -> SqlText {
    let mut list_holds = SqlText::new("SELECT");
    list_holds
        .push(HOLD_COLUMNS)
        .push(" FROM ")
        .table(hold)
        .push(concat!(
            " WHERE ($1::uuid IS NULL OR retention_entity_id = $1) \
           AND ($2::text IS NULL OR tenant_id = $2) \
           AND (NOT $3 OR (",
            active_hold!(),
            ")) ORDER BY created_at, hold_id LIMIT $4"
        ));
    list_holds
}

/// The statement of `LedgerPlan::release_hold`.
pub(super) fn release_hold(hold: &QualifiedName) -> SqlText {
    let mut release_hold = SqlText::new("UPDATE ");
    release_hold
        .table(hold)
        .push(
            " SET released_at = pg_catalog.now() WHERE hold_id = $1 \
             AND (released_at IS NULL OR released_at > pg_catalog.now()) RETURNING",
        )
        .push(HOLD_COLUMNS);
    release_hold
}

/// The statement of `LedgerPlan::get_hold`.
pub(super) fn get_hold(hold: &QualifiedName) -> SqlText {
    let mut get_hold = SqlText::new("SELECT");
    get_hold
        .push(HOLD_COLUMNS)
        .push(" FROM ")
        .table(hold)
        .push(" WHERE hold_id = $1");
    get_hold
}

/// The statement of `LedgerPlan::active_holds`.
pub(super) fn active_holds(hold: &QualifiedName) -> SqlText {
    let mut active_holds = SqlText::new("SELECT DISTINCT record_id FROM ");
    active_holds.table(hold).push(concat!(
        " WHERE retention_entity_id = $1 AND ",
        active_hold!(),
        " LIMIT $2"
    ));
    active_holds
}

/// An active subject hold as the counts bind it: its kind and its
/// canonical text in each form it can take (the rows of
/// `LedgerPlan::active_subject_holds`).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SubjectHoldRow {
    pub(crate) subject_kind: Option<String>,
    subject_text: Option<String>,
    subject_citext: Option<String>,
    subject_uuid: Option<String>,
    subject_int: Option<String>,
}

impl SubjectHoldRow {
    /// The subject in `form` (`None`: it has no such form).
    pub(crate) fn form(&self, form: crate::domain::model::SubjectForm) -> Option<&str> {
        use crate::domain::model::SubjectForm;
        match form {
            SubjectForm::Text => self.subject_text.as_deref(),
            SubjectForm::CiText => self.subject_citext.as_deref(),
            SubjectForm::Uuid => self.subject_uuid.as_deref(),
            SubjectForm::Int => self.subject_int.as_deref(),
        }
    }
}

/// The statement of `LedgerPlan::active_subject_holds`.
pub(super) fn active_subject_holds(hold: &QualifiedName) -> SqlText {
    let mut active_subject_holds = SqlText::new(
        "SELECT subject_kind, subject_text, subject_citext, subject_uuid::text AS subject_uuid, \
         subject_int::text AS subject_int FROM ",
    );
    active_subject_holds.table(hold).push(concat!(
        " WHERE subject_text IS NOT NULL AND ",
        active_hold!(),
        " LIMIT $1"
    ));
    active_subject_holds
}

/// A new hold on one record (entity and record id) or on a subject (its
/// kind and its canonical text in each form it can take).
#[derive(Debug)]
pub(crate) struct InsertHold {
    pub(crate) hold_id: Uuid,
    pub(crate) entity_id: Option<Uuid>,
    pub(crate) record_id: Option<String>,
    pub(crate) subject_kind: Option<String>,
    /// `subject_text`, `subject_citext`, `subject_uuid`, `subject_int`.
    pub(crate) subject_forms: [Option<String>; 4],
    pub(crate) tenant: Option<String>,
    pub(crate) reason: String,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// The journal entry that recorded the hold first (its place and
    /// hash), when it was journaled: the database's record of the journal.
    pub(crate) journal: Option<(i64, String)>,
}

impl Params for InsertHold {
    fn bind(self, q: Args) -> Args {
        q.bind(self.hold_id)
            .bind(self.entity_id)
            .bind(self.record_id)
            .bind(self.tenant)
            .bind(self.reason)
            .bind(self.created_at)
            .bind(self.expires_at)
            .bind(self.subject_kind)
            .bind(self.subject_forms[0].clone())
            .bind(self.subject_forms[1].clone())
            .bind(self.subject_forms[2].clone())
            .bind(self.subject_forms[3].clone())
            .bind(self.journal.as_ref().map(|j| j.0))
            .bind(self.journal.map(|j| j.1))
    }
}

/// Which holds to list.
#[derive(Debug)]
pub(crate) struct ListHolds {
    pub(crate) entity_id: Option<Uuid>,
    pub(crate) tenant: Option<String>,
    pub(crate) active_only: bool,
    pub(crate) limit: Option<i64>,
}

impl Params for ListHolds {
    fn bind(self, q: Args) -> Args {
        q.bind(self.entity_id)
            .bind(self.tenant)
            .bind(self.active_only)
            .bind(self.limit)
    }
}

/// An entity's active holds, at most `limit` of them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActiveHolds {
    pub(crate) entity_id: Uuid,
    pub(crate) limit: i64,
}

impl Params for ActiveHolds {
    fn bind(self, q: Args) -> Args {
        q.bind(self.entity_id).bind(self.limit)
    }
}
