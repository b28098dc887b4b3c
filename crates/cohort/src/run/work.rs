//! What the run executor's parts share: one entity's work (its rule and
//! planned statements with their bound values), what a run is, why an
//! entity stopped (the run's context is in `ctx.rs`).

use crate::base::cancel::Cancel;
use chrono::{DateTime, Utc};

use super::{RunKind, Trigger};
use crate::base::diagnostic::Diagnostic;
use crate::domain::model::EntityDescriptor;
use crate::domain::rules::RetentionRule;
use crate::error::is_connection_error;
use crate::sql::{RunParam, Scope, SweepStatements};
use std::sync::Arc;

/// One entity's share of a run: its rule and the statements to run.
/// Every statement takes the entity id as `$1`.
#[derive(Clone)]
pub(crate) struct Work<'a> {
    pub(crate) entity: &'a EntityDescriptor,
    pub(crate) rule: RetentionRule,
    /// The stage's position when the category has stages (1 first).
    pub(crate) stage: Option<u16>,
    /// The cutoff reported and stored (`None`: erasure without a legal minimum).
    pub(crate) cutoff: Option<DateTime<Utc>>,
    /// Where a legal minimum keeps rows the period alone would let go:
    /// the period's own cutoff (the rows anchored between the sweep's
    /// cutoff and it are counted as kept by the legal minimum), or, in a
    /// stage measured from a marker with a floor, the stage's cutoff.
    /// `None`: nothing is kept by a legal minimum (and for erasure, which
    /// counts its own).
    pub(crate) period_cutoff: Option<DateTime<Utc>>,
    /// The statements, as the plan built them for the strategy (an
    /// erasure builds its own: `lock`, `lock_after`, `mutate`, `counts`).
    pub(crate) statements: Arc<SweepStatements>,
    /// Which rows its statements take.
    pub(crate) scope: Scope,
    /// The rows of each batch (the first batch's, under `auto_batch`).
    pub(crate) batch_size: i64,
    /// `sweep_batch_size = "auto"`: each batch's limit comes from the
    /// measured time of the batches before ([`super::sizing::Sizer`]).
    pub(crate) auto_batch: bool,
    /// The connections this work is swept on at once (1: the run's own
    /// alone); with more, `ranges` splits its candidates into key ranges
    /// each swept with `lock_until` and `lock_after_until`.
    pub(crate) parallelism: u32,
    /// The anonymise literals, rendered for this run (its `now`, its
    /// tenant), bound after the keys: computed once, applied in SQL.
    pub(crate) literals: Vec<RunParam>,
}

impl Work<'_> {
    /// The same sweep work with the row path's cutoff moved earlier (the
    /// reported cutoff and the end-of-entity counts keep the rule's):
    /// partition purge, the only caller, runs for sweeps only.
    pub(super) fn with_row_cutoff(&self, bound: DateTime<Utc>) -> Self {
        Work {
            scope: self.scope.with_cutoff(bound),
            ..self.clone()
        }
    }
}

/// What a run is, apart from its entities.
pub(crate) struct RunSpec {
    pub(crate) kind: RunKind,
    pub(crate) trigger: Trigger,
    pub(crate) dry_run: bool,
    pub(crate) tenant: Option<String>,
    pub(crate) now: DateTime<Utc>,
    pub(crate) cancel: Cancel,
    /// The cron occurrence of a scheduled run, and which of its passes.
    pub(crate) occurrence: Option<super::OccurrencePass>,
    /// An erasure's subject kind, stored on its run.
    pub(crate) erasure_kind: Option<String>,
}

/// Why an entity stopped.
pub(crate) enum Stop {
    /// The entity failed; the run goes on.
    Entity(Diagnostic),
    /// Cancelled: the open batch was rolled back.
    Cancelled,
    /// The run cannot go on (its connection is gone).
    Run(sqlx::Error),
}

pub(crate) fn stop_from(e: sqlx::Error) -> Stop {
    if is_connection_error(&e) {
        Stop::Run(e)
    } else {
        Stop::Entity(Diagnostic::from_sqlx(&e))
    }
}
