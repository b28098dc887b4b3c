//! Runs: the public requests of sweeps and previews (re-exported at the
//! crate root; what they report is `outcome`), and the private machinery
//! behind them: what a run resolves first ([`resolve`]), the work of sweeps
//! and previews ([`sweep`]) and of erasure ([`erasure`]), the executor both
//! share ([`executor`]), and the multi-tenant passes ([`passes`]).

pub(crate) mod batches;
pub(crate) mod capture;
pub(crate) mod counts;
pub(crate) mod erasure;
pub(crate) mod executor;
pub(crate) mod lanes;
pub(crate) mod partitions;
pub(crate) mod passes;
pub(crate) mod recorder;
pub(crate) mod resolve;
pub(crate) mod sizing;
pub(crate) mod status;
pub(crate) mod sweep;
pub(crate) mod work;

use crate::cancel::Cancel;
use chrono::{DateTime, TimeZone, Utc};

pub(crate) use crate::outcome::{failure, logical_now};
pub use crate::outcome::{
    EntityFailure, EntityOutcome, ErasureResult, NotReached, PreviewResult, RunKind, RunStatus,
    SweepResult, Trigger,
};

/// A sweep: one tenant's tenant-scoped entities, or the tenantless ones.
#[derive(Debug, Clone)]
pub struct SweepRequest {
    pub(crate) tenant: Option<String>,
    pub(crate) jurisdiction: Option<String>,
    pub(crate) tags: Option<Vec<String>>,
    pub(crate) now: DateTime<Utc>,
    pub(crate) dry_run: bool,
    pub(crate) trigger: Trigger,
    pub(crate) cancel: Cancel,
    pub(crate) allow_future_now: bool,
    /// Set by the scheduled worker only: the occurrence this run is for.
    pub(crate) occurrence: Option<OccurrencePass>,
}

/// Which pass of which cron occurrence a scheduled run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OccurrencePass {
    /// The occurrence.
    pub(crate) at: DateTime<Utc>,
    /// This pass, from 1.
    pub(crate) pass: i32,
    /// The occurrence's passes.
    pub(crate) passes: i32,
}

impl SweepRequest {
    /// Sweeps the tenant-scoped entities of `tenant` as of `now` (any
    /// offset; normalised to UTC).
    pub fn tenanted<Tz: TimeZone>(tenant: impl Into<String>, now: DateTime<Tz>) -> Self {
        Self::new(Some(tenant.into()), crate::run::logical_now(now))
    }

    /// Sweeps the tenantless entities as of `now`.
    pub fn tenantless<Tz: TimeZone>(now: DateTime<Tz>) -> Self {
        Self::new(None, crate::run::logical_now(now))
    }

    fn new(tenant: Option<String>, now: DateTime<Utc>) -> Self {
        Self {
            tenant,
            jurisdiction: None,
            tags: None,
            now,
            dry_run: false,
            trigger: Trigger::Manual,
            cancel: Cancel::new(),
            allow_future_now: false,
            occurrence: None,
        }
    }

    /// Counts what would change and writes the same audit trail, changing no row.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// The tenant's jurisdiction, passed to the rule provider.
    pub fn jurisdiction(mut self, jurisdiction: impl Into<String>) -> Self {
        self.jurisdiction = Some(jurisdiction.into());
        self
    }

    /// The tenant's tags, passed to the rule provider (a tenant listed in
    /// the directory has its listed tags unless the request gives its own).
    pub fn tags<I, S>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tags = Some(crate::tenants::normalise_tags(
            tags.into_iter().map(Into::into),
        ));
        self
    }

    /// Accepts a `now` later than the database clock for a mutating run.
    /// Refused by default: a future `now` moves every cutoff forward and
    /// mutates rows that are not old enough yet. Dry runs and previews may
    /// look ahead freely.
    pub fn allow_future_now(mut self, allow: bool) -> Self {
        self.allow_future_now = allow;
        self
    }

    /// Cancellation: when the token fires, the open batch is rolled back and
    /// the run settles `Cancelled`.
    pub fn cancellation(mut self, token: Cancel) -> Self {
        self.cancel = token;
        self
    }
}

/// A preview: counts only, nothing written.
#[derive(Debug, Clone)]
pub struct PreviewRequest {
    pub(crate) tenant: Option<String>,
    pub(crate) jurisdiction: Option<String>,
    pub(crate) tags: Option<Vec<String>>,
    pub(crate) now: DateTime<Utc>,
}

impl PreviewRequest {
    /// Previews `tenant`'s tenant-scoped entities.
    pub fn tenanted<Tz: TimeZone>(tenant: impl Into<String>, now: DateTime<Tz>) -> Self {
        Self {
            tenant: Some(tenant.into()),
            jurisdiction: None,
            tags: None,
            now: crate::run::logical_now(now),
        }
    }

    /// Previews the tenantless entities.
    pub fn tenantless<Tz: TimeZone>(now: DateTime<Tz>) -> Self {
        Self {
            tenant: None,
            jurisdiction: None,
            tags: None,
            now: crate::run::logical_now(now),
        }
    }

    /// The tenant's jurisdiction, passed to the rule provider.
    pub fn jurisdiction(mut self, jurisdiction: impl Into<String>) -> Self {
        self.jurisdiction = Some(jurisdiction.into());
        self
    }

    /// The tenant's tags, passed to the rule provider (a tenant listed in
    /// the directory has its listed tags unless the request gives its own).
    pub fn tags<I, S>(mut self, tags: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.tags = Some(crate::tenants::normalise_tags(
            tags.into_iter().map(Into::into),
        ));
        self
    }
}
