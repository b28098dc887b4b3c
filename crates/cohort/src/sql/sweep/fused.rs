//! One statement per sweep batch: lock the candidates, re-check the holds
//! their snapshot could not see, change the rows (and write their row
//! details), all in one round trip.
//!
//! A sweep batch used to be two statements so that the mutation, in a new
//! snapshot, saw holds committed while the candidates were being locked.
//! The fused statement keeps that guarantee another way, relying on
//! exactly these:
//!
//! - Every hold row records the transaction that last wrote it
//!   (`written_xid`), stamped by the trigger `retention_hold_stamp`,
//!   which fires `ALWAYS` (schema 13: also for replica-role writers).
//!   Startup refuses a database where it is missing or does not fire
//!   always (`validate::checks::check_hold_stamp_trigger`).
//! - After every candidate is locked (its row count is the argument that
//!   makes it wait for them), the `VOLATILE` function
//!   `retention_hold_recent` takes the hold gate shared, then looks, in a
//!   snapshot of its own, for holds on the entity's records or on any
//!   subject whose stamp the statement's snapshot could not see
//!   (`pg_visible_in_snapshot`): one range of an index, usually empty.
//!   It trusts the stamps only while the trigger is enabled `ALWAYS` and
//!   its catalog row was not written since the statement's snapshot;
//!   otherwise it answers as if such a hold existed.
//! - When it finds one, the statement changes nothing and returns every
//!   locked row, and the batch changes them with the two-statement path's
//!   mutation, whose new snapshot sees every committed hold.
//! - A hold committed after the function looked cannot name a locked
//!   row: the library's hold creation locks its row (a record hold) and
//!   takes the hold gate exclusive (a subject hold) before inserting, and
//!   both wait for the batch to commit. A hold inserted by other SQL that
//!   does neither is not waited for (docs/holds.md says so).
//!
//! The statement also returns every locked row when it changed fewer rows
//! than it locked (a row updated after the snapshot was taken is locked
//! in its newest version, which the snapshot cannot see, so the mutation
//! passes over it): the batch then runs the same mutation on all of them,
//! and it changes the ones still due. Otherwise it returns one row, the
//! last locked, for the cursor.
//!
//! Only plain tables (rows found by address), batches that read no row
//! into the process (no row handlers, no values computed in Rust) and
//! deletions of rows nothing references through a restricting foreign key
//! are fused; the rest keep the two statements.

use super::lock::keyset_bound;
use super::slots::{Audit, FusedSlots};
use crate::base::ident::{QualifiedName, SqlText};
use crate::domain::model::EntityDescriptor;
use crate::sql::fragments::Casts;

/// The rows of a fused statement's mutation: the locked rows, by address,
/// unless a hold was written since the snapshot (then none).
pub(super) const LOCKED_UNLESS_RECENT: &str =
    "t.ctid = ANY(ARRAY(SELECT c.addr FROM c)) AND NOT (SELECT r.recent FROM r)";

/// A fused statement in each of the four ways a batch is bounded, as the
/// lock statements are, bound as [`FusedSlots`]: `$1` entity id, the
/// cutoff, the limit, the tenant and the stage floor as `lock` binds them,
/// then the strategy's own values (archive's run id, anonymise's
/// literals, the marker's value), then (audited forms) the run id, the
/// entity's display name, the tenant as text and the action, then the
/// cursor and the range's end.
///
/// Returns `k, a, addr, locked, changed` (and `ids`, the changed records
/// as text, on the last row of an audited form): the last locked row
/// alone when it changed every locked row, every locked row otherwise,
/// in (anchor, key) order; nothing when there was no candidate.
#[derive(Debug, Clone)]
pub(crate) struct FusedForms {
    /// The first batch.
    pub(crate) plain: SqlText,
    /// After a cursor.
    pub(crate) after: SqlText,
    /// Up to a key range's end.
    pub(crate) until: SqlText,
    /// After a cursor, up to a key range's end.
    pub(crate) after_until: SqlText,
}

impl FusedForms {
    /// The form for a batch with or without a cursor and a range's end.
    pub(crate) fn pick(&self, after: bool, until: bool) -> &SqlText {
        match (after, until) {
            (false, false) => &self.plain,
            (true, false) => &self.after,
            (false, true) => &self.until,
            (true, true) => &self.after_until,
        }
    }
}

/// One strategy's fused statements.
#[derive(Debug, Clone)]
pub(crate) struct Fused {
    /// Only the count (no per-row audit).
    pub(crate) count: FusedForms,
    /// Writing a row detail per changed row.
    pub(crate) audited: FusedForms,
}

/// What one strategy's fused statements are made of.
pub(super) struct Parts<'a> {
    pub(super) e: &'a EntityDescriptor,
    pub(super) casts: &'a Casts,
    pub(super) cohort_schema: &'a str,
    /// The candidates' conditions, as the lock statements have them.
    pub(super) candidates: &'a SqlText,
    /// The hold check of the candidates.
    pub(super) held: &'a SqlText,
    /// Where the counted and the audited forms bind their values.
    pub(super) slots: (FusedSlots, FusedSlots),
    /// The mutation of the rows [`LOCKED_UNLESS_RECENT`] matches, with its
    /// re-checks (without the hold check: its snapshot is the candidates').
    pub(super) mutation: SqlText,
    /// What the mutation returns (the key, or the archive's columns).
    pub(super) returning: SqlText,
    /// What the count-only forms return instead, when `returning` is
    /// costly and unread there (a composite key's text).
    pub(super) count_returning: Option<SqlText>,
    /// Archive: the copy, `INSERT … SELECT … FROM moved`.
    pub(super) archive_insert: Option<SqlText>,
}

/// Builds a strategy's fused statements.
pub(super) fn build(p: &Parts<'_>) -> Fused {
    Fused {
        count: forms(p, &p.slots.0),
        audited: forms(p, &p.slots.1),
    }
}

fn forms(p: &Parts<'_>, at: &FusedSlots) -> FusedForms {
    let [plain, after, until, after_until] = at
        .lock
        .bounds
        .forms()
        .map(|bounds| statement(p, at, bounds));
    FusedForms {
        plain,
        after,
        until,
        after_until,
    }
}

fn statement(
    p: &Parts<'_>,
    at: &FusedSlots,
    (after, until): (Option<usize>, Option<usize>),
) -> SqlText {
    let e = p.e;
    let audit = at.audit;
    let mut s = SqlText::new("WITH c AS (SELECT ");
    if p.casts.composite() {
        // The parts as they are: the key's text is built for the rows
        // returned only (see `last_or_all`).
        for (i, part) in p.casts.key.iter().enumerate() {
            s.col(&part.column).push(" AS k").number(i).push(", ");
        }
    } else {
        p.casts.key_select(&mut s, e);
        s.push(" AS k, ");
    }
    s.append(&p.casts.key_value(e))
        .push(" AS o, ")
        .col(&e.anchor)
        .push(" AS a, t.ctid AS addr FROM ")
        .table(&e.table)
        .push(" t WHERE ")
        .append(p.candidates);
    if let Some(n) = after {
        keyset_bound(e, p.casts, &mut s, ">", " >= ", n);
    }
    if let Some(n) = until {
        keyset_bound(e, p.casts, &mut s, "<=", " <= ", n);
    }
    s.push(" AND NOT ")
        .append(p.held)
        .push(" ORDER BY ")
        .col(&e.anchor)
        .push(", ")
        .append(&p.casts.order_columns(e))
        .push(" LIMIT ")
        .param(at.lock.limit)
        .push(" FOR UPDATE SKIP LOCKED), n AS (SELECT pg_catalog.count(*) AS locked FROM c), r AS (SELECT ")
        .table(&QualifiedName::new(p.cohort_schema, "retention_hold_recent"))
        // The statement's own snapshot is read here; the function's
        // queries run in new ones.
        .push("($1, pg_catalog.pg_current_snapshot(), (SELECT n.locked FROM n)) AS recent), moved AS (")
        .append(&p.mutation)
        .push(" RETURNING ")
        .append(match (&p.count_returning, audit) {
            // Counted only: a composite key's text is not built per row.
            (Some(cheap), None) => cheap,
            _ => &p.returning,
        })
        .push(")");
    if let Some(insert) = &p.archive_insert {
        s.push(", ").append(&super::archive::archive_checked(
            e,
            p.casts,
            insert,
            p.cohort_schema,
        ));
    }
    if let Some(a) = &audit {
        s.append(&details(p, a));
    }
    s.append(&last_or_all(p, audit.is_some()));
    s
}

/// `, d AS (INSERT …)`: one row detail per changed row, the run id, the
/// entity's name, the tenant and the action bound where `a` says.
fn details(p: &Parts<'_>, a: &Audit) -> SqlText {
    let mut s = SqlText::default();
    s.push(", d AS (INSERT INTO ")
        .table(&crate::sql::tables::CohortTable::RowDetail.qualified(p.cohort_schema))
        .push(" (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) SELECT ")
        .param(a.run)
        .push(", $1, ")
        .param(a.entity)
        .append(&moved_key(p))
        .push(", ")
        .param(a.tenant)
        .push(", ")
        .param(a.action)
        .push(" FROM moved RETURNING record_id)");
    s
}

/// `, moved."id"::text`: the changed row's key as text, from what the
/// mutation returns (a composite key returns its text as `cohort_key`).
fn moved_key(p: &Parts<'_>) -> SqlText {
    let mut s = SqlText::new(", moved.");
    if p.casts.composite() {
        s.push("cohort_key");
    } else {
        s.ident(&p.e.record_id).push("::text");
    }
    s
}

/// The statement's final select: the last locked row alone, or every
/// locked row when fewer were changed, with the counts (and, `audited`,
/// the changed ids on the last row).
fn last_or_all(p: &Parts<'_>, audited: bool) -> SqlText {
    let mut s = SqlText::default();
    // The last locked row (a top-1 read of the locked rows, not a sort of
    // them all) alone, or every locked row when fewer were changed: each
    // branch gated by a one-time filter, so a complete batch does not read
    // its locked rows again.
    let casts = p.casts;
    s.push(", l AS (SELECT ")
        .append(&casts.carried_key("c"))
        .push(", c.a, c.o, c.addr FROM c ORDER BY c.a DESC, c.o DESC LIMIT 1), m AS (SELECT pg_catalog.count(*) AS changed FROM moved) SELECT ");
    if casts.composite() {
        let parts = (0..casts.key.len()).map(|i| {
            let mut c = SqlText::new("x.k");
            c.number(i);
            c
        });
        s.append(&casts.composite_text(parts)).push(" AS k");
    } else {
        s.push("x.k");
    }
    s.push(", x.a, x.addr::text AS addr, n.locked, m.changed");
    if audited {
        s.push(", CASE WHEN x.a = l.a AND x.o = l.o THEN (SELECT pg_catalog.array_agg(d.record_id) FROM d) END AS ids");
    }
    // An archive's verdict is read, so a batch whose copy differs from
    // what it deleted fails whole.
    s.push(if p.archive_insert.is_some() {
        " FROM n, m, l, verdict"
    } else {
        " FROM n, m, l"
    });
    s.push(", LATERAL (SELECT ")
        .append(&casts.carried_key("c"))
        .push(", c.a, c.o, c.addr FROM c WHERE n.locked > m.changed UNION ALL SELECT ")
        .append(&casts.carried_key("l"))
        .push(", l.a, l.o, l.addr WHERE n.locked <= m.changed) x ORDER BY x.a, x.o");
    s
}
