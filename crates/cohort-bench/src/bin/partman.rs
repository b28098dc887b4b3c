//! `cohort-partman-bench`: Cohort's partition purge side by side with
//! pg_partman's own retention, on tables pg_partman manages.
//!
//! ```text
//! cargo run --release -p cohort-bench --bin cohort-partman-bench -- [--rows N]
//! ```
//!
//! Needs Debian's `postgresql-15-partman` (`.ci/run` installs it). Seeds
//! identical tables of N rows over 17 monthly partitions ending this month
//! (created by `partman.create_parent`), with the primary key
//! `(id, created_at)` as their only index, and removes rows older than 90
//! days twice: with no hold, and with one held row in an expired month.
//! pg_partman's `run_maintenance` with `retention = '90 days'` takes one
//! table, Cohort with `partitions = "drop"` the other, both against the
//! database clock. Prints each one's time, the rows each left past the
//! cutoff, and whether the held row survived.

use std::time::Instant;

use clap::Parser;
use cohort::holds::HoldRequest;
use cohort::policy::PolicyFile;
use cohort::{Cohort, RunStatus, SweepRequest};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-partman-bench",
    about = "Cohort's partition purge against pg_partman's retention"
)]
struct Args {
    /// Rows per table.
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(17_000..=100_000_000))]
    rows: u64,
}

const ENTITY: &str = "7e1c0a52-4f3b-4d8e-9a61-2b5c8d9e0f13";

/// A table partman manages: 17 months up to this one (and the months it
/// premakes), rows spread evenly over the 17, ids in time order.
fn seed(table: &str) -> String {
    format!(
        "CREATE TABLE app.{table} (id bigint NOT NULL, created_at timestamptz NOT NULL, body text,
             PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at);
         SELECT partman.create_parent('app.{table}', 'created_at', 'native', 'monthly',
             p_start_partition := (date_trunc('month', now()) - interval '16 months')::text);
         INSERT INTO app.{table}
           SELECT g, date_trunc('month', now()) - interval '16 months'
                     + (now() - (date_trunc('month', now()) - interval '16 months')) * g / current_setting('bench.rows')::int8,
                  'event ' || g
           FROM generate_series(1, current_setting('bench.rows')::int8) g;"
    )
}

fn policy(table: &str) -> String {
    format!(
        r#"
[[entity]]
name = "Event"
id = "{ENTITY}"
table = "app.{table}"
category = "events"
anchor = "created_at"
tenantless = true
partitions = "drop"

[[category]]
name = "events"
strategy = "purge"
period = "90d"
"#
    )
}

/// (rows, rows past the cutoff, partitions) of a table.
async fn shape(pool: &sqlx::PgPool, table: &str) -> Result<(i64, i64, i64), BoxError> {
    let sql = format!(
        "SELECT (SELECT count(*) FROM app.{table}),
                (SELECT count(*) FROM app.{table} WHERE created_at < now() - interval '90 days'),
                (SELECT count(*) FROM pg_inherits WHERE inhparent = 'app.{table}'::regclass)"
    );
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await?)
}

async fn held_row_left(pool: &sqlx::PgPool, table: &str, id: i64) -> Result<bool, BoxError> {
    let sql = format!("SELECT EXISTS (SELECT 1 FROM app.{table} WHERE id = $1)");
    Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(id)
        .fetch_one(pool)
        .await?)
}

/// One comparison on fresh tables; `hold` holds one row in the oldest month.
async fn compare(pool: &sqlx::PgPool, rows: u64, hold: bool) -> Result<(), BoxError> {
    let t = Instant::now();
    sqlx::raw_sql(
        "DROP SCHEMA IF EXISTS app CASCADE; CREATE SCHEMA app;
         DELETE FROM partman.part_config;
         UPDATE public.retention_hold SET released_at = now() WHERE released_at IS NULL;
         DELETE FROM public.retention_hold;",
    )
    .execute(pool)
    .await?;
    let mut conn = pool.acquire().await?;
    sqlx::query("SELECT set_config('bench.rows', $1, false)")
        .bind(rows.to_string())
        .execute(&mut *conn)
        .await?;
    for table in ["by_partman", "by_cohort"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(seed(table)))
            .execute(&mut *conn)
            .await?;
        // Visibility maps set, as on a table live for months (VACUUM runs
        // outside the seed's implicit transaction).
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE app.{table}")))
            .execute(&mut *conn)
            .await?;
    }
    drop(conn);
    eprintln!(
        "seeded 2 x {rows} rows over 17 months in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let held_id = (rows / 34) as i64; // the middle of the oldest month

    let before = shape(pool, "by_partman").await?;
    sqlx::query(
        "UPDATE partman.part_config SET retention = '90 days', retention_keep_table = false
         WHERE parent_table = 'app.by_partman'",
    )
    .execute(pool)
    .await?;
    let t = Instant::now();
    sqlx::query("SELECT partman.run_maintenance('app.by_partman')")
        .execute(pool)
        .await?;
    let partman_secs = t.elapsed().as_secs_f64();
    let partman = shape(pool, "by_partman").await?;
    let partman_kept_held = held_row_left(pool, "by_partman", held_id).await?;

    let cohort = Cohort::builder(pool.clone())
        .policy(PolicyFile::parse(&policy("by_cohort"))?)
        .build()
        .await?;
    cohort.ready().await?;
    if hold {
        let entity = uuid::Uuid::parse_str(ENTITY)?;
        cohort
            .create_hold(HoldRequest::new(entity, held_id.to_string(), "bench"))
            .await?;
    }
    let now: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let t = Instant::now();
    let result = cohort
        .sweep(SweepRequest::tenantless(now.fixed_offset()))
        .await?;
    let cohort_secs = t.elapsed().as_secs_f64();
    if result.status != RunStatus::Succeeded {
        return Err(format!("Cohort's run ended {:?}", result.status).into());
    }
    let by_cohort = shape(pool, "by_cohort").await?;
    let cohort_kept_held = held_row_left(pool, "by_cohort", held_id).await?;
    let expected_past = i64::from(hold);
    if by_cohort.1 != expected_past || (hold && !cohort_kept_held) {
        return Err(format!("Cohort left {} rows past the cutoff", by_cohort.1).into());
    }

    println!(
        "\n{} rows, 17 monthly partitions, 90 days, {}:",
        before.0,
        if hold {
            "one held row in the oldest month"
        } else {
            "no hold"
        }
    );
    println!("| | seconds | rows left past the cutoff | partitions left | held row kept |");
    println!("|---|---|---|---|---|");
    let yes = |b: bool| {
        if hold {
            if b {
                "yes"
            } else {
                "**no**"
            }
        } else {
            "-"
        }
    };
    println!(
        "| pg_partman run_maintenance | {partman_secs:.3} | {} | {} | {} |",
        partman.1,
        partman.2,
        yes(partman_kept_held)
    );
    println!(
        "| Cohort partition purge | {cohort_secs:.3} | {} | {} | {} |",
        by_cohort.1,
        by_cohort.2,
        yes(cohort_kept_held)
    );
    println!(
        "Cohort / pg_partman time: {:.2}x",
        cohort_secs / partman_secs
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let db = cohort_pgtemp::fresh_empty_database().await?;
    let mut conn = db.connect().await?;
    cohort::schema::migrate(&mut conn, "public").await?;
    sqlx::raw_sql("CREATE SCHEMA partman; CREATE EXTENSION pg_partman SCHEMA partman")
        .execute(&mut conn)
        .await?;
    let version: String = sqlx::query_scalar(
        "SELECT 'PostgreSQL ' || current_setting('server_version') || ', pg_partman '
                || (SELECT extversion FROM pg_extension WHERE extname = 'pg_partman')",
    )
    .fetch_one(&mut conn)
    .await?;
    println!("cohort-partman-bench: {version}");
    for hold in [false, true] {
        compare(db.pool(), args.rows, hold).await?;
    }
    Ok(())
}
