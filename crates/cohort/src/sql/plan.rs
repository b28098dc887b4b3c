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

use crate::ident::{QualifiedName, SqlText};
use crate::model::{AnonymiseMethod, CustomAnonymiser, EntityDescriptor};
use crate::rules::{CategoryCapabilities, Strategy};
use crate::schema::CohortTable;
use crate::validate::IncomingKey;

/// The statements of one entity.
#[derive(Debug, Clone)]
pub(crate) struct EntityPlan {
    /// Lock candidates. `$1` entity id, `$2` cutoff, `$3` limit, `$4` tenant.
    /// Returns the record key.
    pub(crate) lock: BTreeMap<Strategy, SqlText>,
    /// Mutate locked rows that are still not held, not done, past the
    /// cutoff and in the tenant. `$1` entity id, `$2` record keys (array),
    /// then (anonymise) the literals, the HMAC inner and outer pads when a
    /// column is hashed, and (with custom anonymisers) one JSON object per
    /// key, aligned with `$2`, holding each custom column's new value; then
    /// the cutoff and the tenant. Returns `record::text`.
    pub(crate) mutate: BTreeMap<Strategy, SqlText>,
    /// `mutate` without its cutoff, tenant and RETURNING, for erasure to
    /// add its own re-checks (parameters after the anonymise ones).
    pub(crate) mutate_head: BTreeMap<Strategy, SqlText>,
    /// Counts in scope: eligible (past cutoff, not held), held (past cutoff,
    /// held) and null_anchor. `$1` entity id, `$2` cutoff, `$3` tenant.
    pub(crate) counts: BTreeMap<Strategy, SqlText>,
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
    /// Literal values bound after `$2` by the anonymise statement.
    pub(crate) literals: Vec<String>,
    /// Whether a column is hashed (the HMAC pads follow the literals).
    pub(crate) hashes: bool,
    /// Custom anonymisers, in parameter order: (column, anonymiser).
    pub(crate) custom: Vec<(String, CustomAnonymiser)>,
}

/// An active hold on the row. Holds protect the record (entity + record
/// id), whatever tenant the row belongs to now: a held row that was moved to
/// another tenant stays protected in every tenant's sweep and erasure.
fn hold_exists(e: &EntityDescriptor, cohort_schema: &str) -> SqlText {
    let mut s = SqlText::new("EXISTS (SELECT 1 FROM ");
    s.table(&CohortTable::Hold.qualified(cohort_schema))
        .push(" h WHERE h.retention_entity_id = $1 AND h.record_id = ")
        .col(&e.record_id)
        .push(
            "::text AND (h.released_at IS NULL OR h.released_at > pg_catalog.now()) \
             AND (h.expires_at IS NULL OR h.expires_at > pg_catalog.now()))",
        );
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
    fn any(&self, column: &str, n: usize) -> SqlText {
        let mut s = SqlText::default();
        s.col(column).push(" = ANY(");
        self.array(&mut s, column, n);
        s.push(")");
        s
    }
}

/// The strategy's own "not yet done" condition, with a leading ` AND `.
fn not_done(e: &EntityDescriptor, strategy: Strategy) -> SqlText {
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
fn referenced(blockers: &[IncomingKey]) -> Option<SqlText> {
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

fn tenant_filter(e: &EntityDescriptor, casts: &Casts, param: usize) -> SqlText {
    let mut s = SqlText::default();
    if let Some(t) = &e.tenant {
        s.push(" AND ").col(t).push(" = ");
        casts.param(&mut s, t, param);
    }
    s
}

impl EntityPlan {
    /// Parameters the anonymise statement binds after the keys (`$2`):
    /// literals, the two HMAC pads when a column is hashed, and the custom
    /// values' JSON array.
    pub(crate) fn anonymise_params(&self) -> usize {
        self.literals.len() + if self.hashes { 2 } else { 0 } + usize::from(!self.custom.is_empty())
    }

    /// Parameters `mutate` binds after the keys for `strategy`.
    pub(crate) fn params_after_keys(&self, strategy: Strategy) -> usize {
        if strategy == Strategy::Anonymise {
            self.anonymise_params()
        } else {
            0
        }
    }

    /// Builds every statement for the strategies the category may return.
    pub(crate) fn build(
        e: &EntityDescriptor,
        capabilities: &CategoryCapabilities,
        blockers: &[IncomingKey],
        casts: &Casts,
        cohort_schema: &str,
    ) -> Self {
        let table: &QualifiedName = &e.table;
        let held = hold_exists(e, cohort_schema);
        let referenced = referenced(blockers);
        let mut plan = EntityPlan {
            lock: BTreeMap::new(),
            mutate: BTreeMap::new(),
            mutate_head: BTreeMap::new(),
            counts: BTreeMap::new(),
            load_rows: SqlText::default(),
            lock_target: SqlText::default(),
            referenced: referenced.clone(),
            guard_lock: SqlText::default(),
            literals: Vec::new(),
            hashes: false,
            custom: Vec::new(),
        };
        // Anonymise's parameters are fixed by the entity, whatever the strategy.
        for a in &e.anonymise {
            match &a.method {
                AnonymiseMethod::Literal(v) => plan.literals.push(v.clone()),
                AnonymiseMethod::Hash => plan.hashes = true,
                AnonymiseMethod::Custom(c) => plan.custom.push((a.column.clone(), c.clone())),
                _ => {}
            }
        }

        for strategy in capabilities.iter() {
            let done = not_done(e, strategy);
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
                .push(") AS held, count(*) FILTER (WHERE ")
                .col(&e.anchor)
                .push(" IS NULL) AS null_anchor, 0::int8 AS kept_by_legal_min FROM ")
                .table(table)
                .push(" t WHERE TRUE")
                .append(&tenant_filter(e, casts, 3))
                .append(&done);
            plan.counts.insert(strategy, c);

            if !strategy.mutates() {
                continue;
            }
            let mut l = SqlText::new("SELECT ");
            casts.select(&mut l, &e.record_id);
            l.push(" FROM ")
                .table(table)
                .push(" t WHERE ")
                .col(&e.anchor)
                .push(" < $2")
                .append(&tenant_filter(e, casts, 4))
                .append(&done)
                .append(&blocked.unblocked)
                .push(" AND NOT ")
                .append(&held)
                .push(" ORDER BY ")
                .col(&e.anchor)
                .push(" LIMIT $3 FOR UPDATE SKIP LOCKED");
            plan.lock.insert(strategy, l);

            let key_match = casts.any(&e.record_id, 2);
            let mut m = SqlText::default();
            match strategy {
                Strategy::Purge => {
                    m.push("DELETE FROM ")
                        .table(table)
                        .push(" t WHERE ")
                        .append(&key_match);
                }
                Strategy::SoftDelete => {
                    m.push("UPDATE ")
                        .table(table)
                        .push(" t SET ")
                        .ident(e.soft_delete.as_deref().expect("validated"));
                    m.push(" = TRUE");
                    if let Some(d) = &e.deleted_at {
                        m.push(", ").ident(d).push(" = pg_catalog.now()");
                    }
                    m.push(" WHERE ").append(&key_match);
                }
                Strategy::Anonymise => {
                    m.push("UPDATE ").table(table).push(" t SET ");
                    let mut next_literal = 3;
                    let hash_inner = 3 + plan.literals.len();
                    let custom_param = hash_inner + if plan.hashes { 2 } else { 0 };
                    for (i, a) in e.anonymise.iter().enumerate() {
                        if i > 0 {
                            m.push(", ");
                        }
                        m.ident(&a.column).push(" = ");
                        match &a.method {
                            AnonymiseMethod::Null => {
                                m.push("NULL");
                            }
                            AnonymiseMethod::Empty => {
                                m.push("''");
                            }
                            AnonymiseMethod::Hash => {
                                // HMAC-SHA256 from core functions: the key's two
                                // padded forms are bound parameters, never stored.
                                m.push("pg_catalog.encode(pg_catalog.sha256(")
                                    .param(hash_inner + 1)
                                    .push("::bytea || pg_catalog.sha256(")
                                    .param(hash_inner)
                                    .push("::bytea || pg_catalog.convert_to(")
                                    .col(&a.column)
                                    .push("::text, 'UTF8'))), 'hex')");
                            }
                            AnonymiseMethod::Literal(_) => {
                                m.param(next_literal);
                                next_literal += 1;
                            }
                            AnonymiseMethod::Custom(_) => {
                                // Rust computes a JSON object per row; PostgreSQL converts
                                // each value to the column's own type through the table's
                                // row type (no type names in SQL, no text casts).
                                m.push("(pg_catalog.jsonb_populate_record(NULL::")
                                    .table(table)
                                    .push(", v.j)).")
                                    .ident(&a.column);
                            }
                        }
                    }
                    m.push(", ")
                        .ident(e.anonymised_at.as_deref().expect("validated"))
                        .push(" = pg_catalog.now()");
                    if plan.custom.is_empty() {
                        m.push(" WHERE ").append(&key_match);
                    } else {
                        m.push(" FROM ROWS FROM (pg_catalog.unnest(");
                        casts.array(&mut m, &e.record_id, 2);
                        m.push("), pg_catalog.unnest(")
                            .param(custom_param)
                            .push("::jsonb[])) AS v(k, j) WHERE ")
                            .col(&e.record_id)
                            .push(" = v.k");
                    }
                }
                Strategy::Exempt => unreachable!("exempt does not mutate"),
            }
            // The re-check in a new snapshot also sees holds and references
            // committed while the batch was being locked.
            m.append(&done)
                .append(&blocked.unblocked)
                .push(" AND NOT ")
                .append(&held);
            plan.mutate_head.insert(strategy, m.clone());
            // A sweep's mutation re-checks what the candidate query chose
            // by (cutoff and tenant) besides the keys, so no key collision,
            // concurrent update or planner surprise reaches another row.
            let after = 3 + plan.params_after_keys(strategy);
            m.push(" AND ")
                .col(&e.anchor)
                .push(" < ")
                .param(after)
                .append(&tenant_filter(e, casts, after + 1))
                .push(" RETURNING ")
                .col(&e.record_id)
                .push("::text");
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
        plan
    }
}

/// Fixed ledger statements for Cohort's schema, built once.
#[derive(Debug, Clone)]
pub(crate) struct LedgerPlan {
    /// `$1` run id, `$2` kind, `$3` trigger, `$4` dry run, `$5` tenant, `$6` logical now.
    pub(crate) insert_run: SqlText,
    /// `$1` run id, `$2` status, `$3` error. Returns settled_at.
    pub(crate) settle_run: SqlText,
    /// `$1` run, `$2` entity id, `$3` type, `$4` category, `$5` tenant,
    /// `$6` strategy, `$7` cutoff, `$8` period days, `$9` period secs,
    /// `$10` legal-min days, `$11` legal-min secs, `$12` source, `$13` reason.
    pub(crate) insert_summary: SqlText,
    /// `$1` summary id, `$2` affected increment.
    pub(crate) add_affected: SqlText,
    /// `$1` summary id, `$2` affected, `$3` held, `$4` skipped, `$5` null
    /// anchor, `$6` error, `$7` kept by legal minimum, `$8` kept by policy.
    pub(crate) finish_summary: SqlText,
    /// `$1` run, `$2` entity id, `$3` type, `$4` tenant, `$5` action, `$6` record ids (text[]).
    pub(crate) insert_details: SqlText,
    /// `$1` hold id, `$2` entity id, `$3` record id, `$4` tenant, `$5` reason,
    /// `$6` created at, `$7` expires at. Returns the hold; no row when
    /// `expires_at` is already past by the database clock.
    pub(crate) insert_hold: SqlText,
    /// `$1` entity id or NULL, `$2` tenant or NULL, `$3` active only.
    pub(crate) list_holds: SqlText,
    /// `$1` hold id. Returns the hold if it was active.
    pub(crate) release_hold: SqlText,
    /// `$1` hold id.
    pub(crate) get_hold: SqlText,
    /// Active holds among records (whatever tenant they were placed in).
    /// `$1` entity id, `$2` record ids (text[]). Returns the held record ids.
    pub(crate) held_records: SqlText,
}

const HOLD_COLUMNS: &str =
    " hold_id, retention_entity_id, record_id, tenant_id, reason, created_at, \
    expires_at, released_at, (released_at IS NULL OR released_at > pg_catalog.now()) \
    AND (expires_at IS NULL OR expires_at > pg_catalog.now()) AS active";

impl LedgerPlan {
    pub(crate) fn build(schema: &str) -> Self {
        let run = CohortTable::SweepRun.qualified(schema);
        let summary = CohortTable::EntitySummary.qualified(schema);
        let detail = CohortTable::RowDetail.qualified(schema);
        let mut insert_run = SqlText::new("INSERT INTO ");
        insert_run.table(&run).push(
            " (run_id, kind, trigger, dry_run, tenant_id, status, logical_now, started_at) \
             VALUES ($1, $2, $3, $4, $5, 'started', $6, pg_catalog.clock_timestamp()) RETURNING started_at",
        );
        let mut settle_run = SqlText::new("UPDATE ");
        settle_run.table(&run).push(
            " SET status = $2, settled_at = pg_catalog.clock_timestamp(), error = $3 \
             WHERE run_id = $1 AND status = 'started' RETURNING settled_at",
        );
        let mut insert_summary = SqlText::new("INSERT INTO ");
        insert_summary.table(&summary).push(
            " (run_id, retention_entity_id, entity_type, category, tenant_id, strategy, cutoff, \
               resolved_period, legal_min, rule_source, rule_reason) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, pg_catalog.make_interval(days => $8, secs => $9), \
               CASE WHEN $10::int4 IS NULL THEN NULL ELSE pg_catalog.make_interval(days => $10, secs => $11) END, \
               $12, $13) RETURNING summary_id",
        );
        let mut add_affected = SqlText::new("UPDATE ");
        add_affected.table(&summary).push(
            " SET affected_count = affected_count + $2, updated_at = pg_catalog.clock_timestamp() WHERE summary_id = $1",
        );
        let mut finish_summary = SqlText::new("UPDATE ");
        finish_summary.table(&summary).push(
            " SET affected_count = $2, held_count = $3, skipped_count = $4, null_anchor_count = $5, \
               error = $6, kept_by_legal_min_count = $7, kept_by_policy_count = $8, \
               updated_at = pg_catalog.clock_timestamp() WHERE summary_id = $1",
        );
        let mut insert_details = SqlText::new("INSERT INTO ");
        insert_details.table(&detail).push(
            " (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) \
             SELECT $1, $2, $3, r, $4, $5 FROM pg_catalog.unnest($6::text[]) AS r",
        );
        let hold = CohortTable::Hold.qualified(schema);
        let mut insert_hold = SqlText::new("INSERT INTO ");
        insert_hold
            .table(&hold)
            .push(
                " (hold_id, retention_entity_id, record_id, tenant_id, reason, created_at, expires_at) \
                 SELECT $1, $2, $3, $4, $5, $6, $7 \
                 WHERE $7::timestamptz IS NULL OR $7::timestamptz > pg_catalog.now() RETURNING",
            )
            .push(HOLD_COLUMNS);
        let mut list_holds = SqlText::new("SELECT");
        list_holds
            .push(HOLD_COLUMNS)
            .push(" FROM ")
            .table(&hold)
            .push(
                " WHERE ($1::uuid IS NULL OR retention_entity_id = $1) \
               AND ($2::text IS NULL OR tenant_id = $2) \
               AND (NOT $3 OR ((released_at IS NULL OR released_at > pg_catalog.now()) \
                    AND (expires_at IS NULL OR expires_at > pg_catalog.now()))) \
             ORDER BY created_at, hold_id",
            );
        let mut release_hold = SqlText::new("UPDATE ");
        release_hold
            .table(&hold)
            .push(
                " SET released_at = pg_catalog.now() WHERE hold_id = $1 \
                 AND (released_at IS NULL OR released_at > pg_catalog.now()) RETURNING",
            )
            .push(HOLD_COLUMNS);
        let mut get_hold = SqlText::new("SELECT");
        get_hold
            .push(HOLD_COLUMNS)
            .push(" FROM ")
            .table(&hold)
            .push(" WHERE hold_id = $1");
        let mut held_records = SqlText::new("SELECT DISTINCT record_id FROM ");
        held_records.table(&hold).push(
            " WHERE retention_entity_id = $1 AND record_id = ANY($2::text[]) \
               AND (released_at IS NULL OR released_at > pg_catalog.now()) \
               AND (expires_at IS NULL OR expires_at > pg_catalog.now()) ORDER BY record_id",
        );
        LedgerPlan {
            held_records,
            insert_hold,
            list_holds,
            release_hold,
            get_hold,
            insert_run,
            settle_run,
            insert_summary,
            add_affected,
            finish_summary,
            insert_details,
        }
    }
}

/// Erasure statements for one entity, strategy and set of subject columns,
/// built per request (they depend on which subject columns apply).
///
/// Parameters of `lock` and `counts`: `$1` entity id, `$2` limit (unused by
/// `counts`), then the [`ErasureParams`] from `$3`. `mutate` binds the same
/// values after its own (`$1` entity id, `$2` keys, literals, custom).
#[derive(Debug, Clone)]
pub(crate) struct ErasurePlan {
    /// Lock candidates, waiting for locked rows (`FOR UPDATE`): a row whose
    /// subject or tenant changed while we waited no longer matches.
    pub(crate) lock: SqlText,
    /// Mutate with subject, tenant, legal minimum, anchor and hold re-checked.
    pub(crate) mutate: SqlText,
    /// `eligible`, `held` and (with a legal minimum) `null_anchor` among the
    /// subject's rows in the tenant.
    pub(crate) counts: SqlText,
}

/// Positions of the erasure's values: tenant (if tenant-scoped), the
/// legal-minimum cutoff (if any), then one value per subject column.
#[derive(Debug, Clone, Copy)]
struct ErasureParams {
    tenant: Option<usize>,
    cutoff: Option<usize>,
    subjects: usize,
}

impl ErasureParams {
    fn from(first: usize, tenanted: bool, with_cutoff: bool) -> Self {
        let mut n = first;
        let mut next = |on: bool| {
            on.then(|| {
                n += 1;
                n - 1
            })
        };
        let tenant = next(tenanted);
        let cutoff = next(with_cutoff);
        Self {
            tenant,
            cutoff,
            subjects: n,
        }
    }

    fn tenant_and_subjects(
        &self,
        e: &EntityDescriptor,
        casts: &Casts,
        subjects: &[String],
    ) -> SqlText {
        let mut s = SqlText::default();
        if let (Some(t), Some(p)) = (&e.tenant, self.tenant) {
            s.push(" AND ").col(t).push(" = ");
            casts.param(&mut s, t, p);
        }
        s.push(" AND (");
        for (i, column) in subjects.iter().enumerate() {
            if i > 0 {
                s.push(" OR ");
            }
            s.col(column).push(" = ");
            casts.param(&mut s, column, self.subjects + i);
        }
        s.push(")");
        s
    }

    fn anchor(&self, e: &EntityDescriptor) -> SqlText {
        let mut s = SqlText::default();
        if let Some(p) = self.cutoff {
            s.push(" AND ").col(&e.anchor).push(" < ").param(p);
        }
        s
    }
}

impl ErasurePlan {
    pub(crate) fn build(
        e: &EntityDescriptor,
        plan: &EntityPlan,
        strategy: Strategy,
        casts: &Casts,
        subjects: &[String],
        with_cutoff: bool,
        cohort_schema: &str,
    ) -> Self {
        let table = &e.table;
        let held = hold_exists(e, cohort_schema);
        let done = not_done(e, strategy);
        let blocked = blocked(strategy, plan.referenced.as_ref());
        let p = ErasureParams::from(3, e.tenant.is_some(), with_cutoff);

        let mut lock = SqlText::new("SELECT ");
        casts.select(&mut lock, &e.record_id);
        lock.push(" FROM ")
            .table(table)
            .push(" t WHERE TRUE")
            .append(&p.tenant_and_subjects(e, casts, subjects))
            .append(&p.anchor(e))
            .append(&done)
            .append(&blocked.unblocked)
            .push(" AND NOT ")
            .append(&held)
            .push(" ORDER BY ")
            .col(&e.record_id)
            .push(" LIMIT $2 FOR UPDATE");

        // Exempt entities are only counted: no mutation statement.
        let mut mutate = SqlText::default();
        if let Some(head) = plan.mutate_head.get(&strategy) {
            let m = ErasureParams::from(
                3 + plan.params_after_keys(strategy),
                e.tenant.is_some(),
                with_cutoff,
            );
            mutate = head.clone();
            mutate
                .append(&m.tenant_and_subjects(e, casts, subjects))
                .append(&m.anchor(e))
                .push(" RETURNING ")
                .col(&e.record_id)
                .push("::text");
        }

        let anchor_ok = p.anchor(e);
        let mut counts = SqlText::new("SELECT count(*) FILTER (WHERE NOT ");
        counts
            .append(&held)
            .append(&anchor_ok)
            .append(&blocked.unblocked)
            .push(") AS eligible, ");
        match (strategy, &plan.referenced) {
            (Strategy::Purge, Some(r)) => {
                counts
                    .push("count(*) FILTER (WHERE NOT ")
                    .append(&held)
                    .append(&anchor_ok)
                    .push(" AND ")
                    .append(r)
                    .push(") AS skipped, ");
            }
            _ => {
                counts.push("0::int8 AS skipped, ");
            }
        }
        counts
            .push("count(*) FILTER (WHERE ")
            .append(&held)
            .append(&anchor_ok)
            .push(") AS held, ");
        if let Some(cutoff) = p.cutoff {
            counts
                .push("count(*) FILTER (WHERE ")
                .col(&e.anchor)
                .push(" IS NULL) AS null_anchor, count(*) FILTER (WHERE ")
                .col(&e.anchor)
                .push(" >= ")
                .param(cutoff)
                .push(") AS kept_by_legal_min");
        } else {
            counts.push("0::int8 AS null_anchor, 0::int8 AS kept_by_legal_min");
        }
        counts
            .push(" FROM ")
            .table(table)
            .push(" t WHERE $2::int8 IS NOT NULL")
            .append(&p.tenant_and_subjects(e, casts, subjects))
            .append(&done);
        ErasurePlan {
            lock,
            mutate,
            counts,
        }
    }
}
