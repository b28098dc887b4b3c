//! Listing dead letters and requeueing them (due now, attempts reset). A
//! dead letter keeps its payload until it is retried and delivered, or
//! until the `payload_retention` backstop scrubs it; a scrubbed one cannot
//! be retried.

use sqlx::PgConnection;

use crate::context::{Context, Ready};
use crate::domain::handlers::{DeadLetter, DeadLetterFilter, RetrySelection};
use crate::error::{Error, Result};
use crate::sql::dead_letters as statements;

pub(crate) async fn list(cx: &Context, filter: &DeadLetterFilter) -> Result<Vec<DeadLetter>> {
    if !(0..=10_000).contains(&filter.limit) {
        return Err(Error::InvalidInput(format!(
            "a dead-letter list limit must be between 0 and 10000, not {}",
            filter.limit
        )));
    }
    let params = statements::List {
        entity_id: filter.entity_id,
        handler: filter.handler.clone(),
        limit: filter.limit,
    };
    let rows = statements::list(&cx.config.schema, params)
        .query_as::<statements::DeadLetterRow>()
        .fetch_all(&cx.pool)
        .await?;
    Ok(rows.into_iter().map(DeadLetter::from).collect())
}

/// Requeues dead letters: due now, attempts reset, error cleared. With ids,
/// an unknown id, one that is not dead-lettered or one whose payload was
/// scrubbed refuses the whole request and changes nothing.
pub(crate) async fn retry(cx: &Ready<'_>, selection: &RetrySelection) -> Result<u64> {
    let schema = &cx.config.schema;
    let prepared = cx.plans();
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
    let mut conn = cx.pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
    let ids: Vec<i64> = match selection {
        RetrySelection::All => {
            let all = statements::lock_retryable(schema)
                .query_scalar()
                .fetch_all(&mut *tx)
                .await?;
            // `--all` retries only work some handler here can deliver.
            deliverable(&mut tx, schema, all, &unknown).await?
        }
        RetrySelection::Ids(ids) => {
            lock_named(&mut tx, schema, ids).await?;
            refuse_unregistered(&mut tx, schema, ids, &unknown).await?;
            ids.clone()
        }
    };
    let done = statements::requeue(schema, statements::Ids(ids))
        .query()
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// Locks the named work; each must be a mutated dead letter that still has its payload.
async fn lock_named(conn: &mut PgConnection, schema: &str, ids: &[i64]) -> Result<()> {
    if ids.is_empty() {
        return Err(Error::InvalidInput(
            "name at least one dead letter to retry".into(),
        ));
    }
    let found = statements::lock_ids(schema, statements::Ids(ids.to_vec()))
        .query_as::<statements::LockedRow>()
        .fetch_all(&mut *conn)
        .await?;
    for id in ids {
        let Some(row) = found.iter().find(|r| r.handler_status_id == *id) else {
            return Err(Error::NotFound(format!("no handler work with id {id}")));
        };
        if row.status != "dead_lettered" {
            return Err(Error::Conflict(format!(
                "work {id} is {}, not dead-lettered",
                row.status
            )));
        }
        if row.skipped {
            return Err(Error::Refused(format!(
                "work {id} cannot be retried: its row was never mutated (a handler's on_before failed for it, so the run left it as it was); the next run tries the row again"
            )));
        }
        if !row.has_payload {
            return Err(Error::Refused(format!(
                "work {id} cannot be retried: its payload was scrubbed after payload_retention"
            )));
        }
    }
    Ok(())
}

/// Refuses named work whose handler is not registered here, naming each.
async fn refuse_unregistered(
    conn: &mut PgConnection,
    schema: &str,
    ids: &[i64],
    unknown: &impl Fn(uuid::Uuid, &str) -> bool,
) -> Result<()> {
    let owners: Vec<(i64, uuid::Uuid, String)> =
        statements::owners(schema, statements::Ids(ids.to_vec()))
            .query_as()
            .fetch_all(&mut *conn)
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
    Ok(())
}

/// The dead letters `ids` some handler registered here can deliver (the rest: a warning).
async fn deliverable(
    conn: &mut PgConnection,
    schema: &str,
    ids: Vec<i64>,
    unknown: &impl Fn(uuid::Uuid, &str) -> bool,
) -> Result<Vec<i64>> {
    let owners: Vec<(i64, uuid::Uuid, String)> = statements::owners(schema, statements::Ids(ids))
        .query_as()
        .fetch_all(&mut *conn)
        .await?;
    let skipped = owners.iter().filter(|(_, e, h)| unknown(*e, h)).count();
    if skipped > 0 {
        tracing::warn!(
            skipped,
            "dead letters of handlers not registered here were left as they are"
        );
    }
    Ok(owners
        .into_iter()
        .filter(|(_, e, h)| !unknown(*e, h))
        .map(|(id, ..)| id)
        .collect())
}

/// Row-handler work by state: pending and in flight through their partial
/// indexes, dead letters by a scan of the status table (which the history
/// pruner keeps short).
pub(crate) async fn depth(cx: &Context) -> Result<crate::domain::telemetry::QueueDepth> {
    let row = statements::depth(&cx.config.schema)
        .query_as::<statements::DepthRow>()
        .fetch_one(&cx.pool)
        .await?;
    Ok(row.into())
}
