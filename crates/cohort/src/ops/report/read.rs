//! Reading a report's figures from the ledger: each part of the report
//! from its statement, in the snapshot `build` opens.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use sqlx::PgConnection;

use crate::context::{Context, Ready};
use crate::domain::rules::{Period, Strategy};
use crate::error::{Error, Result};
use crate::run::{RunKind, RunStatus};
use crate::sql::report::{self as statements, Window};

use super::{
    ChainEvidence, EntityReport, ErasureReport, ErasureServed, FailureCount, HoldCounts,
    KeptCounts, MonthCounts, RequestDeadline, RuleInForce, RunCounts, Timeliness, Timely,
};

/// A count the ledger sums as `int8`, never negative.
fn count(n: i64) -> u64 {
    n.max(0) as u64
}

fn period(interval: PgInterval) -> Result<Period> {
    crate::ops::history::period_of(interval)
}

fn kept(k: statements::Kept) -> KeptCounts {
    KeptCounts {
        held: count(k.held),
        held_by_subject: count(k.held_by_subject),
        legal_minimum: count(k.legal_minimum),
        null_anchor: count(k.null_anchor),
        skipped: count(k.skipped),
        kept_by_policy: count(k.kept_by_policy),
    }
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

/// The tenant, canonical, if it is one Cohort knows: in the tenant
/// directory, or in a run or a hold of the ledger. A tenant known nowhere
/// is refused (an empty report for it would say "nothing happened" about
/// a tenant that was probably mistyped).
pub(super) async fn known_tenant(cx: &Ready<'_>, tenant: &str) -> Result<String> {
    let canonical = cx.canonical_tenant(tenant).await?;
    let identity = cx.plans().model.tenant_identity();
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

/// The chain's heads (now, and at the period's end) and a walk of it.
pub(super) async fn chain_evidence(cx: &Context, window: &Window) -> Result<Option<ChainEvidence>> {
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

/// Each entity line's place in the report's list.
type Index = BTreeMap<statements::Line, usize>;

/// The entity lines, with their rules, rows changed per month and rows kept.
pub(super) async fn entity_reports(
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
        .query_as::<statements::EntityRuns>()
        .fetch_all(&mut *conn)
        .await?
    {
        index.insert(row.line.clone(), entities.len());
        entities.push(entity_line(row));
    }
    Ok((entities, index))
}

/// One entity line from a row of `entity_runs`.
fn entity_line(row: statements::EntityRuns) -> EntityReport {
    EntityReport {
        entity_id: row.line.retention_entity_id,
        entity: row.entity_type,
        category: row.line.category,
        stage: row.line.stage.and_then(|n| u16::try_from(n).ok()),
        rules: Vec::new(),
        runs: RunCounts {
            runs: count(row.runs),
            succeeded: count(row.succeeded),
            failed: count(row.failed),
            last_success: row.last_success,
        },
        months: Vec::new(),
        kept: KeptCounts::default(),
    }
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
        .query_as::<statements::EntityRule>()
        .fetch_all(&mut *conn)
        .await?
    {
        let Some(&i) = index.get(&row.line) else {
            continue;
        };
        entities[i].rules.push(rule_in_force(row)?);
    }
    Ok(())
}

/// One rule from a row of `entity_rules`.
fn rule_in_force(row: statements::EntityRule) -> Result<RuleInForce> {
    Ok(RuleInForce {
        strategy: row
            .strategy
            .parse::<Strategy>()
            .map_err(|e| Error::Migration(e.to_string()))?,
        period: period(row.resolved_period)?,
        legal_minimum: row.legal_min.map(period).transpose()?,
        source: row.rule_source,
        reason: row.rule_reason,
        runs: count(row.runs),
        last_used: row.last_used,
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
        .query_as::<statements::EntityMonth>()
        .fetch_all(&mut *conn)
        .await?
    {
        let Some(&i) = index.get(&row.line) else {
            continue;
        };
        add_month(&mut entities[i].months, row);
    }
    Ok(())
}

/// Counts a row of `entity_months` into `months` (oldest first; a new month adds a line).
fn add_month(months: &mut Vec<MonthCounts>, row: statements::EntityMonth) {
    if months.last().is_none_or(|m| m.month != row.month) {
        months.push(MonthCounts {
            month: row.month,
            purged: 0,
            soft_deleted: 0,
            anonymised: 0,
            archived: 0,
        });
    }
    let m = months.last_mut().expect("pushed");
    let n = count(row.affected);
    match row.strategy.parse::<Strategy>() {
        Ok(Strategy::Purge) => m.purged += n,
        Ok(Strategy::SoftDelete) => m.soft_deleted += n,
        Ok(Strategy::Anonymise) => m.anonymised += n,
        Ok(Strategy::Archive) => m.archived += n,
        _ => {}
    }
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
        .query_as::<statements::EntityKept>()
        .fetch_all(&mut *conn)
        .await?
    {
        let Some(&i) = index.get(&row.line) else {
            continue;
        };
        entities[i].kept = kept(row.kept);
    }
    Ok(())
}

/// Each erasure request of the period, oldest first.
pub(super) async fn erasures_served(
    conn: &mut PgConnection,
    schema: &str,
    window: &Window,
) -> Result<Vec<ErasureServed>> {
    statements::erasures(schema, window.clone())
        .query_as::<statements::Erasure>()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(erasure_served)
        .collect()
}

/// One erasure request from a row of `erasures`.
fn erasure_served(row: statements::Erasure) -> Result<ErasureServed> {
    let status = RunStatus::parse(&row.status)
        .ok_or_else(|| Error::Migration(format!("unknown run status {:?}", row.status)))?;
    let (started_at, settled_at) = (row.started_at, row.settled_at);
    Ok(ErasureServed {
        run_id: row.run_id,
        status,
        subject_kind: row.erasure_subject_kind,
        started_at,
        settled_at,
        seconds: settled_at
            .map(|s| (s - started_at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6),
        removed: count(row.affected),
        kept: kept(row.kept),
    })
}

/// The erasure requests with a reference live in the period, each judged
/// against its due date at `end` (the period's end, or the report's time
/// when that is earlier).
pub(super) async fn request_deadlines(
    conn: &mut PgConnection,
    schema: &str,
    window: &Window,
    end: DateTime<Utc>,
) -> Result<Vec<RequestDeadline>> {
    let rows = statements::request_deadlines(schema, window.clone())
        .query_as::<statements::Deadline>()
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let timely = match row.completed_at {
                Some(done) if done <= row.due_at => Timely::OnTime,
                Some(_) => Timely::Late,
                None if row.due_at < end => Timely::Overdue,
                None => Timely::NotYetDue,
            };
            RequestDeadline {
                reference: row.reference,
                state: row.state,
                received_at: row.received_at,
                due_at: row.due_at,
                completed_at: row.completed_at,
                timely,
            }
        })
        .collect())
}

pub(super) fn timeliness(deadlines: &[RequestDeadline]) -> Timeliness {
    let n = |t: Timely| deadlines.iter().filter(|d| d.timely == t).count() as u64;
    Timeliness {
        on_time: n(Timely::OnTime),
        late: n(Timely::Late),
        overdue: n(Timely::Overdue),
        not_yet_due: n(Timely::NotYetDue),
    }
}

/// The erasure requests counted by outcome, with the median and p95 of their durations.
pub(super) fn erasure_report(served: Vec<ErasureServed>) -> ErasureReport {
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
pub(super) async fn hold_counts(
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
        .query_as::<statements::HoldCount>()
        .fetch_all(&mut *conn)
        .await?
    {
        if let Some(h) = holds.iter_mut().find(|h| h.target == row.target) {
            h.placed = count(row.placed);
            h.released = count(row.released);
            h.expired = count(row.expired);
            h.in_force = count(row.in_force);
        }
    }
    Ok(holds)
}

/// A failure's run kind (`sweep` or `erasure`), entity and sanitised code.
type FailureKey = (&'static str, Option<String>, String);

/// How many times each failure occurred in the period.
pub(super) async fn failure_tally(
    conn: &mut PgConnection,
    schema: &str,
    window: Window,
) -> Result<BTreeMap<FailureKey, u64>> {
    let mut failures: BTreeMap<FailureKey, u64> = BTreeMap::new();
    for row in statements::failures(schema, window)
        .query_as::<statements::Failure>()
        .fetch_all(&mut *conn)
        .await?
    {
        let (kind, entity, codes) = failure_codes(row);
        for code in codes {
            *failures.entry((kind, entity.clone(), code)).or_default() += 1;
        }
    }
    Ok(failures)
}

/// A failure row's run kind, entity (`None`: the run's own error) and failure codes.
fn failure_codes(row: statements::Failure) -> (&'static str, Option<String>, Vec<String>) {
    let kind = if row.kind == "erasure" {
        "erasure"
    } else {
        "sweep"
    };
    let (entity, error) = (row.entity, row.error);
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
    (kind, entity, codes)
}

/// The tallied failures as the report lists them.
pub(super) fn failure_counts(failures: BTreeMap<FailureKey, u64>) -> Vec<FailureCount> {
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
}
