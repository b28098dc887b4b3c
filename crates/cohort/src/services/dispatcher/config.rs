//! The dispatcher's settings and its pure decisions: how much one poll
//! claims, when a delivery is asked to stop and when it is dropped, how
//! long recording an outcome may take, and the retry backoff.

use std::time::Duration;

use crate::config::{CohortConfig, DispatchConfig};
use crate::domain::handlers::{DELIVERY_HARD_DEADLINE, DELIVERY_SOFT_DEADLINE};
use crate::error::{Error, Problems, Result};

pub use crate::config::{
    DEFAULT_DISPATCH_BASE_BACKOFF_SECS, DEFAULT_DISPATCH_BATCH_SIZE,
    DEFAULT_DISPATCH_CLAIM_TIMEOUT_SECS, DEFAULT_DISPATCH_MAX_ATTEMPTS,
    DEFAULT_DISPATCH_MAX_PARALLELISM, DEFAULT_DISPATCH_POLL_INTERVAL_SECS, MAX_DISPATCH_BATCH_SIZE,
    MAX_DISPATCH_MAX_ATTEMPTS, MAX_DISPATCH_MAX_PARALLELISM,
};

/// The longest retry delay, whatever the attempt count (backoff doubles
/// from `base_backoff` and saturates here).
const MAX_BACKOFF_SECS: f64 = 86_400.0;

/// The dispatcher's settings, validated: the `[cohort.dispatch]` table
/// less what the maintenance service reads (`settle_timeout`,
/// `payload_retention`).
#[derive(Debug, Clone, PartialEq)]
pub struct DispatcherConfig {
    pub(super) poll_interval: Duration,
    pub(super) batch_size: u32,
    pub(super) max_parallelism: u32,
    pub(super) max_attempts: u32,
    pub(super) base_backoff_secs: f64,
    pub(super) claim_timeout_secs: f64,
}

impl DispatcherConfig {
    /// The dispatcher of `config`'s `[dispatch]` table; every problem of
    /// the table is named at once.
    pub fn from_config(config: &CohortConfig) -> Result<Self> {
        let problems = config.dispatch.problems();
        if !problems.is_empty() {
            return Err(Error::Config(Problems::global(problems)));
        }
        Ok(Self::of(&config.dispatch))
    }

    /// The settings of a table already validated (a handle's).
    pub(super) fn of(d: &DispatchConfig) -> Self {
        Self {
            poll_interval: Duration::from_secs_f64(secs(d.poll_interval)),
            batch_size: d.batch_size,
            max_parallelism: d.max_parallelism.max(1),
            max_attempts: d.max_attempts,
            base_backoff_secs: secs(d.base_backoff),
            claim_timeout_secs: secs(d.claim_timeout),
        }
    }

    /// How often the background loop polls for due work.
    pub fn poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// How long a claim lasts before the work may be reclaimed.
    pub fn claim_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.claim_timeout_secs)
    }
}

/// The retry delay after `attempt` failed: `base` doubled per attempt,
/// saturating at [`MAX_BACKOFF_SECS`] (no overflow, whatever the numbers).
pub(super) fn backoff_secs(base: f64, attempt: i32) -> f64 {
    let exponent = (attempt.max(1) - 1).min(62);
    (base * 2f64.powi(exponent)).clamp(0.0, MAX_BACKOFF_SECS)
}

fn secs(p: crate::domain::rules::Period) -> f64 {
    p.as_seconds() as f64
}

/// How much work one poll claims: no more than can start at once, since a
/// claim's time runs from the moment it is taken (work must not wait for
/// a free slot).
pub(super) fn claim_limit(batch_size: u32, max_parallelism: u32) -> i64 {
    i64::from(batch_size.min(max_parallelism.max(1)))
}

/// When a delivery is asked to stop (its handler's own deadline) and when
/// one that ignored the ask is dropped: fixed shares of the claim time-out
/// ([`DELIVERY_SOFT_DEADLINE`], [`DELIVERY_HARD_DEADLINE`]), both before
/// the claim expires and the work could run twice at once.
pub(super) fn delivery_deadlines(claim_timeout_secs: f64) -> (Duration, Duration) {
    (
        Duration::from_secs_f64(claim_timeout_secs * DELIVERY_SOFT_DEADLINE),
        Duration::from_secs_f64(claim_timeout_secs * DELIVERY_HARD_DEADLINE),
    )
}

/// How long recording a delivery's outcome may take: a tenth of the claim
/// time-out, between 100 ms and 10 s.
pub(super) fn cleanup_timeout(claim_timeout_secs: f64) -> Duration {
    Duration::from_secs_f64((claim_timeout_secs / 10.0).clamp(0.1, 10.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DISPATCH-001: retry arithmetic saturates instead of overflowing.
    #[test]
    fn backoff_doubles_and_saturates() {
        assert_eq!(backoff_secs(1.0, 1), 1.0);
        assert_eq!(backoff_secs(1.0, 2), 2.0);
        assert_eq!(backoff_secs(1.0, 5), 16.0);
        assert_eq!(
            backoff_secs(1.0, 0),
            1.0,
            "a non-positive attempt counts as the first"
        );
        assert_eq!(backoff_secs(1.0, i32::MAX), MAX_BACKOFF_SECS);
        let thousand_years = 1000.0 * 365.0 * 86_400.0;
        assert_eq!(backoff_secs(thousand_years, 1000), MAX_BACKOFF_SECS);
        assert!(backoff_secs(thousand_years, 1000).is_finite());
    }

    #[test]
    fn a_poll_claims_no_more_than_can_start_at_once() {
        for (batch, parallelism, claimed) in [(50, 4, 4), (2, 4, 2), (10, 10, 10), (10, 0, 1)] {
            assert_eq!(
                claim_limit(batch, parallelism),
                claimed,
                "batch {batch}, parallelism {parallelism}"
            );
        }
    }

    #[test]
    fn deliveries_stop_before_their_claim_expires() {
        for claim in [1.0, 10.0, 300.0, 86_400.0] {
            let (soft, hard) = delivery_deadlines(claim);
            let claim = Duration::from_secs_f64(claim);
            assert!(soft < hard && hard < claim, "{soft:?} {hard:?} {claim:?}");
        }
        for (claim, cleanup) in [(0.5, 0.1), (5.0, 0.5), (300.0, 10.0), (86_400.0, 10.0)] {
            assert_eq!(cleanup_timeout(claim), Duration::from_secs_f64(cleanup));
        }
    }

    #[test]
    fn its_configuration_is_checked_with_every_problem_named() {
        let mut config = CohortConfig::default();
        let defaults = DispatcherConfig::from_config(&config).unwrap();
        assert_eq!(
            defaults.poll_interval(),
            Duration::from_secs(DEFAULT_DISPATCH_POLL_INTERVAL_SECS as u64)
        );
        assert_eq!(
            defaults.claim_timeout(),
            Duration::from_secs(DEFAULT_DISPATCH_CLAIM_TIMEOUT_SECS as u64)
        );
        config.dispatch.batch_size = 0;
        config.dispatch.max_attempts = MAX_DISPATCH_MAX_ATTEMPTS + 1;
        config.dispatch.claim_timeout = crate::domain::rules::Period::ZERO;
        let Err(Error::Config(problems)) = DispatcherConfig::from_config(&config) else {
            panic!("accepted")
        };
        let text = problems.to_string();
        for named in [
            "dispatch.batch_size = 0",
            "dispatch.max_attempts = 1001",
            "dispatch.claim_timeout must be greater than zero",
        ] {
            assert!(text.contains(named), "{text}");
        }
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            Error::Config(problems).to_string(),
            "the handle and the dispatcher check the same table the same way"
        );
    }
}
