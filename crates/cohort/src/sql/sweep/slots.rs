//! Where each family of a sweep's statements binds its values.
//!
//! A family's parameters are numbered here, once, in the order they are
//! declared (`$1` first, by [`Numbering`]), and the builders beside this
//! file write the positions they are handed: none computes one. The
//! binders in [`super::params`] bind in the order declared here; the
//! placeholder tests in `sql/snapshots_test.rs` hold the two equal for
//! every strategy, tenant and stage shape.
//!
//! | family | order |
//! |---|---|
//! | counts, backlog, legal minimum, counts after | entity, cutoff, [`Filter`], then the form's own |
//! | lock, ranges | entity, cutoff, limit, [`Filter`], cursor, range's end |
//! | mutation | entity, rows, [`Own`], cutoff, [`Filter`], [`Audit`] |
//! | fused batch | entity, cutoff, limit, [`Filter`], [`Own`], [`Audit`], cursor, range's end |

use super::values::{marks, Values};
use crate::domain::rules::Strategy;
use crate::sql::statement::Numbering;

/// What a statement's scope binds besides its cutoff: a tenant (a
/// tenanted entity) and a floor (a stage measured from a marker).
#[derive(Debug, Clone, Copy)]
pub(super) struct Scoped {
    pub(super) tenant: bool,
    pub(super) floor: bool,
}

/// The scope's filter: the tenant (a tenanted entity), then the legal
/// minimum's floor (a stage measured from a marker).
#[derive(Debug, Clone, Copy)]
pub(super) struct Filter {
    pub(super) tenant: Option<usize>,
    pub(super) floor: Option<usize>,
}

impl Filter {
    fn numbered(s: Scoped, n: &mut Numbering) -> Self {
        Filter {
            tenant: n.next_if(s.tenant),
            floor: n.next_if(s.floor),
        }
    }
}

/// The counts' family: entity, cutoff, filter, then what one form adds
/// (the period's own cutoff; the bound holds' keys, then their subjects).
#[derive(Debug, Clone, Copy)]
pub(super) struct CountSlots {
    pub(super) cutoff: usize,
    pub(super) filter: Filter,
    /// The first value after the filter.
    pub(super) then: usize,
    /// The numbering after `then` (the bound holds' subjects).
    pub(super) rest: Numbering,
}

impl CountSlots {
    pub(super) fn of(s: Scoped) -> Self {
        let mut n = Numbering::default();
        n.next(); // the entity
        let cutoff = n.next();
        let filter = Filter::numbered(s, &mut n);
        let then = n.next();
        CountSlots {
            cutoff,
            filter,
            then,
            rest: n,
        }
    }
}

/// A strategy's own values, wherever its statement puts them: archive's
/// run id, the literals and per-run values, the JSON array of values
/// computed in Rust per row, and the run's `now` for the marker, last.
#[derive(Debug, Clone, Copy)]
pub(super) struct Own {
    /// Archive's run id.
    pub(super) run: Option<usize>,
    /// The first literal (the next position when there are none).
    pub(super) literals: usize,
    /// The values computed in Rust per row (a JSON array aligned with
    /// the keys).
    pub(super) per_row: Option<usize>,
    /// The keys those values are joined by (`None` where the rows are
    /// not bound: the fused batch, which never computes values in Rust).
    pub(super) keys: Option<usize>,
    /// The marker's value.
    pub(super) mark: Option<usize>,
}

impl Own {
    /// Where the values computed in Rust per row bind, and the keys they
    /// are joined by: (keys, values).
    pub(super) fn per_row_join(&self) -> (usize, usize) {
        (
            self.keys
                .expect("values computed per row are joined by key"),
            self.per_row
                .expect("a strategy computing values per row binds them"),
        )
    }

    fn numbered(plan: &Values, strategy: Strategy, keys: Option<usize>, n: &mut Numbering) -> Self {
        let anonymises = strategy == Strategy::Anonymise
            || (strategy == Strategy::Archive && plan.archive_anonymises);
        let run = n.next_if(strategy == Strategy::Archive);
        let literals = n.many(if anonymises { plan.literals.len() } else { 0 });
        Own {
            run,
            literals,
            per_row: n.next_if(anonymises && !plan.custom.is_empty()),
            keys,
            mark: n.next_if(marks(strategy)),
        }
    }
}

/// The four values of the row details an audited form writes: the run,
/// the entity's display name, the tenant as text and the action.
#[derive(Debug, Clone, Copy)]
pub(super) struct Audit {
    pub(super) run: usize,
    pub(super) entity: usize,
    pub(super) tenant: usize,
    pub(super) action: usize,
}

impl Audit {
    fn numbered(n: &mut Numbering) -> Self {
        Audit {
            run: n.next(),
            entity: n.next(),
            tenant: n.next(),
            action: n.next(),
        }
    }
}

/// A mutation of locked rows: entity, rows (`$2`: keys or addresses), the
/// strategy's own values, then the re-checked cutoff and filter; an
/// audited form then binds its row details' values.
#[derive(Debug, Clone, Copy)]
pub(super) struct MutationSlots {
    pub(super) rows: usize,
    pub(super) own: Own,
    pub(super) cutoff: usize,
    pub(super) filter: Filter,
    pub(super) audit: Audit,
}

impl MutationSlots {
    pub(super) fn of(s: Scoped, plan: &Values, strategy: Strategy) -> Self {
        let (rows, own, mut n) = head(plan, strategy);
        let cutoff = n.next();
        let filter = Filter::numbered(s, &mut n);
        MutationSlots {
            rows,
            own,
            cutoff,
            filter,
            audit: Audit::numbered(&mut n),
        }
    }
}

/// A mutation's head (entity, rows, own values) and the numbering after
/// it, where an erasure adds its own re-checks.
fn head(plan: &Values, strategy: Strategy) -> (usize, Own, Numbering) {
    let mut n = Numbering::default();
    n.next(); // the entity
    let rows = n.next();
    let own = Own::numbered(plan, strategy, Some(rows), &mut n);
    (rows, own, n)
}

/// The numbering after `mutate_head`'s values (entity, rows, the
/// strategy's own), for the re-checks an erasure appends.
pub(crate) fn after_head(plan: &Values, strategy: Strategy) -> Numbering {
    head(plan, strategy).2
}

/// The lock statements (and a parallel sweep's ranges, which bind the
/// number of ranges as the limit): entity, cutoff, limit, filter; then,
/// continuing, the cursor's (anchor, key), and within a key range its last
/// (anchor, key) after the cursor, or in the cursor's place without one.
#[derive(Debug, Clone, Copy)]
pub(super) struct LockSlots {
    pub(super) cutoff: usize,
    pub(super) limit: usize,
    pub(super) filter: Filter,
    pub(super) bounds: Bounds,
}

/// Where a batch's keyset bounds bind, after every other value: each is
/// an (anchor, key) pair.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bounds {
    /// The cursor (alone, or first).
    pub(super) cursor: usize,
    /// The range's end after the cursor.
    pub(super) until_after_cursor: usize,
}

impl Bounds {
    fn numbered(n: &mut Numbering) -> Self {
        Bounds {
            cursor: n.many(2),
            until_after_cursor: n.many(2),
        }
    }

    /// The (after, until) positions of the four forms: plain, after a
    /// cursor, within a range, and both.
    pub(super) fn forms(&self) -> [(Option<usize>, Option<usize>); 4] {
        [
            (None, None),
            (Some(self.cursor), None),
            (None, Some(self.cursor)),
            (Some(self.cursor), Some(self.until_after_cursor)),
        ]
    }
}

impl LockSlots {
    pub(super) fn of(s: Scoped) -> Self {
        let mut n = Numbering::default();
        n.next(); // the entity
        let cutoff = n.next();
        let limit = n.next();
        let filter = Filter::numbered(s, &mut n);
        LockSlots {
            cutoff,
            limit,
            filter,
            bounds: Bounds::numbered(&mut n),
        }
    }
}

/// The fused batch: the lock's values, the strategy's own, an audited
/// form's row-detail values, then the bounds.
#[derive(Debug, Clone, Copy)]
pub(super) struct FusedSlots {
    pub(super) lock: LockSlots,
    pub(super) own: Own,
    /// The audited form's (`None`: the counted form).
    pub(super) audit: Option<Audit>,
}

impl FusedSlots {
    pub(super) fn of(s: Scoped, plan: &Values, strategy: Strategy, audited: bool) -> Self {
        let mut n = Numbering::default();
        n.next(); // the entity
        let cutoff = n.next();
        let limit = n.next();
        let filter = Filter::numbered(s, &mut n);
        let own = Own::numbered(plan, strategy, None, &mut n);
        let audit = audited.then(|| Audit::numbered(&mut n));
        FusedSlots {
            lock: LockSlots {
                cutoff,
                limit,
                filter,
                bounds: Bounds::numbered(&mut n),
            },
            own,
            audit,
        }
    }
}
