//! `cohort-report-bench`: how long `cohort report` takes over a year of
//! ledger.
//!
//! ```text
//! cargo build --release -p cohort-cli
//! cargo run --release -p cohort-bench --bin cohort-report-bench -- [--runs N] [--entities E]
//! ```
//!
//! Seeds a ledger of N sweeps spread over 2025 (E entity summaries each,
//! every 50th failing on one entity), one erasure for every 20 sweeps, and
//! one hold for every 10 sweeps, then times the report for the whole year:
//! the library call (every ledger read in one snapshot, and the JSON), and,
//! when `target/release/cohort` exists, the command writing the HTML page,
//! process start and connection included. Prints the median of five.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use cohort::report::ReportRequest;
use cohort::{Cohort, CohortConfig};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-report-bench",
    about = "cohort report over a year of ledger"
)]
struct Args {
    /// Sweeps in the year.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    runs: u32,
    /// Entities each sweep reaches (one summary each).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=1000))]
    entities: u32,
    /// The `cohort` binary to time (default: target/release/cohort beside
    /// this one, skipped when absent).
    #[arg(long)]
    cohort: Option<PathBuf>,
}

const SEED: &str = "
INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, tenant_id, status, logical_now,
    started_at, settled_at, error, failures)
SELECT gen_random_uuid(), 'sweep', 'scheduled', false, 't-' || (g % 50),
       CASE WHEN g % 50 = 0 THEN 'partially_failed' ELSE 'succeeded' END,
       at, at, at + interval '3 seconds',
       CASE WHEN g % 50 = 0 THEN 'entity 00000000-0000-4000-8000-000000000001: kind=database code=57014 diagnostic_id=' || gen_random_uuid() END,
       '[]'::jsonb
FROM (SELECT g, timestamptz '2025-01-01' + (g * (interval '365 days' / current_setting('bench.runs')::int)) AS at
      FROM generate_series(1, current_setting('bench.runs')::int) g) s;

INSERT INTO public.sweep_run_entity_summary (run_id, retention_entity_id, entity_type, category,
    tenant_id, strategy, affected_count, held_count, skipped_count, null_anchor_count, cutoff,
    resolved_period, legal_min, kept_by_legal_min_count, kept_by_policy_count, error)
SELECT r.run_id, ('00000000-0000-4000-8000-' || lpad(e::text, 12, '0'))::uuid, 'Entity' || e,
       'category-' || (e % 4), r.tenant_id,
       (ARRAY['purge', 'anonymise', 'soft_delete', 'archive'])[1 + e % 4],
       (abs(hashtext(r.run_id::text || e)) % 500), e % 3, 0, 0, r.started_at - interval '30 days',
       interval '30 days', CASE WHEN e % 2 = 0 THEN interval '20 days' END, e % 2, 0,
       CASE WHEN r.status = 'partially_failed' AND e = 1
            THEN 'kind=database code=57014 diagnostic_id=' || gen_random_uuid() END
FROM public.sweep_run r CROSS JOIN generate_series(1, current_setting('bench.entities')::int) e WHERE r.kind = 'sweep';

INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, tenant_id, status, logical_now,
    started_at, settled_at, erasure_subject_kind)
SELECT gen_random_uuid(), 'erasure', 'manual', false, 't-' || (g % 50), 'succeeded', at, at,
       at + make_interval(secs => 0.5 + (g % 7)), 'user'
FROM (SELECT g, timestamptz '2025-01-01' + (g * (interval '365 days' / (current_setting('bench.runs')::int / 20 + 1))) AS at
      FROM generate_series(1, current_setting('bench.runs')::int / 20) g) s;

INSERT INTO public.sweep_run_entity_summary (run_id, retention_entity_id, entity_type, category,
    tenant_id, strategy, affected_count, held_count, kept_by_legal_min_count, resolved_period)
SELECT r.run_id, ('00000000-0000-4000-8000-' || lpad(e::text, 12, '0'))::uuid, 'Entity' || e,
       'category-' || (e % 4), r.tenant_id, 'purge', e % 3, 0, e % 2, interval '30 days'
FROM public.sweep_run r CROSS JOIN generate_series(1, current_setting('bench.entities')::int) e WHERE r.kind = 'erasure';

INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, tenant_id, reason,
    created_at, released_at)
SELECT gen_random_uuid(), '00000000-0000-4000-8000-000000000001', g::text, 't-' || (g % 50),
       'bench', timestamptz '2025-01-01' + make_interval(hours => g),
       CASE WHEN g % 3 = 0 THEN timestamptz '2025-01-01' + make_interval(hours => g + 48) END
FROM generate_series(1, current_setting('bench.runs')::int / 10) g;
";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let db = cohort_pgtemp::fresh_empty_database().await?;
    let pool = db.pool();
    let mut conn = db.connect().await?;
    cohort::schema::migrate(&mut conn, "public").await?;
    let t = Instant::now();
    // The sizes reach the seed as session settings, bound like any value.
    sqlx::query(
        "SELECT set_config('bench.runs', $1, false), set_config('bench.entities', $2, false)",
    )
    .bind(args.runs.to_string())
    .bind(args.entities.to_string())
    .execute(&mut conn)
    .await?;
    sqlx::raw_sql(SEED).execute(&mut conn).await?;
    sqlx::raw_sql("ANALYZE").execute(&mut conn).await?;
    let (runs, summaries): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM public.sweep_run), (SELECT count(*) FROM public.sweep_run_entity_summary)",
    )
    .fetch_one(&mut conn)
    .await?;
    eprintln!(
        "seeded {runs} runs and {summaries} summaries in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await?;
    println!(
        "cohort-report-bench: {} sweeps of {} entities over 2025 ({runs} runs, {summaries} summaries), PostgreSQL {version}",
        args.runs, args.entities
    );

    let cohort = Cohort::builder(pool.clone())
        .config(CohortConfig {
            schema: "public".into(),
            ..CohortConfig::default()
        })
        .build_unvalidated()?;
    let year = ReportRequest::new("2025-01-01".parse()?, "2025-12-31".parse()?);
    let mut library = Vec::new();
    let mut figures = 0;
    for _ in 0..6 {
        let t = Instant::now();
        let report = cohort.report(&year).await?;
        let json = serde_json::to_vec(&report)?;
        library.push(t.elapsed().as_secs_f64());
        figures = report.facts().len();
        assert!(json.len() > 1000 && !report.entities.is_empty());
    }
    library.remove(0); // the warm-up
    println!("| what | median of 5 | figures |");
    println!("|---|---|---|");
    println!(
        "| Cohort::report + JSON, whole year | {:.0} ms | {figures} |",
        median(library) * 1000.0
    );

    let bin = args.cohort.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .expect("own path")
            .with_file_name("cohort")
    });
    if !bin.exists() {
        println!(
            "| `cohort report --format html` | skipped: {} not built (cargo build --release -p cohort-cli) | |",
            bin.display()
        );
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let policy = dir.path().join("cohort.toml");
    std::fs::write(&policy, "[cohort]\nschema = \"public\"\n")?;
    let out = dir.path().join("report.html");
    let mut cli = Vec::new();
    for _ in 0..6 {
        let t = Instant::now();
        let status = std::process::Command::new(&bin)
            .args(["--config", policy.to_str().expect("utf-8 path")])
            .args(["report", "--from", "2025-01-01", "--to", "2025-12-31"])
            .args([
                "--format",
                "html",
                "--output",
                out.to_str().expect("utf-8 path"),
            ])
            .env("DATABASE_URL", db.url())
            .status()?;
        cli.push(t.elapsed().as_secs_f64());
        if !status.success() {
            return Err(format!("cohort report failed: {status}").into());
        }
    }
    cli.remove(0);
    println!(
        "| `cohort report --format html`, whole year (process, connection, page of {} kB) | {:.0} ms | {figures} |",
        std::fs::metadata(&out)?.len() / 1024,
        median(cli) * 1000.0
    );
    Ok(())
}
