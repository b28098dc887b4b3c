//! `--beside-load`: what a sweep does to an application's latency on the
//! same server, measured with a real pgbench at a fixed rate (`-R`, so
//! latency is measured, not throughput): pgbench alone, then beside an
//! unpaced purge, then beside the same purge paced by
//! `max_rows_per_second`. Each phase's latencies are the transactions that
//! completed while its sweep ran (all of them for the phase alone), read
//! from pgbench's per-transaction log. Then the WAL each strategy writes
//! per changed row (`pg_current_wal_lsn()` before and after its sweep).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cohort::{Cohort, CohortConfig, RunStatus, SweepRequest};
use cohort_pgtemp::TestDatabase;
use sqlx::PgPool;
use uuid::Uuid;

use crate::scenario::{Seed, SCENARIOS};
use crate::{Args, BoxError};

/// One phase's pgbench latencies and its sweep.
struct Phase {
    name: &'static str,
    latencies_ms: Vec<f64>,
    /// (rows changed, seconds) of the sweep, when one ran.
    sweep: Option<(u64, f64)>,
}

impl Phase {
    fn percentile(&self, p: f64) -> f64 {
        let mut v = self.latencies_ms.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        let i = ((v.len() - 1) as f64 * p).round() as usize;
        v[i]
    }
}

/// Runs the three phases and the WAL figures, printing them.
pub(crate) async fn beside_load(args: &Args, db: &TestDatabase) -> Result<(), BoxError> {
    let rows = args.rows[0];
    let pool = db.pool();
    cohort::schema::migrate(&mut *pool.acquire().await?, "public").await?;
    let pgbench = cohort_pgtemp::PgBinaries::find()?.bin_dir().join("pgbench");
    let logs = tempfile::tempdir()?;
    eprintln!("cohort-bench: pgbench -i -s {} ...", args.pgbench_scale);
    run(tokio::process::Command::new(&pgbench)
        .args(["-i", "-q", "-s", &args.pgbench_scale.to_string()])
        .arg(db.url()))
    .await?;

    let tenants: Vec<Uuid> = (0..args.tenants).map(|_| Uuid::new_v4()).collect();
    let seed = Seed::now(&tenants);
    let purge = SCENARIOS[0];
    let config = |pace: Option<u32>| CohortConfig {
        sweep_batch_size: cohort::BatchSize::Fixed(args.batch),
        max_rows_per_second: pace,
        ..CohortConfig::default()
    };
    let handle = |pace: Option<u32>| async move {
        Cohort::builder(pool.clone())
            .config(config(pace))
            .rules(purge.rules()?)
            .declaration(purge.declaration())
            .build()
            .await
            .map_err(BoxError::from)
    };

    let load = Load {
        pgbench: &pgbench,
        url: db.url(),
        dir: logs.path(),
        rate: args.load_rate,
        clients: args.load_clients,
    };
    settle(pool, None).await?;
    eprintln!("cohort-bench: pgbench alone ...");
    let alone = Phase {
        name: "pgbench alone",
        latencies_ms: load.run("alone", args.load_seconds, None).await?,
        sweep: None,
    };

    purge.seed(pool, &seed, rows).await?;
    settle(pool, Some(purge.table)).await?;
    let eligible = purge.state(pool, &seed).await?.eligible;
    eprintln!("cohort-bench: beside an unpaced sweep of {eligible} rows ...");
    let unpaced = beside(
        &load,
        "unpaced",
        args.load_seconds,
        &handle(None).await?,
        &seed,
    )
    .await?;

    purge.seed(pool, &seed, rows).await?;
    settle(pool, Some(purge.table)).await?;
    let pace = args.pace;
    let window = (eligible as u64).div_ceil(u64::from(pace)) + 10;
    eprintln!("cohort-bench: beside the sweep paced at {pace} rows/s ({window} s of load) ...");
    let paced = beside(&load, "paced", window, &handle(Some(pace)).await?, &seed).await?;

    print_phases(args, rows, eligible, pace, &[alone, unpaced, paced]);
    wal_per_row(args, pool, &seed).await
}

/// Every phase starts from the same quiet server: the freshly seeded table
/// and pgbench's tables vacuumed (so no autovacuum of the seed, or of the
/// last phase's load, runs inside a phase) and a checkpoint taken.
async fn settle(pool: &PgPool, table: Option<&str>) -> Result<(), BoxError> {
    let mut sql = String::from(
        "VACUUM (ANALYZE) pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history",
    );
    if let Some(table) = table {
        sql.push_str(&format!(", {table}"));
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await?;
    sqlx::raw_sql("CHECKPOINT").execute(pool).await?;
    Ok(())
}

/// pgbench at a fixed rate on the benchmark's database.
struct Load<'a> {
    pgbench: &'a Path,
    url: &'a str,
    dir: &'a Path,
    rate: u32,
    clients: u32,
}

impl Load<'_> {
    /// Runs pgbench for `seconds` and returns the latencies (ms) of the
    /// transactions that completed within `window` (unix seconds), or all.
    async fn run(
        &self,
        name: &str,
        seconds: u64,
        window: Option<(f64, f64)>,
    ) -> Result<Vec<f64>, BoxError> {
        let prefix = self.dir.join(name);
        run(tokio::process::Command::new(self.pgbench)
            .args([
                "-n",
                "-R",
                &self.rate.to_string(),
                "-T",
                &seconds.to_string(),
                "-c",
                &self.clients.to_string(),
                "-j",
                "2",
                "-l",
            ])
            .arg(format!("--log-prefix={}", prefix.display()))
            .arg(self.url))
        .await?;
        latencies(self.dir, name, window)
    }
}

/// pgbench beside one sweep of the purge table: the load starts, two
/// seconds later the sweep; the latencies are those of the sweep's window.
async fn beside(
    load: &Load<'_>,
    name: &'static str,
    seconds: u64,
    cohort: &Cohort,
    seed: &Seed<'_>,
) -> Result<Phase, BoxError> {
    let pgbench = load.run(name, seconds, None);
    let sweep = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let started = unix_now();
        let result = cohort
            .sweep(SweepRequest::tenanted(
                seed.tenant().to_string(),
                seed.now.fixed_offset(),
            ))
            .await?;
        let ended = unix_now();
        if result.status != RunStatus::Succeeded {
            return Err(format!("the {name} sweep did not succeed: {result:?}").into());
        }
        Ok::<_, BoxError>((result.affected(), started, ended))
    };
    let (ran, swept) = tokio::join!(pgbench, sweep);
    ran?;
    let (affected, started, ended) = swept?;
    let all_done = latencies(load.dir, name, None)?;
    if all_done.is_empty() {
        return Err(format!("{name}: pgbench logged no transaction").into());
    }
    let within = latencies(load.dir, name, Some((started, ended)))?;
    let last = last_completion(load.dir, name)?;
    if last < ended {
        return Err(format!(
            "{name}: pgbench stopped before the sweep ended ({:.1} s early): raise --load-seconds",
            ended - last
        )
        .into());
    }
    Ok(Phase {
        name: match name {
            "unpaced" => "beside the unpaced sweep",
            _ => "beside the paced sweep",
        },
        latencies_ms: within,
        sweep: Some((affected, ended - started)),
    })
}

fn print_phases(args: &Args, rows: u64, eligible: i64, pace: u32, phases: &[Phase]) {
    println!(
        "beside load: {rows} rows in {} tenants, {eligible} eligible in the swept tenant, batch {}; pgbench -R {} -c {} (scale {}); paced at {pace} rows/s",
        args.tenants, args.batch, args.load_rate, args.load_clients, args.pgbench_scale
    );
    println!(
        "{:<28} {:>8} {:>10} {:>10} {:>12} {:>10}",
        "phase", "txns", "p50 ms", "p99 ms", "sweep rows/s", "p99 ratio"
    );
    let alone_p99 = phases[0].percentile(0.99);
    for p in phases {
        let rate = p
            .sweep
            .map(|(n, s)| format!("{:.0}", n as f64 / s))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<28} {:>8} {:>10.2} {:>10.2} {:>12} {:>10.2}",
            p.name,
            p.latencies_ms.len(),
            p.percentile(0.5),
            p.percentile(0.99),
            rate,
            p.percentile(0.99) / alone_p99
        );
    }
}

/// WAL bytes per changed row of each strategy's sweep (a quarter of the
/// benchmark's rows, at least 10 000).
async fn wal_per_row(args: &Args, pool: &PgPool, seed: &Seed<'_>) -> Result<(), BoxError> {
    let rows = (args.rows[0] / 4).max(10_000);
    println!(
        "WAL per changed row ({rows} rows seeded per strategy, batch {}):",
        args.batch
    );
    for scenario in SCENARIOS.iter().map(|s| s.with_per_row(s.per_row)) {
        scenario.seed(pool, seed, rows).await?;
        let cohort = Cohort::builder(pool.clone())
            .config(CohortConfig {
                sweep_batch_size: cohort::BatchSize::Fixed(args.batch),
                ..CohortConfig::default()
            })
            .rules(scenario.rules()?)
            .declaration(scenario.declaration())
            .build()
            .await?;
        sqlx::query("CHECKPOINT").execute(pool).await?;
        let before: i64 = sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8")
            .fetch_one(pool)
            .await?;
        let result = cohort
            .sweep(SweepRequest::tenanted(
                seed.tenant().to_string(),
                seed.now.fixed_offset(),
            ))
            .await?;
        let after: i64 = sqlx::query_scalar("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8")
            .fetch_one(pool)
            .await?;
        let affected = result.affected().max(1);
        println!(
            "  {:<12} {:>9} rows, {:>12} WAL bytes, {:>8.0} bytes/row{}",
            scenario.label,
            result.affected(),
            after - before,
            (after - before) as f64 / affected as f64,
            if scenario.per_row {
                " (with per-row audit)"
            } else {
                ""
            }
        );
    }
    println!("  (partition purge: cohort-partitions-bench prints its WAL beside the row path's)");
    Ok(())
}

/// The latencies (ms) in pgbench's per-transaction logs for `name`, of
/// the transactions completed within `window` (unix seconds), or all.
fn latencies(dir: &Path, name: &str, window: Option<(f64, f64)>) -> Result<Vec<f64>, BoxError> {
    let mut out = Vec::new();
    for (latency_us, done) in log_lines(dir, name)? {
        if window.is_none_or(|(from, to)| done >= from && done <= to) {
            out.push(latency_us / 1_000.0);
        }
    }
    Ok(out)
}

fn last_completion(dir: &Path, name: &str) -> Result<f64, BoxError> {
    Ok(log_lines(dir, name)?
        .into_iter()
        .map(|(_, done)| done)
        .fold(0.0, f64::max))
}

/// Every transaction of the logs `name.*`: (latency µs, completion time
/// in unix seconds). A log line is `client_id transaction_no time
/// script_no time_epoch time_us [schedule_lag]`.
fn log_lines(dir: &Path, name: &str) -> Result<Vec<(f64, f64)>, BoxError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
        if !file.starts_with(&format!("{name}.")) {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 || f[2] == "skipped" {
                continue;
            }
            let (Ok(latency), Ok(epoch), Ok(us)) = (
                f[2].parse::<f64>(),
                f[4].parse::<f64>(),
                f[5].parse::<f64>(),
            ) else {
                continue;
            };
            out.push((latency, epoch + us / 1e6));
        }
    }
    Ok(out)
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

async fn run(cmd: &mut tokio::process::Command) -> Result<(), BoxError> {
    let out = cmd.stdin(Stdio::null()).output().await?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(())
}
