//! The `cohort` binary as users script it: exit codes, JSON on stdout,
//! database-URL precedence, and a real database behind every command.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL
use crate::support::cli;
use crate::support::scenario::{json, scenario, succeeded};

use crate::support::wait;

use cli::cohort;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use wait::{wait_until, wait_until_blocking};

use cohort_pgtemp::TestDatabase;
use serde_json::Value;
use sqlx::AssertSqlSafe;

const POLICY: &str = r#"
[cohort]
schema = "retention"

[[entity]]
name = "SessionNote"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.session_notes"
category = "session-notes"
anchor = "created_at"

[[entity]]
name = "CaseContact"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "app.case_contacts"
category = "case-contacts"
anchor = "created_at"
subjects = ["user_id"]
anonymise = { email = "null", phone = { literal = "[redacted]" } }

[[category]]
name = "session-notes"
strategy = "purge"
period = "30d"

[[category]]
name = "case-contacts"
strategy = "anonymise"
period = "90d"
"#;

const TABLES: &str = "CREATE SCHEMA app;
    CREATE TABLE app.session_notes (id uuid PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, body text);
    CREATE INDEX ON app.session_notes (tenant_id, created_at);
    CREATE TABLE app.case_contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
        anonymised_at timestamptz, email text, phone text NOT NULL, user_id uuid NOT NULL);";

async fn setup() -> (TestDatabase, tempfile::TempDir) {
    scenario(TABLES, POLICY).await
}

#[tokio::test]
async fn migrate_then_validate_succeeds_with_json_on_stdout() {
    let (db, dir) = setup().await;
    let out = cohort(dir.path(), &["--json", "migrate"], Some(db.url()));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = json(&out);
    assert_eq!(report["schema"], "retention");
    assert_eq!(
        report["applied"],
        serde_json::json!((1..=cohort::schema::SCHEMA_VERSION).collect::<Vec<_>>())
    );
    let again = json(&cohort(dir.path(), &["--json", "migrate"], Some(db.url())));
    assert_eq!(again["applied"], serde_json::json!([]));

    let out = cohort(dir.path(), &["validate", "--json"], Some(db.url()));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["valid"], true);
    assert_eq!(v["entities"].as_array().unwrap().len(), 2);
    assert_eq!(
        v["entities"][1]["entity_id"],
        "b7316df4-7db5-46ad-aea7-f65c4b430f73"
    );
    assert_eq!(v["entities"][1]["anonymised_at"], "anonymised_at");
    assert_eq!(
        v["entities"][1]["strategies"],
        serde_json::json!(["anonymise"])
    );
    // CaseContact has no (tenant_id, created_at) index, nor one on its
    // subject column, nor one leaving its anonymised rows out: advice, not
    // an error.
    let warnings = v["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(warnings[0]
        .as_str()
        .unwrap()
        .contains("CREATE INDEX ON \"app\".\"case_contacts\" (\"tenant_id\", \"created_at\")"));
    assert!(warnings[1]
        .as_str()
        .unwrap()
        .contains("CREATE INDEX ON \"app\".\"case_contacts\" (\"user_id\")"));
    assert!(warnings[2].as_str().unwrap().contains(
        "CREATE INDEX ON \"app\".\"case_contacts\" (\"tenant_id\", \"created_at\") WHERE \"anonymised_at\" IS NULL"
    ));

    // Human output names the entities.
    let out = cohort(dir.path(), &["validate"], Some(db.url()));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Valid: 2 retained entities") && text.contains("app.case_contacts"),
        "{text}"
    );
}

#[tokio::test]
async fn failed_validation_exits_2_listing_every_problem_and_changes_nothing() {
    let (db, dir) = setup().await;
    assert_eq!(
        cohort(dir.path(), &["migrate"], Some(db.url()))
            .status
            .code(),
        Some(0)
    );
    sqlx::raw_sql(
        "ALTER TABLE app.case_contacts DROP COLUMN anonymised_at;
        ALTER TABLE app.session_notes ALTER COLUMN created_at TYPE timestamp;
        INSERT INTO app.session_notes VALUES (gen_random_uuid(), gen_random_uuid(), now(), 'x');",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let out = cohort(dir.path(), &["--json", "validate"], Some(db.url()));
    assert_eq!(out.status.code(), Some(2));
    let v = json(&out);
    assert_eq!(v["error"]["kind"], "validation");
    let problems: Vec<String> = v["error"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            format!(
                "{}: {}",
                p["entity"].as_str().unwrap_or("-"),
                p["message"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        problems.iter().any(|p| p.starts_with(
            "SessionNote: anchor column \"created_at\" is `timestamp without time zone`"
        )),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.starts_with(
            "CaseContact: category \"case-contacts\" may anonymise, but no anonymised_at marker"
        )),
        "{problems:?}"
    );
    // Human form goes to stderr and lists them too.
    let out = cohort(dir.path(), &["validate"], Some(db.url()));
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("2 problem(s)"), "{err}");
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM app.session_notes")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM retention.sweep_run")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(runs, 0);
}

#[tokio::test]
async fn bad_policy_files_and_missing_urls_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("cohort.toml"),
        "[[category]]\nname = \"x\"\nstrategy = \"purge\"\nperiod = \"-1d\"\n",
    )
    .unwrap();
    let out = cohort(
        dir.path(),
        &["--json", "validate"],
        Some("postgres://nobody@127.0.0.1:1/none"),
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json(&out)["error"]["kind"], "policy");
    assert!(json(&out)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("cannot be negative"));

    let out = cohort(dir.path(), &["validate", "--config", "missing.toml"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read missing.toml"));

    std::fs::write(dir.path().join("cohort.toml"), POLICY).unwrap();
    let out = cohort(dir.path(), &["validate"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no database URL"));
}

#[tokio::test]
async fn database_url_precedence_is_flag_then_environment_then_file() {
    let (db, dir) = setup().await;
    let unreachable = "postgres://nobody@127.0.0.1:1/none?connect_timeout=2";
    let with_file_url = format!("[database]\nurl = \"{}\"\n{POLICY}", db.url());
    std::fs::write(dir.path().join("cohort.toml"), &with_file_url).unwrap();
    // File alone works.
    assert_eq!(
        cohort(dir.path(), &["migrate"], None).status.code(),
        Some(0)
    );
    // The environment beats the file: an unreachable DATABASE_URL fails (exit 1, not 2).
    assert_eq!(
        cohort(dir.path(), &["validate"], Some(unreachable))
            .status
            .code(),
        Some(1)
    );
    // The flag beats the environment.
    let out = cohort(
        dir.path(),
        &["--database-url", db.url(), "validate"],
        Some(unreachable),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = sqlx::raw_sql(AssertSqlSafe("SELECT 1".to_string()))
        .execute(db.pool())
        .await;
}

#[tokio::test]
async fn migrate_honours_an_explicit_schema() {
    let (db, dir) = setup().await;
    let out = cohort(
        dir.path(),
        &["--json", "migrate", "--schema", "ledger"],
        Some(db.url()),
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json(&out)["schema"], "ledger");
    let n: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'ledger'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(n as usize, cohort::schema::CohortTable::ALL.len());
}

/// Starts `cohort sweep` of the first tenant in `dir`, waits until
/// `committed` (a sum over the ledger) reaches 300 rows, kills the process
/// outright (SIGKILL), waits for the server to roll back its open batch and
/// returns what the ledger then counts.
async fn kill_9_mid_sweep(db: &TestDatabase, dir: &Path, committed: &'static str) -> i64 {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .current_dir(dir)
        .args([
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ])
        .env("DATABASE_URL", db.url())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let sum = || async {
        sqlx::query_scalar::<_, i64>(committed)
            .fetch_one(db.pool())
            .await
            .unwrap()
    };
    wait_until("300 rows committed", Duration::from_secs(10), async || {
        sum().await >= 300
    })
    .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // Give the server a moment to notice the dead connection and roll back its open batch.
    wait_until("the dead session's batch to roll back", Duration::from_secs(4), async || {
        let busy: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'")
            .fetch_one(db.pool()).await.unwrap();
        busy == 0
    })
    .await;
    let audited = sum().await;
    assert!(audited >= 300, "the sweep never got going");
    audited
}

/// Reruns the first tenant's sweep; returns SessionNote's outcome (JSON).
fn rerun_session_notes(dir: &Path, url: Option<&str>) -> Value {
    let rerun = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ],
        url,
    );
    succeeded(&rerun);
    json(&rerun)["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == "SessionNote")
        .unwrap()
        .clone()
}

/// MIGRATION-002 from the command line: `migrate --move-from` moves the
/// tables (JSON names them); a second move finds nothing to move (exit 2).
#[tokio::test]
async fn migrate_move_from_moves_the_tables_to_the_new_schema() {
    let (db, dir) = setup().await;
    let d = dir.path();
    let out = cohort(d, &["migrate", "--schema", "old_ledger"], Some(db.url()));
    assert_eq!(out.status.code(), Some(0));
    sqlx::query("INSERT INTO old_ledger.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, settled_at) VALUES (gen_random_uuid(), 'sweep', 'manual', false, 'succeeded', now(), now())")
        .execute(db.pool())
        .await
        .unwrap();
    let out = cohort(
        d,
        &[
            "--json",
            "migrate",
            "--schema",
            "new_ledger",
            "--move-from",
            "old_ledger",
        ],
        Some(db.url()),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(
        (v["from"].as_str(), v["to"].as_str()),
        (Some("old_ledger"), Some("new_ledger"))
    );
    assert_eq!(
        v["tables"].as_array().unwrap().len(),
        cohort::schema::CohortTable::ALL.len()
    );
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM new_ledger.sweep_run")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(runs, 1);
    let again = cohort(
        d,
        &[
            "--json",
            "migrate",
            "--schema",
            "new_ledger",
            "--move-from",
            "old_ledger",
        ],
        Some(db.url()),
    );
    assert_eq!(again.status.code(), Some(2));
    assert_eq!(json(&again)["error"]["kind"], "not_found");
}

#[test]
fn demo_runs_on_a_throw_away_database_and_prints_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let out = cohort(dir.path(), &["--json", "demo"], None);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["entities"].as_array().unwrap().len(), 6);
    let login = v["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == "LoginEvent")
        .unwrap();
    assert_eq!(
        login["archive"],
        serde_json::json!({
            "table": "archive.login_events",
            "columns": ["id", "tenant_id", "created_at", "user_id", "ip_address"],
            "anonymise": true,
        })
    );
    assert!(v["entities"][0]["archive"].is_null());
    // Login events past 60 days moved to the archive, without their IP
    // address; Alan's, under the hold on him, stayed.
    assert_eq!(v["archived"], 2);
    assert_eq!(v["archived_with_ip_address"], 0);
    let count_of = |rows: &Value, table: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r[0] == table)
            .map(|r| r[1].as_i64().unwrap())
    };
    assert_eq!(count_of(&v["rows_before"], "app.login_events"), Some(4));
    assert_eq!(count_of(&v["rows_after"], "app.login_events"), Some(2));
    let archive_summaries: Vec<&Value> = v["sweeps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["entities"].as_array().unwrap())
        .filter(|e| e["entity"] == "LoginEvent")
        .collect();
    assert_eq!(
        archive_summaries
            .iter()
            .map(|e| (
                e["strategy"].as_str().unwrap(),
                e["affected"].as_i64().unwrap()
            ))
            .collect::<Vec<_>>(),
        [("archive", 1), ("archive", 1)]
    );
    // A record hold and a hold on a person, each keeping its due row.
    assert_eq!(v["held_row_kept"], true);
    assert_eq!(v["subject_hold"]["target"], "subject");
    assert_eq!(v["subject_hold"]["subject_kind"], "user");
    assert_eq!(v["subject_row_kept"], true);
    let plan = v["plan"].as_array().unwrap();
    assert_eq!(plan.len(), 12, "two tenants x six entities");
    // The EU tenant's override (180d) and the exempt category (no cutoff) show.
    assert!(plan
        .iter()
        .any(|p| p["tenant"] == "22222222-2222-2222-2222-222222222222"
            && p["entity"] == "CaseContact"
            && p["period"] == "180d"));
    assert!(plan
        .iter()
        .any(|p| p["entity"] == "Invoice" && p["cutoff"].is_null()));
    let out = cohort(dir.path(), &["demo"], None);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Validated the policy file against the live catalog: 6 entities"),
        "{text}"
    );
}

const ROWS: &str = "INSERT INTO app.session_notes
    SELECT gen_random_uuid(), t::uuid, timestamptz '2026-06-01' - make_interval(days => d), 'n'
    FROM unnest(ARRAY['11111111-1111-1111-1111-111111111111', '22222222-2222-2222-2222-222222222222']) t,
         unnest(ARRAY[1, 29, 31, 45]) d;
    INSERT INTO app.case_contacts
    SELECT g, '11111111-1111-1111-1111-111111111111', timestamptz '2026-06-01' - make_interval(days => 80 + g * 5), NULL,
           'x@example.com', '+1', gen_random_uuid() FROM generate_series(1, 4) g;";

const NOW: &str = "2026-06-01T00:00:00Z";

#[tokio::test]
async fn holds_preview_sweep_and_runs_work_end_to_end_with_json() {
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let dir = dir.path();
    let url = Some(db.url());
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    let held: String = sqlx::query_scalar("SELECT id::text FROM app.session_notes WHERE tenant_id = '11111111-1111-1111-1111-111111111111' AND created_at = '2026-04-17'")
        .fetch_one(db.pool()).await.unwrap();

    let out = cohort(
        dir,
        &[
            "--json",
            "holds",
            "create",
            "--entity",
            "SessionNote",
            "--record",
            &held.to_uppercase(),
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--reason",
            "case 42",
        ],
        url,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hold = json(&out);
    assert_eq!(hold["record_id"], held.as_str());
    assert_eq!(hold["entity_id"], "a3f467fe-c5d0-4f17-9897-83c373cc1dc8");
    assert_eq!(hold["tenant"], "11111111-1111-1111-1111-111111111111");
    for key in ["hold_id", "reason", "created_at", "expires_at"] {
        assert!(hold.get(key).is_some(), "{key}");
    }
    let list = json(&cohort(dir, &["--json", "holds", "list", "--active"], url));
    assert_eq!(list.as_array().unwrap().len(), 1);

    let preview = json(&cohort(
        dir,
        &[
            "--json",
            "preview",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ],
        url,
    ));
    let notes = preview["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == "SessionNote")
        .unwrap()
        .clone();
    assert_eq!(
        (notes["affected"].as_u64(), notes["held"].as_u64()),
        (Some(1), Some(1))
    );

    let dry = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
            "--dry-run",
        ],
        url,
    );
    assert_eq!(dry.status.code(), Some(0));
    let dry = json(&dry);
    assert_eq!(
        (
            dry["dry_run"].as_bool(),
            dry["status"].as_str(),
            dry["kind"].as_str(),
            dry["trigger"].as_str()
        ),
        (Some(true), Some("succeeded"), Some("sweep"), Some("manual"))
    );
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM app.session_notes")
            .fetch_one(db.pool())
            .await
            .unwrap(),
        8
    );

    let run = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ],
        url,
    );
    assert_eq!(
        run.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let run = json(&run);
    for key in [
        "run_id",
        "kind",
        "trigger",
        "status",
        "dry_run",
        "tenant",
        "started_at",
        "settled_at",
        "entities",
        "failures",
    ] {
        assert!(run.get(key).is_some(), "{key}");
    }
    let e = run["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == "SessionNote")
        .unwrap()
        .clone();
    for key in [
        "entity_id",
        "entity",
        "category",
        "strategy",
        "affected",
        "held",
        "skipped",
        "null_anchor",
        "cutoff",
    ] {
        assert!(e.get(key).is_some(), "{key}");
    }
    assert_eq!(
        (
            e["affected"].as_u64(),
            e["held"].as_u64(),
            e["strategy"].as_str()
        ),
        (Some(1), Some(1), Some("purge"))
    );
    let contacts = run["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == "CaseContact")
        .unwrap()
        .clone();
    assert_eq!(
        contacts["affected"].as_u64(),
        Some(2),
        "85 and 90 days (exactly on the cutoff) stay"
    );
    assert_eq!(sqlx::query_scalar::<_, i64>("SELECT count(*) FROM app.case_contacts WHERE anonymised_at IS NOT NULL AND email IS NULL AND phone = '[redacted]'").fetch_one(db.pool()).await.unwrap(), 2);

    let shown = json(&cohort(
        dir,
        &["--json", "runs", "show", run["run_id"].as_str().unwrap()],
        url,
    ));
    assert_eq!(shown, run);
    let runs = json(&cohort(dir, &["--json", "runs", "list"], url));
    assert_eq!(runs.as_array().unwrap().len(), 2);

    let hold_id = hold["hold_id"].as_str().unwrap();
    assert_eq!(
        cohort(dir, &["holds", "release", hold_id], url)
            .status
            .code(),
        Some(0)
    );
    assert_eq!(
        cohort(dir, &["holds", "release", hold_id], url)
            .status
            .code(),
        Some(2)
    );
    let again = json(&cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ],
        url,
    ));
    let e = again["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == "SessionNote")
        .unwrap()
        .clone();
    assert_eq!(
        e["affected"].as_u64(),
        Some(1),
        "released hold no longer protects"
    );
}

/// RS-022: a policy asking for eight connections per sweep gets a pool
/// that can serve them (the command is not refused for a pool of its own
/// making) and sweeps the same rows one connection would.
#[tokio::test]
async fn a_parallel_sweep_from_the_cli_gets_the_connections_it_asks_for() {
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let dir = dir.path();
    let url = Some(db.url());
    std::fs::write(
        dir.join("cohort.toml"),
        POLICY.replace(
            "schema = \"retention\"",
            "schema = \"retention\"\nsweep_parallelism = 8",
        ),
    )
    .unwrap();
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    let out = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ],
        url,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["status"], "succeeded", "{v}");
    // The tenant's notes of 31 and 45 days, its contacts of 95 and 100 days.
    let affected: Vec<u64> = v["entities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["affected"].as_u64().unwrap())
        .collect();
    assert_eq!(affected, [2, 2], "{v}");
    assert_eq!(
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM app.session_notes WHERE tenant_id = '11111111-1111-1111-1111-111111111111'"
        )
        .fetch_one(db.pool())
        .await
        .unwrap(),
        2
    );
}

#[tokio::test]
async fn sweep_exit_codes_follow_the_contract() {
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let dir = dir.path();
    let url = Some(db.url());
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    // Bad input: no scope, a bad time, an unknown entity, a missing record; nothing changes.
    assert_eq!(cohort(dir, &["sweep"], url).status.code(), Some(2));
    assert_eq!(
        cohort(dir, &["sweep", "--tenantless", "--now", "yesterday"], url)
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        cohort(dir, &["sweep", "--tenant", "not-a-uuid"], url)
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        cohort(
            dir,
            &["holds", "create", "--entity", "Nope", "--record", "1", "--reason", "r"],
            url
        )
        .status
        .code(),
        Some(2)
    );
    let out = cohort(
        dir,
        &[
            "--json",
            "holds",
            "create",
            "--entity",
            "CaseContact",
            "--record",
            "999",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--reason",
            "r",
        ],
        url,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(json(&out)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("does not exist"));
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM retention.sweep_run")
            .fetch_one(db.pool())
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM app.session_notes")
            .fetch_one(db.pool())
            .await
            .unwrap(),
        8
    );

    // A partially failed run exits 3.
    sqlx::raw_sql("CREATE FUNCTION app.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'no'; END $$;
        CREATE TRIGGER refuse BEFORE DELETE ON app.session_notes FOR EACH ROW EXECUTE FUNCTION app.refuse();")
        .execute(db.pool()).await.unwrap();
    let out = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ],
        url,
    );
    assert_eq!(out.status.code(), Some(3));
    let v = json(&out);
    assert_eq!(v["status"], "partially_failed");
    assert_eq!(
        v["failures"][0]["entity_id"],
        "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
    );
    assert!(v["failures"][0]["error"]
        .as_str()
        .unwrap()
        .starts_with("kind=database code=P0001"));

    // --all-tenants: every tenant of the file, then the tenantless pass; the worst status decides.
    std::fs::write(
        dir.join("cohort.toml"),
        format!("{POLICY}\n[[tenant]]\nid = \"22222222-2222-2222-2222-222222222222\"\n"),
    )
    .unwrap();
    let out = cohort(
        dir,
        &["--json", "sweep", "--all-tenants", "--now", NOW],
        url,
    );
    assert_eq!(out.status.code(), Some(3));
    let all = json(&out);
    let tenants: Vec<Value> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tenant"].clone())
        .collect();
    assert_eq!(
        tenants,
        vec![
            Value::from("22222222-2222-2222-2222-222222222222"),
            // No tenantless pass: there are no tenantless entities, and an
            // empty run is not written.
        ]
    );
}

#[tokio::test]
async fn erase_follows_the_cli_contract() {
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let dir = dir.path();
    let url = Some(db.url());
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    let subject: String =
        sqlx::query_scalar("SELECT user_id::text FROM app.case_contacts WHERE id = 1")
            .fetch_one(db.pool())
            .await
            .unwrap();
    let dry = cohort(
        dir,
        &[
            "--json",
            "erase",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--subject",
            &subject,
            "--dry-run",
            "--now",
            NOW,
        ],
        url,
    );
    assert_eq!(
        dry.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let dry = json(&dry);
    assert_eq!(
        (dry["kind"].as_str(), dry["dry_run"].as_bool()),
        (Some("erasure"), Some(true))
    );
    assert_eq!(dry["entities"][0]["affected"].as_u64(), Some(1));
    assert_eq!(
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM app.case_contacts WHERE anonymised_at IS NOT NULL"
        )
        .fetch_one(db.pool())
        .await
        .unwrap(),
        0
    );
    let live = json(&cohort(
        dir,
        &[
            "--json",
            "erase",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--subject",
            &subject,
            "--now",
            NOW,
        ],
        url,
    ));
    assert_eq!(
        (
            live["status"].as_str(),
            live["entities"][0]["affected"].as_u64()
        ),
        (Some("succeeded"), Some(1))
    );
    assert!(
        live["entities"][0]["cutoff"].is_null(),
        "no legal minimum: no anchor limit"
    );
    assert_eq!(
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM app.case_contacts WHERE anonymised_at IS NOT NULL AND id = 1"
        )
        .fetch_one(db.pool())
        .await
        .unwrap(),
        1
    );
    // A subject no column can hold is bad input.
    let bad = cohort(
        dir,
        &[
            "erase",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--subject",
            "not-a-uuid",
        ],
        url,
    );
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(
        cohort(dir, &["erase", "--subject", &subject], url)
            .status
            .code(),
        Some(2),
        "--tenant is required"
    );

    // Subject columns that declare a kind: the kind is required, an
    // unknown one is refused, and the kind is stored on the run.
    std::fs::write(
        dir.join("cohort.toml"),
        POLICY.replacen(
            "subjects = [\"user_id\"]",
            "subjects = [{ column = \"user_id\", kind = \"user\" }]",
            1,
        ),
    )
    .unwrap();
    let erase = |kind: Option<&str>| {
        let mut args = vec![
            "--json",
            "erase",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--subject",
            &subject,
            "--now",
            NOW,
        ];
        if let Some(k) = kind {
            args.extend(["--kind", k]);
        }
        cohort(dir, &args, url)
    };
    for (kind, fragment) in [
        (None, "subject columns declare kinds (\"user\")"),
        (
            Some("email"),
            "no subject column declares the kind \"email\"",
        ),
    ] {
        let out = erase(kind);
        assert_eq!(out.status.code(), Some(2), "{kind:?}");
        let message = json(&out)["error"]["message"].as_str().unwrap().to_owned();
        assert!(message.contains(fragment), "{message}");
    }
    let out = erase(Some("user"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = json(&out);
    assert_eq!(run["erasure_kind"], "user");
    let id = run["run_id"].as_str().unwrap();
    let shown = json(&cohort(dir, &["--json", "runs", "show", id], url));
    assert_eq!(shown["erasure_kind"], "user");
    let text = cohort(dir, &["runs", "show", id], url);
    assert!(String::from_utf8_lossy(&text.stdout).contains("(erasure of a user subject)"));
}

#[tokio::test]
async fn kill_9_mid_sweep_loses_nothing_and_a_rerun_finishes() {
    let (db, dir) = setup().await;
    let dir = dir.path();
    let url = Some(db.url());
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    sqlx::raw_sql("INSERT INTO app.session_notes
            SELECT gen_random_uuid(), '11111111-1111-1111-1111-111111111111', timestamptz '2026-01-01' - make_interval(secs => g), 'n'
            FROM generate_series(1, 3000) g;
        CREATE FUNCTION app.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.002); RETURN OLD; END $$;
        CREATE TRIGGER slow BEFORE DELETE ON app.session_notes FOR EACH ROW EXECUTE FUNCTION app.slow();")
        .execute(db.pool())
        .await
        .unwrap();
    std::fs::write(
        dir.join("cohort.toml"),
        POLICY.replace(
            "schema = \"retention\"",
            "schema = \"retention\"\nsweep_batch_size = 100",
        ),
    )
    .unwrap();
    // Kill the process outright once some batches have committed.
    let audited = kill_9_mid_sweep(
        &db,
        dir,
        "SELECT COALESCE(sum(affected_count), 0)::int8 FROM retention.sweep_run_entity_summary",
    )
    .await;
    // Every committed deletion has its audit, and nothing else is gone: whole batches only.
    let gone = 3000
        - sqlx::query_scalar::<_, i64>("SELECT count(*) FROM app.session_notes WHERE body = 'n'")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(
        gone, audited,
        "each row is either deleted with its audit or untouched"
    );
    assert_eq!(audited % 100, 0, "only whole batches committed");
    assert!(audited < 3000, "the kill landed mid-run");
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM retention.sweep_run WHERE status = 'started' AND settled_at IS NULL",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(open, 1, "the killed run is left Started for recovery");
    // A rerun finishes the work.
    let notes = rerun_session_notes(dir, url);
    assert_eq!(notes["affected"].as_i64(), Some(3000 - audited));
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM app.session_notes WHERE body = 'n'")
            .fetch_one(db.pool())
            .await
            .unwrap(),
        0
    );
}

/// RS-019: `kill -9` in the middle of an archive sweep. Every batch is
/// either fully moved (deleted from the source, copied into the archive
/// with the run's id, counted in the ledger) or untouched, and a rerun
/// moves the rest. The policy file names the archive table.
#[tokio::test]
async fn kill_9_mid_archive_moves_whole_batches_only_and_a_rerun_finishes() {
    let (db, dir) = setup().await;
    let dir = dir.path();
    let url = Some(db.url());
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    sqlx::raw_sql("CREATE SCHEMA vault;
        CREATE TABLE vault.session_notes_archive (id uuid PRIMARY KEY, tenant_id uuid NOT NULL,
            created_at timestamptz, body text, archived_at timestamptz NOT NULL, run_id uuid NOT NULL);
        INSERT INTO app.session_notes
            SELECT gen_random_uuid(), '11111111-1111-1111-1111-111111111111', timestamptz '2026-01-01' - make_interval(secs => g), 'n'
            FROM generate_series(1, 3000) g;
        CREATE FUNCTION app.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.002); RETURN NEW; END $$;
        CREATE TRIGGER slow AFTER INSERT ON vault.session_notes_archive FOR EACH ROW EXECUTE FUNCTION app.slow();")
        .execute(db.pool())
        .await
        .unwrap();
    let policy = POLICY
        .replace(
            "schema = \"retention\"",
            "schema = \"retention\"\nsweep_batch_size = 100",
        )
        .replace(
            "anchor = \"created_at\"\n\n[[entity]]\nname = \"CaseContact\"",
            "anchor = \"created_at\"\narchive_table = \"vault.session_notes_archive\"\n\n[[entity]]\nname = \"CaseContact\"",
        )
        .replace(
            "name = \"session-notes\"\nstrategy = \"purge\"",
            "name = \"session-notes\"\nstrategy = \"archive\"",
        );
    assert!(policy.contains("archive_table") && policy.contains("strategy = \"archive\""));
    std::fs::write(dir.join("cohort.toml"), policy).unwrap();
    let validate = cohort(dir, &["validate"], url);
    succeeded(&validate);
    let audited = kill_9_mid_sweep(
        &db,
        dir,
        "SELECT COALESCE(sum(affected_count), 0)::int8 FROM retention.sweep_run_entity_summary WHERE strategy = 'archive'",
    )
    .await;
    let pool = db.pool().clone();
    let scalar = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let left = scalar("SELECT count(*) FROM app.session_notes").await;
    let archived = scalar("SELECT count(*) FROM vault.session_notes_archive").await;
    assert_eq!(left + archived, 3000, "no row is lost or copied twice");
    assert_eq!(archived, audited, "every moved row is counted, none else");
    assert_eq!(audited % 100, 0, "only whole batches committed");
    assert!((300..3000).contains(&audited), "the kill landed mid-run");
    assert_eq!(
        scalar("SELECT count(*) FROM vault.session_notes_archive a JOIN app.session_notes s USING (id)").await,
        0,
        "no row is in both tables"
    );
    let killed: (uuid::Uuid,) = sqlx::query_as(
        "SELECT run_id FROM retention.sweep_run WHERE status = 'started' AND settled_at IS NULL",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        scalar("SELECT count(DISTINCT run_id) FROM vault.session_notes_archive").await,
        1
    );
    let stamped: uuid::Uuid =
        sqlx::query_scalar("SELECT DISTINCT run_id FROM vault.session_notes_archive")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(stamped, killed.0, "each copy names the run that moved it");
    // A rerun moves the rest.
    let notes = rerun_session_notes(dir, url);
    assert_eq!(notes["strategy"], "archive");
    assert_eq!(notes["affected"].as_i64(), Some(3000 - audited));
    assert_eq!(scalar("SELECT count(*) FROM app.session_notes").await, 0);
    assert_eq!(
        scalar("SELECT count(*) FROM vault.session_notes_archive").await,
        3000
    );
}

/// Issue "data-loss defects", A: the CLI resolves one tenant however its id
/// is spelled (jurisdiction, overrides, legal minimum), keeps text tenants
/// exactly as written in `--all-tenants`, and erasure names what it could
/// not reach.
#[tokio::test]
async fn cli_tenant_spellings_resolve_one_tenant() {
    let (db, dir) = scenario(
        "CREATE SCHEMA app;
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, user_id text);
         CREATE INDEX ON app.notes (tenant_id, created_at);
         CREATE TABLE app.globals (id bigint PRIMARY KEY, created_at timestamptz, user_id text);
         INSERT INTO app.notes VALUES
           (1, '33333333-3333-4333-a333-333333333333', now() - interval '100 days', 'u-1'),
           (2, '33333333-3333-4333-a333-333333333333', now() - interval '100 days', 'u-2');
         INSERT INTO app.globals VALUES (1, now() - interval '100 days', 'u-1');",
        r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"
subjects = ["user_id"]

[[entity]]
name = "Global"
id = "0f0e0d0c-0b0a-4908-8706-050403020100"
table = "app.globals"
category = "notes"
anchor = "created_at"
tenantless = true
subjects = ["user_id"]

[[category]]
name = "notes"
strategy = "purge"
period = "30d"

[[category.override]]
jurisdiction = "EU"
period = "3650d"
legal_min = "2190d"

[[tenant]]
id = "33333333-3333-4333-a333-333333333333"
jurisdiction = "EU"

[[tenant]]
id = "3333333333334333A333333333333333"
jurisdiction = "EU"
"#,
    )
    .await;
    let dir = dir.path();
    let url = Some(db.url());
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    for spelling in [
        "3333333333334333a333333333333333",
        "{33333333-3333-4333-A333-333333333333}",
        "urn:uuid:33333333-3333-4333-a333-333333333333",
    ] {
        let out = cohort(dir, &["--json", "sweep", "--tenant", spelling], url);
        assert_eq!(out.status.code(), Some(0), "{spelling}");
        let run = json(&out);
        assert_eq!(run["tenant"], "33333333-3333-4333-a333-333333333333");
        assert_eq!(run["entities"][0]["period"], "3650d", "{spelling}");
        assert_eq!(run["entities"][0]["affected"], 0, "{spelling}");
        let out = cohort(
            dir,
            &["--json", "erase", "--tenant", spelling, "--subject", "u-1"],
            url,
        );
        assert_eq!(out.status.code(), Some(0), "{spelling}");
        let run = json(&out);
        assert_eq!(run["entities"][0]["kept_by_legal_min"], 1, "{spelling}");
        assert_eq!(run["entities"][0]["affected"], 0, "{spelling}");
        assert_eq!(run["not_reached"][0]["entity"], "Global");
    }
    // The tenantless erasure reaches Global.
    let out = cohort(
        dir,
        &["--json", "erase", "--tenantless", "--subject", "u-1"],
        url,
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json(&out)["entities"][0]["affected"], 1);
    // --all-tenants: the two spellings are one tenant, swept once.
    let out = cohort(dir, &["--json", "sweep", "--all-tenants"], url);
    assert_eq!(out.status.code(), Some(0));
    let runs = json(&out);
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2, "one tenant pass and the tenantless pass");
    assert_eq!(runs[0]["entities"][0]["affected"], 0);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM app.notes")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(left, 2);
    let out = cohort(dir, &["erase", "--subject", "u-1"], url);
    assert_eq!(out.status.code(), Some(2), "a scope is required");
}

/// Contract defects: an `--all-tenants` pass that fails before its run
/// counts (in the JSON and the exit code), a future `--now` refused unless
/// allowed, and error kinds in the JSON.
#[tokio::test]
async fn cli_all_tenants_future_now_and_error_kinds_follow_the_contract() {
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let dir = dir.path();
    let url = Some(db.url());
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    let base = std::fs::read_to_string(dir.join("cohort.toml")).unwrap();

    // A tenants query naming one good tenant and one that cannot be a tenant.
    std::fs::write(
        dir.join("cohort.toml"),
        format!(
            "tenants_query = \"SELECT t FROM (VALUES ('11111111-1111-1111-1111-111111111111'), ('not-a-uuid')) v(t)\"\n{base}"
        ),
    )
    .unwrap();
    let out = cohort(
        dir,
        &["--json", "sweep", "--all-tenants", "--now", NOW],
        url,
    );
    assert_eq!(out.status.code(), Some(3), "some passes failed");
    let docs = json(&out);
    let docs = docs.as_array().unwrap();
    assert_eq!(docs.len(), 2, "one run and one pass that never started");
    assert_eq!(docs[0]["status"], "succeeded");
    assert_eq!(docs[1]["status"], "not_started");
    // The row is named by its position, never by its value.
    assert_eq!(docs[1]["tenant"], Value::Null);
    assert_eq!(docs[1]["position"], 2);
    assert_eq!(docs[1]["error"]["kind"], "invalid_input");
    assert!(!docs[1].to_string().contains("not-a-uuid"), "{}", docs[1]);
    // Every pass refused as bad input: exit 2.
    std::fs::write(
        dir.join("cohort.toml"),
        format!("tenants_query = \"SELECT 'nope'\"\n{base}"),
    )
    .unwrap();
    let out = cohort(
        dir,
        &["--json", "sweep", "--all-tenants", "--now", NOW],
        url,
    );
    assert_eq!(out.status.code(), Some(2));
    // `validate` runs the tenants query and warns about rows that cannot
    // be tenants (each fails only its own pass), without refusing.
    let out = cohort(dir, &["--json", "validate"], url);
    succeeded(&out);
    let report = json(&out);
    assert_eq!(report["valid"], true);
    assert_eq!(report["unusable_tenants"][0]["position"], 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("row 1 cannot be a tenant"));
    std::fs::write(
        dir.join("cohort.toml"),
        format!("tenants_query = \"SELECT 1, 2, 3, 4\"\n{base}"),
    )
    .unwrap();
    let out = cohort(dir, &["--json", "validate"], url);
    assert_eq!(out.status.code(), Some(2));
    assert!(json(&out)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("one to three columns"));
    // No tenants at all with tenant-scoped entities: a pass that did not
    // start, so exit 2 (there is no tenantless entity here to sweep).
    std::fs::write(
        dir.join("cohort.toml"),
        format!("tenants_query = \"SELECT 'x' WHERE false\"\n{base}"),
    )
    .unwrap();
    let out = cohort(
        dir,
        &["--json", "sweep", "--all-tenants", "--now", NOW],
        url,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(json(&out)[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no tenants to sweep"));

    std::fs::write(dir.join("cohort.toml"), &base).unwrap();

    // A future --now is refused for a mutating run, allowed for a dry run
    // or when asked for; nothing is written when refused.
    let future = (chrono::Utc::now() + chrono::Duration::days(10)).to_rfc3339();
    let tenant = "11111111-1111-1111-1111-111111111111";
    let out = cohort(
        dir,
        &["--json", "sweep", "--tenant", tenant, "--now", &future],
        url,
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json(&out)["error"]["kind"], "refused");
    let runs = cohort(dir, &["--json", "runs", "list"], url);
    let before = json(&runs).as_array().unwrap().len();
    let out = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            tenant,
            "--now",
            &future,
            "--dry-run",
        ],
        url,
    );
    assert_eq!(out.status.code(), Some(0));
    let out = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            tenant,
            "--now",
            &future,
            "--allow-future-now",
        ],
        url,
    );
    assert_eq!(out.status.code(), Some(0));
    let runs = cohort(dir, &["--json", "runs", "list"], url);
    assert_eq!(json(&runs).as_array().unwrap().len(), before + 2);

    // Error kinds: an unknown run is not_found, exit 2.
    let out = cohort(
        dir,
        &["--json", "runs", "show", &uuid::Uuid::new_v4().to_string()],
        url,
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json(&out)["error"]["kind"], "not_found");
}

/// The newcomer's operator output: an unreachable database fails within a
/// bounded time with its cause and where (never the password); a closed
/// stdout pipe ends the command quietly; `--json` usage errors are JSON;
/// stderr carries no colour codes when it is not a terminal.
#[tokio::test]
async fn operator_output_is_bounded_quiet_and_plain() {
    let (db, dir) = setup().await;
    let dir = dir.path();

    // Connection refused: at once, with host and port, without the password.
    let started = std::time::Instant::now();
    let out = cohort(
        dir,
        &[
            "--json",
            "validate",
            "--database-url",
            "postgres://app:s3cret-pw@127.0.0.1:1/appdb",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = json(&out);
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("127.0.0.1:1"), "{message}");
    assert!(message.contains("appdb"), "{message}");
    assert_eq!(err["error"]["kind"], "connection");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("s3cret-pw"));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("s3cret-pw"));
    assert!(started.elapsed() < std::time::Duration::from_secs(20));

    // A server that accepts the TCP connection and never answers: bounded.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let started = std::time::Instant::now();
    let out = cohort(
        dir,
        &[
            "migrate",
            "--database-url",
            &format!("postgres://app@127.0.0.1:{port}/appdb"),
        ],
        None,
    );
    let waited = started.elapsed();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
    assert!(stderr.contains("no answer within 5 s"), "{stderr}");
    assert!(waited < std::time::Duration::from_secs(20), "{waited:?}");
    drop(silent);

    // stdout closed before the command writes: no panic, no backtrace.
    assert_eq!(
        cohort(dir, &["migrate"], Some(db.url())).status.code(),
        Some(0)
    );
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "\"{}\" --json validate | true",
            env!("CARGO_BIN_EXE_cohort")
        ))
        .current_dir(dir)
        .env("DATABASE_URL", db.url())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");

    // Usage errors with --json: one JSON document, exit 2.
    let out = cohort(dir, &["--json", "sweep", "--no-such-flag"], Some(db.url()));
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json(&out)["error"]["kind"], "usage");

    // No colour codes on a stderr that is not a terminal.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_cohort"));
    let out = cmd
        .current_dir(dir)
        .args(["validate"])
        .env("DATABASE_URL", db.url())
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert!(!out.stderr.is_empty(), "debug logs were written");
    assert!(!out.stderr.contains(&0x1b), "no ANSI escapes on a pipe");
}

/// The newcomer's path: `preview --all-tenants`, run ids by the prefix the
/// tables print, `runs list --limit 0`, hold lists naming entities,
/// `new-id`, and `demo --write-policy` for a policy to start from.
#[tokio::test]
async fn newcomer_commands_do_what_the_output_suggests() {
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let dir = dir.path();
    let url = Some(db.url());
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    std::fs::write(
        dir.join("cohort.toml"),
        format!(
            "{POLICY}\n[[tenant]]\nid = \"11111111-1111-1111-1111-111111111111\"\n\n[[tenant]]\nid = \"22222222-2222-2222-2222-222222222222\"\n"
        ),
    )
    .unwrap();

    let out = cohort(
        dir,
        &["--json", "preview", "--all-tenants", "--now", NOW],
        url,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let previews = json(&out);
    let tenants: Vec<&str> = previews
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(
        tenants,
        vec![
            "11111111-1111-1111-1111-111111111111",
            "22222222-2222-2222-2222-222222222222"
        ]
    );
    // The human table shows what produced each cutoff.
    let out = cohort(
        dir,
        &[
            "preview",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ],
        url,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("PERIOD") && text.contains("LEGAL MIN") && text.contains("90d"),
        "{text}"
    );

    let out = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ],
        url,
    );
    let run_id = json(&out)["run_id"].as_str().unwrap().to_string();
    let out = cohort(dir, &["--json", "runs", "show", &run_id[..8]], url);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json(&out)["run_id"], run_id.as_str());
    let out = cohort(
        dir,
        &["--json", "runs", "show", &run_id[..8].to_uppercase()],
        url,
    );
    assert_eq!(json(&out)["run_id"], run_id.as_str());
    let out = cohort(dir, &["--json", "runs", "show", "zz"], url);
    assert_eq!(out.status.code(), Some(2));

    let out = cohort(dir, &["--json", "runs", "list", "--limit", "0"], url);
    assert_eq!(json(&out), serde_json::json!([]));
    let out = cohort(dir, &["runs", "list"], url);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("KIND") && text.contains("DURATION") && text.contains("sweep"),
        "{text}"
    );
    // Who started each run: an operator (manual) or the worker (scheduled).
    let header = text.lines().next().unwrap_or_default();
    assert!(
        header.contains("KIND") && header.contains("TRIGGER"),
        "{text}"
    );
    assert!(
        text.lines().skip(1).any(|l| l.contains(" manual ")),
        "{text}"
    );

    let contact = "1";
    let out = cohort(
        dir,
        &[
            "holds",
            "create",
            "--entity",
            "CaseContact",
            "--record",
            contact,
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--reason",
            "case 7",
        ],
        url,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cohort(dir, &["holds", "list"], url);
    assert!(String::from_utf8_lossy(&out.stdout).contains("CaseContact"));

    let out = cohort(dir, &["new-id"], None);
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(uuid::Uuid::parse_str(&printed).is_ok(), "{printed}");

    let target = dir.join("starter.toml");
    let out = cohort(
        dir,
        &["demo", "--write-policy", target.to_str().unwrap()],
        None,
    );
    assert_eq!(out.status.code(), Some(0));
    let written = std::fs::read_to_string(&target).unwrap();
    assert!(written.contains("COHORT_HASH_KEY") && written.contains("[[entity]]"));
    cohort::policy::PolicyFile::parse(&written).expect("the written policy loads");
    let again = cohort(
        dir,
        &["demo", "--write-policy", target.to_str().unwrap()],
        None,
    );
    assert_eq!(again.status.code(), Some(2), "an existing file is kept");
}

/// A single tenant's jurisdiction comes from `tenants_query` too: its
/// overrides and legal minimums apply to `--tenant` runs, and a tenant the
/// query does not list is refused rather than swept under default rules.
#[tokio::test]
async fn single_tenant_runs_take_their_jurisdiction_from_the_tenants_query() {
    let (db, dir) = scenario(
        "CREATE SCHEMA app;
         CREATE TABLE app.orgs (id uuid PRIMARY KEY, region text);
         INSERT INTO app.orgs VALUES ('33333333-3333-4333-a333-333333333333', 'EU');
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, user_id text);
         CREATE INDEX ON app.notes (tenant_id, created_at);
         INSERT INTO app.notes VALUES
           (1, '33333333-3333-4333-a333-333333333333', now() - interval '100 days', 'u-1'),
           (2, '44444444-4444-4444-8444-444444444444', now() - interval '100 days', 'u-1');",
        r#"
tenants_query = "SELECT id, region FROM app.orgs"

[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"
subjects = ["user_id"]

[[category]]
name = "notes"
strategy = "purge"
period = "30d"

[[category.override]]
jurisdiction = "EU"
period = "3650d"
legal_min = "2190d"
"#,
    )
    .await;
    let dir = dir.path();
    let url = Some(db.url());
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    let tenant = "3333333333334333A333333333333333";
    for args in [
        vec!["--json", "preview", "--tenant", tenant],
        vec!["--json", "sweep", "--tenant", tenant],
        vec!["--json", "erase", "--tenant", tenant, "--subject", "u-1"],
    ] {
        let out = cohort(dir, &args, url);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc = json(&out);
        assert_eq!(doc["entities"][0]["period"], "3650d", "{args:?}");
        assert_eq!(doc["entities"][0]["affected"], 0, "{args:?}");
    }
    // A tenant the query does not list: refused, nothing written.
    let out = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            "44444444-4444-4444-8444-444444444444",
        ],
        url,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(json(&out)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("not among the tenants tenants_query returns"));
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM app.notes")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(left, 2);
}

/// Polls `sql` (a count) until it is zero, for at most 30 s: waits on what
/// the database says, never on a fixed sleep.
async fn wait_for_zero(pool: &sqlx::PgPool, sql: &'static str) {
    wait_until(sql, Duration::from_secs(30), async || {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(pool)
            .await
            .unwrap()
            == 0
    })
    .await;
}

/// `dead-letters list` and `retry` as SPEC §12 pins them.
#[tokio::test]
async fn dead_letters_are_listed_and_retried_from_the_cli() {
    let (db, dir) = setup().await;
    let dir = dir.path();
    let url = Some(db.url());
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    sqlx::raw_sql(
        "INSERT INTO retention.sweep_run (run_id, kind, trigger, dry_run, tenant_id, status, logical_now, started_at, settled_at)
           VALUES ('11111111-1111-4111-8111-111111111111', 'sweep', 'manual', false,
                   '11111111-1111-1111-1111-111111111111', 'succeeded', now(), now(), now());
         INSERT INTO retention.sweep_run_row_detail (run_id, retention_entity_id, entity_type, record_id, tenant_id, action)
           VALUES ('11111111-1111-4111-8111-111111111111', 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'SessionNote', 'r1',
                   '11111111-1111-1111-1111-111111111111', 'purge'),
                  ('11111111-1111-4111-8111-111111111111', 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'SessionNote', 'r2',
                   '11111111-1111-1111-1111-111111111111', 'purge');
         INSERT INTO retention.sweep_row_handler_status (row_detail_id, run_id, handler_id, phase, status, attempts,
             captured_payload, payload_scrubbed_at, last_error)
           SELECT row_detail_id, run_id, 'crm', 'immediate', 'dead_lettered', 10,
                  CASE WHEN record_id = 'r1' THEN '{}'::jsonb END,
                  CASE WHEN record_id = 'r2' THEN now() END,
                  'kind=handler code=on_after_failed diagnostic_id=x'
           FROM retention.sweep_run_row_detail ORDER BY record_id;",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let out = cohort(
        dir,
        &["--json", "dead-letters", "list", "--entity", "SessionNote"],
        url,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let letters = json(&out);
    let letters = letters.as_array().unwrap();
    assert_eq!(letters.len(), 2);
    for key in [
        "id",
        "run_id",
        "entity_id",
        "entity",
        "record_id",
        "tenant",
        "handler",
        "attempts",
        "last_error",
        "dead_lettered_at",
    ] {
        assert!(letters[0].get(key).is_some(), "{key} missing");
    }
    let id_of = |record: &str| {
        letters.iter().find(|l| l["record_id"] == record).unwrap()["id"]
            .as_i64()
            .unwrap()
            .to_string()
    };
    let (good, scrubbed) = (id_of("r1"), id_of("r2"));
    // This policy has no handler "crm": retrying its work is refused,
    // naming it. With the handler declared, the retry goes ahead.
    let out = cohort(dir, &["--json", "dead-letters", "retry", &good], url);
    assert_eq!(out.status.code(), Some(2));
    assert!(json(&out)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("handler \"crm\""));
    std::fs::write(
        dir.join("cohort.toml"),
        POLICY.replace(
            "anchor = \"created_at\"\n\n[[entity]]\nname = \"CaseContact\"",
            "anchor = \"created_at\"\n\n[[entity.handler]]\nname = \"crm\"\ncommand = [\"true\"]\n\n[[entity]]\nname = \"CaseContact\"",
        ),
    )
    .unwrap();
    let snapshot = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT string_agg(status || attempts, ',' ORDER BY handler_status_id) FROM retention.sweep_row_handler_status",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    let before = snapshot().await;
    for bad in [vec![scrubbed.as_str()], vec![good.as_str(), "999999"]] {
        let mut args = vec!["--json", "dead-letters", "retry"];
        args.extend(bad.iter());
        let out = cohort(dir, &args, url);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert_eq!(snapshot().await, before, "nothing changed");
    }
    let out = cohort(dir, &["--json", "dead-letters", "retry", &good], url);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json(&out)["retried"], 1);
    let out = cohort(dir, &["--json", "dead-letters", "list"], url);
    assert_eq!(
        json(&out).as_array().unwrap().len(),
        1,
        "only the scrubbed one is left"
    );
}

/// Policy-file `command` handlers and `cohort dispatch`: the captured
/// columns reach the program as JSON on stdin, a failing program's exit
/// status is the dead letter's reason (its stderr never stored), and a
/// dispatcher killed with -9 mid-delivery loses nothing: the work is
/// redelivered after the claim time-out, its attempts counted.
#[tokio::test]
async fn command_handlers_are_dispatched_at_least_once_even_across_kill_9() {
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let dir = dir.path();
    let url = Some(db.url());
    let out_file = dir.join("delivered.jsonl");
    // Every `log` attempt blocks (and never writes) until the test has
    // killed the first dispatcher and created `release`: a second delivery
    // that the first dispatcher runs concurrently cannot complete before
    // the kill, so each purged row is written exactly once, by the
    // redelivery. (The orphaned `sh` of a killed attempt stays in the
    // branch that never writes.)
    let mark = dir.join("an-attempt-started");
    let release = dir.join("release");
    let policy = POLICY.replace(
        "[[entity]]\nname = \"CaseContact\"",
        &format!(
            "[[entity.handler]]\nname = \"log\"\npriority = 1\ncapture = [\"body\"]\ncommand = [\"sh\", \"-c\", \"if [ -f '{release}' ]; then d=$(cat); printf '%s\\n' \\\"$d\\\" >> '{out}'; else touch '{mark}'; sleep 20; fi\"]\n\n[[entity.handler]]\nname = \"crm\"\npriority = 2\ncommand = [\"sh\", \"-c\", \"echo 'secret-stderr@example.com' >&2; exit 3\"]\n\n[[entity]]\nname = \"CaseContact\"",
            release = release.display(),
            mark = mark.display(),
            out = out_file.display()
        ),
    );
    let policy = format!("[cohort.dispatch]\nmax_attempts = 2\nbase_backoff = \"1s\"\nclaim_timeout = \"3s\"\n\n{policy}")
        .replacen("[cohort]\nschema = \"retention\"\n", "", 1);
    let policy = format!("[cohort]\nschema = \"retention\"\n{policy}");
    std::fs::write(dir.join("cohort.toml"), &policy).unwrap();
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    let tenant = "11111111-1111-1111-1111-111111111111";
    let out = cohort(
        dir,
        &["--json", "sweep", "--tenant", tenant, "--now", NOW],
        url,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let purged = json(&out)["entities"][0]["affected"].as_u64().unwrap();
    assert!(purged >= 2);

    // A dispatcher that blocks in its first `log` delivery, killed with -9.
    let mut child = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .current_dir(dir)
        .arg("dispatch")
        .env("DATABASE_URL", db.url())
        .spawn()
        .unwrap();
    wait_until(
        "the first delivery to start",
        Duration::from_secs(10),
        async || mark.exists(),
    )
    .await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!out_file.exists(), "no attempt completed before the kill");
    std::fs::write(&release, "").unwrap();
    // After the claim time-out (as the database clock sees it) another
    // dispatcher redelivers; nothing is lost.
    wait_for_zero(
        db.pool(),
        "SELECT count(*) FROM retention.sweep_row_handler_status \
         WHERE status = 'in_flight' AND claim_expires_at > now()",
    )
    .await;
    let out = cohort(dir, &["--json", "dispatch", "--once"], url);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = std::fs::read_to_string(&out_file)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len() as u64,
        purged,
        "every purged row delivered once to `log`"
    );
    for doc in &lines {
        assert_eq!(doc["handler"], "log");
        assert_eq!(doc["run_kind"], "sweep");
        assert_eq!(doc["tenant"], tenant);
        assert_eq!(doc["snapshot"]["body"], "n", "captured before the purge");
        assert!(doc["delivery_id"].is_string());
    }
    let reclaimed: i32 = sqlx::query_scalar(
        "SELECT max(attempts) FROM retention.sweep_row_handler_status WHERE handler_id = 'log'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(reclaimed, 2, "the killed delivery counted as an attempt");
    // `crm` always fails: after its second attempt (once its backoff is
    // over) it is dead-lettered with its exit status; its stderr is not stored.
    wait_for_zero(
        db.pool(),
        "SELECT count(*) FROM retention.sweep_row_handler_status \
         WHERE handler_id = 'crm' AND status = 'pending' AND next_attempt_at > now()",
    )
    .await;
    let out = cohort(dir, &["--json", "dispatch", "--once"], url);
    assert_eq!(json(&out)["dead_lettered"].as_u64(), Some(purged));
    let reasons: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT last_error FROM retention.sweep_row_handler_status WHERE status = 'dead_lettered'",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(reasons, vec!["exit status 3".to_string()]);
    let leaked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM retention.sweep_row_handler_status WHERE last_error LIKE '%secret-stderr%'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(leaked, 0);
    let out = cohort(dir, &["--json", "dead-letters", "list"], url);
    assert_eq!(json(&out).as_array().unwrap().len() as u64, purged);

    // No handlers in the policy: `dispatch` is refused; a webhook whose
    // signing secret variable is not set is refused at load.
    std::fs::write(dir.join("cohort.toml"), POLICY).unwrap();
    assert_eq!(
        cohort(dir, &["dispatch", "--once"], url).status.code(),
        Some(2)
    );
    std::fs::write(
        dir.join("cohort.toml"),
        POLICY.replace(
            "[[entity]]\nname = \"CaseContact\"",
            "[[entity.handler]]\nname = \"hook\"\nurl = \"http://127.0.0.1:9/x\"\nsecret_env = \"COHORT_TEST_UNSET_SECRET_VARIABLE\"\n\n[[entity]]\nname = \"CaseContact\"",
        ),
    )
    .unwrap();
    let out = cohort(dir, &["--json", "validate"], url);
    assert_eq!(out.status.code(), Some(2));
    assert!(json(&out)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("which is not set"));
}

/// The fence, with real processes: a dispatcher stopped (SIGSTOP) in the
/// middle of a delivery loses its claim to another dispatcher, which
/// delivers; when the stopped one continues, it cannot settle anything.
#[tokio::test]
async fn a_stopped_dispatcher_cannot_settle_work_taken_over_by_another() {
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let dir = dir.path();
    let url = Some(db.url());
    let out_file = dir.join("delivered.jsonl");
    let mark = dir.join("first-attempt-started");
    let policy = POLICY
        .replace(
            "[[entity]]\nname = \"CaseContact\"",
            &format!(
                "[[entity.handler]]\nname = \"log\"\ncommand = [\"sh\", \"-c\", \"if [ -f '{mark}' ]; then cat >> '{out}'; echo >> '{out}'; else touch '{mark}'; sleep 2; fi\"]\n\n[[entity]]\nname = \"CaseContact\"",
                mark = mark.display(),
                out = out_file.display()
            ),
        )
        .replacen(
            "[cohort]\nschema = \"retention\"\n",
            "[cohort]\nschema = \"retention\"\n\n[cohort.dispatch]\nclaim_timeout = \"3s\"\nmax_parallelism = 1\nbatch_size = 1\n",
            1,
        );
    std::fs::write(dir.join("cohort.toml"), &policy).unwrap();
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    // One row to deliver, so the stopped delivery is the only work.
    sqlx::raw_sql(
        "DELETE FROM app.session_notes WHERE tenant_id <> '11111111-1111-1111-1111-111111111111'
            OR created_at BETWEEN '2026-04-20' AND '2026-05-02'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let out = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ],
        url,
    );
    assert_eq!(json(&out)["entities"][0]["affected"], 1);

    let stopped_log = dir.join("stopped-dispatcher.log");
    let mut stopped = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .current_dir(dir)
        .arg("dispatch")
        .env("DATABASE_URL", db.url())
        .stderr(std::fs::File::create(&stopped_log).unwrap())
        .spawn()
        .unwrap();
    wait_until_blocking(
        "the first delivery to start",
        Duration::from_secs(10),
        || mark.exists(),
    );
    let pid = stopped.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    // Its claim expires (backdated rather than waited for); another
    // dispatcher takes the work over and delivers.
    sqlx::raw_sql(
        "UPDATE retention.sweep_row_handler_status SET claim_expires_at = now() - interval '1 second' WHERE status = 'in_flight'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let out = cohort(dir, &["--json", "dispatch", "--once"], url);
    assert_eq!(
        json(&out)["delivered"],
        1,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let settled = || async {
        sqlx::query_as::<_, (String, i32, Option<String>)>(
            "SELECT status, attempts, last_error FROM retention.sweep_row_handler_status",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    assert_eq!(settled().await, ("succeeded".to_string(), 2, None));
    // The stopped dispatcher continues: its delivery finishes, but it no
    // longer holds the claim, so the row stays as the newer delivery left it.
    assert!(Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap()
        .success());
    // Its delivery ends and its settle finds the claim gone: it says so.
    wait_until_blocking(
        "the stopped dispatcher to find its claim taken over",
        Duration::from_secs(20),
        || {
            std::fs::read_to_string(&stopped_log)
                .unwrap_or_default()
                .contains("claim had expired and was taken over")
        },
    );
    assert_eq!(settled().await, ("succeeded".to_string(), 2, None));
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = stopped.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a graceful stop on SIGTERM");
    let delivered = std::fs::read_to_string(&out_file).unwrap();
    assert_eq!(
        delivered.lines().filter(|l| !l.trim().is_empty()).count(),
        1
    );
}

/// Three dispatcher processes drain one queue: every row's handlers are
/// delivered, in order, none skipped, and none twice (no claim expired).
/// `SOAK_ROWS` sets the size (20 000 for the full run; CI uses 1 500).
#[tokio::test]
async fn three_dispatcher_processes_deliver_every_row_in_order() {
    let rows: u64 = std::env::var("SOAK_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_500);
    let (db, dir) = setup().await;
    let dir = dir.path();
    let url = Some(db.url());
    let out_file = dir.join("delivered.jsonl");
    let handler = |name: &str, priority: u32| {
        format!(
            "[[entity.handler]]\nname = \"{name}\"\npriority = {priority}\ncommand = [\"sh\", \"-c\", \"d=$(cat); printf '%s\\\\n' \\\"$d\\\" >> '{out}'\"]\n\n",
            out = out_file.display()
        )
    };
    let policy = POLICY
        .replace(
            "[[entity]]\nname = \"CaseContact\"",
            &format!("{}{}[[entity]]\nname = \"CaseContact\"", handler("a", 1), handler("b", 2)),
        )
        .replacen(
            "[cohort]\nschema = \"retention\"\n",
            "[cohort]\nschema = \"retention\"\n\n[cohort.dispatch]\npoll_interval = \"1s\"\nbatch_size = 100\n",
            1,
        );
    std::fs::write(dir.join("cohort.toml"), &policy).unwrap();
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO app.session_notes SELECT gen_random_uuid(), '11111111-1111-1111-1111-111111111111',
             timestamptz '2026-06-01' - interval '40 days', 'n' FROM generate_series(1, {rows})"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let out = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ],
        url,
    );
    assert_eq!(json(&out)["entities"][0]["affected"].as_u64(), Some(rows));

    let mut dispatchers: Vec<std::process::Child> = (0..3)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_cohort"))
                .current_dir(dir)
                .arg("dispatch")
                .env("DATABASE_URL", db.url())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let started = std::time::Instant::now();
    wait_until("every delivery settled", Duration::from_secs(600), async || {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM retention.sweep_row_handler_status WHERE status IN ('pending', 'in_flight')",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
            == 0
    })
    .await;
    for d in &mut dispatchers {
        Command::new("kill")
            .args(["-TERM", &d.id().to_string()])
            .status()
            .unwrap();
        assert_eq!(d.wait().unwrap().code(), Some(0));
    }
    let text = std::fs::read_to_string(&out_file).unwrap();
    let docs: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut seen: std::collections::HashMap<String, Vec<String>> = Default::default();
    for d in &docs {
        seen.entry(d["record_id"].as_str().unwrap().to_string())
            .or_default()
            .push(d["handler"].as_str().unwrap().to_string());
    }
    assert_eq!(seen.len() as u64, rows, "every row delivered");
    let duplicates = docs.len() as u64 - 2 * rows;
    assert_eq!(
        duplicates, 0,
        "no claim expired, so nothing was delivered twice"
    );
    for (record, handlers) in &seen {
        assert_eq!(
            handlers,
            &vec!["a".to_string(), "b".to_string()],
            "{record}: in order"
        );
    }
    let settled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM retention.sweep_row_handler_status WHERE status = 'succeeded' AND attempts = 1",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(settled as u64, 2 * rows);
    eprintln!(
        "three dispatchers delivered {} in {:.1}s",
        2 * rows,
        started.elapsed().as_secs_f64()
    );
}

/// One HTTP request as the test server saw it.
struct Seen {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// A loopback HTTP server answering with `statuses` in turn (then 200), or
/// never answering when `silent`. Records what it receives.
async fn hook_server(
    statuses: Vec<u16>,
    silent: bool,
) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<Seen>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut answers = statuses.into_iter();
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let (head_end, length) = loop {
                let n = sock.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    break (None, 0);
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..i]).to_string();
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    break (Some(i + 4), length);
                }
            };
            let Some(start) = head_end else { continue };
            while buf.len() < start + length {
                let n = sock.read(&mut chunk).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let head = String::from_utf8_lossy(&buf[..start]).to_string();
            let headers = head
                .lines()
                .skip(1)
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
                .collect();
            log.lock().unwrap().push(Seen {
                headers,
                body: buf[start..].to_vec(),
            });
            if silent {
                // The silent server under test: it holds the connection
                // without answering, longer than the handler's time-out.
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                continue;
            }
            let status = answers.next().unwrap_or(200);
            let reply =
                format!("HTTP/1.1 {status} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
            let _ = sock.write_all(reply.as_bytes()).await;
        }
    });
    (port, seen)
}

/// Webhooks (`url` handlers): signed with HMAC-SHA256 of "<t>.<body>", 503
/// then 200 is delivered on attempt 2, and a server that never answers is a
/// timed-out attempt. (Multi-threaded: the test servers answer while the
/// test waits for the `cohort` process.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_handlers_post_signed_documents_and_retry() {
    use hmac::{KeyInit, Mac};
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let dir = dir.path();
    let (port, seen) = hook_server(vec![503], false).await;
    let (silent_port, _) = hook_server(vec![], true).await;
    let policy = POLICY
        .replace(
            "[[entity]]\nname = \"CaseContact\"",
            &format!(
                "[[entity.handler]]\nname = \"hook\"\npriority = 1\ncapture = [\"body\"]\nurl = \"http://127.0.0.1:{port}/retention\"\nsecret_env = \"CRM_HOOK_SECRET\"\n\n\
                 [[entity.handler]]\nname = \"slow\"\npriority = 2\ntimeout = \"1s\"\nurl = \"http://127.0.0.1:{silent_port}/slow\"\n\n[[entity]]\nname = \"CaseContact\""
            ),
        )
        .replacen(
            "[cohort]\nschema = \"retention\"\n",
            "[cohort]\nschema = \"retention\"\n\n[cohort.dispatch]\nbase_backoff = \"1s\"\n",
            1,
        );
    std::fs::write(dir.join("cohort.toml"), &policy).unwrap();
    let run = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cohort"));
        cmd.current_dir(dir)
            .args(args)
            .env("DATABASE_URL", db.url())
            .env("CRM_HOOK_SECRET", "s3cret-signing-key");
        cmd.output().unwrap()
    };
    assert_eq!(run(&["migrate"]).status.code(), Some(0));
    sqlx::raw_sql(
        "DELETE FROM app.session_notes WHERE tenant_id <> '11111111-1111-1111-1111-111111111111'
            OR created_at BETWEEN '2026-04-20' AND '2026-05-02'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let out = run(&[
        "--json",
        "sweep",
        "--tenant",
        "11111111-1111-1111-1111-111111111111",
        "--now",
        NOW,
    ]);
    assert_eq!(
        json(&out)["entities"][0]["affected"],
        1,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = run(&["--json", "dispatch", "--once"]);
    assert_eq!(json(&first)["failed"], 1, "503: a failed attempt");
    // Its back-off has passed (backdated rather than waited for).
    sqlx::raw_sql(
        "UPDATE retention.sweep_row_handler_status SET next_attempt_at = now() - interval '1 second' WHERE status = 'pending'",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let second = run(&["--json", "dispatch", "--once"]);
    let report = json(&second);
    assert_eq!(report["delivered"], 1, "200 on attempt 2");
    assert_eq!(report["failed"], 1, "then the silent server times out");
    let attempts: Vec<(String, String, i32, Option<String>)> = sqlx::query_as(
        "SELECT handler_id, status, attempts, last_error FROM retention.sweep_row_handler_status ORDER BY handler_id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(attempts[0], ("hook".into(), "succeeded".into(), 2, None));
    assert_eq!(
        (
            attempts[1].0.as_str(),
            attempts[1].1.as_str(),
            attempts[1].3.as_deref()
        ),
        ("slow", "pending", Some("timed out after 1s"))
    );
    // Both requests were signed; the signature verifies; the document is SPEC §8a's.
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    for req in seen.iter() {
        let header = |name: &str| {
            req.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert_eq!(header("content-type"), "application/json");
        let signature = header("cohort-signature");
        let (t, v1) = signature
            .strip_prefix("t=")
            .and_then(|s| s.split_once(",v1="))
            .expect("t=<seconds>,v1=<hex>");
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"s3cret-signing-key").unwrap();
        mac.update(format!("{t}.").as_bytes());
        mac.update(&req.body);
        let expected: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(v1, expected, "the signature verifies");
        let doc: Value = serde_json::from_slice(&req.body).unwrap();
        assert_eq!(
            header("cohort-delivery"),
            doc["delivery_id"].as_str().unwrap()
        );
        assert_eq!(doc["handler"], "hook");
        assert_eq!(doc["snapshot"]["body"], "n");
    }
    assert_eq!(
        serde_json::from_slice::<Value>(&seen[1].body).unwrap()["attempt"],
        2
    );
}

/// RS-040: `init` reads an `account_id` as the tenant when most tables
/// point at one table through it (the catalog's foreign keys), and never
/// proposes `tenantless` for such a table.
#[tokio::test]
async fn init_reads_an_account_id_most_tables_reference_as_the_tenant() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(
        "CREATE SCHEMA saas;
         CREATE TABLE saas.accounts (id bigint PRIMARY KEY, created_at timestamptz NOT NULL);
         CREATE TABLE saas.projects (id bigint PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES saas.accounts, created_at timestamptz NOT NULL);
         CREATE TABLE saas.invoices (id bigint PRIMARY KEY,
             account_id bigint NOT NULL REFERENCES saas.accounts, created_at timestamptz NOT NULL);
         CREATE TABLE saas.events (id bigint PRIMARY KEY, created_at timestamptz NOT NULL);",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = cohort(
        dir.path(),
        &["init", "--schema", "saas", "--output", "cohort.toml"],
        Some(db.url()),
    );
    succeeded(&out);
    let text = std::fs::read_to_string(dir.path().join("cohort.toml")).unwrap();
    let block = |table: &str| -> String {
        let at = text
            .find(&format!("table = \"saas.{table}\""))
            .unwrap_or_else(|| panic!("no {table} in:\n{text}"));
        text[at..].split("[[entity]]").next().unwrap().to_owned()
    };
    for table in ["projects", "invoices"] {
        let b = block(table);
        assert!(b.contains("# tenant = \"account_id\""), "{table}:\n{b}");
        assert!(!b.contains("tenantless"), "{table}:\n{b}");
    }
    // Two of three other tables point at accounts; events has no column
    // that reads as a tenant.
    assert!(block("events").contains("# tenantless = true"), "{text}");
    assert!(block("accounts").contains("# tenantless = true"), "{text}");
}

#[tokio::test]
async fn init_writes_a_starter_policy_that_validates_and_never_overwrites_without_force() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(
        "CREATE SCHEMA shop;
         CREATE TABLE shop.orders (order_id bigint PRIMARY KEY, organisation_id uuid NOT NULL,
             updated_at timestamptz, created_at timestamptz NOT NULL, email text);
         CREATE TABLE shop.audit_events (id uuid PRIMARY KEY, tenant_id uuid, occurred_at timestamptz);
         CREATE TABLE shop.visits (id bigint PRIMARY KEY, \"TenantId\" uuid, seen_at timestamptz);
         CREATE TABLE shop.settings (key text PRIMARY KEY, value text);",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Cohort's tables in `cohort` (where the written file puts them), and a
    // second copy in the inspected schema, which init must leave out.
    for schema in ["cohort", "shop"] {
        let out = cohort(dir.path(), &["migrate", "--schema", schema], Some(db.url()));
        succeeded(&out);
    }

    let out = cohort(
        dir.path(),
        &[
            "--json",
            "init",
            "--schema",
            "shop",
            "--output",
            "starter.toml",
        ],
        Some(db.url()),
    );
    succeeded(&out);
    let report = json(&out);
    assert_eq!(report["entities"], 3);
    assert_eq!(report["without_timestamp"], serde_json::json!(["settings"]));
    let path = dir.path().join("starter.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    for expected in [
        "name = \"Orders\"",
        "table = \"shop.orders\"",
        "# anchor = \"created_at\"",
        "# tenant = \"organisation_id\"",
        "# record_id = \"order_id\"",
        "name = \"AuditEvents\"",
        "# anchor = \"occurred_at\"",
        // The rule validation refuses `tenantless` by (issue 37 A4).
        "name = \"Visits\"",
        "# tenant = \"TenantId\"",
        "exempt = \"not yet classified\"",
        // An active line: Cohort's ledger apart from the application's tables.
        "\n[cohort]\nschema = \"cohort\" ",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert!(
        !text.contains("sweep_run"),
        "Cohort's own tables are not entities:\n{text}"
    );

    // The file passes validation on the same database as written.
    let config = text;
    let out = cohort(
        dir.path(),
        &["--json", "--config", "starter.toml", "validate"],
        Some(db.url()),
    );
    succeeded(&out);
    assert_eq!(json(&out)["valid"], true);

    // An existing file is kept (exit 2), unless --force.
    let out = cohort(
        dir.path(),
        &["init", "--schema", "shop", "--output", "starter.toml"],
        Some(db.url()),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), config);
    let out = cohort(
        dir.path(),
        &[
            "init",
            "--schema",
            "shop",
            "--output",
            "starter.toml",
            "--force",
        ],
        Some(db.url()),
    );
    succeeded(&out);
    let replaced = std::fs::read_to_string(&path).unwrap();
    assert_ne!(replaced, config, "replaced, with fresh ids");
    assert!(replaced.contains("name = \"Orders\""));

    // A schema without tables (a typo, or the wrong case) writes nothing.
    let out = cohort(
        dir.path(),
        &["init", "--schema", "Shop", "--output", "typo.toml"],
        Some(db.url()),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("schema \"Shop\" has no tables"));
    assert!(!dir.path().join("typo.toml").exists());
}

/// The README's five minutes on your own schema, line by line as written
/// (the lines of its `sh` blocks in that section, with `cohort` the binary
/// under test): init, the `sed` edit, migrate, validate, preview and sweep
/// purge exactly the old rows of the one table classified, with Cohort's
/// ledger in a schema of its own. Then every `console,runnable` block of
/// the guide runs in the same place and exits 0. `.ci/newcomer` does the
/// five minutes from `cargo install`.
#[tokio::test]
async fn the_readmes_five_minute_path_sweeps_a_table_of_ones_own() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let section = readme
        .split_once("## Five minutes on your own schema")
        .expect("the section")
        .1
        .split("\n## ")
        .next()
        .unwrap();
    let mut lines = Vec::new();
    let mut in_sh = false;
    for line in section.lines() {
        match line {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            l if in_sh && !l.starts_with("export DATABASE_URL=") => lines.push(l.to_owned()),
            _ => {}
        }
    }
    let commands: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        commands,
        ["cohort", "sed", "printf", "cohort", "cohort", "cohort", "cohort"],
        "{lines:#?}"
    );

    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE public.events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             created_at timestamptz NOT NULL, payload text);
         INSERT INTO public.events (created_at, payload)
             SELECT now() - (40 + g) * interval '1 day', 'old' FROM generate_series(1, 40) g;
         INSERT INTO public.events (created_at, payload)
             SELECT now() - g * interval '1 day', 'new' FROM generate_series(1, 10) g;
         CREATE TABLE public.accounts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL,
             created_at timestamptz NOT NULL);
         INSERT INTO public.accounts
             SELECT g, gen_random_uuid(), now() - interval '400 days' FROM generate_series(1, 5) g;",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_cohort")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // One line of shell as a user types it: the built `cohort` first on
    // PATH, the database in DATABASE_URL, no COHORT_ settings of ours.
    let run = |line: &str| {
        let mut cmd = Command::new("bash");
        cmd.current_dir(dir.path())
            .args(["-c", line])
            .env("PATH", &path)
            .env("DATABASE_URL", db.url());
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("COHORT_")) {
            cmd.env_remove(k);
        }
        cmd.output().unwrap()
    };
    for line in &lines {
        let out = run(line);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{line}\nstdout:\n{}\nstderr:\n{}\ncohort.toml:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(dir.path().join("cohort.toml")).unwrap_or_default()
        );
    }
    // Then the guide's runnable console blocks, in the same directory.
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let mut pages: Vec<_> = std::fs::read_dir(&docs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    let mut runnable = Vec::new();
    for page in &pages {
        let mut in_block = false;
        for line in std::fs::read_to_string(page).unwrap().lines() {
            match line {
                "```console,runnable" => in_block = true,
                "```" => in_block = false,
                l if in_block => {
                    if let Some(cmd) = l.strip_prefix("$ ") {
                        runnable.push(cmd.to_owned());
                    }
                }
                _ => {}
            }
        }
    }
    assert!(runnable.len() >= 5, "{runnable:?}");
    let before = std::fs::read_to_string(dir.path().join("cohort.toml")).unwrap();
    for line in &runnable {
        let out = run(line);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{line}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("cohort.toml")).unwrap(),
        before
    );

    let count = |sql: &'static str| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(count("SELECT count(*) FROM public.events").await, 10);
    assert_eq!(
        count("SELECT count(*) FROM public.events WHERE payload = 'old'").await,
        0
    );
    assert_eq!(count("SELECT count(*) FROM public.accounts").await, 5);
    assert_eq!(
        count(
            "SELECT s.affected_count FROM cohort.sweep_run r \
             JOIN cohort.sweep_run_entity_summary s USING (run_id) \
             WHERE r.status = 'succeeded' AND NOT r.dry_run"
        )
        .await,
        40,
        "the sweep's audit, in Cohort's own schema"
    );
    assert_eq!(
        count("SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'public' AND tablename = 'sweep_run'").await,
        0,
        "Cohort's tables stay out of public"
    );
}

/// examples/policy-only: the policy validates against its schema, and the
/// systemd unit's own command line starts the worker (metrics answering)
/// and stops it cleanly on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_only_example_validates_and_its_unit_command_runs() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/policy-only");
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    let schema = std::fs::read_to_string(example.join("schema.sql")).unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(schema))
        .execute(db.pool())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The handler's program as the Containerfile installs it: here, the
    // example's own script (the policy refuses a program that is missing).
    let text = std::fs::read_to_string(example.join("cohort.toml")).unwrap();
    assert!(text.contains("\"/usr/local/bin/forget-note\""));
    let script = example.join("forget-note").canonicalize().unwrap();
    let policy = dir.path().join("cohort.toml");
    std::fs::write(
        &policy,
        text.replace("/usr/local/bin/forget-note", &script.display().to_string()),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cohort"));
        cmd.current_dir(dir.path())
            .arg("--config")
            .arg(&policy)
            .args(args)
            .env("DATABASE_URL", db.url())
            .env("COHORT_HASH_KEY", "an-example-hash-key-0123456789");
        cmd
    };
    succeeded(&run(&["migrate"]).output().unwrap());
    let out = run(&["--json", "validate"]).output().unwrap();
    succeeded(&out);
    assert_eq!(json(&out)["entities"].as_array().unwrap().len(), 3);

    // The unit's ExecStart, with this build's binary and the example's file.
    let unit = std::fs::read_to_string(example.join("cohort-worker.service")).unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart line");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/cohort"));
    let args: Vec<String> = words
        .map(|w| match w {
            "/etc/cohort/cohort.toml" => policy.display().to_string(),
            "127.0.0.1:9464" => "127.0.0.1:0".to_string(),
            other => other.to_string(),
        })
        .collect();
    let log = dir.path().join("worker.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .current_dir(dir.path())
        .args(&args)
        .env("DATABASE_URL", db.url())
        .env("COHORT_HASH_KEY", "an-example-hash-key-0123456789")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut addr = String::new();
    wait_until_blocking(
        "the metrics address in the log",
        Duration::from_secs(30),
        || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                child.try_wait().unwrap().is_none(),
                "the worker exited:\n{text}"
            );
            // JSON logs (--log-format json): the message carries the address.
            match text.split("metrics served at http://").nth(1) {
                Some(rest) => {
                    addr = rest.split('/').next().unwrap().to_string();
                    true
                }
                None => false,
            }
        },
    );
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let text = std::fs::read_to_string(&log).unwrap();
    for line in text.lines().filter(|l| l.starts_with('{')) {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    }
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
}

/// Hostile arguments: invalid UTF-8, NUL-free but absurd times, enormous
/// values: each is a usage or input error (exit 2, one JSON document with
/// --json), never a panic, and nothing is written.
#[tokio::test]
async fn hostile_arguments_are_refused_without_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let (db, dir) = setup().await;
    let d = dir.path();
    succeeded(&cohort(d, &["migrate"], Some(db.url())));
    let invalid = std::ffi::OsStr::from_bytes(b"\xff\xfe-not-utf8");
    let out = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .current_dir(d)
        .env("DATABASE_URL", db.url())
        .args(["--json", "sweep", "--tenant"])
        .arg(invalid)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    json(&out);
    let huge = "9".repeat(100_000);
    for args in [
        vec![
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            "99999-01-01T00:00:00Z",
        ],
        vec![
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            "2026-13-45T25:61:61Z",
        ],
        vec![
            "--json",
            "preview",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            "-262144-01-01T00:00:00Z",
        ],
        vec![
            "--json",
            "holds",
            "create",
            "--entity",
            "SessionNote",
            "--record",
            "x",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--reason",
            "r",
            "--expires-at",
            "1969-13-01T00:00:00Z",
        ],
        vec!["--json", "runs", "list", "--limit", "99999999999999999999"],
        vec!["--json", "sweep", "--tenant", huge.as_str()],
        vec![
            "--json",
            "erase",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--subject",
            huge.as_str(),
        ],
    ] {
        let out = cohort(d, &args, Some(db.url()));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:.3?}: {stderr}");
        assert_eq!(out.status.code(), Some(2), "{:.3?}: {stderr}", args);
        let v = json(&out);
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
    }
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM retention.sweep_run")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(runs, 0, "a refused command wrote a run");
}

#[tokio::test]
async fn a_subject_hold_is_created_listed_and_kept_by_the_sweep_from_the_cli() {
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let dir = dir.path();
    let url = Some(db.url());
    std::fs::write(
        dir.join("cohort.toml"),
        POLICY.replacen(
            "subjects = [\"user_id\"]",
            "subjects = [{ column = \"user_id\", kind = \"user\" }]",
            1,
        ),
    )
    .unwrap();
    assert_eq!(cohort(dir, &["migrate"], url).status.code(), Some(0));
    let subject: String =
        sqlx::query_scalar("SELECT user_id::text FROM app.case_contacts WHERE id = 4")
            .fetch_one(db.pool())
            .await
            .unwrap();
    let create = |extra: &[&str]| {
        let mut args = vec![
            "--json",
            "holds",
            "create",
            "--subject",
            &subject,
            "--reason",
            "case 9",
        ];
        args.extend_from_slice(extra);
        cohort(dir, &args, url)
    };
    // The kind is required, and --subject names no entity or record.
    let out = create(&[]);
    assert_eq!(out.status.code(), Some(2));
    let message = json(&out)["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("name the subject's kind"), "{message}");
    assert!(!message.contains(&subject), "{message}");
    let out = create(&["--kind", "user", "--entity", "CaseContact"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "--subject conflicts with --entity"
    );

    let out = create(&["--kind", "user"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hold = json(&out);
    assert_eq!(hold["target"], "subject");
    assert_eq!(hold["subject"], subject.as_str());
    assert_eq!(hold["subject_kind"], "user");
    assert_eq!(hold["entity_id"], serde_json::Value::Null);
    assert_eq!(hold["record_id"], serde_json::Value::Null);
    let text = cohort(dir, &["holds", "list", "--active"], url);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("(subject, user)") && text.contains(&subject),
        "{text}"
    );

    let out = cohort(
        dir,
        &[
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--now",
            NOW,
        ],
        url,
    );
    assert_eq!(out.status.code(), Some(0));
    let run = json(&out);
    let contacts = run["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == "CaseContact")
        .unwrap()
        .clone();
    assert_eq!(
        (
            contacts["affected"].as_u64(),
            contacts["held"].as_u64(),
            contacts["held_by_subject"].as_u64()
        ),
        (Some(1), Some(1), Some(1))
    );
    let kept: Option<String> =
        sqlx::query_scalar("SELECT email FROM app.case_contacts WHERE id = 4")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(kept.as_deref(), Some("x@example.com"));
}

/// RS-041: `cohort validate` exits 2 while the hold stamp trigger is
/// disabled (it exited 0 before), and names the statement that fixes it;
/// after that statement it exits 0.
#[tokio::test]
async fn validate_exits_2_while_the_hold_stamp_trigger_is_disabled() {
    let (db, dir) = setup().await;
    assert_eq!(
        cohort(dir.path(), &["migrate"], Some(db.url()))
            .status
            .code(),
        Some(0)
    );
    sqlx::raw_sql("ALTER TABLE retention.retention_hold DISABLE TRIGGER retention_hold_stamp")
        .execute(db.pool())
        .await
        .unwrap();
    let out = cohort(dir.path(), &["--json", "validate"], Some(db.url()));
    assert_eq!(out.status.code(), Some(2));
    let v = json(&out);
    let fix =
        "ALTER TABLE \"retention\".\"retention_hold\" ENABLE ALWAYS TRIGGER retention_hold_stamp;";
    let problems = v["error"]["problems"].as_array().unwrap();
    assert!(
        problems.iter().any(|p| p["message"]
            .as_str()
            .is_some_and(|m| m.contains("is disabled") && m.contains(fix))),
        "{problems:?}"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(fix.to_owned()))
        .execute(db.pool())
        .await
        .unwrap();
    let out = cohort(dir.path(), &["validate"], Some(db.url()));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `cohort validate` checks the grants the connected role needs to run:
/// a role that may not delete from the source nor insert into the archive
/// exits 2 with each missing grant named after what needs it (the
/// archive, an erasure: not a purge the category never does); granted,
/// it exits 0.
#[tokio::test]
async fn validate_exits_2_naming_every_grant_the_role_lacks() {
    let (db, dir) = scenario(
        "CREATE SCHEMA app; CREATE SCHEMA vault;
         CREATE TABLE app.contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, note text);
         CREATE INDEX ON app.contacts (tenant_id, created_at);
         CREATE TABLE vault.contacts_archive (id bigint PRIMARY KEY, tenant_id uuid NOT NULL,
             created_at timestamptz, note text, archived_at timestamptz NOT NULL, run_id uuid NOT NULL);",
        r#"
[cohort]
schema = "retention"

[[entity]]
name = "Contact"
id = "44444444-aaaa-4aaa-8aaa-444444444444"
table = "app.contacts"
category = "contacts"
anchor = "created_at"
archive_table = "vault.contacts_archive"

[[category]]
name = "contacts"
strategy = "archive"
period = "30d"
"#,
    )
    .await;
    succeeded(&cohort(dir.path(), &["migrate"], Some(db.url())));
    let role = format!("runner_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'runner-pw';
         GRANT USAGE ON SCHEMA retention, app, vault TO {role};
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA retention TO {role};
         GRANT SELECT, UPDATE ON app.contacts TO {role};"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    let url = format!("{}&user={role}&password=runner-pw", db.url());
    let out = cohort(dir.path(), &["--json", "validate"], Some(url.as_str()));
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = out_text(&out);
    let v = json(&out);
    let problems: Vec<&str> = v["error"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["message"].as_str())
        .collect();
    let delete = problems
        .iter()
        .find(|p| p.starts_with("GRANT DELETE ON app.contacts is missing (needed by "))
        .unwrap_or_else(|| panic!("{problems:?}"));
    assert!(
        delete.contains("archive of Contact (its category may archive)")
            && delete.contains("erasure of Contact (an erasure deletes the subject's rows)"),
        "{delete}"
    );
    assert!(
        problems.iter().any(|p| p.starts_with(
            "GRANT INSERT ON vault.contacts_archive is missing (needed by archive of Contact"
        )),
        "{problems:?}"
    );
    assert!(
        !text.contains("purge of Contact"),
        "the category never purges: {text}"
    );
    sqlx::raw_sql(AssertSqlSafe(format!(
        "GRANT DELETE ON app.contacts TO {role}; GRANT INSERT ON vault.contacts_archive TO {role};"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    succeeded(&cohort(dir.path(), &["validate"], Some(url.as_str())));
}

/// Everything a command printed, stdout then stderr.
fn out_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A negative number is a value, not a flag: `erase --subject
/// -9223372036854775808` erases that subject's row (it was refused as an
/// unknown argument), and `holds create --subject -1` places the hold.
#[tokio::test]
async fn a_negative_subject_is_a_value() {
    let (db, dir) = scenario(
        "CREATE SCHEMA app;
         CREATE TABLE app.accounts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, owner_id bigint);
         CREATE INDEX ON app.accounts (tenant_id, created_at);
         CREATE INDEX ON app.accounts (owner_id);
         INSERT INTO app.accounts VALUES
           (1, '11111111-1111-1111-1111-111111111111', now(), -9223372036854775808),
           (2, '11111111-1111-1111-1111-111111111111', now(), -1),
           (3, '11111111-1111-1111-1111-111111111111', now(), 7);",
        r#"
[cohort]
schema = "retention"

[[entity]]
name = "Account"
id = "66666666-aaaa-4aaa-8aaa-666666666666"
table = "app.accounts"
category = "accounts"
anchor = "created_at"
subjects = ["owner_id"]

[[category]]
name = "accounts"
strategy = "purge"
period = "30d"
"#,
    )
    .await;
    let url = Some(db.url());
    succeeded(&cohort(dir.path(), &["migrate"], url));
    let out = cohort(
        dir.path(),
        &[
            "--json",
            "erase",
            "--tenant",
            "11111111-1111-1111-1111-111111111111",
            "--subject",
            "-9223372036854775808",
        ],
        url,
    );
    succeeded(&out);
    assert_eq!(
        json(&out)["entities"][0]["affected"],
        1,
        "{}",
        out_text(&out)
    );
    let out = cohort(
        dir.path(),
        &["holds", "create", "--subject", "-1", "--reason", "case 9"],
        url,
    );
    succeeded(&out);
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM app.accounts ORDER BY id")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(left, [2, 3]);
    let held: String = sqlx::query_scalar("SELECT subject_text FROM retention.retention_hold")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(held, "-1");
}

/// Nothing in scope is not success: on a policy whose entities are all
/// tenant-scoped, `preview --tenantless`, `sweep --tenantless` and `erase
/// --tenantless` exit 2 saying no tenantless entity exists and what to use
/// instead, and record no run (they printed an empty table, exited 0 and
/// recorded a `succeeded` run).
#[tokio::test]
async fn a_command_with_nothing_in_scope_exits_2_and_says_what_would_be() {
    let (db, dir) = setup().await;
    succeeded(&cohort(dir.path(), &["migrate"], Some(db.url())));
    for args in [
        &["preview", "--tenantless"][..],
        &["sweep", "--tenantless"][..],
        &[
            "erase",
            "--tenantless",
            "--subject",
            "4b0a6c56-4b7e-4a53-9d4f-1f2d1a3c5e77",
        ][..],
    ] {
        let out = cohort(dir.path(), args, Some(db.url()));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out_text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("nothing is in scope: no tenantless entity exists")
                && err.contains("--tenant T"),
            "{args:?}: {err}"
        );
    }
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM retention.sweep_run")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(runs, 0, "no run recorded");
}

/// A subject hold placed without `--tenant` covers every tenant, and
/// `holds list` says so ("all tenants", not a blank cell); `holds release`
/// takes the 8 characters the tables print, as `runs show` does, and
/// refuses a prefix that matches nothing.
#[tokio::test]
async fn holds_list_says_all_tenants_and_release_takes_a_prefix() {
    let (db, dir) = setup().await;
    let url = Some(db.url());
    succeeded(&cohort(dir.path(), &["migrate"], url));
    let out = cohort(
        dir.path(),
        &[
            "--json",
            "holds",
            "create",
            "--subject",
            "4b0a6c56-4b7e-4a53-9d4f-1f2d1a3c5e77",
            "--reason",
            "case 7",
        ],
        url,
    );
    succeeded(&out);
    let id = json(&out)["hold_id"].as_str().unwrap().to_owned();
    let out = cohort(dir.path(), &["holds", "list"], url);
    succeeded(&out);
    let listed = String::from_utf8_lossy(&out.stdout);
    let row = listed
        .lines()
        .find(|l| l.contains(&id))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(row.contains("all tenants"), "{row}");
    let unknown = cohort(dir.path(), &["holds", "release", "ffffffff"], url);
    assert_eq!(unknown.status.code(), Some(2), "{}", out_text(&unknown));
    assert!(out_text(&unknown).contains("no hold id starts with"));
    let out = cohort(dir.path(), &["holds", "release", &id[..8]], url);
    succeeded(&out);
    let released: bool = sqlx::query_scalar(
        "SELECT released_at IS NOT NULL FROM retention.retention_hold WHERE hold_id = $1::uuid",
    )
    .bind(&id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(released);
}

/// Read-only commands need no secret: with an entity anonymised by
/// `hash` and no `COHORT_HASH_KEY`, `runs list`, `holds list`, `preview`
/// and `report` work (they refused to start), while `sweep` and `validate`
/// (which checks what runs need) exit 2 naming the key, and nothing is
/// changed.
#[tokio::test]
async fn read_only_commands_need_no_hash_key_and_sweeps_name_it() {
    let (db, dir) = setup().await;
    let policy = POLICY.replace(
        "anonymise = { email = \"null\", phone = { literal = \"[redacted]\" } }",
        "anonymise = { email = \"hash\", phone = { literal = \"[redacted]\" } }",
    );
    assert!(policy.contains("email = \"hash\""));
    std::fs::write(dir.path().join("cohort.toml"), policy).unwrap();
    let url = Some(db.url());
    succeeded(&cohort(dir.path(), &["migrate"], url));
    sqlx::raw_sql(
        "INSERT INTO app.case_contacts VALUES
           (1, '11111111-1111-1111-1111-111111111111', now() - interval '400 days', NULL, 'a@example.com', '+1', gen_random_uuid());",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let tenant = ["--tenant", "11111111-1111-1111-1111-111111111111"];
    for args in [
        vec!["runs", "list"],
        vec!["holds", "list"],
        [&["preview"][..], &tenant[..]].concat(),
        vec![
            "report",
            "--from",
            "2026-01-01",
            "--to",
            "2026-12-31",
            "--format",
            "json",
        ],
    ] {
        succeeded(&cohort(dir.path(), &args, url));
    }
    for args in [[&["sweep"][..], &tenant[..]].concat(), vec!["validate"]] {
        let out = cohort(dir.path(), &args, url);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out_text(&out));
        assert!(
            out_text(&out).contains(
                "CaseContact anonymise with `hash`, which needs the secret key (COHORT_HASH_KEY"
            ),
            "{args:?}: {}",
            out_text(&out)
        );
    }
    let email: String = sqlx::query_scalar("SELECT email FROM app.case_contacts WHERE id = 1")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(email, "a@example.com", "nothing changed");
}

/// The demo tells its own story: the rows it keeps under a hold and the
/// handler it makes fail are narrated on stdout, not interrupted by
/// warning lines on the terminal (16 of them between two steps before).
#[test]
fn the_demo_prints_no_warning_lines_between_its_steps() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cohort"))
        .current_dir(dir.path())
        .arg("demo")
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .output()
        .expect("run cohort demo");
    assert_eq!(out.status.code(), Some(0), "{}", out_text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains(" WARN "), "{err}");
    let story = String::from_utf8_lossy(&out.stdout);
    assert!(
        story.contains("dead letter") || story.contains("dead-letter"),
        "{story}"
    );
}

/// Issue 37 A3: a purged parent that an unclassified child still
/// references with NO ACTION. `validate` names the key, the referencing
/// table and what to do, with the index the child's column lacks; an
/// exempt child and an entity that only anonymises are named the same way,
/// a child that is purged itself is not. The sweep still settles
/// `succeeded`, and says which rows stay for good and why, in its output,
/// its JSON and the ledger (`runs show`).
#[tokio::test]
async fn a_parent_kept_by_a_table_cohort_never_empties_is_named_by_validate_and_by_every_run() {
    let (db, dir) = scenario(
        "CREATE SCHEMA app;
         CREATE TABLE app.orders (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz);
         CREATE INDEX ON app.orders (tenant_id, created_at);
         CREATE TABLE app.order_notes (id bigint PRIMARY KEY, order_id bigint REFERENCES app.orders);
         CREATE TABLE app.invoices (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
             order_id bigint REFERENCES app.orders ON DELETE RESTRICT);
         CREATE INDEX ON app.invoices (order_id);
         CREATE TABLE app.shipments (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
             order_id bigint REFERENCES app.orders);
         CREATE INDEX ON app.shipments (order_id);
         CREATE INDEX ON app.shipments (tenant_id, created_at);
         INSERT INTO app.orders
             SELECT g, '11111111-1111-4111-8111-111111111111', now() - interval '60 days' FROM generate_series(1, 4) g;
         INSERT INTO app.order_notes VALUES (1, 1), (2, 2);
         INSERT INTO app.invoices VALUES (1, '11111111-1111-4111-8111-111111111111', now(), 3);",
        r#"
[cohort]
schema = "retention"

[[entity]]
name = "Order"
id = "51515151-aaaa-4aaa-8aaa-515151515151"
table = "app.orders"
category = "orders"
anchor = "created_at"

[[entity]]
name = "Invoice"
id = "52525252-aaaa-4aaa-8aaa-525252525252"
table = "app.invoices"
exempt = "kept for the tax office"

[[entity]]
name = "Shipment"
id = "53535353-aaaa-4aaa-8aaa-535353535353"
table = "app.shipments"
category = "orders"
anchor = "created_at"

[[category]]
name = "orders"
strategy = "purge"
period = "30d"
"#,
    )
    .await;
    succeeded(&cohort(dir.path(), &["migrate"], Some(db.url())));

    let out = cohort(dir.path(), &["--json", "validate"], Some(db.url()));
    succeeded(&out);
    let v = json(&out);
    let warnings: Vec<&str> = v["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .collect();
    let notes = warnings
        .iter()
        .find(|w| w.contains("foreign key \"order_notes_order_id_fkey\" on app.order_notes"))
        .unwrap_or_else(|| panic!("{warnings:?}"));
    assert!(
        notes.contains("(not retained by Cohort)")
            && notes.contains("ON DELETE NO ACTION")
            && notes.contains("skipped on every run, for good")
            && notes.contains("Classify app.order_notes with a category that purges"),
        "{notes}"
    );
    let invoices = warnings
        .iter()
        .find(|w| w.contains("foreign key \"invoices_order_id_fkey\" on app.invoices"))
        .unwrap_or_else(|| panic!("{warnings:?}"));
    assert!(
        invoices.contains("(Invoice, declared exempt)") && invoices.contains("ON DELETE RESTRICT"),
        "{invoices}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w
                .contains("Suggested: CREATE INDEX ON \"app\".\"order_notes\" (\"order_id\");")),
        "{warnings:?}"
    );
    // Shipments are purged first (dependents first), so they keep no
    // order for good; both of its indexes exist.
    assert!(
        !warnings.iter().any(|w| w.contains("app.shipments")),
        "{warnings:?}"
    );
    assert!(
        !warnings
            .iter()
            .any(|w| w.contains("CREATE INDEX ON \"app\".\"invoices\"")),
        "{warnings:?}"
    );

    let out = cohort(
        dir.path(),
        &[
            "--json",
            "sweep",
            "--tenant",
            "11111111-1111-4111-8111-111111111111",
        ],
        Some(db.url()),
    );
    succeeded(&out);
    let run = json(&out);
    assert_eq!(run["status"], "succeeded");
    let order = run["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == "Order")
        .unwrap()
        .clone();
    assert_eq!(
        (order["affected"].as_u64(), order["skipped"].as_u64()),
        (Some(1), Some(3))
    );
    let note = order["note"].as_str().unwrap_or_else(|| panic!("{order}"));
    assert!(
        note.starts_with("3 rows skipped; those referenced from app.invoices (Invoice, declared exempt), app.order_notes (not retained by Cohort) stay")
            && note.contains("skipped on every run"),
        "{note}"
    );
    let shipment = run["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == "Shipment")
        .unwrap();
    assert!(shipment.get("note").is_none(), "{shipment}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM app.orders")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(left, 3);

    // The ledger keeps the note: `runs show` reads it back.
    let run_id = run["run_id"].as_str().unwrap();
    let shown = json(&cohort(
        dir.path(),
        &["--json", "runs", "show", run_id],
        Some(db.url()),
    ));
    let shown_order = shown["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == "Order")
        .unwrap();
    assert_eq!(shown_order["note"].as_str(), Some(note));
    let text = out_text(&cohort(
        dir.path(),
        &["runs", "show", run_id],
        Some(db.url()),
    ));
    assert!(text.contains(&format!("note: Order: {note}")), "{text}");

    // A preview says the same before anything runs.
    let preview = out_text(&cohort(
        dir.path(),
        &[
            "preview",
            "--tenant",
            "11111111-1111-4111-8111-111111111111",
        ],
        Some(db.url()),
    ));
    assert!(
        preview.contains("note: Order: 3 rows skipped; those referenced from app.invoices"),
        "{preview}"
    );
}

/// RS-040: a policy follows the schema. `validate` warns of a table with
/// a timestamptz column the policy does not mention (and stops once it is
/// added or listed in `ignore_tables`; an entry that silences nothing is
/// itself a warning); `init --update` appends the tables that appeared
/// since, exempt, keeping every byte a person wrote; a second update adds
/// nothing; a file that is missing or does not parse is refused with
/// nothing written.
#[tokio::test]
async fn init_update_adds_new_tables_and_keeps_every_edit() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    let ddl = |sql: &'static str| {
        let pool = db.pool().clone();
        async move { sqlx::raw_sql(sql).execute(&pool).await.unwrap() }
    };
    ddl("CREATE SCHEMA shop;
         CREATE TABLE shop.orders (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz NOT NULL);
         CREATE TABLE shop.settings (key text PRIMARY KEY, value text);")
    .await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let url = Some(db.url());
    succeeded(&cohort(d, &["migrate", "--schema", "cohort"], url));
    succeeded(&cohort(
        d,
        &["init", "--schema", "shop", "--output", "cohort.toml"],
        url,
    ));
    let path = d.join("cohort.toml");
    // A person's edits: a reason, a comment of their own, a setting.
    let edited = std::fs::read_to_string(&path)
        .unwrap()
        .replace(
            "exempt = \"not yet classified\"",
            "exempt = \"kept for the accounts team\"  # decided 2026-11",
        )
        .replace(
            "[cohort]\n",
            "[cohort]\n# ours: keep the ledger apart\nsweep_batch_size = 2000\n",
        );
    std::fs::write(&path, &edited).unwrap();
    let advice = |out: &Output| -> Vec<String> {
        succeeded(out);
        json(out)["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_str().unwrap().to_owned())
            .collect()
    };
    let validate = || cohort(d, &["--json", "validate"], url);
    assert!(
        advice(&validate())
            .iter()
            .all(|w| !w.contains("does not mention")),
        "{:?}",
        advice(&validate())
    );

    // Two tables appear; validate names them.
    ddl("CREATE TABLE shop.chat_messages (id uuid PRIMARY KEY, tenant_id uuid, sent_at timestamptz, body text);
         CREATE TABLE shop.exports (id bigint PRIMARY KEY, finished_at timestamptz);")
    .await;
    let warnings = advice(&validate());
    for table in ["shop.chat_messages", "shop.exports"] {
        assert!(
            warnings.iter().any(
                |w| w.starts_with(&format!("{table} has timestamptz columns"))
                    && w.contains("cohort init --update")
            ),
            "{table}: {warnings:?}"
        );
    }

    // One is left out on purpose; an entry naming no such table is advice.
    let with_ignore = edited.replace(
        "sweep_batch_size = 2000\n",
        "sweep_batch_size = 2000\nignore_tables = [\"shop.exports\", \"shop.gone\"]\n",
    );
    std::fs::write(&path, &with_ignore).unwrap();
    let warnings = advice(&validate());
    assert!(
        !warnings.iter().any(|w| w.starts_with("shop.exports ")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("ignore_tables lists \"shop.gone\"") && w.contains("no effect")),
        "{warnings:?}"
    );

    // --update appends the new table, exempt; every byte before stays.
    let update = || {
        cohort(
            d,
            &[
                "--json",
                "init",
                "--update",
                "--schema",
                "shop",
                "--output",
                "cohort.toml",
            ],
            url,
        )
    };
    let out = update();
    succeeded(&out);
    assert_eq!(
        json(&out)["added"],
        serde_json::json!(["shop.chat_messages"])
    );
    let updated = std::fs::read_to_string(&path).unwrap();
    assert!(updated.starts_with(&with_ignore), "{updated}");
    let appended = &updated[with_ignore.len()..];
    for expected in [
        "name = \"ChatMessages\"",
        "table = \"shop.chat_messages\"",
        "exempt = \"not yet classified\"",
        "# anchor = \"sent_at\"",
    ] {
        assert!(appended.contains(expected), "{expected:?} in {appended}");
    }
    assert!(!appended.contains("shop.exports"), "{appended}");
    let warnings = advice(&validate());
    assert!(
        !warnings.iter().any(|w| w.contains("does not mention")),
        "{warnings:?}"
    );

    // Again: nothing new, nothing written.
    let out = update();
    succeeded(&out);
    assert_eq!(json(&out)["added"], serde_json::json!([]));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), updated);

    // Bad input: a missing file, a file that does not parse; nothing written.
    let out = cohort(
        d,
        &[
            "init",
            "--update",
            "--schema",
            "shop",
            "--output",
            "missing.toml",
        ],
        url,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(!d.join("missing.toml").exists());
    std::fs::write(d.join("broken.toml"), "[cohort\n").unwrap();
    let out = cohort(
        d,
        &[
            "init",
            "--update",
            "--schema",
            "shop",
            "--output",
            "broken.toml",
        ],
        url,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid policy file"));
    assert_eq!(
        std::fs::read_to_string(d.join("broken.toml")).unwrap(),
        "[cohort\n"
    );
}

/// `text` (a file `init` wrote) with the block of `table` classified as a
/// person does it: `exempt` replaced by `category`, the proposed lines
/// uncommented (as the README's `sed` line does, with `subjects` and
/// `partitions` too).
fn init_classified(text: &str, table: &str, category: &str) -> String {
    let start = text
        .find(&format!("table = \"{table}\"\n"))
        .unwrap_or_else(|| panic!("no {table} in:\n{text}"));
    let end = start + text[start..].find("\n\n").expect("a blank line after it");
    let keys = [
        "anchor",
        "tenant",
        "tenantless",
        "record_id",
        "subjects",
        "partitions",
    ];
    let block: Vec<String> = text[start..end]
        .lines()
        .map(|l| {
            if l.starts_with("exempt = ") {
                format!("category = \"{category}\"")
            } else if let Some(rest) = l
                .strip_prefix("# ")
                .filter(|r| keys.iter().any(|k| r.starts_with(&format!("{k} = "))))
            {
                rest.to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect();
    format!("{}{}{}", &text[..start], block.join("\n"), &text[end..])
}

/// Issue 40 D2: besides the anchor, tenant and record key, `init` proposes
/// erasure subjects for person-like columns, `partitions = "drop"` for a
/// table range partitioned on its anchor (and says what is missing when
/// validation would refuse it), a `tenants_query` on the table the tenant
/// columns point at, and an `archive` category; a table's header says
/// when the planner has no statistics for it. The file validates as
/// written and with every proposal taken, and the proposals work: the
/// tenants query lists both tenants, an erasure reaches the subject.
#[tokio::test]
async fn init_proposes_subjects_partition_purge_tenants_and_archive_that_validate() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(
        "CREATE SCHEMA app; CREATE SCHEMA vault;
         CREATE TABLE app.tenants (id uuid PRIMARY KEY, name text NOT NULL,
             created_at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE app.orders (id bigint PRIMARY KEY, tenant_id uuid NOT NULL REFERENCES app.tenants,
             user_id uuid NOT NULL, created_at timestamptz NOT NULL);
         CREATE INDEX ON app.orders (user_id);
         CREATE TABLE app.events (id bigint NOT NULL, tenant_id uuid NOT NULL REFERENCES app.tenants,
             author_user_id bigint, created_at timestamptz NOT NULL, PRIMARY KEY (id, created_at))
             PARTITION BY RANGE (created_at);
         CREATE INDEX ON app.events (author_user_id);
         CREATE TABLE app.events_2026_01 PARTITION OF app.events
             FOR VALUES FROM ('2026-01-01Z') TO ('2026-02-01Z');
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL REFERENCES app.tenants,
             body text, created_at timestamptz NOT NULL);
         CREATE TABLE vault.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, body text,
             created_at timestamptz NOT NULL, archived_at timestamptz NOT NULL, run_id uuid NOT NULL);
         CREATE TABLE app.audit_log (id bigint NOT NULL, logged_at timestamptz NOT NULL,
             PRIMARY KEY (id, logged_at)) PARTITION BY RANGE (logged_at);
         CREATE TABLE app.audit_refs (id bigint PRIMARY KEY, log_id bigint, log_at timestamptz,
             FOREIGN KEY (log_id, log_at) REFERENCES app.audit_log);
         INSERT INTO app.tenants (id, name) VALUES
             ('11111111-1111-4111-8111-111111111111', 'one'), ('22222222-2222-4222-8222-222222222222', 'two');
         INSERT INTO app.orders VALUES
             (1, '11111111-1111-4111-8111-111111111111', '7d0e0000-0000-4000-8000-000000000001', '2026-01-05Z'),
             (2, '11111111-1111-4111-8111-111111111111', '7d0e0000-0000-4000-8000-000000000002', '2026-01-06Z'),
             (3, '22222222-2222-4222-8222-222222222222', '7d0e0000-0000-4000-8000-000000000001', '2026-01-07Z');
         ANALYZE app.orders;",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let url = Some(db.url());
    succeeded(&cohort(d, &["migrate", "--schema", "cohort"], url));
    succeeded(&cohort(
        d,
        &["init", "--schema", "app", "--output", "cohort.toml"],
        url,
    ));
    let path = d.join("cohort.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let block = |table: &str| -> String {
        let at = text
            .find(&format!("table = \"app.{table}\""))
            .unwrap_or_else(|| panic!("no {table} in:\n{text}"));
        text[at..].split("\n\n").next().unwrap().to_owned()
    };
    let header = |table: &str| -> &str {
        text.lines()
            .find(|l| l.starts_with(&format!("# app.{table}: ")))
            .unwrap_or_else(|| panic!("no header of {table} in:\n{text}"))
    };
    // What the planner knows, said as such.
    assert_eq!(header("orders"), "# app.orders: about 3 rows");
    assert!(
        header("notes")
            .ends_with("the planner has no statistics for it yet (no row estimate before ANALYZE)"),
        "{text}"
    );
    assert!(!text.contains("not analysed"), "{text}");
    // Erasure subjects: person-like columns of a key type.
    assert!(
        block("orders").contains("# subjects = [\"user_id\"]"),
        "{text}"
    );
    assert!(
        block("events").contains("# subjects = [\"author_user_id\"]"),
        "{text}"
    );
    assert!(!block("notes").contains("subjects"), "{text}");
    // Partition purge where validation accepts it; what is missing where not.
    for expected in [
        "# anchor = \"created_at\"",
        "# record_id = [\"id\", \"created_at\"]",
        "# partitions = \"drop\" ",
    ] {
        assert!(block("events").contains(expected), "{expected}:\n{text}");
    }
    assert!(
        block("audit_log").contains(
            "partitions = \"drop\" would need no foreign key referencing the table or a partition"
        ),
        "{text}"
    );
    assert!(
        !block("audit_log").contains("# partitions = \"drop\" "),
        "{text}"
    );
    assert!(!block("orders").contains("partitions"), "{text}");
    // The tenants, a top-level key before the first table.
    let query = "# tenants_query = \"SELECT id FROM app.tenants\"\n";
    let at = text.find(query).unwrap_or_else(|| panic!("{text}"));
    assert!(at < text.find("\n[cohort]\n").unwrap(), "{text}");
    // Every strategy in the template, an archive category among them.
    assert!(text.contains("| anonymise | archive | exempt"), "{text}");
    assert!(text.contains("\n# strategy = \"archive\""), "{text}");

    let validate = || {
        let out = cohort(d, &["--json", "validate"], url);
        succeeded(&out);
        json(&out)
    };
    assert_eq!(validate()["valid"], true);

    // Every proposal taken: the entities classified, the tenants query and
    // the templates uncommented, an archive table for the archived entity.
    let mut taken = init_classified(&text, "app.orders", "...");
    taken = init_classified(&taken, "app.events", "...");
    taken = init_classified(&taken, "app.notes", "archived").replace(
        "category = \"archived\"",
        "category = \"archived\"\narchive_table = \"vault.notes\"",
    );
    taken = taken.replace(query, &query[2..]);
    let templates = taken.find("# [[category]]").expect("the templates");
    let uncommented: String = taken[templates..]
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("# ").unwrap_or(l)))
        .collect();
    taken = format!("{}{uncommented}", &taken[..templates]);
    std::fs::write(&path, &taken).unwrap();
    let report = validate();
    assert_eq!(report["valid"], true, "{taken}");
    assert_eq!(
        report["unusable_tenants"],
        serde_json::json!([]),
        "{report}"
    );
    let policy = cohort::policy::PolicyFile::parse(&taken).unwrap();
    assert_eq!(policy.entities.iter().filter(|e| !e.is_exempt()).count(), 3);

    // The proposals at work: both tenants from the query, and an erasure
    // reaching the subject's order in its tenant.
    let out = cohort(d, &["--json", "preview", "--all-tenants"], url);
    succeeded(&out);
    let previews = out_text(&out);
    for tenant in [
        "11111111-1111-4111-8111-111111111111",
        "22222222-2222-4222-8222-222222222222",
    ] {
        assert!(previews.contains(tenant), "{tenant}: {previews}");
    }
    let out = cohort(
        d,
        &[
            "--json",
            "erase",
            "--tenant",
            "11111111-1111-4111-8111-111111111111",
            "--subject",
            "7d0e0000-0000-4000-8000-000000000001",
            "--dry-run",
        ],
        url,
    );
    succeeded(&out);
    let erasure = json(&out);
    let orders = erasure["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == "Orders")
        .unwrap_or_else(|| panic!("{erasure}"));
    assert_eq!(orders["affected"], 1, "{erasure}");
}

/// Issue 40 D1: `validate` advises `cohort init --update`, and it works as
/// advised: without `--schema` it reads the schema the file was made from
/// (the line `init` writes at its top and the ones `--update` adds; else
/// the schemas its entities' tables name), while an explicit `--schema`
/// wins. A file that does not say which schema, whose `init` line cannot
/// be read, or names a schema without tables is refused (exit 2) with the
/// reason, and nothing is written.
#[tokio::test]
async fn init_update_reads_the_schema_the_file_was_made_from() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    let ddl = |sql: &'static str| {
        let pool = db.pool().clone();
        async move { sqlx::raw_sql(sql).execute(&pool).await.unwrap() }
    };
    // `public` has a table too: the old default schema, read by mistake.
    ddl("CREATE SCHEMA app;
         CREATE TABLE app.orders (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz NOT NULL);
         CREATE TABLE public.stray (id bigint PRIMARY KEY, created_at timestamptz);")
    .await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let url = Some(db.url());
    succeeded(&cohort(d, &["migrate", "--schema", "cohort"], url));
    succeeded(&cohort(
        d,
        &["init", "--schema", "app", "--output", "cohort.toml"],
        url,
    ));
    let path = d.join("cohort.toml");
    ddl("CREATE TABLE app.messages (id bigint PRIMARY KEY, tenant_id uuid, sent_at timestamptz);")
        .await;
    let warnings = || -> Vec<String> {
        let out = cohort(d, &["--json", "validate"], url);
        succeeded(&out);
        json(&out)["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_str().unwrap().to_owned())
            .collect()
    };
    assert!(
        warnings()
            .iter()
            .any(|w| w.starts_with("app.messages has timestamptz columns")
                && w.contains("`cohort init --update`")),
        "{:?}",
        warnings()
    );
    let update = |file: &str, schema: Option<&str>| {
        let mut args = vec!["--json", "init", "--update", "--output", file];
        args.extend(schema.map(|s| ["--schema", s]).into_iter().flatten());
        cohort(d, &args, url)
    };

    // As advised, with no --schema: the header's schema, not `public`.
    let before = std::fs::read_to_string(&path).unwrap();
    let out = update("cohort.toml", None);
    succeeded(&out);
    assert_eq!(json(&out)["schemas"], serde_json::json!(["app"]));
    assert_eq!(json(&out)["added"], serde_json::json!(["app.messages"]));
    let updated = std::fs::read_to_string(&path).unwrap();
    assert!(updated.starts_with(&before));
    assert!(!updated.contains("public.stray"), "{updated}");
    assert!(
        !warnings().iter().any(|w| w.contains("does not mention")),
        "{:?}",
        warnings()
    );
    let out = cohort(d, &["init", "--update"], url);
    succeeded(&out);
    assert!(
        out_text(&out).contains("no table of schema \"app\" with a timestamptz column is missing"),
        "{}",
        out_text(&out)
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), updated);

    // An explicit --schema wins.
    let out = update("cohort.toml", Some("public"));
    succeeded(&out);
    assert_eq!(json(&out)["schemas"], serde_json::json!(["public"]));
    assert_eq!(json(&out)["added"], serde_json::json!(["public.stray"]));
    let updated = std::fs::read_to_string(&path).unwrap();
    assert_eq!(warnings(), Vec::<String>::new());

    // Without any `init` line, the entities' tables name the schemas.
    let bare: String = updated
        .lines()
        .filter(|l| !l.contains("`cohort init"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(d.join("bare.toml"), &bare).unwrap();
    ddl(
        "CREATE TABLE app.invoices (id bigint PRIMARY KEY, tenant_id uuid, issued_at timestamptz);",
    )
    .await;
    let out = update("bare.toml", None);
    succeeded(&out);
    assert_eq!(json(&out)["schemas"], serde_json::json!(["app", "public"]));
    assert_eq!(json(&out)["added"], serde_json::json!(["app.invoices"]));

    // Refused, the file unchanged: it cannot tell which schema …
    let refused = |file: &str, text: &str, schema: Option<&str>, reason: &str| {
        std::fs::write(d.join(file), text).unwrap();
        let out = update(file, schema);
        assert_eq!(out.status.code(), Some(2), "{file}: {}", out_text(&out));
        let error = &json(&out)["error"];
        assert_eq!(error["kind"], "invalid_input", "{file}: {error}");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains(reason), "{file}: {message}");
        assert!(message.contains("nothing written"), "{file}: {message}");
        assert_eq!(std::fs::read_to_string(d.join(file)).unwrap(), text);
        assert!(!d.join(format!("{file}.cohort-update")).exists());
    };
    refused(
        "nameless.toml",
        "[cohort]\nschema = \"cohort\"\n",
        None,
        "does not say which schema it was made from",
    );
    // … its `init` line was edited past reading …
    refused(
        "edited.toml",
        &updated.replacen("from schema \"app\"", "from schema app", 1),
        None,
        "line 1 says which schema `cohort init` read",
    );
    // … or the schema it names (or is given) has no tables.
    refused(
        "gone.toml",
        "# Cohort policy file, started by `cohort init` from schema \"gone\" on 2026-01-01.\n[cohort]\n",
        None,
        "schema \"gone\" has no tables",
    );
    refused(
        "typo.toml",
        &updated,
        Some("App"),
        "schema \"App\" has no tables",
    );
}

/// Issue 40 E4: `init --update` on a file with CRLF line endings appends
/// CRLF lines (an LF file stays LF), keeps every byte before and the
/// file's permissions, and the result validates.
#[tokio::test]
async fn init_update_keeps_the_files_line_endings() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    let ddl = |sql: &'static str| {
        let pool = db.pool().clone();
        async move { sqlx::raw_sql(sql).execute(&pool).await.unwrap() }
    };
    ddl("CREATE SCHEMA shop;
         CREATE TABLE shop.orders (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz NOT NULL);")
    .await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let url = Some(db.url());
    succeeded(&cohort(d, &["migrate", "--schema", "cohort"], url));
    succeeded(&cohort(
        d,
        &["init", "--schema", "shop", "--output", "lf.toml"],
        url,
    ));
    let lf = std::fs::read_to_string(d.join("lf.toml")).unwrap();
    let crlf = lf.replace('\n', "\r\n");
    let path = d.join("cohort.toml");
    std::fs::write(&path, &crlf).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    ddl("CREATE TABLE shop.returns (id bigint PRIMARY KEY, tenant_id uuid, received_at timestamptz);")
        .await;

    for (file, before) in [("cohort.toml", &crlf), ("lf.toml", &lf)] {
        let out = cohort(d, &["--json", "init", "--update", "--output", file], url);
        succeeded(&out);
        assert_eq!(json(&out)["added"], serde_json::json!(["shop.returns"]));
        let after = std::fs::read_to_string(d.join(file)).unwrap();
        assert!(after.starts_with(before.as_str()), "{file}: {after:?}");
        let added = &after[before.len()..];
        assert!(added.contains("table = \"shop.returns\""), "{added:?}");
        if file == "cohort.toml" {
            assert!(
                !added.replace("\r\n", "").contains('\n'),
                "a line ending without CR: {added:?}"
            );
            assert!(added.ends_with("\r\n"), "{added:?}");
        } else {
            assert!(!added.contains('\r'), "{added:?}");
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }
    let out = cohort(d, &["--json", "validate"], url);
    succeeded(&out);
    assert_eq!(json(&out)["valid"], true);
}

/// A composite record key on the command line: `--record` takes the key
/// as a JSON array in any spelling of its parts, every JSON output gives
/// it back as an array, and a key of the wrong shape exits 2 with nothing
/// written (RS-038).
#[tokio::test]
async fn a_composite_key_is_a_json_array_on_the_command_line() {
    let (db, dir) = scenario(
        "CREATE SCHEMA app;
         CREATE TABLE app.order_lines (order_id bigint NOT NULL, line_no int NOT NULL,
             tenant_id uuid NOT NULL, created_at timestamptz, PRIMARY KEY (order_id, line_no));
         INSERT INTO app.order_lines
           SELECT o, l, '11111111-1111-1111-1111-111111111111', '2026-01-01Z'
           FROM generate_series(1, 2) o, generate_series(1, 3) l;",
        r#"
[cohort]
schema = "retention"

[[entity]]
name = "OrderLine"
id = "7a0c4a52-3b1e-4c55-8f0e-6d2b9a1c0e11"
table = "app.order_lines"
category = "lines"
anchor = "created_at"
record_id = ["order_id", "line_no"]

[[category]]
name = "lines"
strategy = "purge"
period = "30d"
audit = "per_row"
"#,
    )
    .await;
    let (dir, url) = (dir.path(), Some(db.url()));
    succeeded(&cohort(dir, &["migrate"], url));
    let tenant = "11111111-1111-1111-1111-111111111111";

    let validated = json(&cohort(dir, &["--json", "validate"], url));
    assert!(
        validated
            .to_string()
            .contains(r#""record_id":["order_id","line_no"]"#),
        "{validated}"
    );
    let out = cohort(
        dir,
        &[
            "--json",
            "holds",
            "create",
            "--entity",
            "OrderLine",
            "--record",
            r#"["1", 2]"#,
            "--tenant",
            tenant,
            "--reason",
            "dispute",
        ],
        url,
    );
    succeeded(&out);
    assert_eq!(json(&out)["record_id"], serde_json::json!([1, 2]));
    let listed = json(&cohort(dir, &["--json", "holds", "list"], url));
    assert_eq!(listed[0]["record_id"], serde_json::json!([1, 2]));

    for bad in ["[1]", "1", r#"[1, "two"]"#] {
        let out = cohort(
            dir,
            &[
                "holds",
                "create",
                "--entity",
                "OrderLine",
                "--record",
                bad,
                "--tenant",
                tenant,
                "--reason",
                "r",
            ],
            url,
        );
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("record id for OrderLine"),
            "{bad}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let holds: i64 = sqlx::query_scalar("SELECT count(*) FROM retention.retention_hold")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(holds, 1);

    let out = cohort(
        dir,
        &["--json", "sweep", "--tenant", tenant, "--now", NOW],
        url,
    );
    succeeded(&out);
    let swept = json(&out);
    assert_eq!(swept["entities"][0]["affected"], 5);
    assert_eq!(swept["entities"][0]["held"], 1);
    let history = json(&cohort(
        dir,
        &["--json", "runs", "record", "OrderLine", "[2, 3]"],
        url,
    ));
    assert_eq!(history.as_array().map(Vec::len), Some(1), "{history}");
    assert_eq!(history[0]["action"], "purge");
    let none = json(&cohort(
        dir,
        &["--json", "runs", "record", "OrderLine", r#"["1", "2"]"#],
        url,
    ));
    assert_eq!(
        none,
        serde_json::json!([]),
        "the held line was never changed"
    );
}

/// `erase --reference` opens an erasure request; `erase-requests` lists,
/// shows and extends them, with the documented JSON and exit codes.
#[tokio::test]
async fn erasure_requests_follow_the_cli_contract() {
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let dir = dir.path();
    let url = db.url();
    let key = [("COHORT_HASH_KEY", "an-example-hash-key-0123456789")];
    let run = |args: &[&str]| cli::cohort_with_env(dir, args, url, &key);
    succeeded(&run(&["migrate"]));
    let subject = |id: i64| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT user_id::text FROM app.case_contacts WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let (one, two) = (subject(1).await, subject(2).await);
    let tenant = "11111111-1111-1111-1111-111111111111";
    let erase = |subject: &str, reference: &str, extra: &[&str]| {
        let mut args = vec![
            "--json",
            "erase",
            "--tenant",
            tenant,
            "--subject",
            subject,
            "--now",
            NOW,
            "--reference",
            reference,
        ];
        args.extend_from_slice(extra);
        run(&args)
    };

    // Nothing kept: completed at once, the subject replaced by its hash.
    let out = erase(&one, "SAR-CLI-1", &["--note", "by post"]);
    succeeded(&out);
    let done = json(&out);
    assert_eq!(done["entities"][0]["affected"].as_u64(), Some(1));
    let request = &done["request"];
    assert_eq!(request["reference"], "SAR-CLI-1");
    assert_eq!(request["state"], "completed");
    assert_eq!(request["subject"], Value::Null);
    assert_eq!(request["note"], Value::Null, "cleared with the subject");
    assert_eq!(request["due_at"], "2026-07-01T00:00:00Z");
    assert_eq!(request["subject_hash"].as_str().unwrap().len(), 64);

    // A held row: the request waits, names the part, and is overdue by
    // the clock (due 30 days after 2026-06-01).
    let held = run(&[
        "--json",
        "holds",
        "create",
        "--entity",
        "CaseContact",
        "--record",
        "2",
        "--tenant",
        tenant,
        "--reason",
        "claim",
    ]);
    succeeded(&held);
    let hold_id = json(&held)["hold_id"].as_str().unwrap().to_owned();
    let out = erase(&two, "SAR-CLI-2", &[]);
    succeeded(&out);
    let waiting = json(&out);
    assert_eq!(waiting["request"]["state"], "waiting");
    assert_eq!(waiting["request"]["waiting"][0]["reason"], "held");
    assert_eq!(waiting["request"]["waiting"][0]["entity"], "CaseContact");
    assert_eq!(waiting["request"]["subject"].as_str(), Some(two.as_str()));

    let list = |extra: &[&str]| {
        let mut args = vec!["--json", "erase-requests", "list"];
        args.extend_from_slice(extra);
        let out = run(&args);
        succeeded(&out);
        json(&out)
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["reference"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(list(&[]), ["SAR-CLI-1", "SAR-CLI-2"]);
    assert_eq!(list(&["--state", "waiting"]), ["SAR-CLI-2"]);
    assert_eq!(list(&["--overdue"]), ["SAR-CLI-2"]);
    let text = cli::cohort_with_env(dir, &["erase-requests", "list"], url, &key);
    succeeded(&text);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("REFERENCE") && text.contains("SAR-CLI-2"),
        "{text}"
    );
    // The part's reason as the JSON spells it, the entity as declared.
    assert!(text.contains("CaseContact 1 (held)"), "{text}");

    let out = run(&["--json", "erase-requests", "show", "SAR-CLI-2"]);
    succeeded(&out);
    let shown = json(&out);
    let states: Vec<&str> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["open", "in_progress", "waiting"]);
    // Run again, in text: the waiting part says what it waits for.
    let out = cli::cohort_with_env(
        dir,
        &[
            "erase",
            "--tenant",
            tenant,
            "--subject",
            &two,
            "--now",
            NOW,
            "--reference",
            "SAR-CLI-2",
        ],
        url,
        &key,
    );
    succeeded(&out);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("waiting: CaseContact 1 row(s): under a hold"),
        "{said}"
    );

    let out = run(&[
        "--json",
        "erase-requests",
        "extend",
        "SAR-CLI-2",
        "--due",
        "2099-01-01",
        "--reason",
        "extended under Art. 12(3)",
    ]);
    succeeded(&out);
    let extended = json(&out);
    assert_eq!(extended["due_at"], "2099-01-02T00:00:00Z");
    assert_eq!(extended["overdue"], false);
    assert_eq!(list(&["--overdue"]), Vec::<String>::new());

    // Bad input exits 2 and writes nothing.
    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM retention.erasure_request_event")
        .fetch_one(db.pool())
        .await
        .unwrap();
    for args in [
        vec!["--json", "erase-requests", "show", "SAR-NOPE"],
        vec!["--json", "erase-requests", "list", "--state", "done"],
        vec![
            "--json",
            "erase-requests",
            "extend",
            "SAR-CLI-2",
            "--due",
            "2020-01-01",
            "--reason",
            "late",
        ],
        vec![
            "--json",
            "erase-requests",
            "extend",
            "SAR-CLI-1",
            "--due",
            "2099-01-01",
            "--reason",
            "completed",
        ],
        vec![
            "--json",
            "erase",
            "--tenant",
            tenant,
            "--subject",
            &two,
            "--reference",
            "SAR-CLI-3",
            "--due",
            "soon",
        ],
        vec![
            "--json",
            "erase",
            "--tenant",
            tenant,
            "--subject",
            &two,
            "--reference",
            "SAR-CLI-3",
            "--dry-run",
        ],
    ] {
        let out = run(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Without the hash key a request is refused, naming it.
    let out = cohort(
        dir,
        &[
            "--json",
            "erase",
            "--tenant",
            tenant,
            "--subject",
            &two,
            "--reference",
            "SAR-CLI-4",
        ],
        url,
    );
    assert_eq!(out.status.code(), Some(2));
    let message = json(&out)["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("COHORT_HASH_KEY"), "{message}");
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM retention.erasure_request_event")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(before, after, "nothing was written");

    // Retried with the braced, upper-case spelling of its tenant, it is
    // the same request (issue 55, E3), still waiting.
    let braced = format!("{{{}}}", tenant.to_uppercase());
    let out = run(&[
        "--json",
        "erase",
        "--tenant",
        &braced,
        "--subject",
        &two,
        "--reference",
        "SAR-CLI-2",
    ]);
    succeeded(&out);
    assert_eq!(json(&out)["request"]["state"], "waiting");
    assert_eq!(list(&[]), ["SAR-CLI-1", "SAR-CLI-2"]);

    // RS-046: once the hold is released, one maintenance pass completes
    // the request, without a worker and without handlers; before the
    // release, the same pass leaves it waiting.
    let maintain = |json_out: bool| {
        let mut args = vec!["maintain", "--once"];
        if json_out {
            args.insert(0, "--json");
        }
        run(&args)
    };
    // Work of a handler neither this policy nor a live peer registers,
    // queued two hours ago, is dead-lettered by the same pass.
    sqlx::raw_sql(
        "INSERT INTO retention.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, started_at, settled_at)
         VALUES ('00000000-0000-0000-0000-0000000000b1', 'sweep', 'manual', false, 'succeeded', now(), now() - interval '3 hours', now() - interval '3 hours');
         INSERT INTO retention.sweep_run_row_detail (run_id, retention_entity_id, entity_type, record_id, action)
         VALUES ('00000000-0000-0000-0000-0000000000b1', '00000000-0000-0000-0000-0000000000e1', 'Gone', 'r1', 'purge');
         INSERT INTO retention.sweep_row_handler_status (row_detail_id, run_id, handler_id, phase, status, created_at)
         SELECT row_detail_id, run_id, 'crm-forget', 'immediate', 'pending', now() - interval '2 hours'
         FROM retention.sweep_run_row_detail WHERE record_id = 'r1';",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let out = maintain(true);
    succeeded(&out);
    let pass = json(&out);
    assert_eq!(pass["erasure_requests_resumed"], 0, "{pass}");
    assert_eq!(pass["orphaned_work"], 1, "{pass}");
    assert_eq!(
        sqlx::query_scalar::<_, String>(
            "SELECT status FROM retention.sweep_row_handler_status WHERE handler_id = 'crm-forget'"
        )
        .fetch_one(db.pool())
        .await
        .unwrap(),
        "dead_lettered"
    );
    assert_eq!(list(&["--state", "waiting"]), ["SAR-CLI-2"]);
    succeeded(&run(&["holds", "release", &hold_id]));
    let out = maintain(true);
    succeeded(&out);
    let pass = json(&out);
    assert_eq!(pass["erasure_requests_resumed"], 1, "{pass}");
    assert_eq!(pass["erasure_requests_completed"], 1, "{pass}");
    assert_eq!(list(&["--state", "completed"]), ["SAR-CLI-1", "SAR-CLI-2"]);
    let out = maintain(false);
    succeeded(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Erasure requests resumed 0, completed 0"),
        "{text}"
    );
    // Without --once it is refused (the continuous service is the worker's).
    let out = run(&["maintain"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cohort worker"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `[journal]`, `restore-check`, `replay` and the worker's refusal, as
/// users script them: a database that lost an erasure the journal holds
/// (a copy of the data from before it, standing for a restored backup; the
/// real point-in-time recovery is `cohort/tests/engine/restore.rs`).
#[tokio::test]
async fn restore_check_replay_and_the_worker_follow_the_cli_contract() {
    let (db, dir) = setup().await;
    sqlx::raw_sql(ROWS).execute(db.pool()).await.unwrap();
    let restored = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(TABLES)
        .execute(restored.pool())
        .await
        .unwrap();
    sqlx::raw_sql(ROWS).execute(restored.pool()).await.unwrap();
    sqlx::query("UPDATE app.case_contacts c SET user_id = o.user_id FROM (VALUES (1, $1::uuid)) o(id, user_id) WHERE c.id = o.id")
        .bind(
            sqlx::query_scalar::<_, uuid::Uuid>("SELECT user_id FROM app.case_contacts WHERE id = 1")
                .fetch_one(db.pool())
                .await
                .unwrap(),
        )
        .execute(restored.pool())
        .await
        .unwrap();
    let dir = dir.path();
    let journal = tempfile::tempdir().unwrap();
    let policy = std::fs::read_to_string(dir.join("cohort.toml")).unwrap()
        + &format!(
            "\n[journal]\ndir = {:?}\n",
            journal.path().display().to_string()
        );
    std::fs::write(dir.join("cohort.toml"), policy).unwrap();
    let keys = [
        ("COHORT_HASH_KEY", "an-example-hash-key-0123456789"),
        (
            "COHORT_JOURNAL_KEY",
            "7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a7a",
        ),
    ];
    let on = |url: &str, args: &[&str]| cli::cohort_with_env(dir, args, url, &keys);
    for url in [db.url(), restored.url()] {
        succeeded(&on(url, &["migrate"]));
    }
    let subject: String =
        sqlx::query_scalar("SELECT user_id::text FROM app.case_contacts WHERE id = 1")
            .fetch_one(db.pool())
            .await
            .unwrap();
    let tenant = "11111111-1111-1111-1111-111111111111";
    succeeded(&on(
        db.url(),
        &[
            "erase",
            "--tenant",
            tenant,
            "--subject",
            &subject,
            "--reference",
            "SAR-R1",
        ],
    ));
    succeeded(&on(db.url(), &["restore-check"]));
    let anonymised = |pool: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM app.case_contacts WHERE id = 1 AND anonymised_at IS NOT NULL",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(anonymised(db.pool().clone()).await, 1);

    // The "restored" database lacks the request: exit 1, naming it.
    let gap = on(restored.url(), &["--json", "restore-check"]);
    assert_eq!(
        gap.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&gap.stderr)
    );
    let gap = json(&gap);
    assert_eq!(gap["missing_requests"][0]["reference"], "SAR-R1");
    assert_eq!(gap["missing_requests"][0]["journal_state"], "completed");
    // The worker refuses to start on it, and says what to do.
    let refused = on(restored.url(), &["worker"]);
    assert_eq!(refused.status.code(), Some(2));
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("cohort replay") && message.contains("SAR-R1"),
        "{message}"
    );
    // Told otherwise, it starts (and stops on SIGTERM).
    let log = dir.join("worker-ignoring.log");
    let mut child = cli::command(
        dir,
        &["worker", "--ignore-restore-gap"],
        restored.url(),
        &keys,
    )
    .env("RUST_LOG", "cohort=info")
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    wait_until_blocking(
        "the worker to start anyway",
        Duration::from_secs(30),
        || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("starting anyway (--ignore-restore-gap)")
        },
    );
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    assert_eq!(child.wait().unwrap().code(), Some(0));

    // A dry replay changes nothing and exits 1; the replay brings the
    // request back and erases again; a second one has nothing to do.
    let dry = on(restored.url(), &["--json", "replay", "--dry-run"]);
    assert_eq!(dry.status.code(), Some(1));
    assert_eq!(
        json(&dry)["requests_restored"],
        serde_json::json!(["SAR-R1"])
    );
    assert_eq!(anonymised(restored.pool().clone()).await, 0);
    let dry = on(restored.url(), &["replay", "--dry-run"]);
    assert_eq!(dry.status.code(), Some(1));
    let said = String::from_utf8_lossy(&dry.stdout);
    assert!(
        said.contains("erasure request SAR-R1 would be restored from the journal"),
        "{said}"
    );
    // One request a line: "was", never "were" (issue 55, A3 and E5).
    let done = on(restored.url(), &["replay"]);
    succeeded(&done);
    let said = String::from_utf8_lossy(&done.stdout);
    assert!(
        said.contains("erasure request SAR-R1 was restored from the journal\n")
            && said.contains("erasure request SAR-R1 was run again: completed\n")
            && !said.contains("were"),
        "{said}"
    );
    assert_eq!(anonymised(restored.pool().clone()).await, 1);
    succeeded(&on(restored.url(), &["restore-check"]));
    let again = on(restored.url(), &["--json", "replay"]);
    succeeded(&again);
    assert_eq!(json(&again)["requests_run"], serde_json::json!([]));

    // Without the key, or with a journal cut short: exit 2, named.
    let no_key = cli::cohort_with_env(dir, &["restore-check"], restored.url(), &keys[..1]);
    assert_eq!(no_key.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&no_key.stderr).contains("COHORT_JOURNAL_KEY"));
    let file = journal.path().join("cohort-journal.jsonl");
    let text = std::fs::read_to_string(&file).unwrap();
    let cut: String = text.lines().skip(1).map(|l| format!("{l}\n")).collect();
    std::fs::write(&file, cut).unwrap();
    let broken = on(restored.url(), &["restore-check"]);
    assert_eq!(broken.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&broken.stderr).contains("entry 2 does not follow entry 0"),
        "{}",
        String::from_utf8_lossy(&broken.stderr)
    );
}
