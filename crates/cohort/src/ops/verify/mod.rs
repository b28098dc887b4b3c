//! `cohort verify`: walks the ledger's hash chain ([`crate::domain::chain`]) in one
//! read-only snapshot and reports the first record or link that does not
//! match, and what differs. It reads with `SELECT` only.
//!
//! For each link, in order: its number follows the one before (else a
//! link is missing), its `prev` is the link before's hash (else links
//! were reordered), its digest is the SHA-256 of its record and its hash
//! is the formula over both (else the link itself was edited). Then the
//! record it stands for, rebuilt from the ledger's rows now, must be the
//! record it linked (else it changed, and the fields are named), or be
//! gone with a later checkpoint standing for it (else it is missing).
//! Last, every run settled since the chain started must have a link (else
//! it was inserted).

mod link;
mod rebuilt;

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::context::Context;
use crate::domain::chain::{
    self, BreakKind, ChainBreak, ChainHead, ChainReport, CheckpointRecord, CheckpointSeen,
    ExpectedHead, LedgerKey, LinkKind, PruneCutoffs, ReleaseRecord,
};
use crate::error::Result;
use crate::sql::chain as statements;

use self::link::{check_link, released_after_placed, Keyed};
use self::rebuilt::{
    check_holds, check_releases, check_request_events, check_requests, check_runs,
};

/// Links read per round trip.
const PAGE: i64 = 1000;

/// The most differences named per changed record.
pub(super) const FIELDS: usize = 5;

/// Breaks kept before sorting (a whole chain rewritten breaks every link).
pub(super) const KEEP: usize = 10_000;

/// One link as read.
pub(super) use crate::sql::chain::LinkRow;

/// The walk's state between pages.
#[derive(Default)]
pub(super) struct Walk {
    breaks: Vec<ChainBreak>,
    more: bool,
    /// Linked records found gone, waiting for a checkpoint, by link.
    gone: BTreeMap<i64, Gone>,
    /// Gone holds' expiry and release times (from their links), to check
    /// a checkpoint's cutoff reached them.
    gone_holds: HashMap<Uuid, (Option<i64>, Option<i64>)>,
    /// Each hold's latest release link: hold → (link, record).
    releases: HashMap<Uuid, (i64, ReleaseRecord)>,
    /// Holds in the chain that carry a release time: hold → placing link.
    released_holds: HashMap<Uuid, i64>,
    /// Each hold's placing time as linked: hold → (link, created_at).
    placed_at: HashMap<Uuid, (i64, i64)>,
    /// Each hold's release time as linked: hold → (link, released_at).
    released_at: HashMap<Uuid, (i64, i64)>,
    /// Each request's newest link: request → (link, the request as linked).
    requests: HashMap<Uuid, (i64, chain::RequestPart)>,
    records_checked: u64,
    records_pruned: u64,
}

/// A linked record no longer in the ledger.
pub(super) struct Gone {
    name: String,
    kind: LinkKind,
    subject: Uuid,
    record: String,
}

impl Walk {
    fn gone(&mut self, link_id: i64, kind: LinkKind, subject: Uuid, record: String) {
        let name = label(kind, Some(subject), link_id);
        if matches!(kind, LinkKind::HoldPlaced | LinkKind::HoldReleased) {
            let times = self.gone_holds.entry(subject).or_default();
            if let Ok(h) = serde_json::from_str::<chain::HoldRecord>(&record) {
                times.0 = h.expires_at;
            }
            if let Ok(r) = serde_json::from_str::<ReleaseRecord>(&record) {
                times.1 = Some(r.released_at);
            }
        }
        self.gone.insert(
            link_id,
            Gone {
                name,
                kind,
                subject,
                record,
            },
        );
    }

    /// Why the cutoffs of a checkpoint could not have deleted a record
    /// (`None`: they could).
    fn out_of_reach(&self, g: &Gone, cut: &PruneCutoffs) -> Option<String> {
        let shown = |m: i64| {
            DateTime::<Utc>::from_timestamp_micros(m)
                .map(|t| t.to_rfc3339())
                .unwrap_or_else(|| m.to_string())
        };
        let reached = |at: Option<i64>, before: Option<i64>, what: &str| match (at, before) {
            (_, None) => Some(format!("the checkpoint pruned no {what}")),
            (Some(at), Some(c)) if at < c => None,
            (Some(at), Some(c)) => Some(format!(
                "{what} up to {} only, and this one is of {}",
                shown(c),
                shown(at)
            )),
            (None, Some(_)) => Some(format!(
                "this one never ended, so no {what} cutoff reaches it"
            )),
        };
        match g.kind {
            LinkKind::Run => {
                let r: chain::RunRecord = serde_json::from_str(&g.record).ok()?;
                match r.status.as_str() {
                    "succeeded" => reached(r.settled_at, cut.succeeded_before, "succeeded runs"),
                    "failed" | "partially_failed" | "cancelled" => {
                        reached(r.settled_at, cut.failed_before, "failed runs")
                    }
                    other => Some(format!("a {other} run is never pruned")),
                }
            }
            _ => {
                let (expires, released) =
                    self.gone_holds.get(&g.subject).copied().unwrap_or_default();
                let inactive = match (expires, released) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                reached(inactive, cut.holds_before, "inactive holds")
            }
        }
    }

    fn broken(&mut self, link_id: Option<i64>, record: String, kind: BreakKind, detail: String) {
        if self.breaks.len() < KEEP {
            self.breaks.push(ChainBreak {
                link_id,
                record,
                kind,
                detail,
            });
        } else {
            self.more = true;
        }
    }
}

pub(super) fn label(kind: LinkKind, subject: Option<Uuid>, link_id: i64) -> String {
    match (kind, subject) {
        (LinkKind::Run, Some(s)) => format!("run {s}"),
        (LinkKind::HoldPlaced | LinkKind::HoldReleased, Some(s)) => format!("hold {s}"),
        (LinkKind::Checkpoint, _) => "checkpoint".into(),
        (LinkKind::Start, _) => "the chain's start".into(),
        (LinkKind::Key, _) => format!("key link {link_id}"),
        (LinkKind::Request, Some(s)) => format!("erasure request {s}"),
        _ => format!("link {link_id}"),
    }
}

/// Where the walk stands between links: the next link expected and the
/// hash it must follow, the chain's start, whether the recorded head was
/// seen, and the keyed part's state.
pub(super) struct Cursor<'a> {
    next_id: i64,
    prev: String,
    start: Option<DateTime<Utc>>,
    head_seen: bool,
    expected: Option<&'a ExpectedHead>,
    key: Option<&'a LedgerKey>,
    keyed: Keyed,
}

/// One page's links that hold, by what their records are compared with.
#[derive(Default)]
pub(super) struct Page {
    runs: Vec<(i64, Uuid, String)>,
    holds: Vec<(i64, LinkKind, Uuid, String)>,
    checkpoints: Vec<(i64, DateTime<Utc>, CheckpointRecord)>,
    events: Vec<(i64, Uuid, String)>,
}

/// Walks the chain; `expected`, a head recorded earlier, must still be in
/// it with the same hash.
/// With `policy_known` false (an auditor's verify, without the policy
/// file), checkpoints are not held to any history limits, and the report
/// says so once.
pub(crate) async fn verify(
    cx: &Context,
    expected: Option<ExpectedHead>,
    policy_known: bool,
) -> Result<ChainReport> {
    let schema = cx.config.schema.as_str();
    let mut conn = cx.pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::SNAPSHOT).await?;
    let mut report = ChainReport::new();
    // The history limits of the policy verify runs with, to hold each
    // checkpoint's cutoffs to (a warning, not a break: the policy may
    // have changed since).
    let policy = policy_known.then(|| {
        crate::services::PrunerConfig::from_config(&cx.config)
            .ok()
            .flatten()
    });
    let mut walk = Walk::default();
    let mut at = Cursor {
        next_id: 1,
        prev: chain::GENESIS.to_string(),
        start: None,
        head_seen: false,
        expected: expected.as_ref(),
        key: cx.config.ledger_key.as_ref(),
        keyed: Keyed::default(),
    };
    loop {
        let links = read_page(&mut tx, schema, at.next_id - 1).await?;
        let Some(last_id) = links.last().map(|l| l.link_id) else {
            break;
        };
        let mut page = Page::default();
        for l in &links {
            check_link(&mut walk, &mut report, &mut at, &mut page, l);
        }
        check_runs(&mut tx, schema, page.runs, &mut walk).await?;
        check_request_events(&mut tx, schema, page.events, &mut walk).await?;
        check_holds(&mut tx, schema, page.holds, &mut walk).await?;
        for (link_id, linked_at, c) in page.checkpoints {
            checkpoint(
                &mut walk,
                &mut report,
                (link_id, linked_at),
                c,
                policy.as_ref().map(Option::as_ref),
            );
        }
        if (links.len() as i64) < PAGE {
            break;
        }
        at.next_id = last_id + 1;
    }
    if !policy_known && !report.checkpoints.is_empty() {
        report.warnings.push(format!(
            "{} checkpoint(s) were checked against the records they stand for, but not against a policy's history limits: verified without the policy file",
            report.checkpoints.len()
        ));
    }
    for (link_id, g) in std::mem::take(&mut walk.gone) {
        walk.broken(
            Some(link_id),
            g.name,
            BreakKind::Missing,
            "its record was deleted, and no checkpoint of the pruner stands for it".into(),
        );
    }
    check_releases(&mut tx, schema, &mut walk).await?;
    released_after_placed(&mut walk);
    check_requests(&mut tx, schema, &mut walk).await?;
    journal_head(cx, &mut tx, &mut walk, &mut report.warnings).await?;
    key_warnings(&at, &mut report);
    recorded_head_seen(&at, &mut walk);
    outside_the_chain(&mut tx, schema, at.start, &mut report, &mut walk).await?;
    tx.rollback().await?;
    Ok(walk.into_report(report))
}

/// One page of links after `after`, in order.
async fn read_page(tx: &mut sqlx::PgConnection, schema: &str, after: i64) -> Result<Vec<LinkRow>> {
    Ok(statements::links_after(schema, after, PAGE)
        .query_as::<LinkRow>()
        .fetch_all(&mut *tx)
        .await?)
}

/// What the report says of the chain's key: not keyed, or keyed and
/// verified without the key.
fn key_warnings(at: &Cursor<'_>, report: &mut ChainReport) {
    report.keyed_from = at.keyed.from;
    report.macs_checked = at.keyed.from.is_some() && at.key.is_some();
    match (at.keyed.from, at.key) {
        (None, _) => report.warnings.push(format!(
            "the chain is not keyed: anyone who can write the database can append links that verify; \
             key it with {} set for `cohort migrate`, and compare its head with one recorded outside the database",
            chain::LEDGER_KEY_ENV
        )),
        (Some(from), None) => report.warnings.push(format!(
            "the chain is keyed from link {from}, but verify ran without {}: the links' hashes were checked, their MACs were not, \
             so a link written without the key would not be named",
            chain::LEDGER_KEY_ENV
        )),
        (Some(_), Some(_)) => {}
    }
}

/// A head recorded outside the database that the walk never reached.
fn recorded_head_seen(at: &Cursor<'_>, walk: &mut Walk) {
    if let Some(e) = at.expected.filter(|_| !at.head_seen) {
        walk.broken(
            Some(e.link_id),
            format!("link {}", e.link_id),
            BreakKind::Missing,
            format!(
                "the head you recorded ({}:{}) is not in the chain, which ends at link {}",
                e.link_id,
                e.link,
                at.next_id - 1
            ),
        );
    }
}

/// What is outside the chain: runs settled before it started (counted),
/// runs settled after it started without a link (each a break), and holds
/// written outside the library (counted).
async fn outside_the_chain(
    tx: &mut sqlx::PgConnection,
    schema: &str,
    start: Option<DateTime<Utc>>,
    report: &mut ChainReport,
    walk: &mut Walk,
) -> Result<()> {
    if let Some(start) = start {
        report.started_at = Some(start);
        let n: i64 = statements::runs_before(schema, start)
            .query_scalar()
            .fetch_one(&mut *tx)
            .await?;
        report.runs_before_chain = n.max(0) as u64;
        let inserted: Vec<(Uuid, DateTime<Utc>)> =
            statements::unlinked_runs(schema, start, KEEP as i64)
                .query_as()
                .fetch_all(&mut *tx)
                .await?;
        for (run_id, settled_at) in inserted {
            walk.broken(
                None,
                format!("run {run_id}"),
                BreakKind::Inserted,
                format!("settled at {settled_at}, after the chain started, and has no link"),
            );
        }
    }
    let outside: i64 = statements::holds_outside(schema)
        .query_scalar()
        .fetch_one(&mut *tx)
        .await?;
    report.holds_outside_chain = outside.max(0) as u64;
    Ok(())
}

impl Walk {
    /// The report with the walk's findings: breaks in link order, at most
    /// [`ChainReport::LIMIT`] of them.
    fn into_report(mut self, mut report: ChainReport) -> ChainReport {
        report.records_checked = self.records_checked;
        report.records_pruned = self.records_pruned;
        self.breaks
            .sort_by_key(|b| (b.link_id.is_none(), b.link_id.unwrap_or(0)));
        report.more_breaks = self.more || self.breaks.len() > ChainReport::LIMIT;
        self.breaks.truncate(ChainReport::LIMIT);
        report.intact = self.breaks.is_empty();
        report.breaks = self.breaks;
        report
    }
}

/// The journal's record of the chain (when a journal is configured): the
/// head its newest entry recorded must still be in the chain, or links
/// were removed from the chain's end (the newest included, which nothing
/// else inside the database can show), or the database was restored.
async fn journal_head(
    cx: &Context,
    tx: &mut sqlx::PgConnection,
    walk: &mut Walk,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let Some(journal) = &cx.journal else {
        return Ok(());
    };
    let entries = match journal.read().await {
        Ok(e) => e,
        Err(e) => {
            warnings.push(format!(
                "{} was not compared with the chain: {e}",
                journal.describe()
            ));
            return Ok(());
        }
    };
    let Some((seq, spelled)) = entries
        .iter()
        .rev()
        .find_map(|e| e.chain.clone().map(|c| (e.seq, c)))
    else {
        return Ok(());
    };
    let Ok(expected) = spelled.parse::<ExpectedHead>() else {
        return Ok(());
    };
    let link: Option<String> = statements::link_hash_of(&cx.config.schema, expected.link_id)
        .query_scalar()
        .fetch_optional(&mut *tx)
        .await?;
    if link.as_deref() != Some(expected.link.as_str()) {
        walk.broken(
            Some(expected.link_id),
            format!("link {}", expected.link_id),
            BreakKind::Missing,
            format!(
                "journal entry {seq} recorded the chain at link {spelled}, and the chain {}: links were removed from its end, or the database was restored (run `cohort restore-check`)",
                if link.is_some() { "holds another link there" } else { "no longer reaches it" }
            ),
        );
    }
    Ok(())
}

/// The newest link linked at or before `at` (the whole chain's, when
/// `None`); `None` before schema 19's start link exists.
pub(crate) async fn head(cx: &Context, at: Option<DateTime<Utc>>) -> Result<Option<ChainHead>> {
    let row = statements::head(&cx.config.schema, at)
        .query_as::<statements::HeadRow>()
        .fetch_optional(&cx.pool)
        .await?;
    Ok(row.map(ChainHead::from))
}

/// A checkpoint against the records it stands for: each must be gone with
/// the digest it was linked with, and within the checkpoint's cutoffs,
/// which cannot be after the checkpoint itself; the cutoffs are held to
/// the policy's history limits as a warning (`policy`: `None` when no
/// policy is known, `Some(None)` for one that prunes nothing).
fn checkpoint(
    walk: &mut Walk,
    report: &mut ChainReport,
    (link_id, linked_at): (i64, DateTime<Utc>),
    c: CheckpointRecord,
    policy: Option<Option<&crate::services::PrunerConfig>>,
) {
    let at = |m: Option<i64>| m.and_then(DateTime::<Utc>::from_timestamp_micros);
    let cut = c.cutoffs;
    report.checkpoints.push(CheckpointSeen {
        link_id,
        linked_at,
        succeeded_before: at(cut.succeeded_before),
        failed_before: at(cut.failed_before),
        holds_before: at(cut.holds_before),
        links: c.pruned.len(),
    });
    let now = chain::micros(linked_at);
    if [cut.succeeded_before, cut.failed_before, cut.holds_before]
        .iter()
        .flatten()
        .any(|c| *c > now)
    {
        walk.broken(
            Some(link_id),
            "checkpoint".into(),
            BreakKind::Changed,
            "its cutoffs are after the checkpoint itself: no pruning pass writes that".into(),
        );
    }
    // A policy with no history limits prunes nothing, so it allows no
    // checkpoint at all: every cutoff one claims is named.
    let limits = match policy {
        Some(Some(policy)) => crate::services::pruner::cutoffs(policy, linked_at)
            .ok()
            .map(|(runs, holds)| [runs.succeeded, runs.failed, holds]),
        Some(None) => Some([None, None, None]),
        None => None,
    };
    if let Some([succeeded, failed, holds]) = limits {
        for (what, claimed, allowed) in [
            ("succeeded runs", cut.succeeded_before, succeeded),
            ("failed runs", cut.failed_before, failed),
            ("inactive holds", cut.holds_before, holds),
        ] {
            let Some(claimed) = at(claimed) else { continue };
            match allowed {
                    None => report.warnings.push(format!(
                        "checkpoint link {link_id} ({linked_at}) pruned {what} before {claimed}; the policy verify ran with does not prune {what}: it was written under another policy, or forged"
                    )),
                    Some(allowed) if claimed > allowed => report.warnings.push(format!(
                        "checkpoint link {link_id} ({linked_at}) pruned {what} before {claimed}; the policy verify ran with keeps them until {allowed} at that time: it was written under another policy, or forged"
                    )),
                    Some(_) => {}
                }
        }
    }
    for p in c.pruned {
        let Some(g) = walk.gone.remove(&p.link_id) else {
            continue;
        };
        if chain::digest(&g.record) != p.digest {
            walk.broken(
                Some(p.link_id),
                g.name,
                BreakKind::Missing,
                format!("it is gone, and checkpoint link {link_id} stands for another record in its place"),
            );
        } else if let Some(why) = walk.out_of_reach(&g, &cut) {
            walk.broken(
                Some(p.link_id),
                g.name,
                BreakKind::Missing,
                format!("it is gone under checkpoint link {link_id}, whose cutoffs do not reach it: {why}"),
            );
        } else {
            walk.records_pruned += 1;
        }
    }
}
