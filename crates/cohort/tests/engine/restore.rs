//! After a restore (RS-033, RS-034), on real backups: a cluster archives
//! its WAL; a base backup is taken; erasures, holds and releases follow,
//! each journaled outside the database; a point-in-time recovery to a
//! restore point before them starts a second cluster. `restore_check`
//! finds everything the restored database lacks, `replay` brings it to the
//! same rows as the original, and a second replay does nothing.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::time::Duration;

use chrono::Utc;
use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::erasure_requests::RequestState;
use cohort::holds::HoldRequest;
use cohort::journal::{JournalConfig, JournalKey};
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, EntityDeclaration, ErrorKind};
use cohort_pgtemp::Cluster;
use sqlx::PgPool;
use support::*;
use uuid::Uuid;

const CONTACT_ID: &str = "6b6b6b6b-0000-4000-8000-000000000001";
const S0: &str = "00000000-0000-4000-8000-0000000000a0";
const S1: &str = "00000000-0000-4000-8000-0000000000a1";
const S2: &str = "00000000-0000-4000-8000-0000000000a2";
const KEEP: &str = "00000000-0000-4000-8000-0000000000ff";

const TABLES: &str = r#"
CREATE SCHEMA app;
CREATE TABLE app.contacts (id bigint PRIMARY KEY, created_at timestamptz NOT NULL, user_id uuid NOT NULL);
INSERT INTO app.contacts VALUES
  (1, now() - interval '400 days', '00000000-0000-4000-8000-0000000000a0'),
  (2, now() - interval '400 days', '00000000-0000-4000-8000-0000000000a0'),
  (3, now() - interval '400 days', '00000000-0000-4000-8000-0000000000a1'),
  (4, now() - interval '400 days', '00000000-0000-4000-8000-0000000000a1'),
  (5, now() - interval '400 days', '00000000-0000-4000-8000-0000000000a2'),
  (6, now() - interval '400 days', '00000000-0000-4000-8000-0000000000a2'),
  (7, now() - interval '400 days', '00000000-0000-4000-8000-0000000000ff');
"#;

fn key() -> JournalKey {
    JournalKey::from_hex(&"5e".repeat(32)).unwrap()
}

/// The contacts' handle on `pool`, journaling to `journal`.
fn builder(pool: &PgPool, journal: JournalConfig) -> cohort::CohortBuilder {
    Cohort::builder(pool.clone())
        .config(test_config())
        .rules(
            StaticRuleProvider::builder()
                .category("contacts", RetentionRule::new(days(3650), Strategy::Purge))
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
        .journal(journal)
}

async fn handle(pool: &PgPool, journal: &std::path::Path) -> Cohort {
    builder(pool, JournalConfig::dir(journal).key(key()))
        .build()
        .await
        .unwrap()
}

fn erase(subject: &str, reference: &str) -> ErasureRequest {
    ErasureRequest::tenantless(ErasureScope::new(subject), Utc::now()).reference(reference)
}

async fn contacts(pool: &PgPool) -> Vec<i64> {
    ids(pool, "SELECT id FROM app.contacts ORDER BY id").await
}

async fn request_states(pool: &PgPool) -> Vec<(String, String)> {
    sqlx::query_as("SELECT reference, state FROM public.erasure_request ORDER BY reference")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn hold_states(pool: &PgPool) -> Vec<(Uuid, bool)> {
    sqlx::query_as(
        "SELECT hold_id, released_at IS NOT NULL FROM public.retention_hold ORDER BY hold_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_point_in_time_recovery_is_replayed_to_the_rows_of_the_original() {
    let primary = Cluster::start_archiving().await.unwrap();
    let pool = PgPool::connect_with(primary.connect_options())
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    cohort::schema::migrate(&mut conn, "public").await.unwrap();
    drop(conn);
    exec(&pool, TABLES).await;
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path();
    let cohort = handle(&pool, journal).await;

    // Before the backup: S0's request waits for a hold on contact 1.
    let h0 = cohort
        .create_hold(HoldRequest::new(
            Uuid::parse_str(CONTACT_ID).unwrap(),
            "1",
            "claim of 2026-11",
        ))
        .await
        .unwrap()
        .hold_id;
    let r0 = cohort.erase(erase(S0, "SAR-0")).await.unwrap();
    assert_eq!(r0.request.unwrap().state, RequestState::Waiting);
    assert_eq!(contacts(&pool).await, [1, 3, 4, 5, 6, 7]);

    let backup = primary.base_backup().await.unwrap();
    exec(&pool, "SELECT pg_create_restore_point('before_erasures')").await;

    // After it: the hold goes and S0's request completes; S1 is erased;
    // a hold on S2 is placed, then S2's request waits for it.
    cohort.release_hold(h0).await.unwrap();
    let resumed = cohort
        .resume_erasure_requests(Utc::now(), false)
        .await
        .unwrap();
    assert_eq!(resumed.completed, 1);
    let r1 = cohort.erase(erase(S1, "SAR-1")).await.unwrap();
    assert_eq!(r1.request.unwrap().state, RequestState::Completed);
    let h2 = cohort
        .create_hold(HoldRequest::subject(S2, "litigation").hold_id(Uuid::from_u128(42)))
        .await
        .unwrap()
        .hold_id;
    let r2 = cohort.erase(erase(S2, "SAR-2")).await.unwrap();
    assert_eq!(r2.request.unwrap().state, RequestState::Waiting);
    assert_eq!(contacts(&pool).await, [5, 6, 7]);
    // The journal holds no person in the clear.
    let text = std::fs::read_to_string(journal.join(cohort::journal::FILE_NAME)).unwrap();
    for person in [S0, S1, S2, "litigation"] {
        assert!(!text.contains(person), "{person} in the journal");
    }

    // Every segment up to now archived, then the recovery.
    let segment: String = sqlx::query_scalar("SELECT pg_walfile_name(pg_switch_wal())")
        .fetch_one(&pool)
        .await
        .unwrap();
    wait_until("the WAL archived", Duration::from_secs(60), async || {
        let last: Option<String> =
            sqlx::query_scalar("SELECT last_archived_wal FROM pg_stat_archiver")
                .fetch_one(&pool)
                .await
                .unwrap();
        last.is_some_and(|l| l >= segment)
    })
    .await;
    let restored = primary
        .recover_to_restore_point(&backup, "before_erasures")
        .await
        .unwrap();
    let rpool = PgPool::connect_with(restored.connect_options())
        .await
        .unwrap();
    // The restored database is the one of before the restore point.
    assert_eq!(contacts(&rpool).await, [1, 3, 4, 5, 6, 7]);
    assert_eq!(
        request_states(&rpool).await,
        [("SAR-0".to_owned(), "waiting".to_owned())]
    );
    let rcohort = handle(&rpool, journal).await;

    let check = rcohort.restore_check().await.unwrap();
    assert!(!check.is_clean());
    let refs = |gaps: &[cohort::restore::RequestGap]| {
        gaps.iter()
            .map(|g| {
                (
                    g.reference.clone(),
                    g.journal_state.clone(),
                    g.database_state.clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        refs(&check.missing_requests),
        [
            ("SAR-1".to_owned(), "completed".to_owned(), None),
            ("SAR-2".to_owned(), "waiting".to_owned(), None)
        ]
    );
    assert_eq!(
        refs(&check.behind_requests),
        [(
            "SAR-0".to_owned(),
            "completed".to_owned(),
            Some("waiting".to_owned())
        )]
    );
    assert_eq!(check.holds_to_place, [h2]);
    assert_eq!(check.holds_to_release, [h0]);

    // A dry run changes nothing.
    let dry = rcohort.replay(true).await.unwrap();
    assert_eq!(dry.requests_restored, ["SAR-1", "SAR-2"]);
    assert_eq!(contacts(&rpool).await, [1, 3, 4, 5, 6, 7]);

    let replayed = rcohort.replay(false).await.unwrap();
    assert!(replayed.skipped.is_empty(), "{:?}", replayed.skipped);
    assert_eq!(replayed.holds_placed, [h2]);
    assert_eq!(replayed.holds_released, [h0]);
    assert_eq!(
        replayed.requests_run,
        [
            ("SAR-1".to_owned(), "completed".to_owned()),
            ("SAR-2".to_owned(), "waiting".to_owned()),
            ("SAR-0".to_owned(), "completed".to_owned()),
        ]
    );
    assert!(replayed.check.is_clean(), "{:?}", replayed.check);
    // The same rows as the original: S2's kept by the hold the journal
    // placed again, the person nobody asked about untouched.
    assert_eq!(contacts(&rpool).await, contacts(&pool).await);
    assert_eq!(request_states(&rpool).await, request_states(&pool).await);
    assert_eq!(hold_states(&rpool).await, hold_states(&pool).await);
    assert!(contacts(&rpool).await.contains(&7), "{KEEP} kept");
    // The replay is in each request's history.
    let history = rcohort.erasure_request("SAR-1").await.unwrap().events;
    assert!(
        history[0].detail.starts_with("restored from the journal"),
        "{history:?}"
    );

    // A second replay finds nothing to do.
    let again = rcohort.replay(false).await.unwrap();
    assert!(again.holds_placed.is_empty() && again.holds_released.is_empty());
    assert!(again.requests_restored.is_empty() && again.requests_run.is_empty());
    assert!(again.check.is_clean());
    assert_eq!(contacts(&rpool).await, contacts(&pool).await);

    rpool.close().await;
    restored.stop();
    pool.close().await;
}

#[db_test(migrated)]
async fn an_erasure_never_runs_without_its_journal_entry(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not-there");
    let cohort = handle(db.pool(), &missing).await;
    let e = cohort.erase(erase(S1, "SAR-9")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.to_string().contains("cannot be written"), "{e}");
    assert!(e.to_string().contains("not-there"), "{e}");
    assert_eq!(
        contacts(db.pool()).await,
        [1, 2, 3, 4, 5, 6, 7],
        "nothing erased"
    );
    assert!(request_states(db.pool()).await.is_empty());
    // A hold is not placed without its entry either.
    let e = cohort
        .create_hold(HoldRequest::subject(S2, "claim"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(hold_states(db.pool()).await.is_empty());

    // With the journal there, the erasure runs; with another key it is
    // refused, naming the key.
    let good = handle(db.pool(), dir.path()).await;
    good.erase(erase(S1, "SAR-9")).await.unwrap();
    let other = builder(
        db.pool(),
        JournalConfig::dir(dir.path()).key(JournalKey::from_hex(&"11".repeat(32)).unwrap()),
    )
    .build()
    .await
    .unwrap();
    let e = other.erase(erase(S2, "SAR-10")).await.unwrap_err();
    assert!(e.to_string().contains("another key"), "{e}");
    assert_eq!(contacts(db.pool()).await, [1, 2, 5, 6, 7]);
    let e = other.restore_check().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(
        e.to_string()
            .contains("entry 1 was written with another key"),
        "{e}"
    );

    // A journal whose chain is broken is named, and nothing is replayed.
    let path = dir.path().join(cohort::journal::FILE_NAME);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 3, "{text}");
    let without_second: String = lines
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    std::fs::write(&path, without_second).unwrap();
    let e = good.restore_check().await.unwrap_err();
    assert!(
        e.to_string().contains("entry 3 does not follow entry 1"),
        "{e}"
    );
    let e = good.replay(false).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}

#[db_test(migrated)]
async fn a_journal_in_a_database_on_another_server_is_written_and_one_on_the_same_server_refused(
    db: TestDatabase,
) {
    exec(db.pool(), TABLES).await;
    let other = Cluster::start().await.unwrap();
    let with_url = |url: String| builder(db.pool(), JournalConfig::url(url).key(key()));
    // On the retained database's own server: refused before anything runs.
    let same = with_url(db.url().to_owned()).build().await.unwrap();
    let e = same.erase(erase(S1, "SAR-20")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(
        e.to_string().contains("the retained database itself"),
        "{e}"
    );
    assert_eq!(contacts(db.pool()).await, [1, 2, 3, 4, 5, 6, 7]);

    let cohort = with_url(other.url().to_owned()).build().await.unwrap();
    cohort.erase(erase(S1, "SAR-20")).await.unwrap();
    let rows: Vec<(i64, String)> =
        sqlx::query_as("SELECT seq, entry FROM public.cohort_journal ORDER BY seq")
            .fetch_all(&PgPool::connect_with(other.connect_options()).await.unwrap())
            .await
            .unwrap();
    let seqs: Vec<i64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(seqs, [1, 2, 3], "opened, in progress, completed");
    assert!(
        rows.iter().all(|r| !r.1.contains(S1)),
        "the subject is sealed"
    );
    assert!(cohort.restore_check().await.unwrap().is_clean());

    // Unreachable: refused, nothing run.
    drop(other);
    let e = cohort.erase(erase(S2, "SAR-21")).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.to_string().contains("unreachable"), "{e}");
    assert_eq!(contacts(db.pool()).await, [1, 2, 5, 6, 7]);
}

/// A journal in a database is opened once per handle: one connection
/// serves every append and read, and one the server dropped is opened
/// again at the next append, with no entry lost or written twice.
#[tokio::test]
async fn a_journal_database_keeps_one_connection_and_opens_another_once_it_is_dropped() {
    use sqlx::Connection;
    let db = migrated_db().await;
    exec(db.pool(), TABLES).await;
    let other = Cluster::start().await.unwrap();
    let cohort = builder(
        db.pool(),
        JournalConfig::url(other.url().to_owned()).key(key()),
    )
    .build()
    .await
    .unwrap();
    let mut watch = sqlx::PgConnection::connect_with(&other.connect_options())
        .await
        .unwrap();
    const THEIRS: &str = "SELECT pid FROM pg_catalog.pg_stat_activity \
         WHERE datname = pg_catalog.current_database() AND pid <> pg_catalog.pg_backend_pid() \
         AND backend_type = 'client backend' ORDER BY pid";
    let mut theirs = async || -> Vec<i32> {
        sqlx::query_scalar(THEIRS)
            .fetch_all(&mut watch)
            .await
            .unwrap()
    };
    cohort.erase(erase(S1, "SAR-30")).await.unwrap();
    let first = theirs().await;
    assert_eq!(
        first.len(),
        1,
        "one connection for the check and three appends"
    );
    cohort.erase(erase(S0, "SAR-31")).await.unwrap();
    assert!(cohort.restore_check().await.unwrap().is_clean());
    assert_eq!(theirs().await, first, "the same connection, kept");

    // The server drops it (a restart, an idle timeout): the next append
    // opens another.
    let mut admin = sqlx::PgConnection::connect_with(&other.connect_options())
        .await
        .unwrap();
    let terminated: bool = sqlx::query_scalar("SELECT pg_catalog.pg_terminate_backend($1)")
        .bind(first[0])
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(terminated);
    admin.close().await.unwrap();
    for _ in 0..200 {
        if theirs().await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        theirs().await.is_empty(),
        "the journal's connection was terminated"
    );
    cohort.erase(erase(S2, "SAR-32")).await.unwrap();
    let second = theirs().await;
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first, "a new connection");
    let seqs: Vec<i64> = sqlx::query_scalar("SELECT seq FROM public.cohort_journal ORDER BY seq")
        .fetch_all(&mut watch)
        .await
        .unwrap();
    assert_eq!(
        seqs,
        (1..=9).collect::<Vec<i64>>(),
        "three entries per request, none lost or doubled"
    );
    assert!(cohort.restore_check().await.unwrap().is_clean());
    assert_eq!(contacts(db.pool()).await, [7]);
}

#[db_test(migrated)]
async fn entries_for_a_hold_and_a_request_that_never_came_to_exist_are_resolved_not_gaps(
    db: TestDatabase,
) {
    let pool = db.pool();
    exec(pool, TABLES).await;
    let dir = tempfile::tempdir().unwrap();
    let cohort = handle(pool, dir.path()).await;

    // A hold on a record that does not exist: journaled, then refused.
    let err = cohort
        .create_hold(HoldRequest::new(
            Uuid::parse_str(CONTACT_ID).unwrap(),
            "999",
            "claim of 2026-12",
        ))
        .await
        .unwrap_err();
    assert!(err.kind().is_bad_input(), "{err}");

    // A request whose reference another transaction takes between the
    // look-up and the insert: the test's uncommitted row holds it, so the
    // request's insert waits for it, then finds it taken.
    let mut gate = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO public.erasure_request (request_id, reference, subject_text, subject_hash, \
         state, received_at, due_at) VALUES (gen_random_uuid(), 'SAR-SAME', 'someone', 'h', 'open', \
         now(), now() + interval '30 days')",
    )
    .execute(&mut *gate)
    .await
    .unwrap();
    let c = cohort.clone();
    let lost = tokio::spawn(async move { c.erase(erase(S0, "SAR-SAME")).await });
    wait_for_lock_wait(pool).await;
    gate.commit().await.unwrap();
    let err = lost.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");

    // Both were journaled before the database refused them...
    let text = std::fs::read_to_string(dir.path().join(cohort::journal::FILE_NAME)).unwrap();
    assert!(text.contains(r#""type":"hold_placed""#), "{text}");
    assert!(text.contains(r#""type":"request_opened""#), "{text}");
    // ...and neither is a gap: restore-check is clean, says why, and a
    // replay has nothing to do.
    let check = cohort.restore_check().await.unwrap();
    assert!(check.is_clean(), "{:?}", check.describe());
    assert_eq!(check.resolved.len(), 2, "{:?}", check.resolved);
    assert!(
        check.resolved[0].contains("never opened") || check.resolved[1].contains("never opened")
    );
    let replay = cohort.replay(false).await.unwrap();
    assert!(replay.holds_placed.is_empty() && replay.requests_restored.is_empty());
    assert!(replay.check.is_clean());
    // The journal file is its owner's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join(cohort::journal::FILE_NAME))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}
