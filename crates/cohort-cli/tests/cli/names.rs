//! Class A of the operations review: what `cohort init` writes is what
//! Cohort sweeps, for any identifier PostgreSQL allows. Each hostile table
//! is classified in the written file as a person would (uncommenting
//! init's proposals) and swept; every other table must be unchanged, by
//! digest.
use crate::support::cli;
use crate::support::scenario::{json, succeeded};

use cli::cohort;
use std::collections::BTreeMap;
use std::process::Output;

use serde_json::Value;
use sqlx::{AssertSqlSafe, PgPool, Row};

fn json_of(out: &Output) -> Value {
    succeeded(out);
    json(out)
}

/// Tables whose names break naive quoting, splitting or casing, in
/// `public` (the schema init reads) and one decoy in schema `a` that a
/// dotted name could be misread as.
const HOSTILE: &[&str] = &[
    "a.b",
    "we\"ird name",
    "_",
    "é",
    "order_lines",
    "order-lines",
    "Order_Lines",
    "select",
    "Space Table",
    "x.y.z",
    "$dollar",
    "UPPER",
];

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A TOML basic string, as init writes one.
fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

async fn digests(pool: &PgPool) -> BTreeMap<String, String> {
    let tables: Vec<(String, String)> = sqlx::query_as(
        "SELECT n.nspname::text, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind = 'r' AND n.nspname IN ('public', 'a') AND c.relname NOT LIKE 'sweep%' \
           AND c.relname NOT LIKE 'retention%' AND c.relname NOT LIKE 'cohort%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut out = BTreeMap::new();
    for (schema, table) in tables {
        let sql = format!(
            "SELECT count(*)::text || ':' || COALESCE(md5(string_agg(t::text, ',' ORDER BY t::text)), '') FROM {}.{} t",
            quote(&schema),
            quote(&table)
        );
        let digest: String = sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(pool)
            .await
            .unwrap();
        out.insert(format!("{schema}.{table}"), digest);
    }
    out
}

/// The written file with the entity of `path` classified: `exempt`
/// replaced by a category, init's anchor, tenancy and record-key lines
/// uncommented, and a purge category added.
fn classify(text: &str, path: &str) -> String {
    let table_line = format!("table = {}", toml_string(path));
    let mut blocks: Vec<String> = text.split("\n[[entity]]\n").map(str::to_owned).collect();
    let index = blocks
        .iter()
        .position(|b| b.lines().any(|l| l == table_line))
        .unwrap_or_else(|| panic!("no entity with {table_line} in:\n{text}"));
    let block: Vec<String> = blocks[index]
        .lines()
        .filter(|l| !l.starts_with("exempt = "))
        .map(|l| {
            let uncommented = l.strip_prefix("# ").unwrap_or(l);
            let key = uncommented.split(' ').next().unwrap_or("");
            if matches!(key, "anchor" | "tenantless" | "record_id") {
                uncommented
                    .split("  ")
                    .next()
                    .unwrap()
                    .trim_end()
                    .to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect();
    blocks[index] = format!("{}\ncategory = \"purge-old\"", block.join("\n"));
    format!(
        "{}\n\n[[category]]\nname = \"purge-old\"\nstrategy = \"purge\"\nperiod = \"30d\"\n",
        blocks.join("\n[[entity]]\n")
    )
}

#[tokio::test]
async fn init_classify_and_sweep_touch_exactly_the_table_that_was_classified() {
    let db = cohort_pgtemp::fresh_empty_database().await.unwrap();
    let pool = db.pool();
    let mut ddl = String::from(
        "CREATE SCHEMA a; CREATE TABLE a.b (id bigint PRIMARY KEY, created_at timestamptz NOT NULL);\n",
    );
    for name in HOSTILE {
        ddl.push_str(&format!(
            "CREATE TABLE public.{} (id bigint PRIMARY KEY, created_at timestamptz NOT NULL);\n",
            quote(name)
        ));
    }
    // No primary key, but a UNIQUE NOT NULL column: proposed as the record key.
    ddl.push_str(
        "CREATE TABLE public.keyed (code text NOT NULL UNIQUE, created_at timestamptz NOT NULL);\n",
    );
    sqlx::raw_sql(AssertSqlSafe(ddl))
        .execute(pool)
        .await
        .unwrap();
    let mut seed = String::new();
    for table in HOSTILE
        .iter()
        .map(|n| format!("public.{}", quote(n)))
        .chain(["a.b".to_owned()])
    {
        seed.push_str(&format!(
            "INSERT INTO {table} SELECT g, now() - (CASE WHEN g <= 5 THEN 400 ELSE 1 END) * interval '1 day' FROM generate_series(1, 10) g;\n"
        ));
    }
    seed.push_str("INSERT INTO public.keyed SELECT 'k' || g, now() - (CASE WHEN g <= 5 THEN 400 ELSE 1 END) * interval '1 day' FROM generate_series(1, 10) g;\n");
    sqlx::raw_sql(AssertSqlSafe(seed))
        .execute(pool)
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let written = json_of(&cohort(
        dir.path(),
        &[
            "--json",
            "init",
            "--schema",
            "public",
            "--output",
            "cohort.toml",
        ],
        db.url(),
    ));
    assert_eq!(written["entities"], HOSTILE.len() + 1);
    let text = std::fs::read_to_string(dir.path().join("cohort.toml")).unwrap();
    // The newcomer's order: init, then migrate, which installs Cohort's
    // tables in the schema the file names (`cohort`, apart from `public`).
    let migrated = json_of(&cohort(dir.path(), &["--json", "migrate"], db.url()));
    assert_eq!(migrated["schema"], "cohort", "{migrated}");

    // Written as PostgreSQL quotes: one unambiguous path per table, no `schema` key.
    assert!(text.contains(r#"table = "public.\"a.b\"""#), "{text}");
    assert!(text.contains(r#"table = "public.order_lines""#), "{text}");
    assert!(text.contains(r#"table = "public.\"select\"""#), "{text}");
    let entities = text.split_once("\n[[entity]]\n").expect("entities").1;
    assert!(
        !entities.lines().any(|l| l.starts_with("schema = ")),
        "{text}"
    );
    assert!(text.contains("# record_id = \"code\""), "{text}");
    // Distinct, non-empty display names.
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .map(|l| l.trim_end_matches('"'))
        .collect();
    assert_eq!(names.len(), HOSTILE.len() + 1, "{text}");
    let mut distinct = names.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), names.len(), "{names:?}");
    assert!(names.iter().all(|n| !n.is_empty()), "{names:?}");

    // The file validates as written.
    let report = json_of(&cohort(dir.path(), &["--json", "validate"], db.url()));
    assert_eq!(report["valid"], true, "{report}");

    let paths: Vec<String> = sqlx::query(
        "SELECT pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) AS p \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname NOT LIKE 'sweep%' \
           AND c.relname NOT LIKE 'retention%' AND c.relname NOT LIKE 'cohort%' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|r| r.get("p"))
    .collect();
    assert_eq!(paths.len(), HOSTILE.len() + 1, "{paths:?}");
    for path in &paths {
        let before = digests(pool).await;
        std::fs::write(dir.path().join("classified.toml"), classify(&text, path)).unwrap();
        let args = ["--json", "--config", "classified.toml"];
        let report = json_of(&cohort(
            dir.path(),
            &[&args[..], &["validate"]].concat(),
            db.url(),
        ));
        assert_eq!(report["valid"], true, "{path}: {report}");
        let swept = json_of(&cohort(
            dir.path(),
            &[&args[..], &["sweep", "--tenantless"]].concat(),
            db.url(),
        ));
        assert_eq!(swept["status"], "succeeded", "{path}: {swept}");
        let after = digests(pool).await;
        let changed: Vec<&String> = before
            .keys()
            .filter(|k| before.get(*k) != after.get(*k))
            .collect();
        assert_eq!(changed.len(), 1, "{path}: changed {changed:?}");
        let left: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {path}")))
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(
            left, 5,
            "{path}: the five old rows went, the new ones stayed"
        );
    }
    // The decoy a.b was never touched.
    let decoy: i64 = sqlx::query_scalar("SELECT count(*) FROM a.b")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(decoy, 10);
}

#[tokio::test]
async fn a_schema_with_a_dotted_table_or_an_unquoted_upper_case_name_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let entity = |lines: &str| {
        format!(
            "[[entity]]\nname = \"E\"\nid = \"a3f467fe-c5d0-4f17-9897-83c373cc1dc8\"\n{lines}\nexempt = \"x\"\n"
        )
    };
    for (lines, expected) in [
        ("schema = \"public\"\ntable = \"a.b\"", "ambiguous"),
        ("schema = \"app\"\ntable = \"app.notes\"", "ambiguous"),
        (
            "table = \"Orders\"",
            "would be read by PostgreSQL as \\\"orders\\\"",
        ),
        ("table = \"app.Notes\"", "write it quoted"),
    ] {
        std::fs::write(dir.path().join("cohort.toml"), entity(lines)).unwrap();
        // No database is reached: the file is refused when it is loaded.
        let out = cohort(
            dir.path(),
            &["--json", "validate"],
            "postgres://nobody@127.0.0.1:1/none",
        );
        assert_eq!(out.status.code(), Some(2), "{lines}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(text.contains(expected), "{lines}: {text}");
    }
}
