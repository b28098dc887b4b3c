//! What a run reports: its kind, trigger and status, the outcome of each
//! entity and the settled result (pure values, re-exported at the crate
//! root), and the logical time a request carries.

use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::base::diagnostic::Diagnostic;
use crate::domain::rules::{Period, Strategy};

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Trigger {
    /// Called directly (API or CLI).
    Manual,
    /// Started by the scheduled worker.
    Scheduled,
}

impl Trigger {
    /// The ledger spelling (`manual`, `scheduled`).
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Manual => "manual",
            Trigger::Scheduled => "scheduled",
        }
    }
}

/// Sweep or erasure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunKind {
    /// A retention sweep.
    Sweep,
    /// A right-to-erasure request.
    Erasure,
}

impl RunKind {
    /// The ledger spelling (`sweep`, `erasure`).
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Sweep => "sweep",
            RunKind::Erasure => "erasure",
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunStatus {
    /// Still running, or its process died (recovered later as failed).
    Started,
    /// Every entity was processed.
    Succeeded,
    /// At least one entity failed; the others' work is committed.
    PartiallyFailed,
    /// The run itself failed (e.g. its connection was lost).
    Failed,
    /// Cancelled by the caller; the open batch was rolled back.
    Cancelled,
    /// Every entity was processed or paused, at least one paused
    /// (`cohort pause`), and none failed: not all the work was done, by an
    /// operator's choice.
    Paused,
}

impl RunStatus {
    /// The ledger spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Started => "started",
            RunStatus::Succeeded => "succeeded",
            RunStatus::PartiallyFailed => "partially_failed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Paused => "paused",
        }
    }

    /// Parses the ledger spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "started" => RunStatus::Started,
            "succeeded" => RunStatus::Succeeded,
            "partially_failed" => RunStatus::PartiallyFailed,
            "failed" => RunStatus::Failed,
            "cancelled" => RunStatus::Cancelled,
            "paused" => RunStatus::Paused,
            _ => return None,
        })
    }
}

/// What happened to one entity in a run (or would, in a preview).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct EntityOutcome {
    /// Durable entity id.
    pub entity_id: Uuid,
    /// Display name.
    pub entity: String,
    /// Category.
    pub category: String,
    /// Strategy applied.
    pub strategy: Strategy,
    /// Rows changed (or, in a dry run or preview, that would change).
    pub affected: u64,
    /// Rows past the cutoff kept by an active hold.
    pub held: u64,
    /// Of `held`, the rows kept by a hold on a subject they hold (a row
    /// under both a record hold and a subject hold counts in both).
    pub held_by_subject: u64,
    /// Rows past the cutoff left alone although not held: purge candidates
    /// still referenced by other rows through a NO ACTION / RESTRICT
    /// foreign key (and, with row handlers, rows whose before-handler failed).
    pub skipped: u64,
    /// Rows in scope whose anchor is NULL (never eligible).
    pub null_anchor: u64,
    /// Erasure: the subject's rows kept because the legal minimum has not
    /// passed yet (anchor on or after `now - legal_min`). 0 for sweeps.
    pub kept_by_legal_min: u64,
    /// Erasure: when the oldest of the rows the legal minimum kept can go
    /// (its anchor plus the legal minimum), the time an erasure request
    /// waits for. `None` when none was kept, for sweeps, and when read back
    /// from the ledger (which does not store it). Not serialised when
    /// `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_by_legal_min_until: Option<DateTime<Utc>>,
    /// Rows the policy keeps: past the cutoff (sweep) or the subject's
    /// (erasure), not held, but the resolved strategy is `exempt`.
    pub kept_by_policy: u64,
    /// The cutoff: rows anchored strictly before it were eligible (`None`
    /// for an erasure without a positive legal minimum: no anchor limit).
    pub cutoff: Option<DateTime<Utc>>,
    /// The resolved period.
    pub period: Period,
    /// The resolved legal minimum.
    pub legal_min: Option<Period>,
    /// The stage's position when the category has stages (1 first; each
    /// stage is its own outcome); `None` for a category without stages.
    pub stage: Option<u16>,
    /// The largest batch limit the entity's batches used: the fixed
    /// `sweep_batch_size`, or the largest size `"auto"` chose
    /// ([`BatchSize`](crate::BatchSize)). `None` when no batch ran (a dry
    /// run, a preview, an entity with nothing to lock) and for runs
    /// recorded before schema version 11.
    pub batch_size: Option<u32>,
    /// Why rows were left that will not go by themselves, when some were:
    /// skipped rows of a purge or archive can be referenced from a table
    /// whose rows Cohort never deletes (validation warns of each such
    /// foreign key), and then they are kept on every run. `None`
    /// otherwise, and for runs recorded before schema version 14. Not
    /// serialised when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// What the sweep left in the entity's table: its dead tuples and size
    /// before the batches and after them, and what `vacuum_after` ran.
    /// `None` for dry runs, previews, strategies that change nothing and
    /// runs recorded before schema version 16. Not serialised when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table: Option<TableHealth>,
    /// Milliseconds the sweep waited between batches to stay under
    /// `max_rows_per_second` (every lane's waits). `None` when it was not
    /// paced, and for runs recorded before schema version 16. Not
    /// serialised when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throttled_ms: Option<u64>,
    /// Milliseconds the sweep waited between batches for standbys to
    /// replay (`max_replica_lag`, every lane's waits); 0 when a limit
    /// applied and nothing was waited for (the note says why, e.g. no
    /// standby streamed). `None` when no limit applied, and for runs
    /// recorded before schema version 17. Not serialised when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_waited_ms: Option<u64>,
    /// The entity was paused (`cohort pause`): skipped, or stopped before
    /// a batch (the batches before it committed). Its run settles
    /// `paused`, never `succeeded`.
    pub paused: bool,
    /// What the throttle has to say, until it is folded into `note`.
    #[serde(skip)]
    pub(crate) pacing_notes: Vec<String>,
    /// The partitions of several tenants dropped whole, with the
    /// tenants they held; they join `note` when the entity settles.
    #[serde(skip)]
    pub(crate) partition_notes: Vec<String>,
}

/// What a sweep left in a table, as the statistics system reported it
/// (dead tuples: `pg_stat_user_tables.n_dead_tup`; size:
/// `pg_table_size`; both summed over a partitioned table's partitions).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TableHealth {
    /// Dead tuples before the entity's batches.
    pub dead_tuples_before: u64,
    /// Dead tuples after them (before `vacuum_after` ran).
    pub dead_tuples_after: u64,
    /// The table's size in bytes before the batches.
    pub bytes_before: u64,
    /// Its size after them.
    pub bytes_after: u64,
    /// `analyze` or `vacuum` when `vacuum_after` ran, else `None`.
    pub vacuumed: Option<String>,
}

/// An entity that failed; the run went on with the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct EntityFailure {
    /// Durable entity id.
    pub entity_id: Uuid,
    /// Display name.
    pub entity: String,
    /// Sanitised diagnostic (or a Cohort-defined reason).
    pub error: String,
}

/// The settled result of a sweep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SweepResult {
    /// The run's id in `sweep_run`.
    pub run_id: Uuid,
    /// Sweep or erasure.
    pub kind: RunKind,
    /// Manual or scheduled.
    pub trigger: Trigger,
    /// Terminal status.
    pub status: RunStatus,
    /// Whether rows were left unchanged by design.
    pub dry_run: bool,
    /// The tenant, or `None` for the tenantless pass.
    pub tenant: Option<String>,
    /// When the Started row was written.
    pub started_at: DateTime<Utc>,
    /// When the run settled (`None` while it is still `Started`).
    pub settled_at: Option<DateTime<Utc>>,
    /// Per-entity outcomes, in processing order.
    pub entities: Vec<EntityOutcome>,
    /// Entities that failed.
    pub failures: Vec<EntityFailure>,
    /// Erasure: the subject kind the request named (stored on the run);
    /// `None` for sweeps and for erasures of columns that declare no kind.
    /// Not serialised when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub erasure_kind: Option<String>,
}

/// The settled result of an erasure: its run, and the entities holding the
/// subject's kind of data that the request did not reach. The run's fields
/// read through (`result.status`, `result.entity("Account")`); serialised
/// as the run's object with `not_reached` beside its fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ErasureResult {
    /// The run (kind `erasure`), as the ledger records it.
    #[serde(flatten)]
    pub run: SweepResult,
    /// Entities with subject columns for the request that the run did not
    /// reach, and why (e.g. tenantless entities in a tenant's erasure, or
    /// a subject no column of the entity can hold). Not serialised when
    /// empty; not stored in the ledger.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_reached: Vec<NotReached>,
    /// The erasure request this run served, as it stands after the run,
    /// when the erasure was opened with a reference. Not serialised when
    /// `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<crate::domain::erasure_requests::RequestRecord>,
}

impl std::ops::Deref for ErasureResult {
    type Target = SweepResult;

    fn deref(&self) -> &SweepResult {
        &self.run
    }
}

/// An entity with erasure-subject columns that an erasure did not reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct NotReached {
    /// Durable entity id.
    pub entity_id: Uuid,
    /// Display name.
    pub entity: String,
    /// Why, and how to reach it.
    pub reason: String,
}

impl SweepResult {
    /// Total rows affected.
    pub fn affected(&self) -> u64 {
        self.entities.iter().map(|e| e.affected).sum()
    }

    /// The outcome of one entity, by display name.
    pub fn entity(&self, name: &str) -> Option<&EntityOutcome> {
        self.entities.iter().find(|e| e.entity == name)
    }
}

pub(crate) fn failure(entity_id: Uuid, entity: &str, d: &Diagnostic) -> EntityFailure {
    EntityFailure {
        entity_id,
        entity: entity.to_owned(),
        error: d.to_string(),
    }
}

/// Results of a preview: counts only, nothing written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PreviewResult {
    /// The tenant previewed, or `None` for the tenantless entities.
    pub tenant: Option<String>,
    /// Per-entity counts; `affected` is what a sweep would change now.
    pub entities: Vec<EntityOutcome>,
    /// Entities whose rule could not be resolved.
    pub failures: Vec<EntityFailure>,
}

/// A request's logical time at the boundary: UTC, at PostgreSQL's
/// microsecond precision (so what a run reports is what the ledger stores).
pub(crate) fn logical_now<Tz: TimeZone>(now: DateTime<Tz>) -> DateTime<Utc> {
    use chrono::SubsecRound;
    now.with_timezone(&Utc).trunc_subsecs(6)
}

/// The builder methods of every request that can change rows: a dry run,
/// a `now` later than the database clock, and cancellation (fields
/// `dry_run`, `allow_future_now`, `cancel`).
macro_rules! run_builders {
    () => {
        /// Counts what the run would change and writes the same audit
        /// trail, changing no row.
        pub fn dry_run(mut self, dry_run: bool) -> Self {
            self.dry_run = dry_run;
            self
        }

        /// Accepts a `now` later than the database clock for a mutating
        /// run. Refused by default: a future `now` moves every cutoff
        /// forward and mutates rows that are not old enough yet. Dry runs
        /// and previews may look ahead freely.
        pub fn allow_future_now(mut self, allow: bool) -> Self {
            self.allow_future_now = allow;
            self
        }

        /// Cancellation: when the token fires, the open batch is rolled
        /// back and the run settles `Cancelled` (a sweep of every tenant
        /// also skips the passes after it).
        pub fn cancellation(mut self, token: crate::base::cancel::Cancel) -> Self {
            self.cancel = token;
            self
        }
    };
}
pub(crate) use run_builders;
