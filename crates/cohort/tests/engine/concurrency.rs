//! Real concurrent connections: several engines over the same rows, hold
//! creation racing sweeps, 5000-row batches on a default-configured server,
//! and callers' own transactions.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use std::collections::BTreeMap;

use cohort::holds::HoldRequest;
use cohort::{Cohort, RunStatus, SweepRequest};
use support::*;
use uuid::Uuid;

const BULK: &str = r#"
INSERT INTO app.notes (tenant_id, created_at, body)
SELECT 'aaaaaaaa-0000-0000-0000-00000000000a', timestamptz '2026-01-01' - make_interval(secs => g), 'bulk:' || g
FROM generate_series(1, $N) g;
INSERT INTO app.contacts (id, tenant_id, created_at, email, full_name, phone, reference, user_id)
SELECT 1000 + g, 'aaaaaaaa-0000-0000-0000-00000000000a', timestamptz '2025-06-01' - make_interval(secs => g),
       'bulk@example.com', 'Bulk ' || g, '+1', 'R' || g, gen_random_uuid()
FROM generate_series(1, $N) g;
INSERT INTO app.tickets (tenant_id, closed_at, subject)
SELECT 'aaaaaaaa-0000-0000-0000-00000000000a', timestamptz '2026-01-01' - make_interval(secs => g), 'bulk ' || g
FROM generate_series(1, $N) g;
"#;

async fn engine(db: &cohort_pgtemp::TestDatabase, batch: u32) -> Cohort {
    // Each engine has its own pool: separate connections, as separate processes would.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect_with(db.connect_options())
        .await
        .unwrap();
    engine_cohort_on(pool, batches_of(batch)).await
}

#[db_test(engine)]
async fn two_sweeps_with_5000_row_batches_on_a_default_server_never_double_count(db: TestDatabase) {
    let locks: String = sqlx::query_scalar("SHOW max_locks_per_transaction")
        .fetch_one(db.pool())
        .await
        .unwrap();
    assert_eq!(
        locks, "64",
        "the server must be default-configured for this proof"
    );
    exec(db.pool(), &BULK.replace("$N", "12000")).await;
    let (notes_before, contacts_before, tickets_before) = eligible_in_tenant_a(db.pool()).await;
    assert_eq!(
        (notes_before, contacts_before, tickets_before),
        (12003, 12003, 12003)
    );

    let (a, b) = (engine(&db, 5000).await, engine(&db, 5000).await);
    let (ra, rb) = tokio::join!(
        a.sweep(SweepRequest::tenanted(TENANT_A, now())),
        b.sweep(SweepRequest::tenanted(TENANT_A, now()))
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(
        (ra.status, rb.status),
        (RunStatus::Succeeded, RunStatus::Succeeded),
        "{ra:?}\n{rb:?}"
    );
    // Both sweeps were live at the same time (each started before the other
    // settled) and both did work: the proof is of concurrency, not of two
    // sweeps one after the other.
    assert!(
        ra.started_at < rb.settled_at.unwrap() && rb.started_at < ra.settled_at.unwrap(),
        "the runs did not overlap: {:?}..{:?} and {:?}..{:?}",
        ra.started_at,
        ra.settled_at,
        rb.started_at,
        rb.settled_at
    );
    assert!(
        ra.affected() > 0 && rb.affected() > 0,
        "both sweeps changed rows: {} and {}",
        ra.affected(),
        rb.affected()
    );
    for (name, before) in [
        ("Note", notes_before),
        ("Contact", contacts_before),
        ("Ticket", tickets_before),
    ] {
        let total = ra.entity(name).unwrap().affected + rb.entity(name).unwrap().affected;
        assert_eq!(
            total as i64, before,
            "{name}: each row changed and reported exactly once"
        );
    }
    assert_eq!(
        count(
            db.pool(),
            &in_tenant_a("notes", "AND created_at < '2026-05-02'")
        )
        .await,
        0
    );
    assert_eq!(
        count(
            db.pool(),
            &in_tenant_a("contacts", "AND anonymised_at IS NOT NULL")
        )
        .await,
        12003
    );
    assert_eq!(
        count(db.pool(), &in_tenant_a("tickets", "AND is_deleted")).await,
        12003
    );
    // The ledger agrees with the results.
    let ledger_total: i64 =
        sqlx::query_scalar("SELECT sum(affected_count)::int8 FROM sweep_run_entity_summary")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(ledger_total, 3 * 12003);
}

#[db_test(engine)]
async fn hold_creation_racing_two_sweeps_never_loses_a_protected_row(db: TestDatabase) {
    race_holds_against_sweeps(&db).await;
}

#[db_test(engine)]
async fn hold_races_are_safe_even_when_the_database_defaults_to_repeatable_read(db: TestDatabase) {
    // Cohort must not inherit this: its re-check needs a fresh snapshot per statement.
    exec(
        db.pool(),
        &format!(
            "ALTER DATABASE \"{}\" SET default_transaction_isolation = 'repeatable read'",
            db.name()
        ),
    )
    .await;
    race_holds_against_sweeps(&db).await;
}

async fn race_holds_against_sweeps(db: &cohort_pgtemp::TestDatabase) {
    exec(db.pool(), &BULK.replace("$N", "1500")).await;
    // Targets: every 5th bulk row of each entity.
    let notes: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM app.notes WHERE body LIKE 'bulk:%' AND split_part(body, ':', 2)::int % 5 = 0")
        .fetch_all(db.pool()).await.unwrap();
    let contacts: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM app.contacts WHERE id > 1000 AND id % 5 = 0")
            .fetch_all(db.pool())
            .await
            .unwrap();
    let tickets: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM app.tickets WHERE subject LIKE 'bulk %' AND split_part(subject, ' ', 2)::int % 5 = 0")
        .fetch_all(db.pool()).await.unwrap();
    let mut targets: Vec<(&str, &str, String)> = Vec::new();
    for n in &notes {
        targets.push((NOTE_ID, "notes", n.to_string()));
    }
    for c in &contacts {
        targets.push((CONTACT_ID, "contacts", c.to_string()));
    }
    for t in &tickets {
        targets.push((TICKET_ID, "tickets", t.to_string()));
    }
    // Interleave entities so holds land while every strategy runs.
    targets.sort_by_key(|(_, _, r)| r.chars().rev().collect::<String>());

    let (a, b, h) = (
        engine(db, 50).await,
        engine(db, 50).await,
        engine(db, 50).await,
    );
    let holder = async {
        let mut protected: BTreeMap<String, String> = BTreeMap::new();
        let mut refused = 0;
        for (entity, table, record) in &targets {
            let req = HoldRequest::new(Uuid::parse_str(entity).unwrap(), record.clone(), "race")
                .tenant(TENANT_A);
            match h.create_hold(req).await {
                Ok(_) => {
                    // The row as it was when the hold took effect; nothing may change it afterwards.
                    let state: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                        "SELECT row_to_json(t)::text FROM app.{table} t WHERE id::text = $1"
                    )))
                    .bind(record)
                    .fetch_one(h.pool())
                    .await
                    .unwrap();
                    protected.insert(format!("{table}:{record}"), state);
                }
                Err(cohort::Error::NotFound(msg)) if msg.contains("does not exist") => refused += 1,
                Err(e) => panic!("hold creation failed: {e}"),
            }
        }
        (protected, refused)
    };
    let ((protected, refused), ra, rb) = tokio::join!(
        holder,
        a.sweep(SweepRequest::tenanted(TENANT_A, now())),
        b.sweep(SweepRequest::tenanted(TENANT_A, now()))
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(!protected.is_empty());
    assert_eq!(protected.len() + refused, targets.len());
    for (key, state) in &protected {
        let (table, record) = key.split_once(':').unwrap();
        let now_state: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT row_to_json(t)::text FROM app.{table} t WHERE id::text = $1"
        )))
        .bind(record)
        .fetch_optional(db.pool())
        .await
        .unwrap();
        assert_eq!(
            now_state.as_ref(),
            Some(state),
            "{key} changed after its hold was created"
        );
    }
    // Reported counts equal what committed.
    let purged = 1503 - count(db.pool(), &format!("SELECT count(*) FROM app.notes WHERE tenant_id = '{TENANT_A}' AND created_at < '2026-05-02'")).await;
    let anonymised = count(db.pool(), &format!("SELECT count(*) FROM app.contacts WHERE tenant_id = '{TENANT_A}' AND anonymised_at IS NOT NULL")).await;
    let deleted = count(
        db.pool(),
        &format!("SELECT count(*) FROM app.tickets WHERE tenant_id = '{TENANT_A}' AND is_deleted"),
    )
    .await;
    for (name, actual) in [
        ("Note", purged),
        ("Contact", anonymised),
        ("Ticket", deleted),
    ] {
        let reported = ra.entity(name).unwrap().affected + rb.entity(name).unwrap().affected;
        assert_eq!(reported as i64, actual, "{name}");
    }
    // A later sweep sees every hold that protects a still-eligible row.
    let after = a
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(after.affected(), 0);
}

#[db_test(engine)]
async fn a_callers_open_transaction_neither_blocks_nor_is_joined_by_a_sweep(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let mut caller = db.connect().await.unwrap();
    sqlx::query("BEGIN").execute(&mut caller).await.unwrap();
    // The caller holds a row lock on an eligible row and has an uncommitted eligible insert.
    sqlx::query("UPDATE app.notes SET body = body WHERE body = $1")
        .bind(format!("{TENANT_A}:45d"))
        .execute(&mut caller)
        .await
        .unwrap();
    sqlx::query("INSERT INTO app.notes (tenant_id, created_at, body) VALUES ($1::uuid, '2020-01-01', 'uncommitted')")
        .bind(TENANT_A).execute(&mut caller).await.unwrap();
    let result = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        cohort.sweep(SweepRequest::tenanted(TENANT_A, now())),
    )
    .await
    .expect("the sweep must not wait for the caller")
    .unwrap();
    assert_eq!(result.entity("Note").unwrap().affected, 2);
    sqlx::query("ROLLBACK").execute(&mut caller).await.unwrap();
    // The skipped row stays eligible for the next run.
    let next = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(next.entity("Note").unwrap().affected, 1);
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.notes WHERE body = 'uncommitted'"
        )
        .await,
        0
    );
}

/// Keyset continuation (each batch continues after the previous batch's
/// last (anchor, key)) under four concurrent sweeps with tiny batches and
/// anchors tied in groups of ten: every eligible row is changed and
/// reported exactly once, for each strategy, and the per-row audit names
/// each row once.
#[db_test(engine)]
async fn keyset_batches_with_tied_anchors_under_four_concurrent_sweeps_change_each_row_once(
    db: TestDatabase,
) {
    // Ten rows per anchor value: ties broken by key.
    exec(
        db.pool(),
        &BULK
            .replace("$N", "3000")
            .replace("make_interval(secs => g)", "make_interval(secs => g / 10)"),
    )
    .await;
    let (notes, contacts, tickets) = eligible_in_tenant_a(db.pool()).await;
    let engines = [
        engine(&db, 7).await,
        engine(&db, 7).await,
        engine(&db, 7).await,
        engine(&db, 7).await,
    ];
    let results = futures_join(&engines).await;
    for (name, before) in [("Note", notes), ("Contact", contacts), ("Ticket", tickets)] {
        let total: u64 = results
            .iter()
            .map(|r| r.entity(name).unwrap().affected)
            .sum();
        assert_eq!(
            total as i64, before,
            "{name}: each row changed and reported once"
        );
    }
    assert!(
        results.iter().filter(|r| r.affected() > 0).count() >= 2,
        "the sweeps shared the work"
    );
    assert_eq!(
        count(
            db.pool(),
            &in_tenant_a("notes", "AND created_at < '2026-05-02'")
        )
        .await,
        0
    );
    assert_eq!(
        count(
            db.pool(),
            &in_tenant_a(
                "contacts",
                "AND anonymised_at IS NULL AND created_at < '2026-03-03'"
            )
        )
        .await,
        0
    );
    assert_eq!(
        count(
            db.pool(),
            &in_tenant_a("tickets", "AND closed_at < '2026-05-22' AND NOT is_deleted")
        )
        .await,
        0
    );
}

/// Runs one tenant-A sweep on each engine at once.
async fn futures_join(engines: &[Cohort; 4]) -> Vec<cohort::SweepResult> {
    let [a, b, c, d] = engines;
    let (ra, rb, rc, rd) = tokio::join!(
        a.sweep(SweepRequest::tenanted(TENANT_A, now())),
        b.sweep(SweepRequest::tenanted(TENANT_A, now())),
        c.sweep(SweepRequest::tenanted(TENANT_A, now())),
        d.sweep(SweepRequest::tenanted(TENANT_A, now())),
    );
    let all = vec![ra.unwrap(), rb.unwrap(), rc.unwrap(), rd.unwrap()];
    for r in &all {
        assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    }
    all
}

/// A row another transaction holds locked while a sweep passes over it
/// (SKIP LOCKED) is not changed or counted by that sweep, and is not lost:
/// the next run changes it. The batches after it continue past it.
#[db_test(engine)]
async fn a_row_locked_elsewhere_is_left_to_the_next_run_and_counted_once(db: TestDatabase) {
    exec(db.pool(), &BULK.replace("$N", "200")).await;
    let a = engine(&db, 10).await;
    let before = count(
        db.pool(),
        &format!("SELECT count(*) FROM app.notes WHERE tenant_id = '{TENANT_A}' AND created_at < '2026-05-02'"),
    )
    .await;
    // Another transaction holds one old row (in the middle of the range).
    let mut other = db.pool().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM app.notes WHERE body = 'bulk:100' FOR UPDATE")
        .execute(&mut *other)
        .await
        .unwrap();
    let first = a
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(first.entity("Note").unwrap().affected as i64, before - 1);
    other.commit().await.unwrap();
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.notes WHERE body = 'bulk:100'"
        )
        .await,
        1,
        "passed over, not lost"
    );
    let second = a
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(second.entity("Note").unwrap().affected, 1);
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.notes WHERE body = 'bulk:100'"
        )
        .await,
        0
    );
}

/// Tenant A's notes, contacts and tickets past their engine cutoffs and
/// not yet done (the rows a sweep at `now()` must change).
async fn eligible_in_tenant_a(pool: &sqlx::PgPool) -> (i64, i64, i64) {
    (
        count(pool, &in_tenant_a("notes", "AND created_at < '2026-05-02'")).await,
        count(
            pool,
            &in_tenant_a(
                "contacts",
                "AND created_at < '2026-03-03' AND anonymised_at IS NULL",
            ),
        )
        .await,
        count(
            pool,
            &in_tenant_a("tickets", "AND closed_at < '2026-05-22' AND NOT is_deleted"),
        )
        .await,
    )
}

/// Counts tenant A's rows of `app.<table>` matching `filter`.
fn in_tenant_a(table: &str, filter: &str) -> String {
    format!("SELECT count(*) FROM app.{table} WHERE tenant_id = '{TENANT_A}' {filter}")
}

/// A sweep takes its locked rows by address (`ctid`). Rows the
/// application moves (a non-HOT update gives the row a new address) and
/// makes young while two sweeps run are never purged or soft-deleted: the
/// updates that win their row keep it, whatever the race; every other old
/// row is swept, each once.
#[tokio::test]
async fn rows_moved_and_made_young_by_concurrent_updates_are_never_swept() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let db = engine_db().await;
    exec(db.pool(), &BULK.replace("$N", "6000")).await;
    let (notes_before, _, tickets_before) = eligible_in_tenant_a(db.pool()).await;
    let (a, b) = (engine(&db, 100).await, engine(&db, 100).await);
    // Validated before the race, so the sweeps start at once.
    for e in [&a, &b] {
        e.sweep(SweepRequest::tenanted(TENANT_A, now()).dry_run(true))
            .await
            .unwrap();
    }
    let done = AtomicBool::new(false);
    // The application: small transactions, each making five old notes and
    // five old tickets young (a new `created_at` / `closed_at`, an indexed
    // column, so the row moves) and undeleting the tickets; it records what
    // it changed and when it committed.
    let updater = async {
        let mut conn = db.pool().acquire().await.unwrap();
        let mut moved_notes: Vec<Uuid> = Vec::new();
        let mut moved_tickets: Vec<Uuid> = Vec::new();
        let mut undeleted = 0i64;
        let mut commits: Vec<chrono::DateTime<chrono::Utc>> = Vec::new();
        for chunk in 0..600i32 {
            if done.load(Ordering::SeqCst) {
                break;
            }
            let bodies: Vec<String> = (0..5)
                .map(|i| format!("bulk:{}", chunk * 10 + i + 1))
                .collect();
            let subjects: Vec<String> = (0..5)
                .map(|i| format!("bulk {}", chunk * 10 + i + 1))
                .collect();
            let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
            let notes: Vec<Uuid> = sqlx::query_scalar(
                "UPDATE app.notes SET created_at = '2026-05-31' WHERE body = ANY($1) RETURNING id",
            )
            .bind(&bodies)
            .fetch_all(&mut *tx)
            .await
            .unwrap();
            // Locked first, to learn which of them a sweep had already
            // soft-deleted (this update undeletes them).
            let tickets: Vec<(Uuid, bool)> = sqlx::query_as(
                "SELECT id, is_deleted FROM app.tickets WHERE subject = ANY($1) FOR UPDATE",
            )
            .bind(&subjects)
            .fetch_all(&mut *tx)
            .await
            .unwrap();
            let ids: Vec<Uuid> = tickets.iter().map(|t| t.0).collect();
            sqlx::query(
                "UPDATE app.tickets SET closed_at = '2026-05-31', is_deleted = false, deleted_at = NULL
                 WHERE id = ANY($1)",
            )
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .unwrap();
            tx.commit().await.unwrap();
            let at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
                .fetch_one(&mut *conn)
                .await
                .unwrap();
            moved_notes.extend(notes);
            undeleted += tickets.iter().filter(|t| t.1).count() as i64;
            moved_tickets.extend(ids);
            commits.push(at);
        }
        (moved_notes, moved_tickets, undeleted, commits)
    };
    let sweeps = async {
        let runs = tokio::join!(
            a.sweep(SweepRequest::tenanted(TENANT_A, now())),
            b.sweep(SweepRequest::tenanted(TENANT_A, now()))
        );
        done.store(true, Ordering::SeqCst);
        runs
    };
    let ((moved_notes, moved_tickets, undeleted, commits), (ra, rb)) =
        tokio::join!(updater, sweeps);
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(
        (ra.status, rb.status),
        (RunStatus::Succeeded, RunStatus::Succeeded)
    );
    // The race happened: the application committed while a sweep ran.
    let during = commits
        .iter()
        .filter(|t| {
            [&ra, &rb]
                .iter()
                .any(|r| r.started_at <= **t && Some(**t) <= r.settled_at)
        })
        .count();
    assert!(during > 0, "no update committed while the sweeps ran");
    assert!(!moved_notes.is_empty() && !moved_tickets.is_empty());

    // Every row an update made young is there, young, and not deleted.
    let kept_notes: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM app.notes WHERE id = ANY($1) AND created_at = '2026-05-31'",
    )
    .bind(&moved_notes)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        kept_notes,
        moved_notes.len() as i64,
        "a young note was purged"
    );
    let kept_tickets: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM app.tickets WHERE id = ANY($1) AND closed_at = '2026-05-31' AND NOT is_deleted",
    )
    .bind(&moved_tickets)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        kept_tickets,
        moved_tickets.len() as i64,
        "a young ticket was soft-deleted"
    );

    // Rows the application had locked were passed over; one more sweep
    // finishes them. Each old row was changed once, by one of the runs.
    let rc = a
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let (notes_left, _, tickets_left) = eligible_in_tenant_a(db.pool()).await;
    assert_eq!((notes_left, tickets_left), (0, 0));
    let changed = |name: &str| {
        [&ra, &rb, &rc]
            .iter()
            .map(|r| r.entity(name).unwrap().affected as i64)
            .sum::<i64>()
    };
    assert_eq!(changed("Note"), notes_before - moved_notes.len() as i64);
    // Tickets: the ones still deleted, and the ones the application
    // undeleted after a sweep had deleted them.
    let deleted_tickets = count(db.pool(), &in_tenant_a("tickets", "AND is_deleted")).await;
    assert_eq!(deleted_tickets, tickets_before - moved_tickets.len() as i64);
    assert_eq!(changed("Ticket"), deleted_tickets + undeleted);
}
