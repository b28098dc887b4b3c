//! Configuration: defaults, ranges, and loading from the `[cohort]` table of
//! a TOML file and from `COHORT_…` environment variables (environment wins
//! over the file; code can build it directly).
//!
//! [`CohortConfig`] and its checks are here; the batch size and
//! parallelism in `batch.rs`, the dispatcher's and the pruner's settings in
//! `services.rs`, the `COHORT_…` environment names in `env.rs`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::base::ident::{check_schema_name, QualifiedName};
use crate::domain::model::Conventions;
use crate::domain::rules::Period;
use crate::error::{Error, Problems, Result};

mod batch;
mod env;
mod services;

pub(crate) use batch::check_sweep_parallelism;
pub use batch::{
    BatchSize, AUTO_BATCH_MAX, AUTO_BATCH_MAX_LOADED, AUTO_BATCH_MIN, AUTO_BATCH_TARGET,
    DEFAULT_SWEEP_BATCH_SIZE, DEFAULT_SWEEP_PARALLELISM, MAX_SWEEP_BATCH_SIZE,
    MAX_SWEEP_PARALLELISM,
};
use services::secs;
pub use services::{
    DispatchConfig, PruneConfig, DEFAULT_DISPATCH_BASE_BACKOFF_SECS, DEFAULT_DISPATCH_BATCH_SIZE,
    DEFAULT_DISPATCH_CLAIM_TIMEOUT_SECS, DEFAULT_DISPATCH_MAX_ATTEMPTS,
    DEFAULT_DISPATCH_MAX_PARALLELISM, DEFAULT_DISPATCH_POLL_INTERVAL_SECS,
    DEFAULT_PAYLOAD_RETENTION_SECS, DEFAULT_PRUNE_BATCH_SIZE, DEFAULT_PRUNE_INTERVAL_SECS,
    DEFAULT_SETTLE_TIMEOUT_SECS, MAX_DISPATCH_BATCH_SIZE, MAX_DISPATCH_MAX_ATTEMPTS,
    MAX_DISPATCH_MAX_PARALLELISM, MAX_PRUNE_BATCH_SIZE,
};

/// Cohort's settings. Build in code, or load with [`CohortConfig::from_toml`]
/// and [`CohortConfig::apply_env`]; check with [`CohortConfig::validate`]
/// (building a [`crate::Cohort`] does).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CohortConfig {
    /// Schema holding Cohort's own tables (default `public`).
    pub schema: String,
    /// Schema of retained tables that name none (default `public`; never
    /// Cohort's own schema unless set to it).
    pub default_table_schema: Option<String>,
    /// Rows per batch (1..=100000, default 5000), or `"auto"`: sized from
    /// the measured time of the batches before ([`BatchSize`]).
    pub sweep_batch_size: BatchSize,
    /// Connections one entity's sweep uses at once (1..=64, default 1):
    /// with N > 1 the eligible rows are split into N disjoint keyset ranges
    /// swept side by side, each batch still committed with its audit. An
    /// entity's own `sweep_parallelism` wins. Validation refuses a value
    /// the pool cannot serve.
    pub sweep_parallelism: u32,
    /// Cron schedule (UTC) of the worker; `None` keeps it idle.
    pub schedule: Option<String>,
    /// Scheduled sweeps count instead of mutating.
    pub dry_run: bool,
    /// Stops the worker between passes.
    pub kill_switch: bool,
    /// Per-observer time limit.
    pub observer_timeout: Period,
    /// How long in-flight handler deliveries may take to finish when the
    /// background services stop (default 30 s).
    pub shutdown_grace_period: Period,
    /// How long a partition purge waits for the locks to detach one
    /// partition (1 s to 10 min, default 5 s). A partition whose locks are
    /// not granted in time is left, with every row after its lower bound,
    /// for the next run.
    pub partition_lock_timeout: Period,
    /// Global column conventions.
    pub conventions: Conventions,
    /// Row-handler dispatcher.
    pub dispatch: DispatchConfig,
    /// History pruner.
    pub prune: PruneConfig,
    /// The secret key of the `hash` anonymise method (HMAC-SHA256); at
    /// least 16 bytes. Required when any entity hashes a column. Prefer
    /// `COHORT_HASH_KEY` to writing it in a file. Never stored in the
    /// database, never printed.
    pub hash_key: Option<HashKey>,
    /// The ledger's key (`COHORT_LEDGER_KEY`, 64 hexadecimal characters):
    /// with it every link of the hash chain carries a MAC the database
    /// cannot forge (see [`crate::domain::chain`]). Never read from a file, never
    /// stored, never printed. Once the chain is keyed, a process that
    /// settles runs or changes holds refuses to start without it.
    #[serde(skip)]
    pub ledger_key: Option<crate::domain::chain::LedgerKey>,
    /// Tables `cohort validate` does not warn about when the policy does
    /// not mention them, left out on purpose (`"schema.table"`; a name
    /// without a schema is in the default table schema). Validation warns
    /// of a table with a `timestamptz` column in a schema the policy's
    /// tables live in that no entity names and this list does not hold.
    pub ignore_tables: Vec<String>,
    /// Every mutating batch transaction (sweep, erasure, partition drop)
    /// carries one transactional logical decoding message, prefix
    /// `cohort`, content `{"run_id", "entity", "strategy", "rows"}`: a CDC
    /// consumer can tell retention changes from the application's
    /// (default false). Validation warns when `wal_level` is not `logical`.
    pub cdc_marker: bool,
    /// After an entity's sweep changed at least `vacuum_after_rows` rows:
    /// `analyze` or `vacuum` (with analyze) its table, outside the batch
    /// transactions (default `off`). Validation refuses it for a table the
    /// role does not own (PostgreSQL would skip it with a warning).
    pub vacuum_after: VacuumAfter,
    /// The rows an entity's sweep must change for `vacuum_after` to run
    /// (default 100 000, at least 1).
    pub vacuum_after_rows: u64,
    /// At most this many rows changed per second by one entity's sweep
    /// (its lanes share it), waited for between batches, never inside
    /// one (default: unpaced). Per process: replicas sharing an occurrence
    /// each pace their own passes. An entity's own, and the live values in
    /// the database, apply too: the strictest wins.
    pub max_rows_per_second: Option<u32>,
    /// Before each batch, wait while a streaming standby's replay is
    /// further behind than this (a fixed period of at least one second;
    /// default: not waited for). Reading the lag needs `pg_monitor` or
    /// `pg_read_all_stats`: validation refuses the setting without it. An
    /// entity's own, and the live values in the database, apply too: the
    /// strictest wins.
    pub max_replica_lag: Option<Period>,
}

/// What runs on a table after a sweep changed enough of its rows
/// (`[cohort] vacuum_after`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VacuumAfter {
    /// Nothing: autovacuum's business (the default).
    #[default]
    Off,
    /// `ANALYZE`: fresh statistics for the planner.
    Analyze,
    /// `VACUUM (ANALYZE)`: dead tuples reclaimed for reuse, statistics too.
    Vacuum,
}

impl VacuumAfter {
    /// The name as the policy file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            VacuumAfter::Off => "off",
            VacuumAfter::Analyze => "analyze",
            VacuumAfter::Vacuum => "vacuum",
        }
    }
}

impl std::str::FromStr for VacuumAfter {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "off" => Ok(VacuumAfter::Off),
            "analyze" => Ok(VacuumAfter::Analyze),
            "vacuum" => Ok(VacuumAfter::Vacuum),
            other => Err(format!(
                "{other:?} is not one of \"off\", \"analyze\", \"vacuum\""
            )),
        }
    }
}

/// A secret key. Its `Debug` and serialised forms never show it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct HashKey(String);

impl HashKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key's bytes.
    pub fn expose(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HashKey(<redacted>)")
    }
}

impl Serialize for HashKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

/// A TOML error as `line L, column C: message`, without the source excerpt
/// the parser's own text quotes: the offending line may hold a secret
/// (`hash_key`, a database URL with a password).
pub(crate) fn toml_problem(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            let message = crate::base::suggest::serde_message(e.message());
            format!("line {line}, column {column}: {message}")
        }
        None => crate::base::suggest::serde_message(e.message()),
    }
}

/// The shortest accepted hash key, in bytes.
pub const MIN_HASH_KEY_BYTES: usize = 16;

impl Default for CohortConfig {
    fn default() -> Self {
        Self {
            schema: "public".into(),
            default_table_schema: None,
            sweep_batch_size: BatchSize::Fixed(DEFAULT_SWEEP_BATCH_SIZE),
            sweep_parallelism: DEFAULT_SWEEP_PARALLELISM,
            schedule: None,
            dry_run: false,
            kill_switch: false,
            observer_timeout: secs(5),
            shutdown_grace_period: secs(30),
            partition_lock_timeout: secs(5),
            conventions: Conventions::default(),
            dispatch: DispatchConfig::default(),
            prune: PruneConfig::default(),
            hash_key: None,
            ledger_key: None,
            ignore_tables: Vec::new(),
            cdc_marker: false,
            vacuum_after: VacuumAfter::Off,
            vacuum_after_rows: 100_000,
            max_rows_per_second: None,
            max_replica_lag: None,
        }
    }
}

impl CohortConfig {
    /// Parses a `[cohort]` table's contents (not the whole policy file).
    pub fn from_toml(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| Error::Config(Problems::one(toml_problem(text, &e))))
    }

    /// The schema retained tables without one resolve to: the configured
    /// default, then `public` (never Cohort's own ledger schema).
    pub fn table_schema(&self) -> &str {
        self.default_table_schema.as_deref().unwrap_or("public")
    }

    /// Checks every range; reports all problems at once.
    pub fn validate(&self) -> Result<()> {
        let mut problems = self.name_and_key_problems();
        if let Some(lag) = self.max_replica_lag {
            if let Err(e) = lag.as_replica_lag() {
                problems.push(format!("max_replica_lag = {lag}: {e}"));
            }
        }
        if self.max_rows_per_second == Some(0) {
            problems.push(
                "max_rows_per_second = 0: at least 1 (leave it out for an unpaced sweep)"
                    .to_owned(),
            );
        }
        if self.vacuum_after_rows == 0 {
            problems.push(
                "vacuum_after_rows = 0: at least 1 (a sweep that changed nothing leaves nothing to vacuum)"
                    .to_owned(),
            );
        }
        let lock_timeout = self.partition_lock_timeout.as_seconds();
        if !(1..=600).contains(&lock_timeout) {
            problems.push(format!(
                "partition_lock_timeout = {lock_timeout}s is out of range 1s..=10min (0 would wait for ever)"
            ));
        }
        if let BatchSize::Fixed(n) = self.sweep_batch_size {
            if !(1..=MAX_SWEEP_BATCH_SIZE).contains(&n) {
                problems.push(format!(
                    "sweep_batch_size = {n} is out of range 1..={MAX_SWEEP_BATCH_SIZE} (or \"auto\")"
                ));
            }
        }
        if let Err(e) = check_sweep_parallelism(self.sweep_parallelism) {
            problems.push(format!("sweep_parallelism = {e}"));
        }
        // Settings that measure elapsed time: of fixed length (calendar
        // units have none), and all but two of them positive (the
        // dispatcher's and the pruner's are checked with their tables).
        for (name, p, may_be_zero) in [
            ("observer_timeout", self.observer_timeout, false),
            ("shutdown_grace_period", self.shutdown_grace_period, true),
            ("partition_lock_timeout", self.partition_lock_timeout, true),
        ] {
            if !may_be_zero && p.is_zero() {
                problems.push(format!("{name} must be greater than zero"));
            }
            if let Err(e) = p.require_fixed() {
                problems.push(format!("{name}: {e}"));
            }
        }
        problems.extend(self.dispatch.problems());
        problems.extend(self.prune.problems());
        if let Some(schedule) = &self.schedule {
            if let Err(e) = crate::domain::schedule::parse_schedule(schedule) {
                problems.push(e);
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Config(Problems::global(problems)))
        }
    }

    /// The schemas and tables named, and the hash key's length.
    fn name_and_key_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(e) = check_schema_name(&self.schema) {
            problems.push(format!("schema: {e}"));
        }
        if let Some(s) = &self.default_table_schema {
            if let Err(e) = check_schema_name(s) {
                problems.push(format!("default_table_schema: {e}"));
            }
        }
        if let Some(k) = &self.hash_key {
            if k.expose().len() < MIN_HASH_KEY_BYTES {
                problems.push(format!(
                    "hash_key is {} bytes; a key shorter than {MIN_HASH_KEY_BYTES} bytes can be guessed",
                    k.expose().len()
                ));
            }
        }
        for table in &self.ignore_tables {
            if let Err(e) = QualifiedName::parse(table, self.table_schema()) {
                problems.push(format!("ignore_tables: {table:?}: {e}"));
            }
        }
        problems
    }

    /// Settings that are accepted but would do nothing as combined: one
    /// warning each, so configuration never passes silently. Validation
    /// reports them with its other advice.
    pub fn settings_without_effect(&self) -> Vec<String> {
        let p = &self.prune;
        let defaults = PruneConfig::default();
        let mut out = Vec::new();
        if self.vacuum_after == VacuumAfter::Off
            && self.vacuum_after_rows != CohortConfig::default().vacuum_after_rows
        {
            out.push(
                "vacuum_after_rows is set, but vacuum_after is \"off\": it has no effect".into(),
            );
        }
        if !p.prunes_anything()
            && (p.batch_size != defaults.batch_size || p.interval != defaults.interval)
        {
            out.push(
                "[cohort.prune] batch_size or interval is set, but no run limit (succeeded_runs_older_than, failed_runs_older_than, runs_older_than) nor inactive_holds_older_than: nothing is pruned"
                    .into(),
            );
        }
        if let (Some(ok), Some(failed)) = (p.succeeded_runs(), p.failed_runs()) {
            if failed.as_seconds() < ok.as_seconds() {
                out.push(format!(
                    "prune.failed_runs_older_than ({failed}) is shorter than prune.succeeded_runs_older_than ({ok}): failed runs, the ones an investigation reads, are deleted first"
                ));
            }
        }
        out
    }

    /// `max_replica_lag` as a std duration.
    pub fn max_replica_lag(&self) -> Option<Duration> {
        self.max_replica_lag.and_then(|p| p.as_replica_lag().ok())
    }

    /// The shutdown grace period as a std duration.
    pub fn shutdown_grace_period(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_period.as_seconds().unsigned_abs())
    }

    /// The partition purge's lock time-out as a std duration.
    pub fn partition_lock_timeout(&self) -> Duration {
        Duration::from_secs(self.partition_lock_timeout.as_seconds().unsigned_abs())
    }

    /// The observer time-out as a std duration.
    pub fn observer_timeout(&self) -> Duration {
        Duration::from_secs(self.observer_timeout.as_seconds().unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documentation() {
        let c = CohortConfig::default();
        assert_eq!(c.schema, "public");
        assert_eq!(c.sweep_batch_size, BatchSize::Fixed(5000));
        assert_eq!(c.sweep_parallelism, 1);
        assert_eq!(c.schedule, None);
        assert!(!c.dry_run && !c.kill_switch);
        assert_eq!(c.observer_timeout.as_seconds(), 5);
        let d = &c.dispatch;
        assert_eq!(
            (d.batch_size, d.max_parallelism, d.max_attempts),
            (50, 4, 10)
        );
        assert_eq!(d.poll_interval.as_seconds(), 10);
        assert_eq!(d.claim_timeout.as_seconds(), 300);
        assert_eq!(d.settle_timeout.as_seconds(), 3600);
        assert_eq!(d.payload_retention.as_seconds(), 30 * 86_400);
        c.validate().unwrap();
    }

    #[test]
    fn out_of_range_values_are_all_reported() {
        let mut c = CohortConfig {
            sweep_batch_size: BatchSize::Fixed(0),
            sweep_parallelism: 0,
            schedule: Some("every day".into()),
            schema: String::new(),
            ..CohortConfig::default()
        };
        c.dispatch.batch_size = 10_001;
        c.dispatch.max_parallelism = 257;
        c.dispatch.max_attempts = 0;
        c.dispatch.claim_timeout = Period::ZERO;
        let Err(Error::Config(problems)) = c.validate() else {
            panic!("accepted")
        };
        assert_eq!(problems.0.len(), 8, "every problem listed: {problems}");
        let msg = problems.to_string();
        for part in [
            "sweep_batch_size = 0",
            "sweep_parallelism = 0 is out of range 1..=64",
            "dispatch.batch_size = 10001",
            "dispatch.max_parallelism = 257",
            "dispatch.max_attempts = 0",
            "dispatch.claim_timeout must be greater than zero",
            "not a valid cron expression",
            "schema: an identifier cannot be empty",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg}");
        }
    }

    #[test]
    fn settings_that_measure_elapsed_time_refuse_calendar_units() {
        let mut c = CohortConfig::default();
        c.apply_env([
            (
                "COHORT_DISPATCH__SETTLE_TIMEOUT".to_string(),
                "1mo".to_string(),
            ),
            ("COHORT_OBSERVER_TIMEOUT".to_string(), "1y".to_string()),
        ])
        .unwrap();
        let Err(Error::Config(problems)) = c.validate() else {
            panic!("accepted")
        };
        let msg = problems.to_string();
        assert_eq!(problems.0.len(), 2, "{msg}");
        assert!(
            msg.contains("dispatch.settle_timeout: \"1mo\" uses calendar years or months"),
            "{msg}"
        );
        assert!(msg.contains("observer_timeout: \"1y\""), "{msg}");
    }

    #[test]
    fn toml_and_environment_precedence() {
        let mut c = CohortConfig::from_toml(
            "schema = \"retention\"\nsweep_batch_size = 100\nschedule = \"0 2 * * *\"\n[dispatch]\nbatch_size = 7\n[conventions]\ntenant = \"organisation_id\"\n",
        )
        .unwrap();
        assert_eq!(c.conventions.tenant.as_deref(), Some("organisation_id"));
        c.apply_env([
            ("COHORT_SWEEP_BATCH_SIZE".to_string(), "250".to_string()),
            ("COHORT_DRY_RUN".to_string(), "true".to_string()),
            ("COHORT_SWEEP_PARALLELISM".to_string(), "4".to_string()),
            (
                "COHORT_DISPATCH__CLAIM_TIMEOUT".to_string(),
                "10m".to_string(),
            ),
            ("PATH".to_string(), "/bin".to_string()),
        ])
        .unwrap();
        assert_eq!(c.schema, "retention");
        assert_eq!(c.sweep_batch_size, BatchSize::Fixed(250));
        assert_eq!(c.sweep_parallelism, 4);
        assert!(c.dry_run);
        assert_eq!(c.dispatch.batch_size, 7);
        assert_eq!(c.dispatch.claim_timeout.as_seconds(), 600);
        c.validate().unwrap();
        assert!(c
            .clone()
            .apply_env([("COHORT_SWEEP_BATCH".into(), "1".into())])
            .is_err());
        assert!(c
            .clone()
            .apply_env([("COHORT_DRY_RUN".into(), "maybe".into())])
            .is_err());
        assert!(CohortConfig::from_toml("sweep_batch = 3").is_err());
        assert!(CohortConfig::from_toml("sweep_batch_size = -3").is_err());
    }

    #[test]
    fn the_batch_size_is_a_number_or_auto_from_a_file_and_from_the_environment() {
        let c = CohortConfig::from_toml("sweep_batch_size = \"auto\"").unwrap();
        assert_eq!(c.sweep_batch_size, BatchSize::Auto);
        c.validate().unwrap();
        assert_eq!(c.sweep_batch_size.first(), DEFAULT_SWEEP_BATCH_SIZE);
        assert_eq!(
            CohortConfig::from_toml("sweep_batch_size = 700")
                .unwrap()
                .sweep_batch_size,
            BatchSize::Fixed(700)
        );
        let mut e = CohortConfig::default();
        e.apply_env([("COHORT_SWEEP_BATCH_SIZE".into(), "auto".into())])
            .unwrap();
        assert!(e.sweep_batch_size.is_auto());
        e.apply_env([("COHORT_SWEEP_BATCH_SIZE".into(), " 42 ".into())])
            .unwrap();
        assert_eq!(e.sweep_batch_size, BatchSize::Fixed(42));
        // Anything else is refused, with what is expected.
        for text in [
            "sweep_batch_size = \"Auto\"",
            "sweep_batch_size = \"fast\"",
            "sweep_batch_size = 1.5",
            "sweep_batch_size = 99999999999999",
        ] {
            let err = CohortConfig::from_toml(text).unwrap_err().to_string();
            assert!(
                err.contains("sweep_batch_size") || err.contains("auto"),
                "{text}: {err}"
            );
        }
        let err = e
            .apply_env([("COHORT_SWEEP_BATCH_SIZE".into(), "fast".into())])
            .unwrap_err()
            .to_string();
        assert!(err.contains("nor \"auto\""), "{err}");
        // Written back as it was read.
        let auto = CohortConfig {
            sweep_batch_size: BatchSize::Auto,
            ..CohortConfig::default()
        };
        let text = toml::to_string(&auto).unwrap();
        assert!(text.contains("sweep_batch_size = \"auto\""), "{text}");
        assert_eq!(CohortConfig::from_toml(&text).unwrap(), auto);
    }
}
