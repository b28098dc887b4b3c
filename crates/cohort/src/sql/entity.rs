//! The statements of one entity, built once when the model is validated.
//!
//! A sweep batch is a fixed number of statements whatever its size:
//! `lock` (candidates past the cutoff, in the tenant, not held, oldest first,
//! `FOR UPDATE SKIP LOCKED`, at most the batch size), then `mutate` (a new
//! statement, so a new snapshot: it re-checks holds committed while the
//! candidates were being locked), then the ledger writes. Hold creation
//! takes a row lock on its target, so a hold either commits before the
//! candidate lock (and `mutate` sees it) or waits until the batch commits.
//! Row locks live in the tuples, not in the shared lock table, so a
//! 5000-row batch needs no more lock-table slots than a one-row batch.
//!
//! Parameters are positional and documented per statement.

use std::collections::BTreeMap;

use super::fragments::{
    blocked, bound_rows, hold_exists, not_done, referenced, subject_hold, tenant_filter, Casts,
    HoldKeys,
};
use super::fused;
use crate::ident::{QualifiedName, SqlText};
use crate::model::{AnonymiseMethod, CustomAnonymiser, EntityDescriptor};
use crate::rules::{CategoryCapabilities, Strategy};
use crate::sql::IncomingKey;

/// The statements of one entity.
#[derive(Debug, Clone)]
pub(crate) struct EntityPlan {
    /// Lock candidates. `$1` entity id, `$2` cutoff, `$3` limit, `$4` tenant.
    /// Returns the record key and the anchor, in (anchor, key) order.
    pub(crate) lock: BTreeMap<Strategy, SqlText>,
    /// `lock` continuing after a cursor: candidates whose (anchor, key) is
    /// past the previous batch's last row. Then the cursor's anchor and key
    /// (`$5`, `$6`; `$4`, `$5` for a tenantless entity).
    pub(crate) lock_after: BTreeMap<Strategy, SqlText>,
    /// `lock` within one key range of a parallel sweep: candidates whose
    /// (anchor, key) is at most the range's last row, bound where
    /// `lock_after` binds its cursor.
    pub(crate) lock_until: BTreeMap<Strategy, SqlText>,
    /// `lock_after` within one key range: the cursor, then the range's
    /// last (anchor, key).
    pub(crate) lock_after_until: BTreeMap<Strategy, SqlText>,
    /// The key ranges of a parallel sweep: of the candidates `lock` would
    /// choose (unlocked, in (anchor, key) order), split into `$3` tiles of
    /// equal size, the (key, anchor) of each tile's last row but the last
    /// tile's, in order. Binds as `lock`, the number of ranges in place of
    /// the limit. Read once per entity, without locking anything: the
    /// ranges only divide the key space, so every row lies in exactly one
    /// of them whatever changes after the read.
    pub(crate) ranges: BTreeMap<Strategy, SqlText>,
    /// Mutate locked rows that are still not held, not done, past the
    /// cutoff and in the tenant. `$1` entity id, `$2` record keys (array),
    /// then (anonymise) the literals and (with custom anonymisers or hashed
    /// columns, computed in Rust) one JSON object per key, aligned with
    /// `$2`, holding each such column's new value; then the cutoff and the
    /// tenant. Returns `record::text`.
    pub(crate) mutate: BTreeMap<Strategy, SqlText>,
    /// `mutate` without RETURNING: for batches that need only the count
    /// (no per-row audit, no handlers), so no key travels back.
    pub(crate) mutate_count: BTreeMap<Strategy, SqlText>,
    /// `mutate` writing one row detail per changed row in the same
    /// statement (per-row audit, handlers), so the changed keys do not
    /// travel to the client and back. Binds `mutate`'s parameters, then the
    /// run id, the entity's display name, the tenant as text and the
    /// action. Returns `row_detail_id, record_id`.
    pub(crate) mutate_audited: BTreeMap<Strategy, SqlText>,
    /// `mutate` without its cutoff, tenant and RETURNING, for erasure to
    /// add its own re-checks (parameters after the anonymise ones).
    pub(crate) mutate_head: BTreeMap<Strategy, SqlText>,
    /// Counts in scope: eligible (past cutoff, not held), held (past cutoff,
    /// held), held_by_subject (of those, under a subject hold) and
    /// null_anchor. `$1` entity id, `$2` cutoff, `$3` tenant.
    pub(crate) counts: BTreeMap<Strategy, SqlText>,
    /// What `counts` returns after a real run, without reading the rows
    /// past the cutoff (after a purge, their dead index entries; after an
    /// anonymisation or soft delete, every row already done): held rows
    /// are found through the entity's active holds, bound after the tenant
    /// (`$3`, or `$4` with a tenant) as a [`BoundHolds`](super::BoundHolds):
    /// the record holds' keys, then one array per subject column; NULL
    /// anchors through the anchor index; `eligible` is 0 (only dry runs
    /// need it). Mutating strategies only.
    pub(crate) counts_after: BTreeMap<Strategy, SqlText>,
    /// The backlog: the anchor (column `oldest`) of the oldest row still
    /// eligible (past the cutoff, in the tenant, not done, not held), or
    /// no row. Rows a foreign key still blocks count: they are behind all
    /// the same. One `ORDER BY anchor LIMIT 1` read of the `(tenant,
    /// anchor)` / anchor index. `$1` entity id, `$2` cutoff, `$3` tenant
    /// (then the stage floor), as `counts`. Mutating strategies only.
    pub(crate) backlog: BTreeMap<Strategy, SqlText>,
    /// Reads the locked rows for custom anonymisers: key first, then every
    /// column. `$1` record keys.
    pub(crate) load_rows: SqlText,
    /// Locks one row against mutation and returns its key and tenant as
    /// text (tenant NULL when tenantless): what hold creation takes.
    /// `$1` record key.
    pub(crate) lock_target: SqlText,
    /// `EXISTS (…)` for rows another row still references through a NO
    /// ACTION / RESTRICT foreign key (`None`: nothing references the table).
    pub(crate) referenced: Option<SqlText>,
    /// Guarded deletion: locks the targets (`FOR UPDATE`, in key order) and
    /// returns each one's canonical id and tenant. `$1` record keys.
    pub(crate) guard_lock: SqlText,
    /// The hold check of every statement: `EXISTS` over the active holds
    /// on the row's record or on a subject it holds (`$1` entity id).
    pub(crate) held: SqlText,
    /// The subject half of `held` (`None`: no subject columns).
    pub(crate) subject_held: Option<SqlText>,
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
    /// Values computed once per run and bound after `$2` by the anonymise
    /// statement, in declaration order: literal templates and per-run
    /// custom anonymisers.
    pub(crate) literals: Vec<RunValue>,
    /// Custom anonymisers, in parameter order: (column, anonymiser).
    pub(crate) custom: Vec<(String, CustomAnonymiser)>,
    /// Whether `archive` applies the anonymise methods to the copy (it
    /// then binds the anonymise parameters after the run id).
    pub(crate) archive_anonymises: bool,
    /// The strategies whose sweep finds its locked rows by address: on a
    /// plain table (not partitioned, where an address names one row of
    /// the table), the lock statements return each row's `ctid` as text
    /// third, and for these strategies (all but those computing values
    /// in Rust, which join their values by key) `mutate`, `mutate_count`
    /// and `mutate_audited` take the rows at those addresses, bound as
    /// `$2` in place of the keys: a TID scan reads each row where it lies
    /// instead of probing the key index for every key.
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
    pub(crate) by_address: std::collections::BTreeSet<Strategy>,
    /// The strategies whose sweep batches can run as one statement, with
    /// those statements (see [`super::fused`]).
    pub(crate) fused: BTreeMap<Strategy, super::fused::Fused>,
}
/// How a stage measured from a previous stage's marker narrows an
/// entity's statements (built on a descriptor whose anchor is the marker).
#[derive(Debug, Clone)]
pub(crate) struct StageScope {
    /// ` AND …`: rows the previous stage has done (its marker set and, after
    /// a soft delete, the flag still set: a restored row is not purged).
    pub(crate) previous_done: SqlText,
    /// The entity's own anchor: a row is only touched when it is older than
    /// the legal minimum's floor, bound after the tenant (NULL: no floor).
    pub(crate) floor: String,
}

impl StageScope {
    /// The scope of a stage measured from the marker a `previous` stage
    /// writes, and the descriptor its statements are built on (anchored on
    /// that marker, never dropping partitions). `None` when the strategy
    /// writes no marker or the entity has none (validation refuses both).
    pub(crate) fn after(
        e: &EntityDescriptor,
        previous: Strategy,
    ) -> Option<(EntityDescriptor, Self)> {
        let marker = e.marker(previous.marker()?)?;
        let mut done = SqlText::new(" AND ");
        done.col(marker).push(" IS NOT NULL");
        if previous == Strategy::SoftDelete {
            // A restored row keeps its stale deleted_at: the flag decides.
            done.push(" AND ")
                .col(e.soft_delete.as_deref()?)
                .push(" IS TRUE");
        }
        let mut staged = e.clone();
        staged.anchor = marker.to_owned();
        staged.partitions = crate::model::Partitions::Rows;
        Some((
            staged,
            StageScope {
                previous_done: done,
                floor: e.anchor.clone(),
            },
        ))
    }
}

/// A value of the anonymise statement computed once per run.
#[derive(Debug, Clone)]
pub(crate) enum RunValue {
    /// A literal's template (rendered with the run's `now` and tenant),
    /// bound as text.
    Template(String),
    /// A per-run custom anonymiser of this column, bound as a JSON object
    /// holding the column's new value (converted to the column's type by
    /// PostgreSQL, as per-row values are).
    PerRun(String, CustomAnonymiser),
}

impl EntityPlan {
    /// Parameters the anonymise statement binds after the keys (`$2`):
    /// literals, then the JSON array of values computed in Rust (custom
    /// anonymisers and hashed columns).
    pub(crate) fn anonymise_params(&self) -> usize {
        self.literals.len() + usize::from(!self.custom.is_empty())
    }

    /// Parameters `mutate` binds after the keys for `strategy`: the
    /// anonymise ones; for archive, the run id (`$3`), then the anonymise
    /// ones when the copy is anonymised.
    ///
    /// Last of them, for a strategy that marks its rows ([`marks`]), the
    /// run's logical `now`, which the marker (`deleted_at`,
    /// `anonymised_at`, the archive's `archived_at`) is set to: a run's
    /// marks and its cutoffs read one clock.
    pub(crate) fn params_after_keys(&self, strategy: Strategy) -> usize {
        let own = match strategy {
            Strategy::Anonymise => self.anonymise_params(),
            Strategy::Archive if self.archive_anonymises => 1 + self.anonymise_params(),
            Strategy::Archive => 1,
            _ => 0,
        };
        own + usize::from(marks(strategy))
    }

    /// Whether `strategy`'s statement needs values computed in Rust for
    /// each row (custom anonymisers, hashed columns).
    pub(crate) fn computes_per_row(&self, strategy: Strategy) -> bool {
        !self.custom.is_empty()
            && (strategy == Strategy::Anonymise
                || (strategy == Strategy::Archive && self.archive_anonymises))
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
        let table: &QualifiedName = &e.table;
        // A stage measured from a marker: only rows the previous stage did,
        // and the legal minimum's floor on the entity's own anchor, bound
        // right after the tenant (NULL: no floor).
        let f = usize::from(stage.is_some());
        let previous_done = stage.map(|s| s.previous_done.clone()).unwrap_or_default();
        let floor = |n: usize| {
            let mut s = SqlText::default();
            if let Some(stage) = stage {
                s.push(" AND (")
                    .col(&stage.floor)
                    .push(" < ")
                    .param(n)
                    .push(" OR ")
                    .param(n)
                    .push("::timestamptz IS NULL)");
            }
            s
        };
        let t = usize::from(e.tenant.is_some());
        let held = hold_exists(e, keys, cohort_schema);
        let subject_held = subject_hold(e, keys, cohort_schema, active_hold!("h."));
        let referenced = referenced(blockers);
        let mut plan = EntityPlan {
            lock: BTreeMap::new(),
            lock_after: BTreeMap::new(),
            lock_until: BTreeMap::new(),
            lock_after_until: BTreeMap::new(),
            ranges: BTreeMap::new(),
            mutate: BTreeMap::new(),
            mutate_count: BTreeMap::new(),
            mutate_audited: BTreeMap::new(),
            mutate_head: BTreeMap::new(),
            counts: BTreeMap::new(),
            counts_after: BTreeMap::new(),
            backlog: BTreeMap::new(),
            load_rows: SqlText::default(),
            lock_target: SqlText::default(),
            referenced: referenced.clone(),
            guard_lock: SqlText::default(),
            held: held.clone(),
            subject_held: subject_held.clone(),
            guard_held: SqlText::default(),
            is_held: SqlText::default(),
            is_held_at: SqlText::default(),
            literals: Vec::new(),
            custom: Vec::new(),
            archive_anonymises: e.archive.as_ref().is_some_and(|a| a.anonymise),
            by_address: std::collections::BTreeSet::new(),
            fused: BTreeMap::new(),
        };
        let by_address = plain_table;
        // Anonymise's parameters are fixed by the entity, whatever the strategy.
        for a in &e.anonymise {
            match &a.method {
                AnonymiseMethod::Literal(v) => plan.literals.push(RunValue::Template(v.clone())),
                AnonymiseMethod::Custom(c) if c.is_per_run() => plan
                    .literals
                    .push(RunValue::PerRun(a.column.clone(), c.clone())),
                // Hashed in Rust (HMAC-SHA256 under the configured key), like a
                // custom anonymiser: the key never reaches the server, its
                // statements or its logs.
                AnonymiseMethod::Hash => plan.custom.push((
                    a.column.clone(),
                    hasher.cloned().expect("validated: hashing needs a key"),
                )),
                AnonymiseMethod::Custom(c) => plan.custom.push((a.column.clone(), c.clone())),
                _ => {}
            }
        }

        // An erasure on an archiving entity deletes (it never copies a
        // person's rows into the archive), so archive brings purge's statements.
        let mut strategies: Vec<Strategy> = capabilities.iter().collect();
        if capabilities.allows(Strategy::Archive) && !capabilities.allows(Strategy::Purge) {
            strategies.push(Strategy::Purge);
        }
        for strategy in strategies {
            let mut done = not_done(e, strategy);
            done.append(&previous_done);
            let blocked = blocked(strategy, referenced.as_ref());

            let mut c = SqlText::new("SELECT count(*) FILTER (WHERE ");
            c.col(&e.anchor)
                .push(" < $2 AND NOT ")
                .append(&held)
                .append(&blocked.unblocked)
                .push(") AS eligible, ");
            c.append(&blocked.skipped_column(&e.anchor, "$2", &held))
                .push(", count(*) FILTER (WHERE ")
                .col(&e.anchor)
                .push(" < $2 AND ")
                .append(&held)
                .push(") AS held, ");
            match &subject_held {
                Some(subject) => {
                    c.push("count(*) FILTER (WHERE ")
                        .col(&e.anchor)
                        .push(" < $2 AND ")
                        .append(subject)
                        .push(") AS held_by_subject, ");
                }
                None => {
                    c.push("0::int8 AS held_by_subject, ");
                }
            }
            c.push("count(*) FILTER (WHERE ")
                .col(&e.anchor)
                .push(" IS NULL) AS null_anchor, 0::int8 AS kept_by_legal_min FROM ")
                .table(table)
                // Every count is of rows past the cutoff or without an
                // anchor: only those are read (the anchor index's range
                // before the cutoff, and its NULLs), never the newer rows.
                .push(" t WHERE (")
                .col(&e.anchor)
                .push(" < $2 OR ")
                .col(&e.anchor)
                .push(" IS NULL)")
                .append(&tenant_filter(e, casts, 3))
                .append(&floor(3 + t))
                .append(&done);
            plan.counts.insert(strategy, c);

            if !strategy.mutates() {
                continue;
            }
            let mut b = SqlText::new("SELECT ");
            b.col(&e.anchor)
                .push(" AS oldest FROM ")
                .table(table)
                .push(" t WHERE ")
                .col(&e.anchor)
                .push(" < $2")
                .append(&tenant_filter(e, casts, 3))
                .append(&floor(3 + t))
                .append(&done)
                .push(" AND NOT ")
                .append(&held)
                .push(" ORDER BY ")
                .col(&e.anchor)
                .push(" LIMIT 1");
            plan.backlog.insert(strategy, b);
            let keys = 3 + t + f;
            let tenant_and_floor = {
                let mut s = tenant_filter(e, casts, 3);
                s.append(&floor(3 + t));
                s
            };
            let mut a = SqlText::new("SELECT 0::int8 AS eligible, (SELECT count(*) FROM ");
            a.table(table)
                .push(" t WHERE ")
                .append(&bound_rows(e, casts, keys))
                .push(" AND ")
                .col(&e.anchor)
                .push(" < $2")
                .append(&tenant_and_floor)
                .append(&done)
                .push(" AND ")
                .append(&held)
                .push(") AS held, (SELECT count(*) FROM ")
                .table(table)
                .push(" t WHERE ")
                .col(&e.anchor)
                .push(" IS NULL")
                .append(&tenant_and_floor)
                .append(&done)
                .push(") AS null_anchor, ");
            match (strategy.deletes(), &referenced) {
                (true, Some(r)) => {
                    a.push("(SELECT count(*) FROM ")
                        .table(table)
                        .push(" t WHERE ")
                        .col(&e.anchor)
                        .push(" < $2")
                        .append(&tenant_and_floor)
                        .push(" AND NOT ")
                        .append(&held)
                        .push(" AND ")
                        .append(r)
                        .push(")");
                }
                _ => {
                    a.push("0::int8");
                }
            }
            a.push(" AS skipped, ");
            match &subject_held {
                Some(subject) => {
                    // Rows a subject hold names, through the subject arrays.
                    let mut arms = SqlText::new("(");
                    for i in 0..e.subjects.len() {
                        if i > 0 {
                            arms.push(" OR ");
                        }
                        arms.append(&casts.any(&e.subjects[i].column, keys + 1 + i));
                    }
                    arms.push(")");
                    a.push("(SELECT count(*) FROM ")
                        .table(table)
                        .push(" t WHERE ")
                        .append(&arms)
                        .push(" AND ")
                        .col(&e.anchor)
                        .push(" < $2")
                        .append(&tenant_and_floor)
                        .append(&done)
                        .push(" AND ")
                        .append(subject)
                        .push(")");
                }
                None => {
                    a.push("0::int8");
                }
            }
            a.push(" AS held_by_subject, 0::int8 AS kept_by_legal_min");
            plan.counts_after.insert(strategy, a);
            // Candidates in (anchor, key) order, so a run can continue
            // each batch after the last one's final row (`lock_after`)
            // instead of walking again past every row it already did.
            // The candidates' conditions, shared by the lock statements
            // and the parallel sweep's key ranges.
            let mut candidates = SqlText::default();
            candidates
                .col(&e.anchor)
                .push(" < $2")
                .append(&tenant_filter(e, casts, 4))
                .append(&floor(4 + t))
                .append(&done)
                .append(&blocked.unblocked);
            // Candidates in (anchor, key) order, so a run can continue
            // each batch after the last one's final row (`lock_after`)
            // instead of walking again past every row it already did.
            let lock = |after: Option<usize>, until: Option<usize>| {
                let mut l = SqlText::new("SELECT ");
                casts.select(&mut l, &e.record_id);
                l.push(", ").col(&e.anchor);
                if by_address {
                    l.push(", t.ctid::text");
                }
                l.push(" FROM ")
                    .table(table)
                    .push(" t WHERE ")
                    .append(&candidates);
                if let Some(n) = after {
                    // The row comparison breaks anchor ties by key.
                    keyset_bound(e, casts, &mut l, ">", " >= ", n);
                }
                if let Some(n) = until {
                    keyset_bound(e, casts, &mut l, "<=", " <= ", n);
                }
                l.push(" AND NOT ")
                    .append(&held)
                    .push(" ORDER BY ")
                    .col(&e.anchor)
                    .push(", ")
                    .col(&e.record_id)
                    .push(" LIMIT $3 FOR UPDATE SKIP LOCKED");
                l
            };
            plan.lock.insert(strategy, lock(None, None));
            let cursor = 4 + t + f;
            plan.lock_after.insert(strategy, lock(Some(cursor), None));
            plan.lock_until.insert(strategy, lock(None, Some(cursor)));
            plan.lock_after_until
                .insert(strategy, lock(Some(cursor), Some(cursor + 2)));
            let mut r = SqlText::new("SELECT s.k, s.a FROM (SELECT r.k, r.a, r.n, r.tile, pg_catalog.lead(r.tile) OVER (ORDER BY r.n) AS next FROM (SELECT ");
            casts.select(&mut r, &e.record_id);
            r.push(" AS k, ")
                .col(&e.anchor)
                .push(" AS a, pg_catalog.row_number() OVER w AS n, pg_catalog.ntile(")
                .param(3)
                .push("::int4) OVER w AS tile FROM ")
                .table(table)
                .push(" t WHERE ")
                .append(&candidates)
                .push(" AND NOT ")
                .append(&held)
                .push(" WINDOW w AS (ORDER BY ")
                .col(&e.anchor)
                .push(", ")
                .col(&e.record_id)
                .push(")) r) s WHERE s.next <> s.tile ORDER BY s.n");
            plan.ranges.insert(strategy, r);

            // Parameters after the keys: the strategy's own, then the
            // cutoff, tenant and floor.
            let after = 3 + plan.params_after_keys(strategy);
            let addressed = by_address && !plan.computes_per_row(strategy);
            if addressed {
                plan.by_address.insert(strategy);
            }
            let next = after + 1 + t + f;
            // The mutation without its re-checks: `key_match` picks the rows.
            // `first_literal`: where the strategy's own values start
            // (anonymise's literals first; the run's `now` for the marker
            // last); `recheck_held`: whether the hold check is repeated
            // (not in a fused statement, whose snapshot is its candidates').
            let mark = first_value_mark(&plan, strategy);
            let body = |key_match: &SqlText, first_literal: usize, recheck_held: bool| {
                let mut m = SqlText::default();
                match strategy {
                    Strategy::Purge | Strategy::Archive => {
                        m.push("DELETE FROM ")
                            .table(table)
                            .push(" t WHERE ")
                            .append(key_match);
                    }
                    Strategy::SoftDelete => {
                        m.push("UPDATE ")
                            .table(table)
                            .push(" t SET ")
                            .ident(e.soft_delete.as_deref().expect("validated"));
                        m.push(" = TRUE");
                        if let Some(d) = &e.deleted_at {
                            m.push(", ")
                                .ident(d)
                                .push(" = ")
                                .param(first_literal + mark)
                                .push("::timestamptz");
                        }
                        m.push(" WHERE ").append(key_match);
                    }
                    Strategy::Anonymise => {
                        m.push("UPDATE ").table(table).push(" t SET ");
                        for (i, (column, value)) in
                            anonymised_values(e, first_literal).into_iter().enumerate()
                        {
                            if i > 0 {
                                m.push(", ");
                            }
                            m.ident(column).push(" = ").append(&value);
                        }
                        m.push(", ")
                            .ident(e.anonymised_at.as_deref().expect("validated"))
                            .push(" = ")
                            .param(first_literal + mark)
                            .push("::timestamptz");
                        if plan.custom.is_empty() {
                            m.push(" WHERE ").append(key_match);
                        } else {
                            // The values computed in Rust come with their
                            // keys, which pick the rows.
                            m.push(" FROM ")
                                .append(&per_row_values(e, casts, 3 + plan.literals.len()))
                                .push(" WHERE ")
                                .col(&e.record_id)
                                .push(" = v.k");
                        }
                    }
                    Strategy::Exempt => unreachable!("exempt does not mutate"),
                }
                // The re-check in a new snapshot also sees holds and references
                // committed while the batch was being locked.
                m.append(&done).append(&blocked.unblocked);
                if recheck_held {
                    m.push(" AND NOT ").append(&held);
                }
                m
            };
            let by_key = casts.any(&e.record_id, 2);
            plan.mutate_head.insert(strategy, body(&by_key, 3, true));
            // A sweep's rows by address, read where they lie instead of
            // through the key index (see `by_address`).
            let sweep_match = if addressed { at_addresses(2) } else { by_key };
            let mut m = body(&sweep_match, 3, true);
            // A sweep's mutation re-checks what the candidate query chose
            // by (cutoff and tenant) besides the keys, so no key collision,
            // concurrent update or planner surprise reaches another row.
            m.push(" AND ")
                .col(&e.anchor)
                .push(" < ")
                .param(after)
                .append(&tenant_filter(e, casts, after + 1))
                .append(&floor(after + 1 + t));
            // One statement per batch where nothing is read into the
            // process and no restricting reference can appear after the
            // snapshot (see `fused`).
            if addressed && !(strategy.deletes() && referenced.is_some()) {
                let head = 3 + t + f;
                let archive = strategy == Strategy::Archive;
                // Fused only without values computed in Rust: the
                // strategy's own values are its literals (and archive's
                // run id), then the run's `now` for the marker.
                let extras = plan.params_after_keys(strategy);
                let mut mutation =
                    body(&SqlText::new(fused::LOCKED_UNLESS_RECENT), head + 1, false);
                mutation
                    .push(" AND ")
                    .col(&e.anchor)
                    .push(" < $2")
                    .append(&tenant_filter(e, casts, 4))
                    .append(&floor(4 + t));
                let returning = if archive {
                    archive_returning(e)
                } else {
                    let mut r = SqlText::default();
                    r.col(&e.record_id);
                    r
                };
                let parts = fused::Parts {
                    e,
                    casts,
                    cohort_schema,
                    candidates: &candidates,
                    held: &held,
                    head,
                    extras,
                    mutation,
                    returning,
                    archive_insert: archive.then(|| archive_insert(e, &plan, casts, head + 1)),
                };
                plan.fused.insert(strategy, fused::build(&parts));
            }
            if strategy == Strategy::Archive {
                let statements = archive_statements(e, &plan, casts, &m, next, cohort_schema);
                plan.mutate_count.insert(strategy, statements.count);
                plan.mutate.insert(strategy, statements.keys);
                plan.mutate_audited.insert(strategy, statements.audited);
                continue;
            }
            plan.mutate_count.insert(strategy, m.clone());
            let mut audited = SqlText::new("WITH m AS (");
            audited
                .append(&m)
                .push(" RETURNING ")
                .col(&e.record_id)
                .push("::text AS r) INSERT INTO ")
                .table(&crate::sql::tables::CohortTable::RowDetail.qualified(cohort_schema))
                .push(
                    " (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) SELECT ",
                )
                .param(next)
                .push(", $1, ")
                .param(next + 1)
                .push(", m.r, ")
                .param(next + 2)
                .push(", ")
                .param(next + 3)
                .push(" FROM m RETURNING row_detail_id, record_id");
            plan.mutate_audited.insert(strategy, audited);
            m.push(" RETURNING ").col(&e.record_id).push("::text");
            plan.mutate.insert(strategy, m);
        }

        let mut load_rows = SqlText::new("SELECT ");
        casts.select(&mut load_rows, &e.record_id);
        load_rows
            .push(", t.* FROM ")
            .table(table)
            .push(" t WHERE ")
            .append(&casts.any(&e.record_id, 1));
        plan.load_rows = load_rows;

        let mut lock_target = SqlText::new("SELECT ");
        lock_target.col(&e.record_id).push("::text AS record, ");
        match &e.tenant {
            Some(t) => {
                lock_target.col(t).push("::text");
            }
            None => {
                lock_target.push("NULL::text");
            }
        }
        lock_target
            .push(" AS tenant FROM ")
            .table(table)
            .push(" t WHERE ")
            .col(&e.record_id)
            .push(" = ");
        casts.param(&mut lock_target, &e.record_id, 1);
        lock_target.push(" FOR KEY SHARE");
        plan.lock_target = lock_target;

        let mut guard_lock = SqlText::new("SELECT ");
        guard_lock.col(&e.record_id).push("::text AS record, ");
        match &e.tenant {
            Some(t) => {
                guard_lock.col(t).push("::text");
            }
            None => {
                guard_lock.push("NULL::text");
            }
        }
        guard_lock
            .push(" AS tenant FROM ")
            .table(table)
            .push(" t WHERE ")
            .append(&casts.any(&e.record_id, 1))
            .push(" ORDER BY ")
            .col(&e.record_id)
            .push(" FOR UPDATE");
        plan.guard_lock = guard_lock;

        let mut guard_held = SqlText::new("SELECT ");
        guard_held
            .col(&e.record_id)
            .push("::text AS record FROM ")
            .table(table)
            .push(" t WHERE ")
            .append(&casts.any(&e.record_id, 2))
            .push(" AND ")
            .append(&held)
            .push(" ORDER BY ")
            .col(&e.record_id);
        plan.guard_held = guard_held;

        let mut is_held = SqlText::new("SELECT EXISTS (SELECT 1 FROM ");
        is_held
            .table(table)
            .push(" t WHERE ")
            .col(&e.record_id)
            .push(" = ");
        casts.param(&mut is_held, &e.record_id, 2);
        is_held
            .push(" AND ")
            .append(&held)
            .push(") OR EXISTS (SELECT 1 FROM ");
        is_held
            .table(&crate::sql::tables::CohortTable::Hold.qualified(cohort_schema))
            .push(concat!(
                " h WHERE h.retention_entity_id = $1 AND h.record_id = $3 AND ",
                active_hold!("h."),
                ")"
            ));
        plan.is_held = is_held;

        // The same two ways of naming the record, with the hold's life
        // compared to `$4` instead of now.
        let at = " AND h.created_at <= $4 AND (h.released_at IS NULL OR h.released_at > $4) \
                  AND (h.expires_at IS NULL OR h.expires_at > $4))";
        let holds = crate::sql::tables::CohortTable::Hold.qualified(cohort_schema);
        let mut is_held_at = SqlText::new("SELECT EXISTS (SELECT 1 FROM ");
        is_held_at
            .table(table)
            .push(" t JOIN ")
            .table(&holds)
            .push(" h ON h.retention_entity_id = $1 AND h.record_id = ")
            .col(&e.record_id)
            .push("::text WHERE ")
            .col(&e.record_id)
            .push(" = ");
        casts.param(&mut is_held_at, &e.record_id, 2);
        is_held_at
            .push(at)
            .push(" OR EXISTS (SELECT 1 FROM ")
            .table(&holds)
            .push(" h WHERE h.retention_entity_id = $1 AND h.record_id = $3")
            .push(at);
        // A subject hold alive at `$4` on a subject the row holds now.
        let at_subject = "h.created_at <= $4 AND (h.released_at IS NULL OR h.released_at > $4) \
                          AND (h.expires_at IS NULL OR h.expires_at > $4)";
        if let Some(subject) = subject_hold(e, keys, cohort_schema, at_subject) {
            is_held_at
                .push(" OR EXISTS (SELECT 1 FROM ")
                .table(table)
                .push(" t WHERE ")
                .col(&e.record_id)
                .push(" = ");
            casts.param(&mut is_held_at, &e.record_id, 2);
            is_held_at.push(" AND ").append(&subject).push(")");
        }
        plan.is_held_at = is_held_at;
        plan
    }
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
    l.push(" AND (").col(&e.anchor).push(", ").col(&e.record_id);
    l.push(") ").push(op).push(" (").param(n).push(", ");
    casts.param(l, &e.record_id, n + 1);
    l.push(")");
}

/// Each anonymised column's new value, in declaration order: literal and
/// per-run values bound from `$first_literal` on (in `EntityPlan::literals`
/// order), per-row values read from `v.j` (see [`per_row_values`]).
fn anonymised_values(e: &EntityDescriptor, first_literal: usize) -> Vec<(&str, SqlText)> {
    let mut next_literal = first_literal;
    let mut out = Vec::with_capacity(e.anonymise.len());
    for a in &e.anonymise {
        let mut v = SqlText::default();
        match &a.method {
            AnonymiseMethod::Null => {
                v.push("NULL");
            }
            AnonymiseMethod::Empty => {
                v.push("''");
            }
            AnonymiseMethod::Literal(_) => {
                v.param(next_literal);
                next_literal += 1;
            }
            AnonymiseMethod::Custom(c) if c.is_per_run() => {
                // Computed once per run: one JSON object for the whole
                // batch, converted like per-row values.
                v.push("(pg_catalog.jsonb_populate_record(NULL::")
                    .table(&e.table)
                    .push(", ")
                    .param(next_literal)
                    .push("::jsonb)).")
                    .ident(&a.column);
                next_literal += 1;
            }
            AnonymiseMethod::Custom(_) | AnonymiseMethod::Hash => {
                // Rust computes a JSON object per row; PostgreSQL converts
                // each value to the column's own type through the table's
                // row type (no type names in SQL, no text casts).
                v.push("(pg_catalog.jsonb_populate_record(NULL::")
                    .table(&e.table)
                    .push(", v.j)).")
                    .ident(&a.column);
            }
        }
        out.push((a.column.as_str(), v));
    }
    out
}

/// `t.ctid = ANY((SELECT $n::tid[])::tid[])`: rows at the addresses bound
/// as `$n` (text).
///
/// The addresses are read through a one-row subquery (an init plan) so
/// that the planner never sees how many there are. Bound directly, a
/// custom plan (the first executions of a prepared statement) counts the
/// 5,000 addresses, prices each as a random page read, and takes a bitmap
/// scan over every row the anchor and tenant re-checks match instead
/// (75,000 rows to find 5,000 at 250,000, and growing with the table);
/// through the subquery every plan is the TID scan. The outer cast makes
/// the parser read a scalar subquery, not `= ANY (subquery)`.
fn at_addresses(n: usize) -> SqlText {
    let mut s = SqlText::new("t.ctid = ANY((SELECT ");
    s.param(n).push("::pg_catalog.tid[])::pg_catalog.tid[])");
    s
}

/// `ROWS FROM (…) AS v(k, j)`: the batch's keys (`$2`) aligned with one
/// JSON object of values computed in Rust per key (`$param`).
fn per_row_values(e: &EntityDescriptor, casts: &Casts, param: usize) -> SqlText {
    let mut s = SqlText::new("ROWS FROM (pg_catalog.unnest(");
    casts.array(&mut s, &e.record_id, 2);
    s.push("), pg_catalog.unnest(")
        .param(param)
        .push("::jsonb[])) AS v(k, j)");
    s
}

/// The archive strategy's three statements.
struct ArchiveStatements {
    /// Moves the rows; nothing returned.
    count: SqlText,
    /// Moves the rows; returns each moved key as text.
    keys: SqlText,
    /// Moves the rows and writes a row detail per moved row.
    audited: SqlText,
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
fn archive_statements(
    e: &EntityDescriptor,
    plan: &EntityPlan,
    casts: &Casts,
    delete: &SqlText,
    next: usize,
    cohort_schema: &str,
) -> ArchiveStatements {
    let mut moved = SqlText::new("WITH moved AS (");
    moved
        .append(delete)
        .push(" RETURNING ")
        .append(&archive_returning(e))
        .push("), ")
        .append(&archive_checked(
            e,
            &archive_insert(e, plan, casts, 3),
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
        s.push(" SELECT moved.")
            .ident(&e.record_id)
            .push("::text FROM moved, verdict");
        s
    };
    let mut audited = moved;
    audited
        .push(" INSERT INTO ")
        .table(&crate::sql::tables::CohortTable::RowDetail.qualified(cohort_schema))
        .push(" (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) SELECT ")
        .param(next)
        .push(", $1, ")
        .param(next + 1)
        .push(", moved.")
        .ident(&e.record_id)
        .push("::text, ")
        .param(next + 2)
        .push(", ")
        .param(next + 3)
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
    insert: &SqlText,
    cohort_schema: &str,
) -> SqlText {
    let mut s = SqlText::new("archived AS (");
    s.append(insert)
        .push(" RETURNING ")
        .ident(&e.record_id)
        .push(" AS k), verdict AS (SELECT ")
        .table(&QualifiedName::new(cohort_schema, "retention_archive_check"))
        .push("((SELECT count(*) FROM moved), (SELECT count(*) FROM archived), (SELECT count(*) FROM moved FULL JOIN archived ON moved.")
        .ident(&e.record_id)
        .push(" = archived.k WHERE moved.")
        .ident(&e.record_id)
        .push(" IS NULL OR archived.k IS NULL)) AS ok)");
    s
}

/// What the archive's mutation returns: the columns the copy takes.
fn archive_returning(e: &EntityDescriptor) -> SqlText {
    let archive = e.archive.as_ref().expect("validated: archive has a table");
    let mut s = SqlText::default();
    for (i, c) in archive.columns.iter().enumerate() {
        if i > 0 {
            s.push(", ");
        }
        s.col(c);
    }
    s
}

/// How far after the first of `strategy`'s own values the run's `now`
/// for its marker is bound (its last value; 0 when it marks nothing).
fn first_value_mark(plan: &EntityPlan, strategy: Strategy) -> usize {
    plan.params_after_keys(strategy).saturating_sub(1)
}

/// Whether `strategy` stamps the rows it changes with a marker (set to
/// the run's `now`, bound last of the strategy's values).
pub(crate) fn marks(strategy: Strategy) -> bool {
    matches!(
        strategy,
        Strategy::SoftDelete | Strategy::Anonymise | Strategy::Archive
    )
}

/// The archive's copy of the rows a `moved` statement returns: stamped
/// with the run's `now` and the run id (`$run_id`), the anonymised
/// columns (with anonymise-on-archive) replaced by their anonymised
/// values, bound after the run id; the `now` comes last of the
/// strategy's values.
fn archive_insert(
    e: &EntityDescriptor,
    plan: &EntityPlan,
    casts: &Casts,
    run_id: usize,
) -> SqlText {
    let archive = e.archive.as_ref().expect("validated: archive has a table");
    let anonymised: BTreeMap<&str, SqlText> = if archive.anonymise {
        anonymised_values(e, run_id + 1).into_iter().collect()
    } else {
        BTreeMap::new()
    };
    let mut insert = SqlText::new("INSERT INTO ");
    insert.table(&archive.table).push(" (");
    for c in &archive.columns {
        insert.ident(c).push(", ");
    }
    insert
        .ident(crate::model::ARCHIVED_AT)
        .push(", ")
        .ident(crate::model::ARCHIVE_RUN_ID)
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
        .param(run_id + plan.params_after_keys(Strategy::Archive) - 1)
        .push("::timestamptz, ")
        .param(run_id)
        .push(" FROM moved");
    if archive.anonymise && !plan.custom.is_empty() {
        // Every moved row is copied, whether or not its computed values
        // came along (a missing object anonymises to NULL, never the original).
        insert
            .push(" LEFT JOIN ")
            .append(&per_row_values(e, casts, run_id + 1 + plan.literals.len()))
            .push(" ON moved.")
            .ident(&e.record_id)
            .push(" = v.k");
    }
    insert
}

/// Hold creation on a subject: locks every row of the entity whose given
/// subject columns equal the subject (`FOR KEY SHARE`, which conflicts with
/// the `FOR UPDATE` of every mutation), in the tenant when one is bound,
/// and returns how many. `$1.. ` one value per column in its own type,
/// then the tenant.
pub(crate) fn lock_subject_rows(
    e: &EntityDescriptor,
    casts: &Casts,
    columns: &[&str],
    tenanted: bool,
) -> SqlText {
    let mut s = SqlText::new("SELECT count(*) FROM (SELECT 1 FROM ");
    s.table(&e.table).push(" t WHERE (");
    for (i, column) in columns.iter().enumerate() {
        if i > 0 {
            s.push(" OR ");
        }
        s.col(column).push(" = ");
        casts.param(&mut s, column, i + 1);
    }
    s.push(")");
    if tenanted {
        s.append(&tenant_filter(e, casts, columns.len() + 1));
    }
    s.push(" FOR KEY SHARE OF t) locked");
    s
}
