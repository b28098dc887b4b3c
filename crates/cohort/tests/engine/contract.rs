//! Contract defects found in review: where tables without a schema
//! resolve, settings nothing acts on yet, "is this record held?", runs dated
//! in the future, failures read back structurally, and request times in
//! any time zone.

use crate::support;
use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;

use cohort::holds::HoldRequest;
use cohort::rules::{
    CategoryCapabilities, ResolutionContext, ResolveError, RetentionRule, RuleProvider,
};
use cohort::{Cohort, Error, ErrorKind, RunStatus, SweepRequest};
use support::*;

/// SCHEMA-002: a table without a schema resolves to the configured default,
/// then `public`, never to Cohort's own ledger schema.
#[db_test(empty)]
async fn tables_without_a_schema_resolve_to_the_default_then_public(db: TestDatabase) {
    let mut conn = db.connect().await.unwrap();
    cohort::schema::migrate(&mut conn, "ledger").await.unwrap();
    exec(
        db.pool(),
        "CREATE TABLE public.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz);
         CREATE TABLE ledger.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz);
         CREATE SCHEMA app;
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz);",
    )
    .await;
    let decl = || {
        cohort::EntityDeclaration::new("Note", NOTE_ID)
            .category("notes")
            .anchor("created_at")
            .table("notes")
    };
    let build = |default_table_schema: Option<&str>| {
        let config = cohort::CohortConfig {
            schema: "ledger".into(),
            default_table_schema: default_table_schema.map(str::to_owned),
            ..test_config()
        };
        Cohort::builder(db.pool().clone())
            .config(config)
            .rules(rules())
            .declaration(decl())
            .build()
    };
    // A same-named table in the ledger schema makes the unqualified name
    // ambiguous (earlier versions resolved it there): refused.
    let err = build(None).await.unwrap_err();
    assert!(err.to_string().contains("ledger.notes exists too"), "{err}");
    exec(db.pool(), "DROP TABLE ledger.notes").await;
    let cohort = build(None).await.unwrap();
    let model = cohort.ready().await.unwrap();
    assert_eq!(model.entities[0].table.schema, "public");
    let cohort = build(Some("app")).await.unwrap();
    assert_eq!(
        cohort.ready().await.unwrap().entities[0].table.schema,
        "app"
    );
}

/// Settings that would do nothing as combined are reported, never
/// accepted silently; worker-only settings do not change manual runs.
#[db_test(engine)]
async fn settings_without_effect_are_reported_by_validation(db: TestDatabase) {
    let mut config = test_config();
    config.schedule = Some("0 2 * * *".into());
    config.dry_run = true;
    config.kill_switch = true;
    config.dispatch.batch_size = 7;
    config
        .apply_env([
            ("COHORT_PRUNE__BATCH_SIZE".to_string(), "50".to_string()),
            (
                "COHORT_PARTITION_LOCK_TIMEOUT".to_string(),
                "30s".to_string(),
            ),
        ])
        .unwrap();
    let mut b = Cohort::builder(db.pool().clone())
        .config(config)
        .rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let cohort = b.build().await.unwrap();
    let warnings = cohort.ready().await.unwrap().warnings.join("\n");
    let fragment = "[cohort.prune] batch_size or interval is set, but no run limit (succeeded_runs_older_than, failed_runs_older_than, runs_older_than) nor inactive_holds_older_than: nothing is pruned";
    assert!(
        warnings.contains(fragment),
        "{fragment:?} missing from\n{warnings}"
    );
    let fragment = "partition_lock_timeout is set, but no entity has partitions = \"drop\"";
    assert!(
        warnings.contains(fragment),
        "{fragment:?} missing from\n{warnings}"
    );
    // A manual sweep is not changed by the worker-only dry_run setting.
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(!r.dry_run && r.affected() > 0);
    // Zero prune ages are refused.
    let mut bad = test_config();
    bad.prune.runs_older_than = Some(cohort::rules::Period::ZERO);
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("prune.runs_older_than must be greater than zero"));
    // A lock time-out of 0 (wait for ever) or over 10 minutes is refused.
    for secs in [0, 601] {
        let mut bad = test_config();
        bad.partition_lock_timeout = cohort::rules::Period::from_seconds(secs).unwrap();
        let err = bad.validate().unwrap_err().to_string();
        assert!(
            err.contains("partition_lock_timeout") && err.contains("out of range"),
            "{err}"
        );
    }
}

/// "Is this record held?" for one record, whatever the spelling of its id.
#[db_test(engine)]
async fn is_held_answers_for_one_record(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let note: uuid::Uuid = sqlx::query_scalar(
        "SELECT id FROM app.notes WHERE body = 'aaaaaaaa-0000-0000-0000-00000000000a:45d'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let entity = uuid::Uuid::parse_str(NOTE_ID).unwrap();
    let upper = note.to_string().to_uppercase();
    assert!(!cohort.is_held(entity, &upper).await.unwrap());
    let hold = cohort
        .create_hold(HoldRequest::new(entity, note.to_string(), "case").tenant(TENANT_A))
        .await
        .unwrap();
    assert!(cohort.is_held(entity, &upper).await.unwrap());
    assert!(cohort
        .is_held(entity, &note.simple().to_string())
        .await
        .unwrap());
    cohort.release_hold(hold.hold_id).await.unwrap();
    assert!(!cohort.is_held(entity, &upper).await.unwrap());
    let err = cohort.is_held(entity, "not-a-uuid").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = cohort
        .is_held(uuid::Uuid::new_v4(), &upper)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

/// "Was this record held at that time?" (.NET's `HasActiveHoldAsync(asOf)`):
/// a hold counts from its creation until its release or expiry, whichever
/// comes first, on either spelling of the record id; errors as `is_held`.
#[db_test(engine)]
async fn is_held_as_of_follows_a_holds_life(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let note: uuid::Uuid = sqlx::query_scalar(
        "SELECT id FROM app.notes WHERE body = 'aaaaaaaa-0000-0000-0000-00000000000a:45d'",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let entity = uuid::Uuid::parse_str(NOTE_ID).unwrap();
    let upper = note.to_string().to_uppercase();
    let db_now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
        .fetch_one(db.pool())
        .await
        .unwrap();
    let days = chrono::TimeDelta::days;
    let expiring = cohort
        .create_hold(
            HoldRequest::new(entity, note.to_string(), "case")
                .tenant(TENANT_A)
                .expires_at(db_now + days(10)),
        )
        .await
        .unwrap();
    let at = |t| cohort.is_held_as_of(entity, &upper, t);
    assert!(
        !at(db_now - days(1)).await.unwrap(),
        "before it was created"
    );
    assert!(at(db_now + days(5)).await.unwrap(), "while it runs");
    assert!(!at(db_now + days(11)).await.unwrap(), "after it expires");
    // Released: held from creation until the release, not after.
    cohort.release_hold(expiring.hold_id).await.unwrap();
    let released: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT released_at FROM public.retention_hold")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert!(at(released - chrono::TimeDelta::microseconds(1))
        .await
        .unwrap());
    assert!(!at(released).await.unwrap());
    assert!(!cohort.is_held(entity, &upper).await.unwrap());
    // The record deleted meanwhile: still answered from the hold.
    sqlx::query("DELETE FROM app.notes WHERE id = $1")
        .bind(note)
        .execute(db.pool())
        .await
        .unwrap();
    assert!(at(released - chrono::TimeDelta::microseconds(1))
        .await
        .unwrap());
    let err = cohort
        .is_held_as_of(entity, "not-a-uuid", db_now)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

/// A mutating run dated later than the database clock is refused (nothing
/// written); dry runs and previews may look ahead; the caller may allow it.
#[db_test(engine)]
async fn a_future_now_is_refused_for_mutating_runs(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    let future = chrono::Utc::now() + chrono::Duration::days(30);
    let before = table_digest(db.pool(), "app.notes").await;
    let err = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, future))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Refused(m) if m.contains("later than the database clock")),
        "{err}"
    );
    let err = cohort
        .erase(cohort::erasure::ErasureRequest::tenanted(
            TENANT_A,
            cohort::erasure::ErasureScope::new("cccccccc-0000-0000-0000-00000000000c"),
            future,
        ))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused);
    assert_eq!(ledger_rows(db.pool(), "public").await, 0);
    assert_eq!(table_digest(db.pool(), "app.notes").await, before);
    // Looking ahead without changing anything is fine.
    let dry = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, future).dry_run(true))
        .await
        .unwrap();
    assert!(dry.dry_run);
    cohort
        .preview(cohort::PreviewRequest::tenanted(TENANT_A, future))
        .await
        .unwrap();
    // Explicitly allowed, it runs.
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, future).allow_future_now(true))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Succeeded);
}

/// A provider failing for one category: that entity fails before it has a
/// summary row.
struct FailsFor(&'static str);

#[cohort::async_trait]
impl RuleProvider for FailsFor {
    fn capabilities(&self, category: &str) -> Option<CategoryCapabilities> {
        rules().capabilities(category)
    }

    async fn resolve(&self, ctx: &ResolutionContext) -> Result<RetentionRule, ResolveError> {
        if ctx.category == self.0 {
            return Err(ResolveError::Provider("rules service unavailable".into()));
        }
        rules().resolve(ctx).await
    }
}

/// Failures are stored structurally: read back with their entity names,
/// also for entities that failed before they had a summary row.
#[db_test(engine)]
async fn failures_read_back_structurally(db: TestDatabase) {
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(FailsFor("contacts"));
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let cohort = b.build().await.unwrap();
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::PartiallyFailed);
    assert_eq!(r.failures.len(), 1);
    assert_eq!(r.failures[0].entity, "Contact");
    assert!(r.entity("Contact").is_none(), "no summary row for it");
    let shown = cohort.show_run(r.run_id).await.unwrap();
    assert_eq!(shown.failures, r.failures);
    assert_eq!(shown, r);
}

/// Database errors read as the server's message and SQLSTATE, without the
/// server's source line; `Debug` is as readable as `Display`.
#[db_test(engine)]
async fn database_errors_read_cleanly(db: TestDatabase) {
    let cohort = engine_cohort(&db).await;
    exec(db.pool(), "DROP TABLE public.retention_hold").await;
    let err = cohort
        .list_holds(&cohort::holds::HoldFilter::all())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("SQLSTATE 42P01"), "{text}");
    assert!(!text.contains(" at line "), "{text}");
    assert_eq!(err.kind(), ErrorKind::Database);
    assert_eq!(format!("{err:?}"), format!("[database] {text}"));
}
