//! The ledger's hash chain (RS-035): what a link covers, how it is hashed,
//! and what `cohort verify` reports. No database here: the records are
//! read and the links appended in `run::chain`, and walked in
//! [`crate::ops::verify`].
//!
//! Every settled run, every hold placed or released and every pruning
//! checkpoint is one link, in one order (`link_id` from 1, without gaps).
//! A link keeps its record's canonical JSON (`record`), the SHA-256 of it
//! (`digest`), the link before it (`prev`) and its own hash:
//!
//! ```text
//! link = hex(sha256(prev "\n" link_id "\n" kind "\n" subject_id "\n" digest))
//! ```
//!
//! with an absent subject written as the empty string and the first
//! link's `prev` as 64 zeros. A record is rebuilt from the ledger's rows
//! by the same code that wrote it, so a count changed in
//! `sweep_run_entity_summary` no longer matches its link's record, and a
//! record edited to match no longer matches its digest, and a digest
//! edited to match breaks every link after it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The `prev` of the first link: 64 zeros.
pub const GENESIS: &str = crate::base::digest::ZERO_SHA256;

/// What a link stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LinkKind {
    /// Where the chain starts (written by the migration that created it).
    Start,
    /// A settled run and its entity summaries.
    Run,
    /// A hold placed.
    HoldPlaced,
    /// A hold released.
    HoldReleased,
    /// The pruner's account of the linked records it deleted.
    Checkpoint,
    /// From here on every link carries a MAC under the ledger's key
    /// (`COHORT_LEDGER_KEY`); its record names the key by its id.
    Key,
    /// A change of an erasure request's state (a line of its history):
    /// the line, and the request's dates and state after it.
    Request,
}

impl LinkKind {
    /// The ledger spelling (`start`, `run`, `hold_placed`,
    /// `hold_released`, `checkpoint`).
    pub fn as_str(self) -> &'static str {
        match self {
            LinkKind::Start => "start",
            LinkKind::Run => "run",
            LinkKind::HoldPlaced => "hold_placed",
            LinkKind::HoldReleased => "hold_released",
            LinkKind::Checkpoint => "checkpoint",
            LinkKind::Key => "key",
            LinkKind::Request => "request",
        }
    }

    /// Parses the ledger spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "start" => LinkKind::Start,
            "run" => LinkKind::Run,
            "hold_placed" => LinkKind::HoldPlaced,
            "hold_released" => LinkKind::HoldReleased,
            "checkpoint" => LinkKind::Checkpoint,
            "key" => LinkKind::Key,
            "request" => LinkKind::Request,
            _ => return None,
        })
    }
}

/// The hex SHA-256 of a record's canonical text.
pub fn digest(record: &str) -> String {
    crate::base::digest::sha256_hex(&[record.as_bytes()])
}

/// The hash of link `link_id` (see the module's formula).
pub fn link_hash(
    prev: &str,
    link_id: i64,
    kind: LinkKind,
    subject: Option<Uuid>,
    digest: &str,
) -> String {
    let subject = subject.map(|s| s.to_string()).unwrap_or_default();
    let text = format!("{prev}\n{link_id}\n{}\n{subject}\n{digest}", kind.as_str());
    crate::base::digest::sha256_hex(&[text.as_bytes()])
}

/// The hash of a keyed link (one with a MAC, written under the ledger's
/// key): the formula of [`link_hash`] with the link's own time, in
/// microseconds since the Unix epoch, as a sixth line, so a link cannot be
/// re-dated either.
pub fn keyed_link_hash(
    prev: &str,
    link_id: i64,
    kind: LinkKind,
    subject: Option<Uuid>,
    digest: &str,
    linked_at: i64,
) -> String {
    let subject = subject.map(|s| s.to_string()).unwrap_or_default();
    let text = format!(
        "{prev}\n{link_id}\n{}\n{subject}\n{digest}\n{linked_at}",
        kind.as_str()
    );
    crate::base::digest::sha256_hex(&[text.as_bytes()])
}

/// The environment variable that holds the ledger's key.
pub const LEDGER_KEY_ENV: &str = "COHORT_LEDGER_KEY";

/// The ledger's key: 32 bytes the database never holds. Every link of a
/// keyed chain carries `mac = hex(HMAC-SHA256(key, "cohort ledger link\n"
/// || link))`; a writer of the database without it can delete links but
/// cannot write one `cohort verify` accepts. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct LedgerKey([u8; 32]);

impl std::fmt::Debug for LedgerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LedgerKey(<redacted>)")
    }
}

impl LedgerKey {
    /// Reads 64 hexadecimal characters (surrounding spaces ignored).
    pub fn from_hex(text: &str) -> Result<Self, String> {
        let bytes = hex::decode(text.trim()).map_err(|e| {
            format!("{LEDGER_KEY_ENV} is not hexadecimal ({e}): give 32 bytes as 64 hexadecimal characters (openssl rand -hex 32)")
        })?;
        let key: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
            format!(
                "{LEDGER_KEY_ENV} is {} bytes; the ledger's key is 32 bytes (64 hexadecimal characters: openssl rand -hex 32)",
                bytes.len()
            )
        })?;
        Ok(Self(key))
    }

    fn hmac(&self, context: &str, text: &str) -> String {
        crate::base::digest::hmac_hex(&self.0, &[context.as_bytes(), b"\n", text.as_bytes()])
    }

    /// The key's public name (16 hexadecimal characters of a MAC over a
    /// fixed text): the chain's `key` link records it, so a process given
    /// another key is refused before it writes a link.
    pub fn id(&self) -> String {
        self.hmac("cohort ledger key id", "")[..16].to_owned()
    }

    /// The MAC of a link's hash.
    pub fn mac(&self, link: &str) -> String {
        self.hmac("cohort ledger link", link)
    }
}

/// What a `key` link records: which key the chain is keyed with from
/// there on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// [`LedgerKey::id`].
    pub key_id: String,
}

/// A text a link must not keep (a hold's reason, a subject's identifier)
/// as a digest salted with the hold's id: `verify` still sees it change.
pub fn salted(hold_id: Uuid, text: &str) -> String {
    crate::base::digest::sha256_hex(&[hold_id.to_string().as_bytes(), b"\n", text.as_bytes()])
}

/// A time as the chain writes it: microseconds since the Unix epoch.
pub fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// An interval as the chain writes it: months, days, microseconds.
pub type Interval = [i64; 3];

/// A settled run as its link records it: the run's row and each entity
/// summary (ordered by `summary_id`), every column but the summaries'
/// `updated_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct RunRecord {
    pub run_id: Uuid,
    pub kind: String,
    pub trigger: String,
    pub dry_run: bool,
    pub tenant_id: Option<String>,
    pub status: String,
    pub logical_now: i64,
    pub started_at: i64,
    pub settled_at: Option<i64>,
    pub error: Option<String>,
    pub failures: Option<serde_json::Value>,
    pub occurrence: Option<i64>,
    pub occurrence_pass: Option<i32>,
    pub occurrence_passes: Option<i32>,
    pub policy_fingerprint: Option<String>,
    pub erasure_subject_kind: Option<String>,
    pub summaries: Vec<SummaryRecord>,
    /// The run's per-row audit details: how many, and a digest over them
    /// in order (entity, record, tenant, action). Runs linked before
    /// schema 20 have none, and are compared without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<DetailsDigest>,
}

/// A digest of a run's per-row audit details: SHA-256 over the SHA-256 of
/// each consecutive block of 100,000 of them (`entity \t record \t
/// tenant \t action`, one a line, in the order written), computed by the
/// server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetailsDigest {
    /// How many details.
    pub rows: i64,
    /// The digest (of the empty text when there are none).
    pub sha256: String,
}

/// A line of an erasure request's history as its link records it, with
/// the request's dates and state once the line was written: what the
/// signed report's "on time" figures are computed from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The line.
    pub event: RequestEventPart,
    /// The request after it.
    pub request: RequestPart,
}

/// A line of a request's history (`erasure_request_event`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct RequestEventPart {
    pub event_id: i64,
    pub state: String,
    pub at: i64,
    pub run_id: Option<Uuid>,
    /// The line's text, as a digest.
    pub detail: String,
    pub recorded_by: String,
}

/// What decides a request's deadline figures (`erasure_request`); no
/// subject and no note (the subject only as its keyed hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct RequestPart {
    pub request_id: Uuid,
    pub reference: String,
    pub tenant_id: Option<String>,
    pub subject_hash: String,
    pub state: String,
    pub received_at: i64,
    pub due_at: i64,
    pub completed_at: Option<i64>,
    /// What the request erases. Links written before it was covered do
    /// not carry it (their text is unchanged); `verify` then compares the
    /// request without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<RequestScope>,
}

impl RequestPart {
    /// The fields no line of a request's history changes once it is
    /// opened, where `self` and `later` (a later link of the same request)
    /// differ: names only, for a break's text. The scope is compared when
    /// both links carry it.
    pub fn changed_since_opened(&self, later: &RequestPart) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.reference != later.reference {
            out.push("reference");
        }
        if self.tenant_id != later.tenant_id {
            out.push("tenant_id");
        }
        if self.subject_hash != later.subject_hash {
            out.push("subject_hash");
        }
        if self.received_at != later.received_at {
            out.push("received_at");
        }
        if let (Some(a), Some(b)) = (&self.scope, &later.scope) {
            if a != b {
                out.push("scope");
            }
        }
        out
    }
}

/// What an erasure request erases (`erasure_request`): the subject's kind,
/// a stage, and whether soft deletes may stand for purges. Nothing changes
/// it once the request is open; a row changed by hand narrows what a
/// resumed attempt erases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct RequestScope {
    pub subject_kind: Option<String>,
    pub stage: Option<i32>,
    pub allow_soft_delete: bool,
}

/// One entity summary of a [`RunRecord`]: its counts, the rule it applied
/// and what it measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct SummaryRecord {
    pub summary_id: i64,
    pub retention_entity_id: Uuid,
    pub entity_type: String,
    pub category: String,
    pub tenant_id: Option<String>,
    pub strategy: String,
    pub stage: Option<i16>,
    pub affected_count: i64,
    pub held_count: i64,
    pub held_by_subject_count: i64,
    pub skipped_count: i64,
    pub null_anchor_count: i64,
    pub kept_by_legal_min_count: i64,
    pub kept_by_policy_count: i64,
    pub cutoff: Option<i64>,
    pub resolved_period: Interval,
    pub legal_min: Option<Interval>,
    pub rule_source: Option<String>,
    pub rule_reason: Option<String>,
    pub error: Option<String>,
    pub batch_size: Option<i32>,
    pub note: Option<String>,
    pub paused: bool,
    pub throttled_ms: Option<i64>,
    pub lag_waited_ms: Option<i64>,
    pub dead_tuples_before: Option<i64>,
    pub dead_tuples_after: Option<i64>,
    pub table_bytes_before: Option<i64>,
    pub table_bytes_after: Option<i64>,
    pub vacuumed: Option<String>,
}

/// A hold as placed: its target and times; the reason and the subject's
/// identifier only as [`salted`] digests. Its release is a link of its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct HoldRecord {
    pub hold_id: Uuid,
    pub retention_entity_id: Option<Uuid>,
    pub record_id: Option<String>,
    pub tenant_id: Option<String>,
    pub reason: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub subject_kind: Option<String>,
    pub subject: Option<String>,
    /// The subject's other stored forms (folded text, uuid, integer: what
    /// a sweep matches rows by), as one [`salted`] digest. Holds linked
    /// before schema 20 have none, and are compared without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forms: Option<String>,
    /// The journal entry that recorded the hold first (`SEQ:HASH`), when
    /// it was journaled: the chain keeps the database's record of the
    /// journal even where the hold's row is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal: Option<String>,
}

/// A hold's release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct ReleaseRecord {
    pub hold_id: Uuid,
    pub released_at: i64,
}

/// What the pruner deleted: the cutoffs it deleted under, and each link
/// whose record went, with its digest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// The pass's cutoffs.
    pub cutoffs: PruneCutoffs,
    /// The links whose records were deleted, in link order.
    pub pruned: Vec<PrunedLink>,
}

/// The cutoffs of one pruning pass, as microseconds since the Unix epoch:
/// what it could delete. `None`: it deleted nothing of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PruneCutoffs {
    /// Succeeded runs settled before this.
    pub succeeded_before: Option<i64>,
    /// Failed, partially failed and cancelled runs settled before this.
    pub failed_before: Option<i64>,
    /// Holds released or expired before this.
    pub holds_before: Option<i64>,
}

/// A checkpoint as `verify` found it: when, under which cutoffs, and how
/// many records it stands for. An auditor compares the cutoffs with how
/// long the policy keeps history (`[cohort.prune]`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointSeen {
    /// Its link.
    pub link_id: i64,
    /// When it was linked.
    pub linked_at: DateTime<Utc>,
    /// Succeeded runs settled before this could go.
    pub succeeded_before: Option<DateTime<Utc>>,
    /// Failed runs settled before this could go.
    pub failed_before: Option<DateTime<Utc>>,
    /// Holds inactive before this could go.
    pub holds_before: Option<DateTime<Utc>>,
    /// Links it stands for.
    pub links: usize,
}

/// One link a checkpoint stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrunedLink {
    /// The link.
    pub link_id: i64,
    /// Its digest, as it was linked.
    pub digest: String,
}

/// The canonical text of a record: its JSON, fields in declaration order,
/// maps with sorted keys, no spaces.
pub fn canonical<T: Serialize>(record: &T) -> String {
    serde_json::to_string(record).expect("a chain record serialises")
}

/// The fields where two records' texts differ (`summaries[0].affected_count:
/// linked 40, now 41`), at most `limit` of them.
pub fn differences(linked: &str, current: &str, limit: usize) -> Vec<String> {
    let (Ok(a), Ok(b)) = (
        serde_json::from_str::<serde_json::Value>(linked),
        serde_json::from_str::<serde_json::Value>(current),
    ) else {
        return vec!["the linked record is not JSON".into()];
    };
    let mut out = Vec::new();
    diff_values("", &a, &b, &mut out, limit);
    out
}

fn diff_values(
    path: &str,
    a: &serde_json::Value,
    b: &serde_json::Value,
    out: &mut Vec<String>,
    limit: usize,
) {
    use serde_json::Value;
    if out.len() >= limit || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let null = Value::Null;
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                diff_values(
                    &p,
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    out,
                    limit,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                diff_values(&format!("{path}[{i}]"), u, v, out, limit);
            }
        }
        (Value::Array(x), Value::Array(y)) => out.push(format!(
            "{path}: linked {} entries, now {}",
            x.len(),
            y.len()
        )),
        _ => out.push(format!("{path}: linked {a}, now {b}")),
    }
}

/// The newest link (of a period, or of the whole chain): what an auditor
/// writes down, and later gives `cohort verify --head` to check the
/// chain still holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    /// Its place in the chain.
    pub link_id: i64,
    /// Its hash.
    pub link: String,
    /// When it was linked (database clock).
    pub linked_at: DateTime<Utc>,
}

impl ChainHead {
    /// `N:HASH`, the spelling `cohort verify --head` takes.
    pub fn spelling(&self) -> String {
        format!("{}:{}", self.link_id, self.link)
    }
}

/// A head an auditor recorded earlier: `N:HASH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedHead {
    /// The link's place.
    pub link_id: i64,
    /// Its hash, lower-case hex.
    pub link: String,
}

impl std::str::FromStr for ExpectedHead {
    type Err = crate::error::Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            crate::error::Error::InvalidInput(format!(
                "{s:?} is not a chain head: write N:HASH, the link's number and its 64 hex digits (as the report prints it)"
            ))
        };
        let (n, hash) = s.split_once(':').ok_or_else(bad)?;
        let link_id: i64 = n.trim().parse().map_err(|_| bad())?;
        let hash = hash.trim().to_ascii_lowercase();
        if link_id < 1 || hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        Ok(ExpectedHead {
            link_id,
            link: hash,
        })
    }
}

/// What is wrong with a record or a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BreakKind {
    /// The record differs from what was linked, or a link's own text was
    /// edited.
    Changed,
    /// A linked record, or a link, is gone without a checkpoint for it.
    Missing,
    /// A run was settled into the ledger without a link.
    Inserted,
    /// Links are out of order: a link does not follow the one before it.
    Reordered,
}

impl BreakKind {
    /// The spelling in `verify`'s output.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakKind::Changed => "changed",
            BreakKind::Missing => "missing",
            BreakKind::Inserted => "inserted",
            BreakKind::Reordered => "reordered",
        }
    }
}

/// One thing `verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainBreak {
    /// The link concerned (none for a record inserted without one).
    pub link_id: Option<i64>,
    /// The record, as `run <uuid>`, `hold <uuid>`, `checkpoint` or `link N`.
    pub record: String,
    /// What is wrong.
    pub kind: BreakKind,
    /// In words, with the fields that differ.
    pub detail: String,
}

impl std::fmt::Display for ChainBreak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.link_id {
            Some(n) => write!(
                f,
                "{} (link {n}): {}: {}",
                self.record,
                self.kind.as_str(),
                self.detail
            ),
            None => write!(
                f,
                "{}: {}: {}",
                self.record,
                self.kind.as_str(),
                self.detail
            ),
        }
    }
}

/// What `cohort verify` found in the ledger.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ChainReport {
    /// No break found.
    pub intact: bool,
    /// Links walked.
    pub links: u64,
    /// Records compared with their links (runs and holds still present).
    pub records_checked: u64,
    /// Linked records the pruner deleted, each stood for by a checkpoint.
    pub records_pruned: u64,
    /// When the chain starts (the upgrade to schema 19).
    pub started_at: Option<DateTime<Utc>>,
    /// Runs settled before the chain started: outside it.
    pub runs_before_chain: u64,
    /// Holds without a link of their placing: written outside the library
    /// (raw SQL, `COPY`) or before the chain started. They keep rows, so
    /// they break nothing; they are counted so that none goes unseen.
    pub holds_outside_chain: u64,
    /// The newest link.
    pub head: Option<ChainHead>,
    /// The pruner's checkpoints, in order.
    pub checkpoints: Vec<CheckpointSeen>,
    /// What does not break the chain but an auditor should read: a
    /// checkpoint that pruned newer history than the policy `verify` runs
    /// with keeps (forged, or written under another policy).
    pub warnings: Vec<String>,
    /// The link from which the chain is keyed (its first `key` link);
    /// `None`: not keyed, and anyone who can write the database can
    /// extend it.
    pub keyed_from: Option<i64>,
    /// Whether every keyed link's MAC was checked (`verify` was given the
    /// ledger's key). Without it, a keyed link's hash is still checked but
    /// a forged link with a well-formed MAC cannot be told apart.
    pub macs_checked: bool,
    /// Every break found, in chain order (at most [`ChainReport::LIMIT`]);
    /// the first is the one to look at.
    pub breaks: Vec<ChainBreak>,
    /// More breaks than listed.
    pub more_breaks: bool,
}

impl ChainReport {
    /// The most breaks a report lists.
    pub const LIMIT: usize = 50;

    /// An empty report, before the walk.
    pub(crate) fn new() -> Self {
        ChainReport {
            intact: true,
            links: 0,
            records_checked: 0,
            records_pruned: 0,
            started_at: None,
            runs_before_chain: 0,
            holds_outside_chain: 0,
            head: None,
            checkpoints: Vec::new(),
            warnings: Vec::new(),
            keyed_from: None,
            macs_checked: false,
            breaks: Vec::new(),
            more_breaks: false,
        }
    }

    /// The first break, the one `verify` names.
    pub fn first_break(&self) -> Option<&ChainBreak> {
        self.breaks.first()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migrations_start_link_and_the_rust_formula_agree() {
        // The start link as migration 19 computes it in SQL, for the
        // record below (checked against the server in tests/chain.rs).
        let record = r#"{"chain":"cohort ledger","runs_before":0,"started_at":0}"#;
        let d = digest(record);
        assert_eq!(d.len(), 64);
        let l = link_hash(GENESIS, 1, LinkKind::Start, None, &d);
        let text = format!("{GENESIS}\n1\nstart\n\n{d}");
        use sha2::{Digest, Sha256};
        assert_eq!(l, hex::encode(Sha256::digest(text.as_bytes())));
        assert_ne!(l, link_hash(GENESIS, 2, LinkKind::Start, None, &d));
    }

    #[test]
    fn differences_name_the_field() {
        let a = r#"{"a":1,"s":[{"n":40},{"n":1}]}"#;
        let b = r#"{"a":1,"s":[{"n":41},{"n":1}]}"#;
        assert_eq!(differences(a, b, 5), vec!["s[0].n: linked 40, now 41"]);
        let c = r#"{"a":1,"s":[{"n":40}]}"#;
        assert_eq!(differences(a, c, 5), vec!["s: linked 2 entries, now 1"]);
    }

    #[test]
    fn a_head_is_read_as_n_colon_hash() {
        let h: ExpectedHead = format!("7:{}", "AB".repeat(32)).parse().unwrap();
        assert_eq!(h.link_id, 7);
        assert_eq!(h.link, "ab".repeat(32));
        for bad in ["7", "x:ab", "0:00", &format!("3:{}", "g".repeat(64))] {
            assert!(bad.parse::<ExpectedHead>().is_err(), "{bad}");
        }
    }
}
