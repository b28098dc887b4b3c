//! SQL fragments shared by the entity and erasure statements: the hold
//! check, the strategy's "not done" condition, foreign-key blockers, the
//! tenant filter and comparisons in a column's own type.

use std::collections::BTreeMap;

use crate::base::ident::{QualifiedName, SqlText};
use crate::domain::model::EntityDescriptor;
use crate::domain::rules::Strategy;
use crate::sql::tables::CohortTable;
use crate::sql::{IncomingKey, KeyType};

/// The key types of the columns a hold compares beyond the record id: the
/// subject columns (by name) and the tenant column.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HoldKeys<'a> {
    pub(crate) subjects: &'a BTreeMap<String, KeyType>,
    pub(crate) tenant: Option<KeyType>,
}

/// An active hold on the row: a hold on its record or on a subject it
/// holds. Record holds protect the record (entity + record id), whatever
/// tenant the row belongs to now: a held row that was moved to another
/// tenant stays protected in every tenant's sweep and erasure.
pub(crate) fn hold_exists(
    e: &EntityDescriptor,
    casts: &Casts,
    keys: HoldKeys<'_>,
    cohort_schema: &str,
) -> SqlText {
    let record = record_hold(e, casts, cohort_schema, active_hold!("h."));
    match subject_hold(e, keys, cohort_schema, active_hold!("h.")) {
        Some(subject) => {
            let mut s = SqlText::new("(");
            s.append(&record).push(" OR ").append(&subject).push(")");
            s
        }
        None => record,
    }
}

/// A hold on the row's record, alive by `life` (a condition on `h.`).
pub(crate) fn record_hold(
    e: &EntityDescriptor,
    casts: &Casts,
    cohort_schema: &str,
    life: &'static str,
) -> SqlText {
    if casts.composite() {
        return casts.composite_hold(e, cohort_schema, life);
    }
    let mut s = SqlText::new("EXISTS (SELECT 1 FROM ");
    s.table(&CohortTable::Hold.qualified(cohort_schema))
        .push(" h WHERE h.retention_entity_id = $1 AND h.record_id = ")
        .append(&casts.key_text(e))
        .push(" AND ")
        .push(life)
        .push(")");
    s
}

/// A hold on a subject the row holds, alive by `life`. Per subject
/// column, an `EXISTS` whose only link to the row is one equality between
/// the hold's stored form and the column's value, in the column's type:
/// the planner either reads the live holds once per statement into a hash
/// or, when they are too many for memory, probes the form's index per row
/// (never a scan of every hold per row). Holds of the column's kind (or of
/// none) that name no tenant are looked for first; holds naming a tenant,
/// paired with the row's tenant, only when one exists (checked once per
/// statement). `EXISTS` is TRUE or FALSE, never NULL: a row without a
/// subject is never taken for a held one. `None` for an entity without
/// subject columns.
pub(crate) fn subject_hold(
    e: &EntityDescriptor,
    keys: HoldKeys<'_>,
    cohort_schema: &str,
    life: &'static str,
) -> Option<SqlText> {
    if e.subjects.is_empty() {
        return None;
    }
    let hold = CohortTable::Hold.qualified(cohort_schema);
    let mut s = SqlText::new("(");
    for (i, subject) in e.subjects.iter().enumerate() {
        if i > 0 {
            s.push(" OR ");
        }
        let ty = keys.subjects[&subject.column];
        let form = ty.subject_form().hold_column();
        // The column's value as the stored form's type: uuid and integers
        // as they are (the forms are uuid and bigint), text as text
        // (char(n) without its padding), citext folded.
        let mut value = SqlText::default();
        match ty {
            KeyType::Uuid | KeyType::Int2 | KeyType::Int4 | KeyType::Int8 => {
                value.col(&subject.column);
            }
            KeyType::Text => {
                value.col(&subject.column).push("::text");
            }
            KeyType::CiText => {
                value
                    .push("pg_catalog.lower(")
                    .col(&subject.column)
                    .push("::text)");
            }
        }
        // The live holds of this column's kind with a form for its type.
        let mut live = SqlText::new(" AND ");
        if let Some(kind) = &subject.kind {
            live.push("(h.subject_kind IS NULL OR h.subject_kind = ")
                .kind_literal(kind)
                .push(") AND ");
        }
        live.push(life).push(")");
        s.push("EXISTS (SELECT 1 FROM ")
            .table(&hold)
            .push(" h WHERE h.")
            .push(form)
            .push(" = ")
            .append(&value)
            .push(" AND h.tenant_id IS NULL")
            .append(&live);
        if let (Some(column), Some(tenant_ty)) = (&e.tenant, keys.tenant) {
            s.push(" OR (EXISTS (SELECT 1 FROM ")
                .table(&hold)
                .push(" h WHERE h.")
                .push(form)
                .push(" IS NOT NULL AND h.tenant_id IS NOT NULL")
                .append(&live)
                .push(" AND EXISTS (SELECT 1 FROM ")
                .table(&hold)
                .push(" h WHERE h.")
                .push(form)
                .push(" = ")
                .append(&value)
                .push(" AND h.tenant_id = ")
                .append(&canonical_text(column, tenant_ty))
                .append(&live)
                .push(")");
        }
    }
    s.push(")");
    Some(s)
}

/// The rows a [`BoundHolds`](super::BoundHolds) names, bound from `$first`:
/// `(t.key = ANY($first) OR t.subject1 = ANY($first + 1) OR ...)`, each in
/// the column's own type, so each arm is an index probe.
pub(crate) fn bound_rows(e: &EntityDescriptor, casts: &Casts, first: usize) -> SqlText {
    let mut s = SqlText::new("(");
    s.append(&casts.key_any(e, first));
    for (i, subject) in e.subjects.iter().enumerate() {
        s.push(" OR ")
            .append(&casts.any(&subject.column, first + 1 + i));
    }
    s.push(")");
    s
}

/// A key-like column's canonical text, as Cohort stores keys: `::text`,
/// lower-cased for citext.
pub(crate) fn canonical_text(column: &str, ty: KeyType) -> SqlText {
    let mut s = SqlText::default();
    if ty == KeyType::CiText {
        s.push("pg_catalog.lower(").col(column).push("::text)");
    } else {
        s.col(column).push("::text");
    }
    s
}

/// Columns whose values must be compared in the column's own type rather
/// than the bound parameter's (citext: case-insensitive), by column name,
/// with that type's schema-qualified name; and a composite record key's
/// parts (empty for a one-column key: see `sql::record_key`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Casts {
    pub(crate) columns: BTreeMap<String, QualifiedName>,
    pub(crate) key: Vec<KeyPart>,
}

/// One part of a composite record key: its column, type, and the type's
/// schema-qualified name (what a bound part is cast to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyPart {
    pub(crate) column: String,
    pub(crate) ty: crate::domain::model::PartType,
    pub(crate) sql_type: QualifiedName,
}

impl Casts {
    /// `$n`, cast to `column`'s type when needed.
    pub(crate) fn param(&self, s: &mut SqlText, column: &str, n: usize) {
        s.param(n);
        if let Some(ty) = self.columns.get(column) {
            s.push("::").table(ty);
        }
    }

    /// `$n` as an array of `column`'s type when needed.
    pub(crate) fn array(&self, s: &mut SqlText, column: &str, n: usize) {
        s.param(n);
        if let Some(ty) = self.columns.get(column) {
            s.push("::").table(ty).push("[]");
        }
    }

    /// The column as selected for decoding (as text when it has a cast).
    pub(crate) fn select(&self, s: &mut SqlText, column: &str) {
        s.col(column);
        if self.columns.contains_key(column) {
            s.push("::text");
        }
    }

    /// `t.column = ANY($n)` in the column's own type.
    pub(crate) fn any(&self, column: &str, n: usize) -> SqlText {
        let mut s = SqlText::default();
        s.col(column).push(" = ANY(");
        self.array(&mut s, column, n);
        s.push(")");
        s
    }
}

/// The strategy's own "not yet done" condition, with a leading ` AND `.
pub(crate) fn not_done(e: &EntityDescriptor, strategy: Strategy) -> SqlText {
    let mut s = SqlText::default();
    match strategy {
        Strategy::SoftDelete => {
            s.push(" AND ")
                .col(
                    e.soft_delete
                        .as_deref()
                        .expect("validated: soft delete has a flag"),
                )
                .push(" IS NOT TRUE");
        }
        Strategy::Anonymise => {
            s.push(" AND ")
                .col(
                    e.anonymised_at
                        .as_deref()
                        .expect("validated: anonymise has a marker"),
                )
                .push(" IS NULL");
        }
        _ => {}
    }
    s
}

/// `EXISTS` over every foreign key that forbids deleting a referenced row.
pub(crate) fn referenced(blockers: &[IncomingKey]) -> Option<SqlText> {
    if blockers.is_empty() {
        return None;
    }
    let mut s = SqlText::new("(");
    for (i, k) in blockers.iter().enumerate() {
        if i > 0 {
            s.push(" OR ");
        }
        s.push("EXISTS (SELECT 1 FROM ")
            .table(&k.child)
            .push(" r WHERE ");
        for (j, (child, parent)) in k.child_columns.iter().zip(&k.parent_columns).enumerate() {
            if j > 0 {
                s.push(" AND ");
            }
            s.push("r.").ident(child).push(" = ").col(parent);
        }
        s.push(")");
    }
    s.push(")");
    Some(s)
}

/// Purge and archive cannot delete a row that another row still references: such rows
/// are left alone (not locked, not mutated) and counted as skipped.
pub(crate) struct Blocked {
    /// ` AND NOT (referenced)` for purge and archive, else empty.
    pub(crate) unblocked: SqlText,
    referenced: Option<SqlText>,
}

impl Blocked {
    /// `count(*) FILTER (…) AS skipped`, or `0 AS skipped` (the cutoff
    /// bound as `$cutoff`).
    pub(crate) fn skipped_column(&self, anchor: &str, cutoff: usize, held: &SqlText) -> SqlText {
        let mut s = SqlText::default();
        match &self.referenced {
            Some(r) => {
                s.push("pg_catalog.count(*) FILTER (WHERE ")
                    .col(anchor)
                    .push(" < ")
                    .param(cutoff)
                    .push(" AND NOT ")
                    .append(held)
                    .push(" AND ")
                    .append(r)
                    .push(") AS skipped");
            }
            None => {
                s.push("0::int8 AS skipped");
            }
        }
        s
    }
}

pub(crate) fn blocked(strategy: Strategy, referenced: Option<&SqlText>) -> Blocked {
    let referenced = strategy.deletes().then(|| referenced.cloned()).flatten();
    let mut unblocked = SqlText::default();
    if let Some(r) = &referenced {
        unblocked.push(" AND NOT ").append(r);
    }
    Blocked {
        unblocked,
        referenced,
    }
}

pub(crate) fn tenant_filter(e: &EntityDescriptor, casts: &Casts, param: usize) -> SqlText {
    let mut s = SqlText::default();
    if let Some(t) = &e.tenant {
        s.push(" AND ").col(t).push(" = ");
        casts.param(&mut s, t, param);
    }
    s
}
