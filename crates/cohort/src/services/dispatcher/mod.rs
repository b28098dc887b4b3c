//! The dispatcher: delivers queued handler work at least once.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;
use uuid::Uuid;

pub(crate) mod command;
mod config;

use config::{backoff_secs, claim_limit, cleanup_timeout, delivery_deadlines};
pub use config::{
    DispatcherConfig, DEFAULT_DISPATCH_BASE_BACKOFF_SECS, DEFAULT_DISPATCH_BATCH_SIZE,
    DEFAULT_DISPATCH_CLAIM_TIMEOUT_SECS, DEFAULT_DISPATCH_MAX_ATTEMPTS,
    DEFAULT_DISPATCH_MAX_PARALLELISM, DEFAULT_DISPATCH_POLL_INTERVAL_SECS, MAX_DISPATCH_BATCH_SIZE,
    MAX_DISPATCH_MAX_ATTEMPTS, MAX_DISPATCH_MAX_PARALLELISM,
};

use crate::base::cancel::Cancel;
use crate::base::diagnostic::Diagnostic;
use crate::context::{Context, Prepared, Ready};
use crate::domain::handlers::{AfterContext, Snapshot};
use crate::domain::rules::Strategy;
use crate::error::Result;
use crate::sql::queue;

/// What one [`Dispatcher::flush`] did, and what it left.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct FlushReport {
    /// Deliveries that succeeded and settled.
    pub delivered: u64,
    /// Deliveries that failed and were put back for a retry.
    pub failed: u64,
    /// Work dead-lettered (attempts exhausted, unknown handler, tampered or
    /// scrubbed payload).
    pub dead_lettered: u64,
    /// Deliveries whose claim was taken over meanwhile: their outcome was
    /// discarded (the newer delivery settles the row).
    pub superseded: u64,
    /// Deliveries whose outcome could not be recorded: left in flight
    /// until their claim expires and they are reclaimed.
    pub unrecorded: u64,
    /// Deliveries stopped by shutdown after the grace period: their claims
    /// were released (due again now; the attempt counts).
    pub released: u64,
    /// Runs left `started` past `settle_timeout` that were settled `failed`.
    pub recovered_runs: u64,
    /// Payloads cleared by the `payload_retention` backstop.
    pub scrubbed: u64,
    /// Work still pending afterwards (due later, after its backoff or its
    /// run settling).
    pub pending: u64,
    /// Work in flight afterwards (claimed by another dispatcher).
    pub in_flight: u64,
}

/// Delivers queued handler work (see [`crate::domain::handlers`]). Cheap to clone;
/// any number may run at once, in one process or many.
#[derive(Clone)]
pub struct Dispatcher {
    cx: Arc<Context>,
    config: DispatcherConfig,
    /// Fires when in-flight deliveries must stop now (shutdown after the
    /// grace period): their handlers are cancelled and dropped, their
    /// claims released.
    stop: Cancel,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher").finish_non_exhaustive()
    }
}

/// One claimed piece of work.
impl Claimed {
    fn fenced(&self) -> queue::Fenced {
        queue::Fenced {
            id: self.id,
            token: self.token,
        }
    }
}

struct Claimed {
    id: i64,
    row_detail_id: i64,
    handler: String,
    attempt: i32,
    token: Uuid,
    payload: Option<serde_json::Value>,
    scrubbed: bool,
    run_id: Uuid,
    entity_id: Uuid,
    record_id: String,
    tenant: Option<String>,
    action: String,
    run_kind: String,
}

impl From<queue::ClaimedRow> for Claimed {
    fn from(r: queue::ClaimedRow) -> Self {
        Self {
            id: r.handler_status_id,
            row_detail_id: r.row_detail_id,
            handler: r.handler_id,
            attempt: r.attempts,
            token: r.claim_token,
            payload: r.captured_payload,
            scrubbed: r.scrubbed,
            run_id: r.run_id,
            entity_id: r.retention_entity_id,
            record_id: r.record_id,
            tenant: r.tenant_id,
            action: r.action,
            run_kind: r.kind,
        }
    }
}

enum Outcome {
    Delivered,
    Failed,
    DeadLettered,
    Superseded,
    Unrecorded,
    Released,
}

impl Dispatcher {
    pub(crate) fn new(cx: Arc<Context>) -> Self {
        Self {
            config: DispatcherConfig::of(&cx.config.dispatch),
            cx,
            stop: Cancel::new(),
        }
    }

    /// This dispatcher, whose in-flight deliveries stop when `stop` fires.
    pub(crate) fn stopping_on(mut self, stop: Cancel) -> Self {
        self.stop = stop;
        self
    }

    /// Runs one maintenance pass (stale runs recovered, orphaned work
    /// dead-lettered, expired payloads scrubbed: see
    /// [`crate::services::rescuer`]), then delivers everything due now
    /// until nothing is left to claim; reports what it did and what it
    /// left (in flight elsewhere, or pending for later).
    pub async fn flush(&self) -> Result<FlushReport> {
        let config = crate::services::MaintenanceConfig::from_config(&self.cx.config)?;
        let ready = self.cx.ready().await?;
        let maintained = crate::services::rescuer::pass(&ready, &config).await?;
        let mut report = self.deliver_until(&Cancel::new()).await?;
        report.recovered_runs = maintained.recovered_runs;
        report.scrubbed = maintained.scrubbed;
        report.dead_lettered += maintained.orphaned_work;
        Ok(report)
    }

    /// Delivers everything due now, stopping between batches once `cancel`
    /// fires. Maintenance is not the dispatcher's: the maintenance service
    /// runs beside it in [`crate::services::Services`].
    async fn deliver_until(&self, cancel: &Cancel) -> Result<FlushReport> {
        let ready = self.cx.ready().await?;
        let prepared = ready.plans();
        let foreign = self.foreign_handlers(&ready).await?;
        let mut report = FlushReport::default();
        while !cancel.is_cancelled() {
            let claimed = self.claim(prepared, &foreign).await?;
            if claimed.is_empty() {
                break;
            }
            for outcome in self.deliver_all(prepared, claimed).await {
                match outcome {
                    Outcome::Delivered => report.delivered += 1,
                    Outcome::Failed => report.failed += 1,
                    Outcome::DeadLettered => report.dead_lettered += 1,
                    Outcome::Superseded => report.superseded += 1,
                    Outcome::Unrecorded => report.unrecorded += 1,
                    Outcome::Released => report.released += 1,
                }
            }
        }
        let row = prepared
            .queue
            .outstanding()
            .query_as::<queue::OutstandingRow>()
            .fetch_one(&self.cx.pool)
            .await?;
        report.pending = row.pending.max(0) as u64;
        report.in_flight = row.in_flight.max(0) as u64;
        Ok(report)
    }

    /// Delivers what is due every `poll_interval` until `cancel` fires (no
    /// maintenance: run it through [`crate::services::Services`]). A failed poll
    /// (e.g. the database restarting) is logged and retried next time.
    pub async fn run(&self, cancel: Cancel) {
        let interval = self.config.poll_interval;
        while !cancel.is_cancelled() {
            if let Err(e) = self.deliver_until(&cancel).await {
                tracing::warn!(error = %e, "dispatcher poll failed; retrying at the next poll");
            }
            let mut waited = Duration::ZERO;
            while waited < interval && !cancel.is_cancelled() {
                let step = Duration::from_millis(100).min(interval - waited);
                tokio::time::sleep(step).await;
                waited += step;
            }
        }
    }

    /// `entity|handler` keys of work a live peer registers a handler for
    /// and this process does not: the peer's to deliver (a rolling
    /// deploy), so never claimed here and never dead-lettered as unknown.
    /// Read once per flush, not per claimed batch.
    async fn foreign_handlers(&self, ready: &Ready<'_>) -> Result<Vec<String>> {
        let own = crate::run::peers::own_handlers(&self.cx);
        let mut foreign: Vec<String> = Vec::new();
        for peer in crate::run::peers::live(ready, None).await? {
            for (entity, theirs) in &peer.handlers {
                if let Some(ours) = own.get(entity) {
                    foreign.extend(theirs.difference(ours).map(|h| format!("{entity}|{h}")));
                }
            }
        }
        Ok(foreign)
    }

    async fn claim(&self, prepared: &Prepared, foreign: &[String]) -> Result<Vec<Claimed>> {
        let d = &self.config;
        let claim = queue::Claim {
            limit: claim_limit(d.batch_size, d.max_parallelism),
            claim_timeout_secs: d.claim_timeout_secs,
            entities: self.cx.handlers.keys().copied().collect(),
            foreign: foreign.to_vec(),
        };
        let rows = prepared
            .queue
            .claim(claim)
            .query_as::<queue::ClaimedRow>()
            .fetch_all(&self.cx.pool)
            .await?;
        Ok(rows.into_iter().map(Claimed::from).collect())
    }

    /// Delivers a claimed batch, at most `max_parallelism` at once.
    async fn deliver_all(&self, prepared: &Arc<Prepared>, claimed: Vec<Claimed>) -> Vec<Outcome> {
        let limit = self.config.max_parallelism as usize;
        let semaphore = Arc::new(tokio::sync::Semaphore::new(limit));
        let mut tasks = tokio::task::JoinSet::new();
        for work in claimed {
            let this = self.clone();
            let prepared = Arc::clone(prepared);
            let permit = Arc::clone(&semaphore);
            let span = tracing::info_span!(
                "cohort.delivery",
                handler = %work.handler,
                attempt = work.attempt.max(1),
                work = work.id,
                run_id = %work.run_id,
            );
            tasks.spawn(
                async move {
                    let _permit = permit.acquire_owned().await.expect("semaphore open");
                    let handler = work.handler.clone();
                    let outcome = this.deliver(&prepared, work).await;
                    match outcome {
                        Outcome::Delivered => {
                            crate::domain::telemetry::delivery(&handler, "delivered")
                        }
                        Outcome::Failed => crate::domain::telemetry::delivery(&handler, "failed"),
                        Outcome::DeadLettered => {
                            crate::domain::telemetry::delivery(&handler, "dead_lettered")
                        }
                        // Not recorded by this dispatcher: nothing to count.
                        Outcome::Superseded | Outcome::Unrecorded | Outcome::Released => {}
                    }
                    outcome
                }
                .instrument(span),
            );
        }
        let mut out = Vec::new();
        while let Some(done) = tasks.join_next().await {
            match done {
                Ok(outcome) => out.push(outcome),
                Err(e) => {
                    // A panicking handler: its claim stays until it expires.
                    tracing::error!(error = %e, "a delivery task panicked");
                    out.push(Outcome::Unrecorded);
                }
            }
        }
        out
    }

    async fn deliver(&self, prepared: &Prepared, work: Claimed) -> Outcome {
        let attempt = work.attempt.max(1) as u32;
        let composite = prepared
            .model
            .entity(work.entity_id)
            .is_some_and(crate::domain::model::EntityDescriptor::has_composite_key);
        let (handler, ctx) = match self.deliverable(&work, attempt, composite) {
            Ok(ready) => ready,
            Err(reason) => return self.settle_failure(prepared, &work, &reason, true).await,
        };
        // The handler's deadline: its cancel fires first, and it is dropped
        // later if it ignores it; both before the claim expires.
        let (soft, deadline) = delivery_deadlines(self.config.claim_timeout_secs);
        let cancel = ctx.cancel.clone();
        let delivery = handler.handler.after(&ctx);
        tokio::pin!(delivery);
        let bounded = async {
            match tokio::time::timeout(soft, &mut delivery).await {
                Ok(r) => Ok(r),
                Err(_) => {
                    cancel.cancel();
                    tokio::time::timeout(deadline - soft, &mut delivery).await
                }
            }
        };
        let result = tokio::select! {
            // A delivery that has finished is recorded, never released.
            biased;
            r = bounded => r,
            _ = self.stop.cancelled() => {
                // Shutdown's grace period is over: the handler is told,
                // dropped, and the work put back for another dispatcher.
                cancel.cancel();
                return self.release(prepared, &work).await;
            }
        };
        let error = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(
                match e.downcast_ref::<crate::domain::handlers::SafeReason>() {
                    Some(safe) => safe.0.clone(),
                    None => Diagnostic::capture("handler", Some("on_after_failed".into()), &e)
                        .to_string(),
                },
            ),
            Err(_) => {
                cancel.cancel();
                Some(format!(
                    "kind=handler code=timed_out after {:.1}s",
                    deadline.as_secs_f64()
                ))
            }
        };
        match error {
            None => self.settle_success(prepared, &work).await,
            Some(e) => {
                let dead = attempt >= self.config.max_attempts;
                self.settle_failure(prepared, &work, &e, dead).await
            }
        }
    }

    /// The claimed work's handler and the context it is called with, or
    /// why it can never be delivered (dead-lettered at once): its attempts
    /// are spent, its payload scrubbed or unreadable, its handler unknown
    /// or its action not a strategy.
    fn deliverable<'h>(
        &'h self,
        work: &Claimed,
        attempt: u32,
        composite: bool,
    ) -> std::result::Result<(&'h crate::domain::handlers::Registered, AfterContext), String> {
        if attempt > self.config.max_attempts {
            return Err(
                "attempts exhausted: the last claim expired before the delivery settled".into(),
            );
        }
        if work.scrubbed {
            return Err(
                "payload scrubbed after payload_retention; the work can never complete".into(),
            );
        }
        let Some(handler) = self
            .cx
            .handlers
            .get(&work.entity_id)
            .and_then(|hs| hs.iter().find(|h| h.registration.identity == work.handler))
        else {
            return Err(format!(
                "unknown handler {:?} for entity {}: removed from the code or renamed",
                work.handler, work.entity_id
            ));
        };
        let snapshot = match work
            .payload
            .clone()
            .ok_or_else(|| "payload missing".to_string())
            .and_then(Snapshot::from_json)
        {
            Ok(s) => s,
            Err(e) => {
                // The decoder's own text can quote the payload: never stored.
                tracing::warn!(work = work.id, "dead-lettering an unreadable payload");
                drop(e);
                return Err(
                    "tampered or unreadable payload: the stored snapshot does not decode".into(),
                );
            }
        };
        let Ok(strategy) = work.action.parse::<Strategy>() else {
            return Err(format!(
                "tampered row detail: unknown action {:?}",
                work.action
            ));
        };
        let ctx = AfterContext {
            snapshot,
            entity_id: work.entity_id,
            record_id: work.record_id.clone(),
            record_key: record_key_json(&work.record_id, composite),
            tenant: work.tenant.clone(),
            run_id: work.run_id,
            run_kind: if work.run_kind == "erasure" {
                crate::domain::outcome::RunKind::Erasure
            } else {
                crate::domain::outcome::RunKind::Sweep
            },
            strategy,
            work_id: work.id,
            attempt,
            handler: work.handler.clone(),
            cancel: Cancel::new(),
        };
        Ok((handler, ctx))
    }

    /// How long recording an outcome may take: a tenth of the claim
    /// time-out, between 100 ms and 10 s. Past it the delivery is left in
    /// flight (reclaimed when its claim expires) and the batch goes on.
    fn cleanup_timeout(&self) -> Duration {
        cleanup_timeout(self.config.claim_timeout_secs)
    }

    /// Runs a settling statement within the cleanup time-out.
    async fn record(
        &self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> std::result::Result<Option<sqlx::postgres::PgRow>, String> {
        match tokio::time::timeout(self.cleanup_timeout(), query.fetch_optional(&self.cx.pool))
            .await
        {
            Ok(Ok(row)) => Ok(row),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "no answer within {:.1}s",
                self.cleanup_timeout().as_secs_f64()
            )),
        }
    }

    async fn release(&self, prepared: &Prepared, work: &Claimed) -> Outcome {
        let released = self
            .record(prepared.queue.release(work.fenced()).query())
            .await;
        match released {
            Ok(Some(_)) => {
                tracing::info!(work = work.id, handler = %work.handler, "delivery stopped by shutdown; claim released");
                Outcome::Released
            }
            Ok(None) => {
                tracing::info!(work = work.id, handler = %work.handler, "this delivery's claim had expired and was taken over: its result is not recorded, the newer delivery's stands");
                Outcome::Superseded
            }
            Err(e) => {
                tracing::warn!(work = work.id, error = %e, "releasing a claim failed; the work is reclaimed when its claim expires");
                Outcome::Unrecorded
            }
        }
    }

    async fn settle_success(&self, prepared: &Prepared, work: &Claimed) -> Outcome {
        let settled = self
            .record(prepared.queue.succeed(work.fenced()).query())
            .await;
        match settled {
            Ok(Some(_)) => {
                self.clear_payloads(prepared, work.row_detail_id).await;
                Outcome::Delivered
            }
            Ok(None) => {
                tracing::info!(work = work.id, handler = %work.handler, "this delivery's claim had expired and was taken over: its result is not recorded, the newer delivery's stands");
                Outcome::Superseded
            }
            Err(e) => {
                tracing::warn!(work = work.id, error = %e, "recording a delivery failed; the work stays in flight until reclaimed");
                Outcome::Unrecorded
            }
        }
    }

    async fn settle_failure(
        &self,
        prepared: &Prepared,
        work: &Claimed,
        error: &str,
        dead: bool,
    ) -> Outcome {
        let backoff = backoff_secs(self.config.base_backoff_secs, work.attempt);
        let settled = self
            .record(
                prepared
                    .queue
                    .fail(queue::Fail {
                        work: work.fenced(),
                        error: error.to_owned(),
                        retry_in_secs: if dead { 0.0 } else { backoff },
                        dead,
                    })
                    .query(),
            )
            .await;
        match settled {
            Ok(Some(_)) if dead => {
                tracing::warn!(work = work.id, handler = %work.handler, error, "work dead-lettered");
                self.clear_payloads(prepared, work.row_detail_id).await;
                Outcome::DeadLettered
            }
            Ok(Some(_)) => {
                tracing::warn!(work = work.id, handler = %work.handler, error, retry_in_s = backoff, "delivery failed; retried after its back-off");
                Outcome::Failed
            }
            Ok(None) => {
                tracing::info!(work = work.id, handler = %work.handler, "this delivery's claim had expired and was taken over: its result is not recorded, the newer delivery's stands");
                Outcome::Superseded
            }
            Err(e) => {
                // The primary error (the delivery's) is kept, beside the
                // failure to record it.
                tracing::warn!(work = work.id, delivery_error = error, record_error = %e, "recording a failed delivery failed; the work stays in flight until reclaimed");
                Outcome::Unrecorded
            }
        }
    }

    /// Clears a row's payloads once all its handlers are terminal; a
    /// failure here is only logged (the backstop scrub catches it).
    async fn clear_payloads(&self, prepared: &Prepared, row_detail_id: i64) {
        if let Err(e) = prepared
            .queue
            .clear_payloads(row_detail_id)
            .query()
            .execute(&self.cx.pool)
            .await
        {
            tracing::warn!(row_detail_id, error = %e, "clearing payloads failed; the backstop scrub will");
        }
    }
}

/// A record id as JSON: a string, or the array a composite key's text is.
fn record_key_json(record_id: &str, composite: bool) -> serde_json::Value {
    composite
        .then(|| serde_json::from_str(record_id).ok())
        .flatten()
        .unwrap_or_else(|| serde_json::Value::String(record_id.to_owned()))
}
