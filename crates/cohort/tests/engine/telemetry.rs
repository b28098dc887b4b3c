//! Tracing as operators ship it (JSON lines with their spans): one span per
//! run, entity, batch and delivery with the SPEC's fields, events at the
//! right levels, and no row value anywhere. Audit observers get a run's
//! committed events in order and cannot block or change the run; the
//! events of a run add up to its ledger.
#![allow(clippy::type_complexity)] // tuple rows read back from SQL

use cohort_pgtemp::TestDatabase;
use cohort_test_macros::db_test;
use std::sync::Arc;

use crate::support::*;
use cohort::async_trait;
use cohort::handlers::{
    AfterContext, BeforeContext, HandlerError, HandlerRegistration, RowHandler,
};
use cohort::holds::HoldRequest;
use cohort::observer::{AuditEvent, AuditObserver};
use cohort::{Cohort, CohortConfig, RunStatus, SweepRequest};
use serde_json::Value;
use uuid::Uuid;

fn lines(logs: &logs::Capture) -> Vec<Value> {
    logs.text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The span named `name` around an event, if any: the event's own span
/// (`span`, which is also its explicit parent) or one enclosing it.
fn span<'a>(event: &'a Value, name: &str) -> Option<&'a Value> {
    std::iter::once(&event["span"])
        .chain(event["spans"].as_array().into_iter().flatten())
        .find(|s| s["name"] == name)
}

struct Body(String);

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for Body {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        Ok(Body(row.try_get("body")?))
    }
}

/// Captures the body (a row value) and always fails to deliver.
struct Refusing;

#[cohort::async_trait]
impl RowHandler<Body> for Refusing {
    async fn on_before(&self, row: &Body, ctx: &mut BeforeContext) -> Result<(), HandlerError> {
        ctx.snapshot.insert("body", row.0.clone())?;
        Ok(())
    }

    async fn on_after(&self, _ctx: &AfterContext) -> Result<(), HandlerError> {
        Err("the archive is down".into())
    }
}

/// RS-008: spans and events of a sweep and a dispatch.
#[tokio::test]
async fn runs_entities_batches_and_deliveries_have_spans_with_their_fields_and_no_row_values() {
    let captured = logs::capture(logs::Format::Json);
    let db = engine_db().await;
    // Every note body is a value that must never reach a log.
    exec(
        db.pool(),
        "UPDATE app.notes SET body = 'secret-body-' || id",
    )
    .await;
    let config = CohortConfig {
        sweep_batch_size: cohort::BatchSize::Fixed(1),
        dispatch: cohort::config::DispatchConfig {
            max_attempts: 1,
            ..Default::default()
        },
        ..test_config()
    };
    let note = Uuid::parse_str(NOTE_ID).unwrap();
    let mut b = Cohort::builder(db.pool().clone())
        .config(config)
        .rules(rules());
    for d in engine_entities() {
        b = b.declaration(d);
    }
    let cohort = b
        .handler::<Body, _>(HandlerRegistration::new(note, "archive"), Refusing)
        .build()
        .await
        .unwrap();
    let held: Uuid = sqlx::query_scalar(
        "SELECT id FROM app.notes WHERE tenant_id = 'aaaaaaaa-0000-0000-0000-00000000000a' AND created_at < '2026-04-01' LIMIT 1",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    cohort
        .create_hold(HoldRequest::new(note, held.to_string(), "case").tenant(TENANT_A))
        .await
        .unwrap();
    let r = cohort
        .sweep(SweepRequest::tenanted(TENANT_A, now()))
        .await
        .unwrap();
    assert_eq!(r.status, RunStatus::Succeeded);
    let notes = r.entity("Note").unwrap();
    assert!(notes.affected >= 2 && notes.held == 1, "{notes:?}");
    let flushed = cohort.dispatcher().flush().await.unwrap();
    assert_eq!(flushed.dead_lettered, notes.affected);

    let logs = lines(&captured);
    let run_id = r.run_id.to_string();
    let mine: Vec<&Value> = logs
        .iter()
        .filter(|l| span(l, "cohort.run").is_some_and(|s| s["run_id"] == run_id.as_str()))
        .collect();
    // The run span carries its fields on every event inside it.
    let started = mine
        .iter()
        .find(|l| l["fields"]["message"] == "run started")
        .expect("run started");
    assert_eq!(started["level"], "INFO");
    let run = span(started, "cohort.run").unwrap();
    assert_eq!(run["kind"], "sweep");
    assert_eq!(run["trigger"], "manual");
    assert_eq!(run["tenant"], TENANT_A);
    assert_eq!(run["dry_run"], false);
    let settled = mine
        .iter()
        .find(|l| l["fields"]["message"] == "run settled")
        .expect("run settled");
    assert_eq!(settled["level"], "INFO");
    assert_eq!(settled["fields"]["status"], "succeeded");
    assert_eq!(settled["fields"]["affected"], r.affected());
    // One event per entity inside its entity span, with its counts.
    let done = mine
        .iter()
        .find(|l| span(l, "cohort.entity").is_some_and(|s| s["entity"] == "Note"))
        .expect("an event in Note's span");
    assert_eq!(span(done, "cohort.entity").unwrap()["strategy"], "purge");
    let note_done = mine
        .iter()
        .find(|l| {
            l["fields"]["message"] == "entity done"
                && span(l, "cohort.entity").unwrap()["entity"] == "Note"
        })
        .expect("Note done");
    assert_eq!(note_done["fields"]["affected"], notes.affected);
    assert_eq!(note_done["fields"]["held"], 1);
    // One batch span per committed batch (batch size 1), with its rows.
    let batches: Vec<&&Value> = mine
        .iter()
        .filter(|l| {
            l["fields"]["message"] == "batch committed"
                && span(l, "cohort.entity").unwrap()["entity"] == "Note"
        })
        .collect();
    assert_eq!(batches.len() as u64, notes.affected);
    for b in &batches {
        assert_eq!(b["level"], "DEBUG");
        assert_eq!(span(b, "cohort.batch").unwrap()["rows"], 1);
    }
    // Deliveries: a span per delivery with the handler and the attempt; a
    // dead letter is a warning.
    let dead: Vec<&Value> = logs
        .iter()
        .filter(|l| l["fields"]["message"] == "work dead-lettered")
        .collect();
    assert_eq!(dead.len() as u64, notes.affected);
    for d in &dead {
        assert_eq!(d["level"], "WARN");
        let delivery = span(d, "cohort.delivery").expect("inside the delivery span");
        assert_eq!(delivery["handler"], "archive");
        assert_eq!(delivery["attempt"], 1);
        assert_eq!(delivery["run_id"], run_id.as_str());
    }
    // No row value anywhere in the log (record ids are allowed).
    let text = captured.text();
    // (sqlx logs every statement at debug: Cohort's carry placeholders,
    // never values; the one statement allowed to show them is this test's
    // own seeding UPDATE.)
    let leaks: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("secret-body") && !l.contains("SET body = 'secret-body-' || id"))
        .collect();
    assert!(
        leaks.is_empty(),
        "a row value was logged:\n{}",
        leaks.join("\n")
    );
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

#[db_test(engine)]
async fn observers_get_committed_events_in_order_and_cannot_block_or_change_the_run(
    db: TestDatabase,
) {
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

/// The events of one run add up to its ledger: `Started` carries kind and
/// trigger; each entity's progress batches sum to its summary, and its
/// `EntitySummary` carries the summary row's values (the failed entity's
/// too, with its sanitised error); `Settled` carries the totals of the
/// summaries, the run's error and a duration.
#[db_test(engine)]
async fn the_events_of_a_run_add_up_to_its_ledger(db: TestDatabase) {
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
