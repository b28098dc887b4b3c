//! The `cohort` binary as users script it: exit codes, JSON on stdout,
//! database-URL precedence, and a real database behind every command.

use std::path::Path;
use std::process::{Command, Output};

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

fn cohort(dir: &Path, args: &[&str], env_url: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cohort"));
    cmd.current_dir(dir).args(args).env_remove("DATABASE_URL");
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("COHORT_")) {
        cmd.env_remove(k);
    }
    if let Some(url) = env_url {
        cmd.env("DATABASE_URL", url);
    }
    cmd.output().expect("run cohort")
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

async fn setup() -> (TestDatabase, tempfile::TempDir) {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(TABLES).execute(db.pool()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cohort.toml"), POLICY).unwrap();
    (db, dir)
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
    assert_eq!(report["applied"], serde_json::json!([1]));
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
    // CaseContact has no (tenant_id, created_at) index: advice, not an error.
    let warnings = v["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0]
        .as_str()
        .unwrap()
        .contains("CREATE INDEX ON \"app\".\"case_contacts\" (\"tenant_id\", \"created_at\")"));

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
    assert_eq!(n, 5);
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
    assert_eq!(v["entities"].as_array().unwrap().len(), 4);
    let plan = v["plan"].as_array().unwrap();
    assert_eq!(plan.len(), 8, "two tenants x four entities");
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
        text.contains("Validated the policy file against the live catalog: 4 entities"),
        "{text}"
    );
}
