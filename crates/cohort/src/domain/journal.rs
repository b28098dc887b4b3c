//! The journal: erasure requests, their changes of state and the holds
//! placed and released through Cohort, appended to a store that does not
//! live in the retained database, so that a restored backup can be brought
//! back to what the journal says (`cohort restore-check`, `cohort replay`).
//!
//! ```toml
//! [journal]
//! dir = "/var/lib/cohort/journal"      # append-only files, fsynced
//! # url = "postgres://journal@other-host/cohort_journal"   # or another server
//! ```
//!
//! The key is `COHORT_JOURNAL_KEY`: 32 bytes as 64 hexadecimal characters
//! (`openssl rand -hex 32`). What identifies a person (a request's subject,
//! a subject hold's subject, the requester's note, a hold's reason) is
//! sealed with ChaCha20-Poly1305 (`ring`) under it, bound to its entry, so
//! the journal is not a list of people. Every entry carries the SHA-256 of
//! the entry before it; an entry changed, removed or inserted breaks the
//! chain there, and reading the journal names the first such entry.
//!
//! This module holds the journal's types and its pure rules (sealing,
//! chaining, verifying); writing and reading the stores, and replaying, is
//! `run::journal`.

use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{Error, Problems, Result};

/// The environment variable that holds the journal's key.
pub const KEY_ENV: &str = "COHORT_JOURNAL_KEY";

/// The file a journal directory holds.
pub const FILE_NAME: &str = "cohort-journal.jsonl";

/// The hash the first entry points back to (64 zeros, as the chain's
/// [`GENESIS`](crate::domain::chain::GENESIS)).
pub const JOURNAL_GENESIS: &str = crate::base::digest::ZERO_SHA256;

/// The journal's 32-byte key.
#[derive(Clone, PartialEq, Eq)]
pub struct JournalKey([u8; 32]);

impl std::fmt::Debug for JournalKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JournalKey(<redacted>)")
    }
}

impl JournalKey {
    /// Reads 64 hexadecimal characters (surrounding spaces ignored).
    pub fn from_hex(text: &str) -> Result<Self> {
        let bytes = hex::decode(text.trim()).map_err(|e| {
            Error::Config(Problems::one(format!(
                "{KEY_ENV} is not hexadecimal ({e}): give 32 bytes as 64 hexadecimal characters (openssl rand -hex 32)"
            )))
        })?;
        let key: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
            Error::Config(Problems::one(format!(
                "{KEY_ENV} is {} bytes; the journal's key is 32 bytes (64 hexadecimal characters: openssl rand -hex 32)",
                bytes.len()
            )))
        })?;
        Ok(Self(key))
    }

    /// Reads `COHORT_JOURNAL_KEY`; refused when it is not set.
    pub fn from_env() -> Result<Self> {
        match std::env::var(KEY_ENV) {
            Ok(text) => Self::from_hex(&text),
            Err(_) => Err(Error::Config(Problems::one(format!(
                "[journal] is configured but {KEY_ENV} is not set: the journal seals what identifies a person with it (32 bytes as 64 hexadecimal characters: openssl rand -hex 32)"
            )))),
        }
    }

    /// A short public name of the key (the first 16 hexadecimal characters
    /// of a SHA-256 over it), written on every entry: a journal written
    /// with another key is named as such instead of failing to open.
    pub fn id(&self) -> String {
        crate::base::digest::sha256_hex(&[b"cohort journal key id:", &self.0])[..16].to_owned()
    }

    /// The MAC of an entry's hash: HMAC-SHA256 under this key, apart
    /// from the sealing by its context. A writer of the journal's storage
    /// without the key can remove entries from its end (the database's
    /// record of the journal names that), but cannot add, change or move
    /// one.
    pub(crate) fn mac(&self, hash: &str) -> String {
        crate::base::digest::hmac_hex(&self.0, &[b"cohort journal entry\n", hash.as_bytes()])
    }

    /// Seals `plain`, bound to `context` (its entry and field).
    pub(crate) fn seal(&self, context: &str, plain: &str) -> Sealed {
        use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
        use ring::rand::{SecureRandom, SystemRandom};
        let key = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &self.0).expect("32 bytes"));
        let mut nonce = [0u8; 12];
        SystemRandom::new()
            .fill(&mut nonce)
            .expect("the system's random source");
        let mut data = plain.as_bytes().to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(context.as_bytes()),
            &mut data,
        )
        .expect("sealing cannot fail for these sizes");
        Sealed {
            nonce: hex::encode(nonce),
            sealed: hex::encode(data),
        }
    }

    /// Opens what [`JournalKey::seal`] sealed with `context`; `None` when
    /// the key, the context or the bytes differ.
    pub(crate) fn open(&self, context: &str, sealed: &Sealed) -> Option<String> {
        use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};
        let key = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &self.0).ok()?);
        let nonce: [u8; 12] = hex::decode(&sealed.nonce).ok()?.try_into().ok()?;
        let mut data = hex::decode(&sealed.sealed).ok()?;
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut data,
            )
            .ok()?;
        String::from_utf8(plain.to_vec()).ok()
    }
}

/// Where the journal lives.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JournalTarget {
    /// A directory on a file system of its own (not the database's):
    /// entries are appended to [`FILE_NAME`] there and fsynced.
    Dir(PathBuf),
    /// Another PostgreSQL database, on another server: entries are rows of
    /// `"public"."cohort_journal"` there (created when missing).
    Url(String),
}

/// A configured journal: where, and its key (given, or read from
/// `COHORT_JOURNAL_KEY` when the journal is first written or read, so
/// that commands which never touch it run without the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalConfig {
    pub(crate) target: JournalTarget,
    pub(crate) key: Option<JournalKey>,
}

impl JournalConfig {
    /// A journal of files in `dir` (which must exist).
    pub fn dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            target: JournalTarget::Dir(dir.into()),
            key: None,
        }
    }

    /// A journal in another PostgreSQL database (`postgres://…`).
    pub fn url(url: impl Into<String>) -> Self {
        Self {
            target: JournalTarget::Url(url.into()),
            key: None,
        }
    }

    /// The key (instead of `COHORT_JOURNAL_KEY`).
    pub fn key(mut self, key: JournalKey) -> Self {
        self.key = Some(key);
        self
    }

    /// The key given, or `COHORT_JOURNAL_KEY`.
    pub fn resolved_key(&self) -> Result<JournalKey> {
        match &self.key {
            Some(k) => Ok(k.clone()),
            None => JournalKey::from_env(),
        }
    }

    /// Where it lives.
    pub fn target(&self) -> &JournalTarget {
        &self.target
    }

    /// Where it lives, for messages (a URL without its password).
    pub fn describe(&self) -> String {
        match &self.target {
            JournalTarget::Dir(d) => format!("the journal in {}", d.display()),
            JournalTarget::Url(u) => format!("the journal at {}", redact_url(u)),
        }
    }
}

/// A URL with any password replaced by `***`.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map(|(u, _)| u).unwrap_or(user);
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

/// A value sealed under the journal's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sealed {
    /// The nonce, hexadecimal.
    pub nonce: String,
    /// Ciphertext and tag, hexadecimal.
    pub sealed: String,
}

/// What an entry records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Record {
    /// An erasure request was opened (written before the database knows
    /// it: an erasure never runs without its entry).
    RequestOpened {
        /// Its id.
        request_id: Uuid,
        /// Its reference.
        reference: String,
        /// Its tenant (`None`: tenantless).
        tenant: Option<String>,
        /// The subject's kind.
        kind: Option<String>,
        /// The subject, sealed.
        subject: Sealed,
        /// Soft deletion accepted as erasure.
        allow_soft_delete: bool,
        /// The stage it erases by.
        stage: Option<u16>,
        /// The requester's note, sealed.
        note: Option<Sealed>,
        /// When it was received.
        received_at: DateTime<Utc>,
        /// When it is due.
        due_at: DateTime<Utc>,
        /// Why it has that due date.
        due_reason: Option<String>,
    },
    /// A request changed state (written once the database has).
    RequestState {
        /// Its id.
        request_id: Uuid,
        /// Its reference.
        reference: String,
        /// The new state.
        state: String,
        /// The attempt's run.
        run_id: Option<Uuid>,
    },
    /// A hold was placed through Cohort (written before the database
    /// knows it).
    HoldPlaced {
        /// Its id.
        hold_id: Uuid,
        /// A record hold's entity.
        entity_id: Option<Uuid>,
        /// A record hold's record id.
        record_id: Option<String>,
        /// A subject hold's subject, sealed.
        subject: Option<Sealed>,
        /// A subject hold's kind.
        kind: Option<String>,
        /// Its tenant.
        tenant: Option<String>,
        /// Why, sealed (reasons name people).
        reason: Sealed,
        /// When it was placed.
        created_at: DateTime<Utc>,
        /// When it lapses.
        expires_at: Option<DateTime<Utc>>,
    },
    /// A hold was released (written once the database has).
    HoldReleased {
        /// Its id.
        hold_id: Uuid,
        /// When.
        released_at: DateTime<Utc>,
    },
    /// A hold journaled as placed that the database refused (no such
    /// record, a subject no column holds, …), or that `replay` could not
    /// place again: it never came to exist, and no restore lost it.
    HoldNotPlaced {
        /// Its id.
        hold_id: Uuid,
        /// Why.
        why: String,
    },
    /// A replay brought the database back to the journal (its entry's
    /// chain head is the database's after it): the journal's record of
    /// the chain starts again from there.
    Replayed {
        /// Holds it placed again.
        holds_placed: u64,
        /// Holds it released again.
        holds_released: u64,
        /// Requests it restored.
        requests_restored: u64,
    },
    /// A request journaled as opened that the database never took (another
    /// request won its reference): it never came to exist.
    RequestNotOpened {
        /// Its id.
        request_id: Uuid,
        /// Its reference.
        reference: String,
        /// Why.
        why: String,
    },
}

impl Record {
    /// The request or hold an entry is about, and the field a sealed value
    /// is bound to: the context a sealed value is opened with.
    pub(crate) fn context(id: Uuid, field: &str) -> String {
        format!("cohort journal:{id}:{field}")
    }
}

/// One entry as it is stored: its place, time, key, link and record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Its place in the journal, from 1, without gaps.
    pub seq: u64,
    /// When it was written.
    pub at: DateTime<Utc>,
    /// [`JournalKey::id`] of the key it was sealed with.
    pub key_id: String,
    /// The hash of the entry before it ([`JOURNAL_GENESIS`] for the first).
    pub prev: String,
    /// What it records.
    pub record: Record,
    /// The retained database's system identifier when it was written
    /// (`pg_control_system()`): a replay on another cluster does not
    /// append to this journal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The ledger's chain head (`N:HASH`) when it was written: the
    /// database's chain must still hold it, or it was cut short or
    /// restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<String>,
    /// SHA-256 over `prev` and this entry without `hash` and `mac`.
    pub hash: String,
    /// [`JournalKey::mac`] of `hash`. Entries written before MACs have
    /// none; after the first entry with one, every entry must have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// What [`Entry::hash`] covers: the entry without its hash and MAC.
#[derive(Serialize)]
struct Unhashed<'a> {
    seq: u64,
    at: &'a DateTime<Utc>,
    key_id: &'a str,
    prev: &'a str,
    record: &'a Record,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: &'a Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chain: &'a Option<String>,
}

/// Where the retained database stood when an entry was written: its
/// system identifier and the ledger's chain head (each `None` when it
/// could not be read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stamp {
    /// The database system identifier.
    pub system: Option<String>,
    /// The chain head, `N:HASH`.
    pub chain: Option<String>,
}

impl Entry {
    /// A new entry after one whose place and hash are `(seq, prev)`.
    pub(crate) fn next(
        after: (u64, &str),
        at: DateTime<Utc>,
        key: &JournalKey,
        record: Record,
        stamp: Stamp,
    ) -> Entry {
        let mut e = Entry {
            seq: after.0 + 1,
            at,
            key_id: key.id(),
            prev: after.1.to_owned(),
            record,
            system: stamp.system,
            chain: stamp.chain,
            hash: String::new(),
            mac: None,
        };
        e.hash = e.computed_hash();
        e.mac = Some(key.mac(&e.hash));
        e
    }

    /// The hash this entry's content gives.
    pub fn computed_hash(&self) -> String {
        let body = serde_json::to_vec(&Unhashed {
            seq: self.seq,
            at: &self.at,
            key_id: &self.key_id,
            prev: &self.prev,
            record: &self.record,
            system: &self.system,
            chain: &self.chain,
        })
        .expect("an entry serialises");
        crate::base::digest::sha256_hex(&[self.prev.as_bytes(), b"\n", &body])
    }

    /// The entry as one line of JSON (no newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("an entry serialises")
    }
}

/// Where and how a journal's chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JournalBreak {
    /// A line is not an entry.
    #[error("line {line} is not a journal entry ({why})")]
    Unreadable {
        /// 1-based.
        line: usize,
        /// The parser's message.
        why: String,
    },
    /// An entry's content does not give its hash: it was changed.
    #[error("entry {seq} was changed: its content does not give its hash")]
    Changed {
        /// Its place.
        seq: u64,
    },
    /// An entry does not point at the one before it: one was removed,
    /// inserted or reordered there.
    #[error("entry {seq} does not follow entry {after}: an entry was removed, inserted or moved there (expected entry {expected} linked to the hash of entry {after})")]
    Unlinked {
        /// Its place, as written.
        seq: u64,
        /// The entry before it in the journal.
        after: u64,
        /// The place it should have.
        expected: u64,
    },
    /// An entry's MAC does not hold under the key: it was written, or
    /// rewritten, by someone without the key.
    #[error("entry {seq} was not written with the journal's key: its MAC does not hold (forged, or rewritten)")]
    Forged {
        /// Its place.
        seq: u64,
    },
    /// An entry without a MAC after one with a MAC.
    #[error("entry {seq} has no MAC, and entries before it have one: it was written without the journal's key")]
    Unsigned {
        /// Its place.
        seq: u64,
    },
    /// An entry was sealed with another key.
    #[error("entry {seq} was written with another key (key id {found}, {KEY_ENV} is {expected}): set the key this journal was written with")]
    OtherKey {
        /// Its place.
        seq: u64,
        /// Its key id.
        found: String,
        /// This key's id.
        expected: String,
    },
}

/// Reads and checks a journal's lines: every entry readable, hashed as
/// written, linked to the one before, in order from 1, sealed with `key`,
/// its MAC holding under `key` (after the first entry with one, every
/// entry has one). The first break is returned, naming its entry.
pub fn verify_lines<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    key: &JournalKey,
) -> std::result::Result<Vec<Entry>, JournalBreak> {
    let mut out: Vec<Entry> = Vec::new();
    for (i, line) in lines.into_iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let entry: Entry = serde_json::from_str(line).map_err(|e| JournalBreak::Unreadable {
            line: i + 1,
            why: e.to_string(),
        })?;
        check_next(out.last(), &entry, key)?;
        out.push(entry);
    }
    Ok(out)
}

/// Checks that `entry` follows `last` (or starts the journal).
pub fn check_next(
    last: Option<&Entry>,
    entry: &Entry,
    key: &JournalKey,
) -> std::result::Result<(), JournalBreak> {
    let key_id = key.id();
    let key_id = key_id.as_str();
    if entry.computed_hash() != entry.hash {
        return Err(JournalBreak::Changed { seq: entry.seq });
    }
    let (after, prev) = last
        .map(|l| (l.seq, l.hash.as_str()))
        .unwrap_or((0, JOURNAL_GENESIS));
    if entry.seq != after + 1 || entry.prev != prev {
        return Err(JournalBreak::Unlinked {
            seq: entry.seq,
            after,
            expected: after + 1,
        });
    }
    if entry.key_id != key_id {
        return Err(JournalBreak::OtherKey {
            seq: entry.seq,
            found: entry.key_id.clone(),
            expected: key_id.to_owned(),
        });
    }
    match &entry.mac {
        Some(mac) if *mac != key.mac(&entry.hash) => Err(JournalBreak::Forged { seq: entry.seq }),
        None if last.is_some_and(|l| l.mac.is_some()) => {
            Err(JournalBreak::Unsigned { seq: entry.seq })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> JournalKey {
        JournalKey([b; 32])
    }

    fn released(n: u128) -> Record {
        Record::HoldReleased {
            hold_id: Uuid::from_u128(n),
            released_at: DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
        }
    }

    fn chain(k: &JournalKey, n: u128) -> Vec<Entry> {
        let mut out: Vec<Entry> = Vec::new();
        for i in 0..n {
            let after = out
                .last()
                .map(|e| (e.seq, e.hash.clone()))
                .unwrap_or((0, JOURNAL_GENESIS.to_owned()));
            out.push(Entry::next(
                (after.0, &after.1),
                DateTime::from_timestamp(1_800_000_000 + i as i64, 0).unwrap(),
                k,
                released(i),
                Stamp::default(),
            ));
        }
        out
    }

    fn lines(entries: &[Entry]) -> Vec<String> {
        entries.iter().map(Entry::to_line).collect()
    }

    #[test]
    fn a_key_is_64_hex_characters() {
        assert!(JournalKey::from_hex(&"ab".repeat(32)).is_ok());
        let short = JournalKey::from_hex(&"ab".repeat(16)).unwrap_err();
        assert!(short.to_string().contains("16 bytes"), "{short}");
        let bad = JournalKey::from_hex("zz").unwrap_err();
        assert!(bad.to_string().contains("not hexadecimal"), "{bad}");
        assert_eq!(format!("{:?}", key(1)), "JournalKey(<redacted>)");
    }

    #[test]
    fn sealed_values_open_only_with_their_key_and_context() {
        let k = key(7);
        let s = k.seal("ctx-a", "alice@example.com");
        assert!(!s.sealed.contains("alice"));
        assert_eq!(k.open("ctx-a", &s).as_deref(), Some("alice@example.com"));
        assert_eq!(k.open("ctx-b", &s), None, "moved to another entry");
        assert_eq!(key(8).open("ctx-a", &s), None, "another key");
        let mut flipped = s.clone();
        flipped
            .sealed
            .replace_range(0..1, if &s.sealed[0..1] == "0" { "1" } else { "0" });
        assert_eq!(k.open("ctx-a", &flipped), None, "a changed byte");
    }

    #[test]
    fn every_break_of_the_chain_is_named_at_its_entry() {
        let k = key(3);
        let good = lines(&chain(&k, 5));
        fn refs(v: &[String]) -> Vec<&str> {
            v.iter().map(String::as_str).collect()
        }
        assert_eq!(verify_lines(refs(&good), &k).unwrap().len(), 5);

        // Changed: entry 3's record edited.
        let mut changed = good.clone();
        changed[2] = changed[2].replace(
            "00000000-0000-0000-0000-000000000002",
            "00000000-0000-0000-0000-000000000009",
        );
        let edited = changed[2].clone();
        assert_ne!(edited, good[2]);
        assert_eq!(
            verify_lines(refs(&changed), &k).unwrap_err(),
            JournalBreak::Changed { seq: 3 }
        );
        // Removed: entry 3 gone.
        let mut removed = good.clone();
        removed.remove(2);
        assert_eq!(
            verify_lines(refs(&removed), &k).unwrap_err(),
            JournalBreak::Unlinked {
                seq: 4,
                after: 2,
                expected: 3
            }
        );
        // Reordered: entries 2 and 3 swapped.
        let mut swapped = good.clone();
        swapped.swap(1, 2);
        assert!(matches!(
            verify_lines(refs(&swapped), &k).unwrap_err(),
            JournalBreak::Unlinked {
                seq: 3,
                after: 1,
                ..
            }
        ));
        // Inserted: an entry forged to follow entry 2 breaks the link of
        // the entry after it.
        let entries = chain(&k, 5);
        let forged = Entry::next(
            (2, &entries[1].hash),
            DateTime::from_timestamp(1_800_000_100, 0).unwrap(),
            &k,
            released(99),
            Stamp::default(),
        );
        let mut inserted = good.clone();
        inserted.insert(2, forged.to_line());
        assert_eq!(
            verify_lines(refs(&inserted), &k).unwrap_err(),
            JournalBreak::Unlinked {
                seq: 3,
                after: 3,
                expected: 4
            }
        );
        // Another key.
        assert!(matches!(
            verify_lines(refs(&good), &key(4)).unwrap_err(),
            JournalBreak::OtherKey { seq: 1, .. }
        ));
        // Not an entry.
        let mut junk = good.clone();
        junk[1] = "{\"seq\": 2}".into();
        assert!(matches!(
            verify_lines(refs(&junk), &k).unwrap_err(),
            JournalBreak::Unreadable { line: 2, .. }
        ));
    }

    #[test]
    fn an_entry_appended_without_the_key_is_named_whatever_its_hash() {
        let k = key(3);
        let mut entries = chain(&k, 3);
        fn refs(v: &[String]) -> Vec<&str> {
            v.iter().map(String::as_str).collect()
        }
        // Appended by someone with the journal's file but not its key:
        // hashed and linked correctly, with no MAC, or one under another
        // key (the key id copied).
        let last = entries.last().unwrap().clone();
        let mut forged = Entry::next(
            (last.seq, &last.hash),
            DateTime::from_timestamp(1_800_000_200, 0).unwrap(),
            &key(9),
            released(42),
            Stamp::default(),
        );
        forged.key_id = k.id();
        forged.hash = forged.computed_hash();
        forged.mac = Some(key(9).mac(&forged.hash));
        entries.push(forged.clone());
        assert_eq!(
            verify_lines(refs(&lines(&entries)), &k).unwrap_err(),
            JournalBreak::Forged { seq: 4 }
        );
        entries.last_mut().unwrap().mac = None;
        assert_eq!(
            verify_lines(refs(&lines(&entries)), &k).unwrap_err(),
            JournalBreak::Unsigned { seq: 4 }
        );
        // The stamp is covered: a chain head or system identifier changed
        // no longer gives the entry's hash.
        let mut stamped = chain(&k, 1);
        stamped[0].chain = Some("7:abc".into());
        assert_eq!(
            verify_lines(refs(&lines(&stamped)), &k).unwrap_err(),
            JournalBreak::Changed { seq: 1 }
        );
    }

    #[test]
    fn urls_are_described_without_their_password() {
        assert_eq!(
            redact_url("postgres://j:secret@db.example/journal"),
            "postgres://j:***@db.example/journal"
        );
        assert_eq!(redact_url("postgres://db/j"), "postgres://db/j");
    }
}
