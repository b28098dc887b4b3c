//! Sweeping every tenant: the tenant list (the `[[tenant]]` directory, the
//! policy's `tenants_query`, or a list the caller gives), de-duplicated by
//! tenant identity in first-seen order, one sequential pass per tenant
//! (a pass that fails, before or during its run, does not stop the others),
//! then one tenantless pass when there are tenantless entities.
//! Cancellation stops the open pass and every later one. The CLI's
//! `sweep --all-tenants` and the scheduled worker share this.

use chrono::{DateTime, Utc};

use super::{SweepRequest, SweepResult, Trigger};
use crate::base::cancel::Cancel;
use crate::context::Ready;
use crate::domain::tenants::TenantEntry;
pub use crate::domain::tenants::TenantSource;
use crate::error::{Error, ErrorKind, Result};

/// A sweep of every tenant and then the tenantless entities.
#[derive(Debug, Clone)]
pub struct SweepAllRequest {
    pub(crate) source: TenantSource,
    pub(crate) now: DateTime<Utc>,
    pub(crate) dry_run: bool,
    pub(crate) trigger: Trigger,
    pub(crate) cancel: Cancel,
    pub(crate) allow_future_now: bool,
}

impl SweepAllRequest {
    /// Sweeps the tenants of `source`, then the tenantless entities, as of
    /// `now` (any time zone; normalised to UTC).
    pub fn new<Tz: chrono::TimeZone>(source: TenantSource, now: DateTime<Tz>) -> Self {
        Self {
            source,
            now: crate::run::logical_now(now),
            dry_run: false,
            trigger: Trigger::Manual,
            cancel: Cancel::new(),
            allow_future_now: false,
        }
    }

    crate::domain::outcome::run_builders!();
}

/// A pass that failed before its run existed (e.g. a tenant id that cannot
/// be a tenant, or the database unreachable): nothing was written for it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PassFailure {
    /// The tenant as listed (`None`: the tenantless pass, or a row of the
    /// tenant source that could not be a tenant, see `position`).
    pub tenant: Option<String>,
    /// For a row of `tenants_query` that could not be a tenant: its
    /// position (1-based) in the query's result. Its value is never shown.
    pub position: Option<u64>,
    /// What kind of error stopped it.
    pub kind: ErrorKind,
    /// The error.
    pub error: String,
}

/// One pass of an all-tenants sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PassOutcome {
    /// The pass ran; its run settled with this result.
    Ran(Box<SweepResult>),
    /// The pass failed before its run existed.
    NotStarted(PassFailure),
}

/// What an all-tenants sweep did, pass by pass, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SweepAllResult {
    /// Every pass that was attempted (passes after a cancellation are not).
    pub passes: Vec<PassOutcome>,
    /// Tenants listed more than once with different jurisdictions or tags
    /// (the first listing won), each named once.
    pub conflicting_duplicates: Vec<String>,
}

impl SweepAllResult {
    /// The runs that ran.
    pub fn runs(&self) -> impl Iterator<Item = &SweepResult> {
        self.passes.iter().filter_map(|p| match p {
            PassOutcome::Ran(r) => Some(r.as_ref()),
            PassOutcome::NotStarted(_) => None,
        })
    }

    /// The passes that failed before their run existed.
    pub fn not_started(&self) -> impl Iterator<Item = &PassFailure> {
        self.passes.iter().filter_map(|p| match p {
            PassOutcome::NotStarted(f) => Some(f),
            PassOutcome::Ran(_) => None,
        })
    }
}

/// A row of the tenant source that cannot be a tenant: where it is and
/// why, never its value (a tenants query may return anything).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct UnusableTenant {
    /// Its position (1-based) in the directory or the query's result.
    pub position: u64,
    /// Why it cannot be a tenant.
    pub reason: String,
}

impl std::fmt::Display for UnusableTenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tenant source row {} cannot be a tenant: {}",
            self.position, self.reason
        )
    }
}

/// The tenants of a source, de-duplicated by tenant identity in
/// first-seen order, and the rows that could not be tenants.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct TenantDiscovery {
    /// Each tenant once, as first listed, with the first listing's
    /// jurisdiction and tags.
    pub tenants: Vec<TenantEntry>,
    /// Rows that could not be tenants; each fails only its own pass.
    pub unusable: Vec<UnusableTenant>,
    /// Tenants listed more than once with different jurisdictions or tags
    /// (the first listing won), each named once.
    pub conflicting_duplicates: Vec<String>,
    /// Rows read in all, duplicates and unusable ones included.
    pub rows: u64,
    /// The position of each of `tenants` in the source (1-based).
    pub(crate) positions: Vec<u64>,
}

/// De-duplicates as entries arrive, in one pass with a hash map: linear
/// in the number of rows.
struct Dedup {
    identity: crate::domain::rules::TenantIdentity,
    first: std::collections::HashMap<String, usize>,
    /// Tenants already reported as conflicting (one warning each).
    warned: std::collections::HashSet<String>,
    out: TenantDiscovery,
}

impl Dedup {
    fn new(identity: crate::domain::rules::TenantIdentity) -> Self {
        Self {
            identity,
            first: std::collections::HashMap::new(),
            warned: std::collections::HashSet::new(),
            out: TenantDiscovery::default(),
        }
    }

    fn push(&mut self, row: std::result::Result<TenantEntry, String>) {
        self.out.rows += 1;
        let position = self.out.rows;
        let mut entry = match row {
            Ok(entry) => entry,
            Err(reason) => return self.unusable(position, reason),
        };
        // However the entry was built (its fields are public), its tags
        // compare as a tenant carries them.
        entry.tags =
            crate::domain::tenants::normalise_tags(std::mem::take(&mut entry.tags).into_iter());
        let Some(canonical) = self.identity.canonical(&entry.id) else {
            let reason = format!(
                "its id is not a valid tenant id for the tenant columns ({})",
                self.identity.column_types()
            );
            return self.unusable(position, reason);
        };
        match self.first.entry(canonical) {
            std::collections::hash_map::Entry::Occupied(seen) => {
                let first = &self.out.tenants[*seen.get()];
                if !first.agrees_with(&entry) && !self.warned.contains(seen.key()) {
                    tracing::warn!(tenant = %entry.id, "tenant listed twice with different jurisdictions or tags; the first listing wins");
                    self.warned.insert(seen.key().clone());
                    self.out.conflicting_duplicates.push(entry.id);
                }
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(self.out.tenants.len());
                self.out.tenants.push(entry);
                self.out.positions.push(position);
            }
        }
    }

    fn unusable(&mut self, position: u64, reason: String) {
        tracing::warn!(position, reason = %reason, "a row of the tenant source cannot be a tenant; only its pass fails");
        crate::domain::telemetry::tenant_row_unusable();
        self.out.unusable.push(UnusableTenant { position, reason });
    }
}

/// Reads the tenants of `source`, streaming a query's rows (never holding
/// them all) and de-duplicating as they arrive. A row that cannot be a
/// tenant is reported, not fatal; a query that cannot run at all (bad SQL,
/// wrong number of columns) is an error.
pub(crate) async fn discover(cx: &Ready<'_>, source: &TenantSource) -> Result<TenantDiscovery> {
    let prepared = cx.plans();
    let mut dedup = Dedup::new(prepared.model.tenant_identity());
    match source {
        TenantSource::Directory => cx.tenants.iter().cloned().for_each(|t| dedup.push(Ok(t))),
        TenantSource::List(list) => list.iter().cloned().for_each(|t| dedup.push(Ok(t))),
        TenantSource::Query(sql) => {
            use futures_util::TryStreamExt;
            // Read-only: the query can list tenants, never change anything.
            let mut conn = cx.pool.acquire().await?;
            let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_ONLY).await?;
            {
                let mut rows = sqlx::query(sqlx::AssertSqlSafe(sql.clone())).fetch(&mut *tx);
                while let Some(row) = rows.try_next().await? {
                    dedup.push(crate::sql::tenants::tenant_row(&row)?);
                }
            }
            tx.rollback().await?;
        }
    }
    Ok(dedup.out)
}

/// One pass of an all-tenants operation, in order. Its JSON form (tagged
/// by `kind`) is what a shared occurrence stores for each pass.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Pass {
    /// A tenant with its jurisdiction and tags.
    Tenant(TenantEntry),
    /// A row of the tenant source that cannot be a tenant, or no tenant at
    /// all while there are tenant-scoped entities: fails only itself.
    Unusable {
        /// The row's position, when it is one.
        position: Option<u64>,
        /// What is wrong.
        reason: String,
    },
    /// The tenantless entities.
    Tenantless,
}

impl Pass {
    fn unusable(u: UnusableTenant) -> Self {
        Pass::Unusable {
            position: Some(u.position),
            reason: u.to_string(),
        }
    }

    /// Why the pass cannot run, as its failure.
    pub(crate) fn failure(&self) -> Option<PassFailure> {
        match self {
            Pass::Unusable { position, reason } => Some(PassFailure {
                tenant: None,
                position: *position,
                kind: ErrorKind::InvalidInput,
                error: reason.clone(),
            }),
            _ => None,
        }
    }
}

/// The passes of an all-tenants operation: each tenant once (first
/// listing wins; conflicting duplicates named), a failing pass for each
/// row that cannot be a tenant (and one when there are tenant-scoped
/// entities but no tenants at all, so that sweeping nothing never looks
/// like success), then the tenantless pass when there are tenantless
/// entities, which always runs.
pub(crate) struct PassList {
    pub(crate) passes: Vec<Pass>,
    pub(crate) conflicting_duplicates: Vec<String>,
}

/// The sweep request of a tenant's pass or the tenantless pass as of `now`
/// (`None` for a pass that cannot run).
pub(crate) fn pass_request(pass: &Pass, now: DateTime<Utc>) -> Option<SweepRequest> {
    match pass {
        Pass::Tenant(t) => {
            let mut r = SweepRequest::tenanted(t.id.clone(), now);
            r.tenancy = crate::domain::tenants::TenantScope::listed(t);
            Some(r)
        }
        Pass::Tenantless => Some(SweepRequest::tenantless(now)),
        Pass::Unusable { .. } => None,
    }
}

pub(crate) async fn pass_list(
    cx: &Ready<'_>,
    prepared: &crate::context::Prepared,
    source: &TenantSource,
) -> Result<PassList> {
    let found = discover(cx, source).await?;
    let has_tenanted = prepared.model.entities.iter().any(|e| e.tenant.is_some());
    let tenantless = prepared.model.entities.iter().any(|e| e.tenant.is_none());
    let mut passes: Vec<Pass> = Vec::with_capacity(found.tenants.len() + found.unusable.len() + 2);
    if has_tenanted && found.tenants.is_empty() && found.unusable.is_empty() {
        passes.push(Pass::Unusable {
            position: None,
            reason: "there are tenant-scoped entities but no tenants to sweep ([[tenant]] entries or tenants_query); none of them was swept".into(),
        });
    }
    // Every pass at its place in the source: tenants and unusable rows alike.
    let mut unusable = found.unusable.into_iter().peekable();
    for (t, at) in found.tenants.into_iter().zip(found.positions) {
        while let Some(u) = unusable.next_if(|u| u.position < at) {
            passes.push(Pass::unusable(u));
        }
        passes.push(Pass::Tenant(t));
    }
    passes.extend(unusable.map(Pass::unusable));
    if tenantless {
        passes.push(Pass::Tenantless);
    }
    Ok(PassList {
        passes,
        conflicting_duplicates: found.conflicting_duplicates,
    })
}

pub(crate) async fn sweep_all(cx: &Ready<'_>, req: SweepAllRequest) -> Result<SweepAllResult> {
    let prepared = cx.plans();
    super::resolve::check_now(cx, req.now, !req.dry_run, req.allow_future_now).await?;
    let list = pass_list(cx, prepared, &req.source).await?;
    let mut result = SweepAllResult {
        conflicting_duplicates: list.conflicting_duplicates,
        ..SweepAllResult::default()
    };
    let run = |mut r: SweepRequest| {
        r.dry_run = req.dry_run;
        r.trigger = req.trigger;
        r.cancel = req.cancel.clone();
        r.allow_future_now = req.allow_future_now;
        r
    };
    for pass in list.passes {
        if req.cancel.is_cancelled() {
            break;
        }
        let Some(request) = pass_request(&pass, req.now) else {
            let failure = pass
                .failure()
                .expect("a pass without a request has a failure");
            tracing::error!(position = failure.position, error = %failure.error, "tenant pass cannot run; the other passes go on");
            result.passes.push(PassOutcome::NotStarted(failure));
            continue;
        };
        let tenant = request.tenancy.tenant.clone();
        match super::sweep::sweep(cx, run(request)).await {
            Ok(r) => result.passes.push(PassOutcome::Ran(Box::new(r))),
            Err(e) => {
                tracing::error!(tenant = tenant.as_deref().unwrap_or("(tenantless)"), error = %e, "tenant pass failed before its run started");
                result.passes.push(PassOutcome::NotStarted(PassFailure {
                    tenant,
                    position: None,
                    kind: e.kind(),
                    error: e.to_string(),
                }));
            }
        }
    }
    Ok(result)
}

/// A preview of every pass an all-tenants sweep would make: the tenants
/// of a source, then the tenantless entities, counted as of `now`.
#[derive(Debug, Clone)]
pub struct PreviewAllRequest {
    pub(crate) source: TenantSource,
    pub(crate) now: DateTime<Utc>,
}

impl PreviewAllRequest {
    /// Previews the tenants of `source`, then the tenantless entities, as
    /// of `now` (any time zone; normalised to UTC).
    pub fn new<Tz: chrono::TimeZone>(source: TenantSource, now: DateTime<Tz>) -> Self {
        Self {
            source,
            now: crate::run::logical_now(now),
        }
    }
}

/// What an all-tenants preview counted, pass by pass, in the order a sweep
/// would take them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PreviewAllResult {
    /// Each pass: its counts, or why it could not be previewed (a tenant
    /// that cannot be one, a rule that could not be resolved for all).
    pub passes: Vec<std::result::Result<super::PreviewResult, PassFailure>>,
    /// Tenants listed more than once with different jurisdictions or tags
    /// (the first listing won), each named once.
    pub conflicting_duplicates: Vec<String>,
}

/// Previews every pass an all-tenants sweep would make, in the same order;
/// a tenant that cannot be previewed is reported, the others go on.
pub(crate) async fn preview_all(
    cx: &Ready<'_>,
    req: PreviewAllRequest,
) -> Result<PreviewAllResult> {
    let prepared = cx.plans();
    let list = pass_list(cx, prepared, &req.source).await?;
    let mut out = PreviewAllResult {
        passes: Vec::with_capacity(list.passes.len()),
        conflicting_duplicates: list.conflicting_duplicates,
    };
    for pass in list.passes {
        let preview = match &pass {
            Pass::Tenant(t) => {
                let mut r = super::PreviewRequest::tenanted(t.id.clone(), req.now);
                r.tenancy = crate::domain::tenants::TenantScope::listed(t);
                r
            }
            Pass::Tenantless => super::PreviewRequest::tenantless(req.now),
            Pass::Unusable { .. } => {
                out.passes
                    .push(Err(pass.failure().expect("unusable passes fail")));
                continue;
            }
        };
        let tenant = preview.tenancy.tenant.clone();
        out.passes.push(
            super::sweep::preview(cx, preview)
                .await
                .map_err(|e| PassFailure {
                    tenant,
                    position: None,
                    kind: e.kind(),
                    error: e.to_string(),
                }),
        );
    }
    Ok(out)
}

/// A single-pass request's tenancy, made whole before anything runs:
/// something of the policy is in scope for it (`resolve::in_scope`), and
/// its jurisdiction and tags are the tenant source's listing
/// ([`listing`]).
pub(crate) async fn scoped(
    cx: &Ready<'_>,
    tenancy: &mut crate::domain::tenants::TenantScope,
    what: &str,
) -> Result<()> {
    super::resolve::in_scope(cx, tenancy.tenant.is_some(), what).await?;
    (tenancy.jurisdiction, tenancy.tags) = listing(
        cx,
        tenancy.tenant.as_deref(),
        tenancy.jurisdiction.take(),
        tenancy.tags.take(),
    )
    .await?;
    Ok(())
}

/// What the handle's tenant source says of one tenant a request names,
/// when that source is a query (`tenants_query`) or the caller's list: a
/// tenant's jurisdiction and tags are what its rules are resolved with,
/// so the request takes them from its listing (a request that says
/// otherwise is refused), and a tenant the source does not list is
/// refused: its rules cannot be resolved safely. With the directory as
/// the source the run reads the listing itself (`Prepared::tenant_facts`).
/// Returns the jurisdiction and tags to run with. The worker's passes
/// come from the source already and do not ask again.
async fn listing(
    cx: &Ready<'_>,
    tenant: Option<&str>,
    jurisdiction: Option<String>,
    tags: Option<Vec<String>>,
) -> Result<(Option<String>, Option<Vec<String>>)> {
    let (
        Some(tenant),
        crate::domain::tenants::TenantSource::Query(_)
        | crate::domain::tenants::TenantSource::List(_),
    ) = (tenant, &cx.tenant_source)
    else {
        return Ok((jurisdiction, tags));
    };
    let wanted = cx.canonical_tenant(tenant).await?;
    let identity = cx.plans().model.tenant_identity();
    let discovered = discover(cx, &cx.tenant_source).await?;
    let Some(listed) = discovered
        .tenants
        .into_iter()
        .find(|t| identity.canonical(&t.id).as_deref() == Some(wanted.as_str()))
    else {
        return Err(Error::InvalidInput(format!(
            "tenant {tenant:?} is not among the tenants {} returns; its jurisdiction is unknown, so its rules cannot be resolved safely",
            match &cx.tenant_source {
                crate::domain::tenants::TenantSource::Query(_) => "tenants_query",
                _ => "the tenant list",
            }
        )));
    };
    let facts = crate::domain::tenants::TenantFacts::merged(
        &wanted,
        Some(&listed),
        jurisdiction.as_deref(),
        tags.as_deref(),
    )?;
    Ok((facts.jurisdiction, Some(facts.tags)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a shared occurrence stores for each pass reads back as the
    /// same pass, and a tenant's id is where the table's `tenant_id`
    /// column takes it from.
    #[test]
    fn passes_round_trip_through_their_stored_form() {
        let mut tenant = TenantEntry::new("t-1");
        tenant.jurisdiction = Some("EU".into());
        tenant.tags = vec!["vip".into()];
        let passes = vec![
            Pass::Tenant(tenant),
            Pass::Unusable {
                position: Some(3),
                reason: "its tenant id is NULL".into(),
            },
            Pass::Tenantless,
        ];
        let stored = serde_json::to_value(&passes).unwrap();
        assert_eq!(stored[0]["kind"], "tenant");
        assert_eq!(stored[0]["id"], "t-1");
        assert_eq!(stored[2], serde_json::json!({"kind": "tenantless"}));
        let read: Vec<Pass> = serde_json::from_value(stored).unwrap();
        assert_eq!(read, passes);
    }
}
