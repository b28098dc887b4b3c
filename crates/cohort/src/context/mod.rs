//! The internal service context: what every service needs (pool,
//! configuration, rules, observers, the tenant directory) and the prepared
//! form (validated model, SQL plans), built once. Services take these; the
//! [`crate::Cohort`] facade only delegates, so nothing below it depends on it.

mod observers;
mod settings;

use std::collections::BTreeMap;
use std::sync::Arc;

use sqlx::postgres::PgPool;
use tokio::sync::OnceCell;

use crate::config::CohortConfig;
use crate::domain::model::{EntityDeclaration, EntityDescriptor};
use crate::domain::rules::RuleProvider;
use crate::domain::tenants::{TenantEntry, TenantFacts, TenantSource};
use crate::error::{Error, Result};
use crate::sql::{EntityPlan, LedgerPlan};
use crate::validate::ValidatedModel;
pub(crate) use observers::ObserverHub;

/// What services need, shared by every clone of a handle.
pub(crate) struct Context {
    pub(crate) pool: PgPool,
    pub(crate) config: CohortConfig,
    pub(crate) declarations: Vec<EntityDeclaration>,
    pub(crate) rules: Arc<dyn RuleProvider>,
    pub(crate) tenants: Vec<TenantEntry>,
    /// Where the scheduled worker's tenants come from.
    pub(crate) tenant_source: TenantSource,
    /// This process's values of the live settings.
    pub(crate) switches: crate::domain::settings::Switches,
    /// Row handlers by entity id, in delivery order.
    pub(crate) handlers: BTreeMap<uuid::Uuid, Vec<crate::domain::handlers::Registered>>,
    pub(crate) ready: OnceCell<Arc<Prepared>>,
    pub(crate) observers: ObserverHub,
    /// Whether a sweep reads each entity's backlog after its batches, for
    /// the backlog gauge ([`crate::CohortBuilder::backlog_gauge`]).
    pub(crate) backlog_gauge: bool,
    /// Where erasure requests and holds are journaled, if anywhere: opened
    /// once, with the handle.
    pub(crate) journal: Option<crate::store::journal::Journal>,
    /// Where pacing moments go, when a test asked
    /// ([`crate::CohortBuilder::test_signals`]).
    pub(crate) signals: Option<crate::domain::signals::TestSignals>,
}

/// A handle's context once validated, with its model and plans: what
/// the operations and runs below the facade take. Only
/// [`Context::ready`] makes one, so holding one means validation passed;
/// it reads as the [`Context`] it wraps.
#[derive(Clone, Copy)]
pub(crate) struct Ready<'a> {
    cx: &'a Context,
    plans: &'a Arc<Prepared>,
}

impl<'a> Ready<'a> {
    /// The validated model and its plans.
    pub(crate) fn plans(&self) -> &'a Arc<Prepared> {
        self.plans
    }
}

impl std::ops::Deref for Ready<'_> {
    type Target = Context;

    fn deref(&self) -> &Context {
        self.cx
    }
}

/// A validated model with its SQL plans, built once.
pub(crate) struct Prepared {
    pub(crate) model: Arc<ValidatedModel>,
    pub(crate) plans: BTreeMap<uuid::Uuid, EntityPlan>,
    /// Stages measured from a previous stage's marker, by (entity, stage
    /// strategy, previous strategy): the entity as anchored on the marker,
    /// and its statements.
    pub(crate) stage_plans: BTreeMap<StageKey, (EntityDescriptor, EntityPlan)>,
    pub(crate) ledger: LedgerPlan,
    /// The handler queue's statements.
    pub(crate) queue: crate::sql::queue::QueuePlan,
    /// The tenant directory (`[[tenant]]`), canonicalised: (tenant, jurisdiction).
    pub(crate) tenants: Vec<TenantEntry>,
}

/// A stage measured from a marker: (entity, stage strategy, previous strategy).
pub(crate) type StageKey = (
    uuid::Uuid,
    crate::domain::rules::Strategy,
    crate::domain::rules::Strategy,
);

/// The two padded forms of an HMAC-SHA256 key (RFC 2104), from which the
/// `hash` anonymise method computes `sha256(outer || sha256(inner ||
/// value))` in Rust: the key never reaches the database.
#[derive(Clone)]
pub(crate) struct HmacPads {
    pub(crate) inner: Vec<u8>,
    pub(crate) outer: Vec<u8>,
}

impl HmacPads {
    /// The hex HMAC-SHA256 of `message`.
    pub(crate) fn hex(&self, message: &[u8]) -> String {
        use sha2::Digest;
        let inner = sha2::Sha256::digest([&self.inner[..], message].concat());
        let outer = sha2::Sha256::digest([&self.outer[..], &inner[..]].concat());
        hex::encode(outer)
    }

    /// The `hash` anonymiser for this key: NULL stays NULL.
    pub(crate) fn anonymiser(key: &[u8]) -> crate::domain::model::CustomAnonymiser {
        let pads = HmacPads::new(key);
        crate::domain::model::CustomAnonymiser::new::<Option<String>, _, _>(
            "hash (HMAC-SHA256)",
            move |v: &Option<String>| v.as_ref().map(|s| pads.hex(s.as_bytes())),
        )
    }

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

impl Prepared {
    /// What a run knows of a canonical tenant: the request's jurisdiction
    /// and tags, each checked against the directory's listing when both
    /// are known, else the listing's.
    pub(crate) fn tenant_facts(
        &self,
        tenant: Option<&str>,
        jurisdiction: Option<&str>,
        tags: Option<&[String]>,
    ) -> Result<TenantFacts> {
        let listed = tenant.and_then(|t| self.tenants.iter().find(|e| e.id == t));
        TenantFacts::merged(tenant.unwrap_or_default(), listed, jurisdiction, tags)
    }
}

impl Context {
    /// The canonical form of a tenant id, by the tenant columns' type; a
    /// spelling that cannot be one is bad input.
    pub(crate) async fn canonical_tenant(&self, tenant: &str) -> Result<String> {
        let ready = self.ready().await?;
        let identity = ready.plans().model.tenant_identity();
        identity.canonical(tenant).ok_or_else(|| {
            Error::InvalidInput(format!(
                "{tenant:?} is not a valid tenant id ({identity:?} tenant columns)"
            ))
        })
    }

    /// The handle, validated: the model passed and its plans are built
    /// (validated on first use, once). The facade and each service's
    /// iteration take it, and hand it down: nothing below them validates.
    pub(crate) async fn ready(&self) -> Result<Ready<'_>> {
        self.prepared().await?;
        let plans = self.ready.get().expect("validated just above");
        Ok(Ready { cx: self, plans })
    }

    /// The validated model with its plans (validated on first use).
    async fn prepared(&self) -> Result<Arc<Prepared>> {
        self.ready
            .get_or_try_init(|| async {
                let mut conn = self.pool.acquire().await?;
                let inputs = crate::validate::Inputs {
                    pool: &self.pool,
                    config: &self.config,
                    declarations: &self.declarations,
                    rules: self.rules.as_ref(),
                    handlers: &self.handlers,
                    tenants: &self.tenants,
                };
                let (model, tenants) = crate::validate::handle(&mut conn, inputs).await?;
                crate::validate::chain_key::check_key(
                    &mut conn,
                    &self.config.schema,
                    self.config.ledger_key.as_ref(),
                )
                .await?;
                // Without a key (a read-only process), the plans still need
                // a hasher; sweeps and erasures that would use it are
                // refused before they start (`validate::hash_key_missing`).
                // Should one ever run, it hashes with a random key of this
                // process: the value is still gone, never kept.
                let hasher = Some(match self.config.hash_key.as_ref() {
                    Some(k) => HmacPads::anonymiser(k.expose()),
                    None => HmacPads::anonymiser(uuid::Uuid::new_v4().as_bytes()),
                });
                let build = |e: &EntityDescriptor,
                             caps: &crate::domain::rules::CategoryCapabilities,
                             stage: Option<&crate::sql::StageScope>| {
                    let facts = &model.facts[&e.id];
                    EntityPlan::build(
                        e,
                        caps,
                        &facts.blocking_references,
                        &facts.casts,
                        crate::sql::HoldKeys {
                            subjects: &facts.subjects,
                            tenant: facts.tenant,
                        },
                        hasher.as_ref(),
                        &self.config.schema,
                        stage,
                        facts.plain,
                    )
                };
                let plans = model
                    .entities
                    .iter()
                    .map(|e| (e.id, build(e, &model.capabilities[&e.id], None)))
                    .collect();
                let mut stage_plans = BTreeMap::new();
                for e in &model.entities {
                    for (strategy, previous) in model.capabilities[&e.id].marker_stages() {
                        let (staged, scope) = crate::sql::StageScope::after(e, previous)
                            .expect("validated: the previous stage writes a marker the entity has");
                        let plan = build(
                            &staged,
                            &crate::domain::rules::CategoryCapabilities::only(strategy),
                            Some(&scope),
                        );
                        stage_plans.insert((e.id, strategy, previous), (staged, plan));
                    }
                }
                Ok(Arc::new(Prepared {
                    model: Arc::new(model),
                    plans,
                    stage_plans,
                    ledger: LedgerPlan::build(&self.config.schema),
                    queue: crate::sql::queue::QueuePlan::build(&self.config.schema),
                    tenants,
                }))
            })
            .await
            .cloned()
    }

    /// Whether validation has already succeeded.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.initialized()
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
}
