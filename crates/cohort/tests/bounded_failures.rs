//! FAILURE-009: what a run holds stays bounded by its batch, not by how
//! many rows a failing `on_before` set aside. A counting allocator (this
//! test binary's global allocator, `cap`, with no other test beside it)
//! measures the peak heap: a sweep with 100,899 failing rows over 101
//! batches, run after one with a tenth of them over 10 batches, raises the
//! peak by no more than allocator noise. Bind
//! parameters follow the same rule: every statement of a batch binds that
//! batch's rows only (run/batches.rs carries nothing but a cursor from one
//! batch to the next).

#[path = "engine/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cohort::handlers::{BeforeContext, HandlerError, HandlerRegistration, RowHandler};
use cohort::{Cohort, RunStatus, SweepRequest};
use sqlx::Row;
use support::*;
use uuid::Uuid;

/// Counts the heap this test binary holds, and its peak.
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

const DOC_ID: &str = "6b0c3a52-96a4-4f0e-9f53-0d2b7c1e8a41";
const BATCH: u32 = 1000;

struct Doc {
    id: i64,
}

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for Doc {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        Ok(Doc {
            id: row.try_get("id")?,
        })
    }
}

/// Fails every row but one in each thousand; counts its calls (a counter,
/// so the test itself holds nothing per row).
#[derive(Clone, Default)]
struct MostlyFailing {
    calls: Arc<AtomicU64>,
}

#[cohort::async_trait]
impl RowHandler<Doc> for MostlyFailing {
    async fn on_before(&self, row: &Doc, ctx: &mut BeforeContext) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if row.id % 1000 == 1 {
            ctx.snapshot.insert("id", row.id)?;
            Ok(())
        } else {
            Err("no blob".into())
        }
    }
}

/// Sweeps `rows` rows (oldest first, so each batch of 1000 holds exactly
/// one row that succeeds); returns an upper bound of the peak heap the
/// sweep added (the process's peak so far, above what was live before it).
async fn peak_of_a_sweep(rows: i64) -> usize {
    let db = migrated_db().await;
    exec(
        db.pool(),
        &format!(
            "CREATE SCHEMA app;
             CREATE TABLE app.docs (id bigint PRIMARY KEY, created_at timestamptz NOT NULL, body text NOT NULL);
             CREATE INDEX ON app.docs (created_at, id);
             INSERT INTO app.docs
             SELECT g, timestamptz '2026-06-01T00:00:00Z' - interval '60 days' - g * interval '1 second', 'body ' || g
             FROM generate_series(1, {rows}) g;"
        ),
    )
    .await;
    let handler = MostlyFailing::default();
    let cohort = Cohort::builder(db.pool().clone())
        .config(batches_of(BATCH))
        .rules(rules())
        .declaration(
            cohort::EntityDeclaration::new("Doc", DOC_ID)
                .category("notes")
                .anchor("created_at")
                .table("app.docs")
                .tenantless(),
        )
        .handler::<Doc, _>(
            HandlerRegistration::new(Uuid::parse_str(DOC_ID).unwrap(), "mostly-failing"),
            handler.clone(),
        )
        .build()
        .await
        .unwrap();
    // Warm up the pool's connections and statement caches first.
    cohort
        .preview(cohort::PreviewRequest::tenantless(now()))
        .await
        .unwrap();

    let base = ALLOCATOR.allocated();
    let r = cohort.sweep(SweepRequest::tenantless(now())).await.unwrap();
    // The process's peak so far, above what was live when the sweep began:
    // an upper bound of what this sweep added.
    let peak = ALLOCATOR.max_allocated().saturating_sub(base);

    let succeeding = (rows + 999) / 1000;
    assert_eq!(r.status, RunStatus::Succeeded, "{:?}", r.failures);
    let doc = r.entity("Doc").unwrap();
    assert_eq!(
        (doc.affected, doc.skipped),
        (succeeding as u64, (rows - succeeding) as u64)
    );
    assert_eq!(
        handler.calls.load(Ordering::Relaxed),
        rows as u64,
        "each row captured once"
    );
    let (dead, left): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM public.sweep_row_handler_status WHERE status = 'dead_lettered'), \
                (SELECT count(*) FROM app.docs)",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    assert_eq!((dead, left), (rows - succeeding, rows - succeeding));
    peak
}

#[tokio::test]
async fn a_runs_memory_is_bounded_by_its_batch_not_by_its_failures() {
    let small = peak_of_a_sweep(10_100).await;
    let large = peak_of_a_sweep(101_000).await;
    eprintln!(
        "peak heap added by a sweep: {:.2} MiB with 10,090 failing rows, at most {:.2} MiB with 100,899",
        small as f64 / 1048576.0,
        large as f64 / 1048576.0
    );
    // Ten times the failures: the same peak, give or take allocator noise
    // (anything kept per failed row, even its id, would add several MiB).
    let margin = small / 2 + (1 << 20);
    assert!(
        large <= small + margin,
        "peak grew with the failures: {small} B for 10k, {large} B for 100k"
    );
    // The bound catches what it is for: the failed rows' ids alone, kept
    // for the run, would have exceeded it.
    let before = ALLOCATOR.allocated();
    let kept: Vec<String> = (0..100_899).map(|i: i64| i.to_string()).collect();
    let cost = ALLOCATOR.allocated() - before;
    drop(kept);
    assert!(cost > margin, "{cost} B of ids vs a margin of {margin} B");
}
