//! The [`Cohort`] handle: configuration, declarations and rules, validated
//! against the live database before it is used.

use std::sync::Arc;

use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::OnceCell;

use crate::config::CohortConfig;
use crate::context::Context;
use crate::context::ObserverHub;
use crate::domain::model::{EntityDeclaration, Retained};
use crate::domain::observer::AuditObserver;
use crate::domain::rules::{RuleProvider, StaticRuleProvider};
use crate::error::{Error, Result};
use crate::policy::{PolicyFile, TenantEntry};
use crate::validate::ValidatedModel;

/// A configured Cohort. Cheap to clone; all clones share one readiness state.
///
/// Build it with [`Cohort::builder`] and [`CohortBuilder::build`], which
/// validates against the database and refuses to start with the complete
/// list of problems. A handle made with [`CohortBuilder::build_unvalidated`]
/// validates on first use instead ([`Cohort::ready`]) and caches only
/// success, so a failed check is retried on the next call.
#[derive(Clone)]
pub struct Cohort {
    cx: Arc<Context>,
}

impl std::fmt::Debug for Cohort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cohort")
            .field("schema", &self.cx.config.schema)
            .field("entities", &self.cx.declarations.len())
            .field("ready", &self.cx.is_ready())
            .finish_non_exhaustive()
    }
}

/// Builds a [`Cohort`].
#[derive(Clone)]
pub struct CohortBuilder {
    pool: PgPool,
    config: CohortConfig,
    declarations: Vec<EntityDeclaration>,
    rules: Option<Arc<dyn RuleProvider>>,
    observers: Vec<Arc<dyn AuditObserver>>,
    tenants: Vec<TenantEntry>,
    tenant_source: Option<crate::TenantSource>,
    handlers: Vec<crate::domain::handlers::Registered>,
    backlog_gauge: bool,
    journal: Option<crate::domain::journal::JournalConfig>,
}

impl std::fmt::Debug for CohortBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CohortBuilder")
            .field("schema", &self.config.schema)
            .field("entities", &self.declarations.len())
            .finish_non_exhaustive()
    }
}

impl Cohort {
    /// Starts a builder on an existing pool. Cohort takes its own
    /// connections from it and never joins the caller's transactions.
    pub fn builder(pool: PgPool) -> CohortBuilder {
        CohortBuilder {
            pool,
            config: CohortConfig::default(),
            declarations: Vec::new(),
            rules: None,
            observers: Vec::new(),
            tenants: Vec::new(),
            tenant_source: None,
            handlers: Vec::new(),
            backlog_gauge: true,
            journal: None,
        }
    }

    /// Starts a builder on a new pool for `url`.
    pub async fn connect(url: &str) -> Result<CohortBuilder> {
        let pool = PgPoolOptions::new().max_connections(8).connect(url).await?;
        Ok(Self::builder(pool))
    }

    /// The validated model, validating first if this handle has not been
    /// validated yet. Only success is cached.
    pub async fn ready(&self) -> Result<Arc<ValidatedModel>> {
        Ok(Arc::clone(&self.cx.prepared().await?.model))
    }

    /// Sweeps one tenant's tenant-scoped entities (or the tenantless ones):
    /// see the run model in the crate documentation. Returns the settled
    /// result; a bad request is refused before anything is written.
    pub async fn sweep(&self, mut request: crate::SweepRequest) -> Result<crate::SweepResult> {
        crate::run::passes::scoped(&self.cx, &mut request.tenancy, "sweep").await?;
        crate::run::sweep::sweep(&self.cx, request).await
    }

    /// Erases one data subject's rows (see [`crate::domain::erasure`]). Returns the
    /// settled run; a bad request is refused before anything is written.
    pub async fn erase(
        &self,
        mut request: crate::domain::erasure::ErasureRequest,
    ) -> Result<crate::ErasureResult> {
        crate::run::passes::scoped(&self.cx, &mut request.tenancy, "erasure").await?;
        if request.terms.is_some() {
            return crate::run::requests::open(&self.cx, request).await;
        }
        crate::run::erasure::erase(&self.cx, request).await
    }

    /// Erasure requests as `filter` selects them, oldest received first
    /// (see [`crate::domain::erasure_requests`]).
    pub async fn erasure_requests(
        &self,
        filter: crate::domain::erasure_requests::RequestFilter,
    ) -> Result<Vec<crate::domain::erasure_requests::RequestRecord>> {
        self.cx.prepared().await?;
        crate::run::requests::list(&self.cx, filter).await
    }

    /// One erasure request by its reference, with its history; an unknown
    /// reference is [`crate::Error::NotFound`].
    pub async fn erasure_request(
        &self,
        reference: &str,
    ) -> Result<crate::domain::erasure_requests::RequestHistory> {
        self.cx.prepared().await?;
        crate::run::requests::show(&self.cx, reference).await
    }

    /// Moves an erasure request's due date, recording why (a line of its
    /// history). Refused for a completed request and for a date in the
    /// past.
    pub async fn extend_erasure_request(
        &self,
        reference: &str,
        due: crate::domain::erasure_requests::Due,
        reason: &str,
    ) -> Result<crate::domain::erasure_requests::RequestRecord> {
        self.cx.prepared().await?;
        crate::run::requests::extend(&self.cx, reference, due, reason).await
    }

    /// Runs again, at `now`, every erasure request that may have something
    /// left to do: waiting ones whose legal minimum has passed or for which
    /// a hold was released or expired since their last attempt, and
    /// attempts a lost process left in progress. The maintenance service
    /// calls it every pass with the clock's `now`; `allow_future_now` as
    /// for an erasure (a later `now` erases rows whose legal minimum has
    /// not passed yet).
    pub async fn resume_erasure_requests<Tz: chrono::TimeZone>(
        &self,
        now: chrono::DateTime<Tz>,
        allow_future_now: bool,
    ) -> Result<crate::domain::erasure_requests::ResumeReport> {
        self.cx.prepared().await?;
        let now = crate::domain::outcome::logical_now(now);
        crate::run::resolve::check_now(&self.cx, now, true, allow_future_now).await?;
        crate::run::requests::resume(&self.cx, now, allow_future_now, &crate::Cancel::new()).await
    }

    /// Compares the database with the journal (see [`crate::ops::restore`]):
    /// the erasure requests and holds it holds that the database lacks.
    /// Reads only. Refused without a journal, and when the journal's chain
    /// is broken (naming the entry).
    pub async fn restore_check(&self) -> Result<crate::ops::restore::RestoreCheck> {
        self.cx.prepared().await?;
        crate::ops::restore::check(&self.cx).await
    }

    /// Brings the database back to the journal after a restore (see
    /// [`crate::ops::restore`]); with `dry_run`, only says what it would do.
    pub async fn replay(&self, dry_run: bool) -> Result<crate::ops::restore::ReplayReport> {
        self.cx.prepared().await?;
        crate::ops::restore::replay(&self.cx, dry_run, None).await
    }

    /// [`Cohort::replay`] onto a copy of the journal in `dir` (copied
    /// there first, unless a copy is there already): what a restore drill
    /// on another cluster runs, so that the production journal gains no
    /// entry. A replay without a copy is refused on a cluster other than
    /// the one the journal was written for (its system identifier).
    pub async fn replay_onto_copy(
        &self,
        dry_run: bool,
        dir: &std::path::Path,
    ) -> Result<crate::ops::restore::ReplayReport> {
        self.cx.prepared().await?;
        crate::ops::restore::replay(&self.cx, dry_run, Some(dir)).await
    }

    /// Whether a journal is configured.
    pub fn has_journal(&self) -> bool {
        self.cx.journal.is_some()
    }

    /// Erasure requests per state and those overdue, read now; also sets
    /// `cohort_erasure_requests{state}` and `cohort_erasure_requests_overdue`
    /// (see [`crate::domain::telemetry`]).
    pub async fn erasure_request_counts(
        &self,
    ) -> Result<crate::domain::erasure_requests::RequestCounts> {
        self.cx.prepared().await?;
        let counts = crate::run::requests::counts(&self.cx).await?;
        counts.record();
        Ok(counts)
    }

    /// Runs the application's own deletion of `request.record_ids` inside a
    /// Cohort transaction, unless a target is under an active legal hold
    /// (see [`crate::ops::guarded`]).
    ///
    /// ```no_run
    /// # async fn f(cohort: cohort::Cohort, entity: uuid::Uuid) -> Result<(), cohort::Error> {
    /// use cohort::guarded::{Guarded, GuardedDeletion};
    /// let request = GuardedDeletion::new(entity, ["42"]).tenant("11111111-1111-1111-1111-111111111111");
    /// let outcome = cohort
    ///     .guarded_delete(request, |tx| Box::pin(async move {
    ///         let done = sqlx::query("DELETE FROM app.notes WHERE id = 42").execute(&mut *tx).await?;
    ///         Ok(done.rows_affected())
    ///     }))
    ///     .await?;
    /// if let Guarded::Protected { held } = outcome {
    ///     eprintln!("not deleted, under legal hold: {held:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn guarded_delete<T, F>(
        &self,
        request: crate::ops::guarded::GuardedDeletion,
        callback: F,
    ) -> Result<crate::ops::guarded::Guarded<T>>
    where
        F: for<'c> FnOnce(&'c mut sqlx::PgConnection) -> crate::ops::guarded::CallbackFuture<'c, T>,
    {
        crate::ops::guarded::delete(&self.cx, request, callback).await
    }

    /// Guards a deletion the application makes in its **own** transaction
    /// (sqlx here; see docs/derive.md for SeaORM): locks the target rows
    /// `FOR UPDATE` in that transaction and checks for active holds after
    /// the locks. [`Guarded::Completed`](crate::ops::guarded::Guarded) means no
    /// target is held: delete them in the same transaction and commit (the
    /// locks keep any new hold waiting until then). [`Guarded::Protected`](crate::ops::guarded::Guarded)
    /// names the held ids: do not delete them; the transaction stays yours
    /// (the rows stay locked until it ends). Refused unless the transaction
    /// is READ COMMITTED (PostgreSQL's default). Errors leave the
    /// transaction for the caller to roll back.
    ///
    /// ```no_run
    /// # async fn f(cohort: &cohort::Cohort, pool: &cohort::sqlx::PgPool, entity: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
    /// use cohort::guarded::{Guarded, GuardedDeletion};
    /// let mut tx = pool.begin().await?;
    /// // ... the application's own work in `tx` ...
    /// let request = GuardedDeletion::new(entity, ["42"]).tenant("7d1c1c49-0b6a-4f3e-8a43-5d7b3c2f9e10");
    /// match cohort.guard_deletion(&mut tx, request).await? {
    ///     Guarded::Completed(()) => {
    ///         sqlx::query("DELETE FROM app.notes WHERE id = 42").execute(&mut *tx).await?;
    ///         tx.commit().await?;
    ///     }
    ///     Guarded::Protected { held } => {
    ///         tx.rollback().await?;
    ///         eprintln!("under legal hold, not deleted: {held:?}");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn guard_deletion(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        request: crate::ops::guarded::GuardedDeletion,
    ) -> Result<crate::ops::guarded::Guarded<()>> {
        crate::ops::guarded::guard_in(&self.cx, tx, request).await
    }

    /// Sweeps every tenant of `request`'s source, one pass each in
    /// first-seen order (one tenant however its id is spelled), then the
    /// tenantless entities. A pass that fails does not stop the others;
    /// cancellation stops the open pass and skips the rest. A row of the
    /// tenant source that cannot be a tenant, and the absence of any
    /// tenant while there are tenant-scoped entities, are passes that did
    /// not start; the tenantless pass runs whatever happens to the others.
    pub async fn sweep_all(
        &self,
        request: crate::SweepAllRequest,
    ) -> Result<crate::SweepAllResult> {
        crate::run::passes::sweep_all(&self.cx, request).await
    }

    /// The tenants of `source` (the directory, a tenants query or a list),
    /// de-duplicated by tenant identity, and the rows that cannot be
    /// tenants (a NULL id, an id invalid for the tenant columns, a
    /// jurisdiction that is not text), each with its position. A tenants
    /// query that cannot run, or of the wrong shape, is `InvalidInput`.
    /// A query is streamed, never read whole.
    pub async fn tenants(&self, source: &crate::TenantSource) -> Result<crate::TenantDiscovery> {
        crate::run::passes::discover(&self.cx, source).await
    }

    /// Previews every pass `sweep_all` would make for the request's
    /// source, in order; one tenant's failure does not stop the others.
    /// Nothing is written.
    pub async fn preview_all(
        &self,
        request: crate::PreviewAllRequest,
    ) -> Result<crate::PreviewAllResult> {
        crate::run::passes::preview_all(&self.cx, request).await
    }

    /// Counts what a sweep would change now, without writing anything.
    pub async fn preview(
        &self,
        mut request: crate::PreviewRequest,
    ) -> Result<crate::PreviewResult> {
        crate::run::passes::scoped(&self.cx, &mut request.tenancy, "preview").await?;
        crate::run::sweep::preview(&self.cx, request).await
    }

    /// Places a legal hold (see [`crate::ops::holds`] for every check it makes).
    pub async fn create_hold(
        &self,
        request: crate::ops::holds::HoldRequest,
    ) -> Result<crate::ops::holds::Hold> {
        crate::ops::holds::create(&self.cx, request).await
    }

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
        crate::ops::dead_letters::retry(&self.cx, selection).await
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
        self.cx.prepared().await?;
        crate::run::status::last_success(&self.cx).await
    }

    /// How far behind retention is, per entity, as of the database's clock
    /// now: over every pass of the tenant source, the oldest row still
    /// eligible (past its rule's cutoff, not done, not held) and its age
    /// past the cutoff, for the worst tenant. One indexed `LIMIT 1` read
    /// per entity and pass; nothing is written and no gauge is set (the
    /// worker's gauge is measured after each of its runs).
    pub async fn backlog(&self) -> Result<Vec<crate::domain::telemetry::EntityBacklog>> {
        self.cx.prepared().await?;
        let now = crate::sql::database_now(&self.cx.pool).await?;
        crate::run::status::backlog(&self.cx, &self.cx.tenant_source, now).await
    }

    /// Rows real sweeps changed per UTC day and category over the last
    /// `days` days (today included), oldest first.
    pub async fn rows_per_day(&self, days: u32) -> Result<Vec<crate::ops::history::CategoryDay>> {
        self.cx.prepared().await?;
        crate::run::status::rows_per_day(&self.cx, days).await
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
        self.cx.prepared().await?;
        self.cx.live_settings().await
    }

    /// Sets a live setting in the database: every replica's worker sees it
    /// at its next occurrence or between tenant passes.
    pub async fn set_setting(
        &self,
        setting: crate::domain::settings::Setting,
        enabled: bool,
    ) -> Result<crate::domain::settings::LiveSettings> {
        self.cx.prepared().await?;
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
                self.cx.prepared().await?;
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
        self.cx.prepared().await?;
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

    /// This process's own values of the live settings, to flip without a
    /// restart (the database's are set with [`Cohort::set_setting`]).
    pub fn switches(&self) -> &crate::domain::settings::Switches {
        &self.cx.switches
    }

    /// Where the scheduled worker takes its tenants from.
    pub fn tenant_source(&self) -> &crate::TenantSource {
        &self.cx.tenant_source
    }

    /// The live peers: processes running Cohort's services on this
    /// database, with their policy fingerprint (`same_policy` when it is
    /// this handle's) and handlers per entity.
    pub async fn peers(&self) -> Result<Vec<crate::store::peers::Peer>> {
        crate::store::peers::live(&self.cx, None).await
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
        crate::services::rescuer::pass(&self.cx, config).await
    }

    /// One history-pruning pass now (see [`crate::services::pruner`]):
    /// deletes, or with `dry_run` only counts, what the request's limits
    /// select. An explicit pass does not read the kill switch; the
    /// request's cancellation stops it between batches.
    pub async fn prune(
        &self,
        request: crate::services::PruneRequest,
    ) -> Result<crate::services::PruneReport> {
        self.cx.prepared().await?;
        crate::services::pruner::pass(
            &self.cx,
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
        crate::services::grants::check(&self.cx, accesses).await
    }

    /// The shared context, for the background services.
    pub(crate) fn context(&self) -> Arc<Context> {
        Arc::clone(&self.cx)
    }

    /// Whether a record is under an active hold now (database clock),
    /// whatever tenant it belongs to. An unknown entity is `NotFound`, a
    /// malformed record id `InvalidInput`.
    pub async fn is_held(&self, entity_id: uuid::Uuid, record_id: &str) -> Result<bool> {
        crate::ops::holds::is_held(&self.cx, entity_id, record_id, None).await
    }

    /// Whether a record was (or, for a time to come, will still be) under
    /// an active hold at `as_of`: a hold created by then and neither
    /// released nor expired by then, whatever tenant the record belongs
    /// to. Errors as [`Cohort::is_held`].
    pub async fn is_held_as_of<Tz: chrono::TimeZone>(
        &self,
        entity_id: uuid::Uuid,
        record_id: &str,
        as_of: chrono::DateTime<Tz>,
    ) -> Result<bool> {
        let at = as_of.with_timezone(&chrono::Utc);
        crate::ops::holds::is_held(&self.cx, entity_id, record_id, Some(at)).await
    }

    /// Lists holds.
    pub async fn list_holds(
        &self,
        filter: &crate::ops::holds::HoldFilter,
    ) -> Result<Vec<crate::ops::holds::Hold>> {
        crate::ops::holds::list(&self.cx, filter).await
    }

    /// Releases an active hold now.
    pub async fn release_hold(&self, hold_id: uuid::Uuid) -> Result<crate::ops::holds::Hold> {
        crate::ops::holds::release(&self.cx, hold_id).await
    }

    /// The most recent runs, newest first.
    pub async fn list_runs(&self, limit: i64) -> Result<Vec<crate::ops::history::RunLine>> {
        crate::ops::history::list(&self.cx, limit).await
    }

    /// The id of the run whose id starts with `prefix` (the 8 characters the
    /// tables print are usually enough); an ambiguous prefix is refused,
    /// naming the matches.
    pub async fn find_run(&self, prefix: &str) -> Result<uuid::Uuid> {
        crate::ops::history::find_run(&self.cx, prefix).await
    }

    /// The id of the hold whose id starts with `prefix` (the 8 characters
    /// the console and `holds list` print are usually enough); an
    /// ambiguous prefix is refused, naming the matches.
    pub async fn find_hold(&self, prefix: &str) -> Result<uuid::Uuid> {
        crate::ops::history::find_hold(&self.cx, prefix).await
    }

    /// What happened to one record across runs, oldest first: the detail
    /// rows the ledger holds for it (per-row audit, rows set aside), each
    /// with its run. An index lookup however large the ledger. The record
    /// id is read in the entity's key type (`"0042"` finds `42`).
    pub async fn record_history(
        &self,
        entity_id: uuid::Uuid,
        record_id: &str,
    ) -> Result<Vec<crate::ops::history::RecordEvent>> {
        crate::ops::history::record_history(&self.cx, entity_id, record_id).await
    }

    /// One run as recorded in the ledger, with its entity summaries.
    pub async fn show_run(&self, run_id: uuid::Uuid) -> Result<crate::SweepResult> {
        crate::ops::history::show(&self.cx, run_id).await
    }

    /// The evidence of retention for a period, read from the ledger alone
    /// (no policy or catalog is consulted, so it works on a ledger whose
    /// entities have since changed): rules in force, runs, rows removed
    /// per month and kept and why, erasure requests served, holds and
    /// failures. Runs the pruner removed are not in it.
    pub async fn report(
        &self,
        request: &crate::ops::report::ReportRequest,
    ) -> Result<crate::ops::report::Report> {
        crate::ops::report::build(&self.cx, request).await
    }

    /// Walks the ledger's hash chain (see [`crate::ops::verify`]) in one
    /// read-only snapshot: every link in order, every record it stands for
    /// against the ledger's rows now, every run settled since the chain
    /// started. With `expected`, a head recorded earlier (`N:HASH`, as a
    /// report prints it), the chain must still hold it. Reads with
    /// `SELECT` only; needs no hash key and no valid policy. Refused
    /// before schema 19 (run `cohort migrate`).
    pub async fn verify_chain(
        &self,
        expected: Option<crate::domain::chain::ExpectedHead>,
    ) -> Result<crate::domain::chain::ChainReport> {
        self.require_chain().await?;
        crate::ops::verify::verify(&self.cx, expected, true).await
    }

    /// [`Self::verify_chain`] as an auditor has it: a database URL and
    /// Cohort's schema, no policy file. Every link, MAC (with the ledger
    /// key in this handle's configuration), record and head is checked as
    /// by `verify_chain`; only the checkpoints' cutoffs are not held to a
    /// policy's history limits (the report says so when there are any).
    pub async fn verify_chain_without_policy(
        &self,
        expected: Option<crate::domain::chain::ExpectedHead>,
    ) -> Result<crate::domain::chain::ChainReport> {
        self.require_chain().await?;
        crate::ops::verify::verify(&self.cx, expected, false).await
    }

    /// Keys the ledger's hash chain with this handle's ledger key
    /// ([`crate::CohortConfig::ledger_key`], `COHORT_LEDGER_KEY`): appends
    /// a `key` link, after which every link carries a MAC under it and
    /// `verify` refuses one without. Returns the key link's number, or
    /// `None` when the chain is already keyed with this key; refused
    /// without a key, and when the chain is keyed with another.
    /// `cohort migrate` calls it when the key is in its environment.
    pub async fn key_chain(&self) -> Result<Option<i64>> {
        self.require_chain().await?;
        let key = self.cx.config.ledger_key.as_ref().ok_or_else(|| {
            Error::Config(crate::error::Problems::one(format!(
                "keying the ledger's chain needs {} (32 bytes as 64 hexadecimal characters: openssl rand -hex 32)",
                crate::domain::chain::LEDGER_KEY_ENV
            )))
        })?;
        let mut conn = self.cx.pool.acquire().await?;
        crate::run::chain::key_chain(&mut conn, &self.cx.config.schema, key).await
    }

    /// The id of the key the ledger's hash chain is keyed with
    /// ([`crate::domain::chain::LedgerKey::id`]), or `None` when it is not keyed.
    pub async fn chain_key_id(&self) -> Result<Option<String>> {
        self.require_chain().await?;
        let mut conn = self.cx.pool.acquire().await?;
        Ok(crate::validate::chain_key::keyed_with(&mut conn, &self.cx.config.schema).await?)
    }

    /// The newest link of the ledger's hash chain linked at or before
    /// `at` (the newest of all with `None`): the head a report carries.
    pub async fn chain_head(
        &self,
        at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Option<crate::domain::chain::ChainHead>> {
        self.require_chain().await?;
        crate::ops::verify::head(&self.cx, at).await
    }

    async fn require_chain(&self) -> Result<()> {
        let mut conn = self.cx.pool.acquire().await?;
        let installed = crate::schema::installed_version(&mut conn, &self.cx.config.schema).await?;
        match installed {
            Some(v) if v >= crate::sql::tables::CHAIN_SINCE_VERSION => Ok(()),
            Some(v) => Err(crate::error::Error::InvalidInput(format!(
                "the ledger in schema {:?} is at version {v}; its hash chain starts at version {}: run `cohort migrate`",
                self.cx.config.schema,
                crate::sql::tables::CHAIN_SINCE_VERSION
            ))),
            None => Err(crate::error::Error::InvalidInput(format!(
                "no Cohort ledger in schema {:?}: run `cohort migrate`",
                self.cx.config.schema
            ))),
        }
    }

    /// Whether validation has already succeeded.
    pub fn is_ready(&self) -> bool {
        self.cx.is_ready()
    }

    /// The configuration.
    pub fn config(&self) -> &CohortConfig {
        &self.cx.config
    }

    /// The pool Cohort takes its connections from.
    pub fn pool(&self) -> &PgPool {
        &self.cx.pool
    }

    /// The rule provider.
    pub fn rules(&self) -> &dyn RuleProvider {
        self.cx.rules.as_ref()
    }

    /// The canonical form of a tenant id, by the tenant columns' type (see
    /// [`crate::domain::rules::TenantIdentity`]): what runs, holds and the ledger use.
    pub async fn canonical_tenant(&self, tenant: &str) -> Result<String> {
        self.cx.canonical_tenant(tenant).await
    }
}

impl CohortBuilder {
    /// Replaces the configuration.
    pub fn config(mut self, config: CohortConfig) -> Self {
        self.config = config;
        self
    }

    /// Registers a type that derives [`Retained`].
    pub fn entity<T: Retained>(mut self) -> Self {
        self.declarations.push(T::declaration());
        self
    }

    /// Registers a declaration built by hand.
    pub fn declaration(mut self, declaration: EntityDeclaration) -> Self {
        self.declarations.push(declaration);
        self
    }

    /// Sets the rule provider.
    pub fn rules(mut self, rules: impl RuleProvider) -> Self {
        self.rules = Some(Arc::new(rules));
        self
    }

    /// Whether each sweep reads, after an entity's batches, the oldest row
    /// it left eligible, for `cohort_entity_backlog_age_seconds` (default
    /// `true`). That read walks the index range the sweep just emptied:
    /// after a large purge, every deleted row's index entry once (1.2M
    /// rows purged from 4M: 4.5 s on a small server; the rows' later
    /// readers, or vacuum, would otherwise pay that walk). A process that
    /// exports no metrics has no use for it: `cohort sweep` turns it off,
    /// and `cohort worker` keeps it only with `--metrics-addr`. Off, the
    /// gauge has no series from this process's sweeps;
    /// [`Cohort::backlog`] still reads the backlog on demand.
    pub fn backlog_gauge(mut self, measured: bool) -> Self {
        self.backlog_gauge = measured;
        self
    }

    /// Adds an audit observer (any number; each gets committed events in
    /// order, on its own task, bounded by `observer_timeout`).
    pub fn observer(mut self, observer: impl AuditObserver) -> Self {
        self.observers.push(Arc::new(observer));
        self
    }

    /// Takes settings, entities, rules and the `[[tenant]]` directory from
    /// a policy file (entities and tenants add to any already registered).
    pub fn policy(mut self, policy: PolicyFile) -> Self {
        self.config = policy.config;
        self.declarations.extend(policy.entities);
        self.rules = Some(Arc::new(policy.rules));
        self.tenants.extend(policy.tenants);
        if let Some(q) = policy.tenants_query {
            self.tenant_source = Some(crate::TenantSource::Query(q));
        }
        self.handlers.extend(
            policy
                .handlers
                .into_iter()
                .map(crate::services::dispatcher::command::registered),
        );
        if policy.journal.is_some() {
            self.journal = policy.journal;
        }
        self
    }

    /// Journals erasure requests and the holds placed and released through
    /// Cohort outside the retained database (see [`crate::domain::journal`]): an
    /// erasure request is then never run without its entry.
    pub fn journal(mut self, journal: crate::domain::journal::JournalConfig) -> Self {
        self.journal = Some(journal);
        self
    }

    /// Registers a row handler for the rows of entity `T` (decoded with
    /// `sqlx::FromRow`) under `registration`'s entity id, identity,
    /// priority and phase (see [`crate::domain::handlers`]).
    pub fn handler<T, H>(
        mut self,
        registration: crate::domain::handlers::HandlerRegistration,
        handler: H,
    ) -> Self
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Sync + 'static,
        H: crate::domain::handlers::RowHandler<T>,
    {
        self.handlers
            .push(crate::domain::handlers::Registered::new::<T, H>(
                registration,
                handler,
            ));
        self
    }

    /// Where the scheduled worker takes its tenants from (default: the
    /// directory of [`CohortBuilder::tenant`] entries; a policy file's
    /// `tenants_query` sets a query).
    pub fn tenant_source(mut self, source: crate::TenantSource) -> Self {
        self.tenant_source = Some(source);
        self
    }

    /// Lists a tenant with its jurisdiction: runs for this tenant (however
    /// its id is spelled) resolve rules with that jurisdiction.
    pub fn tenant(mut self, id: impl Into<String>, jurisdiction: Option<String>) -> Self {
        self.tenants.push(TenantEntry {
            jurisdiction,
            ..TenantEntry::new(id)
        });
        self
    }

    /// Lists a tenant with its jurisdiction and tags (see
    /// [`TenantEntry`]): runs for this tenant resolve rules with both.
    pub fn tenant_entry(mut self, entry: TenantEntry) -> Self {
        self.tenants.push(entry);
        self
    }

    fn finish(self) -> Result<Cohort> {
        self.config.validate()?;
        let rules = self
            .rules
            .unwrap_or_else(|| Arc::new(StaticRuleProvider::default()));
        let switches =
            crate::domain::settings::Switches::new(self.config.kill_switch, self.config.dry_run);
        Ok(Cohort {
            cx: Arc::new(Context {
                observers: ObserverHub::new(self.observers, self.config.observer_timeout()),
                pool: self.pool,
                config: self.config,
                declarations: self.declarations,
                rules,
                tenants: self.tenants,
                tenant_source: self.tenant_source.unwrap_or(crate::TenantSource::Directory),
                switches,
                handlers: {
                    let mut by_entity: std::collections::BTreeMap<uuid::Uuid, Vec<_>> =
                        std::collections::BTreeMap::new();
                    for h in self.handlers {
                        by_entity
                            .entry(h.registration.entity_id)
                            .or_default()
                            .push(h);
                    }
                    by_entity
                        .into_iter()
                        .map(|(id, list)| (id, crate::domain::handlers::ordered(list)))
                        .collect()
                },
                ready: OnceCell::new(),
                backlog_gauge: self.backlog_gauge,
                journal: self.journal,
            }),
        })
    }

    /// Validates against the database and returns a ready handle, or every
    /// problem found. Nothing is written.
    pub async fn build(self) -> Result<Cohort> {
        let cohort = self.finish()?;
        cohort.ready().await?;
        Ok(cohort)
    }

    /// Returns a handle that validates on first use. Configuration ranges
    /// are still checked now.
    pub fn build_unvalidated(self) -> Result<Cohort> {
        self.finish()
    }
}

impl crate::services::Services {
    /// The services `cohort`'s configuration asks for: the worker when
    /// `schedule` is set, the dispatcher when row handlers are registered,
    /// the pruner when a `[prune]` limit is set, and the maintenance
    /// service always. [`Services::try_spawn`](crate::services::Services::try_spawn)
    /// refuses a pool too small for them.
    pub fn new(cohort: &Cohort) -> Result<Self> {
        Self::from_context(cohort.context())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn handle_is_send_and_sync() {
        fn check<T: Send + Sync + Clone>() {}
        check::<super::Cohort>();
    }
}
