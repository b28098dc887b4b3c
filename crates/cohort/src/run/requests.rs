//! Erasure requests' work: opening one and running its attempts, the
//! maintenance pass that resumes them, and reading them back (the types
//! and their rules are [`crate::domain::erasure_requests`]).

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row;
use uuid::Uuid;

use crate::base::cancel::Cancel;
use crate::base::locks::LockKey;
use crate::context::Context;
use crate::domain::erasure::{ErasureRequest, ErasureScope};
use crate::domain::erasure_requests::{
    subject_hash, Due, PartReason, RequestCounts, RequestEvent, RequestFilter, RequestHistory,
    RequestRecord, RequestState, ResumeReport, Terms, WaitingPart, DEFAULT_DUE_DAYS,
    MAX_REFERENCE_CHARS,
};
use crate::domain::journal::Record;
use crate::domain::outcome::{ErasureResult, RunStatus};
use crate::domain::rules::Period;
use crate::error::{Error, Problems, Result};
use crate::sql::locks::{try_lock, unlock, Held};
use crate::sql::requests as sql;
use crate::store::journal::{check_apart, Journal};

/// How many requests one maintenance pass runs again, at most.
const RESUME_BATCH: i64 = 100;

/// Checks a request's terms and its erasure before anything is written.
fn check_terms(cx: &Context, req: &ErasureRequest, terms: &Terms) -> Result<Vec<u8>> {
    if req.dry_run {
        return Err(Error::InvalidInput(
            "a dry run opens no erasure request: drop the reference (--reference) or the dry run (--dry-run)".into(),
        ));
    }
    let reference = terms.reference.as_str();
    if reference.trim().is_empty() || reference.trim() != reference {
        return Err(Error::InvalidInput(format!(
            "erasure request reference {reference:?}: it must not be empty or start or end with spaces"
        )));
    }
    if reference.chars().count() > MAX_REFERENCE_CHARS || reference.chars().any(char::is_control) {
        return Err(Error::InvalidInput(format!(
            "erasure request reference {reference:?}: at most {MAX_REFERENCE_CHARS} characters, none of them control characters"
        )));
    }
    if terms
        .due_reason
        .as_deref()
        .is_some_and(|r| r.trim().is_empty())
    {
        return Err(Error::InvalidInput(
            "a due date's reason must not be empty".into(),
        ));
    }
    match &cx.config.hash_key {
        Some(k) => Ok(k.expose().to_vec()),
        None => Err(Error::Config(Problems::one(
            "an erasure request keeps a keyed hash of its subject once completed, which needs the secret key (COHORT_HASH_KEY or [cohort] hash_key, at least 16 bytes); nothing was written".to_owned(),
        ))),
    }
}

/// Opens the request `req` carries (or takes up the one its reference
/// names, if it is the same request and not completed) and runs it.
pub(crate) async fn open(cx: &Context, mut req: ErasureRequest) -> Result<ErasureResult> {
    let terms = req.terms.take().expect("a request's terms");
    let key = check_terms(cx, &req, &terms)?;
    // One tenant, however it is spelled (`{uuid}`, upper case): the
    // request records, journals and compares its canonical form.
    if let Some(t) = &req.tenancy.tenant {
        req.tenancy.tenant = Some(cx.canonical_tenant(t).await?);
    }
    let now = req.now;
    let due_at = due_at(&terms, now)?;
    let schema = &cx.config.schema;
    let scope = &req.scope;
    let hash = subject_hash(&key, &scope.subject);
    let request_id = Uuid::new_v4();
    // A new request is journaled before the database knows it: an erasure
    // never runs without its entry.
    let journaled = journal_opening(cx, &req, &terms, request_id, due_at).await?;
    let opened_here = journaled.is_some();
    let mut conn = Held::new(cx.pool.acquire().await?);
    try_lock(&mut conn, LockKey::Request(request_id)).await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
    let inserted: Option<Uuid> = sql::insert(
        schema,
        sql::Insert {
            request_id,
            reference: terms.reference.clone(),
            tenant: req.tenancy.tenant.clone(),
            kind: scope.kind.clone(),
            subject: scope.subject.clone(),
            subject_hash: hash.clone(),
            allow_soft_delete: scope.allow_soft_delete,
            stage: scope.stage.map(i32::from),
            note: terms.note.clone(),
            received_at: now,
            due_at,
            due_reason: terms.due_reason.clone(),
            journal: journaled,
        },
    )
    .query_scalar()
    .fetch_optional(&mut *tx)
    .await?;
    let id = match inserted {
        Some(id) => {
            let detail = format!(
                "opened: due {}{}",
                due_at.to_rfc3339(),
                terms
                    .due_reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default(),
            );
            event(
                &mut tx,
                (schema, cx.config.ledger_key.as_ref()),
                id,
                RequestState::Open,
                None,
                detail,
            )
            .await?;
            tx.commit().await?;
            id
        }
        None => {
            tx.rollback().await?;
            unlock(&mut conn, LockKey::Request(request_id)).await?;
            if opened_here {
                // Another request took the reference between the look-up
                // and the insert: this one's entry never came to exist.
                not_opened(cx, request_id, &terms.reference).await;
            }
            let existing = by_reference(cx, &terms.reference).await?;
            let identity = cx.prepared().await?.model.tenant_identity();
            same_request(&existing, &req, &hash, &terms, |t| identity.canonical(t))?;
            if !try_lock(&mut conn, LockKey::Request(existing.request_id)).await? {
                return Err(Error::Conflict(format!(
                    "erasure request {:?} is being run by another process",
                    terms.reference
                )));
            }
            existing.request_id
        }
    };
    let outcome = attempt(
        cx,
        cx.journal.as_ref(),
        id,
        now,
        req.allow_future_now,
        req.cancel.clone(),
    )
    .await;
    unlock(&mut conn, LockKey::Request(id)).await?;
    conn.into_inner();
    let mut result = outcome?;
    result.request = Some(read(cx, id, now).await?);
    Ok(result)
}

/// When a request is due: its terms' due date (30 days after it was
/// received by default), which must be after it was received.
fn due_at(terms: &Terms, now: DateTime<Utc>) -> Result<DateTime<Utc>> {
    let due_at = terms
        .due
        .unwrap_or(Due::After(
            Period::from_days(DEFAULT_DUE_DAYS).expect("30 days"),
        ))
        .at(now)?;
    if due_at <= now {
        return Err(Error::InvalidInput(format!(
            "erasure request {:?}: due {} is not after the request's time {}",
            terms.reference,
            due_at.to_rfc3339(),
            now.to_rfc3339()
        )));
    }
    Ok(due_at)
}

/// With a journal, and a reference the database does not know yet: the
/// request's opening journaled (subject and note sealed); its entry's
/// number and hash. `None` without a journal, or for a known reference.
async fn journal_opening(
    cx: &Context,
    req: &ErasureRequest,
    terms: &Terms,
    request_id: Uuid,
    due_at: DateTime<Utc>,
) -> Result<Option<(i64, String)>> {
    let Some(config) = &cx.journal else {
        return Ok(None);
    };
    let journal = Journal::open(config)?;
    check_apart(config, &cx.pool).await?;
    let known = sql::by_reference(&cx.config.schema, terms.reference.clone())
        .query()
        .fetch_optional(&cx.pool)
        .await?;
    if known.is_some() {
        return Ok(None);
    }
    let scope = &req.scope;
    let seal = |field: &str, text: &str| {
        journal
            .key()
            .seal(&Record::context(request_id, field), text)
    };
    let entry = journal
        .append(
            cx,
            Record::RequestOpened {
                request_id,
                reference: terms.reference.clone(),
                tenant: req.tenancy.tenant.clone(),
                kind: scope.kind.clone(),
                subject: seal("subject", &scope.subject),
                allow_soft_delete: scope.allow_soft_delete,
                stage: scope.stage,
                note: terms.note.as_deref().map(|n| seal("note", n)),
                received_at: req.now,
                due_at,
                due_reason: terms.due_reason.clone(),
            },
        )
        .await?;
    Ok(Some((entry.seq as i64, entry.hash)))
}

/// Journals that a request journaled as opened was never inserted.
/// Logged, not returned.
async fn not_opened(cx: &Context, request_id: Uuid, reference: &str) {
    let Some(config) = &cx.journal else { return };
    let appended = match Journal::open(config) {
        Ok(j) => j
            .append(
                cx,
                Record::RequestNotOpened {
                    request_id,
                    reference: reference.to_owned(),
                    why: "another request took its reference first".into(),
                },
            )
            .await
            .map(drop),
        Err(e) => Err(e),
    };
    if let Err(e) = appended {
        tracing::error!(%request_id, error = %e, "journaling that a request was not opened failed; restore-check will name its entry");
    }
}

/// Whether the reference's existing request is the one `req` asks for
/// (same tenant, kind and subject), and may run again (not completed).
fn same_request(
    existing: &RequestRecord,
    req: &ErasureRequest,
    hash: &str,
    terms: &Terms,
    canonical: impl Fn(&str) -> Option<String>,
) -> Result<()> {
    let r = &existing.reference;
    if existing.state == RequestState::Completed {
        return Err(Error::Conflict(format!(
            "erasure request {r:?} was completed at {}; open a new request with another reference",
            existing
                .completed_at
                .map(|t| t.to_rfc3339())
                .unwrap_or_default()
        )));
    }
    if existing.subject_hash != hash
        // Requests opened before tenants were recorded canonically may
        // hold another spelling of the same tenant.
        || existing.tenant.as_deref().map(|t| canonical(t).unwrap_or_else(|| t.to_owned()))
            != req.tenancy.tenant
        || existing.kind != req.scope.kind
    {
        return Err(Error::Conflict(format!(
            "erasure request {r:?} exists for another subject, tenant or kind; a reference names one request"
        )));
    }
    if terms.due.is_some() || terms.note.is_some() {
        return Err(Error::InvalidInput(format!(
            "erasure request {r:?} exists: run it again without --due or --note, and move its due date with `cohort erase-requests extend {r} --due … --reason …`"
        )));
    }
    Ok(())
}

/// One attempt at request `id`, whose lock the caller holds: in
/// progress, the erasure, then waiting, completed or failed, each change
/// with its line of history. The erasure's own error (a refusal, a lost
/// connection) fails the request and is returned.
pub(crate) async fn attempt(
    cx: &Context,
    journal: Option<&crate::domain::journal::JournalConfig>,
    id: Uuid,
    now: DateTime<Utc>,
    allow_future_now: bool,
    cancel: Cancel,
) -> Result<ErasureResult> {
    let schema = &cx.config.schema;
    let mut tx = cx.pool.begin_with(crate::sql::READ_COMMITTED).await?;
    let row = sql::lock(schema, id).query().fetch_one(&mut *tx).await?;
    let current = record(&row, now)?;
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
        super::passes::scoped(cx, &mut erasure.tenancy, "erasure").await?;
        super::erasure::erase(cx, erasure).await
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

/// A change of a request's state, with what the request row and its line
/// of history record.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Transition {
    state: RequestState,
    resume_at: Option<DateTime<Utc>>,
    parts: Vec<WaitingPart>,
    run_id: Option<Uuid>,
    error: Option<String>,
    /// The line of history.
    detail: String,
    /// An attempt starting (it records the attempt's snapshot).
    starting: bool,
}

impl Transition {
    /// An attempt starts.
    fn started() -> Self {
        Transition {
            state: RequestState::InProgress,
            resume_at: None,
            parts: Vec::new(),
            run_id: None,
            error: None,
            detail: "attempt started".into(),
            starting: true,
        }
    }

    /// The attempt's erasure failed (refused, or its connection lost).
    fn failed(why: String) -> Self {
        Transition {
            state: RequestState::Failed,
            detail: format!("failed: {why}"),
            error: Some(why),
            starting: false,
            ..Transition::started()
        }
    }

    /// What an attempt's erasure leaves the request in: failed when the
    /// run did not succeed, completed when nothing was kept, else waiting
    /// for its kept parts (from the earliest time one can go).
    fn after(result: &ErasureResult, now: DateTime<Utc>) -> Self {
        let parts = parts_of(result);
        let changed: u64 = result.entities.iter().map(|e| e.affected).sum();
        let run_id = Some(result.run_id);
        if result.status != RunStatus::Succeeded {
            let why = format!(
                "run {} settled {}{}",
                result.run_id,
                result.status.as_str(),
                result
                    .failures
                    .iter()
                    .map(|f| format!("; {}: {}", f.entity, f.error))
                    .collect::<String>()
            );
            return Transition {
                run_id,
                resume_at: resume_at(&parts, now),
                parts,
                ..Transition::failed(why)
            };
        }
        let (state, detail) = if parts.is_empty() {
            (
                RequestState::Completed,
                format!(
                    "completed: {changed} row(s) changed by this attempt; the subject's identifier is cleared"
                ),
            )
        } else {
            (
                RequestState::Waiting,
                format!(
                    "waiting: {changed} row(s) changed by this attempt; kept: {}",
                    describe_parts(&parts)
                ),
            )
        };
        Transition {
            state,
            resume_at: resume_at(&parts, now),
            parts,
            run_id,
            error: None,
            detail,
            starting: false,
        }
    }
}

/// Moves request `id` (locked in `tx`) to `t`: its row, its line of
/// history (linked in the chain), the commit, then the journal.
async fn transition(
    cx: &Context,
    (journal, id, reference, now): (
        Option<&crate::domain::journal::JournalConfig>,
        Uuid,
        &str,
        DateTime<Utc>,
    ),
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    t: Transition,
) -> Result<()> {
    let schema = &cx.config.schema;
    set_state(
        &mut tx,
        schema,
        id,
        t.state,
        now,
        (t.resume_at, t.parts, t.run_id, t.error),
        t.starting,
    )
    .await?;
    event(
        &mut tx,
        (schema, cx.config.ledger_key.as_ref()),
        id,
        t.state,
        t.run_id,
        t.detail,
    )
    .await?;
    tx.commit().await?;
    journal_state(cx, journal, id, reference, t.state, t.run_id).await;
    Ok(())
}

/// Journals a request's new state once the database has it. A failure is
/// logged, not returned: the journal is then behind the database, which
/// after a restore only runs the request once more.
pub(crate) async fn journal_state(
    cx: &Context,
    journal: Option<&crate::domain::journal::JournalConfig>,
    id: Uuid,
    reference: &str,
    state: RequestState,
    run_id: Option<Uuid>,
) {
    let Some(config) = journal else {
        return;
    };
    let appended = match Journal::open(config) {
        Ok(journal) => {
            journal
                .append(
                    cx,
                    Record::RequestState {
                        request_id: id,
                        reference: reference.to_owned(),
                        state: state.as_str().to_owned(),
                        run_id,
                    },
                )
                .await
        }
        Err(e) => Err(e),
    };
    if let Err(e) = appended {
        tracing::error!(request_id = %id, %state, error = %e, "journaling an erasure request's state failed; the journal is behind the database");
    }
}

/// What an attempt kept, per entity and reason.
fn parts_of(result: &ErasureResult) -> Vec<WaitingPart> {
    let mut parts = Vec::new();
    for o in &result.entities {
        let mut part = |reason, rows: u64, until| {
            if rows > 0 {
                parts.push(WaitingPart {
                    entity_id: o.entity_id,
                    entity: o.entity.clone(),
                    reason,
                    rows,
                    until,
                });
            }
        };
        part(PartReason::Held, o.held, None);
        part(
            PartReason::LegalMinimum,
            o.kept_by_legal_min,
            o.kept_by_legal_min_until,
        );
        part(PartReason::NullAnchor, o.null_anchor, None);
        part(PartReason::Referenced, o.skipped, None);
    }
    parts
}

/// When the maintenance pass tries a waiting request again by the clock:
/// a legal minimum's part when it passes; a part kept by a NULL anchor or
/// a reference (which someone must fix, and Cohort cannot watch) a day
/// after this attempt, and every day after that until it goes. A held
/// part needs no time: the pass resumes it when a hold is released that
/// the attempt could not see released (see `sql::requests::to_resume`).
fn resume_at(parts: &[WaitingPart], now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let recheck = parts
        .iter()
        .any(|p| matches!(p.reason, PartReason::NullAnchor | PartReason::Referenced))
        .then(|| now + RECHECK_AFTER);
    parts
        .iter()
        .filter(|p| p.reason == PartReason::LegalMinimum)
        .filter_map(|p| p.until)
        .chain(recheck)
        .min()
}

/// How long a part kept by a NULL anchor or a reference waits before the
/// maintenance pass looks again.
const RECHECK_AFTER: chrono::Duration = chrono::Duration::days(1);

fn describe_parts(parts: &[WaitingPart]) -> String {
    parts
        .iter()
        .map(|p| {
            let why = match p.reason {
                PartReason::Held => "held".to_owned(),
                PartReason::LegalMinimum => format!(
                    "legal minimum until {}",
                    p.until.map(|t| t.to_rfc3339()).unwrap_or_default()
                ),
                PartReason::NullAnchor => "NULL anchor".to_owned(),
                PartReason::Referenced => "still referenced".to_owned(),
            };
            format!("{} {} row(s) ({why})", p.entity, p.rows)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

async fn set_state(
    tx: &mut sqlx::PgConnection,
    schema: &str,
    id: Uuid,
    state: RequestState,
    now: DateTime<Utc>,
    (resume_at, waiting, run_id, error): (
        Option<DateTime<Utc>>,
        Vec<WaitingPart>,
        Option<Uuid>,
        Option<String>,
    ),
    starting: bool,
) -> Result<()> {
    sql::set_state(
        schema,
        sql::SetState {
            request_id: id,
            state: state.as_str(),
            now,
            resume_at,
            waiting: serde_json::to_value(&waiting).expect("parts serialise"),
            run_id,
            error,
            starting,
        },
    )
    .query()
    .execute(tx)
    .await?;
    Ok(())
}

async fn event(
    tx: &mut sqlx::PgConnection,
    (schema, key): (&str, Option<&crate::domain::chain::LedgerKey>),
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

/// A request as read from its row, `overdue` at `now`.
fn record(r: &PgRow, now: DateTime<Utc>) -> Result<RequestRecord> {
    let state: String = r.try_get("state")?;
    let state = RequestState::parse(&state).ok_or_else(|| {
        Error::Migration(format!(
            "unknown erasure request state {state:?} in the ledger"
        ))
    })?;
    let waiting: serde_json::Value = r.try_get("waiting")?;
    let waiting: Vec<WaitingPart> = serde_json::from_value(waiting)
        .map_err(|e| Error::Migration(format!("an erasure request's parts do not read: {e}")))?;
    let due_at: DateTime<Utc> = r.try_get("due_at")?;
    Ok(RequestRecord {
        request_id: r.try_get("request_id")?,
        reference: r.try_get("reference")?,
        tenant: r.try_get("tenant_id")?,
        kind: r.try_get("subject_kind")?,
        subject: r.try_get("subject_text")?,
        subject_hash: r.try_get("subject_hash")?,
        allow_soft_delete: r.try_get("allow_soft_delete")?,
        stage: r
            .try_get::<Option<i32>, _>("stage")?
            .and_then(|s| u16::try_from(s).ok()),
        note: r.try_get("note")?,
        state,
        received_at: r.try_get("received_at")?,
        due_at,
        due_reason: r.try_get("due_reason")?,
        attempted_at: r.try_get("attempted_at")?,
        resume_at: r.try_get("resume_at")?,
        completed_at: r.try_get("completed_at")?,
        last_run_id: r.try_get("last_run_id")?,
        waiting,
        error: r.try_get("error")?,
        overdue: state != RequestState::Completed && due_at < now,
    })
}

async fn read(cx: &Context, id: Uuid, now: DateTime<Utc>) -> Result<RequestRecord> {
    let row = sql::by_id(&cx.config.schema, id)
        .query()
        .fetch_one(&cx.pool)
        .await?;
    record(&row, now)
}

async fn by_reference(cx: &Context, reference: &str) -> Result<RequestRecord> {
    let row = sql::by_reference(&cx.config.schema, reference.to_owned())
        .query()
        .fetch_optional(&cx.pool)
        .await?
        .ok_or_else(|| {
            Error::NotFound(format!(
                "no erasure request has the reference {reference:?}"
            ))
        })?;
    record(&row, Utc::now())
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
    .query()
    .fetch_all(&cx.pool)
    .await?;
    let now = filter.overdue_at.unwrap_or_else(Utc::now);
    rows.iter().map(|r| record(r, now)).collect()
}

/// One request by its reference, with its history.
pub(crate) async fn show(cx: &Context, reference: &str) -> Result<RequestHistory> {
    let request = by_reference(cx, reference).await?;
    let rows = sql::events(&cx.config.schema, request.request_id)
        .query()
        .fetch_all(&cx.pool)
        .await?;
    let events = rows
        .iter()
        .map(|r| {
            let state: String = r.try_get("state")?;
            Ok(RequestEvent {
                state: RequestState::parse(&state).ok_or_else(|| {
                    Error::Migration(format!(
                        "unknown erasure request state {state:?} in the ledger"
                    ))
                })?,
                at: r.try_get("at")?,
                run_id: r.try_get("run_id")?,
                detail: r.try_get("detail")?,
                recorded_by: r.try_get("recorded_by")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RequestHistory { request, events })
}

/// Moves a request's due date to `due` (after its receipt), recording
/// `reason`; refused for a completed request and for a date already past.
pub(crate) async fn extend(
    cx: &Context,
    reference: &str,
    due: Due,
    reason: &str,
) -> Result<RequestRecord> {
    if reason.trim().is_empty() {
        return Err(Error::InvalidInput(
            "moving a due date needs a reason (--reason)".into(),
        ));
    }
    let now = crate::sql::database_now(&cx.pool).await?;
    let current = by_reference(cx, reference).await?;
    let schema = &cx.config.schema;
    let mut tx = cx.pool.begin_with(crate::sql::READ_COMMITTED).await?;
    let row = sql::lock(schema, current.request_id)
        .query()
        .fetch_one(&mut *tx)
        .await?;
    let current = record(&row, now)?;
    if current.state == RequestState::Completed {
        return Err(Error::Conflict(format!(
            "erasure request {reference:?} is completed; its due date stays"
        )));
    }
    let due_at = due.at(current.received_at)?;
    if due_at <= now {
        return Err(Error::InvalidInput(format!(
            "due {} is in the past (the database clock reads {})",
            due_at.to_rfc3339(),
            now.to_rfc3339()
        )));
    }
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
        format!(
            "due date moved from {} to {}: {reason}",
            current.due_at.to_rfc3339(),
            due_at.to_rfc3339()
        ),
    )
    .await?;
    tx.commit().await?;
    read(cx, current.request_id, now).await
}

/// Runs again, at logical time `now`, each request that may have
/// something left to do (see the module documentation).
pub(crate) async fn resume(
    cx: &Context,
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

/// Requests per state, and those overdue at the database clock.
pub(crate) async fn counts(cx: &Context) -> Result<RequestCounts> {
    let now = crate::sql::database_now(&cx.pool).await?;
    let rows = sql::by_state(&cx.config.schema, now)
        .query()
        .fetch_all(&cx.pool)
        .await?;
    let mut counts = RequestCounts {
        by_state: RequestState::ALL.iter().map(|s| (*s, 0)).collect(),
        overdue: 0,
    };
    for r in rows {
        let state: String = r.try_get("state")?;
        let n: i64 = r.try_get("requests")?;
        let overdue: i64 = r.try_get("overdue")?;
        if let Some(slot) = counts
            .by_state
            .iter_mut()
            .find(|(s, _)| s.as_str() == state)
        {
            slot.1 = n.max(0) as u64;
        }
        counts.overdue += overdue.max(0) as u64;
    }
    Ok(counts)
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
    cx: &Context,
    journal: Option<&crate::domain::journal::JournalConfig>,
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
