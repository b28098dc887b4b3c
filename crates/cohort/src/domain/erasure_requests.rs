//! Erasure requests: an erasure with a reference and a due date that is
//! followed until it is finished.
//!
//! An [`ErasureRequest`](crate::domain::erasure::ErasureRequest) given a
//! [`reference`](crate::domain::erasure::ErasureRequest::reference) opens a request
//! (`cohort erase … --reference SAR-123`), then runs it. A request is
//! [`open`](RequestState::Open), [`in_progress`](RequestState::InProgress),
//! [`waiting`](RequestState::Waiting) (parts of it kept by a hold, a legal
//! minimum, a NULL anchor or a reference from another table, each
//! [part](WaitingPart) with its reason and, for a legal minimum, the
//! earliest time it can go), [`completed`](RequestState::Completed) or
//! [`failed`](RequestState::Failed). Every change of state is a line of
//! the request's history in the ledger (`erasure_request_event`), written
//! in the transaction that changes it.
//!
//! The maintenance service runs a waiting request again when a hold that
//! could keep one of its parts is released or expires, and when the
//! earliest legal minimum of its parts has passed
//! ([`crate::Cohort::resume_erasure_requests`]); it completes when nothing
//! is left. A part kept by a hold placed after the request stays waiting
//! for that hold. An attempt a lost process left `in_progress` is run
//! again (a request's attempts hold an advisory lock, so a live one is
//! never run twice).
//!
//! The request keeps the subject's identifier while it is not completed
//! (its parts need it to resume). On completion the identifier is cleared
//! and only `subject_hash` remains: HMAC-SHA256 of
//! `cohort erasure subject:` and the identifier under the configured hash
//! key (`COHORT_HASH_KEY`), which a request needs. Whoever holds the key can
//! show which request served a person; the ledger alone does not name them.

use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::domain::rules::Period;
use crate::error::{Error, Result};

/// How long a request has by default: 30 days after it was received
/// (GDPR Art. 12(3): one month).
pub const DEFAULT_DUE_DAYS: i64 = 30;

/// The longest reference accepted.
pub const MAX_REFERENCE_CHARS: usize = 200;

/// Where a request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RequestState {
    /// Received, not yet run.
    Open,
    /// An attempt is running (or a lost process left it; maintenance runs
    /// it again).
    InProgress,
    /// Run; parts of it were kept and wait for a hold to end or a legal
    /// minimum to pass (or, for a NULL anchor or a reference, for someone).
    Waiting,
    /// Nothing of the subject is left that the request reaches.
    Completed,
    /// The last attempt failed; `cohort erase --reference REF` runs it
    /// again.
    Failed,
}

impl RequestState {
    /// Every state, in the order a request goes through them.
    pub const ALL: [RequestState; 5] = [
        RequestState::Open,
        RequestState::InProgress,
        RequestState::Waiting,
        RequestState::Completed,
        RequestState::Failed,
    ];

    /// The ledger's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestState::Open => "open",
            RequestState::InProgress => "in_progress",
            RequestState::Waiting => "waiting",
            RequestState::Completed => "completed",
            RequestState::Failed => "failed",
        }
    }

    /// The state the ledger spells `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl std::fmt::Display for RequestState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a request is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// This long after the request was received (a period: `30d`, `2mo`).
    After(Period),
    /// At this time.
    At(DateTime<Utc>),
}

impl Due {
    /// Reads `60d`, `2mo` (a period after the request's time), an RFC 3339
    /// time, or a date (`2027-01-31`: the end of that day, UTC).
    pub fn parse(text: &str) -> Result<Self> {
        let t = text.trim();
        if let Ok(p) = t.parse::<Period>() {
            if p.is_zero() {
                return Err(Error::InvalidInput(format!(
                    "due {t:?}: a period must be longer than zero"
                )));
            }
            return Ok(Due::After(p));
        }
        if let Ok(at) = DateTime::parse_from_rfc3339(t) {
            return Ok(Due::At(at.with_timezone(&Utc)));
        }
        if let Ok(day) = NaiveDate::parse_from_str(t, "%Y-%m-%d") {
            let end = day
                .succ_opt()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
                .ok_or_else(|| Error::InvalidInput(format!("due {t:?} is out of range")))?;
            return Ok(Due::At(Utc.from_utc_datetime(&end)));
        }
        Err(Error::InvalidInput(format!(
            "due {t:?} is neither a period (60d, 2mo), a date (2027-01-31) nor an RFC 3339 time"
        )))
    }

    /// The due time of a request received at `received`.
    pub(crate) fn at(self, received: DateTime<Utc>) -> Result<DateTime<Utc>> {
        match self {
            Due::At(at) => Ok(at),
            Due::After(p) => p
                .after(received)
                .ok_or_else(|| Error::InvalidInput("the due date is out of range".into())),
        }
    }
}

/// What a request carries beside its erasure (set on
/// [`ErasureRequest`](crate::domain::erasure::ErasureRequest) by
/// [`reference`](crate::domain::erasure::ErasureRequest::reference) and the
/// builders after it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Terms {
    pub(crate) reference: String,
    pub(crate) due: Option<Due>,
    pub(crate) due_reason: Option<String>,
    pub(crate) note: Option<String>,
}

/// Why a part of a request waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PartReason {
    /// Under an active hold: goes when the hold is released or expires.
    Held,
    /// The legal minimum has not passed: goes at `until`.
    LegalMinimum,
    /// The anchor is NULL while a legal minimum applies: waits until the
    /// row has an anchor (someone must look).
    NullAnchor,
    /// Still referenced by rows of another table (a purge leaves them):
    /// waits until the reference is gone (someone must look).
    Referenced,
}

impl PartReason {
    /// The reason as the JSON spells it (`held`, `legal_minimum`,
    /// `null_anchor`, `referenced`).
    pub fn as_str(self) -> &'static str {
        match self {
            PartReason::Held => "held",
            PartReason::LegalMinimum => "legal_minimum",
            PartReason::NullAnchor => "null_anchor",
            PartReason::Referenced => "referenced",
        }
    }

    /// What it means, for people: what the part waits for.
    pub fn describe(self) -> &'static str {
        match self {
            PartReason::Held => "under a hold (goes when it is released or expires)",
            PartReason::LegalMinimum => "kept by the legal minimum",
            PartReason::NullAnchor => "no anchor while a legal minimum applies (someone must look)",
            PartReason::Referenced => "still referenced by other rows (someone must look)",
        }
    }
}

impl std::fmt::Display for PartReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A part of a request that was kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct WaitingPart {
    /// Durable entity id.
    pub entity_id: Uuid,
    /// Display name.
    pub entity: String,
    /// Why.
    pub reason: PartReason,
    /// How many of the subject's rows.
    pub rows: u64,
    /// The earliest time they can go (a legal minimum); `None` otherwise.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub until: Option<DateTime<Utc>>,
}

/// An erasure request as the ledger has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RequestRecord {
    /// Its id.
    pub request_id: Uuid,
    /// The caller's reference (unique).
    pub reference: String,
    /// The tenant (`None`: a tenantless request).
    pub tenant: Option<String>,
    /// The subject kind the request was narrowed to.
    pub kind: Option<String>,
    /// The subject's identifier; `None` once completed.
    pub subject: Option<String>,
    /// HMAC-SHA256 (hex) of the subject under the hash key.
    pub subject_hash: String,
    /// Soft deletion is accepted as erasure.
    pub allow_soft_delete: bool,
    /// The stage the request erases by, when it names one.
    pub stage: Option<u16>,
    /// The requester's note.
    pub note: Option<String>,
    /// Where it stands.
    pub state: RequestState,
    /// When it was received (the request's `now`).
    pub received_at: DateTime<Utc>,
    /// When it is due.
    pub due_at: DateTime<Utc>,
    /// Why the due date was set or moved, when it was.
    pub due_reason: Option<String>,
    /// When its last attempt started (database clock).
    pub attempted_at: Option<DateTime<Utc>>,
    /// When a part kept by a legal minimum can go first.
    pub resume_at: Option<DateTime<Utc>>,
    /// When it completed.
    pub completed_at: Option<DateTime<Utc>>,
    /// The run of its last attempt.
    pub last_run_id: Option<Uuid>,
    /// What its last attempt kept.
    pub waiting: Vec<WaitingPart>,
    /// Why its last attempt failed.
    pub error: Option<String>,
    /// Past due and not completed, when read.
    pub overdue: bool,
}

/// A line of a request's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RequestEvent {
    /// The state the request entered (or stayed in, for a moved due date).
    pub state: RequestState,
    /// When (database clock).
    pub at: DateTime<Utc>,
    /// The attempt's run, if any.
    pub run_id: Option<Uuid>,
    /// What happened.
    pub detail: String,
    /// The database role that wrote it.
    pub recorded_by: String,
}

/// A request with its history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RequestHistory {
    /// The request.
    #[serde(flatten)]
    pub request: RequestRecord,
    /// Its history, oldest first.
    pub events: Vec<RequestEvent>,
}

/// Which requests to list.
#[derive(Debug, Clone, Default)]
pub struct RequestFilter {
    pub(crate) state: Option<RequestState>,
    pub(crate) overdue_at: Option<DateTime<Utc>>,
    pub(crate) limit: Option<i64>,
}

impl RequestFilter {
    /// Every request (the first 1 000).
    pub fn new() -> Self {
        Self::default()
    }

    /// Only those in `state`.
    pub fn state(mut self, state: RequestState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only those not completed and past due at `now`.
    pub fn overdue_at<Tz: TimeZone>(mut self, now: DateTime<Tz>) -> Self {
        self.overdue_at = Some(now.with_timezone(&Utc));
        self
    }

    /// At most `n` (1 to 10 000).
    pub fn limit(mut self, n: i64) -> Self {
        self.limit = Some(n);
        self
    }
}

/// Requests per state, read now; `RequestCounts::record` (in
/// [`crate::domain::telemetry`]) sets the `cohort_erasure_requests{state}` and
/// `cohort_erasure_requests_overdue` gauges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RequestCounts {
    /// How many requests are in each state (every state, 0 included).
    pub by_state: Vec<(RequestState, u64)>,
    /// Not completed and past due.
    pub overdue: u64,
}

/// What one pass over the requests to resume did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ResumeReport {
    /// Requests run again.
    pub resumed: u64,
    /// Of those, completed now.
    pub completed: u64,
    /// Of those, still waiting.
    pub waiting: u64,
    /// Of those, failed.
    pub failed: u64,
    /// Passed over: another process is running them.
    pub busy: u64,
}

/// The keyed hash a request keeps of its subject, over one spelling of
/// it: a uuid in its lowercase hyphenated form, an integer in decimal,
/// other text exactly as given (text subject columns compare exactly).
pub(crate) fn subject_hash(key: &[u8], subject: &str) -> String {
    let canonical = match (
        Uuid::parse_str(subject.trim()),
        subject.trim().parse::<i64>(),
    ) {
        (Ok(u), _) => u.to_string(),
        (_, Ok(n)) => n.to_string(),
        _ => subject.to_owned(),
    };
    crate::base::digest::hmac_hex(key, &[b"cohort erasure subject:", canonical.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_reads_periods_dates_and_times() {
        assert!(matches!(Due::parse("60d").unwrap(), Due::After(_)));
        let Due::At(end) = Due::parse("2027-01-31").unwrap() else {
            panic!("a date")
        };
        assert_eq!(end.to_rfc3339(), "2027-02-01T00:00:00+00:00");
        let Due::At(t) = Due::parse("2027-01-31T12:00:00+01:00").unwrap() else {
            panic!("a time")
        };
        assert_eq!(t.to_rfc3339(), "2027-01-31T11:00:00+00:00");
        assert!(Due::parse("0d").is_err());
        assert!(Due::parse("next week").is_err());
    }

    #[test]
    fn the_subject_hash_is_keyed_and_separated_from_the_anonymiser() {
        let a = subject_hash(b"0123456789abcdef", "alice@example.com");
        assert_eq!(a.len(), 64);
        assert_ne!(a, subject_hash(b"0123456789abcdeX", "alice@example.com"));
        assert_ne!(a, subject_hash(b"0123456789abcdef", "bob@example.com"));
        use hmac::{KeyInit, Mac};
        let mut plain =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(b"0123456789abcdef").expect("key");
        plain.update(b"alice@example.com");
        let plain: String = plain
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_ne!(a, plain);
    }

    #[test]
    fn the_subject_hash_is_the_same_for_every_spelling_of_a_uuid_or_integer() {
        let k = b"0123456789abcdef";
        let u = "7d0e5c1a-9f4b-4b8e-a0c2-3d5f6e7a8b9c";
        for other in [
            "7D0E5C1A-9F4B-4B8E-A0C2-3D5F6E7A8B9C",
            "7d0e5c1a9f4b4b8ea0c23d5f6e7a8b9c",
            " 7d0e5c1a-9f4b-4b8e-a0c2-3d5f6e7a8b9c ",
        ] {
            assert_eq!(subject_hash(k, u), subject_hash(k, other), "{other}");
        }
        assert_eq!(subject_hash(k, "42"), subject_hash(k, "042"));
        assert_ne!(
            subject_hash(k, "Ann"),
            subject_hash(k, "ann"),
            "text is exact"
        );
    }

    #[test]
    fn states_round_trip() {
        for s in RequestState::ALL {
            assert_eq!(RequestState::parse(s.as_str()), Some(s));
        }
        assert_eq!(RequestState::parse("done"), None);
    }
}
