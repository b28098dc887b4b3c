//! A report flattened into its figures ([`Report::facts`]), in the order
//! every format shows them.

use chrono::{DateTime, Utc};

use super::{
    kept_figures, seconds_text, ChainEvidence, EntityReport, ErasureReport, ErasureServed, Fact,
    FailureCount, HoldCounts, Report, RequestDeadline, RuleInForce, Timely,
};

fn time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(T::to_string).unwrap_or_default()
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
