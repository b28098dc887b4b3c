//! Durable row handlers: side effects for every row a run mutates, run at
//! least once, in order, even if the process dies at any instant.
//!
//! A handler is registered per entity with a stable identity, a priority
//! (lowest first; unset last, then by identity) and a [`Phase`]. Its
//! [`RowHandler::on_before`] runs inside the batch transaction, before the
//! mutation, on the locked row decoded into the entity's Rust type, and may
//! only capture values into the [`Snapshot`]. The queue rows (one per
//! handler per mutated row, with the snapshot) are written in the same
//! transaction as the mutation and its audit: there is no mutation without
//! its queued work and no queued work without its mutation. Held rows,
//! rows the mutation did not change and dry runs queue nothing.
//!
//! [`RowHandler::on_after`] runs after commit, from the queue, through the
//! [`Dispatcher`](crate::services::Dispatcher): claimed with `FOR UPDATE SKIP LOCKED`, each row's
//! handlers in order, retried with exponential backoff, dead-lettered after
//! `max_attempts` with a sanitised `last_error`. A claim that expires is
//! reclaimed as a new attempt, and the stale delivery can never settle the
//! row (every settlement is fenced by the claim token). Snapshots are
//! cleared as soon as every handler of the row has succeeded (a dead
//! letter keeps its payload so it can be retried), and a backstop scrub
//! clears any older than `payload_retention`.

pub(crate) mod command;
pub(crate) mod dead_letters;
mod snapshot;

use std::sync::Arc;

use sqlx::postgres::PgRow;
use uuid::Uuid;

pub use command::{HandlerTarget, PolicyHandler};
pub use dead_letters::{DeadLetter, DeadLetterFilter, RetrySelection};
pub use snapshot::{Snapshot, SnapshotError, SnapshotValue};

use crate::base::cancel::Cancel;
use crate::domain::rules::Strategy;

/// When queued work becomes due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// As soon as the batch that queued it commits.
    Immediate,
    /// Only once the whole run has settled (succeeded, failed or cancelled).
    AfterSweepSettled,
}

impl Phase {
    /// The ledger spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Immediate => "immediate",
            Phase::AfterSweepSettled => "after_sweep_settled",
        }
    }
}

/// What a handler returns when it fails; its text is never stored (the
/// ledger keeps a sanitised diagnostic only), unless it is a [`SafeReason`].
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// A failure reason the handler vouches holds no personal data (e.g.
/// `exit status 3`): stored as the dead letter's `last_error` as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafeReason(pub String);

impl std::fmt::Display for SafeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SafeReason {}

/// What `on_before` sees besides the row, and where it captures values.
#[derive(Debug)]
#[non_exhaustive]
pub struct BeforeContext {
    /// Values to hand to `on_after`; only what the snapshot can hold.
    pub snapshot: Snapshot,
    /// The row's record id (canonical text).
    pub record_id: String,
    /// The row's tenant, if tenant-scoped.
    pub tenant: Option<String>,
    /// The run.
    pub run_id: Uuid,
    /// What the mutation will do.
    pub strategy: Strategy,
}

/// What `on_after` receives from the queue.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AfterContext {
    /// What `on_before` captured, exactly.
    pub snapshot: Snapshot,
    /// The retained entity's id.
    pub entity_id: Uuid,
    /// The row's record id (canonical text).
    pub record_id: String,
    /// The record id as JSON: the string, or for a composite key the
    /// array of its parts in key order (what a command handler's document
    /// carries as `record_id`).
    pub record_key: serde_json::Value,
    /// The row's tenant, if tenant-scoped.
    pub tenant: Option<String>,
    /// The run that mutated the row.
    pub run_id: Uuid,
    /// Whether that run was a sweep or an erasure.
    pub run_kind: crate::domain::outcome::RunKind,
    /// What the mutation did.
    pub strategy: Strategy,
    /// The work's id: the same for every attempt (a delivery id to make
    /// `on_after` idempotent by).
    pub work_id: i64,
    /// 1 for the first delivery; above 1 the work may already be done, so
    /// handlers must be idempotent.
    pub attempt: u32,
    /// The handler's identity.
    pub handler: String,
    /// Fires at the handler's deadline (9/10 of the claim time-out); the
    /// attempt then fails. Honour it.
    pub cancel: Cancel,
}

/// A side effect for the rows of entity `T`. Both methods are optional.
///
/// ```
/// use cohort::handlers::{AfterContext, BeforeContext, HandlerError, RowHandler};
/// struct ForgetInCrm;
///
/// #[cohort::async_trait]
/// impl RowHandler<(i64, String)> for ForgetInCrm {
///     async fn on_before(&self, row: &(i64, String), ctx: &mut BeforeContext) -> Result<(), HandlerError> {
///         ctx.snapshot.insert("email", row.1.clone())?;
///         Ok(())
///     }
///     async fn on_after(&self, ctx: &AfterContext) -> Result<(), HandlerError> {
///         let _email = ctx.snapshot.get("email");
///         Ok(()) // call the CRM here, idempotently
///     }
/// }
/// ```
#[async_trait::async_trait]
pub trait RowHandler<T: Sync>: Send + Sync + 'static {
    /// Inside the batch transaction, before the mutation: capture only.
    /// An error fails the entity's batch; nothing of it is mutated or
    /// queued.
    async fn on_before(&self, row: &T, ctx: &mut BeforeContext) -> Result<(), HandlerError> {
        let _ = (row, ctx);
        Ok(())
    }

    /// After commit, from the durable queue; at least once.
    async fn on_after(&self, ctx: &AfterContext) -> Result<(), HandlerError> {
        let _ = ctx;
        Ok(())
    }
}

/// How a handler is registered: its entity, stable identity, priority and
/// phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerRegistration {
    pub(crate) entity_id: Uuid,
    pub(crate) identity: String,
    pub(crate) priority: Option<i32>,
    pub(crate) phase: Phase,
    pub(crate) requires_earlier: bool,
}

impl HandlerRegistration {
    /// A handler of the entity with this id, under a stable identity
    /// (queued work is keyed by it: renaming it dead-letters queued work).
    pub fn new(entity_id: Uuid, identity: impl Into<String>) -> Self {
        Self {
            entity_id,
            identity: identity.into(),
            priority: None,
            phase: Phase::Immediate,
            requires_earlier: false,
        }
    }

    /// Runs only after every earlier handler of the same row (lower
    /// priority, then identity) succeeded: an earlier dead letter holds
    /// this work until it is retried and delivered ("archive, then
    /// delete"). By default a handler waits only while earlier work is
    /// pending or in flight, and runs after an earlier dead letter.
    pub fn requires_earlier(mut self, requires: bool) -> Self {
        self.requires_earlier = requires;
        self
    }

    /// Runs before handlers of higher priority numbers (unset: last).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// When its work becomes due (default [`Phase::Immediate`]).
    pub fn phase(mut self, phase: Phase) -> Self {
        self.phase = phase;
        self
    }
}

/// A handler with its row type erased.
#[async_trait::async_trait]
pub(crate) trait ErasedHandler: Send + Sync + 'static {
    async fn before(&self, row: &PgRow, ctx: &mut BeforeContext) -> Result<(), HandlerError>;
    async fn after(&self, ctx: &AfterContext) -> Result<(), HandlerError>;
}

struct Typed<T, H> {
    handler: H,
    _row: std::marker::PhantomData<fn() -> T>,
}

#[async_trait::async_trait]
impl<T, H> ErasedHandler for Typed<T, H>
where
    T: for<'r> sqlx::FromRow<'r, PgRow> + Send + Sync + 'static,
    H: RowHandler<T>,
{
    async fn before(&self, row: &PgRow, ctx: &mut BeforeContext) -> Result<(), HandlerError> {
        let typed = T::from_row(row)?;
        self.handler.on_before(&typed, ctx).await
    }

    async fn after(&self, ctx: &AfterContext) -> Result<(), HandlerError> {
        self.handler.on_after(ctx).await
    }
}

/// A registered handler, ready to run.
#[derive(Clone)]
pub(crate) struct Registered {
    pub(crate) registration: HandlerRegistration,
    pub(crate) handler: Arc<dyn ErasedHandler>,
    /// Columns a policy-file handler captures (checked at validation).
    pub(crate) capture: Vec<String>,
}

impl Registered {
    pub(crate) fn new<T, H>(registration: HandlerRegistration, handler: H) -> Self
    where
        T: for<'r> sqlx::FromRow<'r, PgRow> + Send + Sync + 'static,
        H: RowHandler<T>,
    {
        Self {
            registration,
            handler: Arc::new(Typed {
                handler,
                _row: std::marker::PhantomData,
            }),
            capture: Vec::new(),
        }
    }
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("registration", &self.registration)
            .finish_non_exhaustive()
    }
}

/// Handlers of one entity in delivery order: priority (unset last), then
/// identity.
/// The share of `dispatch.claim_timeout` after which a delivery's cancel
/// fires (its handler's own deadline; a policy handler's `timeout` may not
/// exceed it): well before the claim could expire and the work be
/// reclaimed and run twice at once.
pub(crate) const DELIVERY_SOFT_DEADLINE: f64 = 0.85;

/// The share of `dispatch.claim_timeout` after which a delivery that
/// ignored its cancel is dropped (and a capture abandoned), still before
/// the claim expires.
pub(crate) const DELIVERY_HARD_DEADLINE: f64 = 0.9;

pub(crate) fn ordered(mut handlers: Vec<Registered>) -> Vec<Registered> {
    handlers.sort_by(|a, b| {
        let key = |r: &Registered| {
            (
                r.registration.priority.unwrap_or(i32::MAX),
                r.registration.identity.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    handlers
}
