//! Counting an entity's rows: what is eligible, held, skipped or kept, in
//! a preview and after a run, through the active holds' keys when they can
//! be bound.

use sqlx::{PgConnection, Row};

use super::work::{bind_all, Work};
use super::EntityOutcome;
use crate::context::Prepared;
use crate::model::EntityDescriptor;
use crate::sql::ledger;
use crate::sql::{bind_array, KeyValue};

pub(crate) struct Counts {
    pub(crate) eligible: u64,
    pub(crate) held: u64,
    /// Of `held`, the rows a subject hold protects.
    pub(crate) held_by_subject: u64,
    pub(crate) null_anchor: u64,
    /// Past the cutoff, not held, but still referenced by other rows
    /// through a NO ACTION / RESTRICT foreign key (purge leaves them).
    pub(crate) skipped: u64,
    /// Erasure: kept because the legal minimum has not passed.
    pub(crate) kept_by_legal_min: u64,
    /// Whether `eligible` was measured (false: the statement after a run
    /// that drained its candidates, which takes it as 0).
    pub(crate) eligible_measured: bool,
}

pub(crate) async fn counts(
    conn: &mut PgConnection,
    work: &Work<'_>,
) -> std::result::Result<Counts, sqlx::Error> {
    let q = bind_all(
        sqlx::query(work.counts.sql()).bind(work.entity.id),
        &work.count_args,
    );
    read_counts(q.fetch_one(conn).await?)
}

/// The most active holds of one entity whose keys are bound into one
/// statement; with more, the counts read the rows past the cutoff instead.
pub(super) const MAX_BOUND_HOLDS: i64 = 10_000;

/// The keys of an entity's active holds, parsed in the record key's type;
/// `None` when there are more than [`MAX_BOUND_HOLDS`], when one cannot be
/// a key of this type, or when the entity has subject columns and a
/// subject hold is active (then only a statement that checks every row
/// gives the exact answer).
pub(crate) async fn active_hold_keys(
    conn: &mut PgConnection,
    ready: &Prepared,
    entity: &EntityDescriptor,
) -> std::result::Result<Option<Vec<KeyValue>>, sqlx::Error> {
    if !entity.subjects.is_empty() {
        let any: bool = ready
            .ledger
            .any_subject_hold()
            .query_scalar()
            .fetch_one(&mut *conn)
            .await?;
        if any {
            return Ok(None);
        }
    }
    let wanted = ledger::ActiveHolds {
        entity_id: entity.id,
        limit: MAX_BOUND_HOLDS + 1,
    };
    let ids: Vec<String> = ready
        .ledger
        .active_holds(wanted)
        .query_scalar()
        .fetch_all(conn)
        .await?;
    if ids.len() as i64 > MAX_BOUND_HOLDS {
        return Ok(None);
    }
    let key_type = ready.model.facts[&entity.id].record;
    Ok(ids.iter().map(|id| key_type.parse(id).ok()).collect())
}

/// The counts after a real run that drained its candidates: through the
/// active holds' keys when they can be bound (then `eligible` is not
/// measured, and `Counts::eligible_measured` is false), else by reading
/// the rows past the cutoff.
pub(super) async fn counts_after_run(
    conn: &mut PgConnection,
    ready: &Prepared,
    work: &Work<'_>,
) -> std::result::Result<Counts, sqlx::Error> {
    let Some(after) = &work.counts_after else {
        return counts(conn, work).await;
    };
    let Some(keys) = active_hold_keys(conn, ready, work.entity).await? else {
        return counts(conn, work).await;
    };
    let key_type = ready.model.facts[&work.entity.id].record;
    let q = bind_all(
        sqlx::query(after.sql()).bind(work.entity.id),
        &work.count_args,
    );
    let mut c = read_counts(bind_array(q, key_type, &keys).fetch_one(conn).await?)?;
    c.eligible_measured = false;
    Ok(c)
}

pub(super) fn read_counts(row: sqlx::postgres::PgRow) -> std::result::Result<Counts, sqlx::Error> {
    let n = |name: &str| -> std::result::Result<u64, sqlx::Error> {
        Ok(row.try_get::<i64, _>(name)?.max(0) as u64)
    };
    Ok(Counts {
        eligible: n("eligible")?,
        held: n("held")?,
        held_by_subject: n("held_by_subject")?,
        null_anchor: n("null_anchor")?,
        skipped: n("skipped")?,
        kept_by_legal_min: n("kept_by_legal_min")?,
        eligible_measured: true,
    })
}

pub(crate) fn outcome(work: &Work<'_>) -> EntityOutcome {
    let e = work.entity;
    EntityOutcome {
        entity_id: e.id,
        entity: e.name.clone(),
        category: e.category.clone(),
        strategy: work.rule.strategy(),
        affected: 0,
        held: 0,
        held_by_subject: 0,
        skipped: 0,
        null_anchor: 0,
        kept_by_legal_min: 0,
        kept_by_policy: 0,
        cutoff: work.cutoff,
        period: work.rule.period(),
        legal_min: work.rule.legal_min(),
    }
}
