//! Right to erasure on real tables: every strategy, several subject
//! columns, legal minimums, holds, tenants, dry runs, and rows that change
//! or get held while erasure waits for their locks.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::time::Duration;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::holds::HoldRequest;
use cohort::model::AnonymiseMethod;
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, EntityDeclaration, Error, RunKind, RunStatus};
use support::*;
use uuid::Uuid;

const S: &str = "dddddddd-0000-0000-0000-00000000000d";
const O: &str = "eeeeeeee-0000-0000-0000-00000000000e";
const ACCOUNT_ID: &str = "11111111-aaaa-4aaa-8aaa-111111111111";
const PROFILE_ID: &str = "22222222-bbbb-4bbb-8bbb-222222222222";
const ORDER_ID: &str = "33333333-cccc-4ccc-8ccc-333333333333";
const LEDGER_ID: &str = "44444444-dddd-4ddd-8ddd-444444444444";

const TABLES: &str = r#"
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
    user_id uuid, backup_user_id uuid);
CREATE TABLE app.profiles (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
    anonymised_at timestamptz, user_id uuid, email text, name text NOT NULL);
CREATE TABLE app.orders (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
    is_deleted boolean NOT NULL DEFAULT false, deleted_at timestamptz, user_id uuid);
CREATE TABLE app.ledger_entries (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, user_id uuid);
INSERT INTO app.accounts VALUES
  (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-31', 'dddddddd-0000-0000-0000-00000000000d', NULL),
  (2, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-06-05', 'dddddddd-0000-0000-0000-00000000000d', NULL),
  (3, 'aaaaaaaa-0000-0000-0000-00000000000a', NULL, 'eeeeeeee-0000-0000-0000-00000000000e', 'dddddddd-0000-0000-0000-00000000000d'),
  (4, 'bbbbbbbb-0000-0000-0000-00000000000b', '2026-05-31', 'dddddddd-0000-0000-0000-00000000000d', NULL),
  (5, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-31', 'eeeeeeee-0000-0000-0000-00000000000e', NULL);
INSERT INTO app.profiles VALUES
  (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-31', NULL, 'dddddddd-0000-0000-0000-00000000000d', 'd@example.com', 'Dee'),
  (2, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-31', NULL, 'eeeeeeee-0000-0000-0000-00000000000e', 'd@example.com', 'Eve'),
  (3, 'bbbbbbbb-0000-0000-0000-00000000000b', '2026-05-31', NULL, 'dddddddd-0000-0000-0000-00000000000d', 'd@example.com', 'Dee B');
INSERT INTO app.orders VALUES
  (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-31', false, NULL, 'dddddddd-0000-0000-0000-00000000000d');
INSERT INTO app.ledger_entries VALUES
  (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2025-04-27', 'dddddddd-0000-0000-0000-00000000000d'),
  (2, 'aaaaaaaa-0000-0000-0000-00000000000a', '2025-06-01', 'dddddddd-0000-0000-0000-00000000000d'),
  (3, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-22', 'dddddddd-0000-0000-0000-00000000000d'),
  (4, 'aaaaaaaa-0000-0000-0000-00000000000a', NULL, 'dddddddd-0000-0000-0000-00000000000d');
"#;

fn entities() -> Vec<EntityDeclaration> {
    vec![
        EntityDeclaration::new("Account", ACCOUNT_ID)
            .category("accounts")
            .anchor("created_at")
            .table("app.accounts")
            .subject("user_id", None)
            .subject("backup_user_id", Some("user")),
        EntityDeclaration::new("Profile", PROFILE_ID)
            .category("profiles")
            .anchor("created_at")
            .table("app.profiles")
            .anonymise("email", AnonymiseMethod::Null)
            .anonymise("name", AnonymiseMethod::Literal("[erased]".into()))
            .subject("user_id", Some("user"))
            .subject("email", Some("email")),
        EntityDeclaration::new("Order", ORDER_ID)
            .category("orders")
            .anchor("created_at")
            .table("app.orders")
            .subject("user_id", Some("user")),
        EntityDeclaration::new("LedgerEntry", LEDGER_ID)
            .category("ledger")
            .anchor("created_at")
            .table("app.ledger_entries")
            .subject("user_id", Some("user")),
    ]
}

fn erasure_rules(legal_min_everywhere: Option<i64>) -> StaticRuleProvider {
    let rule = |period: i64, strategy: Strategy, legal: Option<i64>| {
        // With a legal minimum everywhere, periods shrink to one day so legal_min > period.
        let period = if legal.is_none() && legal_min_everywhere.is_some() {
            1
        } else {
            period
        };
        let r = RetentionRule::new(days(period), strategy);
        match legal.or(legal_min_everywhere) {
            Some(l) => r.with_legal_min(days(l)),
            None => r,
        }
    };
    StaticRuleProvider::builder()
        .category("accounts", rule(30, Strategy::Purge, None))
        .category("profiles", rule(90, Strategy::Anonymise, None))
        .category("orders", rule(10, Strategy::SoftDelete, None))
        .category("ledger", rule(30, Strategy::Purge, Some(365)))
        .build()
        .unwrap()
}

async fn setup(legal_min_everywhere: Option<i64>) -> (cohort_pgtemp::TestDatabase, Cohort) {
    let db = migrated_db().await;
    exec(db.pool(), TABLES).await;
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(erasure_rules(legal_min_everywhere));
    for d in entities() {
        b = b.declaration(d);
    }
    let cohort = b.build().await.unwrap();
    (db, cohort)
}

fn request(subject: &str) -> ErasureRequest {
    ErasureRequest::tenanted(
        TENANT_A,
        ErasureScope::new(subject)
            .kind("user")
            .allow_soft_delete(true),
        now(),
    )
}

#[tokio::test]
async fn erasure_acts_at_once_on_every_subject_column_in_the_tenant_only() {
    let (db, cohort) = setup(None).await;
    let result = cohort.erase(request(S)).await.unwrap();
    assert_eq!(
        (result.kind, result.status, result.dry_run),
        (RunKind::Erasure, RunStatus::Succeeded, false)
    );
    // Purge: the 1-day-old row (period ignored), the future-anchored row and the
    // NULL-anchored row matched through the second subject column; not tenant B, not the other subject.
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.accounts ORDER BY id").await,
        vec![4, 5]
    );
    // Anonymise: only the subject's row in tenant A.
    let profiles: Vec<(i64, Option<String>, String, bool)> = sqlx::query_as(
        "SELECT id, email, name, anonymised_at IS NOT NULL FROM app.profiles ORDER BY id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        profiles,
        vec![
            (1, None, "[erased]".into(), true),
            (2, Some("d@example.com".into()), "Eve".into(), false),
            (3, Some("d@example.com".into()), "Dee B".into(), false),
        ]
    );
    // Soft delete, opted in.
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.orders WHERE is_deleted AND deleted_at IS NOT NULL"
        )
        .await,
        1
    );
    // Positive legal minimum (365d): only the row strictly older than it; the boundary, recent and NULL rows stay.
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.ledger_entries ORDER BY id").await,
        vec![2, 3, 4]
    );

    let by = |n: &str| result.entity(n).unwrap().clone();
    assert_eq!((by("Account").affected, by("Account").cutoff), (3, None));
    assert_eq!((by("Profile").affected, by("Order").affected), (1, 1));
    let ledger_e = by("LedgerEntry");
    assert_eq!((ledger_e.affected, ledger_e.null_anchor), (1, 1));
    assert_eq!(
        ledger_e.cutoff,
        Some(
            chrono::DateTime::parse_from_rfc3339("2025-06-01T00:00:00Z")
                .unwrap()
                .to_utc()
        )
    );
    let (status, dry, settled, summaries) = ledger(db.pool(), result.run_id).await;
    assert_eq!((status.as_str(), dry, settled), ("succeeded", false, true));
    let kind: String = sqlx::query_scalar("SELECT kind FROM sweep_run WHERE run_id = $1")
        .bind(result.run_id)
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(kind, "erasure");
    assert_eq!(summaries.iter().map(|s| s.2).sum::<i64>(), 6);
    assert!(summaries.contains(&("LedgerEntry".to_string(), "purge".to_string(), 1, 0, 0, 1)));
    // The subject itself is stored nowhere in the ledger.
    let leaked = count(
        db.pool(),
        &format!("SELECT count(*) FROM sweep_run r WHERE r::text LIKE '%{S}%'"),
    )
    .await
        + count(
            db.pool(),
            &format!("SELECT count(*) FROM sweep_run_entity_summary s WHERE s::text LIKE '%{S}%'"),
        )
        .await;
    assert_eq!(leaked, 0);
}

#[tokio::test]
async fn soft_delete_without_opt_in_is_refused_with_no_mutation_and_no_audit() {
    let (db, cohort) = setup(None).await;
    let before: Vec<String> = vec![
        table_digest(db.pool(), "app.accounts").await,
        table_digest(db.pool(), "app.orders").await,
    ];
    let err = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new(S).kind("user"),
            now(),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused(m) if m.contains("Order soft-deletes") && m.contains("allow_soft_delete")),
        "{err}"
    );
    assert_eq!(
        vec![
            table_digest(db.pool(), "app.accounts").await,
            table_digest(db.pool(), "app.orders").await
        ],
        before
    );
    assert_eq!(ledger_rows(db.pool(), "public").await, 0);
    // Narrowed to a kind that reaches no soft-deleting entity, it runs.
    let emails = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new("d@example.com").kind("email"),
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(emails.entities.len(), 1);
    assert_eq!(emails.entities[0].entity, "Profile");
}

#[tokio::test]
async fn subjects_match_exactly_per_column_type_and_kind() {
    let (db, cohort) = setup(None).await;
    // Text subject, kind email: both tenant-A profiles carry that email; nothing else is reached.
    let r = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new("D@EXAMPLE.COM").kind("email"),
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(
        r.entities[0].affected, 0,
        "no case-insensitive or partial matches"
    );
    let r = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new("d@example").kind("email"),
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(r.entities[0].affected, 0);
    let r = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new("d@example.com").kind("email"),
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(r.entities[0].affected, 2);
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.accounts").await,
        5
    );
    // Kind "user" reaches the accounts' `user` column (backup_user_id, row 3)
    // and the column that declares no kind (user_id, rows 1 and 2): a
    // column without a kind holds the subject whatever its kind. Upper-case
    // uuid subjects are canonicalised.
    let r = cohort.erase(request(&S.to_uppercase())).await.unwrap();
    assert_eq!(r.entity("Account").unwrap().affected, 3);
    assert_eq!(r.erasure_kind.as_deref(), Some("user"));
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.accounts ORDER BY id").await,
        vec![4, 5]
    );
}

#[tokio::test]
async fn holds_and_legal_minimums_block_erasure_and_are_reported() {
    let (db, cohort) = setup(None).await;
    cohort
        .create_hold(
            HoldRequest::new(Uuid::parse_str(ACCOUNT_ID).unwrap(), "1", "court order")
                .tenant(TENANT_A),
        )
        .await
        .unwrap();
    cohort
        .create_hold(
            HoldRequest::new(Uuid::parse_str(LEDGER_ID).unwrap(), "1", "audit").tenant(TENANT_A),
        )
        .await
        .unwrap();
    let r = cohort.erase(request(S)).await.unwrap();
    let acc = r.entity("Account").unwrap();
    assert_eq!((acc.affected, acc.held), (2, 1));
    let led = r.entity("LedgerEntry").unwrap();
    assert_eq!((led.affected, led.held, led.null_anchor), (0, 1, 1));
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.accounts ORDER BY id").await,
        vec![1, 4, 5]
    );
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.ledger_entries ORDER BY id").await,
        vec![1, 2, 3, 4]
    );
    let (_, _, _, summaries) = ledger(db.pool(), r.run_id).await;
    assert!(summaries.contains(&("Account".to_string(), "purge".to_string(), 2, 1, 0, 0)));
}

#[tokio::test]
async fn dry_run_and_live_erasure_agree_for_every_strategy_when_legal_min_exceeds_period() {
    // Every category gets a 1-day period and a 2-day legal minimum (ledger keeps 30d / 365d).
    let (db, cohort) = setup(Some(2)).await;
    let before = vec![
        table_digest(db.pool(), "app.accounts").await,
        table_digest(db.pool(), "app.profiles").await,
        table_digest(db.pool(), "app.orders").await,
    ];
    let dry = cohort.erase(request(S).dry_run(true)).await.unwrap();
    assert!(dry.dry_run);
    assert_eq!(
        vec![
            table_digest(db.pool(), "app.accounts").await,
            table_digest(db.pool(), "app.profiles").await,
            table_digest(db.pool(), "app.orders").await
        ],
        before
    );
    let live = cohort.erase(request(S)).await.unwrap();
    for e in &dry.entities {
        let l = live.entity(&e.entity).unwrap();
        assert_eq!(
            (e.affected, e.held, e.null_anchor),
            (l.affected, l.held, l.null_anchor),
            "{}",
            e.entity
        );
    }
    // With a positive legal minimum, the 1-day-old, future and NULL-anchored rows are blocked.
    assert_eq!(live.entity("Account").unwrap().affected, 0);
    assert_eq!(live.entity("Account").unwrap().null_anchor, 1);
    assert_eq!(live.entity("LedgerEntry").unwrap().affected, 1);
    let (_, dry_flag, _, _) = ledger(db.pool(), dry.run_id).await;
    assert!(dry_flag);
}

#[tokio::test]
async fn a_row_whose_subject_changes_while_erasure_waits_is_not_mutated() {
    let (db, cohort) = setup(None).await;
    let mut other = db.connect().await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query("UPDATE app.accounts SET user_id = $1::uuid WHERE id = 1")
        .bind(O)
        .execute(&mut other)
        .await
        .unwrap();
    let erasing = tokio::spawn({
        let cohort = cohort.clone();
        async move { cohort.erase(request(S)).await }
    });
    wait_for_lock_wait(db.pool()).await;
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(60), erasing)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.accounts ORDER BY id").await,
        vec![1, 4, 5]
    );
    assert_eq!(
        result.entity("Account").unwrap().affected,
        2,
        "reported = committed"
    );
}

#[tokio::test]
async fn a_hold_created_while_erasure_waits_protects_the_row() {
    let (db, cohort) = setup(None).await;
    let mut other = db.connect().await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    // What hold creation does: lock the row, then insert the hold; not yet committed.
    sqlx::query("SELECT 1 FROM app.accounts WHERE id = 1 FOR KEY SHARE")
        .execute(&mut other)
        .await
        .unwrap();
    sqlx::query("INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, tenant_id, reason) VALUES (gen_random_uuid(), $1, '1', $2, 'late')")
        .bind(Uuid::parse_str(ACCOUNT_ID).unwrap())
        .bind(TENANT_A)
        .execute(&mut other)
        .await
        .unwrap();
    let erasing = tokio::spawn({
        let cohort = cohort.clone();
        async move { cohort.erase(request(S)).await }
    });
    wait_for_lock_wait(db.pool()).await;
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(60), erasing)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.accounts ORDER BY id").await,
        vec![1, 4, 5]
    );
    let acc = result.entity("Account").unwrap();
    assert_eq!((acc.affected, acc.held), (2, 1));
}

#[tokio::test]
async fn bad_erasure_requests_are_refused_before_anything_is_written() {
    let (db, cohort) = setup(None).await;
    let cases: Vec<(ErasureRequest, &str)> = vec![
        (
            ErasureRequest::tenanted(TENANT_A, ErasureScope::new("  "), now()),
            "needs a subject",
        ),
        (
            ErasureRequest::tenanted("tenant-a", ErasureScope::new(S).kind("user"), now()),
            "is not a valid uuid",
        ),
        (
            ErasureRequest::tenanted(
                TENANT_A,
                ErasureScope::new("not-a-uuid").kind("user"),
                now(),
            ),
            "the subject cannot be a \"user\" value: every subject column a \"user\" request reaches is of type uuid",
        ),
        (
            ErasureRequest::tenanted(TENANT_A, ErasureScope::new(S), now()),
            "subject columns declare kinds (\"email\", \"user\"): name the subject's kind",
        ),
        (
            ErasureRequest::tenanted(TENANT_A, ErasureScope::new(S).kind("phone"), now()),
            "no subject column declares the kind \"phone\"; the kinds are \"email\", \"user\"",
        ),
        (
            ErasureRequest::tenanted(TENANT_A, ErasureScope::new(S).kind(""), now()),
            "kind must not be empty",
        ),
    ];
    for (req, fragment) in cases {
        match cohort.erase(req.clone()).await {
            Err(e) if e.kind().is_bad_input() => {
                assert!(e.to_string().contains(fragment), "{req:?}: {e}")
            }
            other => panic!("{req:?} gave {other:?}"),
        }
    }
    assert_eq!(ledger_rows(db.pool(), "public").await, 0);
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.accounts").await,
        5
    );
}

#[db_test(migrated)]
async fn jurisdiction_overrides_apply_to_erasure(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    // Accounts in the UK keep a one-year legal minimum; elsewhere none.
    let rules = StaticRuleProvider::builder()
        .category_with(
            "accounts",
            RetentionRule::new(days(30), Strategy::Purge),
            vec![cohort::rules::RuleOverride {
                tenant: None,
                jurisdiction: Some("UK".into()),
                tag: None,
                rule: RetentionRule::new(days(30), Strategy::Purge).with_legal_min(days(365)),
            }],
            None,
        )
        .build()
        .unwrap();
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules)
        .declaration(entities().remove(0))
        .build()
        .await
        .unwrap();
    let uk = cohort.erase(request(S).jurisdiction("UK")).await.unwrap();
    assert_eq!(
        (uk.entities[0].affected, uk.entities[0].null_anchor),
        (0, 1),
        "the UK legal minimum blocks young and NULL rows"
    );
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.accounts").await,
        5
    );
    let elsewhere = cohort.erase(request(S)).await.unwrap();
    assert_eq!(elsewhere.entities[0].affected, 3);
}

/// The subject kind is part of the request and of the ledger: stored on
/// the run, read back by `show_run`, in the result's JSON; a sweep has
/// none, and the schema refuses one on a sweep.
#[tokio::test]
async fn the_subject_kind_is_stored_on_the_run() {
    let (db, cohort) = setup(None).await;
    let r = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new("d@example.com").kind("email"),
            now(),
        ))
        .await
        .unwrap();
    let stored: Option<String> =
        sqlx::query_scalar("SELECT erasure_subject_kind FROM sweep_run WHERE run_id = $1")
            .bind(r.run_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(stored.as_deref(), Some("email"));
    let shown = cohort.show_run(r.run_id).await.unwrap();
    assert_eq!(shown.erasure_kind.as_deref(), Some("email"));
    assert_eq!(serde_json::to_value(&r).unwrap()["erasure_kind"], "email");

    let sweep = cohort
        .sweep(cohort::SweepRequest::tenanted(TENANT_A, now()).dry_run(true))
        .await
        .unwrap();
    assert!(serde_json::to_value(&sweep)
        .unwrap()
        .get("erasure_kind")
        .is_none());
    let refused =
        sqlx::query("UPDATE sweep_run SET erasure_subject_kind = 'email' WHERE run_id = $1")
            .bind(sweep.run_id)
            .execute(db.pool())
            .await
            .unwrap_err();
    assert_eq!(
        refused
            .as_database_error()
            .and_then(|e| e.code())
            .as_deref(),
        Some("23514")
    );
}

/// Issue 55, E3: a request retried under its reference with another
/// spelling of its tenant (braced, upper case) is the same request, and
/// is recorded with the tenant's canonical form; another tenant is still
/// refused, and nothing of it is written.
#[tokio::test]
async fn a_request_retried_with_another_spelling_of_its_tenant_is_the_same_request() {
    let (db, cohort) = setup(None).await;
    let asked = |tenant: String| {
        ErasureRequest::tenanted(
            tenant,
            ErasureScope::new(S).kind("user").allow_soft_delete(true),
            now(),
        )
        .reference("R-SPELLED")
    };
    let braced = format!("{{{}}}", TENANT_A.to_uppercase());
    // The ledger's legal minimum keeps two of the subject's entries: the
    // request waits, so it may be run again.
    let first = cohort.erase(asked(braced.clone())).await.unwrap();
    let first = first.request.expect("a request");
    assert_eq!(first.tenant.as_deref(), Some(TENANT_A), "canonical");
    assert_eq!(first.state.as_str(), "waiting", "{first:?}");
    for spelling in [TENANT_A.to_owned(), braced, TENANT_A.to_uppercase()] {
        let again = cohort.erase(asked(spelling.clone())).await.unwrap();
        assert_eq!(
            again.request.expect("a request").request_id,
            first.request_id,
            "{spelling} is the same tenant"
        );
    }
    let requests = "SELECT count(*) FROM public.erasure_request";
    assert_eq!(count(db.pool(), requests).await, 1);
    let Err(Error::Conflict(why)) = cohort.erase(asked(TENANT_B.to_owned())).await else {
        panic!("another tenant under the same reference is refused")
    };
    assert!(why.contains("another subject, tenant or kind"), "{why}");
    assert_eq!(count(db.pool(), requests).await, 1);
}
