//! The statements of one entity, built once when the model is validated:
//! per strategy its [`SweepStatements`], and the entity's statements by
//! key ([`Targets`]).
//!
//! A sweep batch is, where it can be, one statement ([`fused`]): lock
//! the candidates (past the cutoff, in the tenant, not held, oldest
//! first, `FOR UPDATE SKIP LOCKED`, at most the batch size), re-check the
//! holds their snapshot could not see, change the rows and write their
//! row details. Otherwise (values computed in Rust, row handlers, a
//! partitioned table, a purge of a table others still reference) it is
//! two: `lock`, then a mutation in a new statement, so a new snapshot,
//! which re-checks holds committed while the candidates were being
//! locked. Row locks live in the tuples, not in the shared lock table,
//! so a 5000-row batch needs no more lock-table slots than a one-row one.
//!
//! The files follow the statements: [`counts`] (what a sweep reports),
//! [`lock`] (which rows a batch takes), [`mutate`] (how it changes them),
//! [`archive`] (archive's move), [`fused`] (the one-statement batch),
//! [`targets`] (rows named by key), built from a [`shape::Shape`] and the
//! entity's mutation [`values`]. What the statements bind and return is
//! typed in [`params`]: the text numbers its parameters here, and only
//! `params` binds them and reads the rows that come back.

mod archive;
mod counts;
pub(crate) mod fused;
mod lock;
mod mutate;
mod params;
mod rows;
mod shape;
mod slots;
mod targets;
mod values;

use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) use fused::Fused;
pub(crate) use params::{Audit, Batch, Change, Changed, Cursor, Rows, RunParam, Scope};
#[cfg(feature = "sea-orm")]
pub(crate) use rows::sea;
pub(crate) use rows::{CountsRow, LockedRow, RecordRow};
pub(crate) use shape::StageScope;
pub(crate) use slots::after_head;
pub(crate) use targets::{lock_subject_rows, Targets};
pub(crate) use values::{marks, RunValue, Values};

use super::fragments::{blocked, hold_exists, referenced, subject_hold, Casts, HoldKeys};
use crate::base::ident::SqlText;
use crate::domain::model::{CustomAnonymiser, EntityDescriptor};
use crate::domain::rules::{CategoryCapabilities, Strategy};
use crate::sql::IncomingKey;
use shape::Shape;
use slots::LockSlots;

/// The statements of one entity.
#[derive(Debug, Clone)]
pub(crate) struct EntityPlan {
    /// The statements of each strategy the category may return (and
    /// purge's for an archiving entity: an erasure deletes, it never
    /// copies a person's rows into the archive).
    pub(crate) strategies: BTreeMap<Strategy, Arc<SweepStatements>>,
    /// The statements that name rows by key.
    pub(crate) targets: Targets,
    /// `EXISTS (…)` for rows another row still references through a NO
    /// ACTION / RESTRICT foreign key (`None`: nothing references the table).
    pub(crate) referenced: Option<SqlText>,
    /// The hold check of every statement: `EXISTS` over the active holds
    /// on the row's record or on a subject it holds (`$1` entity id).
    pub(crate) held: SqlText,
    /// The subject half of `held` (`None`: no subject columns).
    pub(crate) subject_held: Option<SqlText>,
    /// What the mutations bind after their rows.
    pub(crate) values: Values,
}

/// One strategy's statements. Every one takes the entity id as `$1`.
/// For a strategy that changes nothing (exempt) only `counts` is set.
#[derive(Debug, Clone, Default)]
pub(crate) struct SweepStatements {
    /// Counts in scope: eligible (past cutoff, not held), skipped, held
    /// (past cutoff, held), held_by_subject (of those, under a subject
    /// hold) and null_anchor. `$1` entity id, `$2` cutoff, `$3` tenant.
    pub(crate) counts: SqlText,
    /// What `counts` returns after a real run, without reading the rows
    /// past the cutoff: held rows through the entity's active holds,
    /// bound after the tenant (`$3`, or `$4` with a tenant) as a
    /// [`BoundHolds`](super::BoundHolds); `eligible` is 0.
    pub(crate) counts_after: Option<SqlText>,
    /// The anchor (column `oldest`) of the oldest row still eligible, or
    /// no row; binds as `counts`.
    pub(crate) backlog: Option<SqlText>,
    /// The rows a legal minimum keeps past the period (column
    /// `kept_by_legal_min`); binds as `counts`, then the period's own
    /// cutoff.
    pub(crate) kept_by_legal_min: Option<SqlText>,
    /// Lock candidates. `$1` entity id, `$2` cutoff, `$3` limit, `$4`
    /// tenant. Returns the record key and the anchor, in (anchor, key)
    /// order, and on a plain table the row's address third.
    pub(crate) lock: SqlText,
    /// `lock` continuing after a cursor: candidates whose (anchor, key) is
    /// past the previous batch's last row. Then the cursor's anchor and key
    /// (`$5`, `$6`; `$4`, `$5` for a tenantless entity).
    pub(crate) lock_after: Option<SqlText>,
    /// `lock` within one key range of a parallel sweep: candidates whose
    /// (anchor, key) is at most the range's last row, bound where
    /// `lock_after` binds its cursor.
    pub(crate) lock_until: Option<SqlText>,
    /// `lock_after` within one key range: the cursor, then the range's
    /// last (anchor, key).
    pub(crate) lock_after_until: Option<SqlText>,
    /// The key ranges of a parallel sweep: of the candidates `lock` would
    /// choose (unlocked, in (anchor, key) order), split into `$3` tiles of
    /// equal size, the (key, anchor) of each tile's last row but the last
    /// tile's, in order. Binds as `lock`, the number of ranges in place of
    /// the limit. Read once per entity, without locking anything: the
    /// ranges only divide the key space, so every row lies in exactly one
    /// of them whatever changes after the read.
    pub(crate) ranges: Option<SqlText>,
    /// Mutate locked rows that are still not held, not done, past the
    /// cutoff and in the tenant. `$1` entity id, `$2` record keys (array;
    /// addresses when `by_address`), then the strategy's own values
    /// (numbered by `slots::MutationSlots`); then the cutoff and the tenant.
    /// Returns `record::text`.
    pub(crate) mutate: SqlText,
    /// `mutate` without RETURNING: for batches that need only the count
    /// (no per-row audit, no handlers), so no key travels back.
    pub(crate) mutate_count: Option<SqlText>,
    /// `mutate` writing one row detail per changed row in the same
    /// statement (per-row audit, handlers), so the changed keys do not
    /// travel to the client and back. Binds `mutate`'s parameters, then the
    /// run id, the entity's display name, the tenant as text and the
    /// action. Returns `row_detail_id, record_id`.
    pub(crate) mutate_audited: Option<SqlText>,
    /// `mutate` by key, without its cutoff, tenant and RETURNING, for
    /// erasure to add its own re-checks (parameters after the strategy's
    /// values).
    pub(crate) mutate_head: Option<SqlText>,
    /// Whether the sweep finds its locked rows by address: on a plain
    /// table (not partitioned, where an address names one row of the
    /// table), the lock statements return each row's `ctid` as text
    /// third, and for strategies not computing values in Rust (which join
    /// their values by key) `mutate`, `mutate_count` and `mutate_audited`
    /// take the rows at those addresses, bound as `$2` in place of the
    /// keys: a TID scan reads each row where it lies instead of probing
    /// the key index for every key.
    ///
    /// Sound because the batch's transaction holds every locked row's
    /// `FOR UPDATE` lock: a locked row version can be neither updated nor
    /// deleted by anyone else, so it stays live at its address until the
    /// commit, and no other row can take that address. (A row updated
    /// between the candidate query's snapshot and its lock is locked, and
    /// returned, in its newest version.) The mutation still re-checks
    /// every condition (holds in its new snapshot, cutoff, tenant, not
    /// done), and the batch loop checks that every key it changed was
    /// locked.
    pub(crate) by_address: bool,
    /// The batch as one statement, where it can be (see [`fused`]).
    pub(crate) fused: Option<Fused>,
}

impl EntityPlan {
    /// The statements of `strategy` (`None`: the category never returns it).
    pub(crate) fn statements(&self, strategy: Strategy) -> Option<&Arc<SweepStatements>> {
        self.strategies.get(&strategy)
    }

    /// Builds every statement for the strategies the category may return
    /// (for a stage measured from a marker, `stage` narrows them; the
    /// descriptor is then anchored on the marker).
    #[allow(clippy::too_many_arguments)] // each is one independent input of the plan
    pub(crate) fn build(
        e: &EntityDescriptor,
        capabilities: &CategoryCapabilities,
        blockers: &[IncomingKey],
        casts: &Casts,
        keys: HoldKeys<'_>,
        hasher: Option<&CustomAnonymiser>,
        cohort_schema: &str,
        stage: Option<&StageScope>,
        plain_table: bool,
    ) -> Self {
        let shape = Shape {
            e,
            casts,
            cohort_schema,
            held: hold_exists(e, casts, keys, cohort_schema),
            subject_held: subject_hold(e, keys, cohort_schema, active_hold!("h.")),
            referenced: referenced(blockers),
            stage,
        };
        let values = Values::of(e, hasher);
        // An erasure on an archiving entity deletes (it never copies a
        // person's rows into the archive), so archive brings purge's statements.
        let mut strategies: Vec<Strategy> = capabilities.iter().collect();
        if capabilities.allows(Strategy::Archive) && !capabilities.allows(Strategy::Purge) {
            strategies.push(Strategy::Purge);
        }
        let strategies = strategies
            .into_iter()
            .map(|s| {
                let statements = sweep_statements(&shape, &values, s, plain_table);
                (s, Arc::new(statements))
            })
            .collect();
        EntityPlan {
            strategies,
            targets: Targets::build(e, casts, keys, &shape.held, cohort_schema),
            referenced: shape.referenced,
            held: shape.held,
            subject_held: shape.subject_held,
            values,
        }
    }
}

/// One strategy's statements (see [`SweepStatements`]).
fn sweep_statements(
    s: &Shape<'_>,
    values: &Values,
    strategy: Strategy,
    plain_table: bool,
) -> SweepStatements {
    let done = s.not_done(strategy);
    let blocked = blocked(strategy, s.referenced.as_ref());
    let counts = counts::counts(s, &done, &blocked);
    if !strategy.mutates() {
        return SweepStatements {
            counts,
            ..SweepStatements::default()
        };
    }
    let at = LockSlots::of(s.scoped());
    let candidates = lock::candidates(s, &at, &done, &blocked);
    let [plain, after, until, after_until] = at
        .bounds
        .forms()
        .map(|bounds| lock::lock(s, &candidates, plain_table, at.limit, bounds));
    let m = mutate::mutations(
        s,
        values,
        strategy,
        (&done, &blocked),
        &candidates,
        plain_table,
    );
    SweepStatements {
        counts,
        counts_after: Some(counts::counts_after(s, strategy, &done)),
        backlog: Some(counts::backlog(s, &done)),
        kept_by_legal_min: Some(counts::kept_by_legal_min(s, &done)),
        lock: plain,
        lock_after: Some(after),
        lock_until: Some(until),
        lock_after_until: Some(after_until),
        ranges: Some(lock::ranges(s, &at, &candidates)),
        mutate: m.keys,
        mutate_count: Some(m.count),
        mutate_audited: Some(m.audited),
        mutate_head: Some(m.head),
        by_address: m.by_address,
        fused: m.fused,
    }
}
