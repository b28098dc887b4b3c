//! Requests read back: one by id or reference, a filtered list, one with
//! its history, and the counts per state.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::context::Context;
use crate::domain::erasure_requests::{
    RequestCounts, RequestEvent, RequestFilter, RequestHistory, RequestRecord, RequestState,
    WaitingPart,
};
use crate::domain::request_rules::parse_state;
use crate::error::{Error, Result};
use crate::sql::requests as sql;

/// A request as read from its row, `overdue` at `now`.
pub(super) fn record(r: sql::RequestRow, now: DateTime<Utc>) -> Result<RequestRecord> {
    let state = parse_state(&r.state)?;
    let waiting: Vec<WaitingPart> = serde_json::from_value(r.waiting)
        .map_err(|e| Error::Migration(format!("an erasure request's parts do not read: {e}")))?;
    Ok(RequestRecord {
        request_id: r.request_id,
        reference: r.reference,
        tenant: r.tenant_id,
        kind: r.subject_kind,
        subject: r.subject_text,
        subject_hash: r.subject_hash,
        allow_soft_delete: r.allow_soft_delete,
        stage: r.stage.and_then(|s| u16::try_from(s).ok()),
        note: r.note,
        state,
        received_at: r.received_at,
        due_at: r.due_at,
        due_reason: r.due_reason,
        attempted_at: r.attempted_at,
        resume_at: r.resume_at,
        completed_at: r.completed_at,
        last_run_id: r.last_run_id,
        waiting,
        error: r.error,
        overdue: state != RequestState::Completed && r.due_at < now,
    })
}

pub(super) async fn read(cx: &Context, id: Uuid, now: DateTime<Utc>) -> Result<RequestRecord> {
    let row = sql::by_id(&cx.config.schema, id)
        .query_as::<sql::RequestRow>()
        .fetch_one(&cx.pool)
        .await?;
    record(row, now)
}

pub(super) async fn by_reference(cx: &Context, reference: &str) -> Result<RequestRecord> {
    let row = sql::by_reference(&cx.config.schema, reference.to_owned())
        .query_as::<sql::RequestRow>()
        .fetch_optional(&cx.pool)
        .await?
        .ok_or_else(|| {
            Error::NotFound(format!(
                "no erasure request has the reference {reference:?}"
            ))
        })?;
    record(row, Utc::now())
}

/// Requests as `filter` selects them, oldest received first.
pub(crate) async fn list(cx: &Context, filter: RequestFilter) -> Result<Vec<RequestRecord>> {
    let limit = filter.limit.unwrap_or(1_000);
    if !(1..=10_000).contains(&limit) {
        return Err(Error::InvalidInput(format!(
            "limit {limit}: list between 1 and 10000 requests"
        )));
    }
    let rows = sql::list(
        &cx.config.schema,
        sql::List {
            state: filter.state.map(RequestState::as_str),
            overdue_at: filter.overdue_at,
            limit,
        },
    )
    .query_as::<sql::RequestRow>()
    .fetch_all(&cx.pool)
    .await?;
    let now = filter.overdue_at.unwrap_or_else(Utc::now);
    rows.into_iter().map(|r| record(r, now)).collect()
}

/// One request by its reference, with its history.
pub(crate) async fn show(cx: &Context, reference: &str) -> Result<RequestHistory> {
    let request = by_reference(cx, reference).await?;
    let rows = sql::events(&cx.config.schema, request.request_id)
        .query_as::<sql::EventRow>()
        .fetch_all(&cx.pool)
        .await?;
    let events = rows
        .into_iter()
        .map(|r| {
            Ok(RequestEvent {
                state: parse_state(&r.state)?,
                at: r.at,
                run_id: r.run_id,
                detail: r.detail,
                recorded_by: r.recorded_by,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RequestHistory { request, events })
}

/// Requests per state, and those overdue at the database clock.
pub(crate) async fn counts(cx: &Context) -> Result<RequestCounts> {
    let now = crate::sql::database_now(&cx.pool).await?;
    let rows = sql::by_state(&cx.config.schema, now)
        .query_as::<sql::StateCount>()
        .fetch_all(&cx.pool)
        .await?;
    let mut counts = RequestCounts {
        by_state: RequestState::ALL.iter().map(|s| (*s, 0)).collect(),
        overdue: 0,
    };
    for r in rows {
        if let Some(slot) = counts
            .by_state
            .iter_mut()
            .find(|(s, _)| s.as_str() == r.state)
        {
            slot.1 = r.requests.max(0) as u64;
        }
        counts.overdue += r.overdue.max(0) as u64;
    }
    Ok(counts)
}
