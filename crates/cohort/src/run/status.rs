//! Whether retention keeps up, read from the ledger and the retained
//! tables: the last successful run of each kind, each entity's backlog,
//! rows changed per day and category, the schedule's next occurrence. What
//! the metrics export and the console's runs page shows. Everything here
//! only reads.

use chrono::{DateTime, Utc};

use crate::context::{Context, Ready};
use crate::domain::telemetry::{EntityBacklog, LastSuccess};
use crate::domain::tenants::TenantSource;
use crate::error::{Error, Result};
use crate::sql::history as statements;

/// The last successful real run of each kind, as the ledger has it; also
/// sets `cohort_last_success_timestamp_seconds`.
pub(crate) async fn last_success(cx: &Context) -> Result<LastSuccess> {
    let rows: Vec<(String, Option<DateTime<Utc>>)> = statements::last_success(&cx.config.schema)
        .query_as()
        .fetch_all(&cx.pool)
        .await?;
    let mut last = LastSuccess::default();
    for (kind, at) in rows {
        match kind.as_str() {
            "sweep" => last.sweep = at,
            "erasure" => last.erasure = at,
            other => {
                return Err(Error::Migration(format!(
                    "unknown run kind {other:?} read back"
                )))
            }
        }
    }
    last.record();
    Ok(last)
}

/// Every entity's backlog as of `now` over every pass of `source` (each
/// tenant, then the tenantless entities): per entity the worst pass. A
/// tenant that cannot be read is skipped (its sweep reports it).
pub(crate) async fn backlog(
    cx: &Ready<'_>,
    source: &TenantSource,
    now: DateTime<Utc>,
) -> Result<Vec<EntityBacklog>> {
    let prepared = cx.plans();
    let list = super::passes::pass_list(cx, prepared, source).await?;
    let mut worst: Vec<EntityBacklog> = Vec::new();
    for pass in list.passes {
        let request = match &pass {
            super::passes::Pass::Tenant(t) => {
                let mut r = super::PreviewRequest::tenanted(t.id.clone(), now);
                r.tenancy = crate::domain::tenants::TenantScope::listed(t);
                r
            }
            super::passes::Pass::Tenantless => super::PreviewRequest::tenantless(now),
            super::passes::Pass::Unusable { .. } => continue,
        };
        for b in super::sweep::backlog(cx, request).await? {
            match worst.iter_mut().find(|w| w.entity == b.entity) {
                Some(w)
                    if b.oldest.is_some()
                        && (w.oldest.is_none() || b.age_seconds > w.age_seconds) =>
                {
                    *w = b
                }
                Some(_) => {}
                None => worst.push(b),
            }
        }
    }
    Ok(worst)
}

/// Rows real sweeps changed on one UTC day in one category.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct CategoryDay {
    /// The day (UTC) the runs settled.
    pub day: chrono::NaiveDate,
    /// The retention category.
    pub category: String,
    /// Rows affected (purged, soft-deleted, anonymised or archived).
    pub rows: i64,
}

impl CategoryDay {
    /// One day's rows of one category (for rendering and tests; the
    /// ledger's come from [`crate::Cohort::rows_per_day`]).
    pub fn new(day: chrono::NaiveDate, category: impl Into<String>, rows: i64) -> Self {
        Self {
            day,
            category: category.into(),
            rows,
        }
    }
}

/// Rows changed per UTC day and category over the last `days` days
/// (today included), oldest day first; days without a run are absent.
pub(crate) async fn rows_per_day(cx: &Context, days: u32) -> Result<Vec<CategoryDay>> {
    let today = crate::sql::database_now(&cx.pool).await?.date_naive();
    let first = today - chrono::Days::new(u64::from(days.max(1) - 1));
    let since = first.and_time(chrono::NaiveTime::MIN).and_utc();
    let rows: Vec<(chrono::NaiveDate, String, i64)> =
        statements::rows_per_day(&cx.config.schema, statements::Since(since))
            .query_as()
            .fetch_all(&cx.pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(day, category, rows)| CategoryDay::new(day, category, rows))
        .collect())
}

/// The next occurrence of the configured schedule after the database's
/// clock now (`None`: no schedule, the worker is idle).
pub(crate) async fn next_occurrence(cx: &Context) -> Result<Option<DateTime<Utc>>> {
    let Some(schedule) = cx.config.schedule.as_deref() else {
        return Ok(None);
    };
    let cron = crate::domain::schedule::parse_schedule(schedule)
        .map_err(|e| Error::Config(crate::error::Problems::one(e)))?;
    let now = crate::sql::database_now(&cx.pool).await?;
    Ok(crate::domain::schedule::next_occurrence(&cron, now, None))
}
