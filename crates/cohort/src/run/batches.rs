//! The batch loop of one entity: lock a batch, capture it for handlers,
//! mutate it, audit it and queue its handler work in one transaction, then
//! the next, until a batch changes nothing or the run is cancelled.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::capture::{capture, custom_values, dead_letter_skipped_rows, enqueue};
use super::sizing::Sizer;
use super::work::{bind_all, limit_of, stop_from, with_limit, Arg, RunCtx, RunParam, Stop, Work};
use super::EntityOutcome;
use crate::config::{AUTO_BATCH_MAX, AUTO_BATCH_MAX_LOADED};
use crate::model::AnonymiseContext;
use crate::observer::AuditEvent;
use crate::rules::AuditDetail;
use crate::rules::Strategy;
use crate::sql::ledger;
use crate::sql::{bind_array, BindKey, DecodeKey, KeyValue};

/// How an entity's batch loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Progress {
    /// No candidate was left after the last batch.
    Drained,
    /// A batch changed nothing (its rows became held or changed, or every
    /// one of them was set aside by a failing `on_before`): the loop
    /// stopped there, and the rows behind it wait for the next run.
    Stalled,
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
}

impl Lane<'static> {
    /// Every candidate, on one connection.
    pub(super) const WHOLE: Lane<'static> = Lane {
        after: None,
        until: None,
        halt: None,
        total: None,
    };
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
    let e = work.entity;
    let plan = &ctx.ready.plans[&e.id];
    let strategy = work.rule.strategy();
    let key_type = ctx.ready.model.facts[&e.id].record;
    let cancel = &ctx.spec.cancel;
    let handlers = ctx.cx.handlers.get(&e.id).filter(|h| !h.is_empty());
    // Where the previous batch's candidates ended, in (anchor, key) order
    // (a sweep's) or key order (an erasure's): each batch continues after
    // it, so no batch walks again past the rows earlier ones finished
    // (anonymised or flagged rows stay in the anchor index range). Rows
    // passed over (locked by a concurrent sweep, held when re-checked, or
    // set aside by a failing `on_before`) are left to that sweep or the
    // next run: nothing about them is carried from batch to batch.
    // A key range starts after the previous range's last row.
    let mut cursor: Option<(Option<DateTime<Utc>>, KeyValue)> =
        lane.after.clone().map(|(anchor, key)| (Some(anchor), key));
    // `"auto"`: each batch's limit from the time of the ones before,
    // smaller when the rows are read into the process.
    let mut sizer = work.auto_batch.then(|| {
        Sizer::new(
            if handlers.is_some() || plan.values.computes_per_row(strategy) {
                AUTO_BATCH_MAX_LOADED
            } else {
                AUTO_BATCH_MAX
            },
        )
    });
    loop {
        if cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        if lane.halt.is_some_and(|h| h.load(Ordering::SeqCst)) {
            // Another range failed; the entity reports its failure.
            return Ok(Progress::Stalled);
        }
        let batch_clock = std::time::Instant::now();
        // Open for the whole batch (its lifetime is the batch's), never
        // entered across an await: events name it as their parent.
        let batch_span = tracing::debug_span!("cohort.batch", rows = tracing::field::Empty);
        let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::BATCH_BEGIN)
            .await
            .map_err(stop_from)?;
        let sized;
        let lock_args: &[Arg] = match &sizer {
            Some(sizer) => {
                sized = with_limit(&work.lock_args, i64::from(sizer.limit()));
                &sized
            }
            None => &work.lock_args,
        };
        let limit = limit_of(lock_args).and_then(|n| u32::try_from(n).ok());
        // Handler work needs a detail row per mutated row to hang from;
        // without either, only the count comes back.
        let wants_ids = work.rule.audit() == AuditDetail::PerRow || handlers.is_some();
        // One statement locks and changes the batch when nothing is read
        // into the process (see `sql::fused`).
        let fused = work
            .statements
            .fused
            .as_ref()
            .filter(|_| handlers.is_none());
        let locked = if let Some(fused) = fused {
            let forms = if wants_ids {
                &fused.audited
            } else {
                &fused.count
            };
            let sql = forms.pick(cursor.is_some(), lane.until.is_some());
            let mut q = bind_all(sqlx::query(sql.sql()).bind(e.id), lock_args);
            q = bind_strategy_values(q, ctx, work);
            q = bind_mark(q, ctx, work);
            if wants_ids {
                q = q
                    .bind(ctx.run_id)
                    .bind(&e.name)
                    .bind(ctx.spec.tenant.as_deref())
                    .bind(strategy.as_str());
            }
            if let Some((anchor, key)) = &cursor {
                q = key.bind(q.bind(anchor.expect("a sweep's cursor has its anchor")));
            }
            if let Some((last_anchor, last_key)) = &lane.until {
                q = last_key.bind(q.bind(*last_anchor));
            }
            q.fetch_all(&mut *tx).await
        } else {
            match (&work.statements.lock_after, &cursor, &lane.until) {
                (Some(after), Some((anchor, key)), None) => {
                    let q = bind_all(sqlx::query(after.sql()).bind(e.id), lock_args);
                    let q = match anchor {
                        Some(anchor) => q.bind(*anchor),
                        None => q,
                    };
                    key.bind(q).fetch_all(&mut *tx).await
                }
                (_, _, None) => {
                    bind_all(
                        sqlx::query(work.statements.lock.sql()).bind(e.id),
                        lock_args,
                    )
                    .fetch_all(&mut *tx)
                    .await
                }
                // A key range (a sweep's: its cursor starts with the anchor).
                (_, cursor, Some((last_anchor, last_key))) => {
                    let sql = match cursor {
                        Some(_) => work.statements.lock_after_until.as_ref(),
                        None => work.statements.lock_until.as_ref(),
                    }
                    .expect("a parallel sweep has its range statements");
                    let mut q = bind_all(sqlx::query(sql.sql()).bind(e.id), lock_args);
                    if let Some((anchor, key)) = cursor {
                        q = key.bind(q.bind(*anchor));
                    }
                    last_key
                        .bind(q.bind(*last_anchor))
                        .fetch_all(&mut *tx)
                        .await
                }
            }
        }
        .map_err(stop_from)?;
        // What the fused statement changed: how many rows, and (audited)
        // which, their details written; with fewer changed than locked,
        // it returned every locked row, and the mutation below runs on
        // them all in a new snapshot.
        let mut pre_n = 0u64;
        let mut pre_changed: Vec<String> = Vec::new();
        let mut complete = false;
        let mut locked_count = locked.len() as u64;
        if let (Some(_), Some(last)) = (fused, locked.last()) {
            let count: i64 = last.try_get(3).map_err(stop_from)?;
            let changed: i64 = last.try_get(4).map_err(stop_from)?;
            locked_count = count as u64;
            pre_n = changed as u64;
            if wants_ids {
                pre_changed = last
                    .try_get::<Option<Vec<String>>, _>(5)
                    .map_err(stop_from)?
                    .unwrap_or_default();
            }
            complete = changed == count;
            if !complete {
                tracing::debug!(
                    parent: &batch_span,
                    locked = count,
                    changed,
                    "the batch statement left locked rows as they were (a hold written while it ran, or rows updated since its snapshot); the mutation runs on them in a new snapshot"
                );
            }
        }
        let mut keys: Vec<KeyValue> = locked
            .iter()
            .map(|row| key_type.decode(row, 0))
            .collect::<std::result::Result<_, _>>()
            .map_err(stop_from)?;
        // Each locked row's address, aligned with `keys`.
        let mut addresses: Vec<String> = if work.statements.by_address {
            locked
                .iter()
                .map(|row| row.try_get::<String, _>(2))
                .collect::<std::result::Result<_, _>>()
                .map_err(stop_from)?
        } else {
            Vec::new()
        };
        if keys.is_empty() {
            tx.rollback().await.map_err(stop_from)?;
            return Ok(Progress::Drained);
        }
        if work.statements.lock_after.is_some() {
            let last = locked.last().expect("not empty");
            let anchor: Option<DateTime<Utc>> = if work.cursor_anchor {
                Some(last.try_get(1).map_err(stop_from)?)
            } else {
                None
            };
            cursor = Some((anchor, keys.last().expect("not empty").clone()));
        }

        // The locked rows are read into Rust (once) only when something
        // needs them: row handlers' capture, or values computed in Rust.
        let computes = plan.values.computes_per_row(strategy);
        let rows = if handlers.is_some() || computes {
            bind_array(sqlx::query(plan.targets.load_rows.sql()), key_type, &keys)
                .fetch_all(&mut *tx)
                .await
                .map_err(stop_from)?
        } else {
            Vec::new()
        };
        // Row handlers capture from the locked rows, before the mutation.
        // A row one of them fails for is left as it is: out of the keys
        // mutated, its work dead-lettered once in this batch.
        let mut captured = match handlers {
            Some(hs) => Some(capture(ctx, work, hs, &rows).await?),
            None => None,
        };
        let mut left = 0u64;
        if let (Some(hs), Some(c)) = (handlers, captured.as_mut()) {
            if !c.failed.is_empty() {
                left = c.failed.len() as u64;
                // The keys and their addresses stay aligned.
                let keep: Vec<bool> = keys.iter().map(|k| !c.is_failed(&k.canonical())).collect();
                let mut kept = keep.iter();
                keys.retain(|_| kept.next().copied().unwrap_or(false));
                if work.statements.by_address {
                    let mut kept = keep.iter();
                    addresses.retain(|_| kept.next().copied().unwrap_or(false));
                }
                let failed = std::mem::take(&mut c.failed);
                dead_letter_skipped_rows(ctx, &mut tx, work, hs, failed).await?;
            }
        }
        let is_left = |record: &str| captured.as_ref().is_some_and(|c| c.is_failed(record));
        let custom = if computes && !keys.is_empty() {
            let scope = AnonymiseContext {
                entity: &e.name,
                entity_id: e.id,
                column: "",
                tenant: ctx.spec.tenant.as_deref(),
                now: ctx.spec.now,
                record_id: None,
            };
            Some(custom_values(plan, &scope, key_type, &rows, is_left)?)
        } else {
            None
        };
        if cancel.is_cancelled() {
            tx.rollback().await.map_err(stop_from)?;
            return Err(Stop::Cancelled);
        }
        if keys.is_empty() {
            // Every locked row was set aside: the batch made no progress,
            // which ends the loop (the rows behind it wait for the next
            // run). Its dead letters commit.
            tx.commit().await.map_err(stop_from)?;
            out.skipped += left;
            tracing::warn!(
                parent: &batch_span,
                skipped = left,
                "every row of a batch was set aside by a failing on_before; the entity stops here and the next run tries them again"
            );
            return Ok(Progress::Stalled);
        }

        let (changed, n, written) = if complete {
            // The fused statement changed every locked row.
            (Vec::new(), 0, None)
        } else {
            mutate(ctx, &mut tx, work, wants_ids, &keys, &mut addresses, custom).await?
        };

        // Rows taken by address must be rows this batch locked (see
        // `EntityPlan::by_address`); anything else rolls the batch back.
        // A complete fused statement returned only its last locked row;
        // it changed rows at its own locked addresses alone, at most as
        // many as it locked.
        let only_locked = if complete {
            pre_n <= locked_count
        } else {
            batch_changed_only_locked(&keys, &changed, n)
                && batch_changed_only_locked(&keys, &pre_changed, pre_n + n)
        };
        if work.statements.by_address && !only_locked {
            tx.rollback().await.map_err(stop_from)?;
            return Err(Stop::Entity(crate::diagnostic::Diagnostic::capture(
                "engine",
                Some("unlocked_row_changed".into()),
                &"a batch changed a row it had not locked; the batch was rolled back",
            )));
        }
        let plan = &ctx.ready.ledger;
        // The mutation's own details (the fused statement wrote its own).
        if wants_ids && n > 0 {
            let details = match written {
                Some(details) => details,
                None => plan
                    .insert_details(ledger::InsertDetails {
                        run_id: ctx.run_id,
                        entity_id: e.id,
                        entity: e.name.clone(),
                        tenant: ctx.spec.tenant.clone(),
                        action: strategy.as_str(),
                        record_ids: changed.clone(),
                    })
                    .query()
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(stop_from)?,
            };
            if let (Some(hs), Some(captured)) = (handlers, &captured) {
                enqueue(ctx, &mut tx, hs, &captured.snapshots, &details).await?;
            }
        }
        let n = pre_n + n;
        let changed = if pre_changed.is_empty() {
            changed
        } else {
            let mut all = pre_changed;
            all.extend(changed);
            all
        };
        let per_row = wants_ids && n > 0;
        // Last before the commit: the entity's one summary row is locked
        // from here to the commit, which is all the key ranges of a
        // parallel sweep wait for each other on.
        plan.add_affected(ledger::AddAffected {
            summary_id,
            rows: n as i64,
        })
        .query()
        .execute(&mut *tx)
        .await
        .map_err(stop_from)?;
        if cancel.is_cancelled() {
            tx.rollback().await.map_err(stop_from)?;
            return Err(Stop::Cancelled);
        }
        tx.commit().await.map_err(stop_from)?;
        batch_span.record("rows", n);
        let took = batch_clock.elapsed();
        if let Some(sizer) = sizer.as_mut() {
            sizer.observe(locked_count, took);
        }
        out.batch_size = out.batch_size.max(limit);
        tracing::debug!(parent: &batch_span, duration_ms = took.as_millis() as u64, "batch committed");
        crate::telemetry::batch(took);
        crate::telemetry::rows(&e.name, strategy, "affected", n);

        out.affected += n;
        out.skipped += left;
        let total = match lane.total {
            Some(all) => all.fetch_add(n, Ordering::SeqCst) + n,
            None => out.affected,
        };
        let hub = &ctx.cx.observers;
        hub.emit(AuditEvent::EntityProgress {
            run_id: ctx.run_id,
            entity_id: e.id,
            strategy,
            batch: n,
            total,
        });
        if per_row {
            hub.emit(AuditEvent::RowDetail {
                run_id: ctx.run_id,
                entity_id: e.id,
                tenant: ctx.spec.tenant.clone(),
                record_ids: changed,
                action: strategy,
            });
        }
        if n == 0 {
            // Locked rows all became held or changed: no progress, stop here.
            return Ok(Progress::Stalled);
        }
    }
}

/// What a batch's mutation changed: the changed keys as text (none when
/// only the count came back), how many, and the row details it wrote.
type Mutated = (Vec<String>, u64, Option<Vec<sqlx::postgres::PgRow>>);

/// Runs the mutation of a batch's locked rows in a new snapshot (by
/// address, by key, or joined with values computed in Rust): audited
/// when details are wanted, returning keys or only its count otherwise.
async fn mutate(
    ctx: &RunCtx<'_>,
    tx: &mut PgConnection,
    work: &Work<'_>,
    wants_ids: bool,
    keys: &[KeyValue],
    addresses: &mut Vec<String>,
    custom: Option<(Vec<KeyValue>, Vec<serde_json::Value>)>,
) -> std::result::Result<Mutated, Stop> {
    let e = work.entity;
    let strategy = work.rule.strategy();
    let key_type = ctx.ready.model.facts[&e.id].record;
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
    // With details wanted, one statement mutates and writes them (no
    // key travels back and forth); with only the count, nothing returns.
    let audited = work
        .statements
        .mutate_audited
        .as_ref()
        .filter(|_| wants_ids);
    let count_only = work.statements.mutate_count.as_ref().filter(|_| !wants_ids);
    let sql = audited.or(count_only).unwrap_or(&work.statements.mutate);
    let mut mutate = sqlx::query(sql.sql()).bind(e.id);
    let custom_json = match custom {
        Some((ordered_keys, values)) => {
            mutate = bind_array(mutate, key_type, &ordered_keys);
            Some(values)
        }
        // Taken by address (see `EntityPlan::by_address`), or by key.
        None if work.statements.by_address => {
            mutate = mutate.bind(std::mem::take(addresses));
            None
        }
        None => {
            mutate = bind_array(mutate, key_type, keys);
            None
        }
    };
    mutate = bind_strategy_values(mutate, ctx, work);
    if let Some(values) = custom_json {
        mutate = mutate.bind(values);
    }
    mutate = bind_mark(mutate, ctx, work);
    let mut mutate = bind_all(mutate, &work.mutate_args);
    if audited.is_some() {
        mutate = mutate
            .bind(ctx.run_id)
            .bind(&e.name)
            .bind(ctx.spec.tenant.as_deref())
            .bind(strategy.as_str());
    }
    let out = if audited.is_some() {
        let details = mutate.fetch_all(&mut *tx).await.map_err(stop_from)?;
        let changed = details
            .iter()
            .map(|r| r.try_get::<String, _>("record_id"))
            .collect::<std::result::Result<_, _>>()
            .map_err(stop_from)?;
        let n = details.len() as u64;
        (changed, n, Some(details))
    } else if count_only.is_none() {
        let changed: Vec<String> = mutate
            .fetch_all(&mut *tx)
            .await
            .map_err(stop_from)?
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<std::result::Result<_, _>>()
            .map_err(stop_from)?;
        let n = changed.len() as u64;
        (changed, n, None)
    } else {
        let n = mutate
            .execute(&mut *tx)
            .await
            .map_err(stop_from)?
            .rows_affected();
        (Vec::new(), n, None)
    };
    Ok(out)
}

/// Binds the run's logical `now`, which a strategy that marks its rows
/// sets its marker to (the last of the strategy's values; see
/// `EntityPlan::params_after_keys`). One clock for the run's cutoffs and
/// its marks: a row stage 1 marks in a run carries the run's `now`, and a
/// stage measured from that marker takes only rows marked before its
/// cutoff, which is never after `now`.
fn bind_mark<'q>(
    q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ctx: &RunCtx<'_>,
    work: &Work<'_>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    if crate::sql::marks(work.rule.strategy()) {
        q.bind(ctx.spec.now)
    } else {
        q
    }
}

/// Binds the values a strategy's mutation takes after its rows: the
/// archive's run id, then the anonymise literals (anonymise, or archive
/// with anonymise-on-archive), rendered for this run.
fn bind_strategy_values<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ctx: &RunCtx<'_>,
    work: &Work<'_>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let strategy = work.rule.strategy();
    let plan = &ctx.ready.plans[&work.entity.id];
    if strategy == Strategy::Archive {
        q = q.bind(ctx.run_id);
    }
    if strategy == Strategy::Anonymise
        || (strategy == Strategy::Archive && plan.values.archive_anonymises)
    {
        for value in &work.literals {
            q = match value {
                RunParam::Text(text) => q.bind(text.clone()),
                RunParam::Json(object) => q.bind(object.clone()),
            };
        }
    }
    q
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
