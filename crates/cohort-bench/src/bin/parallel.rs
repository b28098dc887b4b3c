//! `cohort-parallel-bench`: one entity swept on 1, 2 and 4 connections
//! (`sweep_parallelism`, RS-022).
//!
//! ```text
//! cargo run --release -p cohort-bench --bin cohort-parallel-bench -- [--rows N | --large] [--batch B]
//! ```
//!
//! For each parallelism, seeds a table of N rows of one tenant, all past
//! the cutoff (default 200,000; `--large` is 4,000,000), and purges it in
//! one sweep. Every sweep must purge every row and record it in its
//! summary; each prints seconds and rows/s. The gain is bounded by the
//! server's cores and disk: two connections on a two-core machine share
//! those cores with the server's own work.

use std::time::Instant;

use chrono::Utc;
use clap::Parser;
use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, CohortConfig, EntityDeclaration, RunStatus, SweepRequest};
use sqlx::postgres::PgPoolOptions;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-parallel-bench",
    about = "One entity swept on 1, 2 and 4 connections"
)]
struct Args {
    /// Rows per table.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    rows: u64,
    /// 4,000,000 rows per table (overrides `--rows`).
    #[arg(long)]
    large: bool,
    /// Rows per batch.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
}

const TENANT: &str = "00000000-0000-4000-8000-000000000000";
const LANES: [u32; 3] = [1, 2, 4];

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let rows = if args.large { 4_000_000 } else { args.rows };
    let db = cohort_pgtemp::fresh_empty_database().await?;
    let mut conn = db.connect().await?;
    cohort::schema::migrate(&mut conn, "public").await?;
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(db.pool())
        .await?;
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "cohort-parallel-bench: purge of {rows} rows, batch {}, PostgreSQL {version}, {cores} cores",
        args.batch
    );
    println!("| connections | seconds | rows/s | speed-up |");
    println!("|---|---|---|---|");
    let mut first = None;
    for lanes in LANES {
        let seed = format!(
            "DROP TABLE IF EXISTS public.par;
             CREATE TABLE public.par (id bigint PRIMARY KEY, tenant_id uuid NOT NULL,
                created_at timestamptz NOT NULL, body text NOT NULL);
             INSERT INTO public.par
             SELECT g, '{TENANT}', now() - interval '400 days' + make_interval(secs => g),
                    'body of row ' || g
             FROM generate_series(1, {rows}) g;
             CREATE INDEX ON public.par (tenant_id, created_at);"
        );
        let seeding = Instant::now();
        sqlx::raw_sql(sqlx::AssertSqlSafe(seed))
            .execute(db.pool())
            .await?;
        // Its own statement: VACUUM cannot run in the seed's implicit transaction.
        sqlx::raw_sql("VACUUM ANALYZE public.par")
            .execute(db.pool())
            .await?;
        eprintln!(
            "seeded {rows} rows in {:.1} s",
            seeding.elapsed().as_secs_f64()
        );
        let rules = StaticRuleProvider::builder()
            .category(
                "par",
                RetentionRule::new(Period::from_days(30)?, Strategy::Purge),
            )
            .build()
            .map_err(|e| format!("{e:?}"))?;
        let pool = PgPoolOptions::new()
            .max_connections(lanes + 2)
            .connect_with(db.connect_options())
            .await?;
        let cohort = Cohort::builder(pool)
            .config(CohortConfig {
                sweep_batch_size: cohort::BatchSize::Fixed(args.batch),
                sweep_parallelism: lanes,
                ..CohortConfig::default()
            })
            .rules(rules)
            .declaration(
                EntityDeclaration::new("Par", uuid::Uuid::new_v4().to_string())
                    .category("par")
                    .anchor("created_at")
                    .table("public.par"),
            )
            .build()
            .await?;
        let t = Instant::now();
        let result = cohort
            .sweep(SweepRequest::tenanted(TENANT, Utc::now().fixed_offset()))
            .await?;
        let secs = t.elapsed().as_secs_f64();
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM public.par")
            .fetch_one(db.pool())
            .await?;
        let recorded: i64 = sqlx::query_scalar(
            "SELECT affected_count FROM public.sweep_run_entity_summary WHERE run_id = $1",
        )
        .bind(result.run_id)
        .fetch_one(db.pool())
        .await?;
        if result.status != RunStatus::Succeeded
            || result.affected() != rows
            || left != 0
            || recorded as u64 != rows
        {
            return Err(format!(
                "{lanes} connection(s): status {}, affected {}, left {left}, recorded {recorded}, expected {rows}",
                result.status.as_str(),
                result.affected()
            )
            .into());
        }
        let base = *first.get_or_insert(secs);
        println!(
            "| {lanes} | {secs:.2} | {:.0} | {:.2}x |",
            rows as f64 / secs,
            base / secs
        );
        cohort.pool().close().await;
    }
    drop(conn);
    let _ = db.drop_database().await;
    Ok(())
}
