//! What the background services report as they go: each occurrence the
//! worker finished with, each pruner and maintenance pass. An application
//! that embeds [`Services`](super::Services) subscribes to log, alert or
//! count them its own way, and tests wait for the next event instead of
//! sleeping (River's event subscription and test signals are the model).
//!
//! Delivery is best effort, like observers: a subscriber that falls more
//! than [`EVENT_BUFFER`] events behind misses the oldest (its receiver
//! reports how many), and events with no subscriber are dropped.

use chrono::{DateTime, Utc};
use tokio::sync::broadcast;

use super::reports::{MaintenanceReport, PruneReport};

/// Events a subscriber may fall behind by before it misses the oldest.
pub const EVENT_BUFFER: usize = 256;

/// How the worker finished with one occurrence on this replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OccurrenceOutcome {
    /// Every pass ran (each pass's own outcome is in the ledger); `rerun`
    /// when an earlier attempt at it had been interrupted.
    Ran {
        /// Passes run.
        passes: usize,
        /// Whether it was run again after an interruption.
        rerun: bool,
    },
    /// Another replica's run of it settled; nothing to do.
    AlreadyRan,
    /// Another replica held the lock until the next occurrence was due.
    LockHeld,
    /// The kill switch was on before the first pass, or turned on after
    /// `passes` passes.
    KillSwitch {
        /// Passes run before it.
        passes: usize,
    },
    /// `dry_run` changed after `passes` passes: one occurrence is of one
    /// kind, so the rest waits for the next occurrence.
    DryRunChanged {
        /// Passes run before the change.
        passes: usize,
    },
    /// Shutdown stopped it after `passes` passes.
    Cancelled {
        /// Passes run before shutdown.
        passes: usize,
    },
}

impl OccurrenceOutcome {
    /// The outcome's name as logs and scripts read it (`ran`,
    /// `already_ran`, `lock_held`, `kill_switch`, `dry_run_changed`,
    /// `cancelled`).
    pub fn as_str(&self) -> &'static str {
        match self {
            OccurrenceOutcome::Ran { .. } => "ran",
            OccurrenceOutcome::AlreadyRan => "already_ran",
            OccurrenceOutcome::LockHeld => "lock_held",
            OccurrenceOutcome::KillSwitch { .. } => "kill_switch",
            OccurrenceOutcome::DryRunChanged { .. } => "dry_run_changed",
            OccurrenceOutcome::Cancelled { .. } => "cancelled",
        }
    }

    /// Passes this process ran for the occurrence (0 when it ran none).
    pub fn passes(&self) -> usize {
        match self {
            OccurrenceOutcome::Ran { passes, .. }
            | OccurrenceOutcome::KillSwitch { passes }
            | OccurrenceOutcome::DryRunChanged { passes }
            | OccurrenceOutcome::Cancelled { passes } => *passes,
            OccurrenceOutcome::AlreadyRan | OccurrenceOutcome::LockHeld => 0,
        }
    }

    /// Whether the occurrence was run again after an interruption.
    pub fn is_rerun(&self) -> bool {
        matches!(self, OccurrenceOutcome::Ran { rerun: true, .. })
    }
}

/// One thing a background service did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceEvent {
    /// The worker finished with the occurrence at `at`.
    Occurrence {
        /// The occurrence (cron time, UTC).
        at: DateTime<Utc>,
        /// What happened to it.
        outcome: OccurrenceOutcome,
    },
    /// The occurrence at `at` failed or panicked; it is retried at the next.
    OccurrenceFailed {
        /// The occurrence.
        at: DateTime<Utc>,
        /// The error, as logged.
        error: String,
    },
    /// A background pruner pass ended (`stopped` when the kill switch or
    /// shutdown ended it early, or kept it from starting).
    PrunerPass(PruneReport),
    /// A maintenance pass ended.
    MaintenancePass(MaintenanceReport),
}

/// The sending side, shared by the services of one [`Services`](super::Services).
#[derive(Debug, Clone)]
pub(crate) struct Events(broadcast::Sender<ServiceEvent>);

impl Events {
    pub(crate) fn new() -> Self {
        Self(broadcast::channel(EVENT_BUFFER).0)
    }

    /// Reports an event to whoever subscribed (nobody: dropped).
    pub(crate) fn send(&self, event: ServiceEvent) {
        let _ = self.0.send(event);
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<ServiceEvent> {
        self.0.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occurrence_outcomes_log_as_plain_fields() {
        let table = [
            (
                OccurrenceOutcome::Ran {
                    passes: 2,
                    rerun: false,
                },
                ("ran", 2, false),
            ),
            (
                OccurrenceOutcome::Ran {
                    passes: 1,
                    rerun: true,
                },
                ("ran", 1, true),
            ),
            (OccurrenceOutcome::AlreadyRan, ("already_ran", 0, false)),
            (OccurrenceOutcome::LockHeld, ("lock_held", 0, false)),
            (
                OccurrenceOutcome::KillSwitch { passes: 3 },
                ("kill_switch", 3, false),
            ),
            (
                OccurrenceOutcome::DryRunChanged { passes: 1 },
                ("dry_run_changed", 1, false),
            ),
            (
                OccurrenceOutcome::Cancelled { passes: 0 },
                ("cancelled", 0, false),
            ),
        ];
        for (outcome, (name, passes, rerun)) in table {
            assert_eq!(
                (outcome.as_str(), outcome.passes(), outcome.is_rerun()),
                (name, passes, rerun)
            );
        }
    }
}
