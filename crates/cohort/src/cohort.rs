//! The [`Cohort`] handle: configuration, declarations and rules, validated
//! against the live database before it is used.

use std::sync::Arc;

use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::OnceCell;

use crate::config::CohortConfig;
use crate::error::Result;
use crate::model::{EntityDeclaration, Retained};
use crate::policy::PolicyFile;
use crate::rules::{RuleProvider, StaticRuleProvider};
use crate::validate::{validate, ValidatedModel};

/// A configured Cohort. Cheap to clone; all clones share one readiness state.
///
/// Build it with [`Cohort::builder`] and [`CohortBuilder::build`], which
/// validates against the database and refuses to start with the complete
/// list of problems. A handle made with [`CohortBuilder::build_unvalidated`]
/// validates on first use instead ([`Cohort::ready`]) and caches only
/// success, so a failed check is retried on the next call.
#[derive(Clone)]
pub struct Cohort {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    config: CohortConfig,
    declarations: Vec<EntityDeclaration>,
    rules: Arc<dyn RuleProvider>,
    ready: OnceCell<Arc<ValidatedModel>>,
}

impl std::fmt::Debug for Cohort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cohort")
            .field("schema", &self.inner.config.schema)
            .field("entities", &self.inner.declarations.len())
            .field("ready", &self.inner.ready.initialized())
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
        self.inner
            .ready
            .get_or_try_init(|| async {
                let mut conn = self.inner.pool.acquire().await?;
                validate(
                    &mut conn,
                    &self.inner.config,
                    &self.inner.declarations,
                    self.inner.rules.as_ref(),
                )
                .await
                .map(Arc::new)
            })
            .await
            .cloned()
    }

    /// Whether validation has already succeeded.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.initialized()
    }

    /// The configuration.
    pub fn config(&self) -> &CohortConfig {
        &self.inner.config
    }

    /// The pool Cohort takes its connections from.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The rule provider.
    pub fn rules(&self) -> &dyn RuleProvider {
        self.inner.rules.as_ref()
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

    /// Takes settings, entities and rules from a policy file (entities add
    /// to any already registered).
    pub fn policy(mut self, policy: PolicyFile) -> Self {
        self.config = policy.config;
        self.declarations.extend(policy.entities);
        self.rules = Some(Arc::new(policy.rules));
        self
    }

    fn finish(self) -> Result<Cohort> {
        self.config.validate()?;
        let rules = self
            .rules
            .unwrap_or_else(|| Arc::new(StaticRuleProvider::default()));
        Ok(Cohort {
            inner: Arc::new(Inner {
                pool: self.pool,
                config: self.config,
                declarations: self.declarations,
                rules,
                ready: OnceCell::new(),
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

#[cfg(test)]
mod tests {
    #[test]
    fn handle_is_send_and_sync() {
        fn check<T: Send + Sync + Clone>() {}
        check::<super::Cohort>();
    }
}
