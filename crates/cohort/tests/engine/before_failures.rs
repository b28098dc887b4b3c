//! A failing `on_before` skips its row and the run goes on (the seeds'
//! execution rule): the row stays as it was and is counted `skipped`, its
//! work is dead-lettered once with a sanitised reason (never retryable),
//! the other rows of its batch are mutated and queued, the run's later
//! batches never pick it again, and the next run tries it again. A batch
//! whose every row fails stops the entity's loop.

use crate::support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::handlers::{
    BeforeContext, DeadLetterFilter, HandlerError, HandlerRegistration, RetrySelection, RowHandler,
};
use cohort::{Cohort, CohortConfig, Error, RunStatus, SweepRequest};
use sqlx::Row;
use support::*;
use uuid::Uuid;

const DOC_ID: &str = "6b0c3a52-96a4-4f0e-9f53-0d2b7c1e8a41";

struct Doc {
    id: i64,
}

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for Doc {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Ok(Doc {
            id: row.try_get("id")?,
        })
    }
}

/// How the handler treats a row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    Fails,
    Hangs,
}

/// Counts its `on_before` calls per row; fails (with personal data in the
/// message) or hangs for the rows in `faults`.
#[derive(Clone, Default)]
struct Fussy {
    calls: Arc<Mutex<HashMap<i64, u32>>>,
    faults: Arc<Mutex<HashMap<i64, Fault>>>,
}

impl Fussy {
    fn failing(ids: impl IntoIterator<Item = i64>) -> Self {
        let f = Fussy::default();
        f.faults
            .lock()
            .unwrap()
            .extend(ids.into_iter().map(|id| (id, Fault::Fails)));
        f
    }

    fn calls(&self, id: i64) -> u32 {
        self.calls.lock().unwrap().get(&id).copied().unwrap_or(0)
    }

    fn total_calls(&self) -> u32 {
        self.calls.lock().unwrap().values().sum()
    }
}

#[cohort::async_trait]
impl RowHandler<Doc> for Fussy {
    async fn on_before(&self, row: &Doc, ctx: &mut BeforeContext) -> Result<(), HandlerError> {
        *self.calls.lock().unwrap().entry(row.id).or_default() += 1;
        let fault = self.faults.lock().unwrap().get(&row.id).copied();
        match fault {
            Some(Fault::Fails) => Err(format!("no blob for secret-{}@example.com", row.id).into()),
            Some(Fault::Hangs) => std::future::pending().await,
            None => {
                ctx.snapshot.insert("id", row.id)?;
                Ok(())
            }
        }
    }
}

fn doc_entity() -> Uuid {
    Uuid::parse_str(DOC_ID).unwrap()
}

/// `app.docs`: `rows` rows owned by `u1`, every one past the 30-day
/// cutoff, anchors tied in groups of `tie` (so the keyset breaks ties by key).
async fn docs_db(rows: i64, tie: i64) -> cohort_pgtemp::TestDatabase {
    let db = migrated_db().await;
    exec(
        db.pool(),
        &format!(
            "CREATE SCHEMA app;
             CREATE TABLE app.docs (id bigint PRIMARY KEY, created_at timestamptz NOT NULL,
                 owner text NOT NULL, body text NOT NULL);
             CREATE INDEX ON app.docs (created_at, id);
             INSERT INTO app.docs
             SELECT g, timestamptz '2026-06-01T00:00:00Z' - interval '60 days' - (g / {tie}) * interval '1 minute',
                    'u1', 'body ' || g
             FROM generate_series(1, {rows}) g;"
        ),
    )
    .await;
    db
}

async fn docs_cohort(db: &cohort_pgtemp::TestDatabase, batch: u32, handler: &Fussy) -> Cohort {
    let config = batches_of(batch);
    docs_cohort_with(db, config, handler).await
}

async fn docs_cohort_with(
    db: &cohort_pgtemp::TestDatabase,
    config: CohortConfig,
    handler: &Fussy,
) -> Cohort {
    Cohort::builder(db.pool().clone())
        .config(config)
        .rules(rules())
        .declaration(
            cohort::EntityDeclaration::new("Doc", DOC_ID)
                .category("notes")
                .anchor("created_at")
                .table("app.docs")
                .subject("owner", None)
                .tenantless(),
        )
        .handler::<Doc, _>(
            HandlerRegistration::new(doc_entity(), "fussy"),
            handler.clone(),
        )
        .build()
        .await
        .unwrap()
}

async fn remaining(pool: &sqlx::PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT id FROM app.docs ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn details(pool: &sqlx::PgPool, run_id: Uuid, action: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT record_id FROM public.sweep_run_row_detail WHERE run_id = $1 AND action = $2 \
         ORDER BY record_id::bigint",
    )
    .bind(run_id)
    .bind(action)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// ACCOUNT-007, FAILURE-002: one row failing among 5000, across ten batches.
#[tokio::test]
async fn one_failing_row_among_5000_is_left_unchanged_dead_lettered_once_and_retried_next_run() {
    let db = docs_db(5000, 7).await;
    let fussy = Fussy::failing([2500]);
    let cohort = docs_cohort(&db, 500, &fussy).await;
    let row_before = table_digest(db.pool(), "app.docs").await;
    let r = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();

    assert_eq!(r.status, RunStatus::Succeeded, "{:?}", r.failures);
    assert!(r.failures.is_empty());
    let doc = r.entity("Doc").unwrap();
    assert_eq!((doc.affected, doc.skipped), (4999, 1));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["entities"][0]["skipped"], 1);
    assert_eq!(json["entities"][0]["affected"], 4999);
    // The row is exactly as it was; every other row is gone.
    assert_eq!(remaining(db.pool()).await, vec![2500]);
    assert_ne!(table_digest(db.pool(), "app.docs").await, row_before);
    let body: String = sqlx::query_scalar("SELECT body FROM app.docs WHERE id = 2500")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(body, "body 2500");
    assert_eq!(fussy.calls(2500), 1, "captured once, never picked again");
    assert_eq!(fussy.total_calls(), 5000);

    // The ledger: the summary counts it, the details name it `skipped`.
    let (affected, skipped): (i64, i64) = sqlx::query_as(
        "SELECT affected_count, skipped_count FROM public.sweep_run_entity_summary WHERE run_id = $1",
    )
    .bind(r.run_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!((affected, skipped), (4999, 1));
    assert_eq!(details(db.pool(), r.run_id, "purge").await.len(), 4999);
    assert_eq!(details(db.pool(), r.run_id, "skipped").await, vec!["2500"]);

    // One dead letter, sanitised, with no attempt and no payload; the
    // 4999 mutated rows' work is queued as usual.
    let letters = cohort.dead_letters(&DeadLetterFilter::all()).await.unwrap();
    assert_eq!(letters.len(), 1);
    let letter = &letters[0];
    assert_eq!(
        (
            letter.record_id.as_str(),
            letter.action.as_str(),
            letter.handler.as_str(),
            letter.attempts
        ),
        ("2500", "skipped", "fussy", 0)
    );
    let reason = letter.last_error.as_deref().unwrap();
    assert!(
        reason.starts_with("kind=handler code=on_before_failed diagnostic_id="),
        "{reason}"
    );
    assert!(!reason.contains("secret"), "{reason}");
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM public.sweep_row_handler_status WHERE status = 'pending' AND captured_payload IS NOT NULL",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(pending, 4999);

    // It can never be retried: its row was not changed.
    let refused = cohort
        .retry_dead_letters(&RetrySelection::Ids(vec![letter.id]))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, Error::Refused(m) if m.contains("never mutated")),
        "{refused}"
    );
    assert_eq!(
        cohort
            .retry_dead_letters(&RetrySelection::All)
            .await
            .unwrap(),
        0
    );
    let report = cohort.dispatcher().flush().await.unwrap();
    assert_eq!((report.delivered, report.dead_lettered), (4999, 0));
    assert_eq!(
        cohort.dead_letters(&DeadLetterFilter::all()).await.unwrap(),
        letters,
        "the dead letter is left as it was"
    );

    // The next run tries the row again; now its capture works.
    fussy.faults.lock().unwrap().clear();
    let again = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    let doc = again.entity("Doc").unwrap();
    assert_eq!((doc.affected, doc.skipped), (1, 0));
    assert_eq!(fussy.calls(2500), 2);
    assert!(remaining(db.pool()).await.is_empty());
    assert_eq!(
        details(db.pool(), again.run_id, "purge").await,
        vec!["2500"]
    );
}

/// FAILURE-002: failures in every batch, with tied anchors; the keyset
/// passes over them, so no row's `on_before` runs twice in a run.
#[tokio::test]
async fn failures_in_every_batch_are_passed_over_and_never_picked_again() {
    let db = docs_db(300, 10).await;
    let failing: HashSet<i64> = (1..=300).filter(|id| id % 3 == 0).collect();
    let fussy = Fussy::failing(failing.iter().copied());
    let cohort = docs_cohort(&db, 25, &fussy).await;
    let r = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(r.status, RunStatus::Succeeded);
    let doc = r.entity("Doc").unwrap();
    assert_eq!((doc.affected, doc.skipped), (200, 100));
    for id in 1..=300 {
        assert_eq!(fussy.calls(id), 1, "row {id}");
    }
    let left: HashSet<i64> = remaining(db.pool()).await.into_iter().collect();
    assert_eq!(left, failing);
    let letters = cohort
        .dead_letters(&DeadLetterFilter::all().limit(1000))
        .await
        .unwrap();
    let named: HashSet<i64> = letters
        .iter()
        .map(|l| l.record_id.parse().unwrap())
        .collect();
    assert_eq!((letters.len(), named), (100, failing));
}

/// FAILURE-002 for erasure: its batches continue after the last key too.
#[tokio::test]
async fn erasure_passes_over_rows_whose_on_before_fails() {
    let db = docs_db(60, 1).await;
    let failing: HashSet<i64> = (1..=60).filter(|id| id % 4 == 0).collect();
    let fussy = Fussy::failing(failing.iter().copied());
    let cohort = docs_cohort(&db, 10, &fussy).await;
    let r = cohort
        .erase(ErasureRequest::tenantless(ErasureScope::new("u1"), now()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Succeeded);
    let doc = r.entity("Doc").unwrap();
    assert_eq!((doc.affected, doc.skipped), (45, 15));
    for id in 1..=60 {
        assert_eq!(fussy.calls(id), 1, "row {id}");
    }
    let left: HashSet<i64> = remaining(db.pool()).await.into_iter().collect();
    assert_eq!(left, failing);
    assert_eq!(details(db.pool(), r.run_id, "skipped").await.len(), 15);
}

/// A batch in which every row fails makes no progress: the loop stops
/// after it, nothing is changed, and every row left is counted.
#[tokio::test]
async fn a_batch_whose_every_row_fails_stops_the_loop() {
    let db = docs_db(50, 1).await;
    let fussy = Fussy::failing(1..=50);
    let cohort = docs_cohort(&db, 10, &fussy).await;
    let before = table_digest(db.pool(), "app.docs").await;
    let r = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(r.status, RunStatus::Succeeded);
    assert!(r.failures.is_empty());
    let doc = r.entity("Doc").unwrap();
    assert_eq!(
        (doc.affected, doc.skipped),
        (0, 50),
        "every eligible row left is skipped"
    );
    assert_eq!(fussy.total_calls(), 10, "one batch, then the loop stopped");
    assert_eq!(table_digest(db.pool(), "app.docs").await, before);
    assert_eq!(
        cohort
            .dead_letters(&DeadLetterFilter::all())
            .await
            .unwrap()
            .len(),
        10
    );
}

/// A hung `on_before` times out (9/10 of `claim_timeout`) and skips only
/// its row.
#[tokio::test]
async fn a_timed_out_on_before_skips_only_its_row() {
    let db = docs_db(20, 1).await;
    let fussy = Fussy::default();
    fussy.faults.lock().unwrap().insert(7, Fault::Hangs);
    let mut config = test_config();
    config.dispatch.claim_timeout = cohort::rules::Period::from_seconds(1).unwrap();
    let cohort = docs_cohort_with(&db, config, &fussy).await;
    let r = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    let doc = r.entity("Doc").unwrap();
    assert_eq!((doc.affected, doc.skipped), (19, 1));
    assert_eq!(remaining(db.pool()).await, vec![7]);
    let letters = cohort.dead_letters(&DeadLetterFilter::all()).await.unwrap();
    assert_eq!(letters.len(), 1);
    assert!(letters[0]
        .last_error
        .as_deref()
        .unwrap()
        .starts_with("kind=handler code=on_before_timed_out"));
}
