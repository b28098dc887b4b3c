//! Dead letters: work that will not be delivered without an operator.
//! What a dead letter is, which ones to list and which to requeue; the
//! listing and requeueing themselves are `Cohort::dead_letters` and
//! `Cohort::retry_dead_letters`.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// One dead-lettered piece of handler work.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The work's id (what `retry` takes).
    pub id: i64,
    /// The run that queued it.
    pub run_id: Uuid,
    /// The retained entity.
    pub entity_id: Uuid,
    /// The entity's display name.
    pub entity: String,
    /// The row's record id.
    pub record_id: String,
    /// The row's tenant.
    pub tenant: Option<String>,
    /// The handler's identity.
    pub handler: String,
    /// Attempts made.
    pub attempts: i32,
    /// The sanitised reason.
    pub last_error: Option<String>,
    /// When it was dead-lettered.
    pub dead_lettered_at: DateTime<Utc>,
    /// What the run did to the row: `purge`, `soft_delete`, `anonymise`,
    /// or `skipped` when a handler's `on_before` failed for it and the row
    /// was left as it was (such work is never retried: the next run tries
    /// the row again).
    pub action: String,
}

/// Which dead letters to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterFilter {
    pub(crate) entity_id: Option<Uuid>,
    pub(crate) handler: Option<String>,
    pub(crate) limit: i64,
}

impl Default for DeadLetterFilter {
    fn default() -> Self {
        Self {
            entity_id: None,
            handler: None,
            limit: 100,
        }
    }
}

impl DeadLetterFilter {
    /// Every dead letter (the 100 most recent).
    pub fn all() -> Self {
        Self::default()
    }

    /// Only this entity's.
    pub fn entity(mut self, entity_id: Uuid) -> Self {
        self.entity_id = Some(entity_id);
        self
    }

    /// Only this handler's.
    pub fn handler(mut self, handler: impl Into<String>) -> Self {
        self.handler = Some(handler.into());
        self
    }

    /// At most this many, most recent first (0..=10000).
    pub fn limit(mut self, limit: i64) -> Self {
        self.limit = limit;
        self
    }
}

/// Which dead letters to requeue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetrySelection {
    /// These ids; every one must be a dead letter with its payload, or
    /// nothing is changed.
    Ids(Vec<i64>),
    /// Every dead letter that still has its payload.
    All,
}
