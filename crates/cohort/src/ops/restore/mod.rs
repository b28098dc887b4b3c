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

mod journaled;
mod replay;

use std::collections::BTreeMap;

use serde::Serialize;
use uuid::Uuid;

use self::journaled::{fold, judge, DatabaseView, Folded};
use self::replay::{copy_journal, place_holds, refuse_another_cluster, restore_requests};
use crate::context::{Context, Ready};
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

fn configured(cx: &Context) -> Result<&Journal> {
    cx.journal.as_ref().ok_or_else(|| {
        Error::InvalidInput(
            "no journal is configured: restore-check and replay compare the database with [journal] (dir = \"…\" or url = \"postgres://…\")".into(),
        )
    })
}

/// Compares the database with the journal.
pub(crate) async fn check(cx: &Context) -> Result<RestoreCheck> {
    let folded = fold(configured(cx)?.read().await?);
    compare(cx, &folded).await
}

/// Compares the database with the folded journal.
async fn compare(cx: &Context, folded: &Folded) -> Result<RestoreCheck> {
    Ok(judge(folded, &read_database(cx, folded).await?))
}

/// What the database holds of the journal's requests and holds, the
/// journal entries its rows recorded, and its chain at the link the
/// journal's newest entry recorded.
async fn read_database(cx: &Context, folded: &Folded) -> Result<DatabaseView> {
    let schema = &cx.config.schema;
    let pool = &cx.pool;
    let requests = crate::sql::requests::states(schema)
        .query_as::<crate::sql::requests::StateRow>()
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|r| (r.request_id, r.state))
        .collect();
    let holds = crate::sql::requests::hold_states(schema)
        .query_as::<crate::sql::requests::HoldStateRow>()
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|r| (r.hold_id, r.released_at))
        .collect();
    let mut recorded: BTreeMap<String, (i64, Option<String>)> = BTreeMap::new();
    for r in crate::sql::requests::journal_records(schema)
        .query_as::<crate::sql::requests::JournalRecordRow>()
        .fetch_all(pool)
        .await?
    {
        recorded.insert(r.what, (r.entry, r.hash));
    }
    // A hold's link in the chain outlives its row.
    for r in crate::sql::chain::journal_links(schema)
        .query_as::<crate::sql::chain::JournalLinkRow>()
        .fetch_all(pool)
        .await?
    {
        let (hold, journal) = (r.hold, r.journal);
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
    let chain_link = match folded.expected_head() {
        Some(expected) => {
            crate::sql::chain::link_hash_of(schema, expected.link_id)
                .query_scalar()
                .fetch_optional(pool)
                .await?
        }
        None => None,
    };
    Ok(DatabaseView {
        now: crate::sql::database_now(pool).await?,
        requests,
        holds,
        recorded,
        chain_link,
    })
}

/// Brings the database back to the journal (see the module documentation).
/// With `journal_copy`, a directory, the journal is first copied there
/// (unless a copy is there already) and the replay reads and appends to
/// the copy: a drill on another cluster leaves the production journal as
/// it was. Without it, a replay on a database whose system identifier is
/// not the one the journal's entries recorded is refused.
pub(crate) async fn replay(
    cx: &Ready<'_>,
    dry_run: bool,
    journal_copy: Option<&std::path::Path>,
) -> Result<ReplayReport> {
    let configured = configured(cx)?;
    let copied;
    let journal = match journal_copy {
        Some(dir) => {
            copied = Journal::new(copy_journal(configured, dir).await?);
            &copied
        }
        None => configured,
    };
    let folded = fold(journal.read().await?);
    if journal_copy.is_none() && !dry_run {
        refuse_another_cluster(cx, journal, &folded).await?;
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
    place_holds(cx, journal, &folded, &before, &mut report).await?;
    for id in &before.holds_to_release {
        match crate::ops::holds::release_journaled(cx, *id, false).await {
            Ok(_) | Err(Error::Conflict(_)) => report.holds_released.push(*id),
            Err(e) => return Err(e),
        }
    }
    // 2. Requests the database lost, as the journal opened them, and
    // 3. each of them run again, now, journaled where this replay reads:
    //    a drill's copy stays apart from the production journal.
    let to_run = restore_requests(cx, journal, &folded, &before, &mut report).await?;
    for (id, reference, why) in to_run {
        match crate::run::requests::rerun(cx, Some(journal), id, why).await {
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
                &cx.pool,
                &cx.config.schema,
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
