//! `cohort-soak --seed N --duration 60s [--workers 3]`: a randomised soak.
//!
//! On a throw-away server of its own: several `cohort worker` processes
//! sweep every two seconds on two connections per sweep (purge, per-row
//! audit, two command handlers
//! that fail at random); meanwhile the application inserts rows, deletes
//! some through guarded deletion, places and releases holds and asks for
//! erasures, all at random; and a chaos loop kill -9s, SIGSTOPs/SIGCONTs
//! and restarts workers, terminates server sessions at random
//! (`pg_terminate_backend`) and crashes the server. At the end the queue is
//! drained and every invariant is checked against the shadow log the soak
//! kept in the database (`soak.*` tables). The seed drives every random
//! choice: a failing seed is the way to reproduce a failure (timing still
//! varies). Exit 0 when every invariant holds, 1 otherwise.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use cohort::guarded::{Guarded, GuardedDeletion};
use cohort::holds::HoldRequest;
use cohort::policy::PolicyFile;
use cohort::Cohort;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;
use uuid::Uuid;

const ENTITY: &str = "0d5e6f70-8192-4a3b-9c4d-5e6f708192a3";
const TENANTS: [&str; 2] = [
    "11111111-1111-1111-1111-111111111111",
    "22222222-2222-2222-2222-222222222222",
];
const SUBJECTS: usize = 6;

/// A randomised soak of Cohort under failures; see the crate documentation.
#[derive(Debug, Parser)]
struct Args {
    /// Seed of every random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// How long the load and the chaos last (e.g. 60s, 30m, 4h).
    #[arg(long, default_value = "60s")]
    duration: cohort::rules::Period,
    /// Worker replicas.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// The `cohort` binary (default: beside this one).
    #[arg(long)]
    cohort_bin: Option<PathBuf>,
    /// Key the table by `(id, created_at)` (a composite record key) and
    /// partition it by `created_at`, as a multi-tenant log table is.
    #[arg(long)]
    composite_key: bool,
}

/// How the soak names a row's record key in SQL: `id::text`, or the JSON
/// array of `(id, created_at)` written out here independently of Cohort's
/// own code (the invariants compare the two).
fn key_expr(composite: bool, alias: &str) -> String {
    if composite {
        format!(
            "jsonb_build_array({alias}.id, to_char({alias}.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'))::text"
        )
    } else {
        format!("{alias}.id::text")
    }
}

/// What happened, for the report.
#[derive(Default)]
struct Counts {
    inserted: AtomicU64,
    app_deleted: AtomicU64,
    app_protected: AtomicU64,
    holds: AtomicU64,
    releases: AtomicU64,
    erasures: AtomicU64,
    errors: AtomicU64,
    kills: AtomicU64,
    stops: AtomicU64,
    restarts: AtomicU64,
    terminated: AtomicU64,
}

fn subject(i: usize) -> String {
    format!("aaaaaaaa-0000-0000-0000-{i:012}")
}

/// The application's table: keyed by `id`, or (`composite`) by
/// `(id, created_at)` and partitioned by `created_at` (30 days back from
/// now, the cutoff, is a partition bound).
fn app_schema(composite: bool) -> String {
    if !composite {
        return "CREATE SCHEMA app;
            CREATE TABLE app.items (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, owner_id uuid NOT NULL,
                created_at timestamptz NOT NULL);
            CREATE INDEX ON app.items (tenant_id, created_at);"
            .into();
    }
    let bound = (chrono::Utc::now() - chrono::Duration::days(30)).to_rfc3339();
    format!(
        "CREATE SCHEMA app;
         CREATE TABLE app.items (id bigint NOT NULL, tenant_id uuid NOT NULL, owner_id uuid NOT NULL,
             created_at timestamptz NOT NULL, PRIMARY KEY (id, created_at))
           PARTITION BY RANGE (created_at);
         CREATE TABLE app.items_old PARTITION OF app.items FOR VALUES FROM (MINVALUE) TO ('{bound}');
         CREATE TABLE app.items_new PARTITION OF app.items FOR VALUES FROM ('{bound}') TO (MAXVALUE);
         CREATE INDEX ON app.items (tenant_id, created_at);
         CREATE INDEX ON app.items (owner_id);"
    )
}

const SCHEMA: &str = "
CREATE SCHEMA soak;
-- Every row ever inserted, in the inserting transaction, with its key's text.
CREATE TABLE soak.inserted (id bigint PRIMARY KEY, key text NOT NULL UNIQUE);
-- Every row the application deleted itself (guarded), in the deleting transaction.
CREATE TABLE soak.app_deleted (id bigint PRIMARY KEY, key text NOT NULL,
    at timestamptz NOT NULL DEFAULT now());
-- Holds as the application saw them: acknowledged after creation commits,
-- release requested before the release starts (database clock both).
CREATE TABLE soak.holds (hold_id uuid PRIMARY KEY, record_id text NOT NULL,
    acked_at timestamptz NOT NULL, release_requested_at timestamptz);
";

fn policy(log: &Path, composite: bool) -> String {
    let handler = |name: &str| {
        format!(
            "[[entity.handler]]\nname = \"{name}\"\ncommand = [\"sh\", \"-c\", \"r=$(od -An -N1 -tu1 /dev/urandom); if [ $((r % 6)) -eq 0 ]; then exit 7; fi; d=$(cat); printf '%s\\\\n' \\\"$d\\\" >> '{log}'\"]\n\n",
            log = log.display()
        )
    };
    format!(
        r#"
[cohort]
schema = "retention"
schedule = "*/2 * * * * *"
sweep_batch_size = 25

[cohort.dispatch]
poll_interval = "1s"
max_attempts = 4
base_backoff = "1s"
claim_timeout = "5s"
settle_timeout = "5s"

[[tenant]]
id = "{t1}"

[[tenant]]
id = "{t2}"

[[entity]]
name = "Item"
id = "{ENTITY}"
table = "app.items"
category = "items"
anchor = "created_at"
subjects = ["owner_id"]
{key}
# Two connections per sweep: every invariant below holds under the chaos
# for parallel sweeps too (RS-022).
sweep_parallelism = 2

{first}{second}[[category]]
name = "items"
strategy = "purge"
period = "30d"
audit = "per_row"
"#,
        t1 = TENANTS[0],
        t2 = TENANTS[1],
        first = handler("first"),
        second = handler("second"),
        key = if composite {
            "record_id = [\"id\", \"created_at\"]"
        } else {
            ""
        },
    )
}

struct Workers {
    bin: PathBuf,
    config: PathBuf,
    url: String,
    dir: PathBuf,
    procs: Vec<Option<Child>>,
}

impl Workers {
    fn spawn(&mut self, i: usize) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("worker-{i}.log")))
            .expect("worker log");
        let child = Command::new(&self.bin)
            .arg("--config")
            .arg(&self.config)
            .arg("worker")
            .env("DATABASE_URL", &self.url)
            .env("RUST_LOG", "cohort=warn")
            .env_remove("COHORT_PGTEMP_SETTINGS")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start cohort worker");
        self.procs[i] = Some(child);
    }

    fn signal(&self, i: usize, sig: &str) {
        if let Some(c) = &self.procs[i] {
            let _ = Command::new("kill")
                .args([sig, &c.id().to_string()])
                .status();
        }
    }

    fn kill9(&mut self, i: usize) {
        if let Some(mut c) = self.procs[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGCONT then SIGTERM to every one; waits up to 60 s for each.
    fn stop_all(&mut self) -> Vec<Option<i32>> {
        let mut codes = Vec::new();
        for i in 0..self.procs.len() {
            self.signal(i, "-CONT");
            self.signal(i, "-TERM");
        }
        for slot in &mut self.procs {
            if let Some(mut c) = slot.take() {
                let start = Instant::now();
                loop {
                    if let Ok(Some(status)) = c.try_wait() {
                        // A replica respawned an instant before the end may
                        // get SIGTERM before it installed its handler: the
                        // default action ends it, which is a clean stop too
                        // (systemd counts it as success). Reported as 143.
                        use std::os::unix::process::ExitStatusExt;
                        codes.push(status.code().or(match status.signal() {
                            Some(15) => Some(143),
                            _ => None,
                        }));
                        break;
                    }
                    if start.elapsed() > Duration::from_secs(60) {
                        let _ = c.kill();
                        let _ = c.wait();
                        codes.push(None);
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        codes
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    // Commit timestamps date each audited batch exactly; the harness adds
    // this setting to the cluster it starts. Set before any thread exists.
    std::env::set_var(
        "COHORT_PGTEMP_SETTINGS",
        "track_commit_timestamp=on;max_connections=200",
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(args)) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("soak: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<bool, Box<dyn std::error::Error>> {
    let bin = match args.cohort_bin.clone() {
        Some(b) => b,
        None => std::env::current_exe()?.with_file_name("cohort"),
    };
    if !bin.exists() {
        return Err(format!(
            "{} not found: build it first (cargo build -p cohort-cli) or pass --cohort-bin",
            bin.display()
        )
        .into());
    }
    let duration = Duration::from_secs(args.duration.as_seconds().max(1) as u64);
    println!(
        "soak: seed {} for {}s with {} workers",
        args.seed,
        duration.as_secs(),
        args.workers
    );
    // The chaos loop crashes the server: what was committed before a crash
    // must survive it for the invariants to hold, so commits are written
    // before they return (the throw-away default is off, for speed).
    let mut cluster = cohort_pgtemp::Cluster::start_with_settings("synchronous_commit=on").await?;
    let url = cluster.url().to_string();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(10)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(app_schema(args.composite_key)))
        .execute(&pool)
        .await?;
    sqlx::raw_sql(SCHEMA).execute(&pool).await?;
    cohort::schema::migrate(&mut *pool.acquire().await?, "retention").await?;
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("deliveries.log");
    let config = dir.path().join("cohort.toml");
    let text = policy(&log, args.composite_key);
    std::fs::write(&config, &text)?;
    let cohort = Cohort::builder(pool.clone())
        .policy(PolicyFile::parse(&text)?)
        .build()
        .await?;

    let mut workers = Workers {
        bin,
        config,
        url: url.clone(),
        dir: dir.path().to_path_buf(),
        procs: (0..args.workers).map(|_| None).collect(),
    };
    for i in 0..args.workers {
        workers.spawn(i);
    }
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(load(
        cohort.clone(),
        pool.clone(),
        args.composite_key,
        StdRng::seed_from_u64(args.seed),
        counts.clone(),
        stop.clone(),
    ));

    // The chaos loop, on this task (it owns the cluster and the workers).
    let terminator = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await?;
    let mut rng = StdRng::seed_from_u64(args.seed ^ 0x5eed_c4a0_5000_0001);
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1500..4000))).await;
        let i = rng.random_range(0..args.workers);
        match rng.random_range(0..10) {
            0..=3 => {
                workers.kill9(i);
                counts.kills.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..1500))).await;
                workers.spawn(i);
            }
            4..=6 => {
                workers.signal(i, "-STOP");
                counts.stops.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(rng.random_range(300..3000))).await;
                workers.signal(i, "-CONT");
            }
            7 => {
                cluster
                    .crash_restart(Duration::from_millis(rng.random_range(100..1500)))
                    .await?;
                counts.restarts.fetch_add(1, Ordering::Relaxed);
            }
            8 => {
                // One server session at random (a worker's run, its
                // occurrence lock, a dispatcher's claim, the application's
                // own), as an operator's pg_terminate_backend would.
                let killed: Option<bool> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND backend_type = 'client backend'
                     ORDER BY md5(pid::text || $1::text) LIMIT 1",
                )
                .bind(rng.random::<u32>().to_string())
                .fetch_optional(&terminator)
                .await
                .ok()
                .flatten();
                if killed == Some(true) {
                    counts.terminated.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {}
        }
    }
    stop.store(true, Ordering::SeqCst);
    load.await?;
    let codes = workers.stop_all();

    // Drain: recover runs whose process died, deliver what is left.
    let start = Instant::now();
    loop {
        let report = cohort.dispatcher().flush().await;
        let open: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM retention.sweep_row_handler_status WHERE status IN ('pending', 'in_flight'))
                  + (SELECT count(*) FROM retention.sweep_run WHERE status = 'started')",
        )
        .fetch_one(&pool)
        .await?;
        if open == 0 {
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            println!("soak: the queue did not drain: {open} open, last flush {report:?}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let ok = check(&pool, &log, &counts, &codes, args.composite_key).await?;
    if !ok {
        println!(
            "soak: FAILED with seed {} (rerun: cargo run -p cohort-soak -- --seed {} --duration {}); logs in {}",
            args.seed,
            args.seed,
            args.duration,
            dir.keep().display()
        );
    }
    cluster.stop();
    Ok(ok)
}

/// The application's side: inserts, guarded deletes, holds, releases and
/// erasures at random until `stop`. Errors during outages are counted.
async fn load(
    cohort: Cohort,
    pool: PgPool,
    composite: bool,
    mut rng: StdRng,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
) {
    let entity = Uuid::parse_str(ENTITY).expect("a uuid");
    let mut next_id: i64 = 1;
    let mut holds: Vec<Uuid> = Vec::new();
    let insert = format!(
        "WITH i AS (INSERT INTO app.items VALUES ($1, $2::uuid, $3::uuid, now() - make_interval(days => $4)) RETURNING *) \
         INSERT INTO soak.inserted SELECT i.id, {} FROM i",
        key_expr(composite, "i")
    );
    while !stop.load(Ordering::SeqCst) {
        let result: Result<(), Box<dyn std::error::Error + Send + Sync>> = async {
            match rng.random_range(0..100) {
                0..=34 => {
                    let tenant = TENANTS[rng.random_range(0..2)];
                    let mut tx = pool.begin().await?;
                    for _ in 0..10 {
                        let age_days = rng.random_range(0..60);
                        let owner = subject(rng.random_range(0..SUBJECTS));
                        sqlx::query(sqlx::AssertSqlSafe(insert.clone()))
                            .bind(next_id)
                            .bind(tenant)
                            .bind(owner)
                            .bind(age_days)
                            .execute(&mut *tx)
                            .await?;
                        next_id += 1;
                    }
                    tx.commit().await?;
                    counts.inserted.fetch_add(10, Ordering::Relaxed);
                }
                35..=54 => {
                    let Some((id, tenant, key)) = random_row(&pool, &mut rng).await? else { return Ok(()) };
                    let outcome = cohort
                        .guarded_delete(
                            GuardedDeletion::new(entity, [key.clone()]).tenant(tenant),
                            move |tx| {
                                Box::pin(async move {
                                    sqlx::query("DELETE FROM app.items WHERE id = $1").bind(id).execute(&mut *tx).await?;
                                    sqlx::query("INSERT INTO soak.app_deleted (id, key) VALUES ($1, $2)").bind(id).bind(key).execute(&mut *tx).await?;
                                    Ok(())
                                })
                            },
                        )
                        .await;
                    match outcome {
                        Ok(Guarded::Completed(())) => counts.app_deleted.fetch_add(1, Ordering::Relaxed),
                        Ok(Guarded::Protected { .. }) => counts.app_protected.fetch_add(1, Ordering::Relaxed),
                        Err(cohort::Error::NotFound(_)) => 0, // swept meanwhile
                        Err(e) => return Err(e.into()),
                    };
                }
                55..=74 => {
                    let Some((_, tenant, key)) = random_row(&pool, &mut rng).await? else { return Ok(()) };
                    match cohort
                        .create_hold(HoldRequest::new(entity, key.clone(), "soak").tenant(tenant))
                        .await
                    {
                        Ok(hold) => {
                            sqlx::query("INSERT INTO soak.holds (hold_id, record_id, acked_at) VALUES ($1, $2, clock_timestamp())")
                                .bind(hold.hold_id)
                                .bind(key)
                                .execute(&pool)
                                .await?;
                            holds.push(hold.hold_id);
                            counts.holds.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(cohort::Error::NotFound(_)) => {} // gone meanwhile
                        Err(e) => return Err(e.into()),
                    }
                }
                75..=89 => {
                    if holds.is_empty() {
                        return Ok(());
                    }
                    let hold = holds.swap_remove(rng.random_range(0..holds.len()));
                    sqlx::query("UPDATE soak.holds SET release_requested_at = clock_timestamp() WHERE hold_id = $1")
                        .bind(hold)
                        .execute(&pool)
                        .await?;
                    cohort.release_hold(hold).await?;
                    counts.releases.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    let tenant = TENANTS[rng.random_range(0..2)];
                    let who = subject(rng.random_range(0..SUBJECTS));
                    cohort
                        .erase(cohort::erasure::ErasureRequest::tenanted(
                            tenant,
                            cohort::erasure::ErasureScope::new(who),
                            chrono::Utc::now(),
                        ))
                        .await?;
                    counts.erasures.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(())
        }
        .await;
        if result.is_err() {
            counts.errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..60))).await;
    }
}

/// A row at random: its id, tenant and key text (as `soak.inserted` has it).
async fn random_row(
    pool: &PgPool,
    rng: &mut StdRng,
) -> Result<Option<(i64, String, String)>, sqlx::Error> {
    let pick: f64 = rng.random();
    sqlx::query_as(
        "SELECT t.id, t.tenant_id::text, i.key FROM app.items t JOIN soak.inserted i USING (id) WHERE t.id >= (SELECT COALESCE(min(id), 0) + floor($1 * (COALESCE(max(id), 0) - COALESCE(min(id), 0) + 1)) FROM app.items) ORDER BY t.id LIMIT 1",
    )
    .bind(pick)
    .fetch_optional(pool)
    .await
}

/// Every invariant, each printed with its figures; true when all hold.
async fn check(
    pool: &PgPool,
    log: &Path,
    counts: &Counts,
    codes: &[Option<i32>],
    composite: bool,
) -> Result<bool, Box<dyn std::error::Error>> {
    println!(
        "soak: counts: inserted {}, deleted by the application {} (protected {}), holds {} (released {}), erasures {}, load errors during outages {}, kill -9 {}, SIGSTOP {}, server crashes {}, backends terminated {}",
        counts.inserted.load(Ordering::Relaxed),
        counts.app_deleted.load(Ordering::Relaxed),
        counts.app_protected.load(Ordering::Relaxed),
        counts.holds.load(Ordering::Relaxed),
        counts.releases.load(Ordering::Relaxed),
        counts.erasures.load(Ordering::Relaxed),
        counts.errors.load(Ordering::Relaxed),
        counts.kills.load(Ordering::Relaxed),
        counts.stops.load(Ordering::Relaxed),
        counts.restarts.load(Ordering::Relaxed),
        counts.terminated.load(Ordering::Relaxed),
    );
    let mut ok = true;
    let mut verdict = |name: &str, holds: bool, detail: String| {
        println!(
            "soak: {} {name}: {detail}",
            if holds { "ok  " } else { "FAIL" }
        );
        ok &= holds;
    };
    let one = |sql: String| async move {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
            .fetch_one(pool)
            .await
    };

    // 1. No row mutated under a hold that was acknowledged before the batch
    //    (or the guarded deletion) began and not yet asked to be released
    //    when it committed.
    let by_cohort = one("SELECT count(*) FROM retention.sweep_run_row_detail d JOIN soak.holds h ON h.record_id = d.record_id
        WHERE h.acked_at < d.recorded_at
          AND (h.release_requested_at IS NULL OR h.release_requested_at > pg_xact_commit_timestamp(d.xmin))".into()).await?;
    let by_app = one("SELECT count(*) FROM soak.app_deleted a JOIN soak.holds h ON h.record_id = a.key
        WHERE h.acked_at < a.at
          AND (h.release_requested_at IS NULL OR h.release_requested_at > pg_xact_commit_timestamp(a.xmin))".into()).await?;
    verdict(
        "no row mutated under an active hold",
        by_cohort == 0 && by_app == 0,
        format!("{by_cohort} by Cohort, {by_app} by the application"),
    );

    // 2. Every vanished row has exactly one ledger entry or one application
    //    deletion; no ledger entry for a row that still exists.
    let vanished = one("SELECT count(*) FROM soak.inserted i WHERE NOT EXISTS (SELECT 1 FROM app.items t WHERE t.id = i.id)".into()).await?;
    // (Aggregated once and joined: correlated counts are quadratic at the
    // sizes an hour-long soak reaches.)
    let unexplained = one(
        "WITH d AS (SELECT record_id, count(*) AS n FROM retention.sweep_run_row_detail GROUP BY 1),
             a AS (SELECT key AS record_id, count(*) AS n FROM soak.app_deleted GROUP BY 1)
        SELECT count(*) FROM soak.inserted i
        LEFT JOIN app.items t ON t.id = i.id
        LEFT JOIN d ON d.record_id = i.key
        LEFT JOIN a ON a.record_id = i.key
        WHERE t.id IS NULL AND COALESCE(d.n, 0) + COALESCE(a.n, 0) <> 1"
        .into(),
    )
    .await?;
    let phantom = one(format!(
        "SELECT count(*) FROM retention.sweep_run_row_detail d JOIN app.items t ON {} = d.record_id",
        key_expr(composite, "t")
    ))
    .await?;
    // Every detail names a key the application inserted, in the same text.
    let strangers = one("SELECT count(*) FROM retention.sweep_run_row_detail d
        WHERE NOT EXISTS (SELECT 1 FROM soak.inserted i WHERE i.key = d.record_id)"
        .into())
    .await?;
    let audited = one("SELECT count(*) FROM retention.sweep_run_row_detail".into()).await?;
    verdict("every mutation audited once, no audit without its mutation", unexplained == 0 && phantom == 0 && strangers == 0,
        format!("{vanished} rows gone: {audited} by Cohort (audited), {} by the application; {unexplained} unexplained, {phantom} phantom, {strangers} details naming no inserted key", counts.app_deleted.load(Ordering::Relaxed)));

    // 3. Summaries equal their details, run by run.
    let mismatched = one(
        "WITH s AS (SELECT run_id, sum(affected_count) AS n FROM retention.sweep_run_entity_summary GROUP BY 1),
             d AS (SELECT run_id, count(*) AS n FROM retention.sweep_run_row_detail GROUP BY 1)
        SELECT count(*) FROM retention.sweep_run r LEFT JOIN s USING (run_id) LEFT JOIN d USING (run_id)
        WHERE COALESCE(s.n, 0) <> COALESCE(d.n, 0)"
        .into(),
    )
    .await?;
    let runs = one("SELECT count(*) FROM retention.sweep_run".into()).await?;
    verdict(
        "summaries equal their row details",
        mismatched == 0,
        format!("{runs} runs, {mismatched} mismatched"),
    );

    // 4. Each pass of each occurrence ran to its end at most once: the
    //    replicas share the passes, and only an interrupted attempt (its
    //    run cancelled, or recovered after its replica was lost) is swept
    //    again. A finished pass never is, whatever was killed.
    let twice = one("SELECT count(*) FROM (SELECT 1 FROM retention.sweep_run
        WHERE trigger = 'scheduled' AND kind = 'sweep'
          AND status IN ('succeeded', 'partially_failed', 'failed')
          AND (error IS NULL OR error NOT LIKE 'run: recovered:%')
        GROUP BY occurrence, dry_run, policy_fingerprint, occurrence_pass HAVING count(*) > 1) x"
        .into())
    .await?;
    let occurrences = one(
        "SELECT count(DISTINCT occurrence) FROM retention.sweep_run WHERE trigger = 'scheduled'"
            .into(),
    )
    .await?;
    // Every pass of a completed occurrence is done, with its run.
    let incomplete = one("SELECT count(*) FROM retention.sweep_occurrence o
         JOIN retention.sweep_occurrence_pass p USING (occurrence_id)
         WHERE o.completed_at IS NOT NULL AND p.status <> 'done'"
        .into())
    .await?;
    let claimers = one(
        "SELECT count(DISTINCT claimed_by) FROM retention.sweep_occurrence_pass WHERE status = 'done'"
        .into(),
    )
    .await?;
    verdict(
        "each pass of each occurrence ran to its end once; interrupted passes were swept again",
        twice == 0 && incomplete == 0 && occurrences > 0,
        format!(
            "{occurrences} occurrences, {twice} passes finished twice, {incomplete} passes of completed occurrences not done, {claimers} replicas ran passes"
        ),
    );

    // 5. Handler work: every piece terminal, one per handler per audited
    //    row, each delivered one logged at least once, `first` before
    //    `second` for every row.
    let open = one("SELECT count(*) FROM retention.sweep_row_handler_status WHERE status NOT IN ('succeeded', 'dead_lettered')".into()).await?;
    let missing = one(
        "WITH h AS (SELECT row_detail_id, count(*) AS n FROM retention.sweep_row_handler_status GROUP BY 1)
        SELECT count(*) FROM retention.sweep_run_row_detail d LEFT JOIN h USING (row_detail_id)
        WHERE COALESCE(h.n, 0) <> 2"
        .into(),
    )
    .await?;
    let delivered: Vec<(String, String)> = sqlx::query_as(
        "SELECT d.record_id, h.handler_id FROM retention.sweep_row_handler_status h JOIN retention.sweep_run_row_detail d USING (row_detail_id) WHERE h.status = 'succeeded'",
    )
    .fetch_all(pool)
    .await?;
    let dead = one(
        "SELECT count(*) FROM retention.sweep_row_handler_status WHERE status = 'dead_lettered'"
            .into(),
    )
    .await?;
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut first_seen: std::collections::HashMap<(String, String), usize> = Default::default();
    for (line_no, line) in text.lines().enumerate() {
        let Ok(doc) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let key = (
            record_text(&doc["record_id"]),
            doc["handler"].as_str().unwrap_or("").to_string(),
        );
        first_seen.entry(key).or_insert(line_no);
    }
    let lost = delivered
        .iter()
        .filter(|k| !first_seen.contains_key(*k))
        .count();
    let out_of_order = first_seen
        .iter()
        .filter(|((record, handler), at)| {
            handler == "second"
                && first_seen
                    .get(&(record.clone(), "first".to_string()))
                    .is_some_and(|f| f > at)
        })
        .count();
    verdict("handler work: all terminal, none lost, in order",
        open == 0 && missing == 0 && lost == 0 && out_of_order == 0,
        format!("{} delivered, {dead} dead-lettered, {open} open, {missing} rows without both handlers, {lost} delivered but never logged, {out_of_order} out of order", delivered.len()));

    // 6. The workers stopped cleanly at the end.
    let clean = codes.iter().all(|c| matches!(c, Some(0) | Some(143)));
    verdict(
        "workers stop on SIGTERM (exit 0, or 143 when still starting)",
        clean,
        format!("{codes:?}"),
    );

    Ok(ok)
}

/// A handler document's `record_id` as the ledger writes it: the string,
/// or a composite key's array as `jsonb` prints it (`[1, "…"]`).
fn record_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(parts) => format!(
            "[{}]",
            parts
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => String::new(),
    }
}
