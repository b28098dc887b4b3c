//! The report as one HTML file: no script, no external resource (a
//! Content-Security-Policy says so to the browser), inline SVG charts,
//! readable on screen and on paper. Every figure sits in a cell whose
//! `data-fact` names it as the CSV does, so the two can be compared.

use std::collections::BTreeMap;

use chrono::{Datelike, NaiveDate};
use cohort::report::{kept_figures, seconds_text, EntityReport, Report};
use maud::{html, Markup, PreEscaped, DOCTYPE};

const STYLE: &str = "
body { font: 14px/1.45 system-ui, -apple-system, 'Segoe UI', sans-serif; color: #1b1f24;
       margin: 2rem auto; max-width: 64rem; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; }
h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #d0d7de; padding-bottom: .2rem; }
h3 { font-size: 1rem; margin: 1.4rem 0 .4rem; }
.meta { color: #57606a; margin: 0 0 1rem; }
table { border-collapse: collapse; margin: .4rem 0 1rem; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #d0d7de; padding: .25rem .55rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
td.n, th.n { text-align: right; }
table.glance td:last-child { color: #57606a; }
td.hash { font-family: ui-monospace, monospace; font-size: 0.85em; word-break: break-all; }
table.wide { font-size: .9em; }
table.wide th, table.wide td { padding: .2rem .35rem; }
.none { color: #57606a; font-style: italic; }
.entity { break-inside: avoid; }
svg text { font: 11px system-ui, sans-serif; fill: #1b1f24; }
.legend span { display: inline-block; margin-right: 1rem; }
.legend i { display: inline-block; width: .8rem; height: .8rem; margin-right: .3rem; vertical-align: -1px; }
@media print { body { margin: 0; max-width: none; font-size: 11px; } h2 { break-after: avoid; }
               table, svg { break-inside: avoid; } }
";

/// Okabe–Ito: told apart with every common colour-vision deficiency.
const PALETTE: [&str; 8] = [
    "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000",
];

fn key(section: &str, owner: (&str, &str, &str), item: &str, measure: &str) -> String {
    [section, owner.0, owner.1, owner.2, item, measure].join("|")
}

/// A figure in a cell that names it.
fn fact(key: String, value: String, numeric: bool) -> Markup {
    html! {
        @if numeric { td.n data-fact=(key) { (value) } }
        @else { td data-fact=(key) { (value) } }
    }
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(T::to_string).unwrap_or_default()
}

fn time(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

pub(super) fn page(report: &Report) -> Markup {
    let none = ("", "", "");
    let scope = report.tenant.as_deref().unwrap_or("all tenants");
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="Content-Security-Policy"
                    content="default-src 'none'; style-src 'unsafe-inline'";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Retention report " (report.from) " to " (report.to) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                h1 { "Retention report" }
                p.meta {
                    "Read from Cohort's ledger on " (time(&report.generated_at))
                    " (database clock). Runs count by when they started, in UTC; dry runs are left out."
                }
                table {
                    tr { th { "From" } (fact(key("report", none, "", "from"), report.from.to_string(), false)) }
                    tr { th { "To (included)" } (fact(key("report", none, "", "to"), report.to.to_string(), false)) }
                    tr {
                        th { "Tenant" }
                        td data-fact=(key("report", none, "", "tenant")) data-value=(opt(&report.tenant)) { (scope) }
                    }
                }

                (glance(report))

                h2 { "Rows changed per month, by category" }
                (chart(report))

                h2 { "Entities" }
                @if report.entities.is_empty() {
                    p.none { "No sweep reached any entity in this period." }
                }
                @for e in &report.entities { (entity(e)) }

                (erasures(report))
                (holds(report))
                (failures(report))
            }
        }
    }
}

fn entity(e: &EntityReport) -> Markup {
    let stage = opt(&e.stage);
    let owner = (e.entity.as_str(), e.category.as_str(), stage.as_str());
    html! {
        section.entity {
            h3 {
                (e.entity) " · " (e.category)
                @if let Some(n) = e.stage { " · stage " (n) }
            }
            table {
                tr { th { "#" } th { "Strategy" } th { "Period" } th { "Legal minimum" } th { "Source" }
                     th { "Reason" } th { "Runs" } th { "Last used" } }
                @for (rank, r) in e.rules.iter().enumerate() {
                    @let item = (rank + 1).to_string();
                    tr {
                        td { (item) }
                        (fact(key("rule", owner, &item, "strategy"), r.strategy.as_str().into(), false))
                        (fact(key("rule", owner, &item, "period"), r.period.to_string(), false))
                        (fact(key("rule", owner, &item, "legal_minimum"), opt(&r.legal_minimum), false))
                        (fact(key("rule", owner, &item, "source"), opt(&r.source), false))
                        (fact(key("rule", owner, &item, "reason"), opt(&r.reason), false))
                        (fact(key("rule", owner, &item, "runs"), r.runs.to_string(), true))
                        (fact(key("rule", owner, &item, "last_used"), time(&r.last_used), false))
                    }
                }
            }
            table {
                tr { th { "Runs" } th { "Succeeded" } th { "Failed" } th { "Last success" } }
                tr {
                    (fact(key("runs", owner, "", "runs"), e.runs.runs.to_string(), true))
                    (fact(key("runs", owner, "", "succeeded"), e.runs.succeeded.to_string(), true))
                    (fact(key("runs", owner, "", "failed"), e.runs.failed.to_string(), true))
                    (fact(key("runs", owner, "", "last_success"),
                        e.runs.last_success.as_ref().map(time).unwrap_or_default(), false))
                }
            }
            @if e.months.is_empty() {
                p.none { "No rows changed in this period." }
            } @else {
                table {
                    tr { th { "Month" } th { "Purged" } th { "Soft-deleted" } th { "Anonymised" } th { "Archived" } }
                    @for m in &e.months {
                        tr {
                            td { (m.month) }
                            @for (measure, n) in [("purged", m.purged), ("soft_deleted", m.soft_deleted),
                                                  ("anonymised", m.anonymised), ("archived", m.archived)] {
                                (fact(key("removed", owner, &m.month, measure), n.to_string(), true))
                            }
                        }
                    }
                }
            }
            (kept_table("kept", owner, "", &e.kept, "Kept at each tenant's last run of the period"))
        }
    }
}

fn kept_table(
    section: &str,
    owner: (&str, &str, &str),
    item: &str,
    kept: &cohort::report::KeptCounts,
    caption: &str,
) -> Markup {
    html! {
        table {
            caption { (caption) }
            tr { th { "Held" } th { "Of which by a subject hold" } th { "Legal minimum" } th { "NULL anchor" }
                 th { "Skipped" } th { "Kept by policy" } }
            tr {
                @for (measure, n) in kept_figures(kept) {
                    (fact(key(section, owner, item, measure), n.to_string(), true))
                }
            }
        }
    }
}

/// The first thing an auditor reads: the period's totals over every
/// entity, what was kept and why, erasures and failures, in one table
/// each. Its figures are sums of the facts below (the cells carry no
/// `data-fact`: the CSV has the parts, not the sums).
fn glance(report: &Report) -> Markup {
    let sum = |f: fn(&cohort::report::MonthCounts) -> u64| -> u64 {
        report
            .entities
            .iter()
            .flat_map(|e| e.months.iter())
            .map(f)
            .sum()
    };
    let removed = sum(|m| m.purged) + sum(|m| m.archived);
    let archived = sum(|m| m.archived);
    let anonymised = sum(|m| m.anonymised);
    let soft_deleted = sum(|m| m.soft_deleted);
    let kept = |f: fn(&cohort::report::KeptCounts) -> u64| -> u64 {
        report.entities.iter().map(|e| f(&e.kept)).sum()
    };
    let failed_runs: u64 = report.failures.iter().map(|f| f.count).sum();
    let x = &report.erasures;
    let erased: u64 = x.requests_served.iter().map(|r| r.removed).sum();
    let t = &x.timeliness;
    let requests = t.on_time + t.late + t.overdue + t.not_yet_due;
    html! {
        h2 id="at-a-glance" { "At a glance" }
        table.glance {
            tr { th { "Removed by sweeps" } td.n data-glance="removed" { (removed) }
                 td { "rows deleted (" (archived) " of them moved to an archive)" } }
            tr { th { "Anonymised by sweeps" } td.n data-glance="anonymised" { (anonymised) } td { "rows scrubbed in place" } }
            tr { th { "Soft-deleted by sweeps" } td.n data-glance="soft_deleted" { (soft_deleted) } td { "rows marked deleted, still stored" } }
            tr { th { "Erased on request" } td.n data-glance="erased" { (erased) }
                 td { "rows deleted or anonymised by erasures, not counted in the three lines above" } }
        }
        table.glance {
            tr { th { "Kept, and why" } th.n { "Rows" } th { "Meaning" } }
            tr { td { "Held" } td.n data-glance="held" { (kept(|k| k.held)) }
                 td { "under a legal hold (" (kept(|k| k.held_by_subject)) " by a hold on a person)" } }
            tr { td { "Legal minimum" } td.n data-glance="legal_minimum" { (kept(|k| k.legal_minimum)) }
                 td { "past the period, inside a minimum retention the law sets" } }
            tr { td { "No anchor" } td.n data-glance="null_anchor" { (kept(|k| k.null_anchor)) }
                 td { "no date to measure age from" } }
            tr { td { "Still referenced" } td.n data-glance="skipped" { (kept(|k| k.skipped)) }
                 td { "another row refers to it; deleting it would fail" } }
            tr { td { "By policy" } td.n data-glance="kept_by_policy" { (kept(|k| k.kept_by_policy)) }
                 td { "the rule keeps it (exempt)" } }
        }
        p {
            "Erasure runs: " strong data-glance="erasures" { (x.requests) }
            " (each attempt at an erasure, requested or not; " (x.failed) " failed"
            @if let Some(m) = x.median_seconds { ", median " (seconds_text(m)) " s" }
            "). Failed runs: " strong data-glance="failures" { (failed_runs) } "."
            " Kept counts are each entity's last run in the period, per tenant."
        }
        p {
            "Erasure requests (with a reference and a due date, live in the period): "
            strong data-glance="requests" { (requests) } ": "
            strong data-glance="requests_on_time" { (t.on_time) } " completed on time, "
            strong data-glance="requests_late" { (t.late) } " late, "
            strong data-glance="requests_overdue" { (t.overdue) } " overdue, "
            (t.not_yet_due) " not yet due."
        }
        (chain(report))
    }
}

/// The ledger's hash chain: whether `cohort verify` passed when the report
/// was read, and the heads to write down (see docs/report.md, "How an
/// auditor checks this report").
fn chain(report: &Report) -> Markup {
    let none = ("", "", "");
    let Some(c) = &report.chain else {
        return html! { p { "The ledger has no hash chain (schema older than 19): nothing here can be checked against it." } };
    };
    let head =
        |h: &Option<cohort::chain::ChainHead>| h.as_ref().map(|h| h.spelling()).unwrap_or_default();
    html! {
        table.glance.chain {
            tr {
                th { "Ledger chain" }
                td data-fact=(key("chain", none, "", "verified")) data-value=(c.verified) {
                    @if c.verified { "verified: intact when this report was read" }
                    @else { strong { "NOT intact" } ": " (c.breaks) " break(s); first: " (c.first_break.as_deref().unwrap_or("")) }
                }
            }
            tr { th { "Breaks" } (fact(key("chain", none, "", "breaks"), c.breaks.to_string(), true)) }
            tr { th { "Head now" } td.hash data-fact=(key("chain", none, "", "head")) { (head(&c.head)) } }
            tr { th { "Head at the period's end" } td.hash data-fact=(key("chain", none, "", "head_at_period_end")) { (head(&c.head_at_period_end)) } }
        }
    }
}

fn erasures(report: &Report) -> Markup {
    let x = &report.erasures;
    let none = ("", "", "");
    let secs = |v: Option<f64>| v.map(seconds_text).unwrap_or_default();
    html! {
        h2 { "Erasure runs" }
        table {
            tr { th { "Requests" } th { "Succeeded" } th { "Failed" } th { "Median (s)" } th { "95th percentile (s)" } }
            tr {
                (fact(key("erasures", none, "", "requests"), x.requests.to_string(), true))
                (fact(key("erasures", none, "", "succeeded"), x.succeeded.to_string(), true))
                (fact(key("erasures", none, "", "failed"), x.failed.to_string(), true))
                (fact(key("erasures", none, "", "median_seconds"), secs(x.median_seconds), true))
                (fact(key("erasures", none, "", "p95_seconds"), secs(x.p95_seconds), true))
            }
        }
        @if !x.requests_served.is_empty() {
            table.wide {
                tr { th { "Run" } th { "Status" } th { "Subject kind" } th { "Started" } th { "Settled" }
                     th { "Seconds" } th { "Erased" }
                     th { "Held" } th { "Of which by a subject hold" } th { "Legal minimum" } th { "NULL anchor" }
                     th { "Skipped" } th { "Kept by policy" } }
                @for r in &x.requests_served {
                    @let id = r.run_id.to_string();
                    tr {
                        // The run's first 8 characters (as `runs show`
                        // takes them), the whole id on hover and in the CSV.
                        td { code title=(id) { (id.get(..8).unwrap_or(&id)) } }
                        (fact(key("erasure", none, &id, "status"), r.status.as_str().into(), false))
                        (fact(key("erasure", none, &id, "subject_kind"), opt(&r.subject_kind), false))
                        (fact(key("erasure", none, &id, "started_at"), time(&r.started_at), false))
                        (fact(key("erasure", none, &id, "settled_at"),
                            r.settled_at.as_ref().map(time).unwrap_or_default(), false))
                        (fact(key("erasure", none, &id, "seconds"), secs(r.seconds), true))
                        (fact(key("erasure", none, &id, "removed"), r.removed.to_string(), true))
                        @for (measure, n) in kept_figures(&r.kept) {
                            (fact(key("erasure", none, &id, measure), n.to_string(), true))
                        }
                    }
                }
            }
        }
        h2 { "Erasure requests and their due dates" }
        @let t = &x.timeliness;
        table {
            tr { th { "On time" } th { "Late" } th { "Overdue" } th { "Not yet due" } }
            tr {
                (fact(key("erasures", none, "", "requests_on_time"), t.on_time.to_string(), true))
                (fact(key("erasures", none, "", "requests_late"), t.late.to_string(), true))
                (fact(key("erasures", none, "", "requests_overdue"), t.overdue.to_string(), true))
                (fact(key("erasures", none, "", "requests_not_yet_due"), t.not_yet_due.to_string(), true))
            }
        }
        @if !x.deadlines.is_empty() {
            p.meta { "Requests opened with a reference (cohort erase --reference) and live in the period; the subject stays in the database." }
            table.wide {
                tr { th { "Reference" } th { "State" } th { "Received" } th { "Due" } th { "Completed" } th { "Met its due date" } }
                @for d in &x.deadlines {
                    @let r = d.reference.as_str();
                    @let timely = match d.timely {
                        cohort::report::Timely::OnTime => "on_time",
                        cohort::report::Timely::Late => "late",
                        cohort::report::Timely::Overdue => "overdue",
                        _ => "not_yet_due",
                    };
                    tr {
                        td { code { (r) } }
                        (fact(key("erasure_request", none, r, "state"), d.state.clone(), false))
                        (fact(key("erasure_request", none, r, "received_at"), time(&d.received_at), false))
                        (fact(key("erasure_request", none, r, "due_at"), time(&d.due_at), false))
                        (fact(key("erasure_request", none, r, "completed_at"),
                            d.completed_at.as_ref().map(time).unwrap_or_default(), false))
                        (fact(key("erasure_request", none, r, "timely"), timely.to_owned(), false))
                    }
                }
            }
        }
    }
}

fn holds(report: &Report) -> Markup {
    let none = ("", "", "");
    html! {
        h2 { "Holds" }
        p.meta { "Counts only: reasons and subjects stay in the database." }
        table {
            tr { th { "On" } th { "Placed" } th { "Released" } th { "Expired" } th { "In force at the end" } }
            @for h in &report.holds {
                tr {
                    td { (h.target) }
                    @for (measure, n) in [("placed", h.placed), ("released", h.released),
                                          ("expired", h.expired), ("in_force", h.in_force)] {
                        (fact(key("holds", none, &h.target, measure), n.to_string(), true))
                    }
                }
            }
        }
    }
}

fn failures(report: &Report) -> Markup {
    html! {
        h2 { "Failures" }
        @if report.failures.is_empty() {
            p.none { "No run failed in this period." }
        } @else {
            table {
                tr { th { "Kind" } th { "Entity" } th { "Code" } th { "Count" } }
                @for f in &report.failures {
                    @let entity = f.entity.as_deref().unwrap_or("");
                    tr {
                        td { (f.kind.as_str()) }
                        td { @if entity.is_empty() { span.none { "the run" } } @else { (entity) } }
                        td { code { (f.code) } }
                        (fact(key("failures", (entity, "", ""), f.kind.as_str(), &f.code), f.count.to_string(), true))
                    }
                }
            }
        }
    }
}

/// Every month of the period, `YYYY-MM`.
fn months(from: NaiveDate, to: NaiveDate) -> Vec<String> {
    let mut out = Vec::new();
    let (mut y, mut m) = (from.year(), from.month());
    while (y, m) <= (to.year(), to.month()) {
        out.push(format!("{y:04}-{m:02}"));
        (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    }
    out
}

/// A round axis maximum at or above `n`: 1, 2 or 5 times a power of ten.
fn nice(n: u64) -> u64 {
    let mut step = 1u64;
    loop {
        for f in [1, 2, 5] {
            if step.saturating_mul(f) >= n {
                return step.saturating_mul(f);
            }
        }
        step = step.saturating_mul(10);
    }
}

/// Rows changed per month, one stacked bar a month, one colour a category.
fn chart(report: &Report) -> Markup {
    let months = months(report.from, report.to);
    let mut by: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for e in &report.entities {
        for m in &e.months {
            let n = m.purged + m.soft_deleted + m.anonymised + m.archived;
            *by.entry(e.category.as_str())
                .or_default()
                .entry(m.month.as_str())
                .or_default() += n;
        }
    }
    let categories: Vec<&str> = by.keys().copied().collect();
    let total = |month: &str| -> u64 {
        by.values()
            .map(|c| c.get(month).copied().unwrap_or(0))
            .sum()
    };
    let top = nice(months.iter().map(|m| total(m)).max().unwrap_or(0).max(1));
    let (left, width, height, bottom) = (56.0, 680.0, 200.0, 34.0);
    let slot = width / months.len() as f64;
    let bar = (slot * 0.7).max(1.0);
    let y = |n: u64| height - (n as f64 / top as f64) * height;
    let label_every = months.len().div_ceil(14);
    // (x, y, height, colour, tooltip) of each stacked segment.
    let mut rects: Vec<(f64, f64, f64, &str, String)> = Vec::new();
    for (i, month) in months.iter().enumerate() {
        let x = left + slot * i as f64 + (slot - bar) / 2.0;
        let mut base = 0u64;
        for (c, category) in categories.iter().enumerate() {
            let n = by[category].get(month.as_str()).copied().unwrap_or(0);
            if n > 0 {
                let colour = PALETTE[c % PALETTE.len()];
                let tip = format!("{category} {month}: {n} rows");
                rects.push((x, y(base + n) + 5.0, y(base) - y(base + n), colour, tip));
                base += n;
            }
        }
    }
    html! {
        @if categories.is_empty() {
            p.none { "No rows changed in this period." }
        } @else {
            svg xmlns="http://www.w3.org/2000/svg" width=(left + width + 10.0) height=(height + bottom + 10.0)
                viewBox=(format!("0 0 {} {}", left + width + 10.0, height + bottom + 10.0))
                role="img" aria-label="Rows changed per month, by category" {
                @for tick in [0, top / 2, top] {
                    line x1=(left) x2=(left + width) y1=(y(tick) + 5.0) y2=(y(tick) + 5.0) stroke="#d0d7de" {}
                    text x=(left - 6.0) y=(y(tick) + 9.0) text-anchor="end" { (tick) }
                }
                @for r in &rects {
                    rect x=(format!("{:.1}", r.0)) y=(format!("{:.1}", r.1)) width=(format!("{bar:.1}"))
                        height=(format!("{:.1}", r.2)) fill=(r.3) { title { (r.4) } }
                }
                @for (i, month) in months.iter().enumerate() {
                    @if i % label_every == 0 {
                        text x=(format!("{:.1}", left + slot * i as f64 + slot / 2.0)) y=(height + 22.0)
                            text-anchor="middle" { (month) }
                    }
                }
            }
            p.legend {
                @for (c, category) in categories.iter().enumerate() {
                    span { i style=(format!("background:{}", PALETTE[c % PALETTE.len()])) {} (category) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn months_cover_the_period_and_axes_are_round() {
        let d = |s: &str| s.parse::<NaiveDate>().unwrap();
        assert_eq!(
            months(d("2025-11-20"), d("2026-02-01")),
            ["2025-11", "2025-12", "2026-01", "2026-02"]
        );
        assert_eq!(months(d("2026-03-01"), d("2026-03-31")), ["2026-03"]);
        assert_eq!(
            [nice(1), nice(3), nice(7), nice(11), nice(480)],
            [1, 5, 10, 20, 500]
        );
    }
}
