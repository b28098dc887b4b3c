//! RS-022: one entity swept on several connections at once
//! (`sweep_parallelism`), with every guarantee of a single-connection
//! sweep. The runs at four connections are held at a gate (a trigger
//! waiting on an advisory lock the test holds) until four connections of
//! the sweep are inside a batch at once: the proof is of concurrency, and
//! of what happens to four open batches, without sleeping.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL

use crate::support;
use cohort_test_macros::db_test;

use std::collections::BTreeMap;
use std::time::Duration;

use cohort::holds::HoldRequest;
use cohort::{AuditDetail, Cohort, CohortConfig, RunStatus, SweepRequest};
use cohort_pgtemp::TestDatabase;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use support::*;
use uuid::Uuid;

/// Bulk rows of tenant A for each strategy, with deterministic keys and
/// anchors tied in sevens (so key ranges split ties by key), the
/// fixture's random keys made deterministic too, and a gate:
/// every mutated row waits for a shared lock on advisory key [`GATE`].
const BULK: &str = r#"
UPDATE app.notes SET id = md5(body)::uuid;
UPDATE app.tickets SET id = md5(tenant_id::text || subject)::uuid;
INSERT INTO app.notes (id, tenant_id, created_at, body)
SELECT md5('n' || g)::uuid, 'aaaaaaaa-0000-0000-0000-00000000000a',
       timestamptz '2026-01-01' - make_interval(secs => g / 7), 'bulk:' || g
FROM generate_series(1, $N) g;
INSERT INTO app.contacts (id, tenant_id, created_at, email, full_name, phone, reference, user_id)
SELECT 1000 + g, 'aaaaaaaa-0000-0000-0000-00000000000a', timestamptz '2025-06-01' - make_interval(secs => g / 7),
       'bulk@example.com', 'Bulk ' || g, '+1', 'R' || g, md5('u' || g)::uuid
FROM generate_series(1, $N) g;
INSERT INTO app.tickets (id, tenant_id, closed_at, subject)
SELECT md5('t' || g)::uuid, 'aaaaaaaa-0000-0000-0000-00000000000a',
       timestamptz '2026-01-01' - make_interval(secs => g / 7), 'bulk ' || g
FROM generate_series(1, $N) g;
CREATE FUNCTION app.gate() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN PERFORM pg_advisory_xact_lock_shared(4242); RETURN COALESCE(NEW, OLD); END $$;
CREATE TRIGGER gate BEFORE DELETE ON app.notes FOR EACH ROW EXECUTE FUNCTION app.gate();
CREATE TRIGGER gate BEFORE UPDATE ON app.contacts FOR EACH ROW EXECUTE FUNCTION app.gate();
CREATE TRIGGER gate BEFORE UPDATE ON app.tickets FOR EACH ROW EXECUTE FUNCTION app.gate();
"#;

const GATE: i64 = 4242;

/// Sessions of this database waiting at the gate.
const AT_GATE: &str = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
    AND objid = 4242 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";

async fn bulk_db(rows: u32) -> TestDatabase {
    let db = engine_db().await;
    exec(db.pool(), &BULK.replace("$N", &rows.to_string())).await;
    db
}

/// A handle on its own pool (its own connections, as a process of its
/// own would have) sweeping each entity on `lanes` connections, per-row
/// audit for the three mutating entities.
async fn engine(db: &TestDatabase, lanes: u32, batch: u32) -> Cohort {
    let pool = PgPoolOptions::new()
        .max_connections(lanes + 2)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(db.connect_options())
        .await
        .unwrap();
    let mut b = Cohort::builder(pool)
        .config(CohortConfig {
            sweep_batch_size: cohort::BatchSize::Fixed(batch),
            sweep_parallelism: lanes,
            ..test_config()
        })
        .rules(rules());
    for (i, d) in engine_entities().into_iter().enumerate() {
        b = b.declaration(if i < 3 {
            d.audit(AuditDetail::PerRow)
        } else {
            d
        });
    }
    b.build().await.unwrap()
}

/// Closes the gate on a connection of the test's own; returns it.
async fn close_gate(db: &TestDatabase) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
    let mut gate = db.pool().acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(GATE)
        .execute(&mut *gate)
        .await
        .unwrap();
    gate
}

async fn open_gate(mut gate: sqlx::pool::PoolConnection<sqlx::Postgres>) {
    let opened: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
        .bind(GATE)
        .fetch_one(&mut *gate)
        .await
        .unwrap();
    assert!(opened);
}

/// Waits until `n` sessions of the sweep are at the gate, each inside a
/// batch with its rows locked.
async fn wait_at_gate(pool: &PgPool, n: i64) {
    wait_until(
        "connections of the sweep at the gate",
        Duration::from_secs(60),
        async || count(pool, AT_GATE).await >= n,
    )
    .await;
}

/// What a run left: each table's rows (volatile times reduced to whether
/// they are set), its summaries, and its row details.
async fn state(
    pool: &PgPool,
    run_id: Uuid,
) -> (
    Vec<String>,
    Vec<(String, String, i64, i64, i64, i64)>,
    Vec<String>,
) {
    let mut tables = Vec::new();
    for sql in [
        "SELECT coalesce(string_agg(row(id, tenant_id, created_at, body)::text, ';' ORDER BY id), '') FROM app.notes",
        "SELECT coalesce(string_agg(row(id, tenant_id, created_at, email, full_name, phone, reference, score, user_id, anonymised_at IS NOT NULL)::text, ';' ORDER BY id), '') FROM app.contacts",
        "SELECT coalesce(string_agg(row(id, tenant_id, closed_at, is_deleted, deleted_at IS NOT NULL, subject)::text, ';' ORDER BY id), '') FROM app.tickets",
    ] {
        tables.push(sqlx::query_scalar::<_, String>(sql).fetch_one(pool).await.unwrap());
    }
    let (status, _, settled, summaries) = ledger(pool, run_id).await;
    assert!(settled, "{status}");
    let details: Vec<String> = sqlx::query_scalar(
        "SELECT entity_type || ' ' || action || ' ' || record_id FROM public.sweep_run_row_detail
         WHERE run_id = $1 ORDER BY 1",
    )
    .bind(run_id)
    .fetch_all(pool)
    .await
    .unwrap();
    (tables, summaries, details)
}

/// Holds on every 11th bulk row of each entity, placed before the run.
async fn hold_some(cohort: &Cohort, pool: &PgPool) -> usize {
    let mut targets: Vec<(&str, String)> = Vec::new();
    for (entity, sql) in [
        (NOTE_ID, "SELECT id::text FROM app.notes WHERE body LIKE 'bulk:%' AND split_part(body, ':', 2)::int % 11 = 0"),
        (CONTACT_ID, "SELECT id::text FROM app.contacts WHERE id > 1000 AND id % 11 = 0"),
        (TICKET_ID, "SELECT id::text FROM app.tickets WHERE subject LIKE 'bulk %' AND split_part(subject, ' ', 2)::int % 11 = 0"),
    ] {
        for id in sqlx::query_scalar::<_, String>(sql).fetch_all(pool).await.unwrap() {
            targets.push((entity, id));
        }
    }
    for (entity, id) in &targets {
        cohort
            .create_hold(
                HoldRequest::new(Uuid::parse_str(entity).unwrap(), id.clone(), "case 7")
                    .tenant(TENANT_A),
            )
            .await
            .unwrap();
    }
    targets.len()
}

/// Four connections at once change exactly the rows one connection
/// changes (purge, soft delete, anonymise, hashing included) and record
/// the same summaries and the same row details; held rows stay.
#[tokio::test]
async fn four_connections_change_the_same_rows_and_record_the_same_audit_as_one() {
    let (one, four) = (bulk_db(1500).await, bulk_db(1500).await);
    let (single, parallel) = (engine(&one, 1, 50).await, engine(&four, 4, 50).await);
    let held = hold_some(&single, one.pool()).await;
    assert_eq!(held, hold_some(&parallel, four.pool()).await);
    assert!(held > 100);

    let r1 = single
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let gate = close_gate(&four).await;
    let sweeping = tokio::spawn({
        let parallel = parallel.clone();
        async move {
            parallel
                .sweep(SweepRequest::tenanted(TENANT_A, now()))
                .await
        }
    });
    // Four connections of one run inside a batch of the same entity at once.
    wait_at_gate(four.pool(), 4).await;
    open_gate(gate).await;
    let r4 = sweeping.await.unwrap().unwrap();
    assert_eq!(
        (r1.status, r4.status),
        (RunStatus::Succeeded, RunStatus::Succeeded)
    );

    let (rows1, summaries1, details1) = state(one.pool(), r1.run_id).await;
    let (rows4, summaries4, details4) = state(four.pool(), r4.run_id).await;
    assert_eq!(rows4, rows1, "the rows left differ");
    assert_eq!(summaries4, summaries1, "the summaries differ");
    assert_eq!(details4.len(), details1.len());
    assert_eq!(details4, details1, "the row details differ");
    // And they are what the data says: every eligible bulk row of tenant
    // A changed once, every held one kept and counted.
    for (name, bulk_held) in [("Note", 136), ("Contact", 137), ("Ticket", 136)] {
        let s = summaries4.iter().find(|s| s.0 == name).unwrap();
        assert_eq!(s.3, bulk_held, "{name} held");
        let detailed = details4
            .iter()
            .filter(|d| d.starts_with(&format!("{name} ")))
            .count();
        assert_eq!(s.2 as usize, detailed, "{name}: summary against details");
        assert_eq!(r4.entity(name).unwrap().affected, s.2 as u64);
    }
    assert_eq!(
        count(
            four.pool(),
            "SELECT count(*) FROM app.notes WHERE body LIKE 'bulk:%' AND split_part(body, ':', 2)::int % 11 = 0"
        )
        .await,
        136
    );
}

/// The hold race of `concurrency.rs`, with two sweeps of four connections
/// each: a hold created while the rows are being swept protects its row
/// from the moment it exists; reported counts equal what committed.
#[tokio::test]
async fn hold_creation_racing_two_four_connection_sweeps_never_loses_a_protected_row() {
    let db = bulk_db(1500).await;
    race_holds_against_parallel_sweeps(&db).await;
}

#[tokio::test]
async fn four_connection_hold_races_are_safe_when_the_database_defaults_to_repeatable_read() {
    let db = bulk_db(1500).await;
    exec(
        db.pool(),
        &format!(
            "ALTER DATABASE \"{}\" SET default_transaction_isolation = 'repeatable read'",
            db.name()
        ),
    )
    .await;
    race_holds_against_parallel_sweeps(&db).await;
}

async fn race_holds_against_parallel_sweeps(db: &TestDatabase) {
    let mut targets: Vec<(&str, &str, String)> = Vec::new();
    for (entity, table, sql) in [
        (NOTE_ID, "notes", "SELECT id::text FROM app.notes WHERE body LIKE 'bulk:%' AND split_part(body, ':', 2)::int % 5 = 0"),
        (CONTACT_ID, "contacts", "SELECT id::text FROM app.contacts WHERE id > 1000 AND id % 5 = 0"),
        (TICKET_ID, "tickets", "SELECT id::text FROM app.tickets WHERE subject LIKE 'bulk %' AND split_part(subject, ' ', 2)::int % 5 = 0"),
    ] {
        for id in sqlx::query_scalar::<_, String>(sql).fetch_all(db.pool()).await.unwrap() {
            targets.push((entity, table, id));
        }
    }
    // Interleave entities so holds land while every strategy runs.
    targets.sort_by_key(|(_, _, r)| r.chars().rev().collect::<String>());
    let (a, b, h) = (
        engine(db, 4, 50).await,
        engine(db, 4, 50).await,
        engine(db, 1, 50).await,
    );
    let holder = async {
        let mut protected: BTreeMap<String, String> = BTreeMap::new();
        let mut refused = 0;
        for (entity, table, record) in &targets {
            let req = HoldRequest::new(Uuid::parse_str(entity).unwrap(), record.clone(), "race")
                .tenant(TENANT_A);
            match h.create_hold(req).await {
                Ok(_) => {
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
    assert_eq!(
        (ra.status, rb.status),
        (RunStatus::Succeeded, RunStatus::Succeeded)
    );
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
    let purged = 1503
        - count(db.pool(), &format!("SELECT count(*) FROM app.notes WHERE tenant_id = '{TENANT_A}' AND created_at < '2026-05-02'")).await;
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
    assert_whole(db.pool()).await;
    let after = a
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(after.affected(), 0);
}

/// Every batch whole: each run's summary equals its row details, entity
/// by entity, no record is detailed twice, and each detail's change is
/// in the table (a purged row gone, a soft-deleted or anonymised row done).
async fn assert_whole(pool: &PgPool) {
    let mismatched = count(
        pool,
        "SELECT count(*) FROM public.sweep_run_entity_summary s WHERE s.affected_count <>
            (SELECT count(*) FROM public.sweep_run_row_detail d
             WHERE d.run_id = s.run_id AND d.retention_entity_id = s.retention_entity_id)",
    )
    .await;
    assert_eq!(mismatched, 0, "a summary that is not its details");
    let twice = count(
        pool,
        "SELECT count(*) FROM (SELECT record_id FROM public.sweep_run_row_detail
         GROUP BY retention_entity_id, record_id HAVING count(*) > 1) t",
    )
    .await;
    assert_eq!(twice, 0, "a row changed twice");
    let undone = count(
        pool,
        "SELECT count(*) FROM public.sweep_run_row_detail d WHERE
           (d.entity_type = 'Note' AND EXISTS (SELECT 1 FROM app.notes n WHERE n.id::text = d.record_id))
        OR (d.entity_type = 'Contact' AND EXISTS (SELECT 1 FROM app.contacts c WHERE c.id::text = d.record_id AND c.anonymised_at IS NULL))
        OR (d.entity_type = 'Ticket' AND EXISTS (SELECT 1 FROM app.tickets t WHERE t.id::text = d.record_id AND NOT t.is_deleted))",
    )
    .await;
    assert_eq!(undone, 0, "a detail whose change is not in the table");
    for (table, done) in [
        ("notes", "false"),
        ("contacts", "anonymised_at IS NOT NULL"),
        ("tickets", "is_deleted"),
    ] {
        if done == "false" {
            continue;
        }
        let changed = count(
            pool,
            &format!("SELECT count(*) FROM app.{table} WHERE {done}"),
        )
        .await;
        let detailed = count(
            pool,
            &format!("SELECT count(*) FROM public.sweep_run_row_detail d JOIN app.{table} t ON t.id::text = d.record_id"),
        )
        .await;
        assert_eq!(
            changed, detailed,
            "{table}: a changed row without its detail"
        );
    }
}

/// Cancelled while four connections each hold an open batch: all four
/// batches roll back, the run settles cancelled, nothing changed.
#[tokio::test]
async fn cancelling_a_four_connection_sweep_rolls_back_every_open_batch() {
    let db = bulk_db(1500).await;
    let cohort = engine(&db, 4, 50).await;
    let before = table_digest(db.pool(), "app.notes").await;
    let token = cohort::Cancel::new();
    let gate = close_gate(&db).await;
    let sweeping = tokio::spawn({
        let cohort = cohort.clone();
        let token = token.clone();
        async move {
            cohort
                .sweep(SweepRequest::tenanted(TENANT_A, now()).cancellation(token))
                .await
        }
    });
    wait_at_gate(db.pool(), 4).await;
    token.cancel();
    open_gate(gate).await;
    let result = sweeping.await.unwrap().unwrap();
    assert_eq!(result.status, RunStatus::Cancelled);
    let (status, _, settled, summaries) = ledger(db.pool(), result.run_id).await;
    assert_eq!((status.as_str(), settled), ("cancelled", true));
    assert!(summaries.iter().all(|s| s.2 == 0), "{summaries:?}");
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM public.sweep_run_row_detail"
        )
        .await,
        0
    );
    assert_eq!(
        table_digest(db.pool(), "app.notes").await,
        before,
        "a rolled-back batch changed rows"
    );
    assert!(run_lock_free(db.pool(), result.run_id).await);
    // Nothing is left locked or half-done: a rerun sweeps everything.
    let rerun = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(rerun.status, RunStatus::Succeeded);
    assert_eq!(rerun.entity("Note").unwrap().affected, 1503);
    assert_whole(db.pool()).await;
}

/// One of the four connections is terminated while the four hold open
/// batches: its batch is gone, the other three commit whole and stop, the
/// run fails (as on one connection when its connection is lost), and a
/// rerun on four connections finishes the work.
#[tokio::test]
async fn a_terminated_connection_of_a_four_connection_sweep_leaves_whole_batches_and_a_rerun_finishes(
) {
    let db = bulk_db(1500).await;
    let cohort = engine(&db, 4, 50).await;
    let gate = close_gate(&db).await;
    let sweeping = tokio::spawn({
        let cohort = cohort.clone();
        async move { cohort.sweep(SweepRequest::tenanted(TENANT_A, now())).await }
    });
    wait_at_gate(db.pool(), 4).await;
    // A connection of the sweep other than the run's own (the one holding
    // the run lock, a granted advisory lock other than the hold gate every
    // batch takes: the two-key lock whose first key is 1131375665).
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(l.pid) FROM pg_locks l
         WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objid = 4242
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND NOT EXISTS (SELECT 1 FROM pg_locks r WHERE r.pid = l.pid AND r.locktype = 'advisory' AND r.granted
                           AND NOT (r.objsubid = 2 AND r.classid = 1131375665))
         LIMIT 1) t",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(killed, 1);
    open_gate(gate).await;
    let result = sweeping.await.unwrap();
    let failed = result.unwrap();
    assert_eq!(failed.status, RunStatus::Failed, "{failed:?}");
    let note = failed.entity("Note").unwrap().affected;
    assert!(note > 0 && note < 1503, "three batches committed: {note}");
    assert_eq!(note % 50, 0, "whole batches only: {note}");
    assert_whole(db.pool()).await;
    assert_eq!(started_runs(db.pool()).await, Vec::<Uuid>::new());
    let rerun = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(rerun.status, RunStatus::Succeeded);
    assert_eq!(rerun.entity("Note").unwrap().affected + note, 1503);
    assert_eq!(
        count(db.pool(), &format!("SELECT count(*) FROM app.notes WHERE tenant_id = '{TENANT_A}' AND created_at < '2026-05-02'")).await,
        0
    );
    assert_whole(db.pool()).await;
}

/// Refused at build, naming the setting: more connections than the pool
/// has (globally or for one entity), 0, more than 64; an entity's own
/// setting from a policy file is what its sweep uses.
#[db_test(engine)]
async fn a_parallelism_the_pool_cannot_serve_zero_or_absurd_is_refused_naming_the_setting(
    db: TestDatabase,
) {
    let pool = |max: u32| {
        PgPoolOptions::new()
            .max_connections(max)
            .connect_lazy_with(db.connect_options())
    };
    let build = async |max: u32, global: u32, own: Option<u32>| {
        let mut b = Cohort::builder(pool(max))
            .config(CohortConfig {
                sweep_parallelism: global,
                ..test_config()
            })
            .rules(rules());
        for (i, d) in engine_entities().into_iter().enumerate() {
            b = b.declaration(match own {
                Some(n) if i == 0 => d.sweep_parallelism(n),
                _ => d,
            });
        }
        b.build().await
    };
    let refused = |r: Result<Cohort, cohort::Error>| match r {
        Err(e @ (cohort::Error::Validation(_) | cohort::Error::Config(_))) => e.to_string(),
        Err(e) => panic!("not a validation or configuration error: {e}"),
        Ok(_) => panic!("accepted"),
    };
    let msg = refused(build(3, 4, None).await);
    assert!(
        msg.contains("sweep_parallelism = 4 needs 4 connections")
            && msg.contains("the pool allows 3"),
        "{msg}"
    );
    let msg = refused(build(3, 1, Some(5)).await);
    assert!(
        msg.contains("Note: sweep_parallelism = 5 needs 5 connections"),
        "{msg}"
    );
    let msg = refused(build(8, 1, Some(0)).await);
    assert!(
        msg.contains("Note: sweep_parallelism = 0 is out of range 1..=64"),
        "{msg}"
    );
    let msg = refused(build(8, 65, None).await);
    assert!(
        msg.contains("sweep_parallelism = 65 is out of range 1..=64"),
        "{msg}"
    );
    let msg = refused(build(8, 0, None).await);
    assert!(
        msg.contains("sweep_parallelism = 0 is out of range"),
        "{msg}"
    );
    // Exactly what the pool serves is accepted.
    build(4, 4, None).await.unwrap();
    build(4, 1, Some(4)).await.unwrap();

    // The policy file's entity key and the [cohort] key reach the model.
    let file = cohort::policy::PolicyFile::parse(&format!(
        r#"
[cohort]
sweep_parallelism = 2

[[entity]]
name = "Note"
id = "{NOTE_ID}"
table = "app.notes"
category = "notes"
anchor = "created_at"
sweep_parallelism = 3

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
"#
    ))
    .unwrap();
    assert_eq!(file.config.sweep_parallelism, 2);
    let cohort = Cohort::builder(pool(4)).policy(file).build().await.unwrap();
    let model = cohort.ready().await.unwrap();
    assert_eq!(model.entities[0].sweep_parallelism, Some(3));
    let over = cohort::policy::PolicyFile::parse(&format!(
        "[[entity]]\nname = \"Note\"\nid = \"{NOTE_ID}\"\ntable = \"app.notes\"\ncategory = \"notes\"\nanchor = \"created_at\"\nsweep_parallelism = 9\n\n[[category]]\nname = \"notes\"\nstrategy = \"purge\"\nperiod = \"30d\"\n"
    ))
    .unwrap();
    let msg = refused(Cohort::builder(pool(4)).policy(over).build().await);
    assert!(
        msg.contains("Note: sweep_parallelism = 9 needs 9 connections"),
        "{msg}"
    );
}
