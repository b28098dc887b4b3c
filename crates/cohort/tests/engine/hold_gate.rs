//! RS-041: a subject hold covers a row that became the subject's while
//! the hold was being created, on every path that changes rows.
//!
//! The interleaving is made, not hoped for. A trigger on the hold table
//! stops the hold's insert (after its lock statement has locked the
//! subject's rows) on an advisory lock the test holds. Meanwhile a row of
//! another person becomes the subject's and commits: the hold's lock
//! statement never saw it. Then a batch (sweep, erasure, guarded deletion)
//! locks that row and is stopped by a second trigger just before it
//! changes it, or by the hold gate before it re-checks. The test lets the
//! hold commit, waits for `create_hold` to return, then lets the batch go
//! on. Before the hold gate (schema 13) every path here changed the row
//! after `create_hold` had returned; now the batch waits at the gate and
//! its re-check sees the hold.

use crate::support;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::guarded::{Guarded, GuardedDeletion};
use cohort::holds::HoldRequest;
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, CohortConfig, EntityDeclaration, RunStatus, SweepRequest};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgPool};
use std::time::Duration;
use support::*;
use uuid::Uuid;

/// The subject the hold names, the row's first owner, and the person an
/// erasure names (the row's delegate).
const S: &str = "dddddddd-0000-0000-0000-00000000000d";
const O: &str = "eeeeeeee-0000-0000-0000-00000000000e";
const X: &str = "ffffffff-0000-0000-0000-00000000000f";
const ACCOUNT_ID: &str = "11111111-aaaa-4aaa-8aaa-111111111111";
/// The advisory locks the two pauses wait on.
const HOLD_PAUSE: i64 = 771;
const ROW_PAUSE: i64 = 772;

/// Old accounts of tenant A; row 1 (the raced row) belongs to O, with X
/// as its delegate. Two pauses: the hold's insert (sessions named
/// `hold`), and any change of row 1 by a session named `batch`.
const TABLES: &str = r#"
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
    user_id uuid, delegate_id uuid);
INSERT INTO app.accounts
SELECT g, 'aaaaaaaa-0000-0000-0000-00000000000a', timestamptz '2026-01-01' - make_interval(mins => g),
       CASE WHEN g = 1 THEN '$O'::uuid ELSE md5('u' || g)::uuid END,
       CASE WHEN g = 1 THEN 'ffffffff-0000-0000-0000-00000000000f'::uuid END
FROM generate_series(1, 200) g;
CREATE FUNCTION app.pause(k bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_catalog.pg_advisory_lock_shared(k);
    PERFORM pg_catalog.pg_advisory_unlock_shared(k);
END $$;
CREATE FUNCTION app.pause_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('application_name') = 'hold' THEN PERFORM app.pause(771); END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER pause_hold BEFORE INSERT ON public.retention_hold
    FOR EACH ROW EXECUTE FUNCTION app.pause_hold();
CREATE FUNCTION app.pause_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.id = 1 AND current_setting('application_name') = 'batch' THEN PERFORM app.pause(772); END IF;
    RETURN COALESCE(NEW, OLD);
END $$;
CREATE TRIGGER pause_row BEFORE DELETE OR UPDATE ON app.accounts
    FOR EACH ROW EXECUTE FUNCTION app.pause_row();
"#;

/// A table that references accounts with a restricting foreign key (and
/// no row): a purge of accounts then keeps the two-statement batch.
const RESTRICTING_REFERENCE: &str = "CREATE TABLE app.logins (id bigint PRIMARY KEY, \
     account_id bigint REFERENCES app.accounts (id));";

fn entity() -> EntityDeclaration {
    EntityDeclaration::new("Account", ACCOUNT_ID)
        .category("accounts")
        .anchor("created_at")
        .table("app.accounts")
        .subject("user_id", Some("user"))
        .subject("delegate_id", Some("user"))
}

fn account_rules() -> StaticRuleProvider {
    StaticRuleProvider::builder()
        .category("accounts", RetentionRule::new(days(30), Strategy::Purge))
        .build()
        .unwrap()
}

/// A pool whose sessions carry `application_name` (what the pauses and
/// the waits look for).
async fn named_pool(db: &cohort_pgtemp::TestDatabase, name: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(db.connect_options().application_name(name))
        .await
        .unwrap()
}

async fn cohort_on(pool: PgPool, config: CohortConfig) -> Cohort {
    Cohort::builder(pool)
        .config(config)
        .rules(account_rules())
        .declaration(entity())
        .build()
        .await
        .expect("the fixture validates")
}

/// Whether a session named `name` waits on an advisory lock.
async fn waits(db: &cohort_pgtemp::TestDatabase, name: &str) -> bool {
    count(
        db.pool(),
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = '{name}' AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
        ),
    )
    .await
        > 0
}

/// How row 1 became the subject's after the hold's lock statement.
#[derive(Clone, Copy, Debug)]
enum Becomes {
    /// An UPDATE of its subject column.
    Updated,
    /// It was deleted and inserted again, backdated, as the subject's.
    Inserted,
}

/// The paths that change rows.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// A sweep whose batch is one statement.
    FusedSweep,
    /// A sweep whose batch is two statements (a restricting reference).
    TwoStatementSweep,
    /// A sweep on two connections (key ranges).
    ParallelSweep,
    /// An erasure of the row's delegate.
    Erasure,
    /// A guarded deletion of the row.
    GuardedDeletion,
}

/// What the batch reported: (rows changed, rows counted held).
type Reported = (u64, u64);

/// Runs the race on `path`; returns what the batch reported.
async fn race(path: Path, becomes: Becomes) -> (cohort_pgtemp::TestDatabase, Reported) {
    let db = migrated_db().await;
    exec(db.pool(), &TABLES.replace("$O", O)).await;
    if matches!(path, Path::TwoStatementSweep) {
        exec(db.pool(), RESTRICTING_REFERENCE).await;
    }
    let config = CohortConfig {
        // One batch per connection: every batch stops at the gate while
        // the hold is being placed, so the row must be in the first.
        sweep_batch_size: cohort::BatchSize::Fixed(1000),
        sweep_parallelism: if matches!(path, Path::ParallelSweep) {
            2
        } else {
            1
        },
        ..test_config()
    };
    let holder = cohort_on(named_pool(&db, "hold").await, test_config()).await;
    let batch = cohort_on(named_pool(&db, "batch").await, config).await;
    let mut pauses = sqlx::PgConnection::connect_with(&db.connect_options())
        .await
        .unwrap();
    for key in [HOLD_PAUSE, ROW_PAUSE] {
        sqlx::query("SELECT pg_catalog.pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut pauses)
            .await
            .unwrap();
    }

    // The hold locks the subject's rows (row 1 is not one yet), then
    // stops before its insert.
    let placing = tokio::spawn(async move {
        holder
            .create_hold(HoldRequest::subject(S, "litigation").kind("user"))
            .await
    });
    wait_until(
        "the hold stopped before its insert",
        Duration::from_secs(20),
        async || waits(&db, "hold").await,
    )
    .await;

    // Row 1 becomes the subject's, committed.
    match becomes {
        Becomes::Updated => {
            exec(
                db.pool(),
                &format!("UPDATE app.accounts SET user_id = '{S}' WHERE id = 1"),
            )
            .await
        }
        Becomes::Inserted => {
            exec(
                db.pool(),
                &format!(
                    "DELETE FROM app.accounts WHERE id = 1;
                     INSERT INTO app.accounts VALUES (1, '{TENANT_A}', '2025-12-31', '{S}', '{X}')"
                ),
            )
            .await
        }
    }

    // The batch locks row 1, then stops: at the hold gate, or (without
    // one) just before it changes the row.
    let batch = tokio::spawn(async move {
        match path {
            Path::FusedSweep | Path::TwoStatementSweep | Path::ParallelSweep => {
                let result = batch
                    .sweep(SweepRequest::tenanted(TENANT_A, now()))
                    .await
                    .unwrap();
                assert_eq!(result.status, RunStatus::Succeeded, "{result:?}");
                let a = result.entity("Account").unwrap();
                (a.affected, a.held)
            }
            Path::Erasure => {
                let result = batch
                    .erase(ErasureRequest::tenanted(
                        TENANT_A,
                        ErasureScope::new(X).kind("user"),
                        now(),
                    ))
                    .await
                    .unwrap();
                assert_eq!(result.run.status, RunStatus::Succeeded, "{result:?}");
                let a = result.run.entity("Account").unwrap();
                (a.affected, a.held)
            }
            Path::GuardedDeletion => {
                let outcome = batch
                    .guarded_delete(
                        GuardedDeletion::new(Uuid::parse_str(ACCOUNT_ID).unwrap(), ["1"])
                            .tenant(TENANT_A),
                        |tx| {
                            Box::pin(async move {
                                let done = sqlx::query("DELETE FROM app.accounts WHERE id = 1")
                                    .execute(&mut *tx)
                                    .await?;
                                Ok(done.rows_affected())
                            })
                        },
                    )
                    .await
                    .unwrap();
                match outcome {
                    Guarded::Completed(n) => (n, 0),
                    Guarded::Protected { held } => (0, held.len() as u64),
                }
            }
        }
    });
    wait_until(
        "the batch stopped with row 1 locked",
        Duration::from_secs(20),
        async || {
            waits(&db, "batch").await
                && count(
                    db.pool(),
                    "SELECT count(*) FROM app.accounts WHERE id = 1 \
                     AND NOT EXISTS (SELECT 1 FROM app.accounts a WHERE a.id = 1 FOR KEY SHARE SKIP LOCKED)",
                )
                .await
                    == 1
        },
    )
    .await;

    // The hold commits, and its creation returns, while the batch is open.
    sqlx::query("SELECT pg_catalog.pg_advisory_unlock($1)")
        .bind(HOLD_PAUSE)
        .execute(&mut pauses)
        .await
        .unwrap();
    let hold = placing.await.unwrap().expect("the hold is placed");
    assert!(hold.active);

    sqlx::query("SELECT pg_catalog.pg_advisory_unlock($1)")
        .bind(ROW_PAUSE)
        .execute(&mut pauses)
        .await
        .unwrap();
    let reported = batch.await.unwrap();
    (db, reported)
}

/// Row 1 is there, the subject's, unchanged.
async fn assert_row_kept(db: &cohort_pgtemp::TestDatabase, path: Path, becomes: Becomes) {
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM app.accounts WHERE id = 1 AND user_id = '{S}'"),
        )
        .await,
        1,
        "{path:?}, {becomes:?}: the row that became the subject's while the hold was placed is kept"
    );
}

#[tokio::test]
async fn a_fused_sweep_batch_keeps_a_row_that_became_the_subjects_while_the_hold_was_placed() {
    for becomes in [Becomes::Updated, Becomes::Inserted] {
        let (db, (affected, held)) = race(Path::FusedSweep, becomes).await;
        assert_row_kept(&db, Path::FusedSweep, becomes).await;
        assert_eq!(held, 1, "{becomes:?}");
        assert_eq!(affected, 199, "{becomes:?}: every other row is purged");
    }
}

#[tokio::test]
async fn a_two_statement_sweep_batch_keeps_a_row_that_became_the_subjects_while_the_hold_was_placed(
) {
    for becomes in [Becomes::Updated, Becomes::Inserted] {
        let (db, (affected, held)) = race(Path::TwoStatementSweep, becomes).await;
        assert_row_kept(&db, Path::TwoStatementSweep, becomes).await;
        assert_eq!(held, 1, "{becomes:?}");
        assert_eq!(affected, 199, "{becomes:?}");
    }
}

#[tokio::test]
async fn parallel_lanes_keep_a_row_that_became_the_subjects_while_the_hold_was_placed() {
    let (db, (affected, held)) = race(Path::ParallelSweep, Becomes::Updated).await;
    assert_row_kept(&db, Path::ParallelSweep, Becomes::Updated).await;
    assert_eq!(held, 1);
    assert_eq!(affected, 199);
}

#[tokio::test]
async fn an_erasure_keeps_a_row_that_became_the_held_subjects_while_the_hold_was_placed() {
    for becomes in [Becomes::Updated, Becomes::Inserted] {
        let (db, (affected, held)) = race(Path::Erasure, becomes).await;
        assert_row_kept(&db, Path::Erasure, becomes).await;
        assert_eq!((affected, held), (0, 1), "{becomes:?}");
    }
}

#[tokio::test]
async fn a_guarded_deletion_is_refused_for_a_row_that_became_the_subjects_while_the_hold_was_placed(
) {
    let (db, (deleted, held)) = race(Path::GuardedDeletion, Becomes::Updated).await;
    assert_row_kept(&db, Path::GuardedDeletion, Becomes::Updated).await;
    assert_eq!((deleted, held), (0, 1));
}
