//! `cohort-dispatch-bench`: no-op row-handler deliveries per second with 1,
//! 2 and 4 dispatchers draining the same queue at once.
//!
//! ```text
//! cargo run --release -p cohort-bench --bin cohort-dispatch-bench -- [--rows N]
//! ```
//!
//! For each dispatcher count: a fresh database, N notes past their cutoff,
//! one sweep with a no-op handler (queueing N deliveries in the sweep's own
//! transactions), then the dispatchers flush concurrently until the queue is
//! empty. Prints deliveries per second, and checks every row was delivered
//! exactly once (no duplicates: no claim expired).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use cohort::handlers::{AfterContext, HandlerError, HandlerRegistration, RowHandler};
use cohort::rules::{Period, RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, EntityDeclaration, SweepRequest};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "cohort-dispatch-bench",
    about = "Row-handler deliveries per second"
)]
struct Args {
    /// Rows (deliveries) per measurement.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    rows: u64,
    /// Rows claimed per poll (dispatch.batch_size).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch: u32,
}

const TENANT: &str = "00000000-0000-4000-8000-000000000000";
const ENTITY: &str = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8";

/// The row a handler sees: its id only.
struct Row(i64);

impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for Row {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        Ok(Row(row.try_get("id")?))
    }
}

/// Captures the id, counts deliveries and does nothing else.
struct NoOp(Arc<AtomicU64>);

#[cohort::async_trait]
impl RowHandler<Row> for NoOp {
    async fn on_before(
        &self,
        row: &Row,
        ctx: &mut cohort::handlers::BeforeContext,
    ) -> Result<(), HandlerError> {
        ctx.snapshot.insert("id", row.0)?;
        Ok(())
    }

    async fn on_after(&self, _ctx: &AfterContext) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

async fn measure(rows: u64, batch: u32, dispatchers: usize) -> Result<(f64, u64), BoxError> {
    let db = cohort_pgtemp::fresh_empty_database().await?;
    let mut conn = db.connect().await?;
    cohort::schema::migrate(&mut conn, "public").await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA app;
         CREATE TABLE app.notes (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, created_at timestamptz NOT NULL);
         CREATE INDEX ON app.notes (tenant_id, created_at);
         INSERT INTO app.notes SELECT g, '{TENANT}', now() - interval '100 days' FROM generate_series(1, {rows}) g;
         ANALYZE;"
    )))
    .execute(db.pool())
    .await?;
    let delivered = Arc::new(AtomicU64::new(0));
    let mut config = cohort::CohortConfig::default();
    config.dispatch.batch_size = batch;
    config.dispatch.max_parallelism = 8;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4 + 2 * dispatchers as u32)
        .connect_with(db.connect_options())
        .await?;
    let rules = StaticRuleProvider::builder()
        .category(
            "notes",
            RetentionRule::new(Period::from_days(30)?, Strategy::Purge),
        )
        .build()
        .map_err(|e| format!("{e:?}"))?;
    let cohort = Cohort::builder(pool)
        .config(config)
        .rules(rules)
        .declaration(
            EntityDeclaration::new("Note", ENTITY)
                .category("notes")
                .anchor("created_at")
                .table("app.notes"),
        )
        .handler::<Row, _>(
            HandlerRegistration::new(ENTITY.parse()?, "no-op"),
            NoOp(delivered.clone()),
        )
        .build()
        .await?;
    let swept = cohort
        .sweep(SweepRequest::tenanted(TENANT, chrono::Utc::now()))
        .await?;
    assert_eq!(swept.affected(), rows, "the sweep queued every row");

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..dispatchers {
        let d = cohort.dispatcher();
        tasks.spawn(async move { d.flush().await });
    }
    let mut duplicates = 0;
    while let Some(done) = tasks.join_next().await {
        let report = done??;
        duplicates += report.superseded;
    }
    let seconds = started.elapsed().as_secs_f64();
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM public.sweep_row_handler_status WHERE status <> 'succeeded'",
    )
    .fetch_one(db.pool())
    .await?;
    assert_eq!(left, 0, "every delivery settled");
    assert_eq!(delivered.load(Ordering::Relaxed), rows + duplicates);
    Ok((seconds, duplicates))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    println!(
        "cohort-dispatch-bench: {} no-op deliveries per run, batch {}, max_parallelism 8",
        args.rows, args.batch
    );
    println!("dispatchers   seconds   deliveries/s   duplicates");
    for dispatchers in [1, 2, 4] {
        let (seconds, duplicates) = measure(args.rows, args.batch, dispatchers).await?;
        println!(
            "{dispatchers:>11}   {seconds:>7.2}   {:>12.0}   {duplicates:>10}",
            args.rows as f64 / seconds
        );
    }
    Ok(())
}
