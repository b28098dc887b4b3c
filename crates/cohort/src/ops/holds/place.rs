//! Placing a hold: checked, journaled first when a journal is configured,
//! its target locked, inserted and linked in the chain in one transaction
//! (see the module above for what the locks guarantee).

use uuid::Uuid;

use super::{Hold, HoldRequest, Target};
use crate::context::{Context, Prepared, Ready};
use crate::domain::model::SubjectForm;
use crate::error::{Error, Result};
use crate::sql::{ledger, lock_subject_rows, KeyValue};
use crate::validate::requests::reaches;

pub(crate) async fn create(cx: &Ready<'_>, req: HoldRequest) -> Result<Hold> {
    create_journaled(cx, req, true).await
}

/// Places a hold; with `journal` (and a journal configured) it is
/// journaled first, so that a restore cannot lose it (replay places the
/// journal's holds without journaling them again).
pub(crate) async fn create_journaled(
    cx: &Ready<'_>,
    req: HoldRequest,
    journal: bool,
) -> Result<Hold> {
    let ready = cx.plans();
    if req.reason.trim().is_empty() {
        return Err(Error::InvalidInput("a hold needs a reason".into()));
    }
    if req.expires_at.is_some_and(|e| e <= req.created_at) {
        return Err(Error::InvalidInput(
            "a hold must expire after it is created".into(),
        ));
    }
    let journaled = journal && cx.journal.is_some();
    let entry = if journaled {
        journal_placed(cx, &req).await?
    } else {
        None
    };
    // A subject hold waits at the hold gate for the batches past their
    // re-check; one of them may wait in turn for a row the hold has
    // locked (a cascade reaching a row of the subject), which PostgreSQL
    // breaks as a deadlock. The hold is then simply placed again.
    let mut attempts = 0;
    let placed = loop {
        match create_once(cx, ready, &req, entry.clone()).await {
            Err(Error::Database(e))
                if attempts < 3
                    && e.as_database_error().and_then(|d| d.code()).as_deref() == Some("40P01") =>
            {
                attempts += 1;
                tracing::info!(hold = %req.hold_id, attempts, "placing the hold met a deadlock with a batch; placing it again");
            }
            other => break other,
        }
    };
    match placed {
        // Refused (no such record, a subject no column holds, …): nothing
        // was written, and the journal says so, so its entry is no gap
        // for restore-check, replay or the worker. A lost connection
        // says nothing: the hold may have been placed.
        Err(e) if journaled && e.kind().is_bad_input() => {
            journal_not_placed(cx, req.hold_id, &e).await;
            Err(e)
        }
        other => other,
    }
}

/// Journals that a hold journaled as placed was refused. Logged, not
/// returned: the caller returns the refusal itself.
async fn journal_not_placed(cx: &Context, hold_id: Uuid, refusal: &Error) {
    let Some(journal) = &cx.journal else { return };
    let record = crate::domain::journal::Record::HoldNotPlaced {
        hold_id,
        why: format!("the database refused it: {refusal}"),
    };
    if let Err(e) = journal.append(&cx.pool, &cx.config.schema, record).await {
        tracing::error!(%hold_id, error = %e, "journaling that a hold was refused failed; restore-check will name its entry until replay resolves it");
    }
}

/// One try at placing the hold: its target locked, the row inserted and
/// linked in the chain, in one transaction.
async fn create_once(
    cx: &Context,
    ready: &Prepared,
    req: &HoldRequest,
    journal: Option<(i64, String)>,
) -> Result<Hold> {
    let mut conn = cx.pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
    let (target, tenant) = lock_target(cx, ready, req, &mut tx).await?;
    let insert = ledger::InsertHold {
        hold_id: req.hold_id,
        entity_id: target.entity_id,
        record_id: target.record_id,
        subject_kind: target.subject_kind,
        subject_forms: target.subject_forms,
        tenant,
        reason: req.reason.trim().to_owned(),
        created_at: req.created_at,
        expires_at: req.expires_at,
        journal,
    };
    let chain = (cx.config.schema.as_str(), cx.config.ledger_key.as_ref());
    let inserted = crate::run::chain::place_hold(&mut tx, ready, chain, insert).await;
    let row = match inserted {
        Ok(Some(row)) => row,
        Ok(None) => {
            return Err(Error::InvalidInput(
                "the hold's expiry is already past by the database clock; it would protect nothing"
                    .into(),
            ));
        }
        Err(e) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("23505") => {
            return Err(Error::Conflict(format!(
                "a hold with id {} already exists",
                req.hold_id
            )));
        }
        Err(e) => return Err(e.into()),
    };
    tx.commit().await?;
    Ok(Hold::from(row))
}

/// The hold's target locked in `tx` (`FOR KEY SHARE`) until it commits,
/// with what its row stores and its tenant.
async fn lock_target(
    cx: &Context,
    ready: &Prepared,
    req: &HoldRequest,
    tx: &mut sqlx::PgConnection,
) -> Result<(Stored, Option<String>)> {
    let tenant = req.tenant_id.as_deref();
    match &req.target {
        Target::Record {
            retention_entity_id,
            record_id,
        } => {
            if req.kind.is_some() {
                return Err(Error::InvalidInput(
                    "a kind names a subject's kind; a hold on a record takes none".into(),
                ));
            }
            let entity = ready.model.requested_entity(*retention_entity_id)?;
            lock_record(ready, tx, entity, record_id, tenant).await
        }
        Target::Subject { subject } => {
            let locked = lock_subject(ready, tx, subject, req.kind.as_deref(), tenant).await?;
            // The hold gate, exclusive, after the subject's rows are
            // locked and before the insert: a batch that locked a row
            // which became the subject's after the lock statement above
            // (and so was not locked by it) has either re-checked holds
            // already, and this waits for it to commit, or re-checks
            // after this commits, and sees the hold.
            crate::sql::locks::hold_gate(&cx.config.schema, false)
                .query()
                .execute(&mut *tx)
                .await?;
            Ok(locked)
        }
    }
}

/// Journals a hold before it is placed (when a journal is configured);
/// the entry's place and hash, which the hold's row records.
async fn journal_placed(cx: &Context, req: &HoldRequest) -> Result<Option<(i64, String)>> {
    let Some(journal) = &cx.journal else {
        return Ok(None);
    };
    let key = journal.key()?;
    let seal = |field: &str, text: &str| {
        key.seal(
            &crate::domain::journal::Record::context(req.hold_id, field),
            text,
        )
    };
    let (entity_id, record_id, subject) = match &req.target {
        Target::Record {
            retention_entity_id,
            record_id,
        } => (Some(*retention_entity_id), Some(record_id.clone()), None),
        Target::Subject { subject } => (None, None, Some(seal("subject", subject))),
    };
    let entry = journal
        .append(
            &cx.pool,
            &cx.config.schema,
            crate::domain::journal::Record::HoldPlaced {
                hold_id: req.hold_id,
                entity_id,
                record_id,
                subject,
                kind: req.kind.clone(),
                tenant: req.tenant_id.clone(),
                reason: seal("reason", req.reason.trim()),
                created_at: req.created_at,
                expires_at: req.expires_at,
            },
        )
        .await?;
    Ok(Some((entry.seq as i64, entry.hash)))
}

/// What an insert stores about the target, beyond the tenant.
struct Stored {
    entity_id: Option<Uuid>,
    record_id: Option<String>,
    subject_kind: Option<String>,
    subject_forms: [Option<String>; 4],
}

/// A record hold: the row must exist and belong to the tenant; it is
/// locked (`FOR KEY SHARE`) until the hold commits.
async fn lock_record(
    ready: &Prepared,
    tx: &mut sqlx::PgConnection,
    entity: &crate::domain::model::EntityDescriptor,
    record_id: &str,
    tenant: Option<&str>,
) -> Result<(Stored, Option<String>)> {
    let facts = &ready.model.facts[&entity.id];
    let record = facts.record_key(&entity.name, record_id)?;
    let tenant = facts.request_tenant(&entity.name, tenant)?;
    let plan = &ready.plans[&entity.id];
    let row = plan
        .targets
        .lock_target_query(&record)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(row) = row else {
        return Err(Error::NotFound(format!(
            "record {} of {} does not exist",
            record.canonical(),
            entity.name
        )));
    };
    // The tenant authorises the hold; protection then follows the record.
    let (stored_record, owner) = (row.record, row.tenant);
    let owner = facts.canonical_owner(owner);
    if owner != tenant {
        return Err(Error::InvalidInput(format!(
            "record {} of {} does not belong to tenant {}",
            record.canonical(),
            entity.name,
            tenant.as_deref().unwrap_or("(none)")
        )));
    }
    let stored = Stored {
        entity_id: Some(entity.id),
        record_id: Some(stored_record),
        subject_kind: None,
        subject_forms: Default::default(),
    };
    Ok((stored, tenant))
}

/// A subject hold: the subject and kind are checked against the model as
/// an erasure's are, the tenant (if any) against the tenant columns' type;
/// then every row that holds the subject now is locked (`FOR KEY SHARE`,
/// in the model's order) until the hold commits. A sweep or erasure batch
/// holding one of them finishes first; one that starts later skips them
/// (sweeps lock with `SKIP LOCKED`) or waits and then sees the hold in its
/// mutation's re-check. Rows written later are protected by the check
/// itself: it compares the hold with every row, not a list of rows.
async fn lock_subject(
    ready: &Prepared,
    tx: &mut sqlx::PgConnection,
    subject: &str,
    kind: Option<&str>,
    tenant: Option<&str>,
) -> Result<(Stored, Option<String>)> {
    let model = &ready.model;
    model.check_subject(
        subject,
        kind,
        "HoldRequest::kind, `cohort holds create --kind KIND`",
    )?;
    // The tenant, parsed once: bound in its column's type, stored canonical.
    let tenant_key = match tenant {
        None => None,
        Some(t) => {
            let Some(ty) = model.tenant_key else {
                return Err(Error::InvalidInput(
                    "no retained entity is tenant-scoped: a subject hold takes no tenant".into(),
                ));
            };
            Some(
                ty.parse(t)
                    .map_err(|msg| Error::InvalidInput(format!("tenant: {msg}")))?,
            )
        }
    };
    let tenant = tenant_key.as_ref().map(KeyValue::canonical);
    for e in model.ordered() {
        // A tenant's hold protects that tenant's rows only.
        if tenant.is_some() && e.tenant.is_none() {
            continue;
        }
        let facts = &model.facts[&e.id];
        let columns: Vec<(&str, KeyValue)> = e
            .subjects
            .iter()
            .filter(|s| reaches(s, kind))
            .filter_map(|s| {
                let ty = facts.subjects[&s.column];
                ty.parse(subject).ok().map(|v| (s.column.as_str(), v))
            })
            .collect();
        if columns.is_empty() {
            continue;
        }
        lock_subject_rows(e, &facts.casts, columns, tenant_key.clone())
            .query()
            .execute(&mut *tx)
            .await?;
    }
    let stored = Stored {
        entity_id: None,
        record_id: None,
        subject_kind: kind.map(str::to_owned),
        subject_forms: SubjectForm::ALL.map(|f| f.canonical(subject)),
    };
    Ok((stored, tenant))
}
