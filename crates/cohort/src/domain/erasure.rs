//! Right to erasure: one data subject's rows, on request.
//!
//! Rows match when any of the entity's subject columns (narrowed by the
//! scope's kind, if given) equals the subject exactly, in the tenant, with
//! no active hold, and — only when the rule has a positive legal minimum —
//! an anchor strictly before `now - legal_min` (NULL anchors are then
//! blocked and counted). The ordinary period never delays erasure. The
//! entity's own strategy is applied: purge deletes, anonymise scrubs, soft
//! delete only when the scope opts in (otherwise the request is refused
//! before anything is written). The result accounts for every entity with
//! subject columns for the request: affected, held, kept by the legal
//! minimum, NULL anchor, kept by policy (`exempt`), or not reached and why
//! ([`crate::ErasureResult::not_reached`]).
//!
//! Candidates are locked with `FOR UPDATE` (erasure waits for rows other
//! transactions hold, rather than skipping them); a row whose subject or
//! tenant changed while we waited no longer matches, and the mutation
//! statement re-checks subject, tenant, hold, legal minimum and anchor once
//! more. Runs, batches, audit and failure isolation are those of a sweep.

use crate::base::cancel::Cancel;
use chrono::{DateTime, TimeZone, Utc};

/// Whose data to erase, and how far the request reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErasureScope {
    pub(crate) subject: String,
    pub(crate) kind: Option<String>,
    pub(crate) allow_soft_delete: bool,
    pub(crate) stage: Option<u16>,
}

impl ErasureScope {
    /// Every subject column matching `subject` exactly (uuid, integer or
    /// text, compared in each column's own type).
    pub fn new(subject: impl Into<String>) -> Self {
        Self {
            subject: subject.into(),
            kind: None,
            allow_soft_delete: false,
            stage: None,
        }
    }

    /// Only subject columns declared with this kind (e.g. `user`).
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Accept soft deletion as erasure for categories that soft-delete.
    pub fn allow_soft_delete(mut self, allow: bool) -> Self {
        self.allow_soft_delete = allow;
        self
    }

    /// Erase the way stage `n` (1 first) of each category in stages treats
    /// a row, instead of its last stage (a category without stages has one).
    /// A category with fewer stages refuses the request before anything runs.
    pub fn stage(mut self, n: u16) -> Self {
        self.stage = Some(n);
        self
    }
}

/// An erasure request for one tenant (or the tenantless entities).
#[derive(Debug, Clone)]
pub struct ErasureRequest {
    pub(crate) tenancy: crate::domain::tenants::TenantScope,
    pub(crate) scope: ErasureScope,
    pub(crate) now: DateTime<Utc>,
    pub(crate) dry_run: bool,
    pub(crate) cancel: Cancel,
    pub(crate) allow_future_now: bool,
    pub(crate) terms: Option<crate::domain::erasure_requests::Terms>,
}

impl ErasureRequest {
    /// Erases the subject's rows of `tenant`'s tenant-scoped entities.
    pub fn tenanted<Tz: TimeZone>(
        tenant: impl Into<String>,
        scope: ErasureScope,
        now: DateTime<Tz>,
    ) -> Self {
        Self::new(
            Some(tenant.into()),
            scope,
            crate::domain::outcome::logical_now(now),
        )
    }

    /// Erases the subject's rows of the tenantless entities.
    pub fn tenantless<Tz: TimeZone>(scope: ErasureScope, now: DateTime<Tz>) -> Self {
        Self::new(None, scope, crate::domain::outcome::logical_now(now))
    }

    fn new(tenant: Option<String>, scope: ErasureScope, now: DateTime<Utc>) -> Self {
        Self {
            tenancy: crate::domain::tenants::TenantScope::of(tenant),
            scope,
            now,
            dry_run: false,
            cancel: Cancel::new(),
            allow_future_now: false,
            terms: None,
        }
    }

    /// Opens an erasure request with this reference (unique) and runs it:
    /// the request is followed until it completes (see
    /// [`crate::domain::erasure_requests`]). Due [`DEFAULT_DUE_DAYS`] days after
    /// `now` unless [`due`](Self::due) says otherwise. A reference that
    /// names a request not yet completed, for the same subject, tenant and
    /// kind, runs that request again. Needs the hash key; refused for a dry
    /// run.
    ///
    /// [`DEFAULT_DUE_DAYS`]: crate::domain::erasure_requests::DEFAULT_DUE_DAYS
    pub fn reference(mut self, reference: impl Into<String>) -> Self {
        self.terms.get_or_insert_with(Default::default).reference = reference.into();
        self
    }

    /// When the request is due (with [`reference`](Self::reference)).
    pub fn due(mut self, due: crate::domain::erasure_requests::Due) -> Self {
        self.terms.get_or_insert_with(Default::default).due = Some(due);
        self
    }

    /// Why the request has the due date it has (an extension, a statute).
    pub fn due_reason(mut self, reason: impl Into<String>) -> Self {
        self.terms.get_or_insert_with(Default::default).due_reason = Some(reason.into());
        self
    }

    /// The requester's note, kept with the request.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.terms.get_or_insert_with(Default::default).note = Some(note.into());
        self
    }

    crate::domain::tenants::tenancy_builders!();
    crate::domain::outcome::run_builders!();
}
