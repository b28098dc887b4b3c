//! Retention in stages (RS-018): a category declares an ordered list of
//! stages, each with its own strategy and period; a stage after the first
//! is measured from the marker the previous stage wrote or from the
//! entity's anchor. One run does every stage in order, each its own
//! summary; previews count each stage on the rows as they stand; the legal
//! minimum holds at every stage; erasure follows the last stage.

use crate::support;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::policy::PolicyFile;
use cohort::rules::{RetentionRule, Stage, Strategy};
use cohort::{Cohort, ErrorKind, PreviewRequest, SweepRequest};
use support::*;

/// `now()` is 2026-06-01. Tickets: soft delete 30 days after closing
/// (cutoff 2026-05-02), then purge 60 days after the soft delete (deleted
/// before 2026-04-02). Messages: anonymise after 30 days, purge a year
/// after creation (before 2025-06-01), whether or not anonymised.
const TABLES: &str = r#"
CREATE SCHEMA app;
CREATE TABLE app.tickets (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, closed_at timestamptz,
    is_deleted boolean NOT NULL DEFAULT false, deleted_at timestamptz, requester uuid, body text);
CREATE INDEX ON app.tickets (tenant_id, closed_at);
CREATE INDEX ON app.tickets (tenant_id, deleted_at);
CREATE INDEX ON app.tickets (requester);
CREATE TABLE app.messages (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
    anonymised_at timestamptz, body text);
CREATE INDEX ON app.messages (tenant_id, created_at);
INSERT INTO app.tickets VALUES
  (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-04-01', false, NULL, 'dddddddd-0000-0000-0000-00000000000d', 'closed, due for soft delete'),
  (2, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-20', false, NULL, 'dddddddd-0000-0000-0000-00000000000d', 'closed recently'),
  (3, 'aaaaaaaa-0000-0000-0000-00000000000a', '2025-01-01', true, '2026-03-01', 'eeeeeeee-0000-0000-0000-00000000000e', 'deleted 92 days ago'),
  (4, 'aaaaaaaa-0000-0000-0000-00000000000a', '2025-01-01', true, '2026-05-01', 'eeeeeeee-0000-0000-0000-00000000000e', 'deleted 31 days ago'),
  (5, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-25', false, '2026-02-01', 'eeeeeeee-0000-0000-0000-00000000000e', 'restored'),
  (6, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-02-01', true, '2026-03-01', 'eeeeeeee-0000-0000-0000-00000000000e', 'deleted 92 days ago, closed 4 months ago'),
  (7, 'bbbbbbbb-0000-0000-0000-00000000000b', '2025-01-01', true, '2026-05-10', 'eeeeeeee-0000-0000-0000-00000000000e', 'deleted 22 days ago');
INSERT INTO app.messages VALUES
  (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-04-01', NULL, 'recent'),
  (2, 'aaaaaaaa-0000-0000-0000-00000000000a', '2025-01-01', NULL, 'old'),
  (3, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-20', NULL, 'new');
"#;

const POLICY: &str = r#"
[[entity]]
name = "Ticket"
id = "3c1f0d4e-8a7b-4c2d-9e6f-0a1b2c3d4e5f"
table = "app.tickets"
category = "tickets"
anchor = "closed_at"
subjects = ["requester"]

[[entity]]
name = "Message"
id = "4d2a1e5f-9b8c-4d3e-8f70-1b2c3d4e5f60"
table = "app.messages"
category = "messages"
anchor = "created_at"
anonymise = { body = { literal = "[removed]" } }

[[category]]
name = "tickets"
strategy = "soft_delete"
period = "30d"

[[category.stage]]
strategy = "purge"
period = "60d"                # after deleted_at, the marker the soft delete wrote

[[category.override]]
tenant = "bbbbbbbb-0000-0000-0000-00000000000b"
period = "30d"
stage_periods = ["10d"]

[[category]]
name = "messages"
strategy = "anonymise"
period = "30d"

[[category.stage]]
strategy = "purge"
period = "1y"
after = "anchor"
"#;

async fn setup(policy: &str) -> (cohort_pgtemp::TestDatabase, Cohort) {
    let db = migrated_db().await;
    exec(db.pool(), TABLES).await;
    let mut policy = PolicyFile::parse(policy).unwrap();
    policy.config = test_config();
    let cohort = Cohort::builder(db.pool().clone())
        .policy(policy)
        .build()
        .await
        .unwrap();
    (db, cohort)
}

/// (stage, strategy, affected) of each of an entity's outcomes, in order.
fn stages(outcomes: &[cohort::EntityOutcome], entity: &str) -> Vec<(Option<u16>, Strategy, u64)> {
    outcomes
        .iter()
        .filter(|o| o.entity == entity)
        .map(|o| (o.stage, o.strategy, o.affected))
        .collect()
}

#[tokio::test]
async fn one_run_does_every_stage_in_order_each_its_own_summary() {
    let (db, cohort) = setup(POLICY).await;
    let pool = db.pool();
    let preview = cohort
        .preview(PreviewRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    // As the rows stand: ticket 1 is due for the soft delete; 3 and 6 were
    // soft-deleted more than 60 days ago (4 too recently, 5 was restored).
    // Message 2 is due for both stages; a preview does not assume the first ran.
    assert_eq!(
        stages(&preview.entities, "Ticket"),
        [
            (Some(1), Strategy::SoftDelete, 1),
            (Some(2), Strategy::Purge, 2)
        ]
    );
    assert_eq!(
        stages(&preview.entities, "Message"),
        [
            (Some(1), Strategy::Anonymise, 2),
            (Some(2), Strategy::Purge, 1)
        ]
    );
    let dry = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()).dry_run(true))
        .await
        .unwrap();
    assert_eq!(
        stages(&dry.entities, "Ticket"),
        stages(&preview.entities, "Ticket")
    );

    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(run.failures.is_empty(), "{:?}", run.failures);
    assert_eq!(
        stages(&run.entities, "Ticket"),
        [
            (Some(1), Strategy::SoftDelete, 1),
            (Some(2), Strategy::Purge, 2)
        ]
    );
    // The first stage ran first: message 2 was anonymised, then purged.
    assert_eq!(
        stages(&run.entities, "Message"),
        [
            (Some(1), Strategy::Anonymise, 2),
            (Some(2), Strategy::Purge, 1)
        ]
    );
    assert_eq!(
        ids(pool, "SELECT id FROM app.tickets ORDER BY id").await,
        [1, 2, 4, 5, 7],
        "3 and 6 purged; the restored 5 and the recently deleted 4 kept"
    );
    assert_eq!(
        ids(
            pool,
            "SELECT id FROM app.tickets WHERE is_deleted ORDER BY id"
        )
        .await,
        [1, 4, 7]
    );
    assert_eq!(
        ids(pool, "SELECT id FROM app.messages ORDER BY id").await,
        [1, 3]
    );
    assert_eq!(
        ids(
            pool,
            "SELECT id FROM app.messages WHERE anonymised_at IS NOT NULL"
        )
        .await,
        [1]
    );
    // The ledger: one summary per stage, with its position.
    let summaries: Vec<(String, Option<i16>, String, i64)> = sqlx::query_as(
        "SELECT entity_type, stage, strategy, affected_count FROM public.sweep_run_entity_summary \
         WHERE run_id = $1 ORDER BY summary_id",
    )
    .bind(run.run_id)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        summaries,
        [
            ("Ticket".into(), Some(1), "soft_delete".into(), 1),
            ("Ticket".into(), Some(2), "purge".into(), 2),
            ("Message".into(), Some(1), "anonymise".into(), 2),
            ("Message".into(), Some(2), "purge".into(), 1),
        ]
    );
    // History reads the stages back.
    let shown = cohort.show_run(run.run_id).await.unwrap();
    assert_eq!(
        stages(&shown.entities, "Ticket"),
        stages(&run.entities, "Ticket")
    );

    // The row the first stage just soft-deleted is not purged by the same
    // run: its deleted_at is today.
    let again = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(
        stages(&again.entities, "Ticket"),
        [
            (Some(1), Strategy::SoftDelete, 0),
            (Some(2), Strategy::Purge, 0)
        ]
    );
}

#[tokio::test]
async fn an_override_changes_a_later_stages_period() {
    let (db, cohort) = setup(POLICY).await;
    // Tenant B's tickets are purged 10 days after the soft delete: 7 was
    // deleted 22 days ago.
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    let purge = run
        .entities
        .iter()
        .find(|o| o.entity == "Ticket" && o.stage == Some(2))
        .unwrap();
    assert_eq!((purge.affected, purge.period), (1, days(10)));
    assert_eq!(
        ids(
            db.pool(),
            "SELECT id FROM app.tickets WHERE tenant_id = 'bbbbbbbb-0000-0000-0000-00000000000b'"
        )
        .await,
        Vec::<i64>::new()
    );
}

/// The legal minimum holds at every stage: a stage measured from the
/// soft-delete marker purges only rows whose own anchor is older than the
/// legal minimum, however long ago they were soft-deleted.
#[tokio::test]
async fn the_legal_minimum_holds_at_a_stage_measured_from_a_marker() {
    let policy = POLICY.replace(
        "name = \"tickets\"\nstrategy = \"soft_delete\"\nperiod = \"30d\"",
        "name = \"tickets\"\nstrategy = \"soft_delete\"\nperiod = \"30d\"\nlegal_min = \"365d\"",
    );
    assert!(policy.contains("legal_min = \"365d\""));
    let (db, cohort) = setup(&policy).await;
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    // Ticket 6 was soft-deleted 92 days ago but closed only 4 months ago:
    // the legal minimum (a year from closing) keeps it. Ticket 3 closed in
    // 2025-01 and goes. Ticket 1 (closed 2 months ago) is not soft-deleted:
    // the first stage's cutoff is the legal minimum's too.
    assert_eq!(
        stages(&run.entities, "Ticket"),
        [
            (Some(1), Strategy::SoftDelete, 0),
            (Some(2), Strategy::Purge, 1)
        ]
    );
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.tickets WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a' ORDER BY id").await,
        [1, 2, 4, 5, 6]
    );
    // And says so (RS-037): the purge stage counts ticket 6 as kept by
    // the legal minimum, in the result and in the ledger.
    let purge = run
        .entities
        .iter()
        .find(|o| o.entity == "Ticket" && o.stage == Some(2))
        .unwrap();
    assert_eq!(purge.kept_by_legal_min, 1);
    let stored: i64 = sqlx::query_scalar(
        "SELECT kept_by_legal_min_count FROM public.sweep_run_entity_summary WHERE run_id = $1 AND stage = 2",
    )
    .bind(run.run_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(stored, 1);
    // Without it, the same rows go: the floor is what kept ticket 6.
    let (db, cohort) = setup(POLICY).await;
    cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(!ids(db.pool(), "SELECT id FROM app.tickets")
        .await
        .contains(&6));
}

#[tokio::test]
async fn erasure_follows_the_last_stage() {
    let (db, cohort) = setup(POLICY).await;
    // The last stage purges: the requester's tickets are deleted outright,
    // without asking for erasure by soft delete.
    let erased = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new("dddddddd-0000-0000-0000-00000000000d"),
            now(),
        ))
        .await
        .unwrap();
    let t = erased.run.entity("Ticket").unwrap();
    assert_eq!((t.strategy, t.affected), (Strategy::Purge, 2));
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.tickets ORDER BY id").await,
        [3, 4, 5, 6, 7]
    );
    // Asked for the first stage, the other requester's tickets are soft
    // deleted (which must be allowed explicitly); a stage the category does
    // not have is refused before anything runs.
    let other = || ErasureScope::new("eeeeeeee-0000-0000-0000-00000000000e");
    let refused = cohort
        .erase(ErasureRequest::tenanted(TENANT_A, other().stage(3), now()))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidInput);
    assert!(refused.to_string().contains("has 2 stage(s)"), "{refused}");
    let erased = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            other().stage(1).allow_soft_delete(true),
            now(),
        ))
        .await
        .unwrap();
    let t = erased.run.entity("Ticket").unwrap();
    assert_eq!(
        (t.strategy, t.affected),
        (Strategy::SoftDelete, 1),
        "the restored 5"
    );
    assert_eq!(
        ids(
            db.pool(),
            "SELECT id FROM app.tickets WHERE NOT is_deleted ORDER BY id"
        )
        .await,
        Vec::<i64>::new()
    );
}

/// Stages that cannot follow each other are refused when the policy is
/// loaded or the handle is built, naming the stage; nothing runs.
#[tokio::test]
async fn stages_that_cannot_follow_are_refused() {
    let stage = |s: &str| {
        POLICY.replace(
            "[[category.stage]]\nstrategy = \"purge\"\nperiod = \"60d\"                # after deleted_at, the marker the soft delete wrote",
            s,
        )
    };
    for (policy, expected) in [
        (
            stage("[[category.stage]]\nstrategy = \"purge\"\nperiod = \"60d\"\n\n[[category.stage]]\nstrategy = \"anonymise\"\nperiod = \"1d\""),
            "stage 3: it follows a purge stage, after which no row is left",
        ),
        (
            stage("[[category.stage]]\nstrategy = \"exempt\"\nperiod = \"60d\""),
            "an exempt stage changes nothing",
        ),
        (
            stage("[[category.stage]]\nstrategy = \"soft_delete\"\nperiod = \"60d\""),
            "soft_delete is already a stage of this rule",
        ),
        (
            stage("[[category.stage]]\nstrategy = \"purge\"\nperiod = \"10d\"\nafter = \"anchor\""),
            "purge after 10d from the anchor would come due before the soft_delete stage (30d from the anchor) ran",
        ),
        (
            stage("[[category.stage]]\nstrategy = \"purge\"\nperiod = \"10d\"\nafter = \"closing\""),
            "after = \"closing\" is unknown",
        ),
        (
            POLICY.replace("stage_periods = [\"10d\"]", "stage_periods = [\"10d\", \"20d\"]"),
            "stage_periods lists 2 period(s), but the category has 1 stage(s) after its first",
        ),
    ] {
        let err = PolicyFile::parse(&policy).expect_err(expected);
        assert!(err.to_string().contains(expected), "{expected}: {err}");
    }
    // Purge after anonymise measured from the marker: `anonymised_at` must exist.
    let db = migrated_db().await;
    exec(db.pool(), TABLES).await;
    let mut policy = PolicyFile::parse(
        &POLICY
            .replace("period = \"1y\"\nafter = \"anchor\"", "period = \"1y\"")
            .replace(
                "name = \"tickets\"\nstrategy = \"soft_delete\"",
                "name = \"tickets\"\nstrategy = \"anonymise\"",
            ),
    )
    .unwrap();
    policy.config = test_config();
    let err = Cohort::builder(db.pool().clone())
        .policy(policy)
        .build()
        .await
        .expect_err("tickets have no anonymised_at");
    assert_eq!(err.kind(), ErrorKind::Validation);
    assert!(
        err.to_string().contains("has a purge stage measured from the anonymise stage's marker, but the anonymise stage writes no anonymised_at here"),
        "{err}"
    );
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.tickets").await,
        7
    );
}

/// The library builds the same rules: `RetentionRule::then`.
#[test]
fn rules_in_code_take_stages_in_order() {
    let rule = RetentionRule::new(days(30), Strategy::SoftDelete)
        .then(Stage::after_previous(Strategy::Anonymise, days(10)))
        .unwrap()
        .then(Stage::after_anchor(Strategy::Purge, days(400)))
        .unwrap();
    assert_eq!(rule.later_stages().len(), 2);
    assert_eq!(rule.final_stage().strategy(), Strategy::Purge);
    assert_eq!(rule.stage(2).unwrap().period(), days(10));
    let caps = cohort::rules::CategoryCapabilities::of_rule(&rule);
    assert!(caps.allows_marker_stage(Strategy::Anonymise, Strategy::SoftDelete));
    assert!(!caps.allows_marker_stage(Strategy::Purge, Strategy::Anonymise));
    let err = RetentionRule::new(days(30), Strategy::Purge)
        .then(Stage::after_anchor(Strategy::Anonymise, days(60)))
        .unwrap_err();
    assert!(
        err.to_string().contains("after which no row is left"),
        "{err}"
    );
}

/// A stage measured from a marker finds its rows by that marker: without
/// an index starting with (tenant, marker), validation advises one.
#[tokio::test]
async fn a_marker_stage_without_an_index_gets_advice() {
    let (db, cohort) = setup(POLICY).await;
    let advice = |warnings: &[String]| {
        warnings
            .iter()
            .any(|w| w.contains("Ticket: no index starts with (tenant_id, deleted_at)"))
    };
    assert!(!advice(&cohort.ready().await.unwrap().warnings));
    exec(db.pool(), "DROP INDEX app.tickets_tenant_id_deleted_at_idx").await;
    let mut policy = PolicyFile::parse(POLICY).unwrap();
    policy.config = test_config();
    let again = Cohort::builder(db.pool().clone())
        .policy(policy)
        .build()
        .await
        .unwrap();
    let warnings = again.ready().await.unwrap().warnings.clone();
    assert!(advice(&warnings), "{warnings:?}");
}

/// The database clock now.
async fn db_now(pool: &sqlx::PgPool) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("SELECT now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// One clock for a run's decisions and its marks: the first stage marks
/// the rows it changes with the run's `now`, so a later stage measured
/// from that marker never takes them in the same run, however far `now`
/// is from the database clock. Two ways it went wrong when markers read
/// the database clock: a run dated 61 days ahead (allowed explicitly)
/// soft-deleted and purged the same tickets; a run 50 seconds ahead (the
/// tolerance, no flag) did the same for stages of `0d`.
#[tokio::test]
async fn a_row_the_first_stage_marks_is_not_taken_by_a_later_stage_of_the_same_run() {
    // 61 days ahead, explicitly allowed: "soft delete, then purge 60 days
    // later" must stay two steps.
    let (db, cohort) = setup(POLICY).await;
    let ahead = db_now(db.pool()).await + chrono::Duration::days(61);
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, ahead).allow_future_now(true))
        .await
        .unwrap();
    // Tickets 1, 2 and 5 are soft-deleted now; 3, 4 and 6 were deleted
    // long before and are purged.
    assert_eq!(
        stages(&run.entities, "Ticket"),
        [
            (Some(1), Strategy::SoftDelete, 3),
            (Some(2), Strategy::Purge, 3)
        ]
    );
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.tickets WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a' ORDER BY id").await,
        [1, 2, 5]
    );
    let marks: Vec<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT deleted_at FROM app.tickets WHERE id IN (1, 2, 5) ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(marks, [ahead, ahead, ahead], "marked with the run's now");
    let anonymised: Vec<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT anonymised_at FROM app.messages WHERE anonymised_at IS NOT NULL",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(
        !anonymised.is_empty() && anonymised.iter().all(|a| *a == ahead),
        "{anonymised:?}"
    );

    // 50 seconds ahead (within the tolerance, no flag), stages of 0d.
    let zero = POLICY
        .replace(
            "name = \"tickets\"\nstrategy = \"soft_delete\"\nperiod = \"30d\"",
            "name = \"tickets\"\nstrategy = \"soft_delete\"\nperiod = \"0d\"",
        )
        .replace(
            "strategy = \"purge\"\nperiod = \"60d\"",
            "strategy = \"purge\"\nperiod = \"0d\"",
        );
    assert!(zero.contains("period = \"0d\"                # after deleted_at"));
    let (db, cohort) = setup(&zero).await;
    let ahead = db_now(db.pool()).await + chrono::Duration::seconds(50);
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, ahead))
        .await
        .unwrap();
    assert_eq!(
        stages(&run.entities, "Ticket"),
        [
            (Some(1), Strategy::SoftDelete, 3),
            (Some(2), Strategy::Purge, 3)
        ]
    );
    assert_eq!(
        ids(db.pool(), "SELECT id FROM app.tickets WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a' AND is_deleted ORDER BY id").await,
        [1, 2, 5],
        "soft-deleted by stage 1 and kept by stage 2 of the same run"
    );
    // The next run takes them.
    let later = cohort
        .sweep(
            SweepRequest::tenanted(TENANT_A, ahead + chrono::Duration::seconds(1))
                .allow_future_now(true),
        )
        .await
        .unwrap();
    assert_eq!(
        stages(&later.entities, "Ticket"),
        [
            (Some(1), Strategy::SoftDelete, 0),
            (Some(2), Strategy::Purge, 3)
        ]
    );
}
