//! The checks of one resolved entity against its table: the relation,
//! the columns it uses and their types, the declared Rust types, the
//! strategies its category may return and their markers; and the checks
//! across entities (a table or a display name declared twice). Pure
//! functions over a catalog snapshot; nothing here does I/O.

use std::collections::BTreeMap;

use super::catalog::{TableInfo, TEXT_TYPES};
use crate::domain::model::{EntityDescriptor, Marker};
use crate::domain::rules::{CategoryCapabilities, Strategy};
use crate::error::Problem;

/// PostgreSQL base types a declared Rust type can map to, when known.
fn pg_types_for_rust(rust_type: &str) -> Option<&'static [&'static str]> {
    let mut t: String = rust_type.chars().filter(|c| !c.is_whitespace()).collect();
    while let Some(inner) = t
        .strip_prefix("Option<")
        .or_else(|| t.strip_prefix("::std::option::Option<"))
        .or_else(|| t.strip_prefix("std::option::Option<"))
        .and_then(|s| s.strip_suffix('>'))
    {
        t = inner.to_owned();
    }
    let last = t.rsplit("::").next().unwrap_or(&t);
    let last = last.split('<').next().unwrap_or(last);
    Some(match last {
        "Uuid" => &["uuid"],
        "String" | "str" | "&str" => TEXT_TYPES,
        "i16" => &["int2"],
        "i32" => &["int4"],
        "i64" => &["int8"],
        "bool" => &["bool"],
        "f32" => &["float4"],
        "f64" => &["float8"],
        "DateTime" | "OffsetDateTime" => &["timestamptz"],
        "NaiveDateTime" | "PrimitiveDateTime" => &["timestamp"],
        "NaiveDate" | "Date" => &["date"],
        "Value" | "JsonValue" => &["json", "jsonb"],
        _ => return None,
    })
}

/// Why no anonymised-at marker resolved, with the fix that applies: a
/// derived type resolves markers among its own fields only, so when the
/// table has the column the fix is a field, not a column.
fn no_anonymised_at(entity: &EntityDescriptor, table: &TableInfo) -> String {
    let category = &entity.category;
    let column = table.column("anonymised_at").map(|c| c.name.as_str());
    match (entity.declared_columns.is_some(), column) {
        (true, Some(c)) => format!(
            "category {category:?} may anonymise, but the type has no field for the table's {c:?} column \
             (a derived type finds its markers among its own fields): add `{c}: Option<chrono::DateTime<chrono::Utc>>` \
             to the struct, or mark the field that holds it #[retain(anonymised_at)]"
        ),
        (true, None) => format!(
            "category {category:?} may anonymise, but no anonymised_at marker resolves: add an `anonymised_at` \
             timestamptz column to the table and a field for it to the struct, or mark an existing timestamp \
             field #[retain(anonymised_at)]"
        ),
        (false, _) => format!(
            "category {category:?} may anonymise, but no anonymised_at marker resolves: name its column with \
             `anonymised_at = \"column\"`, or add an `anonymised_at` timestamptz column"
        ),
    }
}

/// Markers whose constraints or defaults make them meaningless. A marker
/// says "this row was changed by Cohort, at this time": a NOT NULL
/// timestamp marker or one with a default is set on rows Cohort never
/// changed, so an anonymising category would find every row "already
/// anonymised" and report `anonymise 0` while the personal data stays,
/// and a stage measured from `deleted_at` would purge rows never soft
/// deleted; a soft-delete flag defaulting to true hides new rows the
/// same way. Checked for the strategies the category may use.
fn marker_problems(
    entity: &EntityDescriptor,
    table: &TableInfo,
    caps: &CategoryCapabilities,
) -> Vec<String> {
    let mut problems = Vec::new();
    let t = table.name.display_plain();
    let mut timestamps = Vec::new();
    if caps.allows(Strategy::SoftDelete) {
        timestamps.extend(entity.deleted_at.as_deref().map(|c| ("deleted_at", c)));
    }
    if caps.allows(Strategy::Anonymise) {
        timestamps.extend(
            entity
                .anonymised_at
                .as_deref()
                .map(|c| ("anonymised_at", c)),
        );
    }
    for (marker, column) in timestamps {
        let Some(col) = table.column(column) else {
            continue;
        };
        if col.not_null {
            problems.push(format!(
                "{marker} marker column {column:?} is NOT NULL: every row would carry a marker Cohort never wrote \
                 (rows it never changed would look done); allow NULL with `ALTER TABLE {t} ALTER COLUMN {} DROP NOT NULL`",
                crate::base::ident::quote_ident(column)
            ));
        }
        if col.has_default {
            problems.push(format!(
                "{marker} marker column {column:?} has a default ({}): new rows would carry a marker Cohort never wrote \
                 (they would look done); remove it with `ALTER TABLE {t} ALTER COLUMN {} DROP DEFAULT`",
                col.default_expr.as_deref().unwrap_or("?"),
                crate::base::ident::quote_ident(column)
            ));
        }
    }
    if caps.allows(Strategy::SoftDelete) {
        if let Some(col) = entity.soft_delete.as_deref().and_then(|c| table.column(c)) {
            if col
                .default_expr
                .as_deref()
                .is_some_and(|d| d.trim().eq_ignore_ascii_case("true"))
            {
                problems.push(format!(
                    "soft-delete flag column {:?} defaults to true: new rows would look soft deleted already; \
                     default it to false (`ALTER TABLE {t} ALTER COLUMN {} SET DEFAULT false`)",
                    col.name,
                    crate::base::ident::quote_ident(&col.name)
                ));
            }
        }
    }
    problems
}

/// Checks one resolved entity against its table and its category's capabilities.
pub(crate) fn check_entity(
    entity: &EntityDescriptor,
    table: &TableInfo,
    capabilities: Option<&CategoryCapabilities>,
    tenant_candidates: &[&str],
    known_categories: &[String],
) -> Vec<String> {
    let mut problems = Vec::new();
    check_relation(table, &mut problems);
    check_columns(entity, table, &mut problems);
    super::keys::check_record_key(entity, table, capabilities, &mut problems);
    super::keys::check_keys(entity, table, tenant_candidates, &mut problems);
    super::anonymise::check_markers_and_anonymise(entity, table, &mut problems);
    check_declared_types(entity, table, &mut problems);
    check_strategies(entity, table, capabilities, known_categories, &mut problems);
    problems
}

/// The relation: a plain or partitioned table, not a partition, in no inheritance.
fn check_relation(table: &TableInfo, problems: &mut Vec<String>) {
    let t = table.name.display_plain();
    match table.relkind.as_str() {
        "r" | "p" => {}
        "v" | "m" => problems.push(format!("{t} is a view; Cohort retains rows of tables only")),
        other => problems.push(format!("{t} is not a table (relkind {other:?})")),
    }
    if table.is_partition {
        problems.push(format!(
            "{t} is a partition of another table; declare the partitioned parent table instead"
        ));
    } else if table.inherits || table.has_inheritance_children {
        problems.push(format!(
            "{t} takes part in table inheritance; Cohort mutates one independently owned table per entity and rejects inheritance hierarchies"
        ));
    }
}

/// Every column the entity uses exists, and its times are `timestamptz`.
fn check_columns(entity: &EntityDescriptor, table: &TableInfo, problems: &mut Vec<String>) {
    let t = table.name.display_plain();
    // Every column the entity uses must exist.
    let mut roles: Vec<(String, &str)> = vec![("anchor".into(), entity.anchor.as_str())];
    for m in Marker::ALL {
        if let Some(c) = entity.marker(m) {
            roles.push((format!("{m} marker"), c));
        }
    }
    for a in &entity.anonymise {
        roles.push((format!("anonymised ({})", a.method.kind()), &a.column));
    }
    for s in &entity.subjects {
        roles.push(("erasure subject".into(), &s.column));
    }
    for (role, column) in &roles {
        if table.column(column).is_none() {
            problems.push(format!("{role} column {column:?} does not exist in {t}"));
        }
    }

    for (role, column) in [
        ("anchor", Some(entity.anchor.as_str())),
        ("deleted_at", entity.deleted_at.as_deref()),
        ("anonymised_at", entity.anonymised_at.as_deref()),
    ] {
        let Some(col) = column.and_then(|c| table.column(c)) else {
            continue;
        };
        match col.type_name.as_str() {
            "timestamptz" => {}
            "timestamp" => problems.push(format!(
                "{role} column {:?} is `timestamp without time zone`; Cohort compares and writes UTC instants, and a naive timestamp silently shifts with the session time zone. Change it to `timestamp with time zone` (timestamptz)",
                col.name
            )),
            _ => problems.push(format!(
                "{role} column {:?} is {} but must be timestamp with time zone",
                col.name, col.display_type
            )),
        }
    }
}

/// Declared Rust types fit the columns Cohort uses.
fn check_declared_types(entity: &EntityDescriptor, table: &TableInfo, problems: &mut Vec<String>) {
    // Declared Rust types must fit the columns Cohort uses.
    for column in entity.used_columns() {
        let (Some(rust), Some(col)) = (entity.rust_type_of(column), table.column(column)) else {
            continue;
        };
        if let Some(expected) = pg_types_for_rust(rust) {
            if !expected.contains(&col.type_name.as_str()) {
                problems.push(format!(
                    "field type {rust} does not match column {:?} of type {}",
                    col.name, col.display_type
                ));
            }
        }
    }
}

/// Every strategy the category may return is supported by the entity.
fn check_strategies(
    entity: &EntityDescriptor,
    table: &TableInfo,
    capabilities: Option<&CategoryCapabilities>,
    known_categories: &[String],
    problems: &mut Vec<String>,
) {
    // Strategy requirements, for every strategy the category may return.
    match capabilities {
        None => {
            let mut known: Vec<&str> = known_categories.iter().map(String::as_str).collect();
            known.sort_unstable();
            let listed = if known.is_empty() {
                String::new()
            } else {
                format!(" (it knows {})", known.join(", "))
            };
            problems.push(format!(
                "category {:?} is not known to the rule provider{listed}{}",
                entity.category,
                crate::base::suggest::did_you_mean(&entity.category, known.iter().copied())
            ))
        }
        Some(caps) => {
            problems.extend(marker_problems(entity, table, caps));
            for strategy in caps.iter() {
                match strategy {
                    Strategy::Anonymise => {
                        if entity.anonymised_at.is_none() {
                            problems.push(no_anonymised_at(entity, table));
                        }
                        if entity.anonymise.is_empty() {
                            problems.push(format!(
                                "category {:?} may anonymise, but no column is marked for anonymisation",
                                entity.category
                            ));
                        }
                    }
                    Strategy::SoftDelete if entity.soft_delete.is_none() => {
                        problems.push(format!(
                            "category {:?} may soft delete, but no soft-delete flag resolves (declare one, or add an `is_deleted` boolean column)",
                            entity.category
                        ));
                    }
                    _ => {}
                }
            }
            // A stage measured from the previous stage's marker needs the
            // entity to have that marker: the previous stage must write it.
            for (strategy, previous) in caps.marker_stages() {
                match previous.marker() {
                    Some(m) if entity.marker(m).is_none() => problems.push(format!(
                        "category {:?} has a {strategy} stage measured from the {previous} stage's marker, but the {previous} stage writes no {marker} here (map the {marker} marker to a timestamptz column, or measure the stage from the anchor)",
                        entity.category,
                        marker = m.key(),
                    )),
                    Some(_) => {}
                    None => problems.push(format!(
                        "category {:?} has a {strategy} stage measured from the {previous} stage's marker, but a {previous} stage writes no marker (only soft delete and anonymise do); measure the stage from the anchor",
                        entity.category
                    )),
                }
            }
        }
    }
}

/// Problems that span entities: duplicate ids, shared tables, cascades.
pub(crate) fn check_across(
    entities: &[(&EntityDescriptor, &TableInfo, Option<&CategoryCapabilities>)],
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut by_table: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for (e, t, _) in entities {
        by_table.entry(t.oid).or_default().push(&e.name);
    }
    for (e, t, _) in entities {
        let names = &by_table[&t.oid];
        if names.len() > 1 {
            problems.push(Problem::entity(
                &e.name,
                format!(
                    "table {} is also declared by {}; one independently owned table per retained entity",
                    t.name.display_plain(),
                    names.iter().filter(|n| **n != e.name).cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }
    let mut by_name: BTreeMap<&str, Vec<uuid::Uuid>> = BTreeMap::new();
    for (e, _, _) in entities {
        by_name.entry(e.name.as_str()).or_default().push(e.id);
    }
    for (name, ids) in by_name.iter().filter(|(_, ids)| ids.len() > 1) {
        problems.push(Problem::entity(
            *name,
            format!(
                "{} retained entities share the display name {name:?} (ids {}); names pick entities in the CLI and the ledger, so each must be unique",
                ids.len(),
                ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_type_mapping_table() {
        let cases: [(&str, Option<&[&str]>); 8] = [
            ("Uuid", Some(&["uuid"])),
            ("uuid::Uuid", Some(&["uuid"])),
            ("Option<DateTime<Utc>>", Some(&["timestamptz"])),
            ("chrono::NaiveDateTime", Some(&["timestamp"])),
            ("Option<Option<i64>>", Some(&["int8"])),
            ("bool", Some(&["bool"])),
            ("Option<String>", Some(TEXT_TYPES)),
            ("MyNewtype", None),
        ];
        for (rust, expected) in cases {
            assert_eq!(pg_types_for_rust(rust), expected, "{rust}");
        }
    }
}
