//! A sweep batch as one statement (lock, re-check, change): what happens
//! between that statement's snapshot and the moment it locks a row.
//!
//! The statement is stopped there for real: a row-level security policy
//! on `app.notes` calls a function that, for one row, waits on an
//! advisory lock the test holds. The sweep runs as a role the policy
//! applies to (not the table's owner, not a superuser); the test's own
//! connections are the superuser's, which the policy does not apply to.
//! While the sweep waits inside its batch statement, another session
//! places a hold on that row, or updates it, and commits; then the test
//! lets the sweep go on.

mod support;

use cohort::holds::HoldRequest;
use cohort::{Cohort, RunStatus, SweepRequest, SweepResult};
use sqlx::Connection;
use support::*;
use uuid::Uuid;

/// The row the gate stops the batch statement at.
const GATED: &str = "bulk:100";
/// The advisory lock the gate waits on.
const GATE_LOCK: i64 = 4242;

/// Tenant A's 200 old bulk notes, the gate, and a role to sweep as.
async fn gated_db() -> (cohort_pgtemp::TestDatabase, sqlx::PgPool) {
    let db = engine_db().await;
    let role = format!("cohort_gate_{}", &db.name()[db.name().len() - 12..]);
    exec(
        db.pool(),
        &format!(
            "INSERT INTO app.notes (tenant_id, created_at, body)
             SELECT '{TENANT_A}', timestamptz '2026-01-01' - make_interval(secs => g), 'bulk:' || g
             FROM generate_series(1, 200) g;
             CREATE FUNCTION app.gate(body text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
             BEGIN
                 IF body = '{GATED}' THEN
                     PERFORM pg_catalog.pg_advisory_lock_shared({GATE_LOCK});
                     PERFORM pg_catalog.pg_advisory_unlock_shared({GATE_LOCK});
                 END IF;
                 RETURN true;
             END $$;
             ALTER TABLE app.notes ENABLE ROW LEVEL SECURITY;
             CREATE POLICY gate ON app.notes USING (app.gate(body));
             CREATE ROLE {role} LOGIN PASSWORD 'gate-secret' NOSUPERUSER;
             GRANT USAGE ON SCHEMA public, app TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};
             GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA app TO {role};"
        ),
    )
    .await;
    let pool = pool_as(&db, &role, "gate-secret", 3).await;
    (db, pool)
}

/// Sweeps tenant A as the gated role with batches larger than the tenant's
/// notes (one batch statement takes them all). While that statement waits
/// at the gated row, `meanwhile` runs and commits on the superuser's
/// connections; then the gate opens.
async fn sweep_through_the_gate<F>(
    db: &cohort_pgtemp::TestDatabase,
    as_role: sqlx::PgPool,
    meanwhile: F,
) -> SweepResult
where
    F: AsyncFnOnce(&Cohort),
{
    let sweeper = engine_cohort_on(as_role, batches_of(1000)).await;
    let owner = engine_cohort_on(db.pool().clone(), test_config()).await;
    let mut gate = sqlx::PgConnection::connect_with(&db.connect_options())
        .await
        .unwrap();
    sqlx::query("SELECT pg_catalog.pg_advisory_lock($1)")
        .bind(GATE_LOCK)
        .execute(&mut gate)
        .await
        .unwrap();
    let sweep = tokio::spawn(async move {
        sweeper
            .sweep(SweepRequest::tenanted(TENANT_A, now()))
            .await
            .unwrap()
    });
    // The sweep waits at the gate inside its batch statement (not in a
    // count or any other read of the table).
    wait_until(
        "the batch statement waiting at the gate",
        std::time::Duration::from_secs(20),
        async || {
            count(
                db.pool(),
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND wait_event = 'advisory' \
                 AND query LIKE 'WITH c AS (SELECT %'",
            )
            .await
                == 1
        },
    )
    .await;
    meanwhile(&owner).await;
    sqlx::query("SELECT pg_catalog.pg_advisory_unlock($1)")
        .bind(GATE_LOCK)
        .execute(&mut gate)
        .await
        .unwrap();
    let result = sweep.await.unwrap();
    assert_eq!(result.status, RunStatus::Succeeded, "{result:?}");
    result
}

/// How many of tenant A's notes are past the 30-day cutoff (the seed's
/// three and the 200 bulk ones).
const ELIGIBLE: u64 = 203;

async fn gated_row_left(db: &cohort_pgtemp::TestDatabase) -> i64 {
    count(
        db.pool(),
        &format!("SELECT count(*) FROM app.notes WHERE body = '{GATED}'"),
    )
    .await
}

async fn hold_the_gated_row(owner: &Cohort, db: &cohort_pgtemp::TestDatabase) {
    let id: Uuid = sqlx::query_scalar("SELECT id FROM app.notes WHERE body = $1")
        .bind(GATED)
        .fetch_one(db.pool())
        .await
        .unwrap();
    owner
        .create_hold(
            HoldRequest::new(
                Uuid::parse_str(NOTE_ID).unwrap(),
                id.to_string(),
                "litigation",
            )
            .tenant(TENANT_A),
        )
        .await
        .unwrap();
}

/// A hold committed after the batch statement's snapshot, on a row it
/// had not locked yet: the candidate query (that snapshot) does not see
/// it, the re-check of holds written since the snapshot does, and the row
/// stays. With the re-check replaced by one that finds nothing, the same
/// interleaving deletes the held row: the test reaches the hazard.
#[tokio::test]
async fn a_hold_committed_inside_the_batch_statements_window_keeps_its_row() {
    for recheck in [false, true] {
        let (db, as_role) = gated_db().await;
        if !recheck {
            exec(
                db.pool(),
                "CREATE OR REPLACE FUNCTION public.retention_hold_recent(entity uuid, snap pg_snapshot, locked bigint)
                 RETURNS boolean LANGUAGE sql VOLATILE AS 'SELECT false'",
            )
            .await;
        }
        let result = sweep_through_the_gate(&db, as_role, async |owner: &Cohort| {
            hold_the_gated_row(owner, &db).await;
        })
        .await;
        let note = result.entity("Note").unwrap();
        if recheck {
            assert_eq!(gated_row_left(&db).await, 1, "the held row is kept");
            assert_eq!(note.affected, ELIGIBLE - 1);
            assert_eq!(note.held, 1, "and counted as held");
        } else {
            assert_eq!(
                gated_row_left(&db).await,
                0,
                "without the re-check the held row is deleted"
            );
            assert_eq!(note.affected, ELIGIBLE);
        }
    }
}

/// A row updated (and still due) after the batch statement's snapshot is
/// locked in its newest version, which that snapshot cannot see, so the
/// statement's own change passes over it; the batch then changes it in a
/// new snapshot, in the same run, and counts it once.
#[tokio::test]
async fn a_row_updated_inside_the_batch_statements_window_is_swept_in_the_same_batch() {
    let (db, as_role) = gated_db().await;
    let result = sweep_through_the_gate(&db, as_role, async |_: &Cohort| {
        exec(
            db.pool(),
            &format!("UPDATE app.notes SET body = body WHERE body = '{GATED}'"),
        )
        .await;
    })
    .await;
    assert_eq!(gated_row_left(&db).await, 0);
    let note = result.entity("Note").unwrap();
    assert_eq!(note.affected, ELIGIBLE, "{note:?}");
    let summaries: i64 = count(
        db.pool(),
        "SELECT affected_count FROM public.sweep_run_entity_summary WHERE entity_type = 'Note'",
    )
    .await;
    assert_eq!(summaries, ELIGIBLE as i64);
}
