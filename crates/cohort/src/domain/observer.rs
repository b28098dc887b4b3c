//! Audit observers: post-commit, best-effort notifications of the ledger.
//!
//! The ledger itself (Cohort's tables) is written by a private writer in the
//! same transaction as each mutation and cannot be replaced or switched off.
//! Observers receive copies of committed events, in order, each on its own
//! task with its own time limit: a failing, slow or hung observer is logged
//! and skipped, and never blocks other observers or the run, nor changes
//! data, results or status. Delivery is best effort: events still queued
//! when the process exits are lost.
//!
//! One run's events add up to its ledger: one `Started`; per entity, its
//! `EntityProgress` batches (their sum is the summary's `affected`, with
//! rows dropped by partition purge counted as batches too), a `RowDetail`
//! per batch with per-row audit or handlers, and one `EntitySummary` with
//! the summary row's values (also for an entity that failed, with its
//! sanitised error); then one `Settled` whose totals are the sums of the
//! summaries and whose error is the run's. An entity refused before its
//! summary row was written (its rule could not be resolved) has none.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::domain::outcome::{RunKind, RunStatus, Trigger};
use crate::domain::rules::{Period, Strategy};

/// A committed ledger event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub enum AuditEvent {
    /// The Started row committed.
    #[non_exhaustive]
    Started {
        /// Run id.
        run_id: Uuid,
        /// Sweep or erasure.
        kind: RunKind,
        /// Manual or scheduled.
        trigger: Trigger,
        /// Dry run.
        dry_run: bool,
        /// Tenant, if any.
        tenant: Option<String>,
        /// Logical time of the run.
        now: DateTime<Utc>,
    },
    /// A batch committed.
    #[non_exhaustive]
    EntityProgress {
        /// Run id.
        run_id: Uuid,
        /// Entity id.
        entity_id: Uuid,
        /// Strategy applied.
        strategy: Strategy,
        /// Rows changed by this batch.
        batch: u64,
        /// Rows changed by this entity so far.
        total: u64,
    },
    /// Per-row detail committed with a batch.
    #[non_exhaustive]
    RowDetail {
        /// Run id.
        run_id: Uuid,
        /// Entity id.
        entity_id: Uuid,
        /// Tenant, if any.
        tenant: Option<String>,
        /// Canonical record ids.
        record_ids: Vec<String>,
        /// Strategy applied.
        action: Strategy,
    },
    /// An entity's summary is final (the `sweep_run_entity_summary` row).
    #[non_exhaustive]
    EntitySummary {
        /// Run id.
        run_id: Uuid,
        /// Entity id.
        entity_id: Uuid,
        /// The entity's display name.
        entity: String,
        /// Its retention category.
        category: String,
        /// The strategy its rule resolved to.
        strategy: Strategy,
        /// The stage's position when the category has stages (1 first).
        stage: Option<u16>,
        /// The resolved retention period.
        period: Period,
        /// The resolved legal minimum, if any.
        legal_min: Option<Period>,
        /// The cutoff applied (`None`: an erasure without a legal minimum).
        cutoff: Option<DateTime<Utc>>,
        /// Where the rule came from (the provider's provenance), if given.
        rule_source: Option<String>,
        /// Why the rule applies, if given.
        rule_reason: Option<String>,
        /// Affected rows.
        affected: u64,
        /// Held rows.
        held: u64,
        /// Of `held`, rows a hold on a subject protects.
        held_by_subject: u64,
        /// Eligible rows left (still referenced, set aside by a failing
        /// `on_before`, or behind a partition that could not be locked).
        skipped: u64,
        /// Null-anchor rows.
        null_anchor: u64,
        /// Erasure: rows kept because the legal minimum has not passed.
        kept_by_legal_min: u64,
        /// Rows kept by policy (the rule is `exempt`).
        kept_by_policy: u64,
        /// The entity's sanitised failure, if it failed.
        error: Option<String>,
    },
    /// The run settled (succeeded, partially failed, failed or cancelled).
    #[non_exhaustive]
    Settled {
        /// Run id.
        run_id: Uuid,
        /// Sweep or erasure.
        kind: RunKind,
        /// Terminal status.
        status: RunStatus,
        /// From the Started row to settling, in milliseconds.
        duration_ms: u64,
        /// Rows affected, over every entity summary.
        affected: u64,
        /// Rows held, over every entity summary.
        held: u64,
        /// Rows skipped, over every entity summary.
        skipped: u64,
        /// Null-anchor rows, over every entity summary.
        null_anchor: u64,
        /// Rows kept by a legal minimum, over every entity summary.
        kept_by_legal_min: u64,
        /// Rows kept by policy, over every entity summary.
        kept_by_policy: u64,
        /// The run's sanitised error (as stored on the run), if any.
        error: Option<String>,
    },
}

/// Receives committed ledger events. Errors and time-outs are logged and
/// otherwise ignored.
#[async_trait]
pub trait AuditObserver: Send + Sync + 'static {
    /// Handles one event.
    async fn on_event(
        &self,
        event: &AuditEvent,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}
