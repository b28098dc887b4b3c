//! `max_rows_per_second`: an entity's sweep spread so that its rows
//! changed stay under a rate. Before each batch a lane waits until the
//! rows its entity changed so far (every lane's) fit the rate since the
//! entity started; it never waits inside a batch, so no row lock is held
//! while it does. The time waited is counted in
//! `cohort_sweep_throttled_seconds_total{entity,reason="rate"}` and
//! recorded in the entity's summary.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cancel::Cancel;

/// One entity's budget, shared by its lanes.
#[derive(Debug)]
pub(crate) struct Pacer {
    rows_per_second: f64,
    started: Instant,
    /// Rows changed so far, by every lane.
    done: AtomicU64,
    /// Time waited so far, in microseconds, by every lane.
    waited_us: AtomicU64,
}

impl Pacer {
    /// A budget of `rows_per_second` (at least 1), starting now.
    pub(crate) fn new(rows_per_second: u32) -> Self {
        Pacer {
            rows_per_second: f64::from(rows_per_second.max(1)),
            started: Instant::now(),
            done: AtomicU64::new(0),
            waited_us: AtomicU64::new(0),
        }
    }

    /// How long a lane must wait now for the rows done so far to fit the
    /// rate (zero when they do).
    fn due(&self) -> Duration {
        let done = self.done.load(Ordering::SeqCst) as f64;
        let due = Duration::from_secs_f64(done / self.rows_per_second);
        due.saturating_sub(self.started.elapsed())
    }

    /// Waits, before a batch, until the entity's rows fit the rate; the
    /// wait is counted for `entity`. `false` when `cancel` fired meanwhile.
    pub(crate) async fn before_batch(&self, entity: &str, cancel: &Cancel) -> bool {
        let wait = self.due();
        if wait.is_zero() {
            return true;
        }
        let started = Instant::now();
        let finished = tokio::select! {
            () = tokio::time::sleep(wait) => true,
            () = cancel.cancelled() => false,
        };
        // What was waited, a cancelled wait included only as far as it went.
        let waited = started.elapsed().min(wait);
        self.waited_us
            .fetch_add(waited.as_micros() as u64, Ordering::SeqCst);
        crate::telemetry::throttled(entity, "rate", waited);
        finished
    }

    /// Counts a committed batch's rows.
    pub(crate) fn add(&self, rows: u64) {
        self.done.fetch_add(rows, Ordering::SeqCst);
    }

    /// The time every lane waited so far.
    pub(crate) fn waited(&self) -> Duration {
        Duration::from_micros(self.waited_us.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_what_the_rows_done_are_ahead_of_the_rate() {
        let p = Pacer::new(1_000);
        assert!(p.due().is_zero(), "nothing done, nothing due");
        p.add(2_000);
        let due = p.due();
        assert!(
            due > Duration::from_millis(1_900) && due <= Duration::from_secs(2),
            "{due:?}"
        );
        assert_eq!(
            Pacer::new(0).rows_per_second,
            1.0,
            "at least one row a second"
        );
    }
}
