//! Tests that move a ledger back in time (to report on past months) make
//! the hash chain's records disagree with the rows, as any edit would.
//! `relink` writes the chain again from the rows as they now are, as if
//! the history had been recorded on those days: run links take the runs'
//! times, hold links the holds' times; every digest and link is then
//! computed again in order, and each link's time is its record's.

use cohort::chain::{self, HoldRecord, LinkKind, ReleaseRecord, RunRecord};
use sqlx::{PgPool, Row};
use uuid::Uuid;

fn micros(t: Option<chrono::DateTime<chrono::Utc>>) -> Option<i64> {
    t.map(|t| t.timestamp_micros())
}

/// Rewrites every link of the chain in `schema` from link 2 on.
pub(crate) async fn relink(pool: &PgPool, schema: &str) {
    let links = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT link_id, kind, subject_id, record FROM \"{schema}\".ledger_link ORDER BY link_id"
    )))
    .fetch_all(pool)
    .await
    .unwrap();
    let mut prev: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT link FROM \"{schema}\".ledger_link WHERE link_id = 1"
    )))
    .fetch_one(pool)
    .await
    .unwrap();
    // The start, before the oldest history a test writes.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE \"{schema}\".ledger_link SET linked_at = '2025-01-01' WHERE link_id = 1"
    )))
    .execute(pool)
    .await
    .unwrap();
    for l in links.iter().skip(1) {
        let link_id: i64 = l.get("link_id");
        let kind = LinkKind::parse(l.get("kind")).unwrap();
        let subject: Option<Uuid> = l.get("subject_id");
        let mut record: String = l.get("record");
        let mut linked_at: Option<i64> = None;
        match (kind, subject) {
            (LinkKind::Run, Some(id)) => {
                let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT started_at, settled_at FROM \"{schema}\".sweep_run WHERE run_id = $1"
                )))
                .bind(id)
                .fetch_optional(pool)
                .await
                .unwrap();
                if let Some(row) = row {
                    let mut r: RunRecord = serde_json::from_str(&record).unwrap();
                    r.started_at = micros(row.get("started_at")).unwrap();
                    r.settled_at = micros(row.get("settled_at"));
                    linked_at = r.settled_at;
                    record = chain::canonical(&r);
                }
            }
            (LinkKind::HoldPlaced | LinkKind::HoldReleased, Some(id)) => {
                let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "SELECT created_at, expires_at, released_at FROM \"{schema}\".retention_hold WHERE hold_id = $1"
                )))
                .bind(id)
                .fetch_optional(pool)
                .await
                .unwrap();
                if let Some(row) = row {
                    if kind == LinkKind::HoldPlaced {
                        let mut r: HoldRecord = serde_json::from_str(&record).unwrap();
                        r.created_at = micros(row.get("created_at")).unwrap();
                        r.expires_at = micros(row.get("expires_at"));
                        linked_at = Some(r.created_at);
                        record = chain::canonical(&r);
                    } else if let Some(at) = micros(row.get("released_at")) {
                        let mut r: ReleaseRecord = serde_json::from_str(&record).unwrap();
                        r.released_at = at;
                        linked_at = Some(at);
                        record = chain::canonical(&r);
                    }
                }
            }
            _ => {}
        }
        let digest = chain::digest(&record);
        let link = chain::link_hash(&prev, link_id, kind, subject, &digest);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE \"{schema}\".ledger_link SET record = $2, digest = $3, prev = $4, link = $5, \
             linked_at = COALESCE(to_timestamp($6::float8 / 1e6), linked_at) WHERE link_id = $1"
        )))
        .bind(link_id)
        .bind(&record)
        .bind(&digest)
        .bind(&prev)
        .bind(&link)
        .bind(linked_at.map(|m| m as f64))
        .execute(pool)
        .await
        .unwrap();
        prev = link;
    }
}
