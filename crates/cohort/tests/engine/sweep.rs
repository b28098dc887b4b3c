//! Sweeps end to end on real tables: every strategy, exact cutoffs, NULL
//! anchors, tenants, other schemas, dry runs and previews, with rows,
//! results and audit rows asserted together.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::{PreviewRequest, RunStatus, Strategy, SweepRequest};
use support::*;

const NOTES_A: &str = "SELECT split_part(body, ':', 2) FROM app.notes WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a'";
const NOTES_B: &str = "SELECT split_part(body, ':', 2) FROM app.notes WHERE tenant_id = 'bbbbbbbb-0000-0000-0000-00000000000b'";
const DECOY: &str = "SELECT split_part(body, ':', 2) FROM other.notes";

fn kept_labels() -> Vec<String> {
    let mut v = vec!["1d".to_string(), "null".into(), "on-cutoff".into()];
    v.sort();
    v
}

fn all_labels() -> Vec<String> {
    let mut v: Vec<String> = ["1d", "on-cutoff", "past-cutoff", "45d", "400d", "null"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.sort();
    v
}

#[db_test(engine)]
async fn sweep_applies_every_strategy_to_exactly_the_eligible_rows_of_one_tenant(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Succeeded);
    assert!(result.failures.is_empty());
    assert_eq!(result.tenant.as_deref(), Some(TENANT_A));

    // Purge: strictly older than the cutoff; the row exactly on it, newer rows and NULL anchors stay.
    assert_eq!(labels(db.pool(), NOTES_A).await, kept_labels());
    // Other tenant and other schema untouched.
    assert_eq!(labels(db.pool(), NOTES_B).await, all_labels());
    assert_eq!(labels(db.pool(), DECOY).await, all_labels());

    // Soft delete: only the markers changed, on exactly three rows.
    let deleted = count(db.pool(), &format!("SELECT count(*) FROM app.tickets WHERE tenant_id = '{TENANT_A}' AND is_deleted AND deleted_at IS NOT NULL")).await;
    assert_eq!(deleted, 3);
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.tickets WHERE is_deleted AND subject NOT IN ('ticket past-cutoff', 'ticket 45d', 'ticket 400d')").await, 0);

    // Anonymise: declared columns scrubbed, the rest intact, marker stamped in the same statement.
    let rows: Vec<(Option<String>, String, String, String, Option<i32>, bool)> = sqlx::query_as(
        "SELECT email, full_name, phone, reference, score, anonymised_at IS NOT NULL FROM app.contacts \
         WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a' ORDER BY id",
    )
    .fetch_all(db.pool())
    .await
    .unwrap();
    let scrubbed: Vec<_> = rows.iter().filter(|r| r.5).collect();
    assert_eq!(scrubbed.len(), 3);
    for r in &scrubbed {
        assert_eq!(
            (r.0.as_deref(), r.1.as_str(), r.2.as_str()),
            (None, "", "[redacted]")
        );
        assert_eq!(r.3.len(), 64, "HMAC-SHA256 hex of the original reference");
        assert!(!r.3.starts_with("REF-"));
        assert_eq!(r.4, Some(7), "undeclared columns stay");
    }
    for r in rows.iter().filter(|r| !r.5) {
        assert_eq!(r.0.as_deref(), Some("person@example.com"));
        assert!(r.3.starts_with("REF-"));
    }
    // Keyed: HMAC-SHA256 under the configured key, as RustCrypto computes
    // it, and not the unkeyed SHA-256 a dictionary would reverse.
    let expected_hash = test_hmac_hex("REF-45d");
    assert!(scrubbed.iter().any(|r| r.3 == expected_hash));
    let unkeyed: String =
        sqlx::query_scalar("SELECT encode(sha256(convert_to('REF-45d', 'UTF8')), 'hex')")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert!(scrubbed.iter().all(|r| r.3 != unkeyed));

    // Exempt: a visible zero.
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.invoices").await,
        5
    );
    // The tenantless entity is not part of a tenant pass.
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.globals").await,
        6
    );

    // Results and ledger agree.
    let by = |name: &str| result.entity(name).unwrap().clone();
    assert_eq!(
        (
            by("Note").affected,
            by("Note").null_anchor,
            by("Note").strategy
        ),
        (3, 1, Strategy::Purge)
    );
    assert_eq!((by("Contact").affected, by("Contact").null_anchor), (3, 1));
    assert_eq!((by("Ticket").affected, by("Ticket").null_anchor), (3, 1));
    assert_eq!(
        (by("Invoice").affected, by("Invoice").strategy),
        (0, Strategy::Exempt)
    );
    assert_eq!(
        by("Note").cutoff,
        Some(
            chrono::DateTime::parse_from_rfc3339("2026-05-02T00:00:00Z")
                .unwrap()
                .to_utc()
        )
    );
    let (status, dry, settled, summaries) = ledger(db.pool(), result.run_id).await;
    assert_eq!((status.as_str(), dry, settled), ("succeeded", false, true));
    let mut expected: Vec<(String, String, i64, i64, i64, i64)> = result
        .entities
        .iter()
        .map(|e| {
            (
                e.entity.clone(),
                e.strategy.as_str().to_string(),
                e.affected as i64,
                e.held as i64,
                e.skipped as i64,
                e.null_anchor as i64,
            )
        })
        .collect();
    let mut got = summaries.clone();
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
    assert_eq!(summaries.len(), 4);
}

#[db_test(engine)]
async fn rerunning_a_sweep_changes_nothing_more(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let ticket_times = labels(
        db.pool(),
        "SELECT deleted_at::text FROM app.tickets WHERE is_deleted",
    )
    .await;
    let contact_times = labels(
        db.pool(),
        "SELECT anonymised_at::text FROM app.contacts WHERE anonymised_at IS NOT NULL",
    )
    .await;
    let again = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(again.affected(), 0, "{again:?}");
    // Already deleted or anonymised rows are not processed again (markers keep their first times).
    assert_eq!(
        labels(
            db.pool(),
            "SELECT deleted_at::text FROM app.tickets WHERE is_deleted"
        )
        .await,
        ticket_times
    );
    assert_eq!(
        labels(
            db.pool(),
            "SELECT anonymised_at::text FROM app.contacts WHERE anonymised_at IS NOT NULL"
        )
        .await,
        contact_times
    );
    let (_, _, _, summaries) = ledger(db.pool(), again.run_id).await;
    assert!(summaries.iter().all(|s| s.2 == 0));
}

#[db_test(engine)]
async fn tenantless_pass_touches_only_tenantless_entities(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let result = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(result.entities.len(), 1);
    assert_eq!(result.entities[0].entity, "Global");
    assert_eq!(
        (result.entities[0].affected, result.entities[0].null_anchor),
        (3, 1)
    );
    assert_eq!(
        labels(db.pool(), "SELECT payload FROM app.globals").await,
        kept_labels()
    );
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.notes").await, 12);
    let (status, _, _, summaries) = ledger(db.pool(), result.run_id).await;
    assert_eq!(status, "succeeded");
    assert_eq!(
        summaries,
        vec![("Global".to_string(), "purge".to_string(), 3, 0, 0, 1)]
    );
    let tenant: Option<String> =
        sqlx::query_scalar("SELECT tenant_id FROM sweep_run WHERE run_id = $1")
            .bind(result.run_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(tenant, None);
}

#[db_test(engine)]
async fn zero_period_makes_rows_eligible_at_once_but_null_anchors_survive(db: TestDatabase) {
    let rules = cohort::rules::StaticRuleProvider::builder()
        .category(
            "notes",
            cohort::rules::RetentionRule::new(cohort::rules::Period::ZERO, Strategy::Purge),
        )
        .build()
        .unwrap();
    let cohort = cohort::Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules)
        .declaration(engine_entities().remove(0))
        .build()
        .await
        .unwrap();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(labels(db.pool(), NOTES_A).await, vec!["null".to_string()]);
    assert_eq!(
        (result.entities[0].affected, result.entities[0].null_anchor),
        (5, 1)
    );
    let (_, _, _, summaries) = ledger(db.pool(), result.run_id).await;
    assert_eq!(summaries[0].5, 1, "null anchors are reported");
}

#[db_test(engine)]
async fn dry_run_counts_and_audits_without_changing_a_row(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let before = table_digest(db.pool(), "app.notes").await;
    let contacts = table_digest(db.pool(), "app.contacts").await;
    let tickets = table_digest(db.pool(), "app.tickets").await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()).dry_run(true))
        .await
        .unwrap();
    assert!(result.dry_run);
    assert_eq!(table_digest(db.pool(), "app.notes").await, before);
    assert_eq!(table_digest(db.pool(), "app.contacts").await, contacts);
    assert_eq!(table_digest(db.pool(), "app.tickets").await, tickets);
    assert_eq!(result.entity("Note").unwrap().affected, 3);
    assert_eq!(result.entity("Contact").unwrap().affected, 3);
    assert_eq!(result.entity("Ticket").unwrap().null_anchor, 1);
    let (status, dry, _, summaries) = ledger(db.pool(), result.run_id).await;
    assert_eq!((status.as_str(), dry), ("succeeded", true));
    assert!(summaries
        .iter()
        .any(|s| s.0 == "Note" && s.2 == 3 && s.5 == 1));
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM sweep_run_row_detail").await,
        0
    );

    // The real sweep then changes what the dry run counted.
    let real = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    for e in &result.entities {
        assert_eq!(
            real.entity(&e.entity).unwrap().affected,
            e.affected,
            "{}",
            e.entity
        );
    }
}

#[db_test(engine)]
async fn preview_counts_and_writes_nothing(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let p = cohort
        .preview(PreviewRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(p.entities.len(), 4);
    assert_eq!(
        p.entities
            .iter()
            .find(|e| e.entity == "Note")
            .unwrap()
            .affected,
        3
    );
    assert_eq!(
        p.entities
            .iter()
            .find(|e| e.entity == "Invoice")
            .unwrap()
            .affected,
        0
    );
    assert_eq!(ledger_rows(db.pool(), "public").await, 0);
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.notes").await, 12);
    let t = cohort
        .preview(PreviewRequest::tenantless(now()))
        .await
        .unwrap();
    assert_eq!(
        (
            t.entities.len(),
            t.entities[0].affected,
            t.entities[0].null_anchor
        ),
        (1, 3, 1)
    );
}

#[db_test(engine)]
async fn legal_minimum_wins_over_a_shorter_period_with_the_exact_boundary_kept_and_counted(
    db: TestDatabase,
) {
    // Period 10 days but legal minimum 45 days: cutoff = now - 45d; the 45d row is exactly on it.
    let rules = cohort::rules::StaticRuleProvider::builder()
        .category(
            "notes",
            cohort::rules::RetentionRule::new(days(10), Strategy::Purge)
                .with_legal_min(days(45))
                .with_source("records act s.12")
                .unwrap(),
        )
        .build()
        .unwrap();
    let cohort = cohort::Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules)
        .declaration(engine_entities().remove(0))
        .build()
        .await
        .unwrap();
    // The rows the period alone would let go but the legal minimum keeps
    // (RS-037): anchored in [now - 45d, now - 10d), counted by PostgreSQL.
    let in_window = |pool: sqlx::PgPool| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM app.notes WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a' \
             AND created_at >= timestamptz '2026-06-01T00:00:00Z' - interval '45 days' \
             AND created_at < timestamptz '2026-06-01T00:00:00Z' - interval '10 days'",
        )
        .fetch_one(&pool)
        .await
        .unwrap() as u64
    };
    let kept = in_window(db.pool().clone()).await;
    assert_eq!(
        kept, 3,
        "on-cutoff, past-cutoff and 45d (on the legal cutoff)"
    );
    let preview = cohort
        .preview(cohort::PreviewRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(
        (
            preview.entities[0].affected,
            preview.entities[0].kept_by_legal_min
        ),
        (1, kept),
        "a preview says what the legal minimum keeps"
    );
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.entities[0].kept_by_legal_min, kept);
    assert_eq!(in_window(db.pool().clone()).await, kept, "and kept them");
    let mut expected: Vec<String> = ["1d", "on-cutoff", "past-cutoff", "45d", "null"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    expected.sort();
    assert_eq!(labels(db.pool(), NOTES_A).await, expected);
    assert_eq!(result.entities[0].affected, 1);
    assert_eq!(result.entities[0].legal_min, Some(days(45)));
    let stored: i64 = sqlx::query_scalar(
        "SELECT kept_by_legal_min_count FROM sweep_run_entity_summary WHERE run_id = $1",
    )
    .bind(result.run_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(stored as u64, kept, "the ledger counts them");
    let row = sqlx::query("SELECT resolved_period::text, legal_min::text, rule_source, cutoff FROM sweep_run_entity_summary WHERE run_id = $1")
        .bind(result.run_id)
        .fetch_one(db.pool())
        .await
        .unwrap();
    use sqlx::Row;
    assert_eq!(row.get::<String, _>(0), "10 days");
    assert_eq!(row.get::<String, _>(1), "45 days");
    assert_eq!(row.get::<String, _>(2), "records act s.12");
    assert_eq!(
        row.get::<chrono::DateTime<chrono::Utc>, _>(3),
        chrono::DateTime::parse_from_rfc3339("2026-04-17T00:00:00Z").unwrap()
    );
}

#[db_test(engine)]
async fn caller_times_with_any_offset_are_normalised_to_utc(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let same_instant = chrono::DateTime::parse_from_rfc3339("2026-06-01T05:30:00+05:30").unwrap();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, same_instant))
        .await
        .unwrap();
    assert_eq!(labels(db.pool(), NOTES_A).await, kept_labels());
    let logical: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT logical_now FROM sweep_run WHERE run_id = $1")
            .bind(result.run_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(logical, now());
}

#[db_test(engine)]
async fn small_batches_commit_alone_and_add_up(db: TestDatabase) {
    factory::notes(TENANT_A)
        .created(factory::at("2025-12-31T23:59:59Z"))
        .spaced(chrono::TimeDelta::seconds(1))
        .numbered("bulk:")
        .count(23)
        .insert(db.pool())
        .await;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let cohort = cohort::Cohort::builder(db.pool().clone())
        .config(batches_of(4))
        .rules(rules())
        .declaration(engine_entities().remove(0))
        .observer(Recorder(seen.clone()))
        .build()
        .await
        .unwrap();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.entities[0].affected, 26);
    assert_eq!(labels(db.pool(), NOTES_A).await, kept_labels());
    // 26 rows in batches of 4: seven committed batches, progress events in order.
    let events = settled_events(&seen).await;
    let batches: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            cohort::observer::AuditEvent::EntityProgress { batch, .. } => Some(*batch),
            _ => None,
        })
        .collect();
    assert_eq!(batches, vec![4, 4, 4, 4, 4, 4, 2]);
    let (_, _, _, summaries) = ledger(db.pool(), result.run_id).await;
    assert_eq!(summaries[0].2, 26);
}

#[db_test(engine)]
async fn the_ledger_reads_back_as_the_result(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let shown = cohort.show_run(result.run_id).await.unwrap();
    assert_eq!(shown, result);
    let dry = cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()).dry_run(true))
        .await
        .unwrap();
    let runs = cohort.list_runs(10).await.unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        (runs[0].run_id, runs[0].dry_run, runs[0].affected),
        (dry.run_id, true, 9)
    );
    assert_eq!((runs[1].run_id, runs[1].affected), (result.run_id, 9));
    assert!(matches!(
        cohort.show_run(uuid::Uuid::new_v4()).await,
        Err(cohort::Error::NotFound(_))
    ));
}

#[db_test(migrated)]
async fn dependents_go_first_and_rows_still_referenced_are_skipped_not_failed(db: TestDatabase) {
    exec(db.pool(), "CREATE SCHEMA app;
        CREATE TABLE app.cases (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz);
        CREATE TABLE app.case_notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz,
            case_id bigint NOT NULL REFERENCES app.cases (id) ON DELETE RESTRICT);
        INSERT INTO app.cases SELECT g, 'aaaaaaaa-0000-0000-0000-00000000000a', '2025-01-01' FROM generate_series(1, 3) g;
        INSERT INTO app.case_notes VALUES (10, 'aaaaaaaa-0000-0000-0000-00000000000a', '2025-01-01', 1),
                                          (20, 'aaaaaaaa-0000-0000-0000-00000000000a', '2025-01-01', 2);").await;
    // Declared parents first on purpose: the engine still purges the notes first.
    let cohort = cohort::Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules())
        .declaration(
            cohort::EntityDeclaration::new("Case", NOTE_ID)
                .category("notes")
                .anchor("created_at")
                .table("app.cases"),
        )
        .declaration(
            cohort::EntityDeclaration::new("CaseNote", OTHER_ID)
                .category("notes")
                .anchor("created_at")
                .table("app.case_notes"),
        )
        .build()
        .await
        .unwrap();
    cohort
        .create_hold(
            cohort::holds::HoldRequest::new(
                uuid::Uuid::parse_str(OTHER_ID).unwrap(),
                "10",
                "evidence",
            )
            .tenant(TENANT_A),
        )
        .await
        .unwrap();
    let preview = cohort
        .preview(PreviewRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let case_preview = preview
        .entities
        .iter()
        .find(|e| e.entity == "Case")
        .unwrap()
        .clone();
    assert_eq!(
        (case_preview.affected, case_preview.skipped),
        (1, 2),
        "before the notes go, cases 1 and 2 are referenced"
    );
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Succeeded, "{result:?}");
    assert_eq!(
        result
            .entities
            .iter()
            .map(|e| e.entity.as_str())
            .collect::<Vec<_>>(),
        vec!["CaseNote", "Case"]
    );
    let notes = result.entity("CaseNote").unwrap();
    assert_eq!((notes.affected, notes.held), (1, 1));
    let cases = result.entity("Case").unwrap();
    assert_eq!(
        (cases.affected, cases.skipped),
        (2, 1),
        "case 1 is still referenced by a held note"
    );
    assert_eq!(
        labels(db.pool(), "SELECT id::text FROM app.cases").await,
        vec!["1".to_string()]
    );
    let (_, _, _, summaries) = ledger(db.pool(), result.run_id).await;
    assert!(
        summaries.contains(&("Case".to_string(), "purge".to_string(), 2, 0, 1, 0)),
        "{summaries:?}"
    );
}

/// The end-of-entity counts find held rows through the active holds' keys
/// when they can be bound, and by reading the rows otherwise (more than
/// 100 000 active holds, or a hold whose record id cannot be a key): the
/// figures agree, and the held rows and NULL anchors are counted exactly.
#[tokio::test]
async fn held_and_null_anchor_counts_agree_however_the_holds_are_read() {
    let note = uuid::Uuid::parse_str(NOTE_ID).unwrap();
    // (extra holds placed on records that do not exist, expected held)
    let cases = [
        ("", 1),
        (
            "SELECT gen_random_uuid()::text FROM generate_series(1, 100001)",
            1,
        ),
        ("SELECT 'not-a-uuid'", 1),
    ];
    for (extra, held) in cases {
        let db = engine_db().await;
        let cohort = engine_cohort(&db).await;
        let target: uuid::Uuid = sqlx::query_scalar("SELECT id FROM app.notes WHERE body = $1")
            .bind(format!("{TENANT_A}:45d"))
            .fetch_one(db.pool())
            .await
            .unwrap();
        cohort
            .create_hold(
                cohort::holds::HoldRequest::new(note, target.to_string(), "case").tenant(TENANT_A),
            )
            .await
            .unwrap();
        // A released hold on another eligible row protects nothing.
        let released: uuid::Uuid = sqlx::query_scalar("SELECT id FROM app.notes WHERE body = $1")
            .bind(format!("{TENANT_A}:400d"))
            .fetch_one(db.pool())
            .await
            .unwrap();
        let hold = cohort
            .create_hold(
                cohort::holds::HoldRequest::new(note, released.to_string(), "old").tenant(TENANT_A),
            )
            .await
            .unwrap();
        cohort.release_hold(hold.hold_id).await.unwrap();
        if !extra.is_empty() {
            exec(
                db.pool(),
                &format!(
                    "INSERT INTO public.retention_hold (hold_id, retention_entity_id, record_id, reason, created_at) \
                     SELECT gen_random_uuid(), '{NOTE_ID}', r, 'bulk', now() FROM ({extra}) AS x(r);"
                ),
            )
            .await;
        }
        let result = cohort
            .sweep(SweepRequest::tenanted(TENANT_A, now()))
            .await
            .unwrap();
        let notes = result
            .entities
            .iter()
            .find(|o| o.entity_id == note)
            .unwrap();
        assert_eq!(
            (notes.affected, notes.held, notes.null_anchor),
            (2, held, 1),
            "extra holds: {extra:?}"
        );
        assert!(sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM app.notes WHERE id = $1)"
        )
        .bind(target)
        .fetch_one(db.pool())
        .await
        .unwrap());
    }
}

/// Per-row audit set per entity wins over its category's: a summary-audit
/// category with an entity set to `per_row` records every changed record
/// id; a per-row category with an entity set to `summary` records none.
/// The policy file and the builder say the same; a bad value is refused.
#[tokio::test]
async fn an_entitys_audit_setting_wins_over_its_categorys() {
    use cohort::rules::AuditDetail;
    let db = engine_db().await;
    let rules = cohort::rules::StaticRuleProvider::builder()
        .category(
            "notes",
            cohort::rules::RetentionRule::new(days(30), cohort::rules::Strategy::Purge),
        )
        .category(
            "soft",
            cohort::rules::RetentionRule::new(days(10), cohort::rules::Strategy::SoftDelete)
                .with_audit(AuditDetail::PerRow)
                .unwrap(),
        )
        .build()
        .unwrap();
    let entities = engine_entities();
    let note = entities[0].clone().audit(AuditDetail::PerRow);
    let ticket = entities[2].clone().audit(AuditDetail::Summary);
    let cohort = cohort::Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules)
        .declaration(note)
        .declaration(ticket)
        .build()
        .await
        .unwrap();
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let details = |entity: &'static str| {
        let pool = db.pool().clone();
        let run = r.run_id;
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM public.sweep_run_row_detail WHERE run_id = $1 AND entity_type = $2",
            )
            .bind(run)
            .bind(entity)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let notes = r.entity("Note").unwrap().affected;
    assert!(notes > 0 && r.entity("Ticket").unwrap().affected > 0);
    assert_eq!(
        details("Note").await as u64,
        notes,
        "the entity's per_row wins"
    );
    assert_eq!(details("Ticket").await, 0, "the entity's summary wins");

    let policy = |audit: &str| {
        format!(
            "[[category]]\nname = \"notes\"\nstrategy = \"purge\"\nperiod = \"30d\"\n\n\
             [[entity]]\nname = \"Note\"\nid = \"{NOTE_ID}\"\ntable = \"app.notes\"\ncategory = \"notes\"\n\
             anchor = \"created_at\"\naudit = \"{audit}\"\n"
        )
    };
    let p = cohort::policy::PolicyFile::parse(&policy("per_row")).unwrap();
    let from_file = cohort::Cohort::builder(db.pool().clone())
        .policy(p)
        .build()
        .await
        .unwrap();
    let model = from_file.ready().await.unwrap();
    assert_eq!(
        model.ordered().next().unwrap().audit,
        Some(AuditDetail::PerRow)
    );
    let bad = cohort::policy::PolicyFile::parse(&policy("every_row"));
    let message = match bad {
        Err(e) => e.to_string(),
        Ok(p) => cohort::Cohort::builder(db.pool().clone())
            .policy(p)
            .build()
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default(),
    };
    assert!(
        message.contains("unknown audit setting \"every_row\""),
        "{message}"
    );
}

/// A literal is a template computed once per run and applied in SQL to
/// the whole batch: `{now}` is the run's logical time, `{tenant}` the
/// pass's tenant, `{{`/`}}` braces; an unknown placeholder is refused at
/// validation, before anything runs.
#[tokio::test]
async fn literal_templates_render_once_per_run_with_its_now_and_tenant() {
    use cohort::model::AnonymiseMethod;
    let db = engine_db().await;
    let contact = |literal: &str| {
        cohort::EntityDeclaration::new("Contact", CONTACT_ID)
            .category("contacts")
            .anchor("created_at")
            .table("app.contacts")
            .anonymise("phone", AnonymiseMethod::Literal(literal.into()))
    };
    let build = |literal: &str| {
        cohort::Cohort::builder(db.pool().clone())
            .config(test_config())
            .rules(rules())
            .declaration(contact(literal))
            .build()
    };
    let err = build("erased {when}").await.unwrap_err().to_string();
    assert!(err.contains("unknown placeholder at \"{when}\""), "{err}");
    let cohort = build("erased {now} in {tenant} {{kept}}").await.unwrap();
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    let affected = r.entity("Contact").unwrap().affected;
    assert!(affected > 0);
    let phones = labels(
        db.pool(),
        "SELECT DISTINCT phone FROM app.contacts WHERE anonymised_at IS NOT NULL",
    )
    .await;
    assert_eq!(
        phones,
        vec![format!(
            "erased 2026-06-01T00:00:00Z in {TENANT_A} {{kept}}"
        )]
    );
}

/// `sweep_batch_size = "auto"`: the batches are sized from their measured
/// time, within bounds (smaller where rows are read into the process, as
/// the hashed column here), change exactly the rows a fixed size does, and
/// the size each entity reached is recorded in the ledger and read back.
#[db_test(engine)]
async fn auto_sized_batches_change_the_same_rows_and_record_their_size(db: TestDatabase) {
    let bulk_notes = async |pool| {
        factory::notes(TENANT_A)
            .created(factory::at("2025-12-31T23:59:59Z"))
            .spaced(chrono::TimeDelta::seconds(1))
            .numbered("bulk:")
            .count(12000)
            .insert(pool)
            .await
    };
    bulk_notes(db.pool()).await;
    let seed = "INSERT INTO app.contacts (id, tenant_id, created_at, email, full_name, phone, reference, user_id)
         SELECT 1000 + g, 'aaaaaaaa-0000-0000-0000-00000000000a', timestamptz '2025-06-01' - make_interval(secs => g),
                'bulk@example.com', 'Bulk ' || g, '+1', 'R' || g, gen_random_uuid()
         FROM generate_series(1, 12000) g;";
    exec(db.pool(), seed).await;
    let engine = |size: cohort::BatchSize| {
        engine_cohort_on(
            db.pool().clone(),
            cohort::CohortConfig {
                sweep_batch_size: size,
                ..test_config()
            },
        )
    };
    let auto = engine(cohort::BatchSize::Auto).await;
    let preview = auto
        .sweep(SweepRequest::tenanted(TENANT_A, now()).dry_run(true))
        .await
        .unwrap();
    assert!(
        preview.entities.iter().all(|e| e.batch_size.is_none()),
        "a dry run runs no batch"
    );
    let r = auto
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    let note = r.entity("Note").unwrap();
    let contact = r.entity("Contact").unwrap();
    assert_eq!(
        note.affected,
        12000 + 3,
        "every old note, the fixtures' too"
    );
    assert_eq!(
        contact.affected,
        preview.entity("Contact").unwrap().affected
    );
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.contacts WHERE id > 1000 AND anonymised_at IS NULL"
        )
        .await,
        0
    );
    let size = |o: &cohort::EntityOutcome| o.batch_size.expect("batches ran");
    assert!(
        (cohort::config::AUTO_BATCH_MIN..=cohort::config::AUTO_BATCH_MAX).contains(&size(note)),
        "{note:?}"
    );
    // The hashed column is computed in Rust: its rows are read into the
    // process, so its batches stay smaller.
    assert!(
        (cohort::config::AUTO_BATCH_MIN..=cohort::config::AUTO_BATCH_MAX_LOADED)
            .contains(&size(contact)),
        "{contact:?}"
    );
    // In the ledger, and read back.
    let stored: Vec<(String, Option<i32>)> = sqlx::query_as(
        "SELECT entity_type, batch_size FROM public.sweep_run_entity_summary WHERE run_id = $1 ORDER BY entity_type",
    )
    .bind(r.run_id)
    .fetch_all(db.pool())
    .await
    .unwrap();
    for (entity, stored) in &stored {
        let o = r.entity(entity).unwrap();
        assert_eq!(stored.map(|n| n as u32), o.batch_size, "{entity}");
    }
    let shown = auto.show_run(r.run_id).await.unwrap();
    assert_eq!(
        shown.entity("Note").unwrap().batch_size,
        note.batch_size,
        "history reads it back"
    );

    // A fixed size records itself, and changes the same rows.
    exec(db.pool(), "DELETE FROM app.contacts WHERE id > 1000").await;
    exec(db.pool(), seed).await;
    bulk_notes(db.pool()).await;
    let fixed = engine(cohort::BatchSize::Fixed(700)).await;
    let f = fixed
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(f.entity("Note").unwrap().batch_size, Some(700));
    assert_eq!(f.entity("Note").unwrap().affected, 12000);
    assert_eq!(f.entity("Contact").unwrap().affected, 12000);
}

/// Issue 39: what happened to one record is read back by record, through
/// the hash index on `record_id` (a lookup, not a scan of the ledger):
/// the record's id is read in the entity's key type (`0003` is `3`), a
/// record with no detail has an empty history, and an id the key type
/// cannot hold is refused as bad input.
#[db_test(engine)]
async fn a_records_history_is_an_index_lookup_in_its_key_type(db: TestDatabase) {
    let rules = cohort::rules::StaticRuleProvider::builder()
        .category(
            "notes",
            cohort::rules::RetentionRule::new(days(30), Strategy::Purge)
                .with_audit(cohort::AuditDetail::PerRow)
                .unwrap(),
        )
        .build()
        .unwrap();
    let global = engine_entities().remove(4);
    let cohort = cohort::Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules)
        .declaration(global)
        .build()
        .await
        .unwrap();
    let entity: uuid::Uuid = GLOBAL_ID.parse().unwrap();
    // Details of another entity, enough that reading the ledger in full
    // would not be the planner's choice.
    exec(
        db.pool(),
        "INSERT INTO sweep_run (run_id, kind, trigger, dry_run, status, logical_now, settled_at) \
           VALUES ('00000000-0000-0000-0000-0000000000f1', 'sweep', 'manual', false, 'succeeded', now(), now());
         INSERT INTO sweep_run_row_detail (run_id, retention_entity_id, entity_type, record_id, action) \
           SELECT '00000000-0000-0000-0000-0000000000f1', gen_random_uuid(), 'Other', g::text, 'purge' \
           FROM generate_series(1, 20000) g;
         ANALYZE sweep_run_row_detail;",
    )
    .await;
    let run = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    assert_eq!(run.status, RunStatus::Succeeded);
    // Globals 3, 4 and 5 are past the 30-day cutoff (see ENGINE_TABLES).
    assert_eq!(run.entities[0].affected, 3);

    let scans = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'sweep_run_row_detail_record_hash'",
        )
        .fetch_one(db.pool())
        .await
        .unwrap()
    };
    let before = scans().await;
    let history = cohort.record_history(entity, "0003").await.unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    let event = &history[0];
    assert_eq!(
        (
            event.run_id,
            event.kind,
            event.action.as_str(),
            event.tenant.as_deref()
        ),
        (run.run_id, cohort::RunKind::Sweep, "purge", None)
    );
    assert_eq!(event.status, RunStatus::Succeeded);
    // The lookup went through the hash index (statistics reach the view
    // when the reading session reports them).
    wait_until(
        "the record lookup to show in the index's statistics",
        std::time::Duration::from_secs(30),
        async || scans().await > before,
    )
    .await;

    // A record no run changed has no history; one the key cannot hold is bad input.
    assert!(cohort.record_history(entity, "1").await.unwrap().is_empty());
    let err = cohort.record_history(entity, "three").await.unwrap_err();
    assert!(matches!(err, cohort::Error::InvalidInput(_)), "{err}");
}
