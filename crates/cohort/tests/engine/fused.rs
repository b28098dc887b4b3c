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

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

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
    factory::notes(TENANT_A)
        .created(factory::at("2025-12-31T23:59:59Z"))
        .spaced(chrono::TimeDelta::seconds(1))
        .numbered("bulk:")
        .count(200)
        .insert(db.pool())
        .await;
    exec(
        db.pool(),
        &format!(
            "CREATE FUNCTION app.gate(body text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
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
    sweep_through_the_gate_after(db, as_role, async || {}, meanwhile).await
}

/// [`sweep_through_the_gate`], with `prepare` run once both handles are
/// built (and so validated), before the sweep starts.
async fn sweep_through_the_gate_after<P, F>(
    db: &cohort_pgtemp::TestDatabase,
    as_role: sqlx::PgPool,
    prepare: P,
    meanwhile: F,
) -> SweepResult
where
    P: AsyncFnOnce(),
    F: AsyncFnOnce(&Cohort),
{
    let sweeper = engine_cohort_on(as_role, batches_of(1000)).await;
    let owner = engine_cohort_on(db.pool().clone(), test_config()).await;
    prepare().await;
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

/// The ways a hold can be written without the library, each committed
/// after the batch statement's snapshot and before it locks the row.
#[derive(Clone, Copy, Debug)]
enum Bypass {
    /// A released hold made active again under `session_replication_role
    /// = replica` (how logical replication's apply worker writes).
    ReactivatedAsReplica,
    /// An expired hold extended under the replica role.
    ExtendedAsReplica,
    /// A saved copy of a hold row, with its old `written_xid`, inserted
    /// again under the replica role (a restore of that row).
    ReinsertedAsReplica,
    /// A released hold made active again after the owner disabled the
    /// stamp trigger (left disabled).
    ReactivatedTriggerDisabled,
    /// The same with the trigger enabled again right after: the batch
    /// finds it enabled, but changed since its snapshot.
    ReactivatedTriggerToggled,
    /// The trigger's function replaced by one that stamps nothing, the
    /// hold re-activated, the function put back: the batch finds the
    /// function changed since its snapshot.
    ReactivatedFunctionSwapped,
}

impl Bypass {
    const ALL: [Bypass; 6] = [
        Bypass::ReactivatedAsReplica,
        Bypass::ExtendedAsReplica,
        Bypass::ReinsertedAsReplica,
        Bypass::ReactivatedTriggerDisabled,
        Bypass::ReactivatedTriggerToggled,
        Bypass::ReactivatedFunctionSwapped,
    ];

    /// Leaves an inactive hold on the gated row (placed by the library,
    /// then released, expired, or removed with a copy kept).
    async fn before(self, owner: &Cohort, db: &cohort_pgtemp::TestDatabase) -> Uuid {
        hold_the_gated_row(owner, db).await;
        let hold: Uuid = sqlx::query_scalar("SELECT hold_id FROM public.retention_hold")
            .fetch_one(db.pool())
            .await
            .unwrap();
        let sql = match self {
            Bypass::ExtendedAsReplica => {
                "ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_reach;
                 UPDATE public.retention_hold SET created_at = timestamptz '1999-01-01', expires_at = timestamptz '2000-01-01';
                 ALTER TABLE public.retention_hold ENABLE ALWAYS TRIGGER retention_hold_reach"
            }
            Bypass::ReinsertedAsReplica => {
                "CREATE TABLE public.saved_hold AS SELECT * FROM public.retention_hold;
                 ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_reach;
                 DELETE FROM public.retention_hold;
                 ALTER TABLE public.retention_hold ENABLE ALWAYS TRIGGER retention_hold_reach"
            }
            _ => "UPDATE public.retention_hold SET released_at = now()",
        };
        exec(db.pool(), sql).await;
        hold
    }

    /// Makes the hold active again, without the library, and commits.
    async fn write(self, db: &cohort_pgtemp::TestDatabase) {
        let sql = match self {
            Bypass::ReactivatedAsReplica => {
                "BEGIN; SET LOCAL session_replication_role = replica;
                 ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_reach;
                 UPDATE public.retention_hold SET released_at = NULL;
                 ALTER TABLE public.retention_hold ENABLE ALWAYS TRIGGER retention_hold_reach; COMMIT"
            }
            Bypass::ExtendedAsReplica => {
                "BEGIN; SET LOCAL session_replication_role = replica;
                 ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_reach;
                 UPDATE public.retention_hold SET expires_at = NULL;
                 ALTER TABLE public.retention_hold ENABLE ALWAYS TRIGGER retention_hold_reach; COMMIT"
            }
            Bypass::ReinsertedAsReplica => {
                "BEGIN; SET LOCAL session_replication_role = replica;
                 INSERT INTO public.retention_hold SELECT * FROM public.saved_hold; COMMIT"
            }
            Bypass::ReactivatedTriggerDisabled => {
                "ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_stamp;
                 ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_reach;
                 UPDATE public.retention_hold SET released_at = NULL;
                 ALTER TABLE public.retention_hold ENABLE ALWAYS TRIGGER retention_hold_reach"
            }
            Bypass::ReactivatedTriggerToggled => {
                "ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_stamp;
                 ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_reach;
                 UPDATE public.retention_hold SET released_at = NULL;
                 ALTER TABLE public.retention_hold ENABLE ALWAYS TRIGGER retention_hold_reach;
                 ALTER TABLE public.retention_hold ENABLE ALWAYS TRIGGER retention_hold_stamp"
            }
            Bypass::ReactivatedFunctionSwapped => {
                "CREATE OR REPLACE FUNCTION public.retention_hold_stamp() RETURNS trigger
                     LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
                 ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_reach;
                 UPDATE public.retention_hold SET released_at = NULL;
                 ALTER TABLE public.retention_hold ENABLE ALWAYS TRIGGER retention_hold_reach;
                 CREATE OR REPLACE FUNCTION public.retention_hold_stamp() RETURNS trigger
                     LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp
                     AS $$ BEGIN NEW.written_xid := pg_catalog.pg_current_xact_id(); RETURN NEW; END $$;"
            }
        };
        exec(db.pool(), sql).await;
    }
}

/// What schema 12 relied on: a stamp trigger that fires only outside the
/// replica role, and a re-check that trusts every stamp. Installed after
/// the handles were validated (startup now refuses such a trigger). The
/// re-check looks for the stamps the snapshot cannot see, as this
/// release's does: schema 12 looked from the oldest transaction running
/// in the whole cluster, which made it miss the hold only when no other
/// test's transaction was open (the control would depend on the others).
const SCHEMA_12_CHECK: &str = "
    ALTER TABLE public.retention_hold ENABLE TRIGGER retention_hold_stamp;
    CREATE OR REPLACE FUNCTION public.retention_hold_recent(entity uuid, snap pg_snapshot, locked bigint)
    RETURNS boolean LANGUAGE sql VOLATILE AS $$
        SELECT locked > 0 AND EXISTS (SELECT 1 FROM public.retention_hold h
            WHERE h.written_xid >= pg_catalog.pg_snapshot_xmin(snap)
              AND NOT pg_catalog.pg_visible_in_snapshot(h.written_xid, snap)
              AND (h.retention_entity_id = entity OR h.retention_entity_id IS NULL))
    $$;";

/// RS-041: a hold made active while the batch statement ran keeps its row
/// however it was written: under the replica role (re-activated, extended,
/// re-inserted with its old stamp), with the stamp trigger disabled (left
/// so, or enabled again at once) or its function swapped and put back. With the schema-12 check the same
/// interleavings delete the held row: the test reaches the hazard.
#[tokio::test]
async fn a_hold_written_past_the_stamp_trigger_inside_the_batch_window_keeps_its_row() {
    for schema_12 in [true, false] {
        for bypass in Bypass::ALL {
            let (db, as_role) = gated_db().await;
            let owner = engine_cohort(&db).await;
            let hold = bypass.before(&owner, &db).await;
            assert!(!owner
                .is_held(Uuid::parse_str(NOTE_ID).unwrap(), &gated_id(&db).await)
                .await
                .unwrap());
            let result = sweep_through_the_gate_after(
                &db,
                as_role,
                async || {
                    if schema_12 {
                        exec(db.pool(), SCHEMA_12_CHECK).await;
                    }
                },
                async |_: &Cohort| bypass.write(&db).await,
            )
            .await;
            let active: bool = sqlx::query_scalar(
                "SELECT (released_at IS NULL OR released_at > now()) \
                 AND (expires_at IS NULL OR expires_at > now()) \
                 FROM public.retention_hold WHERE hold_id = $1",
            )
            .bind(hold)
            .fetch_one(db.pool())
            .await
            .unwrap();
            assert!(active, "{bypass:?}: the hold is active again");
            let note = result.entity("Note").unwrap();
            if schema_12 {
                assert_eq!(
                    gated_row_left(&db).await,
                    0,
                    "{bypass:?}: the schema-12 check misses the hold and deletes its row"
                );
                assert_eq!(note.affected, ELIGIBLE);
            } else {
                assert_eq!(
                    gated_row_left(&db).await,
                    1,
                    "{bypass:?}: the held row is kept"
                );
                assert_eq!(note.affected, ELIGIBLE - 1, "{bypass:?}");
                assert_eq!(note.held, 1, "{bypass:?}: and counted as held");
            }
        }
    }
}

async fn gated_id(db: &cohort_pgtemp::TestDatabase) -> String {
    let id: Uuid = sqlx::query_scalar("SELECT id FROM app.notes WHERE body = $1")
        .bind(GATED)
        .fetch_one(db.pool())
        .await
        .unwrap();
    id.to_string()
}

/// RS-041: the re-check looks for the holds the batch statement's own
/// snapshot could not see, not for every hold written since the oldest
/// transaction still running. With a transaction left open elsewhere, a
/// hold committed before the snapshot is not "recent" (schema 12 took
/// every such batch to the two-statement fallback); one committed after
/// it is.
#[db_test(engine)]
async fn the_re_check_looks_only_for_holds_the_batch_snapshot_could_not_see(db: TestDatabase) {
    let owner = engine_cohort(&db).await;
    let note = Uuid::parse_str(NOTE_ID).unwrap();
    // A transaction with an xid, left open for the whole test.
    let mut idle = sqlx::PgConnection::connect_with(&db.connect_options())
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN; SELECT pg_catalog.pg_current_xact_id();")
        .execute(&mut idle)
        .await
        .unwrap();
    let hold_on = async |label: &str| {
        let id: Uuid = sqlx::query_scalar("SELECT id FROM app.notes WHERE body = $1")
            .bind(format!("{TENANT_A}:{label}"))
            .fetch_one(db.pool())
            .await
            .unwrap();
        owner
            .create_hold(HoldRequest::new(note, id.to_string(), "case").tenant(TENANT_A))
            .await
            .unwrap();
    };
    hold_on("1d").await;
    let snapshot: String = sqlx::query_scalar("SELECT pg_catalog.pg_current_snapshot()::text")
        .fetch_one(db.pool())
        .await
        .unwrap();
    let recent = async || -> bool {
        sqlx::query_scalar("SELECT public.retention_hold_recent($1, $2::pg_snapshot, 1)")
            .bind(note)
            .bind(&snapshot)
            .fetch_one(db.pool())
            .await
            .unwrap()
    };
    assert!(
        !recent().await,
        "a hold the snapshot sees is not recent, whatever else is still running"
    );
    hold_on("45d").await;
    assert!(recent().await, "a hold committed after the snapshot is");
    sqlx::raw_sql("ROLLBACK").execute(&mut idle).await.unwrap();
}

/// RS-041: every process validates at startup, and refuses a database
/// whose stamp trigger does not fire for every writer (disabled, origin
/// only, replica only, missing, or its function no longer stamping),
/// naming the statement that fixes it; after that statement it starts.
#[db_test(engine)]
async fn startup_refuses_a_stamp_trigger_that_does_not_fire_always(db: TestDatabase) {
    let fix =
        "ALTER TABLE \"public\".\"retention_hold\" ENABLE ALWAYS TRIGGER retention_hold_stamp;";
    for (break_it, says) in [
        (
            "ALTER TABLE public.retention_hold DISABLE TRIGGER retention_hold_stamp",
            "is disabled",
        ),
        (
            "ALTER TABLE public.retention_hold ENABLE TRIGGER retention_hold_stamp",
            "replica-role writers",
        ),
        (
            "ALTER TABLE public.retention_hold ENABLE REPLICA TRIGGER retention_hold_stamp",
            "by ordinary sessions",
        ),
        (
            "DROP TRIGGER retention_hold_stamp ON public.retention_hold",
            "is missing",
        ),
        (
            "CREATE OR REPLACE FUNCTION public.retention_hold_stamp() RETURNS trigger
                 LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$",
            "no longer stamps written_xid",
        ),
    ] {
        exec(db.pool(), break_it).await;
        let mut b = Cohort::builder(db.pool().clone())
            .config(test_config())
            .rules(rules());
        for d in engine_entities() {
            b = b.declaration(d);
        }
        let err = b.build().await.expect_err("startup refuses");
        let text = err.to_string();
        assert!(text.contains(says), "{break_it}: {text}");
        assert!(text.contains(fix), "{break_it}: names the fix: {text}");
        let statement = if says == "no longer stamps written_xid" {
            let start = text.find("CREATE OR REPLACE FUNCTION").unwrap();
            let end = start + text[start..].find('`').unwrap();
            text[start..end].to_owned()
        } else if says == "is missing" {
            let start = text.find("CREATE TRIGGER").unwrap();
            let end = start + text[start..].find('`').unwrap();
            text[start..end].to_owned()
        } else {
            fix.to_owned()
        };
        exec(db.pool(), &statement).await;
        engine_cohort(&db).await;
    }
}
