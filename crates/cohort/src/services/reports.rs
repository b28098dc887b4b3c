//! What the background passes report: plain values the services send as
//! events ([`super::events`]) and return from their one-shot calls, kept
//! apart from the services so the events and the services do not import
//! each other.

use chrono::{DateTime, Utc};

/// What one pruning pass deleted (or, dry, would delete).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PruneReport {
    /// Whether this was a count-only pass.
    pub dry_run: bool,
    /// Runs deleted, with their summaries and row details.
    pub runs: u64,
    /// Entity summaries deleted with those runs.
    pub summaries: u64,
    /// Row details deleted with those runs.
    pub row_details: u64,
    /// Terminal handler work deleted with those runs.
    pub handler_work: u64,
    /// Old enough runs kept because they still have pending or in-flight
    /// handler work.
    pub runs_kept_for_handlers: u64,
    /// Holds deleted.
    pub holds: u64,
    /// Shared occurrences of the worker deleted with their passes (those
    /// written before the earlier run cutoff, never the newest).
    pub occurrences: u64,
    /// Runs that succeeded deleted when settled before this, if configured.
    pub succeeded_runs_before: Option<DateTime<Utc>>,
    /// Runs that failed, partially failed or were cancelled deleted when
    /// settled before this, if configured.
    pub failed_runs_before: Option<DateTime<Utc>>,
    /// Holds inactive since before this cutoff, if configured.
    pub holds_before: Option<DateTime<Utc>>,
    /// The pass stopped early: the kill switch turned on (or shutdown).
    pub stopped: bool,
}

/// What one maintenance pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MaintenanceReport {
    /// Runs left `started` by a lost process, settled `failed`.
    pub recovered_runs: u64,
    /// Work no registered handler can deliver, dead-lettered.
    pub orphaned_work: u64,
    /// Captured payloads cleared past `payload_retention`.
    pub scrubbed: u64,
    /// Erasure requests run again: waiting ones a released or expired
    /// hold or a passed legal minimum may let finish, and attempts a lost
    /// process left in progress.
    pub erasure_requests_resumed: u64,
    /// Of those, the ones that completed.
    pub erasure_requests_completed: u64,
}
