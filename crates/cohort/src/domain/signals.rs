//! Test signals: moments of a sweep's pacing that a test waits for instead
//! of sleeping or reading log lines (River's `TestSignals`).
//!
//! A handle sends them only when it was built with
//! [`CohortBuilder::test_signals`](crate::CohortBuilder::test_signals),
//! which only tests do; without them a signal is one `Option` check. They
//! say when a wait began and each time it was checked again, never what
//! the wait decided: the run's outcome and its summary say that.

use tokio::sync::broadcast;

/// How many signals a slow receiver may fall behind before it misses some
/// (it then sees `RecvError::Lagged`).
const BUFFER: usize = 1024;

/// A moment of a sweep's pacing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signal {
    /// The entity's next batch waits for the standbys listed (further
    /// behind than the lag limit): sent once per wait.
    StandbyWaitBegan {
        /// The entity.
        entity: String,
        /// The standbys waited for, by `application_name`.
        standbys: Vec<String>,
    },
    /// A wait for the standbys slept one poll and reads them again.
    StandbyPolled {
        /// The entity.
        entity: String,
    },
    /// The entity's next batch waited one poll for the rate limit.
    RateWaited {
        /// The entity.
        entity: String,
    },
    /// The entity was found paused before a batch, or during a wait.
    Paused {
        /// The entity.
        entity: String,
    },
}

/// Where a handle sends its [`Signal`]s; clone it to subscribe.
#[derive(Debug, Clone)]
pub struct TestSignals(broadcast::Sender<Signal>);

impl Default for TestSignals {
    fn default() -> Self {
        Self::new()
    }
}

impl TestSignals {
    /// A new channel, with no subscriber yet.
    pub fn new() -> Self {
        Self(broadcast::channel(BUFFER).0)
    }

    /// Receives every signal sent from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Signal> {
        self.0.subscribe()
    }

    /// Sends a signal to whoever subscribed (nobody: dropped).
    pub(crate) fn send(&self, signal: Signal) {
        let _ = self.0.send(signal);
    }
}
