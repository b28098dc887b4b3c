//! What every run resolves before it writes anything: the tenant's
//! canonical key per entity and each entity's rule.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::base::diagnostic::Diagnostic;
use crate::context::{Context, Prepared, Ready};
use crate::domain::model::EntityDescriptor;
use crate::domain::rules::{ResolutionContext, ResolveError, RetentionRule, TenantContext};
use crate::error::{Error, Result};
use crate::sql::KeyValue;

/// The entities of one pass with their canonical tenant keys.
pub(crate) struct PassScope<'a> {
    pub(crate) entities: Vec<&'a EntityDescriptor>,
    pub(crate) keys: BTreeMap<Uuid, KeyValue>,
    /// The tenant's canonical text (as stored in the ledger).
    pub(crate) tenant: Option<String>,
}

/// A request's pass and what the run knows of its tenant, checked before
/// anything is written: the canonical tenant key per entity
/// ([`tenant_keys`]) and the tenant's jurisdiction and tags (the
/// request's, checked against the directory's listing).
pub(crate) fn pass_of<'a>(
    ready: &'a Prepared,
    tenancy: &crate::domain::tenants::TenantScope,
) -> Result<(PassScope<'a>, crate::domain::tenants::TenantFacts)> {
    let pass = tenant_keys(ready, tenancy.tenant.as_deref())?;
    let facts = ready.tenant_facts(
        pass.tenant.as_deref(),
        tenancy.jurisdiction.as_deref(),
        tenancy.tags.as_deref(),
    )?;
    Ok((pass, facts))
}

/// Canonical tenant keys per entity of the pass, checked before anything
/// is written. The tenant is canonicalised once, by the tenant columns' type
/// (validation makes them agree): uuid spellings become one uuid, text is
/// kept exactly as written, citext is compared case-insensitively.
pub(crate) fn tenant_keys<'a>(ready: &'a Prepared, tenant: Option<&str>) -> Result<PassScope<'a>> {
    let entities: Vec<&EntityDescriptor> = ready
        .model
        .ordered()
        .filter(|e| e.tenant.is_some() == tenant.is_some())
        .collect();
    let mut keys = BTreeMap::new();
    let canonical = match (tenant, ready.model.tenant_key) {
        (Some(t), Some(ty)) => Some(
            ty.parse(t)
                .map_err(|msg| Error::InvalidInput(format!("tenant: {msg}")))?
                .canonical(),
        ),
        (Some(t), None) => Some(t.to_owned()),
        (None, _) => None,
    };
    if let Some(t) = tenant {
        for e in &entities {
            let ty = ready.model.facts[&e.id].tenant.expect("tenanted entity");
            let key = ty
                .parse(t)
                .map_err(|msg| Error::InvalidInput(format!("tenant for {}: {msg}", e.name)))?;
            keys.insert(e.id, key);
        }
    }
    Ok(PassScope {
        entities,
        keys,
        tenant: canonical,
    })
}

/// Refuses a single request (a sweep, preview or erasure of one tenant, or
/// of the tenantless entities) that nothing is in scope of: a run that
/// could change nothing would report `succeeded` on an empty table. The
/// passes of `sweep_all` and of the worker never ask for an empty scope.
pub(crate) async fn in_scope(cx: &Ready<'_>, tenanted: bool, what: &str) -> Result<()> {
    let ready = cx.plans();
    if ready
        .model
        .entities
        .iter()
        .any(|e| e.tenant.is_some() == tenanted)
    {
        return Ok(());
    }
    Err(Error::InvalidInput(if tenanted {
        format!(
            "nothing is in scope: no retained entity is tenant-scoped, so a tenant's {what} reaches nothing; \
             use the tenantless scope (`--tenantless`, the request's tenantless form)"
        )
    } else {
        format!(
            "nothing is in scope: no tenantless entity exists, so a tenantless {what} reaches nothing; \
             name a tenant (`--tenant T`, the request's tenanted form){}",
            if what == "erasure" {
                ""
            } else {
                ", or every tenant (`--all-tenants`, `sweep_all`)"
            }
        )
    }))
}

/// Resolves and checks the rule of one entity; a sanitised failure otherwise.
pub(crate) async fn rule_for(
    cx: &Context,
    ready: &Prepared,
    e: &EntityDescriptor,
    tenant: Option<&str>,
    facts: &crate::domain::tenants::TenantFacts,
    now: DateTime<Utc>,
) -> std::result::Result<RetentionRule, Diagnostic> {
    let mut tenant_ctx = match tenant {
        Some(t) => TenantContext::tenant(t)
            .with_identity(ready.model.tenant_identity())
            .with_tags(facts.tags.iter().cloned()),
        None => TenantContext::tenantless(),
    };
    if let Some(j) = &facts.jurisdiction {
        tenant_ctx = tenant_ctx.with_jurisdiction(j);
    }
    let ctx = ResolutionContext::new(&e.category, tenant_ctx, now);
    let rule = cx.rules.resolve(&ctx).await.map_err(|err| {
        let code = match &err {
            ResolveError::UnknownCategory(_) => "unknown_category",
            ResolveError::AliasCycle(_) => "alias_cycle",
            _ => "provider_error",
        };
        Diagnostic::capture("rule", Some(code.into()), &err)
    })?;
    let allowed = ready
        .model
        .capabilities
        .get(&e.id)
        .is_some_and(|c| c.allows(rule.strategy()));
    if !allowed {
        return Err(Diagnostic::capture(
            "rule",
            Some("undeclared_strategy".into()),
            &format!(
                "category {:?} resolved to {} which it does not declare",
                e.category,
                rule.strategy()
            ),
        ));
    }
    // The entity's own audit detail wins over the category's (an exempt
    // rule mutates nothing, so it keeps its own).
    match e.audit {
        Some(audit) if rule.strategy().mutates() => rule
            .with_audit(audit)
            .map_err(|err| Diagnostic::capture("rule", Some("audit".into()), &err)),
        _ => Ok(rule),
    }
}

/// How far a mutating run's `now` may be ahead of the database clock
/// (client clock skew), in seconds.
pub(crate) const FUTURE_NOW_TOLERANCE_SECS: i64 = 60;

/// Refuses a mutating run dated later than the database clock (beyond
/// [`FUTURE_NOW_TOLERANCE_SECS`]) unless the caller allowed it: a future
/// `now` moves every cutoff forward. Nothing has been written yet.
pub(crate) async fn check_now(
    cx: &Context,
    now: DateTime<Utc>,
    mutating: bool,
    allowed: bool,
) -> Result<()> {
    if !mutating || allowed {
        return Ok(());
    }
    let db_now = crate::sql::database_now(&cx.pool).await?;
    if now > db_now + chrono::Duration::seconds(FUTURE_NOW_TOLERANCE_SECS) {
        return Err(Error::Refused(format!(
            "now {} is later than the database clock ({}): every cutoff would move forward and rows that are not old enough yet would change. Use a dry run to look ahead, or allow it explicitly (allow_future_now / --allow-future-now)",
            now.to_rfc3339(),
            db_now.to_rfc3339()
        )));
    }
    Ok(())
}
