//! `cohort-holds-bench`: what active subject holds cost a sweep.
//!
//! ```text
//! cargo run --release -p cohort-bench --bin cohort-holds-bench -- [--rows N] [--holds H] [--batch B]
//! ```
//!
//! Seeds four identical tables of N rows (the first sweep, not reported,
//! warms the server up), all past the cutoff, each row
//! holding its own subject (an indexed uuid column, as erasure needs), and
//! purges one with no hold active, one with a single subject hold,
//! and one with H subject holds (10 000 by default), placed through the
//! API. The holds name people who have no rows, so every sweep purges all N
//! rows and the three timings differ only by the hold check each statement
//! makes; one more hold, on a subject that has a row, proves the check
//! still finds what it must keep. Prints rows/s, µs/row and each cost
//! relative to the sweep with no hold.

use std::time::Instant;

use chrono::Utc;
use clap::Parser;
use cohort::holds::HoldRequest;
use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, CohortConfig, EntityDeclaration, RunStatus, SweepRequest};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-holds-bench",
    about = "A sweep with 0, 1 and many subject holds active"
)]
struct Args {
    /// Rows per table.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    rows: u64,
    /// Subject holds active in the last sweep.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(2..=1_000_000))]
    holds: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
    /// Vacuum and analyze the hold table after placing the holds (as
    /// autovacuum would have, for holds placed over time), so its index
    /// can be read without visiting the table.
    #[arg(long)]
    vacuum: bool,
}

const TENANT: &str = "00000000-0000-4000-8000-000000000000";

/// The subject of row `g` of the tables.
fn row_subject(g: u64) -> String {
    format!("00000000-0000-4000-8000-{g:012}")
}

/// A subject with no row (the holds' people).
fn absent_subject(n: u64) -> String {
    format!("ffffffff-0000-4000-8000-{n:012}")
}

async fn handle(pool: &sqlx::PgPool, table: usize, batch: u32) -> Result<Cohort, BoxError> {
    let rules = StaticRuleProvider::builder()
        .category(
            "events",
            RetentionRule::new(Period::from_days(30)?, Strategy::Purge),
        )
        .build()
        .map_err(|e| format!("{e:?}"))?;
    Ok(Cohort::builder(pool.clone())
        .config(CohortConfig {
            sweep_batch_size: cohort::BatchSize::Fixed(batch),
            ..CohortConfig::default()
        })
        .rules(rules)
        .declaration(
            EntityDeclaration::new("Event", uuid::Uuid::new_v4().to_string())
                .category("events")
                .anchor("created_at")
                .table(format!("public.held_{table}"))
                .subject("user_id", Some("user")),
        )
        .build()
        .await?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let db = cohort_pgtemp::fresh_empty_database().await?;
    let pool = db.pool();
    let mut conn = db.connect().await?;
    cohort::schema::migrate(&mut conn, "public").await?;
    let started = Instant::now();
    // Table 3 only warms the server and the connection up (not reported).
    for i in 0..4 {
        let seed = format!(
            "CREATE TABLE public.held_{i} (id bigint PRIMARY KEY, tenant_id uuid NOT NULL,
                created_at timestamptz NOT NULL, user_id uuid NOT NULL, body text NOT NULL);
             INSERT INTO public.held_{i}
             SELECT g, '{TENANT}', now() - interval '400 days' + make_interval(secs => g),
                    ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, 'event ' || g
             FROM generate_series(1, {rows}) g;
             CREATE INDEX ON public.held_{i} (tenant_id, created_at);
             CREATE INDEX ON public.held_{i} (user_id);
             ANALYZE public.held_{i};",
            rows = args.rows
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(seed))
            .execute(pool)
            .await?;
    }
    eprintln!(
        "seeded 4 x {} rows in {:.1} s",
        args.rows,
        started.elapsed().as_secs_f64()
    );
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await?;
    println!(
        "cohort-holds-bench: {} rows per table, batch {}, PostgreSQL {version}",
        args.rows, args.batch
    );
    let warm = handle(pool, 3, args.batch).await?;
    warm.sweep(SweepRequest::tenanted(TENANT, Utc::now().fixed_offset()))
        .await?;
    println!("| subject holds active | rows/s | µs/row | cost vs none |");
    println!("|---|---|---|---|");
    let mut placed = 0u64;
    let mut baseline = None;
    for (table, active) in [0u64, 1, args.holds].into_iter().enumerate() {
        let cohort = handle(pool, table, args.batch).await?;
        let t = Instant::now();
        while placed < active {
            placed += 1;
            // The last hold names a person who has a row in this table.
            let subject = if placed == args.holds {
                row_subject(args.rows / 2)
            } else {
                absent_subject(placed)
            };
            cohort
                .create_hold(HoldRequest::subject(subject, "bench").kind("user"))
                .await?;
        }
        if active > 1 {
            eprintln!(
                "placed {} holds in {:.1} s",
                active - 1,
                t.elapsed().as_secs_f64()
            );
        }
        if args.vacuum {
            // As autovacuum leaves a table of holds placed over months.
            sqlx::raw_sql("VACUUM ANALYZE public.retention_hold")
                .execute(pool)
                .await?;
        }
        let expected = if active == args.holds {
            args.rows - 1
        } else {
            args.rows
        };
        let t = Instant::now();
        let result = cohort
            .sweep(SweepRequest::tenanted(TENANT, Utc::now().fixed_offset()))
            .await?;
        let secs = t.elapsed().as_secs_f64();
        let affected = result.affected();
        let held = result
            .entities
            .iter()
            .map(|e| e.held_by_subject)
            .sum::<u64>();
        let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM public.held_{table}"
        )))
        .fetch_one(pool)
        .await?;
        if result.status != RunStatus::Succeeded
            || affected != expected
            || left as u64 != args.rows - expected
            || held != args.rows - expected
        {
            return Err(format!(
                "{active} holds: status {}, affected {affected}, held {held}, left {left}, expected {expected}",
                result.status.as_str()
            )
            .into());
        }
        let per_row = secs * 1e6 / affected as f64;
        let base = *baseline.get_or_insert(per_row);
        println!(
            "| {active} | {:.0} | {per_row:.2} | {:+.1}% |",
            affected as f64 / secs,
            (per_row / base - 1.0) * 100.0
        );
    }
    let _ = db.drop_database().await;
    Ok(())
}
