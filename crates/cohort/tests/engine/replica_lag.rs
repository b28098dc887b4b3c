//! RS-028: with `max_replica_lag`, a sweep waits between batches (never
//! inside one) while a real streaming standby's replay is further behind,
//! and goes on when it replays; the run records how long it waited and
//! why. A standby that stops streaming is reported and no longer waited
//! for. Validation refuses the setting for a role that cannot read the
//! lag, and warns when no standby streams (the run then records that
//! nothing was waited for).
//!
//! The standby is started by the harness with `pg_basebackup -R` on the
//! primary's unix socket; its replay is paused with
//! `pg_wal_replay_pause()`, so its lag grows for real.

use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;
use std::time::{Duration, Instant};

use crate::support::*;
use cohort::rules::Period;
use cohort::settings::PacingLimit;
use cohort::signals::{Signal, TestSignals};
use cohort::{Cohort, CohortConfig, ErrorKind, RunStatus, SweepRequest};
use cohort_pgtemp::Cluster;
use sqlx::PgPool;
use tokio::sync::broadcast::Receiver;

async fn primary() -> (Cluster, PgPool) {
    let cluster = Cluster::start().await.unwrap();
    let pool = PgPool::connect(cluster.url()).await.unwrap();
    cohort::schema::migrate(&mut pool.acquire().await.unwrap(), "public")
        .await
        .unwrap();
    exec(&pool, ENGINE_TABLES).await;
    (cluster, pool)
}

/// Notes only, one row a batch, paced at four rows a second (so a sweep
/// of a dozen rows lasts long enough for a stalled standby's lag to pass
/// one second), waiting for standbys behind by more than `lag`; its pacing
/// moments go to `signals`.
async fn handle(pool: &PgPool, lag: Option<u64>, signals: &TestSignals) -> Cohort {
    Cohort::builder(pool.clone())
        .test_signals(signals.clone())
        .config(CohortConfig {
            max_rows_per_second: Some(4),
            max_replica_lag: lag.map(|s| Period::from_seconds(s as i64).unwrap()),
            ..batches_of(1)
        })
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .build()
        .await
        .unwrap()
}

/// Ten more notes of `tenant` past every cutoff.
async fn late_notes(pool: &PgPool, tenant: &str) {
    factory::notes(tenant)
        .created(factory::at("2025-01-01T00:00:00Z"))
        .numbered("late ")
        .count(10)
        .insert(pool)
        .await;
}

async fn wait_for_streaming(pool: &PgPool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(
        pool,
        "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND replay_lsn IS NOT NULL",
    )
    .await
        == 0
    {
        assert!(Instant::now() < deadline, "the standby never streamed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until a sweep begins to wait for a standby.
async fn standby_wait_began(signals: &mut Receiver<Signal>) {
    next_signal(signals, Duration::from_secs(60), |s| {
        matches!(s, Signal::StandbyWaitBegan { .. })
    })
    .await;
}

/// Whether any signal received so far says a sweep waited for a standby.
fn waited_for_a_standby(signals: &mut Receiver<Signal>) -> bool {
    let mut waited = false;
    while let Ok(s) = signals.try_recv() {
        waited |= matches!(
            s,
            Signal::StandbyWaitBegan { .. } | Signal::StandbyPolled { .. }
        );
    }
    waited
}

#[tokio::test]
async fn a_sweep_waits_for_a_stalled_standby_and_goes_on_when_it_replays() {
    let signals = TestSignals::new();
    let mut heard = signals.subscribe();
    let (primary, pool) = primary().await;
    let standby = primary.start_standby().await.unwrap();
    let replica = PgPool::connect(standby.url()).await.unwrap();
    wait_for_streaming(&pool).await;
    exec(&replica, "SELECT pg_wal_replay_pause()").await;

    // Without the setting, a stalled standby changes nothing: the sweep
    // of tenant B finishes while replay stays paused.
    late_notes(&pool, TENANT_B).await;
    let run = handle(&pool, None, &signals)
        .await
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(run.entities[0].affected, 13);
    assert_eq!(run.entities[0].lag_waited_ms, None);
    assert!(!waited_for_a_standby(&mut heard));

    // With max_replica_lag = 1s, the sweep of tenant A waits once the
    // stalled standby is more than a second behind, and not before.
    late_notes(&pool, TENANT_A).await;
    let cohort = handle(&pool, Some(1), &signals).await;
    let sweeping = {
        let cohort = cohort.clone();
        tokio::spawn(async move {
            cohort
                .sweep(SweepRequest::tenanted(TENANT_A, now()))
                .await
                .unwrap()
        })
    };
    standby_wait_began(&mut heard).await;
    let late_left = format!(
        "SELECT count(*) FROM app.notes WHERE tenant_id = '{TENANT_A}' AND body LIKE 'late%'"
    );
    let notes_left = || count(&pool, &late_left);
    let left = notes_left().await;
    assert!(left > 0, "rows are left while it waits");
    // Held while replay stays paused: five polls (a second) later, the
    // sweep has not taken another batch.
    for _ in 0..5 {
        next_signal(&mut heard, Duration::from_secs(60), |s| {
            matches!(s, Signal::StandbyPolled { .. })
        })
        .await;
    }
    assert!(!sweeping.is_finished(), "waiting, not done");
    assert_eq!(
        notes_left().await,
        left,
        "no batch while the standby is behind"
    );
    exec(&replica, "SELECT pg_wal_replay_resume()").await;
    let run = sweeping.await.unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    let notes = &run.entities[0];
    assert_eq!(notes.affected, 13, "{notes:?}");
    let waited = notes.lag_waited_ms.expect("a lag limit applied");
    assert!(waited >= 1_000, "five polls of 200 ms at least: {notes:?}");
    let shown = cohort.show_run(run.run_id).await.unwrap();
    assert_eq!(shown.entities[0].lag_waited_ms, Some(waited));

    // A standby that stops streaming while a sweep waits for it is
    // reported and no longer waited for.
    exec(&replica, "SELECT pg_wal_replay_pause()").await;
    replica.close().await;
    late_notes(&pool, TENANT_A).await;
    waited_for_a_standby(&mut heard); // what the last sweep sent, read
    let sweeping = {
        let cohort = cohort.clone();
        tokio::spawn(async move {
            cohort
                .sweep(SweepRequest::tenanted(TENANT_A, now()))
                .await
                .unwrap()
        })
    };
    standby_wait_began(&mut heard).await;
    drop(standby);
    let run = sweeping.await.unwrap();
    let notes = &run.entities[0];
    assert_eq!(notes.affected, 10, "{notes:?}");
    let note = notes.note.as_deref().unwrap_or("");
    assert!(note.contains("stopped streaming"), "{notes:?}");
    assert!(notes.lag_waited_ms.unwrap() > 0, "{notes:?}");
}

#[db_test(engine)]
async fn the_setting_is_refused_without_the_grant_and_noted_without_a_standby(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE ROLE lag_blind LOGIN PASSWORD 'pw' NOSUPERUSER;
         GRANT USAGE ON SCHEMA app TO lag_blind;
         GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA app TO lag_blind;
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO lag_blind;",
    )
    .await;
    let config = CohortConfig {
        max_replica_lag: Some(Period::from_seconds(30).unwrap()),
        ..test_config()
    };
    let build = |pool: PgPool| {
        let config = config.clone();
        async move {
            Cohort::builder(pool)
                .config(config)
                .rules(rules())
                .declaration(engine_entities().remove(0))
                .build()
                .await
        }
    };
    let blind = pool_as(&db, "lag_blind", "pw", 4).await;
    let Err(e) = build(blind.clone()).await else {
        panic!("a role that cannot read the lag is refused")
    };
    assert!(
        e.to_string().contains("GRANT pg_monitor TO \"lag_blind\""),
        "{e}"
    );
    // Set live, the same check holds (issue 55, E1). The role cannot set
    // it, and nothing is written.
    let blind_handle = Cohort::builder(blind.clone())
        .config(test_config())
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .build()
        .await
        .unwrap();
    let e = blind_handle
        .set_pacing(
            None,
            PacingLimit::MaxReplicaLag(Some(Period::from_seconds(2).unwrap())),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(
        e.to_string().contains("GRANT pg_monitor TO \"lag_blind\""),
        "{e}"
    );
    assert!(blind_handle.pacing().await.unwrap().is_empty());
    // Without a lag limit, the role's sweep of tenant B changes rows ...
    let b_notes = format!("SELECT count(*) FROM app.notes WHERE tenant_id = '{TENANT_B}'");
    let before = count(db.pool(), &b_notes).await;
    let run = blind_handle
        .sweep(SweepRequest::tenanted(TENANT_B, now()).dry_run(true))
        .await
        .unwrap();
    assert_eq!(run.entities[0].affected, 3, "it would, unwaited");
    // ... but with one set live by a role that can read the lag, the
    // blind role's sweep fails before its first batch: a lag it cannot
    // read is never read as no lag.
    let seeing = build(db.pool().clone()).await.unwrap();
    seeing
        .set_pacing(
            None,
            PacingLimit::MaxReplicaLag(Some(Period::from_seconds(2).unwrap())),
        )
        .await
        .unwrap();
    let run = blind_handle
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_ne!(run.status, RunStatus::Succeeded, "{run:?}");
    assert_eq!(run.failures.len(), 1, "{run:?}");
    assert!(
        run.failures[0]
            .error
            .contains("code=replica_lag_unreadable"),
        "{run:?}"
    );
    assert_eq!(run.entities[0].affected, 0);
    assert!(
        run.entities[0]
            .note
            .as_deref()
            .unwrap_or("")
            .contains("GRANT pg_monitor TO \"lag_blind\""),
        "{run:?}"
    );
    assert_eq!(count(db.pool(), &b_notes).await, before, "no row changed");
    seeing
        .set_pacing(None, PacingLimit::MaxReplicaLag(None))
        .await
        .unwrap();

    // Given the grant, it validates.
    exec(db.pool(), "GRANT pg_monitor TO lag_blind").await;
    build(blind).await.unwrap();

    // No standby streams from the test server: a warning, and the run
    // records that nothing was waited for.
    let cohort = build(db.pool().clone()).await.unwrap();
    let model = cohort.ready().await.unwrap();
    assert!(
        model
            .warnings
            .iter()
            .any(|w| w.contains("no standby is streaming")),
        "{:?}",
        model.warnings
    );
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let notes = &run.entities[0];
    assert_eq!(notes.affected, 3);
    assert_eq!(notes.lag_waited_ms, Some(0));
    assert!(
        notes
            .note
            .as_deref()
            .unwrap_or("")
            .contains("no standby was streaming"),
        "{notes:?}"
    );

    // A calendar period, or less than a second, is refused outright.
    for (lag, says) in [
        (Period::from_months(1).unwrap(), "fixed period"),
        (Period::ZERO, "at least 1s"),
    ] {
        let Err(e) = Cohort::builder(db.pool().clone())
            .config(CohortConfig {
                max_replica_lag: Some(lag),
                ..test_config()
            })
            .rules(rules())
            .declaration(engine_entities().remove(0))
            .build()
            .await
        else {
            panic!("max_replica_lag = {lag} is refused")
        };
        assert!(e.to_string().contains(says), "{e}");
    }
}
