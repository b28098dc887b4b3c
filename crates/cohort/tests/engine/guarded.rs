//! Guarded deletion: the application's own deletes respect legal holds,
//! run on Cohort's transaction, and roll back on error.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cohort::guarded::{Guarded, GuardedDeletion};
use cohort::holds::HoldRequest;
use cohort::Error;
use support::*;
use uuid::Uuid;

fn note_entity() -> Uuid {
    Uuid::parse_str(NOTE_ID).unwrap()
}

async fn note(pool: &sqlx::PgPool, label: &str) -> String {
    sqlx::query_scalar::<_, Uuid>("SELECT id FROM app.notes WHERE body = $1")
        .bind(format!("{TENANT_A}:{label}"))
        .fetch_one(pool)
        .await
        .unwrap()
        .to_string()
}

#[db_test(engine)]
async fn unheld_targets_are_deleted_by_the_callback_on_cohorts_transaction(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let (a, b) = (note(db.pool(), "1d").await, note(db.pool(), "45d").await);
    let ids = vec![a.clone(), b.to_uppercase(), a.clone()];
    let outcome = cohort
        .guarded_delete(
            GuardedDeletion::new(note_entity(), ids).tenant(TENANT_A),
            |tx| {
                Box::pin(async move {
                    let done = sqlx::query("DELETE FROM app.notes WHERE body IN ($1, $2)")
                        .bind(format!("{TENANT_A}:1d"))
                        .bind(format!("{TENANT_A}:45d"))
                        .execute(&mut *tx)
                        .await?;
                    Ok(done.rows_affected())
                })
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome, Guarded::Completed(2));
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.notes").await, 10);
}

#[db_test(engine)]
async fn a_held_target_returns_protected_and_the_callback_never_runs(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let (a, b) = (note(db.pool(), "1d").await, note(db.pool(), "45d").await);
    cohort
        .create_hold(HoldRequest::new(note_entity(), b.clone(), "litigation").tenant(TENANT_A))
        .await
        .unwrap();
    let called = Arc::new(AtomicBool::new(false));
    let flag = called.clone();
    let outcome = cohort
        .guarded_delete(
            GuardedDeletion::new(note_entity(), [a, b.clone()]).tenant(TENANT_A),
            move |_tx| {
                flag.store(true, Ordering::SeqCst);
                Box::pin(async { Ok(()) })
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome, Guarded::Protected { held: vec![b] });
    assert!(!called.load(Ordering::SeqCst));
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.notes").await, 12);
}

#[db_test(engine)]
async fn a_callback_error_rolls_back_and_is_returned(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let a = note(db.pool(), "1d").await;
    let err = cohort
        .guarded_delete(
            GuardedDeletion::new(note_entity(), [a]).tenant(TENANT_A),
            |tx| {
                Box::pin(async move {
                    sqlx::query("DELETE FROM app.notes")
                        .execute(&mut *tx)
                        .await?;
                    Err::<(), _>("downstream refused".into())
                })
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Callback(e) if e.to_string() == "downstream refused"),
        "{err}"
    );
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.notes").await, 12);
}

#[db_test(engine)]
async fn bad_targets_are_refused_and_nothing_runs(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let a = note(db.pool(), "1d").await;
    let cases: Vec<(GuardedDeletion, &str)> = vec![
        (
            GuardedDeletion::new(Uuid::new_v4(), [a.clone()]).tenant(TENANT_A),
            "not the id of a registered retained entity",
        ),
        (
            GuardedDeletion::new(note_entity(), [a.clone()]).tenant(TENANT_B),
            "does not belong to tenant",
        ),
        (
            GuardedDeletion::new(note_entity(), [a.clone()]),
            "give the tenant",
        ),
        (
            GuardedDeletion::new(note_entity(), [Uuid::new_v4().to_string()]).tenant(TENANT_A),
            "do not exist",
        ),
        (
            GuardedDeletion::new(note_entity(), ["x"]).tenant(TENANT_A),
            "is not a valid uuid",
        ),
        (
            GuardedDeletion::new(note_entity(), Vec::<String>::new()).tenant(TENANT_A),
            "at least one record id",
        ),
        (
            GuardedDeletion::new(Uuid::parse_str(GLOBAL_ID).unwrap(), ["1"]).tenant(TENANT_A),
            "do not give a tenant",
        ),
    ];
    for (req, fragment) in cases {
        let result = cohort
            .guarded_delete(req.clone(), |tx| {
                Box::pin(async move {
                    sqlx::query("DELETE FROM app.notes")
                        .execute(&mut *tx)
                        .await?;
                    Ok(())
                })
            })
            .await;
        assert!(
            matches!(&result, Err(e) if e.kind().is_bad_input() && e.to_string().contains(fragment)),
            "{req:?}: {result:?}"
        );
    }
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.notes").await, 12);
}

#[db_test(engine)]
async fn a_hold_created_concurrently_never_ends_with_a_deleted_held_row(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let a = note(db.pool(), "45d").await;

    // 1. The hold is being created (row locked, hold inserted, not committed): the deletion waits, then refuses.
    let mut other = db.connect().await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query("SELECT 1 FROM app.notes WHERE id = $1::uuid FOR KEY SHARE")
        .bind(&a)
        .execute(&mut other)
        .await
        .unwrap();
    sqlx::query("INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, tenant_id, reason) VALUES (gen_random_uuid(), $1, $2, $3, 'racing')")
        .bind(note_entity()).bind(&a).bind(TENANT_A).execute(&mut other).await.unwrap();
    let deleting = tokio::spawn({
        let (cohort, a) = (cohort.clone(), a.clone());
        async move {
            cohort
                .guarded_delete(
                    GuardedDeletion::new(note_entity(), [a]).tenant(TENANT_A),
                    |tx| {
                        Box::pin(async move {
                            sqlx::query("DELETE FROM app.notes WHERE body LIKE '%:45d'")
                                .execute(&mut *tx)
                                .await?;
                            Ok(())
                        })
                    },
                )
                .await
        }
    });
    wait_for_lock_wait(db.pool()).await;
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(60), deleting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        outcome,
        Guarded::Protected {
            held: vec![a.clone()]
        }
    );
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM app.notes WHERE id = '{a}'")
        )
        .await,
        1
    );

    // 2. The deletion holds its lock first: hold creation waits, then finds the row gone.
    let b = note(db.pool(), "400d").await;
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let deleting = tokio::spawn({
        let (cohort, b) = (cohort.clone(), b.clone());
        async move {
            cohort
                .guarded_delete(
                    GuardedDeletion::new(note_entity(), [b.clone()]).tenant(TENANT_A),
                    move |tx| {
                        Box::pin(async move {
                            sqlx::query("DELETE FROM app.notes WHERE id = $1::uuid")
                                .bind(b)
                                .execute(&mut *tx)
                                .await?;
                            let _ = release_rx.await;
                            Ok(())
                        })
                    },
                )
                .await
        }
    });
    // Wait until the deletion holds the row lock (its DELETE has run).
    wait_until("the deletion to hold its row lock", Duration::from_secs(6), async || {
        count(db.pool(), "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'notes' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.mode = 'RowExclusiveLock' AND l.pid <> pg_backend_pid()").await > 0
    })
    .await;
    let creating = tokio::spawn({
        let (cohort, b) = (cohort.clone(), b.clone());
        async move {
            cohort
                .create_hold(HoldRequest::new(note_entity(), b, "too late").tenant(TENANT_A))
                .await
        }
    });
    // Hold creation waits on the deletion's row lock.
    wait_for_lock_wait(db.pool()).await;
    assert!(
        !creating.is_finished(),
        "hold creation must wait for the deletion's lock"
    );
    release_tx.send(()).unwrap();
    assert_eq!(deleting.await.unwrap().unwrap(), Guarded::Completed(()));
    let created = creating.await.unwrap();
    assert!(
        matches!(&created, Err(Error::NotFound(m)) if m.contains("does not exist")),
        "{created:?}"
    );
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM public.retention_hold WHERE record_id = '{b}'")
        )
        .await,
        0
    );
}

/// ORM and sqlx users: the guard in the application's own sqlx transaction. The
/// application's earlier writes in it and the deletion commit together;
/// a held target is reported and the application's transaction is its own.
#[db_test(engine)]
async fn the_guard_runs_in_the_applications_own_transaction(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let (a, b) = (note(db.pool(), "1d").await, note(db.pool(), "45d").await);
    exec(db.pool(), "CREATE TABLE app.audit (what text)").await;

    // Clear: the application's own insert and the deletion commit as one.
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO app.audit VALUES ('deleting a')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let guard = cohort
        .guard_deletion(
            &mut tx,
            GuardedDeletion::new(note_entity(), [a.clone()]).tenant(TENANT_A),
        )
        .await
        .unwrap();
    assert_eq!(guard, Guarded::Completed(()));
    sqlx::query("DELETE FROM app.notes WHERE id = $1::uuid")
        .bind(&a)
        .execute(&mut *tx)
        .await
        .unwrap();
    // Before the commit, nothing is visible outside.
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.audit").await, 0);
    tx.commit().await.unwrap();
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.audit").await, 1);
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM app.notes WHERE id = '{a}'")
        )
        .await,
        0
    );

    // Held: reported; nothing is deleted; the caller rolls back its own work.
    cohort
        .create_hold(HoldRequest::new(note_entity(), b.clone(), "case").tenant(TENANT_A))
        .await
        .unwrap();
    let mut tx = db.pool().begin().await.unwrap();
    sqlx::query("INSERT INTO app.audit VALUES ('deleting b')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let guard = cohort
        .guard_deletion(
            &mut tx,
            GuardedDeletion::new(note_entity(), [b.clone()]).tenant(TENANT_A),
        )
        .await
        .unwrap();
    assert_eq!(
        guard,
        Guarded::Protected {
            held: vec![b.clone()]
        }
    );
    tx.rollback().await.unwrap();
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.audit").await, 1);
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM app.notes WHERE id = '{b}'")
        )
        .await,
        1
    );

    // Bad input: typed errors, nothing locked or changed.
    let mut tx = db.pool().begin().await.unwrap();
    let err = cohort
        .guard_deletion(
            &mut tx,
            GuardedDeletion::new(note_entity(), ["not-a-uuid"]).tenant(TENANT_A),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    let err = cohort
        .guard_deletion(
            &mut tx,
            GuardedDeletion::new(note_entity(), [Uuid::new_v4().to_string()]).tenant(TENANT_A),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err}");
    // The transaction is still usable after a refusal computed in Rust.
    sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
}

/// Under REPEATABLE READ or SERIALIZABLE the hold check would read a stale
/// snapshot: refused, with the reason, and nothing locked.
#[db_test(engine)]
async fn the_guard_refuses_a_transaction_that_is_not_read_committed(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let a = note(db.pool(), "1d").await;
    for (level, set) in [
        (
            "REPEATABLE READ",
            "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        ),
        (
            "SERIALIZABLE",
            "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        ),
    ] {
        let mut tx = db.pool().begin().await.unwrap();
        sqlx::raw_sql(set).execute(&mut *tx).await.unwrap();
        let err = cohort
            .guard_deletion(
                &mut tx,
                GuardedDeletion::new(note_entity(), [a.clone()]).tenant(TENANT_A),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Refused(_)), "{level}: {err}");
        assert!(err.to_string().contains("READ COMMITTED"), "{err}");
        let locks = count(
            db.pool(),
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'notes' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.pid <> pg_backend_pid()",
        )
        .await;
        assert_eq!(locks, 0, "{level}: the rows were touched");
        tx.rollback().await.unwrap();
    }
}

/// A hold being created while the application's transaction guards the
/// row: the guard waits for it and reports the row held.
#[db_test(engine)]
async fn a_hold_committed_while_the_guard_waits_is_seen(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let a = note(db.pool(), "45d").await;
    let mut other = db.connect().await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query("SELECT 1 FROM app.notes WHERE id = $1::uuid FOR KEY SHARE")
        .bind(&a)
        .execute(&mut other)
        .await
        .unwrap();
    sqlx::query("INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, tenant_id, reason) VALUES (gen_random_uuid(), $1, $2, $3, 'racing')")
        .bind(note_entity()).bind(&a).bind(TENANT_A).execute(&mut other).await.unwrap();
    let guarding = tokio::spawn({
        let (cohort, pool, a) = (cohort.clone(), db.pool().clone(), a.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            // The application's transaction has read before (its snapshot
            // would predate the hold under REPEATABLE READ).
            sqlx::query("SELECT count(*) FROM app.notes")
                .execute(&mut *tx)
                .await
                .unwrap();
            let guard = cohort
                .guard_deletion(
                    &mut tx,
                    GuardedDeletion::new(note_entity(), [a]).tenant(TENANT_A),
                )
                .await;
            tx.rollback().await.unwrap();
            guard
        }
    });
    wait_for_lock_wait(db.pool()).await;
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(60), guarding)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(guard, Guarded::Protected { held: vec![a] });
}
