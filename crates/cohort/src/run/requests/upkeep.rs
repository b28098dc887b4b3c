//! The changes made to requests after they open: a due date moved, the
//! maintenance pass's attempts, a request the journal restores, and one
//! run again after a restore.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::attempt::{attempt, event};
use super::read::{by_reference, read, record};
use crate::base::cancel::Cancel;
use crate::base::locks::LockKey;
use crate::context::{Context, Ready};
use crate::domain::erasure_requests::{
    subject_hash, Due, RequestRecord, RequestState, ResumeReport,
};
use crate::domain::request_rules::{due_moved_detail, moved_due};
use crate::error::{Error, Problems, Result};
use crate::sql::locks::{try_lock, unlock, Held};
use crate::sql::requests as sql;

/// How many requests one maintenance pass runs again, at most.
const RESUME_BATCH: i64 = 100;

/// Moves a request's due date to `due` (after its receipt), recording
/// `reason`; refused for a completed request and for a date already past.
pub(crate) async fn extend(
    cx: &Context,
    reference: &str,
    due: Due,
    reason: &str,
) -> Result<RequestRecord> {
    let now = crate::sql::database_now(&cx.pool).await?;
    let current = by_reference(cx, reference).await?;
    let schema = &cx.config.schema;
    let mut tx = cx.pool.begin_with(crate::sql::READ_COMMITTED).await?;
    let row = sql::lock(schema, current.request_id)
        .query_as::<sql::RequestRow>()
        .fetch_one(&mut *tx)
        .await?;
    let current = record(row, now)?;
    let due_at = moved_due(&current, due, reason, now)?;
    sql::set_due(
        schema,
        sql::SetDue {
            request_id: current.request_id,
            due_at,
            reason: reason.to_owned(),
        },
    )
    .query()
    .execute(&mut *tx)
    .await?;
    event(
        &mut tx,
        (schema, cx.config.ledger_key.as_ref()),
        current.request_id,
        current.state,
        None,
        due_moved_detail(current.due_at, due_at, reason),
    )
    .await?;
    tx.commit().await?;
    read(cx, current.request_id, now).await
}

/// Runs again, at logical time `now`, each request that may have
/// something left to do (see the module documentation).
pub(crate) async fn resume(
    cx: &Ready<'_>,
    now: DateTime<Utc>,
    allow_future_now: bool,
    cancel: &Cancel,
) -> Result<ResumeReport> {
    let ids: Vec<Uuid> = sql::to_resume(&cx.config.schema, now, RESUME_BATCH)
        .query_scalar()
        .fetch_all(&cx.pool)
        .await?;
    let mut report = ResumeReport::default();
    for id in ids {
        if cancel.is_cancelled() {
            break;
        }
        let mut conn = Held::new(cx.pool.acquire().await?);
        if !try_lock(&mut conn, LockKey::Request(id)).await? {
            report.busy += 1;
            conn.into_inner();
            continue;
        }
        let outcome = attempt(
            cx,
            cx.journal.as_ref(),
            id,
            now,
            allow_future_now,
            cancel.clone(),
        )
        .await;
        unlock(&mut conn, LockKey::Request(id)).await?;
        conn.into_inner();
        report.resumed += 1;
        match outcome {
            Err(Error::Conflict(_)) => report.resumed -= 1,
            Err(e) => {
                tracing::warn!(request_id = %id, error = %e, "maintenance: an erasure request failed again");
                report.failed += 1;
            }
            Ok(_) => match read(cx, id, now).await?.state {
                RequestState::Completed => report.completed += 1,
                RequestState::Waiting => report.waiting += 1,
                _ => report.failed += 1,
            },
        }
    }
    Ok(report)
}

/// A request the journal holds and the database lacks (after a restore),
/// inserted as the journal opened it, in state `open`, with a line of
/// history saying so. `false` when its reference is taken by another
/// request (nothing is written then).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn restore_opened(
    cx: &Context,
    request_id: Uuid,
    reference: &str,
    tenant: Option<String>,
    kind: Option<String>,
    subject: String,
    (allow_soft_delete, stage): (bool, Option<u16>),
    note: Option<String>,
    (received_at, due_at, due_reason): (DateTime<Utc>, DateTime<Utc>, Option<String>),
    (entry, entry_hash): (u64, String),
) -> Result<bool> {
    let key = cx.config.hash_key.as_ref().ok_or_else(|| {
        Error::Config(Problems::one(
            "replaying an erasure request needs the hash key (COHORT_HASH_KEY or [cohort] hash_key) it keeps a keyed hash of the subject with".to_owned(),
        ))
    })?;
    let schema = &cx.config.schema;
    let mut tx = cx.pool.begin_with(crate::sql::READ_COMMITTED).await?;
    let inserted: Option<Uuid> = sql::insert(
        schema,
        sql::Insert {
            request_id,
            reference: reference.to_owned(),
            tenant,
            kind,
            subject_hash: subject_hash(key.expose(), &subject),
            subject,
            allow_soft_delete,
            stage: stage.map(i32::from),
            note,
            received_at,
            due_at,
            due_reason,
            journal: Some((entry as i64, entry_hash)),
        },
    )
    .query_scalar()
    .fetch_optional(&mut *tx)
    .await?;
    if inserted.is_none() {
        tx.rollback().await?;
        return Ok(false);
    }
    event(
        &mut tx,
        (schema, cx.config.ledger_key.as_ref()),
        request_id,
        RequestState::Open,
        None,
        format!("restored from the journal (entry {entry}) after the database lost it to a restore; due {}", due_at.to_rfc3339()),
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// Runs request `id` again now, under its lock, after a line of history
/// saying why (`why`); its state afterwards. A request another process is
/// running is refused as a conflict.
///
/// `journal` is where its states are journaled: the journal a replay
/// reads (a drill's copy, never the production journal it was copied
/// from).
pub(crate) async fn rerun(
    cx: &Ready<'_>,
    journal: Option<&crate::store::journal::Journal>,
    id: Uuid,
    why: String,
) -> Result<RequestState> {
    let now = crate::sql::database_now(&cx.pool).await?;
    let mut conn = Held::new(cx.pool.acquire().await?);
    if !try_lock(&mut conn, LockKey::Request(id)).await? {
        conn.into_inner();
        return Err(Error::Conflict(format!(
            "erasure request {id} is being run by another process"
        )));
    }
    let current = read(cx, id, now).await?;
    let mut tx = cx.pool.begin_with(crate::sql::READ_COMMITTED).await?;
    event(
        &mut tx,
        (&cx.config.schema, cx.config.ledger_key.as_ref()),
        id,
        current.state,
        None,
        why,
    )
    .await?;
    tx.commit().await?;
    let outcome = attempt(cx, journal, id, now, false, Cancel::new()).await;
    unlock(&mut conn, LockKey::Request(id)).await?;
    conn.into_inner();
    match outcome {
        Ok(_) | Err(Error::Conflict(_)) => Ok(read(cx, id, now).await?.state),
        Err(e) => Err(e),
    }
}
