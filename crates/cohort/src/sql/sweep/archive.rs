//! The archive strategy's move: one statement deletes the batch and
//! inserts its copy, and fails unless the archive took exactly the rows
//! deleted.

use std::collections::BTreeMap;

use super::slots::{MutationSlots, Own};
use super::values::{anonymised_values, per_row_values};
use crate::base::ident::{QualifiedName, SqlText};
use crate::domain::model::EntityDescriptor;
use crate::sql::fragments::Casts;

/// The archive strategy's three statements.
pub(super) struct ArchiveStatements {
    /// Moves the rows; nothing returned.
    pub(super) count: SqlText,
    /// Moves the rows; returns each moved key as text.
    pub(super) keys: SqlText,
    /// Moves the rows and writes a row detail per moved row.
    pub(super) audited: SqlText,
}

/// One statement moves the batch: `WITH moved AS (DELETE … RETURNING …)
/// INSERT INTO archive … SELECT … FROM moved`. `delete` is the purge
/// mutation with every re-check (holds, references, cutoff, tenant), so
/// the archive receives the rows deleted, in the same statement: either
/// both happen or neither. Every form reads the `verdict` of
/// [`archive_checked`], which fails the statement unless the archive took
/// exactly the rows deleted (a trigger or rule on the archive table could
/// drop or rewrite a copy). The copy is stamped with the run's `now`
/// (`archived_at`, the last of the strategy's values) and the run id
/// (`$3`), and, with anonymise-on-archive, its anonymised columns are
/// replaced by their anonymised values (parameters after the run id).
pub(super) fn archive_statements(
    e: &EntityDescriptor,
    casts: &Casts,
    delete: &SqlText,
    at: &MutationSlots,
    cohort_schema: &str,
) -> ArchiveStatements {
    let mut moved = SqlText::new("WITH moved AS (");
    moved
        .append(delete)
        .push(" RETURNING ")
        .append(&archive_returning(e, casts))
        .push("), ")
        .append(&archive_checked(
            e,
            casts,
            &archive_insert(e, casts, &at.own),
            cohort_schema,
        ));

    // One row per deleted row, each only after the verdict passed.
    let count = {
        let mut s = moved.clone();
        s.push(" SELECT 1 FROM moved, verdict");
        s
    };
    let keys = {
        let mut s = moved.clone();
        s.push(" SELECT ")
            .append(&moved_key(e, casts))
            .push(" FROM moved, verdict");
        s
    };
    let mut audited = moved;
    audited
        .push(" INSERT INTO ")
        .table(&crate::sql::tables::CohortTable::RowDetail.qualified(cohort_schema))
        .push(" (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) SELECT ")
        .param(at.audit.run)
        .push(", $1, ")
        .param(at.audit.entity)
        .push(", ")
        .append(&moved_key(e, casts))
        .push(", ")
        .param(at.audit.tenant)
        .push(", ")
        .param(at.audit.action)
        .push(" FROM moved, verdict RETURNING row_detail_id, record_id");
    ArchiveStatements {
        count,
        keys,
        audited,
    }
}

/// The archive's copy of `moved` and its verdict, as two CTEs:
/// `archived AS (INSERT … RETURNING key), verdict AS (SELECT
/// retention_archive_check(…) AS ok)`. The verdict compares the rows
/// deleted with the copies taken (as many, with the same keys) and raises
/// an error otherwise, which rolls the batch back: a statement that reads
/// `verdict` deletes nothing unless every deleted row was copied.
pub(super) fn archive_checked(
    e: &EntityDescriptor,
    casts: &Casts,
    insert: &SqlText,
    cohort_schema: &str,
) -> SqlText {
    let mut s = SqlText::new("archived AS (");
    s.append(insert).push(" RETURNING ");
    // A composite key is compared as its text, read from the copy (the
    // insert's target is `t`) and from what was deleted.
    let moved = if casts.composite() {
        s.append(&casts.key_text(e));
        SqlText::new("moved.cohort_key")
    } else {
        s.ident(&e.record_id);
        let mut m = SqlText::new("moved.");
        m.ident(&e.record_id);
        m
    };
    s.push(" AS k), verdict AS (SELECT ")
        .table(&QualifiedName::new(cohort_schema, "retention_archive_check"))
        .push("((SELECT pg_catalog.count(*) FROM moved), (SELECT pg_catalog.count(*) FROM archived), (SELECT pg_catalog.count(*) FROM moved FULL JOIN archived ON ")
        .append(&moved)
        .push(" = archived.k WHERE ")
        .append(&moved)
        .push(" IS NULL OR archived.k IS NULL)) AS ok)");
    s
}

/// The moved row's key as text: `moved."id"::text`, or a composite
/// key's text, which the mutation returns as `cohort_key`.
fn moved_key(e: &EntityDescriptor, casts: &Casts) -> SqlText {
    if casts.composite() {
        return SqlText::new("moved.cohort_key");
    }
    let mut s = SqlText::new("moved.");
    s.ident(&e.record_id).push("::text");
    s
}

/// What the archive's mutation returns: the columns the copy takes.
/// (and a composite key's text, `cohort_key`).
pub(super) fn archive_returning(e: &EntityDescriptor, casts: &Casts) -> SqlText {
    let archive = e.archive.as_ref().expect("validated: archive has a table");
    let mut s = SqlText::default();
    for (i, c) in archive.columns.iter().enumerate() {
        if i > 0 {
            s.push(", ");
        }
        s.col(c);
    }
    if casts.composite() {
        s.push(", ")
            .append(&casts.key_text(e))
            .push(" AS cohort_key");
    }
    s
}

/// The archive's copy of the rows a `moved` statement returns: stamped
/// with the run's `now` and the run id (`$run_id`), the anonymised
/// columns (with anonymise-on-archive) replaced by their anonymised
/// values, bound after the run id; the `now` comes last of the
/// strategy's values.
pub(super) fn archive_insert(e: &EntityDescriptor, casts: &Casts, own: &Own) -> SqlText {
    let archive = e.archive.as_ref().expect("validated: archive has a table");
    let anonymised: BTreeMap<&str, SqlText> = if archive.anonymise {
        anonymised_values(e, own.literals).into_iter().collect()
    } else {
        BTreeMap::new()
    };
    let mut insert = SqlText::new("INSERT INTO ");
    insert.table(&archive.table);
    if casts.composite() {
        // Its RETURNING reads the copy's key as `t` (see `archive_checked`).
        insert.push(" AS t");
    }
    insert.push(" (");
    for c in &archive.columns {
        insert.ident(c).push(", ");
    }
    insert
        .ident(crate::domain::model::ARCHIVED_AT)
        .push(", ")
        .ident(crate::domain::model::ARCHIVE_RUN_ID)
        // An identity column of the archive keeps the source's value.
        .push(") OVERRIDING SYSTEM VALUE SELECT ");
    for c in &archive.columns {
        match anonymised.get(c.as_str()) {
            Some(value) => {
                insert.append(value);
            }
            None => {
                insert.push("moved.").ident(c);
            }
        }
        insert.push(", ");
    }
    insert
        .param(own.mark.expect("archive marks its copies"))
        .push("::timestamptz, ")
        .param(own.run.expect("archive binds its run"))
        .push(" FROM moved");
    if own.per_row.is_some() {
        // Every moved row is copied, whether or not its computed values
        // came along (a missing object anonymises to NULL, never the original).
        insert
            .push(" LEFT JOIN ")
            .append(&per_row_values(e, casts, own.per_row_join()))
            .push(" ON ")
            .append(&casts.moved_matches_v(e));
    }
    insert
}
