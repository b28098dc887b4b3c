//! The SeaORM application against a real server: its migrator installs
//! Cohort's tables, the handle shares SeaORM's pool, and deletes in a
//! SeaORM transaction respect legal holds.

use chrono::{TimeDelta, Utc};
use cohort::guarded::{Guarded, GuardedDeletion};
use cohort::holds::HoldRequest;
use cohort::SweepRequest;
use cohort_example_seaorm::{delete_note, migration::Migrator, note, retention, Deleted};
use sea_orm::{ActiveModelTrait, ConnectionTrait, Database, EntityTrait, Set, TransactionTrait};
use sea_orm_migration::MigratorTrait;
use uuid::Uuid;

const TENANT: Uuid = Uuid::from_u128(0x1111_1111_1111_1111_1111_1111_1111_1111);

async fn insert(db: &impl ConnectionTrait, days_old: i64) -> Uuid {
    let id = Uuid::new_v4();
    note::ActiveModel {
        id: Set(id),
        tenant_id: Set(TENANT),
        created_at: Set((Utc::now() - TimeDelta::days(days_old)).fixed_offset()),
        body: Set(format!("secret-body-{days_old}")),
    }
    .insert(db)
    .await
    .unwrap();
    id
}

/// MIGRATION (SeaORM) and RS-GUARDED-002 (SeaORM): the migrator installs
/// Cohort at the current version, twice is a no-op; sweeps and guarded
/// deletes work on SeaORM's connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seaorm_application_migrates_sweeps_and_deletes_under_holds() {
    let tdb = cohort_pgtemp::fresh_empty_database().await.unwrap();
    let db = Database::connect(tdb.url()).await.unwrap();
    Migrator::up(&db, None).await.unwrap();
    let mut conn = tdb.pool().acquire().await.unwrap();
    assert_eq!(
        cohort::schema::installed_version(&mut conn, "retention")
            .await
            .unwrap(),
        Some(cohort::schema::SCHEMA_VERSION)
    );
    // A second run applies nothing; `cohort migrate`'s own runner agrees.
    Migrator::up(&db, None).await.unwrap();
    let report = cohort::schema::migrate(&mut conn, "retention")
        .await
        .unwrap();
    assert!(report.applied.is_empty(), "{report:?}");
    // Running the Cohort step again on a SeaORM connection is a no-op too.
    let again = cohort::sea_orm::migrate(&db, "retention").await.unwrap();
    assert!(again.applied.is_empty(), "{again:?}");

    let cohort = retention(&db).await.unwrap();
    let (old, held, fresh) = (
        insert(&db, 90).await,
        insert(&db, 90).await,
        insert(&db, 1).await,
    );
    cohort
        .create_hold(
            HoldRequest::new(note::Model::RETENTION_ENTITY_ID, held.to_string(), "case")
                .tenant(TENANT.to_string()),
        )
        .await
        .unwrap();

    // Guarded deletes in SeaORM transactions.
    assert_eq!(
        delete_note(&db, &cohort, TENANT, held).await.unwrap(),
        Deleted::Held
    );
    assert!(note::Entity::find_by_id(held)
        .one(&db)
        .await
        .unwrap()
        .is_some());
    assert_eq!(
        delete_note(&db, &cohort, TENANT, fresh).await.unwrap(),
        Deleted::Yes
    );
    assert!(note::Entity::find_by_id(fresh)
        .one(&db)
        .await
        .unwrap()
        .is_none());
    // An unknown id is a typed error; the transaction was rolled back.
    let err = delete_note(&db, &cohort, TENANT, Uuid::new_v4())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("do not exist"), "{err}");

    // A sweep through the handle built on SeaORM's pool: the old note goes,
    // the held one stays.
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT.to_string(), Utc::now()))
        .await
        .unwrap();
    let notes = r.entity("Note").unwrap();
    assert_eq!((notes.affected, notes.held), (1, 1), "{r:?}");
    assert!(note::Entity::find_by_id(old)
        .one(&db)
        .await
        .unwrap()
        .is_none());
    assert!(note::Entity::find_by_id(held)
        .one(&db)
        .await
        .unwrap()
        .is_some());
}

/// The guard inside a SeaORM transaction sees a hold committed while it
/// waited for the row's lock, and refuses REPEATABLE READ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seaorm_guard_waits_for_a_hold_being_placed_and_refuses_repeatable_read() {
    let tdb = cohort_pgtemp::fresh_empty_database().await.unwrap();
    let db = Database::connect(tdb.url()).await.unwrap();
    Migrator::up(&db, None).await.unwrap();
    let cohort = retention(&db).await.unwrap();
    let a = insert(&db, 10).await;

    // Another session is placing a hold on `a` (row locked, hold inserted).
    let mut other = tdb.connect().await.unwrap();
    cohort::sqlx::query("BEGIN")
        .execute(&mut other)
        .await
        .unwrap();
    cohort::sqlx::query("SELECT 1 FROM app.notes WHERE id = $1 FOR KEY SHARE")
        .bind(a)
        .execute(&mut other)
        .await
        .unwrap();
    cohort::sqlx::query("INSERT INTO retention.retention_hold (hold_id, retention_entity_id, record_id, tenant_id, reason) VALUES (gen_random_uuid(), $1, $2, $3, 'racing')")
        .bind(note::Model::RETENTION_ENTITY_ID)
        .bind(a.to_string())
        .bind(TENANT.to_string())
        .execute(&mut other)
        .await
        .unwrap();
    let guarding = tokio::spawn({
        let (db, cohort) = (db.clone(), cohort.clone());
        async move {
            let txn = db.begin().await.unwrap();
            let guard = cohort
                .guard_deletion_sea_orm(
                    &txn,
                    GuardedDeletion::new(note::Model::RETENTION_ENTITY_ID, [a.to_string()])
                        .tenant(TENANT.to_string()),
                )
                .await;
            txn.rollback().await.unwrap();
            guard
        }
    });
    // Wait until the guard waits on the row lock, then commit the hold.
    for _ in 0.. {
        let waiting: i64 = cohort::sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .fetch_one(tdb.pool())
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    cohort::sqlx::query("COMMIT")
        .execute(&mut other)
        .await
        .unwrap();
    let guard = tokio::time::timeout(std::time::Duration::from_secs(60), guarding)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        guard,
        Guarded::Protected {
            held: vec![a.to_string()]
        }
    );

    let txn = db
        .begin_with_config(Some(sea_orm::IsolationLevel::RepeatableRead), None)
        .await
        .unwrap();
    let err = cohort
        .guard_deletion_sea_orm(
            &txn,
            GuardedDeletion::new(note::Model::RETENTION_ENTITY_ID, [a.to_string()])
                .tenant(TENANT.to_string()),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, cohort::Error::Refused(_)), "{err}");
    txn.rollback().await.unwrap();

    // A connection that is not PostgreSQL is refused by the builder... only
    // PostgreSQL is compiled in here; the builder's check is a pattern match.
    assert!(cohort::sea_orm::builder(&db).is_ok());
}
