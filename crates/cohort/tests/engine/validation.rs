//! Startup validation against real tables: each bad shape fails with a
//! precise message, every problem is reported together, and nothing in the
//! database changes.

use crate::support;
use cohort_test_macros::db_test;

use cohort::model::{AnonymiseMethod, EntityDeclaration, Marker};
use cohort::{Cohort, CohortConfig, Error};
use cohort_pgtemp::TestDatabase;
use support::*;

fn note(table: &str) -> EntityDeclaration {
    EntityDeclaration::new("Note", NOTE_ID)
        .category("notes")
        .anchor("created_at")
        .table(table)
}

const NOTES: &str = "CREATE TABLE notes (id uuid PRIMARY KEY, tenant_id uuid NOT NULL, \
    created_at timestamptz, body text NOT NULL); \
    INSERT INTO notes VALUES (gen_random_uuid(), gen_random_uuid(), now(), 'hello');";

async fn build(db: &TestDatabase, decls: Vec<EntityDeclaration>) -> Result<Cohort, Error> {
    build_with(db, decls, test_config()).await
}

async fn build_with(
    db: &TestDatabase,
    decls: Vec<EntityDeclaration>,
    config: CohortConfig,
) -> Result<Cohort, Error> {
    let mut builder = Cohort::builder(db.pool().clone())
        .config(test_config())
        .config(config)
        .rules(rules());
    for d in decls {
        builder = builder.declaration(d);
    }
    builder.build().await
}

/// Builds, expects a validation failure containing every `expected`
/// fragment, and checks that `tables` and the ledger did not change.
/// The advice validation gives for these declarations (they must be valid).
async fn warnings(db: &TestDatabase, decls: Vec<EntityDeclaration>) -> Vec<String> {
    build(db, decls)
        .await
        .unwrap()
        .ready()
        .await
        .unwrap()
        .warnings
        .clone()
}

async fn expect_problems(
    db: &TestDatabase,
    decls: Vec<EntityDeclaration>,
    tables: &[&str],
    expected: &[&str],
) -> Vec<String> {
    let mut before = Vec::new();
    for t in tables {
        before.push(table_digest(db.pool(), t).await);
    }
    let err = build(db, decls).await.expect_err("validation should fail");
    let problems: Vec<String> = err
        .problems()
        .unwrap_or_else(|| panic!("expected validation problems, got {err}"))
        .iter()
        .map(|p| p.to_string())
        .collect();
    for fragment in expected {
        assert!(
            problems.iter().any(|p| p.contains(fragment)),
            "no problem mentions {fragment:?}; problems were:\n{}",
            problems.join("\n")
        );
    }
    for (t, digest) in tables.iter().zip(before) {
        assert_eq!(
            table_digest(db.pool(), t).await,
            digest,
            "{t} changed during validation"
        );
    }
    assert_eq!(
        ledger_rows(db.pool(), "public").await,
        0,
        "validation wrote to the ledger"
    );
    problems
}

#[db_test(migrated)]
async fn valid_model_passes_and_resolves_conventions(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    exec(db.pool(), "CREATE INDEX ON notes (tenant_id, created_at)").await;
    let cohort = build(&db, vec![note("notes")]).await.unwrap();
    let model = cohort.ready().await.unwrap();
    let e = &model.entities[0];
    assert_eq!(e.table, cohort::QualifiedName::new("public", "notes"));
    assert_eq!(e.record_id, "id");
    assert_eq!(e.tenant.as_deref(), Some("tenant_id"));
    assert!(model.warnings.is_empty(), "{:?}", model.warnings);
    assert!(model.server_version_num >= 130000);
    assert!(cohort.is_ready());
}

#[db_test(migrated)]
async fn naive_timestamp_anchor_is_rejected(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE TABLE notes (id uuid PRIMARY KEY, tenant_id uuid, created_at timestamp);
        INSERT INTO notes VALUES (gen_random_uuid(), gen_random_uuid(), now());",
    )
    .await;
    expect_problems(
        &db,
        vec![note("notes")],
        &["notes"],
        &[
            "anchor column \"created_at\" is `timestamp without time zone`",
            "Change it to `timestamp with time zone`",
        ],
    )
    .await;
}

#[db_test(migrated)]
async fn missing_column_is_rejected(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    let decl = note("notes")
        .anchor("written_at")
        .marker(Marker::SoftDelete, "gone");
    expect_problems(
        &db,
        vec![decl],
        &["notes"],
        &[
            "anchor column \"written_at\" does not exist in public.notes",
            "soft_delete marker column \"gone\" does not exist in public.notes",
        ],
    )
    .await;
}

#[db_test(migrated)]
async fn missing_table_is_rejected(db: TestDatabase) {
    expect_problems(
        &db,
        vec![note("nowhere")],
        &[],
        &["Note: table public.nowhere does not exist"],
    )
    .await;
}

#[db_test(migrated)]
async fn two_entities_on_one_table_are_rejected(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    let second = EntityDeclaration::new("NoteAgain", OTHER_ID)
        .category("notes")
        .anchor("created_at")
        .table("public.notes");
    let problems = expect_problems(
        &db,
        vec![note("notes"), second],
        &["notes"],
        &[
            "Note: table public.notes is also declared by NoteAgain",
            "NoteAgain: table public.notes is also declared by Note",
        ],
    )
    .await;
    assert_eq!(problems.len(), 2, "{problems:?}");
}

#[db_test(migrated)]
async fn inherited_tables_are_rejected(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE TABLE parent_notes (id uuid PRIMARY KEY, tenant_id uuid, created_at timestamptz);
        CREATE TABLE child_notes (extra text) INHERITS (parent_notes);
        INSERT INTO child_notes VALUES (gen_random_uuid(), gen_random_uuid(), now(), 'x');",
    )
    .await;
    expect_problems(
        &db,
        vec![note("parent_notes")],
        &["parent_notes"],
        &["public.parent_notes takes part in table inheritance"],
    )
    .await;
    expect_problems(
        &db,
        vec![note("child_notes")],
        &["child_notes"],
        &["public.child_notes takes part in table inheritance"],
    )
    .await;
}

#[db_test(migrated)]
async fn declarative_partitioning_of_the_retained_table_is_accepted_but_a_partition_is_not(
    db: TestDatabase,
) {
    exec(db.pool(), "CREATE TABLE events (id uuid, tenant_id uuid, created_at timestamptz NOT NULL, PRIMARY KEY (id))
            PARTITION BY HASH (id);
        CREATE TABLE events_0 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 0);
        CREATE TABLE events_1 PARTITION OF events FOR VALUES WITH (MODULUS 2, REMAINDER 1);").await;
    build(&db, vec![note("events")]).await.unwrap();
    expect_problems(
        &db,
        vec![note("events_0")],
        &["events_0"],
        &["public.events_0 is a partition of another table"],
    )
    .await;
}

#[db_test(migrated)]
async fn on_delete_cascade_from_a_purgeable_entity_into_another_is_rejected(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE TABLE cases (id uuid PRIMARY KEY, tenant_id uuid, created_at timestamptz);
        CREATE TABLE case_notes (id uuid PRIMARY KEY, tenant_id uuid, created_at timestamptz,
            case_id uuid REFERENCES cases (id) ON DELETE CASCADE);",
    )
    .await;
    let cases = EntityDeclaration::new("Case", NOTE_ID)
        .category("notes")
        .anchor("created_at")
        .table("cases");
    let notes = EntityDeclaration::new("CaseNote", OTHER_ID)
        .category("kept")
        .anchor("created_at")
        .table("case_notes");
    expect_problems(&db, vec![cases.clone(), notes.clone()], &["cases", "case_notes"], &[
        "CaseNote: foreign key \"case_notes_case_id_fkey\" on public.case_notes is ON DELETE CASCADE from public.cases (entity Case, which may be purged)",
    ]).await;
    // Not purgeable: the same cascade is acceptable.
    let cases_exempt = EntityDeclaration::new("Case", NOTE_ID)
        .category("kept")
        .anchor("created_at")
        .table("cases");
    build(&db, vec![cases_exempt, notes.clone()]).await.unwrap();
    // RESTRICT instead of CASCADE: acceptable.
    exec(
        db.pool(),
        "ALTER TABLE case_notes DROP CONSTRAINT case_notes_case_id_fkey;
        ALTER TABLE case_notes ADD FOREIGN KEY (case_id) REFERENCES cases (id) ON DELETE RESTRICT;",
    )
    .await;
    build(&db, vec![cases, notes]).await.unwrap();
}

#[db_test(migrated)]
async fn anonymise_without_marker_or_columns_is_rejected(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE TABLE contacts (id uuid PRIMARY KEY, tenant_id uuid, created_at timestamptz,
        email text, full_name text NOT NULL)",
    )
    .await;
    let no_marker = EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("contacts")
        .anonymise("email", AnonymiseMethod::Null);
    expect_problems(
        &db,
        vec![no_marker],
        &["contacts"],
        &["category \"contacts\" may anonymise, but no anonymised_at marker resolves"],
    )
    .await;
    exec(
        db.pool(),
        "ALTER TABLE contacts ADD COLUMN anonymised_at timestamptz",
    )
    .await;
    let no_columns = EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("contacts");
    expect_problems(
        &db,
        vec![no_columns],
        &["contacts"],
        &["may anonymise, but no column is marked for anonymisation"],
    )
    .await;
    let bad_methods = EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("contacts")
        .anonymise("full_name", AnonymiseMethod::Null)
        .anonymise("tenant_id", AnonymiseMethod::Empty);
    expect_problems(
        &db,
        vec![bad_methods],
        &["contacts"],
        &[
            "column \"full_name\" is anonymised to NULL but is NOT NULL",
            "column \"tenant_id\" is both anonymised and a marker",
            "column \"tenant_id\" is uuid; the empty anonymise method needs a text column",
        ],
    )
    .await;
    let good = EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("contacts")
        .anonymise("email", AnonymiseMethod::Null)
        .anonymise("full_name", AnonymiseMethod::Literal("[redacted]".into()));
    build(&db, vec![good]).await.unwrap();
}

#[db_test(migrated)]
async fn soft_delete_without_flag_is_rejected_also_when_only_an_override_may_soft_delete(
    db: TestDatabase,
) {
    exec(db.pool(), NOTES).await;
    let soft = EntityDeclaration::new("Note", NOTE_ID)
        .category("soft")
        .anchor("created_at")
        .table("notes");
    expect_problems(
        &db,
        vec![soft],
        &["notes"],
        &["category \"soft\" may soft delete, but no soft-delete flag resolves"],
    )
    .await;
    // `mixed` purges by default and soft-deletes only for tenant t2: still validated up front.
    let mixed = EntityDeclaration::new("Note", NOTE_ID)
        .category("mixed")
        .anchor("created_at")
        .table("notes");
    expect_problems(
        &db,
        vec![mixed.clone()],
        &["notes"],
        &["category \"mixed\" may soft delete"],
    )
    .await;
    exec(db.pool(), "ALTER TABLE notes ADD COLUMN is_deleted text").await;
    expect_problems(
        &db,
        vec![mixed.clone()],
        &["notes"],
        &["soft-delete flag column \"is_deleted\" is text but must be boolean"],
    )
    .await;
    exec(db.pool(), "ALTER TABLE notes DROP COLUMN is_deleted; ALTER TABLE notes ADD COLUMN is_deleted boolean NOT NULL DEFAULT false").await;
    let model = build(&db, vec![mixed])
        .await
        .unwrap()
        .ready()
        .await
        .unwrap();
    assert_eq!(model.entities[0].soft_delete.as_deref(), Some("is_deleted"));
}

#[db_test(migrated)]
async fn tenantless_entity_that_has_a_tenant_column_is_rejected(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    expect_problems(
        &db,
        vec![note("notes").tenantless()],
        &["notes"],
        &["declared tenantless, but the tenant column \"tenant_id\" resolves"],
    )
    .await;
    // A derive-style declaration that does not list the column is caught by the catalog check.
    let declared = note("notes")
        .tenantless()
        .column("id", "id", "Uuid")
        .column("created_at", "created_at", "DateTime<Utc>");
    expect_problems(
        &db,
        vec![declared],
        &["notes"],
        &["entity is tenantless but public.notes has a tenant column \"tenant_id\""],
    )
    .await;
    // And an entity with no tenant column that is not marked tenantless.
    exec(
        db.pool(),
        "CREATE TABLE globals (id bigint PRIMARY KEY, created_at timestamptz)",
    )
    .await;
    expect_problems(
        &db,
        vec![note("globals")],
        &["globals"],
        &["no tenant column: none declared"],
    )
    .await;
    build(&db, vec![note("globals").tenantless()])
        .await
        .unwrap();
}

/// Issue 37 A4: one rule for what reads as a tenant column. A tenantless
/// entity on a table with `"TenantId"`, `tenantid` or `Tenant_ID` is
/// refused (it was accepted: the table was swept across every tenant),
/// naming the column and both ways out; `not_tenant` names the column
/// as not a tenant and the entity validates; `not_tenant` that would do
/// nothing is refused, not ignored.
#[db_test(migrated)]
async fn tenantless_on_a_table_with_a_tenant_look_alike_column_needs_not_tenant(db: TestDatabase) {
    for column in ["\"TenantId\"", "tenantid", "\"Tenant_ID\"", "org_id"] {
        exec(
            db.pool(),
            &format!(
                "DROP TABLE IF EXISTS looks; CREATE TABLE looks (id bigint PRIMARY KEY, {column} uuid, created_at timestamptz)"
            ),
        )
        .await;
        let name = column.trim_matches('"');
        expect_problems(
            &db,
            vec![note("looks").tenantless()],
            &["looks"],
            &[&format!(
                "entity is tenantless but public.looks has a tenant column {name:?} (its name reads as a tenant id); map it as the tenant (`tenant = {name:?}`), or, if it is not one, say so (`not_tenant = [{name:?}]`)"
            )],
        )
        .await;
        build(&db, vec![note("looks").tenantless().not_tenant(name)])
            .await
            .unwrap_or_else(|e| panic!("{column}: {e}"));
    }
    // A column whose name does not read as a tenant id needs nothing, and
    // naming it is refused as doing nothing; so is a column the table
    // lacks, and `not_tenant` on an entity that has a tenant.
    exec(
        db.pool(),
        "DROP TABLE looks; CREATE TABLE looks (id bigint PRIMARY KEY, account_id uuid, created_at timestamptz)",
    )
    .await;
    build(&db, vec![note("looks").tenantless()]).await.unwrap();
    expect_problems(
        &db,
        vec![note("looks").tenantless().not_tenant("account_id").not_tenant("nope")],
        &["looks"],
        &[
            "not_tenant names \"account_id\", whose name does not read as a tenant id: it has no effect; remove it",
            "not_tenant names \"nope\", which public.looks does not have",
        ],
    )
    .await;
    exec(db.pool(), NOTES).await;
    expect_problems(
        &db,
        vec![note("notes").not_tenant("tenant_id")],
        &["notes"],
        &["not_tenant names \"tenant_id\", but the entity is not tenantless"],
    )
    .await;
}

#[db_test(migrated)]
async fn duplicate_and_malformed_ids_are_rejected(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    exec(db.pool(), "CREATE TABLE notes2 (LIKE notes INCLUDING ALL); CREATE TABLE notes3 (LIKE notes INCLUDING ALL);").await;
    let dup = EntityDeclaration::new("NoteCopy", NOTE_ID)
        .category("notes")
        .anchor("created_at")
        .table("notes2");
    let malformed = EntityDeclaration::new("NoteBad", "not-a-uuid")
        .category("notes")
        .anchor("created_at")
        .table("notes3");
    let empty = EntityDeclaration::new("NoteEmpty", "")
        .category("notes")
        .anchor("created_at")
        .table("notes3");
    expect_problems(
        &db,
        vec![note("notes"), dup, malformed, empty],
        &["notes"],
        &[
            &format!("NoteCopy: retained-entity id {NOTE_ID} is also used by Note"),
            "NoteBad: the retained-entity id \"not-a-uuid\" is not a UUID",
            "NoteEmpty: the retained-entity id is missing or empty",
        ],
    )
    .await;
}

#[db_test(migrated)]
async fn duplicate_markers_are_rejected(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    exec(db.pool(), "ALTER TABLE notes ADD COLUMN org uuid").await;
    let decl = note("notes")
        .marker(Marker::Tenant, "tenant_id")
        .marker(Marker::Tenant, "org");
    expect_problems(
        &db,
        vec![decl],
        &["notes"],
        &["the tenant marker is declared twice (columns \"tenant_id\" and \"org\")"],
    )
    .await;
}

#[db_test(migrated)]
async fn composite_and_non_unique_keys_are_rejected(db: TestDatabase) {
    exec(db.pool(), "CREATE TABLE pairs (id uuid, tenant_id uuid, created_at timestamptz, PRIMARY KEY (tenant_id, id));
        CREATE TABLE loose (id uuid, tenant_id uuid, created_at timestamptz);").await;
    expect_problems(&db, vec![note("pairs")], &["pairs"], &["public.pairs has a composite primary key (tenant_id, id) and the record key is \"id\" alone; declare the key's columns, record_id = [\"tenant_id\", \"id\"]"]).await;
    expect_problems(
        &db,
        vec![note("loose")],
        &["loose"],
        &["record key column \"id\" is not a primary key or unique on its own"],
    )
    .await;
}

#[db_test(migrated)]
async fn every_problem_is_reported_at_once(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE TABLE bad (id uuid, tenant_id uuid, created_at timestamp, is_deleted int)",
    )
    .await;
    let decl = EntityDeclaration::new("Bad", NOTE_ID)
        .category("soft")
        .anchor("created_at")
        .table("bad")
        .subject("missing_col", None);
    let problems = expect_problems(
        &db,
        vec![decl, note("absent")],
        &["bad"],
        &[
            "Bad: erasure subject column \"missing_col\" does not exist",
            "Bad: anchor column \"created_at\" is `timestamp without time zone`",
            "Bad: record key column \"id\" is not a primary key",
            "Bad: soft-delete flag column \"is_deleted\" is integer but must be boolean",
            "Note: table public.absent does not exist",
        ],
    )
    .await;
    assert!(problems.len() >= 5);
}

#[db_test(migrated)]
async fn unknown_category_is_rejected(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    let decl = note("notes").category("no-such-category");
    expect_problems(
        &db,
        vec![decl],
        &["notes"],
        &["category \"no-such-category\" is not known to the rule provider"],
    )
    .await;
}

/// Errors that stop short of the fix get a "did you mean" wherever the
/// catalog or the policy knows the answer: a table in another schema, a
/// near-miss table name, a near-miss category (with the known ones
/// listed), a near-miss policy key or strategy. Nothing changes.
#[db_test(migrated)]
async fn errors_name_what_was_probably_meant(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    exec(
        db.pool(),
        "CREATE SCHEMA app; CREATE TABLE app.contacts (id bigint PRIMARY KEY, created_at timestamptz);",
    )
    .await;
    let wrong_schema = note("app.notes");
    let near_name = note("public.notez");
    let far_name = note("public.zzzzzzzz");
    for (decl, says) in [
        (
            wrong_schema,
            "Note: table app.notes does not exist; a table of that name exists in public.notes",
        ),
        (
            near_name,
            "Note: table public.notez does not exist; did you mean public.notes?",
        ),
    ] {
        expect_problems(&db, vec![decl], &["notes"], &[says]).await;
    }
    let problems = expect_problems(&db, vec![far_name], &["notes"], &[]).await;
    assert_eq!(
        problems,
        ["Note: table public.zzzzzzzz does not exist"],
        "no guess when nothing is close"
    );
    expect_problems(
        &db,
        vec![note("notes").category("note")],
        &["notes"],
        &["category \"note\" is not known to the rule provider (it knows contacts, kept, mixed, notes, soft); did you mean \"notes\"?"],
    )
    .await;

    // The policy file: a near-miss key, and the one spelling of a strategy.
    let file = |category: &str| {
        format!(
            "[[entity]]\nname = \"Note\"\nid = \"{NOTE_ID}\"\ntable = \"public.notes\"\ncategory = \"notes\"\n\n[[category]]\nname = \"notes\"\n{category}\n"
        )
    };
    let err = cohort::policy::PolicyFile::parse(&file("strategy = \"purge\"\nperod = \"30d\""))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown field `perod`") && err.contains("did you mean `period`?"),
        "{err}"
    );
    let err =
        cohort::policy::PolicyFile::parse(&file("strategy = \"anonymize\"\nperiod = \"30d\""))
            .unwrap_err()
            .to_string();
    assert!(
        err.contains("unknown strategy \"anonymize\"")
            && err.contains("did you mean \"anonymise\"?"),
        "{err}"
    );
    assert!(
        cohort::policy::PolicyFile::parse(&file("strategy = \"anonymise\"\nperiod = \"30d\""))
            .is_ok()
    );
}

#[db_test(migrated)]
async fn erasure_subjects_several_columns_and_incompatible_types(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE TABLE messages (id uuid PRIMARY KEY, tenant_id uuid, created_at timestamptz,
        author_id uuid, recipient_email text, legacy_user int8, payload jsonb)",
    )
    .await;
    let ok = note("messages")
        .subject("author_id", None)
        .subject("recipient_email", Some("email"))
        .subject("legacy_user", Some("user"));
    let model = build(&db, vec![ok]).await.unwrap().ready().await.unwrap();
    assert_eq!(model.entities[0].subjects.len(), 3);
    let bad = note("messages")
        .subject("author_id", None)
        .subject("payload", None);
    expect_problems(&db, vec![bad], &["messages"], &["erasure subject column \"payload\" is jsonb; subjects must be uuid, integer or text columns"]).await;
    let typed = note("messages")
        .column("id", "id", "Uuid")
        .column("tenant_id", "tenant_id", "Uuid")
        .column("created_at", "created_at", "DateTime<Utc>")
        .column("author_id", "author_id", "i32")
        .subject("author_id", None);
    expect_problems(
        &db,
        vec![typed],
        &["messages"],
        &["field type i32 does not match column \"author_id\" of type uuid"],
    )
    .await;
}

#[db_test(migrated)]
async fn retained_and_exempt_at_once_is_rejected(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    expect_problems(
        &db,
        vec![note("notes").exempt("audit evidence")],
        &["notes"],
        &["declared both retained (category \"notes\") and exempt"],
    )
    .await;
    let exempt = EntityDeclaration::new("AuditLog", OTHER_ID).exempt("kept by law");
    let model = build(&db, vec![note("notes"), exempt])
        .await
        .unwrap()
        .ready()
        .await
        .unwrap();
    assert_eq!(model.exempt.len(), 1);
    assert_eq!(model.entities.len(), 1);
}

#[db_test(empty)]
async fn missing_cohort_schema_is_rejected(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    let err = build(&db, vec![note("notes")]).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(
            "Cohort's tables are not installed in schema \"public\"; run `cohort migrate`"
        ),
        "{text}"
    );
}

#[db_test(migrated)]
async fn incomplete_or_old_cohort_schema_is_rejected(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    exec(
        db.pool(),
        "DROP TABLE sweep_row_handler_status; ALTER TABLE retention_hold DROP COLUMN released_at;
        ALTER TABLE sweep_run ALTER COLUMN error TYPE varchar(200);",
    )
    .await;
    expect_problems_global(
        &db,
        &[
            "Cohort table public.sweep_row_handler_status is missing",
            "Cohort table public.retention_hold lacks column \"released_at\"",
            "Cohort column public.sweep_run.error is character varying(200) but must be text",
        ],
    )
    .await;
    exec(
        db.pool(),
        "COMMENT ON TABLE sweep_run IS 'cohort schema version 0'",
    )
    .await;
    expect_problems_global(
        &db,
        &[&format!(
            "is version 0, older than this build's {}; run `cohort migrate`",
            cohort::schema::SCHEMA_VERSION
        )],
    )
    .await;
    exec(
        db.pool(),
        "COMMENT ON TABLE sweep_run IS 'cohort schema version 99'",
    )
    .await;
    expect_problems_global(
        &db,
        &[&format!(
            "is version 99, newer than this build's {}; upgrade Cohort",
            cohort::schema::SCHEMA_VERSION
        )],
    )
    .await;
}

async fn expect_problems_global(db: &TestDatabase, expected: &[&str]) {
    let err = build(db, vec![note("notes")]).await.unwrap_err();
    let text = err.to_string();
    for e in expected {
        assert!(text.contains(e), "missing {e:?} in {text}");
    }
}

#[db_test(migrated)]
async fn a_same_named_table_in_another_schema_is_never_inspected(db: TestDatabase) {
    // The right table is in `app`; `public.notes` has a bad shape and must be ignored,
    // even when it is first on the search path.
    exec(
        db.pool(),
        "CREATE SCHEMA app;
        CREATE TABLE app.notes (id uuid PRIMARY KEY, tenant_id uuid, created_at timestamptz);
        CREATE TABLE public.notes (id text, tenant_id uuid, created_at timestamp);",
    )
    .await;
    let options = db
        .connect_options()
        .options([("search_path", "public, app")]);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    Cohort::builder(pool)
        .config(test_config())
        .rules(rules())
        .declaration(note("app.notes"))
        .build()
        .await
        .unwrap();
    // With `app` as the configured default schema, an unqualified table resolves there.
    let config = CohortConfig {
        default_table_schema: Some("app".into()),
        ..test_config()
    };
    let model = build_with(&db, vec![note("notes")], config)
        .await
        .unwrap()
        .ready()
        .await
        .unwrap();
    assert_eq!(
        model.entities[0].table,
        cohort::QualifiedName::new("app", "notes")
    );
    // And the bad public one really is rejected when named.
    expect_problems(
        &db,
        vec![note("public.notes")],
        &["public.notes"],
        &["is `timestamp without time zone`"],
    )
    .await;
}

#[db_test(migrated)]
async fn catalog_reads_cannot_be_shadowed_through_search_path(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    exec(db.pool(), "CREATE SCHEMA evil;
        CREATE VIEW evil.pg_class AS SELECT * FROM pg_catalog.pg_class WHERE false;
        CREATE VIEW evil.pg_namespace AS SELECT * FROM pg_catalog.pg_namespace WHERE false;
        CREATE VIEW evil.pg_attribute AS SELECT attrelid, attname, atttypid, atttypmod, attnum, attnotnull, attisdropped FROM pg_catalog.pg_attribute WHERE false;
        CREATE FUNCTION evil.version() RETURNS text LANGUAGE sql AS $$ SELECT 'CockroachDB'::text $$;
        CREATE FUNCTION evil.format_type(oid, int4) RETURNS text LANGUAGE sql AS $$ SELECT 'nonsense'::text $$;").await;
    let options = db
        .connect_options()
        .options([("search_path", "evil, pg_catalog, public")]);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    // The shadowing objects really shadow for unqualified names on this pool.
    let shadowed: String = sqlx::query_scalar("SELECT version()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(shadowed, "CockroachDB");
    let cohort = Cohort::builder(pool)
        .config(test_config())
        .rules(rules())
        .declaration(note("notes"))
        .build()
        .await
        .unwrap();
    let model = cohort.ready().await.unwrap();
    assert_eq!(model.entities[0].tenant.as_deref(), Some("tenant_id"));
}

#[db_test(migrated)]
async fn missing_index_is_advised_with_the_statement_to_create_it(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    exec(
        db.pool(),
        "CREATE TABLE globals (id bigint PRIMARY KEY, created_at timestamptz)",
    )
    .await;
    let globals = EntityDeclaration::new("Global", OTHER_ID)
        .category("notes")
        .anchor("created_at")
        .table("globals")
        .tenantless();
    assert_eq!(warnings(&db, vec![note("notes"), globals.clone()]).await, vec![
        "Note: no index starts with (tenant_id, created_at); sweeps will scan public.notes. Suggested: CREATE INDEX ON \"public\".\"notes\" (\"tenant_id\", \"created_at\");".to_string(),
        "Global: no index starts with (created_at); sweeps will scan public.globals. Suggested: CREATE INDEX ON \"public\".\"globals\" (\"created_at\");".to_string(),
    ]);
    exec(
        db.pool(),
        "CREATE INDEX ON notes (tenant_id, created_at, id); CREATE INDEX ON globals (created_at)",
    )
    .await;
    let left = warnings(&db, vec![note("notes"), globals]).await;
    assert!(left.is_empty(), "{left:?}");
}

/// A failed `CREATE INDEX CONCURRENTLY` leaves an invalid index behind
/// with the right columns; the planner never reads through it, so it must
/// not silence the advice. Once rebuilt, it does.
#[db_test(migrated)]
async fn an_index_left_invalid_by_a_failed_concurrent_build_is_still_advised_on(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    // Two rows with the same (tenant_id, created_at): a unique build fails.
    exec(
        db.pool(),
        "INSERT INTO notes SELECT gen_random_uuid(), tenant_id, created_at, 'twin' FROM notes",
    )
    .await;
    let failed = sqlx::raw_sql(
        "CREATE UNIQUE INDEX CONCURRENTLY notes_scan ON notes (tenant_id, created_at)",
    )
    .execute(db.pool())
    .await;
    assert!(failed.is_err(), "the concurrent build should fail");
    let invalid: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_index WHERE indexrelid = 'notes_scan'::regclass AND NOT indisvalid",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(invalid, 1, "the failed build left its invalid index behind");
    let advice = "Note: no index starts with (tenant_id, created_at); sweeps will scan public.notes. Suggested: CREATE INDEX ON \"public\".\"notes\" (\"tenant_id\", \"created_at\");".to_string();
    assert_eq!(warnings(&db, vec![note("notes")]).await, vec![advice]);
    // Rebuilt without the uniqueness it could not have, it serves.
    exec(
        db.pool(),
        "DROP INDEX notes_scan; CREATE INDEX notes_scan ON notes (tenant_id, created_at)",
    )
    .await;
    assert!(warnings(&db, vec![note("notes")]).await.is_empty());
}

/// A soft delete or an anonymisation leaves the rows it changed in the
/// (tenant, anchor) range later sweeps read: without a partial index that
/// leaves them out, each run reads past all of them. Validation advises
/// that index, the advice's own statement creates one that satisfies it,
/// and the planner then takes it for the sweep's statements.
#[db_test(engine)]
async fn rows_a_sweep_leaves_in_place_get_partial_index_advice(db: TestDatabase) {
    let advice = |warnings: &[String]| -> Vec<String> {
        warnings
            .iter()
            .filter(|w| w.contains("rows stay in the"))
            .cloned()
            .collect()
    };
    let warnings = engine_cohort(&db)
        .await
        .ready()
        .await
        .unwrap()
        .warnings
        .clone();
    assert_eq!(
        advice(&warnings),
        vec![
            "Contact: anonymised rows stay in the (tenant_id, created_at) range a sweep reads, so each sweep's first batch, its counts and the backlog gauge read past every row ever anonymised. Suggested: CREATE INDEX ON \"app\".\"contacts\" (\"tenant_id\", \"created_at\") WHERE \"anonymised_at\" IS NULL;".to_string(),
            "Ticket: soft-deleted rows stay in the (tenant_id, closed_at) range a sweep reads, so each sweep's first batch, its counts and the backlog gauge read past every row ever soft-deleted. Suggested: CREATE INDEX ON \"app\".\"tickets\" (\"tenant_id\", \"closed_at\") WHERE \"is_deleted\" IS NOT TRUE;".to_string(),
        ],
        "{warnings:?}"
    );
    // A full index on the same columns does not leave the changed rows out.
    exec(
        db.pool(),
        "CREATE INDEX ON app.tickets (tenant_id, closed_at); \
         CREATE INDEX ON app.contacts (tenant_id, created_at) WHERE anonymised_at IS NOT NULL",
    )
    .await;
    let warnings = engine_cohort(&db)
        .await
        .ready()
        .await
        .unwrap()
        .warnings
        .clone();
    assert_eq!(advice(&warnings).len(), 2, "{warnings:?}");
    // The suggested statements, run as printed, satisfy the advice.
    for line in advice(&warnings) {
        let sql = line.split("Suggested: ").nth(1).unwrap();
        exec(db.pool(), sql).await;
    }
    let warnings = engine_cohort(&db)
        .await
        .ready()
        .await
        .unwrap()
        .warnings
        .clone();
    assert!(advice(&warnings).is_empty(), "{warnings:?}");
    // With most of a tenant's tickets already deleted, the planner reads
    // the ones left through it.
    exec(
        db.pool(),
        "INSERT INTO app.tickets (tenant_id, closed_at, is_deleted, deleted_at, subject) \
         SELECT 'aaaaaaaa-0000-0000-0000-00000000000a', timestamptz '2025-01-01' - make_interval(secs => g), \
                true, timestamptz '2025-02-01', 'done ' || g FROM generate_series(1, 20000) g; \
         ANALYZE app.tickets",
    )
    .await;
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT t.id FROM app.tickets t WHERE t.tenant_id = $1 AND t.closed_at < $2 \
         AND t.is_deleted IS NOT TRUE ORDER BY t.closed_at LIMIT 1",
    )
    .bind(uuid::Uuid::parse_str(TENANT_A).unwrap())
    .bind(now())
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert!(
        plan.iter()
            .any(|l| l.contains("tickets_tenant_id_closed_at_idx1")),
        "{plan:?}"
    );
}

/// Where every read by the anchor leaves out the done rows with one
/// predicate (a category that only soft-deletes), the partial index the
/// done-rows advice suggests serves the sweep's scan as well: one index,
/// no advice. As soon as a strategy reads every row by the anchor (a
/// purge, here for all but one tenant), the full index is advised again,
/// and a partial index with another predicate never counts.
#[db_test(migrated)]
async fn a_done_rows_partial_index_serves_the_anchor_scan_only_when_every_read_uses_it(
    db: TestDatabase,
) {
    exec(db.pool(), NOTES).await;
    exec(
        db.pool(),
        "ALTER TABLE notes ADD COLUMN is_deleted boolean NOT NULL DEFAULT false; \
         CREATE INDEX notes_other ON notes (tenant_id, created_at) WHERE is_deleted",
    )
    .await;
    let entity = |category: &str| {
        EntityDeclaration::new("Note", NOTE_ID)
            .category(category)
            .anchor("created_at")
            .table("notes")
    };
    let advice = |category: &'static str| warnings(&db, vec![entity(category)]);
    let full = "Note: no index starts with (tenant_id, created_at); sweeps will scan public.notes. Suggested: CREATE INDEX ON \"public\".\"notes\" (\"tenant_id\", \"created_at\");";
    let done = "Note: soft-deleted rows stay in the (tenant_id, created_at) range a sweep reads, so each sweep's first batch, its counts and the backlog gauge read past every row ever soft-deleted. Suggested: CREATE INDEX ON \"public\".\"notes\" (\"tenant_id\", \"created_at\") WHERE \"is_deleted\" IS NOT TRUE;";
    // A partial index with another predicate serves neither.
    assert_eq!(
        advice("soft").await,
        vec![full.to_string(), done.to_string()]
    );
    // The done-rows index, created as advised, serves both.
    let sql = done.split("Suggested: ").nth(1).unwrap();
    exec(db.pool(), sql).await;
    assert!(advice("soft").await.is_empty());
    // `mixed` purges every tenant but one by the same anchor: the purge
    // reads soft-deleted rows too, which the partial index leaves out.
    assert_eq!(advice("mixed").await, vec![full.to_string()]);
    exec(db.pool(), "CREATE INDEX ON notes (tenant_id, created_at)").await;
    assert!(advice("mixed").await.is_empty());
    assert!(advice("soft").await.is_empty());
}

/// Subject columns without an index are advised on: erasing a subject,
/// placing a hold on one and the held counts while one is active would scan
/// the table. A multi-column index that starts with the column serves.
#[db_test(migrated)]
async fn a_subject_column_without_an_index_gets_advice(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    exec(
        db.pool(),
        "ALTER TABLE notes ADD COLUMN author uuid, ADD COLUMN editor uuid; \
         CREATE INDEX ON notes (tenant_id, created_at); CREATE INDEX ON notes (editor, created_at); \
         CREATE INDEX ON notes (author) WHERE author IS NOT NULL",
    )
    .await;
    let decl = || {
        note("notes")
            .subject("author", Some("user"))
            .subject("editor", Some("user"))
    };
    let model = build(&db, vec![decl()])
        .await
        .unwrap()
        .ready()
        .await
        .unwrap();
    assert_eq!(model.warnings, vec![
        "Note: no index starts with (author); erasing a subject, placing a hold on one and counting held rows while a subject hold is active will scan public.notes. Suggested: CREATE INDEX ON \"public\".\"notes\" (\"author\");".to_string(),
    ], "a partial index does not serve every lookup");
    exec(db.pool(), "CREATE INDEX ON notes (author)").await;
    let model = build(&db, vec![decl()])
        .await
        .unwrap()
        .ready()
        .await
        .unwrap();
    assert!(model.warnings.is_empty(), "{:?}", model.warnings);
}

#[db_test(empty)]
async fn cohort_tables_are_found_exactly_in_the_configured_schema(db: TestDatabase) {
    exec(db.pool(), NOTES).await;
    let mut conn = db.connect().await.unwrap();
    let report = cohort::schema::migrate(&mut conn, "retention")
        .await
        .unwrap();
    assert_eq!(
        (
            report.from_version,
            report.to_version,
            report.applied.clone()
        ),
        (
            0,
            cohort::schema::SCHEMA_VERSION,
            (1..=cohort::schema::SCHEMA_VERSION).collect::<Vec<_>>()
        )
    );
    // Not in public: the default configuration must not find them.
    let err = build(&db, vec![note("notes")]).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("not installed in schema \"public\""),
        "{err}"
    );
    let config = CohortConfig {
        schema: "retention".into(),
        default_table_schema: Some("public".into()),
        ..test_config()
    };
    build_with(&db, vec![note("notes")], config).await.unwrap();
}

#[db_test(migrated)]
async fn unvalidated_handle_checks_readiness_itself_and_caches_only_success(db: TestDatabase) {
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules())
        .declaration(note("notes"))
        .build_unvalidated()
        .unwrap();
    assert!(!cohort.is_ready());
    let err = cohort.ready().await.unwrap_err();
    assert!(
        err.to_string()
            .contains("table public.notes does not exist"),
        "{err}"
    );
    assert!(!cohort.is_ready(), "a failure must not be cached");
    exec(db.pool(), NOTES).await;
    cohort.ready().await.unwrap();
    assert!(cohort.is_ready());
    // Success is cached: dropping the table afterwards does not re-run validation.
    exec(db.pool(), "DROP TABLE notes").await;
    cohort.ready().await.unwrap();
}

#[db_test(migrated)]
async fn out_of_range_configuration_is_rejected_before_touching_the_database(db: TestDatabase) {
    let mut config = batches_of(0);
    config.dispatch.max_parallelism = 1000;
    let err = Cohort::builder(db.pool().clone())
        .config(test_config())
        .config(config)
        .build()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Config(_)), "{text}");
    assert!(
        text.contains("sweep_batch_size = 0 is out of range 1..=100000"),
        "{text}"
    );
    assert!(
        text.contains("dispatch.max_parallelism = 1000 is out of range 1..=256"),
        "{text}"
    );
}

#[tokio::test]
async fn something_that_is_not_postgres_is_rejected() {
    // A loopback listener that accepts and hangs up: not a PostgreSQL server.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        for _ in 0..4 {
            if let Ok((mut s, _)) = listener.accept().await {
                use tokio::io::AsyncWriteExt;
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            }
        }
    });
    let url = format!("postgres://u@{addr}/db?sslmode=disable&connect_timeout=2");
    let result = tokio::time::timeout(std::time::Duration::from_secs(20), Cohort::connect(&url))
        .await
        .expect("no hang");
    assert!(matches!(result, Err(Error::Database(_))), "{result:?}");
    server.abort();
}

#[allow(dead_code)] // the struct exists for its declaration only
mod derived {
    use chrono::{DateTime, Utc};
    use uuid::Uuid;

    #[derive(cohort::Retained)]
    #[retain(
        category = "contacts",
        anchor = "created_at",
        id = "b7316df4-7db5-46ad-aea7-f65c4b430f73",
        table = "crm.contacts"
    )]
    pub(crate) struct Contact {
        pub id: i64,
        #[retain(tenant)]
        pub org: Uuid,
        pub created_at: DateTime<Utc>,
        pub anonymised_at: Option<DateTime<Utc>>,
        #[anonymise(null)]
        pub email: Option<String>,
        #[anonymise(literal = "[redacted]")]
        pub phone: String,
        #[erasure_subject]
        pub user_id: Uuid,
        #[erasure_subject(kind = "user")]
        pub delegate_id: Option<Uuid>,
    }

    /// The same table, with the `anonymised_at` field left out of the struct.
    #[derive(cohort::Retained)]
    #[retain(
        category = "contacts",
        anchor = "created_at",
        id = "c0a8e4f2-5d1b-4e6a-9b7c-2f3e4d5a6b7c",
        table = "crm.contacts"
    )]
    pub(crate) struct ContactWithoutMarkerField {
        pub id: i64,
        #[retain(tenant)]
        pub org: Uuid,
        pub created_at: DateTime<Utc>,
        #[anonymise(null)]
        pub email: Option<String>,
    }
}

/// A derived type finds its markers among its own fields: when the table
/// has `anonymised_at` but the struct does not, the message says to add the
/// field (not the column, which exists).
#[db_test(migrated)]
async fn a_derived_type_missing_its_marker_field_is_told_to_add_the_field(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA crm; CREATE TABLE crm.contacts (id bigint PRIMARY KEY, org uuid NOT NULL,
        created_at timestamptz NOT NULL, anonymised_at timestamptz, email text)",
    )
    .await;
    let err = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules())
        .entity::<derived::ContactWithoutMarkerField>()
        .build()
        .await
        .expect_err("no marker field");
    let text = err.to_string();
    assert!(
        text.contains("the type has no field for the table's \"anonymised_at\" column")
            && text.contains(
                "add `anonymised_at: Option<chrono::DateTime<chrono::Utc>>` to the struct"
            ),
        "{text}"
    );
    assert!(
        !text.contains("add an `anonymised_at` timestamptz column"),
        "{text}"
    );
}

#[db_test(migrated)]
async fn derive_and_policy_file_resolve_to_the_same_entity(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE SCHEMA crm; CREATE TABLE crm.contacts (id bigint PRIMARY KEY, org uuid NOT NULL,
        created_at timestamptz NOT NULL, anonymised_at timestamptz, email text, phone text NOT NULL,
        user_id uuid NOT NULL, delegate_id uuid, notes text)",
    )
    .await;
    let from_derive = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules())
        .entity::<derived::Contact>()
        .build()
        .await
        .unwrap();
    let policy = cohort::policy::PolicyFile::parse(&format!(
        r#"
[[entity]]
name = "Contact"
id = "{CONTACT_ID}"
table = "crm.contacts"
category = "contacts"
anchor = "created_at"
tenant = "org"
subjects = ["user_id", {{ column = "delegate_id", kind = "user" }}]
anonymise = {{ email = "null", phone = {{ literal = "[redacted]" }} }}

[[category]]
name = "contacts"
strategy = "anonymise"
period = "90d"
"#
    ))
    .unwrap();
    let from_policy = Cohort::builder(db.pool().clone())
        .config(test_config())
        .policy(policy)
        .build()
        .await
        .unwrap();
    let a = from_derive.ready().await.unwrap().entities[0].clone();
    let b = from_policy.ready().await.unwrap().entities[0].clone();
    // Same table, columns, markers, methods and subjects; only the origin and
    // the Rust field list differ.
    assert_eq!(
        (a.id, &a.name, &a.category, &a.table, &a.anchor),
        (b.id, &b.name, &b.category, &b.table, &b.anchor)
    );
    assert_eq!(
        (
            &a.record_id,
            &a.tenant,
            &a.soft_delete,
            &a.deleted_at,
            &a.anonymised_at
        ),
        (
            &b.record_id,
            &b.tenant,
            &b.soft_delete,
            &b.deleted_at,
            &b.anonymised_at
        )
    );
    assert_eq!(a.anonymise, b.anonymise);
    assert_eq!(a.subjects, b.subjects);
    assert_eq!(a.tenant.as_deref(), Some("org"));
    assert!(a.declared_columns.is_some() && b.declared_columns.is_none());
}

#[db_test(migrated)]
async fn self_referencing_cascades_nullable_and_padded_keys_are_rejected(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE TABLE threads (id uuid PRIMARY KEY, tenant_id uuid, created_at timestamptz,
            reply_to uuid REFERENCES threads (id) ON DELETE CASCADE);
        CREATE TABLE nullable_keys (id uuid UNIQUE, tenant_id uuid, created_at timestamptz);
        CREATE TABLE padded_keys (id char(8) PRIMARY KEY, tenant_id uuid, created_at timestamptz);",
    )
    .await;
    expect_problems(&db, vec![note("threads")], &["threads"], &[
        "Note: foreign key \"threads_reply_to_fkey\" on public.threads is ON DELETE CASCADE from public.threads (entity Note, which may be purged)",
    ]).await;
    expect_problems(
        &db,
        vec![note("nullable_keys")],
        &["nullable_keys"],
        &["record key column \"id\" allows NULL"],
    )
    .await;
    expect_problems(
        &db,
        vec![note("padded_keys")],
        &["padded_keys"],
        &["record key column \"id\" is character(8)"],
    )
    .await;
}

/// Foreign keys among entities that may purge must not form a cycle: the
/// cycle is named at startup and nothing runs. The same cycle through
/// entities that only anonymise deletes nothing and is accepted.
#[db_test(migrated)]
async fn a_foreign_key_cycle_among_purging_entities_is_refused_with_the_cycle_named(
    db: TestDatabase,
) {
    exec(
        db.pool(),
        "CREATE TABLE app_a (id bigint PRIMARY KEY, b_id bigint, created_at timestamptz, anonymised_at timestamptz, email text);
         CREATE TABLE app_b (id bigint PRIMARY KEY, c_id bigint, created_at timestamptz, anonymised_at timestamptz, email text);
         CREATE TABLE app_c (id bigint PRIMARY KEY, a_id bigint REFERENCES app_a, created_at timestamptz, anonymised_at timestamptz, email text);
         ALTER TABLE app_a ADD FOREIGN KEY (b_id) REFERENCES app_b;
         ALTER TABLE app_b ADD FOREIGN KEY (c_id) REFERENCES app_c;
         INSERT INTO app_a VALUES (1, NULL, now() - interval '1 year', NULL, 'a@example.com');",
    )
    .await;
    let decl = |name: &str, id: &str, table: &str, category: &str| {
        let d = EntityDeclaration::new(name, id)
            .category(category)
            .anchor("created_at")
            .table(table)
            .tenantless();
        if category == "contacts" {
            d.anonymise("email", cohort::model::AnonymiseMethod::Null)
        } else {
            d
        }
    };
    let ids = [NOTE_ID, CONTACT_ID, OTHER_ID];
    let entities = |category: &str| {
        vec![
            decl("A", ids[0], "app_a", category),
            decl("B", ids[1], "app_b", category),
            decl("C", ids[2], "app_c", category),
        ]
    };
    let problems = expect_problems(&db, entities("notes"), &["app_a"], &["form a cycle"]).await;
    let named = problems
        .iter()
        .find(|p| p.contains("form a cycle"))
        .unwrap();
    assert!(
        named.contains("(A references B references C references A)"),
        "{named}"
    );
    assert_eq!(ledger_rows(db.pool(), "public").await, 0);
    // Anonymising the same three tables deletes nothing: accepted.
    let cohort = build(&db, entities("contacts")).await.unwrap();
    let model = cohort.ready().await.unwrap();
    assert_eq!(model.ordered().count(), 3);
}

/// A marker that rows carry without Cohort writing it makes a strategy
/// lie: an `anonymised_at` with a default hides new rows from every
/// anonymising sweep (shown first on a handle validated before the
/// default was added: the row is past its cutoff, `anonymise` reports 0,
/// the personal data stays); a NOT NULL `deleted_at` defaulting to the
/// epoch marks rows never soft deleted; a soft-delete flag defaulting to
/// true hides new rows. Validation refuses each, naming the column and
/// the statement that fixes it, and accepts the table once fixed.
#[db_test(engine)]
async fn a_marker_rows_carry_without_cohort_is_refused(db: TestDatabase) {
    let validated = engine_cohort(&db).await;
    exec(
        db.pool(),
        &format!(
            "ALTER TABLE app.contacts ALTER COLUMN anonymised_at SET DEFAULT now();
             INSERT INTO app.contacts (id, tenant_id, created_at, email, full_name, phone, reference, user_id)
             VALUES (900, '{TENANT_A}', '2025-01-01', 'kept@example.com', 'Kept', '+1', 'R', gen_random_uuid());"
        ),
    )
    .await;
    let run = validated
        .sweep(cohort::SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.contacts WHERE id = 900 AND email = 'kept@example.com'"
        )
        .await,
        1,
        "the hazard: a row past its cutoff keeps its personal data ({:?})",
        run.entity("Contact")
    );
    // The refusals, on a database no sweep has written to.
    let db = engine_db().await;
    exec(
        db.pool(),
        "ALTER TABLE app.contacts ALTER COLUMN anonymised_at SET DEFAULT now()",
    )
    .await;
    let problems = expect_problems(
        &db,
        engine_entities(),
        &["app.contacts"],
        &["anonymised_at marker column \"anonymised_at\" has a default (now())"],
    )
    .await;
    assert!(
        problems
            .iter()
            .any(|p| p
                .contains("ALTER TABLE app.contacts ALTER COLUMN \"anonymised_at\" DROP DEFAULT")),
        "{problems:?}"
    );
    exec(
        db.pool(),
        "ALTER TABLE app.contacts ALTER COLUMN anonymised_at DROP DEFAULT;
         UPDATE app.tickets SET deleted_at = 'epoch' WHERE deleted_at IS NULL;
         ALTER TABLE app.tickets ALTER COLUMN deleted_at SET DEFAULT 'epoch',
             ALTER COLUMN deleted_at SET NOT NULL, ALTER COLUMN is_deleted SET DEFAULT true;",
    )
    .await;
    expect_problems(
        &db,
        engine_entities(),
        &["app.tickets"],
        &[
            "deleted_at marker column \"deleted_at\" is NOT NULL",
            "ALTER TABLE app.tickets ALTER COLUMN \"deleted_at\" DROP NOT NULL",
            "deleted_at marker column \"deleted_at\" has a default",
            "soft-delete flag column \"is_deleted\" defaults to true",
        ],
    )
    .await;
    exec(
        db.pool(),
        "ALTER TABLE app.tickets ALTER COLUMN deleted_at DROP DEFAULT,
             ALTER COLUMN deleted_at DROP NOT NULL, ALTER COLUMN is_deleted SET DEFAULT false;",
    )
    .await;
    engine_cohort(&db).await;
}

/// A `{tenant}` literal is measured with the longest tenant id the tenant
/// column's type allows (a uuid is 36 characters): one that cannot fit its
/// `varchar(n)` is refused, naming why (every sweep of a tenant failed
/// with 22001 before); one that fits, and the same literal without the
/// tenant, are accepted.
#[db_test(migrated)]
async fn a_tenant_literal_that_cannot_fit_its_column_is_refused(db: TestDatabase) {
    exec(
        db.pool(),
        "CREATE TABLE contacts (id uuid PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
            anonymised_at timestamptz, full_name varchar(40) NOT NULL)",
    )
    .await;
    let contact = |literal: &str| {
        EntityDeclaration::new("Contact", CONTACT_ID)
            .category("contacts")
            .anchor("created_at")
            .table("contacts")
            .anonymise("full_name", AnonymiseMethod::Literal(literal.into()))
    };
    expect_problems(
        &db,
        vec![contact("[removed for {tenant}]")],
        &["contacts"],
        &["column \"full_name\" is character varying(40) but the literal anonymise method writes 50 characters, its {tenant} counted as the longest id of the tenant column (uuid: 36 characters)"],
    )
    .await;
    build(&db, vec![contact("[removed for tenant]")])
        .await
        .unwrap();
    exec(
        db.pool(),
        "ALTER TABLE contacts ALTER COLUMN full_name TYPE varchar(60)",
    )
    .await;
    build(&db, vec![contact("[removed for {tenant}]")])
        .await
        .unwrap();
}

/// Issue 37 A2, for a `text` tenant column (no bound of its own): a
/// `{tenant}` literal is measured against every tenant of the directory,
/// and one that does not fit is refused, naming the tenant. A tenant
/// found only at run time is checked when its sweep starts: the entity
/// fails with `kind=rule code=literal_too_long` before any batch (every
/// batch failed with SQLSTATE 22001 before), its rows are unchanged, and
/// a tenant that fits is anonymised.
#[tokio::test]
async fn a_tenant_literal_is_measured_against_each_tenant_of_a_text_tenant_column() {
    use cohort::{RunStatus, SweepRequest};
    let db = migrated_db().await;
    exec(
        db.pool(),
        "CREATE TABLE contacts (id uuid PRIMARY KEY, tenant_id text NOT NULL, created_at timestamptz,
            anonymised_at timestamptz, full_name varchar(16) NOT NULL);
         CREATE INDEX ON contacts (tenant_id, created_at);
         INSERT INTO contacts VALUES
            (gen_random_uuid(), 'acme', now() - interval '200 days', NULL, 'Ada'),
            (gen_random_uuid(), 'a-rather-long-tenant', now() - interval '200 days', NULL, 'Bob')",
    )
    .await;
    let contact = EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("contacts")
        .anonymise(
            "full_name",
            AnonymiseMethod::Literal("gone {tenant}".into()),
        );
    let with_directory = |tenants: &[&str]| {
        let mut b = Cohort::builder(db.pool().clone())
            .config(test_config())
            .rules(rules())
            .declaration(contact.clone());
        for t in tenants {
            b = b.tenant_entry(cohort::policy::TenantEntry::new(*t));
        }
        b
    };
    let err = with_directory(&["acme", "a-rather-long-tenant"])
        .build()
        .await
        .expect_err("a directory tenant whose literal cannot fit");
    let text = err.to_string();
    assert!(
        text.contains("the literal for column \"full_name\" (character varying(16)) writes 25 characters for tenant \"a-rather-long-tenant\", more than the column holds")
            && text.contains("(a tenant of the tenant directory)")
            && !text.contains("for tenant \"acme\""),
        "{text}"
    );

    let cohort = with_directory(&["acme"]).build().await.unwrap();
    let long = cohort
        .sweep(SweepRequest::tenanted(
            "a-rather-long-tenant",
            chrono::Utc::now(),
        ))
        .await
        .unwrap();
    assert_eq!(long.status, RunStatus::PartiallyFailed);
    assert!(
        long.failures[0]
            .error
            .contains("kind=rule code=literal_too_long"),
        "{:?}",
        long.failures
    );
    let short = cohort
        .sweep(SweepRequest::tenanted("acme", chrono::Utc::now()))
        .await
        .unwrap();
    assert_eq!(short.status, RunStatus::Succeeded);
    let names: Vec<(String, String)> =
        sqlx::query_as("SELECT tenant_id, full_name FROM contacts ORDER BY tenant_id")
            .fetch_all(db.pool())
            .await
            .unwrap();
    assert_eq!(
        names,
        vec![
            ("a-rather-long-tenant".to_owned(), "Bob".to_owned()),
            ("acme".to_owned(), "gone acme".to_owned()),
        ]
    );
}
