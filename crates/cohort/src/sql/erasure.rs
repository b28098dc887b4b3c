//! Erasure statements, built per request from an entity's plan.

use super::fragments::{blocked, not_done, Blocked, Casts};
use super::statement::Numbering;
use super::sweep::after_head;
use super::EntityPlan;
use crate::base::ident::SqlText;
use crate::domain::model::EntityDescriptor;
use crate::domain::rules::Strategy;

/// Erasure statements for one entity, strategy and set of subject columns,
/// built per request (they depend on which subject columns apply).
///
/// Parameters of `lock` and `counts`: `$1` entity id, `$2` limit (unused by
/// `counts`), then the [`ErasureParams`] (`lock_after`: then the cursor).
/// `mutate` binds the same values after its own (`$1` entity id, `$2`
/// keys, the strategy's values), each numbered where it is declared.
#[derive(Debug, Clone)]
pub(crate) struct ErasurePlan {
    /// Lock candidates, waiting for locked rows (`FOR UPDATE`): a row whose
    /// subject or tenant changed while we waited no longer matches.
    pub(crate) lock: SqlText,
    /// `lock` after a cursor, the previous batch's last key (bound after
    /// the values), so no batch picks a row an earlier one passed over.
    pub(crate) lock_after: SqlText,
    /// Mutate with subject, tenant, legal minimum, anchor and hold re-checked.
    pub(crate) mutate: SqlText,
    /// `eligible`, `held` and (with a legal minimum) `null_anchor` among the
    /// subject's rows in the tenant.
    pub(crate) counts: SqlText,
}

/// Positions of the erasure's values: tenant (if tenant-scoped), the
/// legal-minimum cutoff (if any), one value per subject column, then a
/// lock's cursor.
#[derive(Debug, Clone, Copy)]
struct ErasureParams {
    tenant: Option<usize>,
    cutoff: Option<usize>,
    /// The first subject column's value.
    subjects: usize,
    /// The previous batch's last key (`lock_after` only).
    cursor: usize,
}

impl ErasureParams {
    /// The values numbered from where `n` stands, for `subjects` subject
    /// columns.
    fn numbered(n: &mut Numbering, tenanted: bool, with_cutoff: bool, subjects: usize) -> Self {
        let tenant = n.next_if(tenanted);
        let cutoff = n.next_if(with_cutoff);
        let subjects = n.many(subjects);
        Self {
            tenant,
            cutoff,
            subjects,
            cursor: n.next(),
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
    /// The statements an erasure's batch loop runs: its rows are few and
    /// found by key, on the run's connection (no ranges, no addresses, no
    /// fused batch).
    pub(crate) fn into_statements(self) -> super::SweepStatements {
        super::SweepStatements {
            lock: self.lock,
            lock_after: Some(self.lock_after),
            mutate: self.mutate,
            counts: self.counts,
            ..Default::default()
        }
    }

    pub(crate) fn build(
        e: &EntityDescriptor,
        plan: &EntityPlan,
        strategy: Strategy,
        casts: &Casts,
        subjects: &[String],
        with_cutoff: bool,
    ) -> Self {
        let done = not_done(e, strategy);
        let blocked = blocked(strategy, plan.referenced.as_ref());
        let mut n = Numbering::default();
        n.next(); // the entity
        let limit = n.next();
        let parts = Parts {
            e,
            plan,
            strategy,
            casts,
            subjects,
            with_cutoff,
            done: &done,
            blocked: &blocked,
            limit,
            p: ErasureParams::numbered(&mut n, e.tenant.is_some(), with_cutoff, subjects.len()),
        };
        let (lock, lock_after) = locks(&parts);
        ErasurePlan {
            lock,
            lock_after,
            mutate: mutate(&parts),
            counts: counts(&parts),
        }
    }
}

/// What one request's erasure statements are built from.
#[derive(Clone, Copy)]
struct Parts<'a> {
    e: &'a EntityDescriptor,
    plan: &'a EntityPlan,
    strategy: Strategy,
    casts: &'a Casts,
    subjects: &'a [String],
    with_cutoff: bool,
    /// Rows the strategy has not done yet.
    done: &'a SqlText,
    /// Rows a restricting reference keeps.
    blocked: &'a Blocked,
    /// The lock statements' limit (bound, unread, by the counts too).
    limit: usize,
    /// The positions of the lock statements' and the counts' values.
    p: ErasureParams,
}

/// [`ErasurePlan::lock`] and [`ErasurePlan::lock_after`].
fn locks(r: &Parts<'_>) -> (SqlText, SqlText) {
    let Parts {
        e,
        plan,
        casts,
        subjects,
        done,
        blocked,
        limit,
        p,
        ..
    } = *r;
    let table = &e.table;
    let held = &plan.held;
    let lock = |after: Option<usize>| {
        let mut lock = SqlText::new("SELECT ");
        casts.key_select(&mut lock, e);
        lock.push(" FROM ")
            .table(table)
            .push(" t WHERE TRUE")
            .append(&p.tenant_and_subjects(e, casts, subjects))
            .append(&p.anchor(e))
            .append(done)
            .append(&blocked.unblocked);
        if let Some(n) = after {
            lock.push(" AND ").append(&casts.key_after(e, n));
        }
        lock.push(" AND NOT ")
            .append(held)
            .push(" ORDER BY ")
            .append(&casts.key_columns(e))
            .push(" LIMIT ")
            .param(limit)
            .push(" FOR UPDATE");
        lock
    };
    let (lock, lock_after) = (lock(None), lock(Some(p.cursor)));

    (lock, lock_after)
}

/// [`ErasurePlan::mutate`]: the strategy's mutation by key with the
/// request's re-checks (empty for an exempt entity: only counted).
fn mutate(r: &Parts<'_>) -> SqlText {
    let Parts {
        e,
        plan,
        strategy,
        casts,
        subjects,
        with_cutoff,
        ..
    } = *r;
    // Exempt entities are only counted: no mutation statement.
    let mut mutate = SqlText::default();
    if let Some(head) = plan
        .statements(strategy)
        .and_then(|s| s.mutate_head.as_ref())
    {
        let m = ErasureParams::numbered(
            &mut after_head(&plan.values, strategy),
            e.tenant.is_some(),
            with_cutoff,
            subjects.len(),
        );
        mutate = head.clone();
        mutate
            .append(&m.tenant_and_subjects(e, casts, subjects))
            .append(&m.anchor(e))
            .push(" RETURNING ")
            .append(&casts.key_text(e));
    }

    mutate
}

/// [`ErasurePlan::counts`].
fn counts(r: &Parts<'_>) -> SqlText {
    let Parts {
        e,
        plan,
        strategy,
        casts,
        subjects,
        done,
        blocked,
        p,
        ..
    } = *r;
    let table = &e.table;
    let held = &plan.held;
    let anchor_ok = p.anchor(e);
    let mut counts = SqlText::new("SELECT pg_catalog.count(*) FILTER (WHERE NOT ");
    counts
        .append(held)
        .append(&anchor_ok)
        .append(&blocked.unblocked)
        .push(") AS eligible, ");
    match (strategy, &plan.referenced) {
        (Strategy::Purge, Some(r)) => {
            counts
                .push("pg_catalog.count(*) FILTER (WHERE NOT ")
                .append(held)
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
        .push("pg_catalog.count(*) FILTER (WHERE ")
        .append(held)
        .append(&anchor_ok)
        .push(") AS held, ");
    match &plan.subject_held {
        Some(subject) => {
            counts
                .push("pg_catalog.count(*) FILTER (WHERE ")
                .append(subject)
                .append(&anchor_ok)
                .push(") AS held_by_subject, ");
        }
        None => {
            counts.push("0::int8 AS held_by_subject, ");
        }
    }
    legal_min_counts(&mut counts, e, p.cutoff);
    counts
        .push(" FROM ")
        .table(table)
        .push(" t WHERE ")
        .param(r.limit)
        .push("::int8 IS NOT NULL")
        .append(&p.tenant_and_subjects(e, casts, subjects))
        .append(done);
    counts
}

/// The counts' last columns: rows with a NULL anchor, rows kept by the
/// legal minimum (`cutoff`) and the oldest of them; zeros without one.
fn legal_min_counts(counts: &mut SqlText, e: &EntityDescriptor, cutoff: Option<usize>) {
    if let Some(cutoff) = cutoff {
        counts
            .push("pg_catalog.count(*) FILTER (WHERE ")
            .col(&e.anchor)
            .push(" IS NULL) AS null_anchor, pg_catalog.count(*) FILTER (WHERE ")
            .col(&e.anchor)
            .push(" >= ")
            .param(cutoff)
            .push(") AS kept_by_legal_min, pg_catalog.min(")
            .col(&e.anchor)
            .push(") FILTER (WHERE ")
            .col(&e.anchor)
            .push(" >= ")
            .param(cutoff)
            .push(") AS legal_min_oldest");
    } else {
        counts.push(
            "0::int8 AS null_anchor, 0::int8 AS kept_by_legal_min, \
             NULL::timestamptz AS legal_min_oldest",
        );
    }
}
