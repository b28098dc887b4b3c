//! What a sweep reports without changing anything: the counts of rows in
//! scope (`counts`, and `counts_after` once a real run has changed its
//! rows) and the backlog's oldest eligible row.

use super::shape::Shape;
use super::slots::{CountSlots, Filter};
use crate::base::ident::SqlText;
use crate::domain::rules::Strategy;
use crate::sql::fragments::{bound_rows, Blocked};

/// Counts in scope: eligible (past cutoff, not held), skipped (still
/// referenced), held (past cutoff, held), held_by_subject (of those,
/// under a subject hold) and null_anchor. `$1` entity id, `$2` cutoff,
/// `$3` tenant (then the stage floor).
pub(super) fn counts(s: &Shape<'_>, done: &SqlText, blocked: &Blocked) -> SqlText {
    let e = s.e;
    let at = CountSlots::of(s.scoped());
    let cutoff = at.cutoff;
    let mut c = SqlText::new("SELECT pg_catalog.count(*) FILTER (WHERE ");
    c.col(&e.anchor)
        .push(" < ")
        .param(cutoff)
        .push(" AND NOT ")
        .append(&s.held)
        .append(&blocked.unblocked)
        .push(") AS eligible, ");
    c.append(&blocked.skipped_column(&e.anchor, cutoff, &s.held))
        .push(", pg_catalog.count(*) FILTER (WHERE ")
        .col(&e.anchor)
        .push(" < ")
        .param(cutoff)
        .push(" AND ")
        .append(&s.held)
        .push(") AS held, ");
    match &s.subject_held {
        Some(subject) => {
            c.push("pg_catalog.count(*) FILTER (WHERE ")
                .col(&e.anchor)
                .push(" < ")
                .param(cutoff)
                .push(" AND ")
                .append(subject)
                .push(") AS held_by_subject, ");
        }
        None => {
            c.push("0::int8 AS held_by_subject, ");
        }
    }
    c.push("pg_catalog.count(*) FILTER (WHERE ")
        .col(&e.anchor)
        .push(" IS NULL) AS null_anchor, 0::int8 AS kept_by_legal_min FROM ")
        .table(&e.table)
        // Every count is of rows past the cutoff or without an
        // anchor: only those are read (the anchor index's range
        // before the cutoff, and its NULLs), never the newer rows.
        .push(" t WHERE (")
        .col(&e.anchor)
        .push(" < ")
        .param(cutoff)
        .push(" OR ")
        .col(&e.anchor)
        .push(" IS NULL)")
        .append(&s.filter(&at.filter))
        .append(done);
    c
}

/// Rows the legal minimum keeps (column `kept_by_legal_min`), in the
/// tenant, not done: anchored at or after the sweep's cutoff (`$2`, moved
/// earlier by the legal minimum) and before the period's own cutoff, bound
/// after the tenant and floor. In a stage measured from a marker: rows
/// past the stage's cutoff whose own anchor is at or after the legal
/// minimum's floor (none when the stage has no floor; the period's cutoff
/// is then bound but only checked for NULL). Held rows count here too: the
/// legal minimum keeps them first, as an erasure counts them.
pub(super) fn kept_by_legal_min(s: &Shape<'_>, done: &SqlText) -> SqlText {
    let e = s.e;
    let at = CountSlots::of(s.scoped());
    let period_cutoff = at.then;
    let mut k = SqlText::new("SELECT pg_catalog.count(*) AS kept_by_legal_min FROM ");
    k.table(&e.table).push(" t WHERE $1::uuid IS NOT NULL AND ");
    match s.stage {
        Some(stage) => {
            let tenant_only = Filter {
                floor: None,
                ..at.filter
            };
            k.col(&e.anchor)
                .push(" < ")
                .param(at.cutoff)
                .push(" AND ")
                .param(period_cutoff)
                .push("::timestamptz IS NOT NULL AND ")
                .col(&stage.floor)
                .push(" >= ")
                .param(at.filter.floor.expect("a stage binds its floor"))
                .append(&s.filter(&tenant_only));
        }
        None => {
            k.col(&e.anchor)
                .push(" >= ")
                .param(at.cutoff)
                .push(" AND ")
                .col(&e.anchor)
                .push(" < ")
                .param(period_cutoff)
                .append(&s.filter(&at.filter));
        }
    }
    k.append(done);
    k
}

/// The backlog: the anchor (column `oldest`) of the oldest row still
/// eligible (past the cutoff, in the tenant, not done, not held), or no
/// row. Rows a foreign key still blocks count: they are behind all the
/// same. One `ORDER BY anchor LIMIT 1` read of the `(tenant, anchor)` /
/// anchor index. Binds as [`counts`].
pub(super) fn backlog(s: &Shape<'_>, done: &SqlText) -> SqlText {
    let e = s.e;
    let at = CountSlots::of(s.scoped());
    let mut b = SqlText::new("SELECT ");
    b.col(&e.anchor)
        .push(" AS oldest FROM ")
        .table(&e.table)
        .push(" t WHERE ")
        .col(&e.anchor)
        .push(" < ")
        .param(at.cutoff)
        .append(&s.filter(&at.filter))
        .append(done)
        .push(" AND NOT ")
        .append(&s.held)
        .push(" ORDER BY ")
        .col(&e.anchor)
        .push(" LIMIT 1");
    b
}

/// What [`counts`] returns after a real run, without reading the rows
/// past the cutoff (after a purge, their dead index entries; after an
/// anonymisation or soft delete, every row already done): held rows are
/// found through the entity's active holds, bound after the tenant and
/// floor as a [`BoundHolds`](crate::sql::BoundHolds) (the record holds'
/// keys, then one array per subject column); NULL anchors through the
/// anchor index; `eligible` is 0 (only dry runs need it).
pub(super) fn counts_after(s: &Shape<'_>, strategy: Strategy, done: &SqlText) -> SqlText {
    let e = s.e;
    let table = &e.table;
    let mut at = CountSlots::of(s.scoped());
    let keys = at.then;
    let first_subject = at.rest.many(e.subjects.len());
    let mut before_cutoff = SqlText::new(" < ");
    before_cutoff.param(at.cutoff);
    let tenant_and_floor = s.filter(&at.filter);
    let mut a = SqlText::new("SELECT 0::int8 AS eligible, (SELECT pg_catalog.count(*) FROM ");
    a.table(table)
        .push(" t WHERE ")
        .append(&bound_rows(e, s.casts, keys))
        .push(" AND ")
        .col(&e.anchor)
        .append(&before_cutoff)
        .append(&tenant_and_floor)
        .append(done)
        .push(" AND ")
        .append(&s.held)
        .push(") AS held, (SELECT pg_catalog.count(*) FROM ")
        .table(table)
        .push(" t WHERE ")
        .col(&e.anchor)
        .push(" IS NULL")
        .append(&tenant_and_floor)
        .append(done)
        .push(") AS null_anchor, ");
    match (strategy.deletes(), &s.referenced) {
        (true, Some(r)) => {
            a.push("(SELECT pg_catalog.count(*) FROM ")
                .table(table)
                .push(" t WHERE ")
                .col(&e.anchor)
                .append(&before_cutoff)
                .append(&tenant_and_floor)
                .push(" AND NOT ")
                .append(&s.held)
                .push(" AND ")
                .append(r)
                .push(")");
        }
        _ => {
            a.push("0::int8");
        }
    }
    a.push(" AS skipped, ");
    match &s.subject_held {
        Some(subject) => {
            // Rows a subject hold names, through the subject arrays.
            let mut arms = SqlText::new("(");
            for i in 0..e.subjects.len() {
                if i > 0 {
                    arms.push(" OR ");
                }
                arms.append(&s.casts.any(&e.subjects[i].column, first_subject + i));
            }
            arms.push(")");
            a.push("(SELECT pg_catalog.count(*) FROM ")
                .table(table)
                .push(" t WHERE ")
                .append(&arms)
                .push(" AND ")
                .col(&e.anchor)
                .append(&before_cutoff)
                .append(&tenant_and_floor)
                .append(done)
                .push(" AND ")
                .append(subject)
                .push(")");
        }
        None => {
            a.push("0::int8");
        }
    }
    a.push(" AS held_by_subject, 0::int8 AS kept_by_legal_min");
    a
}
