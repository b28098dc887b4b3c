//! The `archive` strategy (RS-019): rows past the cutoff are copied into
//! the entity's archive table and deleted from the source by one statement
//! of the batch transaction, stamped with `archived_at` and the run id,
//! optionally anonymised on the way; held rows and rows still referenced
//! stay; the archive table is checked against the catalog at startup; an
//! erasure deletes the subject's rows and reaches the archived copies
//! through the archive's own entity.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::holds::HoldRequest;
use cohort::model::AnonymiseMethod;
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, EntityDeclaration, ErrorKind, SweepRequest};
use sqlx::Row;
use uuid::Uuid;

use support::*;

const CONTACT_ID: &str = "44444444-aaaa-4aaa-8aaa-444444444444";
const ARCHIVE_ID: &str = "55555555-bbbb-4bbb-8bbb-555555555555";
const S: &str = "dddddddd-0000-0000-0000-00000000000d";
const O: &str = "eeeeeeee-0000-0000-0000-00000000000e";

/// `now()` is 2026-06-01 and contacts keep 30 days: rows of April are
/// due, rows of 2026-05-31 are not. The archive keeps every column of the
/// source (its phone wider), plus `archived_at` and `run_id`.
const TABLES: &str = r#"
CREATE SCHEMA app;
CREATE SCHEMA vault;
CREATE TABLE app.contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
    user_id uuid, email text, phone varchar(20), note text);
CREATE INDEX ON app.contacts (user_id);
CREATE TABLE app.calls (id bigint PRIMARY KEY, contact_id bigint REFERENCES app.contacts (id));
CREATE TABLE vault.contacts_archive (id bigint PRIMARY KEY, tenant_id uuid NOT NULL,
    created_at timestamptz, user_id uuid, email text, phone varchar(40), note text,
    archived_at timestamptz NOT NULL, run_id uuid NOT NULL);
CREATE INDEX ON vault.contacts_archive (user_id);
-- An archive whose key is an identity column (the copy keeps the source's
-- id), with a column its own identity fills and one it computes.
CREATE TABLE vault.contacts_scrubbed (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entry bigint GENERATED ALWAYS AS IDENTITY NOT NULL, tenant_id uuid NOT NULL,
    created_at timestamptz, user_id uuid, email text, phone varchar(20), note text,
    email_length int GENERATED ALWAYS AS (length(email)) STORED,
    archived_at timestamptz NOT NULL, run_id uuid NOT NULL);
INSERT INTO app.contacts VALUES
  (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-04-01', 'dddddddd-0000-0000-0000-00000000000d', 'dee@example.com', '+44 1', 'one'),
  (2, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-04-01', 'eeeeeeee-0000-0000-0000-00000000000e', 'ed@example.com', '+44 2', 'two'),
  (3, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-04-02', 'eeeeeeee-0000-0000-0000-00000000000e', 'ed@example.com', '+44 3', 'three'),
  (4, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-04-03', 'eeeeeeee-0000-0000-0000-00000000000e', 'ed@example.com', '+44 4', 'four'),
  (5, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-04-04', 'eeeeeeee-0000-0000-0000-00000000000e', 'ed@example.com', '+44 5', 'five'),
  (6, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-31', 'eeeeeeee-0000-0000-0000-00000000000e', 'ed@example.com', '+44 6', 'new'),
  (7, 'bbbbbbbb-0000-0000-0000-00000000000b', '2026-04-01', 'eeeeeeee-0000-0000-0000-00000000000e', 'ed@example.com', '+44 7', 'other tenant');
INSERT INTO app.calls VALUES (1, 5);
"#;

fn contact() -> EntityDeclaration {
    EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("app.contacts")
        .subject("user_id", Some("user"))
        .anonymise("email", AnonymiseMethod::Hash)
        .anonymise("phone", AnonymiseMethod::Null)
        .anonymise("note", AnonymiseMethod::Literal("[archived]".into()))
        .audit(cohort::rules::AuditDetail::PerRow)
        .archive_to("vault.contacts_archive")
}

fn archive_entity() -> EntityDeclaration {
    archive_entity_of_kind(Some("user"))
}

/// The archive's own entity, its `user_id` declared with `kind`.
fn archive_entity_of_kind(kind: Option<&str>) -> EntityDeclaration {
    EntityDeclaration::new("ContactArchive", ARCHIVE_ID)
        .category("contact-archive")
        .anchor("archived_at")
        .table("vault.contacts_archive")
        .subject("user_id", kind)
}

fn rules() -> StaticRuleProvider {
    StaticRuleProvider::builder()
        .category("contacts", RetentionRule::new(days(30), Strategy::Archive))
        .category(
            "contact-archive",
            RetentionRule::new(days(3650), Strategy::Purge),
        )
        .build()
        .unwrap()
}

async fn build(
    db: &cohort_pgtemp::TestDatabase,
    entities: Vec<EntityDeclaration>,
    rules: StaticRuleProvider,
) -> cohort::Result<Cohort> {
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules);
    for d in entities {
        b = b.declaration(d);
    }
    b.build().await
}

async fn setup(entities: Vec<EntityDeclaration>) -> (cohort_pgtemp::TestDatabase, Cohort) {
    let db = migrated_db().await;
    exec(db.pool(), TABLES).await;
    let cohort = build(&db, entities, rules()).await.unwrap();
    (db, cohort)
}

#[tokio::test]
async fn archive_moves_due_rows_with_their_audit_and_keeps_held_and_referenced_rows() {
    let (db, cohort) = setup(vec![contact(), archive_entity()]).await;
    let pool = db.pool();
    let before = table_digest(pool, "app.contacts").await;
    let dry = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()).dry_run(true))
        .await
        .unwrap();
    let d = dry.entity("Contact").unwrap();
    assert_eq!(
        (d.strategy, d.affected, d.skipped),
        (Strategy::Archive, 4, 1)
    );
    assert_eq!(
        table_digest(pool, "app.contacts").await,
        before,
        "a dry run moves nothing"
    );
    assert_eq!(
        count(pool, "SELECT count(*) FROM vault.contacts_archive").await,
        0
    );

    // A hold on record 2, and one on the person S (record 1).
    let entity = Uuid::parse_str(CONTACT_ID).unwrap();
    cohort
        .create_hold(HoldRequest::new(entity, "2", "complaint").tenant(TENANT_A))
        .await
        .unwrap();
    cohort
        .create_hold(HoldRequest::subject(S, "litigation").kind("user"))
        .await
        .unwrap();
    let preview = cohort
        .preview(cohort::PreviewRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let p = preview
        .entities
        .iter()
        .find(|e| e.entity == "Contact")
        .unwrap();
    assert_eq!((p.affected, p.held, p.skipped), (2, 2, 1));

    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let e = run.entity("Contact").unwrap();
    assert_eq!(
        (e.strategy, e.affected, e.held, e.held_by_subject, e.skipped),
        (Strategy::Archive, 2, 2, 1, 1)
    );
    // Held (1, 2), referenced (5), not due (6) and the other tenant's (7) stay.
    assert_eq!(
        ids(pool, "SELECT id FROM app.contacts ORDER BY id").await,
        [1, 2, 5, 6, 7]
    );
    // The moved rows are in the archive, whole, stamped with this run.
    let archived = sqlx::query(
        "SELECT id, tenant_id::text, created_at = '2026-04-02'::timestamptz + (id - 3) * interval '1 day', \
                user_id::text, email, phone, note, run_id, archived_at IS NOT NULL \
         FROM vault.contacts_archive ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(archived.len(), 2);
    for (row, (id, phone, note)) in archived
        .iter()
        .zip([(3, "+44 3", "three"), (4, "+44 4", "four")])
    {
        assert_eq!(row.get::<i64, _>(0), id);
        assert_eq!(row.get::<String, _>(1), TENANT_A);
        assert!(row.get::<bool, _>(2), "created_at kept");
        assert_eq!(row.get::<String, _>(3), O);
        assert_eq!(row.get::<String, _>(4), "ed@example.com");
        assert_eq!(row.get::<String, _>(5), phone);
        assert_eq!(row.get::<String, _>(6), note);
        assert_eq!(row.get::<Uuid, _>(7), run.run_id);
        assert!(row.get::<bool, _>(8));
    }
    // The ledger: one archive summary, a row detail per moved row.
    let (status, _, _, summaries) = ledger(pool, run.run_id).await;
    assert_eq!(status, "succeeded");
    let contact = summaries.iter().find(|s| s.0 == "Contact").unwrap();
    assert_eq!(contact.1, "archive");
    assert_eq!((contact.2, contact.3, contact.4), (2, 2, 1));
    let details: Vec<(String, String)> = sqlx::query_as(
        "SELECT record_id, action FROM public.sweep_run_row_detail WHERE run_id = $1 ORDER BY record_id",
    )
    .bind(run.run_id)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        details,
        [
            ("3".into(), "archive".into()),
            ("4".into(), "archive".into())
        ]
    );
    // The archive is an entity of its own; its copies are years from due.
    assert_eq!(run.entity("ContactArchive").unwrap().affected, 0);

    // A second run finds nothing more to move.
    let again = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(again.entity("Contact").unwrap().affected, 0);
    assert_eq!(
        count(pool, "SELECT count(*) FROM vault.contacts_archive").await,
        2
    );
}

#[tokio::test]
async fn anonymise_on_archive_copies_the_shape_but_not_the_person() {
    let archive = archive_entity().table("vault.contacts_scrubbed");
    let contact = contact()
        .archive_to("vault.contacts_scrubbed")
        .archive_columns([
            "id",
            "tenant_id",
            "created_at",
            "user_id",
            "email",
            "phone",
            "note",
        ])
        .anonymise_on_archive();
    let (db, cohort) = setup(vec![contact, archive]).await;
    let pool = db.pool();
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(run.entity("Contact").unwrap().affected, 4);
    let rows = sqlx::query(
        "SELECT id, user_id::text, email, phone, note, run_id, entry, email_length FROM vault.contacts_scrubbed ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let moved: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(moved, [1, 2, 3, 4]);
    for r in &rows {
        let original = if r.get::<i64, _>(0) == 1 {
            "dee@example.com"
        } else {
            "ed@example.com"
        };
        assert_eq!(
            r.get::<String, _>(2),
            test_hmac_hex(original),
            "hashed in Rust"
        );
        assert_eq!(r.get::<Option<String>, _>(3), None, "nulled");
        assert_eq!(r.get::<String, _>(4), "[archived]", "literal");
        assert_eq!(r.get::<Uuid, _>(5), run.run_id);
        assert!(r.get::<i64, _>(6) > 0, "filled by the archive's identity");
        assert_eq!(r.get::<i32, _>(7), 64, "computed from the hashed e-mail");
    }
    // The subject column is not anonymised: the subject stays findable.
    assert_eq!(rows[0].get::<String, _>(1), S);
    assert_eq!(
        ids(pool, "SELECT id FROM app.contacts ORDER BY id").await,
        [5, 6, 7]
    );
}

#[tokio::test]
async fn a_failing_copy_deletes_nothing() {
    let (db, cohort) = setup(vec![contact(), archive_entity()]).await;
    let pool = db.pool();
    // The archive already holds id 4 (primary key): the batch's insert fails.
    exec(
        pool,
        &format!(
            "INSERT INTO vault.contacts_archive VALUES (4, '{TENANT_A}', now(), NULL, NULL, NULL, 'x', now(), gen_random_uuid())"
        ),
    )
    .await;
    let before = table_digest(pool, "app.contacts").await;
    let result = cohort.sweep(SweepRequest::tenanted(TENANT_A, now())).await;
    let failed = match result {
        Ok(run) => run.failures.iter().any(|f| f.entity == "Contact"),
        Err(_) => true,
    };
    assert!(failed, "the duplicate key fails the batch");
    assert_eq!(
        table_digest(pool, "app.contacts").await,
        before,
        "no row deleted without its copy"
    );
    assert_eq!(
        count(pool, "SELECT count(*) FROM vault.contacts_archive").await,
        1
    );
    assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM public.sweep_run_row_detail WHERE action = 'archive'"
        )
        .await,
        0
    );
}

#[tokio::test]
async fn erasure_deletes_the_subjects_rows_and_their_archived_copies() {
    let (db, cohort) = setup(vec![contact(), archive_entity()]).await;
    let pool = db.pool();
    cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    // O's rows 2, 3 and 4 are archived (1 is S's and 5 referenced, moved
    // too unless held: nothing is held here).
    assert_eq!(
        ids(pool, "SELECT id FROM vault.contacts_archive ORDER BY id").await,
        [1, 2, 3, 4]
    );
    let erased = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new(O).kind("user"),
            now(),
        ))
        .await
        .unwrap();
    let c = erased.run.entity("Contact").unwrap();
    assert_eq!(
        c.strategy,
        Strategy::Purge,
        "an erasure deletes, never copies"
    );
    assert_eq!(c.affected, 1, "row 6 (5 is still referenced)");
    assert_eq!(erased.run.entity("ContactArchive").unwrap().affected, 3);
    assert_eq!(
        ids(pool, "SELECT id FROM vault.contacts_archive ORDER BY id").await,
        [1],
        "only the other person's copy is left"
    );
    assert_eq!(
        ids(pool, "SELECT id FROM app.contacts ORDER BY id").await,
        [5, 7]
    );
}

/// Each broken archive set-up is refused at startup with a message that
/// names the problem, and nothing is changed.
#[db_test(migrated)]
async fn a_broken_archive_is_refused_at_startup(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    exec(
        db.pool(),
        "CREATE TABLE vault.no_stamps (id bigint, tenant_id uuid, created_at timestamptz, user_id uuid);
         CREATE TABLE vault.narrow (id bigint, tenant_id uuid, created_at timestamptz, user_id uuid,
             email text, phone varchar(10), note text, archived_at timestamptz, run_id uuid);
         CREATE TABLE vault.wrong_types (id text, tenant_id uuid, created_at timestamptz, user_id uuid,
             archived_at date, run_id text);
         CREATE TABLE vault.computed (id bigint, tenant_id uuid, created_at timestamptz, user_id uuid,
             note text GENERATED ALWAYS AS ('archived') STORED, archived_at timestamptz, run_id uuid);
         CREATE TABLE vault.demanding (id bigint, tenant_id uuid, created_at timestamptz, user_id uuid,
             archived_at timestamptz, run_id uuid, reviewer text NOT NULL);",
    )
    .await;
    let before = table_digest(db.pool(), "app.contacts").await;
    let subset = ["id", "tenant_id", "created_at", "user_id"];
    let cases: Vec<(Vec<EntityDeclaration>, StaticRuleProvider, &str)> = vec![
        (
            vec![contact().archive_to("vault.missing"), archive_entity()],
            rules(),
            "archive table vault.missing does not exist",
        ),
        (
            vec![
                contact()
                    .archive_to("vault.no_stamps")
                    .archive_columns(subset),
                archive_entity(),
            ],
            rules(),
            "has no \"archived_at\" column",
        ),
        (
            vec![contact().archive_to("vault.narrow"), archive_entity()],
            rules(),
            "archive column \"phone\" is character varying(10) in vault.narrow",
        ),
        (
            vec![
                contact()
                    .archive_to("vault.wrong_types")
                    .archive_columns(subset),
                archive_entity(),
            ],
            rules(),
            "archive column \"run_id\" of vault.wrong_types is text; it must be uuid",
        ),
        (
            vec![
                contact()
                    .archive_to("vault.demanding")
                    .archive_columns(subset),
                archive_entity(),
            ],
            rules(),
            "NOT NULL column \"reviewer\" without a default",
        ),
        (
            vec![
                contact().archive_to("vault.computed").archive_columns([
                    "id",
                    "tenant_id",
                    "created_at",
                    "user_id",
                    "note",
                ]),
                archive_entity(),
            ],
            rules(),
            "archive column \"note\" is a generated column of vault.computed",
        ),
        (
            vec![
                contact().archive_columns(["tenant_id", "created_at"]),
                archive_entity(),
            ],
            rules(),
            "leave out the record key \"id\"",
        ),
        (
            vec![contact()],
            rules(),
            "keeps the subject column \"user_id\"",
        ),
        (
            vec![contact().archive_to("app.contacts")],
            rules(),
            "the archive table is the entity's own table",
        ),
        (
            vec![EntityDeclaration::new("Contact", CONTACT_ID)
                .category("contacts")
                .anchor("created_at")
                .table("app.contacts")],
            rules(),
            "may archive, but the entity names no archive table",
        ),
        (
            vec![contact(), archive_entity()],
            StaticRuleProvider::builder()
                .category("contacts", RetentionRule::new(days(30), Strategy::Purge))
                .category(
                    "contact-archive",
                    RetentionRule::new(days(30), Strategy::Purge),
                )
                .build()
                .unwrap(),
            "never archives",
        ),
        (
            vec![contact(), archive_entity().archive_to("app.contacts")],
            StaticRuleProvider::builder()
                .category("contacts", RetentionRule::new(days(30), Strategy::Archive))
                .category(
                    "contact-archive",
                    RetentionRule::new(days(30), Strategy::Archive),
                )
                .build()
                .unwrap(),
            "archives must not form a cycle",
        ),
    ];
    for (entities, rules, expected) in cases {
        let err = build(&db, entities, rules).await.expect_err(expected);
        assert_eq!(err.kind(), ErrorKind::Validation, "{expected}: {err}");
        assert!(err.to_string().contains(expected), "{expected}: {err}");
    }
    assert_eq!(table_digest(db.pool(), "app.contacts").await, before);
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM vault.contacts_archive").await,
        0
    );
}

/// The connected role needs INSERT on the archive table besides DELETE on
/// the source, and UPDATE on the source (a batch locks its rows `FOR
/// UPDATE`, which PostgreSQL allows only with UPDATE): the grants check
/// names each missing one, and with them granted the role archives.
#[db_test(migrated)]
async fn archiving_needs_insert_on_the_archive_table(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    let role = format!("archiver_{}", &db.name()[db.name().len() - 12..]);
    exec(
        db.pool(),
        &format!(
            "CREATE ROLE {role} LOGIN PASSWORD 'pw' NOSUPERUSER;
             GRANT USAGE ON SCHEMA app, vault, public TO {role};
             GRANT SELECT, DELETE ON app.contacts TO {role};
             GRANT SELECT ON app.calls TO {role};
             GRANT SELECT, UPDATE, DELETE ON vault.contacts_archive TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};"
        ),
    )
    .await;
    let pool = pool_as(&db, &role, "pw", 3).await;
    let cohort = Cohort::builder(pool)
        .config(test_config())
        .rules(rules())
        .declaration(contact().anonymise_on_archive())
        .declaration(archive_entity())
        .build()
        .await
        .unwrap();
    let err = cohort
        .check_grants(&[cohort::services::Access::Runs])
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(
            "GRANT INSERT ON vault.contacts_archive is missing (needed by archive of Contact"
        ),
        "{text}"
    );
    assert!(
        text.contains("GRANT UPDATE ON app.contacts is missing (needed by row locks of Contact"),
        "{text}"
    );
    assert!(!text.contains("DELETE"), "{text}");
    // Without UPDATE the check is right: the server refuses the row locks.
    let refused = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(refused.failures.len(), 1, "{:?}", refused.failures);
    assert!(refused.failures[0].error.contains("42501"));
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.contacts").await,
        7
    );
    exec(
        db.pool(),
        &format!("GRANT INSERT ON vault.contacts_archive TO {role}; GRANT UPDATE ON app.contacts TO {role}"),
    )
    .await;
    cohort
        .check_grants(&[cohort::services::Access::Runs])
        .await
        .unwrap();
    let run = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(run.failures.is_empty(), "{:?}", run.failures);
    assert_eq!(run.entity("Contact").unwrap().affected, 4);
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM vault.contacts_archive").await,
        4
    );
}

/// An engine on its own pool (separate connections, as separate processes
/// would have), archiving in batches of 50.
async fn archiving_engine(db: &cohort_pgtemp::TestDatabase) -> Cohort {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect_with(db.connect_options())
        .await
        .unwrap();
    let mut b = Cohort::builder(pool).config(batches_of(50)).rules(rules());
    for d in [contact(), archive_entity()] {
        b = b.declaration(d);
    }
    b.build().await.unwrap()
}

/// Holds created while two archiving sweeps run on other connections: a
/// row whose hold was created is never moved afterwards, every row is in
/// exactly one of the two tables, and the reported counts, the copies and
/// the ledger agree.
async fn race_holds_against_archiving(db: &cohort_pgtemp::TestDatabase) {
    exec(
        db.pool(),
        &format!(
            "INSERT INTO app.contacts (id, tenant_id, created_at, user_id, email, phone, note)
             SELECT 1000 + g, '{TENANT_A}', timestamptz '2026-03-01' - make_interval(secs => g),
                    gen_random_uuid(), 'bulk@example.com', '+1', 'bulk ' || g
             FROM generate_series(1, 1500) g"
        ),
    )
    .await;
    let total = count(db.pool(), "SELECT count(*) FROM app.contacts").await;
    let mut targets: Vec<i64> = (1..=1500)
        .filter(|g| g % 5 == 0)
        .map(|g| 1000 + g)
        .collect();
    // Spread the holds over the sweeps' whole course.
    targets.sort_by_key(|id| id.to_string().chars().rev().collect::<String>());
    let (a, b, h) = (
        archiving_engine(db).await,
        archiving_engine(db).await,
        archiving_engine(db).await,
    );
    let entity = Uuid::parse_str(CONTACT_ID).unwrap();
    let holder = async {
        let mut protected = Vec::new();
        let mut gone = 0;
        for id in &targets {
            let req = HoldRequest::new(entity, id.to_string(), "race").tenant(TENANT_A);
            match h.create_hold(req).await {
                Ok(_) => protected.push(*id),
                Err(cohort::Error::NotFound(msg)) if msg.contains("does not exist") => gone += 1,
                Err(e) => panic!("hold creation failed: {e}"),
            }
        }
        (protected, gone)
    };
    let ((protected, gone), ra, rb) = tokio::join!(
        holder,
        a.sweep(SweepRequest::tenanted(TENANT_A, now())),
        b.sweep(SweepRequest::tenanted(TENANT_A, now()))
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(
        !protected.is_empty(),
        "some holds landed before their row moved"
    );
    assert_eq!(protected.len() + gone, targets.len());
    let kept = ids(
        db.pool(),
        &format!(
            "SELECT id FROM app.contacts WHERE id = ANY('{{{}}}'::int8[]) ORDER BY id",
            protected
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
    )
    .await;
    let mut expected = protected.clone();
    expected.sort_unstable();
    assert_eq!(kept, expected, "a row moved after its hold was created");
    let archived = count(db.pool(), "SELECT count(*) FROM vault.contacts_archive").await;
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.contacts").await + archived,
        total,
        "every row is in exactly one table"
    );
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM vault.contacts_archive a JOIN app.contacts c USING (id)"
        )
        .await,
        0
    );
    let reported = ra.entity("Contact").unwrap().affected + rb.entity("Contact").unwrap().affected;
    assert_eq!(
        reported as i64, archived,
        "reported counts equal the copies"
    );
    let ledger: i64 = sqlx::query_scalar(
        "SELECT sum(affected_count)::int8 FROM public.sweep_run_entity_summary WHERE strategy = 'archive'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(ledger, archived);
    assert_eq!(
        count(
            db.pool(),
            &format!(
                "SELECT count(*) FROM vault.contacts_archive WHERE run_id NOT IN ('{}', '{}')",
                ra.run_id, rb.run_id
            )
        )
        .await,
        0,
        "each copy names one of the two runs"
    );
    let after = a
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let c = after.entity("Contact").unwrap();
    // Only the held rows and the referenced one are left past the cutoff.
    assert_eq!((c.affected, c.skipped), (0, 1));
    assert_eq!(c.held as usize, protected.len());
}

#[tokio::test]
async fn hold_creation_racing_two_archiving_sweeps_never_moves_a_protected_row() {
    let (db, _) = setup(vec![contact(), archive_entity()]).await;
    race_holds_against_archiving(&db).await;
}

#[tokio::test]
async fn archiving_races_are_safe_when_the_database_defaults_to_repeatable_read() {
    let (db, _) = setup(vec![contact(), archive_entity()]).await;
    exec(
        db.pool(),
        &format!(
            "ALTER DATABASE \"{}\" SET default_transaction_isolation = 'repeatable read'",
            db.name()
        ),
    )
    .await;
    race_holds_against_archiving(&db).await;
}

/// A trigger on the archive table that swallows one copy (returns NULL)
/// or changes its key, created after startup (validation refuses it at
/// startup: see the next test). The batch's verdict finds the copies
/// differ from the rows it deleted and the batch fails whole: nothing is
/// deleted, nothing copied, nothing audited, on every form of the archive
/// statement (one statement or two, per-row audit or counts). With the
/// verdict replaced by one that passes everything, the same batch
/// deletes row 3 without its copy: the test reaches the hazard.
#[tokio::test]
async fn a_copy_the_archive_table_drops_or_rewrites_fails_the_batch_and_deletes_nothing() {
    let hooks = [
        (
            "drops",
            "IF NEW.id = 3 THEN RETURN NULL; END IF; RETURN NEW;",
        ),
        (
            "rewrites",
            "IF NEW.id = 3 THEN NEW.id := 1003; END IF; RETURN NEW;",
        ),
    ];
    for verdict in [false, true] {
        for (hook, body) in hooks {
            for one_statement in [true, false] {
                for audit in [
                    cohort::rules::AuditDetail::PerRow,
                    cohort::rules::AuditDetail::Summary,
                ] {
                    let case = format!(
                        "{hook}, one statement {one_statement}, {audit:?}, verdict {verdict}"
                    );
                    let db = migrated_db().await;
                    exec(db.pool(), TABLES).await;
                    if one_statement {
                        // Nothing references contacts: the batch is fused.
                        exec(db.pool(), "DROP TABLE app.calls").await;
                    }
                    let cohort =
                        build(&db, vec![contact().audit(audit), archive_entity()], rules())
                            .await
                            .unwrap();
                    exec(
                        db.pool(),
                        &format!(
                            "CREATE FUNCTION vault.hook() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {body} END $$;
                             CREATE TRIGGER hook BEFORE INSERT ON vault.contacts_archive
                                 FOR EACH ROW EXECUTE FUNCTION vault.hook();"
                        ),
                    )
                    .await;
                    if !verdict {
                        exec(
                            db.pool(),
                            "CREATE OR REPLACE FUNCTION public.retention_archive_check(moved bigint, copied bigint, unmatched bigint)
                             RETURNS boolean LANGUAGE sql VOLATILE AS 'SELECT true'",
                        )
                        .await;
                    }
                    let before = table_digest(db.pool(), "app.contacts").await;
                    let run = cohort
                        .sweep(SweepRequest::tenanted(TENANT_A, now()))
                        .await
                        .unwrap();
                    let archived = count(
                        db.pool(),
                        "SELECT count(*) FROM vault.contacts_archive WHERE id = 3",
                    )
                    .await;
                    if verdict {
                        let failure = run
                            .failures
                            .iter()
                            .find(|f| f.entity == "Contact")
                            .unwrap_or_else(|| panic!("{case}: the batch fails: {run:?}"));
                        assert!(
                            failure.error.contains("code=archive_copy_mismatch"),
                            "{case}: {}",
                            failure.error
                        );
                        assert_eq!(
                            table_digest(db.pool(), "app.contacts").await,
                            before,
                            "{case}: nothing is deleted"
                        );
                        assert_eq!(
                            count(db.pool(), "SELECT count(*) FROM vault.contacts_archive").await,
                            0,
                            "{case}: nothing is copied"
                        );
                        assert_eq!(
                            count(
                                db.pool(),
                                "SELECT count(*) FROM public.sweep_run_row_detail"
                            )
                            .await,
                            0,
                            "{case}: nothing is audited"
                        );
                        assert_eq!(run.entity("Contact").unwrap().affected, 0, "{case}");
                    } else {
                        assert_eq!(
                            count(db.pool(), "SELECT count(*) FROM app.contacts WHERE id = 3")
                                .await,
                            0,
                            "{case}: without the verdict row 3 is deleted"
                        );
                        assert_eq!(archived, 0, "{case}: without its copy");
                    }
                }
            }
        }
    }
}

/// Validation refuses an archive table whose INSERT can be rewritten or
/// swallowed: an INSERT rule, a `BEFORE INSERT` row trigger (on the table
/// or on one of its partitions), naming each. An AFTER trigger and a
/// statement-level trigger are accepted.
#[db_test(migrated)]
async fn an_archive_table_whose_insert_can_be_rewritten_is_refused(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    exec(
        db.pool(),
        "CREATE FUNCTION vault.hook() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
         CREATE TABLE vault.ruled (LIKE vault.contacts_archive INCLUDING ALL);
         CREATE RULE swallow AS ON INSERT TO vault.ruled DO INSTEAD NOTHING;
         CREATE TABLE vault.triggered (LIKE vault.contacts_archive INCLUDING ALL);
         CREATE TRIGGER dedupe BEFORE INSERT ON vault.triggered FOR EACH ROW EXECUTE FUNCTION vault.hook();
         CREATE TABLE vault.split (LIKE vault.contacts_archive) PARTITION BY RANGE (archived_at);
         CREATE TABLE vault.split_2026 PARTITION OF vault.split FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
         CREATE TRIGGER route BEFORE INSERT ON vault.split_2026 FOR EACH ROW EXECUTE FUNCTION vault.hook();
         CREATE TABLE vault.after_only (LIKE vault.contacts_archive INCLUDING ALL);
         CREATE TRIGGER noted AFTER INSERT ON vault.after_only FOR EACH ROW EXECUTE FUNCTION vault.hook();
         CREATE TRIGGER counted BEFORE INSERT ON vault.after_only FOR EACH STATEMENT EXECUTE FUNCTION vault.hook();",
    )
    .await;
    let archived_to =
        |table: &str| vec![contact().archive_to(table), archive_entity().table(table)];
    for (table, expected) in [
        ("vault.ruled", "has the INSERT rule \"swallow\""),
        (
            "vault.triggered",
            "has the BEFORE INSERT row trigger \"dedupe\" on vault.triggered",
        ),
        (
            "vault.split",
            "has the BEFORE INSERT row trigger \"route\" on vault.split_2026",
        ),
    ] {
        let err = build(&db, archived_to(table), rules())
            .await
            .expect_err(expected);
        assert_eq!(err.kind(), ErrorKind::Validation, "{table}: {err}");
        assert!(err.to_string().contains(expected), "{table}: {err}");
    }
    build(&db, archived_to("vault.after_only"), rules())
        .await
        .expect("AFTER and statement-level triggers change no copy");
}

/// An archive column must hold every value of its source column exactly:
/// a narrower numeric, timestamp, time or varbit modifier would round or
/// cut values silently, another bit length or interval modifier would
/// change or refuse them. Each is refused, naming the column; wider
/// modifiers and unconstrained columns are accepted.
#[db_test(migrated)]
async fn an_archive_column_narrower_than_its_source_is_refused(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA app; CREATE SCHEMA vault;
         CREATE TABLE app.readings (id bigint PRIMARY KEY, tenant_id uuid NOT NULL,
             created_at timestamptz(3), amount numeric(8,2), at_time time, span interval day to second(3),
             flags bit(4), bits varbit(8), taken timestamp(6));",
    )
    .await;
    let archive = |overrides: &[(&str, &str)]| {
        let mut columns = [
            ("created_at", "timestamptz(3)"),
            ("amount", "numeric(8,2)"),
            ("at_time", "time"),
            ("span", "interval day to second(3)"),
            ("flags", "bit(4)"),
            ("bits", "varbit(8)"),
            ("taken", "timestamp(6)"),
        ];
        for (c, t) in overrides {
            columns.iter_mut().find(|(n, _)| n == c).unwrap().1 = t;
        }
        columns
            .iter()
            .map(|(c, t)| format!("{c} {t}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // (archive table, its columns that differ from the source's, the
    // refusal expected or none).
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], Option<&'a str>);
    let cases: &[Case] = &[
        (
            "v_amount",
            &[("amount", "numeric(6,0)")],
            Some("\"amount\" is numeric(6,0)"),
        ),
        (
            "v_scale",
            &[("amount", "numeric(12,1)")],
            Some("\"amount\" is numeric(12,1)"),
        ),
        (
            "v_time",
            &[("at_time", "time(0)")],
            Some("\"at_time\" is time(0) without time zone"),
        ),
        (
            "v_stamp",
            &[("created_at", "timestamptz(0)")],
            Some("\"created_at\" is timestamp(0) with time zone"),
        ),
        (
            "v_span",
            &[("span", "interval(0)")],
            Some("\"span\" is interval(0)"),
        ),
        (
            "v_flags",
            &[("flags", "bit(8)")],
            Some("\"flags\" is bit(8)"),
        ),
        (
            "v_bits",
            &[("bits", "varbit(4)")],
            Some("\"bits\" is bit varying(4)"),
        ),
        (
            "v_unbounded_source",
            &[("taken", "timestamp(3)")],
            Some("\"taken\" is timestamp(3)"),
        ),
        (
            "v_wider",
            &[
                ("amount", "numeric(12,3)"),
                ("created_at", "timestamptz"),
                ("at_time", "time(6)"),
                ("span", "interval"),
                ("bits", "varbit"),
            ],
            None,
        ),
        ("v_unconstrained", &[("amount", "numeric")], None),
    ];
    for (name, overrides, expected) in cases {
        exec(
            db.pool(),
            &format!(
                "CREATE TABLE vault.{name} (id bigint, tenant_id uuid NOT NULL, {}, \
                 archived_at timestamptz NOT NULL, run_id uuid NOT NULL)",
                archive(overrides)
            ),
        )
        .await;
        let reading = EntityDeclaration::new("Reading", CONTACT_ID)
            .category("contacts")
            .anchor("created_at")
            .table("app.readings")
            .archive_to(format!("vault.{name}"));
        let built = build(&db, vec![reading], rules()).await;
        match expected {
            Some(expected) => {
                let err = built.expect_err(expected);
                assert_eq!(err.kind(), ErrorKind::Validation, "{name}: {err}");
                assert!(err.to_string().contains(expected), "{name}: {err}");
                assert!(
                    err.to_string()
                        .contains("a narrower one rounds or cuts values silently"),
                    "{name}: {err}"
                );
            }
            None => {
                built.unwrap_or_else(|e| panic!("{name} holds every value: {e}"));
            }
        }
    }
}

/// An erasure of the source's subject kind must reach the archived
/// copies: an archive entity declaring the same column with another kind
/// is refused; the same kind, or none, is accepted.
#[db_test(migrated)]
async fn an_archive_whose_subject_column_has_another_kind_is_refused(db: TestDatabase) {
    exec(db.pool(), TABLES).await;
    let err = build(
        &db,
        vec![contact(), archive_entity_of_kind(Some("customer"))],
        rules(),
    )
    .await
    .expect_err("another kind");
    assert_eq!(err.kind(), ErrorKind::Validation, "{err}");
    assert!(
        err.to_string().contains(
            "declares the subject column \"user_id\" as kind \"customer\", but app.contacts declares it as kind \"user\""
        ),
        "{err}"
    );
    for kind in [Some("user"), None] {
        build(&db, vec![contact(), archive_entity_of_kind(kind)], rules())
            .await
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
    }
}
