//! `cohort worker` as operators run it: several real processes on one real
//! database, a schedule that fires every few seconds, replicas killed with
//! SIGKILL, stopped with SIGTERM, clocks skewed, the kill switch flipped
//! from another process.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL
use crate::support::cli;
use crate::support::scenario::scenario;

use cli::{cohort_with_env as cohort, command};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::wait;
use wait::{wait_until, wait_until_blocking};

use chrono::{DateTime, Utc};
use cohort_pgtemp::TestDatabase;
use sqlx::PgPool;

const T1: &str = "11111111-1111-1111-1111-111111111111";
const T2: &str = "22222222-2222-2222-2222-222222222222";

/// Two tenants and one tenantless entity: three passes per occurrence.
fn policy(schedule: &str, batch: u32, extra: &str) -> String {
    format!(
        r#"
[cohort]
schema = "retention"
schedule = "{schedule}"
sweep_batch_size = {batch}
{extra}

[[tenant]]
id = "{T1}"

[[tenant]]
id = "{T2}"

[[entity]]
name = "SessionNote"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.session_notes"
category = "notes"
anchor = "created_at"

[[entity]]
name = "Event"
id = "5b0bf2f4-3f0e-4a57-8d3c-2f1f7f0c9a11"
table = "app.events"
category = "notes"
anchor = "created_at"
tenantless = true

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
"#
    )
}

const TABLES: &str = "CREATE SCHEMA app;
    CREATE TABLE app.session_notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, body text);
    CREATE INDEX ON app.session_notes (tenant_id, created_at);
    CREATE TABLE app.events (id bigint PRIMARY KEY, created_at timestamptz);";

/// A per-row delay on deletion, so a sweep lasts long enough to be
/// interrupted.
const SLOW: &str = "CREATE FUNCTION app.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.002); RETURN OLD; END $$;
    CREATE TRIGGER slow BEFORE DELETE ON app.session_notes FOR EACH ROW EXECUTE FUNCTION app.slow();";

async fn setup(policy_text: &str) -> (TestDatabase, tempfile::TempDir) {
    let (db, dir) = scenario(TABLES, policy_text).await;
    let out = cohort(dir.path(), &["migrate"], db.url(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    (db, dir)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `cohort worker` processes owned by a test. Each one's connections carry
/// its name as their application name (so the test can tell which replica
/// holds a lock) and its log goes to a file. Dropping the set kills every
/// process not yet waited for, so a failed assertion never leaves workers
/// running (and a pid is never signalled after it was reaped).
struct Replicas {
    dir: std::path::PathBuf,
    url: String,
    procs: Vec<(String, Option<Child>)>,
}

impl Replicas {
    fn new(dir: &Path, url: &str) -> Self {
        Self {
            dir: dir.to_path_buf(),
            url: url.to_string(),
            procs: Vec::new(),
        }
    }

    fn log_path(&self, name: &str) -> std::path::PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn spawn(&mut self, name: &str, env: &[(&str, &str)]) {
        self.spawn_with(name, &["worker"], env);
    }

    /// A replica started with these arguments (e.g. another `--config`).
    fn spawn_with(&mut self, name: &str, args: &[&str], env: &[(&str, &str)]) {
        let url = format!("{}&application_name={name}", self.url);
        let log = std::fs::File::create(self.log_path(name)).unwrap();
        let child = command(&self.dir, args, url.as_str(), env)
            .env("RUST_LOG", "cohort=info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start cohort worker");
        self.procs.push((name.to_string(), Some(child)));
    }

    fn child(&mut self, name: &str) -> &mut Option<Child> {
        &mut self
            .procs
            .iter_mut()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no replica named {name:?}"))
            .1
    }

    /// The replica whose process id is `pid`.
    fn name_of(&self, pid: u32) -> String {
        self.procs
            .iter()
            .find(|(_, c)| c.as_ref().is_some_and(|c| c.id() == pid))
            .map(|(n, _)| n.clone())
            .unwrap_or_else(|| panic!("no running replica has pid {pid}"))
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    /// SIGKILL, and reap it.
    fn kill9(&mut self, name: &str) {
        let mut child = self.child(name).take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGTERM; the exit code and the log once it has exited. Panics if it
    /// takes longer than `within`.
    fn terminate(&mut self, name: &str, within: Duration) -> (Option<i32>, String) {
        let mut child = self.child(name).take().expect("running");
        let ok = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM failed");
        let mut status = None;
        let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until_blocking(&format!("{name} to stop after SIGTERM"), within, || {
                status = child.try_wait().unwrap();
                status.is_some()
            })
        }));
        if stopped.is_err() {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{name} did not stop within {within:?} of SIGTERM:\n{}",
                self.log(name)
            );
        }
        (status.and_then(|s| s.code()), self.log(name))
    }

    /// SIGTERM to each still running, in order; each must exit 0.
    fn terminate_all(&mut self) -> Vec<(String, String)> {
        let names: Vec<String> = self
            .procs
            .iter()
            .filter(|(_, c)| c.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        names
            .into_iter()
            .map(|n| {
                let (code, log) = self.terminate(&n, Duration::from_secs(30));
                assert_eq!(code, Some(0), "{n} exit:\n{log}");
                (n, log)
            })
            .collect()
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for (_, child) in &mut self.procs {
            if let Some(mut c) = child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

async fn insert_rows(pool: &PgPool, notes_per_tenant: i64, events: i64) {
    sqlx::query(
        "INSERT INTO app.session_notes
         SELECT g + t.n * 1000000, t.id, now() - interval '400 days' - make_interval(secs => g), 'n'
         FROM generate_series(1, $1) g,
              (VALUES (1, $2::uuid), (2, $3::uuid)) AS t(n, id)",
    )
    .bind(notes_per_tenant)
    .bind(T1)
    .bind(T2)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO app.events SELECT g, now() - interval '400 days' FROM generate_series(1, $1) g",
    )
    .bind(events)
    .execute(pool)
    .await
    .unwrap();
}

/// Scheduled runs: (occurrence, dry_run, tenant, status, logical_now, error).
async fn scheduled(
    pool: &PgPool,
) -> Vec<(
    DateTime<Utc>,
    bool,
    Option<String>,
    String,
    DateTime<Utc>,
    Option<String>,
)> {
    sqlx::query_as(
        "SELECT occurrence, dry_run, tenant_id, status, logical_now, error FROM retention.sweep_run
         WHERE trigger = 'scheduled' ORDER BY started_at",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Debian's libfaketime, which makes a process's wall clock read off by a
/// fixed amount.
fn libfaketime() -> String {
    let found = std::fs::read_dir("/usr/lib")
        .unwrap()
        .filter_map(|d| d.ok())
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.exists());
    found
        .expect("libfaketime is not installed (apt-get install faketime; .ci/run does)")
        .display()
        .to_string()
}

/// READY-006, RS-011: three replicas (one configured dry-run, two with
/// wall clocks an hour off either way) over several occurrences: exactly
/// one run per pass per occurrence of each kind; the dry-run replica never
/// stands in for the real sweep; cutoffs follow the database clock.
#[tokio::test]
async fn three_worker_replicas_run_each_occurrence_once() {
    let (db, dir) = setup(&policy("*/3 * * * * *", 500, "")).await;
    let dir = dir.path();
    insert_rows(db.pool(), 50, 50).await;
    let mut replicas = Replicas::new(dir, db.url());
    // Their wall clocks really are an hour off (libfaketime, Debian's
    // faketime package: .ci/run installs it); the database's is not.
    let faketime = libfaketime();
    let skewed = |offset: &'static str| {
        [
            ("LD_PRELOAD", faketime.clone()),
            ("FAKETIME", offset.to_string()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        ]
    };
    let ahead = skewed("+1h");
    let behind = skewed("-1h");
    replicas.spawn("w-ahead", &ahead.each_ref().map(|(k, v)| (*k, v.as_str())));
    replicas.spawn(
        "w-behind",
        &behind.each_ref().map(|(k, v)| (*k, v.as_str())),
    );
    replicas.spawn("w-dry", &[("COHORT_DRY_RUN", "true")]);
    // At least three real occurrences with all their passes settled.
    wait_until(
        "three real occurrences",
        Duration::from_secs(40),
        async || {
            let runs = scheduled(db.pool()).await;
            let mut done: BTreeMap<DateTime<Utc>, usize> = BTreeMap::new();
            for r in runs.iter().filter(|r| !r.1 && r.3 != "started") {
                *done.entry(r.0).or_default() += 1;
            }
            done.values().filter(|&&n| n == 3).count() >= 3
        },
    )
    .await;
    let logs: Vec<String> = replicas
        .terminate_all()
        .into_iter()
        .map(|(_, l)| l)
        .collect();
    let runs = scheduled(db.pool()).await;
    // A pass whose replica was stopped by its SIGTERM (a cancelled run) is
    // swept again, whole, by another replica. Every other pass of every
    // occurrence runs exactly once, whichever replica takes it.
    let interrupted: std::collections::BTreeSet<(DateTime<Utc>, bool, Option<String>)> = runs
        .iter()
        .filter(|r| r.3 == "cancelled")
        .map(|r| (r.0, r.1, r.2.clone()))
        .collect();
    let mut per: BTreeMap<(DateTime<Utc>, bool, Option<String>), usize> = BTreeMap::new();
    for (occurrence, dry, tenant, status, logical_now, error) in &runs {
        if !interrupted.contains(&(*occurrence, *dry, tenant.clone())) {
            *per.entry((*occurrence, *dry, tenant.clone())).or_default() += 1;
        }
        // The cutoffs come from the occurrence, on the database clock.
        assert_eq!(logical_now, occurrence);
        assert_eq!(occurrence.timestamp_subsec_nanos(), 0);
        assert!(
            status == "succeeded" || status == "cancelled",
            "{status} {error:?}"
        );
    }
    let doubled: Vec<_> = per.iter().filter(|(_, &n)| n > 1).collect();
    assert!(doubled.is_empty(), "an occurrence ran twice: {doubled:?}");
    let real: Vec<_> = per.keys().filter(|k| !k.1).collect();
    let dry: Vec<_> = per.keys().filter(|k| k.1).collect();
    assert!(real.len() >= 9, "{real:?}");
    assert!(
        !dry.is_empty(),
        "the dry-run replica ran its own occurrences"
    );
    // Consecutive real occurrences are 3 s apart: none was skipped while
    // all three replicas were up (the first may predate the others).
    let occurrences: Vec<DateTime<Utc>> = {
        let mut o: Vec<_> = real.iter().map(|k| k.0).collect();
        o.dedup();
        o
    };
    for pair in occurrences.windows(2) {
        assert_eq!(
            (pair[1] - pair[0]).num_seconds(),
            3,
            "an occurrence was skipped: {occurrences:?}"
        );
    }
    // The rows were purged by the real sweeps, not by the dry one.
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM app.session_notes) + (SELECT count(*) FROM app.events)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(left, 0);
    // The two real replicas shared the passes: each ran some.
    let claimers: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT p.claimed_by FROM retention.sweep_occurrence_pass p
         JOIN retention.sweep_occurrence o USING (occurrence_id)
         WHERE NOT o.dry_run AND p.status = 'done'",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(
        claimers.len() >= 2,
        "one replica ran every pass: {claimers:?}"
    );
    // The skewed replicas noticed their clocks and scheduled by the database's.
    assert!(
        logs[0].contains("differs from the database")
            && logs[1].contains("differs from the database"),
        "skew warnings missing:\n{}\n{}",
        logs[0],
        logs[1]
    );
}

/// RS-023: two replicas share an occurrence's passes; the kill -9 of the
/// replica running one pass mid-sweep: the survivor settles that pass's
/// run failed (owner lost) and sweeps that pass again, whole, while the
/// passes that had finished are never swept again.
#[tokio::test]
async fn a_killed_replica_s_pass_is_swept_again_by_another_and_finished_passes_are_not() {
    let (db, dir) = setup(&policy("*/30 * * * * *", 100, "")).await;
    let dir = dir.path();
    insert_rows(db.pool(), 1500, 10).await;
    sqlx::raw_sql(SLOW).execute(db.pool()).await.unwrap();
    let mut replicas = Replicas::new(dir, db.url());
    replicas.spawn("w-a", &[]);
    replicas.spawn("w-b", &[]);
    // Wait for a pass under way with some batches committed.
    wait_until("a sweep under way", Duration::from_secs(45), async || {
        let committed: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(affected_count), 0)::int8 FROM retention.sweep_run_entity_summary",
        )
        .fetch_one(db.pool())
        .await
        .unwrap();
        committed >= 200
    })
    .await;
    // A run in progress, and the replica whose claim it runs under.
    let mut started = None;
    wait_until("a scheduled run in progress", Duration::from_secs(5), async || {
        started = sqlx::query_as::<_, (DateTime<Utc>, i32, uuid::Uuid, String)>(
            "SELECT r.occurrence, r.occurrence_pass, r.run_id, p.claimed_by
             FROM retention.sweep_run r
             JOIN retention.sweep_occurrence o ON o.occurrence = r.occurrence AND NOT o.dry_run
             JOIN retention.sweep_occurrence_pass p ON p.occurrence_id = o.occurrence_id AND p.pass = r.occurrence_pass
             WHERE r.status = 'started' AND r.trigger = 'scheduled' AND p.status = 'claimed'
             LIMIT 1",
        )
        .fetch_optional(db.pool())
        .await
        .unwrap();
        started.is_some()
    })
    .await;
    let (occurrence, pass, orphan_id, claimed_by) = started.expect("a run in progress");
    let pid: u32 = claimed_by.rsplit(':').next().unwrap().parse().unwrap();
    let owner = replicas.name_of(pid);
    replicas.kill9(&owner);
    // Killed mid-run: the run had not settled by itself.
    let status: String =
        sqlx::query_scalar("SELECT status FROM retention.sweep_run WHERE run_id = $1")
            .bind(orphan_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_ne!(status, "succeeded", "the kill landed mid-run");
    // The survivor takes the pass over and the occurrence completes
    // before the next one is due.
    wait_until("the occurrence completed", Duration::from_secs(25), async || {
        let done: Option<bool> = sqlx::query_scalar(
            "SELECT completed_at IS NOT NULL FROM retention.sweep_occurrence WHERE occurrence = $1 AND NOT dry_run",
        )
        .bind(occurrence)
        .fetch_optional(db.pool())
        .await
        .unwrap();
        done == Some(true)
    })
    .await;
    let (status, error): (String, Option<String>) =
        sqlx::query_as("SELECT status, error FROM retention.sweep_run WHERE run_id = $1")
            .bind(orphan_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(status, "failed");
    assert!(error.unwrap_or_default().contains("owner lost"));
    // Every pass ran to its end exactly once; the killed one also has its
    // interrupted run.
    let runs: Vec<(i32, String, Option<String>)> = sqlx::query_as(
        "SELECT occurrence_pass, status, error FROM retention.sweep_run
         WHERE occurrence = $1 AND NOT dry_run ORDER BY occurrence_pass, started_at",
    )
    .bind(occurrence)
    .fetch_all(db.pool())
    .await
    .unwrap();
    for p in 1..=3 {
        let of: Vec<_> = runs.iter().filter(|r| r.0 == p).collect();
        let finished = of.iter().filter(|r| r.1 == "succeeded").count();
        assert_eq!(finished, 1, "pass {p} ran to its end once: {runs:?}");
        let expected = if p == pass { 2 } else { 1 };
        assert_eq!(of.len(), expected, "pass {p}: {runs:?}");
    }
    let (attempts, by): (i32, String) = sqlx::query_as(
        "SELECT p.attempts, p.claimed_by FROM retention.sweep_occurrence_pass p
         JOIN retention.sweep_occurrence o USING (occurrence_id)
         WHERE o.occurrence = $1 AND NOT o.dry_run AND p.pass = $2 AND p.status = 'done'",
    )
    .bind(occurrence)
    .bind(pass)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(attempts, 2);
    assert_ne!(by, claimed_by, "the survivor finished the pass");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM app.session_notes")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "the re-run finished the work");
    replicas.terminate_all();
}

/// RS-012: SIGTERM during a long sweep: exit 0 within the grace period,
/// the run settled Cancelled, every committed batch audited, nothing
/// half-done.
#[tokio::test]
async fn sigterm_mid_sweep_cancels_the_run_and_exits_zero() {
    let (db, dir) = setup(&policy("*/2 * * * * *", 100, "")).await;
    let dir = dir.path();
    insert_rows(db.pool(), 3000, 10).await;
    sqlx::raw_sql(SLOW).execute(db.pool()).await.unwrap();
    let mut replicas = Replicas::new(dir, db.url());
    replicas.spawn("w-term", &[]);
    wait_until("batches committed", Duration::from_secs(30), async || {
        let committed: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(affected_count), 0)::int8 FROM retention.sweep_run_entity_summary",
        )
        .fetch_one(db.pool())
        .await
        .unwrap();
        committed >= 300
    })
    .await;
    let start = Instant::now();
    let (code, err) = replicas.terminate("w-term", Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30));
    let runs = scheduled(db.pool()).await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].3, "cancelled");
    let audited: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(affected_count), 0)::int8 FROM retention.sweep_run_entity_summary",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM app.session_notes")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        6000 - left,
        audited,
        "every deletion audited, no other row gone"
    );
    assert_eq!(audited % 100, 0, "whole batches only");
    assert!(left > 0, "the stop landed mid-sweep");
}

/// RS-027: `cohort pause ENTITY` from another process reaches every
/// replica without a restart: their scheduled runs skip it and settle
/// `paused`; `cohort resume` lets the next occurrence sweep it. The live
/// pacing commands follow the contract (JSON, bad input exits 2).
#[tokio::test]
async fn a_pause_reaches_every_replica_until_resume() {
    let (db, dir) = setup(&policy("*/2 * * * * *", 100, "")).await;
    let dir = dir.path();
    insert_rows(db.pool(), 50, 10).await;
    let out = cohort(dir, &["--json", "pause", "SessionNote"], db.url(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["entity"], "SessionNote");
    assert_eq!(rows[0]["paused"], true);
    let mut replicas = Replicas::new(dir, db.url());
    for n in ["w-1", "w-2"] {
        replicas.spawn(n, &[]);
    }
    let paused_runs = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM retention.sweep_run r JOIN retention.sweep_run_entity_summary s USING (run_id)
             WHERE r.trigger = 'scheduled' AND r.status = 'paused' AND s.entity_type = 'SessionNote' AND s.paused",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    let events_left = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM app.events")
            .fetch_one(db.pool())
            .await
            .unwrap()
    };
    wait_until(
        "runs that skipped the paused entity, and the other entity swept",
        Duration::from_secs(30),
        async || paused_runs().await >= 2 && events_left().await == 0,
    )
    .await;
    let notes: i64 = sqlx::query_scalar("SELECT count(*) FROM app.session_notes")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(notes, 100, "no paused row changed");
    // A pause is counted as a pause, not as skipped rows (issue 55, C2),
    // in the ledger and in the text of `runs show`, which also has the
    // swept table's `table:` line (C3).
    let (skipped, note, run_id): (i64, String, uuid::Uuid) = sqlx::query_as(
        "SELECT s.skipped_count, s.note, r.run_id FROM retention.sweep_run r
         JOIN retention.sweep_run_entity_summary s USING (run_id)
         WHERE r.status = 'paused' AND s.entity_type = 'SessionNote' AND s.paused
         ORDER BY r.started_at DESC LIMIT 1",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(skipped, 0, "{note}");
    assert!(
        note.contains("eligible rows left by the pause, not skipped"),
        "{note}"
    );
    let shown = cohort(dir, &["runs", "show", &run_id.to_string()], db.url(), &[]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("(paused)"), "{text}");
    assert!(text.contains("left by the pause"), "{text}");
    assert!(text.contains("table: "), "{text}");
    assert_eq!(
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM retention.sweep_run WHERE status = 'succeeded' AND tenant_id IS NOT NULL"
        )
        .fetch_one(db.pool())
        .await
        .unwrap(),
        0,
        "a tenant pass with the paused entity never settles succeeded"
    );

    let out = cohort(dir, &["resume", "SessionNote"], db.url(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("resumed SessionNote"));
    wait_until(
        "the resumed entity swept",
        Duration::from_secs(30),
        async || {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM app.session_notes")
                .fetch_one(db.pool())
                .await
                .unwrap()
                == 0
        },
    )
    .await;
    drop(replicas);

    // Live limits through the CLI, for one entity and for every entity.
    let out = cohort(
        dir,
        &[
            "--json",
            "settings",
            "set",
            "max_rows_per_second",
            "500",
            "--entity",
            "SessionNote",
        ],
        db.url(),
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = cohort(
        dir,
        &["--json", "settings", "set", "max_replica_lag", "30s"],
        db.url(),
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pacing = shown["pacing"].as_array().unwrap();
    assert_eq!(
        pacing[0]["entity"],
        serde_json::Value::Null,
        "every entity first"
    );
    assert_eq!(pacing[0]["max_replica_lag_ms"], 30_000);
    assert_eq!(pacing[1]["entity"], "SessionNote");
    assert_eq!(pacing[1]["max_rows_per_second"], 500);
    assert_eq!(pacing[1]["paused"], false);
    let before = pacing.clone();
    for bad in [
        vec!["pause", "NoSuchEntity"],
        vec!["settings", "set", "max_rows_per_second", "0"],
        vec!["settings", "set", "max_replica_lag", "1mo"],
        vec![
            "settings",
            "set",
            "kill_switch",
            "on",
            "--entity",
            "SessionNote",
        ],
        vec![
            "settings",
            "set",
            "max_rows_per_second",
            "10",
            "--entity",
            "Nope",
        ],
    ] {
        let out = cohort(dir, &bad, db.url(), &[]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
    }
    let out = cohort(dir, &["--json", "settings", "show"], db.url(), &[]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        shown["pacing"].as_array().unwrap(),
        &before,
        "bad input changed nothing"
    );
    assert_eq!(shown["kill_switch"], false);
}

/// READY-005, RS-010: `cohort settings set kill_switch on` from another
/// process while replicas are mid-occurrence: the pass in progress
/// finishes, later passes and occurrences are skipped; switched off, the
/// next occurrence runs.
#[tokio::test]
async fn the_database_kill_switch_reaches_every_replica() {
    let (db, dir) = setup(&policy("*/3 * * * * *", 100, "")).await;
    let dir = dir.path();
    insert_rows(db.pool(), 3000, 10).await;
    sqlx::raw_sql(SLOW).execute(db.pool()).await.unwrap();
    let mut replicas = Replicas::new(dir, db.url());
    for n in ["w-1", "w-2", "w-3"] {
        replicas.spawn(n, &[]);
    }
    wait_until(
        "the first pass under way",
        Duration::from_secs(30),
        async || {
            let committed: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(affected_count), 0)::int8 FROM retention.sweep_run_entity_summary",
        )
        .fetch_one(db.pool())
        .await
        .unwrap();
            committed >= 100
        },
    )
    .await;
    let out = cohort(
        dir,
        &["--json", "settings", "set", "kill_switch", "on"],
        db.url(),
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["kill_switch"], true);
    assert_eq!(shown["sources"]["kill_switch"]["database"], true);
    // The passes in progress (the replicas share the occurrence's three)
    // finish; nothing else starts.
    wait_until(
        "the open passes to settle",
        Duration::from_secs(30),
        async || scheduled(db.pool()).await.iter().all(|r| r.3 != "started"),
    )
    .await;
    let before = scheduled(db.pool()).await;
    assert!(
        (1..=3).contains(&before.len()),
        "only the passes in progress ran: {before:?}"
    );
    assert!(
        before.iter().all(|r| r.3 == "succeeded"),
        "the passes in progress finished: {before:?}"
    );
    // Two more occurrences come and are skipped by the switch (the
    // replicas log each), and nothing ran meanwhile.
    let skipped = || {
        ["w-1", "w-2", "w-3"]
            .iter()
            .map(|n| {
                replicas
                    .log(n)
                    .matches("outcome=kill_switch passes=0 ")
                    .count()
            })
            .sum::<usize>()
    };
    let seen = skipped();
    wait_until(
        "two occurrences skipped by the kill switch",
        Duration::from_secs(30),
        async || skipped() >= seen + 2,
    )
    .await;
    let during = scheduled(db.pool()).await;
    assert_eq!(
        during.len(),
        before.len(),
        "no run while the switch is on: {during:?}"
    );
    let out = cohort(
        dir,
        &["--json", "settings", "set", "kill_switch", "off"],
        db.url(),
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    wait_until(
        "an occurrence after the switch is off",
        Duration::from_secs(40),
        async || {
            scheduled(db.pool())
                .await
                .iter()
                .filter(|r| r.3 == "succeeded" && r.2.is_none())
                .count()
                > before.iter().filter(|r| r.2.is_none()).count()
        },
    )
    .await;
    for (name, log) in replicas.terminate_all() {
        assert!(log.contains("kill switch"), "{name}:\n{log}");
    }
}

/// `cohort settings` and `cohort prune` follow the CLI contract: JSON
/// shapes, bad names exit 2, nothing to prune without limits.
#[tokio::test]
async fn settings_and_prune_commands_follow_the_contract() {
    let (db, dir) = setup(&policy("0 2 * * *", 100, "kill_switch = true")).await;
    let dir = dir.path();
    let out = cohort(dir, &["--json", "settings", "show"], db.url(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kill_switch"], true, "configuration OR database");
    assert_eq!(v["dry_run"], false);
    assert_eq!(v["sources"]["kill_switch"]["configuration"], true);
    assert_eq!(v["sources"]["kill_switch"]["database"], false);
    let out = cohort(dir, &["settings", "set", "dry_run", "on"], db.url(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("dry_run") && text.contains("on"), "{text}");
    for bad in [
        vec!["settings", "set", "killswitch", "on"],
        vec!["settings", "set", "dry_run", "maybe"],
    ] {
        let out = cohort(dir, &bad, db.url(), &[]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
    let out = cohort(dir, &["--json", "prune"], db.url(), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to prune"));
    // A worker with nothing else to run still runs the maintenance service,
    // and says so.
    std::fs::write(
        dir.join("cohort.toml"),
        policy("0 2 * * *", 100, "").replace("schedule = \"0 2 * * *\"", ""),
    )
    .unwrap();
    let mut replicas = Replicas::new(dir, db.url());
    replicas.spawn("only-maintenance", &[]);
    wait_until(
        "the maintenance service",
        Duration::from_secs(20),
        async || {
            replicas
                .log("only-maintenance")
                .contains("maintenance service started")
        },
    )
    .await;
    let (code, log) = replicas.terminate("only-maintenance", Duration::from_secs(30));
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("only the maintenance service runs"), "{log}");
    // Prune with limits: old settled runs go, the rest stays; dry-run counts.
    std::fs::write(
        dir.join("cohort.toml"),
        policy(
            "0 2 * * *",
            100,
            "[cohort.prune]\nruns_older_than = \"90d\"\nbatch_size = 2",
        ),
    )
    .unwrap();
    insert_rows(db.pool(), 5, 5).await;
    for _ in 0..3 {
        let out = cohort(dir, &["sweep", "--all-tenants"], db.url(), &[]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        // Worker-only settings (dry_run on in the database) are named, and
        // the explicit sweep is honoured as written.
        assert!(stderr(&out).contains("dry_run is on"), "{}", stderr(&out));
    }
    let dry: i64 = sqlx::query_scalar("SELECT count(*) FROM retention.sweep_run WHERE dry_run")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(dry, 0, "explicit sweeps are not made dry by the setting");
    sqlx::raw_sql(
        "UPDATE retention.sweep_run SET started_at = started_at - interval '100 days', settled_at = settled_at - interval '100 days'
         WHERE run_id IN (SELECT run_id FROM retention.sweep_run ORDER BY started_at LIMIT 6)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let out = cohort(dir, &["--json", "prune", "--dry-run"], db.url(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["runs"].as_i64(), v["dry_run"].as_bool()),
        (Some(6), Some(true))
    );
    let total = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM retention.sweep_run")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(
        total(db.pool().clone()).await,
        9,
        "a dry run deletes nothing"
    );
    let out = cohort(dir, &["--json", "prune"], db.url(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["runs"].as_i64(), Some(6));
    assert_eq!(total(db.pool().clone()).await, 3);
}

/// One HTTP/1.1 GET on loopback: (status, body).
fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the exporter");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// The value of one sample (`name{labels}` exactly as rendered, labels in
/// the exporter's order), 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

/// RS-008: `cohort worker --metrics-addr` serves the SPEC's metrics; after
/// scheduled sweeps and deliveries the scraped values equal what the ledger
/// and the queue table say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_agrees_with_the_ledger() {
    let extra = "
[cohort.dispatch]
max_attempts = 1
base_backoff = \"1s\"
";
    let text = policy("*/2 * * * * *", 40, extra).replace(
        "anchor = \"created_at\"\n\n[[entity]]\nname = \"Event\"",
        "anchor = \"created_at\"\n\n[[entity.handler]]\nname = \"archive\"\ncommand = [\"sh\", \"-c\", \"cat > /dev/null\"]\n\n[[entity.handler]]\nname = \"crm\"\ncommand = [\"sh\", \"-c\", \"exit 3\"]\n\n[[entity]]\nname = \"Event\"",
    );
    assert!(text.contains("name = \"crm\""));
    let (db, dir) = setup(&text).await;
    let dir = dir.path();
    insert_rows(db.pool(), 30, 20).await;
    // Rows under a hold stay, and are counted as held.
    sqlx::query(
        "INSERT INTO retention.retention_hold (hold_id, retention_entity_id, record_id, tenant_id, reason)
         VALUES (gen_random_uuid(), 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', '1000001', $1, 'litigation')",
    )
    .bind(T1)
    .execute(db.pool())
    .await
    .unwrap();
    let log_path = dir.join("metrics.log");
    let mut child = command(
        dir,
        &["worker", "--metrics-addr", "127.0.0.1:0"],
        db.url(),
        &[],
    )
    .env("RUST_LOG", "cohort=info")
    .stdout(Stdio::null())
    .stderr(Stdio::from(std::fs::File::create(&log_path).unwrap()))
    .spawn()
    .expect("start cohort worker");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut addr = String::new();
    wait_until(
        "the exporter's address",
        Duration::from_secs(30),
        async || {
            addr = log()
                .lines()
                .find_map(|l| l.split("metrics served at http://").nth(1))
                .and_then(|rest| rest.split('/').next())
                .unwrap_or_default()
                .to_string();
            !addr.is_empty()
        },
    )
    .await;
    let (status, body) = http_get(&addr, "/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"));

    // Every row swept and every delivery settled (one per row per handler).
    wait_until("sweeps and deliveries", Duration::from_secs(60), async || {
        let left: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM app.session_notes) + (SELECT count(*) FROM app.events)
                  + (SELECT count(*) FROM retention.sweep_row_handler_status WHERE status IN ('pending', 'in_flight'))",
        )
        .fetch_one(db.pool())
        .await
        .unwrap();
        left == 1
    })
    .await;

    // Runs keep coming every two seconds: compare at a moment when the
    // ledger did not move between two reads around the scrape.
    let ledger = async || -> (Vec<(String, String, String, i64)>, Vec<(String, i64)>, Vec<(String, String, i64)>) {
        let runs = sqlx::query_as(
            "SELECT kind, trigger, status, count(*) FROM retention.sweep_run GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        )
        .fetch_all(db.pool())
        .await
        .unwrap();
        let rows = sqlx::query_as(
            "SELECT o.outcome, sum(o.n)::int8 FROM retention.sweep_run_entity_summary s
             JOIN retention.sweep_run r USING (run_id),
             LATERAL (VALUES ('affected', s.affected_count), ('held', s.held_count), ('skipped', s.skipped_count), ('null_anchor', s.null_anchor_count)) o(outcome, n)
             WHERE r.status <> 'started' AND NOT r.dry_run AND s.entity_type = 'SessionNote' GROUP BY 1 ORDER BY 1",
        )
        .fetch_all(db.pool())
        .await
        .unwrap();
        let deliveries = sqlx::query_as(
            "SELECT handler_id, status, count(*) FROM retention.sweep_row_handler_status GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .fetch_all(db.pool())
        .await
        .unwrap();
        (runs, rows, deliveries)
    };
    // A scrape taken while the ledger stood still (nothing started, the
    // same before and after) is compared with it. Started runs are read
    // too: a run between its entities' counts and its settle has counted
    // its held rows in the metrics but not yet in a settled summary.
    let mut still = None;
    wait_until(
        "the ledger to stand still for a scrape",
        Duration::from_secs(10),
        async || {
            let before = ledger().await;
            let (status, metrics) = http_get(&addr, "/metrics");
            let after = ledger().await;
            assert_eq!(status, 200);
            let settled = before == after && !before.0.iter().any(|r| r.2 == "started");
            if settled {
                still = Some((before, metrics));
            }
            settled
        },
    )
    .await;
    {
        let ((runs, rows, deliveries), metrics) = still.expect("a still scrape");
        assert!(runs.iter().map(|r| r.3).sum::<i64>() >= 3, "{runs:?}");
        for (kind, trigger, status, n) in &runs {
            let series = format!(
                "cohort_runs_total{{kind=\"{kind}\",trigger=\"{trigger}\",status=\"{status}\"}}"
            );
            assert_eq!(sample(&metrics, &series), *n as f64, "{series}\n{metrics}");
        }
        let settled: i64 = runs.iter().filter(|r| r.0 == "sweep").map(|r| r.3).sum();
        assert_eq!(
            sample(
                &metrics,
                "cohort_run_duration_seconds_count{kind=\"sweep\"}"
            ),
            settled as f64
        );
        for (outcome, n) in &rows {
            let series = format!("cohort_rows_total{{entity=\"SessionNote\",strategy=\"purge\",outcome=\"{outcome}\"}}");
            assert_eq!(sample(&metrics, &series), *n as f64, "{series}\n{metrics}");
        }
        assert!(rows.contains(&("affected".into(), 59)), "{rows:?}");
        assert!(rows.iter().any(|(o, n)| o == "held" && *n >= 1), "{rows:?}");
        // Each handler got the 59 purged rows: "archive" delivered them,
        // "crm" failed once and, with max_attempts = 1, dead-lettered them.
        assert_eq!(
            deliveries,
            vec![
                ("archive".into(), "succeeded".into(), 59),
                ("crm".into(), "dead_lettered".into(), 59)
            ]
        );
        let delivered =
            "cohort_handler_deliveries_total{handler=\"archive\",outcome=\"delivered\"}";
        assert_eq!(sample(&metrics, delivered), 59.0, "{metrics}");
        let dead = "cohort_handler_deliveries_total{handler=\"crm\",outcome=\"dead_lettered\"}";
        assert_eq!(sample(&metrics, dead), 59.0, "{metrics}");
        assert_eq!(sample(&metrics, "cohort_dead_letters"), 59.0, "{metrics}");
        assert_eq!(
            sample(&metrics, "cohort_handler_queue_depth{state=\"pending\"}"),
            0.0
        );
        assert_eq!(
            sample(&metrics, "cohort_handler_queue_depth{state=\"in_flight\"}"),
            0.0
        );
        assert!(
            sample(&metrics, "cohort_batch_duration_seconds_count") >= 2.0,
            "{metrics}"
        );
        // Help text and types are served; no row value is in any label.
        assert!(
            metrics.contains("# TYPE cohort_rows_total counter"),
            "{metrics}"
        );
        assert!(
            metrics.contains("# TYPE cohort_batch_duration_seconds histogram"),
            "{metrics}"
        );
        assert!(!metrics.contains("1000001"), "a record id in the metrics");
    }
    let (status, _) = http_get(&addr, "/nope");
    assert_eq!(status, 404);

    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", log());
}

/// RS-026 on the worker: a tenants query with a NULL id, an id that cannot
/// be a tenant and a duplicate. The good tenants and the tenantless
/// entities are swept at every occurrence; each bad row is a failed run of
/// its own, named by its position, never by its value; the worker goes on.
#[tokio::test]
async fn rows_of_the_tenants_query_that_cannot_be_tenants_fail_only_themselves() {
    let query = format!(
        "tenants_query = \"SELECT t, j FROM (VALUES ('{T1}', 'UK'), (NULL, 'UK'), ('secret-not-a-uuid', 'UK'), ('{T2}', NULL), ('{T1}', 'UK')) v(t, j)\"\n"
    );
    let text = policy("*/2 * * * * *", 500, "")
        .replace(&format!("[[tenant]]\nid = \"{T1}\"\n"), "")
        .replace(&format!("[[tenant]]\nid = \"{T2}\"\n"), "");
    let (db, dir) = setup(&format!("{query}{text}")).await;
    let dir = dir.path();
    insert_rows(db.pool(), 20, 20).await;
    let out = cohort(dir, &["--json", "validate"], db.url(), &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "validate warns, it does not refuse: {}",
        stderr(&out)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let positions: Vec<i64> = report["unusable_tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["position"].as_i64().unwrap())
        .collect();
    assert_eq!(positions, [2, 3]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("secret-not-a-uuid"));

    let mut replicas = Replicas::new(dir, db.url());
    replicas.spawn("w", &[]);
    // One whole occurrence: T1, T2, two rows that failed, the tenantless pass.
    wait_until("a whole occurrence", Duration::from_secs(30), async || {
        let runs = scheduled(db.pool()).await;
        let mut done: BTreeMap<DateTime<Utc>, usize> = BTreeMap::new();
        for r in runs.iter().filter(|r| r.3 != "started") {
            *done.entry(r.0).or_default() += 1;
        }
        done.values().any(|&n| n == 5)
    })
    .await;
    let (code, log) = replicas.terminate("w", Duration::from_secs(30));
    assert_eq!(code, Some(0), "{log}");
    let runs = scheduled(db.pool()).await;
    let first = runs[0].0;
    let of_first: Vec<_> = runs.iter().filter(|r| r.0 == first).collect();
    assert_eq!(of_first.len(), 5, "{of_first:?}");
    let succeeded: Vec<Option<&str>> = of_first
        .iter()
        .filter(|r| r.3 == "succeeded")
        .map(|r| r.2.as_deref())
        .collect();
    assert_eq!(succeeded, [Some(T1), Some(T2), None], "{of_first:?}");
    let failed: Vec<&str> = of_first
        .iter()
        .filter(|r| r.3 == "failed")
        .map(|r| r.5.as_deref().unwrap())
        .collect();
    assert_eq!(failed.len(), 2, "{of_first:?}");
    assert!(
        failed[0].contains("row 2 cannot be a tenant") && failed[0].contains("NULL"),
        "{failed:?}"
    );
    assert!(failed[1].contains("row 3 cannot be a tenant"), "{failed:?}");
    for r in &of_first {
        assert!(!format!("{r:?}").contains("secret-not-a-uuid"), "{r:?}");
    }
    // Every old row of both tenants and the tenantless table is gone.
    let left: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM app.session_notes) + (SELECT count(*) FROM app.events)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(left, 0);
    assert!(log.contains("cannot be a tenant"), "{log}");
}

/// RS-024 on real worker processes: two replicas with different policies
/// on one database. The new one has a `crm-forget` handler on notes and no
/// tenantless entity; the old one lacks the handler and has the tenantless
/// events. Each policy runs its own occurrences (the events are swept
/// although the new replica ran the occurrence first); the old replica
/// never purges a note, so every purged note has its `crm-forget` work;
/// `validate` names the peer with the other policy.
#[tokio::test]
async fn replicas_with_different_policies_never_drop_work() {
    let base = policy("*/2 * * * * *", 500, "");
    let new_policy = base
        .replace(
            "anchor = \"created_at\"\n\n[[entity]]\nname = \"Event\"",
            "anchor = \"created_at\"\n\n[[entity.handler]]\nname = \"crm-forget\"\ncommand = [\"true\"]\n\n[[entity]]\nname = \"Event\"",
        );
    assert_ne!(new_policy, base);
    // The new policy has no tenantless events.
    let new_policy = new_policy[..new_policy.find("[[entity]]\nname = \"Event\"").unwrap()]
        .to_string()
        + &new_policy[new_policy.find("[[category]]").unwrap()..];
    let (db, dir) = setup(&base).await;
    let dir = dir.path();
    std::fs::write(dir.join("new.toml"), &new_policy).unwrap();
    let mut replicas = Replicas::new(dir, db.url());
    replicas.spawn_with("new", &["--config", "new.toml", "worker"], &[]);
    // The new replica is registered before the old one sweeps anything.
    wait_until(
        "the new replica's peer record",
        Duration::from_secs(20),
        async || {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM retention.retention_peer")
                .fetch_one(db.pool())
                .await
                .unwrap()
                == 1
        },
    )
    .await;
    let out = cohort(dir, &["--json", "validate"], db.url(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["peers_with_other_policy"].as_array().unwrap().len(),
        1,
        "{report}"
    );
    assert!(stderr(&out).contains("another policy"), "{}", stderr(&out));
    insert_rows(db.pool(), 30, 20).await;
    replicas.spawn("old", &[]);
    wait_until("every old row swept", Duration::from_secs(60), async || {
        sqlx::query_scalar::<_, i64>(
            "SELECT (SELECT count(*) FROM app.session_notes) + (SELECT count(*) FROM app.events)",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
            == 0
    })
    .await;
    let logs = replicas.terminate_all();
    // Every purged note has its crm-forget work: none went without it.
    let (notes, with_work): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM retention.sweep_row_handler_status h \
           WHERE h.row_detail_id = d.row_detail_id AND h.handler_id = 'crm-forget')) \
         FROM retention.sweep_run_row_detail d WHERE d.entity_type = 'SessionNote'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(notes, 60, "every note was purged with a row detail");
    assert_eq!(with_work, 60, "every purged note has its handler work");
    // The old replica left notes alone, saying why.
    let refused: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM retention.sweep_run WHERE error LIKE '%handler_missing_here%'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(refused > 0, "the old replica was held back at least once");
    let old_log = &logs.iter().find(|(n, _)| n == "old").unwrap().1;
    assert!(old_log.contains("another policy"), "{old_log}");
}

/// RS-023: replicas restarted (SIGTERM, a clean stop) on a ledger analysed
/// the way autovacuum leaves it (every pass of the finished occurrences
/// done, none of the next one's yet) share the next occurrence's 60 passes
/// and complete it: each pass claimed once (attempt 1) and run once, no
/// replica holding passes it is not running (so none "taken over" from a
/// replica that was not lost). Before schema 13's claim statement, one
/// replica claimed every pass at once on these statistics and swept them
/// one by one as "taken over", while the other could take none.
#[tokio::test]
async fn replicas_restarted_on_an_analysed_ledger_complete_every_occurrence() {
    let tenants = 60;
    let text = policy("*/3 * * * * *", 100, "")
        .replace(
            &format!("[[tenant]]\nid = \"{T1}\"\n\n[[tenant]]\nid = \"{T2}\"\n"),
            "",
        )
        .replace(
            "[cohort]\n",
            "tenants_query = \"SELECT id FROM app.tenants ORDER BY n\"\n\n[cohort]\n",
        );
    assert!(!text.contains(T1), "the tenant list was replaced:\n{text}");
    let (db, dir) = setup(&text).await;
    let dir = dir.path();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE app.tenants (n int PRIMARY KEY, id uuid NOT NULL);
         INSERT INTO app.tenants SELECT g, md5('tenant' || g)::uuid FROM generate_series(1, {tenants}) g;"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let completed = async || -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM retention.sweep_occurrence WHERE NOT dry_run AND completed_at IS NOT NULL",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    // One replica completes a first occurrence, then stops cleanly.
    let mut replicas = Replicas::new(dir, db.url());
    replicas.spawn("w-first", &[]);
    wait_until(
        "a first occurrence completed",
        Duration::from_secs(60),
        async || completed().await >= 1,
    )
    .await;
    replicas.terminate_all();
    // Analysed now: only finished passes in the table.
    sqlx::raw_sql("ANALYZE retention.sweep_occurrence_pass; ANALYZE retention.sweep_occurrence;")
        .execute(db.pool())
        .await
        .unwrap();
    let before: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT occurrence_id FROM retention.sweep_occurrence WHERE NOT dry_run",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    replicas.spawn("w-a", &[]);
    replicas.spawn("w-b", &[]);
    // No replica ever holds the lock of a pass it is not running: at most
    // one pass lock per replica, sampled while the occurrence runs.
    let mut most_held = 0i64;
    wait_until(
        "the first occurrence after the restart completed",
        Duration::from_secs(40),
        async || {
            // Pass locks (the key text `cohort.pass:<occurrence>:<pass>`,
            // hashed) held by each replica, across its connections.
            let held: i64 = sqlx::query_scalar(
                "WITH k AS (SELECT pg_catalog.hashtextextended(
                                'cohort.pass:' || p.occurrence_id::text || ':' || p.pass::text, 0) AS key
                            FROM retention.sweep_occurrence_pass p)
                 SELECT COALESCE(max(n), 0) FROM (SELECT count(*) AS n FROM pg_locks l
                 JOIN pg_stat_activity a ON a.pid = l.pid
                 JOIN k ON l.classid::int8 = ((k.key >> 32) & 4294967295)
                       AND l.objid::int8 = (k.key & 4294967295)
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                   AND a.application_name IN ('w-a', 'w-b')
                 GROUP BY a.application_name) x",
            )
            .fetch_one(db.pool())
            .await
            .unwrap();
            most_held = most_held.max(held);
            // The first occurrence written after the restart completed.
            sqlx::query_scalar::<_, bool>(
                "SELECT COALESCE((SELECT completed_at IS NOT NULL FROM retention.sweep_occurrence
                 WHERE NOT dry_run AND NOT (occurrence_id = ANY($1))
                 ORDER BY occurrence LIMIT 1), false)",
            )
            .bind(&before)
            .fetch_one(db.pool())
            .await
            .unwrap()
        },
    )
    .await;
    let logs = replicas.terminate_all();
    // The first occurrence after the restart: every pass done once.
    let passes: Vec<(i32, String, i32)> = sqlx::query_as(
        "SELECT p.pass, p.status, p.attempts FROM retention.sweep_occurrence_pass p
         JOIN retention.sweep_occurrence o USING (occurrence_id)
         WHERE NOT o.dry_run AND o.completed_at IS NOT NULL AND NOT (o.occurrence_id = ANY($1))
           AND o.occurrence = (SELECT min(occurrence) FROM retention.sweep_occurrence
                               WHERE NOT dry_run AND NOT (occurrence_id = ANY($1)))
         ORDER BY p.pass",
    )
    .bind(&before)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        passes.len(),
        tenants as usize + 1,
        "every tenant and the tenantless pass"
    );
    for (pass, status, attempts) in &passes {
        assert_eq!((status.as_str(), *attempts), ("done", 1), "pass {pass}");
    }
    // A replica holds the lock of the one pass it runs: never many.
    assert!(
        (1..=1).contains(&most_held),
        "a replica held {most_held} pass locks at once"
    );
    for (name, log) in logs {
        assert!(
            !log.contains("replica was lost"),
            "{name} took over a pass no replica lost:\n{log}"
        );
    }
}
