//! Audit observers: post-commit, best-effort notifications of the ledger.
//!
//! The ledger itself (Cohort's tables) is written by a private writer in the
//! same transaction as each mutation and cannot be replaced or switched off.
//! Observers receive copies of committed events, in order, each on its own
//! task with its own time limit: a failing, slow or hung observer is logged
//! and skipped, and never blocks other observers or the run, nor changes
//! data, results or status. Delivery is best effort: events still queued
//! when the process exits are lost.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::outcome::{RunKind, RunStatus};
use crate::rules::Strategy;

/// A committed ledger event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub enum AuditEvent {
    /// The Started row committed.
    Started {
        /// Run id.
        run_id: Uuid,
        /// Sweep or erasure.
        kind: RunKind,
        /// Dry run.
        dry_run: bool,
        /// Tenant, if any.
        tenant: Option<String>,
        /// Logical time of the run.
        now: DateTime<Utc>,
    },
    /// A batch committed.
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
    /// An entity's summary is final.
    EntitySummary {
        /// Run id.
        run_id: Uuid,
        /// Entity id.
        entity_id: Uuid,
        /// Affected rows.
        affected: u64,
        /// Held rows.
        held: u64,
        /// Null-anchor rows.
        null_anchor: u64,
    },
    /// The run settled (succeeded, partially failed, failed or cancelled).
    Settled {
        /// Run id.
        run_id: Uuid,
        /// Terminal status.
        status: RunStatus,
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

/// Fans events out to observers, one queue and task each.
pub(crate) struct ObserverHub {
    observers: Vec<Arc<dyn AuditObserver>>,
    timeout: Duration,
    senders: OnceLock<Vec<mpsc::UnboundedSender<AuditEvent>>>,
}

impl ObserverHub {
    pub(crate) fn new(observers: Vec<Arc<dyn AuditObserver>>, timeout: Duration) -> Self {
        Self {
            observers,
            timeout,
            senders: OnceLock::new(),
        }
    }

    /// Whether no observer is registered (events would go nowhere).
    pub(crate) fn is_empty(&self) -> bool {
        self.observers.is_empty()
    }

    /// Queues a committed event for every observer. Never waits.
    pub(crate) fn emit(&self, event: AuditEvent) {
        if self.observers.is_empty() {
            return;
        }
        let senders = self.senders.get_or_init(|| {
            self.observers
                .iter()
                .enumerate()
                .map(|(index, observer)| {
                    let (tx, mut rx) = mpsc::unbounded_channel::<AuditEvent>();
                    let observer = Arc::clone(observer);
                    let timeout = self.timeout;
                    tokio::spawn(async move {
                        while let Some(event) = rx.recv().await {
                            match tokio::time::timeout(timeout, observer.on_event(&event)).await {
                                Ok(Ok(())) => {}
                                Ok(Err(e)) => tracing::warn!(observer = index, error = %e, "audit observer failed"),
                                Err(_) => tracing::warn!(observer = index, timeout_ms = timeout.as_millis() as u64, "audit observer timed out"),
                            }
                        }
                    });
                    tx
                })
                .collect()
        });
        for tx in senders {
            let _ = tx.send(event.clone());
        }
    }
}
