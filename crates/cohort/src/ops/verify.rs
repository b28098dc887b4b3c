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

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

use crate::context::Context;
use crate::domain::chain::{
    self, BreakKind, ChainBreak, ChainHead, ChainReport, CheckpointRecord, CheckpointSeen,
    ExpectedHead, LedgerKey, LinkKind, PruneCutoffs, ReleaseRecord,
};
use crate::error::Result;
use crate::run::chain as records;
use crate::sql::chain as statements;

/// Links read per round trip.
const PAGE: i64 = 1000;

/// The most differences named per changed record.
const FIELDS: usize = 5;

/// Breaks kept before sorting (a whole chain rewritten breaks every link).
const KEEP: usize = 10_000;

/// One link as read.
#[derive(Clone)]
struct LinkRow {
    link_id: i64,
    kind: String,
    subject: Option<Uuid>,
    record: String,
    digest: String,
    prev: String,
    link: String,
    covers: Vec<i64>,
    linked_at: DateTime<Utc>,
    mac: Option<String>,
}

/// The walk's state between pages.
#[derive(Default)]
struct Walk {
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
struct Gone {
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

fn label(kind: LinkKind, subject: Option<Uuid>, link_id: i64) -> String {
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
struct Cursor<'a> {
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
struct Page {
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
        .query()
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| {
            Ok(LinkRow {
                link_id: r.try_get("link_id")?,
                kind: r.try_get("kind")?,
                subject: r.try_get("subject_id")?,
                record: r.try_get("record")?,
                digest: r.try_get("digest")?,
                prev: r.try_get("prev")?,
                link: r.try_get("link")?,
                covers: r.try_get("covers")?,
                linked_at: r.try_get("linked_at")?,
                mac: r.try_get("mac")?,
            })
        })
        .collect::<std::result::Result<_, sqlx::Error>>()?)
}

/// One link against the walk so far, without the database: its place
/// (nothing missing before it, following its predecessor's hash), the
/// head recorded outside, its kind, its record's digest, its hash and MAC;
/// a link that holds is put in `page` by what its record is compared
/// with.
fn check_link(
    walk: &mut Walk,
    report: &mut ChainReport,
    at: &mut Cursor<'_>,
    page: &mut Page,
    l: &LinkRow,
) {
    report.links += 1;
    let kind = LinkKind::parse(&l.kind);
    let name = kind
        .map(|k| label(k, l.subject, l.link_id))
        .unwrap_or_else(|| format!("link {}", l.link_id));
    in_place(walk, at, l, &name);
    at.next_id = l.link_id + 1;
    at.prev = l.link.clone();
    report.head = Some(ChainHead {
        link_id: l.link_id,
        link: l.link.clone(),
        linked_at: l.linked_at,
    });
    if let Some(e) = at.expected.filter(|e| e.link_id == l.link_id) {
        at.head_seen = true;
        if e.link != l.link {
            walk.broken(
                Some(l.link_id),
                name.clone(),
                BreakKind::Changed,
                format!(
                    "the chain no longer holds the head you recorded ({}:{}); it is now {}: the chain was rewritten up to here",
                    e.link_id, e.link, l.link
                ),
            );
        }
    }
    let Some(kind) = kind else {
        walk.broken(
            Some(l.link_id),
            name,
            BreakKind::Changed,
            format!("its kind {:?} is not one Cohort writes", l.kind),
        );
        return;
    };
    if chain::digest(&l.record) != l.digest {
        walk.broken(
            Some(l.link_id),
            name,
            BreakKind::Changed,
            "its record was edited: it no longer matches its digest".into(),
        );
        return;
    }
    if let Some(why) = at.keyed.check(l, kind, at.key) {
        walk.broken(Some(l.link_id), name, BreakKind::Changed, why);
        return;
    }
    sort_link(walk, at, page, l, kind, name);
}

/// Whether link `l` comes where the walk expects it: none missing before
/// it, and following the previous link's hash.
fn in_place(walk: &mut Walk, at: &Cursor<'_>, l: &LinkRow, name: &str) {
    let next_id = at.next_id;
    if l.link_id > next_id {
        let gap = if l.link_id - next_id == 1 {
            format!("link {next_id} is gone")
        } else {
            format!("links {next_id} to {} are gone", l.link_id - 1)
        };
        walk.broken(
            Some(next_id),
            format!("link {next_id}"),
            BreakKind::Missing,
            format!("{gap}: deleted from the chain"),
        );
    } else if l.prev != at.prev {
        walk.broken(
            Some(l.link_id),
            name.to_owned(),
            BreakKind::Reordered,
            format!(
                "it does not follow link {}: its prev is not that link's hash (links moved, or one before it was replaced)",
                l.link_id - 1
            ),
        );
    }
}

/// A link that holds, put where its record is compared.
fn sort_link(
    walk: &mut Walk,
    at: &mut Cursor<'_>,
    page: &mut Page,
    l: &LinkRow,
    kind: LinkKind,
    name: String,
) {
    match (kind, l.subject) {
        (LinkKind::Key, _) => {}
        (LinkKind::Request, Some(s)) => page.events.push((l.link_id, s, l.record.clone())),
        (LinkKind::Start, _) => {
            if l.link_id == 1 {
                at.start = Some(l.linked_at);
            }
        }
        (LinkKind::Run, Some(s)) => page.runs.push((l.link_id, s, l.record.clone())),
        (LinkKind::HoldPlaced | LinkKind::HoldReleased, Some(s)) => {
            release_in_time(walk, l, kind, s);
            page.holds.push((l.link_id, kind, s, l.record.clone()))
        }
        (LinkKind::Checkpoint, _) => match serde_json::from_str::<CheckpointRecord>(&l.record) {
            Ok(c) if c.pruned.iter().map(|p| p.link_id).collect::<Vec<_>>() == l.covers => {
                page.checkpoints.push((l.link_id, l.linked_at, c))
            }
            _ => walk.broken(
                Some(l.link_id),
                name,
                BreakKind::Changed,
                "its record does not list the links it covers".into(),
            ),
        },
        _ => walk.broken(
            Some(l.link_id),
            name,
            BreakKind::Changed,
            "a run or hold link without its subject".into(),
        ),
    }
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

async fn check_runs(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    runs: Vec<(i64, Uuid, String)>,
    walk: &mut Walk,
) -> Result<()> {
    if runs.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = runs.iter().map(|r| r.1).collect();
    let current = records::read_runs(conn, schema, &ids).await?;
    for (link_id, run_id, linked) in runs {
        let name = label(LinkKind::Run, Some(run_id), link_id);
        match current.get(&run_id) {
            None => walk.gone(link_id, LinkKind::Run, run_id, linked),
            Some(now) => {
                walk.records_checked += 1;
                let mut now = now.clone();
                if serde_json::from_str::<chain::RunRecord>(&linked)
                    .is_ok_and(|l| l.details.is_none())
                {
                    // Linked before schema 20, which added the details' digest.
                    now.details = None;
                }
                let now = chain::canonical(&now);
                if now != linked {
                    let fields = name_summaries(&linked, chain::differences(&linked, &now, FIELDS))
                        .join("; ");
                    walk.broken(
                        Some(link_id),
                        name,
                        BreakKind::Changed,
                        format!("the ledger's rows differ from the linked record: {fields}"),
                    );
                }
            }
        }
    }
    Ok(())
}

/// Differences as a person reads them: `summaries[3].affected_count`
/// becomes `summaries[3] (Invoice, tenant aaaa…).affected_count`, the
/// entity (and tenant) the linked record gives that summary.
fn name_summaries(linked: &str, fields: Vec<String>) -> Vec<String> {
    let Ok(run) = serde_json::from_str::<chain::RunRecord>(linked) else {
        return fields;
    };
    fields
        .into_iter()
        .map(|f| {
            let Some(rest) = f.strip_prefix("summaries[") else {
                return f;
            };
            let Some((index, tail)) = rest.split_once(']') else {
                return f;
            };
            match index
                .parse::<usize>()
                .ok()
                .and_then(|i| run.summaries.get(i))
            {
                Some(s) => format!(
                    "summaries[{index}] ({}{}){tail}",
                    s.entity_type,
                    s.tenant_id
                        .as_deref()
                        .map(|t| format!(", tenant {t}"))
                        .unwrap_or_default()
                ),
                None => f,
            }
        })
        .collect()
}

async fn check_holds(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    holds: Vec<(i64, LinkKind, Uuid, String)>,
    walk: &mut Walk,
) -> Result<()> {
    if holds.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = holds.iter().map(|h| h.2).collect();
    let current = records::read_holds(conn, schema, &ids).await?;
    for (link_id, kind, hold_id, linked) in holds {
        let name = label(kind, Some(hold_id), link_id);
        let Some(now) = current.get(&hold_id) else {
            walk.gone(link_id, kind, hold_id, linked);
            continue;
        };
        if kind == LinkKind::HoldReleased {
            match serde_json::from_str::<ReleaseRecord>(&linked) {
                Ok(r) => {
                    walk.releases.insert(hold_id, (link_id, r));
                }
                Err(_) => walk.broken(
                    Some(link_id),
                    name,
                    BreakKind::Changed,
                    "its record is not a release".into(),
                ),
            }
            continue;
        }
        walk.records_checked += 1;
        if now.released_at.is_some() {
            walk.released_holds.insert(hold_id, link_id);
        }
        let mut now = now.placed.clone();
        if serde_json::from_str::<chain::HoldRecord>(&linked).is_ok_and(|l| l.forms.is_none()) {
            // Linked before schema 20, which added the subject's forms.
            now.forms = None;
        }
        let now = chain::canonical(&now);
        if now != linked {
            let fields = chain::differences(&linked, &now, FIELDS).join("; ");
            walk.broken(
                Some(link_id),
                name,
                BreakKind::Changed,
                format!("the hold differs from the linked record: {fields} (reason and subject are compared as digests)"),
            );
        }
    }
    Ok(())
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
    let Some(config) = &cx.journal else {
        return Ok(());
    };
    let entries = match crate::store::journal::Journal::open(config) {
        Ok(j) => j.read().await,
        Err(e) => Err(e),
    };
    let entries = match entries {
        Ok(e) => e,
        Err(e) => {
            warnings.push(format!(
                "{} was not compared with the chain: {e}",
                config.describe()
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

/// The chain's keyed part, as the walk meets it: from the first `key`
/// link on, every link carries a MAC and is hashed over its own time.
#[derive(Default)]
struct Keyed {
    /// The first `key` link.
    from: Option<i64>,
    /// The key id its newest `key` link names.
    key_id: Option<String>,
}

impl Keyed {
    /// Why link `l` does not hold (its hash, its MAC, its place in the
    /// keyed part), or `None` when it holds. A `key` link starts the keyed
    /// part; a link without a MAC after it was written without the key.
    fn check(&mut self, l: &LinkRow, kind: LinkKind, key: Option<&LedgerKey>) -> Option<String> {
        let Some(mac) = &l.mac else {
            if chain::link_hash(&l.prev, l.link_id, kind, l.subject, &l.digest) != l.link {
                return Some("the link was edited: its hash no longer matches its contents".into());
            }
            return self.from.map(|from| {
                format!(
                    "it has no MAC, and the chain is keyed from link {from}: it was written without the ledger's key"
                )
            });
        };
        let hash = chain::keyed_link_hash(
            &l.prev,
            l.link_id,
            kind,
            l.subject,
            &l.digest,
            chain::micros(l.linked_at),
        );
        if hash != l.link {
            return Some(
                "the link was edited: its hash no longer matches its contents and time".into(),
            );
        }
        if kind == LinkKind::Key {
            self.from.get_or_insert(l.link_id);
            self.key_id = serde_json::from_str::<chain::KeyRecord>(&l.record)
                .ok()
                .map(|k| k.key_id);
        } else if self.from.is_none() {
            return Some(
                "it carries a MAC before any key link: the chain's keyed part does not start with a key".into(),
            );
        }
        let key = key?;
        if self.key_id.as_deref() != Some(key.id().as_str()) {
            return Some(format!(
                "the chain is keyed here with key {}, and verify was given key {}",
                self.key_id.as_deref().unwrap_or("?"),
                key.id()
            ));
        }
        (key.mac(&l.link) != *mac).then(|| {
            "its MAC does not hold under the ledger's key: it was written, or rewritten, without the key".into()
        })
    }
}

/// A release link's time against the link itself: a release is linked in
/// the transaction that sets it, so its `released_at` (that transaction's
/// start) is never after the link's `linked_at`. Records the linked
/// placing and release times for [`released_after_placed`].
fn release_in_time(walk: &mut Walk, l: &LinkRow, kind: LinkKind, hold: Uuid) {
    if kind == LinkKind::HoldPlaced {
        if let Ok(h) = serde_json::from_str::<chain::HoldRecord>(&l.record) {
            walk.placed_at.insert(hold, (l.link_id, h.created_at));
        }
        return;
    }
    let Ok(r) = serde_json::from_str::<ReleaseRecord>(&l.record) else {
        return;
    };
    walk.released_at.insert(hold, (l.link_id, r.released_at));
    if r.released_at > chain::micros(l.linked_at) {
        walk.broken(
            Some(l.link_id),
            label(kind, Some(hold), l.link_id),
            BreakKind::Changed,
            format!(
                "its release time {} is after the link that records it ({}): no release writes that",
                shown(r.released_at),
                l.linked_at.to_rfc3339()
            ),
        );
    }
}

/// Each linked release against its hold's linked placing: a hold is never
/// released before it was placed (a release back-dated to make a pruning
/// checkpoint reach a hold that was active).
fn released_after_placed(walk: &mut Walk) {
    let mut found = Vec::new();
    for (hold, (link_id, released)) in &walk.released_at {
        if let Some((_, created)) = walk.placed_at.get(hold) {
            if released < created {
                found.push((
                    *link_id,
                    format!("hold {hold}"),
                    format!(
                        "its release at {} is before the hold was placed ({}): back-dated",
                        shown(*released),
                        shown(*created)
                    ),
                ));
            }
        }
    }
    for (link_id, name, detail) in found {
        walk.broken(Some(link_id), name, BreakKind::Changed, detail);
    }
}

/// A chain time (microseconds) as RFC 3339.
fn shown(m: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(m)
        .map(|t| t.to_rfc3339())
        .unwrap_or_else(|| m.to_string())
}

/// Each request history line's link against the line now; the request
/// part of each request's newest link is compared with the request after
/// the walk ([`check_requests`]).
async fn check_request_events(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    events: Vec<(i64, Uuid, String)>,
    walk: &mut Walk,
) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let mut linked = Vec::new();
    for (link_id, request_id, record) in events {
        match serde_json::from_str::<chain::RequestRecord>(&record) {
            Ok(r) => linked.push((link_id, request_id, r)),
            Err(_) => walk.broken(
                Some(link_id),
                format!("erasure request {request_id}"),
                BreakKind::Changed,
                "its record is not a request's history line".into(),
            ),
        }
    }
    let ids: Vec<i64> = linked.iter().map(|l| l.2.event.event_id).collect();
    let now = records::read_request_events(conn, schema, &ids).await?;
    for (link_id, request_id, r) in linked {
        let name = format!(
            "erasure request {} (history line {})",
            r.request.reference, r.event.event_id
        );
        walk.records_checked += 1;
        match now.get(&r.event.event_id) {
            None => walk.broken(
                Some(link_id),
                name,
                BreakKind::Missing,
                "its history line was deleted".into(),
            ),
            Some((owner, line)) => {
                if *owner != request_id || *line != r.event {
                    let fields = chain::differences(
                        &chain::canonical(&r.event),
                        &chain::canonical(line),
                        FIELDS,
                    )
                    .join("; ");
                    walk.broken(
                        Some(link_id),
                        name,
                        BreakKind::Changed,
                        format!("the history line differs from the linked one: {fields}"),
                    );
                }
            }
        }
        walk.requests.insert(request_id, (link_id, r.request));
    }
    Ok(())
}

/// Each linked request as it stands now against its newest link (its
/// state, due date, completion: what the report's deadline figures count),
/// and every history line since the first linked one has a link.
async fn check_requests(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    walk: &mut Walk,
) -> Result<()> {
    let requests = std::mem::take(&mut walk.requests);
    if requests.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = requests.keys().copied().collect();
    let now = records::read_requests(conn, schema, &ids).await?;
    let mut found = Vec::new();
    for (request_id, (link_id, linked)) in &requests {
        let name = format!("erasure request {}", linked.reference);
        match now.get(request_id) {
            None => found.push((
                *link_id,
                name,
                BreakKind::Missing,
                "it was deleted".to_owned(),
            )),
            Some(current) if current != linked => {
                let fields = chain::differences(
                    &chain::canonical(linked),
                    &chain::canonical(current),
                    FIELDS,
                )
                .join("; ");
                found.push((
                    *link_id,
                    name,
                    BreakKind::Changed,
                    format!("the request differs from its newest linked history line: {fields}"),
                ));
            }
            Some(_) => {}
        }
    }
    for (link_id, name, kind, detail) in found {
        walk.broken(Some(link_id), name, kind, detail);
    }
    let unlinked: Vec<(i64, Uuid)> = statements::unlinked_events(schema, KEEP as i64)
        .query_as()
        .fetch_all(&mut *conn)
        .await?;
    for (event_id, request_id) in unlinked {
        walk.broken(
            None,
            format!("erasure request {request_id} (history line {event_id})"),
            BreakKind::Inserted,
            "written after the chain linked request histories, and has no link".into(),
        );
    }
    Ok(())
}

/// Each hold's release time against its latest release link; a hold in
/// the chain released without one was released outside the library.
async fn check_releases(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    walk: &mut Walk,
) -> Result<()> {
    let mut ids: HashSet<Uuid> = walk.releases.keys().copied().collect();
    ids.extend(walk.released_holds.keys().copied());
    if ids.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = ids.into_iter().collect();
    let current = records::read_holds(conn, schema, &ids).await?;
    let mut found = Vec::new();
    for (hold_id, placed_link) in &walk.released_holds {
        if !walk.releases.contains_key(hold_id) {
            found.push((
                *placed_link,
                format!("hold {hold_id}"),
                "it carries a release time but its release has no link: released outside the library".to_string(),
            ));
        }
    }
    for (hold_id, (link_id, r)) in &walk.releases {
        let Some(now) = current.get(hold_id) else {
            continue;
        };
        let now_at = now.released_at.map(chain::micros);
        if now_at != Some(r.released_at) {
            let shown = |m: Option<i64>| {
                m.and_then(DateTime::<Utc>::from_timestamp_micros)
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_else(|| "none".into())
            };
            found.push((
                *link_id,
                format!("hold {hold_id}"),
                format!(
                    "its release time differs from the linked release: released_at: linked {}, now {}",
                    shown(Some(r.released_at)),
                    shown(now_at)
                ),
            ));
        }
    }
    for (link_id, name, detail) in found {
        walk.broken(Some(link_id), name, BreakKind::Changed, detail);
    }
    Ok(())
}

/// The newest link linked at or before `at` (the whole chain's, when
/// `None`); `None` before schema 19's start link exists.
pub(crate) async fn head(cx: &Context, at: Option<DateTime<Utc>>) -> Result<Option<ChainHead>> {
    let row = statements::head(&cx.config.schema, at)
        .query()
        .fetch_optional(&cx.pool)
        .await?;
    Ok(match row {
        Some(r) => Some(ChainHead {
            link_id: r.try_get("link_id")?,
            link: r.try_get("link")?,
            linked_at: r.try_get("linked_at")?,
        }),
        None => None,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A run link `link_id` after `prev`, whose hash holds.
    fn run_link(link_id: i64, prev: &str, record: &str) -> LinkRow {
        let subject = Some(Uuid::from_u128(link_id as u128));
        let digest = chain::digest(record);
        LinkRow {
            link_id,
            kind: LinkKind::Run.as_str().into(),
            subject,
            record: record.into(),
            link: chain::link_hash(prev, link_id, LinkKind::Run, subject, &digest),
            digest,
            prev: prev.into(),
            covers: Vec::new(),
            linked_at: DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap(),
            mac: None,
        }
    }

    /// The breaks `check_link` finds walking `links` from the start.
    fn walked(links: &[LinkRow]) -> (Vec<(Option<i64>, BreakKind)>, usize) {
        let mut walk = Walk::default();
        let mut report = ChainReport::new();
        let mut at = Cursor {
            next_id: 1,
            prev: chain::GENESIS.to_string(),
            start: None,
            head_seen: false,
            expected: None,
            key: None,
            keyed: Keyed::default(),
        };
        let mut page = Page::default();
        for l in links {
            check_link(&mut walk, &mut report, &mut at, &mut page, l);
        }
        (
            walk.breaks.iter().map(|b| (b.link_id, b.kind)).collect(),
            page.runs.len(),
        )
    }

    #[test]
    fn check_link_names_each_way_a_link_fails() {
        let one = run_link(1, chain::GENESIS, "{\"a\":1}");
        let two = run_link(2, &one.link, "{\"a\":2}");
        let three = run_link(3, &two.link, "{\"a\":3}");
        // Whole: every run sorted for its record's check, nothing broken.
        assert_eq!(
            walked(&[one.clone(), two.clone(), three.clone()]),
            (vec![], 3)
        );
        // A link deleted: the gap, at the first missing link.
        assert_eq!(
            walked(&[one.clone(), three.clone()]).0,
            vec![(Some(2), BreakKind::Missing)]
        );
        // Two links swapped: each names where it does not follow.
        let (breaks, _) = walked(&[one.clone(), three.clone(), two.clone()]);
        assert!(
            breaks.contains(&(Some(2), BreakKind::Missing)),
            "{breaks:?}"
        );
        assert!(
            breaks.contains(&(Some(2), BreakKind::Reordered)),
            "{breaks:?}"
        );
        // A record edited after it was linked.
        let mut edited = two.clone();
        edited.record = "{\"a\":20}".into();
        assert_eq!(
            walked(&[one.clone(), edited, three.clone()]).0,
            vec![(Some(2), BreakKind::Changed)]
        );
        // A record and its digest rewritten together: the hash says so.
        let mut forged = two.clone();
        forged.record = "{\"a\":20}".into();
        forged.digest = chain::digest(&forged.record);
        assert_eq!(
            walked(&[one.clone(), forged, three.clone()]).0,
            vec![(Some(2), BreakKind::Changed)]
        );
        // A kind Cohort never writes.
        let mut strange = two;
        strange.kind = "note".into();
        assert_eq!(
            walked(&[one, strange, three]).0,
            vec![(Some(2), BreakKind::Changed)]
        );
    }
}
