//! Configuration: defaults, ranges, and loading from the `[cohort]` table of
//! a TOML file and from `COHORT_…` environment variables (environment wins
//! over the file; code can build it directly).
//!
//! Why one file of about 640 lines: it is the one place every setting, its
//! default, its range and its environment name are declared (about 110 of
//! the lines are its unit tests); split, a setting's parts would live apart.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::base::ident::{check_schema_name, QualifiedName};
use crate::domain::model::Conventions;
use crate::domain::rules::Period;
use crate::error::{Error, Problems, Result};

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

fn secs(n: i64) -> Period {
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
            let bad = |what: &str| {
                let shown = if name == "HASH_KEY" || name == "LEDGER_KEY" {
                    "<redacted>"
                } else {
                    value.as_str()
                };
                Error::Config(Problems::one(format!("{key}={shown:?}: {what}")))
            };
            let int = || {
                value
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| bad("expected a whole number"))
            };
            let period = || value.parse::<Period>().map_err(|e| bad(&e.to_string()));
            let boolean = || match value.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(bad("expected true or false")),
            };
            match name {
                "SCHEMA" => self.schema = value.clone(),
                "HASH_KEY" => self.hash_key = Some(HashKey::new(value.clone())),
                "LEDGER_KEY" => {
                    self.ledger_key = Some(
                        crate::domain::chain::LedgerKey::from_hex(&value).map_err(|e| bad(&e))?,
                    )
                }
                "SWEEP_BATCH_SIZE" => {
                    self.sweep_batch_size = value.parse::<BatchSize>().map_err(|e| bad(&e))?
                }
                "SWEEP_PARALLELISM" => self.sweep_parallelism = int()?,
                "SCHEDULE" => self.schedule = Some(value.clone()).filter(|s| !s.trim().is_empty()),
                "DRY_RUN" => self.dry_run = boolean()?,
                "KILL_SWITCH" => self.kill_switch = boolean()?,
                "CDC_MARKER" => self.cdc_marker = boolean()?,
                "VACUUM_AFTER" => {
                    self.vacuum_after = value.parse::<VacuumAfter>().map_err(|e| bad(&e))?
                }
                "MAX_ROWS_PER_SECOND" => {
                    self.max_rows_per_second = match value.trim() {
                        "" => None,
                        _ => Some(int()?),
                    }
                }
                "MAX_REPLICA_LAG" => {
                    self.max_replica_lag = match value.trim() {
                        "" => None,
                        _ => Some(period()?),
                    }
                }
                "VACUUM_AFTER_ROWS" => {
                    self.vacuum_after_rows = value
                        .trim()
                        .parse::<u64>()
                        .map_err(|_| bad("expected a whole number"))?
                }
                "OBSERVER_TIMEOUT" => self.observer_timeout = period()?,
                "SHUTDOWN_GRACE_PERIOD" => self.shutdown_grace_period = period()?,
                "PARTITION_LOCK_TIMEOUT" => self.partition_lock_timeout = period()?,
                "DISPATCH__POLL_INTERVAL" => self.dispatch.poll_interval = period()?,
                "DISPATCH__BATCH_SIZE" => self.dispatch.batch_size = int()?,
                "DISPATCH__MAX_PARALLELISM" => self.dispatch.max_parallelism = int()?,
                "DISPATCH__MAX_ATTEMPTS" => self.dispatch.max_attempts = int()?,
                "DISPATCH__BASE_BACKOFF" => self.dispatch.base_backoff = period()?,
                "DISPATCH__CLAIM_TIMEOUT" => self.dispatch.claim_timeout = period()?,
                "DISPATCH__SETTLE_TIMEOUT" => self.dispatch.settle_timeout = period()?,
                "DISPATCH__PAYLOAD_RETENTION" => self.dispatch.payload_retention = period()?,
                "PRUNE__RUNS_OLDER_THAN" => self.prune.runs_older_than = Some(period()?),
                "PRUNE__SUCCEEDED_RUNS_OLDER_THAN" => {
                    self.prune.succeeded_runs_older_than = Some(period()?)
                }
                "PRUNE__FAILED_RUNS_OLDER_THAN" => {
                    self.prune.failed_runs_older_than = Some(period()?)
                }
                "PRUNE__INACTIVE_HOLDS_OLDER_THAN" => {
                    self.prune.inactive_holds_older_than = Some(period()?)
                }
                "PRUNE__BATCH_SIZE" => self.prune.batch_size = int()?,
                "PRUNE__INTERVAL" => self.prune.interval = period()?,
                _ => {
                    return Err(Error::Config(Problems::one(format!(
                        "unknown setting {key}"
                    ))))
                }
            }
        }
        Ok(())
    }

    /// Checks every range; reports all problems at once.
    pub fn validate(&self) -> Result<()> {
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
        for table in &self.ignore_tables {
            if let Err(e) = QualifiedName::parse(table, self.table_schema()) {
                problems.push(format!("ignore_tables: {table:?}: {e}"));
            }
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
