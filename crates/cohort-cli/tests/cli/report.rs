//! `cohort report` (RS-021): the evidence of retention for a period, read
//! from a ledger written by real sweeps, erasures and holds (then moved
//! back in time), checked figure by figure against the ledger, in three
//! formats that must agree, and opened in a real browser.
use crate::support::cli;
use crate::support::scenario::scenario;

use crate::support::chromium;

use crate::support::relink;

use cli::cohort;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use cohort_pgtemp::TestDatabase;
use serde_json::Value;

const A: &str = "11111111-1111-4111-8111-111111111111";
const B: &str = "22222222-2222-4222-8222-222222222222";

const POLICY: &str = r#"
[cohort]
schema = "retention"

[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"
subjects = [{ column = "user_id", kind = "user" }]

[[entity]]
name = "Contact"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "app.contacts"
category = "contacts"
anchor = "created_at"
subjects = [{ column = "user_id", kind = "user" }]
anonymise = { email = "null" }

[[category]]
name = "notes"
strategy = "purge"
period = "30d"

[[category.override]]
jurisdiction = "EU"
period = "60d"

[[category]]
name = "contacts"
strategy = "anonymise"
period = "90d"
legal_min = "20d"

[[tenant]]
id = "22222222-2222-4222-8222-222222222222"
jurisdiction = "EU"
"#;

const TABLES: &str = "CREATE SCHEMA app;
    CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
        user_id text NOT NULL);
    CREATE INDEX ON app.notes (tenant_id, created_at);
    CREATE TABLE app.contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
        anonymised_at timestamptz, email text, user_id text NOT NULL);
    CREATE INDEX ON app.contacts (tenant_id, created_at);
    -- Row 99 cannot be deleted: the sweep that reaches it fails on Note.
    CREATE FUNCTION app.refuse() RETURNS trigger LANGUAGE plpgsql AS
      $$ BEGIN IF OLD.id = 99 THEN RAISE EXCEPTION 'kept by the application' USING ERRCODE = 'P0099'; END IF;
         RETURN OLD; END $$;
    CREATE TRIGGER refuse BEFORE DELETE ON app.notes FOR EACH ROW EXECUTE FUNCTION app.refuse();";

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Runs a command that writes a run, and moves the run to `at` (settled
/// `seconds` later): the ledger then reads as if written on that day.
async fn run_at(
    db: &TestDatabase,
    dir: &Path,
    args: &[&str],
    code: i32,
    at: &str,
    seconds: f64,
) -> Value {
    let out = cohort(dir, args, db.url());
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = stdout_json(&out);
    let run_id = doc["run_id"].as_str().expect("a run id").to_owned();
    sqlx::query(
        "UPDATE retention.sweep_run SET started_at = $2::timestamptz,
           settled_at = $2::timestamptz + make_interval(secs => $3) WHERE run_id = $1::uuid",
    )
    .bind(&run_id)
    .bind(at)
    .bind(seconds)
    .execute(db.pool())
    .await
    .unwrap();
    doc
}

/// A ledger with four months of history:
/// - 2025-12-20: a sweep of tenant A, outside the reported period;
/// - 2026-01-15: a sweep of tenant A (notes purged, contacts anonymised);
/// - 2026-01-16: a dry run of tenant B (changes nothing, not reported);
/// - 2026-02-10: a sweep of tenant B under its EU override, failing on
///   note 99 (partially failed);
/// - 2026-02-20: a sweep of tenant A keeping a held note;
/// - 2026-02-25 and 26: two erasures of user u-7 (2.5 s and 4 s), the
///   second keeping a contact younger than the legal minimum;
/// - holds: one on a record (placed, in force), one on a subject placed
///   and released in the period.
async fn history() -> (TestDatabase, tempfile::TempDir) {
    let (db, dir) = scenario(TABLES, POLICY).await;
    let d = dir.path();
    let url = db.url();
    assert_eq!(cohort(d, &["migrate"], url).status.code(), Some(0));
    let pool = db.pool().clone();
    let rows = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::raw_sql(sql).execute(&pool).await.unwrap();
        }
    };

    rows("INSERT INTO app.notes SELECT g, '11111111-1111-4111-8111-111111111111', now() - interval '40 days', 'u-' || g
          FROM generate_series(1, 3) g").await;
    run_at(
        &db,
        d,
        &["--json", "sweep", "--tenant", A],
        0,
        "2025-12-20 03:00:00+00",
        1.0,
    )
    .await;

    rows("INSERT INTO app.notes SELECT g, '11111111-1111-4111-8111-111111111111', now() - interval '40 days', 'u-' || g
          FROM generate_series(10, 14) g;
          INSERT INTO app.contacts SELECT g, '11111111-1111-4111-8111-111111111111', now() - interval '100 days', NULL,
            'c' || g || '@example.org', 'u-' || g FROM generate_series(1, 4) g").await;
    run_at(
        &db,
        d,
        &["--json", "sweep", "--tenant", A],
        0,
        "2026-01-15 03:00:00+00",
        2.0,
    )
    .await;

    rows("INSERT INTO app.notes SELECT g, '22222222-2222-4222-8222-222222222222', now() - interval '70 days', 'u-' || g
          FROM generate_series(20, 25) g").await;
    run_at(
        &db,
        d,
        &["--json", "sweep", "--tenant", B, "--dry-run"],
        0,
        "2026-01-16 03:00:00+00",
        1.0,
    )
    .await;

    rows("INSERT INTO app.notes VALUES (99, '22222222-2222-4222-8222-222222222222', now() - interval '70 days', 'u-99')").await;
    run_at(
        &db,
        d,
        &["--json", "sweep", "--tenant", B],
        3,
        "2026-02-10 03:00:00+00",
        1.0,
    )
    .await;

    rows("INSERT INTO app.notes SELECT g, '11111111-1111-4111-8111-111111111111', now() - interval '40 days', 'u-' || g
          FROM generate_series(30, 32) g").await;
    let hold = cohort(
        d,
        &[
            "--json", "holds", "create", "--entity", "Note", "--record", "31", "--tenant", A,
            "--reason", "case 1",
        ],
        url,
    );
    assert_eq!(
        hold.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&hold.stderr)
    );
    run_at(
        &db,
        d,
        &["--json", "sweep", "--tenant", A],
        0,
        "2026-02-20 03:00:00+00",
        1.0,
    )
    .await;

    rows("INSERT INTO app.notes VALUES (40, '11111111-1111-4111-8111-111111111111', now() - interval '1 day', 'u-7');
          INSERT INTO app.contacts VALUES (7, '11111111-1111-4111-8111-111111111111', now() - interval '5 days', NULL,
            'seven@example.org', 'u-7')").await;
    let erase = [
        "--json",
        "erase",
        "--tenant",
        A,
        "--subject",
        "u-7",
        "--kind",
        "user",
    ];
    run_at(&db, d, &erase, 0, "2026-02-25 10:00:00+00", 2.5).await;
    run_at(&db, d, &erase, 0, "2026-02-26 10:00:00+00", 4.0).await;

    let subject = cohort(
        d,
        &[
            "--json",
            "holds",
            "create",
            "--subject",
            "u-3",
            "--kind",
            "user",
            "--reason",
            "case 2",
        ],
        url,
    );
    assert_eq!(
        subject.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&subject.stderr)
    );
    let subject_id = stdout_json(&subject)["hold_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let release = cohort(d, &["holds", "release", &subject_id], url);
    assert_eq!(
        release.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&release.stderr)
    );
    // Holds placed and released in February, like the runs (the reach
    // trigger, which refuses any such change, set aside for it).
    sqlx::raw_sql(
        "ALTER TABLE retention.retention_hold DISABLE TRIGGER retention_hold_reach;
         UPDATE retention.retention_hold SET created_at = '2026-02-18 09:00:00+00',
           released_at = CASE WHEN released_at IS NULL THEN NULL ELSE timestamptz '2026-02-27 09:00:00+00' END;
         ALTER TABLE retention.retention_hold ENABLE ALWAYS TRIGGER retention_hold_reach;",
    )
    .execute(db.pool())
    .await
    .unwrap();
    // The hash chain as if recorded on those days.
    relink::relink(db.pool(), "retention").await;
    (db, dir)
}

fn report(dir: &Path, url: &str, extra: &[&str]) -> Output {
    let mut args = vec!["report", "--from", "2026-01-01", "--to", "2026-03-31"];
    args.extend_from_slice(extra);
    cohort(dir, &args, url)
}

fn entity<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["entities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["entity"] == name)
        .unwrap_or_else(|| panic!("{name} not in {doc:#}"))
}

/// RS-021: every figure of the JSON report against the ledger it was read
/// from, and against what the seeded history did.
#[tokio::test]
async fn the_report_states_what_the_ledger_holds_for_the_period() {
    let (db, dir) = history().await;
    let out = report(dir.path(), db.url(), &["--format", "json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = stdout_json(&out);
    assert_eq!(
        (doc["from"].as_str(), doc["to"].as_str()),
        (Some("2026-01-01"), Some("2026-03-31"))
    );

    // Notes: three sweeps in the period (the December one and the dry run
    // are not), one of them failing on Note; 5 purged in January, 6 of
    // tenant B and 2 of tenant A in February; one held.
    let notes = entity(&doc, "Note");
    assert_eq!(notes["category"], "notes");
    assert_eq!(notes["runs"]["runs"], 3);
    assert_eq!(notes["runs"]["succeeded"], 2);
    assert_eq!(notes["runs"]["failed"], 1);
    assert_eq!(notes["runs"]["last_success"], "2026-02-20T03:00:01Z");
    let months: Vec<(String, u64)> = notes["months"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["month"].as_str().unwrap().to_owned(),
                m["purged"].as_u64().unwrap(),
            )
        })
        .collect();
    // The failing batch rolled back whole: B's six notes share it with 99.
    assert_eq!(
        months,
        [("2026-01".to_owned(), 5), ("2026-02".to_owned(), 2)]
    );
    assert_eq!(notes["kept"]["held"], 1, "tenant A's last run kept note 31");
    // Two rules in force: the default, and tenant B's EU override.
    let rules: Vec<(String, String)> = notes["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["period"].as_str().unwrap().to_owned(),
                r["strategy"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        rules,
        [
            ("30d".to_owned(), "purge".to_owned()),
            ("60d".to_owned(), "purge".to_owned())
        ]
    );

    let contacts = entity(&doc, "Contact");
    assert_eq!(contacts["rules"][0]["legal_minimum"], "20d");
    assert_eq!(contacts["rules"][0]["strategy"], "anonymise");
    assert_eq!(contacts["months"][0]["month"], "2026-01");
    assert_eq!(contacts["months"][0]["anonymised"], 4);

    // The same figures, read straight from the ledger.
    let ledger: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT s.entity_type, to_char(r.started_at AT TIME ZONE 'UTC', 'YYYY-MM'), sum(s.affected_count)::int8
         FROM retention.sweep_run r JOIN retention.sweep_run_entity_summary s USING (run_id)
         WHERE r.kind = 'sweep' AND NOT r.dry_run AND r.started_at >= '2026-01-01' AND r.started_at < '2026-04-01'
         GROUP BY 1, 2 HAVING sum(s.affected_count) > 0 ORDER BY 1, 2",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    let reported: Vec<(String, String, i64)> = doc["entities"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| {
            e["months"].as_array().unwrap().iter().map(move |m| {
                let n = ["purged", "soft_deleted", "anonymised", "archived"]
                    .iter()
                    .map(|k| m[k].as_i64().unwrap())
                    .sum::<i64>();
                (
                    e["entity"].as_str().unwrap().to_owned(),
                    m["month"].as_str().unwrap().to_owned(),
                    n,
                )
            })
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(reported, ledger);

    // Erasures: two requests, both succeeded; the median and 95th
    // percentile as PostgreSQL computes them; the second kept contact 7
    // (younger than the legal minimum), the first erased note 40.
    let x = &doc["erasures"];
    assert_eq!(
        (
            x["requests"].as_u64(),
            x["succeeded"].as_u64(),
            x["failed"].as_u64()
        ),
        (Some(2), Some(2), Some(0))
    );
    let (median, p95): (f64, f64) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM settled_at - started_at))::float8,
                percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM settled_at - started_at))::float8
         FROM retention.sweep_run WHERE kind = 'erasure' AND NOT dry_run",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!((x["median_seconds"].as_f64().unwrap() - median).abs() < 1e-6);
    assert!((x["p95_seconds"].as_f64().unwrap() - p95).abs() < 1e-6);
    assert!((median - 3.25).abs() < 1e-9 && (p95 - 3.925).abs() < 1e-9);
    let served = x["requests_served"].as_array().unwrap();
    assert_eq!(served[0]["subject_kind"], "user");
    assert_eq!(
        served[0]["removed"], 1,
        "note 40: contact 7 is under the legal minimum"
    );
    assert_eq!(served[0]["kept"]["legal_minimum"], 1);
    assert_eq!(served[1]["removed"], 0);
    assert_eq!(served[1]["kept"]["legal_minimum"], 1);
    assert!(
        !doc.to_string().contains("u-7"),
        "the subject never appears"
    );

    // Holds: counts only, never the reason or the subject.
    let holds: BTreeMap<String, Value> = doc["holds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["target"].as_str().unwrap().to_owned(), h.clone()))
        .collect();
    assert_eq!(
        [
            &holds["record"]["placed"],
            &holds["record"]["released"],
            &holds["record"]["in_force"]
        ],
        [1, 0, 1]
    );
    assert_eq!(
        [
            &holds["subject"]["placed"],
            &holds["subject"]["released"],
            &holds["subject"]["in_force"]
        ],
        [1, 1, 0]
    );
    let text = doc.to_string();
    assert!(!text.contains("case 1") && !text.contains("u-3"), "{text}");

    // Failures: Note's, by its sanitised code, without the diagnostic id.
    let failures = doc["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{failures:#?}");
    assert_eq!(failures[0]["entity"], "Note");
    assert_eq!(failures[0]["kind"], "sweep");
    assert_eq!(failures[0]["code"], "kind=database code=P0099");
    assert_eq!(failures[0]["count"], 1);

    // One tenant: B's runs only, and the holds that reach it (tenantless
    // subject holds do; A's record hold does not).
    let out = report(dir.path(), db.url(), &["--format", "json", "--tenant", B]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b = stdout_json(&out);
    assert_eq!(b["tenant"], B);
    let notes = entity(&b, "Note");
    assert_eq!(
        (
            notes["runs"]["runs"].as_u64(),
            notes["runs"]["failed"].as_u64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(notes["rules"].as_array().unwrap().len(), 1);
    assert_eq!(notes["rules"][0]["period"], "60d");
    assert_eq!(b["erasures"]["requests"], 0);
    let holds = b["holds"].as_array().unwrap();
    assert_eq!(holds[0]["placed"], 0, "A's record hold does not reach B");
    assert_eq!(holds[1]["placed"], 1, "a tenantless subject hold does");
    // Another spelling of B (a uuid without hyphens) is B.
    let spelled = B.replace('-', "");
    let out = report(
        dir.path(),
        db.url(),
        &["--format", "json", "--tenant", &spelled],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut again = stdout_json(&out);
    again["generated_at"] = b["generated_at"].clone();
    assert_eq!(again, b, "one tenant however it is spelled");
    // The library path alike.
    let pool = cohort::sqlx::PgPool::connect(db.url()).await.unwrap();
    let lib = cohort::Cohort::builder(pool)
        .policy(cohort::policy::PolicyFile::parse(POLICY).unwrap())
        .build_unvalidated()
        .unwrap();
    let d = |s: &str| s.parse::<chrono::NaiveDate>().unwrap();
    let via_library = lib
        .report(
            &cohort::report::ReportRequest::new(d("2026-01-01"), d("2026-03-31"))
                .tenant(spelled.clone()),
        )
        .await
        .unwrap();
    assert_eq!(via_library.tenant.as_deref(), Some(B));
    assert_eq!(
        serde_json::to_value(&via_library.entities).unwrap(),
        b["entities"]
    );

    // A period with nothing in it is a report with nothing in it.
    let out = cohort(
        dir.path(),
        &[
            "--json",
            "report",
            "--from",
            "2024-01-01",
            "--to",
            "2024-01-31",
        ],
        db.url(),
    );
    assert_eq!(out.status.code(), Some(0));
    let empty = stdout_json(&out);
    assert_eq!(empty["entities"].as_array().unwrap().len(), 0);
    assert_eq!(empty["erasures"]["median_seconds"], Value::Null);
}

/// The figures a JSON report holds, each keyed as the CSV and the HTML
/// name it: built here from the JSON, independently of the code that
/// writes the CSV.
fn json_facts(doc: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let text = |v: &Value| match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Number(n) if n.is_f64() => format!("{:.3}", n.as_f64().unwrap()),
        other => other.to_string(),
    };
    let time = |v: &Value| match v.as_str() {
        None => String::new(),
        Some(s) => chrono::DateTime::parse_from_rfc3339(s)
            .unwrap()
            .with_timezone(&chrono::Utc)
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    };
    let mut put = |k: [&str; 6], v: String| {
        out.insert(k.join("|"), v);
    };
    put(["report", "", "", "", "", "from"], text(&doc["from"]));
    put(["report", "", "", "", "", "to"], text(&doc["to"]));
    put(["report", "", "", "", "", "tenant"], text(&doc["tenant"]));
    for e in doc["entities"].as_array().unwrap() {
        let (en, cat, st) = (text(&e["entity"]), text(&e["category"]), text(&e["stage"]));
        for (i, r) in e["rules"].as_array().unwrap().iter().enumerate() {
            let item = (i + 1).to_string();
            for m in [
                "strategy",
                "period",
                "legal_minimum",
                "source",
                "reason",
                "runs",
            ] {
                put(["rule", &en, &cat, &st, &item, m], text(&r[m]));
            }
            put(
                ["rule", &en, &cat, &st, &item, "last_used"],
                time(&r["last_used"]),
            );
        }
        for m in ["runs", "succeeded", "failed"] {
            put(["runs", &en, &cat, &st, "", m], text(&e["runs"][m]));
        }
        put(
            ["runs", &en, &cat, &st, "", "last_success"],
            time(&e["runs"]["last_success"]),
        );
        for month in e["months"].as_array().unwrap() {
            for m in ["purged", "soft_deleted", "anonymised", "archived"] {
                put(
                    [
                        "removed",
                        &en,
                        &cat,
                        &st,
                        month["month"].as_str().unwrap(),
                        m,
                    ],
                    text(&month[m]),
                );
            }
        }
        for (m, v) in e["kept"].as_object().unwrap() {
            put(["kept", &en, &cat, &st, "", m], text(v));
        }
    }
    let x = &doc["erasures"];
    for m in [
        "requests",
        "succeeded",
        "failed",
        "median_seconds",
        "p95_seconds",
    ] {
        put(["erasures", "", "", "", "", m], text(&x[m]));
    }
    for (m, k) in [
        ("requests_on_time", "on_time"),
        ("requests_late", "late"),
        ("requests_overdue", "overdue"),
        ("requests_not_yet_due", "not_yet_due"),
    ] {
        put(["erasures", "", "", "", "", m], text(&x["timeliness"][k]));
    }
    for d in x["deadlines"].as_array().unwrap() {
        let reference = text(&d["reference"]);
        for m in ["state", "timely"] {
            put(["erasure_request", "", "", "", &reference, m], text(&d[m]));
        }
        for m in ["received_at", "due_at", "completed_at"] {
            put(["erasure_request", "", "", "", &reference, m], time(&d[m]));
        }
    }
    for r in x["requests_served"].as_array().unwrap() {
        let id = text(&r["run_id"]);
        for m in ["status", "subject_kind", "seconds", "removed"] {
            put(["erasure", "", "", "", &id, m], text(&r[m]));
        }
        for m in ["started_at", "settled_at"] {
            put(["erasure", "", "", "", &id, m], time(&r[m]));
        }
        for (m, v) in r["kept"].as_object().unwrap() {
            put(["erasure", "", "", "", &id, m], text(v));
        }
    }
    for h in doc["holds"].as_array().unwrap() {
        for m in ["placed", "released", "expired", "in_force"] {
            put(
                ["holds", "", "", "", h["target"].as_str().unwrap(), m],
                text(&h[m]),
            );
        }
    }
    for f in doc["failures"].as_array().unwrap() {
        let key = [
            "failures",
            &text(&f["entity"]),
            "",
            "",
            &text(&f["kind"]),
            &text(&f["code"]),
        ];
        put(key, text(&f["count"]));
    }
    let chain = &doc["chain"];
    let head = |h: &Value| match h {
        Value::Null => String::new(),
        h => format!("{}:{}", h["link_id"], text(&h["link"])),
    };
    put(["chain", "", "", "", "", "head"], head(&chain["head"]));
    put(
        ["chain", "", "", "", "", "head_at_period_end"],
        head(&chain["head_at_period_end"]),
    );
    put(
        ["chain", "", "", "", "", "verified"],
        text(&chain["verified"]),
    );
    put(["chain", "", "", "", "", "breaks"], text(&chain["breaks"]));
    out
}

/// The figures of an HTML report: every cell that names one (`data-fact`),
/// with its text, or its `data-value` where the text is a label.
fn html_facts(html: &str) -> BTreeMap<String, String> {
    let unescape = |s: &str| {
        s.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
    };
    let mut out = BTreeMap::new();
    for piece in html.split("data-fact=\"").skip(1) {
        let (key, rest) = piece.split_once('"').unwrap();
        let tag_end = rest.find('>').unwrap();
        let attrs = &rest[..tag_end];
        let value = match attrs.split_once("data-value=\"") {
            Some((_, v)) => v.split_once('"').unwrap().0.to_owned(),
            None => rest[tag_end + 1..]
                .split_once("</td>")
                .unwrap()
                .0
                .to_owned(),
        };
        let previous = out.insert(unescape(key), unescape(&value));
        assert!(previous.is_none(), "figure {key} shown twice");
    }
    out
}

/// RS-021: the HTML, the CSV and the JSON carry the same figures, and the
/// page opens in headless Chromium without a console error (no script, no
/// external resource: its Content-Security-Policy refuses any). The
/// screenshot is `docs/report.png` (refreshed with
/// `COHORT_UPDATE_SCREENSHOTS=1`).
#[tokio::test]
async fn html_csv_and_json_agree_and_the_page_renders_in_chromium() {
    let (db, dir) = history().await;
    let d = dir.path();
    let files: Vec<(&str, std::path::PathBuf)> = ["json", "csv", "html"]
        .into_iter()
        .map(|f| (f, d.join(format!("report.{f}"))))
        .collect();
    for (format, path) in &files {
        let out = report(
            d,
            db.url(),
            &["--format", format, "--output", path.to_str().unwrap()],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The report went to the file; stdout says only what it holds.
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.starts_with(&format!("Wrote {}", path.display())) && said.lines().count() == 1,
            "{format}: {said}"
        );
    }
    let read = |i: usize| std::fs::read_to_string(&files[i].1).unwrap();
    let doc: Value = serde_json::from_str(&read(0)).unwrap();
    let from_json = json_facts(&doc);
    assert!(
        from_json.len() > 80,
        "a seeded history has many figures: {}",
        from_json.len()
    );

    let csv_text = read(1);
    let mut csv = csv::Reader::from_reader(csv_text.as_bytes());
    assert_eq!(
        csv.headers().unwrap().iter().collect::<Vec<_>>(),
        ["section", "entity", "category", "stage", "item", "measure", "value"]
    );
    let mut from_csv = BTreeMap::new();
    for record in csv.records() {
        let r = record.unwrap();
        let key = r.iter().take(6).collect::<Vec<_>>().join("|");
        assert!(
            from_csv.insert(key, r[6].to_owned()).is_none(),
            "{r:?} twice"
        );
    }
    assert_eq!(from_csv, from_json, "CSV and JSON disagree");

    let html = read(2);
    assert_eq!(html_facts(&html), from_json, "HTML and JSON disagree");
    assert!(!html.contains("<script") && !html.contains("src=") && !html.contains("href="));
    assert!(html.contains("<svg") && html.contains("<rect"), "a chart");
    assert!(
        !html.contains("u-7") && !html.contains("case 1"),
        "no subject, no hold reason"
    );

    let url = format!("file://{}", files[2].1.display());
    let profile = tempfile::tempdir().unwrap();
    let dom = chromium::run(profile.path(), &["--dump-dom", &url]);
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let rendered = String::from_utf8_lossy(&dom.stdout);
    assert!(rendered.contains("Retention report") && rendered.contains("Erasure runs"));
    let errors = chromium::console_errors(&dom.stderr);
    assert!(errors.is_empty(), "{errors:#?}");

    let png = d.join("report.png");
    let profile = tempfile::tempdir().unwrap();
    let shot = chromium::run(
        profile.path(),
        &[
            "--window-size=1100,1500",
            &format!("--screenshot={}", png.display()),
            &url,
        ],
    );
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    let bytes = std::fs::read(&png).expect("a screenshot");
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000,
        "{} bytes",
        bytes.len()
    );
    if std::env::var_os("COHORT_UPDATE_SCREENSHOTS").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
        std::fs::copy(&png, docs.join("report.png")).unwrap();
    }
}

/// Bad input exits 2 with a typed error and writes nothing: a date that is
/// not one, a period that ends before it starts, an output that cannot be
/// written (an older report there stays whole).
#[tokio::test]
async fn bad_report_arguments_exit_2_and_write_nothing() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(TABLES).execute(db.pool()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("cohort.toml"), POLICY).unwrap();
    assert_eq!(cohort(d, &["migrate"], db.url()).status.code(), Some(0));
    for (args, says) in [
        (
            vec!["--from", "2026-13-01", "--to", "2026-12-31"],
            "--from \"2026-13-01\" is not a date",
        ),
        (
            vec!["--from", "2026-02-01", "--to", "2026-01-31"],
            "must not end before",
        ),
        (
            vec![
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-31",
                "--tenant",
                "not-a-uuid",
            ],
            "not a valid tenant id",
        ),
        (
            vec![
                "--from",
                "2026-01-01",
                "--to",
                "2026-01-31",
                "--output",
                "/nonexistent/dir/r.html",
            ],
            "cannot write /nonexistent/dir/r.html",
        ),
    ] {
        let mut all = vec!["--json", "report"];
        all.extend(args.iter().copied());
        let out = cohort(d, &all, db.url());
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let message = stdout_json(&out)["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(message.contains(says), "{args:?}: {message}");
    }
    let out = cohort(
        d,
        &[
            "report",
            "--from",
            "2026-01-01",
            "--to",
            "2026-01-31",
            "--format",
            "pdf",
        ],
        db.url(),
    );
    assert_eq!(out.status.code(), Some(2));

    // An older report stays whole when a new one cannot be written.
    let target = d.join("old.html");
    std::fs::write(&target, "older report").unwrap();
    let out = cohort(
        d,
        &[
            "report",
            "--from",
            "2026-02-01",
            "--to",
            "2026-01-01",
            "--output",
            target.to_str().unwrap(),
        ],
        db.url(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "older report");
    assert!(std::fs::read_dir(d).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".partial")));
}

/// CWE-1236: policy text that a spreadsheet would run as a formula (a
/// rule's `reason` starting with `=`, its `source` with `@`) is written to
/// the CSV with a leading `'`, so it stays text; the JSON keeps it exact.
/// Every other cell of the CSV starts with none of `= + - @`, tab or CR
/// unless it is a number or the lone `-`.
#[tokio::test]
async fn csv_cells_a_spreadsheet_would_run_as_formulas_are_made_inert() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(TABLES).execute(db.pool()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let policy = POLICY.replace(
        "name = \"notes\"\nstrategy = \"purge\"\nperiod = \"30d\"\n",
        "name = \"notes\"\nstrategy = \"purge\"\nperiod = \"30d\"\nreason = \"=HYPERLINK(1)\"\nsource = \"@SUM(1)\"\n",
    );
    assert!(policy.contains("=HYPERLINK(1)"));
    std::fs::write(d.join("cohort.toml"), policy).unwrap();
    let url = db.url();
    assert_eq!(cohort(d, &["migrate"], url).status.code(), Some(0));
    sqlx::raw_sql(
        "INSERT INTO app.notes SELECT g, '11111111-1111-4111-8111-111111111111', now() - interval '40 days', 'u-' || g
         FROM generate_series(1, 3) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let swept = cohort(d, &["sweep", "--tenant", A], url);
    assert_eq!(
        swept.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&swept.stderr)
    );
    let today = chrono::Utc::now().date_naive();
    let (from, to) = (
        (today - chrono::Days::new(1)).to_string(),
        (today + chrono::Days::new(1)).to_string(),
    );
    let run = |format: &str| {
        let out = cohort(
            d,
            &["report", "--from", &from, "--to", &to, "--format", format],
            url,
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let json = run("json");
    assert!(
        json.contains("\"=HYPERLINK(1)\"") && json.contains("\"@SUM(1)\""),
        "the JSON keeps the exact text:\n{json}"
    );
    let csv_text = run("csv");
    let mut reader = csv::Reader::from_reader(csv_text.as_bytes());
    let mut values = Vec::new();
    for record in reader.records() {
        let r = record.unwrap();
        for cell in r.iter() {
            let risky = cell.starts_with(['=', '+', '-', '@', '\t', '\r']);
            assert!(
                !risky || cell == "-" || cell.parse::<f64>().is_ok(),
                "a cell a spreadsheet would run: {cell:?} in {r:?}"
            );
        }
        values.push(r[6].to_owned());
    }
    assert!(values.iter().any(|v| v == "'=HYPERLINK(1)"), "{values:?}");
    assert!(values.iter().any(|v| v == "'@SUM(1)"), "{values:?}");
}

/// A tenant the ledger and the directory know nothing of is refused
/// (exit 2, nothing written): an empty report would say "nothing
/// happened" about a mistyped id. A known tenant in another spelling gets
/// the same report as in its own.
#[tokio::test]
async fn an_unknown_tenant_is_refused_and_a_known_one_in_any_spelling_reports_the_same() {
    let (db, dir) = history().await;
    let d = dir.path();
    let unknown = report(
        d,
        db.url(),
        &[
            "--format",
            "json",
            "--tenant",
            "99999999-9999-4999-8999-999999999999",
        ],
    );
    assert_eq!(unknown.status.code(), Some(2));
    assert!(unknown.stdout.is_empty());
    let err = String::from_utf8_lossy(&unknown.stderr);
    assert!(err.contains("is in no run, no hold"), "{err}");
    let as_json = |spelling: &str| {
        let out = report(d, db.url(), &["--format", "json", "--tenant", spelling]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{spelling}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut v = stdout_json(&out);
        v.as_object_mut().unwrap().remove("generated_at");
        v
    };
    let own = as_json(A);
    assert!(
        own["entities"].as_array().is_some_and(|e| !e.is_empty()),
        "{own:#}"
    );
    assert_eq!(as_json(&A.to_uppercase()), own);
}

/// RS-037: rows a legal minimum keeps past the period are counted for a
/// sweep as for an erasure: in the preview, the sweep's JSON, `runs show`
/// and the report, each equal to what PostgreSQL counts in the window.
#[tokio::test]
async fn a_sweep_counts_what_the_legal_minimum_keeps_everywhere() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(TABLES).execute(db.pool()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let policy = POLICY.replace(
        "period = \"90d\"\nlegal_min = \"20d\"",
        "period = \"10d\"\nlegal_min = \"45d\"",
    );
    assert!(policy.contains("legal_min = \"45d\""));
    std::fs::write(dir.path().join("cohort.toml"), policy).unwrap();
    let (d, url) = (dir.path(), db.url());
    assert_eq!(cohort(d, &["migrate"], url).status.code(), Some(0));
    // Contacts 5, 20, 30 and 60 days old: past the period (10 days) are
    // three, past the legal minimum (45 days) one.
    sqlx::raw_sql(
        "INSERT INTO app.contacts SELECT g, '11111111-1111-4111-8111-111111111111',
           now() - make_interval(days => g), NULL, 'c' || g || '@example.org', 'u-' || g
         FROM unnest(ARRAY[5, 20, 30, 60]) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let window: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM app.contacts WHERE created_at >= now() - interval '45 days'
           AND created_at < now() - interval '10 days'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(window, 2);

    let preview = stdout_json(&cohort(d, &["--json", "preview", "--tenant", A], url));
    let contact = entity(&preview, "Contact");
    assert_eq!(
        (&contact["affected"], &contact["kept_by_legal_min"]),
        (&Value::from(1), &Value::from(window)),
        "{preview:#}"
    );
    let run = run_at(
        &db,
        d,
        &["--json", "sweep", "--tenant", A],
        0,
        "2026-02-01 03:00:00+00",
        1.0,
    )
    .await;
    let contact = entity(&run, "Contact");
    assert_eq!(contact["affected"], 1);
    assert_eq!(contact["kept_by_legal_min"], window);
    let run_id = run["run_id"].as_str().unwrap();
    let shown = stdout_json(&cohort(d, &["--json", "runs", "show", run_id], url));
    assert_eq!(entity(&shown, "Contact")["kept_by_legal_min"], window);
    let out = report(d, url, &["--format", "json"]);
    assert_eq!(out.status.code(), Some(0));
    let doc = stdout_json(&out);
    assert_eq!(
        entity(&doc, "Contact")["kept"]["legal_minimum"],
        window,
        "{doc:#}"
    );
    // And the rows are still there, untouched.
    let untouched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM app.contacts WHERE anonymised_at IS NULL AND email IS NOT NULL",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(untouched, 3);
}

/// RS-036: a signed report and its manifest verify offline, with no
/// database and no policy file; a byte changed in the report, in the
/// manifest or in the signature, or another key, fails verification,
/// naming what changed; keys are never overwritten; a bad key writes no
/// report.
#[tokio::test]
async fn a_signed_report_verifies_offline_and_a_changed_byte_fails_it() {
    let (db, dir) = history().await;
    let d = dir.path();
    let keys = d.join("auditor");
    let out = cohort(
        d,
        &["keys", "generate", "--out", keys.to_str().unwrap()],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (private, public) = (d.join("auditor.key"), d.join("auditor.pub"));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&private).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let again = cohort(
        d,
        &["keys", "generate", "--out", keys.to_str().unwrap()],
        None,
    );
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("never overwritten"));

    for format in ["html", "json", "csv"] {
        let file = d.join(format!("q1.{format}"));
        let out = report(
            d,
            db.url(),
            &[
                "--format",
                format,
                "--output",
                file.to_str().unwrap(),
                "--sign",
                private.to_str().unwrap(),
            ],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (manifest, sig) = (
            d.join(format!("q1.{format}.manifest.json")),
            d.join(format!("q1.{format}.sig")),
        );
        let attests: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
        assert_eq!(attests["format"], "cohort-report-manifest/1");
        assert_eq!(attests["period"]["from"], "2026-01-01");
        assert_eq!(attests["report_format"], format);
        // What it attests is what the report says.
        let doc = stdout_json(&report(d, db.url(), &["--format", "json"]));
        let purged: u64 = entity(&doc, "Note")["months"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["purged"].as_u64().unwrap())
            .sum();
        let signed = attests["changed"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["entity"] == "Note" && c["strategy"] == "purge")
            .unwrap();
        assert_eq!(signed["rows"], purged);

        // Offline: another directory, no policy file, no database URL.
        let elsewhere = tempfile::tempdir().unwrap();
        let verify = |report: &Path, sig: &Path, key: &Path| {
            cohort(
                elsewhere.path(),
                &[
                    "--json",
                    "verify",
                    "--report",
                    report.to_str().unwrap(),
                    "--signature",
                    sig.to_str().unwrap(),
                    "--public-key",
                    key.to_str().unwrap(),
                ],
                None,
            )
        };
        let ok = verify(&file, &sig, &public);
        assert_eq!(
            ok.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
        assert_eq!(stdout_json(&ok)["valid"], true);

        // One byte of the report changed.
        let original = std::fs::read(&file).unwrap();
        let mut changed = original.clone();
        let at = changed.len() / 2;
        changed[at] ^= 0x01;
        std::fs::write(&file, &changed).unwrap();
        let broken = verify(&file, &sig, &public);
        assert_eq!(broken.status.code(), Some(1), "{format}");
        let why = stdout_json(&broken);
        assert_eq!(why["valid"], false);
        assert!(
            why["problem"]
                .as_str()
                .unwrap()
                .contains("was changed after signing"),
            "{why}"
        );
        std::fs::write(&file, &original).unwrap();

        // One byte of the manifest changed (a count raised by one).
        let signed_manifest = std::fs::read(&manifest).unwrap();
        let text = String::from_utf8(signed_manifest.clone()).unwrap();
        let pos = text.find("\"rows\": ").unwrap() + "\"rows\": ".len();
        let mut tampered = signed_manifest.clone();
        tampered[pos] = if tampered[pos] == b'9' {
            b'8'
        } else {
            tampered[pos] + 1
        };
        std::fs::write(&manifest, &tampered).unwrap();
        let broken = verify(&file, &sig, &public);
        assert_eq!(broken.status.code(), Some(1));
        assert!(stdout_json(&broken)["problem"]
            .as_str()
            .unwrap()
            .contains("the signature does not verify"));
        std::fs::write(&manifest, &signed_manifest).unwrap();

        // Another key does not verify it.
        let other = elsewhere.path().join("other");
        assert_eq!(
            cohort(
                elsewhere.path(),
                &["keys", "generate", "--out", other.to_str().unwrap()],
                None
            )
            .status
            .code(),
            Some(0)
        );
        let broken = verify(&file, &sig, &elsewhere.path().join("other.pub"));
        assert_eq!(broken.status.code(), Some(1));

        // Restored, it verifies again.
        assert_eq!(verify(&file, &sig, &public).status.code(), Some(0));
        // A signature file that is no signature is bad input.
        assert_eq!(
            verify(&file, &public.with_extension("nope"), &public)
                .status
                .code(),
            Some(2)
        );
    }

    // Residual copies: handler work not done, and, once the policy states
    // it, how long backups keep copies of what the period removed.
    let attests: Value =
        serde_json::from_slice(&std::fs::read(d.join("q1.json.manifest.json")).unwrap()).unwrap();
    let residual = &attests["residual_copies"];
    assert!(
        residual["handler_work"]["dead_lettered"].is_u64(),
        "{residual}"
    );
    assert!(
        residual["backups"]["statement"]
            .as_str()
            .unwrap()
            .starts_with("not stated"),
        "{residual}"
    );
    let policy = d.join("cohort.toml");
    let plain = std::fs::read_to_string(&policy).unwrap();
    std::fs::write(
        &policy,
        format!("{plain}\n[evidence]\nbackup_retention = \"35d\"\n"),
    )
    .unwrap();
    let file = d.join("q1b.json");
    let out = report(
        d,
        db.url(),
        &[
            "--format",
            "json",
            "--output",
            file.to_str().unwrap(),
            "--sign",
            private.to_str().unwrap(),
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let attests: Value =
        serde_json::from_slice(&std::fs::read(d.join("q1b.json.manifest.json")).unwrap()).unwrap();
    let backups = &attests["residual_copies"]["backups"];
    assert_eq!(backups["retention"], "35d", "{backups}");
    assert_eq!(backups["until"], "2026-05-06T00:00:00Z", "{backups}");
    assert!(
        backups["statement"]
            .as_str()
            .unwrap()
            .contains("removed up to 2026-03-31")
            && backups["statement"]
                .as_str()
                .unwrap()
                .contains("until 2026-05-06"),
        "{backups}"
    );
    // A retention of nothing is refused, as any bad policy is.
    std::fs::write(
        &policy,
        format!("{plain}\n[evidence]\nbackup_retention = \"0d\"\n"),
    )
    .unwrap();
    let out = report(d, db.url(), &["--format", "json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("backup_retention must be longer than zero")
    );
    std::fs::write(&policy, &plain).unwrap();

    // A key that cannot sign writes no report.
    let bogus = d.join("bogus.key");
    std::fs::write(&bogus, "not a key\n").unwrap();
    let file = d.join("never.html");
    let out = report(
        d,
        db.url(),
        &[
            "--output",
            file.to_str().unwrap(),
            "--sign",
            bogus.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(!file.exists());
    // `verify --report` without its signature and key is refused.
    let out = cohort(d, &["verify", "--report", file.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
}

/// The report's first section states the period's totals, each the sum of
/// the figures below it, and the page fits a 1280-pixel window: measured
/// in Chromium by a page that frames the report at that width.
#[tokio::test]
async fn the_first_section_sums_the_report_and_the_page_fits_1280_pixels() {
    let (db, dir) = history().await;
    let d = dir.path();
    let page = d.join("q1.html");
    let out = report(d, db.url(), &["--output", page.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = stdout_json(&report(d, db.url(), &["--format", "json"]));
    let html = std::fs::read_to_string(&page).unwrap();
    let glance = |name: &str| -> u64 {
        let at = html
            .find(&format!("data-glance=\"{name}\">"))
            .unwrap_or_else(|| panic!("{name} not on the page"));
        let rest = &html[at..];
        let value = &rest[rest.find('>').unwrap() + 1..rest.find('<').unwrap()];
        value.parse().unwrap()
    };
    let entities = doc["entities"].as_array().unwrap();
    let months = |measure: &str| -> u64 {
        entities
            .iter()
            .flat_map(|e| e["months"].as_array().unwrap())
            .map(|m| m[measure].as_u64().unwrap())
            .sum()
    };
    let kept = |measure: &str| -> u64 {
        entities
            .iter()
            .map(|e| e["kept"][measure].as_u64().unwrap())
            .sum()
    };
    assert_eq!(glance("removed"), months("purged") + months("archived"));
    assert!(glance("removed") > 0, "the seeded history removed rows");
    assert_eq!(glance("anonymised"), months("anonymised"));
    assert_eq!(glance("soft_deleted"), months("soft_deleted"));
    for measure in [
        "held",
        "legal_minimum",
        "null_anchor",
        "skipped",
        "kept_by_policy",
    ] {
        assert_eq!(glance(measure), kept(measure), "{measure}");
    }
    assert_eq!(
        glance("erasures"),
        doc["erasures"]["requests"].as_u64().unwrap(),
        "erasure runs, named as runs"
    );
    // Every removal is on the first page: the erasures' rows on a line of
    // their own, and requests counted as requests.
    let erased: u64 = doc["erasures"]["requests_served"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["removed"].as_u64().unwrap())
        .sum();
    assert_eq!(glance("erased"), erased);
    assert_eq!(
        glance("requests"),
        doc["erasures"]["deadlines"].as_array().unwrap().len() as u64
    );
    let failures: u64 = doc["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["count"].as_u64().unwrap())
        .sum();
    assert_eq!(glance("failures"), failures);
    // It comes first, before the chart and the entities.
    assert!(html.find("At a glance").unwrap() < html.find("Rows changed per month").unwrap());

    // In a 1280-pixel frame the page scrolls down, never sideways.
    let frame = d.join("frame.html");
    std::fs::write(
        &frame,
        "<!doctype html><body style=\"margin:0\"><iframe id=\"f\" src=\"q1.html\" \
         style=\"width:1280px;height:720px;border:0\"></iframe><script>\
         document.getElementById('f').onload = function () {\
           var e = this.contentDocument.documentElement;\
           document.body.setAttribute('data-scroll-width', String(e.scrollWidth));\
           document.body.setAttribute('data-client-width', String(e.clientWidth));\
           var wide = Array.prototype.filter.call(this.contentDocument.querySelectorAll('body *'),\
             function (x) { return x.getBoundingClientRect().right > e.clientWidth; });\
           document.body.setAttribute('data-wide', wide.slice(0, 3).map(function (x) {\
             return x.tagName + ':' + (x.textContent || '').slice(0, 60); }).join(' / '));\
         };</script></body>",
    )
    .unwrap();
    let profile = tempfile::tempdir().unwrap();
    let dom = chromium::run(
        profile.path(),
        &[
            "--allow-file-access-from-files",
            "--virtual-time-budget=5000",
            "--dump-dom",
            &format!("file://{}", frame.display()),
        ],
    );
    assert!(
        dom.status.success(),
        "{}",
        String::from_utf8_lossy(&dom.stderr)
    );
    let body = String::from_utf8_lossy(&dom.stdout);
    let attr = |name: &str| -> u64 {
        let at = body
            .find(&format!("{name}=\""))
            .unwrap_or_else(|| panic!("{name} not measured: {body}"));
        let rest = &body[at + name.len() + 2..];
        rest[..rest.find('"').unwrap()].parse().unwrap()
    };
    let (scroll, client) = (attr("data-scroll-width"), attr("data-client-width"));
    assert!(client >= 1200, "the frame is 1280 px wide: {client}");
    let wide = body
        .find("data-wide=\"")
        .map(|at| &body[at + 11..])
        .map(|rest| &rest[..rest.find('"').unwrap_or(0)])
        .unwrap_or_default();
    assert!(
        scroll <= client,
        "horizontal scroll: {scroll} > {client}: {wide}"
    );
}

/// RS-031: the report lists the erasure requests live in the period, each
/// judged against its due date, with the four counts on the first page
/// and in the JSON; a request completed before the period is not in it.
#[tokio::test]
async fn the_report_says_whether_each_erasure_request_met_its_due_date() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    sqlx::raw_sql(TABLES).execute(db.pool()).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO app.notes SELECT g, '11111111-1111-4111-8111-111111111111', timestamptz '2025-06-01', 'u-' || g
         FROM generate_series(1, 5) g",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cohort.toml"), POLICY).unwrap();
    let d = dir.path();
    let url = db.url();
    let key = [("COHORT_HASH_KEY", "an-example-hash-key-0123456789")];
    let ok = |out: Output| {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    ok(cohort(d, &["migrate"], url));
    let erase = |subject: &str, reference: &str, now: &str| {
        ok(cli::cohort_with_env(
            d,
            &[
                "erase",
                "--tenant",
                A,
                "--subject",
                subject,
                "--kind",
                "user",
                "--reference",
                reference,
                "--now",
                now,
            ],
            url,
            &key,
        ))
    };
    for record in ["3", "4", "5"] {
        ok(cohort(
            d,
            &[
                "holds", "create", "--entity", "Note", "--record", record, "--tenant", A,
                "--reason", "claim",
            ],
            url,
        ));
    }
    erase("u-1", "SAR-BEFORE", "2025-11-01T00:00:00Z");
    erase("u-2", "SAR-ON", "2026-01-05T00:00:00Z");
    erase("u-3", "SAR-LATE", "2026-01-02T00:00:00Z");
    erase("u-4", "SAR-OVERDUE", "2026-01-10T00:00:00Z");
    erase("u-5", "SAR-LATER", "2026-03-20T00:00:00Z");
    // SAR-LATE completed on 1 March, as a resumed attempt at that time
    // would have left it (its due date was 1 February).
    sqlx::raw_sql(
        "UPDATE retention.erasure_request SET state = 'completed', completed_at = '2026-03-01',
           subject_text = NULL, waiting = '[]' WHERE reference = 'SAR-LATE'",
    )
    .execute(db.pool())
    .await
    .unwrap();

    let out = ok(report(d, url, &["--format", "json"]));
    let doc = stdout_json(&out);
    let x = &doc["erasures"];
    let judged: Vec<(String, String)> = x["deadlines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["reference"].as_str().unwrap().to_owned(),
                r["timely"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        judged,
        [
            ("SAR-LATE".into(), "late".into()),
            ("SAR-ON".into(), "on_time".into()),
            ("SAR-OVERDUE".into(), "overdue".into()),
            ("SAR-LATER".into(), "not_yet_due".into()),
        ]
    );
    assert_eq!(
        x["timeliness"],
        serde_json::json!({"on_time": 1, "late": 1, "overdue": 1, "not_yet_due": 1})
    );
    assert!(
        !out.stdout.windows(3).any(|w| w == b"u-2"),
        "a subject in the report"
    );
    let html = String::from_utf8(ok(report(d, url, &["--format", "html"])).stdout).unwrap();
    for (glance, n) in [
        ("requests_on_time", 1),
        ("requests_late", 1),
        ("requests_overdue", 1),
    ] {
        assert!(
            html.contains(&format!("data-glance=\"{glance}\">{n}</strong>")),
            "{glance}"
        );
    }
    // Another tenant's report has none of them.
    let other = stdout_json(&ok(report(d, url, &["--format", "json", "--tenant", B])));
    assert_eq!(other["erasures"]["deadlines"], serde_json::json!([]));
}

/// RS-035: `cohort verify` walks the ledger's hash chain (exit 0 intact, 1
/// broken with the first broken record named, 2 on bad input), and the
/// report carries the chain's heads and whether it verified when read.
#[tokio::test]
async fn verify_names_a_changed_count_and_the_report_states_the_chain() {
    let (db, dir) = history().await;
    let d = dir.path();
    let url = db.url();
    let out = cohort(d, &["--json", "verify"], url);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let walked = stdout_json(&out);
    assert_eq!(walked["intact"], true);
    assert!(
        walked["records_checked"].as_u64().unwrap() >= 7,
        "{walked:#}"
    );
    let head = format!(
        "{}:{}",
        walked["head"]["link_id"],
        walked["head"]["link"].as_str().unwrap()
    );
    let text = cohort(d, &["verify"], url);
    assert_eq!(text.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&text.stdout).contains("The chain is intact."));

    // The report states the chain: its head now, its head at the end of
    // the period, and that it verified.
    let doc = stdout_json(&report(d, url, &["--format", "json"]));
    assert_eq!(doc["chain"]["verified"], true, "{:#}", doc["chain"]);
    assert_eq!(doc["chain"]["head"]["link_id"], walked["head"]["link_id"]);
    let at_end = doc["chain"]["head_at_period_end"]["link_id"]
        .as_i64()
        .unwrap();
    assert!(at_end > 1 && at_end <= walked["head"]["link_id"].as_i64().unwrap());
    let html = String::from_utf8(report(d, url, &["--format", "html"]).stdout).unwrap();
    assert!(html.contains("verified: intact when this report was read"));
    assert!(html.contains(&head));
    // Signed, the manifest carries the head.
    let keys = d.join("auditor");
    assert_eq!(
        cohort(
            d,
            &["keys", "generate", "--out", keys.to_str().unwrap()],
            None
        )
        .status
        .code(),
        Some(0)
    );
    let file = d.join("q1.json");
    let signed = report(
        d,
        url,
        &[
            "--format",
            "json",
            "--output",
            file.to_str().unwrap(),
            "--sign",
            d.join("auditor.key").to_str().unwrap(),
        ],
    );
    assert_eq!(signed.status.code(), Some(0));
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(d.join("q1.json.manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["chain"]["head"], head.as_str());
    assert_eq!(manifest["chain"]["verified_at_generation"], true);
    // The head recorded, checked again.
    assert_eq!(
        cohort(d, &["verify", "--head", &head], url).status.code(),
        Some(0)
    );

    // One count changed by hand: exit 1, the run and the field named.
    let run_id: String = sqlx::query_scalar(
        "UPDATE retention.sweep_run_entity_summary SET affected_count = affected_count + 5 \
         WHERE summary_id = (SELECT min(summary_id) FROM retention.sweep_run_entity_summary \
                             WHERE affected_count > 0) RETURNING run_id::text",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let broken = cohort(d, &["verify"], url);
    assert_eq!(broken.status.code(), Some(1));
    let err = String::from_utf8_lossy(&broken.stderr);
    assert!(
        err.contains(&format!("run {run_id} (link "))
            && err.contains("changed")
            && err.contains("affected_count"),
        "{err}"
    );
    let json = stdout_json(&cohort(d, &["--json", "verify"], url));
    assert_eq!(json["intact"], false);
    assert_eq!(json["breaks"][0]["kind"], "changed");
    assert_eq!(json["breaks"][0]["record"], format!("run {run_id}"));
    let doc = stdout_json(&report(d, url, &["--format", "json"]));
    assert_eq!(doc["chain"]["verified"], false);
    let html = String::from_utf8(report(d, url, &["--format", "html"]).stdout).unwrap();
    assert!(html.contains("NOT intact"));

    // Bad input: exit 2, nothing read.
    for args in [
        &["verify", "--head", "12"][..],
        &["verify", "--head", "3:xyz"],
        &["verify", "--head", &head, "--report", "x.html"],
    ] {
        let out = cohort(d, args, url);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    let empty = cohort_pgtemp::fresh_empty_database().await.unwrap();
    let out = cohort(d, &["verify"], empty.url());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cohort migrate"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// docs/report.md, "How an auditor checks this report": its shell blocks,
/// run as written (`sh -e` scripts, `cohort` on the PATH) on a real
/// ledger: the operator's (steps 1 and 2) beside the policy file, the
/// auditor's (3 and 5) in a directory of their own holding only what the
/// auditor receives, as a role that can only read Cohort's tables, with
/// no policy file and no key (RS-046); then the same steps fail when the
/// ledger is changed.
#[tokio::test]
async fn the_auditors_steps_in_the_guide_run_as_written() {
    let guide =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/report.md"))
            .unwrap();
    let section = guide
        .split("## How an auditor checks this report")
        .nth(1)
        .expect("the section")
        .split("\n## ")
        .next()
        .unwrap();
    let blocks: Vec<String> = section
        .split("```sh\n")
        .skip(1)
        .map(|block| {
            let code = block.split("```").next().unwrap();
            code.lines()
                .map(|l| format!("{}\n", l.trim_start()))
                .collect()
        })
        .collect();
    assert_eq!(blocks.len(), 4, "{blocks:?}");
    assert!(blocks[0].contains("cohort keys generate"), "{}", blocks[0]);
    assert!(blocks[1].contains("--sign signing.key"), "{}", blocks[1]);
    let operator = format!("set -e\n{}{}", blocks[0], blocks[1]);
    let auditor = format!("set -e\n{}{}", blocks[2], blocks[3]);
    assert!(auditor.contains("cohort verify --report"), "{auditor}");
    assert!(auditor.contains("cohort verify --schema"), "{auditor}");
    let (db, dir) = history().await;
    let d = dir.path();
    // The auditor's role reads Cohort's tables and nothing else.
    // Roles are the cluster's: a name of this test's own.
    let role = format!("auditor_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'auditor-pw';
         GRANT USAGE ON SCHEMA retention TO {role};
         GRANT SELECT ON ALL TABLES IN SCHEMA retention TO {role};"
    )))
    .execute(db.pool())
    .await
    .unwrap();
    assert!(db.url().contains('?'), "{}", db.url());
    let auditor_url = format!("{}&user={role}&password=auditor-pw", db.url());
    let bin = Path::new(env!("CARGO_BIN_EXE_cohort")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sh = |script: &str, dir: &Path, url: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .env_clear()
            .env("PATH", &path)
            .env("DATABASE_URL", url)
            .env("HOME", dir)
            .output()
            .unwrap()
    };
    let ran = |what: &str, script: &str, out: &std::process::Output| {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{what}:\n{script}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let out = sh(&operator, d, db.url());
    ran("the operator's steps", &operator, &out);
    let away = tempfile::tempdir().unwrap();
    let a = away.path();
    for f in [
        "q1.html",
        "q1.html.sig",
        "q1.html.manifest.json",
        "signing.pub",
    ] {
        std::fs::copy(d.join(f), a.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
    let out = sh(&auditor, a, &auditor_url);
    ran("the auditor's steps", &auditor, &out);
    assert!(!a.join("cohort.toml").exists());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("The chain is intact."), "{said}");
    // A count changed afterwards: the last step fails, naming the run.
    sqlx::query(
        "UPDATE retention.sweep_run_entity_summary SET held_count = held_count + 1 \
         WHERE summary_id = (SELECT max(summary_id) FROM retention.sweep_run_entity_summary)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let out = sh(&format!("set -e\n{}", blocks[3]), a, &auditor_url);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("held_count"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// RS-044: a signed report binds its file name, period, tenant and policy
/// digest: `verify --report` prints them, and fails another period's
/// report renamed to this one, a report of another period or tenant than
/// asked, and `report --sign` refuses a broken chain unless told to sign
/// it anyway, which the manifest then says.
#[tokio::test]
async fn a_signed_report_is_bound_to_its_name_period_and_tenant_and_a_broken_chain_is_not_signed_silently(
) {
    let (db, dir) = history().await;
    let d = dir.path();
    let url = db.url();
    let keys = d.join("auditor");
    assert_eq!(
        cohort(
            d,
            &["keys", "generate", "--out", keys.to_str().unwrap()],
            None
        )
        .status
        .code(),
        Some(0)
    );
    let private = d.join("auditor.key");
    let public = d.join("auditor.pub");
    let sign = |name: &str, from: &str, to: &str| {
        let file = d.join(name);
        let out = cohort(
            d,
            &[
                "report",
                "--from",
                from,
                "--to",
                to,
                "--format",
                "json",
                "--output",
                file.to_str().unwrap(),
                "--sign",
                private.to_str().unwrap(),
            ],
            url,
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        file
    };
    let q1 = sign("q1.json", "2026-01-01", "2026-03-31");
    let verify = |file: &Path, extra: &[&str]| {
        let mut args = vec!["verify", "--report", file.to_str().unwrap(), "--signature"];
        let sig = format!("{}.sig", file.display());
        args.push(&sig);
        args.push("--public-key");
        args.push(public.to_str().unwrap());
        args.extend_from_slice(extra);
        cohort(d, &args, None)
    };
    let ok = verify(&q1, &["--period", "2026-01-01..2026-03-31"]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let said = String::from_utf8_lossy(&ok.stdout);
    for line in [
        "file: q1.json",
        "period: 2026-01-01 to 2026-03-31",
        "tenant: all tenants",
        "policy file sha256: ",
        "chain head: ",
    ] {
        assert!(said.contains(line), "{line} in {said}");
    }
    // Asked for another period or a tenant: exit 1, the difference named.
    let other = verify(&q1, &["--period", "2026-04-01..2026-06-30"]);
    assert_eq!(other.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&other.stderr).contains("not 2026-04-01 to 2026-06-30"));
    let tenant = verify(&q1, &["--tenant", "aaaaaaaa-0000-0000-0000-00000000000a"]);
    assert_eq!(tenant.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&tenant.stderr).contains("all tenants"));
    assert_eq!(
        verify(&q1, &["--period", "2026-01-01"]).status.code(),
        Some(2)
    );

    // Another period's three files renamed to q1's name.
    let q2 = sign("q2.json", "2026-04-01", "2026-06-30");
    let fake = tempfile::tempdir().unwrap();
    let renamed = fake.path().join("q1.json");
    for (from, to) in [
        ("", ""),
        (".sig", ".sig"),
        (".manifest.json", ".manifest.json"),
    ] {
        std::fs::copy(
            format!("{}{from}", q2.display()),
            format!("{}{to}", renamed.display()),
        )
        .unwrap();
    }
    let presented = verify(&renamed, &[]);
    assert_eq!(presented.status.code(), Some(1));
    let err = String::from_utf8_lossy(&presented.stderr);
    assert!(err.contains("of q2.json, not q1.json"), "{err}");

    // A tenant's report: --tenant in any spelling of that tenant holds
    // (braced, upper case), another tenant does not.
    let of_a = d.join("q1-a.json");
    let out = cohort(
        d,
        &[
            "report",
            "--from",
            "2026-01-01",
            "--to",
            "2026-03-31",
            "--tenant",
            A,
            "--format",
            "json",
            "--output",
            of_a.to_str().unwrap(),
            "--sign",
            private.to_str().unwrap(),
        ],
        url,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let braced = format!("{{{}}}", A.to_uppercase());
    let same = verify(&of_a, &["--tenant", &braced]);
    assert_eq!(
        same.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&same.stderr)
    );
    let other = verify(&of_a, &["--tenant", B]);
    assert_eq!(other.status.code(), Some(1));

    // A broken chain: not signed (exit 1, nothing written) unless asked,
    // and then the manifest says so and verify repeats it.
    sqlx::query(
        "UPDATE retention.sweep_run_entity_summary SET affected_count = affected_count + 5 \
         WHERE summary_id = (SELECT min(summary_id) FROM retention.sweep_run_entity_summary \
                             WHERE affected_count > 0)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    let broken = d.join("broken.json");
    let args = [
        "report",
        "--from",
        "2026-01-01",
        "--to",
        "2026-03-31",
        "--format",
        "json",
        "--output",
        broken.to_str().unwrap(),
        "--sign",
        private.to_str().unwrap(),
    ];
    let refused = cohort(d, &args, url);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--sign-broken-chain"));
    assert!(!broken.exists() && !d.join("broken.json.sig").exists());
    let mut anyway = args.to_vec();
    anyway.push("--sign-broken-chain");
    let signed = cohort(d, &anyway, url);
    assert_eq!(
        signed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&signed.stderr)
    );
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(d.join("broken.json.manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["signed_broken_chain"], true);
    assert_eq!(manifest["chain"]["verified_at_generation"], false);
    let checked = verify(&broken, &[]);
    assert_eq!(checked.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&checked.stdout).contains("did not verify"));

    // A period without runs says so.
    let empty = cohort(
        d,
        &[
            "report",
            "--from",
            "2020-01-01",
            "--to",
            "2020-01-31",
            "--format",
            "json",
        ],
        url,
    );
    assert_eq!(empty.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&empty.stderr).contains("no run settled"));
    // Written to a file, stdout says what the file holds (issue 55, B2).
    let file = d.join("empty.html");
    let empty = cohort(
        d,
        &[
            "report",
            "--from",
            "2020-01-01",
            "--to",
            "2020-01-31",
            "--output",
            file.to_str().unwrap(),
        ],
        url,
    );
    assert_eq!(empty.status.code(), Some(0));
    let said = String::from_utf8_lossy(&empty.stdout);
    assert!(
        said.contains("empty.html (html, 2020-01-01 to 2020-01-31, all tenants): no run settled in the period"),
        "{said}"
    );
    assert!(file.exists());
}
