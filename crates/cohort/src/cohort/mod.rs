//! The [`Cohort`] handle: configuration, declarations and rules, validated
//! against the live database before it is used.

use std::sync::Arc;

use sqlx::postgres::PgPool;

use crate::config::CohortConfig;
use crate::context::Context;
use crate::domain::rules::RuleProvider;
use crate::error::Result;
use crate::validate::ValidatedModel;

mod builder;
mod evidence;
mod operate;
mod protect;

pub use builder::CohortBuilder;

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

impl Cohort {
    /// The validated model, validating first if this handle has not been
    /// validated yet. Only success is cached.
    pub async fn ready(&self) -> Result<Arc<ValidatedModel>> {
        Ok(Arc::clone(&self.cx.ready().await?.plans().model))
    }

    /// Sweeps one tenant's tenant-scoped entities (or the tenantless ones):
    /// see the run model in the crate documentation. Returns the settled
    /// result; a bad request is refused before anything is written.
    pub async fn sweep(&self, mut request: crate::SweepRequest) -> Result<crate::SweepResult> {
        let ready = self.cx.ready().await?;
        crate::run::passes::scoped(&ready, &mut request.tenancy, "sweep").await?;
        let ready = self.cx.ready().await?;
        crate::run::sweep::sweep(&ready, request).await
    }

    /// Erases one data subject's rows (see [`crate::domain::erasure`]). Returns the
    /// settled run; a bad request is refused before anything is written.
    pub async fn erase(
        &self,
        mut request: crate::domain::erasure::ErasureRequest,
    ) -> Result<crate::ErasureResult> {
        let ready = self.cx.ready().await?;
        crate::run::passes::scoped(&ready, &mut request.tenancy, "erasure").await?;
        if request.terms.is_some() {
            let ready = self.cx.ready().await?;
            return crate::run::requests::open(&ready, request).await;
        }
        let ready = self.cx.ready().await?;
        crate::run::erasure::erase(&ready, request).await
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
        let ready = self.cx.ready().await?;
        crate::run::passes::sweep_all(&ready, request).await
    }

    /// The tenants of `source` (the directory, a tenants query or a list),
    /// de-duplicated by tenant identity, and the rows that cannot be
    /// tenants (a NULL id, an id invalid for the tenant columns, a
    /// jurisdiction that is not text), each with its position. A tenants
    /// query that cannot run, or of the wrong shape, is `InvalidInput`.
    /// A query is streamed, never read whole.
    pub async fn tenants(&self, source: &crate::TenantSource) -> Result<crate::TenantDiscovery> {
        let ready = self.cx.ready().await?;
        crate::run::passes::discover(&ready, source).await
    }

    /// Previews every pass `sweep_all` would make for the request's
    /// source, in order; one tenant's failure does not stop the others.
    /// Nothing is written.
    pub async fn preview_all(
        &self,
        request: crate::PreviewAllRequest,
    ) -> Result<crate::PreviewAllResult> {
        let ready = self.cx.ready().await?;
        crate::run::passes::preview_all(&ready, request).await
    }

    /// Counts what a sweep would change now, without writing anything.
    pub async fn preview(
        &self,
        mut request: crate::PreviewRequest,
    ) -> Result<crate::PreviewResult> {
        let ready = self.cx.ready().await?;
        crate::run::passes::scoped(&ready, &mut request.tenancy, "preview").await?;
        let ready = self.cx.ready().await?;
        crate::run::sweep::preview(&ready, request).await
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

    /// The shared context, for the background services.
    pub(crate) fn context(&self) -> Arc<Context> {
        Arc::clone(&self.cx)
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

#[cfg(test)]
mod tests {
    #[test]
    fn handle_is_send_and_sync() {
        fn check<T: Send + Sync + Clone>() {}
        check::<super::Cohort>();
    }
}
