//! The data-loss classes found by hostile testing, each proved end to end on
//! a real server: one tenant identity everywhere, defence in depth in every
//! mutation, holds that follow the record, cascades followed to the end,
//! validation that refuses what would fail (or harm) every run, and
//! erasure that says what it did not do.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL

use crate::support;

use cohort::config::HashKey;
use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::holds::HoldRequest;
use cohort::policy::PolicyFile;
use cohort::{Cohort, Error, PreviewRequest, SweepRequest};
use cohort_pgtemp::TestDatabase;
use support::*;

/// A Cohort from policy text (with the test hash key), validated.
async fn from_policy(db: &TestDatabase, policy: &str) -> Result<Cohort, Error> {
    let mut p = PolicyFile::parse(policy)?;
    if p.config.hash_key.is_none() {
        p.config.hash_key = Some(HashKey::new(TEST_HASH_KEY));
    }
    Cohort::builder(db.pool().clone()).policy(p).build().await
}

fn problems_text(err: &Error) -> String {
    match err {
        Error::Validation(p) => p.to_string(),
        other => panic!("expected validation problems, got {other}"),
    }
}

async fn expect_refused(db: &TestDatabase, policy: &str, fragments: &[&str]) {
    let err = from_policy(db, policy).await.unwrap_err();
    let text = problems_text(&err);
    for f in fragments {
        assert!(text.contains(f), "missing {f:?} in:\n{text}");
    }
    assert_eq!(ledger_rows(db.pool(), "public").await, 0);
}

const UUID_TENANT: &str = "33333333-3333-4333-a333-333333333333";
const OTHER_TENANT: &str = "44444444-4444-4444-8444-444444444444";

/// Notes with uuid tenants; tenant 3333 is EU, where an override keeps
/// notes ten years and a legal minimum of six years applies to contacts.
const UUID_TENANT_POLICY: &str = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"
subjects = ["user_id"]

[[category]]
name = "notes"
strategy = "purge"
period = "30d"

[[category.override]]
jurisdiction = "EU"
period = "3650d"
legal_min = "2190d"

[[tenant]]
id = "33333333-3333-4333-a333-333333333333"
jurisdiction = "EU"
"#;

const UUID_TENANT_TABLES: &str = "CREATE SCHEMA app;
    CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL,
        created_at timestamptz, user_id uuid, body text);
    CREATE INDEX ON app.notes (tenant_id, created_at);
    INSERT INTO app.notes VALUES
      (1, '33333333-3333-4333-a333-333333333333', '2026-06-01T00:00:00Z'::timestamptz - interval '100 days',
       'dddddddd-0000-4000-8000-00000000000d', 'eu, 100 days'),
      (2, '44444444-4444-4444-8444-444444444444', '2026-06-01T00:00:00Z'::timestamptz - interval '100 days',
       'dddddddd-0000-4000-8000-00000000000d', 'other, 100 days');";

/// A.1: every spelling of a uuid tenant resolves the same jurisdiction and
/// overrides, on the library path (the CLI path is in the CLI tests).
#[tokio::test]
async fn every_spelling_of_a_uuid_tenant_gets_its_jurisdiction_and_overrides() {
    let db = migrated_db().await;
    exec(db.pool(), UUID_TENANT_TABLES).await;
    let cohort = from_policy(&db, UUID_TENANT_POLICY).await.unwrap();
    let spellings = [
        "3333333333334333a333333333333333",
        "3333333333334333A333333333333333",
        "{33333333-3333-4333-a333-333333333333}",
        "urn:uuid:33333333-3333-4333-a333-333333333333",
        "33333333-3333-4333-A333-333333333333",
    ];
    for spelling in spellings {
        let preview = cohort
            .preview(PreviewRequest::tenanted(spelling, now()))
            .await
            .unwrap();
        assert_eq!(preview.tenant.as_deref(), Some(UUID_TENANT), "{spelling}");
        let note = &preview.entities[0];
        assert_eq!(
            (note.period.to_string(), note.affected),
            ("3650d".to_string(), 0),
            "{spelling}: the EU override applies"
        );
        let swept = cohort
            .sweep(SweepRequest::tenanted(spelling, now()))
            .await
            .unwrap();
        assert_eq!(swept.tenant.as_deref(), Some(UUID_TENANT));
        assert_eq!(swept.affected(), 0, "{spelling}");
        // Erasure with the same spelling honours the EU legal minimum.
        let erased = cohort
            .erase(ErasureRequest::tenanted(
                spelling,
                ErasureScope::new("dddddddd-0000-4000-8000-00000000000d"),
                now(),
            ))
            .await
            .unwrap();
        let note = &erased.entities[0];
        assert_eq!(
            (note.affected, note.kept_by_legal_min),
            (0, 1),
            "{spelling}"
        );
    }
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.notes").await, 2);
    // The ledger records the canonical tenant only.
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM public.sweep_run WHERE tenant_id <> '33333333-3333-4333-a333-333333333333'"
        )
        .await,
        0
    );
    // A request whose jurisdiction contradicts the directory is refused.
    let err = cohort
        .sweep(SweepRequest::tenanted(UUID_TENANT, now()).jurisdiction("US"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("listed with jurisdiction")),
        "{err}"
    );
    // The other tenant has no jurisdiction: the 30-day default purges its row.
    let other = cohort
        .sweep(SweepRequest::tenanted(OTHER_TENANT.to_uppercase(), now()))
        .await
        .unwrap();
    assert_eq!(other.affected(), 1);
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.notes").await, 1);
}

const TEXT_TENANT_POLICY: &str = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"

[[category]]
name = "notes"
strategy = "purge"
period = "30d"

[[category.override]]
jurisdiction = "US"
period = "3650d"

[[category.override]]
tenant = "AAAAAAAA-AAAA-4AAA-8AAA-AAAAAAAAAAAA"
period = "3650d"

[[tenant]]
id = "acme"
jurisdiction = "EU"

[[tenant]]
id = "ACME"
jurisdiction = "US"
"#;

/// A.1 and A.2: text tenants are exact — `acme` and `ACME` are two tenants,
/// and a uuid-looking text tenant is never lower-cased.
#[tokio::test]
async fn text_tenants_are_compared_exactly_never_case_folded() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id text NOT NULL, created_at timestamptz);
         CREATE INDEX ON app.notes (tenant_id, created_at);
         INSERT INTO app.notes VALUES
           (1, 'acme', '2026-06-01T00:00:00Z'::timestamptz - interval '100 days'),
           (2, 'ACME', '2026-06-01T00:00:00Z'::timestamptz - interval '100 days'),
           (3, 'AAAAAAAA-AAAA-4AAA-8AAA-AAAAAAAAAAAA', '2026-06-01T00:00:00Z'::timestamptz - interval '100 days'),
           (4, 'AAAAAAAA-AAAA-4AAA-8AAA-AAAAAAAAAAAA', '2026-06-01T00:00:00Z'::timestamptz - interval '200 days');",
    )
    .await;
    let cohort = from_policy(&db, TEXT_TENANT_POLICY).await.unwrap();

    // ACME is US (ten years): nothing of ACME's is purged, nothing of acme's either.
    let r = cohort
        .sweep(SweepRequest::tenanted("ACME", now()))
        .await
        .unwrap();
    assert_eq!((r.tenant.as_deref(), r.affected()), (Some("ACME"), 0));
    // The uuid-looking text tenant keeps its override, as written.
    let r = cohort
        .sweep(SweepRequest::tenanted(
            "AAAAAAAA-AAAA-4AAA-8AAA-AAAAAAAAAAAA",
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(r.entities[0].period.to_string(), "3650d");
    assert_eq!(r.affected(), 0);
    // Its lower-cased spelling is another tenant, with no rows.
    let r = cohort
        .sweep(SweepRequest::tenanted(
            "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa",
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(r.affected(), 0);
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.notes").await, 4);
    // acme is EU (30 days): only acme's row goes.
    let r = cohort
        .sweep(SweepRequest::tenanted("acme", now()))
        .await
        .unwrap();
    assert_eq!(r.affected(), 1);
    assert_eq!(
        labels(db.pool(), "SELECT tenant_id || ':' || id FROM app.notes").await,
        vec![
            "AAAAAAAA-AAAA-4AAA-8AAA-AAAAAAAAAAAA:3",
            "AAAAAAAA-AAAA-4AAA-8AAA-AAAAAAAAAAAA:4",
            "ACME:2"
        ]
    );
    // Leading white space is part of a text tenant: " acme" is not acme.
    let r = cohort
        .sweep(SweepRequest::tenanted(" ACME", now()))
        .await
        .unwrap();
    assert_eq!((r.tenant.as_deref(), r.affected()), (Some(" ACME"), 0));
}

/// A.3: citext tenants and keys compare case-insensitively in SQL, and
/// overrides, holds and guarded deletion agree.
#[tokio::test]
async fn citext_tenants_and_keys_compare_case_insensitively() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE EXTENSION citext;
         CREATE SCHEMA app;
         CREATE TABLE app.notes (id citext PRIMARY KEY, tenant_id citext NOT NULL, created_at timestamptz);
         CREATE INDEX ON app.notes (tenant_id, created_at);
         INSERT INTO app.notes VALUES
           ('Note-1', 'Acme', '2026-06-01T00:00:00Z'::timestamptz - interval '100 days'),
           ('Note-2', 'Acme', '2026-06-01T00:00:00Z'::timestamptz - interval '100 days'),
           ('Note-3', 'Other', '2026-06-01T00:00:00Z'::timestamptz - interval '100 days');",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"

[[category]]
name = "notes"
strategy = "purge"
period = "30d"

[[category.override]]
tenant = "OTHER"
period = "3650d"
"#;
    let cohort = from_policy(&db, policy).await.unwrap();
    let note = uuid::Uuid::parse_str(NOTE_ID).unwrap();
    // A hold placed with other spellings of the key and the tenant.
    let hold = cohort
        .create_hold(HoldRequest::new(note, "NOTE-1", "litigation").tenant("ACME"))
        .await
        .unwrap();
    assert_eq!(
        hold.record_id.as_deref(),
        Some("Note-1"),
        "the row's own key is stored"
    );
    let preview = cohort
        .preview(PreviewRequest::tenanted("aCmE", now()))
        .await
        .unwrap();
    assert_eq!(
        (preview.entities[0].affected, preview.entities[0].held),
        (1, 1)
    );
    let r = cohort
        .sweep(SweepRequest::tenanted("ACME", now()))
        .await
        .unwrap();
    assert_eq!((r.tenant.as_deref(), r.affected()), (Some("acme"), 1));
    assert_eq!(r.entities[0].held, 1);
    // The override written OTHER matches the tenant stored as Other.
    let r = cohort
        .sweep(SweepRequest::tenanted("other", now()))
        .await
        .unwrap();
    assert_eq!(r.entities[0].period.to_string(), "3650d");
    assert_eq!(r.affected(), 0);
    assert_eq!(
        labels(db.pool(), "SELECT id::text FROM app.notes").await,
        vec!["Note-1", "Note-3"]
    );
    // Guarded deletion sees the hold through another spelling of the key.
    let guarded = cohort
        .guarded_delete(
            cohort::guarded::GuardedDeletion::new(note, ["note-1"]).tenant("acme"),
            |_tx| Box::pin(async move { Ok(()) }),
        )
        .await
        .unwrap();
    assert!(matches!(
        guarded,
        cohort::guarded::Guarded::Protected { .. }
    ));
}

/// A: tenant columns that give one spelling different meanings are refused.
#[tokio::test]
async fn tenant_columns_of_different_types_are_refused() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz);
         CREATE TABLE app.tickets (id bigint PRIMARY KEY, tenant_id text NOT NULL, created_at timestamptz);",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"

[[entity]]
name = "Ticket"
id = "3c1f0d4e-8a7b-4c2d-9e6f-0a1b2c3d4e5f"
table = "app.tickets"
category = "notes"
anchor = "created_at"

[[category]]
name = "notes"
strategy = "purge"
period = "30d"

[[category.override]]
tenant = "not-a-uuid"
period = "90d"

[[tenant]]
id = "also-not-a-uuid"
"#;
    expect_refused(
        &db,
        policy,
        &[
            "tenant columns disagree on type (Note: uuid, Ticket: text)",
            "override for tenant \"not-a-uuid\", which is not a valid uuid tenant id",
        ],
    )
    .await;
    // With one type, a [[tenant]] id that cannot be a tenant is refused too.
    exec(
        db.pool(),
        "ALTER TABLE app.tickets ALTER COLUMN tenant_id TYPE uuid USING NULL",
    )
    .await;
    let policy = policy.replace(
        "tenant = \"not-a-uuid\"",
        "tenant = \"33333333-3333-4333-a333-333333333333\"",
    );
    expect_refused(
        &db,
        &policy,
        &["[[tenant]] id \"also-not-a-uuid\" is not a valid tenant id"],
    )
    .await;
}

const NOTE_POLICY: &str = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
"#;

/// B.4(a): a record key whose only unique index is invalid (a failed
/// CREATE UNIQUE INDEX CONCURRENTLY) or deferrable is refused.
#[tokio::test]
async fn record_keys_need_a_valid_immediate_unique_index() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.notes (id bigint NOT NULL, tenant_id uuid NOT NULL, created_at timestamptz);
         INSERT INTO app.notes VALUES (1, 'aaaaaaaa-0000-0000-0000-00000000000a', now()),
                                      (1, 'bbbbbbbb-0000-0000-0000-00000000000b', now());",
    )
    .await;
    // Fails on the duplicates and leaves an invalid index behind.
    let failed = sqlx::raw_sql("CREATE UNIQUE INDEX CONCURRENTLY notes_id_key ON app.notes (id)")
        .execute(db.pool())
        .await;
    assert!(failed.is_err());
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM pg_index WHERE indexrelid = 'app.notes_id_key'::regclass AND NOT indisvalid"
        )
        .await,
        1
    );
    expect_refused(
        &db,
        NOTE_POLICY,
        &["the unique index on record key column \"id\" is not valid, ready and immediate"],
    )
    .await;
    exec(
        db.pool(),
        "DROP INDEX app.notes_id_key; DELETE FROM app.notes WHERE tenant_id = 'bbbbbbbb-0000-0000-0000-00000000000b';
         ALTER TABLE app.notes ADD CONSTRAINT notes_pk PRIMARY KEY (id) DEFERRABLE INITIALLY DEFERRED;",
    )
    .await;
    expect_refused(&db, NOTE_POLICY, &["is not valid, ready and immediate"]).await;
    exec(
        db.pool(),
        "ALTER TABLE app.notes DROP CONSTRAINT notes_pk; ALTER TABLE app.notes ADD PRIMARY KEY (id);",
    )
    .await;
    from_policy(&db, NOTE_POLICY).await.unwrap();
}

/// B.4(b): the mutation re-checks tenant, cutoff and "not done" itself, so a
/// key that stops being unique after validation (the key index dropped or
/// rebuilt under a live handle) cannot carry the delete to other rows.
#[tokio::test]
async fn a_mutation_reaches_only_rows_the_candidate_query_would_choose() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.notes (id bigint NOT NULL, tenant_id uuid NOT NULL, created_at timestamptz,
             anonymised_at timestamptz, is_deleted boolean NOT NULL DEFAULT false, body text);
         ALTER TABLE app.notes ADD CONSTRAINT notes_pk PRIMARY KEY (id);",
    )
    .await;
    let policy = |strategy: &str| {
        format!(
            r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"
anonymise = {{ body = "null" }}

[[category]]
name = "notes"
strategy = "{strategy}"
period = "30d"
"#
        )
    };
    for strategy in ["purge", "soft_delete", "anonymise"] {
        exec(
            db.pool(),
            "ALTER TABLE app.notes DROP CONSTRAINT IF EXISTS notes_pk; TRUNCATE app.notes;
             ALTER TABLE app.notes ADD CONSTRAINT notes_pk PRIMARY KEY (id);",
        )
        .await;
        let cohort = from_policy(&db, &policy(strategy)).await.unwrap();
        // After validation: the key index goes, and key 1 appears three times.
        exec(
            db.pool(),
            "ALTER TABLE app.notes DROP CONSTRAINT notes_pk;
             INSERT INTO app.notes (id, tenant_id, created_at, body) VALUES
               (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-06-01T00:00:00Z'::timestamptz - interval '100 days', 'old a'),
               (1, 'bbbbbbbb-0000-0000-0000-00000000000b', '2026-06-01T00:00:00Z'::timestamptz - interval '100 days', 'old b'),
               (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-06-01T00:00:00Z'::timestamptz - interval '1 day', 'young a');",
        )
        .await;
        let r = cohort
            .sweep(SweepRequest::tenanted(TENANT_A, now()))
            .await
            .unwrap();
        assert_eq!(r.affected(), 1, "{strategy}");
        let untouched = labels(
            db.pool(),
            "SELECT body FROM app.notes WHERE NOT is_deleted AND anonymised_at IS NULL",
        )
        .await;
        assert_eq!(untouched, vec!["old b", "young a"], "{strategy}");
    }
}

/// C.5: a hold protects its record wherever the row moves: counted held
/// and left alone by the new tenant's sweep and erasure.
#[tokio::test]
async fn a_hold_follows_its_record_into_another_tenant() {
    let db = engine_db().await;
    let cohort = engine_cohort(&db).await;
    let note: uuid::Uuid = sqlx::query_scalar(
        "SELECT id FROM app.notes WHERE body = 'aaaaaaaa-0000-0000-0000-00000000000a:45d'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let contact: i64 = sqlx::query_scalar(
        "SELECT id FROM app.contacts WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a' AND full_name = 'Person 45d'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let note_entity = uuid::Uuid::parse_str(NOTE_ID).unwrap();
    let contact_entity = uuid::Uuid::parse_str(CONTACT_ID).unwrap();
    let hold = cohort
        .create_hold(HoldRequest::new(note_entity, note.to_string(), "case 1").tenant(TENANT_A))
        .await
        .unwrap();
    cohort
        .create_hold(
            HoldRequest::new(contact_entity, contact.to_string(), "case 1").tenant(TENANT_A),
        )
        .await
        .unwrap();
    exec(
        db.pool(),
        &format!(
            "UPDATE app.notes SET tenant_id = '{TENANT_B}' WHERE id = '{note}';
             UPDATE app.contacts SET tenant_id = '{TENANT_B}' WHERE id = {contact};"
        ),
    )
    .await;
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(r.entity("Note").unwrap().held, 1);
    assert_eq!(r.entity("Contact").unwrap().held, 1);
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM app.notes WHERE id = '{note}'")
        )
        .await,
        1
    );
    let erased = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_B,
            ErasureScope::new("cccccccc-0000-0000-0000-00000000000c"),
            now(),
        ))
        .await
        .unwrap();
    assert_eq!(erased.entity("Contact").unwrap().held, 1);
    assert_eq!(
        count(
            db.pool(),
            &format!(
                "SELECT count(*) FROM app.contacts WHERE id = {contact} AND anonymised_at IS NULL"
            )
        )
        .await,
        1
    );
    // Still listed active, under the tenant it was placed for.
    let listed = cohort
        .list_holds(
            &cohort::holds::HoldFilter::all()
                .tenant(TENANT_A.to_uppercase())
                .active_only(true),
        )
        .await
        .unwrap();
    assert!(listed.iter().any(|h| h.hold_id == hold.hold_id));
}

/// C.6: columns other rows reference, and the columns Cohort relies on,
/// are never anonymised.
#[tokio::test]
async fn referenced_key_columns_cannot_be_anonymised() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.accounts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
             anonymised_at timestamptz, email text UNIQUE, handle text UNIQUE);
         CREATE TABLE app.logins (id bigint PRIMARY KEY,
             email text REFERENCES app.accounts (email) ON UPDATE CASCADE ON DELETE RESTRICT);",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Account"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "app.accounts"
category = "accounts"
anchor = "created_at"
anonymise = { email = "hash", handle = "null", tenant_id = "null", id = "null" }

[[category]]
name = "accounts"
strategy = "anonymise"
period = "30d"
"#;
    expect_refused(
        &db,
        policy,
        &[
            "column \"email\" is anonymised but is part of a key that foreign key \"logins_email_fkey\" on app.logins references",
            "column \"tenant_id\" is both anonymised and a marker or anchor",
            "column \"id\" is both anonymised and a marker or anchor",
        ],
    )
    .await;
    // An unreferenced column is fine.
    from_policy(
        &db,
        &policy
            .replace("email = \"hash\", ", "")
            .replace(", tenant_id = \"null\", id = \"null\"", ""),
    )
    .await
    .unwrap();
}

const CASCADE_POLICY: &str = r#"
[[entity]]
name = "Parent"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.parent"
category = "short"
anchor = "created_at"
tenantless = true

[[entity]]
name = "Child"
id = "3c1f0d4e-8a7b-4c2d-9e6f-0a1b2c3d4e5f"
table = "app.child"
category = "long"
anchor = "created_at"
tenantless = true

[[category]]
name = "short"
strategy = "purge"
period = "30d"

[[category]]
name = "long"
strategy = "purge"
period = "3650d"
"#;

/// D.7: cascades are followed through unretained tables to the end; SET
/// NULL / SET DEFAULT that would fail every purge are refused as well.
#[tokio::test]
async fn cascades_are_followed_through_unretained_tables() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.parent (id bigint PRIMARY KEY, created_at timestamptz);
         CREATE TABLE app.mid (id bigint PRIMARY KEY, parent_id bigint REFERENCES app.parent ON DELETE CASCADE);
         CREATE TABLE app.child (id bigint PRIMARY KEY, created_at timestamptz,
             mid_id bigint REFERENCES app.mid ON DELETE CASCADE);",
    )
    .await;
    expect_refused(
        &db,
        CASCADE_POLICY,
        &["Child: foreign key \"child_mid_id_fkey\" on app.child is ON DELETE CASCADE from app.mid, which a purge of entity Parent reaches through app.parent -> app.mid -> app.child"],
    )
    .await;
    // SET NULL into a retained table changes its rows: refused too.
    exec(
        db.pool(),
        "ALTER TABLE app.child DROP CONSTRAINT child_mid_id_fkey,
           ADD CONSTRAINT child_mid_id_fkey FOREIGN KEY (mid_id) REFERENCES app.mid ON DELETE SET NULL;",
    )
    .await;
    expect_refused(
        &db,
        CASCADE_POLICY,
        &["is ON DELETE SET NULL from app.mid, which a purge of entity Parent reaches"],
    )
    .await;
    // SET NULL / SET DEFAULT onto NOT NULL columns of an unretained table:
    // every purge would fail.
    exec(
        db.pool(),
        "ALTER TABLE app.child DROP CONSTRAINT child_mid_id_fkey,
           ADD CONSTRAINT child_mid_id_fkey FOREIGN KEY (mid_id) REFERENCES app.mid ON DELETE RESTRICT;
         CREATE TABLE app.audit (id bigint PRIMARY KEY,
             parent_id bigint NOT NULL REFERENCES app.parent ON DELETE SET NULL);
         CREATE TABLE app.audit2 (id bigint PRIMARY KEY,
             parent_id bigint NOT NULL REFERENCES app.parent ON DELETE SET DEFAULT);",
    )
    .await;
    expect_refused(
        &db,
        CASCADE_POLICY,
        &[
            "Parent: foreign key \"audit_parent_id_fkey\" on app.audit is ON DELETE SET NULL from app.parent (entity Parent, which may be purged), but its column(s) parent_id are NOT NULL",
            "foreign key \"audit2_parent_id_fkey\" on app.audit2 is ON DELETE SET DEFAULT from app.parent (entity Parent, which may be purged), but its column(s) parent_id are NOT NULL without a default",
        ],
    )
    .await;
    exec(db.pool(), "DROP TABLE app.audit, app.audit2").await;
    // A cascade into unretained tables only is the application's design.
    let cohort = from_policy(&db, CASCADE_POLICY).await.unwrap();
    assert_eq!(cohort.ready().await.unwrap().entities.len(), 2);
}

/// E.8: an anonymise output that cannot fit its column would fail every
/// batch; NUL characters cannot be stored at all.
#[tokio::test]
async fn anonymise_outputs_must_fit_their_columns() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE DOMAIN app.short_text AS varchar(5);
         CREATE TABLE app.contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
             anonymised_at timestamptz, email varchar(10), code char(3), nick app.short_text,
             note varchar(12), wide varchar(64));",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Contact"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "app.contacts"
category = "contacts"
anchor = "created_at"
anonymise = { email = "hash", code = { literal = "xxxx" }, nick = { literal = "redacted" }, note = { literal = "[redacted]" }, wide = "hash" }

[[category]]
name = "contacts"
strategy = "anonymise"
period = "30d"
"#;
    expect_refused(
        &db,
        policy,
        &[
            "column \"email\" is character varying(10) but the hash anonymise method writes 64 characters",
            "column \"code\" is character(3) but the literal anonymise method writes 4 characters",
            "column \"nick\" is app.short_text but the literal anonymise method writes 8 characters",
        ],
    )
    .await;
    let err = from_policy(&db, policy).await.unwrap_err().to_string();
    assert!(
        !err.contains("\"note\"") && !err.contains("\"wide\""),
        "{err}"
    );
    // NUL characters are refused when the file is loaded, wherever they are.
    let err = PolicyFile::parse(&policy.replace("[redacted]", "[red\\u0000acted]")).unwrap_err();
    assert!(
        err.to_string().contains("NUL characters are not allowed")
            && err.to_string().contains("entity[0].anonymise.note.literal"),
        "{err}"
    );
    let err = PolicyFile::parse(&policy.replace(
        "period = \"30d\"",
        "period = \"30d\"\nreason = \"a\\u0000b\"",
    ))
    .unwrap_err();
    assert!(err.to_string().contains("category[0].reason"), "{err}");
    // The same literal built in code is refused by validation.
    let decl = cohort::EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("app.contacts")
        .anonymise(
            "wide",
            cohort::model::AnonymiseMethod::Literal("a\0b".into()),
        );
    let err = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules())
        .declaration(decl)
        .build()
        .await
        .unwrap_err();
    assert!(
        problems_text(&err).contains("contains a NUL character"),
        "{err}"
    );
}

/// E.9, E.10, E.11: Cohort's own tables, duplicate names and PostgreSQL's
/// own schemas are refused.
#[tokio::test]
async fn cohort_tables_duplicate_names_and_reserved_schemas_are_refused() {
    let db = migrated_db().await;
    let mut conn = db.connect().await.unwrap();
    cohort::schema::migrate(&mut conn, "ledger2").await.unwrap();
    let policy = r#"
[[entity]]
name = "Holds"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "public.retention_hold"
category = "c"
anchor = "created_at"
tenantless = true

[[entity]]
name = "OtherRuns"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "ledger2.sweep_run"
category = "c"
anchor = "started_at"
tenantless = true

[[category]]
name = "c"
strategy = "purge"
period = "30d"
"#;
    expect_refused(
        &db,
        policy,
        &[
            "Holds: public.retention_hold is one of Cohort's own ledger tables",
            "OtherRuns: ledger2.sweep_run is one of Cohort's own ledger tables",
        ],
    )
    .await;

    exec(
        db.pool(),
        "CREATE TABLE public.notes (id bigint PRIMARY KEY, created_at timestamptz);
         CREATE TABLE public.notes2 (id bigint PRIMARY KEY, created_at timestamptz);",
    )
    .await;
    let dup = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "notes"
category = "c"
anchor = "created_at"
tenantless = true

[[entity]]
name = "Note"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "notes2"
category = "c"
anchor = "created_at"
tenantless = true

[[category]]
name = "c"
strategy = "purge"
period = "30d"
"#;
    expect_refused(
        &db,
        dup,
        &["2 retained entities share the display name \"Note\" (ids a3f467fe-c5d0-4f17-9897-83c373cc1dc8, b7316df4-7db5-46ad-aea7-f65c4b430f73)"],
    )
    .await;

    for schema in [
        " public",
        "public ",
        "information_schema",
        "pg_catalog",
        "PG_temp",
    ] {
        let config = cohort::CohortConfig {
            schema: schema.into(),
            ..test_config()
        };
        let err = Cohort::builder(db.pool().clone())
            .config(config)
            .build()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{schema:?}: {err}");
        let err = cohort::schema::migrate(&mut conn, schema)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{schema:?}: {err}");
    }
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM pg_namespace WHERE nspname IN (' public', 'public ')"
        )
        .await,
        0
    );
}

/// F.12: schema names holding braces, quotes and placeholders stay inside
/// their own quotes.
#[tokio::test]
async fn migrations_quote_any_schema_name_in_one_pass() {
    let db = empty_db().await;
    let mut conn = db.connect().await.unwrap();
    for schema in [
        "x{retention_hold}",
        "{sweep_run_entity_summary}",
        "{sweep_run}",
        "we\"ird {",
        "}{",
    ] {
        let report = cohort::schema::migrate(&mut conn, schema).await.unwrap();
        assert_eq!(report.to_version, cohort::schema::SCHEMA_VERSION);
        let tables: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = $1")
                .bind(schema)
                .fetch_one(&mut conn)
                .await
                .unwrap();
        assert_eq!(
            tables as usize,
            cohort::schema::CohortTable::ALL.len(),
            "{schema:?}"
        );
        assert_eq!(
            cohort::schema::installed_version(&mut conn, schema)
                .await
                .unwrap(),
            Some(cohort::schema::SCHEMA_VERSION)
        );
        let config = cohort::CohortConfig {
            schema: schema.into(),
            ..test_config()
        };
        Cohort::builder(db.pool().clone())
            .config(config)
            .build()
            .await
            .unwrap_or_else(|e| panic!("{schema:?}: {e}"));
    }
}

/// G.13: an erasure accounts for every entity holding subject columns.
#[tokio::test]
async fn erasure_reports_what_it_did_not_do() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, user_id text);
         CREATE TABLE app.invoices (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, user_id text);
         CREATE TABLE app.records (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, user_id text);
         CREATE TABLE app.globals (id bigint PRIMARY KEY, created_at timestamptz, user_id text);
         CREATE TABLE app.badges (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz, badge_no bigint);
         INSERT INTO app.notes VALUES (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-01', 'u-1');
         INSERT INTO app.invoices VALUES (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-01', 'u-1'),
                                         (2, 'aaaaaaaa-0000-0000-0000-00000000000a', '2018-01-01', 'u-1');
         INSERT INTO app.records VALUES (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-05-01', 'u-1');
         INSERT INTO app.globals VALUES (1, '2026-05-01', 'u-1');",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"
subjects = ["user_id"]

[[entity]]
name = "Invoice"
id = "9e8d7c6b-5a49-4838-a726-1514f3e2d1c0"
table = "app.invoices"
category = "invoices"
anchor = "created_at"
subjects = ["user_id"]

[[entity]]
name = "Record"
id = "3c1f0d4e-8a7b-4c2d-9e6f-0a1b2c3d4e5f"
table = "app.records"
category = "records"
anchor = "created_at"
subjects = ["user_id"]

[[entity]]
name = "Global"
id = "0f0e0d0c-0b0a-4908-8706-050403020100"
table = "app.globals"
category = "notes"
anchor = "created_at"
tenantless = true
subjects = ["user_id"]

[[entity]]
name = "Badge"
id = "5d1d2c55-2f0e-4e6c-9d59-5c0b6f3b8a11"
table = "app.badges"
category = "notes"
anchor = "created_at"
subjects = ["badge_no"]

[[category]]
name = "notes"
strategy = "purge"
period = "30d"

[[category]]
name = "invoices"
strategy = "purge"
period = "30d"
legal_min = "2190d"

[[category]]
name = "records"
strategy = "exempt"
period = "30d"
"#;
    let cohort = from_policy(&db, policy).await.unwrap();
    let r = cohort
        .erase(ErasureRequest::tenanted(
            TENANT_A,
            ErasureScope::new("u-1"),
            now(),
        ))
        .await
        .unwrap();
    let note = r.entity("Note").unwrap();
    assert_eq!(note.affected, 1);
    let invoice = r.entity("Invoice").unwrap();
    assert_eq!((invoice.affected, invoice.kept_by_legal_min), (1, 1));
    let record = r.entity("Record").unwrap();
    assert_eq!((record.affected, record.kept_by_policy), (0, 1));
    let reasons: Vec<(&str, &str)> = r
        .not_reached
        .iter()
        .map(|n| (n.entity.as_str(), n.reason.as_str()))
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons
        .iter()
        .any(|(e, why)| *e == "Global" && why.starts_with("tenantless")));
    assert!(reasons.iter().any(|(e, why)| *e == "Badge"
        && why.contains("not a valid value for its subject column(s) (badge_no)")));
    // The ledger keeps the kept counts; the JSON carries not_reached.
    let shown = cohort.show_run(r.run_id).await.unwrap();
    assert_eq!(shown.entity("Invoice").unwrap().kept_by_legal_min, 1);
    assert_eq!(shown.entity("Record").unwrap().kept_by_policy, 1);
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["not_reached"].as_array().unwrap().len(), 2);
    // The tenantless request reaches Global and names the tenant-scoped ones.
    let r = cohort
        .erase(ErasureRequest::tenantless(ErasureScope::new("u-1"), now()))
        .await
        .unwrap();
    assert_eq!(r.entity("Global").unwrap().affected, 1);
    assert_eq!(r.not_reached.len(), 4);
    assert!(r
        .not_reached
        .iter()
        .all(|n| n.reason.starts_with("tenant-scoped")));
}

/// G.14: `hash` is keyed; without a key, whatever would change rows is
/// refused before anything runs (a sweep, an erasure, the worker's and
/// `cohort validate`'s check for runs), while reading (previews, dry runs,
/// holds, history) works: a read-only view needs no secret.
#[tokio::test]
async fn hashing_requires_a_key() {
    let db = engine_db().await;
    let mut b = Cohort::builder(db.pool().clone()).rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let cohort = b.build().await.expect("a handle without the key reads");
    let model = cohort.ready().await.unwrap();
    assert!(
        model
            .warnings
            .iter()
            .any(|w| w.contains("Contact anonymise with `hash`, and no hash key is set")),
        "{:?}",
        model.warnings
    );
    let before = table_digest(db.pool(), "app.contacts").await;
    let refused = |e: cohort::Error| {
        assert!(e.kind().is_bad_input(), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(
                "Contact anonymise with `hash`, which needs the secret key (COHORT_HASH_KEY"
            ) && text.contains("nothing was changed"),
            "{e}"
        );
    };
    refused(
        cohort
            .sweep(SweepRequest::tenanted(TENANT_A, now()))
            .await
            .unwrap_err(),
    );
    refused(
        cohort
            .erase(ErasureRequest::tenanted(
                TENANT_A,
                ErasureScope::new("cccccccc-0000-0000-0000-00000000000c"),
                now(),
            ))
            .await
            .unwrap_err(),
    );
    refused(
        cohort
            .check_grants(&[cohort::services::Access::Runs])
            .await
            .unwrap_err(),
    );
    assert_eq!(table_digest(db.pool(), "app.contacts").await, before);
    assert_eq!(
        ledger_rows(db.pool(), "public").await,
        0,
        "no run was recorded"
    );
    // Reading works: a preview, a dry run, the holds, the history.
    let dry = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()).dry_run(true))
        .await
        .unwrap();
    assert!(dry.entity("Contact").unwrap().affected > 0);
    cohort
        .preview(cohort::PreviewRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    cohort
        .list_holds(&cohort::holds::HoldFilter::all())
        .await
        .unwrap();
    cohort.list_runs(10).await.unwrap();
    assert_eq!(table_digest(db.pool(), "app.contacts").await, before);
    // A short key is refused; the key never shows in errors or Debug.
    let mut config = test_config();
    config.hash_key = Some(HashKey::new("short"));
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("hash_key is 5 bytes"), "{err}");
    let mut config = cohort::CohortConfig::default();
    config
        .apply_env([("COHORT_HASH_KEY".to_string(), TEST_HASH_KEY.to_string())])
        .unwrap();
    assert!(!format!("{config:?}").contains(TEST_HASH_KEY));
    assert!(!serde_json::to_string(&config)
        .unwrap()
        .contains(TEST_HASH_KEY));
    assert_eq!(config.hash_key, Some(HashKey::new(TEST_HASH_KEY)));
}

/// Migration 0002 upgrades a version-1 database keeping its history, and a
/// handle refuses a database that is behind.
#[tokio::test]
async fn a_version_one_database_upgrades_keeping_history() {
    let db = empty_db().await;
    let mut conn = db.connect().await.unwrap();
    let v1 = &cohort::schema::migrations("public").unwrap()[0];
    assert_eq!(v1.version, 1);
    sqlx::raw_sql(sqlx::AssertSqlSafe(v1.sql.clone()))
        .execute(&mut conn)
        .await
        .unwrap();
    exec(
        db.pool(),
        "INSERT INTO public.sweep_run (run_id, kind, trigger, dry_run, status, logical_now, started_at, settled_at, error)
           VALUES ('11111111-1111-4111-8111-111111111111', 'sweep', 'manual', false, 'partially_failed', now(), now(), now(), 'entity x: kind=db code=22001 diagnostic_id=abc');
         INSERT INTO public.sweep_run_entity_summary (run_id, retention_entity_id, entity_type, category, strategy,
             affected_count, held_count, skipped_count, null_anchor_count, resolved_period)
           VALUES ('11111111-1111-4111-8111-111111111111', 'a3f467fe-c5d0-4f17-9897-83c373cc1dc8', 'Note', 'notes', 'purge', 5, 1, 0, 2, interval '30 days');",
    )
    .await;
    // The columns of version 1, value for value (later versions add columns).
    const V1_RUNS: &str =
        "(SELECT run_id, kind, trigger, dry_run, tenant_id, status, logical_now, \
        started_at, settled_at, error FROM public.sweep_run)";
    let before = table_digest(db.pool(), V1_RUNS).await;
    let err = Cohort::builder(db.pool().clone())
        .config(test_config())
        .build()
        .await
        .unwrap_err();
    assert!(
        problems_text(&err).contains(&format!(
            "is version 1, older than this build's {}; run `cohort migrate`",
            cohort::schema::SCHEMA_VERSION
        )),
        "{err}"
    );
    let report = cohort::schema::migrate(&mut conn, "public").await.unwrap();
    assert_eq!(
        (report.from_version, report.applied),
        (1, (2..=cohort::schema::SCHEMA_VERSION).collect::<Vec<_>>())
    );
    // The runs table is byte for byte as it was, error texts included.
    assert_eq!(table_digest(db.pool(), V1_RUNS).await, before);
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .build()
        .await
        .unwrap();
    let run = cohort
        .show_run(uuid::Uuid::parse_str("11111111-1111-4111-8111-111111111111").unwrap())
        .await
        .unwrap();
    let note = run.entity("Note").unwrap();
    assert_eq!(
        (
            note.affected,
            note.held,
            note.null_anchor,
            note.kept_by_legal_min
        ),
        (5, 1, 2, 0)
    );
}

/// Released migrations are never edited: their checksums are pinned.
#[test]
fn released_migrations_are_pinned() {
    use sha2::Digest;
    let pinned = [
        (
            1,
            "608e187d69252026253c8487bf78d7024f388d117640699d1f28ff6f314622c1",
        ),
        (
            2,
            "3983322a06f8235d7f6e2b5210f2a523572e856d33297deb0669c1a2eb9a224e",
        ),
        (
            3,
            "b8d9fc32d3501bd6f79c129c54855d04493726568eefa30269dbaae07a9a3962",
        ),
        (
            4,
            "45dffbf9579bdc6115b338ed578e004f432442d925d590ff8c9a834331463886",
        ),
        (
            5,
            "01e42d47e1412e09959ba1925c2d8a1cdfff6cf49e2cfd0b8ae5404af3d39d2a",
        ),
        (
            6,
            "78e92c0354c4b7f4892f7498575515605add9e139bd25af81f9d195308742d68",
        ),
        (
            7,
            "947d0fd514d6a1e88128faa9be1fa88b241d589cf433adc32657f6338efc9e18",
        ),
        (
            8,
            "934b14d7bde011bd94d43d676c19e9520a026edb578391f28a3feff3029eff96",
        ),
        (
            9,
            "299e9c4ab01bcbe9fa816b646776f330a9c07b048e96cb4434398b4938dea694",
        ),
        (
            10,
            "3c2fc499810bcf26a4f130a068837d63170f2bf582e4044ac3247c53b3044c5b",
        ),
        (
            11,
            "bae5a3019c4873d968a41f53d143f03d80ef01549e081cd19cd8de98a6832033",
        ),
        (
            12,
            "d4dfe5a116ee3541fcc86656d2255b1ff63c5dbc2d71fe29fb7c35af2dff8e47",
        ),
        (
            13,
            "96a37b109645c155c33e578c171115b0f9ceb1741c1f4fcf176ebca7037c0c77",
        ),
        (
            14,
            "439702dae9baaf9f036fd03b6dc30a9a1b4d0016f75c698023cfcf69215e6130",
        ),
        (
            15,
            "6675ea972d634df6f4936ba01060fbb538f22c2bc15d44232932fcedd162605d",
        ),
        (
            16,
            "41c72e36cb1e109778f293314d66e3de11cb0b6de95b0d887cebc75a9ad64e1f",
        ),
        (
            17,
            "346ea9aefa8375d62bd71855d7a6646bc48206f6a7da4f5ba838491af5fe2991",
        ),
        (
            18,
            "49c58b0a5990045a70fd54a8d73099706540de5a6349532281ab71a567a2eae4",
        ),
        (
            19,
            "8747c88981cb2dff681e795a4db0f779f494ed23c66c4797456063ead5620518",
        ),
        (
            20,
            "ddc2bcff47a5c41746414a6ec672e6942a0d59ff605c2db9594d5277f58b909e",
        ),
    ];
    assert_eq!(
        pinned.len(),
        cohort::schema::migrations("public").unwrap().len(),
        "pin every released migration"
    );
    for (version, digest) in pinned {
        let m = &cohort::schema::migrations("public").unwrap()[version - 1];
        let hex: String = sha2::Sha256::digest(m.sql.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, digest, "migration {version} was edited after release");
    }
}

/// Key-like columns must compare the way Cohort identifies values: no
/// non-deterministic collations, no char(n) tenants or subjects.
#[tokio::test]
async fn key_columns_must_compare_deterministically() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE COLLATION app.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id text COLLATE app.ci NOT NULL,
             created_at timestamptz, user_code char(8));",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Note"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.notes"
category = "notes"
anchor = "created_at"
subjects = ["user_code"]

[[category]]
name = "notes"
strategy = "purge"
period = "30d"
"#;
    expect_refused(
        &db,
        policy,
        &[
            "tenant column \"tenant_id\" has a non-deterministic collation",
            "erasure subject column \"user_code\" is character(8)",
        ],
    )
    .await;
}

/// A cascade that loops back into the purged table is reported too.
#[tokio::test]
async fn cascades_that_loop_back_are_refused() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE SCHEMA app;
         CREATE TABLE app.parent (id bigint PRIMARY KEY, created_at timestamptz, child_id bigint);
         CREATE TABLE app.mid (id bigint PRIMARY KEY, parent_id bigint REFERENCES app.parent ON DELETE CASCADE);
         ALTER TABLE app.parent ADD CONSTRAINT parent_mid_fkey FOREIGN KEY (child_id) REFERENCES app.mid ON DELETE CASCADE;",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Parent"
id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8"
table = "app.parent"
category = "short"
anchor = "created_at"
tenantless = true

[[category]]
name = "short"
strategy = "purge"
period = "30d"
"#;
    expect_refused(
        &db,
        policy,
        &["Parent: foreign key \"parent_mid_fkey\" on app.parent is ON DELETE CASCADE from app.mid, which a purge of entity Parent reaches through app.parent -> app.mid -> app.parent"],
    )
    .await;
}

/// A fixed value written into a unique column would fail every batch of two
/// rows or more; an unqualified table that also exists in Cohort's schema is
/// ambiguous since the default table schema became `public`.
#[tokio::test]
async fn constant_scrubs_of_unique_columns_and_ambiguous_tables_are_refused() {
    let db = migrated_db().await;
    let mut conn = db.connect().await.unwrap();
    cohort::schema::migrate(&mut conn, "ledger").await.unwrap();
    exec(
        db.pool(),
        "CREATE TABLE public.contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
             anonymised_at timestamptz, handle text UNIQUE, nick text);
         CREATE TABLE ledger.contacts (LIKE public.contacts);",
    )
    .await;
    let policy = r#"
[cohort]
schema = "ledger"

[[entity]]
name = "Contact"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "contacts"
category = "contacts"
anchor = "created_at"
anonymise = { handle = { literal = "gone" }, nick = "empty" }

[[category]]
name = "contacts"
strategy = "anonymise"
period = "30d"
"#;
    let err = from_policy(&db, policy).await.unwrap_err();
    let text = problems_text(&err);
    for f in [
        "column \"handle\" is unique, but the literal anonymise method writes the same value into every row",
        "table \"contacts\" names no schema: it resolves to public.contacts (the default table schema), but ledger.contacts exists too",
    ] {
        assert!(text.contains(f), "{f:?} missing from\n{text}");
    }
    assert!(!text.contains("\"nick\""), "{text}");
    // Qualified, and hashing the unique column instead: accepted.
    from_policy(
        &db,
        &policy
            .replace("table = \"contacts\"", "table = \"public.contacts\"")
            .replace("{ literal = \"gone\" }", "\"hash\""),
    )
    .await
    .unwrap();
}

/// The keyed hash is computed in Rust from the column's value, also for a
/// citext column (decoded as text).
#[tokio::test]
async fn hashing_works_on_citext_and_varchar_columns() {
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE EXTENSION citext;
         CREATE SCHEMA app;
         CREATE TABLE app.contacts (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
             anonymised_at timestamptz, email citext, phone varchar(80));
         INSERT INTO app.contacts VALUES
           (1, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-01-01', NULL, 'Ada@Example.com', '+44 1'),
           (2, 'aaaaaaaa-0000-0000-0000-00000000000a', '2026-01-01', NULL, NULL, '+44 2');",
    )
    .await;
    let policy = r#"
[[entity]]
name = "Contact"
id = "b7316df4-7db5-46ad-aea7-f65c4b430f73"
table = "app.contacts"
category = "contacts"
anchor = "created_at"
anonymise = { email = "hash", phone = "hash" }

[[category]]
name = "contacts"
strategy = "anonymise"
period = "30d"
"#;
    let cohort = from_policy(&db, policy).await.unwrap();
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.affected(), 2);
    let rows: Vec<(Option<String>, String)> =
        sqlx::query_as("SELECT email::text, phone FROM app.contacts ORDER BY id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(
        rows[0].0.as_deref(),
        Some(test_hmac_hex("Ada@Example.com").as_str())
    );
    assert_eq!(rows[0].1, test_hmac_hex("+44 1"));
    assert_eq!(rows[1].0, None, "NULL stays NULL");
}
