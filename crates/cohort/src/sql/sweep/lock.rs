//! How a sweep chooses its rows: the candidates' conditions, the lock
//! statements that take a batch of them (from the start, after a cursor,
//! within a key range), and the key ranges of a parallel sweep.

use super::shape::Shape;
use super::slots::LockSlots;
use crate::base::ident::SqlText;
use crate::domain::model::EntityDescriptor;
use crate::sql::fragments::{Blocked, Casts};

/// The candidates' conditions, shared by the lock statements and the key
/// ranges: past the cutoff, in the tenant, above the stage's floor (each
/// where `at` binds it), not done, not blocked by a reference.
pub(super) fn candidates(
    s: &Shape<'_>,
    at: &LockSlots,
    done: &SqlText,
    blocked: &Blocked,
) -> SqlText {
    let mut c = SqlText::default();
    c.col(&s.e.anchor)
        .push(" < ")
        .param(at.cutoff)
        .append(&s.filter(&at.filter))
        .append(done)
        .append(&blocked.unblocked);
    c
}

/// Locks candidates in (anchor, key) order, so a run can continue each
/// batch after the last one's final row instead of walking again past
/// every row it already did. Binds as [`LockSlots`]: `$1` entity id, the
/// candidates' values, the limit at `limit`; `after`: the cursor's
/// (anchor, key) from that position; `until`: the range's last (anchor,
/// key) from that position.
/// Returns the record key, the anchor and, `by_address`, the row's `ctid`
/// as text.
pub(super) fn lock(
    s: &Shape<'_>,
    candidates: &SqlText,
    by_address: bool,
    limit: usize,
    (after, until): (Option<usize>, Option<usize>),
) -> SqlText {
    let e = s.e;
    let mut l = SqlText::new("SELECT ");
    s.casts.key_select(&mut l, e);
    l.push(", ").col(&e.anchor);
    if by_address {
        l.push(", t.ctid::text");
    }
    l.push(" FROM ")
        .table(&e.table)
        .push(" t WHERE ")
        .append(candidates);
    if let Some(n) = after {
        // The row comparison breaks anchor ties by key.
        keyset_bound(e, s.casts, &mut l, ">", " >= ", n);
    }
    if let Some(n) = until {
        keyset_bound(e, s.casts, &mut l, "<=", " <= ", n);
    }
    l.push(" AND NOT ")
        .append(&s.held)
        .push(" ORDER BY ")
        .col(&e.anchor)
        .push(", ")
        .append(&s.casts.order_columns(e))
        .push(" LIMIT ")
        .param(limit)
        .push(" FOR UPDATE SKIP LOCKED");
    l
}

/// The key ranges of a parallel sweep: of the candidates `lock` would
/// choose (unlocked, in (anchor, key) order), split into as many tiles of
/// equal size, the (key, anchor) of each tile's last row but the last
/// tile's, in order. Binds as `lock`, the number of ranges in place of
/// the limit.
pub(super) fn ranges(s: &Shape<'_>, at: &LockSlots, candidates: &SqlText) -> SqlText {
    let e = s.e;
    let mut r = SqlText::new("SELECT s.k, s.a FROM (SELECT r.k, r.a, r.n, r.tile, pg_catalog.lead(r.tile) OVER (ORDER BY r.n) AS next FROM (SELECT ");
    s.casts.key_select(&mut r, e);
    r.push(" AS k, ")
        .col(&e.anchor)
        .push(" AS a, pg_catalog.row_number() OVER w AS n, pg_catalog.ntile(")
        .param(at.limit)
        .push("::int4) OVER w AS tile FROM ")
        .table(&e.table)
        .push(" t WHERE ")
        .append(candidates)
        .push(" AND NOT ")
        .append(&s.held)
        .push(" WINDOW w AS (ORDER BY ")
        .col(&e.anchor)
        .push(", ")
        .append(&s.casts.order_columns(e))
        .push(")) r) s WHERE s.next <> s.tile ORDER BY s.n");
    r
}

/// ` AND anchor <loose> $n AND (anchor, key) <op> ($n, $n+1)`: a keyset
/// bound of the lock statements; the anchor alone first lets the anchor
/// index start (or stop) there, the row comparison breaks anchor ties by key.
pub(super) fn keyset_bound(
    e: &EntityDescriptor,
    casts: &Casts,
    l: &mut SqlText,
    op: &'static str,
    loose: &'static str,
    n: usize,
) {
    l.push(" AND ").col(&e.anchor).push(loose).param(n);
    l.push(" AND (")
        .col(&e.anchor)
        .push(", ")
        .append(&casts.order_columns(e));
    l.push(") ").push(op).push(" (").param(n).push(", ");
    l.append(&casts.order_params(e, n + 1));
    l.push(")");
}
