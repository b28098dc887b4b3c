//! The maintenance service, River's rescuer for Cohort: it runs in every
//! `cohort worker` and every [`crate::services::Services`], whether or not
//! row handlers, a schedule or a pruner are configured, and on each pass
//!
//! 1. settles `failed` every run of any kind (scheduled and manual sweeps,
//!    erasures) left `started` past `settle_timeout` whose run lock is free:
//!    its process died, and nobody else would ever settle it;
//! 2. dead-letters handler work that neither this process nor a live peer
//!    registers a handler for (its entity lost its handlers, or the handler
//!    was renamed or removed), once it has waited `settle_timeout`, naming
//!    the reason; `dead-letters retry` brings it back once the handler exists;
//! 3. scrubs captured payloads (personal data) older than
//!    `payload_retention`, whatever became of their work.
//!
//! Between passes it keeps this process's peer record (see
//! [`crate::run::peers`]), every ten seconds.

pub use super::reports::MaintenanceReport;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use crate::base::cancel::Cancel;
use crate::base::locks::LockKey;
use crate::context::{Context, Ready};
use crate::domain::rules::Period;
use crate::error::{Error, Result};
use crate::sql::locks;
use crate::sql::queue;

/// How often the service runs a pass by default.
pub const DEFAULT_MAINTENANCE_INTERVAL: Duration = Duration::from_secs(60);

/// The shortest interval accepted (a pass reads three tables).
pub const MIN_MAINTENANCE_INTERVAL: Duration = Duration::from_secs(1);

/// The reason written on work that requires an earlier handler's work
/// (`requires_earlier`) when that work was dead-lettered and its handler
/// is gone (`%s`: the earlier handler): it could never run.
pub const STUCK_BEHIND_ORPHAN_REASON: &str = "dead-lettered by maintenance: it requires the earlier handler %s's work for its row, which is dead-lettered and no handler of that name is registered (removed, or renamed); retry both once that handler exists again";

/// The reason written on work dead-lettered because no handler can take it.
pub const ORPHANED_WORK_REASON: &str = "dead-lettered by maintenance: no handler of this name is registered for its entity (removed from the code or the policy, or renamed); retry it once the handler exists again";

/// The maintenance service's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaintenanceConfig {
    interval: Duration,
    settle_timeout: Period,
    payload_retention: Period,
}

impl MaintenanceConfig {
    /// Checked settings: `interval` at least [`MIN_MAINTENANCE_INTERVAL`];
    /// `settle_timeout` and `payload_retention` positive and of fixed
    /// length (no calendar units).
    pub fn new(
        interval: Duration,
        settle_timeout: Period,
        payload_retention: Period,
    ) -> Result<Self> {
        let mut problems = Vec::new();
        if interval < MIN_MAINTENANCE_INTERVAL {
            problems.push(format!(
                "maintenance interval {interval:?} is shorter than {MIN_MAINTENANCE_INTERVAL:?}"
            ));
        }
        for (name, p) in [
            ("dispatch.settle_timeout", settle_timeout),
            ("dispatch.payload_retention", payload_retention),
        ] {
            if p.is_zero() {
                problems.push(format!("{name} must be greater than zero"));
            }
            if let Err(e) = p.require_fixed() {
                problems.push(format!("{name}: {e}"));
            }
        }
        if !problems.is_empty() {
            return Err(Error::Config(crate::error::Problems::global(problems)));
        }
        Ok(Self {
            interval,
            settle_timeout,
            payload_retention,
        })
    }

    /// The configuration's `dispatch.settle_timeout` and
    /// `dispatch.payload_retention`, every [`DEFAULT_MAINTENANCE_INTERVAL`].
    pub fn from_config(config: &crate::config::CohortConfig) -> Result<Self> {
        Self::new(
            DEFAULT_MAINTENANCE_INTERVAL,
            config.dispatch.settle_timeout,
            config.dispatch.payload_retention,
        )
    }

    /// The same settings, run every `interval`.
    pub fn interval(self, interval: Duration) -> Result<Self> {
        Self::new(interval, self.settle_timeout, self.payload_retention)
    }

    /// How often a pass runs.
    pub fn every(&self) -> Duration {
        self.interval
    }
}

/// One maintenance pass now.
pub(crate) async fn pass(cx: &Ready<'_>, config: &MaintenanceConfig) -> Result<MaintenanceReport> {
    let prepared = cx.plans();
    let settle = config.settle_timeout.as_seconds() as f64;
    let report = MaintenanceReport {
        recovered_runs: recover_stale_runs(cx, prepared, settle).await?,
        orphaned_work: dead_letter_orphans(cx, settle).await?,
        scrubbed: prepared
            .queue
            .scrub(config.payload_retention.as_seconds() as f64)
            .query()
            .execute(&cx.pool)
            .await?
            .rows_affected(),
        ..MaintenanceReport::default()
    };
    let resumed = crate::run::requests::resume(
        cx,
        // One clock with the holds' release times: the database's.
        crate::sql::database_now(&cx.pool).await?,
        false,
        &crate::base::cancel::Cancel::new(),
    )
    .await?;
    Ok(MaintenanceReport {
        erasure_requests_resumed: resumed.resumed,
        erasure_requests_completed: resumed.completed,
        ..report
    })
}

/// Settles as failed each run left started whose run lock no one has
/// held past `settle` seconds. Returns how many.
async fn recover_stale_runs(
    cx: &Ready<'_>,
    prepared: &crate::context::Prepared,
    settle: f64,
) -> Result<u64> {
    let stale: Vec<uuid::Uuid> = prepared
        .queue
        .stale_runs(settle)
        .query_scalar()
        .fetch_all(&cx.pool)
        .await?;
    let mut recovered = 0;
    for run_id in stale {
        if recover_run(
            cx,
            run_id,
            "run: recovered: the process running it stopped before it settled (no run lock held past settle_timeout)",
        )
        .await?
            == Recovery::Recovered
        {
            tracing::warn!(%run_id, "maintenance: recovered a run left started as failed");
            recovered += 1;
        }
    }
    Ok(recovered)
}

/// Dead-letters handler work no registered handler can deliver, older
/// than `settle` seconds, then the work waiting behind it. Returns how
/// many.
async fn dead_letter_orphans(cx: &Ready<'_>, settle: f64) -> Result<u64> {
    // Handlers this process registers, and those of live peers: work a
    // live peer can deliver is not orphaned (a rolling deploy).
    let mut known = crate::run::peers::own_handlers(cx);
    for peer in crate::run::peers::live(cx, None).await? {
        for (entity, hs) in peer.handlers {
            known.entry(entity).or_default().extend(hs);
        }
    }
    let (entities, handlers): (Vec<uuid::Uuid>, Vec<String>) = known
        .into_iter()
        .flat_map(|(entity, hs)| hs.into_iter().map(move |h| (entity, h)))
        .unzip();
    let mut orphaned: Vec<String> = queue::orphans(
        &cx.config.schema,
        queue::Orphans {
            entities: entities.clone(),
            handlers: handlers.clone(),
            reason: ORPHANED_WORK_REASON,
            older_than_secs: settle,
        },
    )
    .query_scalar()
    .fetch_all(&cx.pool)
    .await?;
    // Then the work that waits for an orphan's (now dead-lettered) work
    // and so could never run.
    orphaned.extend(
        queue::stuck_behind_orphans(
            &cx.config.schema,
            queue::Orphans {
                entities,
                handlers,
                reason: STUCK_BEHIND_ORPHAN_REASON,
                older_than_secs: settle,
            },
        )
        .query_scalar::<String>()
        .fetch_all(&cx.pool)
        .await?,
    );
    for handler in &orphaned {
        crate::domain::telemetry::delivery(handler, "dead_lettered");
    }
    if !orphaned.is_empty() {
        tracing::warn!(
            count = orphaned.len(),
            "maintenance: dead-lettered handler work no registered handler can deliver"
        );
    }
    Ok(orphaned.len() as u64)
}

/// Keeps this process's peer record (a heartbeat every
/// [`crate::run::peers::PEER_HEARTBEAT_INTERVAL`], reporting peers whose policy
/// differs) and runs a pass every interval until `cancel` fires; then it
/// removes the peer record. A failed pass or heartbeat is logged and tried
/// again at the next.
pub(crate) async fn run(
    cx: Arc<Context>,
    config: MaintenanceConfig,
    cancel: Cancel,
    events: super::events::Events,
) {
    tracing::info!(
        interval_s = config.interval.as_secs(),
        "maintenance service started"
    );
    let peer_id = uuid::Uuid::new_v4();
    let mut next_pass = tokio::time::Instant::now();
    let mut reported_other: Option<usize> = None;
    while !cancel.is_cancelled() {
        // Validated once; until then (a schema not yet migrated, say) each
        // beat says why and tries again.
        match cx.ready().await {
            Ok(ready) => {
                beat(&ready, peer_id, &mut reported_other).await;
                if tokio::time::Instant::now() >= next_pass {
                    let done = pass(&ready, &config).await;
                    report_pass(&events, done);
                    next_pass = tokio::time::Instant::now() + config.interval;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the handle is not valid; maintenance retries at its next heartbeat")
            }
        }
        let wait = crate::run::peers::PEER_HEARTBEAT_INTERVAL
            .min(next_pass.saturating_duration_since(tokio::time::Instant::now()));
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    if let Err(e) = crate::run::peers::leave(&cx, peer_id).await {
        tracing::warn!(error = %e, "removing this process's peer record failed; it expires by itself");
    }
}

/// This process's heartbeat, and what it says of the live peers: their
/// count by policy, a warning once per change when one runs another policy.
async fn beat(ready: &Ready<'_>, peer_id: uuid::Uuid, reported_other: &mut Option<usize>) {
    if let Err(e) = crate::run::peers::heartbeat(ready, peer_id).await {
        tracing::warn!(error = %e, "peer heartbeat failed; retrying");
        return;
    }
    let peers = match crate::run::peers::live(ready, Some(peer_id)).await {
        Ok(peers) => peers,
        Err(e) => {
            tracing::warn!(error = %e, "reading the peer records failed");
            return;
        }
    };
    let other = peers.iter().filter(|p| !p.same_policy).count();
    crate::domain::telemetry::peers(peers.len() - other, other);
    if other > 0 && *reported_other != Some(other) {
        for p in peers.iter().filter(|p| !p.same_policy) {
            tracing::warn!(host = %p.host, pid = p.pid, fingerprint = %p.policy_fingerprint, "a live peer sweeps this database with another policy (other entities or handlers): each policy runs its own occurrences, and entities whose handlers differ are left alone until the replicas agree");
        }
    }
    *reported_other = Some(other);
    if let Err(e) = crate::run::peers::census(ready).await {
        tracing::warn!(error = %e, "counting the peer records failed");
    }
}

/// Says how a maintenance pass went: an event, and a log line when it did
/// something or failed.
fn report_pass(events: &super::events::Events, done: Result<MaintenanceReport>) {
    if let Ok(r) = &done {
        events.send(super::events::ServiceEvent::MaintenancePass(*r));
    }
    match done {
        Ok(r) if r != MaintenanceReport::default() => {
            tracing::info!(
                recovered_runs = r.recovered_runs,
                orphaned_work = r.orphaned_work,
                scrubbed = r.scrubbed,
                "maintenance pass"
            );
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "maintenance pass failed; retrying at the next"),
    }
}

/// Settles the run `failed` and links it in the ledger's hash chain, in
/// one transaction; no row when it had settled meanwhile.
async fn recover_linked(
    cx: &Context,
    prepared: &crate::context::Prepared,
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    reason: &str,
) -> std::result::Result<Option<crate::sql::ledger::SettledRow>, sqlx::Error> {
    let mut tx = sqlx::Connection::begin_with(&mut *conn, crate::sql::READ_COMMITTED).await?;
    let settling = crate::run::chain::Settling::Recovered(queue::Recover {
        run_id,
        reason: reason.to_owned(),
    });
    let chain = (cx.config.schema.as_str(), cx.config.ledger_key.as_ref());
    let row = crate::run::chain::settle_run(&mut tx, prepared, chain, run_id, settling).await?;
    tx.commit().await?;
    Ok(row)
}

/// What [`recover_run`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recovery {
    /// The run was left `started` by a lost owner: settled `failed` now.
    Recovered,
    /// The run had settled meanwhile.
    Settled,
    /// Its run lock is held: the run is live (or its owner's session is
    /// still ending).
    Live,
}

/// Settles `failed` a run left `started` if its run lock can be taken (a
/// live run holds it, so it is never recovered).
pub(crate) async fn recover_run(cx: &Ready<'_>, run_id: Uuid, reason: &str) -> Result<Recovery> {
    let prepared = cx.plans();
    let mut conn = cx.pool.acquire().await?;
    if !locks::try_lock(&mut conn, LockKey::Run(run_id)).await? {
        return Ok(Recovery::Live);
    }
    let done = recover_linked(cx, prepared, &mut conn, run_id, reason).await;
    if locks::unlock(&mut conn, LockKey::Run(run_id))
        .await
        .is_err()
    {
        // Closing the connection releases the lock.
        drop(conn.detach());
    }
    Ok(match done? {
        Some(row) => {
            crate::domain::telemetry::run_recorded_failed(&row.kind, &row.trigger);
            Recovery::Recovered
        }
        None => Recovery::Settled,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_constructor_validates() {
        let p = |s: &str| s.parse::<Period>().unwrap();
        assert!(MaintenanceConfig::new(Duration::from_secs(60), p("1h"), p("30d")).is_ok());
        let err = MaintenanceConfig::new(Duration::from_millis(10), p("0s"), p("1mo"))
            .unwrap_err()
            .to_string();
        for expected in [
            "shorter than",
            "settle_timeout must be greater than zero",
            "payload_retention",
            "calendar",
        ] {
            assert!(err.contains(expected), "{err}");
        }
        let defaults =
            MaintenanceConfig::from_config(&crate::config::CohortConfig::default()).unwrap();
        assert_eq!(defaults.every(), DEFAULT_MAINTENANCE_INTERVAL);
    }
}
