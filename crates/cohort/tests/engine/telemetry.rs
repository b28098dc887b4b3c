//! Tracing as operators ship it (JSON lines with their spans): one span per
//! run, entity, batch and delivery with the SPEC's fields, events at the
//! right levels, and no row value anywhere.

use crate::support::*;
use cohort::handlers::{
    AfterContext, BeforeContext, HandlerError, HandlerRegistration, RowHandler,
};
use cohort::holds::HoldRequest;
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
