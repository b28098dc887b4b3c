//! SQL fragments shared by the entity and erasure statements: the hold
//! check, the strategy's "not done" condition, foreign-key blockers, the
//! tenant filter and comparisons in a column's own type.

use std::collections::BTreeMap;

use crate::ident::{QualifiedName, SqlText};
use crate::model::EntityDescriptor;
use crate::rules::Strategy;
use crate::sql::tables::CohortTable;
use crate::sql::IncomingKey;

/// An active hold on the row. Holds protect the record (entity + record
/// id), whatever tenant the row belongs to now: a held row that was moved to
/// another tenant stays protected in every tenant's sweep and erasure.
pub(crate) fn hold_exists(e: &EntityDescriptor, cohort_schema: &str) -> SqlText {
    let mut s = SqlText::new("EXISTS (SELECT 1 FROM ");
    s.table(&CohortTable::Hold.qualified(cohort_schema))
        .push(" h WHERE h.retention_entity_id = $1 AND h.record_id = ")
        .col(&e.record_id)
        .push(concat!("::text AND ", active_hold!("h."), ")"));
    s
}

/// Columns whose values must be compared in the column's own type rather
/// than the bound parameter's (citext: case-insensitive), by column name,
/// with that type's schema-qualified name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Casts(pub(crate) BTreeMap<String, QualifiedName>);

impl Casts {
    /// `$n`, cast to `column`'s type when needed.
    pub(crate) fn param(&self, s: &mut SqlText, column: &str, n: usize) {
        s.param(n);
        if let Some(ty) = self.0.get(column) {
            s.push("::").table(ty);
        }
    }

    /// `$n` as an array of `column`'s type when needed.
    pub(crate) fn array(&self, s: &mut SqlText, column: &str, n: usize) {
        s.param(n);
        if let Some(ty) = self.0.get(column) {
            s.push("::").table(ty).push("[]");
        }
    }

    /// The column as selected for decoding (as text when it has a cast).
    pub(crate) fn select(&self, s: &mut SqlText, column: &str) {
        s.col(column);
        if self.0.contains_key(column) {
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

/// Purge cannot delete a row that another row still references: such rows
/// are left alone (not locked, not mutated) and counted as skipped.
pub(crate) struct Blocked {
    /// ` AND NOT (referenced)` for purge, else empty.
    pub(crate) unblocked: SqlText,
    referenced: Option<SqlText>,
}

impl Blocked {
    /// `count(*) FILTER (…) AS skipped`, or `0 AS skipped`.
    pub(crate) fn skipped_column(
        &self,
        anchor: &str,
        cutoff: &'static str,
        held: &SqlText,
    ) -> SqlText {
        let mut s = SqlText::default();
        match &self.referenced {
            Some(r) => {
                s.push("count(*) FILTER (WHERE ")
                    .col(anchor)
                    .push(" < ")
                    .push(cutoff)
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
    let referenced = (strategy == Strategy::Purge)
        .then(|| referenced.cloned())
        .flatten();
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
