//! Startup validation against the live catalog (SPEC §4).
//!
//! Reads only `pg_catalog`, never changes anything, and reports every
//! problem it finds in one [`Error::Validation`]. Missing-index advice is
//! returned as warnings, not errors. Building a handle (`Cohort::ready`,
//! `cohort validate`) runs every check, the model's (`validate`) and the
//! handle's own (`handle`: the pooler probe, handlers, captures, the
//! tenant directory), so no public entry validates less.
//!
//! The model's checks: the server and Cohort's tables (`checks`), each
//! declaration against its table (`declarations`, through `entity`,
//! `keys`, `anonymise`, `archive` and `partitions`), what foreign keys
//! mean for purges (`foreign_keys`), pacing (`pacing`) and the advice of a
//! valid model (`advice`); what they establish is `validated`'s.

mod advice;
mod anonymise;
mod archive;
mod catalog;
pub(crate) mod chain_key;
mod checks;
mod declarations;
mod entity;
mod foreign_keys;
mod handle;
mod keys;
mod pacing;
mod partitions;
pub(crate) mod pooling;
pub(crate) mod requests;
mod validated;

use std::collections::BTreeMap;

use sqlx::PgConnection;

pub use checks::MIN_SERVER_VERSION_NUM;
pub(crate) use handle::{handle, Inputs};
pub(crate) use validated::TableFacts;
pub use validated::ValidatedModel;

use crate::base::ident::QualifiedName;
use crate::config::CohortConfig;
use crate::domain::model::{EntityDeclaration, EntityDescriptor};
use crate::domain::rules::{CategoryCapabilities, RuleProvider};
use crate::error::{Error, Problem, Problems, Result};
use crate::schema::CohortTable;
use declarations::{resolve_declarations, Declared};

/// The columns of a table with their base type names (for checks made
/// after validation).
pub(crate) async fn column_types(
    conn: &mut PgConnection,
    table: &QualifiedName,
) -> Result<Vec<(String, String)>> {
    Ok(catalog::load_table(conn, table)
        .await?
        .map(|t| {
            t.columns
                .into_iter()
                .map(|c| (c.name, c.type_name))
                .collect()
        })
        .unwrap_or_default())
}

/// Validates the model (configuration, server, Cohort's tables, every
/// entity and rule) against the database behind `conn`. Nothing is
/// written. Returns every problem at once. A handle runs this and the
/// checks of [`handle()`]: `Cohort::ready` is the public way in.
pub(crate) async fn validate(
    conn: &mut PgConnection,
    config: &CohortConfig,
    declarations: &[EntityDeclaration],
    rules: &dyn RuleProvider,
) -> Result<ValidatedModel> {
    let mut problems: Vec<Problem> = Vec::new();
    if let Err(Error::Config(config_problems)) = config.validate() {
        problems.extend(config_problems.prefixed("configuration").0);
    }
    let server = check_server_and_schema(conn, config, &mut problems).await?;
    let declared = resolve_declarations(conn, config, declarations, rules, &mut problems).await?;
    let lag_warnings = check_declared(conn, config, &declared, &mut problems).await?;
    let tenant_key =
        keys::tenant_identity(&declared.entities, &declared.tables, rules, &mut problems);
    let may_purge = |e: &EntityDescriptor| {
        declared
            .capabilities
            .get(&e.id)
            .is_some_and(|c: &CategoryCapabilities| c.iter().any(|s| s.deletes()))
    };
    let order = foreign_keys::processing_order(
        &declared.entities,
        &declared.tables,
        may_purge,
        &mut problems,
    );
    if !problems.is_empty() {
        return Err(Error::Validation(Problems(problems)));
    }
    let mut warnings = model_warnings(conn, config, &declared, lag_warnings).await?;
    let kept_by = foreign_keys::kept_by_references(
        &declared.entities,
        &declared.tables,
        &declared.exempt_tables,
        may_purge,
        &mut warnings,
    );
    let facts = validated::table_facts(&declared.entities, &declared.tables, kept_by);
    let Declared {
        entities,
        exempt,
        capabilities,
        ..
    } = declared;
    Ok(ValidatedModel {
        tenant_key,
        order,
        facts,
        entities,
        exempt,
        capabilities,
        warnings,
        server_version_num: server.version_num,
    })
}

/// The checks of the resolved entities together, their problems added to
/// `problems` in this order: across the entities, `vacuum_after`, pacing
/// and the replica lag. Returns the replica lag's warnings.
async fn check_declared(
    conn: &mut PgConnection,
    config: &CohortConfig,
    declared: &Declared,
    problems: &mut Vec<Problem>,
) -> Result<Vec<String>> {
    let Declared {
        entities,
        tables,
        exempt_tables,
        capabilities,
        ..
    } = declared;
    problems
        .extend(check_across_entities(conn, entities, tables, capabilities, exempt_tables).await?);
    problems.extend(vacuum_after_problems(conn, config, entities, tables, capabilities).await?);
    problems.extend(pacing::entity_problems(entities));
    let (lag_problems, lag_warnings) = pacing::replica_lag_checks(conn, config, entities).await?;
    problems.extend(lag_problems);
    Ok(lag_warnings)
}

/// The warnings of a valid model, in this order: the advice (settings,
/// the hash key, indexes), the tables the policy does not mention, the
/// replica lag's (`lag_warnings`), and the CDC marker's.
async fn model_warnings(
    conn: &mut PgConnection,
    config: &CohortConfig,
    declared: &Declared,
    lag_warnings: Vec<String>,
) -> Result<Vec<String>> {
    let Declared {
        entities,
        tables,
        exempt_tables,
        capabilities,
        ..
    } = declared;
    let unkeyed = unkeyed(config, entities);
    let mut warnings = advice::advice(config, entities, tables, capabilities, &unkeyed);
    warnings.extend(unmentioned_tables(conn, config, entities, exempt_tables).await?);
    warnings.extend(lag_warnings);
    warnings.extend(cdc_marker_warning(conn, config).await?);
    Ok(warnings)
}

/// The entities that anonymise with `hash` while no hash key is set, by
/// name (empty when the key is set).
fn unkeyed(config: &CohortConfig, entities: &[EntityDescriptor]) -> Vec<String> {
    // The hash key is a secret only what changes rows needs: sweeps and
    // erasures refuse to start without it (`hash_key_missing`), and so do
    // the worker and `cohort validate` (the grants check for runs). A
    // read-only process (the console, history, holds, the report) works
    // without it.
    if config.hash_key.is_none() {
        entities
            .iter()
            .filter(|e| uses_hash(e))
            .map(|e| e.name.clone())
            .collect()
    } else {
        Vec::new()
    }
}

/// With `cdc_marker` on, the warning that `wal_level` is not `logical`
/// (no logical decoding consumer can read the markers); `None` otherwise.
async fn cdc_marker_warning(
    conn: &mut PgConnection,
    config: &CohortConfig,
) -> Result<Option<String>> {
    if !config.cdc_marker {
        return Ok(None);
    }
    let level = catalog::current_setting(conn, "wal_level").await?;
    Ok((level != "logical").then(|| {
        format!(
            "cdc_marker is on, but wal_level is {level}: the markers are written, and no logical decoding consumer can read them until wal_level = logical (a server restart)"
        )
    }))
}

/// The server and Cohort's own tables: an unsupported server ends
/// validation at once (nothing else can be trusted there); problems with
/// Cohort's tables and the hold stamp trigger are added to `problems`.
async fn check_server_and_schema(
    conn: &mut PgConnection,
    config: &CohortConfig,
    problems: &mut Vec<Problem>,
) -> Result<catalog::ServerInfo> {
    let server = catalog::server_info(conn).await.map_err(|e| {
        Error::Validation(Problems(vec![Problem::global(format!(
            "could not read the server version ({e}); Cohort needs PostgreSQL 13 or newer"
        ))]))
    })?;
    let server_problems = checks::check_server(&server);
    if !server_problems.is_empty() {
        // Nothing else can be trusted on an unsupported server.
        problems.extend(server_problems);
        return Err(Error::Validation(Problems(std::mem::take(problems))));
    }

    let mut cohort_tables = Vec::new();
    for table in CohortTable::ALL {
        cohort_tables.push((
            table,
            catalog::load_table(conn, &table.qualified(&config.schema)).await?,
        ));
    }
    let schema_problems = checks::check_cohort_schema(&config.schema, &cohort_tables);
    if schema_problems.is_empty() {
        let trigger = catalog::hold_trigger(conn, &config.schema, "retention_hold_stamp").await?;
        problems.extend(checks::check_hold_stamp_trigger(
            &config.schema,
            trigger.as_ref(),
        ));
        let row = catalog::hold_trigger(conn, &config.schema, "retention_hold_reach").await?;
        let truncate =
            catalog::hold_trigger(conn, &config.schema, "retention_hold_reach_truncate").await?;
        problems.extend(checks::check_hold_reach_triggers(
            &config.schema,
            row.as_ref(),
            truncate.as_ref(),
        ));
    }
    problems.extend(schema_problems);

    Ok(server)
}

/// What the entities set off together: checks across them, archive
/// pairs, and everything a purge would set off through foreign keys.
async fn check_across_entities(
    conn: &mut PgConnection,
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
    exempt_tables: &[(String, QualifiedName)],
) -> Result<Vec<Problem>> {
    let mut problems = Vec::new();
    let joined: Vec<_> = entities
        .iter()
        .zip(tables)
        .map(|(e, t)| (e, t, capabilities.get(&e.id)))
        .collect();
    problems.extend(entity::check_across(&joined));
    problems.extend(archive::check_pairs(entities));

    // Everything a purge would set off through foreign keys, to the end.
    let mut purgeable = Vec::new();
    for (e, t, caps) in &joined {
        if caps.is_some_and(|c| c.iter().any(|s| s.deletes())) {
            purgeable.push((*e, catalog::cascade_edges(conn, t.oid).await?));
        }
    }
    let kept_tables: Vec<(&str, &QualifiedName)> = entities
        .iter()
        .map(|e| (e.name.as_str(), &e.table))
        .chain(exempt_tables.iter().map(|(n, t)| (n.as_str(), t)))
        .collect();
    problems.extend(foreign_keys::check_cascades(&purgeable, &kept_tables));

    Ok(problems)
}

/// Tables with a `timestamptz` column, in the schemas the policy's tables
/// live in, that no entity names (retained, exempt, or an archive's copy)
/// and `ignore_tables` does not hold: a table added after the policy was
/// written holds rows nobody decided about. Also the `ignore_tables`
/// entries that silence nothing.
async fn unmentioned_tables(
    conn: &mut PgConnection,
    config: &CohortConfig,
    entities: &[EntityDescriptor],
    exempt_tables: &[(String, QualifiedName)],
) -> Result<Vec<String>> {
    let mentioned: std::collections::BTreeSet<QualifiedName> = entities
        .iter()
        .flat_map(|e| {
            std::iter::once(e.table.clone()).chain(e.archive.as_ref().map(|a| a.table.clone()))
        })
        .chain(exempt_tables.iter().map(|(_, t)| t.clone()))
        .collect();
    let schemas: std::collections::BTreeSet<String> =
        mentioned.iter().map(|t| t.schema.clone()).collect();
    if schemas.is_empty() {
        return Ok(Vec::new());
    }
    let found = catalog::timestamped_tables(conn, schemas.into_iter().collect()).await?;
    Ok(advice::unmentioned_advice(config, &mentioned, &found))
}

/// `vacuum_after` on a table the role does not own would do nothing
/// (PostgreSQL skips it with a warning): refused for each entity that
/// changes rows, naming the relations and their owners.
async fn vacuum_after_problems(
    conn: &mut PgConnection,
    config: &CohortConfig,
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
) -> Result<Vec<Problem>> {
    let mut problems = Vec::new();
    if config.vacuum_after == crate::config::VacuumAfter::Off {
        return Ok(problems);
    }
    for (e, t) in entities.iter().zip(tables) {
        let mutates = capabilities
            .get(&e.id)
            .is_some_and(|c| c.iter().any(|s| s.mutates()));
        if !mutates {
            continue;
        }
        let not_owned = catalog::not_owned(conn, t.oid).await?;
        if not_owned.is_empty() {
            continue;
        }
        let list: Vec<String> = not_owned
            .iter()
            .map(|(table, owner)| format!("{} (owner {owner:?})", table.display_plain()))
            .collect();
        problems.push(Problem::entity(
            &e.name,
            format!(
                "vacuum_after = {:?} needs the owner's rights on the table, and the current role is not a member of the owner of {}; PostgreSQL would skip it with a warning. Run Cohort as (a member of) that owner, or set vacuum_after = \"off\"",
                config.vacuum_after.as_str(),
                list.join(", ")
            ),
        ));
    }
    Ok(problems)
}

/// Whether an entity anonymises a column with the keyed `hash` method.
pub(crate) fn uses_hash(e: &EntityDescriptor) -> bool {
    e.anonymise
        .iter()
        .any(|a| a.method == crate::domain::model::AnonymiseMethod::Hash)
}

/// The refusal of a run that would change rows of entities using `hash`
/// without the key (`None` when it has the key, or needs none). Checked
/// before anything is written.
pub(crate) fn hash_key_missing<'a>(
    config: &CohortConfig,
    entities: impl IntoIterator<Item = &'a EntityDescriptor>,
) -> Option<crate::error::Error> {
    if config.hash_key.is_some() {
        return None;
    }
    let names: Vec<&str> = entities
        .into_iter()
        .filter(|e| uses_hash(e))
        .map(|e| e.name.as_str())
        .collect();
    (!names.is_empty()).then(|| {
        crate::error::Error::Config(crate::error::Problems::one(format!(
            "{} anonymise with `hash`, which needs the secret key (COHORT_HASH_KEY or [cohort] hash_key, at least 16 bytes): \
             an unkeyed hash of an e-mail address or phone number is reversed by a dictionary; nothing was changed",
            names.join(", ")
        )))
    })
}
