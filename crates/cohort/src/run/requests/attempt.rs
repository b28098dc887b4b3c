//! One attempt at a request, and the changes of state it writes: the row,
//! its line of history linked in the chain, the commit, then the journal.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::base::cancel::Cancel;
use crate::context::{Context, Ready};
use crate::domain::chain::LedgerKey;
use crate::domain::erasure::{ErasureRequest, ErasureScope};
use crate::domain::erasure_requests::RequestState;
use crate::domain::journal::Record;
use crate::domain::outcome::ErasureResult;
use crate::domain::request_rules::Transition;
use crate::error::{Error, Result};
use crate::sql::requests as sql;
use crate::store::journal::Journal;

/// Where a request's changes are written: the journal (if any), the
/// request, its reference and the attempt's logical time.
type On<'a> = (Option<&'a Journal>, Uuid, &'a str, DateTime<Utc>);

/// One attempt at request `id`, whose lock the caller holds: in
/// progress, the erasure, then waiting, completed or failed, each change
/// with its line of history. The erasure's own error (a refusal, a lost
/// connection) fails the request and is returned.
pub(crate) async fn attempt(
    cx: &Ready<'_>,
    journal: Option<&Journal>,
    id: Uuid,
    now: DateTime<Utc>,
    allow_future_now: bool,
    cancel: Cancel,
) -> Result<ErasureResult> {
    let schema = &cx.config.schema;
    let mut tx = cx.pool.begin_with(crate::sql::READ_COMMITTED).await?;
    let row = sql::lock(schema, id)
        .query_as::<sql::RequestRow>()
        .fetch_one(&mut *tx)
        .await?;
    let current = super::read::record(row, now)?;
    let subject = current.subject.clone().ok_or_else(|| {
        Error::Conflict(format!(
            "erasure request {:?} is completed",
            current.reference
        ))
    })?;
    let on = (journal, id, current.reference.as_str(), now);
    transition(cx, on, tx, Transition::started()).await?;

    let mut scope = ErasureScope::new(subject).allow_soft_delete(current.allow_soft_delete);
    if let Some(k) = &current.kind {
        scope = scope.kind(k.clone());
    }
    if let Some(stage) = current.stage {
        scope = scope.stage(stage);
    }
    let mut erasure = match &current.tenant {
        Some(t) => ErasureRequest::tenanted(t.clone(), scope, now),
        None => ErasureRequest::tenantless(scope, now),
    }
    .allow_future_now(allow_future_now)
    .cancellation(cancel);
    let ran = async {
        crate::run::passes::scoped(cx, &mut erasure.tenancy, "erasure").await?;
        crate::run::erasure::erase(cx, erasure).await
    }
    .await;

    let mut tx = cx.pool.begin_with(crate::sql::READ_COMMITTED).await?;
    sql::lock(schema, id).query().fetch_one(&mut *tx).await?;
    match ran {
        Err(e) => {
            transition(cx, on, tx, Transition::failed(e.to_string())).await?;
            Err(e)
        }
        Ok(result) => {
            transition(cx, on, tx, Transition::after(&result, now)).await?;
            Ok(result)
        }
    }
}

/// Moves request `id` (locked in `tx`) to `t`: its row, its line of
/// history (linked in the chain), the commit, then the journal.
async fn transition(
    cx: &Context,
    (journal, id, reference, now): On<'_>,
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    t: Transition,
) -> Result<()> {
    let schema = &cx.config.schema;
    sql::set_state(
        schema,
        sql::SetState {
            request_id: id,
            state: t.state.as_str(),
            now,
            resume_at: t.resume_at,
            waiting: serde_json::to_value(&t.parts).expect("parts serialise"),
            run_id: t.run_id,
            error: t.error,
            starting: t.starting,
        },
    )
    .query()
    .execute(&mut *tx)
    .await?;
    let ledger = (schema.as_str(), cx.config.ledger_key.as_ref());
    event(&mut tx, ledger, id, t.state, t.run_id, t.detail).await?;
    tx.commit().await?;
    journal_state(cx, journal, id, reference, t.state, t.run_id).await;
    Ok(())
}

/// Journals a request's new state once the database has it. A failure is
/// logged, not returned: the journal is then behind the database, which
/// after a restore only runs the request once more.
async fn journal_state(
    cx: &Context,
    journal: Option<&Journal>,
    id: Uuid,
    reference: &str,
    state: RequestState,
    run_id: Option<Uuid>,
) {
    let Some(journal) = journal else {
        return;
    };
    let record = Record::RequestState {
        request_id: id,
        reference: reference.to_owned(),
        state: state.as_str().to_owned(),
        run_id,
    };
    let appended = journal.append(&cx.pool, &cx.config.schema, record).await;
    if let Err(e) = appended {
        tracing::error!(request_id = %id, %state, error = %e, "journaling an erasure request's state failed; the journal is behind the database");
    }
}

/// A line of a request's history, linked in the chain in the same
/// transaction.
pub(super) async fn event(
    tx: &mut sqlx::PgConnection,
    (schema, key): (&str, Option<&LedgerKey>),
    id: Uuid,
    state: RequestState,
    run_id: Option<Uuid>,
    detail: String,
) -> Result<()> {
    let event_id: i64 = sql::event(
        schema,
        sql::Event {
            request_id: id,
            state: state.as_str(),
            run_id,
            detail,
        },
    )
    .query_scalar()
    .fetch_one(&mut *tx)
    .await?;
    crate::run::chain::link_request_event(tx, schema, key, event_id).await?;
    Ok(())
}
