//! Replaying the journal: refusing another cluster's journal, placing
//! the holds the database lost, restoring the requests it lost as the
//! journal opened them, and the copy a drill replays onto.

use std::os::unix::fs::OpenOptionsExt;

use uuid::Uuid;

use super::journaled::Folded;
use super::{ReplayReport, RequestGap, RestoreCheck};
use crate::context::{Context, Ready};
use crate::domain::journal::{JournalKey, Record};
use crate::error::{Error, Result};
use crate::ops::holds::HoldRequest;
use crate::store::journal::Journal;

/// Refuses a replay into a journal another cluster wrote (its entries'
/// system identifier is not this database's): a drill replays onto a copy.
pub(super) async fn refuse_another_cluster(
    cx: &Context,
    journal: &Journal,
    folded: &Folded,
) -> Result<()> {
    let ours: Option<String> = crate::sql::journal::system_identifier()
        .query_scalar()
        .fetch_optional(&cx.pool)
        .await
        .ok()
        .flatten();
    if let (Some(ours), Some(theirs)) = (&ours, &folded.system) {
        if ours != theirs {
            return Err(Error::Refused(format!(
                "this database's cluster (system identifier {ours}) is not the one {} was written for ({theirs}): \
                 a replay here would append to another cluster's journal; a drill replays onto a copy with --journal-copy DIR",
                journal.describe()
            )));
        }
    }
    Ok(())
}

/// Places again the holds the journal placed and the database lacks,
/// without journaling them again; one that is refused as it stands (its
/// record is gone, say) is journaled as never to be placed.
pub(super) async fn place_holds(
    cx: &Ready<'_>,
    journal: &Journal,
    folded: &Folded,
    before: &RestoreCheck,
    report: &mut ReplayReport,
) -> Result<()> {
    for id in &before.holds_to_place {
        let Some((_, h)) = folded.holds.iter().find(|(h, _)| h == id) else {
            continue;
        };
        let Some(placed @ Record::HoldPlaced { hold_id, .. }) = &h.placed else {
            continue;
        };
        let Some(req) = hold_request(journal.key()?, placed)? else {
            report
                .skipped
                .push(format!("hold {hold_id}: the journal names no target"));
            continue;
        };
        match crate::ops::holds::create_journaled(cx, req, false).await {
            Ok(_) => report.holds_placed.push(*hold_id),
            Err(e) if e.kind().is_bad_input() => {
                // Refused as it stands (its record is gone, say): it cannot
                // come to exist, so the journal says so and it no longer
                // blocks restore-check, replay or the worker.
                let why = format!("replay could not place it again: {e}");
                journal
                    .append(
                        &cx.pool,
                        &cx.config.schema,
                        Record::HoldNotPlaced {
                            hold_id: *hold_id,
                            why: why.clone(),
                        },
                    )
                    .await?;
                report.skipped.push(format!("hold {hold_id}: {why}"));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The request that places a journaled hold again as it was placed, its
/// sealed reason and subject opened with the journal's key (`None`: the
/// journal names neither a record nor a subject).
fn hold_request(key: &JournalKey, placed: &Record) -> Result<Option<HoldRequest>> {
    let Record::HoldPlaced {
        hold_id,
        entity_id,
        record_id,
        subject,
        kind,
        tenant,
        reason,
        created_at,
        expires_at,
    } = placed
    else {
        return Ok(None);
    };
    let open = |field: &str, sealed: &crate::domain::journal::Sealed| {
        key.open(&Record::context(*hold_id, field), sealed)
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "hold {hold_id}: its {field} does not open with this COHORT_JOURNAL_KEY"
                ))
            })
    };
    let reason = open("reason", reason)?;
    let mut req = match (entity_id, record_id, subject) {
        (Some(e), Some(r), _) => HoldRequest::new(*e, r.clone(), reason),
        (_, _, Some(s)) => HoldRequest::subject(open("subject", s)?, reason),
        _ => return Ok(None),
    };
    req = req.hold_id(*hold_id).created_at(*created_at);
    if let Some(k) = kind {
        req = req.kind(k.clone());
    }
    if let Some(t) = tenant {
        req = req.tenant(t.clone());
    }
    if let Some(e) = expires_at {
        req = req.expires_at(*e);
    }
    Ok(Some(req))
}

/// A request to run again: its id, its reference, and the line of
/// history its run again starts with.
type ToRun = (Uuid, String, String);

/// Restores the requests the database lost, as the journal opened them;
/// returns them and the ones the database has behind the journal, each
/// with the line of history its run again starts with.
pub(super) async fn restore_requests(
    cx: &Context,
    journal: &Journal,
    folded: &Folded,
    before: &RestoreCheck,
    report: &mut ReplayReport,
) -> Result<Vec<ToRun>> {
    let mut to_run: Vec<ToRun> = Vec::new();
    for gap in &before.missing_requests {
        if let Some(run) = restore_missing(cx, journal.key()?, folded, gap, report).await? {
            to_run.push(run);
        }
    }
    for gap in &before.behind_requests {
        to_run.push((
            gap.request_id,
            gap.reference.clone(),
            format!(
                "replay: the journal holds this request {}; the database had it {}",
                gap.journal_state,
                gap.database_state.as_deref().unwrap_or("-")
            ),
        ));
    }
    Ok(to_run)
}

/// Restores one request the database lost, as the journal opened it
/// (`None`: it cannot be, and the report says why).
async fn restore_missing(
    cx: &Context,
    key: &JournalKey,
    folded: &Folded,
    gap: &RequestGap,
    report: &mut ReplayReport,
) -> Result<Option<ToRun>> {
    let Some((
        seq,
        Record::RequestOpened {
            request_id,
            reference,
            tenant,
            kind,
            subject,
            allow_soft_delete,
            stage,
            note,
            received_at,
            due_at,
            due_reason,
        },
    )) = folded
        .requests
        .iter()
        .find(|(id, _)| *id == gap.request_id)
        .and_then(|(_, r)| r.opened.clone())
    else {
        report.skipped.push(format!(
            "erasure request {}: the journal has its changes of state but not its opening",
            gap.reference
        ));
        return Ok(None);
    };
    let open = |field: &str, sealed: &crate::domain::journal::Sealed| {
        key.open(&Record::context(request_id, field), sealed)
            .ok_or_else(|| {
                Error::InvalidInput(format!(
                    "erasure request {reference}: its {field} (entry {seq}) does not open with this COHORT_JOURNAL_KEY"
                ))
            })
    };
    let subject = open("subject", &subject)?;
    let note = note.as_ref().map(|n| open("note", n)).transpose()?;
    let opened_hash = folded
        .hashes
        .get((seq as usize).saturating_sub(1))
        .cloned()
        .unwrap_or_default();
    let restored = crate::run::requests::restore_opened(
        cx,
        request_id,
        &reference,
        tenant,
        kind,
        subject,
        (allow_soft_delete, stage),
        note,
        (received_at, due_at, due_reason),
        (seq, opened_hash),
    )
    .await?;
    if !restored {
        report.skipped.push(format!(
            "erasure request {reference}: another request has its reference in the database"
        ));
        return Ok(None);
    }
    report.requests_restored.push(reference.clone());
    let why = format!(
        "replay: the journal holds this request {}; the database had lost it",
        gap.journal_state
    );
    Ok(Some((request_id, reference, why)))
}

/// A copy of the configured journal in `dir` (made once: a second drill
/// goes on from the first's copy), for a replay that must not write to
/// the journal it was given.
pub(super) async fn copy_journal(
    journal: &Journal,
    dir: &std::path::Path,
) -> Result<crate::domain::journal::JournalConfig> {
    let key = journal.key()?.clone();
    let copy = crate::domain::journal::JournalConfig::dir(dir).key(key);
    let target = dir.join(crate::domain::journal::FILE_NAME);
    if !target.exists() {
        let lines = journal.lines().await?;
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::InvalidInput(format!("--journal-copy {}: {e}", dir.display())))?;
        let mut text = lines.join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        use std::io::Write;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&target)
            .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
            .map_err(|e| {
                Error::InvalidInput(format!("--journal-copy {}: {e}", target.display()))
            })?;
    }
    Ok(copy)
}
