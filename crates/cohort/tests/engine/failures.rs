//! What a failure leaves behind. The server crashed (`pg_ctl restart -m
//! immediate`: SIGQUIT, crash recovery from the WAL) in the middle of a
//! sweep, an erasure and a dispatch (RS-005); the run's connection or the
//! dispatcher's terminated; timeouts set low on the role; a run cancelled;
//! one entity failing mid run. After each, every batch is whole with its
//! audit or absent, the run settles (or is recovered) with a sanitised
//! error, no handler work is lost, the other entities do their work, and a
//! rerun finishes.
//! A failing `on_before` skips its row and the run goes on (the seeds'
//! execution rule): the row stays as it was and is counted `skipped`, its
//! work is dead-lettered once with a sanitised reason (never retryable),
//! the other rows of its batch are mutated and queued, the run's later
//! batches never pick it again, and the next run tries it again. A batch
//! whose every row fails stops the entity's loop.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::handlers::{
    AfterContext, BeforeContext, DeadLetterFilter, HandlerError, HandlerRegistration,
    RetrySelection, RowHandler,
};
use cohort::model::{AnonymiseMethod, CustomAnonymiser};
use cohort::observer::{AuditEvent, AuditObserver};
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::{
    async_trait, AuditDetail, Cancel, Cohort, CohortConfig, EntityDeclaration, Error, RunStatus,
    SweepRequest,
};
use cohort_pgtemp::Cluster;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use support::*;
use uuid::Uuid;

// --- A server crash mid sweep, erasure or dispatch

const ITEM_ID: &str = "7a1c2e3f-4b5d-4e6f-8a9b-0c1d2e3f4a5b";
const TENANT: &str = "11111111-1111-1111-1111-111111111111";
const SUBJECT: &str = "22222222-2222-2222-2222-222222222222";
const ROWS: i64 = 400;

/// 400 old items of one tenant, half of them the subject's; every delete
/// sleeps a little so that a run is long enough to be interrupted.
const TABLES: &str = "CREATE SCHEMA app;
    CREATE TABLE app.items (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, owner_id uuid NOT NULL,
        created_at timestamptz NOT NULL, body text NOT NULL);
    CREATE INDEX ON app.items (tenant_id, created_at);
    INSERT INTO app.items SELECT g, '11111111-1111-1111-1111-111111111111',
        CASE WHEN g % 2 = 0 THEN '22222222-2222-2222-2222-222222222222'::uuid ELSE gen_random_uuid() END,
        now() - interval '400 days' - make_interval(secs => g), 'secret ' || g
        FROM generate_series(1, 400) g;
    CREATE FUNCTION app.slow() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_sleep(0.004); RETURN OLD; END $$;
    CREATE TRIGGER slow BEFORE DELETE ON app.items FOR EACH ROW EXECUTE FUNCTION app.slow();";

/// A cluster of the test's own (it is crashed), migrated and seeded. A
/// commit must survive the crash, so it is written before it returns
/// (`synchronous_commit=on`; the throw-away clusters' default is off,
/// which may lose the last commits to an immediate shutdown).
async fn server() -> (Cluster, PgPool) {
    let cluster = Cluster::start_with_settings("synchronous_commit=on")
        .await
        .unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(cluster.url())
        .await
        .unwrap();
    cohort::schema::migrate(&mut pool.acquire().await.unwrap(), "public")
        .await
        .unwrap();
    sqlx::raw_sql(TABLES).execute(&pool).await.unwrap();
    (cluster, pool)
}

/// Counts the deliveries; optionally slow, to be caught mid-delivery.
struct Deliveries {
    delivered: Arc<AtomicU64>,
    delay: Duration,
}

struct Item;

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for Item {
    fn from_row(_: &'r sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Ok(Item)
    }
}

#[cohort::async_trait]
impl RowHandler<Item> for Deliveries {
    async fn on_before(&self, _: &Item, _: &mut BeforeContext) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn on_after(&self, _: &AfterContext) -> Result<(), HandlerError> {
        // A slow delivery is the fault under test (work in flight when the
        // server goes away), not a wait.
        tokio::time::sleep(self.delay).await;
        self.delivered.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Per-row audit, batches of 20; recovery after 1 s; deliveries claimed
/// for 2 s.
async fn cohort(pool: &PgPool, handler: Option<Deliveries>) -> Cohort {
    let rules = StaticRuleProvider::builder()
        .category(
            "items",
            RetentionRule::new("30d".parse().unwrap(), Strategy::Purge)
                .with_audit(AuditDetail::PerRow)
                .unwrap(),
        )
        .build()
        .unwrap();
    let config = CohortConfig {
        sweep_batch_size: cohort::BatchSize::Fixed(20),
        dispatch: cohort::config::DispatchConfig {
            settle_timeout: "1s".parse().unwrap(),
            claim_timeout: "2s".parse().unwrap(),
            base_backoff: "1s".parse().unwrap(),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut b = Cohort::builder(pool.clone())
        .config(config)
        .rules(rules)
        .declaration(
            EntityDeclaration::new("Item", ITEM_ID)
                .category("items")
                .anchor("created_at")
                .table("app.items")
                .subject("owner_id", None),
        );
    if let Some(h) = handler {
        b = b.handler::<Item, _>(
            HandlerRegistration::new(Uuid::parse_str(ITEM_ID).unwrap(), "count"),
            h,
        );
    }
    b.build().await.unwrap()
}

async fn scalar(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Waits (on a fresh connection each time, the pool may hold dead ones)
/// until `sql` returns at least `n`.
async fn wait_for(pool: &PgPool, sql: &'static str, n: i64) {
    support::wait_until(sql, Duration::from_secs(60), async || {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(pool)
            .await
            .is_ok_and(|v| v >= n)
    })
    .await;
}

/// Every batch whole or absent: each deleted row has exactly one detail
/// row, every detail's row is gone, and the summaries add up to the
/// details, run by run.
async fn assert_batches_whole(pool: &PgPool) {
    let deleted = ROWS - scalar(pool, "SELECT count(*) FROM app.items").await;
    let details = scalar(pool, "SELECT count(*) FROM public.sweep_run_row_detail").await;
    let distinct = scalar(
        pool,
        "SELECT count(DISTINCT record_id) FROM public.sweep_run_row_detail",
    )
    .await;
    let summed = scalar(
        pool,
        "SELECT COALESCE(sum(affected_count), 0)::int8 FROM public.sweep_run_entity_summary",
    )
    .await;
    let orphans = scalar(
        pool,
        "SELECT count(*) FROM public.sweep_run_row_detail d JOIN app.items i ON i.id::text = d.record_id",
    )
    .await;
    assert_eq!(
        details, deleted,
        "a deleted row without its detail, or the reverse"
    );
    assert_eq!(distinct, details, "a row recorded twice");
    assert_eq!(summed, details, "summaries disagree with the details");
    assert_eq!(orphans, 0, "a detail for a row that still exists");
    let mismatched = scalar(
        pool,
        "SELECT count(*) FROM public.sweep_run_entity_summary s WHERE s.affected_count <>
            (SELECT count(*) FROM public.sweep_run_row_detail d WHERE d.run_id = s.run_id)",
    )
    .await;
    assert_eq!(mismatched, 0, "a run whose summary is not its details");
}

/// RS-005: the server crashes mid-sweep. Committed batches stay whole with
/// their audit, the open one is gone; the run left `started` is recovered
/// as failed; a rerun finishes the work.
#[tokio::test]
async fn a_server_crash_mid_sweep_leaves_whole_batches_and_a_rerun_finishes() {
    let (mut cluster, pool) = server().await;
    let cohort = cohort(&pool, None).await;
    let sweeping = tokio::spawn({
        let cohort = cohort.clone();
        async move {
            cohort
                .sweep(SweepRequest::tenanted(TENANT, chrono::Utc::now()))
                .await
        }
    });
    wait_for(
        &pool,
        "SELECT COALESCE(sum(affected_count), 0)::int8 FROM public.sweep_run_entity_summary",
        60,
    )
    .await;
    cluster
        .crash_restart(Duration::from_millis(500))
        .await
        .unwrap();
    let interrupted = sweeping.await.unwrap();
    assert!(
        !matches!(&interrupted, Ok(r) if r.status == RunStatus::Succeeded),
        "the sweep cannot have succeeded: {interrupted:?}"
    );
    assert_batches_whole(&pool).await;
    let left = scalar(&pool, "SELECT count(*) FROM app.items").await;
    assert!(left > 0 && left < ROWS, "interrupted mid-way: {left} left");

    // Recovery: the run left started is settled failed (its lock died with
    // its session).
    support::backdate_abandoned_runs(&pool).await;
    let report = cohort.dispatcher().flush().await.unwrap();
    assert_eq!(report.recovered_runs, 1, "{report:?}");
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM public.sweep_run WHERE status = 'started'"
        )
        .await,
        0
    );
    // The rerun finishes.
    let rerun = cohort
        .sweep(SweepRequest::tenanted(TENANT, chrono::Utc::now()))
        .await
        .unwrap();
    assert_eq!(rerun.status, RunStatus::Succeeded);
    assert_eq!(rerun.affected(), left as u64);
    assert_eq!(scalar(&pool, "SELECT count(*) FROM app.items").await, 0);
    assert_batches_whole(&pool).await;
    cluster.stop();
}

/// RS-005: the server crashes mid-erasure: the same guarantees; the rerun
/// erases exactly the subject's remaining rows.
#[tokio::test]
async fn a_server_crash_mid_erasure_leaves_whole_batches_and_a_rerun_finishes() {
    let (mut cluster, pool) = server().await;
    let cohort = cohort(&pool, None).await;
    let request =
        || ErasureRequest::tenanted(TENANT, ErasureScope::new(SUBJECT), chrono::Utc::now());
    let erasing = tokio::spawn({
        let cohort = cohort.clone();
        let request = request();
        async move { cohort.erase(request).await }
    });
    wait_for(
        &pool,
        "SELECT COALESCE(sum(affected_count), 0)::int8 FROM public.sweep_run_entity_summary",
        40,
    )
    .await;
    cluster
        .crash_restart(Duration::from_millis(500))
        .await
        .unwrap();
    let interrupted = erasing.await.unwrap();
    assert!(!matches!(&interrupted, Ok(r) if r.status == RunStatus::Succeeded));
    assert_batches_whole(&pool).await;
    let subjects_left = scalar(
        &pool,
        "SELECT count(*) FROM app.items WHERE owner_id = '22222222-2222-2222-2222-222222222222'",
    )
    .await;
    assert!(
        subjects_left > 0 && subjects_left < ROWS / 2,
        "{subjects_left}"
    );
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM app.items WHERE owner_id <> '22222222-2222-2222-2222-222222222222'").await,
        ROWS / 2,
        "an erasure touched someone else's row"
    );
    support::backdate_abandoned_runs(&pool).await;
    assert_eq!(cohort.dispatcher().flush().await.unwrap().recovered_runs, 1);
    let rerun = cohort.erase(request()).await.unwrap();
    assert_eq!(rerun.status, RunStatus::Succeeded);
    assert_eq!(rerun.affected(), subjects_left as u64);
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM app.items").await,
        ROWS / 2
    );
    assert_batches_whole(&pool).await;
    cluster.stop();
}

/// RS-005: the server crashes while deliveries are in flight: after the
/// restart every piece of work is delivered (at least once: a delivery
/// whose outcome was lost is delivered again after its claim expires), and
/// none is lost.
#[tokio::test]
async fn a_server_crash_mid_dispatch_loses_no_work() {
    let (mut cluster, pool) = server().await;
    sqlx::query("DELETE FROM app.items WHERE id > 60")
        .execute(&pool)
        .await
        .unwrap();
    let delivered = Arc::new(AtomicU64::new(0));
    let cohort = cohort(
        &pool,
        Some(Deliveries {
            delivered: delivered.clone(),
            delay: Duration::from_millis(30),
        }),
    )
    .await;
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT, chrono::Utc::now()))
        .await
        .unwrap();
    assert_eq!(r.affected(), 60);
    let stop = cohort::Cancel::new();
    let dispatching = tokio::spawn({
        let (dispatcher, stop) = (cohort.dispatcher(), stop.clone());
        async move { dispatcher.run(stop).await }
    });
    support::wait_until("ten deliveries", Duration::from_secs(30), async || {
        delivered.load(Ordering::SeqCst) >= 10
    })
    .await;
    cluster
        .crash_restart(Duration::from_millis(500))
        .await
        .unwrap();
    // The dispatcher keeps polling through the outage; wait until the queue
    // has nothing left that is not terminal.
    wait_for(
        &pool,
        "SELECT CASE WHEN count(*) FILTER (WHERE status IN ('pending', 'in_flight')) = 0 THEN 1 ELSE 0 END::int8 FROM public.sweep_row_handler_status",
        1,
    )
    .await;
    stop.cancel();
    dispatching.await.unwrap();
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM public.sweep_row_handler_status WHERE status = 'succeeded'"
        )
        .await,
        60,
        "every piece of work delivered"
    );
    assert!(delivered.load(Ordering::SeqCst) >= 60, "at least once");
    cluster.stop();
}

// --- A terminated connection, and timeouts on the role
//
// The first two tests terminate the run's own connection mid sweep. The
// first, on a server of its own with per-row audit, proves the audit whole
// row by row and the run settled or recovered, whichever way the call
// returns; the second, on the engine fixture with the kill timed by an
// observer after a committed batch, proves the run settles itself `failed`
// and reports exactly the whole batches it committed.

/// RS-005: the run's own backend is terminated mid-sweep (an operator's
/// `pg_terminate_backend`, a failover): the run fails, committed batches
/// are whole, its lock is gone with its session, and a rerun finishes.
#[tokio::test]
async fn terminating_the_run_connection_mid_sweep_fails_the_run_cleanly() {
    let (cluster, pool) = server().await;
    let cohort = cohort(&pool, None).await;
    let sweeping = tokio::spawn({
        let cohort = cohort.clone();
        async move {
            cohort
                .sweep(SweepRequest::tenanted(TENANT, chrono::Utc::now()))
                .await
        }
    });
    wait_for(
        &pool,
        "SELECT COALESCE(sum(affected_count), 0)::int8 FROM public.sweep_run_entity_summary",
        40,
    )
    .await;
    // The backend holding the run lock is the run's connection (its open
    // batch also holds the hold gate, which is not the run lock).
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM (SELECT DISTINCT pid FROM pg_locks
         WHERE locktype = 'advisory' AND pid <> pg_backend_pid()
           AND NOT (objsubid = 2 AND classid = 1131375665)
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) l) t",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(killed, 1);
    let result = sweeping.await.unwrap();
    // Either the run settled failed (on a fresh connection) or the call
    // returned the connection error; never a success.
    if let Ok(r) = &result {
        assert_eq!(r.status, RunStatus::Failed, "{r:?}");
    }
    assert_batches_whole(&pool).await;
    support::backdate_abandoned_runs(&pool).await;
    cohort.dispatcher().flush().await.unwrap();
    assert_eq!(
        scalar(
            &pool,
            "SELECT count(*) FROM public.sweep_run WHERE status = 'started'"
        )
        .await,
        0,
        "settled by the run itself or recovered"
    );
    let rerun = cohort
        .sweep(SweepRequest::tenanted(TENANT, chrono::Utc::now()))
        .await
        .unwrap();
    assert_eq!(rerun.status, RunStatus::Succeeded);
    assert_eq!(scalar(&pool, "SELECT count(*) FROM app.items").await, 0);
    assert_batches_whole(&pool).await;
    cluster.stop();
}

#[db_test(engine)]
async fn a_terminated_run_connection_settles_the_run_failed_with_no_half_batch(db: TestDatabase) {
    factory::notes(TENANT_A)
        .created(factory::at("2025-12-31T23:59:59Z"))
        .spaced(chrono::TimeDelta::seconds(1))
        .numbered("bulk:")
        .count(40)
        .insert(db.pool())
        .await;
    struct Killer(sqlx::PgPool, Arc<Mutex<bool>>);
    #[async_trait]
    impl AuditObserver for Killer {
        async fn on_event(
            &self,
            event: &AuditEvent,
        ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            if matches!(event, AuditEvent::EntityProgress { .. }) && !*self.1.lock().unwrap() {
                *self.1.lock().unwrap() = true;
                // The run's connection is the one holding an advisory lock
                // in this test's database (other tests share the cluster).
                sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
                    .execute(&self.0)
                    .await?;
            }
            Ok(())
        }
    }
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .config(batches_of(5))
        .rules(rules())
        .observer(Killer(db.pool().clone(), Arc::default()));
    b = b.declaration(engine_entities().remove(0));
    let cohort = b.build().await.unwrap();
    // Slow each batch down a little so the kill lands mid-run.
    exec(db.pool(), "CREATE FUNCTION app.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.02); RETURN OLD; END $$;
        CREATE TRIGGER slow BEFORE DELETE ON app.notes FOR EACH ROW EXECUTE FUNCTION app.slow();").await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Failed, "{result:?}");
    let affected = result.entities[0].affected;
    assert!(
        affected >= 5 && affected % 5 == 0,
        "only whole batches committed: {affected}"
    );
    let left = count(db.pool(), &format!("SELECT count(*) FROM app.notes WHERE tenant_id = '{TENANT_A}' AND created_at < '2026-05-02'")).await;
    assert_eq!(left as u64, 43 - affected, "reported = committed");
    let (status, _, settled, _) = ledger(db.pool(), result.run_id).await;
    assert_eq!((status.as_str(), settled), ("failed", true));
    // A rerun finishes the work.
    let rerun = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(rerun.entities[0].affected, 43 - affected);
}

/// RS-005: the dispatcher's connections are terminated while deliveries
/// are in flight: it reconnects, nothing is lost, everything is delivered.
#[tokio::test]
async fn terminating_the_dispatchers_connections_loses_no_work() {
    let (cluster, pool) = server().await;
    sqlx::query("DELETE FROM app.items WHERE id > 40")
        .execute(&pool)
        .await
        .unwrap();
    let delivered = Arc::new(AtomicU64::new(0));
    let cohort = cohort(
        &pool,
        Some(Deliveries {
            delivered: delivered.clone(),
            delay: Duration::from_millis(30),
        }),
    )
    .await;
    cohort
        .sweep(SweepRequest::tenanted(TENANT, chrono::Utc::now()))
        .await
        .unwrap();
    let stop = cohort::Cancel::new();
    let dispatching = tokio::spawn({
        let (dispatcher, stop) = (cohort.dispatcher(), stop.clone());
        async move { dispatcher.run(stop).await }
    });
    support::wait_until("eight deliveries", Duration::from_secs(30), async || {
        delivered.load(Ordering::SeqCst) >= 8
    })
    .await;
    let observer = PgPoolOptions::new()
        .max_connections(1)
        .connect(cluster.url())
        .await
        .unwrap();
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend') t",
    )
    .fetch_one(&observer)
    .await
    .unwrap();
    assert!(killed >= 1);
    wait_for(
        &observer,
        "SELECT CASE WHEN count(*) FILTER (WHERE status IN ('pending', 'in_flight')) = 0 THEN 1 ELSE 0 END::int8 FROM public.sweep_row_handler_status",
        1,
    )
    .await;
    stop.cancel();
    dispatching.await.unwrap();
    assert_eq!(
        scalar(
            &observer,
            "SELECT count(*) FROM public.sweep_row_handler_status WHERE status = 'succeeded'"
        )
        .await,
        40
    );
    assert!(delivered.load(Ordering::SeqCst) >= 40);
    cluster.stop();
}

/// RS-005: `statement_timeout` set low on the role: the batch that runs
/// over is rolled back, the run settles with a clear, sanitised error
/// (SQLSTATE 57014), nothing is half-done; `lock_timeout` likewise for an
/// erasure waiting on a row another session holds.
#[tokio::test]
async fn timeouts_on_the_role_fail_cleanly_with_nothing_half_done() {
    let (cluster, pool) = server().await;
    sqlx::raw_sql(
        "CREATE ROLE cohort_timed LOGIN SUPERUSER;
         ALTER ROLE cohort_timed SET statement_timeout = '40ms';
         ALTER ROLE cohort_timed SET lock_timeout = '100ms';",
    )
    .execute(&pool)
    .await
    .unwrap();
    let timed = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(cluster.connect_options().username("cohort_timed"))
        .await
        .unwrap();
    let cohort = cohort(&timed, None).await;
    // 20 rows x 4 ms of trigger per batch: over 40 ms.
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT, chrono::Utc::now()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::PartiallyFailed, "{r:?}");
    assert!(
        r.failures[0].error.contains("code=57014"),
        "{:?}",
        r.failures
    );
    assert_eq!(scalar(&pool, "SELECT count(*) FROM app.items").await, ROWS);
    assert_batches_whole(&pool).await;

    // lock_timeout: a subject's row held by another transaction; the
    // erasure (which waits rather than skipping) gives up cleanly.
    sqlx::raw_sql(
        "ALTER ROLE cohort_timed SET statement_timeout = 0; DROP TRIGGER slow ON app.items;",
    )
    .execute(&pool)
    .await
    .unwrap();
    let timed = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(cluster.connect_options().username("cohort_timed"))
        .await
        .unwrap();
    let cohort = self::cohort(&timed, None).await;
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM app.items WHERE id = 2 FOR UPDATE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let r = cohort
        .erase(ErasureRequest::tenanted(
            TENANT,
            ErasureScope::new(SUBJECT),
            chrono::Utc::now(),
        ))
        .await
        .unwrap();
    assert_ne!(r.status, RunStatus::Succeeded, "{r:?}");
    assert!(
        r.failures.iter().any(|f| f.error.contains("code=55P03")),
        "{:?}",
        r.failures
    );
    holder.rollback().await.unwrap();
    assert_batches_whole(&pool).await;
    // With the lock gone the rerun erases every one of the subject's rows.
    let rerun = cohort
        .erase(ErasureRequest::tenanted(
            TENANT,
            ErasureScope::new(SUBJECT),
            chrono::Utc::now(),
        ))
        .await
        .unwrap();
    assert_eq!(rerun.status, RunStatus::Succeeded, "{rerun:?}");
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM app.items WHERE owner_id = '22222222-2222-2222-2222-222222222222'").await,
        0
    );
    assert_batches_whole(&pool).await;
    cluster.stop();
}

// --- A cancelled run, and one entity failing mid run

pub(crate) async fn cohort_with(
    db: &cohort_pgtemp::TestDatabase,
    config: CohortConfig,
    decls: Vec<cohort::EntityDeclaration>,
) -> Cohort {
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .config(config)
        .rules(rules());
    for d in decls {
        b = b.declaration(d);
    }
    b.build().await.unwrap()
}

#[db_test(engine)]
async fn a_cancelled_run_rolls_back_its_open_batch_and_settles_cancelled(db: TestDatabase) {
    let token = Cancel::new();
    let trip = token.clone();
    // The custom anonymiser runs inside the batch, after the rows are locked: cancel there.
    let contact = cohort::EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("app.contacts")
        .anonymise("email", AnonymiseMethod::Null)
        .anonymise(
            "full_name",
            AnonymiseMethod::Custom(CustomAnonymiser::new("cancel_midway", move |v: &String| {
                trip.cancel();
                format!("masked {}", v.len())
            })),
        );
    let cohort = cohort_with(&db, test_config(), vec![contact]).await;
    let before = table_digest(db.pool(), "app.contacts").await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()).cancellation(token))
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Cancelled);
    assert_eq!(result.entities[0].affected, 0);
    assert_eq!(
        table_digest(db.pool(), "app.contacts").await,
        before,
        "the in-flight batch left its rows untouched"
    );
    let (status, _, settled, summaries) = ledger(db.pool(), result.run_id).await;
    assert_eq!((status.as_str(), settled), ("cancelled", true));
    assert_eq!(summaries[0].2, 0);
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM sweep_run_row_detail").await,
        0
    );

    // Cancelled before it starts: Started, then Cancelled, nothing else.
    let pre = Cancel::new();
    pre.cancel();
    let plain = engine_cohort(&db).await;
    let r = plain
        .sweep(SweepRequest::tenanted(TENANT_A, now()).cancellation(pre))
        .await
        .unwrap();
    assert_eq!((r.status, r.entities.len()), (RunStatus::Cancelled, 0));
    // The rows stay eligible for a later run.
    let later = plain
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(later.entity("Contact").unwrap().affected, 3);
}

#[db_test(engine)]
async fn one_entity_failing_mid_run_keeps_committed_batches_and_the_other_entities_work(
    db: TestDatabase,
) {
    // Soft-deleting the '45d' ticket fails, with subject data in the message.
    exec(db.pool(), "CREATE FUNCTION app.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.subject = 'ticket 45d' THEN RAISE EXCEPTION 'cannot delete ticket of alice@example.com'; END IF; RETURN NEW; END $$;
        CREATE TRIGGER refuse BEFORE UPDATE ON app.tickets FOR EACH ROW EXECUTE FUNCTION app.refuse();").await;
    let config = batches_of(1);
    let cohort = cohort_with(&db, config, engine_entities()).await;
    let logs = logs::capture(logs::Format::Text);
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::PartiallyFailed);
    assert_eq!(result.failures.len(), 1);
    let failure = &result.failures[0];
    assert_eq!(failure.entity, "Ticket");
    assert!(
        failure
            .error
            .starts_with("kind=database code=P0001 diagnostic_id="),
        "{}",
        failure.error
    );
    assert!(!failure.error.contains("alice"));
    // The full error is in the log, under the same diagnostic id.
    let diagnostic_id = failure.error.rsplit('=').next().unwrap();
    let log = logs.text();
    let line = log
        .lines()
        .find(|l| l.contains(diagnostic_id))
        .unwrap_or_else(|| panic!("no log line for {diagnostic_id}:\n{log}"));
    assert!(
        line.contains("cannot delete ticket of alice@example.com"),
        "{line}"
    );
    // Oldest first: the 400d ticket's batch committed before the failing one; nothing after it ran.
    let deleted = labels(
        db.pool(),
        &format!("SELECT subject FROM app.tickets WHERE tenant_id = '{TENANT_A}' AND is_deleted"),
    )
    .await;
    assert_eq!(deleted, vec!["ticket 400d".to_string()]);
    assert_eq!(
        result.entity("Ticket").unwrap().affected,
        1,
        "never over-reports"
    );
    // The other entities did all their work.
    assert_eq!(result.entity("Note").unwrap().affected, 3);
    assert_eq!(result.entity("Contact").unwrap().affected, 3);
    let (status, _, settled, summaries) = ledger(db.pool(), result.run_id).await;
    assert_eq!((status.as_str(), settled), ("partially_failed", true));
    assert_eq!(summaries.iter().find(|s| s.0 == "Ticket").unwrap().2, 1);
    assert_eq!(summaries.iter().find(|s| s.0 == "Note").unwrap().2, 3);
    let (run_error, summary_error): (String, String) = sqlx::query_as(
        "SELECT r.error, s.error FROM sweep_run r JOIN sweep_run_entity_summary s USING (run_id) WHERE r.run_id = $1 AND s.entity_type = 'Ticket'",
    )
    .bind(result.run_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(
        run_error.contains(&failure.error) && summary_error == failure.error,
        "{run_error} / {summary_error}"
    );
    assert!(!run_error.contains("alice"));
}

#[db_test(engine)]
async fn per_row_detail_and_provenance_are_recorded_and_a_rolled_back_batch_leaves_none(
    db: TestDatabase,
) {
    exec(db.pool(), "CREATE FUNCTION app.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF OLD.body LIKE '%:45d' THEN RAISE EXCEPTION 'no'; END IF; RETURN OLD; END $$;
        CREATE TRIGGER refuse BEFORE DELETE ON app.notes FOR EACH ROW EXECUTE FUNCTION app.refuse();").await;
    let rules = cohort::rules::StaticRuleProvider::builder()
        .category(
            "notes",
            RetentionRule::new(days(30), Strategy::Purge)
                .with_audit(cohort::AuditDetail::PerRow)
                .unwrap()
                .with_source("policy v3")
                .unwrap()
                .with_reason("ops data")
                .unwrap(),
        )
        .build()
        .unwrap();
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .config(batches_of(1))
        .rules(rules)
        .declaration(engine_entities().remove(0))
        .build()
        .await
        .unwrap();
    let ok = cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(ok.status, RunStatus::PartiallyFailed);
    assert_eq!(ok.entities[0].affected, 1);
    let details: Vec<(String, Option<String>, String, String)> = sqlx::query_as(
        "SELECT record_id, tenant_id, action, entity_type FROM sweep_run_row_detail WHERE run_id = $1",
    )
    .bind(ok.run_id)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(details.len(), 1, "only the committed batch has row detail");
    let purged_id: String = details[0].0.clone();
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM app.notes WHERE id::text = '{purged_id}'")
        )
        .await,
        0
    );
    assert_eq!(
        (
            details[0].1.as_deref(),
            details[0].2.as_str(),
            details[0].3.as_str()
        ),
        (Some(TENANT_B), "purge", "Note")
    );
    let (source, reason): (String, String) = sqlx::query_as(
        "SELECT rule_source, rule_reason FROM sweep_run_entity_summary WHERE run_id = $1",
    )
    .bind(ok.run_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        (source.as_str(), reason.as_str()),
        ("policy v3", "ops data")
    );
}

// --- A row whose `on_before` fails or hangs

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
