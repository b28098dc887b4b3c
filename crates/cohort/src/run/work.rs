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
use crate::ident::SqlText;
use crate::model::EntityDescriptor;
use crate::rules::RetentionRule;
use crate::sql::{BindKey, KeyValue};

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
pub(crate) struct Work<'a> {
    pub(crate) entity: &'a EntityDescriptor,
    pub(crate) rule: RetentionRule,
    /// The stage's position when the category has stages (1 first).
    pub(crate) stage: Option<u16>,
    /// The cutoff reported and stored (`None`: erasure without a legal minimum).
    pub(crate) cutoff: Option<DateTime<Utc>>,
    /// Locks a batch; returns record keys (and, with `lock_after`, each
    /// row's anchor).
    pub(crate) lock: SqlText,
    /// Locks the next batch after a cursor, the previous batch's last
    /// (anchor, key) or key, bound after `lock_args` (`None`: every batch
    /// uses `lock`).
    pub(crate) lock_after: Option<SqlText>,
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
    /// Reads the key ranges of a parallel sweep (binds `lock_args`, the
    /// number of ranges in place of the limit); `None`: never parallel.
    pub(crate) ranges: Option<SqlText>,
    /// `lock` up to a range's last (anchor, key), bound after `lock_args`.
    pub(crate) lock_until: Option<SqlText>,
    /// `lock_after` up to a range's last (anchor, key), bound after the cursor.
    pub(crate) lock_after_until: Option<SqlText>,
    /// Mutates locked rows; binds keys, literals, custom values, then
    /// `mutate_args`; returns the changed keys as text.
    pub(crate) mutate: SqlText,
    /// `mutate` returning nothing (used when only the count is needed).
    pub(crate) mutate_count: Option<SqlText>,
    /// `mutate` writing the row details itself (per-row audit, handlers);
    /// binds the run id, entity name, tenant text and action after
    /// `mutate_args`.
    pub(crate) mutate_audited: Option<SqlText>,
    pub(crate) mutate_args: Vec<Arg>,
    /// Whether the lock statements return each row's address third and
    /// the mutations bind the batch's addresses in place of its keys
    /// ([`EntityPlan::by_address`](crate::sql::EntityPlan::by_address)).
    pub(crate) by_address: bool,
    /// The batch as one statement (a sweep's, when its plan has one; see
    /// [`crate::sql::Fused`]): binds `lock_args`, the strategy's values as
    /// `mutate` binds them after its rows, the audit values when audited,
    /// then the cursor and the range's end.
    pub(crate) fused: Option<crate::sql::Fused>,
    /// The anonymise literals, rendered for this run (its `now`, its
    /// tenant), bound after the keys: computed once, applied in SQL.
    pub(crate) literals: Vec<RunParam>,
    /// Returns `eligible`, `held`, `null_anchor`.
    pub(crate) counts: SqlText,
    /// `counts` after a real run, through the active holds' keys (bound
    /// after `count_args`); `None`: always `counts`.
    pub(crate) counts_after: Option<SqlText>,
    pub(crate) count_args: Vec<Arg>,
    /// The oldest still-eligible row's anchor, bound like `counts`
    /// (`None`: the work has no backlog, an erasure or a strategy that
    /// changes nothing).
    pub(crate) backlog: Option<SqlText>,
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
            entity: self.entity,
            rule: self.rule.clone(),
            stage: self.stage,
            cutoff: self.cutoff,
            lock: self.lock.clone(),
            lock_after: self.lock_after.clone(),
            cursor_anchor: self.cursor_anchor,
            lock_args: earlier(&self.lock_args),
            auto_batch: self.auto_batch,
            parallelism: self.parallelism,
            ranges: self.ranges.clone(),
            lock_until: self.lock_until.clone(),
            lock_after_until: self.lock_after_until.clone(),
            mutate: self.mutate.clone(),
            mutate_count: self.mutate_count.clone(),
            mutate_audited: self.mutate_audited.clone(),
            mutate_args: earlier(&self.mutate_args),
            by_address: self.by_address,
            fused: self.fused.clone(),
            literals: self.literals.clone(),
            counts: self.counts.clone(),
            counts_after: self.counts_after.clone(),
            backlog: self.backlog.clone(),
            count_args: self.count_args.clone(),
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
