//! After a restore: what the journal holds that the database lacks
//! ([`crate::Cohort::restore_check`]), and bringing the database back to it
//! ([`crate::Cohort::replay`]).
//!
//! A restored base backup, or a point-in-time recovery, takes the database
//! back to before some erasures: the people they erased are back. The
//! journal (see [`crate::domain::journal`]) is outside the database and still has
//! them. `restore_check` reads it from its first entry (a broken chain is
//! refused, naming the entry) and compares:
//!
//! - erasure requests the database does not know, or knows in an earlier
//!   state (`open` < `in_progress`, `failed` < `waiting` < `completed`);
//! - holds placed through Cohort that the database lacks (and the journal
//!   has not released or seen expire): a restore must not lose a hold and
//!   then erase what it kept;
//! - holds the journal released that the database has in force.
//!
//! `replay` places those holds, releases those, restores the missing
//! requests as the journal opened them, then runs each missing or behind
//! request again (holds first, so an erasure sees the holds the journal
//! says were there), and checks again. A second replay finds nothing to do.

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::Row;
use uuid::Uuid;

use crate::context::Context;
use crate::domain::journal::Record;
use crate::error::{Error, Result};
use crate::store::journal::Journal;

/// A request the database lacks or knows in an earlier state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RequestGap {
    /// Its id.
    pub request_id: Uuid,
    /// Its reference.
    pub reference: String,
    /// Its last state in the journal.
    pub journal_state: String,
    /// Its state in the database (`None`: unknown there).
    pub database_state: Option<String>,
}

/// What the journal holds that the database lacks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RestoreCheck {
    /// Entries read (every one checked).
    pub entries: u64,
    /// The last entry's hash.
    pub head: Option<String>,
    /// Requests the database does not know.
    pub missing_requests: Vec<RequestGap>,
    /// Requests the database knows in an earlier state.
    pub behind_requests: Vec<RequestGap>,
    /// Holds placed through Cohort that the database lacks (not released
    /// and not expired by the journal's account).
    pub holds_to_place: Vec<Uuid>,
    /// Holds the journal released that the database has in force.
    pub holds_to_release: Vec<Uuid>,
    /// Holds and requests whose row records a journal entry the journal
    /// no longer holds as it was: the journal was cut short, rolled back
    /// with the database's storage, or rewritten. Each names the row and
    /// the entry.
    pub journal_behind: Vec<String>,
    /// The ledger's chain head the journal's newest entry recorded, when
    /// the database's chain no longer holds it: the database was restored
    /// to before it (replay, and the next entry records the new head) or
    /// its chain was cut short.
    pub chain_behind: Option<String>,
    /// Entries written before entries carried MACs (they are hashed and
    /// linked, but a writer without the key could have written them).
    pub entries_without_mac: u64,
    /// Entries for holds and requests that never came to exist (the
    /// database refused them when they were made, or replay could not
    /// make them again): resolved, not gaps, each with why.
    pub resolved: Vec<String>,
}

impl RestoreCheck {
    /// Nothing is missing.
    pub fn is_clean(&self) -> bool {
        self.missing_requests.is_empty()
            && self.behind_requests.is_empty()
            && self.holds_to_place.is_empty()
            && self.holds_to_release.is_empty()
            && self.journal_behind.is_empty()
            && self.chain_behind.is_none()
    }

    /// One line per gap, for messages.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        for r in &self.missing_requests {
            out.push(format!(
                "erasure request {} ({}) is not in the database",
                r.reference, r.journal_state
            ));
        }
        for r in &self.behind_requests {
            out.push(format!(
                "erasure request {} is {} in the database and {} in the journal",
                r.reference,
                r.database_state.as_deref().unwrap_or("-"),
                r.journal_state
            ));
        }
        for h in &self.holds_to_place {
            out.push(format!("hold {h} is not in the database"));
        }
        for h in &self.holds_to_release {
            out.push(format!(
                "hold {h} was released, and is in force in the database"
            ));
        }
        out.extend(self.journal_behind.iter().cloned());
        out.extend(self.chain_behind.iter().cloned());
        out
    }
}

/// What a replay did (or, dry, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ReplayReport {
    /// Whether nothing was changed.
    pub dry_run: bool,
    /// Holds placed again.
    pub holds_placed: Vec<Uuid>,
    /// Holds released again.
    pub holds_released: Vec<Uuid>,
    /// Requests restored from the journal.
    pub requests_restored: Vec<String>,
    /// Requests run again, with their state afterwards.
    pub requests_run: Vec<(String, String)>,
    /// What could not be replayed, and why.
    pub skipped: Vec<String>,
    /// The check after the replay (before it, for a dry run).
    pub check: RestoreCheck,
}

/// A request as the journal has it.
struct Journaled {
    reference: String,
    state: String,
    opened: Option<(u64, Record)>,
    /// Why it never came to exist, when the journal says so.
    not_opened: Option<String>,
}

/// A hold as the journal has it.
#[derive(Default)]
struct JournaledHold {
    placed: Option<Record>,
    released: bool,
    /// Why it never came to exist, when the journal says so.
    not_placed: Option<String>,
}

/// The journal folded: requests and holds in the order it first names them.
struct Folded {
    entries: u64,
    head: Option<String>,
    /// Each entry's hash, by place.
    hashes: Vec<String>,
    /// The newest entry's record of the chain head, and of the database.
    chain: Option<String>,
    system: Option<String>,
    without_mac: u64,
    requests: Vec<(Uuid, Journaled)>,
    holds: Vec<(Uuid, JournaledHold)>,
}

fn fold(entries: Vec<crate::domain::journal::Entry>) -> Folded {
    let mut requests: Vec<(Uuid, Journaled)> = Vec::new();
    let mut holds: Vec<(Uuid, JournaledHold)> = Vec::new();
    let n = entries.len() as u64;
    let head = entries.last().map(|e| e.hash.clone());
    let hashes = entries.iter().map(|e| e.hash.clone()).collect();
    let chain = entries.iter().rev().find_map(|e| e.chain.clone());
    let system = entries.iter().rev().find_map(|e| e.system.clone());
    let without_mac = entries.iter().filter(|e| e.mac.is_none()).count() as u64;
    for e in entries {
        match &e.record {
            Record::RequestOpened {
                request_id,
                reference,
                ..
            } => {
                requests.push((
                    *request_id,
                    Journaled {
                        reference: reference.clone(),
                        state: "open".into(),
                        opened: Some((e.seq, e.record.clone())),
                        not_opened: None,
                    },
                ));
            }
            Record::RequestState {
                request_id,
                reference,
                state,
                ..
            } => match requests.iter_mut().find(|(id, _)| id == request_id) {
                Some((_, r)) => r.state = state.clone(),
                None => requests.push((
                    *request_id,
                    Journaled {
                        reference: reference.clone(),
                        state: state.clone(),
                        opened: None,
                        not_opened: None,
                    },
                )),
            },
            Record::RequestNotOpened {
                request_id, why, ..
            } => {
                if let Some((_, r)) = requests.iter_mut().find(|(id, _)| id == request_id) {
                    r.not_opened = Some(why.clone());
                }
            }
            Record::Replayed { .. } => {}
            Record::HoldNotPlaced { hold_id, why } => {
                if let Some((_, h)) = holds.iter_mut().find(|(id, _)| id == hold_id) {
                    h.not_placed = Some(why.clone());
                }
            }
            Record::HoldPlaced { hold_id, .. } => {
                match holds.iter_mut().find(|(id, _)| id == hold_id) {
                    Some((_, h)) => h.placed = Some(e.record.clone()),
                    None => holds.push((
                        *hold_id,
                        JournaledHold {
                            placed: Some(e.record.clone()),
                            ..JournaledHold::default()
                        },
                    )),
                }
            }
            Record::HoldReleased { hold_id, .. } => {
                match holds.iter_mut().find(|(id, _)| id == hold_id) {
                    Some((_, h)) => h.released = true,
                    None => holds.push((
                        *hold_id,
                        JournaledHold {
                            released: true,
                            ..JournaledHold::default()
                        },
                    )),
                }
            }
        }
    }
    Folded {
        entries: n,
        head,
        hashes,
        chain,
        system,
        without_mac,
        requests,
        holds,
    }
}

/// How far along a state is: `open` < `in_progress`, `failed` < `waiting`
/// < `completed`.
fn rank(state: &str) -> u8 {
    match state {
        "open" => 0,
        "in_progress" | "failed" => 1,
        "waiting" => 2,
        "completed" => 3,
        _ => 0,
    }
}

fn configured(cx: &Context) -> Result<&crate::domain::journal::JournalConfig> {
    cx.journal.as_ref().ok_or_else(|| {
        Error::InvalidInput(
            "no journal is configured: restore-check and replay compare the database with [journal] (dir = \"…\" or url = \"postgres://…\")".into(),
        )
    })
}

/// Compares the database with the journal.
pub(crate) async fn check(cx: &Context) -> Result<RestoreCheck> {
    let config = configured(cx)?;
    let journal = Journal::open(config)?;
    let folded = fold(journal.read().await?);
    compare(cx, &folded).await
}

async fn compare(cx: &Context, folded: &Folded) -> Result<RestoreCheck> {
    let schema = &cx.config.schema;
    let now = crate::sql::database_now(&cx.pool).await?;
    let db_requests: BTreeMap<Uuid, String> = crate::sql::requests::states(schema)
        .query()
        .fetch_all(&cx.pool)
        .await?
        .iter()
        .map(|r| Ok((r.try_get("request_id")?, r.try_get("state")?)))
        .collect::<std::result::Result<_, sqlx::Error>>()?;
    let db_holds: BTreeMap<Uuid, Option<DateTime<Utc>>> = crate::sql::requests::hold_states(schema)
        .query()
        .fetch_all(&cx.pool)
        .await?
        .iter()
        .map(|r| Ok((r.try_get("hold_id")?, r.try_get("released_at")?)))
        .collect::<std::result::Result<_, sqlx::Error>>()?;
    let mut out = RestoreCheck {
        entries: folded.entries,
        head: folded.head.clone(),
        entries_without_mac: folded.without_mac,
        ..RestoreCheck::default()
    };
    // The database's record of the journal: every entry a row, or a
    // hold's link in the chain (which outlives its row), recorded must
    // still be there, as it was.
    let mut recorded: BTreeMap<String, (i64, Option<String>)> = BTreeMap::new();
    for r in crate::sql::requests::journal_records(schema)
        .query()
        .fetch_all(&cx.pool)
        .await?
    {
        recorded.insert(
            r.try_get("what")?,
            (r.try_get("entry")?, r.try_get("hash")?),
        );
    }
    for r in crate::sql::chain::journal_links(schema)
        .query()
        .fetch_all(&cx.pool)
        .await?
    {
        let hold: Option<Uuid> = r.try_get("hold")?;
        let journal: String = r.try_get("journal")?;
        let Some((entry, hash)) = journal.split_once(':') else {
            continue;
        };
        let Ok(entry) = entry.parse::<i64>() else {
            continue;
        };
        let what = format!("hold {}", hold.map(|h| h.to_string()).unwrap_or_default());
        recorded
            .entry(what)
            .or_insert((entry, Some(hash.to_owned())));
    }
    for (what, (entry, hash)) in recorded {
        let found = usize::try_from(entry - 1)
            .ok()
            .and_then(|i| folded.hashes.get(i));
        match found {
            Some(h) if Some(h) == hash.as_ref() => {}
            Some(_) => out.journal_behind.push(format!(
                "{what} was recorded by journal entry {entry}, and the journal holds another entry there: it was rewritten"
            )),
            None => out.journal_behind.push(format!(
                "{what} was recorded by journal entry {entry}, and the journal ends at entry {}: it was cut short or rolled back",
                folded.entries
            )),
        }
    }
    // The journal's record of the database's chain.
    if let Some(spelled) = &folded.chain {
        if let Ok(expected) = spelled.parse::<crate::domain::chain::ExpectedHead>() {
            let link: Option<String> = crate::sql::chain::link_hash_of(schema, expected.link_id)
                .query_scalar()
                .fetch_optional(&cx.pool)
                .await?;
            if link.as_deref() != Some(expected.link.as_str()) {
                out.chain_behind = Some(format!(
                    "the journal's newest entry recorded the ledger's chain at link {spelled}, and the database's chain {}: the database was restored to before it, or its chain was cut short",
                    if link.is_some() { "holds another link there" } else { "no longer reaches it" }
                ));
            }
        }
    }
    for (id, r) in &folded.requests {
        let gap = RequestGap {
            request_id: *id,
            reference: r.reference.clone(),
            journal_state: r.state.clone(),
            database_state: db_requests.get(id).cloned(),
        };
        match db_requests.get(id) {
            None if r.not_opened.is_some() => out.resolved.push(format!(
                "erasure request {} (entry for {id}) was journaled but never opened: {}",
                r.reference,
                r.not_opened.as_deref().unwrap_or_default()
            )),
            None => out.missing_requests.push(gap),
            Some(db) if rank(db) < rank(&r.state) => out.behind_requests.push(gap),
            Some(_) => {}
        }
    }
    for (id, h) in &folded.holds {
        match (db_holds.get(id), h.released) {
            (None, false) if h.not_placed.is_some() => out.resolved.push(format!(
                "hold {id} was journaled but never placed: {}",
                h.not_placed.as_deref().unwrap_or_default()
            )),
            (None, false) => {
                let expired = matches!(
                    &h.placed,
                    Some(Record::HoldPlaced { expires_at: Some(e), .. }) if *e <= now
                );
                if h.placed.is_some() && !expired {
                    out.holds_to_place.push(*id);
                }
            }
            (Some(None), true) => out.holds_to_release.push(*id),
            _ => {}
        }
    }
    Ok(out)
}

/// Brings the database back to the journal (see the module documentation).
/// With `journal_copy`, a directory, the journal is first copied there
/// (unless a copy is there already) and the replay reads and appends to
/// the copy: a drill on another cluster leaves the production journal as
/// it was. Without it, a replay on a database whose system identifier is
/// not the one the journal's entries recorded is refused.
pub(crate) async fn replay(
    cx: &Context,
    dry_run: bool,
    journal_copy: Option<&std::path::Path>,
) -> Result<ReplayReport> {
    let configured = configured(cx)?;
    let copied;
    let config = match journal_copy {
        Some(dir) => {
            copied = copy_journal(configured, dir).await?;
            &copied
        }
        None => configured,
    };
    let journal = Journal::open(config)?;
    let folded = fold(journal.read().await?);
    if journal_copy.is_none() && !dry_run {
        refuse_another_cluster(cx, config, &folded).await?;
    }
    let before = compare(cx, &folded).await?;
    let mut report = ReplayReport {
        dry_run,
        ..ReplayReport::default()
    };
    if dry_run {
        report.holds_placed = before.holds_to_place.clone();
        report.holds_released = before.holds_to_release.clone();
        report.requests_restored = before
            .missing_requests
            .iter()
            .map(|r| r.reference.clone())
            .collect();
        report.check = before;
        return Ok(report);
    }
    // 1. Holds first: an erasure run again must see every hold the journal
    //    says was there.
    place_holds(cx, &journal, &folded, &before, &mut report).await?;
    for id in &before.holds_to_release {
        match crate::ops::holds::release_journaled(cx, *id, false).await {
            Ok(_) | Err(Error::Conflict(_)) => report.holds_released.push(*id),
            Err(e) => return Err(e),
        }
    }
    // 2. Requests the database lost, as the journal opened them, and
    // 3. each of them run again, now, journaled where this replay reads:
    //    a drill's copy stays apart from the production journal.
    let to_run = restore_requests(cx, &journal, &folded, &before, &mut report).await?;
    for (id, reference, why) in to_run {
        match crate::run::requests::rerun(cx, Some(config), id, why).await {
            Ok(state) => report.requests_run.push((reference, state.as_str().into())),
            Err(e) => report
                .requests_run
                .push((reference, format!("failed: {e}"))),
        }
    }
    // The journal records where the database stands now: its chain head
    // after the replay, so the head an older entry recorded (from before
    // the restore) is no longer the one held against the chain.
    if !before.is_clean() {
        journal
            .append(
                cx,
                Record::Replayed {
                    holds_placed: report.holds_placed.len() as u64,
                    holds_released: report.holds_released.len() as u64,
                    requests_restored: report.requests_restored.len() as u64,
                },
            )
            .await?;
    }
    report.check = compare(cx, &fold(journal.read().await?)).await?;
    Ok(report)
}

/// Refuses a replay into a journal another cluster wrote (its entries'
/// system identifier is not this database's): a drill replays onto a copy.
async fn refuse_another_cluster(
    cx: &Context,
    config: &crate::domain::journal::JournalConfig,
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
                config.describe()
            )));
        }
    }
    Ok(())
}

/// Places again the holds the journal placed and the database lacks,
/// without journaling them again; one that is refused as it stands (its
/// record is gone, say) is journaled as never to be placed.
async fn place_holds(
    cx: &Context,
    journal: &Journal<'_>,
    folded: &Folded,
    before: &RestoreCheck,
    report: &mut ReplayReport,
) -> Result<()> {
    let key = journal.key();
    for id in &before.holds_to_place {
        let Some((_, h)) = folded.holds.iter().find(|(h, _)| h == id) else {
            continue;
        };
        let Some(Record::HoldPlaced {
            hold_id,
            entity_id,
            record_id,
            subject,
            kind,
            tenant,
            reason,
            created_at,
            expires_at,
        }) = &h.placed
        else {
            continue;
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
            (Some(e), Some(r), _) => crate::ops::holds::HoldRequest::new(*e, r.clone(), reason),
            (_, _, Some(s)) => crate::ops::holds::HoldRequest::subject(open("subject", s)?, reason),
            _ => {
                report
                    .skipped
                    .push(format!("hold {hold_id}: the journal names no target"));
                continue;
            }
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
        match crate::ops::holds::create_journaled(cx, req, false).await {
            Ok(_) => report.holds_placed.push(*hold_id),
            Err(e) if e.kind().is_bad_input() => {
                // Refused as it stands (its record is gone, say): it cannot
                // come to exist, so the journal says so and it no longer
                // blocks restore-check, replay or the worker.
                let why = format!("replay could not place it again: {e}");
                journal
                    .append(
                        cx,
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

/// Restores the requests the database lost, as the journal opened them;
/// returns them and the ones the database has behind the journal, each
/// with the line of history its run again starts with.
async fn restore_requests(
    cx: &Context,
    journal: &Journal<'_>,
    folded: &Folded,
    before: &RestoreCheck,
    report: &mut ReplayReport,
) -> Result<Vec<(Uuid, String, String)>> {
    let key = journal.key();
    let mut to_run: Vec<(Uuid, String, String)> = Vec::new();
    for gap in &before.missing_requests {
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
            continue;
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
            continue;
        }
        report.requests_restored.push(reference.clone());
        to_run.push((
            request_id,
            reference,
            format!(
                "replay: the journal holds this request {}; the database had lost it",
                gap.journal_state
            ),
        ));
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

/// A copy of the configured journal in `dir` (made once: a second drill
/// goes on from the first's copy), for a replay that must not write to
/// the journal it was given.
async fn copy_journal(
    config: &crate::domain::journal::JournalConfig,
    dir: &std::path::Path,
) -> Result<crate::domain::journal::JournalConfig> {
    let key = config.resolved_key()?;
    let copy = crate::domain::journal::JournalConfig::dir(dir).key(key);
    let target = dir.join(crate::domain::journal::FILE_NAME);
    if !target.exists() {
        let lines = Journal::open(config)?.lines().await?;
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
