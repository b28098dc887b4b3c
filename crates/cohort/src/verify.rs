//! `cohort verify`: walks the ledger's hash chain ([`crate::chain`]) in one
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

use crate::chain::{
    self, BreakKind, ChainBreak, ChainHead, ChainReport, CheckpointRecord, ExpectedHead, LinkKind,
    ReleaseRecord,
};
use crate::context::Context;
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
}

/// The walk's state between pages.
struct Walk {
    breaks: Vec<ChainBreak>,
    more: bool,
    /// Linked records found gone, waiting for a checkpoint: link → (label,
    /// digest).
    gone: BTreeMap<i64, (String, String)>,
    /// Each hold's latest release link: hold → (link, record).
    releases: HashMap<Uuid, (i64, ReleaseRecord)>,
    /// Holds in the chain that carry a release time: hold → placing link.
    released_holds: HashMap<Uuid, i64>,
    records_checked: u64,
    records_pruned: u64,
}

impl Walk {
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
        _ => format!("link {link_id}"),
    }
}

/// Walks the chain; `expected`, a head recorded earlier, must still be in
/// it with the same hash.
pub(crate) async fn verify(cx: &Context, expected: Option<ExpectedHead>) -> Result<ChainReport> {
    let schema = cx.config.schema.as_str();
    let mut conn = cx.pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::SNAPSHOT).await?;
    let mut report = ChainReport::new();
    let mut walk = Walk {
        breaks: Vec::new(),
        more: false,
        gone: BTreeMap::new(),
        releases: HashMap::new(),
        released_holds: HashMap::new(),
        records_checked: 0,
        records_pruned: 0,
    };
    let mut next_id = 1i64;
    let mut prev = chain::GENESIS.to_string();
    let mut start: Option<DateTime<Utc>> = None;
    let mut head_seen = false;
    loop {
        let page: Vec<LinkRow> = statements::links_after(schema, next_id - 1, PAGE)
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
                })
            })
            .collect::<std::result::Result<_, sqlx::Error>>()?;
        let Some(last) = page.last() else { break };
        let last_id = last.link_id;
        let mut runs: Vec<(i64, Uuid, String)> = Vec::new();
        let mut holds: Vec<(i64, LinkKind, Uuid, String)> = Vec::new();
        let mut checkpoints: Vec<(i64, CheckpointRecord)> = Vec::new();
        for l in &page {
            report.links += 1;
            let kind = LinkKind::parse(&l.kind);
            let name = kind
                .map(|k| label(k, l.subject, l.link_id))
                .unwrap_or_else(|| format!("link {}", l.link_id));
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
            } else if l.prev != prev {
                walk.broken(
                    Some(l.link_id),
                    name.clone(),
                    BreakKind::Reordered,
                    format!(
                        "it does not follow link {}: its prev is not that link's hash (links moved, or one before it was replaced)",
                        l.link_id - 1
                    ),
                );
            }
            next_id = l.link_id + 1;
            prev = l.link.clone();
            report.head = Some(ChainHead {
                link_id: l.link_id,
                link: l.link.clone(),
                linked_at: l.linked_at,
            });
            if let Some(e) = &expected {
                if e.link_id == l.link_id {
                    head_seen = true;
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
            }
            let Some(kind) = kind else {
                walk.broken(
                    Some(l.link_id),
                    name,
                    BreakKind::Changed,
                    format!("its kind {:?} is not one Cohort writes", l.kind),
                );
                continue;
            };
            if chain::digest(&l.record) != l.digest {
                walk.broken(
                    Some(l.link_id),
                    name,
                    BreakKind::Changed,
                    "its record was edited: it no longer matches its digest".into(),
                );
                continue;
            }
            if chain::link_hash(&l.prev, l.link_id, kind, l.subject, &l.digest) != l.link {
                walk.broken(
                    Some(l.link_id),
                    name,
                    BreakKind::Changed,
                    "the link was edited: its hash no longer matches its contents".into(),
                );
                continue;
            }
            match (kind, l.subject) {
                (LinkKind::Start, _) => {
                    if l.link_id == 1 {
                        start = Some(l.linked_at);
                    }
                }
                (LinkKind::Run, Some(s)) => runs.push((l.link_id, s, l.record.clone())),
                (LinkKind::HoldPlaced | LinkKind::HoldReleased, Some(s)) => {
                    holds.push((l.link_id, kind, s, l.record.clone()))
                }
                (LinkKind::Checkpoint, _) => {
                    match serde_json::from_str::<CheckpointRecord>(&l.record) {
                        Ok(c)
                            if c.pruned.iter().map(|p| p.link_id).collect::<Vec<_>>()
                                == l.covers =>
                        {
                            checkpoints.push((l.link_id, c))
                        }
                        _ => walk.broken(
                            Some(l.link_id),
                            name,
                            BreakKind::Changed,
                            "its record does not list the links it covers".into(),
                        ),
                    }
                }
                _ => walk.broken(
                    Some(l.link_id),
                    name,
                    BreakKind::Changed,
                    "a run or hold link without its subject".into(),
                ),
            }
        }
        check_runs(&mut tx, schema, runs, &mut walk).await?;
        check_holds(&mut tx, schema, holds, &mut walk).await?;
        for (link_id, c) in checkpoints {
            for p in c.pruned {
                match walk.gone.get(&p.link_id) {
                    Some((_, digest)) if *digest == p.digest => {
                        walk.gone.remove(&p.link_id);
                        walk.records_pruned += 1;
                    }
                    Some((name, _)) => {
                        let name = name.clone();
                        walk.gone.remove(&p.link_id);
                        walk.broken(
                            Some(p.link_id),
                            name,
                            BreakKind::Missing,
                            format!("it is gone, and checkpoint link {link_id} stands for another record in its place"),
                        );
                    }
                    None => {}
                }
            }
        }
        if (page.len() as i64) < PAGE {
            break;
        }
        next_id = last_id + 1;
    }
    for (link_id, (name, _)) in std::mem::take(&mut walk.gone) {
        walk.broken(
            Some(link_id),
            name,
            BreakKind::Missing,
            "its record was deleted, and no checkpoint of the pruner stands for it".into(),
        );
    }
    check_releases(&mut tx, schema, &mut walk).await?;
    if let Some(e) = &expected {
        if !head_seen {
            walk.broken(
                Some(e.link_id),
                format!("link {}", e.link_id),
                BreakKind::Missing,
                format!(
                    "the head you recorded ({}:{}) is not in the chain, which ends at link {}",
                    e.link_id,
                    e.link,
                    next_id - 1
                ),
            );
        }
    }
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
    tx.rollback().await?;
    report.records_checked = walk.records_checked;
    report.records_pruned = walk.records_pruned;
    walk.breaks
        .sort_by_key(|b| (b.link_id.is_none(), b.link_id.unwrap_or(0)));
    report.more_breaks = walk.more;
    for b in walk.breaks {
        report.broken(b.link_id, b.record, b.kind, b.detail);
    }
    Ok(report)
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
        let name = format!("run {run_id}");
        match current.get(&run_id) {
            None => {
                walk.gone.insert(link_id, (name, chain::digest(&linked)));
            }
            Some(now) => {
                walk.records_checked += 1;
                let now = chain::canonical(now);
                if now != linked {
                    let fields = chain::differences(&linked, &now, FIELDS).join("; ");
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
        let name = format!("hold {hold_id}");
        let Some(now) = current.get(&hold_id) else {
            walk.gone.insert(link_id, (name, chain::digest(&linked)));
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
        let now = chain::canonical(&now.placed);
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
