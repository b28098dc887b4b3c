//! The printed results: a text table or one JSON document.

use std::fmt::Write as _;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::scenario::{KEY_DESCRIPTION, PERIOD_DAYS};

/// What Cohort does per run that the baseline does not; printed with every result.
const NOTES: [&str; 5] = [
    "The reference (ref) is the in-server way of SPEC 15: a PL/pgSQL procedure \
     looping one fused lock-and-mutate statement per batch with COMMIT, continuing \
     after the previous batch's last (created_at, id) like Cohort, and inserting one \
     row detail per changed row in the same statement when the category asks for \
     per-row audit (anonymise here; Cohort writes them too) into Cohort's detail \
     table. vs ref = Cohort rows/s / reference rows/s; the SPEC 15 target is >= 0.90. \
     The plain reference (plain) writes those details into a table without keys, \
     indexes or foreign keys instead (the strongest loop; the same as ref where \
     no per-row detail is written); vs plain = Cohort rows/s / its rows/s.",
    "The baseline writes no audit at all. Cohort's timing includes its run row \
     (insert + settle), the entity summary (insert + final update), one progress \
     update per batch, and a run-level advisory lock (take + release).",
    "Cohort, the reference and the baseline all lock and mutate a batch in one \
     statement: WITH c AS (SELECT ctid ... FOR UPDATE SKIP LOCKED) DELETE/UPDATE \
     ... WHERE ctid = ANY (ARRAY(SELECT ... FROM c)), a TID scan. Cohort's also \
     re-checks, in a fresh snapshot, holds written since its own snapshot \
     (retention_hold_recent, one index range) and returns the batch's last row \
     for its cursor; it falls back to a second statement only when such a hold \
     exists or a locked row was not changed.",
    "Cohort also counts the tenant's remaining held and NULL-anchor rows after \
     its batches (through the active holds' keys and the anchor index). It runs \
     as `cohort sweep` does, without a metrics exporter, so it does not read the \
     backlog for cohort_entity_backlog_age_seconds after its batches (a worker \
     with --metrics-addr does; its cost is in docs/performance.md).",
    "Same batch size, same index, same hold test, one transaction per batch, one \
     connection each; validation, connecting and statement preparation are \
     excluded (untimed warm-up on a small table of the same name first); \
     autovacuum off on the benchmark database's tables and a CHECKPOINT after \
     seeding, before each timed side.",
];

/// The run's parameters.
#[derive(Debug, Clone)]
pub(crate) struct Parameters {
    /// Rows per table.
    pub(crate) rows: u64,
    /// Batch size.
    pub(crate) batch: u32,
    /// Whether Cohort sized its own batches (`sweep_batch_size = "auto"`).
    pub(crate) auto_batch: bool,
    /// Tenants.
    pub(crate) tenants: u32,
    /// `SHOW server_version`.
    pub(crate) server_version: String,
    /// The tenant swept.
    pub(crate) swept_tenant: Uuid,
    /// Logical now of the sweeps.
    pub(crate) now: DateTime<Utc>,
    /// The cutoff.
    pub(crate) cutoff: DateTime<Utc>,
}

/// One strategy's timings.
#[derive(Debug, Clone)]
pub(crate) struct Measurement {
    /// Strategy label.
    pub(crate) label: &'static str,
    /// Rows changed (equal for Cohort and the baseline: verified).
    pub(crate) affected: u64,
    /// Eligible rows kept by holds.
    pub(crate) held: u64,
    /// Rows of the swept tenant in the table.
    pub(crate) tenant_rows: u64,
    /// Cohort's wall-clock seconds.
    pub(crate) cohort_seconds: f64,
    /// The baseline's wall-clock seconds.
    pub(crate) baseline_seconds: f64,
    /// The in-server reference's wall-clock seconds.
    pub(crate) reference_seconds: f64,
    /// The plain reference's (details into a plain table) seconds.
    pub(crate) plain_reference_seconds: f64,
    /// Each run's (Cohort, reference) seconds, in the order they ran.
    pub(crate) runs: Vec<(f64, f64)>,
}

/// The middle value (the mean of the two middle ones for an even count).
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

impl Measurement {
    /// Several runs of one strategy as one: each side's median seconds,
    /// and every run kept (`runs` is not empty; every run changed the
    /// same rows, as `measure` verified against the same seed).
    pub(crate) fn median(runs: Vec<Measurement>) -> Measurement {
        let first = runs.first().expect("one run at least").clone();
        let of = |f: fn(&Measurement) -> f64| median(runs.iter().map(f).collect());
        Measurement {
            cohort_seconds: of(|m| m.cohort_seconds),
            baseline_seconds: of(|m| m.baseline_seconds),
            reference_seconds: of(|m| m.reference_seconds),
            plain_reference_seconds: of(|m| m.plain_reference_seconds),
            runs: runs.iter().flat_map(|m| m.runs.iter().copied()).collect(),
            ..first
        }
    }

    /// Each run's Cohort rows/s over the reference's (the same rows: its
    /// seconds over Cohort's).
    fn run_ratios(&self) -> Vec<f64> {
        self.runs
            .iter()
            .map(|&(cohort, reference)| {
                if cohort > 0.0 {
                    reference / cohort
                } else {
                    0.0
                }
            })
            .collect()
    }

    fn cohort_rate(&self) -> f64 {
        rate(self.affected, self.cohort_seconds)
    }

    fn baseline_rate(&self) -> f64 {
        rate(self.affected, self.baseline_seconds)
    }

    fn reference_rate(&self) -> f64 {
        rate(self.affected, self.reference_seconds)
    }

    /// Cohort throughput over the in-server reference's.
    fn reference_ratio(&self) -> f64 {
        let r = self.reference_rate();
        if r > 0.0 {
            self.cohort_rate() / r
        } else {
            0.0
        }
    }

    fn plain_reference_rate(&self) -> f64 {
        rate(self.affected, self.plain_reference_seconds)
    }

    /// Cohort throughput over the plain reference's.
    fn plain_reference_ratio(&self) -> f64 {
        let r = self.plain_reference_rate();
        if r > 0.0 {
            self.cohort_rate() / r
        } else {
            0.0
        }
    }

    /// Cohort's microseconds per changed row.
    pub(crate) fn cohort_us_per_row(&self) -> f64 {
        if self.affected > 0 {
            self.cohort_seconds * 1e6 / self.affected as f64
        } else {
            0.0
        }
    }

    /// Cohort throughput over baseline throughput.
    fn ratio(&self) -> f64 {
        let b = self.baseline_rate();
        if b > 0.0 {
            self.cohort_rate() / b
        } else {
            0.0
        }
    }
}

fn rate(rows: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        rows as f64 / seconds
    } else {
        0.0
    }
}

/// Everything printed.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    /// Parameters.
    pub(crate) parameters: Parameters,
    /// One per strategy.
    pub(crate) measurements: Vec<Measurement>,
}

impl Report {
    /// A human-readable table with the parameters and notes.
    pub(crate) fn to_table(&self) -> String {
        let p = &self.parameters;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "cohort-bench: rows={} batch={}{} tenants={} postgresql={}",
            p.rows,
            p.batch,
            if p.auto_batch { " (Cohort: auto)" } else { "" },
            p.tenants,
            p.server_version
        );
        let _ = writeln!(
            out,
            "key: {KEY_DESCRIPTION}; index (tenant_id, created_at); period {PERIOD_DAYS}d; \
             one tenant swept ({}), ~60% of rows past the cutoff, ~1% of its eligible rows held",
            p.swept_tenant
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<12} {:>9} {:>6} {:>9} {:>11} {:>9} {:>11} {:>8} {:>9} {:>8} {:>9} {:>11} {:>7}",
            "strategy",
            "affected",
            "held",
            "cohort s",
            "cohort r/s",
            "ref s",
            "ref r/s",
            "vs ref",
            "plain s",
            "vs plain",
            "base s",
            "base r/s",
            "ratio"
        );
        for m in &self.measurements {
            let _ = writeln!(
                out,
                "{:<12} {:>9} {:>6} {:>9.3} {:>11.0} {:>9.3} {:>11.0} {:>8.2} {:>9.3} {:>8.2} {:>9.3} {:>11.0} {:>7.2}",
                m.label,
                m.affected,
                m.held,
                m.cohort_seconds,
                m.cohort_rate(),
                m.reference_seconds,
                m.reference_rate(),
                m.reference_ratio(),
                m.plain_reference_seconds,
                m.plain_reference_ratio(),
                m.baseline_seconds,
                m.baseline_rate(),
                m.ratio()
            );
        }
        if self.measurements.iter().any(|m| m.runs.len() > 1) {
            let _ = writeln!(out);
            let _ = writeln!(
                out,
                "Each side's median of {} runs; vs ref of each run, in order:",
                self.measurements[0].runs.len()
            );
            for m in &self.measurements {
                let each: Vec<String> = m.run_ratios().iter().map(|r| format!("{r:.2}")).collect();
                let _ = writeln!(out, "{:<12} {}", m.label, each.join(" "));
            }
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "ratio = Cohort rows/s / baseline rows/s (1.00 = as fast as the hand-written loop)."
        );
        for note in NOTES {
            let _ = writeln!(out, "- {note}");
        }
        out
    }

    /// The same as one JSON document.
    pub(crate) fn to_json(&self) -> Value {
        let p = &self.parameters;
        json!({
            "parameters": {
                "rows": p.rows,
                "batch": p.batch,
                "cohort_batch": if p.auto_batch { json!("auto") } else { json!(p.batch) },
                "tenants": p.tenants,
                "postgresql_version": p.server_version,
                "key": KEY_DESCRIPTION,
                "index": "(tenant_id, created_at)",
                "period_days": PERIOD_DAYS,
                "swept_tenant": p.swept_tenant,
                "now": p.now.to_rfc3339_opts(SecondsFormat::Secs, true),
                "cutoff": p.cutoff.to_rfc3339_opts(SecondsFormat::Secs, true),
            },
            "results": self.measurements.iter().map(|m| json!({
                "strategy": m.label,
                "rows_affected": m.affected,
                "held": m.held,
                "tenant_rows": m.tenant_rows,
                "cohort_seconds": m.cohort_seconds,
                "cohort_rows_per_second": m.cohort_rate(),
                "baseline_seconds": m.baseline_seconds,
                "baseline_rows_per_second": m.baseline_rate(),
                "ratio": m.ratio(),
                "reference_seconds": m.reference_seconds,
                "reference_rows_per_second": m.reference_rate(),
                "ratio_to_reference": m.reference_ratio(),
                "plain_reference_seconds": m.plain_reference_seconds,
                "plain_reference_rows_per_second": m.plain_reference_rate(),
                "ratio_to_plain_reference": m.plain_reference_ratio(),
                "cohort_us_per_row": m.cohort_us_per_row(),
                "runs": m.runs.iter().zip(m.run_ratios()).map(|(&(cohort, reference), ratio)| json!({
                    "cohort_seconds": cohort,
                    "reference_seconds": reference,
                    "ratio_to_reference": ratio,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "ratio": "Cohort rows/s divided by baseline rows/s",
            "notes": NOTES,
        })
    }
}
