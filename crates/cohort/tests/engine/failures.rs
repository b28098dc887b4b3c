//! Failure isolation, cancellation, readiness, rule checks at run time,
//! observers and sanitised diagnostics.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL

use std::sync::{Arc, Mutex};

use crate::support::*;
use cohort::async_trait;
use cohort::model::{AnonymiseMethod, CustomAnonymiser};
use cohort::observer::{AuditEvent, AuditObserver};
use cohort::rules::{
    CategoryCapabilities, ResolutionContext, ResolveError, RetentionRule, RuleProvider, Strategy,
};
use cohort::{Cancel, Cohort, CohortConfig, Error, RunStatus, SweepRequest};

async fn cohort_with(
    db: &cohort_pgtemp::TestDatabase,
    config: CohortConfig,
    decls: Vec<cohort::EntityDeclaration>,
) -> Cohort {
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .config(config)
        .rules(rules());
    for d in decls {
        b = b.declaration(d);
    }
    b.build().await.unwrap()
}

#[tokio::test]
async fn one_entity_failing_mid_run_keeps_committed_batches_and_the_other_entities_work() {
    let db = engine_db().await;
    // Soft-deleting the '45d' ticket fails, with subject data in the message.
    exec(db.pool(), "CREATE FUNCTION app.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.subject = 'ticket 45d' THEN RAISE EXCEPTION 'cannot delete ticket of alice@example.com'; END IF; RETURN NEW; END $$;
        CREATE TRIGGER refuse BEFORE UPDATE ON app.tickets FOR EACH ROW EXECUTE FUNCTION app.refuse();").await;
    let config = batches_of(1);
    let cohort = cohort_with(&db, config, engine_entities()).await;
    let logs = logs::capture(logs::Format::Text);
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::PartiallyFailed);
    assert_eq!(result.failures.len(), 1);
    let failure = &result.failures[0];
    assert_eq!(failure.entity, "Ticket");
    assert!(
        failure
            .error
            .starts_with("kind=database code=P0001 diagnostic_id="),
        "{}",
        failure.error
    );
    assert!(!failure.error.contains("alice"));
    // The full error is in the log, under the same diagnostic id.
    let diagnostic_id = failure.error.rsplit('=').next().unwrap();
    let log = logs.text();
    let line = log
        .lines()
        .find(|l| l.contains(diagnostic_id))
        .unwrap_or_else(|| panic!("no log line for {diagnostic_id}:\n{log}"));
    assert!(
        line.contains("cannot delete ticket of alice@example.com"),
        "{line}"
    );
    // Oldest first: the 400d ticket's batch committed before the failing one; nothing after it ran.
    let deleted = labels(
        db.pool(),
        &format!("SELECT subject FROM app.tickets WHERE tenant_id = '{TENANT_A}' AND is_deleted"),
    )
    .await;
    assert_eq!(deleted, vec!["ticket 400d".to_string()]);
    assert_eq!(
        result.entity("Ticket").unwrap().affected,
        1,
        "never over-reports"
    );
    // The other entities did all their work.
    assert_eq!(result.entity("Note").unwrap().affected, 3);
    assert_eq!(result.entity("Contact").unwrap().affected, 3);
    let (status, _, settled, summaries) = ledger(db.pool(), result.run_id).await;
    assert_eq!((status.as_str(), settled), ("partially_failed", true));
    assert_eq!(summaries.iter().find(|s| s.0 == "Ticket").unwrap().2, 1);
    assert_eq!(summaries.iter().find(|s| s.0 == "Note").unwrap().2, 3);
    let (run_error, summary_error): (String, String) = sqlx::query_as(
        "SELECT r.error, s.error FROM sweep_run r JOIN sweep_run_entity_summary s USING (run_id) WHERE r.run_id = $1 AND s.entity_type = 'Ticket'",
    )
    .bind(result.run_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert!(
        run_error.contains(&failure.error) && summary_error == failure.error,
        "{run_error} / {summary_error}"
    );
    assert!(!run_error.contains("alice"));
}

#[tokio::test]
async fn per_row_detail_and_provenance_are_recorded_and_a_rolled_back_batch_leaves_none() {
    let db = engine_db().await;
    exec(db.pool(), "CREATE FUNCTION app.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF OLD.body LIKE '%:45d' THEN RAISE EXCEPTION 'no'; END IF; RETURN OLD; END $$;
        CREATE TRIGGER refuse BEFORE DELETE ON app.notes FOR EACH ROW EXECUTE FUNCTION app.refuse();").await;
    let rules = cohort::rules::StaticRuleProvider::builder()
        .category(
            "notes",
            RetentionRule::new(days(30), Strategy::Purge)
                .with_audit(cohort::AuditDetail::PerRow)
                .unwrap()
                .with_source("policy v3")
                .unwrap()
                .with_reason("ops data")
                .unwrap(),
        )
        .build()
        .unwrap();
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .config(batches_of(1))
        .rules(rules)
        .declaration(engine_entities().remove(0))
        .build()
        .await
        .unwrap();
    let ok = cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(ok.status, RunStatus::PartiallyFailed);
    assert_eq!(ok.entities[0].affected, 1);
    let details: Vec<(String, Option<String>, String, String)> = sqlx::query_as(
        "SELECT record_id, tenant_id, action, entity_type FROM sweep_run_row_detail WHERE run_id = $1",
    )
    .bind(ok.run_id)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(details.len(), 1, "only the committed batch has row detail");
    let purged_id: String = details[0].0.clone();
    assert_eq!(
        count(
            db.pool(),
            &format!("SELECT count(*) FROM app.notes WHERE id::text = '{purged_id}'")
        )
        .await,
        0
    );
    assert_eq!(
        (
            details[0].1.as_deref(),
            details[0].2.as_str(),
            details[0].3.as_str()
        ),
        (Some(TENANT_B), "purge", "Note")
    );
    let (source, reason): (String, String) = sqlx::query_as(
        "SELECT rule_source, rule_reason FROM sweep_run_entity_summary WHERE run_id = $1",
    )
    .bind(ok.run_id)
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!(
        (source.as_str(), reason.as_str()),
        ("policy v3", "ops data")
    );
}

struct Misbehaving;

#[async_trait]
impl RuleProvider for Misbehaving {
    fn capabilities(&self, category: &str) -> Option<CategoryCapabilities> {
        (category != "unknown-at-runtime").then(|| CategoryCapabilities::only(Strategy::Purge))
    }
    async fn resolve(&self, ctx: &ResolutionContext) -> Result<RetentionRule, ResolveError> {
        // The provider receives the run's logical time and tenant.
        if ctx.now != now()
            || ctx.tenant.tenant_id.is_none()
            || ctx.alias_path != vec![ctx.category.clone()]
        {
            return Err(ResolveError::Provider(format!(
                "unexpected context {ctx:?}"
            )));
        }
        match ctx.category.as_str() {
            // Declares only purge but returns soft delete for tenant B.
            "notes" if ctx.tenant.tenant_id.as_deref() == Some(TENANT_B) => {
                Ok(RetentionRule::new(days(30), Strategy::SoftDelete))
            }
            "notes" => Ok(RetentionRule::new(days(30), Strategy::Purge)),
            other => Err(ResolveError::UnknownCategory(other.to_owned())),
        }
    }
}

#[tokio::test]
async fn undeclared_strategies_and_unknown_categories_are_rejected_at_run_time() {
    let db = engine_db().await;
    let decls = engine_entities();
    let tickets_as_notes = cohort::EntityDeclaration::new("Ticket", TICKET_ID)
        .category("tickets")
        .anchor("closed_at")
        .table("app.tickets");
    let cohort = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(Misbehaving)
        .declaration(decls[0].clone())
        .declaration(tickets_as_notes)
        .build()
        .await
        .unwrap();
    let b = cohort
        .sweep(SweepRequest::tenanted(TENANT_B, now()))
        .await
        .unwrap();
    assert_eq!(b.status, RunStatus::PartiallyFailed);
    let errors: Vec<(&str, &str)> = b
        .failures
        .iter()
        .map(|f| (f.entity.as_str(), f.error.as_str()))
        .collect();
    assert!(
        errors
            .iter()
            .any(|(e, m)| *e == "Note" && m.starts_with("kind=rule code=undeclared_strategy")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|(e, m)| *e == "Ticket" && m.starts_with("kind=rule code=unknown_category")),
        "{errors:?}"
    );
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM app.notes").await,
        12,
        "nothing was mutated"
    );
    assert_eq!(
        count(
            db.pool(),
            "SELECT count(*) FROM app.tickets WHERE is_deleted"
        )
        .await,
        0
    );
    let (status, _, _, summaries) = ledger(db.pool(), b.run_id).await;
    assert_eq!((status.as_str(), summaries.len()), ("partially_failed", 0));
    // Tenant A resolves to the declared strategy and works.
    let a = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(a.entity("Note").unwrap().affected, 3);
}

#[tokio::test]
async fn a_cancelled_run_rolls_back_its_open_batch_and_settles_cancelled() {
    let db = engine_db().await;
    let token = Cancel::new();
    let trip = token.clone();
    // The custom anonymiser runs inside the batch, after the rows are locked: cancel there.
    let contact = cohort::EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("app.contacts")
        .anonymise("email", AnonymiseMethod::Null)
        .anonymise(
            "full_name",
            AnonymiseMethod::Custom(CustomAnonymiser::new("cancel_midway", move |v: &String| {
                trip.cancel();
                format!("masked {}", v.len())
            })),
        );
    let cohort = cohort_with(&db, test_config(), vec![contact]).await;
    let before = table_digest(db.pool(), "app.contacts").await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()).cancellation(token))
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Cancelled);
    assert_eq!(result.entities[0].affected, 0);
    assert_eq!(
        table_digest(db.pool(), "app.contacts").await,
        before,
        "the in-flight batch left its rows untouched"
    );
    let (status, _, settled, summaries) = ledger(db.pool(), result.run_id).await;
    assert_eq!((status.as_str(), settled), ("cancelled", true));
    assert_eq!(summaries[0].2, 0);
    assert_eq!(
        count(db.pool(), "SELECT count(*) FROM sweep_run_row_detail").await,
        0
    );

    // Cancelled before it starts: Started, then Cancelled, nothing else.
    let pre = Cancel::new();
    pre.cancel();
    let plain = engine_cohort(&db).await;
    let r = plain
        .sweep(SweepRequest::tenanted(TENANT_A, now()).cancellation(pre))
        .await
        .unwrap();
    assert_eq!((r.status, r.entities.len()), (RunStatus::Cancelled, 0));
    // The rows stay eligible for a later run.
    let later = plain
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(later.entity("Contact").unwrap().affected, 3);
}

#[allow(clippy::ptr_arg)] // a custom anonymiser receives &T of the column's Rust type
fn mask(v: &String) -> String {
    format!("{}***", &v[..2])
}

#[tokio::test]
async fn custom_anonymisers_see_typed_values_and_write_the_column_type() {
    let db = engine_db().await;
    let contact = cohort::EntityDeclaration::new("Contact", CONTACT_ID)
        .category("contacts")
        .anchor("created_at")
        .table("app.contacts")
        .anonymise(
            "reference",
            AnonymiseMethod::Custom(CustomAnonymiser::new("mask", mask)),
        )
        // integer column, typed input, i64 output converted to integer by PostgreSQL
        .anonymise(
            "score",
            AnonymiseMethod::Custom(CustomAnonymiser::new("bucket", |v: &Option<i32>| {
                v.map(|n| i64::from(n) * 100)
            })),
        )
        .anonymise("phone", AnonymiseMethod::Literal("[redacted]".into()));
    let cohort = cohort_with(&db, test_config(), vec![contact]).await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.entities[0].affected, 3);
    let rows: Vec<(String, Option<i32>, String, Option<String>)> = sqlx::query_as(
        "SELECT reference, score, phone, email FROM app.contacts WHERE tenant_id = $1::uuid AND anonymised_at IS NOT NULL ORDER BY id",
    )
    .bind(TENANT_A)
    .fetch_all(db.pool())
    .await
    .unwrap();
    assert_eq!(rows.len(), 3);
    for r in rows {
        assert_eq!(
            (r.0.as_str(), r.1, r.2.as_str()),
            ("RE***", Some(700), "[redacted]")
        );
        assert_eq!(
            r.3.as_deref(),
            Some("person@example.com"),
            "undeclared column untouched"
        );
    }
}

struct Failing;
#[async_trait]
impl AuditObserver for Failing {
    async fn on_event(
        &self,
        _: &AuditEvent,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Err("observer exploded".into())
    }
}

struct Hung;
#[async_trait]
impl AuditObserver for Hung {
    async fn on_event(
        &self,
        _: &AuditEvent,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        std::future::pending::<()>().await;
        Ok(())
    }
}

#[tokio::test]
async fn observers_get_committed_events_in_order_and_cannot_block_or_change_the_run() {
    let db = engine_db().await;
    let events: Events = Arc::default();
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .config(CohortConfig {
            sweep_batch_size: cohort::BatchSize::Fixed(2),
            observer_timeout: "1s".parse().unwrap(),
            ..test_config()
        })
        .rules(rules())
        .observer(Failing)
        .observer(Hung)
        .observer(Recorder(events.clone()));
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let cohort = b.build().await.unwrap();
    let started = std::time::Instant::now();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "a hung observer must not hold up the run"
    );
    assert_eq!(result.status, RunStatus::Succeeded);
    assert_eq!(result.affected(), 9);
    let seen = settled_events(&events).await;
    assert!(
        matches!(seen.first(), Some(AuditEvent::Started { run_id, .. }) if *run_id == result.run_id)
    );
    assert!(matches!(
        seen.last(),
        Some(AuditEvent::Settled {
            status: RunStatus::Succeeded,
            ..
        })
    ));
    // Per entity: progress totals grow batch by batch and the summary comes after its progress.
    for e in &result.entities {
        let mine: Vec<&AuditEvent> = seen
            .iter()
            .filter(|ev| matches!(ev, AuditEvent::EntityProgress { entity_id, .. } | AuditEvent::EntitySummary { entity_id, .. } if *entity_id == e.entity_id))
            .collect();
        let totals: Vec<u64> = mine
            .iter()
            .filter_map(|ev| match ev {
                AuditEvent::EntityProgress { total, .. } => Some(*total),
                _ => None,
            })
            .collect();
        if e.affected > 0 {
            assert_eq!(totals, vec![2, 3], "{}", e.entity);
        }
        assert!(
            matches!(mine.last(), Some(AuditEvent::EntitySummary { affected, .. }) if *affected == e.affected),
            "{}",
            e.entity
        );
    }
    let (status, _, _, _) = ledger(db.pool(), result.run_id).await;
    assert_eq!(status, "succeeded");
}

#[tokio::test]
async fn a_handle_built_without_validation_checks_readiness_before_writing_started() {
    let db = migrated_db().await;
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let cohort = b.build_unvalidated().unwrap();
    let err = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Validation(_)), "{err}");
    assert!(matches!(
        cohort
            .preview(cohort::PreviewRequest::tenanted(TENANT_A, now()))
            .await,
        Err(Error::Validation(_))
    ));
    assert_eq!(
        ledger_rows(db.pool(), "public").await,
        0,
        "no Started row before readiness"
    );
    exec(db.pool(), ENGINE_TABLES).await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Succeeded);
    assert_eq!(result.entity("Note").unwrap().affected, 3);
}

#[tokio::test]
async fn bad_sweep_requests_are_refused_before_anything_is_written() {
    let db = engine_db().await;
    let cohort = engine_cohort(&db).await;
    let err = cohort
        .sweep(SweepRequest::tenanted("not-a-tenant-uuid", now()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput(m) if m.contains("is not a valid uuid")),
        "{err}"
    );
    assert_eq!(ledger_rows(db.pool(), "public").await, 0);
    assert_eq!(count(db.pool(), "SELECT count(*) FROM app.notes").await, 12);
}

#[tokio::test]
async fn a_terminated_run_connection_settles_the_run_failed_with_no_half_batch() {
    let db = engine_db().await;
    factory::notes(TENANT_A)
        .created(factory::at("2025-12-31T23:59:59Z"))
        .spaced(chrono::TimeDelta::seconds(1))
        .numbered("bulk:")
        .count(40)
        .insert(db.pool())
        .await;
    struct Killer(sqlx::PgPool, Arc<Mutex<bool>>);
    #[async_trait]
    impl AuditObserver for Killer {
        async fn on_event(
            &self,
            event: &AuditEvent,
        ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
            if matches!(event, AuditEvent::EntityProgress { .. }) && !*self.1.lock().unwrap() {
                *self.1.lock().unwrap() = true;
                // The run's connection is the one holding an advisory lock
                // in this test's database (other tests share the cluster).
                sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
                    .execute(&self.0)
                    .await?;
            }
            Ok(())
        }
    }
    let mut b = Cohort::builder(db.pool().clone())
        .config(test_config())
        .config(batches_of(5))
        .rules(rules())
        .observer(Killer(db.pool().clone(), Arc::default()));
    b = b.declaration(engine_entities().remove(0));
    let cohort = b.build().await.unwrap();
    // Slow each batch down a little so the kill lands mid-run.
    exec(db.pool(), "CREATE FUNCTION app.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.02); RETURN OLD; END $$;
        CREATE TRIGGER slow BEFORE DELETE ON app.notes FOR EACH ROW EXECUTE FUNCTION app.slow();").await;
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Failed, "{result:?}");
    let affected = result.entities[0].affected;
    assert!(
        affected >= 5 && affected % 5 == 0,
        "only whole batches committed: {affected}"
    );
    let left = count(db.pool(), &format!("SELECT count(*) FROM app.notes WHERE tenant_id = '{TENANT_A}' AND created_at < '2026-05-02'")).await;
    assert_eq!(left as u64, 43 - affected, "reported = committed");
    let (status, _, settled, _) = ledger(db.pool(), result.run_id).await;
    assert_eq!((status.as_str(), settled), ("failed", true));
    // A rerun finishes the work.
    let rerun = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(rerun.entities[0].affected, 43 - affected);
}

/// The events of one run add up to its ledger: `Started` carries kind and
/// trigger; each entity's progress batches sum to its summary, and its
/// `EntitySummary` carries the summary row's values (the failed entity's
/// too, with its sanitised error); `Settled` carries the totals of the
/// summaries, the run's error and a duration.
#[tokio::test]
async fn the_events_of_a_run_add_up_to_its_ledger() {
    let db = engine_db().await;
    exec(db.pool(), "CREATE FUNCTION app.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.subject = 'ticket 45d' THEN RAISE EXCEPTION 'no'; END IF; RETURN NEW; END $$;
        CREATE TRIGGER refuse BEFORE UPDATE ON app.tickets FOR EACH ROW EXECUTE FUNCTION app.refuse();").await;
    let events: Events = Default::default();
    let mut b = Cohort::builder(db.pool().clone())
        .config(batches_of(1))
        .rules(rules())
        .observer(Recorder(events.clone()));
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let cohort = b.build().await.unwrap();
    let cancel_hold = cohort::holds::HoldRequest::new(
        uuid::Uuid::parse_str(NOTE_ID).unwrap(),
        count_text(db.pool(), "SELECT id::text FROM app.notes WHERE body = 'aaaaaaaa-0000-0000-0000-00000000000a:400d'").await,
        "case",
    )
    .tenant(TENANT_A);
    cohort.create_hold(cancel_hold).await.unwrap();
    let result = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::PartiallyFailed);
    let seen = settled_events(&events).await;
    let seen: Vec<&AuditEvent> = seen
        .iter()
        .filter(|e| match e {
            AuditEvent::Started { run_id, .. }
            | AuditEvent::EntityProgress { run_id, .. }
            | AuditEvent::RowDetail { run_id, .. }
            | AuditEvent::EntitySummary { run_id, .. }
            | AuditEvent::Settled { run_id, .. } => *run_id == result.run_id,
            _ => false,
        })
        .collect();
    assert!(matches!(
        seen.first(),
        Some(AuditEvent::Started {
            kind: cohort::RunKind::Sweep,
            trigger: cohort::Trigger::Manual,
            ..
        })
    ));

    // Every summary row of the ledger, as its event carries it.
    let rows: Vec<(uuid::Uuid, String, String, String, i64, i64, i64, i64, i64, i64, Option<String>, Option<chrono::DateTime<chrono::Utc>>)> = sqlx::query_as(
        "SELECT retention_entity_id, entity_type, category, strategy, affected_count, held_count, \
                skipped_count, null_anchor_count, kept_by_legal_min_count, kept_by_policy_count, error, cutoff \
         FROM public.sweep_run_entity_summary WHERE run_id = $1 ORDER BY summary_id",
    )
    .bind(result.run_id)
    .fetch_all(db.pool())
    .await
    .unwrap();
    let summaries: Vec<&AuditEvent> = seen
        .iter()
        .copied()
        .filter(|e| matches!(e, AuditEvent::EntitySummary { .. }))
        .collect();
    assert_eq!(summaries.len(), rows.len());
    let mut totals = [0u64; 6];
    for (event, row) in summaries.iter().zip(&rows) {
        let AuditEvent::EntitySummary {
            entity_id,
            entity,
            category,
            strategy,
            cutoff,
            affected,
            held,
            skipped,
            null_anchor,
            kept_by_legal_min,
            kept_by_policy,
            error,
            period,
            ..
        } = event
        else {
            unreachable!()
        };
        let n = |v: i64| v as u64;
        assert_eq!(
            (
                *entity_id,
                entity.as_str(),
                category.as_str(),
                strategy.as_str(),
                *affected,
                *held,
                *skipped,
                *null_anchor,
                *kept_by_legal_min,
                *kept_by_policy,
                error.as_deref(),
                *cutoff
            ),
            (
                row.0,
                row.1.as_str(),
                row.2.as_str(),
                row.3.as_str(),
                n(row.4),
                n(row.5),
                n(row.6),
                n(row.7),
                n(row.8),
                n(row.9),
                row.10.as_deref(),
                row.11
            ),
            "{entity}"
        );
        let outcome = result.entity(entity).unwrap();
        assert_eq!(*period, outcome.period);
        // Its progress batches add up to what it affected.
        let batches: u64 = seen
            .iter()
            .filter_map(|e| match e {
                AuditEvent::EntityProgress {
                    entity_id: id,
                    batch,
                    ..
                } if id == entity_id => Some(*batch),
                _ => None,
            })
            .sum();
        assert_eq!(batches, *affected, "{entity}");
        for (t, v) in totals.iter_mut().zip([
            *affected,
            *held,
            *skipped,
            *null_anchor,
            *kept_by_legal_min,
            *kept_by_policy,
        ]) {
            *t += v;
        }
    }
    let failed = summaries
        .iter()
        .find_map(|e| match e {
            AuditEvent::EntitySummary {
                entity,
                error: Some(err),
                ..
            } => Some((entity.clone(), err.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(failed.0, "Ticket");
    assert!(
        failed.1.starts_with("kind=database code=P0001"),
        "{}",
        failed.1
    );
    assert!(totals[1] >= 1, "the held note is counted");

    let run_error: Option<String> =
        sqlx::query_scalar("SELECT error FROM public.sweep_run WHERE run_id = $1")
            .bind(result.run_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    let Some(AuditEvent::Settled {
        kind,
        status,
        affected,
        held,
        skipped,
        null_anchor,
        kept_by_legal_min,
        kept_by_policy,
        error,
        ..
    }) = seen.last()
    else {
        panic!("the last event is Settled: {seen:?}")
    };
    assert_eq!(
        (*kind, *status, error.as_deref()),
        (
            cohort::RunKind::Sweep,
            RunStatus::PartiallyFailed,
            run_error.as_deref()
        )
    );
    assert_eq!(
        [
            *affected,
            *held,
            *skipped,
            *null_anchor,
            *kept_by_legal_min,
            *kept_by_policy
        ],
        totals
    );
    assert_eq!(*affected, result.affected());
}

async fn count_text(pool: &sqlx::PgPool, sql: &'static str) -> String {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}
