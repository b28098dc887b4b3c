//! The dispatcher's and the history pruner's settings, with their
//! defaults and ranges.

use serde::{Deserialize, Serialize};

use crate::domain::rules::Period;

/// Default seconds between the dispatcher's polls for due work.
pub const DEFAULT_DISPATCH_POLL_INTERVAL_SECS: i64 = 10;
/// Default rows the dispatcher claims per poll.
pub const DEFAULT_DISPATCH_BATCH_SIZE: u32 = 50;
/// Largest accepted dispatch batch.
pub const MAX_DISPATCH_BATCH_SIZE: u32 = 10_000;
/// Default deliveries at once.
pub const DEFAULT_DISPATCH_MAX_PARALLELISM: u32 = 4;
/// Largest accepted number of deliveries at once.
pub const MAX_DISPATCH_MAX_PARALLELISM: u32 = 256;
/// Default attempts before a delivery is dead-lettered.
pub const DEFAULT_DISPATCH_MAX_ATTEMPTS: u32 = 10;
/// Largest accepted number of attempts.
pub const MAX_DISPATCH_MAX_ATTEMPTS: u32 = 1_000;
/// Default first retry delay in seconds (it doubles per attempt).
pub const DEFAULT_DISPATCH_BASE_BACKOFF_SECS: i64 = 1;
/// Default seconds a claim lasts before the work may be reclaimed.
pub const DEFAULT_DISPATCH_CLAIM_TIMEOUT_SECS: i64 = 300;
/// Default seconds a run may stay started before it is recovered.
pub const DEFAULT_SETTLE_TIMEOUT_SECS: i64 = 3600;
/// Default seconds after which captured payloads are scrubbed (30 days).
pub const DEFAULT_PAYLOAD_RETENTION_SECS: i64 = 30 * 86_400;
/// Default seconds between background pruning passes.
pub const DEFAULT_PRUNE_INTERVAL_SECS: i64 = 3600;

/// Row-handler dispatcher settings (SPEC §8). Defaults: poll 10 s, batch 50
/// (1..=10000), parallelism 4 (1..=256), attempts 10 (1..=1000), base
/// backoff 1 s, claim time-out 5 min, settle time-out 1 h, payload retention 30 d.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatchConfig {
    /// How often the dispatcher polls for due work.
    pub poll_interval: Period,
    /// Rows claimed per poll.
    pub batch_size: u32,
    /// Rows delivered at once.
    pub max_parallelism: u32,
    /// Attempts before dead-lettering.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt.
    pub base_backoff: Period,
    /// How long a claim lasts before it may be reclaimed.
    pub claim_timeout: Period,
    /// How long a run may stay Started before it is recovered as Failed.
    pub settle_timeout: Period,
    /// Backstop age after which captured payloads are scrubbed.
    pub payload_retention: Period,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        Self {
            poll_interval: secs(DEFAULT_DISPATCH_POLL_INTERVAL_SECS),
            batch_size: DEFAULT_DISPATCH_BATCH_SIZE,
            max_parallelism: DEFAULT_DISPATCH_MAX_PARALLELISM,
            max_attempts: DEFAULT_DISPATCH_MAX_ATTEMPTS,
            base_backoff: secs(DEFAULT_DISPATCH_BASE_BACKOFF_SECS),
            claim_timeout: secs(DEFAULT_DISPATCH_CLAIM_TIMEOUT_SECS),
            settle_timeout: secs(DEFAULT_SETTLE_TIMEOUT_SECS),
            payload_retention: secs(DEFAULT_PAYLOAD_RETENTION_SECS),
        }
    }
}

impl DispatchConfig {
    /// Every problem of these settings (the one place they are checked:
    /// [`CohortConfig::validate`] and the dispatcher's constructor both
    /// ask).
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, value, max) in [
            (
                "dispatch.batch_size",
                self.batch_size,
                MAX_DISPATCH_BATCH_SIZE,
            ),
            (
                "dispatch.max_parallelism",
                self.max_parallelism,
                MAX_DISPATCH_MAX_PARALLELISM,
            ),
            (
                "dispatch.max_attempts",
                self.max_attempts,
                MAX_DISPATCH_MAX_ATTEMPTS,
            ),
        ] {
            if !(1..=max).contains(&value) {
                problems.push(format!("{name} = {value} is out of range 1..={max}"));
            }
        }
        // Settings that measure elapsed time: positive, of fixed length
        // (calendar units have none).
        for (name, p) in [
            ("dispatch.poll_interval", self.poll_interval),
            ("dispatch.base_backoff", self.base_backoff),
            ("dispatch.claim_timeout", self.claim_timeout),
            ("dispatch.settle_timeout", self.settle_timeout),
            ("dispatch.payload_retention", self.payload_retention),
        ] {
            if p.is_zero() {
                problems.push(format!("{name} must be greater than zero"));
            }
            if let Err(e) = p.require_fixed() {
                problems.push(format!("{name}: {e}"));
            }
        }
        problems
    }
}

/// A constant number of seconds as a period.
pub(super) fn secs(n: i64) -> Period {
    Period::from_seconds(n).expect("constant in range")
}

/// Default rows per pruning batch.
pub const DEFAULT_PRUNE_BATCH_SIZE: u32 = 1000;
/// Largest accepted pruning batch.
pub const MAX_PRUNE_BATCH_SIZE: u32 = 100_000;

/// History-pruner settings; nothing is pruned unless a limit is set.
/// Defaults: batch 1000 (1..=100000), a pass every hour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PruneConfig {
    /// Shorthand for both run limits below (what older configurations
    /// set): delete settled runs, with their summaries and details, older
    /// than this. Refused together with either of them.
    pub runs_older_than: Option<Period>,
    /// Delete runs that succeeded, settled longer ago than this.
    pub succeeded_runs_older_than: Option<Period>,
    /// Delete runs that failed, partially failed or were cancelled,
    /// settled longer ago than this (keep them longer than successes: they
    /// are what an investigation reads).
    pub failed_runs_older_than: Option<Period>,
    /// Delete released or expired holds inactive for longer than this.
    pub inactive_holds_older_than: Option<Period>,
    /// Runs (or holds) deleted per transaction.
    pub batch_size: u32,
    /// How often the background pruner runs a pass.
    pub interval: Period,
}

impl PruneConfig {
    /// The limit of runs that succeeded: its own, else `runs_older_than`.
    pub fn succeeded_runs(&self) -> Option<Period> {
        self.succeeded_runs_older_than.or(self.runs_older_than)
    }

    /// The limit of runs that failed, partially failed or were cancelled:
    /// its own, else `runs_older_than`.
    pub fn failed_runs(&self) -> Option<Period> {
        self.failed_runs_older_than.or(self.runs_older_than)
    }

    /// Whether any limit is set.
    pub fn prunes_anything(&self) -> bool {
        self.succeeded_runs().is_some()
            || self.failed_runs().is_some()
            || self.inactive_holds_older_than.is_some()
    }

    /// Every problem of these settings (the one place they are checked:
    /// [`CohortConfig::validate`] and the pruner's constructor both ask).
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !(1..=MAX_PRUNE_BATCH_SIZE).contains(&self.batch_size) {
            problems.push(format!(
                "prune.batch_size = {} is out of range 1..={MAX_PRUNE_BATCH_SIZE}",
                self.batch_size
            ));
        }
        if self.interval.is_zero() {
            problems.push("prune.interval must be greater than zero".into());
        }
        if let Err(e) = self.interval.require_fixed() {
            problems.push(format!("prune.interval: {e}"));
        }
        if self.runs_older_than.is_some()
            && (self.succeeded_runs_older_than.is_some() || self.failed_runs_older_than.is_some())
        {
            problems.push(
                "prune.runs_older_than sets both run limits, so it cannot be combined with prune.succeeded_runs_older_than or prune.failed_runs_older_than: replace it with the two of them".into(),
            );
        }
        for (name, p) in [
            ("prune.runs_older_than", self.runs_older_than),
            (
                "prune.succeeded_runs_older_than",
                self.succeeded_runs_older_than,
            ),
            ("prune.failed_runs_older_than", self.failed_runs_older_than),
            (
                "prune.inactive_holds_older_than",
                self.inactive_holds_older_than,
            ),
        ] {
            if p.is_some_and(|p| p.is_zero()) {
                problems.push(format!(
                    "{name} must be greater than zero (leave it out to keep history forever)"
                ));
            }
        }
        problems
    }
}

impl Default for PruneConfig {
    fn default() -> Self {
        Self {
            runs_older_than: None,
            succeeded_runs_older_than: None,
            failed_runs_older_than: None,
            inactive_holds_older_than: None,
            batch_size: DEFAULT_PRUNE_BATCH_SIZE,
            interval: secs(DEFAULT_PRUNE_INTERVAL_SECS),
        }
    }
}
