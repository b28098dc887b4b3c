//! `sweep_batch_size = "auto"`: each batch sized from the measured time
//! of the ones before it.

use std::time::Duration;

use crate::config::{AUTO_BATCH_MIN, AUTO_BATCH_TARGET, DEFAULT_SWEEP_BATCH_SIZE};

/// The size of one key range's next batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sizer {
    /// The rows the next batch locks at most.
    limit: u32,
    /// The largest batch it may choose.
    max: u32,
}

impl Sizer {
    /// Starts at the default batch size, never above `max`.
    pub(crate) fn new(max: u32) -> Self {
        Sizer {
            limit: DEFAULT_SWEEP_BATCH_SIZE.min(max),
            max,
        }
    }

    /// The rows the next batch locks at most.
    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    /// Learns from a committed batch that locked `locked` rows in `took`
    /// (from its start to its commit). Only a full batch says how long a
    /// full one takes: a shorter one (the last rows, or rows passed over)
    /// leaves the size as it is. The next size is the rows the measured
    /// rate would lock in [`AUTO_BATCH_TARGET`], at most twice and at
    /// least a quarter of this one, within the bounds.
    pub(crate) fn observe(&mut self, locked: u64, took: Duration) {
        if locked < u64::from(self.limit) {
            return;
        }
        let seconds = took.as_secs_f64().max(1e-3);
        let ideal = locked as f64 * AUTO_BATCH_TARGET.as_secs_f64() / seconds;
        let limit = f64::from(self.limit);
        let next = ideal
            .clamp(limit / 4.0, limit * 2.0)
            .max(f64::from(AUTO_BATCH_MIN))
            .min(f64::from(self.max));
        self.limit = next.round() as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AUTO_BATCH_MAX, AUTO_BATCH_MAX_LOADED};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn fast_batches_grow_at_most_twofold_up_to_the_largest() {
        let mut s = Sizer::new(AUTO_BATCH_MAX);
        assert_eq!(s.limit(), 5000);
        // 5000 rows in 50 ms: 50,000 would take the target; twice at most.
        s.observe(5000, ms(50));
        assert_eq!(s.limit(), 10_000);
        s.observe(10_000, ms(100));
        assert_eq!(s.limit(), 20_000);
        // 20,000 in 250 ms: 40,000 hits the target.
        s.observe(20_000, ms(250));
        assert_eq!(s.limit(), 40_000);
        for _ in 0..5 {
            let limit = s.limit();
            s.observe(u64::from(limit), ms(10));
        }
        assert_eq!(s.limit(), AUTO_BATCH_MAX);
    }

    #[test]
    fn slow_batches_shrink_at_most_fourfold_down_to_the_smallest() {
        let mut s = Sizer::new(AUTO_BATCH_MAX);
        // 5000 rows in 1 s: 2500 hits the target.
        s.observe(5000, ms(1000));
        assert_eq!(s.limit(), 2500);
        // 2500 in 100 s: a quarter at most, then the floor.
        s.observe(2500, ms(100_000));
        assert_eq!(s.limit(), 625);
        s.observe(625, ms(100_000));
        assert_eq!(s.limit(), AUTO_BATCH_MIN);
    }

    #[test]
    fn a_batch_on_target_keeps_its_size_and_a_short_one_says_nothing() {
        let mut s = Sizer::new(AUTO_BATCH_MAX);
        s.observe(5000, AUTO_BATCH_TARGET);
        assert_eq!(s.limit(), 5000);
        s.observe(1200, ms(1));
        assert_eq!(s.limit(), 5000, "the last rows, fewer than a batch");
        s.observe(5000, Duration::ZERO);
        assert_eq!(s.limit(), 10_000, "an instant batch grows twofold, no more");
    }

    #[test]
    fn rows_read_into_the_process_cap_the_size() {
        let mut s = Sizer::new(AUTO_BATCH_MAX_LOADED);
        for _ in 0..4 {
            let limit = s.limit();
            s.observe(u64::from(limit), ms(1));
        }
        assert_eq!(s.limit(), AUTO_BATCH_MAX_LOADED);
        let tiny = Sizer::new(100);
        assert_eq!(tiny.limit(), 100, "never starts above its largest");
    }
}
