//! The batch loop of one entity: lock a batch, capture it for handlers,
//! mutate it, audit it and queue its handler work in one transaction, then
//! the next, until a batch changes nothing or the run is cancelled.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::capture::{capture, custom_values, dead_letter_skipped_rows, enqueue};
use super::ctx::RunCtx;
use super::pacing::Gate;
use super::recorder::CommittedBatch;
use super::sizing::Sizer;
use super::work::{stop_from, Stop, Work};
use super::EntityOutcome;
use crate::config::{AUTO_BATCH_MAX, AUTO_BATCH_MAX_LOADED};
use crate::domain::model::AnonymiseContext;
use crate::domain::rules::AuditDetail;
use crate::domain::rules::Strategy;
use crate::sql::ledger;
use crate::sql::{Audit, Batch as Bounds, Change, Changed, Cursor, KeyValue, Rows};

/// How an entity's batch loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Progress {
    /// No candidate was left after the last batch.
    Drained,
    /// A batch changed nothing (its rows became held or changed, or every
    /// one of them was set aside by a failing `on_before`): the loop
    /// stopped there, and the rows behind it wait for the next run.
    Stalled,
    /// The entity was paused (`cohort pause`): the loop stopped before its
    /// next batch.
    Paused,
}

/// The share of an entity's candidates one connection sweeps: every
/// candidate ([`Lane::WHOLE`]), or one key range of a parallel sweep,
/// with what the ranges' connections share.
pub(super) struct Lane<'l> {
    /// The range starts after this (anchor, key), exclusive (`None`: at
    /// the first candidate).
    pub(super) after: Option<(DateTime<Utc>, KeyValue)>,
    /// The range ends at this (anchor, key), inclusive (`None`: at the last).
    pub(super) until: Option<(DateTime<Utc>, KeyValue)>,
    /// Set when another range failed: this one stops before its next
    /// batch (the batch it has open commits whole).
    pub(super) halt: Option<&'l AtomicBool>,
    /// The entity's rows changed so far by every range (the progress
    /// events' total).
    pub(super) total: Option<&'l AtomicU64>,
    /// The entity's pause and limits, shared by its lanes (`None` for
    /// work that is never paced).
    pub(super) throttle: Option<&'l super::pacing::Throttle>,
}

impl Lane<'static> {
    /// Every candidate, on one connection.
    pub(super) const WHOLE: Lane<'static> = Lane {
        after: None,
        until: None,
        halt: None,
        total: None,
        throttle: None,
    };
}

/// What stays the same for every batch of one entity's loop.
struct Loop<'l, 'w> {
    ctx: &'l RunCtx<'l>,
    work: &'l Work<'w>,
    lane: &'l Lane<'l>,
    plan: &'l crate::sql::EntityPlan,
    strategy: Strategy,
    key_type: crate::sql::KeyType,
    handlers: Option<&'l Vec<crate::domain::handlers::Registered>>,
    /// Handler work needs a detail row per mutated row to hang from;
    /// without either, only the count comes back.
    wants_ids: bool,
    /// What the strategy's mutation binds after its rows, for this run.
    change: Change,
}

impl<'l, 'w> Loop<'l, 'w> {
    /// The loop of `work` on `lane`.
    fn new(ctx: &'l RunCtx<'l>, work: &'l Work<'w>, lane: &'l Lane<'l>) -> Self {
        let e = work.entity;
        let handlers = ctx.cx.handlers.get(&e.id).filter(|h| !h.is_empty());
        let plan = &ctx.ready.plans[&e.id];
        Loop {
            ctx,
            work,
            lane,
            plan,
            strategy: work.rule.strategy(),
            key_type: ctx.ready.model.facts[&e.id].record,
            handlers,
            wants_ids: work.rule.audit() == AuditDetail::PerRow || handlers.is_some(),
            change: Change::of(
                work.rule.strategy(),
                &plan.values,
                ctx.run_id,
                work.literals.clone(),
                ctx.spec.now,
            ),
        }
    }

    /// `"auto"`: each batch's limit from the time of the ones before,
    /// smaller when the rows are read into the process.
    fn sizer(&self) -> Option<Sizer> {
        let loaded = self.handlers.is_some() || self.plan.values.computes_per_row(self.strategy);
        self.work.auto_batch.then(|| {
            Sizer::new(if loaded {
                AUTO_BATCH_MAX_LOADED
            } else {
                AUTO_BATCH_MAX
            })
        })
    }

    /// The row details the batch's statements write, when wanted.
    fn audit(&self) -> Option<Audit<'l>> {
        self.wants_ids.then(|| Audit {
            run_id: self.ctx.run_id,
            entity: &self.work.entity.name,
            tenant: self.ctx.spec.tenant.as_deref(),
            action: self.strategy.as_str(),
        })
    }
}

/// Runs the batches of one entity (or of one key range of it); rows set
/// aside by a failing `on_before` are counted in `out.skipped` as their
/// batch commits.
pub(super) async fn batches(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    summary_id: i64,
    out: &mut EntityOutcome,
    lane: &Lane<'_>,
) -> std::result::Result<Progress, Stop> {
    let l = Loop::new(ctx, work, lane);
    // Each batch continues after the previous one's last row, so no batch
    // walks again past the rows earlier ones finished (anonymised or
    // flagged rows stay in the anchor index range). Rows passed over
    // (locked by a concurrent sweep, held when re-checked, or set aside by
    // a failing `on_before`) are left to that sweep or the next run:
    // nothing about them is carried from batch to batch. A key range
    // starts after the previous range's last row.
    let mut cursor: Option<Cursor> = lane.after.clone().map(|(anchor, key)| (Some(anchor), key));
    let mut sizer = l.sizer();
    loop {
        if let Some(progress) = before_batch(ctx, lane, conn).await? {
            return Ok(progress);
        }
        let started = std::time::Instant::now();
        let limit = sizer
            .as_ref()
            .map_or(work.batch_size, |s| i64::from(s.limit()));
        match one_batch(&l, conn, summary_id, &mut cursor, limit).await? {
            Batch::Empty => return Ok(Progress::Drained),
            Batch::SetAside { left } => {
                out.skipped += left;
                return Ok(Progress::Stalled);
            }
            Batch::Committed(done) => {
                let changed = done.rows;
                if let Some(throttle) = lane.throttle {
                    throttle.after_batch(changed, started);
                }
                batch_done(&l, out, sizer.as_mut(), limit, done);
                if changed == 0 {
                    // Locked rows all became held or changed: no progress, stop here.
                    return Ok(Progress::Stalled);
                }
            }
        }
    }
}

/// What is asked between batches, never inside one: the run cancelled,
/// another range failed, the entity paused or paced. `Some` ends the
/// loop with that progress.
async fn before_batch(
    ctx: &RunCtx<'_>,
    lane: &Lane<'_>,
    conn: &mut PgConnection,
) -> std::result::Result<Option<Progress>, Stop> {
    if ctx.spec.cancel.is_cancelled() {
        return Err(Stop::Cancelled);
    }
    if lane.halt.is_some_and(|h| h.load(Ordering::SeqCst)) {
        // Another range failed; the entity reports its failure.
        return Ok(Some(Progress::Stalled));
    }
    let Some(throttle) = lane.throttle else {
        return Ok(None);
    };
    match throttle
        .before_batch(conn, &ctx.spec.cancel)
        .await
        .map_err(stop_from)?
    {
        Gate::Go => Ok(None),
        Gate::Paused => Ok(Some(Progress::Paused)),
        Gate::Cancelled => Err(Stop::Cancelled),
        Gate::Refused(why) => Err(Stop::Entity(crate::base::diagnostic::Diagnostic::capture(
            "pacing",
            Some("replica_lag_unreadable".into()),
            &why,
        ))),
    }
}

/// How one batch ended.
enum Batch {
    /// Nothing was left to lock (rolled back).
    Empty,
    /// Every locked row was set aside by a failing `on_before` (its dead
    /// letters committed).
    SetAside { left: u64 },
    /// The batch committed.
    Committed(Committed),
}

/// What a committed batch did: what feeds the batch sizer, the entity's
/// outcome, the metrics and the events, in one place ([`batch_done`]).
struct Committed {
    /// Rows changed.
    rows: u64,
    /// Rows locked (what the sizer measures by).
    locked: u64,
    /// Rows set aside by a failing `on_before`.
    left: u64,
    /// From the batch's start to its commit.
    took: std::time::Duration,
    /// The changed keys, when row details were written.
    per_row: Option<Vec<String>>,
}

/// A committed batch, told to everything that counts it.
fn batch_done(
    l: &Loop<'_, '_>,
    out: &mut EntityOutcome,
    sizer: Option<&mut Sizer>,
    limit: i64,
    done: Committed,
) {
    let ctx = l.ctx;
    let e = l.work.entity;
    if let Some(sizer) = sizer {
        sizer.observe(done.locked, done.took);
    }
    out.batch_size = out.batch_size.max(u32::try_from(limit).ok());
    out.affected += done.rows;
    out.skipped += done.left;
    let total = match l.lane.total {
        Some(all) => all.fetch_add(done.rows, Ordering::SeqCst) + done.rows,
        None => out.affected,
    };
    let batch = CommittedBatch {
        rows: done.rows,
        took: done.took,
        total,
        per_row: done.per_row,
    };
    ctx.recorder.batch_committed(e, l.strategy, batch);
}

/// One batch in its own transaction: lock, capture, mutate, audit, queue
/// handler work, count it on the summary row, commit.
async fn one_batch(
    l: &Loop<'_, '_>,
    conn: &mut PgConnection,
    summary_id: i64,
    cursor: &mut Option<Cursor>,
    limit: i64,
) -> std::result::Result<Batch, Stop> {
    let ctx = l.ctx;
    let cancel = &ctx.spec.cancel;
    let batch_clock = std::time::Instant::now();
    // Open for the whole batch (its lifetime is the batch's), never
    // entered across an await: events name it as their parent.
    let batch_span = tracing::debug_span!("cohort.batch", rows = tracing::field::Empty);
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::BATCH_BEGIN)
        .await
        .map_err(stop_from)?;
    let mut locked = lock_batch(l, &mut tx, cursor.as_ref(), limit, &batch_span).await?;
    if locked.keys.is_empty() {
        tx.rollback().await.map_err(stop_from)?;
        return Ok(Batch::Empty);
    }
    if let Some(next) = locked.next_cursor.take() {
        *cursor = Some(next);
    }
    let BatchRows {
        captured,
        left,
        custom,
    } = prepare(l, &mut tx, &mut locked).await?;
    if cancel.is_cancelled() {
        tx.rollback().await.map_err(stop_from)?;
        return Err(Stop::Cancelled);
    }
    if locked.keys.is_empty() {
        // Every locked row was set aside: the batch made no progress,
        // which ends the loop (the rows behind it wait for the next
        // run). Its dead letters commit.
        tx.commit().await.map_err(stop_from)?;
        tracing::warn!(parent: &batch_span, skipped = left, "{EVERY_ROW_SET_ASIDE}");
        return Ok(Batch::SetAside { left });
    }
    let changed = if locked.complete {
        // The fused statement changed every locked row.
        Changed::default()
    } else {
        mutate(l, &mut tx, &locked.keys, &mut locked.addresses, custom).await?
    };
    if !only_locked(l, &locked, &changed.keys, changed.rows) {
        tx.rollback().await.map_err(stop_from)?;
        return Err(unlocked_row_changed());
    }
    let (n, changed) =
        record_batch(l, &mut tx, summary_id, &captured, &mut locked, changed).await?;
    if cancel.is_cancelled() {
        tx.rollback().await.map_err(stop_from)?;
        return Err(Stop::Cancelled);
    }
    tx.commit().await.map_err(stop_from)?;
    batch_span.record("rows", n);
    let took = batch_clock.elapsed();
    tracing::debug!(parent: &batch_span, duration_ms = took.as_millis() as u64, "batch committed");
    Ok(Batch::Committed(Committed {
        rows: n,
        locked: locked.count,
        left,
        took,
        per_row: (l.wants_ids && n > 0).then_some(changed),
    }))
}

/// Logged when every row of a batch was set aside.
const EVERY_ROW_SET_ASIDE: &str = "every row of a batch was set aside by a failing on_before; the entity stops here and the next run tries them again";

/// A batch changed a row it had not locked (and was rolled back).
fn unlocked_row_changed() -> Stop {
    Stop::Entity(crate::base::diagnostic::Diagnostic::capture(
        "engine",
        Some("unlocked_row_changed".into()),
        &"a batch changed a row it had not locked; the batch was rolled back",
    ))
}

/// What a batch's rows need before the mutation: their capture for row
/// handlers (rows a handler fails for set aside), and the values computed
/// in Rust.
struct BatchRows {
    captured: Option<super::capture::Captured>,
    /// Rows set aside by a failing `on_before`.
    left: u64,
    custom: Option<(Vec<KeyValue>, Vec<serde_json::Value>)>,
}

/// Reads the locked rows into Rust (once) only when something needs them
/// (row handlers' capture, values computed in Rust), captures them and
/// computes the values.
async fn prepare(
    l: &Loop<'_, '_>,
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    locked: &mut Locked,
) -> std::result::Result<BatchRows, Stop> {
    let (ctx, work) = (l.ctx, l.work);
    // The locked rows are read into Rust (once) only when something
    // needs them: row handlers' capture, or values computed in Rust.
    let computes = l.plan.values.computes_per_row(l.strategy);
    let rows = if l.handlers.is_some() || computes {
        l.plan
            .targets
            .load_rows_query(l.key_type, &locked.keys)
            .fetch_all(&mut **tx)
            .await
            .map_err(stop_from)?
    } else {
        Vec::new()
    };
    // Row handlers capture from the locked rows, before the mutation.
    let (captured, left) = capture_and_set_aside(l, tx, &rows, locked).await?;
    let is_left = |record: &str| captured.as_ref().is_some_and(|c| c.is_failed(record));
    let custom = if computes && !locked.keys.is_empty() {
        let e = work.entity;
        let scope = AnonymiseContext {
            entity: &e.name,
            entity_id: e.id,
            column: "",
            tenant: ctx.spec.tenant.as_deref(),
            now: ctx.spec.now,
            record_id: None,
        };
        Some(custom_values(l.plan, &scope, l.key_type, &rows, is_left)?)
    } else {
        None
    };
    Ok(BatchRows {
        captured,
        left,
        custom,
    })
}

/// The batch in the ledger, in its transaction: the mutation's row
/// details (the fused statement wrote its own) with the handler work
/// hanging from them, then the summary's running count. Returns how many
/// rows the batch changed in all, and which (when details were wanted).
async fn record_batch(
    l: &Loop<'_, '_>,
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    summary_id: i64,
    captured: &Option<super::capture::Captured>,
    locked: &mut Locked,
    mutated: Changed,
) -> std::result::Result<(u64, Vec<String>), Stop> {
    let ctx = l.ctx;
    let Changed {
        keys: changed,
        rows: n,
        details: written,
    } = mutated;
    // The mutation's own details (the fused statement wrote its own).
    if l.wants_ids && n > 0 {
        let details = match written {
            Some(details) => details,
            None => insert_details(l, tx, &changed).await?,
        };
        if let (Some(hs), Some(captured)) = (l.handlers, captured) {
            enqueue(ctx, tx, hs, &captured.snapshots, &details).await?;
        }
    }
    let n = locked.fused_changed + n;
    let changed = if locked.fused_ids.is_empty() {
        changed
    } else {
        let mut all = std::mem::take(&mut locked.fused_ids);
        all.extend(changed);
        all
    };
    // Last before the commit: the entity's one summary row is locked
    // from here to the commit, which is all the key ranges of a
    // parallel sweep wait for each other on.
    ctx.ready
        .ledger
        .add_affected(ledger::AddAffected {
            summary_id,
            rows: n as i64,
            marker: ctx.cdc_marker(&l.work.entity.name, l.strategy, n as i64),
        })
        .query()
        .execute(&mut **tx)
        .await
        .map_err(stop_from)?;
    Ok((n, changed))
}

/// What a batch locked, and what its fused statement already did.
struct Locked {
    /// The locked rows' keys, in lock order.
    keys: Vec<KeyValue>,
    /// Each locked row's address, aligned with `keys` (when the work finds
    /// its rows by address).
    addresses: Vec<String>,
    /// How many rows were locked (a fused statement counts them itself:
    /// it returns only its last row when it changed them all).
    count: u64,
    /// What the fused statement changed: how many rows, and (audited)
    /// which, their details written.
    fused_changed: u64,
    fused_ids: Vec<String>,
    /// Whether the fused statement changed every locked row (otherwise
    /// it returned every locked row, and the mutation runs on them all in
    /// a new snapshot).
    complete: bool,
    /// Where the next batch starts, when the work continues after a cursor.
    next_cursor: Option<Cursor>,
}

/// Locks the batch's rows: with the fused statement where the work has
/// one and nothing is read into the process, else with the lock
/// statement that fits the cursor and the key range.
async fn lock_batch(
    l: &Loop<'_, '_>,
    tx: &mut PgConnection,
    cursor: Option<&Cursor>,
    limit: i64,
    batch_span: &tracing::Span,
) -> std::result::Result<Locked, Stop> {
    let work = l.work;
    let statements = &work.statements;
    let bounds = Bounds {
        entity_id: work.entity.id,
        scope: &work.scope,
        limit,
        after: cursor,
        until: l.lane.until.as_ref(),
    };
    // One statement locks and changes the batch when nothing is read
    // into the process (see `sql::sweep::fused`).
    let fused = match l.handlers {
        None => statements.fused_batch(&bounds, &l.change, l.audit()),
        Some(_) => None,
    };
    let is_fused = fused.is_some();
    let query = fused.unwrap_or_else(|| statements.lock_batch(&bounds));
    let rows = query.fetch_all(&mut *tx).await.map_err(stop_from)?;
    let read = statements
        .read_locked(&rows, l.key_type, &work.scope, (is_fused, l.wants_ids))
        .map_err(stop_from)?;
    let mut locked = Locked {
        count: rows.len() as u64,
        keys: read.keys,
        addresses: read.addresses,
        fused_changed: 0,
        fused_ids: Vec::new(),
        complete: false,
        next_cursor: read.next,
    };
    if let Some(tail) = read.fused {
        locked.count = tail.locked;
        locked.fused_changed = tail.changed;
        locked.fused_ids = tail.ids;
        locked.complete = tail.changed == tail.locked;
        if !locked.complete {
            tracing::debug!(
                parent: batch_span,
                locked = tail.locked,
                changed = tail.changed,
                "the batch statement left locked rows as they were (a hold written while it ran, or rows updated since its snapshot); the mutation runs on them in a new snapshot"
            );
        }
    }
    Ok(locked)
}

/// Row handlers capture from the locked rows, before the mutation. A row
/// one of them fails for is left as it is: out of the keys mutated (and
/// their addresses, which stay aligned), its work dead-lettered once in
/// this batch. Returns the capture and how many rows were set aside.
async fn capture_and_set_aside(
    l: &Loop<'_, '_>,
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    rows: &[sqlx::postgres::PgRow],
    locked: &mut Locked,
) -> std::result::Result<(Option<super::capture::Captured>, u64), Stop> {
    let Some(hs) = l.handlers else {
        return Ok((None, 0));
    };
    let mut c = capture(l.ctx, l.work, hs, rows).await?;
    if c.failed.is_empty() {
        return Ok((Some(c), 0));
    }
    let left = c.failed.len() as u64;
    let keep: Vec<bool> = locked
        .keys
        .iter()
        .map(|k| !c.is_failed(&k.canonical()))
        .collect();
    let mut kept = keep.iter();
    locked
        .keys
        .retain(|_| kept.next().copied().unwrap_or(false));
    if l.work.statements.by_address {
        let mut kept = keep.iter();
        locked
            .addresses
            .retain(|_| kept.next().copied().unwrap_or(false));
    }
    let failed = std::mem::take(&mut c.failed);
    dead_letter_skipped_rows(l.ctx, tx, l.work, hs, failed).await?;
    Ok((Some(c), left))
}

/// Whether the batch changed only rows it locked. Rows taken by address
/// must be (see `SweepStatements::by_address`); anything else rolls the
/// batch back. A complete fused statement returned only its last locked
/// row; it changed rows at its own locked addresses alone, at most as
/// many as it locked.
fn only_locked(l: &Loop<'_, '_>, locked: &Locked, changed: &[String], n: u64) -> bool {
    if !l.work.statements.by_address {
        return true;
    }
    if locked.complete {
        locked.fused_changed <= locked.count
    } else {
        batch_changed_only_locked(&locked.keys, changed, n)
            && batch_changed_only_locked(&locked.keys, &locked.fused_ids, locked.fused_changed + n)
    }
}

/// The row details of the mutation's changed rows.
async fn insert_details(
    l: &Loop<'_, '_>,
    tx: &mut PgConnection,
    changed: &[String],
) -> std::result::Result<Vec<ledger::DetailRow>, Stop> {
    let (ctx, e) = (l.ctx, l.work.entity);
    ctx.ready
        .ledger
        .insert_details(ledger::InsertDetails {
            run_id: ctx.run_id,
            entity_id: e.id,
            entity: e.name.clone(),
            tenant: ctx.spec.tenant.clone(),
            action: l.strategy.as_str(),
            record_ids: changed.to_vec(),
        })
        .query_as()
        .fetch_all(&mut *tx)
        .await
        .map_err(stop_from)
}

/// Runs the mutation of a batch's locked rows in a new snapshot (by
/// address, by key, or joined with values computed in Rust): audited
/// when details are wanted, returning keys or only its count otherwise.
async fn mutate(
    l: &Loop<'_, '_>,
    tx: &mut PgConnection,
    keys: &[KeyValue],
    addresses: &mut Vec<String>,
    custom: Option<(Vec<KeyValue>, Vec<serde_json::Value>)>,
) -> std::result::Result<Changed, Stop> {
    let (ctx, work) = (l.ctx, l.work);
    // The hold gate, shared, with the rows locked and before the re-check
    // below: a subject hold being placed either committed before this,
    // and the re-check sees it, or waits for this batch to commit (see
    // `locks::HOLD_GATE_CLASS`). A fused statement that left its rows to
    // this mutation took it already; taking it again costs nothing.
    ctx.ready
        .ledger
        .hold_gate()
        .query()
        .execute(&mut *tx)
        .await
        .map_err(stop_from)?;
    let rows = match custom {
        Some((ordered_keys, values)) => Rows::Computed(l.key_type, ordered_keys, values),
        // Taken by address (see `SweepStatements::by_address`), or by key.
        None if work.statements.by_address => Rows::Addresses(std::mem::take(addresses)),
        None => Rows::Keys(l.key_type, keys),
    };
    work.statements
        .mutate(work.entity.id, rows, &l.change, &work.scope, l.audit())
        .run(tx)
        .await
        .map_err(stop_from)
}

/// Whether a batch changed only rows it locked: no more rows than it
/// locked, and every changed key it returned among the locked keys
/// (`changed` is empty when the mutation returns only its count).
fn batch_changed_only_locked(locked: &[KeyValue], changed: &[String], n: u64) -> bool {
    if n > locked.len() as u64 {
        return false;
    }
    if changed.is_empty() {
        return true;
    }
    let locked: std::collections::HashSet<String> =
        locked.iter().map(KeyValue::canonical).collect();
    changed.iter().all(|k| locked.contains(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_may_change_only_the_rows_it_locked() {
        let locked = [KeyValue::Int8(1), KeyValue::Int8(2)];
        assert!(batch_changed_only_locked(
            &locked,
            &["2".into(), "1".into()],
            2
        ));
        assert!(batch_changed_only_locked(&locked, &[], 2), "a count alone");
        assert!(batch_changed_only_locked(&locked, &[], 0));
        assert!(!batch_changed_only_locked(&locked, &["3".into()], 1));
        assert!(
            !batch_changed_only_locked(&locked, &[], 3),
            "more than locked"
        );
    }
}
