//! The advice of a valid model (warnings, not errors): settings without
//! effect, a missing hash key, the indexes sweeps, erasures and purges
//! need, and the tables the policy does not mention. Pure functions over
//! a catalog snapshot; nothing here does I/O.

use std::collections::BTreeMap;

use super::catalog::{self, TableInfo};
use crate::base::ident::QualifiedName;
use crate::config::CohortConfig;
use crate::domain::model::EntityDescriptor;
use crate::domain::rules::{CategoryCapabilities, Strategy};

/// The advice of a valid model: settings without effect, a missing hash
/// key, and the indexes sweeps need.
pub(super) fn advice(
    config: &CohortConfig,
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
    unkeyed: &[String],
) -> Vec<String> {
    let mut warnings = settings_advice(config, entities, unkeyed);
    warnings.extend(anchor_index_advice(entities, tables, capabilities));
    warnings.extend(
        entities
            .iter()
            .zip(tables)
            .flat_map(|(e, t)| subject_index_advice(e, t)),
    );
    // A stage measured from a marker finds its rows by that marker.
    warnings.extend(marker_index_advice(entities, tables, capabilities));
    // Soft deletes and anonymisations leave their rows where sweeps look:
    // by the anchor, or by the marker of the stage they follow.
    warnings.extend(done_rows_advice(entities, tables, capabilities));
    warnings
}

/// Settings without effect, and hash anonymisation without a hash key.
fn settings_advice(
    config: &CohortConfig,
    entities: &[EntityDescriptor],
    unkeyed: &[String],
) -> Vec<String> {
    let mut warnings: Vec<String> = config.settings_without_effect();
    if !unkeyed.is_empty() {
        warnings.push(format!(
            "{} anonymise with `hash`, and no hash key is set (COHORT_HASH_KEY or [cohort] hash_key): this process can read, but its sweeps and erasures are refused",
            unkeyed.join(", ")
        ));
    }
    if config.partition_lock_timeout != CohortConfig::default().partition_lock_timeout
        && !entities
            .iter()
            .any(|e| e.partitions == crate::domain::model::Partitions::Drop)
    {
        warnings.push(
            "partition_lock_timeout is set, but no entity has partitions = \"drop\": it has no effect"
                .into(),
        );
    }
    warnings
}

/// The anchor indexes of the entities whose category changes rows.
fn anchor_index_advice(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
) -> Vec<String> {
    entities
        .iter()
        .zip(tables)
        .filter_map(|(e, t)| {
            let c = capabilities.get(&e.id)?;
            if !c.iter().any(|s| s.mutates()) {
                return None;
            }
            let reads: Vec<_> = c.anchor_reads().collect();
            index_advice(e, t, &reads)
        })
        .collect()
}

/// The indexes the stages measured from a marker need.
fn marker_index_advice(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    for (e, t) in entities.iter().zip(tables) {
        // Each marker, with the strategies of the stages that read by it.
        let mut markers: BTreeMap<&str, Vec<crate::domain::rules::Strategy>> = BTreeMap::new();
        for (stage, previous) in capabilities
            .get(&e.id)
            .into_iter()
            .flat_map(|c| c.marker_stages())
        {
            if let Some(marker) = previous.marker().and_then(|m| e.marker(m)) {
                markers.entry(marker).or_default().push(stage);
            }
        }
        for (marker, reads) in markers {
            let mut staged = e.clone();
            staged.anchor = marker.to_owned();
            warnings.extend(index_advice(&staged, t, &reads));
        }
    }
    warnings
}

/// The indexes that let sweeps pass over rows already soft-deleted or anonymised.
fn done_rows_advice(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    capabilities: &BTreeMap<uuid::Uuid, CategoryCapabilities>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    for (e, t) in entities.iter().zip(tables) {
        let Some(c) = capabilities.get(&e.id) else {
            continue;
        };
        let mut advised = std::collections::BTreeSet::new();
        let from_markers: Vec<(crate::domain::rules::Strategy, &str)> = c
            .marker_stages()
            .filter_map(|(stage, previous)| Some((stage, e.marker(previous.marker()?)?)))
            .collect();
        let by_anchor = c
            .iter()
            .filter(|s| !from_markers.iter().any(|(m, _)| m == s))
            .map(|s| (s, e.anchor.as_str()));
        for (strategy, anchor) in by_anchor.chain(from_markers.iter().copied()) {
            if let Some(advice) = done_rows_index_advice(e, t, strategy, anchor) {
                if advised.insert(advice.clone()) {
                    warnings.push(advice);
                }
            }
        }
    }
    warnings
}

/// Advice: a missing index usable for the sweep's `(tenant, anchor)` scan.
///
/// `reads` are the strategies whose statements read the table by that
/// anchor. When every one of them leaves out its done rows with the same
/// predicate (all soft deletes, or all anonymisations), a partial index
/// with exactly that predicate serves every read (the one
/// [`done_rows_index_advice`] suggests), so it counts; a full one is
/// needed as soon as one read takes every row (a purge, an archive, an
/// exempt category's count).
pub(crate) fn index_advice(
    entity: &EntityDescriptor,
    table: &TableInfo,
    reads: &[Strategy],
) -> Option<String> {
    let wanted = anchor_prefix(entity, &entity.anchor);
    let shared = shared_done_predicate(entity, reads);
    let covered = indexes_on(table, &wanted).any(|i| match &i.predicate {
        None => true,
        Some(p) => shared.as_deref().is_some_and(|s| same_predicate(p, s)),
    });
    if covered {
        return None;
    }
    Some(format!(
        "{}: no index starts with ({}); sweeps will scan {}. Suggested: CREATE INDEX ON {} ({});",
        entity.name,
        wanted.join(", "),
        table.name.display_plain(),
        table.name,
        quoted_list(&wanted),
    ))
}

/// The table's valid indexes whose key columns start with `wanted`.
fn indexes_on<'t>(
    table: &'t TableInfo,
    wanted: &'t [&str],
) -> impl Iterator<Item = &'t super::catalog::IndexInfo> {
    table.indexes.iter().filter(move |i| {
        i.valid
            && i.columns.len() >= wanted.len()
            && i.columns.iter().zip(wanted).all(|(a, b)| a == b)
    })
}

/// The columns, each quoted, comma-separated: an index's column list.
fn quoted_list(columns: &[&str]) -> String {
    columns
        .iter()
        .map(|c| crate::base::ident::quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns a sweep's scan by `anchor` starts with: the tenant (when
/// the entity has one), then the anchor.
fn anchor_prefix<'a>(entity: &'a EntityDescriptor, anchor: &'a str) -> Vec<&'a str> {
    entity
        .tenant
        .as_deref()
        .into_iter()
        .chain(std::iter::once(anchor))
        .collect()
}

/// How a strategy leaves out the rows it already changed: the column,
/// the test every one of its reads puts on it, and the word for those
/// rows. `None` for strategies whose rows leave the table (purge,
/// archive) or that change nothing (exempt), and for an entity without
/// the column.
fn done_test(
    entity: &EntityDescriptor,
    strategy: Strategy,
) -> Option<(&str, &'static str, &'static str)> {
    match strategy {
        Strategy::SoftDelete => Some((
            entity.soft_delete.as_deref()?,
            "IS NOT TRUE",
            "soft-deleted",
        )),
        Strategy::Anonymise => Some((entity.anonymised_at.as_deref()?, "IS NULL", "anonymised")),
        _ => None,
    }
}

/// The predicate (`column test`, unquoted) every read of `reads` carries,
/// when they all carry the same one.
fn shared_done_predicate(entity: &EntityDescriptor, reads: &[Strategy]) -> Option<String> {
    let mut shared: Option<String> = None;
    for &strategy in reads {
        let (column, test, _) = done_test(entity, strategy)?;
        let predicate = format!("{column} {test}");
        match &shared {
            Some(seen) if *seen != predicate => return None,
            _ => shared = Some(predicate),
        }
    }
    shared
}

/// Whether a partial index's predicate, as the server prints it
/// (parenthesised, quoting only names that need it), is `predicate`.
fn same_predicate(printed: &str, predicate: &str) -> bool {
    printed.replace('"', "").trim_matches(['(', ')']) == predicate
}

/// Advice: a soft delete or an anonymisation leaves the rows it changed in
/// the sweep's `(tenant, anchor)` range, so without a partial index that
/// leaves them out, every later sweep's first batch, its end-of-entity
/// counts and the backlog gauge read past every row ever changed (all of
/// them, one by one, each run). `anchor` is the column the stage is
/// measured from (the entity's anchor, or the marker a stage follows).
pub(crate) fn done_rows_index_advice(
    entity: &EntityDescriptor,
    table: &TableInfo,
    strategy: Strategy,
    anchor: &str,
) -> Option<String> {
    let (column, test, done) = done_test(entity, strategy)?;
    let wanted = anchor_prefix(entity, anchor);
    let predicate = format!("{column} {test}");
    let covered = indexes_on(table, &wanted).any(|i| {
        i.predicate
            .as_deref()
            .is_some_and(|p| same_predicate(p, &predicate))
    });
    if covered {
        return None;
    }
    Some(format!(
        "{}: {done} rows stay in the ({}) range a sweep reads, so each sweep's first batch, its counts and the backlog gauge read past every row ever {done}. Suggested: CREATE INDEX ON {} ({}) WHERE {} {test};",
        entity.name,
        wanted.join(", "),
        table.name,
        quoted_list(&wanted),
        crate::base::ident::quote_ident(column),
    ))
}

/// Advice: subject columns no index starts with. Erasing a subject,
/// placing a hold on one, and counting held rows after a run while a
/// subject hold is active each look rows up by these columns.
pub(crate) fn subject_index_advice(entity: &EntityDescriptor, table: &TableInfo) -> Vec<String> {
    entity
        .subjects
        .iter()
        .filter(|s| {
            !table
                .indexes
                .iter()
                .any(|i| i.valid && !i.partial && i.columns.first() == Some(&s.column))
        })
        .map(|s| {
            format!(
                "{}: no index starts with ({}); erasing a subject, placing a hold on one and counting held rows while a subject hold is active will scan {}. Suggested: CREATE INDEX ON {} ({});",
                entity.name,
                s.column,
                table.name.display_plain(),
                table.name,
                crate::base::ident::quote_ident(&s.column)
            )
        })
        .collect()
}

/// The warnings of tables the policy does not mention (see
/// `validate::unmentioned_tables`): each table of `found` that is neither
/// `mentioned`, nor listed in `ignore_tables`, nor one of Cohort's own;
/// and each `ignore_tables` entry that names a retained table or no table
/// `found` holds.
pub(crate) fn unmentioned_advice(
    config: &CohortConfig,
    mentioned: &std::collections::BTreeSet<QualifiedName>,
    found: &[super::catalog::TimestampedTable],
) -> Vec<String> {
    let ignored: Vec<(&str, QualifiedName)> = config
        .ignore_tables
        .iter()
        .filter_map(|t| {
            Some((
                t.as_str(),
                QualifiedName::parse(t, config.table_schema()).ok()?,
            ))
        })
        .collect();
    let own = |t: &QualifiedName| {
        t.schema == config.schema
            && crate::sql::tables::CohortTable::ALL
                .iter()
                .any(|c| c.name() == t.name)
    };
    let mut warnings = Vec::new();
    for t in found {
        if mentioned.contains(&t.name) || own(&t.name) || ignored.iter().any(|(_, i)| *i == t.name)
        {
            continue;
        }
        warnings.push(format!(
            "{} has timestamptz columns ({}) and the policy does not mention it: decide about its rows (`cohort init --update` adds it, exempt until classified), or list it in [cohort] ignore_tables",
            t.name.path(),
            t.timestamps.join(", ")
        ));
    }
    for (text, i) in &ignored {
        if mentioned.contains(i) {
            warnings.push(format!(
                "ignore_tables lists {text:?}, which an entity names: it has no effect; take it off"
            ));
        } else if !found.iter().any(|t| t.name == *i) {
            warnings.push(format!(
                "ignore_tables lists {text:?}, which is not a table with a timestamptz column in a schema the policy's tables live in: it has no effect"
            ));
        }
    }
    warnings
}
