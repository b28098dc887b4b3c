//! `COHORT_…` environment variables laid over a configuration. Every name
//! is listed here; an unknown `COHORT_` name is an error.

use super::{BatchSize, CohortConfig, DispatchConfig, HashKey, PruneConfig, VacuumAfter};
use crate::domain::rules::Period;
use crate::error::{Error, Problems, Result};

/// One `COHORT_…` variable, read as the type its setting takes; its
/// errors name the variable (a secret's value redacted).
struct Var<'a> {
    key: &'a str,
    name: &'a str,
    value: &'a str,
}

impl Var<'_> {
    fn bad(&self, what: &str) -> Error {
        let shown = if self.name == "HASH_KEY" || self.name == "LEDGER_KEY" {
            "<redacted>"
        } else {
            self.value
        };
        Error::Config(Problems::one(format!("{}={shown:?}: {what}", self.key)))
    }

    fn int(&self) -> Result<u32> {
        self.value
            .trim()
            .parse::<u32>()
            .map_err(|_| self.bad("expected a whole number"))
    }

    fn period(&self) -> Result<Period> {
        self.value
            .parse::<Period>()
            .map_err(|e| self.bad(&e.to_string()))
    }

    fn boolean(&self) -> Result<bool> {
        match self.value.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(self.bad("expected true or false")),
        }
    }

    /// A value that may be left empty for "none".
    fn optional<T>(&self, read: impl FnOnce() -> Result<T>) -> Result<Option<T>> {
        match self.value.trim() {
            "" => Ok(None),
            _ => read().map(Some),
        }
    }

    fn parsed<T: std::str::FromStr<Err = String>>(&self) -> Result<T> {
        self.value.parse::<T>().map_err(|e| self.bad(&e))
    }

    fn unknown(&self) -> Error {
        Error::Config(Problems::one(format!("unknown setting {}", self.key)))
    }
}

impl CohortConfig {
    /// Overlays `COHORT_…` variables from `vars` (pass `std::env::vars()`):
    /// `COHORT_SCHEMA`, `COHORT_SWEEP_BATCH_SIZE`, `COHORT_SWEEP_PARALLELISM`, `COHORT_SCHEDULE`,
    /// `COHORT_DRY_RUN`, `COHORT_KILL_SWITCH`, `COHORT_OBSERVER_TIMEOUT`,
    /// `COHORT_SHUTDOWN_GRACE_PERIOD`, `COHORT_PARTITION_LOCK_TIMEOUT`, `COHORT_HASH_KEY`,
    /// `COHORT_DISPATCH__<FIELD>` (e.g. `COHORT_DISPATCH__BATCH_SIZE`),
    /// `COHORT_PRUNE__<FIELD>` (e.g. `COHORT_PRUNE__RUNS_OLDER_THAN`).
    /// Unknown `COHORT_` variables are errors, so typos do not pass silently.
    pub fn apply_env(&mut self, vars: impl IntoIterator<Item = (String, String)>) -> Result<()> {
        for (key, value) in vars {
            let Some(name) = key.strip_prefix("COHORT_") else {
                continue;
            };
            let var = Var {
                key: &key,
                name,
                value: &value,
            };
            if let Some(field) = name.strip_prefix("DISPATCH__") {
                self.dispatch.apply_var(field, &var)?;
            } else if let Some(field) = name.strip_prefix("PRUNE__") {
                self.prune.apply_var(field, &var)?;
            } else {
                self.apply_var(&var)?;
            }
        }
        Ok(())
    }

    /// One variable of the `[cohort]` table's own settings.
    fn apply_var(&mut self, v: &Var<'_>) -> Result<()> {
        match v.name {
            "SCHEMA" => self.schema = v.value.to_owned(),
            "HASH_KEY" => self.hash_key = Some(HashKey::new(v.value)),
            "LEDGER_KEY" => {
                self.ledger_key = Some(
                    crate::domain::chain::LedgerKey::from_hex(v.value).map_err(|e| v.bad(&e))?,
                )
            }
            "SWEEP_BATCH_SIZE" => self.sweep_batch_size = v.parsed::<BatchSize>()?,
            "SWEEP_PARALLELISM" => self.sweep_parallelism = v.int()?,
            "SCHEDULE" => self.schedule = Some(v.value.to_owned()).filter(|s| !s.trim().is_empty()),
            "DRY_RUN" => self.dry_run = v.boolean()?,
            "KILL_SWITCH" => self.kill_switch = v.boolean()?,
            "CDC_MARKER" => self.cdc_marker = v.boolean()?,
            "VACUUM_AFTER" => self.vacuum_after = v.parsed::<VacuumAfter>()?,
            "MAX_ROWS_PER_SECOND" => self.max_rows_per_second = v.optional(|| v.int())?,
            "MAX_REPLICA_LAG" => self.max_replica_lag = v.optional(|| v.period())?,
            "VACUUM_AFTER_ROWS" => {
                self.vacuum_after_rows = v
                    .value
                    .trim()
                    .parse::<u64>()
                    .map_err(|_| v.bad("expected a whole number"))?
            }
            "OBSERVER_TIMEOUT" => self.observer_timeout = v.period()?,
            "SHUTDOWN_GRACE_PERIOD" => self.shutdown_grace_period = v.period()?,
            "PARTITION_LOCK_TIMEOUT" => self.partition_lock_timeout = v.period()?,
            _ => return Err(v.unknown()),
        }
        Ok(())
    }
}

impl DispatchConfig {
    /// `COHORT_DISPATCH__<FIELD>`.
    fn apply_var(&mut self, field: &str, v: &Var<'_>) -> Result<()> {
        match field {
            "POLL_INTERVAL" => self.poll_interval = v.period()?,
            "BATCH_SIZE" => self.batch_size = v.int()?,
            "MAX_PARALLELISM" => self.max_parallelism = v.int()?,
            "MAX_ATTEMPTS" => self.max_attempts = v.int()?,
            "BASE_BACKOFF" => self.base_backoff = v.period()?,
            "CLAIM_TIMEOUT" => self.claim_timeout = v.period()?,
            "SETTLE_TIMEOUT" => self.settle_timeout = v.period()?,
            "PAYLOAD_RETENTION" => self.payload_retention = v.period()?,
            _ => return Err(v.unknown()),
        }
        Ok(())
    }
}

impl PruneConfig {
    /// `COHORT_PRUNE__<FIELD>`.
    fn apply_var(&mut self, field: &str, v: &Var<'_>) -> Result<()> {
        match field {
            "RUNS_OLDER_THAN" => self.runs_older_than = Some(v.period()?),
            "SUCCEEDED_RUNS_OLDER_THAN" => self.succeeded_runs_older_than = Some(v.period()?),
            "FAILED_RUNS_OLDER_THAN" => self.failed_runs_older_than = Some(v.period()?),
            "INACTIVE_HOLDS_OLDER_THAN" => self.inactive_holds_older_than = Some(v.period()?),
            "BATCH_SIZE" => self.batch_size = v.int()?,
            "INTERVAL" => self.interval = v.period()?,
            _ => return Err(v.unknown()),
        }
        Ok(())
    }
}
