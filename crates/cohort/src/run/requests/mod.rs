//! Erasure requests' work: opening one and running its attempts
//! ([`attempt`]), the maintenance pass that resumes them and the other
//! changes made after opening ([`upkeep`]), and reading them back
//! ([`read`]). The types and every rule they follow are
//! [`crate::domain::erasure_requests`]; this module reads, writes, locks
//! and journals.

mod attempt;
mod read;
mod upkeep;

pub(crate) use read::{counts, list, show};
pub(crate) use upkeep::{extend, rerun, restore_opened, resume};

use chrono::DateTime;
use chrono::Utc;
use uuid::Uuid;

use self::attempt::{attempt, event};
use crate::base::locks::LockKey;
use crate::context::{Context, Ready};
use crate::domain::erasure::ErasureRequest;
use crate::domain::erasure_requests::{subject_hash, RequestState, Terms};
use crate::domain::journal::Record;
use crate::domain::outcome::ErasureResult;
use crate::domain::request_rules::{check_terms, due_at, opened_detail, same_request};
use crate::error::{Error, Problems, Result};
use crate::sql::locks::{try_lock, unlock, Held};
use crate::sql::requests as sql;

/// The secret key a request keeps a keyed hash of its subject with.
fn hash_key(cx: &Context) -> Result<Vec<u8>> {
    match &cx.config.hash_key {
        Some(k) => Ok(k.expose().to_vec()),
        None => Err(Error::Config(Problems::one(
            "an erasure request keeps a keyed hash of its subject once completed, which needs the secret key (COHORT_HASH_KEY or [cohort] hash_key, at least 16 bytes); nothing was written".to_owned(),
        ))),
    }
}

/// Opens the request `req` carries (or takes up the one its reference
/// names, if it is the same request and not completed) and runs it.
pub(crate) async fn open(cx: &Ready<'_>, mut req: ErasureRequest) -> Result<ErasureResult> {
    let terms = req.terms.take().expect("a request's terms");
    check_terms(req.dry_run, &terms)?;
    let key = hash_key(cx)?;
    // One tenant, however it is spelled (`{uuid}`, upper case): the
    // request records, journals and compares its canonical form.
    if let Some(t) = &req.tenancy.tenant {
        req.tenancy.tenant = Some(cx.canonical_tenant(t).await?);
    }
    let now = req.now;
    let due_at = due_at(&terms, now)?;
    let hash = subject_hash(&key, &req.scope.subject);
    let request_id = Uuid::new_v4();
    // A new request is journaled before the database knows it: an erasure
    // never runs without its entry.
    let journaled = journal_opening(cx, &req, &terms, request_id, due_at).await?;
    let opened_here = journaled.is_some();
    let mut conn = Held::new(cx.pool.acquire().await?);
    try_lock(&mut conn, LockKey::Request(request_id)).await?;
    let opening = Opening {
        req: &req,
        terms: &terms,
        request_id,
        hash: &hash,
        due_at,
    };
    let id = match insert(cx, &mut conn, &opening, journaled).await? {
        Some(id) => id,
        None => {
            unlock(&mut conn, LockKey::Request(request_id)).await?;
            if opened_here {
                // Another request took the reference between the look-up
                // and the insert: this one's entry never came to exist.
                not_opened(cx, request_id, &terms.reference).await;
            }
            take_up(cx, &mut conn, &opening).await?
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
    result.request = Some(read::read(cx, id, now).await?);
    Ok(result)
}

/// A request being opened, as its row will record it.
struct Opening<'a> {
    req: &'a ErasureRequest,
    terms: &'a Terms,
    request_id: Uuid,
    hash: &'a str,
    due_at: DateTime<Utc>,
}

/// Inserts the request with its first line of history, on the connection
/// that holds its lock; `None` (nothing written) when its reference is
/// taken.
async fn insert(
    cx: &Context,
    conn: &mut Held,
    o: &Opening<'_>,
    journal: Option<(i64, String)>,
) -> Result<Option<Uuid>> {
    let schema = &cx.config.schema;
    let (req, terms) = (o.req, o.terms);
    let mut tx = sqlx::Connection::begin_with(&mut **conn, crate::sql::READ_COMMITTED).await?;
    let inserted: Option<Uuid> = sql::insert(
        schema,
        sql::Insert {
            request_id: o.request_id,
            reference: terms.reference.clone(),
            tenant: req.tenancy.tenant.clone(),
            kind: req.scope.kind.clone(),
            subject: req.scope.subject.clone(),
            subject_hash: o.hash.to_owned(),
            allow_soft_delete: req.scope.allow_soft_delete,
            stage: req.scope.stage.map(i32::from),
            note: terms.note.clone(),
            received_at: req.now,
            due_at: o.due_at,
            due_reason: terms.due_reason.clone(),
            journal,
        },
    )
    .query_scalar()
    .fetch_optional(&mut *tx)
    .await?;
    let Some(id) = inserted else {
        tx.rollback().await?;
        return Ok(None);
    };
    let detail = opened_detail(terms, o.due_at);
    let ledger = (schema.as_str(), cx.config.ledger_key.as_ref());
    event(&mut tx, ledger, id, RequestState::Open, None, detail).await?;
    tx.commit().await?;
    Ok(Some(id))
}

/// The request the reference already names, when it is the one asked for
/// and no other process runs it, locked on `conn`.
async fn take_up(cx: &Ready<'_>, conn: &mut Held, o: &Opening<'_>) -> Result<Uuid> {
    let reference = &o.terms.reference;
    let existing = read::by_reference(cx, reference).await?;
    let identity = cx.plans().model.tenant_identity();
    same_request(&existing, o.req, o.hash, o.terms, |t| identity.canonical(t))?;
    if !try_lock(conn, LockKey::Request(existing.request_id)).await? {
        return Err(Error::Conflict(format!(
            "erasure request {reference:?} is being run by another process"
        )));
    }
    Ok(existing.request_id)
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
    let Some(journal) = &cx.journal else {
        return Ok(None);
    };
    let key = journal.key()?;
    journal.check_apart(&cx.pool).await?;
    let known = sql::by_reference(&cx.config.schema, terms.reference.clone())
        .query()
        .fetch_optional(&cx.pool)
        .await?;
    if known.is_some() {
        return Ok(None);
    }
    let scope = &req.scope;
    let seal = |field: &str, text: &str| key.seal(&Record::context(request_id, field), text);
    let entry = journal
        .append(
            &cx.pool,
            &cx.config.schema,
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
    let Some(journal) = &cx.journal else { return };
    let record = Record::RequestNotOpened {
        request_id,
        reference: reference.to_owned(),
        why: "another request took its reference first".into(),
    };
    let appended = journal.append(&cx.pool, &cx.config.schema, record).await;
    if let Err(e) = appended {
        tracing::error!(%request_id, error = %e, "journaling that a request was not opened failed; restore-check will name its entry");
    }
}
