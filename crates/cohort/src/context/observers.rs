//! The audit observers' delivery: each observer gets its own queue and
//! task, with its own time limit, so one that fails, hangs or is slow is
//! logged and skipped without blocking the others or the run (see
//! [`crate::domain::observer`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::domain::observer::{AuditEvent, AuditObserver};

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
