//! The checks a handle runs beyond the model's: the pool keeps its
//! sessions (no transaction pooler), every row handler belongs to a
//! retained entity under a unique identity, every column a policy handler
//! captures exists with a type it can capture, and the tenant directory's
//! ids are valid tenants listed once. [`handle`] runs them all, after
//! [`super::validate`]; building a handle (`Cohort::ready`) is the one
//! public way in, so nothing validates less than a handle does.

use std::collections::BTreeMap;

use sqlx::{PgConnection, PgPool};

use super::ValidatedModel;
use crate::config::CohortConfig;
use crate::domain::handlers::Registered;
use crate::domain::model::EntityDeclaration;
use crate::domain::rules::RuleProvider;
use crate::domain::tenants::TenantEntry;
use crate::error::{Error, Problem, Problems, Result};

/// What a handle validates.
pub(crate) struct Inputs<'a> {
    pub(crate) pool: &'a PgPool,
    pub(crate) config: &'a CohortConfig,
    pub(crate) declarations: &'a [EntityDeclaration],
    pub(crate) rules: &'a dyn RuleProvider,
    pub(crate) handlers: &'a BTreeMap<uuid::Uuid, Vec<Registered>>,
    pub(crate) tenants: &'a [TenantEntry],
}

/// Every check of a handle, in order; returns the validated model and the
/// canonical tenant directory.
pub(crate) async fn handle(
    conn: &mut PgConnection,
    inputs: Inputs<'_>,
) -> Result<(ValidatedModel, Vec<TenantEntry>)> {
    super::pooling::check(conn, inputs.pool).await?;
    let model = super::validate(conn, inputs.config, inputs.declarations, inputs.rules).await?;
    let parallelism = super::checks::check_sweep_parallelism(
        &model.entities,
        inputs.config.sweep_parallelism,
        inputs.pool.options().get_max_connections(),
    );
    if !parallelism.is_empty() {
        return Err(Error::Validation(Problems(parallelism)));
    }
    let tenants = tenant_directory(&model, inputs.tenants)?;
    check_tenant_literals(&model, &tenants)?;
    check_handlers(&model, inputs.handlers)?;
    check_captures(conn, &model, inputs.handlers).await?;
    Ok((model, tenants))
}

/// A `{tenant}` literal that a tenant of the directory cannot write (its
/// column is too short for that tenant's id) is refused: every
/// anonymisation of that tenant's rows would fail. A tenant found only at
/// run time (`tenants_query`, a caller's list) is checked when its sweep
/// starts: that entity fails with `kind=rule code=literal_too_long`
/// before any batch, and the others go on.
fn check_tenant_literals(model: &ValidatedModel, tenants: &[TenantEntry]) -> Result<()> {
    let mut problems = Vec::new();
    for e in &model.entities {
        let facts = &model.facts[&e.id];
        let writes = model
            .capabilities
            .get(&e.id)
            .is_some_and(|c| c.iter().any(|s| ValidatedModel::writes_literals(e, s)));
        if !writes || facts.tenant.is_none() {
            continue;
        }
        for t in tenants {
            if let Some(why) = facts.literal_misfit(&t.id) {
                problems.push(Problem::entity(
                    &e.name,
                    format!("{why} (a tenant of the tenant directory)"),
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Validation(Problems(problems)))
    }
}

/// Every column a policy-file handler captures exists in its table.
async fn check_captures(
    conn: &mut PgConnection,
    model: &ValidatedModel,
    handlers: &BTreeMap<uuid::Uuid, Vec<Registered>>,
) -> Result<()> {
    let mut problems = Vec::new();
    for (entity_id, list) in handlers {
        let Some(entity) = model.entity(*entity_id) else {
            continue;
        };
        if list.iter().all(|h| h.capture.is_empty()) {
            continue;
        }
        // The types a command handler can capture as JSON values.
        const CAPTURABLE: &[&str] = &[
            "text",
            "varchar",
            "bpchar",
            "int2",
            "int4",
            "int8",
            "bool",
            "float8",
            "uuid",
            "timestamptz",
            "timestamp",
            "date",
            "json",
            "jsonb",
        ];
        let columns = super::column_types(conn, &entity.table).await?;
        for h in list {
            for c in &h.capture {
                match columns.iter().find(|(name, _)| name == c) {
                    None => problems.push(Problem::entity(
                        &entity.name,
                        format!(
                            "handler {:?} captures column {c:?}, which {} does not have",
                            h.registration.identity,
                            entity.table.display_plain()
                        ),
                    )),
                    Some((_, ty)) if !CAPTURABLE.contains(&ty.as_str()) => {
                        problems.push(Problem::entity(
                            &entity.name,
                            format!(
                                "handler {:?} captures column {c:?} of type {ty}, which a policy handler cannot capture (text, integers, booleans, float8, uuid, timestamps, dates and json are supported); every sweep would fail",
                                h.registration.identity
                            ),
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Validation(Problems(problems)))
    }
}

/// Every handler belongs to a registered retained entity, under a
/// non-empty identity unique for that entity.
fn check_handlers(
    model: &ValidatedModel,
    handlers: &BTreeMap<uuid::Uuid, Vec<Registered>>,
) -> Result<()> {
    let mut problems = Vec::new();
    for (entity_id, list) in handlers {
        let Some(entity) = model.entity(*entity_id) else {
            problems.push(Problem::global(format!(
                "row handler(s) {} are registered for {entity_id}, which is not a retained entity",
                list.iter()
                    .map(|h| format!("{:?}", h.registration.identity))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
            continue;
        };
        let mut seen = std::collections::BTreeSet::new();
        for h in list {
            let identity = &h.registration.identity;
            if identity.trim().is_empty() || identity.contains('\0') {
                problems.push(Problem::entity(
                    &entity.name,
                    format!("row handler identity {identity:?} must be non-empty text"),
                ));
            } else if !seen.insert(identity.clone()) {
                problems.push(Problem::entity(
                    &entity.name,
                    format!("two row handlers share the identity {identity:?}; queued work is keyed by it"),
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Validation(Problems(problems)))
    }
}

/// Canonicalises the `[[tenant]]` directory; an id that is not valid for
/// the tenant columns, or one tenant listed twice with different
/// jurisdictions, is a validation problem.
fn tenant_directory(model: &ValidatedModel, entries: &[TenantEntry]) -> Result<Vec<TenantEntry>> {
    let identity = model.tenant_identity();
    let mut problems = Vec::new();
    let mut out: Vec<TenantEntry> = Vec::new();
    for entry in entries {
        let Some(id) = identity.canonical(&entry.id) else {
            problems.push(Problem::global(format!(
                "[[tenant]] id {:?} is not a valid tenant id for the tenant columns ({})",
                entry.id,
                identity.column_types()
            )));
            continue;
        };
        let listed = TenantEntry {
            id,
            jurisdiction: entry.jurisdiction.clone(),
            tags: crate::domain::tenants::normalise_tags(entry.tags.iter().cloned()),
        };
        // The directory is configuration the operator wrote: a tenant
        // listed twice that disagrees with itself is refused, not guessed.
        match out.iter().find(|seen| seen.id == listed.id) {
            Some(seen) if seen.jurisdiction != listed.jurisdiction => {
                problems.push(Problem::global(format!(
                    "tenant {} is listed twice with different jurisdictions ({:?} and {:?})",
                    listed.id, seen.jurisdiction, listed.jurisdiction
                )))
            }
            Some(seen) if !seen.agrees_with(&listed) => problems.push(Problem::global(format!(
                "tenant {} is listed twice with different tags ({:?} and {:?})",
                listed.id, seen.tags, listed.tags
            ))),
            Some(_) => {}
            None => out.push(listed),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(Error::Validation(Problems(problems)))
    }
}
