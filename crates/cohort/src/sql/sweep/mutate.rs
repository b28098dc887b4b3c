//! How a sweep changes its locked rows: the mutation of each strategy
//! (delete, soft delete, anonymise, archive's move), with every re-check,
//! in the forms a batch needs (returning the keys, the count only,
//! writing the row details itself), and the one-statement batch built on
//! it ([`super::fused`]).

use super::archive::{archive_insert, archive_returning, archive_statements};
use super::fused;
use super::shape::Shape;
use super::slots::{FusedSlots, MutationSlots, Own};
use super::values::{anonymised_values, per_row_values, Values};
use crate::base::ident::SqlText;
use crate::domain::rules::Strategy;
use crate::sql::fragments::Blocked;

/// One strategy's mutations of locked rows.
pub(super) struct Mutations {
    /// Returns `record::text` of each changed row.
    pub(super) keys: SqlText,
    /// Returns nothing: for batches that need only the count.
    pub(super) count: SqlText,
    /// Writes one row detail per changed row in the same statement.
    pub(super) audited: SqlText,
    /// Without cutoff, tenant and RETURNING, rows by key: erasure adds
    /// its own re-checks.
    pub(super) head: SqlText,
    /// Whether the rows are bound by address (`$2`) instead of by key.
    pub(super) by_address: bool,
    /// The batch as one statement, where it can be (see [`super::fused`]).
    pub(super) fused: Option<fused::Fused>,
}

/// What a strategy's mutation is built from.
struct Mutation<'s, 'a> {
    s: &'s Shape<'a>,
    plan: &'s Values,
    strategy: Strategy,
    done: &'s SqlText,
    blocked: &'s Blocked,
}

impl Mutation<'_, '_> {
    /// The mutation without its cutoff and tenant re-checks: `key_match`
    /// picks the rows; `own` is where the strategy's own values bind
    /// (anonymise's literals, the run's `now` for the marker);
    /// `recheck_held`: whether the hold check is repeated (not in a fused
    /// statement, whose snapshot is its candidates').
    fn body(&self, key_match: &SqlText, own: &Own, recheck_held: bool) -> SqlText {
        let e = self.s.e;
        let table = &e.table;
        let mark = own.mark;
        let mut m = SqlText::default();
        match self.strategy {
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
                        .param(mark.expect("a soft delete marks its rows"))
                        .push("::timestamptz");
                }
                m.push(" WHERE ").append(key_match);
            }
            Strategy::Anonymise => {
                m.push("UPDATE ").table(table).push(" t SET ");
                for (i, (column, value)) in
                    anonymised_values(e, own.literals).into_iter().enumerate()
                {
                    if i > 0 {
                        m.push(", ");
                    }
                    m.ident(column).push(" = ").append(&value);
                }
                m.push(", ")
                    .ident(e.anonymised_at.as_deref().expect("validated"))
                    .push(" = ")
                    .param(mark.expect("an anonymisation marks its rows"))
                    .push("::timestamptz");
                if self.plan.custom.is_empty() {
                    m.push(" WHERE ").append(key_match);
                } else {
                    // The values computed in Rust come with their keys,
                    // which pick the rows.
                    m.push(" FROM ")
                        .append(&per_row_values(e, self.s.casts, own.per_row_join()))
                        .push(" WHERE ")
                        .append(&self.s.casts.key_matches_v(e));
                }
            }
            Strategy::Exempt => unreachable!("exempt does not mutate"),
        }
        // The re-check in a new snapshot also sees holds and references
        // committed while the batch was being locked.
        m.append(self.done).append(&self.blocked.unblocked);
        if recheck_held {
            m.push(" AND NOT ").append(&self.s.held);
        }
        m
    }
}

/// A mutating strategy's statements, bound as [`MutationSlots`]: `$1`
/// entity id, the rows (keys, or addresses `by_address`), the strategy's
/// own values, then the cutoff, tenant and floor; `audited` binds the run
/// id, entity name, tenant text and action after them.
pub(super) fn mutations(
    s: &Shape<'_>,
    plan: &Values,
    strategy: Strategy,
    (done, blocked): (&SqlText, &Blocked),
    candidates: &SqlText,
    plain_table: bool,
) -> Mutations {
    let e = s.e;
    let casts = s.casts;
    let at = MutationSlots::of(s.scoped(), plan, strategy);
    let m = Mutation {
        s,
        plan,
        strategy,
        done,
        blocked,
    };
    let addressed = plain_table && !plan.computes_per_row(strategy);
    let by_key = casts.key_any(e, at.rows);
    let head = m.body(&by_key, &at.own, true);
    // A sweep's rows by address, read where they lie instead of through
    // the key index (see `SweepStatements::by_address`).
    let sweep_match = if addressed {
        at_addresses(at.rows)
    } else {
        by_key
    };
    let mut keys = m.body(&sweep_match, &at.own, true);
    // A sweep's mutation re-checks what the candidate query chose by
    // (cutoff and tenant) besides the keys, so no key collision,
    // concurrent update or planner surprise reaches another row.
    keys.push(" AND ")
        .col(&e.anchor)
        .push(" < ")
        .param(at.cutoff)
        .append(&s.filter(&at.filter));
    // One statement per batch where nothing is read into the process and
    // no restricting reference can appear after the snapshot.
    let fused = (addressed && !(strategy.deletes() && s.referenced.is_some()))
        .then(|| fused_batch(&m, candidates));
    if strategy == Strategy::Archive {
        let statements = archive_statements(e, casts, &keys, &at, s.cohort_schema);
        return Mutations {
            keys: statements.keys,
            count: statements.count,
            audited: statements.audited,
            head,
            by_address: addressed,
            fused,
        };
    }
    let count = keys.clone();
    let mut audited = SqlText::new("WITH m AS (");
    audited
        .append(&keys)
        .push(" RETURNING ")
        .append(&casts.key_text(e))
        .push(" AS r) INSERT INTO ")
        .table(&crate::sql::tables::CohortTable::RowDetail.qualified(s.cohort_schema))
        .push(" (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) SELECT ")
        .param(at.audit.run)
        .push(", $1, ")
        .param(at.audit.entity)
        .push(", m.r, ")
        .param(at.audit.tenant)
        .push(", ")
        .param(at.audit.action)
        .push(" FROM m RETURNING row_detail_id, record_id");
    keys.push(" RETURNING ").append(&casts.key_text(e));
    Mutations {
        keys,
        count,
        audited,
        head,
        by_address: addressed,
        fused,
    }
}

/// The batch as one statement (see [`super::fused`]): only without
/// values computed in Rust, so the strategy's own values are its
/// literals (and archive's run id), then the run's `now` for the marker.
fn fused_batch(m: &Mutation<'_, '_>, candidates: &SqlText) -> fused::Fused {
    let s = m.s;
    let e = s.e;
    let archive = m.strategy == Strategy::Archive;
    // The counted and audited forms number alike up to the audit's values.
    let [count, audited] = [false, true].map(|a| FusedSlots::of(s.scoped(), m.plan, m.strategy, a));
    let mut mutation = m.body(
        &SqlText::new(fused::LOCKED_UNLESS_RECENT),
        &count.own,
        false,
    );
    mutation
        .push(" AND ")
        .col(&e.anchor)
        .push(" < ")
        .param(count.lock.cutoff)
        .append(&s.filter(&count.lock.filter));
    let returning = if archive {
        archive_returning(e, s.casts)
    } else {
        let mut r = SqlText::default();
        if s.casts.composite() {
            r.append(&s.casts.key_text(e)).push(" AS cohort_key");
        } else {
            r.col(&e.record_id);
        }
        r
    };
    let parts = fused::Parts {
        e,
        casts: s.casts,
        cohort_schema: s.cohort_schema,
        candidates,
        held: &s.held,
        slots: (count, audited),
        mutation,
        count_returning: (s.casts.composite() && !archive).then(|| SqlText::new("1 AS cohort_key")),
        returning,
        archive_insert: archive.then(|| archive_insert(e, s.casts, &count.own)),
    };
    fused::build(&parts)
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
