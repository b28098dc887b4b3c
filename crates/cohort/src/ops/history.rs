//! Reading the ledger back: recent runs, and one run with its summaries.

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use uuid::Uuid;

use crate::context::{Context, Ready};
use crate::domain::rules::{Period, Strategy};
use crate::error::{Error, Result};
use crate::run::{EntityFailure, EntityOutcome, RunKind, RunStatus, SweepResult, Trigger};
use crate::sql::history as statements;

pub use crate::run::status::CategoryDay;

/// One line of `runs list`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RunLine {
    /// Run id.
    pub run_id: Uuid,
    /// Sweep or erasure.
    pub kind: RunKind,
    /// Manual or scheduled.
    pub trigger: Trigger,
    /// Status.
    pub status: RunStatus,
    /// Dry run.
    pub dry_run: bool,
    /// Tenant.
    pub tenant: Option<String>,
    /// Start.
    pub started_at: DateTime<Utc>,
    /// Settlement.
    pub settled_at: Option<DateTime<Utc>>,
    /// Rows affected, all entities.
    pub affected: u64,
    /// Rows kept by an active hold, all entities.
    pub held: u64,
    /// Eligible rows skipped (see [`crate::EntityOutcome::skipped`]), all entities.
    pub skipped: u64,
}

/// One thing that happened to a record: a detail row of a run (per-row
/// audit, or a row set aside by a failing `on_before`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct RecordEvent {
    /// The run that wrote it.
    pub run_id: Uuid,
    /// Sweep or erasure.
    pub kind: RunKind,
    /// Manual or scheduled.
    pub trigger: Trigger,
    /// The run's status now.
    pub status: RunStatus,
    /// Whether the run was a dry run (a dry run writes no detail).
    pub dry_run: bool,
    /// What was done: `purge`, `soft_delete`, `anonymise`, `archive`, or
    /// `skipped` (set aside by a failing `on_before`).
    pub action: String,
    /// The run's tenant.
    pub tenant: Option<String>,
    /// When the detail was written (the batch's transaction).
    pub recorded_at: DateTime<Utc>,
}

/// The most details [`record_history`] returns for one record.
pub const RECORD_HISTORY_LIMIT: i64 = 1_000;

/// What happened to one record of an entity across runs, oldest first,
/// from its detail rows (written for categories with per-row audit, and
/// for rows set aside): at most [`RECORD_HISTORY_LIMIT`]. The record id is
/// taken in the entity's key type and compared canonically.
pub(crate) async fn record_history(
    cx: &Ready<'_>,
    entity_id: Uuid,
    record_id: &str,
) -> Result<Vec<RecordEvent>> {
    let ready = cx.plans();
    let entity = ready.model.requested_entity(entity_id)?;
    let record = ready.model.facts[&entity.id].record_key(&entity.name, record_id)?;
    let params = statements::RecordOf {
        entity_id: entity.id,
        record_id: record.canonical(),
        limit: RECORD_HISTORY_LIMIT,
    };
    let rows = statements::record_details(&cx.config.schema, params)
        .query_as::<statements::RecordDetailRow>()
        .fetch_all(&cx.pool)
        .await?;
    rows.into_iter()
        .map(|r| {
            Ok(RecordEvent {
                run_id: r.run_id,
                kind: kind(&r.kind),
                trigger: trigger(&r.trigger),
                status: status(&r.status)?,
                dry_run: r.dry_run,
                action: r.action,
                tenant: r.tenant_id,
                recorded_at: r.recorded_at,
            })
        })
        .collect()
}

/// A count the ledger stores as `int8`, never negative.
fn count(n: i64) -> u64 {
    n.max(0) as u64
}

fn kind(s: &str) -> RunKind {
    if s == "erasure" {
        RunKind::Erasure
    } else {
        RunKind::Sweep
    }
}

fn trigger(s: &str) -> Trigger {
    if s == "scheduled" {
        Trigger::Scheduled
    } else {
        Trigger::Manual
    }
}

fn status(s: &str) -> Result<RunStatus> {
    RunStatus::parse(s)
        .ok_or_else(|| Error::Migration(format!("unknown run status {s:?} in the ledger")))
}

pub(crate) async fn list(cx: &Context, limit: i64) -> Result<Vec<RunLine>> {
    if !(0..=10_000).contains(&limit) {
        return Err(Error::InvalidInput(format!(
            "a run list limit must be between 0 and 10000, not {limit}"
        )));
    }
    if limit == 0 {
        return Ok(Vec::new());
    }
    let schema = &cx.config.schema;
    let rows = statements::recent_runs(schema, statements::Limit(limit))
        .query_as::<statements::RunLineRow>()
        .fetch_all(&cx.pool)
        .await?;
    rows.into_iter()
        .map(|r| {
            Ok(RunLine {
                run_id: r.run_id,
                kind: kind(&r.kind),
                trigger: trigger(&r.trigger),
                status: status(&r.status)?,
                dry_run: r.dry_run,
                tenant: r.tenant_id,
                started_at: r.started_at,
                settled_at: r.settled_at,
                affected: count(r.affected),
                held: count(r.held),
                skipped: count(r.skipped),
            })
        })
        .collect()
}

/// A period as the ledger stores it: calendar months, and days and time
/// folded into seconds (Cohort writes days as 86 400 s, it works in UTC).
pub(crate) fn period_of(i: PgInterval) -> Result<Period> {
    let seconds = i64::from(i.days) * 86_400 + i.microseconds.div_euclid(1_000_000);
    Period::from_parts(i64::from(i.months), seconds).map_err(|e| Error::Migration(e.to_string()))
}

/// One run as the ledger has it, with its entities' summaries and its failures.
pub(crate) async fn show(cx: &Context, run_id: Uuid) -> Result<SweepResult> {
    let schema = &cx.config.schema;
    let pool = &cx.pool;
    let Some(run) = statements::run(schema, statements::Run(run_id))
        .query_as::<statements::RunRow>()
        .fetch_optional(pool)
        .await?
    else {
        return Err(Error::NotFound(format!("no run with id {run_id}")));
    };
    let summaries = statements::summaries(schema, statements::Run(run_id))
        .query_as::<statements::SummaryRow>()
        .fetch_all(pool)
        .await?;
    let entities = summaries
        .into_iter()
        .map(entity_outcome)
        .collect::<Result<Vec<_>>>()?;
    let failures = run_failures(run.failures, run.error.as_deref(), run_id, &entities)?;
    Ok(SweepResult {
        run_id,
        kind: kind(&run.kind),
        trigger: trigger(&run.trigger),
        status: status(&run.status)?,
        dry_run: run.dry_run,
        tenant: run.tenant_id,
        started_at: run.started_at,
        settled_at: run.settled_at,
        erasure_kind: run.erasure_subject_kind,
        entities,
        failures,
    })
}

/// One entity's outcome, from its summary row.
fn entity_outcome(s: statements::SummaryRow) -> Result<EntityOutcome> {
    let n = |v: i64| v.max(0) as u64;
    let period = |i: Option<PgInterval>| i.map(period_of).transpose();
    Ok(EntityOutcome {
        entity_id: s.retention_entity_id,
        strategy: s
            .strategy
            .parse::<Strategy>()
            .map_err(|e| Error::Migration(e.to_string()))?,
        affected: n(s.affected_count),
        held: n(s.held_count),
        held_by_subject: n(s.held_by_subject_count),
        skipped: n(s.skipped_count),
        kept_by_legal_min: n(s.kept_by_legal_min_count),
        kept_by_legal_min_until: None,
        kept_by_policy: n(s.kept_by_policy_count),
        null_anchor: n(s.null_anchor_count),
        cutoff: s.cutoff,
        period: period(s.resolved_period)?.unwrap_or_default(),
        legal_min: period(s.legal_min)?,
        stage: s.stage.and_then(|n| u16::try_from(n).ok()),
        batch_size: s.batch_size.and_then(|n| u32::try_from(n).ok()),
        table: table_health(&s),
        throttled_ms: s.throttled_ms.map(n),
        lag_waited_ms: s.lag_waited_ms.map(n),
        paused: s.paused,
        note: s.note,
        entity: s.entity_type,
        category: s.category,
        pacing_notes: Vec::new(),
        partition_notes: Vec::new(),
    })
}

/// What the sweep left in the entity's table, when it was recorded
/// (schema version 16 on, runs that changed rows).
fn table_health(s: &statements::SummaryRow) -> Option<crate::domain::outcome::TableHealth> {
    let n = |v: Option<i64>| v.map(|v| v.max(0) as u64);
    Some(crate::domain::outcome::TableHealth {
        dead_tuples_before: n(s.dead_tuples_before)?,
        dead_tuples_after: n(s.dead_tuples_after)?,
        bytes_before: n(s.table_bytes_before)?,
        bytes_after: n(s.table_bytes_after)?,
        vacuumed: s.vacuumed.clone(),
    })
}

/// The run's failures, as stored or (runs before schema version 3) from its text.
fn run_failures(
    structured: Option<serde_json::Value>,
    error: Option<&str>,
    run_id: Uuid,
    entities: &[EntityOutcome],
) -> Result<Vec<EntityFailure>> {
    // Failures are stored structurally since schema version 3; runs settled
    // before it are read from the sanitised text "entity <id>: <diagnostic>; …".
    let failures: Vec<EntityFailure> = match structured {
        Some(v) => serde_json::from_value(v)
            .map_err(|e| Error::Migration(format!("run {run_id} has unreadable failures: {e}")))?,
        None => legacy_failures(error, entities),
    };
    Ok(failures)
}

/// The failures a run settled before schema version 3 lists in its error text.
fn legacy_failures(error: Option<&str>, entities: &[EntityOutcome]) -> Vec<EntityFailure> {
    error
        .map(|e| {
            e.split("; ")
                .filter_map(|part| {
                    let rest = part.strip_prefix("entity ")?;
                    let (id, diagnostic) = rest.split_once(": ")?;
                    let entity_id = Uuid::parse_str(id).ok()?;
                    let entity = entities
                        .iter()
                        .find(|o| o.entity_id == entity_id)
                        .map(|o| o.entity.clone())
                        .unwrap_or_default();
                    Some(EntityFailure {
                        entity_id,
                        entity,
                        error: diagnostic.to_owned(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The run whose id starts with `prefix` (at least 4 hexadecimal characters,
/// hyphens optional: what the tables print is enough). No match is
/// `NotFound`; several are `InvalidInput` naming them.
pub(crate) async fn find_run(cx: &Context, prefix: &str) -> Result<Uuid> {
    find_by_prefix(cx, prefix, "run", statements::runs_by_prefix).await
}

/// The hold whose id starts with `prefix`, as [`find_run`] finds runs
/// (the console and the tables print 8 characters).
pub(crate) async fn find_hold(cx: &Context, prefix: &str) -> Result<Uuid> {
    find_by_prefix(cx, prefix, "hold", statements::holds_by_prefix).await
}

async fn find_by_prefix(
    cx: &Context,
    prefix: &str,
    what: &str,
    by_prefix: fn(&str, statements::Prefix) -> crate::sql::statement::Statement<statements::Prefix>,
) -> Result<Uuid> {
    let wanted: String = prefix.trim().to_ascii_lowercase();
    if let Ok(id) = Uuid::parse_str(&wanted) {
        return Ok(id);
    }
    let hex: String = wanted.chars().filter(|c| *c != '-').collect();
    if hex.len() < 4 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(Error::InvalidInput(format!(
            "{prefix:?} is not a {what} id or a prefix of one (at least 4 hexadecimal characters)"
        )));
    }
    let found: Vec<Uuid> = by_prefix(&cx.config.schema, statements::Prefix(hex.clone()))
        .query_scalar()
        .fetch_all(&cx.pool)
        .await?;
    match found.as_slice() {
        [] => Err(Error::NotFound(format!(
            "no {what} id starts with {prefix:?}"
        ))),
        [one] => Ok(*one),
        many => Err(Error::InvalidInput(format!(
            "{prefix:?} matches several {what}s: {}{}; give more of the id",
            many.iter()
                .take(5)
                .map(Uuid::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            if many.len() > 5 { ", …" } else { "" }
        ))),
    }
}
