//! PACKAGE-001: a consumer of the published API. Builds with a path
//! dependency only, then, with `DATABASE_URL` set, creates a table, derives
//! a retained entity, installs Cohort, places a hold, sweeps, and checks
//! the result. Exits non-zero on any mismatch.

use chrono::{DateTime, Utc};
use cohort::holds::HoldRequest;
use cohort::rules::{RetentionRule, StaticRuleProvider, Strategy};
use cohort::{Cohort, Retained, RunStatus, SweepRequest};
use uuid::Uuid;

#[derive(Retained)]
#[retain(
    category = "visits",
    anchor = "visited_at",
    id = "5f1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
    table = "consumer.visits"
)]
#[allow(dead_code)]
struct Visit {
    id: i64,
    tenant_id: Uuid,
    visited_at: DateTime<Utc>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL (run under cohort-pgtemp exec)")?;
    let pool = cohort::sqlx::PgPool::connect(&url).await?;
    cohort::sqlx::raw_sql(
        "DROP SCHEMA IF EXISTS consumer CASCADE; DROP SCHEMA IF EXISTS consumer_ledger CASCADE;
         CREATE SCHEMA consumer;
         CREATE TABLE consumer.visits (id bigint PRIMARY KEY, tenant_id uuid NOT NULL, visited_at timestamptz);
         INSERT INTO consumer.visits SELECT g, '11111111-1111-1111-1111-111111111111',
             now() - make_interval(days => g) FROM generate_series(1, 100) g;",
    )
    .execute(&pool)
    .await?;
    cohort::schema::migrate(&mut *pool.acquire().await?, "consumer_ledger").await?;
    let rules = StaticRuleProvider::builder()
        .category(
            "visits",
            RetentionRule::new("30d".parse()?, Strategy::Purge),
        )
        .build()
        .map_err(|e| format!("inconsistent rules: {e:?}"))?;
    let cohort = Cohort::builder(pool.clone())
        .config(cohort::CohortConfig {
            schema: "consumer_ledger".into(),
            ..Default::default()
        })
        .entity::<Visit>()
        .rules(rules)
        .build()
        .await?;
    let tenant = "11111111-1111-1111-1111-111111111111";
    cohort
        .create_hold(HoldRequest::new(Visit::RETENTION_ENTITY_ID, "90", "audit").tenant(tenant))
        .await?;
    let r = cohort
        .sweep(SweepRequest::tenanted(tenant, Utc::now()))
        .await?;
    let visits = r.entity("Visit").ok_or("no outcome for Visit")?;
    // Days 30..=100 are past the 30-day cutoff (day 30 by the milliseconds
    // between the insert and the sweep), one of them held: 70 go, 30 stay.
    let left: i64 = cohort::sqlx::query_scalar("SELECT count(*) FROM consumer.visits")
        .fetch_one(&pool)
        .await?;
    let ok =
        r.status == RunStatus::Succeeded && visits.held == 1 && visits.affected == 70 && left == 30;
    println!(
        "consumer check: {:?}, affected {}, held {}, rows left {left}",
        r.status, visits.affected, visits.held
    );
    if !ok {
        return Err("the sweep did not do what the public API promises".into());
    }
    Ok(())
}
