//! Durable row handlers and the dispatcher, on a real server: capture in
//! the batch transaction, queue with the mutation, deliver in order at
//! least once, retry and dead-letter, fence stale deliveries, and recover
//! runs a crashed process left started.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::sync::{Arc, Mutex};

use cohort::handlers::{
    AfterContext, BeforeContext, HandlerError, HandlerRegistration, Phase, RowHandler,
    SnapshotValue,
};
use cohort::holds::HoldRequest;
use cohort::{Cohort, CohortConfig, RunStatus, SweepRequest};
use sqlx::Row;
use support::*;
use uuid::Uuid;

/// A note as handlers see it.
struct Note {
    id: Uuid,
    body: String,
}

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for Note {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Ok(Note {
            id: row.try_get("id")?,
            body: row.try_get("body")?,
        })
    }
}

type Log = Arc<Mutex<Vec<(String, String, String, u32)>>>;

/// Captures the body; on delivery logs (handler, record, body, attempt).
/// Fails its first `fail_first` deliveries, and fails capture for bodies
/// ending in `fail_capture_for`.
struct Recording {
    name: &'static str,
    log: Log,
    fail_first: u32,
    fail_capture_for: Option<&'static str>,
}

#[cohort::async_trait]
impl RowHandler<Note> for Recording {
    async fn on_before(&self, row: &Note, ctx: &mut BeforeContext) -> Result<(), HandlerError> {
        if self
            .fail_capture_for
            .is_some_and(|suffix| row.body.ends_with(suffix))
        {
            return Err("cannot capture this one".into());
        }
        assert_eq!(ctx.record_id, row.id.to_string());
        ctx.snapshot.insert("body", row.body.clone())?;
        ctx.snapshot.insert("id", row.id)?;
        Ok(())
    }

    async fn on_after(&self, ctx: &AfterContext) -> Result<(), HandlerError> {
        if ctx.attempt <= self.fail_first {
            return Err("crm said no for secret@example.com".into());
        }
        let Some(SnapshotValue::Text(body)) = ctx.snapshot.get("body") else {
            return Err("no body captured".into());
        };
        assert!(
            matches!(ctx.snapshot.get("id"), Some(SnapshotValue::Uuid(id)) if id.to_string() == ctx.record_id)
        );
        self.log.lock().unwrap().push((
            self.name.to_string(),
            ctx.record_id.clone(),
            body.clone(),
            ctx.attempt,
        ));
        Ok(())
    }
}

fn note_entity() -> Uuid {
    Uuid::parse_str(NOTE_ID).unwrap()
}

fn recording(name: &'static str, log: &Log) -> Recording {
    Recording {
        name,
        log: log.clone(),
        fail_first: 0,
        fail_capture_for: None,
    }
}

async fn cohort_with(
    db: &cohort_pgtemp::TestDatabase,
    config: CohortConfig,
    handlers: Vec<(HandlerRegistration, Recording)>,
) -> Cohort {
    let mut b = Cohort::builder(db.pool().clone())
        .config(config)
        .rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    for (r, h) in handlers {
        b = b.handler::<Note, _>(r, h);
    }
    b.build().await.unwrap()
}

async fn queue(pool: &sqlx::PgPool, filter: &str) -> i64 {
    count(
        pool,
        &format!("SELECT count(*) FROM public.sweep_row_handler_status WHERE {filter}"),
    )
    .await
}

#[db_test(engine)]
async fn handlers_run_in_order_with_their_snapshots_and_held_rows_queue_nothing(db: TestDatabase) {
    let log: Log = Arc::default();
    let cohort = cohort_with(
        &db,
        test_config(),
        vec![
            (
                HandlerRegistration::new(note_entity(), "second").priority(20),
                recording("second", &log),
            ),
            (
                HandlerRegistration::new(note_entity(), "first").priority(10),
                recording("first", &log),
            ),
            (
                HandlerRegistration::new(note_entity(), "last-unprioritised"),
                recording("last-unprioritised", &log),
            ),
        ],
    )
    .await;
    let held: Uuid = sqlx::query_scalar(
        "SELECT id FROM app.notes WHERE body = 'aaaaaaaa-0000-0000-0000-00000000000a:45d'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    cohort
        .create_hold(HoldRequest::new(note_entity(), held.to_string(), "case").tenant(TENANT_A))
        .await
        .unwrap();
    let bodies: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT id, body FROM app.notes WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a' \
         AND created_at < '2026-05-02' AND id <> $1 ORDER BY id",
    )
    .bind(held)
    .fetch_all(db.pool())
    .await
    .unwrap();
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    let note = r.entity("Note").unwrap();
    assert_eq!((note.affected, note.held), (bodies.len() as u64, 1));
    // One piece of work per handler per mutated row; none for the held row.
    assert_eq!(queue(db.pool(), "TRUE").await, 3 * bodies.len() as i64);
    assert_eq!(
        queue(
            db.pool(),
            &format!("row_detail_id IN (SELECT row_detail_id FROM public.sweep_run_row_detail WHERE record_id = '{held}')")
        )
        .await,
        0
    );
    // Other entities have no handlers and queue nothing.
    let report = cohort.dispatcher().flush().await.unwrap();
    assert_eq!(report.delivered, 3 * bodies.len() as u64);
    assert_eq!(
        (report.pending, report.in_flight, report.dead_lettered),
        (0, 0, 0)
    );
    let log = log.lock().unwrap().clone();
    for (id, body) in &bodies {
        let seen: Vec<&str> = log
            .iter()
            .filter(|(_, r, _, _)| *r == id.to_string())
            .map(|(h, _, b, _)| {
                assert_eq!(b, body, "on_after gets what on_before captured");
                h.as_str()
            })
            .collect();
        assert_eq!(seen, vec!["first", "second", "last-unprioritised"]);
    }
    // Payloads are cleared once every handler of a row is terminal.
    assert_eq!(queue(db.pool(), "captured_payload IS NOT NULL").await, 0);
    assert_eq!(
        queue(db.pool(), "status = 'succeeded'").await,
        3 * bodies.len() as i64
    );
    // Erasure queues work too.
    let report = cohort.dispatcher().flush().await.unwrap();
    assert_eq!(report.delivered, 0, "nothing is delivered twice");
}

/// The seeds' rule: a failing `on_before` leaves its row as it was and
/// dead-letters its work once; the rest of the batch is mutated and
/// queued, and the run succeeds (failures.rs goes further).
#[db_test(engine)]
async fn an_on_before_failure_skips_only_its_row(db: TestDatabase) {
    let log: Log = Arc::default();
    let mut failing = recording("fussy", &log);
    failing.fail_capture_for = Some(":45d");
    let cohort = cohort_with(
        &db,
        test_config(),
        vec![(HandlerRegistration::new(note_entity(), "fussy"), failing)],
    )
    .await;
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Succeeded, "{:?}", r.failures);
    let note = r.entity("Note").unwrap();
    // Of tenant A's three notes past the cutoff, the 45-day one is left.
    assert_eq!((note.affected, note.skipped), (2, 1));
    assert_eq!(
        labels(
            db.pool(),
            &format!("SELECT body FROM app.notes WHERE tenant_id = '{TENANT_A}' AND created_at < '2026-05-02'")
        )
        .await,
        vec![format!("{TENANT_A}:45d")]
    );
    assert_eq!(queue(db.pool(), "status = 'pending'").await, 2);
    assert_eq!(
        queue(
            db.pool(),
            "status = 'dead_lettered' AND attempts = 0 AND captured_payload IS NULL \
             AND last_error LIKE 'kind=handler code=on_before_failed diagnostic_id=%'"
        )
        .await,
        1
    );
    // The other entities' work stands.
    assert!(r.entity("Ticket").unwrap().affected > 0);
}

#[db_test(engine)]
async fn failed_deliveries_retry_with_backoff_then_succeed_or_dead_letter(db: TestDatabase) {
    let log: Log = Arc::default();
    let mut config = test_config();
    config.dispatch.max_attempts = 3;
    let mut flaky = recording("flaky", &log);
    flaky.fail_first = 1;
    let mut hopeless = recording("hopeless", &log);
    hopeless.fail_first = u32::MAX;
    let cohort = cohort_with(
        &db,
        config,
        vec![
            (
                HandlerRegistration::new(note_entity(), "flaky").priority(1),
                flaky,
            ),
            (
                HandlerRegistration::new(note_entity(), "hopeless").priority(2),
                hopeless,
            ),
        ],
    )
    .await;
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let rows = r.entity("Note").unwrap().affected as i64;
    let d = cohort.dispatcher();
    let first = d.flush().await.unwrap();
    assert_eq!((first.failed, first.delivered), (rows as u64, 0));
    // Not due again before the backoff (1s base): nothing is attempted.
    let early = d.flush().await.unwrap();
    assert_eq!(
        (early.failed, early.delivered, early.pending),
        (0, 0, 2 * rows as u64)
    );
    let due_in: f64 = sqlx::query_scalar(
        "SELECT min(extract(epoch FROM next_attempt_at - now()))::float8 FROM public.sweep_row_handler_status WHERE handler_id = 'flaky'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(due_in > 0.0 && due_in <= 1.0, "{due_in}");
    // Make everything due now (instead of sleeping through the backoff).
    let due_now = "UPDATE public.sweep_row_handler_status SET next_attempt_at = now() WHERE status = 'pending'";
    exec(db.pool(), due_now).await;
    let second = d.flush().await.unwrap();
    assert_eq!(second.delivered, rows as u64, "flaky succeeds on attempt 2");
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .all(|(h, _, _, a)| h == "flaky" && *a == 2));
    // `hopeless` runs only after `flaky` succeeded for the row; it fails 3 times.
    for _ in 0..3 {
        exec(db.pool(), due_now).await;
        d.flush().await.unwrap();
    }
    assert_eq!(
        queue(
            db.pool(),
            "handler_id = 'hopeless' AND status = 'dead_lettered'"
        )
        .await,
        rows
    );
    let errors: Vec<String> = sqlx::query_scalar(
        "SELECT last_error FROM public.sweep_row_handler_status WHERE status = 'dead_lettered'",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    for e in errors {
        assert!(
            e.starts_with("kind=handler code=on_after_failed diagnostic_id="),
            "{e}"
        );
        assert!(
            !e.contains("secret@example.com"),
            "handler text is never stored"
        );
    }
    assert_eq!(
        queue(db.pool(), "handler_id = 'hopeless' AND attempts = 3").await,
        rows
    );
    // A row whose work dead-lettered keeps its payloads for a retry (they
    // are cleared once all of the row's work succeeded, or by the backstop).
    assert_eq!(
        queue(db.pool(), "captured_payload IS NOT NULL").await,
        2 * rows
    );
}

/// A handler whose first delivery blocks until released.
struct Blocking {
    release: Arc<tokio::sync::Notify>,
    started: Arc<tokio::sync::Notify>,
    calls: Arc<Mutex<u32>>,
}

#[cohort::async_trait]
impl RowHandler<Note> for Blocking {
    async fn on_after(&self, _ctx: &AfterContext) -> Result<(), HandlerError> {
        let first = {
            let mut calls = self.calls.lock().unwrap();
            *calls += 1;
            *calls == 1
        };
        if first {
            self.started.notify_one();
            self.release.notified().await;
        }
        Ok(())
    }
}

#[db_test(engine)]
async fn a_stale_delivery_cannot_settle_once_its_claim_was_taken_over(db: TestDatabase) {
    let release = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let calls = Arc::new(Mutex::new(0));
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules())
        .declaration(engine_entities().remove(0));
    b = b.handler::<Note, _>(
        HandlerRegistration::new(note_entity(), "blocking"),
        Blocking {
            release: release.clone(),
            started: started.clone(),
            calls: calls.clone(),
        },
    );
    let cohort = b.build().await.unwrap();
    // One row only, so the blocked delivery is the only work.
    exec(
        db.pool(),
        "DELETE FROM app.notes WHERE body <> 'aaaaaaaa-0000-0000-0000-00000000000a:45d'",
    )
    .await;
    cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let stale = cohort.dispatcher();
    let first = tokio::spawn(async move { stale.flush().await.unwrap() });
    tokio::time::timeout(std::time::Duration::from_secs(20), started.notified())
        .await
        .expect("the first delivery started");
    assert_eq!(
        queue(db.pool(), "status = 'in_flight' AND attempts = 1").await,
        1
    );
    // The first delivery overran: its claim expires and another dispatcher reclaims.
    exec(
        db.pool(),
        "UPDATE public.sweep_row_handler_status SET claim_expires_at = now() - interval '1 second'",
    )
    .await;
    let second = cohort.dispatcher().flush().await.unwrap();
    assert_eq!(second.delivered, 1);
    assert_eq!(
        queue(db.pool(), "status = 'succeeded' AND attempts = 2").await,
        1
    );
    // The stale delivery finishes now: it cannot settle anything.
    release.notify_one();
    let first = first.await.unwrap();
    assert_eq!((first.superseded, first.delivered), (1, 0));
    assert_eq!(
        queue(db.pool(), "status = 'succeeded' AND attempts = 2").await,
        1
    );
    assert_eq!(*calls.lock().unwrap(), 2);
}

#[db_test(engine)]
async fn unknown_tampered_and_scrubbed_work_dead_letters_with_its_reason(db: TestDatabase) {
    let log: Log = Arc::default();
    let with = cohort_with(
        &db,
        test_config(),
        vec![
            (
                HandlerRegistration::new(note_entity(), "kept"),
                recording("kept", &log),
            ),
            (
                HandlerRegistration::new(note_entity(), "removed"),
                recording("removed", &log),
            ),
        ],
    )
    .await;
    with.sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT handler_status_id FROM public.sweep_row_handler_status WHERE handler_id = 'kept' ORDER BY 1",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(ids.len() >= 3);
    // Tamper with one payload, make another older than payload_retention.
    exec(
        db.pool(),
        &format!(
            "UPDATE public.sweep_row_handler_status SET captured_payload = '{{\"body\": {{\"t\": \"uuid\", \"v\": \"nope\"}}}}' WHERE handler_status_id = {};
             UPDATE public.sweep_row_handler_status SET created_at = now() - interval '31 days' WHERE handler_status_id = {};",
            ids[0], ids[1]
        ),
    )
    .await;
    // The code no longer registers `removed`.
    let without = cohort_with(
        &db,
        test_config(),
        vec![(
            HandlerRegistration::new(note_entity(), "kept"),
            recording("kept", &log),
        )],
    )
    .await;
    let report = without.dispatcher().flush().await.unwrap();
    assert_eq!(report.scrubbed, 1);
    let reason = |id: i64| {
        let pool = db.pool().clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT last_error FROM public.sweep_row_handler_status WHERE handler_status_id = $1 AND status = 'dead_lettered'",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert!(reason(ids[0])
        .await
        .starts_with("tampered or unreadable payload"));
    assert!(reason(ids[1])
        .await
        .starts_with("payload scrubbed after payload_retention"));
    let removed = queue(db.pool(), "handler_id = 'removed' AND status = 'dead_lettered' AND last_error LIKE 'unknown handler \"removed\"%'").await;
    assert_eq!(removed, ids.len() as i64);
    assert_eq!(report.dead_lettered, 2 + ids.len() as u64);
    assert_eq!(report.delivered, ids.len() as u64 - 2);
}

#[db_test(engine)]
async fn after_sweep_settled_work_waits_for_its_run_and_only_dead_runs_are_recovered(
    db: TestDatabase,
) {
    let log: Log = Arc::default();
    let mut config = test_config();
    config.dispatch.settle_timeout = "1m".parse().unwrap();
    let cohort = cohort_with(
        &db,
        config,
        vec![(
            HandlerRegistration::new(note_entity(), "archive").phase(Phase::AfterSweepSettled),
            recording("archive", &log),
        )],
    )
    .await;
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let rows = r.entity("Note").unwrap().affected;
    // As if the process had died after its batches: the run is still started.
    exec(
        db.pool(),
        &format!(
            "UPDATE public.sweep_run SET status = 'started', settled_at = NULL, started_at = now() - interval '2 hours' WHERE run_id = '{}'",
            r.run_id
        ),
    )
    .await;
    // A live run holds its lock: it is neither recovered nor its work released.
    let mut holder = db.connect().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
        .bind(format!("cohort.run:{}", r.run_id))
        .execute(&mut holder)
        .await
        .unwrap();
    let report = cohort.dispatcher().flush().await.unwrap();
    assert_eq!(
        (report.recovered_runs, report.delivered, report.pending),
        (0, 0, rows)
    );
    drop(holder);
    wait_until(
        "the holder's session to end",
        std::time::Duration::from_secs(30),
        || run_lock_free(db.pool(), r.run_id),
    )
    .await;
    let report = cohort.dispatcher().flush().await.unwrap();
    assert_eq!(report.recovered_runs, 1);
    assert_eq!(report.delivered, rows);
    let shown = cohort.show_run(r.run_id).await.unwrap();
    assert_eq!(shown.status, RunStatus::Failed);
}

/// A handler that fails until the test says the far side is healthy.
struct Toggle(Arc<std::sync::atomic::AtomicBool>);

#[cohort::async_trait]
impl RowHandler<Note> for Toggle {
    async fn on_before(&self, row: &Note, ctx: &mut BeforeContext) -> Result<(), HandlerError> {
        ctx.snapshot.insert("id", row.id)?;
        Ok(())
    }

    async fn on_after(&self, _ctx: &AfterContext) -> Result<(), HandlerError> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err("far side down".into())
        }
    }
}

#[tokio::test]
async fn dead_letters_are_listed_and_retried_and_bad_retries_change_nothing() {
    use cohort::handlers::{DeadLetterFilter, RetrySelection};
    let db = engine_db().await;
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut config = test_config();
    config.dispatch.max_attempts = 1;
    let cohort = Cohort::builder(db.pool().clone())
        .config(config)
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .handler::<Note, _>(
            HandlerRegistration::new(note_entity(), "crm"),
            Toggle(healthy.clone()),
        )
        .build()
        .await
        .unwrap();
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let rows = r.entity("Note").unwrap().affected;
    let report = cohort.dispatcher().flush().await.unwrap();
    assert_eq!(report.dead_lettered, rows);
    let letters = cohort
        .dead_letters(&DeadLetterFilter::all().entity(note_entity()).handler("crm"))
        .await
        .unwrap();
    assert_eq!(letters.len() as u64, rows);
    assert!(letters
        .iter()
        .all(|l| l.entity == "Note" && l.attempts == 1 && l.run_id == r.run_id));
    assert!(cohort
        .dead_letters(&DeadLetterFilter::all().handler("other"))
        .await
        .unwrap()
        .is_empty());
    let ids: Vec<i64> = letters.iter().map(|l| l.id).collect();
    // Bad retries change nothing.
    let before = table_digest(db.pool(), "public.sweep_row_handler_status").await;
    let unknown = cohort
        .retry_dead_letters(&RetrySelection::Ids(vec![ids[0], 999_999]))
        .await
        .unwrap_err();
    assert_eq!(unknown.kind(), cohort::ErrorKind::NotFound);
    exec(
        db.pool(),
        &format!("UPDATE public.sweep_row_handler_status SET captured_payload = NULL, payload_scrubbed_at = now() WHERE handler_status_id = {}", ids[1]),
    )
    .await;
    let scrubbed_digest = table_digest(db.pool(), "public.sweep_row_handler_status").await;
    let scrubbed = cohort
        .retry_dead_letters(&RetrySelection::Ids(vec![ids[0], ids[1]]))
        .await
        .unwrap_err();
    assert_eq!(scrubbed.kind(), cohort::ErrorKind::Refused);
    assert_eq!(
        table_digest(db.pool(), "public.sweep_row_handler_status").await,
        scrubbed_digest
    );
    assert_ne!(before, scrubbed_digest);
    // The far side is back: retry everything retryable and deliver it.
    healthy.store(true, std::sync::atomic::Ordering::SeqCst);
    let requeued = cohort
        .retry_dead_letters(&RetrySelection::All)
        .await
        .unwrap();
    assert_eq!(requeued, rows - 1, "all but the scrubbed one");
    let report = cohort.dispatcher().flush().await.unwrap();
    assert_eq!(report.delivered, rows - 1);
    let again = cohort
        .retry_dead_letters(&RetrySelection::Ids(vec![ids[0]]))
        .await
        .unwrap_err();
    assert_eq!(
        again.kind(),
        cohort::ErrorKind::Conflict,
        "succeeded work is not dead-lettered"
    );
}

/// ERASURE-007: a dry-run erasure runs no handlers and queues nothing; a
/// live erasure queues work only for the rows it changed (held ones not).
#[db_test(engine)]
async fn erasure_queues_work_only_for_the_rows_it_changes(db: TestDatabase) {
    let log: Log = Arc::default();
    // Notes gain a subject column for this test.
    exec(db.pool(), "ALTER TABLE app.notes ADD COLUMN user_id text; UPDATE app.notes SET user_id = 'u-1' WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a'").await;
    let mut decls = engine_entities();
    decls[0] = decls[0].clone().subject("user_id", None);
    let mut b2 = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules());
    for d in decls {
        b2 = b2.declaration(d);
    }
    let cohort = b2
        .handler::<Note, _>(
            HandlerRegistration::new(note_entity(), "erase-log"),
            recording("erase-log", &log),
        )
        .build()
        .await
        .unwrap();
    let held: Uuid = sqlx::query_scalar(
        "SELECT id FROM app.notes WHERE body = 'aaaaaaaa-0000-0000-0000-00000000000a:1d'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    cohort
        .create_hold(HoldRequest::new(note_entity(), held.to_string(), "case").tenant(TENANT_A))
        .await
        .unwrap();
    let erase = |dry: bool| {
        cohort::erasure::ErasureRequest::tenanted(
            TENANT_A,
            cohort::erasure::ErasureScope::new("u-1"),
            now(),
        )
        .dry_run(dry)
    };
    let dry = cohort.erase(erase(true)).await.unwrap();
    assert!(dry.entity("Note").unwrap().affected > 0);
    assert_eq!(
        queue(db.pool(), "TRUE").await,
        0,
        "a dry run queues nothing"
    );
    let live = cohort.erase(erase(false)).await.unwrap();
    let note = live.entity("Note").unwrap();
    assert_eq!(note.held, 1);
    assert_eq!(queue(db.pool(), "TRUE").await, note.affected as i64);
    let report = cohort.dispatcher().flush().await.unwrap();
    assert_eq!(report.delivered, note.affected);
    assert!(log
        .lock()
        .unwrap()
        .iter()
        .all(|(_, record, _, _)| *record != held.to_string()));
}

/// Succeeds, but first has another session lock its own queue row (and
/// keeps that transaction open), so recording the outcome cannot finish.
struct LocksItsRow {
    pool: sqlx::PgPool,
    held: Arc<tokio::sync::Mutex<Option<sqlx::pool::PoolConnection<sqlx::Postgres>>>>,
}

#[cohort::async_trait]
impl RowHandler<Note> for LocksItsRow {
    async fn on_after(&self, ctx: &AfterContext) -> Result<(), HandlerError> {
        let mut conn = self.pool.acquire().await?;
        sqlx::query("BEGIN").execute(&mut *conn).await?;
        sqlx::query(
            "SELECT 1 FROM public.sweep_row_handler_status WHERE handler_status_id = $1 FOR UPDATE",
        )
        .bind(ctx.work_id)
        .execute(&mut *conn)
        .await?;
        *self.held.lock().await = Some(conn);
        Ok(())
    }
}

/// DISPATCH-002: recording an outcome has its own bounded time-out; when it
/// cannot be recorded, the delivery stays in flight (to be reclaimed) and
/// the flush goes on instead of hanging.
#[db_test(engine)]
async fn an_outcome_that_cannot_be_recorded_leaves_the_work_in_flight(db: TestDatabase) {
    let held = Arc::new(tokio::sync::Mutex::new(None));
    let mut config = test_config();
    config.dispatch.claim_timeout = "10s".parse().unwrap(); // cleanup time-out: 1 s
    let cohort = Cohort::builder(db.pool().clone())
        .config(config)
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .handler::<Note, _>(
            HandlerRegistration::new(note_entity(), "locks"),
            LocksItsRow {
                pool: db.pool().clone(),
                held: held.clone(),
            },
        )
        .build()
        .await
        .unwrap();
    exec(
        db.pool(),
        "DELETE FROM app.notes WHERE body <> 'aaaaaaaa-0000-0000-0000-00000000000a:45d'",
    )
    .await;
    cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let report = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        cohort.dispatcher().flush(),
    )
    .await
    .expect("the flush does not hang")
    .unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!((report.unrecorded, report.delivered), (1, 0));
    // Release the lock. The abandoned statement may still land once the
    // database catches up (the delivery did succeed); otherwise the work is
    // in flight with its attempt spent, reclaimed when its claim expires.
    // Either way the row is consistent: one attempt, never retried early.
    if let Some(mut conn) = held.lock().await.take() {
        sqlx::query("ROLLBACK").execute(&mut *conn).await.unwrap();
    }
    // Wait until no other session is still running a statement on the
    // queue (the abandoned one landed or was given up).
    wait_until("the abandoned statement to finish", std::time::Duration::from_secs(20), async || {
        count(
            db.pool(),
            "SELECT count(*) FROM pg_stat_activity WHERE state <> 'idle' AND pid <> pg_backend_pid() \
             AND datname = current_database() AND query LIKE '%sweep_row_handler_status%'",
        )
        .await
            == 0
    })
    .await;
    let state: Vec<(String, i32)> =
        sqlx::query_as("SELECT status, attempts FROM public.sweep_row_handler_status")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(state.len(), 1);
    assert!(
        matches!(state[0].0.as_str(), "in_flight" | "succeeded") && state[0].1 == 1,
        "{state:?}"
    );
}

/// CONCURRENCY-001 with handlers: two sweeps at once queue each mutated
/// row's work exactly once, and it is delivered exactly once.
#[db_test(engine, flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sweeps_queue_each_row_once(db: TestDatabase) {
    factory::notes(TENANT_A)
        .created(factory::at("2026-01-01T00:00:00Z"))
        .numbered("bulk:")
        .count(3000)
        .insert(db.pool())
        .await;
    let log: Log = Arc::default();
    let build = || async {
        let mut config = test_config();
        config.sweep_batch_size = cohort::BatchSize::Fixed(200);
        Cohort::builder(db.pool().clone())
            .config(config)
            .rules(rules())
            .declaration(engine_entities().remove(0))
            .handler::<Note, _>(
                HandlerRegistration::new(note_entity(), "log"),
                recording("log", &log),
            )
            .build()
            .await
            .unwrap()
    };
    let (a, b) = (build().await, build().await);
    let (ra, rb) = tokio::join!(
        a.sweep(SweepRequest::tenanted(TENANT_A, now())),
        b.sweep(SweepRequest::tenanted(TENANT_A, now()))
    );
    let total = ra.unwrap().affected() + rb.unwrap().affected();
    assert_eq!(total, 3003);
    assert_eq!(queue(db.pool(), "TRUE").await, total as i64);
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM (SELECT record_id FROM public.sweep_run_row_detail GROUP BY record_id HAVING count(*) > 1) d"
        )
        .await,
        0,
        "no row detailed (or queued) twice"
    );
    let (da, db2) = (a.dispatcher(), b.dispatcher());
    let (fa, fb) = tokio::join!(da.flush(), db2.flush());
    assert_eq!(fa.unwrap().delivered + fb.unwrap().delivered, total);
    let log = log.lock().unwrap();
    let distinct: std::collections::HashSet<&String> = log.iter().map(|(_, r, _, _)| r).collect();
    assert_eq!((log.len() as u64, distinct.len() as u64), (total, total));
}

/// Policy handlers that could never work are refused before anything runs:
/// a captured column of a type they cannot capture, a time-out past the
/// delivery deadline, a webhook whose signing secret is missing.
#[db_test(engine)]
async fn policy_handlers_that_could_never_work_are_refused(db: TestDatabase) {
    exec(db.pool(), "ALTER TABLE app.notes ADD COLUMN amount numeric").await;
    let policy = |handler: &str| {
        format!(
            r#"
[cohort.dispatch]
claim_timeout = "10s"

[[entity]]
name = "Note"
id = "{NOTE_ID}"
table = "app.notes"
category = "notes"
anchor = "created_at"

{handler}

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
"#
        )
    };
    let pool = db.pool().clone();
    let build = |text: String| {
        let pool = pool.clone();
        async move {
            let p = cohort::policy::PolicyFile::parse(&text)?;
            Cohort::builder(pool).policy(p).build().await
        }
    };
    let err = build(policy(
        "[[entity.handler]]\nname = \"h\"\ncapture = [\"amount\"]\ncommand = [\"true\"]",
    ))
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("captures column \"amount\" of type numeric"),
        "{err}"
    );
    let err = build(policy(
        "[[entity.handler]]\nname = \"h\"\ncapture = [\"nope\"]\ncommand = [\"true\"]",
    ))
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("captures column \"nope\""),
        "{err}"
    );
    let err = build(policy(
        "[[entity.handler]]\nname = \"h\"\ntimeout = \"9s\"\ncommand = [\"true\"]",
    ))
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("exceeds the delivery deadline"),
        "{err}"
    );
    let err = build(policy(
        "[[entity.handler]]\nname = \"h\"\nurl = \"http://127.0.0.1:9/\"\nsecret_env = \"COHORT_TEST_NEVER_SET_ANYWHERE\"",
    ))
    .await
    .unwrap_err();
    assert!(err.to_string().contains("which is not set"), "{err}");
    // Commands are resolved and checked when the policy is loaded; urls
    // must be absolute http(s) URLs with a host.
    let dir = tempfile::tempdir().unwrap();
    let not_exec = dir.path().join("script.sh");
    std::fs::write(&not_exec, "#!/bin/sh\nexit 0\n").unwrap();
    for (handler, expected) in [
        (
            "command = [\"cohort-no-such-program-anywhere\"]".to_string(),
            "is not an executable file on PATH",
        ),
        (
            format!("command = [{:?}]", dir.path().display().to_string()),
            "is not a file",
        ),
        (
            format!("command = [{:?}]", not_exec.display().to_string()),
            "is not executable",
        ),
        (
            "command = [\"/no/such/dir/prog\"]".to_string(),
            "cannot be used",
        ),
        (
            "url = \"ftp://example.com/\"".to_string(),
            "must start with http",
        ),
        ("url = \"http://\"".to_string(), "not a valid URL"),
        ("url = \"/hooks/local\"".to_string(), "must start with http"),
        ("url = \"https:///path\"".to_string(), "not a valid URL"),
    ] {
        let err = cohort::policy::PolicyFile::parse(&policy(&format!(
            "[[entity.handler]]\nname = \"h\"\n{handler}"
        )))
        .unwrap_err();
        assert!(err.to_string().contains(expected), "{handler}: {err}");
    }
    // A good one builds.
    build(policy(
        "[[entity.handler]]\nname = \"h\"\ncapture = [\"body\", \"created_at\"]\ntimeout = \"5s\"\ncommand = [\"true\"]",
    ))
    .await
    .unwrap();
}

/// A database with one old note, a handle with `handler` on notes, and a
/// sweep that queued the note's one delivery.
async fn one_queued_delivery<H: RowHandler<Note>>(
    name: &str,
    handler: H,
) -> (cohort_pgtemp::TestDatabase, Cohort) {
    let db = engine_db().await;
    exec(
        db.pool(),
        "DELETE FROM app.notes WHERE body <> 'aaaaaaaa-0000-0000-0000-00000000000a:45d'",
    )
    .await;
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .handler::<Note, _>(HandlerRegistration::new(note_entity(), name), handler)
        .build()
        .await
        .unwrap();
    cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    (db, cohort)
}

/// A handler that never finishes unless cancelled.
struct Stuck;

#[cohort::async_trait]
impl RowHandler<Note> for Stuck {
    async fn on_after(&self, _ctx: &AfterContext) -> Result<(), HandlerError> {
        std::future::pending::<()>().await;
        Ok(())
    }
}

/// RS-012 (dispatcher side): at shutdown an in-flight delivery that ends
/// within the grace period settles normally; one that does not is
/// cancelled and its claim released (due again at once, the attempt counted),
/// so another dispatcher picks it up at once instead of after the claim
/// time-out.
#[tokio::test]
async fn shutdown_lets_deliveries_finish_within_the_grace_period_then_releases_them() {
    use cohort::services::Services;
    use std::time::Duration;
    let release = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let (db, cohort) = one_queued_delivery(
        "blocking",
        Blocking {
            release: release.clone(),
            started: started.clone(),
            calls: Arc::new(Mutex::new(0)),
        },
    )
    .await;
    let services = Services::new(&cohort)
        .unwrap()
        .grace_period(Duration::from_secs(20))
        .spawn();
    tokio::time::timeout(Duration::from_secs(20), started.notified())
        .await
        .expect("the delivery started");
    let stopping = tokio::spawn(services.shutdown());
    // Shutdown is under way once the maintenance service has left its peer
    // record; the dispatcher is still waiting for the blocked delivery.
    wait_until("maintenance to stop", Duration::from_secs(20), async || {
        count(db.pool(), "SELECT count(*) FROM public.retention_peer").await == 0
    })
    .await;
    assert!(!stopping.is_finished(), "shutdown waits for the delivery");
    release.notify_one();
    let report = stopping.await.unwrap();
    assert!(report.clean(), "{report:?}");
    assert_eq!(
        queue(db.pool(), "status = 'succeeded' AND attempts = 1").await,
        1
    );

    // A delivery that outlives the grace period.
    let (db, cohort) = one_queued_delivery("stuck", Stuck).await;
    let services = Services::new(&cohort)
        .unwrap()
        .grace_period(Duration::from_millis(500))
        .spawn();
    wait_until(
        "the stuck delivery to be in flight",
        Duration::from_secs(10),
        async || queue(db.pool(), "status = 'in_flight'").await == 1,
    )
    .await;
    let report = services.shutdown().await;
    assert_eq!(report.forced, ["dispatcher"]);
    assert_eq!(
        queue(
            db.pool(),
            "status = 'pending' AND attempts = 1 AND claim_token IS NULL AND next_attempt_at <= now()"
        )
        .await,
        1,
        "the claim was released"
    );

    // `stop_now` gives no grace: a stuck delivery under a long grace
    // period is cancelled at once and its claim released.
    let (db, cohort) = one_queued_delivery("stuck-now", Stuck).await;
    let services = Services::new(&cohort)
        .unwrap()
        .grace_period(Duration::from_secs(600))
        .spawn();
    wait_until(
        "the stuck delivery to be in flight",
        Duration::from_secs(10),
        async || queue(db.pool(), "status = 'in_flight'").await == 1,
    )
    .await;
    let report = tokio::time::timeout(Duration::from_secs(60), services.stop_now())
        .await
        .expect("stop_now does not wait for the grace period");
    // Cancelled by the hard token, the delivery gives its claim back and
    // the dispatcher stops on its own: nothing had to be aborted.
    assert!(report.clean(), "{report:?}");
    assert_eq!(
        queue(db.pool(), "status = 'pending' AND claim_token IS NULL").await,
        1,
        "the claim was released"
    );
}
