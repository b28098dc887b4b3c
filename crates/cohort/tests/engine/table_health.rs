//! RS-030: a sweep records what it left in the table (dead tuples and
//! size, before and after, in the summary, the result and `runs show`),
//! and `vacuum_after` runs ANALYZE or VACUUM outside the batch
//! transactions once a sweep changed enough rows, and is refused where
//! PostgreSQL would skip it.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::config::VacuumAfter;
use cohort::{Cohort, CohortConfig, RunStatus, SweepRequest};
use support::*;

async fn handle(pool: &sqlx::PgPool, vacuum_after: VacuumAfter, rows: u64) -> Cohort {
    Cohort::builder(pool.clone())
        .config(CohortConfig {
            vacuum_after,
            vacuum_after_rows: rows,
            ..test_config()
        })
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .declaration(engine_entities().remove(2))
        .build()
        .await
        .unwrap()
}

/// How many times `table` was vacuumed and analysed by hand (not by
/// autovacuum), as the statistics system counts them.
async fn maintained(pool: &sqlx::PgPool, table: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT vacuum_count, analyze_count FROM pg_stat_user_tables WHERE relid = $1::regclass",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[db_test(engine)]
async fn a_sweep_records_what_it_left_and_vacuums_past_its_threshold(db: TestDatabase) {
    assert_eq!(maintained(db.pool(), "app.notes").await, (0, 0));
    // Tenant A: notes purge 3 rows, at the threshold: vacuumed.
    let cohort = handle(db.pool(), VacuumAfter::Vacuum, 3).await;
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    let notes = run.entities.iter().find(|e| e.entity == "Note").unwrap();
    assert_eq!(notes.affected, 3);
    let t = notes
        .table
        .as_ref()
        .expect("a run that changed rows records its table");
    assert_eq!(t.dead_tuples_before, 0, "{t:?}");
    assert!(t.dead_tuples_after >= 3, "the purged rows are dead: {t:?}");
    assert!(t.bytes_before > 0 && t.bytes_after > 0, "{t:?}");
    assert_eq!(t.vacuumed.as_deref(), Some("vacuum"));
    assert_eq!(maintained(db.pool(), "app.notes").await, (1, 1));
    // The ledger has it: `runs show` reads back the same.
    let shown = cohort.show_run(run.run_id).await.unwrap();
    let shown_notes = shown.entities.iter().find(|e| e.entity == "Note").unwrap();
    assert_eq!(shown_notes.table, notes.table);

    // Below the threshold nothing runs; what was left is still recorded.
    let tickets_before = maintained(db.pool(), "app.tickets").await;
    let quiet = handle(db.pool(), VacuumAfter::Analyze, 1_000).await;
    let run = quiet
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    let tickets = run.entities.iter().find(|e| e.entity == "Ticket").unwrap();
    assert!(tickets.affected > 0, "{run:?}");
    let t = tickets.table.as_ref().unwrap();
    assert_eq!(t.vacuumed, None);
    assert!(
        t.dead_tuples_after >= tickets.affected,
        "soft deletes leave old versions: {t:?}"
    );
    assert_eq!(maintained(db.pool(), "app.tickets").await, tickets_before);

    // A dry run changes nothing and records nothing.
    let dry = quiet
        .sweep(SweepRequest::tenanted(TENANT_B, now()).dry_run(true))
        .await
        .unwrap();
    assert!(dry.entities.iter().all(|e| e.table.is_none()), "{dry:?}");
}

/// PostgreSQL skips VACUUM and ANALYZE of a table the role does not own,
/// with a warning only: `vacuum_after` is refused there, naming the
/// table and its owner, and accepted once the role owns it.
#[db_test(engine)]
async fn vacuum_after_is_refused_on_a_table_the_role_does_not_own(db: TestDatabase) {
    let suffix = &db.name()[db.name().len() - 12..];
    let app = format!("cohort_vac_{suffix}");
    exec(
        db.pool(),
        &format!(
            "CREATE ROLE {app} LOGIN PASSWORD 'vac-secret' NOSUPERUSER;
             GRANT USAGE ON SCHEMA public, app TO {app};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public, app TO {app};
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {app};
             ALTER TABLE app.tickets OWNER TO {app};"
        ),
    )
    .await;
    let pool = pool_as(&db, &app, "vac-secret", 3).await;
    let Err(err) = Cohort::builder(pool.clone())
        .config(CohortConfig {
            vacuum_after: VacuumAfter::Analyze,
            ..test_config()
        })
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .declaration(engine_entities().remove(2))
        .build()
        .await
    else {
        panic!("vacuum_after on a table the role does not own must be refused");
    };
    let text = err.to_string();
    assert!(
        text.contains("Note: vacuum_after = \"analyze\" needs the owner's rights")
            && text.contains("app.notes (owner"),
        "{text}"
    );
    assert!(
        !text.contains("Ticket: vacuum_after"),
        "the role owns tickets: {text}"
    );
    // Off, the same role is accepted.
    Cohort::builder(pool)
        .config(test_config())
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .declaration(engine_entities().remove(2))
        .build()
        .await
        .unwrap();
}

/// RS-027 (pacing): with `max_rows_per_second`, a sweep waits between
/// batches so its rows stay under the rate, and records how long (the
/// result, the ledger, `runs show`); without it, it never waits.
#[db_test(engine)]
async fn a_paced_sweep_waits_between_batches_and_records_how_long(db: TestDatabase) {
    let with = |rate: Option<u32>| {
        let pool = db.pool().clone();
        async move {
            Cohort::builder(pool)
                .config(CohortConfig {
                    max_rows_per_second: rate,
                    ..batches_of(1)
                })
                .rules(rules())
                .declaration(engine_entities().remove(0))
                .build()
                .await
                .unwrap()
        }
    };
    // Three notes past the cutoff per tenant, one per batch: at 20 rows a
    // second the second and third batches (and the empty fourth) wait.
    let paced = with(Some(20)).await;
    let run = paced
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let notes = &run.entities[0];
    assert_eq!(notes.affected, 3);
    let waited = notes.throttled_ms.expect("a paced sweep records its waits");
    assert!(waited > 0, "{notes:?}");
    let shown = paced.show_run(run.run_id).await.unwrap();
    assert_eq!(shown.entities[0].throttled_ms, Some(waited));

    let unpaced = with(None).await;
    let run = unpaced
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(run.entities[0].affected, 3);
    assert_eq!(run.entities[0].throttled_ms, None);
    let shown = unpaced.show_run(run.run_id).await.unwrap();
    assert_eq!(shown.entities[0].throttled_ms, None);

    // Zero is refused: leave the setting out for an unpaced sweep.
    let Err(err) = Cohort::builder(db.pool().clone())
        .config(CohortConfig {
            max_rows_per_second: Some(0),
            ..test_config()
        })
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .build()
        .await
    else {
        panic!("max_rows_per_second = 0 is refused");
    };
    assert!(err.to_string().contains("max_rows_per_second = 0"), "{err}");
}
