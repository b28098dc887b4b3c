//! The checks of key-like columns: the record key (one column unique on
//! its own, or a composite key), the tenant and subject columns compared
//! the way Cohort identifies their values, `not_tenant`, and the one
//! tenant identity across entities. Pure functions over a catalog
//! snapshot; nothing here does I/O.

use super::catalog::{self, ColumnInfo, TableInfo, KEY_TYPES};
use crate::domain::model::{looks_like_tenant, EntityDescriptor};
use crate::domain::rules::{CategoryCapabilities, RuleProvider};
use crate::error::Problem;
use crate::sql::KeyType;

/// The record key: one column, unique on its own.
pub(super) fn check_record_key(
    entity: &EntityDescriptor,
    table: &TableInfo,
    capabilities: Option<&CategoryCapabilities>,
    problems: &mut Vec<String>,
) {
    // The record key: one column, unique on its own. On a partitioned
    // table PostgreSQL only allows unique indexes that include the
    // partition key, so for partition purge of a purge-only category
    // (record key, anchor) is accepted: a purge deletes by key and
    // re-checks the cutoff, so rows that shared an id would both be past
    // it, and they would share its holds (never fewer protections).
    // Anonymise and soft delete would have to tell such rows apart.
    if entity.has_composite_key() {
        check_composite_key(entity, table, problems);
        return;
    }
    let purge_only = capabilities.is_some_and(|c| {
        !c.allows(crate::domain::rules::Strategy::Anonymise)
            && !c.allows(crate::domain::rules::Strategy::SoftDelete)
    });
    if let Some(col) = table.column(&entity.record_id) {
        check_primary_key(entity, table, purge_only, problems);
        check_key_unique(entity, table, purge_only, col, problems);
        check_key_column(col, problems);
    }
}

/// A composite record key: columns of supported types, NOT NULL, with a
/// deterministic collation, that are together the primary key or a
/// valid unique index of exactly these columns.
fn check_composite_key(entity: &EntityDescriptor, table: &TableInfo, problems: &mut Vec<String>) {
    let t = table.name.display_plain();
    let mut all_present = true;
    for c in &entity.record_key {
        let Some(col) = table.column(c) else {
            all_present = false;
            continue;
        };
        if crate::domain::model::PartType::from_type_name(&col.type_name).is_none()
            || col.type_name == "bpchar"
        {
            problems.push(format!(
                "record key column {:?} is {}; a composite key's parts may be uuid, integer types, text, varchar, citext, timestamptz, timestamp or date",
                col.name, col.display_type
            ));
        }
        if !col.not_null {
            problems.push(format!(
                "record key column {:?} allows NULL; a record key must be NOT NULL",
                col.name
            ));
        }
        if !col.deterministic {
            problems.push(format!(
                "record key column {:?} has a non-deterministic collation: SQL would treat values Cohort tells apart as equal (or the reverse). Use a deterministic collation, or citext for case-insensitive ids",
                col.name
            ));
        }
    }
    if !all_present {
        return;
    }
    let same_columns = |i: &&super::catalog::IndexInfo| {
        (i.primary || i.unique)
            && !i.partial
            && i.columns.len() == entity.record_key.len()
            && entity.record_key.iter().all(|c| i.columns.contains(c))
    };
    let key = entity.record_key.join(", ");
    match table.indexes.iter().filter(same_columns).find(|i| i.usable) {
        Some(_) => {}
        None if table.indexes.iter().any(|i| same_columns(&i)) => problems.push(format!(
            "the unique index on the record key ({key}) is not valid, ready and immediate (a failed CREATE UNIQUE INDEX CONCURRENTLY, or a DEFERRABLE constraint); duplicate keys would let one batch reach rows it did not select. Rebuild it (REINDEX) or drop and recreate it"
        )),
        None => problems.push(format!(
            "the record key ({key}) of {t} is not its primary key or a unique index of exactly these columns; holds and audit need a unique key{}",
            match table.indexes.iter().find(|i| i.primary) {
                Some(pk) => format!(" (the primary key is ({}))", pk.columns.join(", ")),
                None => String::new(),
            }
        )),
    }
}

/// Whether `columns` are the (record key, anchor) pair a partition purge may key by.
fn is_partitioned_key(
    entity: &EntityDescriptor,
    table: &TableInfo,
    purge_only: bool,
    columns: &[String],
) -> bool {
    table.relkind == "p"
        && entity.partitions == crate::domain::model::Partitions::Drop
        && purge_only
        && columns.len() == 2
        && columns.contains(&entity.record_id)
        && columns.contains(&entity.anchor)
}

/// Whether index `i` makes the record key unique on its own (the pair counts, too).
fn is_key_index(
    entity: &EntityDescriptor,
    table: &TableInfo,
    purge_only: bool,
    i: &super::catalog::IndexInfo,
) -> bool {
    (i.primary || i.unique)
        && !i.partial
        && (i.columns == [entity.record_id.clone()]
            || is_partitioned_key(entity, table, purge_only, &i.columns))
}

/// What a refused key on a partitioned table can do instead: with a
/// tenant column nothing yet (partition purge needs a tenantless entity,
/// and composite record keys are not supported), so it says so rather
/// than send the reader to a setting that is refused next.
fn partitioned_key_hint(entity: &EntityDescriptor, table: &TableInfo) -> &'static str {
    match (table.relkind == "p", entity.tenant.is_some()) {
        (false, _) => "",
        (true, false) => " (on a partitioned table a key unique together with the anchor is accepted only with partitions = \"drop\" and a category that only purges)",
        (true, true) => " (on a partitioned table every unique key includes the partition key: declare the primary key as a composite record key, record_id = [\"id\", \"logged_at\"] in its columns' order)",
    }
}

/// No primary key of several columns (but the accepted partitioned pair).
fn check_primary_key(
    entity: &EntityDescriptor,
    table: &TableInfo,
    purge_only: bool,
    problems: &mut Vec<String>,
) {
    let t = table.name.display_plain();
    if let Some(pk) = table.indexes.iter().find(|i| i.primary) {
        if pk.columns.len() > 1 && !is_partitioned_key(entity, table, purge_only, &pk.columns) {
            problems.push(format!(
                "{t} has a composite primary key ({}) and the record key is {:?} alone; declare the key's columns, record_id = [{}], or a column unique on its own{}",
                pk.columns.join(", "),
                entity.record_id,
                pk.columns.iter().map(|c| format!("{c:?}")).collect::<Vec<_>>().join(", "),
                partitioned_key_hint(entity, table)
            ));
        }
    }
}

/// The record key has a unique index of its own that is usable now.
fn check_key_unique(
    entity: &EntityDescriptor,
    table: &TableInfo,
    purge_only: bool,
    col: &ColumnInfo,
    problems: &mut Vec<String>,
) {
    // Only an index that guarantees uniqueness right now counts: a
    // failed CREATE UNIQUE INDEX CONCURRENTLY leaves an invalid index
    // over duplicate keys, and a deferrable one allows them mid-transaction.
    let key_index = |i: &&super::catalog::IndexInfo| is_key_index(entity, table, purge_only, i);
    let unique_alone = table.indexes.iter().filter(key_index).any(|i| i.usable);
    if !unique_alone && table.indexes.iter().any(|i| key_index(&i)) {
        problems.push(format!(
            "the unique index on record key column {:?} is not valid, ready and immediate (a failed CREATE UNIQUE INDEX CONCURRENTLY, or a DEFERRABLE constraint); duplicate keys would let one batch reach rows it did not select. Rebuild it (REINDEX) or drop and recreate it",
            col.name
        ));
    }
    if !unique_alone
        && !table.indexes.iter().any(|i| key_index(&i))
        && !table
            .indexes
            .iter()
            .any(|i| i.primary && i.columns.len() > 1)
    {
        problems.push(format!(
            "record key column {:?} is not a primary key or unique on its own; holds and audit need a unique single-column key{}",
            col.name,
            partitioned_key_hint(entity, table)
        ));
    }
}

/// The record key column is of a key type and NOT NULL.
fn check_key_column(col: &ColumnInfo, problems: &mut Vec<String>) {
    // char(n) is padded: its values would not compare equal to themselves as text.
    if !KEY_TYPES.contains(&col.type_name.as_str()) || col.type_name == "bpchar" {
        problems.push(format!(
            "record key column {:?} is {}; supported key types are uuid, integer types, text and varchar",
            col.name, col.display_type
        ));
    }
    if !col.not_null {
        problems.push(format!(
            "record key column {:?} allows NULL; a record key must be NOT NULL",
            col.name
        ));
    }
}

/// Key-like columns compare the way Cohort identifies values; the tenant column, or none that reads as one.
pub(super) fn check_keys(
    entity: &EntityDescriptor,
    table: &TableInfo,
    tenant_candidates: &[&str],
    problems: &mut Vec<String>,
) {
    let t = table.name.display_plain();
    // Key-like columns must compare the way Cohort identifies their values.
    // A composite key's parts are checked with the key.
    let record = (!entity.has_composite_key()).then_some(entity.record_id.as_str());
    let key_like = std::iter::once(("record key", record))
        .chain(std::iter::once(("tenant", entity.tenant.as_deref())))
        .chain(
            entity
                .subjects
                .iter()
                .map(|s| ("erasure subject", Some(s.column.as_str()))),
        );
    for (role, column) in key_like {
        let Some(col) = column.and_then(|c| table.column(c)) else {
            continue;
        };
        if !col.deterministic {
            problems.push(format!(
                "{role} column {:?} has a non-deterministic collation: SQL would treat values Cohort tells apart as equal (or the reverse). Use a deterministic collation, or citext for case-insensitive ids",
                col.name
            ));
        }
        if role != "record key" && col.type_name == "bpchar" {
            problems.push(format!(
                "{role} column {:?} is {}; char(n) pads its values, so an id compared as text never matches. Use text or varchar",
                col.name, col.display_type
            ));
        }
    }
    if let Some(col) = entity.tenant.as_deref().and_then(|c| table.column(c)) {
        if !KEY_TYPES.contains(&col.type_name.as_str()) {
            problems.push(format!(
                "tenant column {:?} is {}; supported tenant types are uuid, integer types and text",
                col.name, col.display_type
            ));
        }
    }
    // One rule for what looks like a tenant column (`looks_like_tenant`,
    // and the configured convention), the rule `cohort init` proposes by.
    let tenant_like = |c: &str| looks_like_tenant(c) || tenant_candidates.contains(&c);
    if entity.is_tenantless() {
        for col in table
            .columns
            .iter()
            .filter(|c| tenant_like(&c.name) && !entity.not_tenant.contains(&c.name))
        {
            problems.push(format!(
                "entity is tenantless but {t} has a tenant column {:?} (its name reads as a tenant id); map it as the tenant (`tenant = {:?}`), or, if it is not one, say so (`not_tenant = [{:?}]`): a tenantless entity is swept across every tenant and per-tenant overrides do not apply to it",
                col.name, col.name, col.name
            ));
        }
    }
    for col in &entity.not_tenant {
        if let Some(tenant) = &entity.tenant {
            problems.push(format!(
                "not_tenant names {col:?}, but the entity is not tenantless (its tenant column is {tenant:?}); not_tenant applies only to a tenantless entity: remove it"
            ));
        } else if table.column(col).is_none() {
            problems.push(format!(
                "not_tenant names {col:?}, which {t} does not have; remove it or fix the name"
            ));
        } else if !tenant_like(col) {
            problems.push(format!(
                "not_tenant names {col:?}, whose name does not read as a tenant id: it has no effect; remove it"
            ));
        }
    }
}

/// One tenant identity: every tenant column gives a spelling one meaning,
/// and every tenant a rule names is a valid id of it. Returns the tenant
/// key type (`None`: no entity has a tenant).
pub(super) fn tenant_identity(
    entities: &[EntityDescriptor],
    tables: &[catalog::TableInfo],
    rules: &dyn RuleProvider,
    problems: &mut Vec<Problem>,
) -> Option<KeyType> {
    let tenant_types: Vec<(&str, KeyType, &str)> = entities
        .iter()
        .zip(tables)
        .filter_map(|(e, t)| {
            let col = t.column(e.tenant.as_deref()?)?;
            Some((
                e.name.as_str(),
                KeyType::from_type_name(&col.type_name)?,
                col.display_type.as_str(),
            ))
        })
        .collect();
    let tenant_key = tenant_types.first().map(|(_, k, _)| *k);
    if tenant_types
        .iter()
        .any(|(_, k, _)| !k.same_identity(tenant_key.expect("non-empty")))
    {
        problems.push(Problem::global(format!(
            "tenant columns disagree on type ({}), so one tenant id could mean different tenants in different tables; give every tenant column the same type",
            tenant_types
                .iter()
                .map(|(n, _, d)| format!("{n}: {d}"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    if let Some(key) = tenant_key {
        for (category, tenant) in rules.named_tenants() {
            if key.canonical_text(&tenant).is_none() {
                problems.push(Problem::global(format!(
                    "category {category:?} has an override for tenant {tenant:?}, which is not a valid {} tenant id; it would never match",
                    tenant_types[0].2
                )));
            }
        }
    }

    tenant_key
}
