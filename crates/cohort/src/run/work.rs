//! What the run executor's parts share: one entity's work (its rule and
//! planned statements with their bound values), what a run is, why an
//! entity stopped, and the run's context.

use crate::cancel::Cancel;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::Postgres;
use uuid::Uuid;

use super::{RunKind, Trigger};
use crate::context::{Context, Prepared};
use crate::diagnostic::Diagnostic;
use crate::error::is_connection_error;
use crate::model::EntityDescriptor;
use crate::rules::RetentionRule;
use crate::sql::{BindKey, KeyValue, SweepStatements};
use std::sync::Arc;

/// A bound value of a planned statement.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    Key(KeyValue),
    Time(DateTime<Utc>),
    /// A time that may be absent (a stage's legal-minimum floor).
    OptTime(Option<DateTime<Utc>>),
    /// A lock statement's batch limit (bound as `int8`): wherever it sits
    /// in a work's `lock_args`, [`with_limit`] and [`limit_of`] find it.
    Limit(i64),
}

/// `args` with `limit` bound in place of their batch limit.
pub(crate) fn with_limit(args: &[Arg], limit: i64) -> Vec<Arg> {
    args.iter()
        .map(|a| match a {
            Arg::Limit(_) => Arg::Limit(limit),
            other => other.clone(),
        })
        .collect()
}

/// The batch limit bound in `args`, if they hold one.
pub(crate) fn limit_of(args: &[Arg]) -> Option<i64> {
    args.iter().find_map(|a| match a {
        Arg::Limit(n) => Some(*n),
        _ => None,
    })
}

impl Arg {
    fn bind<'q>(&self, q: Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> {
        match self {
            Arg::Key(k) => k.bind(q),
            Arg::Time(t) => q.bind(*t),
            Arg::OptTime(t) => q.bind(*t),
            Arg::Limit(n) => q.bind(*n),
        }
    }
}

pub(crate) fn bind_all<'q>(
    mut q: Query<'q, Postgres, PgArguments>,
    args: &[Arg],
) -> Query<'q, Postgres, PgArguments> {
    for a in args {
        q = a.bind(q);
    }
    q
}

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
    /// The statements, as the plan built them for the strategy (an
    /// erasure builds its own: `lock`, `lock_after`, `mutate`, `counts`).
    pub(crate) statements: Arc<SweepStatements>,
    /// Whether `lock_after`'s cursor starts with the anchor (a sweep's,
    /// whose `lock` returns it second) or is the key alone (an erasure's).
    pub(crate) cursor_anchor: bool,
    pub(crate) lock_args: Vec<Arg>,
    /// `sweep_batch_size = "auto"`: each batch's limit comes from the
    /// measured time of the batches before ([`super::sizing::Sizer`]),
    /// bound in place of the limit in `lock_args` ([`with_limit`]).
    pub(crate) auto_batch: bool,
    /// The connections this work is swept on at once (1: the run's own
    /// alone); with more, `ranges` splits its candidates into key ranges
    /// each swept with `lock_until` and `lock_after_until`.
    pub(crate) parallelism: u32,
    /// Bound after the rows by the mutations: literals, custom values,
    /// then these.
    pub(crate) mutate_args: Vec<Arg>,
    /// The anonymise literals, rendered for this run (its `now`, its
    /// tenant), bound after the keys: computed once, applied in SQL.
    pub(crate) literals: Vec<RunParam>,
    /// Bound after the entity id by `counts`, `counts_after` and
    /// `backlog`.
    pub(crate) count_args: Vec<Arg>,
}

impl Work<'_> {
    /// The same sweep work with the row path's cutoff moved earlier (the
    /// reported cutoff and the end-of-entity counts keep the rule's). A
    /// sweep binds its cutoff first in `lock_args` and `mutate_args`;
    /// partition purge, the only caller, runs for sweeps only.
    pub(super) fn with_row_cutoff(&self, bound: DateTime<Utc>) -> Self {
        let earlier = |args: &[Arg]| -> Vec<Arg> {
            let mut args = args.to_vec();
            if let Some(first @ Arg::Time(_)) = args.first_mut() {
                *first = Arg::Time(bound);
            }
            args
        };
        Work {
            lock_args: earlier(&self.lock_args),
            mutate_args: earlier(&self.mutate_args),
            ..self.clone()
        }
    }
}

/// A value of the anonymise statement computed for this run.
#[derive(Debug, Clone)]
pub(crate) enum RunParam {
    /// A rendered literal.
    Text(String),
    /// A per-run anonymiser's value: `{column: value}`.
    Json(serde_json::Value),
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

pub(crate) struct RunCtx<'a> {
    pub(crate) cx: &'a Context,
    pub(crate) ready: &'a Prepared,
    pub(crate) run_id: Uuid,
    pub(crate) spec: &'a RunSpec,
}
