//! `cohort-anonymise-bench`: what a custom anonymiser costs in each mode.
//!
//! ```text
//! cargo run --release -p cohort-bench --bin cohort-anonymise-bench -- [--rows N] [--batch B]
//! ```
//!
//! Seeds three identical tables of N rows, all past the cutoff, and sweeps
//! each with one anonymised column (`note`) scrubbed a different way:
//! - per row: `CustomAnonymiser::new`, a Rust function of the original
//!   value, so every batch reads its rows into Rust and sends the values
//!   back;
//! - per run: `CustomAnonymiser::per_run`, computed once and applied to the
//!   whole batch in SQL;
//! - literal: a literal template, the SQL-only baseline.
//!
//! Every sweep must leave its table with the same values; each prints rows/s
//! and µs/row.

use std::time::Instant;

use chrono::Utc;
use clap::Parser;
use cohort::model::{AnonymiseContext, AnonymiseMethod, CustomAnonymiser};
use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, CohortConfig, EntityDeclaration, RunStatus, SweepRequest};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-anonymise-bench",
    about = "Custom anonymisers per row against per run"
)]
struct Args {
    /// Rows per table.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    rows: u64,
    /// Rows per batch.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
}

const TENANT: &str = "00000000-0000-4000-8000-000000000000";
const REPLACEMENT: &str = "[removed]";

#[allow(clippy::ptr_arg)] // a custom anonymiser receives &T of the column's Rust type
fn per_row(_: &String) -> String {
    REPLACEMENT.to_owned()
}

fn per_run(_: &AnonymiseContext<'_>) -> String {
    REPLACEMENT.to_owned()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let db = cohort_pgtemp::fresh_empty_database().await?;
    let pool = db.pool();
    let mut conn = db.connect().await?;
    cohort::schema::migrate(&mut conn, "public").await?;
    let modes: [(&str, AnonymiseMethod); 3] = [
        (
            "per row",
            AnonymiseMethod::Custom(CustomAnonymiser::new("per_row", per_row)),
        ),
        (
            "per run",
            AnonymiseMethod::Custom(CustomAnonymiser::per_run("per_run", per_run)),
        ),
        ("literal", AnonymiseMethod::Literal(REPLACEMENT.into())),
    ];
    let started = Instant::now();
    for i in 0..modes.len() {
        let seed = format!(
            "CREATE TABLE public.anon_{i} (id bigint PRIMARY KEY, tenant_id uuid NOT NULL,
                created_at timestamptz NOT NULL, anonymised_at timestamptz, note text NOT NULL);
             INSERT INTO public.anon_{i}
             SELECT g, '{TENANT}', now() - interval '400 days' + make_interval(secs => g), NULL,
                    'note of row ' || g
             FROM generate_series(1, {rows}) g;
             CREATE INDEX ON public.anon_{i} (tenant_id, created_at);
             ANALYZE public.anon_{i};",
            rows = args.rows
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(seed))
            .execute(pool)
            .await?;
    }
    eprintln!(
        "seeded 3 x {} rows in {:.1} s",
        args.rows,
        started.elapsed().as_secs_f64()
    );
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await?;
    println!(
        "cohort-anonymise-bench: {} rows per table, batch {}, PostgreSQL {version}",
        args.rows, args.batch
    );
    println!("| mode | rows/s | µs/row |");
    println!("|---|---|---|");
    for (i, (label, method)) in modes.into_iter().enumerate() {
        let rules = StaticRuleProvider::builder()
            .category(
                "notes",
                RetentionRule::new(Period::from_days(30)?, Strategy::Anonymise),
            )
            .build()
            .map_err(|e| format!("{e:?}"))?;
        let cohort = Cohort::builder(pool.clone())
            .config(CohortConfig {
                sweep_batch_size: cohort::BatchSize::Fixed(args.batch),
                ..CohortConfig::default()
            })
            .rules(rules)
            .declaration(
                EntityDeclaration::new("Note", uuid::Uuid::new_v4().to_string())
                    .category("notes")
                    .anchor("created_at")
                    .table(format!("public.anon_{i}"))
                    .anonymise("note", method),
            )
            .build()
            .await?;
        let t = Instant::now();
        let result = cohort
            .sweep(SweepRequest::tenanted(TENANT, Utc::now().fixed_offset()))
            .await?;
        let secs = t.elapsed().as_secs_f64();
        let affected = result.affected();
        let replaced: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM public.anon_{i} WHERE note = $1 AND anonymised_at IS NOT NULL"
        )))
        .bind(REPLACEMENT)
        .fetch_one(pool)
        .await?;
        if result.status != RunStatus::Succeeded
            || affected != args.rows
            || replaced as u64 != args.rows
        {
            return Err(format!(
                "{label}: status {}, affected {affected}, replaced {replaced}, expected {}",
                result.status.as_str(),
                args.rows
            )
            .into());
        }
        println!(
            "| {label} | {:.0} | {:.2} |",
            affected as f64 / secs,
            secs * 1e6 / affected as f64
        );
    }
    let _ = db.drop_database().await;
    Ok(())
}
