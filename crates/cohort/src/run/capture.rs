//! Row handlers inside a batch: each handler's `on_before` capture on the
//! locked rows, the queueing of their work with the batch, and the values
//! of custom anonymisers.

use std::collections::HashMap;

use sqlx::Postgres;

use super::ctx::RunCtx;
use super::work::{stop_from, Stop, Work};
use crate::base::diagnostic::Diagnostic;
use crate::sql::{DecodeKey, EntityPlan, KeyValue};

/// What the handlers' `on_before` made of one batch's locked rows.
pub(super) struct Captured {
    /// Each captured row's snapshots by record id, aligned with the handlers.
    pub(super) snapshots: HashMap<String, Vec<serde_json::Value>>,
    /// Rows a handler's `on_before` failed for (or timed out on): they are
    /// left unmutated, their work dead-lettered once, and the run's later
    /// batches never pick them again (they lie behind its cursor).
    pub(super) failed: Vec<FailedRow>,
}

/// A row left because one of its handlers' `on_before` failed.
pub(super) struct FailedRow {
    /// Its record id, canonical text.
    pub(super) record_id: String,
    /// The handler that failed, by position in delivery order.
    pub(super) handler: usize,
    /// The sanitised reason (the full error is logged under its id).
    pub(super) reason: String,
}

impl Captured {
    /// Whether this row's capture failed.
    pub(super) fn is_failed(&self, record_id: &str) -> bool {
        !self.snapshots.contains_key(record_id)
    }
}

/// Runs every handler's `on_before` on each locked row (decoded into the
/// entity's Rust type), in delivery order. A row for which one fails (or
/// does not finish in time) is set aside, the handlers after it not run:
/// the other rows of the batch go on. Only an error that is not the
/// handler's (its key cannot be read) fails the batch.
pub(super) async fn capture(
    ctx: &RunCtx<'_>,
    work: &Work<'_>,
    handlers: &[crate::domain::handlers::Registered],
    rows: &[sqlx::postgres::PgRow],
) -> std::result::Result<Captured, Stop> {
    let key_type = ctx.ready.model.facts[&work.entity.id].record;
    let mut captured = Captured {
        snapshots: HashMap::with_capacity(rows.len()),
        failed: Vec::new(),
    };
    // Bounded: a hung capture would hold the batch's row locks and the run
    // lock, so that not even recovery could step in.
    let limit = std::time::Duration::from_secs_f64(
        ctx.cx.config.dispatch.claim_timeout.as_seconds() as f64
            * crate::domain::handlers::DELIVERY_HARD_DEADLINE,
    );
    'rows: for row in rows {
        let record_id = key_type.decode(row, 0).map_err(stop_from)?.canonical();
        let mut payloads = Vec::with_capacity(handlers.len());
        for (position, h) in handlers.iter().enumerate() {
            let mut before = crate::domain::handlers::BeforeContext {
                snapshot: crate::domain::handlers::Snapshot::new(),
                record_id: record_id.clone(),
                tenant: ctx.spec.tenant.clone(),
                run_id: ctx.run_id,
                strategy: work.rule.strategy(),
            };
            let failure =
                match tokio::time::timeout(limit, h.handler.before(row, &mut before)).await {
                    Ok(Ok(())) => None,
                    Ok(Err(err)) => Some(Diagnostic::capture(
                        "handler",
                        Some("on_before_failed".into()),
                        &format!("{}: {err}", h.registration.identity),
                    )),
                    Err(_) => Some(Diagnostic::capture(
                        "handler",
                        Some("on_before_timed_out".into()),
                        &format!(
                            "{}: on_before did not finish within 9/10 of claim_timeout",
                            h.registration.identity
                        ),
                    )),
                };
            if let Some(d) = failure {
                captured.failed.push(FailedRow {
                    record_id,
                    handler: position,
                    reason: d.to_string(),
                });
                continue 'rows;
            }
            payloads.push(before.snapshot.to_json());
        }
        captured.snapshots.insert(record_id, payloads);
    }
    Ok(captured)
}

/// Records the rows set aside by a failing `on_before`, in the batch
/// transaction: a `skipped` row detail each, and the failing handler's
/// work dead-lettered once with its reason (no payload, so it can never be
/// retried; the next run tries the row again).
pub(super) async fn dead_letter_skipped_rows(
    ctx: &RunCtx<'_>,
    tx: &mut sqlx::Transaction<'_, Postgres>,
    work: &Work<'_>,
    handlers: &[crate::domain::handlers::Registered],
    failed: Vec<FailedRow>,
) -> std::result::Result<(), Stop> {
    let mut rows = crate::sql::queue::DeadLetterSkipped {
        run_id: ctx.run_id,
        entity_id: work.entity.id,
        entity: work.entity.name.clone(),
        tenant: ctx.spec.tenant.clone(),
        record_ids: Vec::with_capacity(failed.len()),
        handlers: Vec::with_capacity(failed.len()),
        priorities: Vec::with_capacity(failed.len()),
        phases: Vec::with_capacity(failed.len()),
        reasons: Vec::with_capacity(failed.len()),
        requires_earlier: Vec::with_capacity(failed.len()),
    };
    for f in failed {
        let h = &handlers[f.handler].registration;
        rows.record_ids.push(f.record_id);
        rows.handlers.push(h.identity.clone());
        rows.priorities.push(h.priority);
        rows.phases.push(h.phase.as_str());
        rows.reasons.push(f.reason);
        rows.requires_earlier.push(h.requires_earlier);
    }
    ctx.ready
        .queue
        .dead_letter_skipped(rows)
        .query()
        .execute(&mut **tx)
        .await
        .map_err(stop_from)?;
    Ok(())
}

/// Queues one piece of work per handler per mutated row, with its
/// snapshot, in the batch transaction.
pub(super) async fn enqueue(
    ctx: &RunCtx<'_>,
    tx: &mut sqlx::Transaction<'_, Postgres>,
    handlers: &[crate::domain::handlers::Registered],
    captured: &HashMap<String, Vec<serde_json::Value>>,
    details: &[crate::sql::ledger::DetailRow],
) -> std::result::Result<(), Stop> {
    let mut detail_ids = Vec::new();
    let mut identities = Vec::new();
    let mut priorities: Vec<Option<i32>> = Vec::new();
    let mut phases = Vec::new();
    let mut requires_earlier = Vec::new();
    let mut payloads = Vec::new();
    for d in details {
        let (detail_id, record) = (d.row_detail_id, d.record_id.clone());
        let Some(snapshots) = captured.get(&record) else {
            return Err(Stop::Entity(Diagnostic::capture(
                "handler",
                Some("capture_missing".into()),
                &format!("a mutated row was not among the rows its handlers captured ({record})"),
            )));
        };
        for (h, payload) in handlers.iter().zip(snapshots) {
            detail_ids.push(detail_id);
            identities.push(h.registration.identity.clone());
            priorities.push(h.registration.priority);
            phases.push(h.registration.phase.as_str());
            requires_earlier.push(h.registration.requires_earlier);
            payloads.push(payload.clone());
        }
    }
    let work = crate::sql::queue::Enqueue {
        row_detail_ids: detail_ids,
        run_id: ctx.run_id,
        handlers: identities,
        priorities,
        phases,
        payloads,
        requires_earlier,
    };
    ctx.ready
        .queue
        .enqueue(work)
        .query()
        .execute(&mut **tx)
        .await
        .map_err(stop_from)?;
    Ok(())
}

/// Computes each custom anonymiser's (and the hash's) value on the locked
/// rows, except those `left` names (set aside by a failing `on_before`). Returns the keys in row order and, per row, a JSON object of the
/// new values by column.
pub(super) fn custom_values(
    plan: &EntityPlan,
    scope: &crate::domain::model::AnonymiseContext<'_>,
    key_type: crate::sql::KeyType,
    rows: &[sqlx::postgres::PgRow],
    left: impl Fn(&str) -> bool,
) -> std::result::Result<(Vec<KeyValue>, Vec<serde_json::Value>), Stop> {
    let mut ordered = Vec::with_capacity(rows.len());
    let mut objects = Vec::with_capacity(rows.len());
    for row in rows {
        let key = key_type.decode(row, 0).map_err(stop_from)?;
        let record = key.canonical();
        if left(&record) {
            continue;
        }
        ordered.push(key);
        let mut object = serde_json::Map::new();
        for (column, anonymiser) in &plan.values.custom {
            let cx = crate::domain::model::AnonymiseContext {
                column,
                record_id: Some(&record),
                ..*scope
            };
            let value = anonymiser.apply(&cx, row).map_err(|err| {
                Stop::Entity(Diagnostic::capture(
                    "anonymiser",
                    Some("decode".into()),
                    &err,
                ))
            })?;
            object.insert(column.clone(), value.into_json());
        }
        objects.push(serde_json::Value::Object(object));
    }
    Ok((ordered, objects))
}
