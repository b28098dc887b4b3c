//! Sweeping every tenant: the tenant list (the `[[tenant]]` directory, the
//! policy's `tenants_query`, or a list the caller gives), de-duplicated by
//! tenant identity in first-seen order, one sequential pass per tenant
//! (a pass that fails, before or during its run, does not stop the others),
//! then one tenantless pass when there are tenantless entities.
//! Cancellation stops the open pass and every later one. The CLI's
//! `sweep --all-tenants` and the scheduled worker share this.

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{SweepRequest, SweepResult, Trigger};
use crate::cancel::Cancel;
use crate::context::Context;
use crate::error::{Error, ErrorKind, Result};
use crate::policy::TenantEntry;

/// Where the tenants of an all-tenants sweep come from.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TenantSource {
    /// The tenant directory given to the builder (`[[tenant]]` entries).
    Directory,
    /// A query of the policy author's own (`tenants_query`): the first
    /// column is the tenant id (uuid, integer or text), an optional second
    /// text column its jurisdiction. Run as written, read-only.
    Query(String),
    /// The caller's own list.
    List(Vec<TenantEntry>),
}

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

    /// Accepts a `now` later than the database clock (see
    /// [`crate::SweepRequest::allow_future_now`]); refused by default.
    pub fn allow_future_now(mut self, allow: bool) -> Self {
        self.allow_future_now = allow;
        self
    }

    /// Counts and audits without changing rows.
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Cancels the open pass (its batch rolled back) and skips later ones.
    pub fn cancellation(mut self, cancel: Cancel) -> Self {
        self.cancel = cancel;
        self
    }
}

/// A pass that failed before its run existed (e.g. a tenant id that cannot
/// be a tenant, or the database unreachable): nothing was written for it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct PassFailure {
    /// The tenant as listed (`None`: the tenantless pass).
    pub tenant: Option<String>,
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
    /// Tenants listed more than once with different jurisdictions (the
    /// first listing won).
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

/// The tenants of `source`, each checked to be a valid tenant id of the
/// tenant columns' type (what `cohort validate` runs on a tenants query).
pub(crate) async fn checked_tenants(
    cx: &Context,
    source: &TenantSource,
) -> Result<Vec<TenantEntry>> {
    let prepared = cx.prepared().await?;
    let identity = prepared.model.tenant_identity();
    let list = tenant_list(cx, source).await?;
    let bad: Vec<&str> = list
        .iter()
        .filter(|t| identity.canonical(&t.id).is_none())
        .map(|t| t.id.as_str())
        .take(5)
        .collect();
    if !bad.is_empty() {
        return Err(Error::InvalidInput(format!(
            "these tenant ids are not valid for the tenant columns ({identity:?}): {}",
            bad.join(", ")
        )));
    }
    Ok(list)
}

/// Reads the tenant list of `source`.
async fn tenant_list(cx: &Context, source: &TenantSource) -> Result<Vec<TenantEntry>> {
    match source {
        TenantSource::Directory => Ok(cx.tenants.clone()),
        TenantSource::List(list) => Ok(list.clone()),
        TenantSource::Query(sql) => {
            // Read-only: the query can list tenants, never change anything.
            let mut conn = cx.pool.acquire().await?;
            let mut tx = sqlx::Connection::begin_with(
                &mut *conn,
                "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY",
            )
            .await?;
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                .fetch_all(&mut *tx)
                .await?;
            tx.rollback().await?;
            rows.iter().map(tenant_row).collect()
        }
    }
}

/// One row of a tenants query: the id in the tenant column's own type or
/// text, then an optional text jurisdiction.
fn tenant_row(row: &sqlx::postgres::PgRow) -> Result<TenantEntry> {
    let columns = row.len();
    if !(1..=2).contains(&columns) {
        return Err(Error::InvalidInput(format!(
            "tenants_query must return one or two columns (tenant id, then jurisdiction), not {columns}"
        )));
    }
    let id = row
        .try_get::<String, _>(0)
        .or_else(|_| row.try_get::<uuid::Uuid, _>(0).map(|u| u.to_string()))
        .or_else(|_| row.try_get::<i64, _>(0).map(|n| n.to_string()))
        .or_else(|_| row.try_get::<i32, _>(0).map(|n| n.to_string()))
        .or_else(|_| row.try_get::<i16, _>(0).map(|n| n.to_string()))
        .map_err(|_| {
            Error::InvalidInput(
                "the first column of tenants_query must be the tenant id (uuid, integer or text), and not NULL"
                    .into(),
            )
        })?;
    let jurisdiction = if columns == 2 {
        row.try_get::<Option<String>, _>(1).map_err(|_| {
            Error::InvalidInput(
                "the second column of tenants_query must be the jurisdiction as text".into(),
            )
        })?
    } else {
        None
    };
    Ok(TenantEntry { id, jurisdiction })
}

/// The passes of an all-tenants operation: each listed tenant once (first
/// listing wins; conflicting duplicates named), then `None` for the
/// tenantless pass when there are tenantless entities. Refused when there
/// are tenant-scoped entities but no tenants.
pub(crate) struct PassList {
    pub(crate) passes: Vec<Option<(String, Option<String>)>>,
    pub(crate) conflicting_duplicates: Vec<String>,
}

/// The sweep request of one pass (a tenant with its jurisdiction, or the
/// tenantless pass) as of `now`.
pub(crate) fn pass_request(
    pass: Option<(String, Option<String>)>,
    now: DateTime<Utc>,
) -> SweepRequest {
    match pass {
        Some((t, j)) => {
            let mut r = SweepRequest::tenanted(t, now);
            r.jurisdiction = j;
            r
        }
        None => SweepRequest::tenantless(now),
    }
}

pub(crate) async fn pass_list(
    cx: &Context,
    prepared: &crate::context::Prepared,
    source: &TenantSource,
) -> Result<PassList> {
    let identity = prepared.model.tenant_identity();
    let listed = tenant_list(cx, source).await?;
    let has_tenanted = prepared.model.entities.iter().any(|e| e.tenant.is_some());
    if has_tenanted && listed.is_empty() {
        return Err(Error::InvalidInput(
            "there are tenant-scoped entities but no tenants to sweep ([[tenant]] entries or tenants_query); \
             an all-tenants sweep would silently sweep none of them"
                .into(),
        ));
    }
    let mut conflicting_duplicates = Vec::new();
    let mut seen: Vec<(String, Option<String>, Option<String>)> = Vec::new();
    for entry in listed {
        let canonical = identity.canonical(&entry.id);
        let first = canonical
            .as_ref()
            .and_then(|c| seen.iter().find(|(_, s, _)| s.as_ref() == Some(c)));
        match first {
            Some((_, _, j)) => {
                if *j != entry.jurisdiction {
                    tracing::warn!(tenant = %entry.id, "tenant listed twice with different jurisdictions; the first listing wins");
                    conflicting_duplicates.push(entry.id.clone());
                }
            }
            None => seen.push((entry.id, canonical, entry.jurisdiction)),
        }
    }
    let tenantless = prepared.model.entities.iter().any(|e| e.tenant.is_none());
    Ok(PassList {
        passes: seen
            .into_iter()
            .map(|(t, _, j)| Some((t, j)))
            .chain(tenantless.then_some(None))
            .collect(),
        conflicting_duplicates,
    })
}

pub(crate) async fn sweep_all(cx: &Context, req: SweepAllRequest) -> Result<SweepAllResult> {
    let prepared = cx.prepared().await?;
    super::resolve::check_now(cx, req.now, !req.dry_run, req.allow_future_now).await?;
    let list = pass_list(cx, &prepared, &req.source).await?;
    let mut result = SweepAllResult {
        conflicting_duplicates: list.conflicting_duplicates,
        ..SweepAllResult::default()
    };
    let run = |tenant: Option<(String, Option<String>)>| {
        let mut r = pass_request(tenant, req.now);
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
        let tenant = pass.as_ref().map(|(t, _)| t.clone());
        match super::sweep::sweep(cx, run(pass)).await {
            Ok(r) => result.passes.push(PassOutcome::Ran(Box::new(r))),
            Err(e) => {
                tracing::error!(tenant = tenant.as_deref().unwrap_or("(tenantless)"), error = %e, "tenant pass failed before its run started");
                result.passes.push(PassOutcome::NotStarted(PassFailure {
                    tenant,
                    kind: e.kind(),
                    error: e.to_string(),
                }));
            }
        }
    }
    Ok(result)
}

/// Previews every pass an all-tenants sweep would make, in the same order;
/// a tenant that cannot be previewed is reported, the others go on.
pub(crate) async fn preview_all(
    cx: &Context,
    source: TenantSource,
    now: DateTime<Utc>,
) -> Result<Vec<std::result::Result<super::PreviewResult, PassFailure>>> {
    let prepared = cx.prepared().await?;
    let list = pass_list(cx, &prepared, &source).await?;
    let mut out = Vec::new();
    for pass in list.passes {
        let tenant = pass.as_ref().map(|(t, _)| t.clone());
        let req = match pass {
            Some((t, j)) => {
                let mut r = super::PreviewRequest::tenanted(t, now);
                r.jurisdiction = j;
                r
            }
            None => super::PreviewRequest::tenantless(now),
        };
        out.push(
            super::sweep::preview(cx, req)
                .await
                .map_err(|e| PassFailure {
                    tenant,
                    kind: e.kind(),
                    error: e.to_string(),
                }),
        );
    }
    Ok(out)
}
