//! The journal folded into what it says of each request and hold, and the
//! comparison with what the database holds: pure, so every way the two
//! can disagree is a table test below.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{RequestGap, RestoreCheck};
use crate::domain::chain::ExpectedHead;
use crate::domain::journal::{Entry, Record};

/// A request as the journal has it.
pub(super) struct Journaled {
    pub(super) reference: String,
    pub(super) state: String,
    pub(super) opened: Option<(u64, Record)>,
    /// Why it never came to exist, when the journal says so.
    pub(super) not_opened: Option<String>,
}

/// A hold as the journal has it.
#[derive(Default)]
pub(super) struct JournaledHold {
    pub(super) placed: Option<Record>,
    pub(super) released: bool,
    /// Why it never came to exist, when the journal says so.
    pub(super) not_placed: Option<String>,
}

/// The journal folded: requests and holds in the order it first names them.
pub(super) struct Folded {
    pub(super) entries: u64,
    pub(super) head: Option<String>,
    /// Each entry's hash, by place.
    pub(super) hashes: Vec<String>,
    /// The newest entry's record of the chain head, and of the database.
    pub(super) chain: Option<String>,
    pub(super) system: Option<String>,
    pub(super) without_mac: u64,
    pub(super) requests: Vec<(Uuid, Journaled)>,
    pub(super) holds: Vec<(Uuid, JournaledHold)>,
}

impl Folded {
    /// The link of the ledger's chain the newest entry recorded, when it
    /// names one.
    pub(super) fn expected_head(&self) -> Option<ExpectedHead> {
        self.chain.as_ref()?.parse().ok()
    }
}

/// What the database holds of the same things, read at `now`.
#[derive(Default)]
pub(super) struct DatabaseView {
    pub(super) now: DateTime<Utc>,
    /// Each request's state.
    pub(super) requests: BTreeMap<Uuid, String>,
    /// Each hold, with when it was released.
    pub(super) holds: BTreeMap<Uuid, Option<DateTime<Utc>>>,
    /// The journal entries rows recorded (`hold …`, `erasure request …`):
    /// the entry's place and hash.
    pub(super) recorded: BTreeMap<String, (i64, Option<String>)>,
    /// The hash the chain holds at the link the journal's newest entry
    /// recorded (`None`: no such link).
    pub(super) chain_link: Option<String>,
}

/// Folds the journal's entries, oldest first.
pub(super) fn fold(entries: Vec<Entry>) -> Folded {
    let mut folded = Folded {
        entries: entries.len() as u64,
        head: entries.last().map(|e| e.hash.clone()),
        hashes: entries.iter().map(|e| e.hash.clone()).collect(),
        chain: entries.iter().rev().find_map(|e| e.chain.clone()),
        system: entries.iter().rev().find_map(|e| e.system.clone()),
        without_mac: entries.iter().filter(|e| e.mac.is_none()).count() as u64,
        requests: Vec::new(),
        holds: Vec::new(),
    };
    for e in entries {
        fold_request(&mut folded.requests, &e);
        fold_hold(&mut folded.holds, &e);
    }
    folded
}

/// What one entry says of a request (nothing, for a hold's).
fn fold_request(requests: &mut Vec<(Uuid, Journaled)>, e: &Entry) {
    match &e.record {
        Record::RequestOpened {
            request_id,
            reference,
            ..
        } => requests.push((
            *request_id,
            Journaled {
                reference: reference.clone(),
                state: "open".into(),
                opened: Some((e.seq, e.record.clone())),
                not_opened: None,
            },
        )),
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
        _ => {}
    }
}

/// What one entry says of a hold (nothing, for a request's).
fn fold_hold(holds: &mut Vec<(Uuid, JournaledHold)>, e: &Entry) {
    let hold_id = match &e.record {
        Record::HoldPlaced { hold_id, .. }
        | Record::HoldReleased { hold_id, .. }
        | Record::HoldNotPlaced { hold_id, .. } => *hold_id,
        _ => return,
    };
    let known = holds.iter().position(|(id, _)| *id == hold_id);
    if let Record::HoldNotPlaced { why, .. } = &e.record {
        // Only of a hold the journal placed.
        if let Some(i) = known {
            holds[i].1.not_placed = Some(why.clone());
        }
        return;
    }
    let i = known.unwrap_or_else(|| {
        holds.push((hold_id, JournaledHold::default()));
        holds.len() - 1
    });
    match &e.record {
        Record::HoldPlaced { .. } => holds[i].1.placed = Some(e.record.clone()),
        _ => holds[i].1.released = true,
    }
}

/// How far along a state is: `open` < `in_progress`, `failed` < `waiting`
/// < `completed`.
pub(super) fn rank(state: &str) -> u8 {
    match state {
        "open" => 0,
        "in_progress" | "failed" => 1,
        "waiting" => 2,
        "completed" => 3,
        _ => 0,
    }
}

/// What the journal holds that the database lacks.
pub(super) fn judge(folded: &Folded, db: &DatabaseView) -> RestoreCheck {
    let mut out = RestoreCheck {
        entries: folded.entries,
        head: folded.head.clone(),
        entries_without_mac: folded.without_mac,
        ..RestoreCheck::default()
    };
    out.journal_behind = journal_behind(folded, &db.recorded);
    out.chain_behind = chain_behind(folded, db.chain_link.as_deref());
    judge_requests(folded, &db.requests, &mut out);
    judge_holds(folded, db, &mut out);
    out
}

/// The database's record of the journal: every entry a row (or a hold's
/// link in the chain, which outlives its row) recorded must still be
/// there, as it was.
fn journal_behind(
    folded: &Folded,
    recorded: &BTreeMap<String, (i64, Option<String>)>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (what, (entry, hash)) in recorded {
        let found = usize::try_from(entry - 1)
            .ok()
            .and_then(|i| folded.hashes.get(i));
        match found {
            Some(h) if Some(h) == hash.as_ref() => {}
            Some(_) => out.push(format!(
                "{what} was recorded by journal entry {entry}, and the journal holds another entry there: it was rewritten"
            )),
            None => out.push(format!(
                "{what} was recorded by journal entry {entry}, and the journal ends at entry {}: it was cut short or rolled back",
                folded.entries
            )),
        }
    }
    out
}

/// The journal's record of the database's chain: the link its newest
/// entry recorded must still be the chain's.
fn chain_behind(folded: &Folded, link: Option<&str>) -> Option<String> {
    let spelled = folded.chain.as_ref()?;
    let expected = folded.expected_head()?;
    if link == Some(expected.link.as_str()) {
        return None;
    }
    Some(format!(
        "the journal's newest entry recorded the ledger's chain at link {spelled}, and the database's chain {}: the database was restored to before it, or its chain was cut short",
        if link.is_some() { "holds another link there" } else { "no longer reaches it" }
    ))
}

/// Requests the database lacks or knows in an earlier state.
fn judge_requests(folded: &Folded, db: &BTreeMap<Uuid, String>, out: &mut RestoreCheck) {
    for (id, r) in &folded.requests {
        let gap = RequestGap {
            request_id: *id,
            reference: r.reference.clone(),
            journal_state: r.state.clone(),
            database_state: db.get(id).cloned(),
        };
        match db.get(id) {
            None if r.not_opened.is_some() => out.resolved.push(format!(
                "erasure request {} (entry for {id}) was journaled but never opened: {}",
                r.reference,
                r.not_opened.as_deref().unwrap_or_default()
            )),
            None => out.missing_requests.push(gap),
            Some(state) if rank(state) < rank(&r.state) => out.behind_requests.push(gap),
            Some(_) => {}
        }
    }
}

/// Holds the database lacks (unless released or expired by the journal's
/// account), and holds it has in force that the journal released.
fn judge_holds(folded: &Folded, db: &DatabaseView, out: &mut RestoreCheck) {
    for (id, h) in &folded.holds {
        match (db.holds.get(id), h.released) {
            (None, false) if h.not_placed.is_some() => out.resolved.push(format!(
                "hold {id} was journaled but never placed: {}",
                h.not_placed.as_deref().unwrap_or_default()
            )),
            (None, false) => {
                let expired = matches!(
                    &h.placed,
                    Some(Record::HoldPlaced { expires_at: Some(e), .. }) if *e <= db.now
                );
                if h.placed.is_some() && !expired {
                    out.holds_to_place.push(*id);
                }
            }
            (Some(None), true) => out.holds_to_release.push(*id),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::journal::Sealed;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn entry(seq: u64, record: Record) -> Entry {
        Entry {
            seq,
            at: at(seq as i64),
            key_id: "k".into(),
            prev: String::new(),
            record,
            system: None,
            chain: None,
            hash: format!("h{seq}"),
            mac: Some("m".into()),
        }
    }

    fn placed(n: u128, expires_at: Option<DateTime<Utc>>) -> Record {
        Record::HoldPlaced {
            hold_id: id(n),
            entity_id: Some(id(100)),
            record_id: Some("1".into()),
            subject: None,
            kind: None,
            tenant: None,
            reason: Sealed {
                nonce: String::new(),
                sealed: String::new(),
            },
            created_at: at(0),
            expires_at,
        }
    }

    fn state(n: u128, reference: &str, state: &str) -> Record {
        Record::RequestState {
            request_id: id(n),
            reference: reference.into(),
            state: state.into(),
            run_id: None,
        }
    }

    #[test]
    fn the_journal_folds_into_each_hold_and_request() {
        let folded = fold(vec![
            entry(1, placed(1, None)),
            entry(2, placed(2, None)),
            entry(
                3,
                Record::HoldReleased {
                    hold_id: id(1),
                    released_at: at(3),
                },
            ),
            entry(
                4,
                Record::HoldNotPlaced {
                    hold_id: id(2),
                    why: "gone".into(),
                },
            ),
            // Not placed, of a hold the journal never placed: nothing.
            entry(
                5,
                Record::HoldNotPlaced {
                    hold_id: id(9),
                    why: "?".into(),
                },
            ),
            entry(6, state(3, "R-3", "in_progress")),
            entry(7, state(3, "R-3", "completed")),
        ]);
        assert_eq!(folded.entries, 7);
        assert_eq!(folded.head.as_deref(), Some("h7"));
        assert_eq!(folded.hashes.len(), 7);
        assert_eq!(folded.holds.len(), 2);
        assert!(folded.holds[0].1.released && folded.holds[0].1.placed.is_some());
        assert_eq!(folded.holds[1].1.not_placed.as_deref(), Some("gone"));
        assert_eq!(folded.requests.len(), 1);
        assert_eq!(folded.requests[0].1.state, "completed");
        assert!(folded.requests[0].1.opened.is_none());
    }

    /// Each way the journal and the database can disagree, one row each:
    /// what the database holds, and what the check must say.
    #[test]
    fn each_disagreement_is_named() {
        let journal = fold(vec![
            entry(1, placed(1, None)),
            entry(2, placed(2, Some(at(-10)))),
            entry(3, placed(3, None)),
            entry(
                4,
                Record::HoldReleased {
                    hold_id: id(3),
                    released_at: at(4),
                },
            ),
            entry(5, state(4, "R-4", "completed")),
            entry(6, state(5, "R-5", "waiting")),
        ]);
        type Case = (
            &'static str,
            fn(&mut DatabaseView),
            fn(&RestoreCheck) -> bool,
        );
        let cases: &[Case] = &[
            ("all there", |_| {}, |c| c.is_clean()),
            (
                "a hold lost",
                |db| {
                    db.holds.remove(&id(1));
                },
                |c| c.holds_to_place == [id(1)],
            ),
            (
                "an expired hold lost: nothing to place",
                |db| {
                    db.holds.remove(&id(2));
                },
                |c| c.is_clean(),
            ),
            (
                "a released hold in force",
                |db| {
                    db.holds.insert(id(3), None);
                },
                |c| c.holds_to_release == [id(3)],
            ),
            (
                "a request lost",
                |db| {
                    db.requests.remove(&id(4));
                },
                |c| c.missing_requests.len() == 1 && c.missing_requests[0].reference == "R-4",
            ),
            (
                "a request behind",
                |db| {
                    db.requests.insert(id(5), "in_progress".into());
                },
                |c| {
                    c.behind_requests.len() == 1
                        && c.behind_requests[0].database_state.as_deref() == Some("in_progress")
                },
            ),
            (
                "a request ahead is not a gap",
                |db| {
                    db.requests.insert(id(5), "completed".into());
                },
                |c| c.is_clean(),
            ),
            (
                "a row records an entry the journal rewrote",
                |db| {
                    db.recorded
                        .insert("hold x".into(), (2, Some("other".into())));
                },
                |c| c.journal_behind.len() == 1 && c.journal_behind[0].contains("rewritten"),
            ),
            (
                "a row records an entry past the journal's end",
                |db| {
                    db.recorded.insert("hold x".into(), (9, Some("h9".into())));
                },
                |c| c.journal_behind.len() == 1 && c.journal_behind[0].contains("cut short"),
            ),
        ];
        for (name, change, expect) in cases {
            let mut db = DatabaseView {
                now: at(100),
                requests: [(id(4), "completed".into()), (id(5), "waiting".into())].into(),
                holds: [(id(1), None), (id(2), None), (id(3), Some(at(4)))].into(),
                recorded: [("hold 1".to_owned(), (1, Some("h1".to_owned())))].into(),
                chain_link: None,
            };
            change(&mut db);
            let check = judge(&journal, &db);
            assert!(expect(&check), "{name}: {check:?}");
        }
    }

    #[test]
    fn the_chain_the_journal_recorded_must_still_be_there() {
        let mut journal = fold(vec![entry(1, placed(1, None))]);
        journal.chain = Some(format!("7:{}", "a".repeat(64)));
        let db = |link: Option<String>| DatabaseView {
            now: at(100),
            holds: [(id(1), None)].into(),
            chain_link: link,
            ..DatabaseView::default()
        };
        assert!(judge(&journal, &db(Some("a".repeat(64)))).is_clean());
        let other = judge(&journal, &db(Some("b".repeat(64))));
        assert!(other
            .chain_behind
            .unwrap()
            .contains("holds another link there"));
        let gone = judge(&journal, &db(None));
        assert!(gone.chain_behind.unwrap().contains("no longer reaches it"));
    }
}
