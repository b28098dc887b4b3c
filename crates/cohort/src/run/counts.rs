//! Counting an entity's rows: what is eligible, held, skipped or kept, in
//! a preview and after a run, through the active holds' keys when they can
//! be bound.

use sqlx::PgConnection;

use super::work::Work;
use super::EntityOutcome;
use crate::context::Prepared;
use crate::domain::model::EntityDescriptor;
use crate::sql::ledger;
use crate::sql::{BoundHolds, CountsRow};

pub(crate) struct Counts {
    pub(crate) eligible: u64,
    pub(crate) held: u64,
    /// Of `held`, the rows a subject hold protects.
    pub(crate) held_by_subject: u64,
    pub(crate) null_anchor: u64,
    /// Past the cutoff, not held, but still referenced by other rows
    /// through a NO ACTION / RESTRICT foreign key (purge leaves them).
    pub(crate) skipped: u64,
    /// Kept because the legal minimum has not passed: an erasure's rows
    /// of the subject, a sweep's rows past the period but not past the
    /// legal minimum.
    pub(crate) kept_by_legal_min: u64,
    /// The anchor of the oldest row an erasure's legal minimum keeps
    /// (only an erasure's counts measure it).
    pub(crate) legal_min_oldest: Option<chrono::DateTime<chrono::Utc>>,
    /// Whether `eligible` was measured (false: the statement after a run
    /// that drained its candidates, which takes it as 0).
    pub(crate) eligible_measured: bool,
}

/// The anchor of the oldest row of `work` still eligible (`None`: none is,
/// or the work has no backlog statement), read in the counts' transaction
/// settings.
pub(super) async fn oldest_eligible(
    conn: &mut PgConnection,
    work: &Work<'_>,
) -> std::result::Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error> {
    let Some(q) = work.statements.backlog_query(work.entity.id, &work.scope) else {
        return Ok(None);
    };
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::BATCH_BEGIN).await?;
    let row = q.fetch_optional(&mut *tx).await?;
    tx.commit().await?;
    Ok(row.and_then(|r| r.oldest))
}

pub(crate) async fn counts(
    conn: &mut PgConnection,
    work: &Work<'_>,
) -> std::result::Result<Counts, sqlx::Error> {
    let q = work.statements.counts_query(work.entity.id, &work.scope);
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::BATCH_BEGIN).await?;
    let row = q.fetch_one(&mut *tx).await?;
    let mut c = Counts::from(row);
    if let Some(kept) = kept_by_legal_min(&mut tx, work).await? {
        c.kept_by_legal_min = kept;
    }
    tx.commit().await?;
    Ok(c)
}

/// The rows of a sweep's `work` a legal minimum keeps past its period
/// (`None`: the work has no such rows to count, no minimum or one shorter
/// than the period, or it is an erasure, whose counts have their own).
async fn kept_by_legal_min(
    conn: &mut PgConnection,
    work: &Work<'_>,
) -> std::result::Result<Option<u64>, sqlx::Error> {
    let Some(period_cutoff) = work.period_cutoff else {
        return Ok(None);
    };
    let Some(q) =
        work.statements
            .kept_by_legal_min_query(work.entity.id, &work.scope, period_cutoff)
    else {
        return Ok(None);
    };
    let row = q.fetch_one(conn).await?;
    Ok(Some(CountsRow::count(row.kept_by_legal_min)))
}

/// The most active holds of one entity whose keys are bound into one
/// statement; with more, the counts read the rows past the cutoff instead.
pub(super) const MAX_BOUND_HOLDS: i64 = 100_000;

/// An entity's active holds as values its statements can bind: the
/// record holds' keys, parsed in the record key's type, and per subject
/// column the subject holds of its kind (or of none) in the form and type
/// of the column. `None` when more than [`MAX_BOUND_HOLDS`] values would
/// be bound, or a record hold's id cannot be a key of this type (then
/// only a statement that checks every row gives the exact answer).
pub(crate) async fn active_hold_keys(
    conn: &mut PgConnection,
    ready: &Prepared,
    entity: &EntityDescriptor,
) -> std::result::Result<Option<BoundHolds>, sqlx::Error> {
    let wanted = ledger::ActiveHolds {
        entity_id: entity.id,
        limit: MAX_BOUND_HOLDS + 1,
    };
    let ids: Vec<String> = ready
        .ledger
        .active_holds(wanted)
        .query_scalar()
        .fetch_all(&mut *conn)
        .await?;
    if ids.len() as i64 > MAX_BOUND_HOLDS {
        return Ok(None);
    }
    let facts = &ready.model.facts[&entity.id];
    let Some(records) = ids.iter().map(|id| facts.record.parse(id).ok()).collect() else {
        return Ok(None);
    };
    let mut bound = BoundHolds {
        records,
        subjects: Vec::new(),
    };
    if entity.subjects.is_empty() {
        return Ok(Some(bound));
    }
    let rows = ready
        .ledger
        .active_subject_holds(MAX_BOUND_HOLDS + 1)
        .query_as::<ledger::SubjectHoldRow>()
        .fetch_all(&mut *conn)
        .await?;
    if rows.len() as i64 > MAX_BOUND_HOLDS {
        return Ok(None);
    }
    for column in &entity.subjects {
        let ty = facts.subjects[&column.column];
        let form = ty.subject_form();
        let mut values = Vec::new();
        for row in &rows {
            let kind = &row.subject_kind;
            if column.kind.is_some() && kind.is_some() && &column.kind != kind {
                continue;
            }
            // A form out of this column's range (a bigint for an integer
            // column) names no row of it.
            if let Some(value) = row.form(form).and_then(|t| ty.parse(t).ok()) {
                values.push(value);
            }
        }
        values.sort();
        values.dedup();
        bound.subjects.push((ty, values));
    }
    if bound.len() as i64 > MAX_BOUND_HOLDS {
        return Ok(None);
    }
    Ok(Some(bound))
}

/// The counts after a real run that drained its candidates: through the
/// active holds' keys and subjects when they can be bound (then
/// `eligible` is not measured, and `Counts::eligible_measured` is false),
/// else by reading the rows past the cutoff.
pub(super) async fn counts_after_run(
    conn: &mut PgConnection,
    ready: &Prepared,
    work: &Work<'_>,
) -> std::result::Result<Counts, sqlx::Error> {
    if work.statements.counts_after.is_none() {
        return counts(conn, work).await;
    }
    let Some(holds) = active_hold_keys(conn, ready, work.entity).await? else {
        return counts(conn, work).await;
    };
    let key_type = ready.model.facts[&work.entity.id].record;
    let q = work
        .statements
        .counts_after_query(work.entity.id, &work.scope, &holds, key_type)
        .expect("checked above");
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::BATCH_BEGIN).await?;
    let row = q.fetch_one(&mut *tx).await?;
    let mut c = Counts::from(row);
    if let Some(kept) = kept_by_legal_min(&mut tx, work).await? {
        c.kept_by_legal_min = kept;
    }
    tx.commit().await?;
    c.eligible_measured = false;
    Ok(c)
}

impl From<CountsRow> for Counts {
    fn from(row: CountsRow) -> Self {
        Counts {
            eligible: CountsRow::count(row.eligible),
            held: CountsRow::count(row.held),
            held_by_subject: CountsRow::count(row.held_by_subject),
            null_anchor: CountsRow::count(row.null_anchor),
            skipped: CountsRow::count(row.skipped),
            kept_by_legal_min: CountsRow::count(row.kept_by_legal_min),
            legal_min_oldest: row.legal_min_oldest,
            eligible_measured: true,
        }
    }
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
        kept_by_legal_min_until: None,
        kept_by_policy: 0,
        cutoff: work.cutoff,
        period: work.rule.period(),
        legal_min: work.rule.legal_min(),
        stage: work.stage,
        batch_size: None,
        note: None,
        table: None,
        throttled_ms: None,
        lag_waited_ms: None,
        paused: false,
        pacing_notes: Vec::new(),
        partition_notes: Vec::new(),
    }
}

/// The note of an entity that skipped rows some of which are kept for
/// good: referenced from a table whose rows Cohort never deletes
/// (`TableFacts::kept_by_references`). `None` when it skipped none, or
/// nothing keeps them for good.
pub(crate) fn kept_for_good(ready: &Prepared, work: &Work<'_>, skipped: u64) -> Option<String> {
    let tables = &ready.model.facts.get(&work.entity.id)?.kept_by_references;
    if skipped == 0 || tables.is_empty() || !work.rule.strategy().deletes() {
        return None;
    }
    Some(format!(
        "{skipped} rows skipped; those referenced from {} stay: Cohort never deletes the referencing rows, so they are skipped on every run. Classify the referencing table with a category that purges, or accept that they are kept",
        tables.join(", ")
    ))
}
