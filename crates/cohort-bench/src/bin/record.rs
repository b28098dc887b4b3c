//! `cohort-record-bench`: how long "what happened to this record" takes on
//! a large ledger.
//!
//! ```text
//! cargo run --release -p cohort-bench --bin cohort-record-bench -- [--details N] [--lookups L]
//! ```
//!
//! Writes N row details (10 000 000 by default) the way sweeps leave them:
//! runs of 5 000 details each, record ids in no order, most of one
//! entity. Then it asks `Cohort::record_history` about L records (present
//! and absent, alternating) and prints the lookups' median, 99th
//! percentile and slowest time, with the ledger's size.

use std::time::Instant;

use clap::Parser;
use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort::{AuditDetail, Cohort, EntityDeclaration};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-record-bench",
    about = "Cohort::record_history on a ledger of N row details"
)]
struct Args {
    /// Row details in the ledger.
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(10_000..=200_000_000))]
    details: u64,
    /// Lookups timed.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(10..=100_000))]
    lookups: u64,
}

const ENTITY: &str = "5d6c0a3e-0000-4000-8000-000000000001";

/// Details per run, as a sweep of 5 000-row batches writes them.
const PER_RUN: u64 = 5_000;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let db = cohort_pgtemp::fresh_empty_database().await?;
    let pool = db.pool().clone();
    let mut conn = pool.acquire().await?;
    cohort::schema::migrate(&mut conn, "public").await?;
    sqlx::raw_sql(
        "CREATE TABLE public.bench_records (id bigint PRIMARY KEY, created_at timestamptz)",
    )
    .execute(&mut *conn)
    .await?;
    let started = Instant::now();
    // Runs, then their details: record ids a permutation of 1..N (a
    // multiplicative hash modulo a prime above N), so each run's records
    // lie all over the key space, as a sweep in anchor order leaves them.
    let runs = args.details.div_ceil(PER_RUN);
    sqlx::query(
        "INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, settled_at) \
         SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, 'sweep', 'scheduled', false, \
           'succeeded', now(), now() FROM generate_series(1, $1) g",
    )
    .bind(runs as i64)
    .execute(&mut *conn)
    .await?;
    let chunk = 1_000_000u64;
    let mut from = 0u64;
    while from < args.details {
        let to = (from + chunk).min(args.details);
        sqlx::query(
            "INSERT INTO public.sweep_run_row_detail (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) \
             SELECT ('00000000-0000-4000-8000-' || lpad((g / $3 + 1)::text, 12, '0'))::uuid, $4::uuid, 'Record', \
               ((g * 7919) % 2147483647 + 1)::text, NULL, 'anonymise' \
             FROM generate_series($1, $2 - 1) g",
        )
        .bind(from as i64)
        .bind(to as i64)
        .bind(PER_RUN as i64)
        .bind(ENTITY)
        .execute(&mut *conn)
        .await?;
        from = to;
    }
    sqlx::raw_sql("VACUUM ANALYZE public.sweep_run_row_detail")
        .execute(&mut *conn)
        .await?;
    let size: String = sqlx::query_scalar(
        "SELECT pg_size_pretty(pg_total_relation_size('public.sweep_run_row_detail'))",
    )
    .fetch_one(&mut *conn)
    .await?;
    drop(conn);
    eprintln!(
        "cohort-record-bench: {} details in {} runs written in {:.1} s ({size} with indexes)",
        args.details,
        runs,
        started.elapsed().as_secs_f64()
    );

    let rules = StaticRuleProvider::builder()
        .category(
            "records",
            RetentionRule::new(Period::from_days(30)?, Strategy::Purge)
                .with_audit(AuditDetail::PerRow)
                .map_err(|e| format!("{e:?}"))?,
        )
        .build()
        .map_err(|e| format!("{e:?}"))?;
    let cohort = Cohort::builder(pool.clone())
        .rules(rules)
        .declaration(
            EntityDeclaration::new("Record", ENTITY)
                .category("records")
                .anchor("created_at")
                .table("public.bench_records")
                .tenantless(),
        )
        .build()
        .await?;
    let mut times = Vec::with_capacity(args.lookups as usize);
    let mut found = 0usize;
    for i in 0..args.lookups {
        // Present: the record of detail g; absent: beyond every id written.
        let g = (i * 104_729) % args.details;
        let record = if i % 2 == 0 {
            ((g * 7919) % 2_147_483_647 + 1).to_string()
        } else {
            (2_147_483_648 + i).to_string()
        };
        let t = Instant::now();
        let history = cohort.record_history(ENTITY.parse()?, &record).await?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        found += history.len();
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!(
        "record_history details={} lookups={} found={} median_ms={:.3} p99_ms={:.3} max_ms={:.3}",
        args.details,
        args.lookups,
        found,
        at(0.5),
        at(0.99),
        times[times.len() - 1]
    );
    Ok(())
}
