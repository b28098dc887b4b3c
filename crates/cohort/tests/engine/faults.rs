//! Fault injection on a real server of each test's own (RS-005): the
//! server crashed (`pg_ctl restart -m immediate`: SIGQUIT, crash recovery
//! from the WAL) in the middle of a sweep, an erasure and a dispatch; the
//! run's backend terminated; timeouts set low on the role. After each,
//! every batch is whole with its audit or absent, the interrupted run is
//! recovered, and a rerun finishes.

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::handlers::{
    AfterContext, BeforeContext, HandlerError, HandlerRegistration, RowHandler,
};
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::{AuditDetail, Cohort, CohortConfig, EntityDeclaration, RunStatus, SweepRequest};
use cohort_pgtemp::Cluster;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

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

/// A cluster of the test's own (it is crashed), migrated and seeded.
async fn server() -> (Cluster, PgPool) {
    let cluster = Cluster::start().await.unwrap();
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
