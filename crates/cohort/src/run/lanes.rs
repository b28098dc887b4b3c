//! One entity swept on several connections at once (`sweep_parallelism`,
//! RS-022). The candidates are split once, by one unlocking read, into
//! disjoint keyset ranges of (anchor, key): each range starts after the
//! previous range's last row and ends at its own, the first starts at the
//! beginning and the last runs to the end, so every row lies in exactly
//! one range whatever changes after the read. Each range is swept by the
//! batch loop of a single-connection sweep ([`batches`]), on its own
//! connection: the run's own connection takes the first range, the others
//! are taken from the pool for the entity and given back after it.
//!
//! Every guarantee of the batch loop holds per batch: `FOR UPDATE SKIP
//! LOCKED`, the hold re-check in the mutation's fresh snapshot, the audit
//! committed with the batch. The batches of all ranges add to the entity's
//! one summary row (its update is the last statement before each commit).
//!
//! On failure: cancellation stops every range, each rolling back the batch
//! it has open; a range that fails (its connection lost, a statement
//! error) makes the others stop before their next batch, and the entity
//! (or, for a lost connection, the run) fails as it would on one
//! connection. Only whole batches ever commit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::batches::{batches, Lane, Progress};
use super::ctx::RunCtx;
use super::pacing::Throttle;
use super::work::{stop_from, Stop, Work};
use super::EntityOutcome;
use crate::sql::KeyValue;

/// Sweeps the rows of one entity: on the run's connection alone, or,
/// with a parallelism above one, in key ranges on that many connections,
/// every lane asking `throttle` before each batch.
pub(super) async fn sweep_rows(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    summary_id: i64,
    out: &mut EntityOutcome,
    throttle: Option<&Throttle>,
) -> std::result::Result<Progress, Stop> {
    if work.parallelism <= 1 || work.statements.ranges.is_none() {
        let whole = Lane {
            throttle,
            ..Lane::WHOLE
        };
        return batches(ctx, conn, work, summary_id, out, &whole).await;
    }
    let mut extra = extra_connections(ctx, work.parallelism as usize - 1).await;
    let bounds = ranges(conn, ctx, work, extra.len() + 1)
        .await
        .map_err(stop_from)?;
    let halt = AtomicBool::new(false);
    let total = AtomicU64::new(out.affected);
    let lanes = lanes_of(bounds, (&halt, &total), throttle);
    tracing::debug!(ranges = lanes.len(), "sweeping the entity in key ranges");
    let mut conns: Vec<&mut PgConnection> = vec![conn];
    conns.extend(extra.iter_mut().map(|c| &mut **c));
    let runs = lanes.iter().zip(conns).map(|(lane, conn)| {
        let halt = &halt;
        async move {
            let mut mine = super::counts::outcome(work);
            let result = batches(ctx, conn, work, summary_id, &mut mine, lane).await;
            if result.is_err() {
                halt.store(true, Ordering::SeqCst);
            }
            (mine, result)
        }
    });
    let results = futures_util::future::join_all(runs).await;
    drop(extra);
    merge(out, results)
}

/// The connections beyond the run's own. Validation made sure the pool
/// can serve them; one it cannot serve now (the application holds the
/// rest) leaves fewer ranges, logged, never a failed entity.
async fn extra_connections(
    ctx: &RunCtx<'_>,
    wanted: usize,
) -> Vec<sqlx::pool::PoolConnection<sqlx::Postgres>> {
    let mut extra = Vec::with_capacity(wanted);
    for _ in 0..wanted {
        match ctx.cx.pool.acquire().await {
            Ok(c) => extra.push(c),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    wanted = wanted + 1,
                    got = extra.len() + 1,
                    "the pool could not serve every connection of sweep_parallelism; sweeping on fewer"
                );
                break;
            }
        }
    }
    extra
}

/// One lane per key range: each starts after the previous range's last
/// row and ends at its own (the last lane: at the last candidate).
fn lanes_of<'l>(
    bounds: Vec<(DateTime<Utc>, KeyValue)>,
    (halt, total): (&'l AtomicBool, &'l AtomicU64),
    throttle: Option<&'l Throttle>,
) -> Vec<Lane<'l>> {
    let mut lanes = Vec::with_capacity(bounds.len() + 1);
    let mut after = None;
    for last in bounds.into_iter().map(Some).chain([None]) {
        lanes.push(Lane {
            after: after.clone(),
            until: last.clone(),
            halt: Some(halt),
            total: Some(total),
            throttle,
        });
        after = last;
    }
    lanes
}

/// The ranges' outcomes added into the entity's, and how it ended, as on
/// one connection: a lost connection fails the run, a failed statement
/// the entity, and cancellation stops the run.
fn merge(
    out: &mut EntityOutcome,
    results: Vec<(EntityOutcome, std::result::Result<Progress, Stop>)>,
) -> std::result::Result<Progress, Stop> {
    let mut progress = Progress::Drained;
    let (mut lost, mut failed, mut cancelled) = (None, None, false);
    for (mine, result) in results {
        out.affected += mine.affected;
        out.batch_size = out.batch_size.max(mine.batch_size);
        out.skipped += mine.skipped;
        match result {
            Ok(Progress::Drained) => {}
            Ok(Progress::Stalled) if progress != Progress::Paused => progress = Progress::Stalled,
            Ok(Progress::Stalled) => {}
            Ok(Progress::Paused) => progress = Progress::Paused,
            Err(Stop::Run(e)) => lost = lost.or(Some(e)),
            Err(Stop::Entity(d)) => failed = failed.or(Some(d)),
            Err(Stop::Cancelled) => cancelled = true,
        }
    }
    match (lost, failed, cancelled) {
        (Some(e), _, _) => Err(Stop::Run(e)),
        (None, Some(d), _) => Err(Stop::Entity(d)),
        (None, None, true) => Err(Stop::Cancelled),
        (None, None, false) => Ok(progress),
    }
}

/// The last (anchor, key) of each key range but the last, in order: at
/// most `n - 1` of them (fewer when there are fewer candidates than
/// ranges; none when there is at most one), read in one statement.
async fn ranges(
    conn: &mut PgConnection,
    ctx: &RunCtx<'_>,
    work: &Work<'_>,
    n: usize,
) -> std::result::Result<Vec<(DateTime<Utc>, KeyValue)>, sqlx::Error> {
    if n <= 1 {
        return Ok(Vec::new());
    }
    let q = work
        .statements
        .ranges_query(work.entity.id, &work.scope, n)
        .expect("checked by the caller");
    let key_type = ctx.ready.model.facts[&work.entity.id].record;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::BATCH_BEGIN).await?;
    let rows = q.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    crate::sql::SweepStatements::read_ranges(&rows, key_type)
}
