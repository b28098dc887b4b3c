//! RS-027: pausing an entity and pacing its sweeps, live in the database
//! (`retention_pacing`), so one change reaches every replica at its next
//! batch: a paused entity is skipped or stops before its next batch and
//! is reported `paused` (its run too, never `succeeded`); a live
//! `max_rows_per_second` paces sweeps beside the configuration's (the
//! strictest wins).

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::settings::PacingLimit;
use cohort::signals::{Signal, TestSignals};
use cohort::{Cohort, CohortConfig, ErrorKind, RunStatus, SweepRequest};
use support::*;
use tokio::sync::broadcast::Receiver;

/// Notes and Tickets of the engine fixture, with `config`.
async fn notes_and_tickets(pool: &sqlx::PgPool, config: CohortConfig) -> Cohort {
    Cohort::builder(pool.clone())
        .config(config)
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .declaration(engine_entities().remove(2))
        .build()
        .await
        .unwrap()
}

async fn notes_left(pool: &sqlx::PgPool, tenant: &str) -> i64 {
    count(
        pool,
        &format!("SELECT count(*) FROM app.notes WHERE tenant_id = '{tenant}'"),
    )
    .await
}

#[db_test(engine)]
async fn a_paused_entity_is_skipped_and_reported_paused_until_it_is_resumed(db: TestDatabase) {
    let cohort = notes_and_tickets(db.pool(), test_config()).await;
    let before = notes_left(db.pool(), TENANT_A).await;

    let rows = cohort.pause("Note").await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].entity.as_deref(), Some("Note"));
    assert!(rows[0].paused);

    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(run.status, RunStatus::Paused, "never succeeded: {run:?}");
    let notes = run.entity("Note").unwrap();
    assert!(notes.paused);
    assert_eq!(notes.affected, 0);
    // Its eligible rows are left by the pause, not skipped.
    assert_eq!(notes.skipped, 0, "{notes:?}");
    assert!(
        notes
            .note
            .as_deref()
            .unwrap_or("")
            .contains("paused (cohort pause): 3 eligible rows left by the pause, not skipped"),
        "{notes:?}"
    );
    assert_eq!(
        notes_left(db.pool(), TENANT_A).await,
        before,
        "no note changed"
    );
    // The other entity went on.
    let tickets = run.entity("Ticket").unwrap();
    assert!(!tickets.paused);
    assert!(tickets.affected > 0, "{tickets:?}");
    // The ledger says the same.
    let shown = cohort.show_run(run.run_id).await.unwrap();
    assert_eq!(shown.status, RunStatus::Paused);
    assert!(shown.entity("Note").unwrap().paused);
    assert!(!shown.entity("Ticket").unwrap().paused);

    // Resumed (by id this time): the next sweep does the work.
    let rows = cohort.resume(NOTE_ID).await.unwrap();
    assert!(!rows[0].paused);
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(run.entity("Note").unwrap().affected, 3);
    assert!(!run.entity("Note").unwrap().paused);
    assert_eq!(notes_left(db.pool(), TENANT_A).await, before - 3);

    // An unknown entity is bad input, and nothing is written.
    let e = cohort.pause("Nope").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert_eq!(cohort.pacing().await.unwrap().len(), 1);
}

#[db_test(engine)]
async fn a_pause_stops_a_running_sweep_before_its_next_batch(db: TestDatabase) {
    // The first delete of a note waits on an advisory lock the test holds:
    // the sweep is inside its first batch while the pause commits.
    exec(
        db.pool(),
        "CREATE FUNCTION app.gate() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_advisory_xact_lock_shared(4141); RETURN OLD; END $$;
         CREATE TRIGGER gate BEFORE DELETE ON app.notes FOR EACH ROW EXECUTE FUNCTION app.gate();",
    )
    .await;
    let cohort = notes_and_tickets(db.pool(), batches_of(1)).await;
    let mut gate = db.pool().acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(4141)")
        .execute(&mut *gate)
        .await
        .unwrap();
    let sweeping = {
        let cohort = cohort.clone();
        tokio::spawn(async move {
            cohort
                .sweep(SweepRequest::tenanted(TENANT_A, now()))
                .await
                .unwrap()
        })
    };
    wait_for_lock_wait(db.pool()).await;
    let other = notes_and_tickets(db.pool(), test_config()).await;
    other.pause("Note").await.unwrap();
    sqlx::query("SELECT pg_advisory_unlock(4141)")
        .execute(&mut *gate)
        .await
        .unwrap();
    let run = sweeping.await.unwrap();
    let notes = run.entity("Note").unwrap();
    assert_eq!(
        notes.affected, 1,
        "the open batch committed whole: {notes:?}"
    );
    assert!(notes.paused);
    assert_eq!(run.status, RunStatus::Paused);
    assert_eq!(
        cohort
            .show_run(run.run_id)
            .await
            .unwrap()
            .entity("Note")
            .unwrap()
            .affected,
        1
    );

    // Resumed, the rest goes.
    other.resume("Note").await.unwrap();
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(run.entity("Note").unwrap().affected, 2);
}

#[db_test(engine)]
async fn live_limits_pace_every_sweep_and_the_strictest_wins(db: TestDatabase) {
    // Configured far above what three rows need: no wait from it alone.
    let cohort = notes_and_tickets(
        db.pool(),
        CohortConfig {
            max_rows_per_second: Some(1_000_000),
            ..batches_of(1)
        },
    )
    .await;
    // A live limit for Note alone: 20 rows a second, so its second and
    // third batches (and the empty fourth) wait.
    cohort
        .set_pacing(Some("Note"), PacingLimit::MaxRowsPerSecond(Some(20)))
        .await
        .unwrap();
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let notes = run.entity("Note").unwrap();
    assert_eq!(notes.affected, 3);
    let waited = notes.throttled_ms.expect("paced");
    assert!(
        waited >= 50,
        "at 20 rows/s three rows take 100 ms: {notes:?}"
    );

    // Cleared: the configured limit alone applies, and it is loose.
    let rows = cohort
        .set_pacing(Some("Note"), PacingLimit::MaxRowsPerSecond(None))
        .await
        .unwrap();
    assert_eq!(rows[0].max_rows_per_second, None);
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    let notes = run.entity("Note").unwrap();
    assert_eq!(notes.affected, 3);
    assert!(notes.throttled_ms.unwrap() < 50, "{notes:?}");

    // For every entity (`*`), set from another process: this one sees it
    // at its next batch.
    let other = notes_and_tickets(db.pool(), test_config()).await;
    other
        .set_pacing(None, PacingLimit::MaxRowsPerSecond(Some(20)))
        .await
        .unwrap();
    let rows = cohort.pacing().await.unwrap();
    assert_eq!(rows[0].entity, None, "* first");
    assert_eq!(rows[0].max_rows_per_second, Some(20));
    factory::notes(TENANT_A)
        .created(factory::at("2025-01-01T00:00:00Z"))
        .numbered("late ")
        .count(3)
        .insert(db.pool())
        .await;
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let notes = run.entity("Note").unwrap();
    assert_eq!(notes.affected, 3);
    assert!(notes.throttled_ms.unwrap() >= 50, "{notes:?}");

    // Bad values are refused with nothing written.
    for limit in [
        PacingLimit::MaxRowsPerSecond(Some(0)),
        PacingLimit::MaxReplicaLag(Some(cohort::rules::Period::from_months(1).unwrap())),
        PacingLimit::MaxReplicaLag(Some(cohort::rules::Period::ZERO)),
    ] {
        let e = cohort.set_pacing(Some("Note"), limit).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    }
    assert_eq!(cohort.pacing().await.unwrap(), rows);
}

#[db_test(engine)]
async fn an_entity_of_its_own_pace_is_paced_and_a_zero_is_refused(db: TestDatabase) {
    let paced = |rate: u32| {
        let pool = db.pool().clone();
        async move {
            Cohort::builder(pool)
                .config(batches_of(1))
                .rules(rules())
                .declaration(engine_entities().remove(0).max_rows_per_second(rate))
                .build()
                .await
        }
    };
    let cohort = paced(20).await.unwrap();
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let notes = run.entity("Note").unwrap();
    assert_eq!(notes.affected, 3);
    assert!(notes.throttled_ms.unwrap() >= 50, "{notes:?}");

    let Err(e) = paced(0).await else {
        panic!("an entity's max_rows_per_second = 0 is refused")
    };
    assert!(e.to_string().contains("max_rows_per_second = 0"), "{e}");
}

/// `n` more notes of tenant A past every cutoff.
async fn late_notes(pool: &sqlx::PgPool, n: i64) {
    factory::notes(TENANT_A)
        .created(factory::at("2025-01-01T00:00:00Z"))
        .numbered("late ")
        .count(n)
        .insert(pool)
        .await;
}

/// Waits until tenant A has `left` late notes (a batch committed; the
/// late notes are older than the fixture's, so they go first).
async fn late_notes_left(pool: &sqlx::PgPool, left: i64) {
    wait_until(
        "a committed batch",
        std::time::Duration::from_secs(60),
        async || {
            count(
                pool,
                &format!(
                    "SELECT count(*) FROM app.notes WHERE tenant_id = '{TENANT_A}' AND body LIKE 'late%'"
                ),
            )
            .await
                == left
        },
    )
    .await;
}

/// E2 of issue 55: a wait for the rate ends as soon as what caused it
/// changes. At one row a second, a batch of 100 rows is followed by a
/// wait of 100 s; a pause, a lifted limit or a raised one each end it
/// within the bound (far under the wait it replaces).
#[db_test(engine)]
async fn a_pause_or_a_lifted_or_raised_limit_ends_a_rate_wait_at_once(db: TestDatabase) {
    let signals = TestSignals::new();
    let mut heard = signals.subscribe();
    let cohort = Cohort::builder(db.pool().clone())
        .config(batches_of(100))
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .declaration(engine_entities().remove(2))
        .test_signals(signals)
        .build()
        .await
        .unwrap();
    let other = notes_and_tickets(db.pool(), test_config()).await;
    let bound = std::time::Duration::from_secs(30);
    // The first batch committed and the sweep waits for the rate (what
    // earlier sweeps sent is read first).
    let waiting_for_the_rate = async |heard: &mut Receiver<Signal>| {
        next_signal(heard, bound, |s| matches!(s, Signal::RateWaited { .. })).await;
    };
    let sweep = || {
        let cohort = cohort.clone();
        tokio::spawn(async move {
            cohort
                .sweep(SweepRequest::tenanted(TENANT_A, now()))
                .await
                .unwrap()
        })
    };
    other
        .set_pacing(Some("Note"), PacingLimit::MaxRowsPerSecond(Some(1)))
        .await
        .unwrap();

    // A pause: the wait ends paused, the batch before it stays.
    late_notes(db.pool(), 150).await;
    while heard.try_recv().is_ok() {}
    let sweeping = sweep();
    late_notes_left(db.pool(), 50).await;
    waiting_for_the_rate(&mut heard).await;
    assert!(!sweeping.is_finished(), "waiting out 100 s for the rate");
    other.pause("Note").await.unwrap();
    next_signal(&mut heard, bound, |s| matches!(s, Signal::Paused { .. })).await;
    let run = tokio::time::timeout(bound, sweeping)
        .await
        .expect("the pause ended the wait")
        .unwrap();
    let notes = run.entity("Note").unwrap();
    assert!(notes.paused, "{notes:?}");
    assert_eq!(notes.affected, 100, "{notes:?}");
    assert_eq!(run.status, RunStatus::Paused);
    assert!(notes.throttled_ms.unwrap() < 30_000, "{notes:?}");

    // A lifted limit: the wait ends and the sweep goes on.
    other.resume("Note").await.unwrap();
    late_notes(db.pool(), 100).await;
    while heard.try_recv().is_ok() {}
    let sweeping = sweep();
    late_notes_left(db.pool(), 50).await;
    waiting_for_the_rate(&mut heard).await;
    assert!(!sweeping.is_finished(), "waiting out 100 s for the rate");
    other
        .set_pacing(Some("Note"), PacingLimit::MaxRowsPerSecond(None))
        .await
        .unwrap();
    let run = tokio::time::timeout(bound, sweeping)
        .await
        .expect("lifting the limit ended the wait")
        .unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(run.entity("Note").unwrap().affected, 153);
    late_notes_left(db.pool(), 0).await;

    // A raised limit: what is left of the wait is paid at the new rate.
    other
        .set_pacing(Some("Note"), PacingLimit::MaxRowsPerSecond(Some(1)))
        .await
        .unwrap();
    late_notes(db.pool(), 150).await;
    while heard.try_recv().is_ok() {}
    let sweeping = sweep();
    late_notes_left(db.pool(), 50).await;
    waiting_for_the_rate(&mut heard).await;
    assert!(!sweeping.is_finished(), "waiting out 100 s for the rate");
    other
        .set_pacing(Some("Note"), PacingLimit::MaxRowsPerSecond(Some(1_000_000)))
        .await
        .unwrap();
    let run = tokio::time::timeout(bound, sweeping)
        .await
        .expect("raising the limit shortened the wait")
        .unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    assert_eq!(run.entity("Note").unwrap().affected, 150);
}
