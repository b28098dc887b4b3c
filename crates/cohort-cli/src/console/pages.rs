//! The console's pages, as maud templates (escaped by construction). Each
//! takes what the library returns and renders it; none reads anything.

use chrono::{DateTime, Utc};
use cohort::handlers::DeadLetter;
use cohort::history::{CategoryDay, RunLine};
use cohort::holds::Hold;
use cohort::restore::RestoreCheck;
use cohort::settings::{LivePacing, LiveSettings, Setting, SettingValue};
use cohort::telemetry::{EntityBacklog, LastSuccess, QueueDepth};
use cohort::validate::ValidatedModel;
use cohort::{CohortConfig, RunStatus, SweepResult};
use maud::{html, Markup, DOCTYPE};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tab {
    Runs,
    Holds,
    Requests,
    Queue,
    Settings,
    None,
}

fn layout(title: &str, tab: Tab, body: Markup) -> Markup {
    let link = |href: &str, label: &str, this: Tab| {
        html! {
            @if this == tab { a href=(href) aria-current="page" { (label) } }
            @else { a href=(href) { (label) } }
        }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Cohort" }
                link rel="stylesheet" href="/style.css";
            }
            body {
                header {
                    span.brand { "Cohort" }
                    nav {
                        (link("/runs", "Runs", Tab::Runs))
                        (link("/holds", "Holds", Tab::Holds))
                        (link("/erasure-requests", "Erasure requests", Tab::Requests))
                        (link("/queue", "Handler queue", Tab::Queue))
                        (link("/settings", "Settings", Tab::Settings))
                    }
                    span.readonly { "read-only" }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn opt_time(t: Option<DateTime<Utc>>) -> String {
    t.map(time).unwrap_or_else(|| "—".into())
}

/// A duration the way an operator reads it: 850 ms, 12.4 s, 3 min 05 s,
/// 2 h 07 min.
pub(crate) fn duration(from: DateTime<Utc>, to: Option<DateTime<Utc>>) -> String {
    let Some(to) = to else {
        return "running".into();
    };
    let ms = (to - from).num_milliseconds().max(0);
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {:02} s", ms / 60_000, (ms / 1000) % 60),
        _ => format!("{} h {:02} min", ms / 3_600_000, (ms / 60_000) % 60),
    }
}

fn status(s: RunStatus) -> Markup {
    let class = match s {
        RunStatus::Succeeded => "ok",
        RunStatus::Started => "running",
        RunStatus::Cancelled | RunStatus::Paused => "warn",
        _ => "bad",
    };
    html! { span class={"status " (class)} { (s.as_str()) } }
}

/// What the run did to a dead letter's row; a row set aside by a failing
/// `on_before` was left as it was.
fn row_action(action: &str) -> Markup {
    html! {
        @if action == "skipped" {
            span.muted title="a handler's on_before failed for it; the row was not changed and the next run tries it again" { "skipped (unchanged)" }
        } @else {
            (action)
        }
    }
}

fn tenant(t: Option<&str>) -> Markup {
    html! {
        @match t {
            Some(t) => code { (t) },
            None => span.muted { "tenantless" },
        }
    }
}

fn short(id: &uuid::Uuid) -> String {
    id.to_string()[..8].to_string()
}

/// Whether retention keeps up, for the runs page's header: what the
/// worker's metrics say, read by the console itself.
pub(crate) struct Keeping {
    pub(crate) last_success: LastSuccess,
    /// Each entity's backlog, or why it could not be read.
    pub(crate) backlog: Result<Vec<EntityBacklog>, String>,
    /// When the backlog was read (reused for a while: see `BACKLOG_REUSE`).
    pub(crate) backlog_read_at: DateTime<Utc>,
    pub(crate) next_occurrence: Option<DateTime<Utc>>,
    /// Rows per day and category over [`CHART_DAYS`] days ending `today`.
    pub(crate) rows_per_day: Vec<CategoryDay>,
    pub(crate) today: chrono::NaiveDate,
}

/// Days the rows-per-day chart covers, today included.
pub(crate) const CHART_DAYS: u32 = 14;

/// An age the way an operator reads it: 0 s, 42 s, 7 min 05 s, 3 h 07 min,
/// 10 d 05 h.
pub(crate) fn age(seconds: f64) -> String {
    let s = seconds.max(0.0) as i64;
    match s {
        0..60 => format!("{s} s"),
        60..3_600 => format!("{} min {:02} s", s / 60, s % 60),
        3_600..86_400 => format!("{} h {:02} min", s / 3_600, (s / 60) % 60),
        _ => format!("{} d {:02} h", s / 86_400, (s / 3_600) % 24),
    }
}

fn keeping_up(k: &Keeping) -> Markup {
    let behind: Vec<&EntityBacklog> = k
        .backlog
        .as_ref()
        .map(|all| all.iter().filter(|b| b.oldest.is_some()).collect())
        .unwrap_or_default();
    html! {
        section.keeping aria-label="Whether retention keeps up" {
            div.fact {
                span.label { "Last successful sweep" }
                span.value { (opt_time(k.last_success.sweep)) }
            }
            div.fact {
                span.label { "Last successful erasure" }
                span.value { (opt_time(k.last_success.erasure)) }
            }
            div.fact {
                span.label { "Next occurrence" }
                span.value {
                    @match k.next_occurrence {
                        Some(t) => (time(t)),
                        None => span.muted { "no schedule set" },
                    }
                }
            }
            div.fact {
                span.label { "Backlog" }
                span.value {
                    @if let Err(why) = &k.backlog {
                        span.muted { (why) }
                    } @else if behind.is_empty() {
                        span.status.ok { "none" } " " span.muted { "(every eligible row is done)" }
                    } @else {
                        @for b in &behind {
                            span.backlog {
                                span.status.warn { (b.entity) ": " (age(b.age_seconds)) " past its cutoff" }
                                @if let Some(t) = &b.tenant { " " span.muted { "(tenant " code { (t) } ")" } }
                            }
                        }
                    }
                }
                span.muted.read-at { "read " (time(k.backlog_read_at)) "; read again at most every 30 s" }
            }
        }
        (rows_chart(&k.rows_per_day, k.today))
    }
}

/// Fill colours of the chart's categories, in order of first appearance.
const PALETTE: &[&str] = &[
    "#2457c5", "#1f7a3a", "#9a6200", "#8e3bb5", "#b3261e", "#0f7c86", "#5d6678",
];

/// One category's part of a day's bar: y, height, fill, its title.
type Segment<'a> = (f64, f64, &'a str, String);

/// One day's bar: its place among the days, the day, its x, and its
/// segments stacked from the axis up.
type Bar = (usize, chrono::NaiveDate, f64, Vec<Segment<'static>>);

/// The chart's size and margins, in SVG units.
struct ChartBox {
    width: f64,
    height: f64,
    left: f64,
    bottom: f64,
    top: f64,
}

impl ChartBox {
    /// Each day's share of the width right of the axis.
    fn slot(&self) -> f64 {
        (self.width - self.left) / f64::from(CHART_DAYS)
    }

    /// A bar's width: most of its day's slot.
    fn bar(&self) -> f64 {
        self.slot() * 0.7
    }
}

/// The rows chart's box.
const CHART: ChartBox = ChartBox {
    width: 720.0,
    height: 180.0,
    left: 48.0,
    bottom: 24.0,
    top: 8.0,
};

/// The categories of `rows`, in order of first appearance.
fn chart_categories<'a>(rows: &[&'a CategoryDay]) -> Vec<&'a str> {
    let mut categories: Vec<&str> = Vec::new();
    for r in rows {
        if !categories.contains(&r.category.as_str()) {
            categories.push(&r.category);
        }
    }
    categories
}

/// A category's fill: its place among `categories` in the palette.
fn chart_colour(categories: &[&str], c: &str) -> &'static str {
    let i = categories.iter().position(|x| *x == c).unwrap_or(0);
    PALETTE[i % PALETTE.len()]
}

/// Each day's bar, scaled so that `max` rows fill the plot's height.
fn chart_bars(
    days: &[chrono::NaiveDate],
    rows: &[&CategoryDay],
    categories: &[&str],
    max: i64,
) -> Vec<Bar> {
    let ChartBox {
        height,
        left,
        bottom,
        top,
        ..
    } = CHART;
    let plot = height - bottom - top;
    let (slot, bar) = (CHART.slot(), CHART.bar());
    days.iter()
        .enumerate()
        .map(|(i, day)| {
            let x = left + slot * i as f64 + (slot - bar) / 2.0;
            let mut y = height - bottom;
            let segments = rows
                .iter()
                .filter(|r| r.day == *day)
                .map(|r| {
                    let h = plot * r.rows as f64 / max as f64;
                    y -= h;
                    (
                        y,
                        h,
                        chart_colour(categories, &r.category),
                        format!("{}: {} rows on {day}", r.category, r.rows),
                    )
                })
                .collect();
            (i, *day, x, segments)
        })
        .collect()
}

/// The chart's legend: each category's colour and rows in total, or a
/// line saying no real sweep changed a row.
fn chart_legend(rows: &[&CategoryDay], categories: &[&str]) -> Markup {
    html! {
        @if categories.is_empty() {
            p.empty { "No rows changed by a real sweep in these days." }
        } @else {
            ul.legend {
                @for c in categories {
                    li {
                        svg xmlns="http://www.w3.org/2000/svg" width="10" height="10" viewBox="0 0 10 10" aria-hidden="true" {
                            rect width="10" height="10" fill=(chart_colour(categories, c)) {}
                        }
                        " " (c) ": " (rows.iter().filter(|r| r.category == *c).map(|r| r.rows).sum::<i64>())
                    }
                }
            }
        }
    }
}

/// Rows changed per day, stacked by category: an inline SVG (no script,
/// presentation attributes only, every text escaped), each bar segment
/// titled with its figures.
fn rows_chart(rows: &[CategoryDay], today: chrono::NaiveDate) -> Markup {
    let days: Vec<chrono::NaiveDate> = (0..CHART_DAYS)
        .rev()
        .map(|back| today - chrono::Days::new(u64::from(back)))
        .collect();
    let rows: Vec<&CategoryDay> = rows.iter().filter(|r| days.contains(&r.day)).collect();
    let categories = chart_categories(&rows);
    let total = |d: chrono::NaiveDate| {
        rows.iter()
            .filter(|r| r.day == d)
            .map(|r| r.rows)
            .sum::<i64>()
    };
    let max = days.iter().map(|d| total(*d)).max().unwrap_or(0).max(1);
    let bars = chart_bars(&days, &rows, &categories, max);
    let ChartBox {
        width,
        height,
        left,
        bottom,
        top,
    } = CHART;
    let bar = CHART.bar();
    html! {
        figure.chart {
            figcaption { "Rows changed per day by category (real sweeps, last " (CHART_DAYS) " days, UTC)" }
            svg xmlns="http://www.w3.org/2000/svg" role="img" viewBox={"0 0 " (width) " " (height)} width="100%" height=(height) preserveAspectRatio="xMinYMin meet" {
                title { "Rows changed per day by category" }
                line x1=(left) y1=(top) x2=(left) y2=(height - bottom) stroke="#dfe3ea" {}
                line x1=(left) y1=(height - bottom) x2=(width) y2=(height - bottom) stroke="#dfe3ea" {}
                text x=(left - 6.0) y=(top + 10.0) text-anchor="end" font-size="11" fill="#5d6678" { (max) }
                text x=(left - 6.0) y=(height - bottom) text-anchor="end" font-size="11" fill="#5d6678" { "0" }
                @for (i, day, x, segments) in &bars {
                    g {
                        @for (y, h, fill, label) in segments {
                            rect x=(format!("{x:.1}")) y=(format!("{y:.1}")) width=(format!("{bar:.1}")) height=(format!("{h:.1}")) fill=(fill) {
                                title { (label) }
                            }
                        }
                        @if i % 2 == (CHART_DAYS as usize - 1) % 2 {
                            text x=(format!("{:.1}", x + bar / 2.0)) y=(height - 8.0) text-anchor="middle" font-size="10" fill="#5d6678" { (day.format("%m-%d")) }
                        }
                    }
                }
            }
            (chart_legend(&rows, &categories))
        }
    }
}

pub(crate) fn runs(runs: &[RunLine], limit: i64, keeping: &Keeping) -> Markup {
    layout(
        "Recent runs",
        Tab::Runs,
        html! {
            (keeping_up(keeping))
            p.muted { "The " (limit) " most recent runs, newest first. Counts are summed over the run's entities." }
            @if runs.is_empty() {
                p.empty { "No runs recorded yet." }
            } @else {
                table {
                    thead { tr {
                        th { "Run" } th { "Status" } th { "Kind" } th { "Trigger" } th { "Tenant" }
                        th.n { "Affected" } th.n { "Held" } th.n { "Skipped" } th { "Started" } th.n { "Duration" }
                    } }
                    tbody {
                        @for r in runs {
                            tr {
                                td { a href={"/runs/" (r.run_id)} { code { (short(&r.run_id)) } } }
                                td { (status(r.status)) @if r.dry_run { " " span.tag { "dry run" } } }
                                td { (r.kind.as_str()) }
                                td { (r.trigger.as_str()) }
                                td { (tenant(r.tenant.as_deref())) }
                                td.n { (r.affected) }
                                td.n { (r.held) }
                                td.n { (r.skipped) }
                                td { (time(r.started_at)) }
                                td.n { (duration(r.started_at, r.settled_at)) }
                            }
                        }
                    }
                }
            }
        },
    )
}

pub(crate) fn run(r: &SweepResult) -> Markup {
    let title = format!("Run {}", short(&r.run_id));
    layout(
        &title,
        Tab::None,
        html! {
            dl.facts {
                dt { "Run id" } dd { code { (r.run_id) } }
                dt { "Status" } dd { (status(r.status)) @if r.dry_run { " " span.tag { "dry run: no row changed" } } }
                dt { "Kind" } dd {
                    (r.kind.as_str())
                    @if let Some(k) = &r.erasure_kind { " " span.tag { "subject kind: " (k) } }
                }
                dt { "Trigger" } dd { (r.trigger.as_str()) }
                dt { "Tenant" } dd { (tenant(r.tenant.as_deref())) }
                dt { "Started" } dd { (time(r.started_at)) }
                dt { "Settled" } dd { (opt_time(r.settled_at)) }
                dt { "Duration" } dd { (duration(r.started_at, r.settled_at)) }
                dt { "Rows affected" } dd { (r.affected()) }
            }
            h2 { "Entities" }
            @if r.entities.is_empty() {
                p.empty { "No entity was processed." }
            } @else {
                table {
                    thead { tr {
                        th { "Entity" } th { "Category" } th { "Strategy" }
                        th.n { "Affected" } th.n { "Held" } th.n { "Skipped" } th.n { "NULL anchor" }
                        th.n { "Kept: legal minimum" } th.n { "Kept: policy" } th { "Cutoff" } th { "Period" }
                    } }
                    tbody {
                        @for e in &r.entities {
                            tr {
                                td {
                                    (e.entity)
                                    @if e.paused { " " span.tag { "paused" } }
                                }
                                td { (e.category) }
                                td { (e.strategy.as_str()) }
                                td.n { (e.affected) }
                                td.n { (e.held) }
                                td.n { (e.skipped) }
                                td.n { (e.null_anchor) }
                                td.n { (e.kept_by_legal_min) }
                                td.n { (e.kept_by_policy) }
                                td { (opt_time(e.cutoff)) }
                                td { (e.period) }
                            }
                        }
                    }
                }
            }
            h2 { "Failures" }
            @if r.failures.is_empty() {
                p.empty { "None." }
            } @else {
                p.muted { "Sanitised diagnostics: the full error is in the log of the process that ran it, under the same diagnostic id." }
                table {
                    thead { tr { th { "Entity" } th { "Diagnostic" } } }
                    tbody {
                        @for f in &r.failures {
                            tr { td { (f.entity) } td { code { (f.error) } } }
                        }
                    }
                }
            }
        },
    )
}

pub(crate) fn holds(holds: &[Hold], model: &ValidatedModel, limit: i64) -> Markup {
    layout(
        "Active holds",
        Tab::Holds,
        html! {
            p.muted {
                "Rows these holds name are never changed by a sweep or an erasure. "
                "A subject hold protects every row holding one person's identifier; "
                "the identifier is personal data, so only its kind is shown here. "
                "Reasons are free text that may name people, so they are not shown here either: "
                code { "cohort holds list" } " prints both."
            }
            @if holds.is_empty() {
                p.empty { "No active holds." }
            } @else {
                @if holds.len() as i64 == limit {
                    p.muted { "The first " (limit) " by placement time (" code { "?limit=" } " up to 1000; " code { "cohort holds list --active" } " lists them all)." }
                }
                table {
                    thead { tr { th { "Hold" } th { "On" } th { "Entity" } th { "Record id" } th { "Tenant" } th { "Placed" } th { "Expires" } } }
                    tbody {
                        @for h in holds {
                            tr {
                                td { code { (short(&h.hold_id)) } }
                                @match (h.retention_entity_id, &h.record_id) {
                                    (Some(id), Some(record)) => {
                                        td { "record" }
                                        td {
                                            @match model.entity(id) {
                                                Some(e) => (e.name),
                                                None => code { (id) },
                                            }
                                        }
                                        td { code { (record) } }
                                    }
                                    _ => {
                                        td {
                                            "subject"
                                            @if let Some(kind) = &h.subject_kind { " (" code { (kind) } ")" }
                                        }
                                        td.muted { "every entity" }
                                        td.muted { "every row holding it" }
                                    }
                                }
                                td {
                                    @match (&h.tenant_id, h.target) {
                                        (Some(t), _) => code { (t) },
                                        // A subject hold placed without a
                                        // tenant protects every tenant's rows.
                                        (None, cohort::holds::HoldTarget::Subject) => span.muted { "all tenants" },
                                        (None, _) => span.muted { "tenantless" },
                                    }
                                }
                                td { (time(h.created_at)) }
                                td { (h.expires_at.map(time).unwrap_or_else(|| "never".into())) }
                            }
                        }
                    }
                }
            }
        },
    )
}

pub(crate) fn requests(
    requests: &[cohort::erasure_requests::RequestRecord],
    counts: &cohort::erasure_requests::RequestCounts,
    limit: i64,
) -> Markup {
    use cohort::erasure_requests::PartReason;
    layout(
        "Erasure requests",
        Tab::Requests,
        html! {
            p.muted {
                "Erasure requests opened with " code { "cohort erase --reference" } ", followed until they complete. "
                "The subject and the requester's note are personal data, so they are not shown here: "
                code { "cohort erase-requests show REF" } " prints them."
            }
            dl.facts {
                @for (state, n) in &counts.by_state {
                    dt { (state.as_str()) } dd { (n) }
                }
                dt { "Overdue" } dd { (counts.overdue) }
            }
            @if requests.is_empty() {
                p.empty { "No erasure requests." }
            } @else {
                @if requests.len() as i64 == limit {
                    p.muted { "The first " (limit) " by receipt (" code { "?limit=" } " up to 1000)." }
                }
                table {
                    thead { tr { th { "Reference" } th { "State" } th { "Tenant" } th { "Received" } th { "Due" } th { "Completed" } th { "Waiting for" } } }
                    tbody {
                        @for r in requests {
                            tr {
                                td { code { (r.reference) } }
                                td {
                                    (r.state.as_str())
                                    @if r.overdue { " " span.status.bad { "overdue" } }
                                }
                                td {
                                    @match &r.tenant {
                                        Some(t) => code { (t) },
                                        None => span.muted { "tenantless" },
                                    }
                                }
                                td { (time(r.received_at)) }
                                td { (time(r.due_at)) }
                                td { (opt_time(r.completed_at)) }
                                td {
                                    @if let Some(e) = &r.error {
                                        span.error { "failed: " (e) }
                                    }
                                    @for p in &r.waiting {
                                        div {
                                            (p.entity) ": " (p.rows) " row(s), "
                                            @match p.reason {
                                                PartReason::Held => "held",
                                                PartReason::LegalMinimum => "legal minimum",
                                                PartReason::NullAnchor => "no anchor (needs a person)",
                                                PartReason::Referenced => "still referenced (needs a person)",
                                                _ => "kept",
                                            }
                                            @if let Some(u) = p.until { ", until " (time(u)) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

pub(crate) fn queue(depth: &QueueDepth, dead: &[DeadLetter], limit: i64) -> Markup {
    layout(
        "Handler queue",
        Tab::Queue,
        html! {
            dl.facts {
                dt { "Pending" } dd { (depth.pending) }
                dt { "In flight" } dd { (depth.in_flight) }
                dt { "Dead-lettered" } dd { (depth.dead_lettered) }
            }
            h2 { "Dead letters" }
            @if dead.is_empty() {
                p.empty { "No dead letters." }
            } @else {
                p.muted { "The " (limit) " most recent. Requeue with " code { "cohort dead-letters retry" } "." }
                table {
                    thead { tr {
                        th.n { "Work" } th { "Handler" } th { "Entity" } th { "Record id" } th { "Row" } th { "Tenant" }
                        th.n { "Attempts" } th { "Last error" } th { "Dead-lettered" } th { "Run" }
                    } }
                    tbody {
                        @for d in dead {
                            tr {
                                td.n { (d.id) }
                                td { (d.handler) }
                                td { (d.entity) }
                                td { code { (d.record_id) } }
                                td { (row_action(&d.action)) }
                                td { (tenant(d.tenant.as_deref())) }
                                td.n { (d.attempts) }
                                td { code { (d.last_error.as_deref().unwrap_or("—")) } }
                                td { (time(d.dead_lettered_at)) }
                                td { a href={"/runs/" (d.run_id)} { code { (short(&d.run_id)) } } }
                            }
                        }
                    }
                }
            }
        },
    )
}

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// One live setting as `cohort settings show` has it: effective, this
/// process's value (its configuration), the database's, and who set that.
fn switch(setting: Setting, v: &SettingValue) -> Markup {
    html! {
        tr {
            td { code { (setting.name()) } }
            td { span class={"status " (if v.effective { "warn" } else { "ok" })} { (on(v.effective)) } }
            td { (on(v.process)) }
            td { (on(v.database)) }
            td { (opt_time(v.updated_at)) }
            td { (v.updated_by.as_deref().unwrap_or("—")) }
        }
    }
}

/// A live `max_replica_lag`, as `cohort settings show` prints it.
fn lag_ms(ms: u64) -> String {
    format!("{}s", ms as f64 / 1000.0)
}

fn or_dash(v: Option<String>) -> Markup {
    html! {
        @match v {
            Some(v) => (v),
            None => span.muted { "—" },
        }
    }
}

fn scope(entity: Option<&str>) -> Markup {
    html! {
        @match entity {
            Some(e) => (e),
            None => { code { "*" } " " span.muted { "(every entity)" } },
        }
    }
}

/// The settings page's journal section: whether a `[journal]` is
/// configured, and the console's last restore check.
#[derive(Clone)]
pub(crate) enum Journal {
    /// No `[journal]`: nothing outside the database records requests and
    /// holds.
    NotConfigured,
    /// The last check (reused for a while: see `RESTORE_CHECK_REUSE`).
    Checked {
        /// When it ran.
        at: DateTime<Utc>,
        /// What it found (boxed: a check is large), or why it could not
        /// run.
        check: Result<Box<RestoreCheck>, String>,
    },
}

/// Minutes the console reuses a restore check (see `RESTORE_CHECK_REUSE`).
pub(crate) const RESTORE_CHECK_MINUTES: u64 = 5;

/// The pauses first, where nobody misses them; then the live pacing rows
/// as `cohort settings show` prints them; then the configured limits.
fn pacing(live: &[LivePacing], config: &CohortConfig, model: &ValidatedModel) -> Markup {
    let paused: Vec<&LivePacing> = live.iter().filter(|p| p.paused).collect();
    let own: Vec<_> = model
        .ordered()
        .filter(|e| e.max_rows_per_second.is_some() || e.max_replica_lag.is_some())
        .collect();
    html! {
        h2 { "Pacing" }
        @if paused.is_empty() {
            p { span.status.ok { "No entity is paused." } }
        } @else {
            @for p in &paused {
                p {
                    span.status.bad { "Paused: " (p.entity.as_deref().unwrap_or("every entity")) }
                    " since " (time(p.updated_at)) " (by " (p.updated_by) "). Every sweep skips it, or stops "
                    "before its next batch, until "
                    code { "cohort resume " (p.entity.as_deref().unwrap_or("*")) } "."
                }
            }
        }
        p.muted {
            "Live pacing, in the database: every sweep reads it before each batch. Set with "
            code { "cohort pause" } ", " code { "cohort resume" } " and "
            code { "cohort settings set max_rows_per_second|max_replica_lag" } ". "
            "A live limit applies beside the configured ones; where several are set, the strictest wins."
        }
        @if live.is_empty() {
            p.empty { "No live pacing: no entity paused, no limit set in the database." }
        } @else {
            table {
                thead { tr {
                    th { "Entity" } th { "Paused" } th.n { "max_rows_per_second" } th.n { "max_replica_lag" }
                    th { "Set at" } th { "Set by" }
                } }
                tbody {
                    @for p in live {
                        tr {
                            td { (scope(p.entity.as_deref())) }
                            td {
                                @if p.paused { span.status.bad { "paused" } } @else { span.muted { "no" } }
                            }
                            td.n { (or_dash(p.max_rows_per_second.map(|n| n.to_string()))) }
                            td.n { (or_dash(p.max_replica_lag_ms.map(lag_ms))) }
                            td { (time(p.updated_at)) }
                            td { (p.updated_by) }
                        }
                    }
                }
            }
        }
        p.muted { "Configured pacing, from the policy file and the environment (an entity's own beside the global)." }
        table {
            thead { tr { th { "Entity" } th.n { "max_rows_per_second" } th.n { "max_replica_lag" } } }
            tbody {
                tr {
                    td { (scope(None)) }
                    td.n { (or_dash(config.max_rows_per_second.map(|n| n.to_string()))) }
                    td.n { (or_dash(config.max_replica_lag.map(|p| p.to_string()))) }
                }
                @for e in &own {
                    tr {
                        td { (e.name) }
                        td.n { (or_dash(e.max_rows_per_second.map(|n| n.to_string()))) }
                        td.n { (or_dash(e.max_replica_lag.map(|d| format!("{}s", d.as_secs_f64())))) }
                    }
                }
            }
        }
    }
}

/// Whether the database lacks what the journal holds, as the console's
/// last `restore-check` found it.
fn journal(j: &Journal) -> Markup {
    html! {
        h2 { "Journal" }
        @match j {
            Journal::NotConfigured => {
                p {
                    span.status.warn { "No [journal] is configured." }
                    " Erasure requests and holds are recorded in this database only: after a restore from a "
                    "backup, nothing outside it says what it lost."
                }
            }
            Journal::Checked { at, check } => {
                p.muted {
                    "A " code { "[journal]" } " is configured. The console compares the database with it as "
                    code { "cohort restore-check" } " does: the check reads every journal entry and every "
                    "request's and hold's state, so a result is reused for "
                    (RESTORE_CHECK_MINUTES) " minutes. " code { "cohort restore-check" } " checks now."
                }
                @match check {
                    Err(why) => {
                        p {
                            span.status.bad { "Not checked: " } (why)
                        }
                    }
                    Ok(c) if c.is_clean() => {
                        p { span.status.ok { "The database knows everything the journal holds." } }
                    }
                    Ok(c) => {
                        p {
                            span.status.bad { "The database lacks what the journal holds." }
                            " Leave the workers stopped (they refuse to start) and run "
                            code { "cohort replay" } " (docs/erasure.md, \"After a restore\")."
                        }
                        ul {
                            @for line in c.describe() { li { "missing: " (line) } }
                        }
                    }
                }
                dl.facts {
                    dt { "Checked" } dd.checked-at { (time(*at)) }
                    @if let Ok(c) = check {
                        dt { "Entries" } dd { (c.entries) " (every one checked)" }
                        dt { "Head" } dd { code { (c.head.as_deref().unwrap_or("—")) } }
                        @if c.entries_without_mac > 0 {
                            dt { "Without a MAC" } dd {
                                (c.entries_without_mac) " entries were written before entries carried MACs: "
                                "a writer without the key could have written those."
                            }
                        }
                        @for r in &c.resolved {
                            dt { "Resolved" } dd { (r) }
                        }
                    }
                }
            }
        }
    }
}

/// The console's own configuration, one row per setting.
fn configuration(config: &CohortConfig) -> Vec<(&'static str, String)> {
    let d = &config.dispatch;
    let p = &config.prune;
    let period = |p: Option<cohort::rules::Period>| {
        p.map(|p| p.to_string()).unwrap_or_else(|| "not set".into())
    };
    vec![
        ("schema", config.schema.clone()),
        (
            "schedule",
            config
                .schedule
                .clone()
                .unwrap_or_else(|| "not set (no scheduled sweeps)".into()),
        ),
        ("sweep_batch_size", config.sweep_batch_size.to_string()),
        ("observer_timeout", config.observer_timeout.to_string()),
        (
            "shutdown_grace_period",
            config.shutdown_grace_period.to_string(),
        ),
        (
            "partition_lock_timeout",
            config.partition_lock_timeout.to_string(),
        ),
        (
            "hash_key",
            if config.hash_key.is_some() {
                "set (never shown)".into()
            } else {
                "not set".into()
            },
        ),
        ("dispatch.poll_interval", d.poll_interval.to_string()),
        ("dispatch.batch_size", d.batch_size.to_string()),
        ("dispatch.max_parallelism", d.max_parallelism.to_string()),
        ("dispatch.max_attempts", d.max_attempts.to_string()),
        ("dispatch.base_backoff", d.base_backoff.to_string()),
        ("dispatch.claim_timeout", d.claim_timeout.to_string()),
        ("dispatch.settle_timeout", d.settle_timeout.to_string()),
        (
            "dispatch.payload_retention",
            d.payload_retention.to_string(),
        ),
        (
            "prune.succeeded_runs_older_than",
            period(p.succeeded_runs()),
        ),
        ("prune.failed_runs_older_than", period(p.failed_runs())),
        (
            "prune.inactive_holds_older_than",
            period(p.inactive_holds_older_than),
        ),
        ("prune.batch_size", p.batch_size.to_string()),
        ("prune.interval", p.interval.to_string()),
    ]
}

fn peers(peers: &[cohort::peers::Peer]) -> Markup {
    html! {
        h2 { "Peers" }
        p.muted {
            "Processes running Cohort's services on this database, with a heartbeat in the last minute. "
            "A peer with another policy runs its own occurrences; an entity for which a peer has a handler "
            "another process lacks is left alone by that process."
        }
        @if peers.is_empty() {
            p { "No live peers." }
        } @else {
            table {
                thead { tr { th { "Host" } th.n { "PID" } th { "Started" } th { "Heartbeat" } th { "Policy" } th.n { "Entities with handlers" } } }
                tbody {
                    @for peer in peers {
                        tr {
                            td { (peer.host) }
                            td.n { (peer.pid) }
                            td { (time(peer.started_at)) }
                            td { (time(peer.heartbeat_at)) }
                            td {
                                code { (peer.policy_fingerprint) }
                                @if peer.same_policy { " (this console's)" } @else { strong { " differs from this console's" } }
                            }
                            td.n { (peer.handlers.len()) }
                        }
                    }
                }
            }
        }
    }
}

/// What the settings page shows: everything `cohort settings show` prints,
/// the journal's state, the peers and the configuration.
pub(crate) struct SettingsPage<'a> {
    pub(crate) live: &'a LiveSettings,
    pub(crate) pacing: &'a [LivePacing],
    pub(crate) config: &'a CohortConfig,
    pub(crate) model: &'a ValidatedModel,
    pub(crate) journal: &'a Journal,
    pub(crate) peers: &'a [cohort::peers::Peer],
}

pub(crate) fn settings(s: &SettingsPage<'_>) -> Markup {
    let rows = configuration(s.config);
    layout(
        "Settings",
        Tab::Settings,
        html! {
            h2 { "Live settings" }
            p.muted {
                "Every worker replica reads these at each occurrence and between tenant passes. "
                "Effective = the configuration's value (this process's) OR the database's. Set with "
                code { "cohort settings set" } "."
            }
            table {
                thead { tr {
                    th { "Setting" } th { "Effective" } th { "Configuration" } th { "Database" }
                    th { "Database value set at" } th { "Set by" }
                } }
                tbody {
                    @for setting in Setting::ALL {
                        (switch(setting, s.live.get(setting)))
                    }
                }
            }
            (pacing(s.pacing, s.config, s.model))
            (journal(s.journal))
            (peers(s.peers))
            h2 { "Configuration" }
            p.muted { "As this console loaded it from the policy file and the environment." }
            table {
                thead { tr { th { "Setting" } th { "Value" } } }
                tbody {
                    @for (name, value) in &rows {
                        tr { td { code { (name) } } td { (value) } }
                    }
                }
            }
        },
    )
}

pub(crate) fn error(status: axum::http::StatusCode, message: &str) -> Markup {
    layout(
        status.canonical_reason().unwrap_or("Error"),
        Tab::None,
        html! { p.error { (message) } },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_an_operator_writes_them() {
        let t0 = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .to_utc();
        let after = |ms: i64| Some(t0 + chrono::TimeDelta::milliseconds(ms));
        let table = [
            (after(0), "0 ms"),
            (after(850), "850 ms"),
            (after(12_400), "12.4 s"),
            (after(185_000), "3 min 05 s"),
            (after(7_620_000), "2 h 07 min"),
            (after(-5), "0 ms"),
            (None, "running"),
        ];
        for (to, want) in table {
            assert_eq!(duration(t0, to), want);
        }
    }

    #[test]
    fn ages_read_like_an_operator_writes_them() {
        for (seconds, want) in [
            (-3.0, "0 s"),
            (0.0, "0 s"),
            (42.9, "42 s"),
            (425.0, "7 min 05 s"),
            (11_220.0, "3 h 07 min"),
            (10.0 * 86_400.0 + 5.0 * 3_600.0 + 7.0, "10 d 05 h"),
        ] {
            assert_eq!(age(seconds), want, "{seconds}");
        }
    }

    #[test]
    fn the_rows_chart_stacks_categories_per_day_and_escapes_their_names() {
        let today = chrono::NaiveDate::from_ymd_opt(2026, 3, 14).unwrap();
        let day = |d: u32| chrono::NaiveDate::from_ymd_opt(2026, 3, d).unwrap();
        let rows = [
            CategoryDay::new(day(13), "notes", 30),
            CategoryDay::new(day(13), "<script>x</script>", 10),
            CategoryDay::new(day(14), "notes", 20),
            // Outside the window: neither drawn nor counted.
            CategoryDay::new(
                chrono::NaiveDate::from_ymd_opt(2026, 2, 28).unwrap(),
                "notes",
                99,
            ),
        ];
        let svg = rows_chart(&rows, today).into_string();
        assert!(!svg.contains("<script"), "{svg}");
        assert!(
            svg.contains("&lt;script&gt;x&lt;/script&gt;: 10 rows on 2026-03-13"),
            "{svg}"
        );
        assert!(
            svg.contains("<title>notes: 30 rows on 2026-03-13</title>"),
            "{svg}"
        );
        assert!(
            svg.contains("<title>notes: 20 rows on 2026-03-14</title>"),
            "{svg}"
        );
        assert!(!svg.contains("99 rows"), "{svg}");
        // The tallest day (40 rows) fills the plot: 148 units high.
        let chart = svg.split("</svg>").next().unwrap();
        let heights: Vec<f64> = chart
            .split("<rect ")
            .skip(1)
            .filter_map(|r| r.split("height=\"").nth(1))
            .filter_map(|h| h.split('"').next()?.parse().ok())
            .collect();
        assert_eq!(heights.len(), 3, "{heights:?}");
        assert_eq!(heights[0] + heights[1], 148.0, "{heights:?}");
        assert_eq!(heights[2], 74.0, "{heights:?}");
        // The y axis is labelled with the tallest day's total.
        assert!(svg.contains(">40</text>"), "{svg}");
        assert!(
            svg.contains("</svg> notes: 50</li>"),
            "the legend's total: {svg}"
        );
    }

    #[test]
    fn the_journal_section_says_what_the_check_found_escaped() {
        let at = DateTime::parse_from_rfc3339("2026-03-14T09:30:00Z")
            .unwrap()
            .to_utc();
        let render = |check: Result<Box<RestoreCheck>, String>| {
            journal(&Journal::Checked { at, check }).into_string()
        };
        let none = journal(&Journal::NotConfigured).into_string();
        assert!(none.contains("No [journal] is configured."), "{none}");

        let mut clean = RestoreCheck::default();
        clean.entries = 3;
        let text = render(Ok(Box::new(clean.clone())));
        assert!(
            text.contains("The database knows everything the journal holds."),
            "{text}"
        );
        assert!(text.contains("2026-03-14 09:30:00 UTC"), "{text}");
        assert!(!text.contains("lacks"), "{text}");

        let mut gap = clean;
        let hold = uuid::Uuid::nil();
        gap.holds_to_place.push(hold);
        gap.journal_behind
            .push("hold <script>x</script> was recorded by journal entry 9".into());
        let text = render(Ok(Box::new(gap)));
        assert!(
            text.contains("The database lacks what the journal holds."),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "<li>missing: hold {hold} is not in the database</li>"
            )),
            "{text}"
        );
        assert!(!text.contains("<script>"), "{text}");
        assert!(text.contains("&lt;script&gt;x&lt;/script&gt;"), "{text}");

        let text = render(Err("the journal in /j is broken: <entry 4>".into()));
        assert!(
            text.contains("Not checked: </span>the journal in /j is broken: &lt;entry 4&gt;"),
            "{text}"
        );
        assert!(!text.contains("<dt>Entries</dt>"), "{text}");
    }

    #[test]
    fn page_text_is_escaped() {
        let page = error(
            axum::http::StatusCode::BAD_REQUEST,
            "<script>alert(1)</script>",
        );
        let text = page.into_string();
        assert!(!text.contains("<script>"), "{text}");
        assert!(text.contains("&lt;script&gt;"), "{text}");
    }
}
