//! Custom anonymisers in their three modes (.NET Cohort's PerRow,
//! PerRowWithOriginalValue and Static), on a real server: per row from the
//! original value with the row's context, and once per run applied to the
//! whole batch in SQL. A custom anonymiser sees the column's value typed
//! and writes the column's type; the keyed hash works on citext and
//! varchar columns too.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::model::{AnonymiseContext, AnonymiseMethod, CustomAnonymiser};
use cohort::{Cohort, CohortConfig, EntityDeclaration, SweepRequest};
use support::*;

async fn cohort_with(db: &cohort_pgtemp::TestDatabase, contact: EntityDeclaration) -> Cohort {
    Cohort::builder(db.pool().clone())
        .config(CohortConfig {
            // Several batches per run: a per-run value must not be
            // recomputed per batch.
            sweep_batch_size: cohort::BatchSize::Fixed(2),
            ..test_config()
        })
        .rules(rules())
        .declaration(contact)
        .build()
        .await
        .unwrap()
}

fn contact() -> EntityDeclaration {
    EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("app.contacts")
        .subject("user_id", None)
        // Per-row audit: the ledger names every row changed.
        .audit(cohort::AuditDetail::PerRow)
}

/// `(id, reference, phone, score)` of tenant A's anonymised contacts.
async fn anonymised(pool: &sqlx::PgPool, tenant: &str) -> Vec<(i64, String, String, Option<i32>)> {
    sqlx::query_as(
        "SELECT id, reference, phone, score FROM app.contacts
         WHERE tenant_id = $1::uuid AND anonymised_at IS NOT NULL ORDER BY id",
    )
    .bind(tenant)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// What a per-run anonymiser saw: column, tenant, record.
type Seen = (String, Option<String>, Option<String>);

/// The run settled succeeded with one summary of `affected` anonymised
/// rows, and one row detail per anonymised row of `tenant`.
async fn assert_audited(pool: &sqlx::PgPool, run_id: uuid::Uuid, affected: usize) {
    let (status, dry_run, settled, summaries) = ledger(pool, run_id).await;
    assert_eq!(
        (status.as_str(), dry_run, settled),
        ("succeeded", false, true)
    );
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert_eq!(
        (summaries[0].1.as_str(), summaries[0].2),
        ("anonymise", affected as i64)
    );
    let details: Vec<String> = sqlx::query_scalar(
        "SELECT record_id FROM public.sweep_run_row_detail WHERE run_id = $1 ORDER BY record_id::bigint",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await
    .unwrap();
    let changed: Vec<String> = sqlx::query_scalar(
        "SELECT id::text FROM app.contacts WHERE tenant_id = $1::uuid AND anonymised_at IS NOT NULL ORDER BY id",
    )
    .bind(TENANT_A)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(details.len(), affected);
    assert_eq!(details, changed, "one row detail per anonymised row");
}

fn rfc3339(now: chrono::DateTime<chrono::Utc>) -> String {
    now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[db_test(engine)]
async fn a_context_anonymiser_sees_its_entity_column_tenant_run_time_and_record(db: TestDatabase) {
    let anonymiser = CustomAnonymiser::with_context(
        "describe",
        |cx: &AnonymiseContext<'_>, original: &String| {
            format!(
                "{}|{}|{}|{}|{}|{}|{}",
                cx.entity,
                cx.entity_id,
                cx.column,
                cx.tenant.unwrap_or("-"),
                cx.record_id.unwrap_or("-"),
                rfc3339(cx.now),
                original.len()
            )
        },
    );
    let cohort = cohort_with(
        &db,
        contact().anonymise("reference", AnonymiseMethod::Custom(anonymiser)),
    )
    .await;
    let before: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, reference FROM app.contacts WHERE tenant_id = $1::uuid")
            .bind(TENANT_A)
            .fetch_all(db.pool())
            .await
            .unwrap();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let rows = anonymised(db.pool(), TENANT_A).await;
    assert!(rows.len() >= 3, "several batches of 2: {rows:?}");
    assert_eq!(
        result.entity("Contact").unwrap().affected,
        rows.len() as u64
    );
    assert_audited(db.pool(), result.run_id, rows.len()).await;
    let run_now = rfc3339(now().with_timezone(&chrono::Utc));
    for (id, reference, _, _) in &rows {
        let original = &before.iter().find(|(i, _)| i == id).unwrap().1;
        assert_eq!(
            reference,
            &format!(
                "Contact|{CONTACT_ID}|reference|{TENANT_A}|{id}|{run_now}|{}",
                original.len()
            ),
            "row {id}"
        );
    }
    // Tenant B's rows were not this run's: untouched.
    assert!(anonymised(db.pool(), TENANT_B).await.is_empty());
}

#[db_test(engine)]
async fn a_per_run_anonymiser_is_computed_once_per_run_and_applied_to_every_row_in_sql(
    db: TestDatabase,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let (c1, s1) = (Arc::clone(&calls), Arc::clone(&seen));
    let phone = CustomAnonymiser::per_run("stamp", move |cx: &AnonymiseContext<'_>| {
        c1.fetch_add(1, Ordering::SeqCst);
        s1.lock().unwrap().push((
            cx.column.to_owned(),
            cx.tenant.map(str::to_owned),
            cx.record_id.map(str::to_owned),
        ));
        format!(
            "erased {} for {}",
            rfc3339(cx.now),
            cx.tenant.unwrap_or("-")
        )
    });
    let c2 = Arc::clone(&calls);
    // An integer column: the i64 goes through JSON and becomes integer.
    let score = CustomAnonymiser::per_run("zero-score", move |_: &AnonymiseContext<'_>| {
        c2.fetch_add(1, Ordering::SeqCst);
        -1i64
    });
    assert!(phone.is_per_run() && score.is_per_run());
    let cohort = cohort_with(
        &db,
        contact()
            .anonymise("phone", AnonymiseMethod::Custom(phone))
            .anonymise("score", AnonymiseMethod::Custom(score))
            .anonymise(
                "full_name",
                AnonymiseMethod::Literal("gone {tenant}".into()),
            ),
    )
    .await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let rows = anonymised(db.pool(), TENANT_A).await;
    assert!(rows.len() >= 3, "several batches of 2: {rows:?}");
    assert_eq!(
        result.entity("Contact").unwrap().affected,
        rows.len() as u64
    );
    assert_audited(db.pool(), result.run_id, rows.len()).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "once per run and column, whatever the number of rows and batches"
    );
    let run_now = rfc3339(now().with_timezone(&chrono::Utc));
    for (id, _, phone, score) in &rows {
        assert_eq!(
            phone,
            &format!("erased {run_now} for {TENANT_A}"),
            "row {id}"
        );
        assert_eq!(*score, Some(-1), "row {id}");
    }
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT full_name FROM app.contacts WHERE tenant_id = $1::uuid AND anonymised_at IS NOT NULL",
    )
    .bind(TENANT_A)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(
        names,
        [format!("gone {TENANT_A}")],
        "a literal beside them still renders"
    );
    assert_eq!(
        seen.lock().unwrap().clone(),
        [("phone".to_owned(), Some(TENANT_A.to_owned()), None)],
        "the run's context, and no record (it sees no row)"
    );

    // The next run (tenant B) computes its own value.
    cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    let rows_b = anonymised(db.pool(), TENANT_B).await;
    assert!(!rows_b.is_empty(), "tenant B has anonymised rows");
    for (_, _, phone, _) in rows_b {
        assert_eq!(phone, format!("erased {run_now} for {TENANT_B}"));
    }
    // Rows of tenant A that were not due are untouched.
    let kept: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM app.contacts WHERE tenant_id = $1::uuid AND anonymised_at IS NULL AND phone = '+44 1' AND score = 7",
    )
    .bind(TENANT_A)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(kept as usize + rows.len(), 6);
}

#[db_test(engine)]
async fn erasure_applies_per_run_and_context_anonymisers_too(db: TestDatabase) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let cohort = cohort_with(
        &db,
        contact()
            .anonymise(
                "phone",
                AnonymiseMethod::Custom(CustomAnonymiser::per_run(
                    "stamp",
                    move |cx: &AnonymiseContext<'_>| {
                        c.fetch_add(1, Ordering::SeqCst);
                        format!("erased for {}", cx.tenant.unwrap_or("-"))
                    },
                )),
            )
            .anonymise(
                "reference",
                AnonymiseMethod::Custom(CustomAnonymiser::with_context(
                    "record",
                    |cx: &AnonymiseContext<'_>, _: &String| {
                        format!("record {}", cx.record_id.unwrap_or("-"))
                    },
                )),
            ),
    )
    .await;
    let result = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new("cccccccc-0000-0000-0000-00000000000c"),
            now(),
        ))
        .await
        .unwrap();
    let rows = anonymised(db.pool(), TENANT_A).await;
    assert_eq!(rows.len(), 6, "every row of the subject in tenant A");
    assert_eq!(result.entity("Contact").unwrap().affected, 6);
    assert_audited(db.pool(), result.run_id, 6).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    for (id, reference, phone, _) in rows {
        assert_eq!(phone, format!("erased for {TENANT_A}"));
        assert_eq!(reference, format!("record {id}"));
    }
}

#[allow(clippy::ptr_arg)] // a custom anonymiser receives &T of the column's Rust type
fn mask(v: &String) -> String {
    format!("{}***", &v[..2])
}

#[db_test(engine)]
async fn custom_anonymisers_see_typed_values_and_write_the_column_type(db: TestDatabase) {
    let contact = cohort::EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("app.contacts")
        .anonymise(
            "reference",
            AnonymiseMethod::Custom(CustomAnonymiser::new("mask", mask)),
        )
        // integer column, typed input, i64 output converted to integer by PostgreSQL
        .anonymise(
            "score",
            AnonymiseMethod::Custom(CustomAnonymiser::new("bucket", |v: &Option<i32>| {
                v.map(|n| i64::from(n) * 100)
            })),
        )
        .anonymise("phone", AnonymiseMethod::Literal("[redacted]".into()));
    let cohort = crate::failures::cohort_with(&db, test_config(), vec![contact]).await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.entities[0].affected, 3);
    let rows: Vec<(String, Option<i32>, String, Option<String>)> = sqlx::query_as(
        "SELECT reference, score, phone, email FROM app.contacts WHERE tenant_id = $1::uuid AND anonymised_at IS NOT NULL ORDER BY id",
    )
    .bind(TENANT_A)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(rows.len(), 3);
    for r in rows {
        assert_eq!(
            (r.0.as_str(), r.1, r.2.as_str()),
            ("RE***", Some(700), "[redacted]")
        );
        assert_eq!(
            r.3.as_deref(),
            Some("person@example.com"),
            "undeclared column untouched"
        );
    }
}

/// The keyed hash is computed in Rust from the column's value, also for a
/// citext column (decoded as text).
#[db_test(migrated)]
async fn hashing_works_on_citext_and_varchar_columns(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE EXTENSION citext;
         CREATE SCHEMA app;
         CREATE TABLE app.contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
             anonymised_at timestamptz, email citext, phone varchar(80));
         INSERT INTO app.contacts VALUES
           (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-01-01', NULL, 'Ada@Example.com', '+44 1'),
           (2, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-01-01', NULL, NULL, '+44 2');",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Contact"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "app.contacts"
category = "contacts"
anchor = "created_at"
anonymise = { email = "hash", phone = "hash" }

[[category]]
name = "contacts"
strategy = "anonymise"
period = "30d"
"#;
    let cohort = from_policy(&db, policy).await.unwrap();
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.affected(), 2);
    let rows: Vec<(Option<String>, String)> =
        sqlx::query_as("SELECT email::text, phone FROM app.contacts ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(
        rows[0].0.as_deref(),
        Some(test_hmac_hex("Ada@Example.com").as_str())
    );
    assert_eq!(rows[0].1, test_hmac_hex("+44 1"));
    assert_eq!(rows[1].0, None, "NULL stays NULL");
}
