//! Holds on a subject (RS-020): one hold names a person, by kind, and
//! protects every row of every entity whose subject columns of that kind
//! (or of none) hold them, in every tenant or in one, rows written after
//! the hold included, from sweeps, erasure and guarded deletion, until it
//! is released or expires. Counted as held, and as held by a subject.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::guarded::{Guarded, GuardedDeletion};
use cohort::holds::{HoldFilter, HoldRequest, HoldTarget};
use cohort::model::AnonymiseMethod;
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, EntityDeclaration, ErrorKind, SweepRequest};
use sqlx::Row;
use std::collections::BTreeMap;

use support::*;
use uuid::Uuid;

/// The subject under hold and another person.
const S: &str = "dddddddd-0000-0000-0000-00000000000d";
const O: &str = "eeeeeeee-0000-0000-0000-00000000000e";
const ACCOUNT_ID: &str = "11111111-aaaa-4aaa-8aaa-111111111111";
const MESSAGE_ID: &str = "22222222-bbbb-4bbb-8bbb-222222222222";
const AUDIT_ID: &str = "33333333-cccc-4ccc-8ccc-333333333333";

/// `now()` is 2026-06-01; rules keep 30 days, so 2026-05-01 is past the
/// cutoff and 2026-05-31 is not. Accounts hold the subject as a uuid
/// (`user`); messages as a uuid sender (`user`) and a citext e-mail
/// (`email`); the tenantless audit log as text (no kind: it holds the
/// subject whatever its kind).
const TABLES: &str = r#"
CREATE EXTENSION IF NOT EXISTS citext;
CREATE SCHEMA app;
CREATE TABLE app.accounts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
    user_id uuid);
CREATE TABLE app.messages (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
    anonymised_at timestamptz, sender uuid, email citext, body text);
CREATE TABLE app.audit_log (id bigint PRIMARY KEY, created_at timestamptz, actor text);
INSERT INTO app.accounts VALUES
  (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-01', 'dddddddd-0000-0000-0000-00000000000d'),
  (2, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-01', 'eeeeeeee-0000-0000-0000-00000000000e'),
  (3, 'bbbbbbbb-0000-0000-0000-00000000000b', '2026-05-01', 'dddddddd-0000-0000-0000-00000000000d'),
  (4, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-31', 'dddddddd-0000-0000-0000-00000000000d');
INSERT INTO app.messages VALUES
  (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-01', NULL, 'dddddddd-0000-0000-0000-00000000000d', NULL, 'from S'),
  (2, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-01', NULL, 'eeeeeeee-0000-0000-0000-00000000000e', 'Dee@Example.com', 'to Dee'),
  (3, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-01', NULL, 'eeeeeeee-0000-0000-0000-00000000000e', NULL, 'from O');
INSERT INTO app.audit_log VALUES
  (1, '2026-05-01', 'dddddddd-0000-0000-0000-00000000000d'),
  (2, '2026-05-01', 'eeeeeeee-0000-0000-0000-00000000000e');
"#;

fn entities() -> Vec<EntityDeclaration> {
    vec![
        EntityDeclaration::new("Account", ACCOUNT_ID)
            .category("accounts")
            .anchor("created_at")
            .table("app.accounts")
            .subject("user_id", Some("user")),
        EntityDeclaration::new("Message", MESSAGE_ID)
            .category("messages")
            .anchor("created_at")
            .table("app.messages")
            .anonymise("body", AnonymiseMethod::Literal("[removed]".into()))
            .anonymise("email", AnonymiseMethod::Null)
            .subject("sender", Some("user"))
            .subject("email", Some("email")),
        EntityDeclaration::new("AuditEntry", AUDIT_ID)
            .category("audit")
            .anchor("created_at")
            .table("app.audit_log")
            .tenantless()
            .subject("actor", None),
    ]
}

async fn setup() -> (cohort_pgtemp::TestDatabase, Cohort) {
    let db = migrated_db().await;
    exec(db.pool(), TABLES).await;
    let rules = StaticRuleProvider::builder()
        .category("accounts", RetentionRule::new(days(30), Strategy::Purge))
        .category(
            "messages",
            RetentionRule::new(days(30), Strategy::Anonymise),
        )
        .category("audit", RetentionRule::new(days(30), Strategy::Purge))
        .build()
        .unwrap();
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules);
    for d in entities() {
        b = b.declaration(d);
    }
    let cohort = b.build().await.unwrap();
    (db, cohort)
}

/// Message ids whose body is still the original.
async fn messages_intact(pool: &sqlx::PgPool) -> Vec<i64> {
    ids(
        pool,
        "SELECT id FROM app.messages WHERE anonymised_at IS NULL ORDER BY id",
    )
    .await
}

/// (held_count, held_by_subject_count, affected_count) of the run's summary for an entity.
async fn summary(pool: &sqlx::PgPool, run: Uuid, entity: &str) -> (i64, i64, i64) {
    let r = sqlx::query(
        "SELECT held_count, held_by_subject_count, affected_count FROM public.sweep_run_entity_summary \
         WHERE run_id = $1 AND entity_type = $2",
    )
    .bind(run)
    .bind(entity)
    .fetch_one(pool)
    .await
    .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

#[tokio::test]
async fn a_subject_hold_protects_the_subjects_rows_in_every_entity_and_tenant_and_rows_written_later(
) {
    let (db, cohort) = setup().await;
    let pool = db.pool();
    // Without the hold a dry run would take every old row: the hold is what keeps them.
    let dry = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()).dry_run(true))
        .await
        .unwrap();
    assert_eq!(dry.entity("Account").unwrap().affected, 2);
    assert_eq!(dry.entity("Message").unwrap().affected, 3);

    let hold = cohort
        .create_hold(HoldRequest::subject(S, "Litigation - case 12").kind("user"))
        .await
        .unwrap();
    assert_eq!(hold.target, HoldTarget::Subject);
    assert_eq!(hold.subject.as_deref(), Some(S));
    assert_eq!(hold.subject_kind.as_deref(), Some("user"));
    assert_eq!(
        (hold.retention_entity_id, hold.record_id.as_deref()),
        (None, None)
    );
    assert!(hold.active);
    // A row of the subject written after the hold, already past the cutoff.
    exec(
        pool,
        &format!("INSERT INTO app.accounts VALUES (5, '{TENANT_A}', '2026-04-01', '{S}')"),
    )
    .await;

    let preview = cohort
        .preview(cohort::PreviewRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let a = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    for (name, affected, held) in [("Account", 1, 2), ("Message", 2, 1)] {
        let p = preview.entities.iter().find(|e| e.entity == name).unwrap();
        let e = a.entity(name).unwrap();
        assert_eq!(
            (p.affected, p.held, p.held_by_subject),
            (affected, held, held),
            "preview {name}"
        );
        assert_eq!(
            (e.affected, e.held, e.held_by_subject),
            (affected, held, held),
            "sweep {name}"
        );
        assert_eq!(
            summary(pool, a.run_id, name).await,
            (held as i64, held as i64, affected as i64),
            "ledger {name}"
        );
    }
    assert_eq!(
        ids(pool, "SELECT id FROM app.accounts ORDER BY id").await,
        [1, 3, 4, 5]
    );
    // The sender is the subject; the e-mail column is of another kind.
    assert_eq!(messages_intact(pool).await, [1]);

    // Another tenant's rows of the subject, and the tenantless audit log
    // (a column without a kind holds the subject whatever its kind).
    let b = cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(b.entity("Account").unwrap().held_by_subject, 1);
    let t = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    let audit = t.entity("AuditEntry").unwrap();
    assert_eq!(
        (audit.affected, audit.held, audit.held_by_subject),
        (1, 1, 1)
    );
    assert_eq!(ids(pool, "SELECT id FROM app.audit_log").await, [1]);
    assert_eq!(
        ids(pool, "SELECT id FROM app.accounts ORDER BY id").await,
        [1, 3, 4, 5]
    );
    assert!(cohort
        .is_held(Uuid::parse_str(ACCOUNT_ID).unwrap(), "5")
        .await
        .unwrap());

    // Released: the next sweep takes them.
    let released = cohort.release_hold(hold.hold_id).await.unwrap();
    assert!(!released.active);
    let after = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let acc = after.entity("Account").unwrap();
    assert_eq!((acc.affected, acc.held, acc.held_by_subject), (2, 0, 0));
    assert_eq!(
        ids(pool, "SELECT id FROM app.accounts ORDER BY id").await,
        [3, 4]
    );
    assert!(messages_intact(pool).await.is_empty());
}

#[tokio::test]
async fn a_kind_reaches_its_own_columns_and_a_tenant_hold_only_that_tenants_rows() {
    let (db, cohort) = setup().await;
    let pool = db.pool();
    // citext compares case-insensitively: any spelling of the address.
    cohort
        .create_hold(HoldRequest::subject("dee@EXAMPLE.com", "complaint").kind("email"))
        .await
        .unwrap();
    // The same person as a user, but only in tenant B.
    cohort
        .create_hold(
            // Any spelling of the uuid and of the tenant.
            HoldRequest::subject(S.to_uppercase(), "tenant B's case")
                .kind("user")
                .tenant(TENANT_B.to_uppercase()),
        )
        .await
        .unwrap();
    let a = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    // Message 2 holds the address; message 1's sender is held in tenant B only.
    assert_eq!(messages_intact(pool).await, [2]);
    assert_eq!(a.entity("Message").unwrap().held_by_subject, 1);
    assert_eq!(
        ids(pool, "SELECT id FROM app.accounts ORDER BY id").await,
        [3, 4]
    );
    cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(
        ids(pool, "SELECT id FROM app.accounts ORDER BY id").await,
        [3, 4]
    );
    // A tenant's hold does not reach the tenantless audit log.
    cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert!(ids(pool, "SELECT id FROM app.audit_log").await.is_empty());

    let listed = cohort
        .list_holds(&HoldFilter::all().tenant(TENANT_B))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].tenant_id.as_deref(),
        Some(TENANT_B),
        "canonical tenant"
    );
}

#[tokio::test]
async fn erasure_and_guarded_deletion_leave_the_subjects_rows_alone() {
    let (db, cohort) = setup().await;
    let pool = db.pool();
    cohort
        .create_hold(HoldRequest::subject(S, "regulator's inquiry").kind("user"))
        .await
        .unwrap();
    let erased = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new(S).kind("user"),
            now(),
        ))
        .await
        .unwrap();
    let acc = erased.entity("Account").unwrap();
    assert_eq!((acc.affected, acc.held, acc.held_by_subject), (0, 2, 2));
    let msg = erased.entity("Message").unwrap();
    assert_eq!((msg.affected, msg.held, msg.held_by_subject), (0, 1, 1));
    assert_eq!(summary(pool, erased.run_id, "Account").await, (2, 2, 0));
    assert_eq!(
        ids(pool, "SELECT id FROM app.accounts ORDER BY id").await,
        [1, 2, 3, 4]
    );
    assert_eq!(messages_intact(pool).await, [1, 2, 3]);

    // Guarded deletion: the subject's row is protected, another's goes.
    let account = Uuid::parse_str(ACCOUNT_ID).unwrap();
    let outcome = cohort
        .guarded_delete(
            GuardedDeletion::new(account, ["1", "2"]).tenant(TENANT_A),
            |tx| {
                Box::pin(async move {
                    sqlx::query("DELETE FROM app.accounts WHERE id = ANY('{1,2}')")
                        .execute(&mut *tx)
                        .await?;
                    Ok(())
                })
            },
        )
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Guarded::Protected {
            held: vec!["1".into()]
        }
    );
    let outcome = cohort
        .guarded_delete(
            GuardedDeletion::new(account, ["2"]).tenant(TENANT_A),
            |tx| {
                Box::pin(async move {
                    sqlx::query("DELETE FROM app.accounts WHERE id = 2")
                        .execute(&mut *tx)
                        .await?;
                    Ok(())
                })
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome, Guarded::Completed(()));
    assert_eq!(
        ids(pool, "SELECT id FROM app.accounts ORDER BY id").await,
        [1, 3, 4]
    );
}

#[tokio::test]
async fn a_subject_hold_that_would_protect_nothing_or_the_wrong_thing_is_refused() {
    let (db, cohort) = setup().await;
    let account = Uuid::parse_str(ACCOUNT_ID).unwrap();
    let cases: Vec<(HoldRequest, &str)> = vec![
        (HoldRequest::subject("  ", "r").kind("user"), "must not be empty"),
        (
            HoldRequest::subject(S, "r"),
            "subject columns declare kinds (\"email\", \"user\"): name the subject's kind (HoldRequest::kind",
        ),
        (
            HoldRequest::subject(S, "r").kind("phone"),
            "no subject column declares the kind \"phone\"",
        ),
        (
            HoldRequest::subject(S, "r").kind(" "),
            "a subject kind must not be empty",
        ),
        (
            HoldRequest::subject(S, "r").kind("user").tenant("not-a-uuid"),
            "tenant: \"not-a-uuid\" is not a valid uuid",
        ),
        (
            HoldRequest::new(account, "1", "r").tenant(TENANT_A).kind("user"),
            "a hold on a record takes none",
        ),
        (HoldRequest::subject(S, " ").kind("user"), "a hold needs a reason"),
    ];
    for (req, message) in cases {
        let err = cohort.create_hold(req).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains(message), "{err} / {message}");
        assert!(
            !err.to_string().contains(S),
            "the subject is never echoed: {err}"
        );
    }
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM public.retention_hold").await,
        0
    );
}

#[db_test(migrated)]
async fn without_kinds_a_subject_hold_needs_none_and_reaches_every_subject_column(
    db: TestDatabase,
) {
    exec(db.pool(), TABLES).await;
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(
            StaticRuleProvider::builder()
                .category("audit", RetentionRule::new(days(30), Strategy::Purge))
                .build()
                .unwrap(),
        )
        .declaration(entities().pop().unwrap())
        .build()
        .await
        .unwrap();
    let err = cohort
        .create_hold(HoldRequest::subject(S, "r").kind("user"))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no subject column declares a kind"),
        "{err}"
    );
    let err = cohort
        .create_hold(HoldRequest::subject(S, "r").tenant(TENANT_A))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("a subject hold takes no tenant"),
        "{err}"
    );
    cohort
        .create_hold(HoldRequest::subject(O, "r"))
        .await
        .unwrap();
    let run = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    let audit = run.entity("AuditEntry").unwrap();
    assert_eq!((audit.affected, audit.held_by_subject), (1, 1));
    assert_eq!(ids(db.pool(), "SELECT id FROM app.audit_log").await, [2]);
}

/// 300 subjects of tenant A, all past the cutoff: 5 accounts (purged) and
/// 3 messages (anonymised) each; subject `g` is the uuid ending in `g`.
const BULK: &str = r#"
INSERT INTO app.accounts
SELECT 1000 + g * 10 + r, 'aaaaaaaa-0000-0000-0000-00000000000a',
       timestamptz '2026-01-01' - make_interval(secs => g * 10 + r),
       ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid
FROM generate_series(1, 300) g, generate_series(1, 5) r;
INSERT INTO app.messages
SELECT 1000 + g * 10 + r, 'aaaaaaaa-0000-0000-0000-00000000000a',
       timestamptz '2026-01-01' - make_interval(secs => g * 10 + r), NULL,
       ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, NULL, 'bulk ' || g
FROM generate_series(1, 300) g, generate_series(1, 3) r;
"#;

fn bulk_subject(g: u32) -> String {
    format!("00000000-0000-4000-8000-{g:012}")
}

/// A Cohort over the fixture on its own pool (as another process would be).
async fn engine(db: &cohort_pgtemp::TestDatabase, batch: u32) -> Cohort {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect_with(db.connect_options())
        .await
        .unwrap();
    let rules = StaticRuleProvider::builder()
        .category("accounts", RetentionRule::new(days(30), Strategy::Purge))
        .category(
            "messages",
            RetentionRule::new(days(30), Strategy::Anonymise),
        )
        .category("audit", RetentionRule::new(days(30), Strategy::Purge))
        .build()
        .unwrap();
    let mut b = Cohort::builder(pool).config(batches_of(batch)).rules(rules);
    for d in entities() {
        b = b.declaration(d);
    }
    b.build().await.unwrap()
}

/// Every row of a subject, as JSON, in id order.
async fn subject_rows(pool: &sqlx::PgPool, subject: &str) -> String {
    sqlx::query_scalar(
        "SELECT coalesce((SELECT string_agg(row_to_json(a)::text, ',' ORDER BY id) FROM app.accounts a WHERE user_id = $1::uuid), '') \
         || '|' || coalesce((SELECT string_agg(row_to_json(m)::text, ',' ORDER BY id) FROM app.messages m WHERE sender = $1::uuid), '')",
    )
    .bind(subject)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Subject holds created one after another while two sweeps of the same
/// tenant run on other connections: whatever interleaving happens, every
/// row a subject had when its hold returned is never changed afterwards,
/// the sweeps' reported counts equal what committed, and a later sweep
/// finds nothing left to do but the held rows.
async fn race_subject_holds_against_sweeps(db: &cohort_pgtemp::TestDatabase) {
    exec(db.pool(), BULK).await;
    let (a, b, h) = (
        engine(db, 40).await,
        engine(db, 40).await,
        engine(db, 40).await,
    );
    let targets: Vec<String> = (1..=300).filter(|g| g % 5 == 0).map(bulk_subject).collect();
    let holder = async {
        let mut protected = BTreeMap::new();
        for subject in &targets {
            h.create_hold(HoldRequest::subject(subject.clone(), "race").kind("user"))
                .await
                .unwrap();
            // The subject's rows as they were when the hold took effect.
            protected.insert(subject.clone(), subject_rows(h.pool(), subject).await);
        }
        protected
    };
    let (protected, ra, rb) = tokio::join!(
        holder,
        a.sweep(SweepRequest::tenanted(TENANT_A, now())),
        b.sweep(SweepRequest::tenanted(TENANT_A, now()))
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(protected.len(), 60);
    let mut kept_rows = 0;
    for (subject, state) in &protected {
        assert_eq!(
            &subject_rows(db.pool(), subject).await,
            state,
            "subject {subject} changed after its hold was created"
        );
        kept_rows += state.matches("\"id\"").count();
    }
    // Some holds landed before the sweeps reached their subjects.
    assert!(kept_rows > 0);
    // Reported counts equal what committed (the fixture's own rows included).
    let purged = 1502 - count(db.pool(), "SELECT count(*) FROM app.accounts WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a' AND created_at < '2026-05-02'").await;
    let anonymised = count(
        db.pool(),
        "SELECT count(*) FROM app.messages WHERE anonymised_at IS NOT NULL",
    )
    .await;
    let reported =
        |name: &str| ra.entity(name).unwrap().affected + rb.entity(name).unwrap().affected;
    assert!(
        purged > 0 && anonymised > 0,
        "the sweeps did change unheld rows"
    );
    assert_eq!(reported("Account") as i64, purged);
    assert_eq!(reported("Message") as i64, anonymised);
    // A later sweep: every held subject's rows are still there and counted held.
    let after = a
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let (acc, msg) = (
        after.entity("Account").unwrap(),
        after.entity("Message").unwrap(),
    );
    assert_eq!((acc.affected, msg.affected), (0, 0));
    assert_eq!(acc.held, acc.held_by_subject);
    assert_eq!(msg.held, msg.held_by_subject);
    // Held: every row of a held subject the sweeps did not reach first.
    let subjects: Vec<String> = protected.keys().cloned().collect();
    let still: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM app.accounts WHERE user_id::text = ANY($1) AND created_at < '2026-05-02') \
              + (SELECT count(*) FROM app.messages WHERE sender::text = ANY($1) AND anonymised_at IS NULL)",
    )
    .bind(&subjects)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!((acc.held + msg.held) as i64, still);
    assert!(
        still > 0,
        "some holds landed before the sweeps reached their subjects"
    );
}

#[tokio::test]
async fn subject_hold_creation_racing_two_sweeps_never_loses_a_protected_row() {
    let (db, _) = setup().await;
    race_subject_holds_against_sweeps(&db).await;
}

#[tokio::test]
async fn subject_hold_races_are_safe_when_the_database_defaults_to_repeatable_read() {
    let (db, _) = setup().await;
    exec(
        db.pool(),
        &format!(
            "ALTER DATABASE \"{}\" SET default_transaction_isolation = 'repeatable read'",
            db.name()
        ),
    )
    .await;
    race_subject_holds_against_sweeps(&db).await;
}

/// The other order, step by step: a batch holds one of the subject's rows
/// (as a sweep or erasure batch does, `FOR UPDATE`) when the hold is asked
/// for. The hold waits for the batch; the batch's change commits; the hold
/// then protects every row the subject still has, and a later sweep and
/// erasure change none of them.
#[tokio::test]
async fn a_subject_hold_waits_for_a_batch_holding_one_of_its_rows() {
    let (db, cohort) = setup().await;
    let pool = db.pool();
    let mut batch = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM app.accounts WHERE id = 1 FOR UPDATE")
        .execute(&mut *batch)
        .await
        .unwrap();
    let create = tokio::spawn({
        let cohort = cohort.clone();
        async move {
            cohort
                .create_hold(HoldRequest::subject(S, "waits").kind("user"))
                .await
        }
    });
    wait_for_lock_wait(pool).await;
    assert!(!create.is_finished(), "the hold waits for the batch");
    sqlx::query("DELETE FROM app.accounts WHERE id = 1")
        .execute(&mut *batch)
        .await
        .unwrap();
    batch.commit().await.unwrap();
    let hold = create.await.unwrap().unwrap();
    assert!(hold.active);
    let before = subject_rows(pool, S).await;
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    // Account 4 is too young to count; message 1 is past the cutoff and held.
    assert_eq!(run.entity("Message").unwrap().held_by_subject, 1);
    cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new(S).kind("user"),
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(subject_rows(pool, S).await, before);
    assert_eq!(ids(pool, "SELECT id FROM app.accounts WHERE user_id = 'dddddddd-0000-0000-0000-00000000000d' ORDER BY id").await, [3, 4]);
}
