//! Runs: the public requests of sweeps and previews (re-exported at the
//! crate root; what they report is `outcome`), and the private machinery
//! behind them: what a run resolves first ([`resolve`]), the work of sweeps
//! and previews ([`sweep`]) and of erasure ([`erasure`]), the executor both
//! share ([`executor`]), and the multi-tenant passes ([`passes`]).

pub(crate) mod batches;
pub(crate) mod capture;
pub(crate) mod chain;
pub(crate) mod counts;
pub(crate) mod ctx;
pub(crate) mod erasure;
pub(crate) mod executor;
pub(crate) mod health;
pub(crate) mod lanes;
pub(crate) mod pacing;
pub(crate) mod partitions;
pub(crate) mod passes;
pub mod peers;
pub(crate) mod recorder;
pub(crate) mod requests;
pub(crate) mod resolve;
pub(crate) mod sizing;
pub(crate) mod status;
pub(crate) mod sweep;
pub(crate) mod work;

use crate::base::cancel::Cancel;
use chrono::{DateTime, TimeZone, Utc};

pub(crate) use crate::domain::outcome::{failure, logical_now};
pub use crate::domain::outcome::{
    EntityFailure, EntityOutcome, ErasureResult, NotReached, PreviewResult, RunKind, RunStatus,
    SweepResult, TableHealth, Trigger,
};

/// A sweep: one tenant's tenant-scoped entities, or the tenantless ones.
#[derive(Debug, Clone)]
pub struct SweepRequest {
    pub(crate) tenancy: crate::domain::tenants::TenantScope,
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
            tenancy: crate::domain::tenants::TenantScope::of(tenant),
            now,
            dry_run: false,
            trigger: Trigger::Manual,
            cancel: Cancel::new(),
            allow_future_now: false,
            occurrence: None,
        }
    }

    crate::domain::tenants::tenancy_builders!();
    crate::domain::outcome::run_builders!();
}

/// A preview: counts only, nothing written.
#[derive(Debug, Clone)]
pub struct PreviewRequest {
    pub(crate) tenancy: crate::domain::tenants::TenantScope,
    pub(crate) now: DateTime<Utc>,
}

impl PreviewRequest {
    /// Previews `tenant`'s tenant-scoped entities.
    pub fn tenanted<Tz: TimeZone>(tenant: impl Into<String>, now: DateTime<Tz>) -> Self {
        Self {
            tenancy: crate::domain::tenants::TenantScope::of(Some(tenant.into())),
            now: crate::run::logical_now(now),
        }
    }

    /// Previews the tenantless entities.
    pub fn tenantless<Tz: TimeZone>(now: DateTime<Tz>) -> Self {
        Self {
            tenancy: crate::domain::tenants::TenantScope::of(None),
            now: crate::run::logical_now(now),
        }
    }

    crate::domain::tenants::tenancy_builders!();
}
