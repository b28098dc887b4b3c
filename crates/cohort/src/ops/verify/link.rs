//! One link checked on its own: its place, its hash and MAC, and whether
//! it stands where its record says (a release after its placing).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::chain::{
    self, BreakKind, ChainHead, ChainReport, CheckpointRecord, LedgerKey, LinkKind, ReleaseRecord,
};

use super::{label, Cursor, LinkRow, Page, Walk};

/// One link against the walk so far, without the database: its place
/// (nothing missing before it, following its predecessor's hash), the
/// head recorded outside, its kind, its record's digest, its hash and MAC;
/// a link that holds is put in `page` by what its record is compared
/// with.
pub(super) fn check_link(
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

/// The chain's keyed part, as the walk meets it: from the first `key`
/// link on, every link carries a MAC and is hashed over its own time.
#[derive(Default)]
pub(super) struct Keyed {
    /// The first `key` link.
    pub(super) from: Option<i64>,
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
pub(super) fn released_after_placed(walk: &mut Walk) {
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
pub(super) fn shown(m: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(m)
        .map(|t| t.to_rfc3339())
        .unwrap_or_else(|| m.to_string())
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
