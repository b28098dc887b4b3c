//! What a sweep leaves in a table: its dead tuples and size before an
//! entity's batches and after them (`TableHealth`, in the summary), and
//! the opt-in `vacuum_after` that runs `ANALYZE` or `VACUUM (ANALYZE)`
//! on it outside the batch transactions once a sweep changed enough rows.

use sqlx::PgConnection;

use super::ctx::RunCtx;
use super::work::Work;
use crate::config::VacuumAfter;
use crate::domain::model::EntityDescriptor;
use crate::domain::outcome::TableHealth;
use crate::sql::catalog as statements;
use crate::sql::ledger;

/// Dead tuples and bytes, as the statistics system reports them now.
pub(super) type Measured = (i64, i64);

/// The entity's table now: dead tuples and size, summed over its
/// partitions. `None` (logged) when they cannot be read: what is
/// observed never fails the entity.
pub(super) async fn measure(conn: &mut PgConnection, e: &EntityDescriptor) -> Option<Measured> {
    let read = async {
        let row = statements::table_health(e.table.to_string())
            .query_as::<statements::HealthRow>()
            .fetch_one(&mut *conn)
            .await?;
        Ok::<_, sqlx::Error>((row.dead, row.bytes))
    };
    match read.await {
        Ok(m) => Some(m),
        Err(err) => {
            tracing::warn!(entity = %e.name, error = %err, "reading the table's dead tuples and size failed; the summary goes without them");
            None
        }
    }
}

/// After the entity's batches: this session's statistics reported at once
/// (PostgreSQL 15 on; before, they may lag by a second), the table
/// measured again, `vacuum_after` run when the sweep changed at least
/// `vacuum_after_rows` rows, and all of it recorded on the summary, with
/// how long a paced sweep waited.
pub(super) async fn after(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    work: &Work<'_>,
    summary_id: i64,
    before: Measured,
    (affected, throttled_ms): (u64, Option<u64>),
) -> Option<TableHealth> {
    let e = work.entity;
    if ctx.ready.model.server_version_num >= 150_000 {
        // Reported at this statement's end, before the next one reads.
        let _ = statements::force_stats_flush()
            .query()
            .execute(&mut *conn)
            .await;
    }
    let after = measure(conn, e).await?;
    let vacuumed = vacuum_after(ctx, conn, e, affected).await;
    let recorded = ctx
        .ready
        .ledger
        .table_health(ledger::TableHealth {
            summary_id,
            dead_tuples_before: before.0,
            dead_tuples_after: after.0,
            bytes_before: before.1,
            bytes_after: after.1,
            vacuumed,
            throttled_ms: throttled_ms.map(|ms| ms as i64),
        })
        .query()
        .execute(&mut *conn)
        .await;
    if let Err(err) = recorded {
        tracing::warn!(entity = %e.name, error = %err, "recording the table's dead tuples and size failed");
        return None;
    }
    let n = |v: i64| v.max(0) as u64;
    Some(TableHealth {
        dead_tuples_before: n(before.0),
        dead_tuples_after: n(after.0),
        bytes_before: n(before.1),
        bytes_after: n(after.1),
        vacuumed: vacuumed.map(str::to_owned),
    })
}

/// Runs `vacuum_after` on the entity's table when the sweep changed at
/// least `vacuum_after_rows` rows: what ran, or `None` (not configured,
/// too few rows, or it failed, which is logged: the rows are changed
/// either way, and autovacuum comes later).
async fn vacuum_after(
    ctx: &RunCtx<'_>,
    conn: &mut PgConnection,
    e: &EntityDescriptor,
    affected: u64,
) -> Option<&'static str> {
    let config = &ctx.cx.config;
    let full = match config.vacuum_after {
        VacuumAfter::Off => return None,
        _ if affected < config.vacuum_after_rows => return None,
        VacuumAfter::Analyze => false,
        VacuumAfter::Vacuum => true,
    };
    let started = std::time::Instant::now();
    match statements::vacuum(&e.table, full)
        .raw()
        .execute(&mut *conn)
        .await
    {
        Ok(_) => {
            tracing::info!(entity = %e.name, what = config.vacuum_after.as_str(), duration_ms = started.elapsed().as_millis() as u64, "vacuum_after ran on the swept table");
            Some(config.vacuum_after.as_str())
        }
        Err(err) => {
            tracing::warn!(entity = %e.name, error = %err, "vacuum_after failed; the sweep's changes stand");
            None
        }
    }
}
