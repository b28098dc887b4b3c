//! Building a [`Cohort`]: configuration, declarations, rules, policy,
//! observers, handlers, tenants and the journal, then validation.

use std::sync::Arc;

use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::OnceCell;

use crate::config::CohortConfig;
use crate::context::Context;
use crate::context::ObserverHub;
use crate::domain::model::{EntityDeclaration, Retained};
use crate::domain::observer::AuditObserver;
use crate::domain::rules::{RuleProvider, StaticRuleProvider};
use crate::error::Result;
use crate::policy::{PolicyFile, TenantEntry};

use super::Cohort;

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
    signals: Option<crate::domain::signals::TestSignals>,
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
            signals: None,
            journal: None,
        }
    }

    /// Starts a builder on a new pool for `url`.
    pub async fn connect(url: &str) -> Result<CohortBuilder> {
        let pool = PgPoolOptions::new().max_connections(8).connect(url).await?;
        Ok(Self::builder(pool))
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

    /// Sends this handle's pacing moments to `signals`, for a test to
    /// wait on ([`crate::signals`]). Not for production: a wait is
    /// measured and reported by the run's summary and the metrics.
    pub fn test_signals(mut self, signals: crate::domain::signals::TestSignals) -> Self {
        self.signals = Some(signals);
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
                signals: self.signals,
                journal: self.journal.map(crate::store::journal::Journal::new),
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
