//! The evidence of retention for a period (`cohort report`), read from the
//! ledger alone: the rules in force, the runs, the rows removed per month
//! and the rows kept and why, the erasure requests served, the holds and
//! the failures.
//!
//! [`Report::facts`] flattens a report into one list of figures; the CLI's
//! CSV is that list and its HTML shows every one of them, so the formats
//! cannot disagree.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;
use sqlx::postgres::types::PgInterval;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use crate::context::Context;
use crate::domain::rules::{Period, Strategy};
use crate::error::{Error, Result};
use crate::run::{RunKind, RunStatus};
use crate::sql::report::{self as statements, Window};

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

fn time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(T::to_string).unwrap_or_default()
}

/// Seconds as the report prints them: milliseconds, no more.
pub fn seconds_text(s: f64) -> String {
    format!("{s:.3}")
}

impl Report {
    /// Every figure of the report, in a fixed order.
    pub fn facts(&self) -> Vec<Fact> {
        let mut out = Facts::default();
        out.period(self);
        for e in &self.entities {
            out.entity(e);
        }
        out.erasures(&self.erasures);
        for r in &self.erasures.requests_served {
            out.erasure(r);
        }
        for d in &self.erasures.deadlines {
            out.deadline(d);
        }
        out.holds(&self.holds);
        out.failures(&self.failures);
        if let Some(c) = &self.chain {
            out.chain(c);
        }
        out.0
    }
}

/// Where a figure sits: entity, category and stage (each empty where none).
type Owner<'a> = (&'a str, &'a str, String);

/// The owner of a figure that belongs to no entity.
fn no_owner() -> Owner<'static> {
    ("", "", String::new())
}

/// The owner of an entity's figures.
fn entity_owner(e: &EntityReport) -> Owner<'_> {
    (e.entity.as_str(), e.category.as_str(), opt(&e.stage))
}

/// Seconds as text, empty when unknown.
fn seconds_or_empty(v: Option<f64>) -> String {
    v.map(seconds_text).unwrap_or_default()
}

/// The figures of a report, in the order [`Report::facts`] lists them.
#[derive(Default)]
struct Facts(Vec<Fact>);

impl Facts {
    /// Adds one figure.
    fn push(
        &mut self,
        section: &'static str,
        owner: Owner<'_>,
        item: String,
        measure: &str,
        value: String,
    ) {
        self.0.push(Fact {
            section,
            entity: owner.0.to_owned(),
            category: owner.1.to_owned(),
            stage: owner.2,
            item,
            measure: measure.to_owned(),
            value,
        })
    }

    /// The period and the tenant the report covers.
    fn period(&mut self, report: &Report) {
        self.push(
            "report",
            no_owner(),
            String::new(),
            "from",
            report.from.to_string(),
        );
        self.push(
            "report",
            no_owner(),
            String::new(),
            "to",
            report.to.to_string(),
        );
        self.push(
            "report",
            no_owner(),
            String::new(),
            "tenant",
            opt(&report.tenant),
        );
    }

    /// The chain's heads and whether it verified.
    fn chain(&mut self, c: &ChainEvidence) {
        let head = |h: &Option<crate::domain::chain::ChainHead>| {
            h.as_ref().map(|h| h.spelling()).unwrap_or_default()
        };
        for (measure, value) in [
            ("head", head(&c.head)),
            ("head_at_period_end", head(&c.head_at_period_end)),
            ("verified", c.verified.to_string()),
            ("breaks", c.breaks.to_string()),
        ] {
            self.push("chain", no_owner(), String::new(), measure, value);
        }
    }

    /// One entity's figures: its rules, runs, rows removed per month and rows kept.
    fn entity(&mut self, e: &EntityReport) {
        for (rank, r) in e.rules.iter().enumerate() {
            self.rule(e, rank, r);
        }
        self.runs(e);
        for m in &e.months {
            for (measure, n) in [
                ("purged", m.purged),
                ("soft_deleted", m.soft_deleted),
                ("anonymised", m.anonymised),
                ("archived", m.archived),
            ] {
                self.push(
                    "removed",
                    entity_owner(e),
                    m.month.clone(),
                    measure,
                    n.to_string(),
                );
            }
        }
        for (measure, n) in kept_figures(&e.kept) {
            self.push(
                "kept",
                entity_owner(e),
                String::new(),
                measure,
                n.to_string(),
            );
        }
    }

    /// One rule an entity's runs resolved, its item the rank (from 1).
    fn rule(&mut self, e: &EntityReport, rank: usize, r: &RuleInForce) {
        let owner = || entity_owner(e);
        let item = (rank + 1).to_string();
        self.push(
            "rule",
            owner(),
            item.clone(),
            "strategy",
            r.strategy.as_str().into(),
        );
        self.push(
            "rule",
            owner(),
            item.clone(),
            "period",
            r.period.to_string(),
        );
        self.push(
            "rule",
            owner(),
            item.clone(),
            "legal_minimum",
            opt(&r.legal_minimum),
        );
        self.push("rule", owner(), item.clone(), "source", opt(&r.source));
        self.push("rule", owner(), item.clone(), "reason", opt(&r.reason));
        self.push("rule", owner(), item.clone(), "runs", r.runs.to_string());
        self.push("rule", owner(), item, "last_used", time(&r.last_used));
    }

    /// The sweeps that reached an entity.
    fn runs(&mut self, e: &EntityReport) {
        let owner = || entity_owner(e);
        let runs = &e.runs;
        self.push(
            "runs",
            owner(),
            String::new(),
            "runs",
            runs.runs.to_string(),
        );
        self.push(
            "runs",
            owner(),
            String::new(),
            "succeeded",
            runs.succeeded.to_string(),
        );
        self.push(
            "runs",
            owner(),
            String::new(),
            "failed",
            runs.failed.to_string(),
        );
        let last = runs.last_success.as_ref().map(time).unwrap_or_default();
        self.push("runs", owner(), String::new(), "last_success", last);
    }

    /// The erasure requests served, counted, and their timing.
    fn erasures(&mut self, x: &ErasureReport) {
        self.push(
            "erasures",
            no_owner(),
            String::new(),
            "requests",
            x.requests.to_string(),
        );
        self.push(
            "erasures",
            no_owner(),
            String::new(),
            "succeeded",
            x.succeeded.to_string(),
        );
        self.push(
            "erasures",
            no_owner(),
            String::new(),
            "failed",
            x.failed.to_string(),
        );
        self.push(
            "erasures",
            no_owner(),
            String::new(),
            "median_seconds",
            seconds_or_empty(x.median_seconds),
        );
        self.push(
            "erasures",
            no_owner(),
            String::new(),
            "p95_seconds",
            seconds_or_empty(x.p95_seconds),
        );
        let t = &x.timeliness;
        for (measure, n) in [
            ("requests_on_time", t.on_time),
            ("requests_late", t.late),
            ("requests_overdue", t.overdue),
            ("requests_not_yet_due", t.not_yet_due),
        ] {
            self.push(
                "erasures",
                no_owner(),
                String::new(),
                measure,
                n.to_string(),
            );
        }
    }

    /// One erasure request with a reference, its item the reference.
    fn deadline(&mut self, d: &RequestDeadline) {
        let timely = match d.timely {
            Timely::OnTime => "on_time",
            Timely::Late => "late",
            Timely::Overdue => "overdue",
            Timely::NotYetDue => "not_yet_due",
        };
        let completed = d.completed_at.as_ref().map(time).unwrap_or_default();
        for (measure, value) in [
            ("state", d.state.clone()),
            ("received_at", time(&d.received_at)),
            ("due_at", time(&d.due_at)),
            ("completed_at", completed),
            ("timely", timely.to_owned()),
        ] {
            self.push(
                "erasure_request",
                no_owner(),
                d.reference.clone(),
                measure,
                value,
            );
        }
    }

    /// One erasure request, its item the run id.
    fn erasure(&mut self, r: &ErasureServed) {
        let id = r.run_id.to_string();
        self.push(
            "erasure",
            no_owner(),
            id.clone(),
            "status",
            r.status.as_str().into(),
        );
        self.push(
            "erasure",
            no_owner(),
            id.clone(),
            "subject_kind",
            opt(&r.subject_kind),
        );
        self.push(
            "erasure",
            no_owner(),
            id.clone(),
            "started_at",
            time(&r.started_at),
        );
        let settled = r.settled_at.as_ref().map(time).unwrap_or_default();
        self.push("erasure", no_owner(), id.clone(), "settled_at", settled);
        self.push(
            "erasure",
            no_owner(),
            id.clone(),
            "seconds",
            seconds_or_empty(r.seconds),
        );
        self.push(
            "erasure",
            no_owner(),
            id.clone(),
            "removed",
            r.removed.to_string(),
        );
        for (measure, n) in kept_figures(&r.kept) {
            self.push("erasure", no_owner(), id.clone(), measure, n.to_string());
        }
    }

    /// The holds of each target kind.
    fn holds(&mut self, holds: &[HoldCounts]) {
        for h in holds {
            for (measure, n) in [
                ("placed", h.placed),
                ("released", h.released),
                ("expired", h.expired),
                ("in_force", h.in_force),
            ] {
                self.push(
                    "holds",
                    no_owner(),
                    h.target.clone(),
                    measure,
                    n.to_string(),
                );
            }
        }
    }

    /// The failures, by run kind, entity and code.
    fn failures(&mut self, failures: &[FailureCount]) {
        for f in failures {
            let owner = (f.entity.as_deref().unwrap_or(""), "", String::new());
            self.push(
                "failures",
                owner,
                f.kind.as_str().into(),
                &f.code,
                f.count.to_string(),
            );
        }
    }
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

fn count(row: &sqlx::postgres::PgRow, column: &str) -> Result<u64> {
    Ok(row.try_get::<i64, _>(column)?.max(0) as u64)
}

fn period(interval: PgInterval) -> Result<Period> {
    crate::ops::history::period_of(interval)
}

fn kept(row: &sqlx::postgres::PgRow) -> Result<KeptCounts> {
    Ok(KeptCounts {
        held: count(row, "held")?,
        held_by_subject: count(row, "held_by_subject")?,
        legal_minimum: count(row, "legal_minimum")?,
        null_anchor: count(row, "null_anchor")?,
        skipped: count(row, "skipped")?,
        kept_by_policy: count(row, "kept_by_policy")?,
    })
}

/// Linear interpolation between the closest ranks, as PostgreSQL's
/// `percentile_cont`. `sorted` is ascending and not empty.
fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    let position = fraction * (sorted.len() - 1) as f64;
    let below = position.floor() as usize;
    let above = position.ceil() as usize;
    sorted[below] + (sorted[above] - sorted[below]) * (position - below as f64)
}

/// Drops the diagnostic id from a sanitised failure text: what remains is
/// the failure's kind and code, the same for every occurrence.
fn failure_code(text: &str) -> String {
    text.split_whitespace()
        .filter(|w| !w.starts_with("diagnostic_id="))
        .collect::<Vec<_>>()
        .join(" ")
}

type Group = (Uuid, String, Option<i16>);

/// The tenant, canonical, if it is one Cohort knows: in the tenant
/// directory, or in a run or a hold of the ledger. A tenant known nowhere
/// is refused (an empty report for it would say "nothing happened" about
/// a tenant that was probably mistyped).
async fn known_tenant(cx: &Context, tenant: &str) -> Result<String> {
    let canonical = cx.canonical_tenant(tenant).await?;
    let identity = cx.prepared().await?.model.tenant_identity();
    let listed = cx
        .tenants
        .iter()
        .any(|t| identity.canonical(&t.id).as_deref() == Some(canonical.as_str()));
    let seen: bool = statements::tenant_seen(&cx.config.schema, canonical.clone())
        .query_scalar()
        .fetch_one(&cx.pool)
        .await?;
    if listed || seen {
        Ok(canonical)
    } else {
        Err(Error::NotFound(format!(
            "tenant {tenant:?} is in no run, no hold and not in the tenant directory: check its spelling"
        )))
    }
}

fn group(row: &sqlx::postgres::PgRow) -> Result<Group> {
    Ok((
        row.try_get("retention_entity_id")?,
        row.try_get("category")?,
        row.try_get("stage")?,
    ))
}

/// Reads the report `request` asks for from the ledger, every figure from one snapshot.
pub(crate) async fn build(cx: &Context, request: &ReportRequest) -> Result<Report> {
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

/// The chain's heads (now, and at the period's end) and a walk of it.
async fn chain_evidence(cx: &Context, window: &Window) -> Result<Option<ChainEvidence>> {
    let mut conn = cx.pool.acquire().await?;
    let installed = crate::schema::installed_version(&mut conn, &cx.config.schema).await?;
    drop(conn);
    if installed.is_none_or(|v| v < crate::sql::tables::CHAIN_SINCE_VERSION) {
        return Ok(None);
    }
    let walked = crate::ops::verify::verify(cx, None, true).await?;
    let last_instant = window.until - chrono::Duration::microseconds(1);
    let at_end = crate::ops::verify::head(cx, Some(last_instant)).await?;
    Ok(Some(ChainEvidence {
        head: walked.head.clone(),
        head_at_period_end: at_end,
        verified: walked.intact,
        breaks: walked.breaks.len(),
        first_break: walked.first_break().map(|b| b.to_string()),
    }))
}

/// Each entity line's place in the report's list, by its group.
type Index = BTreeMap<Group, usize>;

/// The entity line a per-entity row belongs to (`None`: a line no run reached).
fn owner(index: &Index, row: &sqlx::postgres::PgRow) -> Result<Option<usize>> {
    Ok(index.get(&group(row)?).copied())
}

/// The entity lines, with their rules, rows changed per month and rows kept.
async fn entity_reports(
    conn: &mut PgConnection,
    schema: &str,
    window: &Window,
) -> Result<Vec<EntityReport>> {
    let (mut entities, index) = entity_lines(conn, schema, window).await?;
    add_rules(conn, schema, window, &mut entities, &index).await?;
    add_months(conn, schema, window, &mut entities, &index).await?;
    add_kept(conn, schema, window, &mut entities, &index).await?;
    Ok(entities)
}

/// The entity lines with their run counts, and where each sits in the list.
async fn entity_lines(
    conn: &mut PgConnection,
    schema: &str,
    window: &Window,
) -> Result<(Vec<EntityReport>, Index)> {
    let mut entities = Vec::new();
    let mut index: Index = BTreeMap::new();
    for row in statements::entity_runs(schema, window.clone())
        .query()
        .fetch_all(&mut *conn)
        .await?
    {
        index.insert(group(&row)?, entities.len());
        entities.push(entity_line(&row)?);
    }
    Ok((entities, index))
}

/// One entity line from a row of `entity_runs`.
fn entity_line(row: &sqlx::postgres::PgRow) -> Result<EntityReport> {
    Ok(EntityReport {
        entity_id: row.try_get("retention_entity_id")?,
        entity: row.try_get("entity_type")?,
        category: row.try_get("category")?,
        stage: row
            .try_get::<Option<i16>, _>("stage")?
            .and_then(|n| u16::try_from(n).ok()),
        rules: Vec::new(),
        runs: RunCounts {
            runs: count(row, "runs")?,
            succeeded: count(row, "succeeded")?,
            failed: count(row, "failed")?,
            last_success: row.try_get("last_success")?,
        },
        months: Vec::new(),
        kept: KeptCounts::default(),
    })
}

/// Adds the rules the runs resolved to each entity line.
async fn add_rules(
    conn: &mut PgConnection,
    schema: &str,
    window: &Window,
    entities: &mut [EntityReport],
    index: &Index,
) -> Result<()> {
    for row in statements::entity_rules(schema, window.clone())
        .query()
        .fetch_all(&mut *conn)
        .await?
    {
        let Some(i) = owner(index, &row)? else {
            continue;
        };
        entities[i].rules.push(rule_in_force(&row)?);
    }
    Ok(())
}

/// One rule from a row of `entity_rules`.
fn rule_in_force(row: &sqlx::postgres::PgRow) -> Result<RuleInForce> {
    let strategy: String = row.try_get("strategy")?;
    Ok(RuleInForce {
        strategy: strategy
            .parse::<Strategy>()
            .map_err(|e| Error::Migration(e.to_string()))?,
        period: period(row.try_get("resolved_period")?)?,
        legal_minimum: row
            .try_get::<Option<PgInterval>, _>("legal_min")?
            .map(period)
            .transpose()?,
        source: row.try_get("rule_source")?,
        reason: row.try_get("rule_reason")?,
        runs: count(row, "runs")?,
        last_used: row.try_get("last_used")?,
    })
}

/// Adds the rows changed per month to each entity line.
async fn add_months(
    conn: &mut PgConnection,
    schema: &str,
    window: &Window,
    entities: &mut [EntityReport],
    index: &Index,
) -> Result<()> {
    for row in statements::entity_months(schema, window.clone())
        .query()
        .fetch_all(&mut *conn)
        .await?
    {
        let Some(i) = owner(index, &row)? else {
            continue;
        };
        add_month(&mut entities[i].months, &row)?;
    }
    Ok(())
}

/// Counts a row of `entity_months` into `months` (oldest first; a new month adds a line).
fn add_month(months: &mut Vec<MonthCounts>, row: &sqlx::postgres::PgRow) -> Result<()> {
    let month: String = row.try_get("month")?;
    if months.last().is_none_or(|m| m.month != month) {
        months.push(MonthCounts {
            month,
            purged: 0,
            soft_deleted: 0,
            anonymised: 0,
            archived: 0,
        });
    }
    let m = months.last_mut().expect("pushed");
    let n = count(row, "affected")?;
    let strategy: String = row.try_get("strategy")?;
    match strategy.parse::<Strategy>() {
        Ok(Strategy::Purge) => m.purged += n,
        Ok(Strategy::SoftDelete) => m.soft_deleted += n,
        Ok(Strategy::Anonymise) => m.anonymised += n,
        Ok(Strategy::Archive) => m.archived += n,
        _ => {}
    }
    Ok(())
}

/// Sets the rows kept, and why, on each entity line.
async fn add_kept(
    conn: &mut PgConnection,
    schema: &str,
    window: &Window,
    entities: &mut [EntityReport],
    index: &Index,
) -> Result<()> {
    for row in statements::entity_kept(schema, window.clone())
        .query()
        .fetch_all(&mut *conn)
        .await?
    {
        let Some(i) = owner(index, &row)? else {
            continue;
        };
        entities[i].kept = kept(&row)?;
    }
    Ok(())
}

/// Each erasure request of the period, oldest first.
async fn erasures_served(
    conn: &mut PgConnection,
    schema: &str,
    window: &Window,
) -> Result<Vec<ErasureServed>> {
    let mut served = Vec::new();
    for row in statements::erasures(schema, window.clone())
        .query()
        .fetch_all(&mut *conn)
        .await?
    {
        served.push(erasure_served(&row)?);
    }
    Ok(served)
}

/// One erasure request from a row of `erasures`.
fn erasure_served(row: &sqlx::postgres::PgRow) -> Result<ErasureServed> {
    let status: String = row.try_get("status")?;
    let status = RunStatus::parse(&status)
        .ok_or_else(|| Error::Migration(format!("unknown run status {status:?}")))?;
    let started_at: DateTime<Utc> = row.try_get("started_at")?;
    let settled_at: Option<DateTime<Utc>> = row.try_get("settled_at")?;
    Ok(ErasureServed {
        run_id: row.try_get("run_id")?,
        status,
        subject_kind: row.try_get("erasure_subject_kind")?,
        started_at,
        settled_at,
        seconds: settled_at
            .map(|s| (s - started_at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6),
        removed: count(row, "affected")?,
        kept: kept(row)?,
    })
}

/// The erasure requests with a reference live in the period, each judged
/// against its due date at `end` (the period's end, or the report's time
/// when that is earlier).
async fn request_deadlines(
    conn: &mut PgConnection,
    schema: &str,
    window: &Window,
    end: DateTime<Utc>,
) -> Result<Vec<RequestDeadline>> {
    let mut out = Vec::new();
    for row in statements::request_deadlines(schema, window.clone())
        .query()
        .fetch_all(&mut *conn)
        .await?
    {
        let due_at: DateTime<Utc> = row.try_get("due_at")?;
        let completed_at: Option<DateTime<Utc>> = row.try_get("completed_at")?;
        let timely = match completed_at {
            Some(done) if done <= due_at => Timely::OnTime,
            Some(_) => Timely::Late,
            None if due_at < end => Timely::Overdue,
            None => Timely::NotYetDue,
        };
        out.push(RequestDeadline {
            reference: row.try_get("reference")?,
            state: row.try_get("state")?,
            received_at: row.try_get("received_at")?,
            due_at,
            completed_at,
            timely,
        });
    }
    Ok(out)
}

fn timeliness(deadlines: &[RequestDeadline]) -> Timeliness {
    let n = |t: Timely| deadlines.iter().filter(|d| d.timely == t).count() as u64;
    Timeliness {
        on_time: n(Timely::OnTime),
        late: n(Timely::Late),
        overdue: n(Timely::Overdue),
        not_yet_due: n(Timely::NotYetDue),
    }
}

/// The erasure requests counted by outcome, with the median and p95 of their durations.
fn erasure_report(served: Vec<ErasureServed>) -> ErasureReport {
    let mut durations: Vec<f64> = served.iter().filter_map(|r| r.seconds).collect();
    durations.sort_by(f64::total_cmp);
    ErasureReport {
        requests: served.len() as u64,
        succeeded: served
            .iter()
            .filter(|r| r.status == RunStatus::Succeeded)
            .count() as u64,
        failed: served
            .iter()
            .filter(|r| {
                matches!(
                    r.status,
                    RunStatus::Failed | RunStatus::PartiallyFailed | RunStatus::Cancelled
                )
            })
            .count() as u64,
        median_seconds: (!durations.is_empty()).then(|| percentile(&durations, 0.5)),
        p95_seconds: (!durations.is_empty()).then(|| percentile(&durations, 0.95)),
        requests_served: served,
        deadlines: Vec::new(),
        timeliness: Timeliness::default(),
    }
}

/// Holds on records and on subjects (a line for each, zero when none).
async fn hold_counts(
    conn: &mut PgConnection,
    schema: &str,
    window: &Window,
) -> Result<Vec<HoldCounts>> {
    let mut holds: Vec<HoldCounts> = ["record", "subject"]
        .into_iter()
        .map(|target| HoldCounts {
            target: target.to_owned(),
            placed: 0,
            released: 0,
            expired: 0,
            in_force: 0,
        })
        .collect();
    for row in statements::holds(schema, window.clone())
        .query()
        .fetch_all(&mut *conn)
        .await?
    {
        let target: String = row.try_get("target")?;
        if let Some(h) = holds.iter_mut().find(|h| h.target == target) {
            h.placed = count(&row, "placed")?;
            h.released = count(&row, "released")?;
            h.expired = count(&row, "expired")?;
            h.in_force = count(&row, "in_force")?;
        }
    }
    Ok(holds)
}

/// A failure's run kind (`sweep` or `erasure`), entity and sanitised code.
type FailureKey = (&'static str, Option<String>, String);

/// How many times each failure occurred in the period.
async fn failure_tally(
    conn: &mut PgConnection,
    schema: &str,
    window: Window,
) -> Result<BTreeMap<FailureKey, u64>> {
    let mut failures: BTreeMap<FailureKey, u64> = BTreeMap::new();
    for row in statements::failures(schema, window)
        .query()
        .fetch_all(&mut *conn)
        .await?
    {
        let (kind, entity, codes) = failure_codes(&row)?;
        for code in codes {
            *failures.entry((kind, entity.clone(), code)).or_default() += 1;
        }
    }
    Ok(failures)
}

/// A failure row's run kind, entity (`None`: the run's own error) and failure codes.
fn failure_codes(
    row: &sqlx::postgres::PgRow,
) -> Result<(&'static str, Option<String>, Vec<String>)> {
    let kind: String = row.try_get("kind")?;
    let kind = if kind == "erasure" {
        "erasure"
    } else {
        "sweep"
    };
    let entity: Option<String> = row.try_get("entity")?;
    let error: String = row.try_get("error")?;
    let codes: Vec<String> = if entity.is_some() {
        vec![failure_code(&error)]
    } else {
        // A run's own error text lists its entities' failures first
        // ("entity <id>: …", counted from their summaries), then its
        // own ("run: …"), or is a single reason.
        error
            .split("; ")
            .filter(|part| !part.starts_with("entity "))
            .map(|part| failure_code(part.strip_prefix("run: ").unwrap_or(part)))
            .collect()
    };
    Ok((kind, entity, codes))
}

/// The tallied failures as the report lists them.
fn failure_counts(failures: BTreeMap<FailureKey, u64>) -> Vec<FailureCount> {
    failures
        .into_iter()
        .map(|((kind, entity, code), count)| FailureCount {
            kind: if kind == "erasure" {
                RunKind::Erasure
            } else {
                RunKind::Sweep
            },
            entity,
            code,
            count,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_postgres() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.5);
        assert!((percentile(&v, 0.95) - 3.85).abs() < 1e-9);
        assert_eq!(percentile(&[7.0], 0.95), 7.0);
    }

    #[test]
    fn failure_codes_drop_the_diagnostic_id() {
        assert_eq!(
            failure_code(
                "kind=database code=23503 diagnostic_id=5c1e0a5e-0000-4000-8000-000000000000"
            ),
            "kind=database code=23503"
        );
        assert_eq!(failure_code("cancelled"), "cancelled");
    }

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
