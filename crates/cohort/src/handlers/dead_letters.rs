//! Dead letters: work that will not be delivered without an operator.
//! Listing them, and requeueing them (due now, attempts reset). A dead
//! letter keeps its payload until it is retried and delivered, or until the
//! `payload_retention` backstop scrubs it; a scrubbed one cannot be retried.

use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::ident::SqlText;
use crate::schema::CohortTable;

/// One dead-lettered piece of handler work.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The work's id (what `retry` takes).
    pub id: i64,
    /// The run that queued it.
    pub run_id: Uuid,
    /// The retained entity.
    pub entity_id: Uuid,
    /// The entity's display name.
    pub entity: String,
    /// The row's record id.
    pub record_id: String,
    /// The row's tenant.
    pub tenant: Option<String>,
    /// The handler's identity.
    pub handler: String,
    /// Attempts made.
    pub attempts: i32,
    /// The sanitised reason.
    pub last_error: Option<String>,
    /// When it was dead-lettered.
    pub dead_lettered_at: DateTime<Utc>,
}

/// Which dead letters to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterFilter {
    pub(crate) entity_id: Option<Uuid>,
    pub(crate) handler: Option<String>,
    pub(crate) limit: i64,
}

impl Default for DeadLetterFilter {
    fn default() -> Self {
        Self {
            entity_id: None,
            handler: None,
            limit: 100,
        }
    }
}

impl DeadLetterFilter {
    /// Every dead letter (the 100 most recent).
    pub fn all() -> Self {
        Self::default()
    }

    /// Only this entity's.
    pub fn entity(mut self, entity_id: Uuid) -> Self {
        self.entity_id = Some(entity_id);
        self
    }

    /// Only this handler's.
    pub fn handler(mut self, handler: impl Into<String>) -> Self {
        self.handler = Some(handler.into());
        self
    }

    /// At most this many, most recent first (0..=10000).
    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }
}

/// Which dead letters to requeue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetrySelection {
    /// These ids; every one must be a dead letter with its payload, or
    /// nothing is changed.
    Ids(Vec<i64>),
    /// Every dead letter that still has its payload.
    All,
}

fn tables(cx: &Context) -> (crate::QualifiedName, crate::QualifiedName) {
    (
        CohortTable::HandlerStatus.qualified(&cx.config.schema),
        CohortTable::RowDetail.qualified(&cx.config.schema),
    )
}

pub(crate) async fn list(cx: &Context, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>> {
    if !(0..=10_000).contains(&filter.limit) {
        return Err(Error::InvalidInput(format!(
            "a dead-letter list limit must be between 0 and 10000, not {}",
            filter.limit
        )));
    }
    let (hs, detail) = tables(cx);
    let mut sql = SqlText::new(
        "SELECT h.handler_status_id, h.run_id, d.retention_entity_id, d.entity_type, d.record_id, \
                d.tenant_id, h.handler_id, h.attempts, h.last_error, h.updated_at FROM ",
    );
    sql.table(&hs).push(" h JOIN ").table(&detail).push(
        " d ON d.row_detail_id = h.row_detail_id \
         WHERE h.status = 'dead_lettered' \
           AND ($1::uuid IS NULL OR d.retention_entity_id = $1) \
           AND ($2::text IS NULL OR h.handler_id = $2) \
         ORDER BY h.updated_at DESC, h.handler_status_id DESC LIMIT $3",
    );
    let rows = sqlx::query(sql.into_sql())
        .bind(filter.entity_id)
        .bind(filter.handler.as_deref())
        .bind(filter.limit)
        .fetch_all(&cx.pool)
        .await?;
    rows.iter()
        .map(|r| {
            Ok(DeadLetter {
                id: r.try_get(0)?,
                run_id: r.try_get(1)?,
                entity_id: r.try_get(2)?,
                entity: r.try_get(3)?,
                record_id: r.try_get(4)?,
                tenant: r.try_get(5)?,
                handler: r.try_get(6)?,
                attempts: r.try_get(7)?,
                last_error: r.try_get(8)?,
                dead_lettered_at: r.try_get(9)?,
            })
        })
        .collect::<std::result::Result<_, sqlx::Error>>()
        .map_err(Into::into)
}

/// Requeues dead letters: due now, attempts reset, error cleared. With ids,
/// an unknown id, one that is not dead-lettered or one whose payload was
/// scrubbed refuses the whole request and changes nothing.
pub(crate) async fn retry(cx: &Context, selection: &RetrySelection) -> Result<u64> {
    let (hs, detail) = tables(cx);
    let prepared = cx.prepared().await?;
    // Work of an entity this process knows, for a handler it does not
    // register, would only dead-letter again: refused, naming the handler.
    // (An entity this process does not know, e.g. a Rust handler's entity
    // seen from the CLI, cannot be judged here and is retried.)
    let unknown = |entity: uuid::Uuid, handler: &str| {
        prepared.model.entities.iter().any(|e| e.id == entity)
            && !cx
                .handlers
                .get(&entity)
                .is_some_and(|hs| hs.iter().any(|h| h.registration.identity == handler))
    };
    let mut who =
        SqlText::new("SELECT h.handler_status_id, d.retention_entity_id, h.handler_id FROM ");
    who.table(&hs)
        .push(" h JOIN ")
        .table(&detail)
        .push(" d ON d.row_detail_id = h.row_detail_id WHERE h.handler_status_id = ANY($1)");
    let mut conn = cx.pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
    let ids: Vec<i64> = match selection {
        RetrySelection::All => {
            let mut sql = SqlText::new("SELECT handler_status_id FROM ");
            sql.table(&hs).push(
                " WHERE status = 'dead_lettered' AND captured_payload IS NOT NULL \
                 ORDER BY handler_status_id FOR UPDATE",
            );
            sqlx::query_scalar(sql.into_sql())
                .fetch_all(&mut *tx)
                .await?
        }
        RetrySelection::Ids(ids) => {
            if ids.is_empty() {
                return Err(Error::InvalidInput(
                    "name at least one dead letter to retry".into(),
                ));
            }
            let mut sql = SqlText::new(
                "SELECT handler_status_id, status, captured_payload IS NOT NULL AS has_payload FROM ",
            );
            sql.table(&hs)
                .push(" WHERE handler_status_id = ANY($1) ORDER BY handler_status_id FOR UPDATE");
            let found = sqlx::query(sql.into_sql())
                .bind(ids)
                .fetch_all(&mut *tx)
                .await?;
            for id in ids {
                let Some(row) = found
                    .iter()
                    .find(|r| r.try_get::<i64, _>(0).ok() == Some(*id))
                else {
                    return Err(Error::NotFound(format!("no handler work with id {id}")));
                };
                let status: String = row.try_get(1)?;
                if status != "dead_lettered" {
                    return Err(Error::Conflict(format!(
                        "work {id} is {status}, not dead-lettered"
                    )));
                }
                if !row.try_get::<bool, _>(2)? {
                    return Err(Error::Refused(format!(
                        "work {id} cannot be retried: its payload was scrubbed after payload_retention"
                    )));
                }
            }
            let owners: Vec<(i64, uuid::Uuid, String)> = sqlx::query_as(who.sql())
                .bind(ids)
                .fetch_all(&mut *tx)
                .await?;
            let mut refused: Vec<String> = owners
                .iter()
                .filter(|(_, e, h)| unknown(*e, h))
                .map(|(id, e, h)| format!("work {id} (handler {h:?} of entity {e})"))
                .collect();
            refused.dedup();
            if !refused.is_empty() {
                return Err(Error::InvalidInput(format!(
                    "no handler of that name is registered for its entity, so a retry would dead-letter again: {}; add the handler back (or rename it back), then retry",
                    refused.join(", ")
                )));
            }
            ids.clone()
        }
    };
    // `--all` retries only work some handler here can deliver.
    let ids: Vec<i64> = if matches!(selection, RetrySelection::All) {
        let owners: Vec<(i64, uuid::Uuid, String)> = sqlx::query_as(who.sql())
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await?;
        let skipped = owners.iter().filter(|(_, e, h)| unknown(*e, h)).count();
        if skipped > 0 {
            tracing::warn!(
                skipped,
                "dead letters of handlers not registered here were left as they are"
            );
        }
        owners
            .into_iter()
            .filter(|(_, e, h)| !unknown(*e, h))
            .map(|(id, ..)| id)
            .collect()
    } else {
        ids
    };
    let mut sql = SqlText::new("UPDATE ");
    sql.table(&hs).push(
        " SET status = 'pending', attempts = 0, next_attempt_at = pg_catalog.now(), \
           last_error = NULL, claim_token = NULL, claim_expires_at = NULL, updated_at = pg_catalog.now() \
         WHERE handler_status_id = ANY($1) AND status = 'dead_lettered' AND captured_payload IS NOT NULL",
    );
    let done = sqlx::query(sql.into_sql())
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// Row-handler work by state: pending and in flight through their partial
/// indexes, dead letters by a scan of the status table (which the history
/// pruner keeps short).
pub(crate) async fn depth(cx: &Context) -> Result<crate::telemetry::QueueDepth> {
    let (hs, _) = tables(cx);
    let mut sql = SqlText::new("SELECT (SELECT count(*) FROM ");
    sql.table(&hs)
        .push(" WHERE status = 'pending'), (SELECT count(*) FROM ")
        .table(&hs)
        .push(" WHERE status = 'in_flight'), (SELECT count(*) FROM ")
        .table(&hs)
        .push(" WHERE status = 'dead_lettered')");
    let row = sqlx::query(sql.into_sql()).fetch_one(&cx.pool).await?;
    let count = |i: usize| -> Result<u64> { Ok(row.try_get::<i64, _>(i)?.max(0) as u64) };
    Ok(crate::telemetry::QueueDepth {
        pending: count(0)?,
        in_flight: count(1)?,
        dead_lettered: count(2)?,
    })
}
