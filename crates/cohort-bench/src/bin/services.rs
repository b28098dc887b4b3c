//! `cohort-services-bench`: what the background services cost.
//!
//! ```text
//! cargo run --release -p cohort-bench --bin cohort-services-bench -- [--runs N] [--details D] [--tenants T] [--replicas 1,2,3] [--discover K] [--keyed]
//! ```
//!
//! 1. History pruner: a fresh database with N old settled runs, each with
//!    one entity summary, D per-row details and D delivered handler
//!    deliveries; one pruning pass (batch 1000). Prints runs and ledger
//!    rows deleted per second, and checks nothing old is left and a recent
//!    run is kept.
//! 2. Scheduled worker: T tenants with nothing eligible, a schedule firing
//!    every second, run by 1, 2 and 3 replicas (each its own `Cohort`, pool
//!    and worker, as separate processes would be) sharing the passes; the
//!    time one occurrence takes from being written to its last pass done,
//!    and per pass (the worker's fixed cost per tenant: the claim, settings
//!    reads, a run's ledger rows).
//! 3. Tenant discovery: a `tenants_query` returning K rows (a tenth of
//!    them listed twice in another spelling, one NULL): the time to stream,
//!    check and de-duplicate them, and the process's resident memory
//!    before and after.

use std::time::{Duration, Instant};

use clap::Parser;
use cohort::policy::TenantEntry;
use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort::services::{PruneRequest, PrunerConfig, Services, WorkerConfig};
use cohort::{Cohort, EntityDeclaration, TenantSource};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-services-bench",
    about = "History pruning and scheduled-worker costs"
)]
struct Args {
    /// Old runs to prune.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    runs: u64,
    /// Row details (and delivered handler rows) per run.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    details: u64,
    /// Tenants swept per occurrence.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    tenants: u64,
    /// Worker replicas sharing each occurrence, one measurement per count.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3", value_parser = clap::value_parser!(u64).range(1..=16))]
    replicas: Vec<u64>,
    /// Key the ledger's chain (`COHORT_LEDGER_KEY`) before the worker
    /// runs, so every settle writes a MAC'd link, as a keyed install does.
    #[arg(long)]
    keyed: bool,
    /// Rows of the tenants query for the discovery benchmark.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    discover: u64,
}

const ENTITY: &str = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8";

async fn cohort_on(
    db: &cohort_pgtemp::TestDatabase,
    config: cohort::CohortConfig,
    tenants: Vec<TenantEntry>,
) -> Result<Cohort, BoxError> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect_with(db.connect_options())
        .await?;
    let rules = StaticRuleProvider::builder()
        .category(
            "notes",
            RetentionRule::new(Period::from_days(30)?, Strategy::Purge),
        )
        .build()
        .map_err(|e| format!("{e:?}"))?;
    Ok(Cohort::builder(pool)
        .config(config)
        .rules(rules)
        .tenant_source(TenantSource::List(tenants))
        .declaration(
            EntityDeclaration::new("Note", ENTITY)
                .category("notes")
                .anchor("created_at")
                .table("app.notes"),
        )
        .build()
        .await?)
}

async fn fresh() -> Result<cohort_pgtemp::TestDatabase, BoxError> {
    let db = cohort_pgtemp::fresh_empty_database().await?;
    let mut conn = db.connect().await?;
    cohort::schema::migrate(&mut conn, "public").await?;
    sqlx::raw_sql(
        "CREATE SCHEMA app;
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz NOT NULL);
         CREATE INDEX ON app.notes (tenant_id, created_at);",
    )
    .execute(db.pool())
    .await?;
    Ok(db)
}

async fn prune(runs: u64, details: u64) -> Result<(), BoxError> {
    let db = fresh().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, started_at, settled_at)
         SELECT gen_random_uuid(), 'sweep', 'manual', false, 'succeeded', now(), now() - interval '200 days', now() - interval '200 days' + make_interval(secs => g)
         FROM generate_series(1, {runs}) g;
         INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, started_at, settled_at)
         VALUES ('00000000-0000-4000-8000-000000000001', 'sweep', 'manual', false, 'succeeded', now(), now(), now());
         INSERT INTO public.sweep_run_entity_summary (run_id, retention_entity_id, entity_type, category, strategy, affected_count, resolved_period)
         SELECT run_id, '{ENTITY}', 'Note', 'notes', 'purge', {details}, interval '30 days' FROM public.sweep_run;
         INSERT INTO public.sweep_run_row_detail (run_id, retention_entity_id, entity_type, record_id, action)
         SELECT r.run_id, '{ENTITY}', 'Note', g::text, 'purge' FROM public.sweep_run r, generate_series(1, {details}) g;
         INSERT INTO public.sweep_row_handler_status (row_detail_id, run_id, handler_id, phase, status)
         SELECT row_detail_id, run_id, 'h', 'immediate', 'succeeded' FROM public.sweep_run_row_detail;
         ANALYZE;"
    )))
    .execute(db.pool())
    .await?;
    let mut config = cohort::CohortConfig::default();
    config.prune.runs_older_than = Some(Period::from_days(90)?);
    let cohort = cohort_on(&db, config.clone(), Vec::new()).await?;
    let pruner = PrunerConfig::from_config(&config)?.ok_or("pruner not configured")?;
    let started = Instant::now();
    let r = cohort.prune(PruneRequest::new(pruner)).await?;
    let secs = started.elapsed().as_secs_f64();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM public.sweep_run")
        .fetch_one(db.pool())
        .await?;
    if r.runs != runs || left != 1 {
        return Err(format!("pruned {} of {runs} runs, {left} left (expected 1)", r.runs).into());
    }
    let rows = r.runs + r.summaries + r.row_details + r.handler_work;
    println!(
        "pruner: {runs} runs with {details} row details and {details} deliveries each: {:.2} s, {:.0} runs/s, {:.0} ledger rows/s (batch {})",
        secs,
        r.runs as f64 / secs,
        rows as f64 / secs,
        config.prune.batch_size
    );
    Ok(())
}

async fn worker(tenants: u64, replicas: u64, keyed: bool) -> Result<f64, BoxError> {
    let db = fresh().await?;
    let config = cohort::CohortConfig {
        ledger_key: keyed
            .then(|| cohort::chain::LedgerKey::from_hex(&"4c".repeat(32)).expect("64 hex")),
        ..cohort::CohortConfig::default()
    };
    if keyed {
        Cohort::builder(db.pool().clone())
            .config(config.clone())
            .build_unvalidated()?
            .key_chain()
            .await?;
    }
    let list: Vec<TenantEntry> = (0..tenants)
        .map(|i| TenantEntry::new(format!("00000000-0000-4000-8000-{i:012}")))
        .collect();
    let mut running = Vec::new();
    for _ in 0..replicas {
        let cohort = cohort_on(&db, config.clone(), list.clone()).await?;
        let services = Services::new(&cohort)?
            .worker(Some(WorkerConfig::new("* * * * * *")?))
            .try_spawn()?;
        running.push(services);
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let done = loop {
        let row: Option<(f64, i32)> = sqlx::query_as(
            "SELECT extract(epoch FROM completed_at - created_at)::float8, passes
             FROM public.sweep_occurrence WHERE completed_at IS NOT NULL
             ORDER BY occurrence LIMIT 1",
        )
        .fetch_optional(db.pool())
        .await?;
        if let Some(r) = row {
            break r;
        }
        if Instant::now() > deadline {
            return Err("no occurrence completed within 10 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for services in running {
        let report = services.shutdown().await;
        if !report.clean() {
            return Err(format!("shutdown: {report:?}").into());
        }
    }
    let (secs, passes) = done;
    if passes as u64 != tenants {
        return Err(format!("{passes} passes for {tenants} tenants").into());
    }
    let finished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM public.sweep_run r JOIN public.sweep_occurrence o USING (occurrence)
         WHERE o.completed_at IS NOT NULL AND r.status = 'succeeded'
           AND o.occurrence = (SELECT min(occurrence) FROM public.sweep_occurrence WHERE completed_at IS NOT NULL)",
    )
    .fetch_one(db.pool())
    .await?;
    if finished as u64 != tenants {
        return Err(format!("{finished} passes succeeded of {tenants}").into());
    }
    // Where a pass's time goes: inside its run (started to settled), and
    // the replica's own work around it (claim, settle, settings reads).
    let (in_run, span): (f64, f64) = sqlx::query_as(
        "SELECT extract(epoch FROM avg(settled_at - started_at))::float8 * 1000,
                extract(epoch FROM max(settled_at) - min(started_at))::float8
         FROM public.sweep_run WHERE occurrence = (SELECT min(occurrence) FROM public.sweep_occurrence WHERE completed_at IS NOT NULL)",
    )
    .fetch_one(db.pool())
    .await?;
    println!(
        "worker: one occurrence of {passes} tenant passes shared by {replicas} replica(s): {secs:.3} s ({span:.3} s from the first run's start to the last's end), {:.2} ms per pass, of which {in_run:.2} ms inside each run",
        secs * 1000.0 / f64::from(passes)
    );
    Ok(secs)
}

/// Resident memory of this process in MiB (Linux; 0 elsewhere).
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

async fn discovery(rows: u64) -> Result<(), BoxError> {
    let db = fresh().await?;
    let cohort = cohort_on(&db, cohort::CohortConfig::default(), Vec::new()).await?;
    cohort.ready().await?;
    let distinct = rows - rows / 10 - 1;
    // Distinct ids, then a tenth of them again in upper case, then a NULL.
    let query = format!(
        "SELECT '00000000-0000-4000-8000-' || lpad(g::text, 12, '0') FROM generate_series(1, {distinct}) g \
         UNION ALL SELECT upper('00000000-0000-4000-8000-' || lpad(g::text, 12, '0')) FROM generate_series(1, {}) g \
         UNION ALL SELECT NULL",
        rows / 10
    );
    let before = rss_mib();
    let started = Instant::now();
    let found = cohort.tenants(&TenantSource::Query(query)).await?;
    let secs = started.elapsed().as_secs_f64();
    let after = rss_mib();
    if found.rows != rows || found.tenants.len() as u64 != distinct || found.unusable.len() != 1 {
        return Err(format!(
            "read {} rows, {} tenants, {} unusable; expected {rows}, {distinct}, 1",
            found.rows,
            found.tenants.len(),
            found.unusable.len()
        )
        .into());
    }
    println!(
        "tenant discovery: {rows} rows of tenants_query ({distinct} distinct, 1 unusable): {secs:.2} s, {:.0} rows/s; resident memory {before:.0} MiB before, {after:.0} MiB after",
        rows as f64 / secs
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    prune(args.runs, args.details).await?;
    let mut first = None;
    for replicas in args.replicas {
        let secs = worker(args.tenants, replicas, args.keyed).await?;
        let (base_replicas, base) = *first.get_or_insert((replicas, secs));
        println!(
            "worker: {replicas} replica(s): {:.2}x the speed of {base_replicas}",
            base / secs
        );
    }
    discovery(args.discover).await?;
    Ok(())
}
