//! Running Cohort day to day: live settings, pauses and pacing, the
//! dispatcher and its dead letters, telemetry reads, peers, maintenance
//! and pruning.

use std::sync::Arc;

use crate::error::{Error, Result};

use super::Cohort;

impl Cohort {
    /// Dead-lettered handler work, most recent first.
    pub async fn dead_letters(
        &self,
        filter: &crate::domain::handlers::DeadLetterFilter,
    ) -> Result<Vec<crate::domain::handlers::DeadLetter>> {
        crate::ops::dead_letters::list(&self.cx, filter).await
    }

    /// Requeues dead letters (due now, attempts reset); returns how many.
    /// Named ids that are unknown, not dead-lettered or scrubbed refuse the
    /// whole request and change nothing.
    pub async fn retry_dead_letters(
        &self,
        selection: &crate::domain::handlers::RetrySelection,
    ) -> Result<u64> {
        let ready = self.cx.ready().await?;
        crate::ops::dead_letters::retry(&ready, selection).await
    }

    /// Row-handler work by state (pending, in flight, dead-lettered), read
    /// now; also sets the `cohort_handler_queue_depth` and
    /// `cohort_dead_letters` gauges (see [`crate::domain::telemetry`]).
    pub async fn queue_depth(&self) -> Result<crate::domain::telemetry::QueueDepth> {
        let depth = crate::ops::dead_letters::depth(&self.cx).await?;
        depth.record();
        Ok(depth)
    }

    /// The settle time of the last successful real (not dry) run of each
    /// kind, read from the ledger now; also sets
    /// `cohort_last_success_timestamp_seconds` (see [`crate::domain::telemetry`]).
    pub async fn last_success(&self) -> Result<crate::domain::telemetry::LastSuccess> {
        let ready = self.cx.ready().await?;
        crate::run::status::last_success(&ready).await
    }

    /// How far behind retention is, per entity, as of the database's clock
    /// now: over every pass of the tenant source, the oldest row still
    /// eligible (past its rule's cutoff, not done, not held) and its age
    /// past the cutoff, for the worst tenant. One indexed `LIMIT 1` read
    /// per entity and pass; nothing is written and no gauge is set (the
    /// worker's gauge is measured after each of its runs).
    pub async fn backlog(&self) -> Result<Vec<crate::domain::telemetry::EntityBacklog>> {
        self.cx.ready().await?;
        let now = crate::sql::database_now(&self.cx.pool).await?;
        let ready = self.cx.ready().await?;
        crate::run::status::backlog(&ready, &self.cx.tenant_source, now).await
    }

    /// Rows real sweeps changed per UTC day and category over the last
    /// `days` days (today included), oldest first.
    pub async fn rows_per_day(&self, days: u32) -> Result<Vec<crate::ops::history::CategoryDay>> {
        let ready = self.cx.ready().await?;
        crate::run::status::rows_per_day(&ready, days).await
    }

    /// The next occurrence of the configured `schedule` after the
    /// database's clock now (`None` when no schedule is set).
    pub async fn next_occurrence(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
        crate::run::status::next_occurrence(&self.cx).await
    }

    /// A dispatcher delivering this handle's queued row-handler work.
    pub fn dispatcher(&self) -> crate::services::Dispatcher {
        crate::services::Dispatcher::new(Arc::clone(&self.cx))
    }

    /// The live settings (`kill_switch`, `dry_run`) as this process sees
    /// them: its own values, the database's, and their OR (see
    /// [`crate::domain::settings`]).
    pub async fn settings(&self) -> Result<crate::domain::settings::LiveSettings> {
        self.cx.ready().await?;
        self.cx.live_settings().await
    }

    /// Sets a live setting in the database: every replica's worker sees it
    /// at its next occurrence or between tenant passes.
    pub async fn set_setting(
        &self,
        setting: crate::domain::settings::Setting,
        enabled: bool,
    ) -> Result<crate::domain::settings::LiveSettings> {
        self.cx.ready().await?;
        self.cx.set_setting(setting, enabled).await
    }

    /// Pauses an entity's sweeps (by name or id), in the database for every
    /// replica: a sweep skips it, or stops before its next batch (the open
    /// one commits whole), and reports it `paused`; its run settles
    /// `paused`. Manual and scheduled sweeps alike; erasures are never
    /// paused. Returns every live pacing row.
    pub async fn pause(&self, entity: &str) -> Result<Vec<crate::domain::settings::LivePacing>> {
        let name = self.entity_name(entity).await?;
        self.cx
            .set_pacing(&name, crate::sql::pacing::SetValue::Paused(true))
            .await
    }

    /// Resumes a paused entity: its next sweep goes on as usual.
    pub async fn resume(&self, entity: &str) -> Result<Vec<crate::domain::settings::LivePacing>> {
        let name = self.entity_name(entity).await?;
        self.cx
            .set_pacing(&name, crate::sql::pacing::SetValue::Paused(false))
            .await
    }

    /// Sets (or clears) a live pacing limit, for one entity (by name or
    /// id) or, with `None`, for every entity. Every sweep reads it before
    /// each batch; the strictest of it, the other live row and the
    /// configuration applies.
    pub async fn set_pacing(
        &self,
        entity: Option<&str>,
        limit: crate::domain::settings::PacingLimit,
    ) -> Result<Vec<crate::domain::settings::LivePacing>> {
        use crate::domain::settings::PacingLimit;
        use crate::sql::pacing::SetValue;
        let scope = match entity {
            Some(e) => self.entity_name(e).await?,
            None => {
                self.cx.ready().await?;
                crate::sql::pacing::EVERY_ENTITY.to_owned()
            }
        };
        let value = match limit {
            PacingLimit::MaxRowsPerSecond(Some(0)) => {
                return Err(Error::InvalidInput(
                    "max_rows_per_second 0: at least 1, or off".into(),
                ))
            }
            PacingLimit::MaxRowsPerSecond(n) => {
                SetValue::Rate(n.map(|n| i32::try_from(n).unwrap_or(i32::MAX)))
            }
            PacingLimit::MaxReplicaLag(lag) => {
                if let Some(lag) = lag {
                    lag.as_replica_lag().map_err(|why| {
                        Error::InvalidInput(format!("max_replica_lag {lag}: {why}"))
                    })?;
                    // The check the policy file's form passes: a lag this
                    // role cannot read is refused, not read as no lag.
                    // (A sweep checks its own role again before it waits.)
                    self.cx.lag_readable().await?;
                }
                SetValue::Lag(lag.map(|p| p.as_seconds().saturating_mul(1000)))
            }
        };
        self.cx.set_pacing(&scope, value).await
    }

    /// Every live pacing row (every entity's first, written `*`).
    pub async fn pacing(&self) -> Result<Vec<crate::domain::settings::LivePacing>> {
        self.cx.ready().await?;
        self.cx.live_pacing().await
    }

    /// A declared entity's name, from its name or id (bad input otherwise).
    async fn entity_name(&self, id_or_name: &str) -> Result<String> {
        let model = self.ready().await?;
        model
            .find_entity(id_or_name)
            .map(|e| e.name.clone())
            .ok_or_else(|| {
                Error::InvalidInput(format!("no retained entity with id or name {id_or_name:?}"))
            })
    }

    /// The live peers: processes running Cohort's services on this
    /// database, with their policy fingerprint (`same_policy` when it is
    /// this handle's) and handlers per entity.
    pub async fn peers(&self) -> Result<Vec<crate::run::peers::Peer>> {
        let ready = self.cx.ready().await?;
        crate::run::peers::live(&ready, None).await
    }

    /// One maintenance pass now (what the always-running maintenance
    /// service does every interval): settle runs left `started` by a lost
    /// process, dead-letter work no registered handler can deliver, scrub
    /// payloads past `payload_retention`, and run again the erasure
    /// requests that may finish ([`Self::resume_erasure_requests`] at the
    /// clock's `now`).
    pub async fn maintain(
        &self,
        config: &crate::services::MaintenanceConfig,
    ) -> Result<crate::services::MaintenanceReport> {
        let ready = self.cx.ready().await?;
        crate::services::rescuer::pass(&ready, config).await
    }

    /// One history-pruning pass now (see [`crate::services::pruner`]):
    /// deletes, or with `dry_run` only counts, what the request's limits
    /// select. An explicit pass does not read the kill switch; the
    /// request's cancellation stops it between batches.
    pub async fn prune(
        &self,
        request: crate::services::PruneRequest,
    ) -> Result<crate::services::PruneReport> {
        let ready = self.cx.ready().await?;
        crate::services::pruner::pass(
            &ready,
            &request.config,
            request.dry_run,
            crate::services::pruner::StopCheck::Explicit(&request.cancel),
        )
        .await
    }

    /// Checks, against the live grants, that the role may do everything
    /// `accesses` need (e.g. `[Access::Runs]` before a manual sweep,
    /// `[Access::Console]` for a read-only dashboard); one error lists
    /// every missing grant, before anything runs.
    pub async fn check_grants(&self, accesses: &[crate::services::Access]) -> Result<()> {
        let ready = self.cx.ready().await?;
        crate::services::grants::check(&ready, accesses).await
    }
}
