//! Erasure requests on a real server (RS-031, RS-032): a reference, a due
//! date, states with a history line per change, parts kept by a hold or a
//! legal minimum that resume by themselves, and a keyed hash in place of
//! the subject once completed.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use chrono::{DateTime, Duration, Utc};
use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::erasure_requests::{Due, PartReason, RequestFilter, RequestState};
use cohort::holds::HoldRequest;
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::services::MaintenanceConfig;
use cohort::{Cohort, EntityDeclaration, Error, ErrorKind};
use support::*;
use uuid::Uuid;

const S: &str = "dddddddd-0000-0000-0000-00000000000d";
const OTHER: &str = "eeeeeeee-0000-0000-0000-00000000000e";
const CONTACT_ID: &str = "5a5a5a5a-0000-4000-8000-000000000001";
const BILL_ID: &str = "5a5a5a5a-0000-4000-8000-000000000002";

// The logical `now` of the requests is support's 2026-06-01; bill 2 is
// ten days old then, and its 90-day legal minimum ends on 2026-08-20.
const TABLES: &str = r#"
CREATE SCHEMA app;
CREATE TABLE app.contacts (id bigint PRIMARY KEY, created_at timestamptz, user_id uuid);
CREATE TABLE app.bills (id bigint PRIMARY KEY, created_at timestamptz, user_id uuid);
INSERT INTO app.contacts VALUES
  (1, '2026-01-10', 'dddddddd-0000-0000-0000-00000000000d'),
  (2, '2026-01-11', 'dddddddd-0000-0000-0000-00000000000d'),
  (3, '2026-01-12', 'eeeeeeee-0000-0000-0000-00000000000e');
INSERT INTO app.bills VALUES
  (1, '2025-12-01', 'dddddddd-0000-0000-0000-00000000000d'),
  (2, '2026-05-22', 'dddddddd-0000-0000-0000-00000000000d'),
  (3, '2025-12-01', 'eeeeeeee-0000-0000-0000-00000000000e');
"#;

async fn setup() -> (cohort_pgtemp::TestDatabase, Cohort) {
    let db = migrated_db().await;
    exec(db.pool(), TABLES).await;
    let cohort = builder(db.pool().clone(), test_config())
        .build()
        .await
        .unwrap();
    (db, cohort)
}

fn builder(pool: sqlx::PgPool, config: cohort::CohortConfig) -> cohort::CohortBuilder {
    Cohort::builder(pool)
        .config(config)
        .rules(
            StaticRuleProvider::builder()
                .category("contacts", RetentionRule::new(days(30), Strategy::Purge))
                .category(
                    "bills",
                    RetentionRule::new(days(30), Strategy::Purge).with_legal_min(days(90)),
                )
                .build()
                .unwrap(),
        )
        .declaration(
            EntityDeclaration::new("Contact", CONTACT_ID)
                .category("contacts")
                .anchor("created_at")
                .table("app.contacts")
                .subject("user_id", None)
                .tenantless(),
        )
        .declaration(
            EntityDeclaration::new("Bill", BILL_ID)
                .category("bills")
                .anchor("created_at")
                .table("app.bills")
                .subject("user_id", None)
                .tenantless(),
        )
}

fn at(t: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(t).unwrap().with_timezone(&Utc)
}

fn erase(reference: &str) -> ErasureRequest {
    ErasureRequest::tenantless(ErasureScope::new(S), now()).reference(reference)
}

fn maintenance() -> MaintenanceConfig {
    MaintenanceConfig::from_config(&test_config()).unwrap()
}

async fn hold_contact_1(cohort: &Cohort) -> Uuid {
    cohort
        .create_hold(HoldRequest::new(
            Uuid::parse_str(CONTACT_ID).unwrap(),
            "1",
            "litigation",
        ))
        .await
        .unwrap()
        .hold_id
}

async fn states(cohort: &Cohort, reference: &str) -> Vec<&'static str> {
    cohort
        .erasure_request(reference)
        .await
        .unwrap()
        .events
        .iter()
        .map(|e| e.state.as_str())
        .collect()
}

async fn count(pool: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_request_kept_by_a_hold_is_completed_by_the_maintenance_pass_once_the_hold_is_released() {
    let (db, cohort) = setup().await;
    let hold = hold_contact_1(&cohort).await;
    let r = cohort
        .erase(erase("SAR-1").note("asked by e-mail on 2026-05-30"))
        .await
        .unwrap();
    let req = r.request.clone().expect("the request");
    assert_eq!(req.reference, "SAR-1");
    assert_eq!(req.state, RequestState::Waiting);
    assert_eq!(req.received_at, at("2026-06-01T00:00:00Z"));
    assert_eq!(req.due_at, at("2026-07-01T00:00:00Z"), "30 days by default");
    assert_eq!(req.subject.as_deref(), Some(S), "kept while not completed");
    assert_eq!(req.note.as_deref(), Some("asked by e-mail on 2026-05-30"));
    assert_eq!(req.last_run_id, Some(r.run_id));
    // Contact 1 is held; bill 2 is inside its legal minimum until
    // 2026-08-20 (ten days old plus 90 days).
    let parts: Vec<_> = req
        .waiting
        .iter()
        .map(|p| (p.entity.as_str(), p.reason, p.rows, p.until))
        .collect();
    assert_eq!(
        parts,
        vec![
            ("Contact", PartReason::Held, 1, None),
            (
                "Bill",
                PartReason::LegalMinimum,
                1,
                Some(at("2026-08-20T00:00:00Z"))
            ),
        ]
    );
    assert_eq!(req.resume_at, Some(at("2026-08-20T00:00:00Z")));
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.contacts ORDER BY id").await,
        vec![1, 3]
    );
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.bills ORDER BY id").await,
        vec![2, 3]
    );
    assert_eq!(
        states(&cohort, "SAR-1").await,
        vec!["open", "in_progress", "waiting"]
    );

    // Due 2026-07-01, long past by the database clock: overdue.
    let counts = cohort.erasure_request_counts().await.unwrap();
    assert_eq!(counts.overdue, 1);
    assert!(counts.by_state.contains(&(RequestState::Waiting, 1)));
    let overdue = cohort
        .erasure_requests(RequestFilter::new().overdue_at(Utc::now()))
        .await
        .unwrap();
    assert_eq!(overdue.len(), 1);
    assert!(overdue[0].overdue);

    // Nothing changed since the attempt at the logical `now` of the
    // request, whose legal minimum has not passed: nothing to resume.
    let none = cohort.resume_erasure_requests(now(), false).await.unwrap();
    assert_eq!(none.resumed, 0);

    // Released: the maintenance pass (at the clock's `now`, past the
    // legal minimum too) runs the request again and completes it.
    cohort.release_hold(hold).await.unwrap();
    let report = cohort.maintain(&maintenance()).await.unwrap();
    assert_eq!(
        (
            report.erasure_requests_resumed,
            report.erasure_requests_completed
        ),
        (1, 1)
    );
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.contacts ORDER BY id").await,
        vec![3]
    );
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.bills ORDER BY id").await,
        vec![3]
    );
    let done = cohort.erasure_request("SAR-1").await.unwrap();
    assert_eq!(done.request.state, RequestState::Completed);
    assert!(done.request.waiting.is_empty());
    assert!(!done.request.overdue);
    assert!(done.request.completed_at.is_some());
    assert_eq!(
        states(&cohort, "SAR-1").await,
        vec!["open", "in_progress", "waiting", "in_progress", "completed"]
    );
    // Each settled attempt names its run, an erasure run of the ledger.
    let runs: Vec<Uuid> = done.events.iter().filter_map(|e| e.run_id).collect();
    assert_eq!(runs.len(), 2);
    for run in &runs {
        assert_eq!(
            cohort.show_run(*run).await.unwrap().kind,
            cohort::RunKind::Erasure
        );
    }

    // The person is gone from the request: only the keyed hash remains,
    // and it is the one the key gives for the subject.
    assert_eq!(done.request.subject, None);
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM public.erasure_request WHERE subject_text IS NOT NULL"
        )
        .await,
        0
    );
    assert_eq!(
        done.request.subject_hash,
        test_hmac_hex(&format!("cohort erasure subject:{S}"))
    );
    let counts = cohort.erasure_request_counts().await.unwrap();
    assert_eq!(counts.overdue, 0);
    assert!(counts.by_state.contains(&(RequestState::Completed, 1)));
    // A completed request is not run again, by reference or by maintenance.
    let again = cohort.erase(erase("SAR-1")).await.unwrap_err();
    assert_eq!(again.kind(), ErrorKind::Conflict, "{again}");
    assert_eq!(
        cohort
            .maintain(&maintenance())
            .await
            .unwrap()
            .erasure_requests_resumed,
        0
    );
}

#[tokio::test]
async fn a_part_kept_by_a_legal_minimum_resumes_when_it_passes() {
    let (db, cohort) = setup().await;
    let r = cohort.erase(erase("SAR-2")).await.unwrap();
    let req = r.request.unwrap();
    assert_eq!(req.state, RequestState::Waiting);
    assert_eq!(req.resume_at, Some(at("2026-08-20T00:00:00Z")));

    // Before the minimum ends nothing runs; after, the request completes.
    let early = cohort
        .resume_erasure_requests(at("2026-08-19T00:00:00Z"), false)
        .await
        .unwrap();
    assert_eq!(early.resumed, 0);
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.bills ORDER BY id").await,
        vec![2, 3]
    );
    let later = cohort
        .resume_erasure_requests(at("2026-08-21T00:00:00Z"), false)
        .await
        .unwrap();
    assert_eq!((later.resumed, later.completed), (1, 1));
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.bills ORDER BY id").await,
        vec![3]
    );
    let done = cohort.erasure_request("SAR-2").await.unwrap().request;
    assert_eq!(done.state, RequestState::Completed);
    assert_eq!(done.completed_at, Some(at("2026-08-21T00:00:00Z")));
}

#[tokio::test]
async fn a_part_kept_by_a_hold_placed_after_the_request_waits_for_that_hold() {
    let (db, cohort) = setup().await;
    let first = hold_contact_1(&cohort).await;
    let r = cohort.erase(erase("SAR-3")).await.unwrap();
    assert_eq!(r.request.unwrap().state, RequestState::Waiting);
    // A subject hold placed after the request also covers contact 1.
    let later = cohort
        .create_hold(HoldRequest::subject(S, "a new claim"))
        .await
        .unwrap()
        .hold_id;
    cohort.release_hold(first).await.unwrap();
    let report = cohort.maintain(&maintenance()).await.unwrap();
    assert_eq!(
        (
            report.erasure_requests_resumed,
            report.erasure_requests_completed
        ),
        (1, 0)
    );
    let waiting = cohort.erasure_request("SAR-3").await.unwrap().request;
    assert_eq!(waiting.state, RequestState::Waiting);
    let parts: Vec<_> = waiting
        .waiting
        .iter()
        .map(|p| (p.entity.as_str(), p.reason))
        .collect();
    // The subject hold keeps both of the subject's rows that are left.
    assert_eq!(
        parts,
        vec![("Contact", PartReason::Held), ("Bill", PartReason::Held)]
    );
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.contacts ORDER BY id").await,
        vec![1, 3]
    );
    // Nothing changes until that hold ends.
    assert_eq!(
        cohort
            .maintain(&maintenance())
            .await
            .unwrap()
            .erasure_requests_resumed,
        0
    );
    cohort.release_hold(later).await.unwrap();
    let report = cohort.maintain(&maintenance()).await.unwrap();
    assert_eq!(report.erasure_requests_completed, 1);
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.contacts ORDER BY id").await,
        vec![3]
    );
}

#[tokio::test]
async fn an_attempt_a_lost_process_left_in_progress_is_run_again_but_never_a_live_one() {
    let (db, cohort) = setup().await;
    let r = cohort.erase(erase("SAR-4")).await.unwrap();
    let id = r.request.unwrap().request_id;
    // As a process killed during an attempt leaves it: in progress.
    exec(
        db.pool(),
        &format!(
            "UPDATE public.erasure_request SET state = 'in_progress' WHERE request_id = '{id}'"
        ),
    )
    .await;
    // While another session holds the request's lock (a live attempt),
    // the pass leaves it alone ...
    let mut gate = db.pool().acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, 0))")
        .bind(format!("cohort.erasure-request:{id}"))
        .execute(&mut *gate)
        .await
        .unwrap();
    let busy = cohort.resume_erasure_requests(now(), false).await.unwrap();
    assert_eq!((busy.resumed, busy.busy), (0, 1));
    assert_eq!(
        cohort.erasure_request("SAR-4").await.unwrap().request.state,
        RequestState::InProgress
    );
    // ... and once the lock is free, runs it again.
    sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(&mut *gate)
        .await
        .unwrap();
    drop(gate);
    let report = cohort.resume_erasure_requests(now(), false).await.unwrap();
    assert_eq!((report.resumed, report.waiting), (1, 1));
    assert_eq!(
        cohort.erasure_request("SAR-4").await.unwrap().request.state,
        RequestState::Waiting
    );
}

#[tokio::test]
async fn a_due_date_is_moved_with_its_reason_and_bad_requests_write_nothing() {
    let (db, cohort) = setup().await;
    let nothing = |db: &cohort_pgtemp::TestDatabase| {
        let pool = db.pool().clone();
        async move {
            (
                count(&pool, "SELECT count(*) FROM public.erasure_request").await,
                count(&pool, "SELECT count(*) FROM public.sweep_run").await,
                ids(&pool, "SELECT id FROM app.contacts ORDER BY id").await,
            )
        }
    };
    let before = nothing(&db).await;
    let refused: Vec<(Error, ErrorKind)> = vec![
        (
            cohort
                .erase(erase("SAR-5").dry_run(true))
                .await
                .unwrap_err(),
            ErrorKind::InvalidInput,
        ),
        (
            cohort.erase(erase(" SAR-5")).await.unwrap_err(),
            ErrorKind::InvalidInput,
        ),
        (
            cohort.erase(erase("")).await.unwrap_err(),
            ErrorKind::InvalidInput,
        ),
        (
            cohort
                .erase(erase("SAR-5").due(Due::At(at("2026-05-01T00:00:00Z"))))
                .await
                .unwrap_err(),
            ErrorKind::InvalidInput,
        ),
    ];
    for (e, kind) in &refused {
        assert_eq!(e.kind(), *kind, "{e}");
    }
    assert!(refused[3]
        .0
        .to_string()
        .contains("is not after the request's time"));
    // Without the hash key a request cannot keep its proof: refused.
    let unkeyed = builder(db.pool().clone(), cohort::CohortConfig::default())
        .build()
        .await
        .unwrap();
    let e = unkeyed.erase(erase("SAR-5")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("COHORT_HASH_KEY"), "{e}");
    let e = cohort.erasure_request("SAR-404").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert_eq!(nothing(&db).await, before, "nothing was written");

    // Opened with its own due date and reason, then moved.
    let r = cohort
        .erase(
            erase("SAR-5")
                .due(Due::parse("45d").unwrap())
                .due_reason("contract says 45 days"),
        )
        .await
        .unwrap()
        .request
        .unwrap();
    assert_eq!(r.due_at, at("2026-07-16T00:00:00Z"));
    assert_eq!(r.due_reason.as_deref(), Some("contract says 45 days"));
    let past = cohort
        .extend_erasure_request("SAR-5", Due::parse("2026-08-01").unwrap(), "complex")
        .await
        .unwrap_err();
    assert_eq!(past.kind(), ErrorKind::InvalidInput, "{past}");
    let no_reason = cohort
        .extend_erasure_request("SAR-5", Due::parse("2099-01-01").unwrap(), " ")
        .await
        .unwrap_err();
    assert_eq!(no_reason.kind(), ErrorKind::InvalidInput, "{no_reason}");
    let moved = cohort
        .extend_erasure_request(
            "SAR-5",
            Due::At(Utc::now() + Duration::days(60)),
            "Art. 12(3) extension: the subject was told",
        )
        .await
        .unwrap();
    assert!(!moved.overdue);
    assert_eq!(
        moved.due_reason.as_deref(),
        Some("Art. 12(3) extension: the subject was told")
    );
    let history = cohort.erasure_request("SAR-5").await.unwrap().events;
    let last = history.last().unwrap();
    assert_eq!(last.state, RequestState::Waiting);
    assert!(
        last.detail
            .starts_with("due date moved from 2026-07-16T00:00:00+00:00 to "),
        "{}",
        last.detail
    );
    assert!(last
        .detail
        .ends_with(": Art. 12(3) extension: the subject was told"));

    // The same reference for another subject is another request: refused.
    let other = ErasureRequest::tenantless(ErasureScope::new(OTHER), now()).reference("SAR-5");
    let e = cohort.erase(other).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.contacts ORDER BY id").await,
        vec![3]
    );
    // The same request again (its subject spelled in capitals) runs it
    // again (one more attempt).
    let again = cohort
        .erase(
            ErasureRequest::tenantless(ErasureScope::new(S.to_uppercase()), now())
                .reference("SAR-5"),
        )
        .await
        .unwrap()
        .request
        .unwrap();
    assert_eq!(again.state, RequestState::Waiting);
    assert_eq!(
        states(&cohort, "SAR-5").await,
        vec![
            "open",
            "in_progress",
            "waiting",
            "waiting",
            "in_progress",
            "waiting"
        ]
    );
}

#[tokio::test]
async fn a_release_committed_after_the_attempt_looked_resumes_the_request_whatever_the_clocks_say()
{
    let (db, cohort) = setup().await;
    let pool = db.pool();
    let hold = hold_contact_1(&cohort).await;
    // The hold's row, locked by the test. The release's transaction
    // starts (its `released_at` is that start) and waits for the row.
    let mut gate = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM public.retention_hold WHERE hold_id = $1 FOR UPDATE")
        .bind(hold)
        .execute(&mut *gate)
        .await
        .unwrap();
    let c = cohort.clone();
    let release = tokio::spawn(async move { c.release_hold(hold).await.unwrap() });
    wait_for_lock_wait(pool).await;
    // The attempt starts after the release's transaction began, and finds
    // contact 1 still held: the release has not committed.
    let r = cohort.erase(erase("SAR-RACE")).await.unwrap();
    gate.rollback().await.unwrap();
    release.await.unwrap();
    let req = r.request.unwrap();
    assert_eq!(req.state, RequestState::Waiting);
    assert!(req.waiting.iter().any(|p| p.reason == PartReason::Held));
    // The trap: by the clocks the hold was released before the attempt.
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM public.retention_hold h, public.erasure_request r \
             WHERE h.released_at < r.attempted_at",
        )
        .await,
        1
    );
    assert_eq!(
        ids(pool, "SELECT id FROM app.contacts ORDER BY id").await,
        vec![1, 3]
    );

    // No hold is active: the pass resumes it, and contact 1 goes. Bill 2
    // still waits for its legal minimum at this logical `now`.
    let resumed = cohort.resume_erasure_requests(now(), false).await.unwrap();
    assert_eq!(resumed.resumed, 1);
    assert_eq!(
        ids(pool, "SELECT id FROM app.contacts ORDER BY id").await,
        vec![3]
    );
    let after = cohort.erasure_request("SAR-RACE").await.unwrap().request;
    let reasons: Vec<_> = after.waiting.iter().map(|p| p.reason).collect();
    assert_eq!(reasons, vec![PartReason::LegalMinimum]);
    // And once is enough: the release is now one the attempt saw.
    let again = cohort.resume_erasure_requests(now(), false).await.unwrap();
    assert_eq!(again.resumed, 0);
}

/// A handle on `pool` (its tables created) whose erasures audit each row.
async fn chained(pool: &sqlx::PgPool) -> Cohort {
    exec(pool, TABLES).await;
    Cohort::builder(pool.clone())
        .config(test_config())
        .rules(
            StaticRuleProvider::builder()
                .category(
                    "contacts",
                    RetentionRule::new(days(30), Strategy::Purge)
                        .with_audit(cohort::AuditDetail::PerRow)
                        .unwrap(),
                )
                .build()
                .unwrap(),
        )
        .declaration(
            EntityDeclaration::new("Contact", CONTACT_ID)
                .category("contacts")
                .anchor("created_at")
                .table("app.contacts")
                .subject("user_id", None)
                .tenantless(),
        )
        .build()
        .await
        .unwrap()
}

#[db_test(migrated)]
async fn request_histories_and_row_details_are_in_the_chain(db: TestDatabase) {
    let pool = db.pool();
    let cohort = chained(pool).await;
    hold_contact_1(&cohort).await;
    let r = cohort.erase(erase("SAR-CHAIN")).await.unwrap();
    assert_eq!(r.request.unwrap().state, RequestState::Waiting);
    let clean = cohort.verify_chain(None).await.unwrap();
    assert!(clean.intact, "{:?}", clean.breaks);
    let linked = count(
        pool,
        "SELECT count(*) FROM public.ledger_link WHERE kind = 'request'",
    )
    .await;
    assert_eq!(linked, 3, "opened, in progress, waiting: each line linked");
    let named = |needle: &'static str| {
        let cohort = cohort.clone();
        async move {
            let r = cohort.verify_chain(None).await.unwrap();
            assert!(
                r.breaks.iter().any(|b| b.to_string().contains(needle)),
                "{needle} not in {:?}",
                r.breaks
            );
        }
    };

    // The due date moved by hand: the report's "on time" would follow it.
    exec(
        pool,
        "UPDATE public.erasure_request SET due_at = due_at + interval '60 days'",
    )
    .await;
    named("due_at").await;
    exec(
        pool,
        "UPDATE public.erasure_request SET due_at = due_at - interval '60 days'",
    )
    .await;
    // A history line rewritten, and one written by hand.
    exec(
        pool,
        "UPDATE public.erasure_request_event SET state = 'completed' \
         WHERE event_id = (SELECT max(event_id) FROM public.erasure_request_event)",
    )
    .await;
    named("history line differs").await;
    exec(
        pool,
        "UPDATE public.erasure_request_event SET state = 'waiting' \
         WHERE event_id = (SELECT max(event_id) FROM public.erasure_request_event)",
    )
    .await;
    exec(
        pool,
        "INSERT INTO public.erasure_request_event (request_id, state, detail) \
         SELECT request_id, 'completed', 'by hand' FROM public.erasure_request",
    )
    .await;
    named("has no link").await;
    exec(
        pool,
        "DELETE FROM public.erasure_request_event WHERE detail = 'by hand'",
    )
    .await;
    assert!(cohort.verify_chain(None).await.unwrap().intact);

    // The erasure's per-row audit: a record id rewritten.
    let details = count(pool, "SELECT count(*) FROM public.sweep_run_row_detail").await;
    assert!(details > 0);
    exec(
        pool,
        "UPDATE public.sweep_run_row_detail SET record_id = '99' \
         WHERE row_detail_id = (SELECT min(row_detail_id) FROM public.sweep_run_row_detail)",
    )
    .await;
    named("details.sha256").await;
}

/// A request's scope or due date changed by hand is named against its
/// newest link, and still after the next line of its history links the
/// changed row; a due date moved through Cohort is not.
#[db_test(migrated)]
async fn a_narrowed_request_is_named_even_after_its_next_line_links_it(db: TestDatabase) {
    let pool = db.pool();
    let cohort = chained(pool).await;
    hold_contact_1(&cohort).await;
    let r = cohort.erase(erase("SAR-SCOPE")).await.unwrap();
    assert_eq!(r.request.unwrap().state, RequestState::Waiting);
    let breaks = async || {
        let report = cohort.verify_chain(None).await.unwrap();
        report
            .breaks
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
    };
    // A line written through Cohort changes the due date: nothing is named.
    cohort
        .extend_erasure_request(
            "SAR-SCOPE",
            Due::parse("2099-01-31").unwrap(),
            "complex request",
        )
        .await
        .unwrap();
    assert_eq!(breaks().await, Vec::<String>::new());

    // The subject's kind changed by hand: a resumed attempt would erase
    // only the columns of a kind nothing declares.
    exec(
        pool,
        "UPDATE public.erasure_request SET subject_kind = 'nobody' WHERE reference = 'SAR-SCOPE'",
    )
    .await;
    let named = breaks().await;
    assert!(
        named
            .iter()
            .any(|b| b.contains("SAR-SCOPE") && b.contains("scope")),
        "{named:?}"
    );
    // The next line links the changed row (here a due date moved, as an
    // operator would): the change stays named, against the earlier link.
    cohort
        .extend_erasure_request(
            "SAR-SCOPE",
            Due::parse("2099-03-31").unwrap(),
            "still complex",
        )
        .await
        .unwrap();
    let named = breaks().await;
    assert!(
        named
            .iter()
            .any(|b| b.contains("scope changed since its earlier linked line")),
        "{named:?}"
    );
    // And a stage or soft deletes allowed the same way, each on a request
    // of its own.
    for (reference, change) in [
        ("SAR-STAGE", "stage = 2"),
        ("SAR-SOFT", "allow_soft_delete = NOT allow_soft_delete"),
    ] {
        let r = cohort.erase(erase(reference)).await.unwrap();
        assert_eq!(r.request.unwrap().state, RequestState::Waiting);
        assert!(!breaks().await.iter().any(|b| b.contains(reference)));
        exec(
            pool,
            &format!("UPDATE public.erasure_request SET {change} WHERE reference = '{reference}'"),
        )
        .await;
        let named = breaks().await;
        assert!(
            named
                .iter()
                .any(|b| b.contains(reference) && b.contains("scope")),
            "{change}: {named:?}"
        );
    }
    // A due date moved by hand (the report's "on time" would follow it),
    // then moved through Cohort from the forged date: the line that linked
    // it moved another date than the one linked before.
    let r = cohort.erase(erase("SAR-DUE")).await.unwrap();
    assert_eq!(r.request.unwrap().state, RequestState::Waiting);
    exec(
        pool,
        "UPDATE public.erasure_request SET due_at = due_at + interval '60 days' \
         WHERE reference = 'SAR-DUE'",
    )
    .await;
    cohort
        .extend_erasure_request("SAR-DUE", Due::parse("2099-05-31").unwrap(), "audit")
        .await
        .unwrap();
    let named = breaks().await;
    assert!(
        named
            .iter()
            .any(|b| b.contains("SAR-DUE")
                && b.contains("due_at changed since its earlier linked line")),
        "{named:?}"
    );
    // A waiting request called failed by hand (maintenance then never
    // resumes it: what it must erase stays), then linked by the next line
    // (a due date moved through Cohort): the step is named.
    let r = cohort.erase(erase("SAR-STATE")).await.unwrap();
    assert_eq!(r.request.unwrap().state, RequestState::Waiting);
    assert!(!breaks().await.iter().any(|b| b.contains("SAR-STATE")));
    exec(
        pool,
        "UPDATE public.erasure_request SET state = 'failed' WHERE reference = 'SAR-STATE'",
    )
    .await;
    cohort
        .extend_erasure_request("SAR-STATE", Due::parse("2099-07-31").unwrap(), "audit")
        .await
        .unwrap();
    let named = breaks().await;
    assert!(
        named.iter().any(|b| b.contains("SAR-STATE")
            && b.contains("its state went from waiting to failed")),
        "{named:?}"
    );
}
