//! Row handlers inside a batch: each handler's `on_before` capture on the
//! locked rows, the queueing of their work with the batch, and the values
//! of custom anonymisers.

use sqlx::{Postgres, Row};

use super::work::{stop_from, RunCtx, Stop, Work};
use crate::diagnostic::Diagnostic;
use crate::sql::{DecodeKey, EntityPlan, KeyValue};

/// Runs every handler's `on_before` on each locked row (decoded into the
/// entity's Rust type), in delivery order; returns each row's snapshots by
/// record id, aligned with the handlers. Any failure fails the batch:
/// nothing of it is mutated or queued.
pub(super) async fn capture(
    ctx: &RunCtx<'_>,
    work: &Work<'_>,
    handlers: &[crate::handlers::Registered],
    rows: &[sqlx::postgres::PgRow],
) -> std::result::Result<std::collections::HashMap<String, Vec<serde_json::Value>>, Stop> {
    let key_type = ctx.ready.model.facts[&work.entity.id].record;
    let mut captured = std::collections::HashMap::with_capacity(rows.len());
    for row in rows {
        let record_id = key_type.decode(row, 0).map_err(stop_from)?.canonical();
        let mut payloads = Vec::with_capacity(handlers.len());
        for h in handlers {
            let mut before = crate::handlers::BeforeContext {
                snapshot: crate::handlers::Snapshot::new(),
                record_id: record_id.clone(),
                tenant: ctx.spec.tenant.clone(),
                run_id: ctx.run_id,
                strategy: work.rule.strategy(),
            };
            // Bounded: a hung capture would hold the batch's row locks and
            // the run lock, so that not even recovery could step in.
            let limit = std::time::Duration::from_secs_f64(
                ctx.cx.config.dispatch.claim_timeout.as_seconds() as f64
                    * crate::handlers::DELIVERY_HARD_DEADLINE,
            );
            match tokio::time::timeout(limit, h.handler.before(row, &mut before)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    return Err(Stop::Entity(Diagnostic::capture(
                        "handler",
                        Some("on_before_failed".into()),
                        &err,
                    )))
                }
                Err(_) => {
                    return Err(Stop::Entity(Diagnostic::capture(
                        "handler",
                        Some("on_before_timed_out".into()),
                        &"on_before did not finish within 9/10 of claim_timeout",
                    )))
                }
            }
            payloads.push(before.snapshot.to_json());
        }
        captured.insert(record_id, payloads);
    }
    Ok(captured)
}

/// Queues one piece of work per handler per mutated row, with its
/// snapshot, in the batch transaction.
pub(super) async fn enqueue(
    ctx: &RunCtx<'_>,
    tx: &mut sqlx::Transaction<'_, Postgres>,
    handlers: &[crate::handlers::Registered],
    captured: &std::collections::HashMap<String, Vec<serde_json::Value>>,
    details: &[sqlx::postgres::PgRow],
) -> std::result::Result<(), Stop> {
    let mut detail_ids = Vec::new();
    let mut identities = Vec::new();
    let mut priorities: Vec<Option<i32>> = Vec::new();
    let mut phases = Vec::new();
    let mut requires_earlier = Vec::new();
    let mut payloads = Vec::new();
    for d in details {
        let detail_id: i64 = d.try_get("row_detail_id").map_err(stop_from)?;
        let record: String = d.try_get("record_id").map_err(stop_from)?;
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
/// rows. Returns the keys in row order and, per row, a JSON object of the
/// new values by column.
pub(super) fn custom_values(
    plan: &EntityPlan,
    key_type: crate::sql::KeyType,
    rows: &[sqlx::postgres::PgRow],
) -> std::result::Result<(Vec<KeyValue>, Vec<serde_json::Value>), Stop> {
    let mut ordered = Vec::with_capacity(rows.len());
    let mut objects = Vec::with_capacity(rows.len());
    for row in rows {
        ordered.push(key_type.decode(row, 0).map_err(stop_from)?);
        let mut object = serde_json::Map::new();
        for (column, anonymiser) in &plan.custom {
            let value = anonymiser.apply(row, column).map_err(|err| {
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
