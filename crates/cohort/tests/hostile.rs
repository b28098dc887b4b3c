//! Hostile input on every surface: the parsers never panic and round-trip
//! what they accept (proptest); SQL-injection strings, NUL bytes and
//! enormous values as tenants, subjects, record ids, hold reasons and
//! entity names are refused with a typed error or taken literally, and
//! nothing changes.

mod support;

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

const POLICY: &str = r#"
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
#[tokio::test]
async fn injection_strings_and_enormous_values_change_nothing() {
    let db = engine_db().await;
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
