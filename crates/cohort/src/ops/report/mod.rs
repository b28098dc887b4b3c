//! The evidence of retention for a period (`cohort report`), read from the
//! ledger alone: the rules in force, the runs, the rows removed per month
//! and the rows kept and why, the erasure requests served, the holds and
//! the failures.
//!
//! [`Report::facts`] flattens a report into one list of figures; the CLI's
//! CSV is that list and its HTML shows every one of them, so the formats
//! cannot disagree.

mod facts;
mod read;

use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::context::Ready;
use crate::domain::rules::{Period, Strategy};
use crate::error::{Error, Result};
use crate::run::{RunKind, RunStatus};
use crate::sql::report::{self as statements, Window};

use self::read::{
    chain_evidence, entity_reports, erasure_report, erasures_served, failure_counts, failure_tally,
    hold_counts, known_tenant, request_deadlines, timeliness,
};

/// The period (whole UTC days, both ends included) and tenant a report
/// covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportRequest {
    from: NaiveDate,
    to: NaiveDate,
    tenant: Option<String>,
}

impl ReportRequest {
    /// The days `from` to `to`, both included. `from` after `to` is
    /// refused when the report is built.
    pub fn new(from: NaiveDate, to: NaiveDate) -> Self {
        ReportRequest {
            from,
            to,
            tenant: None,
        }
    }

    /// Only this tenant's runs, and the holds that reach it (its own and
    /// the tenantless ones). Any spelling of the id the tenant columns'
    /// type accepts (checking it validates the handle).
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    fn window(&self, tenant: Option<String>) -> Result<Window> {
        if self.from > self.to {
            return Err(Error::InvalidInput(format!(
                "a report's period must not end before it starts ({} is after {})",
                self.from, self.to
            )));
        }
        let until = self.to.succ_opt().ok_or_else(|| {
            Error::InvalidInput(format!("{} is past the last date Cohort can use", self.to))
        })?;
        let start = |d: NaiveDate| d.and_hms_opt(0, 0, 0).map(|t| t.and_utc());
        Ok(Window {
            from: start(self.from).expect("midnight exists"),
            until: start(until).expect("midnight exists"),
            tenant,
        })
    }
}

/// What the ledger says about one period.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// First day covered.
    pub from: NaiveDate,
    /// Last day covered.
    pub to: NaiveDate,
    /// The one tenant covered, or `None` for all.
    pub tenant: Option<String>,
    /// When the report was read from the ledger (database clock).
    pub generated_at: DateTime<Utc>,
    /// One line per entity, category and stage that a sweep reached.
    pub entities: Vec<EntityReport>,
    /// Erasure requests served.
    pub erasures: ErasureReport,
    /// Holds on records and holds on subjects.
    pub holds: Vec<HoldCounts>,
    /// Failures, by sanitised code.
    pub failures: Vec<FailureCount>,
    /// The ledger's hash chain when the report was read: its heads and
    /// whether `verify` passed (`None` on a ledger older than schema 19).
    pub chain: Option<ChainEvidence>,
}

/// The ledger's hash chain as a report states it: the head an auditor
/// writes down (and later gives `cohort verify --head`), and whether the
/// chain verified when the report was read.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ChainEvidence {
    /// The newest link when the report was read: it stands for every
    /// record linked before it, the period's included.
    pub head: Option<crate::domain::chain::ChainHead>,
    /// The newest link linked by the end of the period.
    pub head_at_period_end: Option<crate::domain::chain::ChainHead>,
    /// `cohort verify` found the chain intact when the report was read.
    pub verified: bool,
    /// Breaks found (none when verified).
    pub breaks: usize,
    /// The first break, in words.
    pub first_break: Option<String>,
}

/// One entity, category and stage over the period.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct EntityReport {
    /// Durable entity id.
    pub entity_id: Uuid,
    /// Display name.
    pub entity: String,
    /// Retention category.
    pub category: String,
    /// The stage, for a category retained in stages.
    pub stage: Option<u16>,
    /// Every rule the runs resolved, the one used last first (a tenant
    /// override or a policy change shows as a further line).
    pub rules: Vec<RuleInForce>,
    /// The sweeps that reached it.
    pub runs: RunCounts,
    /// Rows changed per calendar month (UTC), oldest first; months with
    /// none are left out.
    pub months: Vec<MonthCounts>,
    /// Rows kept, and why, as each tenant's last run in the period counted
    /// them.
    pub kept: KeptCounts,
}

/// A rule as the runs resolved it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RuleInForce {
    /// Strategy.
    pub strategy: Strategy,
    /// Retention period.
    pub period: Period,
    /// Legal minimum, when one applied.
    pub legal_minimum: Option<Period>,
    /// Where the rule came from (policy, provider, override).
    pub source: Option<String>,
    /// The provider's reason, when it gave one.
    pub reason: Option<String>,
    /// Runs that used it.
    pub runs: u64,
    /// When it was last used.
    pub last_used: DateTime<Utc>,
}

/// Sweeps that reached an entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RunCounts {
    /// Runs that reached it.
    pub runs: u64,
    /// Runs that finished it without an error.
    pub succeeded: u64,
    /// Runs that failed on it.
    pub failed: u64,
    /// Settlement of the last run that finished it, in the period.
    pub last_success: Option<DateTime<Utc>>,
}

/// Rows changed in one calendar month, by what was done to them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MonthCounts {
    /// `YYYY-MM`, UTC.
    pub month: String,
    /// Rows deleted.
    pub purged: u64,
    /// Rows soft-deleted.
    pub soft_deleted: u64,
    /// Rows anonymised.
    pub anonymised: u64,
    /// Rows moved to the archive table.
    pub archived: u64,
}

/// Rows kept although past their cutoff, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeptCounts {
    /// Kept by an active hold (record or subject).
    pub held: u64,
    /// Of `held`, kept by a hold on a subject.
    pub held_by_subject: u64,
    /// Kept because the legal minimum had not passed.
    pub legal_minimum: u64,
    /// Kept because the anchor is NULL.
    pub null_anchor: u64,
    /// Left although eligible (still referenced, or set aside by a hook).
    pub skipped: u64,
    /// Kept by the policy (an erasure's exempt entity, a rule that keeps).
    pub kept_by_policy: u64,
}

/// Erasure requests served in the period.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ErasureReport {
    /// Requests.
    pub requests: u64,
    /// Requests that settled as succeeded.
    pub succeeded: u64,
    /// Requests that failed, partially failed or were cancelled.
    pub failed: u64,
    /// Median time from start to settlement, in seconds (settled requests).
    pub median_seconds: Option<f64>,
    /// 95th percentile of that time (linear interpolation, as PostgreSQL's
    /// `percentile_cont`).
    pub p95_seconds: Option<f64>,
    /// Each request, oldest first.
    pub requests_served: Vec<ErasureServed>,
    /// The erasure requests with a reference live during the period
    /// (received before its end, not completed before its start), oldest
    /// first, each with whether it met its due date.
    pub deadlines: Vec<RequestDeadline>,
    /// Of those, how many met, missed, are past or are not yet at their
    /// due date.
    pub timeliness: Timeliness,
}

/// Whether an erasure request met its due date.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Timely {
    /// Completed on or before its due date.
    OnTime,
    /// Completed after its due date.
    Late,
    /// Not completed, and its due date passed before the period's end (or
    /// before the report, for a period not over yet).
    Overdue,
    /// Not completed, not yet due.
    NotYetDue,
}

/// One erasure request's deadline, as the report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RequestDeadline {
    /// Its reference.
    pub reference: String,
    /// Its state when the report was written.
    pub state: String,
    /// Received.
    pub received_at: DateTime<Utc>,
    /// Due.
    pub due_at: DateTime<Utc>,
    /// Completed.
    pub completed_at: Option<DateTime<Utc>>,
    /// Whether it met its due date.
    pub timely: Timely,
}

/// The requests of [`ErasureReport::deadlines`] by [`Timely`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Timeliness {
    /// Completed on time.
    pub on_time: u64,
    /// Completed late.
    pub late: u64,
    /// Past due, not completed.
    pub overdue: u64,
    /// Not yet due.
    pub not_yet_due: u64,
}

/// One erasure request. The subject is never in the ledger: its kind is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ErasureServed {
    /// The erasure run's id.
    pub run_id: Uuid,
    /// Its status.
    pub status: RunStatus,
    /// The subject's kind, when the request named one.
    pub subject_kind: Option<String>,
    /// Start.
    pub started_at: DateTime<Utc>,
    /// Settlement.
    pub settled_at: Option<DateTime<Utc>>,
    /// Start to settlement, in seconds.
    pub seconds: Option<f64>,
    /// Rows erased (deleted or anonymised).
    pub removed: u64,
    /// Rows kept, and why.
    pub kept: KeptCounts,
}

/// Holds of one target kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct HoldCounts {
    /// `record` or `subject`.
    pub target: String,
    /// Placed in the period.
    pub placed: u64,
    /// Released in the period.
    pub released: u64,
    /// Expired in the period (before any release).
    pub expired: u64,
    /// In force at the end of the period.
    pub in_force: u64,
}

/// Failures sharing a sanitised code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct FailureCount {
    /// Sweep or erasure.
    pub kind: RunKind,
    /// The entity that failed, or `None` for a run-level failure.
    pub entity: Option<String>,
    /// The sanitised code (`kind=database code=23503`, `cancelled`, …),
    /// without the diagnostic id.
    pub code: String,
    /// How many times.
    pub count: u64,
}

/// One figure of a report: where it sits and its value as text. The CSV
/// is these rows; the HTML shows each of them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[non_exhaustive]
pub struct Fact {
    /// `report`, `rule`, `runs`, `removed`, `kept`, `erasures`,
    /// `erasure`, `holds` or `failures`.
    pub section: &'static str,
    /// Entity display name (empty where none).
    pub entity: String,
    /// Category (empty where none).
    pub category: String,
    /// Stage (empty where none).
    pub stage: String,
    /// The line within the section: a rule's rank, a month, a run id, a
    /// hold target, a run kind.
    pub item: String,
    /// What is measured.
    pub measure: String,
    /// The figure.
    pub value: String,
}

impl Fact {
    /// A key naming the figure uniquely within its report.
    pub fn key(&self) -> String {
        [
            self.section,
            &self.entity,
            &self.category,
            &self.stage,
            &self.item,
            &self.measure,
        ]
        .join("|")
    }
}

/// Seconds as the report prints them: milliseconds, no more.
pub fn seconds_text(s: f64) -> String {
    format!("{s:.3}")
}

/// The kept figures by name, in the order every format shows them.
pub fn kept_figures(k: &KeptCounts) -> [(&'static str, u64); 6] {
    [
        ("held", k.held),
        ("held_by_subject", k.held_by_subject),
        ("legal_minimum", k.legal_minimum),
        ("null_anchor", k.null_anchor),
        ("skipped", k.skipped),
        ("kept_by_policy", k.kept_by_policy),
    ]
}

/// Reads the report `request` asks for from the ledger, every figure from one snapshot.
pub(crate) async fn build(cx: &Ready<'_>, request: &ReportRequest) -> Result<Report> {
    let tenant = match &request.tenant {
        Some(t) => Some(known_tenant(cx, t).await?),
        None => None,
    };
    let window = request.window(tenant.clone())?;
    let schema = &cx.config.schema;
    let pool = &cx.pool;
    // One snapshot for every statement: the figures agree with each other
    // even while runs settle.
    let mut tx = pool.begin().await?;
    statements::snapshot().query().execute(&mut *tx).await?;
    let generated_at: DateTime<Utc> = statements::generated_at()
        .query_scalar()
        .fetch_one(&mut *tx)
        .await?;
    let entities = entity_reports(&mut tx, schema, &window).await?;
    let mut erasures = erasure_report(erasures_served(&mut tx, schema, &window).await?);
    erasures.deadlines =
        request_deadlines(&mut tx, schema, &window, window.until.min(generated_at)).await?;
    erasures.timeliness = timeliness(&erasures.deadlines);
    let holds = hold_counts(&mut tx, schema, &window).await?;
    let failures = failure_tally(&mut tx, schema, window.clone()).await?;
    tx.commit().await?;
    let chain = chain_evidence(cx, &window).await?;

    Ok(Report {
        from: request.from,
        to: request.to,
        tenant,
        generated_at,
        entities,
        erasures,
        holds,
        failures: failure_counts(failures),
        chain,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_ending_before_it_starts_is_refused() {
        let d = |s: &str| s.parse::<NaiveDate>().unwrap();
        let err = ReportRequest::new(d("2026-02-01"), d("2026-01-31"))
            .window(None)
            .unwrap_err();
        assert!(err.to_string().contains("must not end before"), "{err}");
        let w = ReportRequest::new(d("2026-01-01"), d("2026-01-31"))
            .window(None)
            .unwrap();
        assert_eq!(w.from.to_rfc3339(), "2026-01-01T00:00:00+00:00");
        assert_eq!(w.until.to_rfc3339(), "2026-02-01T00:00:00+00:00");
    }
}
