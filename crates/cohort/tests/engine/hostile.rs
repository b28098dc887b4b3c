//! Hostile input on every surface: the parsers never panic and round-trip
//! what they accept (proptest); SQL-injection strings, NUL bytes and
//! enormous values as tenants, subjects, record ids, hold reasons and
//! entity names are refused with a typed error or taken literally, and
//! nothing changes; built-in functions shadowed ahead of `pg_catalog`
//! change nothing a sweep or an erasure keeps. (Hostile identifiers in a
//! policy file are refused at load: `refused.rs`.)

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::guarded::GuardedDeletion;
use cohort::holds::HoldRequest;
use cohort::policy::PolicyFile;
use cohort::rules::Period;
use cohort::services::WorkerConfig;
use cohort::{Error, PreviewRequest, SweepRequest};
use proptest::prelude::*;
use support::*;
use uuid::Uuid;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any text: a period or a typed refusal; never a panic.
    #[test]
    fn period_parsing_never_panics(text in ".{0,24}") {
        let _ = text.parse::<Period>();
    }

    /// Every period that parses prints as text that parses back to it.
    #[test]
    fn periods_round_trip(d in 0i64..100_000, h in 0i64..48, m in 0i64..120, s in 0i64..120) {
        let text = format!("{d}d{h}h{m}m{s}s");
        if let Ok(p) = text.parse::<Period>() {
            let again: Period = p.to_string().parse().unwrap();
            prop_assert_eq!(again, p);
        }
    }

    /// Any text as a schedule: a worker configuration or a typed error.
    #[test]
    fn cron_parsing_never_panics(text in "[0-9*/,\\- A-Za-z?#LW]{0,40}") {
        let _ = WorkerConfig::new(&text);
    }

    /// Any text as a policy file, and a valid one with bytes spliced in:
    /// parsed or refused, never a panic.
    #[test]
    fn policy_parsing_never_panics(text in ".{0,200}") {
        let _ = PolicyFile::parse(&text);
    }

    #[test]
    fn mangled_policies_never_panic(at in 0usize..2000, junk in ".{0,12}") {
        let valid = POLICY;
        let at = (0..=at.min(valid.len())).rev().find(|i| valid.is_char_boundary(*i)).unwrap_or(0);
        let mangled = format!("{}{junk}{}", &valid[..at], &valid[at..]);
        let _ = PolicyFile::parse(&mangled);
    }
}

/// A valid policy file, mangled by the property tests here and by
/// `refused.rs`.
pub(crate) const POLICY: &str = r#"
tenants_query = "SELECT id FROM app.tenants"

[cohort]
schema = "retention"
sweep_batch_size = 500
schedule = "0 0 3 * * *"

[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"
subjects = ["author_id", { column = "editor_id", kind = "user" }]
anonymise = { email = "null", name = "empty", phone = { literal = "[x]" } }

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
legal_min = "1d12h"
audit = "per_row"

[[category.override]]
jurisdiction = "EU"
period = "90d"
"#;

/// Strings an attacker would try.
const HOSTILE: &[&str] = &[
    "'; DROP TABLE app.notes; --",
    "\" OR 1=1 --",
    "aaaaaaaa-0000-0000-0000-00000000000a' OR '1'='1",
    "1; DELETE FROM public.retention_hold",
    "$1",
    "\\x00",
    "a\0b",
    "\u{202e}gnp.exe",
    "",
    "   ",
];

/// Everything of the engine's tables and Cohort's, to compare.
async fn everything(pool: &sqlx::PgPool) -> Vec<String> {
    let mut out = Vec::new();
    for t in [
        "app.notes",
        "app.contacts",
        "app.tickets",
        "app.invoices",
        "app.globals",
        "public.sweep_run",
        "public.retention_hold",
        "public.sweep_run_row_detail",
    ] {
        out.push(format!("{t}: {}", table_digest(pool, t).await));
    }
    out
}

/// SQL-injection strings, NUL bytes and a 1 MB value as tenant, subject,
/// record id, hold reason and entity name: each call is refused with a
/// typed error (or, where any text is valid, matches nothing), and no
/// table changes.
#[db_test(engine)]
async fn injection_strings_and_enormous_values_change_nothing(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let note = Uuid::parse_str(NOTE_ID).unwrap();
    let contact = Uuid::parse_str(CONTACT_ID).unwrap();
    let before = everything(db.pool()).await;
    let huge = "x".repeat(1 << 20);
    let now = now();
    let mut inputs: Vec<String> = HOSTILE.iter().map(|s| s.to_string()).collect();
    inputs.push(huge.clone());
    for bad in &inputs {
        // As a tenant.
        let e = cohort
            .sweep(SweepRequest::tenanted(bad.clone(), now))
            .await
            .unwrap_err();
        assert!(e.kind().is_bad_input(), "sweep tenant {:.40?}: {e}", bad);
        let e = cohort
            .preview(PreviewRequest::tenanted(bad.clone(), now))
            .await
            .unwrap_err();
        assert!(e.kind().is_bad_input(), "preview tenant: {e}");
        // As a subject (the subject column is a uuid).
        match cohort
            .erase(ErasureRequest::tenanted(
                TENANT_A,
                ErasureScope::new(bad.clone()),
                now,
            ))
            .await
        {
            Err(e) => assert!(e.kind().is_bad_input(), "subject {:.40?}: {e}", bad),
            Ok(r) => assert_eq!(r.affected(), 0, "subject {:.40?} erased something", bad),
        }
        // As a record id (uuid and bigint keys).
        for entity in [note, contact] {
            let e = cohort
                .create_hold(HoldRequest::new(entity, bad.clone(), "case").tenant(TENANT_A))
                .await
                .unwrap_err();
            assert!(
                e.kind().is_bad_input() || matches!(e, Error::NotFound(_)),
                "{e}"
            );
            let e = cohort
                .guarded_delete(
                    GuardedDeletion::new(entity, [bad.clone()]).tenant(TENANT_A),
                    |_tx| Box::pin(async { Ok(()) }),
                )
                .await
                .unwrap_err();
            assert!(
                e.kind().is_bad_input() || matches!(e, Error::NotFound(_)),
                "{e}"
            );
            assert!(
                cohort.is_held(entity, bad).await.is_err()
                    || !cohort.is_held(entity, bad).await.unwrap()
            );
        }
        // As an entity name for a run lookup.
        assert!(cohort.find_run(bad).await.is_err());
    }
    // Reasons: empty and whitespace are refused; NUL bytes are refused by
    // the server's text type (a typed database error), never truncated.
    let real: String = sqlx::query_scalar(
        "SELECT id::text FROM app.notes WHERE body = 'aaaaaaaa-0000-0000-0000-00000000000a:1d'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    for reason in ["", "   ", "a\0b"] {
        let e = cohort
            .create_hold(HoldRequest::new(note, real.clone(), reason).tenant(TENANT_A))
            .await
            .unwrap_err();
        assert!(!e.to_string().is_empty(), "{e}");
    }
    // Hostile entity ids and names: refused by startup validation, before
    // any statement runs.
    for (name, id, table) in [
        ("Note", "'; DROP TABLE app.notes; --", "app.notes"),
        ("Note", NOTE_ID, "app.notes; DROP TABLE app.notes"),
        ("Note", NOTE_ID, "app.\"notes\"\"; DROP"),
    ] {
        let e = cohort::Cohort::builder(db.pool().clone())
            .config(test_config())
            .rules(rules())
            .declaration(
                cohort::EntityDeclaration::new(name, id)
                    .category("notes")
                    .anchor("created_at")
                    .table(table),
            )
            .build()
            .await
            .unwrap_err();
        assert!(e.kind().is_bad_input(), "{name:?} {id:?} {table:?}: {e}");
    }
    assert_eq!(everything(db.pool()).await, before, "something changed");

    // A display name is only ever a bound value: any text is taken
    // literally (stored in the ledger as written).
    let odd = "Note\"; DROP TABLE app.notes; --";
    let named = cohort::Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules())
        .declaration(
            cohort::EntityDeclaration::new(odd, NOTE_ID)
                .category("notes")
                .anchor("created_at")
                .table("app.notes"),
        )
        .build()
        .await
        .unwrap();
    let r = named
        .sweep(SweepRequest::tenanted(TENANT_A, now))
        .await
        .unwrap();
    assert!(r.entity(odd).is_some());
    let stored: String =
        sqlx::query_scalar("SELECT entity_type FROM public.sweep_run_entity_summary")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(stored, odd);
    assert!(count(db.pool(), "SELECT count(*) FROM app.notes").await > 0);
    let before = everything(db.pool()).await;

    // A hostile reason that is valid text is stored as it is, literally.
    let hold = cohort
        .create_hold(HoldRequest::new(note, real.clone(), HOSTILE[0]).tenant(TENANT_A))
        .await
        .unwrap();
    assert_eq!(hold.reason, HOSTILE[0]);
    let stored: String = sqlx::query_scalar("SELECT reason FROM public.retention_hold")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(stored, HOSTILE[0]);
    assert_eq!(
        everything(db.pool()).await[0],
        before[0],
        "the notes changed"
    );
    // A 1 MB reason is stored whole too (no truncation, no error).
    let big = cohort
        .create_hold(HoldRequest::new(note, real, huge.clone()).tenant(TENANT_A))
        .await
        .unwrap();
    assert_eq!(big.reason.len(), huge.len());
}

/// Built-in functions shadowed by a schema ahead of `pg_catalog` in the
/// connection's `search_path`, each with an exact overload that would make
/// an unqualified call lie: the clocks far in the future (every hold
/// expired), advisory locks that lock nothing, a snapshot test that hides
/// every recent hold, counts and hashes that are wrong. Holds, a sweep and
/// an erasure driven through that connection keep exactly what the same
/// work keeps on an ordinary one: every statement calls `pg_catalog.`.
#[tokio::test]
async fn shadowed_built_in_functions_change_nothing_a_sweep_or_erasure_keeps() {
    const CONTACT: &str = "5a5a5a5a-0000-4000-8000-0000000000e1";
    const S: &str = "dddddddd-0000-0000-0000-00000000000d";
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.contacts (id bigint PRIMARY KEY, created_at timestamptz, user_id uuid);
         INSERT INTO app.contacts VALUES
           (1, '2026-01-10', 'dddddddd-0000-0000-0000-00000000000d'),
           (2, '2026-01-11', 'eeeeeeee-0000-0000-0000-00000000000e'),
           (3, '2026-01-12', 'eeeeeeee-0000-0000-0000-00000000000e'),
           (4, '2026-05-30', 'eeeeeeee-0000-0000-0000-00000000000e');
         CREATE SCHEMA evil;
         CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT timestamptz '2999-01-01' $$;
         CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT timestamptz '2999-01-01' $$;
         CREATE FUNCTION evil.statement_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT timestamptz '2999-01-01' $$;
         CREATE FUNCTION evil.transaction_timestamp() RETURNS timestamptz LANGUAGE sql AS $$ SELECT timestamptz '2999-01-01' $$;
         CREATE FUNCTION evil.pg_advisory_xact_lock(bigint) RETURNS void LANGUAGE sql AS $$ SELECT $$;
         CREATE FUNCTION evil.pg_advisory_xact_lock(integer, integer) RETURNS void LANGUAGE sql AS $$ SELECT $$;
         CREATE FUNCTION evil.pg_advisory_xact_lock_shared(integer, integer) RETURNS void LANGUAGE sql AS $$ SELECT $$;
         CREATE FUNCTION evil.pg_try_advisory_lock(bigint) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
         CREATE FUNCTION evil.hashtext(text) RETURNS integer LANGUAGE sql AS $$ SELECT 0 $$;
         CREATE FUNCTION evil.pg_visible_in_snapshot(xid8, pg_snapshot) RETURNS boolean LANGUAGE sql AS $$ SELECT true $$;
         CREATE FUNCTION evil.pg_current_xact_id() RETURNS xid8 LANGUAGE sql AS $$ SELECT '3'::xid8 $$;
         CREATE FUNCTION evil.lower(text) RETURNS text LANGUAGE sql AS $$ SELECT 'nobody' $$;
         CREATE FUNCTION evil.unnest(anyarray) RETURNS SETOF anyelement LANGUAGE sql AS $$ SELECT NULL::anyelement WHERE false $$;
         CREATE FUNCTION evil.count_sf(bigint) RETURNS bigint LANGUAGE sql AS $$ SELECT 0::bigint $$;
         CREATE AGGREGATE evil.count(*) (SFUNC = evil.count_sf, STYPE = bigint, INITCOND = '0');
         GRANT USAGE ON SCHEMA evil TO PUBLIC;",
    )
    .await;
    let options = db
        .connect_options()
        .options([("search_path", "evil, pg_catalog, public")]);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    // Control: on this pool an unqualified call is the impostor.
    let shadowed: (chrono::DateTime<chrono::Utc>, i64) =
        sqlx::query_as("SELECT now(), (SELECT count(*) FROM app.contacts)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(shadowed.0.to_rfc3339(), "2999-01-01T00:00:00+00:00");
    assert_eq!(shadowed.1, 0);

    let cohort = cohort::Cohort::builder(pool.clone())
        .config(test_config())
        .rules(
            cohort::rules::StaticRuleProvider::builder()
                .category(
                    "contacts",
                    cohort::rules::RetentionRule::new(days(30), cohort::rules::Strategy::Purge),
                )
                .build()
                .unwrap(),
        )
        .declaration(
            cohort::EntityDeclaration::new("Contact", CONTACT)
                .category("contacts")
                .anchor("created_at")
                .table("app.contacts")
                .subject("user_id", None)
                .tenantless(),
        )
        .build()
        .await
        .unwrap();
    // A record hold that expires next year, and a hold on the person S.
    let next_year = chrono::Utc::now() + chrono::Duration::days(365);
    cohort
        .create_hold(
            HoldRequest::new(Uuid::parse_str(CONTACT).unwrap(), "2", "claim").expires_at(next_year),
        )
        .await
        .unwrap();
    cohort
        .create_hold(HoldRequest::subject(S, "litigation"))
        .await
        .unwrap();
    let swept = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(swept.affected(), 1, "only contact 3 was due and free");
    let held = &swept.entities[0];
    assert_eq!((held.held, held.affected), (2, 1));
    let erased = cohort
        .erase(ErasureRequest::tenantless(ErasureScope::new(S), now()))
        .await
        .unwrap();
    assert_eq!(erased.affected(), 0, "S's row is under a hold");
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.contacts ORDER BY id").await,
        vec![1, 2, 4]
    );
    // The ledger reads back true: the chain verifies through the same pool.
    let r = cohort.verify_chain(None).await.unwrap();
    assert!(r.intact, "{:?}", r.breaks);
}
