//! Rows per sweep batch (a number or `"auto"`) and connections per entity.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default batch size of sweeps and erasure.
pub const DEFAULT_SWEEP_BATCH_SIZE: u32 = 5000;
/// Largest accepted sweep batch size.
pub const MAX_SWEEP_BATCH_SIZE: u32 = 100_000;
/// Rows per sweep batch: a fixed number, or `"auto"`.
///
/// `Auto` sizes each batch of a sweep from the ones before it: it starts at
/// [`DEFAULT_SWEEP_BATCH_SIZE`] and aims every full batch at about
/// [`AUTO_BATCH_TARGET`] from its start to its commit, growing at most
/// twofold and shrinking at most fourfold from one batch to the next, within
/// [`AUTO_BATCH_MIN`]..=[`AUTO_BATCH_MAX`] (at most
/// [`AUTO_BATCH_MAX_LOADED`] when the batch's rows are read into the
/// process, for row handlers or values computed in Rust). The size each
/// entity ended on is recorded in the ledger (`sweep_run_entity_summary.batch_size`,
/// [`EntityOutcome::batch_size`](crate::EntityOutcome::batch_size)).
/// Erasures and the other uses of the batch size take the first size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchSize {
    /// Every batch locks at most this many rows (1..=100000).
    Fixed(u32),
    /// Sized from the measured time of the batches before.
    Auto,
}

/// Where `sweep_batch_size = "auto"` starts and what it aims each batch at.
pub const AUTO_BATCH_TARGET: Duration = Duration::from_millis(500);
/// The smallest batch `"auto"` chooses.
pub const AUTO_BATCH_MIN: u32 = 500;
/// The largest batch `"auto"` chooses.
pub const AUTO_BATCH_MAX: u32 = MAX_SWEEP_BATCH_SIZE;
/// The largest batch `"auto"` chooses when the rows are read into the
/// process (row handlers, custom anonymisers, hashed columns): memory
/// grows with the batch there.
pub const AUTO_BATCH_MAX_LOADED: u32 = 10_000;

impl BatchSize {
    /// The size of a first batch (`Auto`: [`DEFAULT_SWEEP_BATCH_SIZE`]).
    pub fn first(self) -> u32 {
        match self {
            BatchSize::Fixed(n) => n,
            BatchSize::Auto => DEFAULT_SWEEP_BATCH_SIZE,
        }
    }

    /// Whether batches are sized from their measured time.
    pub fn is_auto(self) -> bool {
        self == BatchSize::Auto
    }
}

impl From<u32> for BatchSize {
    fn from(n: u32) -> Self {
        BatchSize::Fixed(n)
    }
}

impl std::fmt::Display for BatchSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BatchSize::Fixed(n) => write!(f, "{n}"),
            BatchSize::Auto => f.write_str("auto"),
        }
    }
}

impl std::str::FromStr for BatchSize {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        if s == "auto" {
            return Ok(BatchSize::Auto);
        }
        s.parse::<u32>()
            .map(BatchSize::Fixed)
            .map_err(|_| format!("{s:?} is neither a whole number of rows nor \"auto\""))
    }
}

impl Serialize for BatchSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            BatchSize::Fixed(n) => s.serialize_u32(*n),
            BatchSize::Auto => s.serialize_str("auto"),
        }
    }
}

impl<'de> Deserialize<'de> for BatchSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = BatchSize;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a whole number of rows (1..=100000) or \"auto\"")
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<BatchSize, E> {
                u32::try_from(v).map(BatchSize::Fixed).map_err(|_| {
                    E::custom(format!(
                        "sweep_batch_size = {v} is out of range 1..={MAX_SWEEP_BATCH_SIZE}"
                    ))
                })
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<BatchSize, E> {
                u32::try_from(v).map(BatchSize::Fixed).map_err(|_| {
                    E::custom(format!(
                        "sweep_batch_size = {v} is out of range 1..={MAX_SWEEP_BATCH_SIZE}"
                    ))
                })
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<BatchSize, E> {
                match v {
                    "auto" => Ok(BatchSize::Auto),
                    other => Err(E::custom(format!(
                        "sweep_batch_size = {other:?}: expected a whole number of rows or \"auto\""
                    ))),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Default connections one entity is swept on at once (one: the run's own).
pub const DEFAULT_SWEEP_PARALLELISM: u32 = 1;
/// Largest accepted sweep parallelism (the pool must also be able to serve
/// it: validation checks that against the pool's size).
pub const MAX_SWEEP_PARALLELISM: u32 = 64;

/// Checks a sweep parallelism against its range (`1..=64`); the error
/// reads after `sweep_parallelism = `.
pub(crate) fn check_sweep_parallelism(n: u32) -> std::result::Result<(), String> {
    if (1..=MAX_SWEEP_PARALLELISM).contains(&n) {
        Ok(())
    } else {
        Err(format!(
            "{n} is out of range 1..={MAX_SWEEP_PARALLELISM} (1 sweeps on the run's own connection)"
        ))
    }
}
