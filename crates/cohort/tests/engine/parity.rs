//! RS-001: a policy file drives everything the derive can. Every key the
//! derive accepts is listed with the policy-file key that says the same
//! (read from the macro's own symbol table, so a new derive key without a
//! policy equivalent fails here), and types using all of them validate to
//! the same model as one policy file, against the same tables.
//!
//! The one thing a file cannot say is `#[anonymise(with = "path::to::fn")]`:
//! it names a Rust function, which only compiled code can call. A file
//! reaches the static methods (`null`, `empty`, `literal`, `hash`).

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use chrono::{DateTime, Utc};
use cohort::policy::PolicyFile;
use cohort::Cohort;
use support::*;
use uuid::Uuid;

/// Each derive key, and how a policy file says it.
const PARITY: &[(&str, &str)] = &[
    // Attribute names.
    ("retain", "[[entity]]"),
    ("anonymise", "anonymise = { column = method }"),
    ("erasure_subject", "subjects = [...]"),
    ("exempt_from_retention", "exempt = \"reason\""),
    ("sqlx", "table (the derive reads the ORM's table name)"),
    ("sea_orm", "table (the derive reads the ORM's table name)"),
    ("diesel", "table (the derive reads the ORM's table name)"),
    // Struct keys.
    ("category", "category"),
    (
        "anchor",
        "anchor (the column, where the derive names the field)",
    ),
    ("id", "id"),
    ("table", "table"),
    ("schema", "table = \"schema.table\""),
    ("name", "name"),
    ("tenantless", "tenantless = true"),
    ("partitions", "partitions"),
    ("sweep_parallelism", "sweep_parallelism"),
    ("audit", "audit"),
    ("archive", "archive_table"),
    ("anonymise_on_archive", "archive_anonymise = true"),
    // Field keys.
    (
        "not_archived",
        "archive_columns = [...] (the columns archived, without it)",
    ),
    ("column", "the column's own name wherever a column is named"),
    ("record_id", "record_id"),
    ("tenant", "tenant"),
    ("soft_delete", "soft_delete"),
    ("deleted_at", "deleted_at"),
    ("anonymised_at", "anonymised_at"),
    ("not_tenant", "not_tenant = [\"column\"]"),
    // Anonymise methods and the subject kind.
    ("null", "\"null\""),
    ("empty", "\"empty\""),
    ("literal", "{ literal = \"...\" }"),
    ("hash", "\"hash\""),
    (
        "with",
        "not expressible: it names a Rust function; use a static method",
    ),
    ("kind", "{ column = \"...\", kind = \"...\" }"),
];

#[test]
fn every_derive_key_has_a_policy_file_equivalent() {
    let symbols = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../cohort-macros/src/attr/symbols.rs"),
    )
    .unwrap();
    let keys: Vec<&str> = symbols
        .split("Symbol(\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .collect();
    assert!(keys.len() > 20, "{keys:?}");
    let missing: Vec<&&str> = keys
        .iter()
        .filter(|k| !PARITY.iter().any(|(d, _)| d == *k))
        .collect();
    assert!(
        missing.is_empty(),
        "derive keys with no policy-file equivalent listed: {missing:?}"
    );
    let stale: Vec<&str> = PARITY
        .iter()
        .map(|(d, _)| *d)
        .filter(|d| !keys.contains(d))
        .collect();
    assert!(
        stale.is_empty(),
        "listed keys the derive no longer has: {stale:?}"
    );
}

#[derive(cohort::Retained)]
#[retain(
    category = "parity",
    anchor = "made",
    id = "7d4c1e2a-3b5f-4a6e-8c9d-0e1f2a3b4c5d",
    schema = "app",
    table = "parity_docs",
    name = "ParityDoc",
    audit = "per_row"
)]
#[allow(dead_code)]
struct ParityDocRow {
    #[retain(record_id)]
    key: i64,
    #[retain(tenant)]
    org: Uuid,
    made: DateTime<Utc>,
    #[retain(soft_delete)]
    gone: bool,
    #[retain(deleted_at)]
    gone_at: Option<DateTime<Utc>>,
    #[retain(anonymised_at)]
    scrubbed: Option<DateTime<Utc>>,
    #[anonymise(null)]
    email: Option<String>,
    #[anonymise(empty)]
    full_name: String,
    #[anonymise(literal = "[redacted]")]
    phone: String,
    #[anonymise(hash)]
    reference: String,
    #[erasure_subject(kind = "user")]
    #[retain(column = "owner")]
    owner_id: Uuid,
}

#[derive(cohort::Retained)]
#[retain(
    category = "parity-events",
    anchor = "made",
    id = "8e5d2f3b-4c6a-4b7f-9d0e-1f2a3b4c5d6e",
    table = "parity_events",
    tenantless,
    partitions = "drop"
)]
#[allow(dead_code)]
struct ParityEvent {
    id: i64,
    made: DateTime<Utc>,
    #[retain(not_tenant)]
    org_id: Option<i64>,
}

#[derive(cohort::Retained)]
#[retain(
    category = "parity-logs",
    anchor = "made",
    id = "0a7f4b5d-6e8c-4d9b-9f2a-3b4c5d6e7f80",
    table = "app.parity_logs",
    archive = "app.parity_logs_archive",
    anonymise_on_archive,
    sweep_parallelism = 2
)]
#[allow(dead_code)]
struct ParityLog {
    id: i64,
    tenant_id: Uuid,
    made: DateTime<Utc>,
    #[anonymise(null)]
    ip: Option<String>,
    #[retain(not_archived)]
    search: Option<String>,
}

#[derive(cohort::Retained)]
#[exempt_from_retention("kept for the auditors")]
#[retain(id = "9f6e3a4c-5d7b-4c8a-8e1f-2a3b4c5d6e7f", table = "parity_archive")]
#[allow(dead_code)]
struct ParityArchive {
    id: i64,
}

const TABLES: &str = "
CREATE SCHEMA app;
CREATE TABLE app.parity_docs (key bigint PRIMARY KEY, org uuid NOT NULL, made timestamptz,
    gone boolean NOT NULL DEFAULT false, gone_at timestamptz, scrubbed timestamptz,
    email text, full_name text NOT NULL, phone text NOT NULL, reference text NOT NULL, owner uuid NOT NULL);
CREATE INDEX ON app.parity_docs (org, made);
CREATE TABLE public.parity_events (id bigint NOT NULL, made timestamptz NOT NULL, org_id bigint,
    PRIMARY KEY (id, made)) PARTITION BY RANGE (made);
CREATE TABLE public.parity_events_2026 PARTITION OF public.parity_events
    FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
CREATE TABLE public.parity_archive (id bigint PRIMARY KEY);
CREATE TABLE app.parity_logs (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, made timestamptz,
    ip text, search text);
CREATE INDEX ON app.parity_logs (tenant_id, made);
CREATE TABLE app.parity_logs_archive (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, made timestamptz,
    ip text, archived_at timestamptz NOT NULL, run_id uuid NOT NULL);
";

const POLICY: &str = r#"
[[category]]
name = "parity"
strategies = ["anonymise", "soft_delete"]
strategy = "anonymise"
period = "30d"

[[category]]
name = "parity-events"
strategy = "purge"
period = "90d"

[[entity]]
name = "ParityDoc"
id = "7d4c1e2a-3b5f-4a6e-8c9d-0e1f2a3b4c5d"
table = "app.parity_docs"
category = "parity"
anchor = "made"
audit = "per_row"
record_id = "key"
tenant = "org"
soft_delete = "gone"
deleted_at = "gone_at"
anonymised_at = "scrubbed"
anonymise = { email = "null", full_name = "empty", phone = { literal = "[redacted]" }, reference = "hash" }
subjects = [{ column = "owner", kind = "user" }]

[[entity]]
name = "ParityEvent"
id = "8e5d2f3b-4c6a-4b7f-9d0e-1f2a3b4c5d6e"
table = "parity_events"
category = "parity-events"
anchor = "made"
tenantless = true
not_tenant = ["org_id"]
partitions = "drop"

[[category]]
name = "parity-logs"
strategy = "archive"
period = "1y"

[[entity]]
name = "ParityLog"
id = "0a7f4b5d-6e8c-4d9b-9f2a-3b4c5d6e7f80"
table = "app.parity_logs"
category = "parity-logs"
anchor = "made"
anonymise = { ip = "null" }
archive_table = "app.parity_logs_archive"
archive_columns = ["id", "tenant_id", "made", "ip"]
archive_anonymise = true
sweep_parallelism = 2

[[entity]]
name = "ParityArchive"
id = "9f6e3a4c-5d7b-4c8a-8e1f-2a3b4c5d6e7f"
table = "parity_archive"
exempt = "kept for the auditors"
"#;

/// What a model says about its entities, leaving out only where each
/// declaration came from (the derive also records its fields' Rust types).
fn meaning(model: &cohort::validate::ValidatedModel) -> Vec<String> {
    let mut out: Vec<String> = model
        .ordered()
        .map(|e| {
            let mut e = e.clone();
            e.origin = cohort::model::Origin::Code;
            e.declared_columns = None;
            e.marker_resolution.clear();
            format!("{e:?}")
        })
        .collect();
    out.extend(model.exempt.iter().map(|e| format!("exempt {e:?}")));
    out
}

#[db_test(migrated)]
async fn types_using_every_key_and_one_policy_file_validate_to_the_same_model(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    let policy = PolicyFile::parse(POLICY).unwrap();
    let rules = policy.rules.clone();
    let mut config = test_config();
    config.hash_key = Some(cohort::config::HashKey::new(TEST_HASH_KEY));
    let from_types = Cohort::builder(db.pool().clone())
        .config(config.clone())
        .rules(rules)
        .entity::<ParityDocRow>()
        .entity::<ParityEvent>()
        .entity::<ParityLog>()
        .entity::<ParityArchive>()
        .build()
        .await
        .unwrap();
    let mut policy = policy;
    policy.config = config;
    let from_file = Cohort::builder(db.pool().clone())
        .policy(policy)
        .build()
        .await
        .unwrap();
    let a = meaning(&from_types.ready().await.unwrap());
    let b = meaning(&from_file.ready().await.unwrap());
    assert_eq!(a.len(), 4, "{a:#?}");
    assert_eq!(a, b);
}
