//! What would fail or harm every run is refused before anything is
//! written: a typed error, and nothing changed. A policy file with hostile
//! identifiers is refused at load, before any SQL exists. A model whose
//! tenant columns disagree, whose record keys lack a valid immediate
//! unique index, whose key columns compare loosely, whose anonymised
//! columns are referenced or too narrow for what is written, whose
//! constant scrubs hit a unique column, whose cascades loop back, or that
//! names Cohort's own tables or PostgreSQL's schemas is refused at
//! startup, every problem listed. A handle not yet ready, a bad request, a
//! hash with no key, and a rule the provider did not declare are refused
//! at run time, before the run's rows are touched.

use crate::hostile::POLICY;
use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::async_trait;
use cohort::config::HashKey;
use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::policy::PolicyFile;
use cohort::rules::{
    CategoryCapabilities, ResolutionContext, ResolveError, RetentionRule, RuleProvider, Strategy,
};
use cohort::{Cohort, Error, RunStatus, SweepRequest};
use support::*;

// --- At load: the policy file

/// Hostile identifiers in a policy file are refused at load, before any
/// SQL exists, with the offending entry named.
#[test]
fn hostile_identifiers_in_a_policy_are_refused_at_load() {
    for (what, text) in [
        (
            "schema",
            POLICY.replace("schema = \"retention\"", "schema = \"\""),
        ),
        (
            "period",
            POLICY.replace("period = \"30d\"", "period = \"30d; DROP\""),
        ),
        (
            "strategy",
            POLICY.replace("strategy = \"purge\"", "strategy = \"purge'--\""),
        ),
        (
            "audit",
            POLICY.replace("audit = \"per_row\"", "audit = \"all\\u0000\""),
        ),
        (
            "batch",
            POLICY.replace("sweep_batch_size = 500", "sweep_batch_size = -1"),
        ),
        (
            "batch",
            POLICY.replace(
                "sweep_batch_size = 500",
                "sweep_batch_size = 99999999999999",
            ),
        ),
    ] {
        let Err(err) = PolicyFile::parse(&text) else {
            panic!("{what}: accepted");
        };
        assert!(err.kind().is_bad_input(), "{what}: {err}");
        assert!(!err.to_string().is_empty(), "{what}");
    }
}

// --- At startup: validation lists every problem

/// A: tenant columns that give one spelling different meanings are refused.
#[db_test(migrated)]
async fn tenant_columns_of_different_types_are_refused(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz);
         CREATE TABLE app.tickets (id bigint PRIMARY KEY, tenant_id text NOT NULL, created_at timestamptz);",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"

[[entity]]
name = "Ticket"
id = "3c1f0d4e-8a7b-4c2d-9e6f-0a1b2c3d4e5f"
table = "app.tickets"
category = "notes"
anchor = "created_at"

[[category]]
name = "notes"
strategy = "purge"
period = "30d"

[[category.override]]
tenant = "not-a-uuid"
period = "90d"

[[tenant]]
id = "also-not-a-uuid"
"#;
    expect_refused(
        &db,
        policy,
        &[
            "tenant columns disagree on type (Note: uuid, Ticket: text)",
            "override for tenant \"not-a-uuid\", which is not a valid uuid tenant id",
        ],
    )
    .await;
    // With one type, a [[tenant]] id that cannot be a tenant is refused too.
    exec(
        db.pool(),
        "ALTER TABLE app.tickets ALTER COLUMN tenant_id TYPE uuid USING NULL",
    )
    .await;
    let policy = policy.replace(
        "tenant = \"not-a-uuid\"",
        "tenant = \"33333333-3333-4333-a333-333333333333\"",
    );
    expect_refused(
        &db,
        &policy,
        &["[[tenant]] id \"also-not-a-uuid\" is not a valid tenant id"],
    )
    .await;
}

const NOTE_POLICY: &str = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
"#;

/// B.4(a): a record key whose only unique index is invalid (a failed
/// CREATE UNIQUE INDEX CONCURRENTLY) or deferrable is refused.
#[db_test(migrated)]
async fn record_keys_need_a_valid_immediate_unique_index(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.notes (id bigint NOT NULL, tenant_id uuid NOT NULL, created_at timestamptz);
         INSERT INTO app.notes VALUES (1, 'aaaaaaaa-0000-0000-0000-00000000000a', now()),
                                      (1, 'bbbbbbbb-0000-0000-0000-00000000000b', now());",
    )
    .await;
    // Fails on the duplicates and leaves an invalid index behind.
    let failed = sqlx::raw_sql("CREATE UNIQUE INDEX CONCURRENTLY notes_id_key ON app.notes (id)")
        .execute(db.pool())
        .await;
    assert!(failed.is_err());
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM pg_index WHERE indexrelid = 'app.notes_id_key'::regclass AND NOT indisvalid"
        )
        .await,
        1
    );
    expect_refused(
        &db,
        NOTE_POLICY,
        &["the unique index on record key column \"id\" is not valid, ready and immediate"],
    )
    .await;
    exec(
        db.pool(),
        "DROP INDEX app.notes_id_key; DELETE FROM app.notes WHERE tenant_id = 'bbbbbbbb-0000-0000-0000-00000000000b';
         ALTER TABLE app.notes ADD CONSTRAINT notes_pk PRIMARY KEY (id) DEFERRABLE INITIALLY DEFERRED;",
    )
    .await;
    expect_refused(&db, NOTE_POLICY, &["is not valid, ready and immediate"]).await;
    exec(
        db.pool(),
        "ALTER TABLE app.notes DROP CONSTRAINT notes_pk; ALTER TABLE app.notes ADD PRIMARY KEY (id);",
    )
    .await;
    from_policy(&db, NOTE_POLICY).await.unwrap();
}

/// Key-like columns must compare the way Cohort identifies values: no
/// non-deterministic collations, no char(n) tenants or subjects.
#[db_test(migrated)]
async fn key_columns_must_compare_deterministically(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE COLLATION app.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id text COLLATE app.ci NOT NULL,
             created_at timestamptz, user_code char(8));",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"
subjects = ["user_code"]

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
"#;
    expect_refused(
        &db,
        policy,
        &[
            "tenant column \"tenant_id\" has a non-deterministic collation",
            "erasure subject column \"user_code\" is character(8)",
        ],
    )
    .await;
}

/// C.6: columns other rows reference, and the columns Cohort relies on,
/// are never anonymised.
#[db_test(migrated)]
async fn referenced_key_columns_cannot_be_anonymised(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.accounts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
             anonymised_at timestamptz, email text UNIQUE, handle text UNIQUE);
         CREATE TABLE app.logins (id bigint PRIMARY KEY,
             email text REFERENCES app.accounts (email) ON UPDATE CASCADE ON DELETE RESTRICT);",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Account"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "app.accounts"
category = "accounts"
anchor = "created_at"
anonymise = { email = "hash", handle = "null", tenant_id = "null", id = "null" }

[[category]]
name = "accounts"
strategy = "anonymise"
period = "30d"
"#;
    expect_refused(
        &db,
        policy,
        &[
            "column \"email\" is anonymised but is part of a key that foreign key \"logins_email_fkey\" on app.logins references",
            "column \"tenant_id\" is both anonymised and a marker or anchor",
            "column \"id\" is both anonymised and a marker or anchor",
        ],
    )
    .await;
    // An unreferenced column is fine.
    from_policy(
        &db,
        &policy
            .replace("email = \"hash\", ", "")
            .replace(", tenant_id = \"null\", id = \"null\"", ""),
    )
    .await
    .unwrap();
}

/// E.8: an anonymise output that cannot fit its column would fail every
/// batch; NUL characters cannot be stored at all.
#[db_test(migrated)]
async fn anonymise_outputs_must_fit_their_columns(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE DOMAIN app.short_text AS varchar(5);
         CREATE TABLE app.contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
             anonymised_at timestamptz, email varchar(10), code char(3), nick app.short_text,
             note varchar(12), wide varchar(64));",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Contact"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "app.contacts"
category = "contacts"
anchor = "created_at"
anonymise = { email = "hash", code = { literal = "xxxx" }, nick = { literal = "redacted" }, note = { literal = "[redacted]" }, wide = "hash" }

[[category]]
name = "contacts"
strategy = "anonymise"
period = "30d"
"#;
    expect_refused(
        &db,
        policy,
        &[
            "column \"email\" is character varying(10) but the hash anonymise method writes 64 characters",
            "column \"code\" is character(3) but the literal anonymise method writes 4 characters",
            "column \"nick\" is app.short_text but the literal anonymise method writes 8 characters",
        ],
    )
    .await;
    let err = from_policy(&db, policy).await.unwrap_err().to_string();
    assert!(
        !err.contains("\"note\"") && !err.contains("\"wide\""),
        "{err}"
    );
    // NUL characters are refused when the file is loaded, wherever they are.
    let err = PolicyFile::parse(&policy.replace("[redacted]", "[red\\u0000acted]")).unwrap_err();
    assert!(
        err.to_string().contains("NUL characters are not allowed")
            && err.to_string().contains("entity[0].anonymise.note.literal"),
        "{err}"
    );
    let err = PolicyFile::parse(&policy.replace(
        "period = \"30d\"",
        "period = \"30d\"\nreason = \"a\\u0000b\"",
    ))
    .unwrap_err();
    assert!(err.to_string().contains("category[0].reason"), "{err}");
    // The same literal built in code is refused by validation.
    let decl = cohort::EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("app.contacts")
        .anonymise(
            "wide",
            cohort::model::AnonymiseMethod::Literal("a\0b".into()),
        );
    let err = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules())
        .declaration(decl)
        .build()
        .await
        .unwrap_err();
    assert!(
        problems_text(&err).contains("contains a NUL character"),
        "{err}"
    );
}

/// A fixed value written into a unique column would fail every batch of two
/// rows or more; an unqualified table that also exists in Cohort's schema is
/// ambiguous since the default table schema became `public`.
#[db_test(migrated)]
async fn constant_scrubs_of_unique_columns_and_ambiguous_tables_are_refused(db: TestDatabase) {
    let mut conn = db.connect().await.unwrap();
    cohort::schema::migrate(&mut conn, "ledger").await.unwrap();
    exec(
        db.pool(),
        "CREATE TABLE public.contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
             anonymised_at timestamptz, handle text UNIQUE, nick text);
         CREATE TABLE ledger.contacts (LIKE public.contacts);",
    )
    .await;
    let policy = r#"
[cohort]
schema = "ledger"

[[entity]]
name = "Contact"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "contacts"
category = "contacts"
anchor = "created_at"
anonymise = { handle = { literal = "gone" }, nick = "empty" }

[[category]]
name = "contacts"
strategy = "anonymise"
period = "30d"
"#;
    let err = from_policy(&db, policy).await.unwrap_err();
    let text = problems_text(&err);
    for f in [
        "column \"handle\" is unique, but the literal anonymise method writes the same value into every row",
        "table \"contacts\" names no schema: it resolves to public.contacts (the default table schema), but ledger.contacts exists too",
    ] {
        assert!(text.contains(f), "{f:?} missing from\n{text}");
    }
    assert!(!text.contains("\"nick\""), "{text}");
    // Qualified, and hashing the unique column instead: accepted.
    from_policy(
        &db,
        &policy
            .replace("table = \"contacts\"", "table = \"public.contacts\"")
            .replace("{ literal = \"gone\" }", "\"hash\""),
    )
    .await
    .unwrap();
}

/// A cascade that loops back into the purged table is reported too.
#[db_test(migrated)]
async fn cascades_that_loop_back_are_refused(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.parent (id bigint PRIMARY KEY, created_at timestamptz, child_id bigint);
         CREATE TABLE app.mid (id bigint PRIMARY KEY, parent_id bigint REFERENCES app.parent ON DELETE CASCADE);
         ALTER TABLE app.parent ADD CONSTRAINT parent_mid_fkey FOREIGN KEY (child_id) REFERENCES app.mid ON DELETE CASCADE;",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Parent"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.parent"
category = "short"
anchor = "created_at"
tenantless = true

[[category]]
name = "short"
strategy = "purge"
period = "30d"
"#;
    expect_refused(
        &db,
        policy,
        &["Parent: foreign key \"parent_mid_fkey\" on app.parent is ON DELETE CASCADE from app.mid, which a purge of entity Parent reaches through app.parent -> app.mid -> app.parent"],
    )
    .await;
}

/// E.9, E.10, E.11: Cohort's own tables, duplicate names and PostgreSQL's
/// own schemas are refused.
#[db_test(migrated)]
async fn cohort_tables_duplicate_names_and_reserved_schemas_are_refused(db: TestDatabase) {
    let mut conn = db.connect().await.unwrap();
    cohort::schema::migrate(&mut conn, "ledger2").await.unwrap();
    let policy = r#"
[[entity]]
name = "Holds"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "public.retention_hold"
category = "c"
anchor = "created_at"
tenantless = true

[[entity]]
name = "OtherRuns"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "ledger2.sweep_run"
category = "c"
anchor = "started_at"
tenantless = true

[[category]]
name = "c"
strategy = "purge"
period = "30d"
"#;
    expect_refused(
        &db,
        policy,
        &[
            "Holds: public.retention_hold is one of Cohort's own ledger tables",
            "OtherRuns: ledger2.sweep_run is one of Cohort's own ledger tables",
        ],
    )
    .await;

    exec(
        db.pool(),
        "CREATE TABLE public.notes (id bigint PRIMARY KEY, created_at timestamptz);
         CREATE TABLE public.notes2 (id bigint PRIMARY KEY, created_at timestamptz);",
    )
    .await;
    let dup = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "notes"
category = "c"
anchor = "created_at"
tenantless = true

[[entity]]
name = "Note"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "notes2"
category = "c"
anchor = "created_at"
tenantless = true

[[category]]
name = "c"
strategy = "purge"
period = "30d"
"#;
    expect_refused(
        &db,
        dup,
        &["2 retained entities share the display name \"Note\" (ids a3f467fe-c5d0-4f17-9897-83c373cc1dc8, b7316df4-7db5-46ad-aea7-f65c4b430f73)"],
    )
    .await;

    for schema in [
        " public",
        "public ",
        "information_schema",
        "pg_catalog",
        "PG_temp",
    ] {
        let config = cohort::CohortConfig {
            schema: schema.into(),
            ..test_config()
        };
        let err = Cohort::builder(db.pool().clone())
            .config(config)
            .build()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{schema:?}: {err}");
        let err = cohort::schema::migrate(&mut conn, schema)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{schema:?}: {err}");
    }
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM pg_namespace WHERE nspname IN (' public', 'public ')"
        )
        .await,
        0
    );
}

// --- At run time: before the run is recorded, or before a row is touched

#[db_test(migrated)]
async fn a_handle_built_without_validation_checks_readiness_before_writing_started(
    db: TestDatabase,
) {
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let cohort = b.build_unvalidated().unwrap();
    let err = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Validation(_)), "{err}");
    assert!(matches!(
        cohort
            .preview(cohort::PreviewRequest::tenanted(TENANT_A, now()))
            .await,
        Err(Error::Validation(_))
    ));
    assert_eq!(
        ledger_rows(db.pool(), "public").await,
        0,
        "no Started row before readiness"
    );
    exec(db.pool(), ENGINE_TABLES).await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Succeeded);
    assert_eq!(result.entity("Note").unwrap().affected, 3);
}

#[db_test(engine)]
async fn bad_sweep_requests_are_refused_before_anything_is_written(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let err = cohort
        .sweep(SweepRequest::tenanted("not-a-tenant-uuid", now()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("is not a valid uuid")),
        "{err}"
    );
    assert_eq!(ledger_rows(db.pool(), "public").await, 0);
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.notes").await, 12);
}

/// G.14: `hash` is keyed; without a key, whatever would change rows is
/// refused before anything runs (a sweep, an erasure, the worker's and
/// `cohort validate`'s check for runs), while reading (previews, dry runs,
/// holds, history) works: a read-only view needs no secret.
#[db_test(engine)]
async fn hashing_requires_a_key(db: TestDatabase) {
    let mut b = Cohort::builder(db.pool().clone()).rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let cohort = b.build().await.expect("a handle without the key reads");
    let model = cohort.ready().await.unwrap();
    assert!(
        model
            .warnings
            .iter()
            .any(|w| w.contains("Contact anonymise with `hash`, and no hash key is set")),
        "{:?}",
        model.warnings
    );
    let before = table_digest(db.pool(), "app.contacts").await;
    let refused = |e: cohort::Error| {
        assert!(e.kind().is_bad_input(), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(
                "Contact anonymise with `hash`, which needs the secret key (COHORT_HASH_KEY"
            ) && text.contains("nothing was changed"),
            "{e}"
        );
    };
    refused(
        cohort
            .sweep(SweepRequest::tenanted(TENANT_A, now()))
            .await
            .unwrap_err(),
    );
    refused(
        cohort
            .erase(ErasureRequest::tenanted(
                TENANT_A,
                ErasureScope::new("cccccccc-0000-0000-0000-00000000000c"),
                now(),
            ))
            .await
            .unwrap_err(),
    );
    refused(
        cohort
            .check_grants(&[cohort::services::Access::Runs])
            .await
            .unwrap_err(),
    );
    assert_eq!(table_digest(db.pool(), "app.contacts").await, before);
    assert_eq!(
        ledger_rows(db.pool(), "public").await,
        0,
        "no run was recorded"
    );
    // Reading works: a preview, a dry run, the holds, the history.
    let dry = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()).dry_run(true))
        .await
        .unwrap();
    assert!(dry.entity("Contact").unwrap().affected > 0);
    cohort
        .preview(cohort::PreviewRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    cohort
        .list_holds(&cohort::holds::HoldFilter::all())
        .await
        .unwrap();
    cohort.list_runs(10).await.unwrap();
    assert_eq!(table_digest(db.pool(), "app.contacts").await, before);
    // A short key is refused; the key never shows in errors or Debug.
    let mut config = test_config();
    config.hash_key = Some(HashKey::new("short"));
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("hash_key is 5 bytes"), "{err}");
    let mut config = cohort::CohortConfig::default();
    config
        .apply_env([("COHORT_HASH_KEY".to_string(), TEST_HASH_KEY.to_string())])
        .unwrap();
    assert!(!format!("{config:?}").contains(TEST_HASH_KEY));
    assert!(!serde_json::to_string(&config)
        .unwrap()
        .contains(TEST_HASH_KEY));
    assert_eq!(config.hash_key, Some(HashKey::new(TEST_HASH_KEY)));
}

struct Misbehaving;

#[async_trait]
impl RuleProvider for Misbehaving {
    fn capabilities(&self, category: &str) -> Option<CategoryCapabilities> {
        (category != "unknown-at-runtime").then(|| CategoryCapabilities::only(Strategy::Purge))
    }
    async fn resolve(&self, ctx: &ResolutionContext) -> Result<RetentionRule, ResolveError> {
        // The provider receives the run's logical time and tenant.
        if ctx.now != now()
            || ctx.tenant.tenant_id.is_none()
            || ctx.alias_path != vec![ctx.category.clone()]
        {
            return Err(ResolveError::Provider(format!(
                "unexpected context {ctx:?}"
            )));
        }
        match ctx.category.as_str() {
            // Declares only purge but returns soft delete for tenant B.
            "notes" if ctx.tenant.tenant_id.as_deref() == Some(TENANT_B) => {
                Ok(RetentionRule::new(days(30), Strategy::SoftDelete))
            }
            "notes" => Ok(RetentionRule::new(days(30), Strategy::Purge)),
            other => Err(ResolveError::UnknownCategory(other.to_owned())),
        }
    }
}

#[db_test(engine)]
async fn undeclared_strategies_and_unknown_categories_are_rejected_at_run_time(db: TestDatabase) {
    let decls = engine_entities();
    let tickets_as_notes = cohort::EntityDeclaration::new("Ticket", TICKET_ID)
        .category("tickets")
        .anchor("closed_at")
        .table("app.tickets");
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(Misbehaving)
        .declaration(decls[0].clone())
        .declaration(tickets_as_notes)
        .build()
        .await
        .unwrap();
    let b = cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(b.status, RunStatus::PartiallyFailed);
    let errors: Vec<(&str, &str)> = b
        .failures
        .iter()
        .map(|f| (f.entity.as_str(), f.error.as_str()))
        .collect();
    assert!(
        errors
            .iter()
            .any(|(e, m)| *e == "Note" && m.starts_with("kind=rule code=undeclared_strategy")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|(e, m)| *e == "Ticket" && m.starts_with("kind=rule code=unknown_category")),
        "{errors:?}"
    );
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.notes").await,
        12,
        "nothing was mutated"
    );
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.tickets WHERE is_deleted"
        )
        .await,
        0
    );
    let (status, _, _, summaries) = ledger(db.pool(), b.run_id).await;
    assert_eq!((status.as_str(), summaries.len()), ("partially_failed", 0));
    // Tenant A resolves to the declared strategy and works.
    let a = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(a.entity("Note").unwrap().affected, 3);
}
