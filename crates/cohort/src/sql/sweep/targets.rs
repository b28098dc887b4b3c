//! The statements that name rows by key rather than by age: custom
//! anonymisers' reads, hold creation's lock of its target, guarded
//! deletion, and whether a record is held (now, or at a given time).

use crate::base::ident::SqlText;
use crate::domain::model::EntityDescriptor;
use crate::sql::fragments::{subject_hold, tenant_filter, Casts, HoldKeys};
use crate::sql::statement::{Args, Numbering, Params, Statement};
use crate::sql::tables::CohortTable;
use crate::sql::{BindKey, KeyValue};

/// The entity's statements by key.
#[derive(Debug, Clone)]
pub(crate) struct Targets {
    /// Reads the locked rows for custom anonymisers: key first, then every
    /// column. `$1` record keys.
    pub(crate) load_rows: SqlText,
    /// Locks one row against mutation and returns its key and tenant as
    /// text (tenant NULL when tenantless): what hold creation takes.
    /// `$1` record key.
    pub(crate) lock_target: SqlText,
    /// Guarded deletion: locks the targets (`FOR UPDATE`, in key order) and
    /// returns each one's canonical id and tenant. `$1` record keys.
    pub(crate) guard_lock: SqlText,
    /// Guarded deletion: the held ones among locked targets, as
    /// `record::text`. `$1` entity id, `$2` record keys.
    pub(crate) guard_held: SqlText,
    /// Whether a record is under an active hold: matched through the row
    /// (the hold stores the row's own key text) or by the canonical id.
    /// `$1` entity id, `$2` record key, `$3` canonical id text.
    pub(crate) is_held: SqlText,
    /// `is_held` at a given time (`$4`): a hold created by then and
    /// neither released nor expired by then.
    pub(crate) is_held_at: SqlText,
}

impl Targets {
    /// Builds them; `held` is the hold check of every statement.
    pub(super) fn build(
        e: &EntityDescriptor,
        casts: &Casts,
        keys: HoldKeys<'_>,
        held: &SqlText,
        cohort_schema: &str,
    ) -> Self {
        Targets {
            load_rows: load_rows(e, casts),
            lock_target: lock_target(e, casts),
            guard_lock: guard_lock(e, casts),
            guard_held: guard_held(e, casts, held),
            is_held: is_held(e, casts, held, cohort_schema),
            is_held_at: is_held_at(e, casts, keys, cohort_schema),
        }
    }
}

fn load_rows(e: &EntityDescriptor, casts: &Casts) -> SqlText {
    let mut s = SqlText::new("SELECT ");
    casts.key_select(&mut s, e);
    s.push(", t.* FROM ")
        .table(&e.table)
        .push(" t WHERE ")
        .append(&casts.key_any(e, 1));
    s
}

/// `SELECT key::text AS record, tenant::text AS tenant FROM table t WHERE `
fn key_and_tenant(e: &EntityDescriptor, casts: &Casts) -> SqlText {
    let mut s = SqlText::new("SELECT ");
    s.append(&casts.key_text(e)).push(" AS record, ");
    match &e.tenant {
        Some(t) => {
            s.col(t).push("::text");
        }
        None => {
            s.push("NULL::text");
        }
    }
    s.push(" AS tenant FROM ").table(&e.table).push(" t WHERE ");
    s
}

fn lock_target(e: &EntityDescriptor, casts: &Casts) -> SqlText {
    let mut s = key_and_tenant(e, casts);
    s.append(&casts.key_eq(e, 1)).push(" FOR KEY SHARE");
    s
}

fn guard_lock(e: &EntityDescriptor, casts: &Casts) -> SqlText {
    let mut s = key_and_tenant(e, casts);
    s.append(&casts.key_any(e, 1))
        .push(" ORDER BY ")
        .append(&casts.key_columns(e))
        .push(" FOR UPDATE");
    s
}

fn guard_held(e: &EntityDescriptor, casts: &Casts, held: &SqlText) -> SqlText {
    let mut s = SqlText::new("SELECT ");
    s.append(&casts.key_text(e))
        .push(" AS record FROM ")
        .table(&e.table)
        .push(" t WHERE ")
        .append(&casts.key_any(e, 2))
        .push(" AND ")
        .append(held)
        .push(" ORDER BY ")
        .append(&casts.key_columns(e));
    s
}

fn is_held(e: &EntityDescriptor, casts: &Casts, held: &SqlText, cohort_schema: &str) -> SqlText {
    let mut s = SqlText::new("SELECT EXISTS (SELECT 1 FROM ");
    s.table(&e.table)
        .push(" t WHERE ")
        .append(&casts.key_eq(e, 2));
    s.push(" AND ")
        .append(held)
        .push(") OR EXISTS (SELECT 1 FROM ");
    s.table(&CohortTable::Hold.qualified(cohort_schema))
        .push(concat!(
            " h WHERE h.retention_entity_id = $1 AND h.record_id = $3 AND ",
            active_hold!("h."),
            ")"
        ));
    s
}

/// The same two ways of naming the record as [`is_held`], with the hold's
/// life compared to `$4` instead of now; and a subject hold alive at `$4`
/// on a subject the row holds now.
fn is_held_at(
    e: &EntityDescriptor,
    casts: &Casts,
    keys: HoldKeys<'_>,
    cohort_schema: &str,
) -> SqlText {
    let at = " AND h.created_at <= $4 AND (h.released_at IS NULL OR h.released_at > $4) \
              AND (h.expires_at IS NULL OR h.expires_at > $4))";
    let holds = CohortTable::Hold.qualified(cohort_schema);
    let mut s = SqlText::new("SELECT EXISTS (SELECT 1 FROM ");
    s.table(&e.table)
        .push(" t JOIN ")
        .table(&holds)
        .push(" h ON h.retention_entity_id = $1 AND h.record_id = ")
        .append(&casts.key_text(e))
        .push(" WHERE ")
        .append(&casts.key_eq(e, 2));
    s.push(at)
        .push(" OR EXISTS (SELECT 1 FROM ")
        .table(&holds)
        .push(" h WHERE h.retention_entity_id = $1 AND h.record_id = $3")
        .push(at);
    let at_subject = "h.created_at <= $4 AND (h.released_at IS NULL OR h.released_at > $4) \
                      AND (h.expires_at IS NULL OR h.expires_at > $4)";
    if let Some(subject) = subject_hold(e, keys, cohort_schema, at_subject) {
        s.push(" OR EXISTS (SELECT 1 FROM ")
            .table(&e.table)
            .push(" t WHERE ")
            .append(&casts.key_eq(e, 2));
        s.push(" AND ").append(&subject).push(")");
    }
    s
}

/// The values of [`lock_subject_rows`]: the subject in each column's own
/// type, then the tenant.
pub(crate) struct SubjectRows {
    values: Vec<KeyValue>,
    tenant: Option<KeyValue>,
}

impl Params for SubjectRows {
    fn bind(self, mut q: Args) -> Args {
        for v in &self.values {
            q = v.bind(q);
        }
        if let Some(t) = &self.tenant {
            q = t.bind(q);
        }
        q
    }
}

/// Hold creation on a subject: locks every row of the entity whose given
/// subject columns equal the subject (`FOR KEY SHARE`, which conflicts with
/// the `FOR UPDATE` of every mutation), in the tenant when one is given,
/// and returns how many. `$1..` one value per column in its own type,
/// then the tenant.
pub(crate) fn lock_subject_rows(
    e: &EntityDescriptor,
    casts: &Casts,
    columns: Vec<(&str, KeyValue)>,
    tenant: Option<KeyValue>,
) -> Statement<SubjectRows> {
    let mut s = SqlText::new("SELECT pg_catalog.count(*) FROM (SELECT 1 FROM ");
    s.table(&e.table).push(" t WHERE (");
    let mut n = Numbering::default();
    for (i, (column, _)) in columns.iter().enumerate() {
        if i > 0 {
            s.push(" OR ");
        }
        s.col(column).push(" = ");
        casts.param(&mut s, column, n.next());
    }
    s.push(")");
    if tenant.is_some() {
        s.append(&tenant_filter(e, casts, n.next()));
    }
    s.push(" FOR KEY SHARE OF t) locked");
    let values = columns.into_iter().map(|(_, v)| v).collect();
    Statement::new(s, SubjectRows { values, tenant })
}
