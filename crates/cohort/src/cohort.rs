//! The [`Cohort`] handle: configuration, declarations and rules, validated
//! against the live database before it is used.

use std::sync::Arc;

use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::OnceCell;

use std::collections::BTreeMap;

use crate::audit::{AuditObserver, ObserverHub};
use crate::config::CohortConfig;
use crate::error::Result;
use crate::error::{Error, Problem, Problems};
use crate::model::{EntityDeclaration, Retained};
use crate::policy::{PolicyFile, TenantEntry};
use crate::rules::{RuleProvider, StaticRuleProvider};
use crate::sql::plan::{EntityPlan, LedgerPlan};
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

pub(crate) struct Inner {
    pub(crate) pool: PgPool,
    pub(crate) config: CohortConfig,
    declarations: Vec<EntityDeclaration>,
    pub(crate) rules: Arc<dyn RuleProvider>,
    tenants: Vec<TenantEntry>,
    ready: OnceCell<Arc<Ready>>,
    pub(crate) observers: ObserverHub,
}

/// A validated model with its SQL plans, built once.
pub(crate) struct Ready {
    pub(crate) model: Arc<ValidatedModel>,
    pub(crate) plans: BTreeMap<uuid::Uuid, EntityPlan>,
    pub(crate) ledger: LedgerPlan,
    /// The tenant directory (`[[tenant]]`), canonicalised: (tenant, jurisdiction).
    pub(crate) tenants: Vec<(String, Option<String>)>,
    /// HMAC-SHA256 pads of the hash key, when one is configured.
    pub(crate) hash_pads: Option<HmacPads>,
}

/// The two padded forms of an HMAC-SHA256 key (RFC 2104): the `hash`
/// anonymise method binds them and computes
/// `sha256(outer || sha256(inner || value))` with core functions.
#[derive(Clone)]
pub(crate) struct HmacPads {
    pub(crate) inner: Vec<u8>,
    pub(crate) outer: Vec<u8>,
}

impl HmacPads {
    pub(crate) fn new(key: &[u8]) -> Self {
        use sha2::Digest;
        const BLOCK: usize = 64;
        let mut block = if key.len() > BLOCK {
            sha2::Sha256::digest(key).to_vec()
        } else {
            key.to_vec()
        };
        block.resize(BLOCK, 0);
        Self {
            inner: block.iter().map(|b| b ^ 0x36).collect(),
            outer: block.iter().map(|b| b ^ 0x5c).collect(),
        }
    }
}

impl Ready {
    /// The jurisdiction of a canonical tenant: the request's, checked
    /// against the directory's when both are known.
    pub(crate) fn jurisdiction(
        &self,
        tenant: Option<&str>,
        requested: Option<&str>,
    ) -> Result<Option<String>> {
        let listed = tenant.and_then(|t| {
            self.tenants
                .iter()
                .find(|(id, _)| id == t)
                .and_then(|(_, j)| j.clone())
        });
        match (requested, listed) {
            (Some(r), Some(l)) if r != l => Err(crate::Error::InvalidInput(format!(
                "tenant {} is listed with jurisdiction {l:?}, but the request says {r:?}",
                tenant.unwrap_or_default()
            ))),
            (Some(r), _) => Ok(Some(r.to_owned())),
            (None, listed) => Ok(listed),
        }
    }
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
    observers: Vec<Arc<dyn AuditObserver>>,
    tenants: Vec<TenantEntry>,
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
        Ok(Arc::clone(&self.prepared().await?.model))
    }

    /// The validated model with its plans; what every operation starts with.
    pub(crate) async fn prepared(&self) -> Result<Arc<Ready>> {
        self.inner
            .ready
            .get_or_try_init(|| async {
                let mut conn = self.inner.pool.acquire().await?;
                let model = validate(
                    &mut conn,
                    &self.inner.config,
                    &self.inner.declarations,
                    self.inner.rules.as_ref(),
                )
                .await?;
                let tenants = tenant_directory(&model, &self.inner.tenants)?;
                let plans = model
                    .entities
                    .iter()
                    .map(|e| {
                        let caps = &model.capabilities[&e.id];
                        let facts = &model.facts[&e.id];
                        (
                            e.id,
                            EntityPlan::build(
                                e,
                                caps,
                                &facts.blocking_references,
                                &facts.casts,
                                &self.inner.config.schema,
                            ),
                        )
                    })
                    .collect();
                Ok(Arc::new(Ready {
                    model: Arc::new(model),
                    plans,
                    ledger: LedgerPlan::build(&self.inner.config.schema),
                    tenants,
                    hash_pads: self
                        .inner
                        .config
                        .hash_key
                        .as_ref()
                        .map(|k| HmacPads::new(k.expose())),
                }))
            })
            .await
            .cloned()
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// Sweeps one tenant's tenant-scoped entities (or the tenantless ones):
    /// see the run model in the crate documentation. Returns the settled
    /// result; a bad request is refused before anything is written.
    pub async fn sweep(&self, request: crate::SweepRequest) -> Result<crate::SweepResult> {
        crate::engine::sweep(self, request).await
    }

    /// Erases one data subject's rows (see [`crate::erasure`]). Returns the
    /// settled run; a bad request is refused before anything is written.
    pub async fn erase(
        &self,
        request: crate::erasure::ErasureRequest,
    ) -> Result<crate::SweepResult> {
        crate::erasure::erase(self, request).await
    }

    /// Runs the application's own deletion of `request.record_ids` inside a
    /// Cohort transaction, unless a target is under an active legal hold
    /// (see [`crate::guarded`]).
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
        request: crate::guarded::GuardedDeletion,
        callback: F,
    ) -> Result<crate::guarded::Guarded<T>>
    where
        F: for<'c> FnOnce(&'c mut sqlx::PgConnection) -> crate::guarded::CallbackFuture<'c, T>,
    {
        crate::guarded::delete(self, request, callback).await
    }

    /// Counts what a sweep would change now, without writing anything.
    pub async fn preview(&self, request: crate::PreviewRequest) -> Result<crate::PreviewResult> {
        crate::engine::preview(self, request).await
    }

    /// Places a legal hold (see [`crate::holds`] for every check it makes).
    pub async fn create_hold(
        &self,
        request: crate::holds::HoldRequest,
    ) -> Result<crate::holds::Hold> {
        crate::holds::create(self, request).await
    }

    /// Lists holds.
    pub async fn list_holds(
        &self,
        filter: &crate::holds::HoldFilter,
    ) -> Result<Vec<crate::holds::Hold>> {
        crate::holds::list(self, filter).await
    }

    /// Releases an active hold now.
    pub async fn release_hold(&self, hold_id: uuid::Uuid) -> Result<crate::holds::Hold> {
        crate::holds::release(self, hold_id).await
    }

    /// The most recent runs, newest first.
    pub async fn list_runs(&self, limit: i64) -> Result<Vec<crate::runs::RunRecord>> {
        crate::runs::list(self, limit).await
    }

    /// One run as recorded in the ledger, with its entity summaries.
    pub async fn show_run(&self, run_id: uuid::Uuid) -> Result<crate::SweepResult> {
        crate::runs::show(self, run_id).await
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

    /// The canonical form of a tenant id, by the tenant columns' type (see
    /// [`crate::rules::TenantIdentity`]): what runs, holds and the ledger use.
    pub async fn canonical_tenant(&self, tenant: &str) -> Result<String> {
        let ready = self.prepared().await?;
        let identity = ready.model.tenant_identity();
        identity.canonical(tenant).ok_or_else(|| {
            Error::InvalidInput(format!(
                "{tenant:?} is not a valid tenant id ({identity:?} tenant columns)"
            ))
        })
    }
}

/// Canonicalises the `[[tenant]]` directory; an id that is not valid for
/// the tenant columns, or one tenant listed twice with different
/// jurisdictions, is a validation problem.
fn tenant_directory(
    model: &ValidatedModel,
    entries: &[TenantEntry],
) -> Result<Vec<(String, Option<String>)>> {
    let identity = model.tenant_identity();
    let mut problems = Vec::new();
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for entry in entries {
        let Some(id) = identity.canonical(&entry.id) else {
            problems.push(Problem::global(format!(
                "[[tenant]] id {:?} is not a valid tenant id for the tenant columns ({identity:?})",
                entry.id
            )));
            continue;
        };
        match out.iter().find(|(seen, _)| *seen == id) {
            Some((_, j)) if *j != entry.jurisdiction => problems.push(Problem::global(format!(
                "tenant {id} is listed twice with different jurisdictions ({:?} and {:?})",
                j, entry.jurisdiction
            ))),
            Some(_) => {}
            None => out.push((id, entry.jurisdiction.clone())),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(Error::Validation(Problems(problems)))
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
        self
    }

    /// Lists a tenant with its jurisdiction: runs for this tenant (however
    /// its id is spelled) resolve rules with that jurisdiction.
    pub fn tenant(mut self, id: impl Into<String>, jurisdiction: Option<String>) -> Self {
        self.tenants.push(TenantEntry {
            id: id.into(),
            jurisdiction,
        });
        self
    }

    fn finish(self) -> Result<Cohort> {
        self.config.validate()?;
        let rules = self
            .rules
            .unwrap_or_else(|| Arc::new(StaticRuleProvider::default()));
        Ok(Cohort {
            inner: Arc::new(Inner {
                observers: ObserverHub::new(self.observers, self.config.observer_timeout()),
                pool: self.pool,
                config: self.config,
                declarations: self.declarations,
                rules,
                tenants: self.tenants,
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
    /// The pads reproduce RustCrypto's HMAC-SHA256 for short, block-sized
    /// and long keys (what the SQL computes from them).
    #[test]
    fn hmac_pads_match_rustcrypto() {
        use hmac::{KeyInit, Mac};
        use sha2::Digest;
        for key in [&b"0123456789abcdef"[..], &[7u8; 64][..], &[9u8; 100][..]] {
            let pads = super::HmacPads::new(key);
            let message = b"person@example.com";
            let inner = sha2::Sha256::digest([&pads.inner[..], &message[..]].concat());
            let ours = sha2::Sha256::digest([&pads.outer[..], &inner[..]].concat());
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
            mac.update(message);
            assert_eq!(ours.to_vec(), mac.finalize().into_bytes().to_vec());
        }
    }

    #[test]
    fn handle_is_send_and_sync() {
        fn check<T: Send + Sync + Clone>() {}
        check::<super::Cohort>();
    }
}
