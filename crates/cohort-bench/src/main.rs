//! `cohort-bench`: sweep throughput of Cohort against a hand-written batched
//! SQL loop doing the same work, for each mutating strategy (purge,
//! archive, anonymise, soft delete).
//!
//! ```text
//! cargo run --release -p cohort-bench -- [--rows N] [--batch B] [--tenants T] [--strategies S,..] [--json]
//! ```
//!
//! Uses the server behind `DATABASE_URL` when set (a fresh database is
//! created on it and dropped at the end), otherwise a throw-away cluster.
//! For each strategy a table of N rows over T tenants is seeded, one tenant
//! is swept by Cohort and timed, then an identical table is seeded and the
//! same tenant is processed by the baseline and timed. Both must change the
//! same rows and leave the same counts behind, or the program exits non-zero.
//! Each timed run follows an untimed warm-up on a small table of the same
//! name, on the same connection, so connecting, validation and statement
//! preparation are not measured.

mod baseline;
mod beside;
mod interleave;
mod reference;
mod report;
mod scenario;

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use cohort::{Cohort, CohortConfig, RunStatus, SweepRequest};
use cohort_pgtemp::TestDatabase;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

use crate::report::{Measurement, Parameters, Report};
use crate::scenario::{Scenario, Seed, TableState, SCENARIOS};

/// Rows of the untimed warm-up table (at least 50 per tenant).
fn warmup_rows(args: &Args) -> u64 {
    1000.max(50 * u64::from(args.tenants))
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-bench",
    about = "Cohort sweep throughput against a hand-written batched SQL baseline"
)]
struct Args {
    /// Rows seeded per table (all tenants together); several sizes, comma
    /// separated, run one after another (e.g. `250000,1000000,4000000`).
    #[arg(long, default_value = "200000", value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    rows: Vec<u64>,
    /// Rows per batch, for Cohort (`sweep_batch_size`) and the baseline alike.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
    /// Cohort sizes its own batches (`sweep_batch_size = "auto"`) instead of
    /// taking `--batch`; the reference and the baseline keep `--batch`.
    #[arg(long)]
    auto_batch: bool,
    /// Tenants the rows are spread over; the first one is swept.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    tenants: u32,
    /// The strategies to run, comma separated, in their usual order
    /// whatever the order given (all four when left out).
    #[arg(long, value_delimiter = ',', value_parser = ["purge", "archive", "anonymise", "soft_delete"])]
    strategies: Vec<String>,
    /// Times each strategy this many times (every side, each on a freshly
    /// seeded table) and reports each side's median seconds, with every
    /// run's ratio to the reference: one run on a small shared machine
    /// moves by a fifth and more.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=9))]
    repeat: u32,
    /// Print the results as one JSON document instead of a table.
    #[arg(long)]
    json: bool,
    /// Compare Cohort's own batch statement with the reference's, one
    /// batch of each in turn on two identical tables, instead of timing
    /// whole sweeps one after the other: what the statements cost, with
    /// the machine's noise falling on both alike (purge and soft delete;
    /// `--repeat` times each).
    #[arg(long, conflicts_with_all = ["json", "auto_batch"])]
    interleaved: bool,
    /// Every strategy with per-row audit (anonymise has it always): Cohort
    /// and the in-server references then write one row detail per changed
    /// row, the plain reference to a table without keys or indexes.
    #[arg(long, conflicts_with = "interleaved")]
    per_row: bool,
    /// Instead of timing against the references: a pgbench load at a
    /// fixed rate, alone, beside an unpaced purge of the first `--rows`,
    /// and beside the same purge paced at `--pace`; p50/p99 latency of
    /// each phase and the sweep's rows/s, then each strategy's WAL bytes
    /// per changed row.
    #[arg(long, conflicts_with_all = ["interleaved", "json", "per_row", "auto_batch"])]
    beside_load: bool,
    /// `--beside-load`: the paced sweep's `max_rows_per_second`.
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u32).range(1..))]
    pace: u32,
    /// `--beside-load`: pgbench's fixed rate (`-R`, transactions a second).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    load_rate: u32,
    /// `--beside-load`: pgbench's clients (`-c`).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    load_clients: u32,
    /// `--beside-load`: seconds of load alone and beside the unpaced sweep.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(5..=3600))]
    load_seconds: u64,
    /// `--beside-load`: pgbench's scale (`-i -s`; 100 000 accounts each).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pgbench_scale: u32,
}

impl Args {
    /// Whether this scenario was asked for.
    fn runs(&self, scenario: &Scenario) -> bool {
        self.strategies.is_empty() || self.strategies.iter().any(|s| s == scenario.label)
    }

    /// The scenarios asked for, with per-row audit where `--per-row` asks.
    fn scenarios(&self) -> Vec<Scenario> {
        SCENARIOS
            .iter()
            .filter(|s| self.runs(s))
            .map(|s| s.with_per_row(s.per_row || self.per_row))
            .collect()
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let db = match cohort_pgtemp::fresh_empty_database().await {
        Ok(db) => db,
        Err(e) => {
            eprintln!("cohort-bench: cannot get a database: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut reports = Vec::new();
    let mut outcome = Ok(());
    if args.interleaved {
        outcome = interleaved(&args, &db).await;
    }
    if args.beside_load {
        outcome = beside::beside_load(&args, &db).await;
    }
    for &rows in args
        .rows
        .iter()
        .filter(|_| !args.interleaved && !args.beside_load)
    {
        match bench(&args, rows, &db).await {
            Ok(report) => {
                if !args.json {
                    print!("{}", report.to_table());
                    println!("peak resident memory so far: {} kB\n", peak_rss_kb());
                }
                reports.push((report, peak_rss_kb()));
            }
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    let external = cohort_pgtemp::test_cluster()
        .await
        .map(|c| c.is_external())
        .unwrap_or(false);
    if external {
        // Do not leave a large database behind on someone else's server.
        if let Err(e) = db.drop_database().await {
            eprintln!("cohort-bench: dropping the benchmark database failed: {e}");
        }
    }
    match outcome {
        Ok(()) => {
            if args.json {
                let docs: Vec<serde_json::Value> = reports
                    .iter()
                    .map(|(r, rss)| {
                        let mut doc = r.to_json();
                        doc["peak_rss_kb"] = serde_json::json!(rss);
                        doc
                    })
                    .collect();
                match docs.len() {
                    1 => println!("{}", docs[0]),
                    _ => println!("{}", serde_json::Value::Array(docs)),
                }
            } else if reports.len() > 1 {
                println!("time per changed row (Cohort, microseconds):");
                for (r, rss) in &reports {
                    let cells: Vec<String> = r
                        .measurements
                        .iter()
                        .map(|m| format!("{} {:.2}", m.label, m.cohort_us_per_row()))
                        .collect();
                    println!(
                        "  rows={:>9}: {}; peak RSS {} kB",
                        r.parameters.rows,
                        cells.join(", "),
                        rss
                    );
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cohort-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--interleaved`: each size, each supported strategy, `--repeat` times;
/// one line per comparison, then the median ratio.
async fn interleaved(args: &Args, db: &TestDatabase) -> Result<(), BoxError> {
    let pool = db.pool();
    cohort::schema::migrate(&mut *pool.acquire().await?, "public").await?;
    let tenants: Vec<Uuid> = (0..args.tenants).map(|_| Uuid::new_v4()).collect();
    let seed = Seed::now(&tenants);
    for &rows in &args.rows {
        for scenario in SCENARIOS.iter().filter(|s| args.runs(s)) {
            if !interleave::supports(scenario) {
                eprintln!(
                    "cohort-bench: --interleaved compares statements that take no value but their bounds; {} is left out",
                    scenario.label
                );
                continue;
            }
            let mut ratios = Vec::new();
            for _ in 0..args.repeat {
                let m = interleave::compare(args, rows, pool, scenario, &seed).await?;
                println!("{}", m.line());
                ratios.push(m.ratio());
            }
            let comparisons = ratios.len();
            println!(
                "{:<12} rows={rows}: median vs ref {:.3} over {comparisons} comparisons (the reference's statement time over Cohort's; 1.00 = the same)",
                scenario.label,
                report::median(ratios),
            );
        }
    }
    Ok(())
}

/// The process's peak resident set size (VmHWM), in kB; 0 when unknown.
fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

async fn bench(args: &Args, rows: u64, db: &TestDatabase) -> Result<Report, BoxError> {
    let pool = db.pool();
    cohort::schema::migrate(&mut *pool.acquire().await?, "public").await?;
    let server_version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await?;

    let tenants: Vec<Uuid> = (0..args.tenants).map(|_| Uuid::new_v4()).collect();
    let seed = Seed::now(&tenants);
    let now = seed.now;
    // Cohort's own pool: a sweep uses one connection, so the warm-up's
    // prepared statements are reused by the timed sweep.
    let cohort_pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(db.connect_options())
        .await?;
    let mut baseline_conn = db.connect().await?;
    let mut reference_conn = db.connect().await?;

    let mut measurements = Vec::new();
    for scenario in &args.scenarios() {
        eprintln!("cohort-bench: {} ...", scenario.label);
        reference::install(&mut reference_conn, scenario, reference::Details::Ledger).await?;
        reference::install(&mut reference_conn, scenario, reference::Details::Plain).await?;
        let mut runs = Vec::new();
        for _ in 0..args.repeat {
            let m = measure(
                (args, rows),
                pool,
                &cohort_pool,
                (&mut baseline_conn, &mut reference_conn),
                scenario,
                &seed,
            )
            .await?;
            eprintln!(
                "cohort-bench: {}: {} rows, Cohort {:.3} s, reference {:.3} s (plain details {:.3} s), baseline {:.3} s",
                m.label,
                m.affected,
                m.cohort_seconds,
                m.reference_seconds,
                m.plain_reference_seconds,
                m.baseline_seconds
            );
            runs.push(m);
        }
        measurements.push(Measurement::median(runs));
    }
    cohort_pool.close().await;
    let _ = sqlx::Connection::close(baseline_conn).await;
    let _ = sqlx::Connection::close(reference_conn).await;

    Ok(Report {
        parameters: Parameters {
            rows,
            batch: args.batch,
            auto_batch: args.auto_batch,
            tenants: args.tenants,
            server_version,
            swept_tenant: seed.tenant(),
            now,
            cutoff: seed.cutoff,
        },
        measurements,
    })
}

/// Checks a condition of the comparison; a mismatch fails the run.
fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<(), BoxError> {
    if ok {
        Ok(())
    } else {
        Err(format!("verification failed: {}", what()).into())
    }
}

/// Builds the scenario's Cohort (validation) and sweeps the small table
/// just seeded once, untimed: its statements are prepared on
/// `cohort_pool`'s connections.
async fn warmed_up(
    cohort_pool: &PgPool,
    config: CohortConfig,
    scenario: &Scenario,
    seed: &Seed<'_>,
) -> Result<Cohort, BoxError> {
    // As `cohort sweep` runs it: no metrics exporter, so no read of the
    // backlog for its gauge after the batches (docs/performance.md has
    // what that read costs a worker that exports metrics).
    let cohort = Cohort::builder(cohort_pool.clone())
        .config(config)
        .rules(scenario.rules()?)
        .declaration(scenario.declaration())
        .backlog_gauge(false)
        .build()
        .await?;
    let (warm, _) = cohort_sweep(&cohort, scenario, seed).await?;
    ensure(warm > 0, || {
        format!("{}: the Cohort warm-up changed nothing", scenario.label)
    })?;
    Ok(cohort)
}

/// Sweeps the swept tenant with Cohort and checks the run is a clean
/// success; returns (affected, held). The cutoff is not read from the
/// result: `verify` proves it matched, since the anchors are spread
/// continuously and any other cutoff would change different rows.
async fn cohort_sweep(
    cohort: &Cohort,
    scenario: &Scenario,
    seed: &Seed<'_>,
) -> Result<(u64, u64), BoxError> {
    let result = cohort
        .sweep(SweepRequest::tenanted(
            seed.tenant().to_string(),
            seed.now.fixed_offset(),
        ))
        .await?;
    ensure(
        result.status == RunStatus::Succeeded && result.failures.is_empty(),
        || {
            format!(
                "{}: Cohort sweep did not succeed: {result:?}",
                scenario.label
            )
        },
    )?;
    let outcome = result
        .entities
        .first()
        .ok_or_else(|| format!("{}: Cohort swept no entity", scenario.label))?;
    if let Some(size) = outcome.batch_size {
        eprintln!(
            "cohort-bench: {}: Cohort's largest batch {size} rows",
            scenario.label
        );
    }
    Ok((result.affected(), outcome.held))
}

async fn measure(
    (args, rows): (&Args, u64),
    pool: &PgPool,
    cohort_pool: &PgPool,
    (baseline_conn, reference_conn): (&mut sqlx::PgConnection, &mut sqlx::PgConnection),
    scenario: &Scenario,
    seed: &Seed<'_>,
) -> Result<Measurement, BoxError> {
    let label = scenario.label;

    // Cohort: build (validation) and warm up on a small table, then time one sweep.
    scenario.seed(pool, seed, warmup_rows(args)).await?;
    let config = CohortConfig {
        sweep_batch_size: if args.auto_batch {
            cohort::BatchSize::Auto
        } else {
            cohort::BatchSize::Fixed(args.batch)
        },
        ..CohortConfig::default()
    };
    let cohort = warmed_up(cohort_pool, config, scenario, seed).await?;

    scenario.seed(pool, seed, rows).await?;
    let before = scenario.state(pool, seed).await?;
    settle(pool).await?;
    let started = Instant::now();
    let (cohort_affected, cohort_held) = cohort_sweep(&cohort, scenario, seed).await?;
    let cohort_seconds = started.elapsed().as_secs_f64();
    let cohort_after = scenario.state(pool, seed).await?;

    // Baseline, then the in-server reference: the same, on identical tables.
    let (baseline_affected, baseline_seconds, baseline_before, baseline_after) = hand_written(
        Way::Baseline,
        (args, rows),
        pool,
        baseline_conn,
        scenario,
        seed,
    )
    .await?;
    let mut references = Vec::new();
    // The plain reference differs only where details are written.
    let ways: &[reference::Details] = if scenario.per_row {
        &[reference::Details::Ledger, reference::Details::Plain]
    } else {
        &[reference::Details::Ledger]
    };
    for &details in ways {
        let (reference_affected, seconds, reference_before, reference_after) = hand_written(
            Way::Reference(details),
            (args, rows),
            pool,
            reference_conn,
            scenario,
            seed,
        )
        .await?;
        ensure(
            reference_before == before
                && reference_affected == cohort_affected
                && reference_after == cohort_after,
            || {
                format!(
                    "{label}: the {details:?} reference did different work: {reference_affected} rows, \
                     {reference_before:?} -> {reference_after:?}"
                )
            },
        )?;
        references.push(seconds);
    }
    let reference_seconds = references[0];
    let plain_reference_seconds = *references.last().expect("one at least");

    verify(
        scenario,
        &before,
        &baseline_before,
        (cohort_affected, cohort_held, &cohort_after),
        (baseline_affected, &baseline_after),
    )?;

    Ok(Measurement {
        label,
        affected: cohort_affected,
        held: cohort_held,
        tenant_rows: before.tenant_rows as u64,
        cohort_seconds,
        baseline_seconds,
        reference_seconds,
        plain_reference_seconds,
        runs: vec![(cohort_seconds, reference_seconds)],
    })
}

/// A hand-written way of doing a scenario's work.
#[derive(Debug, Clone, Copy)]
enum Way {
    /// The client-side loop (`baseline.rs`).
    Baseline,
    /// The in-server procedure (`reference.rs`), writing its details there.
    Reference(reference::Details),
}

impl Way {
    async fn run(
        self,
        conn: &mut sqlx::PgConnection,
        scenario: &Scenario,
        seed: &Seed<'_>,
        batch: u32,
    ) -> sqlx::Result<u64> {
        match self {
            Way::Baseline => baseline::run(conn, scenario, seed.tenant(), seed.cutoff, batch).await,
            Way::Reference(details) => {
                reference::run(conn, scenario, details, seed.tenant(), seed.cutoff, batch).await
            }
        }
    }
}

/// Before a timed run: turns autovacuum off for every table of the
/// benchmark's own database (the seeded tables, Cohort's ledger, the
/// reference's detail table), so that no background vacuum of a table
/// seeded or filled just before (a million rows and more) runs beside one
/// side and not the other; then writes out what seeding left dirty
/// (`CHECKPOINT`), so that no side is timed beside that checkpoint either.
/// Without them, the side a vacuum or a checkpoint happened to overlap
/// lost up to half its speed on this 2-core machine. Then `sync`s this
/// machine's page cache (see below).
async fn settle(pool: &PgPool) -> Result<(), BoxError> {
    sqlx::raw_sql(
        "DO $$ DECLARE t regclass; BEGIN \
           FOR t IN SELECT c.oid::regclass FROM pg_catalog.pg_class c \
                    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                    WHERE n.nspname = 'public' AND c.relkind = 'r' LOOP \
             EXECUTE pg_catalog.format('ALTER TABLE %s SET (autovacuum_enabled = false)', t); \
           END LOOP; \
         END $$",
    )
    .execute(pool)
    .await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    // The throw-away cluster runs with fsync off, so the checkpoint leaves
    // its writes in this machine's page cache, for the kernel to write
    // back half a minute later: into the next side's run. Write them now
    // (a server elsewhere has its own; this then syncs only this machine).
    let synced = tokio::process::Command::new("sync").status().await?;
    ensure(synced.success(), || format!("sync failed: {synced}"))?;
    Ok(())
}

/// Warms `way` up on a small table, then seeds `rows` rows and times it;
/// returns (affected, seconds, state before, state after).
async fn hand_written(
    way: Way,
    (args, rows): (&Args, u64),
    pool: &PgPool,
    conn: &mut sqlx::PgConnection,
    scenario: &Scenario,
    seed: &Seed<'_>,
) -> Result<(u64, f64, TableState, TableState), BoxError> {
    scenario.seed(pool, seed, warmup_rows(args)).await?;
    let warm = way.run(conn, scenario, seed, args.batch).await?;
    ensure(warm > 0, || {
        format!("{}: the {way:?} warm-up changed nothing", scenario.label)
    })?;
    scenario.seed(pool, seed, rows).await?;
    let before = scenario.state(pool, seed).await?;
    settle(pool).await?;
    let started = Instant::now();
    let affected = way.run(conn, scenario, seed, args.batch).await?;
    let seconds = started.elapsed().as_secs_f64();
    let after = scenario.state(pool, seed).await?;
    Ok((affected, seconds, before, after))
}

/// Both runs started from the same state and did the same thing.
fn verify(
    scenario: &Scenario,
    before: &TableState,
    baseline_before: &TableState,
    (cohort_affected, cohort_held, cohort_after): (u64, u64, &TableState),
    (baseline_affected, baseline_after): (u64, &TableState),
) -> Result<(), BoxError> {
    let label = scenario.label;
    ensure(before == baseline_before, || {
        format!("{label}: the seeded tables differ: {before:?} vs {baseline_before:?}")
    })?;
    ensure(before.eligible > 0, || {
        format!("{label}: nothing eligible to sweep: {before:?}")
    })?;
    let expected = before.eligible as u64;
    ensure(
        cohort_affected == expected && baseline_affected == expected,
        || {
            format!(
                "{label}: rows affected differ: expected {expected}, Cohort {cohort_affected}, \
                 baseline {baseline_affected}"
            )
        },
    )?;
    ensure(cohort_after == baseline_after, || {
        format!(
            "{label}: remaining rows differ: Cohort {cohort_after:?}, baseline {baseline_after:?}"
        )
    })?;
    ensure(
        cohort_after.eligible == 0 && cohort_after.held == before.held,
        || format!("{label}: work left or holds not respected: {cohort_after:?}"),
    )?;
    ensure(cohort_held == before.held as u64, || {
        format!(
            "{label}: Cohort reported {cohort_held} held rows, the table has {}",
            before.held
        )
    })?;
    let expected_total = match scenario.strategy.deletes() {
        true => before.total - before.eligible,
        false => before.total,
    };
    ensure(
        cohort_after.total == expected_total
            && cohort_after.not_done == before.not_done - before.eligible,
        || format!("{label}: unexpected remaining rows {cohort_after:?} from {before:?}"),
    )?;
    if scenario.strategy != cohort::Strategy::Purge {
        ensure(cohort_after.done_consistent == before.eligible, || {
            format!("{label}: processed rows not in the expected state: {cohort_after:?}")
        })?;
    }
    Ok(())
}
