//! Every mutation reaches only the rows it should, proved end to end on a
//! real server: one tenant identity everywhere (every spelling of a uuid
//! tenant, text tenants exact, citext tenants and keys case-insensitive),
//! defence in depth in every mutation (it re-checks what the candidate
//! query chose), holds that follow their record into another tenant,
//! cascades followed through unretained tables to the end, and an erasure
//! that says what it did not do.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::erasure::{ErasureRequest, ErasureScope};
use cohort::holds::HoldRequest;
use cohort::{Error, PreviewRequest, SweepRequest};
use support::*;

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
#[db_test(migrated)]
async fn every_spelling_of_a_uuid_tenant_gets_its_jurisdiction_and_overrides(db: TestDatabase) {
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
#[db_test(migrated)]
async fn text_tenants_are_compared_exactly_never_case_folded(db: TestDatabase) {
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
#[db_test(migrated)]
async fn citext_tenants_and_keys_compare_case_insensitively(db: TestDatabase) {
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

/// B.4(b): the mutation re-checks tenant, cutoff and "not done" itself, so a
/// key that stops being unique after validation (the key index dropped or
/// rebuilt under a live handle) cannot carry the delete to other rows.
#[db_test(migrated)]
async fn a_mutation_reaches_only_rows_the_candidate_query_would_choose(db: TestDatabase) {
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
#[db_test(engine)]
async fn a_hold_follows_its_record_into_another_tenant(db: TestDatabase) {
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
#[db_test(migrated)]
async fn cascades_are_followed_through_unretained_tables(db: TestDatabase) {
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

/// G.13: an erasure accounts for every entity holding subject columns.
#[db_test(migrated)]
async fn erasure_reports_what_it_did_not_do(db: TestDatabase) {
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
