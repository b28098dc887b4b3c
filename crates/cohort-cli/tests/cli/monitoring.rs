//! Monitoring as operators run it: the metrics contract (docs/metrics.md)
//! against what a real `cohort worker --metrics-addr` serves, the example
//! alert rules under `promtool`, and a real Prometheus server scraping a
//! real worker, its answers compared with the ledger.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::wait;
use wait::wait_until;

use chrono::{DateTime, Datelike, Timelike, Utc};
use cohort_pgtemp::TestDatabase;

const T1: &str = "11111111-1111-1111-1111-111111111111";
const T2: &str = "22222222-2222-2222-2222-222222222222";
const NOTE: &str = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn monitoring() -> PathBuf {
    workspace().join("examples/monitoring")
}

/// A binary of Debian's `prometheus` package (`promtool`, `prometheus`),
/// installed by `.ci/run`: a missing one fails the test, never skips it.
fn prometheus_tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!("{name} is not installed: apt-get install --no-install-recommends prometheus (.ci/run does)")
        })
}

/// The metric names of docs/metrics.md's contract table.
fn documented() -> BTreeSet<String> {
    let text = std::fs::read_to_string(workspace().join("docs/metrics.md")).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("cohort_"))
        .map(str::to_string)
        .collect()
}

/// Every `cohort_…` metric name in a text (PromQL in rules or a dashboard),
/// a histogram's `_bucket`/`_sum`/`_count` series named by its metric;
/// recording-rule names (`cohort:…`) are not metrics.
fn names_used(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("cohort_") {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            out.insert(metric_of(&tail[..end]).to_string());
        }
        rest = &tail[end..];
    }
    out
}

fn metric_of(series: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| series.strip_suffix(s))
        .unwrap_or(series)
}

fn command(dir: &Path, args: &[&str], url: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cohort"));
    cmd.current_dir(dir).args(args).env("DATABASE_URL", url);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("COHORT")) {
        cmd.env_remove(k);
    }
    cmd
}

/// A child process killed (and reaped) when dropped, so a failed assertion
/// never leaves a worker or a Prometheus server running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `cohort worker --metrics-addr 127.0.0.1:0` and the address its
/// exporter bound.
async fn start_worker(dir: &Path, url: &str) -> (Running, String) {
    let log_path = dir.join("worker.log");
    let child = command(dir, &["worker", "--metrics-addr", "127.0.0.1:0"], url)
        .env("RUST_LOG", "cohort=info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log_path).unwrap()))
        .spawn()
        .expect("start cohort worker");
    let mut worker = Running(child);
    let mut addr = String::new();
    wait_until(
        "the exporter's address",
        Duration::from_secs(60),
        async || {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(status) = worker.0.try_wait().unwrap() {
                panic!("cohort worker exited ({status}):\n{log}");
            }
            addr = log
                .lines()
                .find_map(|l| l.split("metrics served at http://").nth(1))
                .and_then(|rest| rest.split('/').next())
                .unwrap_or_default()
                .to_string();
            !addr.is_empty()
        },
    )
    .await;
    (worker, addr)
}

/// One HTTP/1.1 GET on loopback: (status, body).
fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    // Prometheus answers with a chunked body: join the chunks.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        out
    } else {
        body.to_string()
    };
    (status, body)
}

/// The metric names a scrape serves (`# TYPE` lines).
fn served(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}

/// RS-008: the example alert rules are valid, and their unit tests prove
/// each alert fires and resolves.
#[test]
fn example_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let promtool = prometheus_tool("promtool");
    let dir = monitoring();
    let check = Command::new(&promtool)
        .current_dir(&dir)
        .args(["check", "rules", "alerts.yml"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(out.contains("SUCCESS: 7 rules found"), "{out}");
    let test = Command::new(&promtool)
        .current_dir(&dir)
        .args(["test", "rules", "alerts.test.yml"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&test.stdout);
    assert!(
        test.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&test.stderr)
    );
    assert!(out.contains("SUCCESS"), "{out}");
    // Every alert has a test where it fires and a later one where it does
    // not (resolved).
    let rules = std::fs::read_to_string(dir.join("alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("alerts.test.yml")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 7, "{alerts:?}");
    for alert in alerts {
        let cases: Vec<&str> = tests
            .split("- eval_time:")
            .filter(|c| c.contains(&format!("alertname: {alert}\n")))
            .collect();
        assert!(
            cases.iter().any(|c| c.contains("exp_labels")),
            "{alert} is never shown firing"
        );
        assert!(
            cases.iter().any(|c| c.contains("exp_alerts: []")),
            "{alert} is never shown resolved or quiet"
        );
    }
}

/// RS-008: every metric the alert rules and the dashboard use is in the
/// contract (docs/metrics.md), the contract is `cohort::telemetry::ALL`,
/// and a real worker serves every name of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_in_the_contract_is_served_and_the_examples_use_no_other() {
    let docs = documented();
    assert!(docs.len() >= 13, "{docs:?}");
    let all: BTreeSet<String> = cohort::telemetry::ALL
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        docs, all,
        "docs/metrics.md and cohort::telemetry::ALL differ"
    );
    let alerts = names_used(&std::fs::read_to_string(monitoring().join("alerts.yml")).unwrap());
    let dashboard = std::fs::read_to_string(monitoring().join("grafana-dashboard.json")).unwrap();
    let dashboard_json: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let exprs: Vec<String> = dashboard_json["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    let in_dashboard = names_used(&exprs.join("\n"));
    // Every panel reads the data source the dashboard's own variable
    // names, and no import input is declared that nothing would use.
    assert!(
        dashboard_json.get("__inputs").is_none(),
        "an import input nothing uses"
    );
    for p in dashboard_json["panels"].as_array().unwrap() {
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {}",
            p["title"]
        );
    }
    for (what, names) in [("alerts.yml", &alerts), ("the dashboard", &in_dashboard)] {
        let unknown: Vec<_> = names.difference(&docs).collect();
        assert!(
            unknown.is_empty(),
            "{what} uses {unknown:?}, not in docs/metrics.md"
        );
    }
    // The new series are all watched by the dashboard.
    for name in [
        "cohort_last_success_timestamp_seconds",
        "cohort_entity_backlog_age_seconds",
        "cohort_next_occurrence_timestamp_seconds",
        "cohort_peers",
    ] {
        assert!(in_dashboard.contains(name), "the dashboard lacks {name}");
    }

    // A worker that produces every series: a handler that fails (deliveries
    // and dead letters), a tenant row that cannot be a tenant, a live peer
    // with a handler on the notes that this worker lacks (a conflict), and
    // sweeps paced slowly enough to wait between their batches: at one row
    // a second, whatever the machine's load (at 50 a second, a loaded
    // machine's first batch of five rows outlasted its 0.1 s budget, so no
    // sweep ever waited and the throttle's series never came).
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(
        "CREATE SCHEMA app;
         CREATE TABLE app.session_notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz);
         CREATE TABLE app.events (id bigint PRIMARY KEY, created_at timestamptz);
         INSERT INTO app.session_notes SELECT g, '11111111-1111-1111-1111-111111111111', now() - interval '400 days' FROM generate_series(1, 5) g;
         INSERT INTO app.events SELECT g, now() - interval '400 days' FROM generate_series(1, 5) g;",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let policy = format!(
        r#"
tenants_query = "SELECT t, NULL::text FROM (VALUES ('{T1}'), ('not-a-tenant')) v(t)"

[cohort]
schema = "retention"
schedule = "*/2 * * * * *"
max_rows_per_second = 1
max_replica_lag = "30s"

[cohort.dispatch]
max_attempts = 1

[[entity]]
name = "SessionNote"
id = "{NOTE}"
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

[[entity.handler]]
name = "crm"
command = ["sh", "-c", "exit 3"]

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
"#
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cohort.toml"), policy).unwrap();
    let out = command(dir.path(), &["migrate"], db.url())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    // The other replica, as its heartbeat leaves it (renewed far ahead, so
    // it stays live for the whole test).
    sqlx::query(
        "INSERT INTO retention.retention_peer (peer_id, host, pid, heartbeat_at, policy_fingerprint, handlers)
         VALUES (gen_random_uuid(), 'other-host', 4242, now() + interval '1 hour', 'another-policy', $1)",
    )
    .bind(serde_json::json!({ NOTE: ["crm-forget"] }))
    .execute(db.pool())
    .await
    .unwrap();
    let (_worker, addr) = start_worker(dir.path(), db.url()).await;
    // Every documented name in a scrape; the ones still missing are named
    // if they never come.
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let (last, scrape) = loop {
        let (status, body) = http_get(&addr, "/metrics");
        assert_eq!(status, 200);
        let last = served(&body);
        if docs.is_subset(&last) {
            break (last, body);
        }
        let missing: Vec<_> = docs.difference(&last).collect();
        assert!(
            std::time::Instant::now() < deadline,
            "no scrape in 240 s served {missing:?}:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let cohort_names: BTreeSet<String> = last
        .iter()
        .filter(|n| n.starts_with("cohort_"))
        .cloned()
        .collect();
    assert_eq!(
        cohort_names, docs,
        "served and documented names differ:\n{scrape}"
    );
    // The conflict is the peer's doing, and every label is a name, never a
    // row value.
    assert!(
        scrape.contains("cohort_peer_conflicts_total{entity=\"SessionNote\"}"),
        "{scrape}"
    );
    assert!(!scrape.contains("not-a-tenant"), "{scrape}");
}

/// The database clock now.
async fn db_now(db: &TestDatabase) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(db.pool())
        .await
        .unwrap()
}

/// Unix seconds as the exporter renders a timestamp gauge.
fn unix(t: DateTime<Utc>) -> f64 {
    t.timestamp_micros() as f64 / 1e6
}

/// A free loopback port (bound, then released for the server to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `%`-encodes a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of the one sample an instant query returns (`None`: none yet).
fn query(prometheus: &str, promql: &str) -> Option<f64> {
    let (status, body) = http_get(
        prometheus,
        &format!("/api/v1/query?query={}", encode(promql)),
    );
    assert_eq!(status, 200, "{promql}: {body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["status"], "success", "{body}");
    let result = doc["data"]["result"].as_array().unwrap();
    assert!(result.len() <= 1, "{promql}: {body}");
    result
        .first()
        .map(|r| r["value"][1].as_str().unwrap().parse().unwrap())
}

/// RS-008, end to end: a real Prometheus server scrapes a real worker;
/// what it stores for each new series is what the ledger, the schedule and
/// the peer table say. The schedule fires once (at a second a few seconds
/// from now, then a year later), so the values stand still once it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scraping_a_worker_stores_what_the_ledger_says() {
    let prometheus = prometheus_tool("prometheus");
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    // T1's notes: old ones (purged), one still referenced by another table
    // (a foreign key keeps it: the backlog), an older one under a hold
    // (not eligible: not backlog), one of a subject erased before the
    // worker starts. T2's notes are all purged. Tenantless events too.
    sqlx::raw_sql(
        "CREATE SCHEMA app;
         CREATE TABLE app.session_notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, owner text);
         CREATE INDEX ON app.session_notes (tenant_id, created_at);
         CREATE TABLE app.note_refs (note_id bigint NOT NULL REFERENCES app.session_notes (id));
         CREATE TABLE app.events (id bigint PRIMARY KEY, created_at timestamptz);
         INSERT INTO app.session_notes SELECT g, '11111111-1111-1111-1111-111111111111', now() - interval '400 days', NULL FROM generate_series(1, 10) g;
         INSERT INTO app.session_notes SELECT g, '22222222-2222-2222-2222-222222222222', now() - interval '500 days', NULL FROM generate_series(11, 20) g;
         INSERT INTO app.session_notes VALUES (100, '11111111-1111-1111-1111-111111111111', now() - interval '100 days 3 hours 7.25 seconds', NULL);
         INSERT INTO app.note_refs VALUES (100);
         INSERT INTO app.session_notes VALUES (101, '11111111-1111-1111-1111-111111111111', now() - interval '900 days', NULL);
         INSERT INTO app.session_notes VALUES (102, '11111111-1111-1111-1111-111111111111', now() - interval '1 day', 'jane');
         INSERT INTO app.events SELECT g, now() - interval '400 days' FROM generate_series(1, 5) g;",
    )
    .execute(db.pool())
    .await
    .unwrap();
    // One occurrence, 20 s from now by the database clock; the next is a
    // year later.
    let at = db_now(&db).await.with_nanosecond(0).unwrap() + chrono::TimeDelta::seconds(20);
    let schedule = format!(
        "{} {} {} {} {} *",
        at.second(),
        at.minute(),
        at.hour(),
        at.day(),
        at.month()
    );
    let policy = format!(
        r#"
[cohort]
schema = "retention"
schedule = "{schedule}"

[[tenant]]
id = "{T1}"

[[tenant]]
id = "{T2}"

[[entity]]
name = "SessionNote"
id = "{NOTE}"
table = "app.session_notes"
category = "notes"
anchor = "created_at"
subjects = ["owner"]

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
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("cohort.toml"), policy).unwrap();
    let run = |args: &[&str]| {
        let out = command(d, args, db.url()).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["migrate"]);
    run(&[
        "holds",
        "create",
        "--entity",
        "SessionNote",
        "--record",
        "101",
        "--tenant",
        T1,
        "--reason",
        "litigation",
    ]);
    // An erasure in the ledger before the worker starts: the exporter
    // reads it at startup.
    run(&["erase", "--tenant", T1, "--subject", "jane"]);
    // A replica that died (no heartbeat for five minutes), and a live one
    // with another policy (its heartbeat renewed far ahead, so it stays
    // live for the whole test).
    sqlx::raw_sql(
        "INSERT INTO retention.retention_peer (peer_id, host, pid, started_at, heartbeat_at, policy_fingerprint, handlers) VALUES
           (gen_random_uuid(), 'dead-host', 1, now() - interval '1 hour', now() - interval '5 minutes', 'old-policy', '{}'),
           (gen_random_uuid(), 'other-host', 2, now(), now() + interval '1 hour', 'other-policy', '{}')",
    )
    .execute(db.pool())
    .await
    .unwrap();

    let (_worker, worker_addr) = start_worker(d, db.url()).await;
    let port = free_port();
    let prom_dir = tempfile::tempdir().unwrap();
    std::fs::write(
        prom_dir.path().join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: cohort\n    static_configs:\n      - targets: ['{worker_addr}']\n"
        ),
    )
    .unwrap();
    let prom_log = prom_dir.path().join("prometheus.log");
    let server = Command::new(prometheus)
        .current_dir(prom_dir.path())
        .arg("--config.file=prometheus.yml")
        .arg(format!(
            "--storage.tsdb.path={}",
            prom_dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&prom_log).unwrap()))
        .spawn()
        .expect("start prometheus");
    let _server = Running(server);
    let prom = format!("127.0.0.1:{port}");

    // Before the occurrence: the next one is `at`, as the schedule says.
    let next = "cohort_next_occurrence_timestamp_seconds";
    wait_until(
        "Prometheus to be ready",
        Duration::from_secs(60),
        async || {
            std::net::TcpStream::connect(&prom).is_ok() && http_get(&prom, "/-/ready").0 == 200
        },
    )
    .await;
    let seen = poll_query(&prom, next, at.timestamp() as f64).await;
    assert_eq!(seen, Some(at.timestamp() as f64), "before the occurrence");

    // The occurrence runs: T1, T2, the tenantless events.
    wait_until("the occurrence's three passes", Duration::from_secs(240), async || {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM retention.sweep_run WHERE trigger = 'scheduled' AND status <> 'started'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
            == 3
    })
    .await;
    let statuses: Vec<String> = sqlx::query_scalar(
        "SELECT status FROM retention.sweep_run WHERE trigger = 'scheduled' ORDER BY started_at",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(statuses, ["succeeded"; 3], "the occurrence ran");

    // What the ledger, the schedule and the peer table say.
    let last = |kind: &'static str| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, DateTime<Utc>>(
                "SELECT max(settled_at) FROM retention.sweep_run WHERE kind = $1 AND status = 'succeeded' AND NOT dry_run",
            )
            .bind(kind)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let last_sweep = last("sweep").await;
    let last_erasure = last("erasure").await;
    let (cutoff, anchor): (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
        "SELECT s.cutoff, (SELECT created_at FROM app.session_notes WHERE id = 100)
         FROM retention.sweep_run_entity_summary s JOIN retention.sweep_run r USING (run_id)
         WHERE r.trigger = 'scheduled' AND s.entity_type = 'SessionNote' AND s.tenant_id = $1",
    )
    .bind(T1)
    .fetch_one(db.pool())
    .await
    .unwrap();
    // The FK-blocked note is the one left eligible; the held one is older
    // but not eligible; T2 has no backlog, and the gauge is the worst pass.
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM app.session_notes ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(left, [100, 101]);
    let backlog = (cutoff - anchor).num_microseconds().unwrap() as f64 / 1e6;
    assert!(
        backlog > 69.0 * 86_400.0 && backlog < 71.0 * 86_400.0,
        "{backlog}"
    );
    let (alive, stale): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE heartbeat_at > clock_timestamp() - interval '60 seconds'),
                count(*) FILTER (WHERE heartbeat_at <= clock_timestamp() - interval '60 seconds')
         FROM retention.retention_peer",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        (alive, stale),
        (2, 1),
        "this worker and the other are alive"
    );
    let a_year_on = at.with_year(at.year() + 1).unwrap();

    let expected = [
        (
            "cohort_last_success_timestamp_seconds{kind=\"sweep\"}",
            unix(last_sweep),
        ),
        (
            "cohort_last_success_timestamp_seconds{kind=\"erasure\"}",
            unix(last_erasure),
        ),
        (
            "cohort_entity_backlog_age_seconds{entity=\"SessionNote\"}",
            backlog,
        ),
        ("cohort_entity_backlog_age_seconds{entity=\"Event\"}", 0.0),
        (next, a_year_on.timestamp() as f64),
        ("cohort_peers{state=\"alive\"}", alive as f64),
        ("cohort_peers{state=\"stale\"}", stale as f64),
        ("cohort_peers{state=\"other_policy\"}", 1.0),
        ("cohort_peers{state=\"same_policy\"}", 0.0),
    ];
    for (promql, want) in expected {
        let got = poll_query(&prom, promql, want).await;
        assert!(
            got.is_some_and(|v| (v - want).abs() < 1e-6),
            "{promql}: Prometheus has {got:?}, the ledger says {want}\n{}",
            std::fs::read_to_string(&prom_log).unwrap_or_default()
        );
    }
}

/// Queries until the sample equals `want` (Prometheus may not have
/// scraped the latest value yet) or a minute has passed; the last answer.
async fn poll_query(prom: &str, promql: &str, want: f64) -> Option<f64> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = query(prom, promql);
        if got.is_some_and(|v| (v - want).abs() < 1e-6) || std::time::Instant::now() > deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
