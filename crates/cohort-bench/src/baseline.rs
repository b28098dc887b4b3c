//! The hand-written baseline: the same candidate query Cohort uses (tenant,
//! cutoff, not done, not held, oldest first, `FOR UPDATE SKIP LOCKED`,
//! at most one batch) fused with the mutation in one statement, one
//! transaction per batch, until a batch changes nothing. It writes no audit
//! at all.

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use uuid::Uuid;

use crate::scenario::Scenario;

/// Runs the baseline loop on `conn` and returns the number of rows changed.
pub(crate) async fn run(
    conn: &mut PgConnection,
    scenario: &Scenario,
    tenant: Uuid,
    cutoff: DateTime<Utc>,
    batch: u32,
) -> sqlx::Result<u64> {
    let sql = scenario.baseline_sql();
    let entity = scenario.entity_uuid();
    let limit = i64::from(batch);
    let mut total = 0u64;
    loop {
        let mut tx = conn.begin().await?;
        let n = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(tenant)
            .bind(cutoff)
            .bind(entity)
            .bind(limit)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        if n == 0 {
            return Ok(total);
        }
        total += n;
    }
}
