//! `--interleaved`: Cohort's own batch statement against the reference's,
//! one batch of each in turn, on two identical tables.
//!
//! The side-by-side run times whole sweeps one after the other, and on a
//! small shared machine a side's own time moves by more than the gap
//! between the two. Here the two statements alternate batch by batch (and
//! which goes first alternates too), so whatever slows the machine slows
//! both: what is left is what the statements cost. Both are sent from
//! this process the same way (begin, the statement, commit), so the
//! comparison leaves out what Cohort does around its statement; the
//! side-by-side run has that.
//!
//! Cohort's statement is not copied: it is read back, as Cohort prepared
//! it, from `pg_prepared_statements` on Cohort's connections after a
//! warm-up sweep, and bound as Cohort binds it.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use cohort::CohortConfig;
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::scenario::{Scenario, Seed};
use crate::{ensure, settle, warmed_up, warmup_rows, Args, BoxError};

/// What one interleaved comparison measured.
pub(crate) struct Interleaved {
    pub(crate) label: &'static str,
    pub(crate) rows: u64,
    pub(crate) batches: usize,
    pub(crate) changed: u64,
    pub(crate) cohort: Duration,
    pub(crate) reference: Duration,
    pub(crate) cohort_median_ms: f64,
    pub(crate) reference_median_ms: f64,
}

impl Interleaved {
    /// The reference's statement time over Cohort's (1.00: the same).
    pub(crate) fn ratio(&self) -> f64 {
        self.reference.as_secs_f64() / self.cohort.as_secs_f64()
    }

    pub(crate) fn line(&self) -> String {
        format!(
            "{:<12} rows={:<9} batches={:<5} changed={:<8} Cohort's statement {:>8.1} ms (median batch {:>6.2} ms), \
             the reference's {:>8.1} ms (median batch {:>6.2} ms), vs ref {:.3}",
            self.label,
            self.rows,
            self.batches,
            self.changed,
            self.cohort.as_secs_f64() * 1e3,
            self.cohort_median_ms,
            self.reference.as_secs_f64() * 1e3,
            self.reference_median_ms,
            self.ratio()
        )
    }
}

/// The scenarios whose statements `--interleaved` compares: the ones
/// whose batch statement takes no value but its bounds (no per-row audit,
/// no archive copy).
pub(crate) fn supports(scenario: &Scenario) -> bool {
    !scenario.per_row && scenario.archive.is_none()
}

/// Seeds the scenario's table, copies it (rows in the same order, the
/// same indexes, built the same way; the holds name the same keys, so
/// they hold both), then sweeps both to the end, one batch of each in
/// turn.
pub(crate) async fn compare(
    args: &Args,
    rows: u64,
    pool: &PgPool,
    scenario: &Scenario,
    seed: &Seed<'_>,
) -> Result<Interleaved, BoxError> {
    let label = scenario.label;
    let table = scenario.table;
    let copy = format!("{table}_interleaved");

    // Cohort prepares its statements on its own connections during a
    // warm-up sweep; read them back from there.
    scenario.seed(pool, seed, warmup_rows(args)).await?;
    let cohort_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(pool.connect_options().as_ref().clone())
        .await?;
    let config = CohortConfig {
        sweep_batch_size: cohort::BatchSize::Fixed(args.batch),
        ..CohortConfig::default()
    };
    warmed_up(&cohort_pool, config, scenario, seed).await?;
    let (cohort_sql, marks) = continuing_statement(&cohort_pool).await?;
    cohort_pool.close().await;

    scenario.seed(pool, seed, rows).await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {copy}; \
         CREATE TABLE {copy} (id uuid PRIMARY KEY, seq bigint NOT NULL, \
           tenant_id uuid NOT NULL, created_at timestamptz, {extra}); \
         INSERT INTO {copy} SELECT * FROM {table} ORDER BY seq; \
         CREATE INDEX ON {copy} (tenant_id, created_at); \
         ANALYZE {copy}",
        extra = scenario.extra_columns,
    )))
    .execute(pool)
    .await?;
    settle(pool).await?;

    let reference_sql = format!(
        "WITH c AS (SELECT t.ctid AS tid, t.id, t.created_at FROM {copy} t \
           WHERE t.tenant_id = $1 AND t.created_at < $2{not_done} AND t.created_at >= $5 \
           AND (t.created_at, t.id) > ($5, $6) AND NOT {held} \
           ORDER BY t.created_at, t.id LIMIT $4 FOR UPDATE SKIP LOCKED), \
         m AS ({mutation} RETURNING t.id), \
         last AS (SELECT c.created_at, c.id FROM c ORDER BY c.created_at DESC, c.id DESC LIMIT 1) \
         SELECT (SELECT count(*) FROM m), (SELECT created_at FROM last), (SELECT id FROM last)",
        not_done = scenario.not_done,
        held = crate::scenario::held("$3"),
        mutation = scenario.baseline_mutation.replace("{table}", &copy),
    );

    let entity = Uuid::parse_str(scenario.entity_id)?;
    let tenant = seed.tenant();
    let limit = i64::from(args.batch);
    // Before every seeded anchor: where both sides' cursors start.
    let start = seed.now - TimeDelta::days(3650);
    let mut cohort_conn = PgConnection::connect_with(&pool.connect_options()).await?;
    let mut reference_conn = PgConnection::connect_with(&pool.connect_options()).await?;
    let mut c = Side::new(start);
    let mut r = Side::new(start);
    let mut turn = 0u64;
    while !(c.done && r.done) {
        turn += 1;
        let even = turn.is_multiple_of(2);
        for cohort_first in [even, !even] {
            if cohort_first && !c.done {
                let mut query = sqlx::query(AssertSqlSafe(cohort_sql.clone()))
                    .bind(entity)
                    .bind(seed.cutoff)
                    .bind(limit)
                    .bind(tenant);
                if marks {
                    // The run's now, which the marker is set to.
                    query = query.bind(seed.now);
                }
                let query = query.bind(c.at).bind(c.key);
                let (rows, took) = timed_batch(&mut cohort_conn, query).await?;
                match rows.last() {
                    Some(last) => {
                        let changed: i64 = last.try_get(4)?;
                        c.step(took, changed, last.try_get(1)?, last.try_get(0)?);
                    }
                    None => c.done = true,
                }
            } else if !cohort_first && !r.done {
                let query = sqlx::query(AssertSqlSafe(reference_sql.clone()))
                    .bind(tenant)
                    .bind(seed.cutoff)
                    .bind(entity)
                    .bind(limit)
                    .bind(r.at)
                    .bind(r.key);
                let (rows, took) = timed_batch(&mut reference_conn, query).await?;
                let row = rows
                    .first()
                    .ok_or("the reference's statement returned no row")?;
                let next: Option<DateTime<Utc>> = row.try_get(1)?;
                match next {
                    Some(at) => r.step(took, row.try_get(0)?, at, row.try_get(2)?),
                    None => r.done = true,
                }
            }
        }
    }
    let _ = cohort_conn.close().await;
    let _ = reference_conn.close().await;

    let left: (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT (SELECT count(*) FROM {table}), (SELECT count(*) FROM {copy})"
    )))
    .fetch_one(pool)
    .await?;
    ensure(
        c.changed == r.changed && c.changed > 0 && left.0 == left.1,
        || {
            format!(
            "{label}: the two statements did different work: Cohort's changed {}, the reference's {}; rows left {} and {}",
            c.changed, r.changed, left.0, left.1
        )
        },
    )?;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP TABLE {copy}")))
        .execute(pool)
        .await?;
    Ok(Interleaved {
        label,
        rows,
        batches: c.times.len(),
        changed: c.changed,
        cohort: c.times.iter().sum(),
        reference: r.times.iter().sum(),
        cohort_median_ms: median_ms(&c.times),
        reference_median_ms: median_ms(&r.times),
    })
}

/// How each side's batches begin, as Cohort's do.
const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL jit = off";

/// Runs one batch statement in a transaction of its own, begun as
/// Cohort begins its batches; returns its rows and the statement's time
/// (begin and commit left out).
async fn timed_batch(
    conn: &mut PgConnection,
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Result<(Vec<sqlx::postgres::PgRow>, Duration), BoxError> {
    let mut tx = conn.begin_with(BEGIN).await?;
    let clock = Instant::now();
    let rows = query.fetch_all(&mut *tx).await?;
    let took = clock.elapsed();
    tx.commit().await?;
    Ok((rows, took))
}

/// One side's cursor, its batch times and the rows it changed.
struct Side {
    at: DateTime<Utc>,
    key: Uuid,
    done: bool,
    changed: u64,
    times: Vec<Duration>,
}

impl Side {
    fn new(start: DateTime<Utc>) -> Self {
        Self {
            at: start,
            key: Uuid::nil(),
            done: false,
            changed: 0,
            times: Vec::new(),
        }
    }

    fn step(&mut self, took: Duration, changed: i64, at: DateTime<Utc>, key: Uuid) {
        self.times.push(took);
        self.changed += changed.max(0) as u64;
        self.at = at;
        self.key = key;
    }
}

fn median_ms(times: &[Duration]) -> f64 {
    crate::report::median(times.iter().map(|t| t.as_secs_f64() * 1e3).collect())
}

/// Cohort's batch statement that continues after a cursor (entity `$1`,
/// cutoff `$2`, limit `$3`, tenant `$4`, then, for a strategy that marks
/// its rows, the run's now `$5`, then the cursor's anchor and key), as its
/// connections prepared it, and whether it takes the run's now.
async fn continuing_statement(pool: &PgPool) -> Result<(String, bool), BoxError> {
    // Both connections at once, so each is asked.
    let mut conns = vec![pool.acquire().await?, pool.acquire().await?];
    let mut found = Vec::new();
    for conn in &mut conns {
        let statements: Vec<String> = sqlx::query_scalar(
            "SELECT statement FROM pg_catalog.pg_prepared_statements \
             WHERE statement LIKE 'WITH c AS (SELECT t.\"id\" AS k, %'",
        )
        .fetch_all(&mut **conn)
        .await?;
        found.extend(statements.into_iter().filter_map(|s| {
            if s.contains("(t.\"created_at\", t.\"id\") > ($5, $6)") && !s.contains("$7") {
                Some((s, false))
            } else if s.contains("(t.\"created_at\", t.\"id\") > ($6, $7)") && !s.contains("$8") {
                Some((s, true))
            } else {
                None
            }
        }));
    }
    found.dedup();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        other => Err(format!(
            "expected one prepared batch statement continuing after a cursor, found {}",
            other.len()
        )
        .into()),
    }
}
