//! The checks of the columns a sweep writes: the soft-delete flag, the
//! erasure subjects' types, and each anonymised column (its role, its
//! literal, its length, its method). Pure functions over a catalog
//! snapshot; nothing here does I/O.

use super::catalog::{ColumnInfo, TableInfo, KEY_TYPES, TEXT_TYPES};
use crate::domain::model::{AnonymiseMethod, AnonymisedColumn, EntityDescriptor, Marker};

/// The longest text a tenant id of `column`'s type renders as (a `uuid`
/// 36 characters, `int8` 20 with its sign, `varchar(n)` n); `None` for a
/// type that sets no bound (`text`, `citext`).
fn longest_tenant_id(column: &ColumnInfo) -> Option<usize> {
    match column.type_name.as_str() {
        "uuid" => Some(36),
        "int2" => Some(6),
        "int4" => Some(11),
        "int8" => Some(20),
        "varchar" | "bpchar" => column.max_chars.and_then(|n| usize::try_from(n).ok()),
        _ => None,
    }
}

fn is_text(c: &ColumnInfo) -> bool {
    TEXT_TYPES.contains(&c.type_name.as_str())
}

/// The soft-delete flag, subject columns, markers and anonymised columns.
pub(super) fn check_markers_and_anonymise(
    entity: &EntityDescriptor,
    table: &TableInfo,
    problems: &mut Vec<String>,
) {
    check_soft_delete_and_subjects(entity, table, problems);
    let markers: Vec<&str> = Marker::ALL
        .iter()
        .filter_map(|m| entity.marker(*m))
        .collect();
    for a in &entity.anonymise {
        check_anonymised_role(entity, table, &markers, a, problems);
        check_anonymise_literal(a, problems);
        let Some(col) = table.column(&a.column) else {
            continue;
        };
        check_anonymised_length(entity, table, a, col, problems);
        check_anonymise_method(table, a, col, problems);
    }
}

/// The soft-delete flag is boolean, and subject columns are of a key type.
fn check_soft_delete_and_subjects(
    entity: &EntityDescriptor,
    table: &TableInfo,
    problems: &mut Vec<String>,
) {
    if let Some(col) = entity.soft_delete.as_deref().and_then(|c| table.column(c)) {
        if col.type_name != "bool" {
            problems.push(format!(
                "soft-delete flag column {:?} is {} but must be boolean",
                col.name, col.display_type
            ));
        }
    }
    for s in &entity.subjects {
        let Some(col) = table.column(&s.column) else {
            continue;
        };
        if !KEY_TYPES.contains(&col.type_name.as_str()) {
            problems.push(format!(
                "erasure subject column {:?} is {}; subjects must be uuid, integer or text columns",
                col.name, col.display_type
            ));
        }
    }
}

/// An anonymised column is no marker or anchor, nor part of a referenced key.
fn check_anonymised_role(
    entity: &EntityDescriptor,
    table: &TableInfo,
    markers: &[&str],
    a: &AnonymisedColumn,
    problems: &mut Vec<String>,
) {
    if markers.contains(&a.column.as_str()) || a.column == entity.anchor {
        problems.push(format!(
            "column {:?} is both anonymised and a marker or anchor; Cohort will not scrub the columns it relies on",
            a.column
        ));
    }
    // Rewriting a referenced key would reach the rows that reference it
    // (ON UPDATE CASCADE rewrites them, held or not) or fail every batch.
    for k in table
        .referenced_by
        .iter()
        .filter(|k| k.parent_columns.contains(&a.column))
    {
        problems.push(format!(
            "column {:?} is anonymised but is part of a key that foreign key {:?} on {} references; scrubbing it would change or break the rows that reference it",
            a.column,
            k.name,
            k.child.display_plain()
        ));
    }
}

/// A literal method's text holds no NUL and renders.
fn check_anonymise_literal(a: &AnonymisedColumn, problems: &mut Vec<String>) {
    if let AnonymiseMethod::Literal(v) = &a.method {
        if v.contains('\0') {
            problems.push(format!(
                "the literal for column {:?} contains a NUL character, which PostgreSQL text cannot store",
                a.column
            ));
        }
        if let Err(e) = crate::domain::model::render_literal(v, chrono::DateTime::UNIX_EPOCH, None)
        {
            problems.push(format!("the literal for column {:?}: {e}", a.column));
        }
    }
}

/// What the method writes fits the column's length.
fn check_anonymised_length(
    entity: &EntityDescriptor,
    table: &TableInfo,
    a: &AnonymisedColumn,
    col: &ColumnInfo,
    problems: &mut Vec<String>,
) {
    // The longest tenant id a `{tenant}` can render, as the tenant
    // column's type allows (a uuid is 36 characters); `None` when the
    // type sets no bound (text): then each tenant is as long as it is.
    let tenant_column = entity.tenant.as_deref().and_then(|t| table.column(t));
    let longest_tenant = tenant_column.and_then(longest_tenant_id);
    let uses_tenant = matches!(&a.method, AnonymiseMethod::Literal(v) if v.contains("{tenant}"));
    let written = match &a.method {
        AnonymiseMethod::Hash => Some(crate::sql::HASH_HEX_CHARS),
        // As rendered: a `{now}` is 20 characters, a `{tenant}` as long
        // as the longest id the tenant column can hold.
        AnonymiseMethod::Literal(v) => {
            let tenant = "0".repeat(longest_tenant.unwrap_or(0));
            crate::domain::model::render_literal(v, chrono::DateTime::UNIX_EPOCH, Some(&tenant))
                .ok()
                .map(|r| r.chars().count())
        }
        _ => None,
    };
    if let (Some(n), Some(max)) = (written, col.max_chars) {
        if n > usize::try_from(max).unwrap_or(0) {
            let tenant_note = match (uses_tenant, tenant_column, longest_tenant) {
                (true, Some(tc), Some(k)) => format!(
                    ", its {{tenant}} counted as the longest id of the tenant column ({}: {k} characters)",
                    tc.display_type
                ),
                _ => String::new(),
            };
            problems.push(format!(
                "column {:?} is {} but the {} anonymise method writes {n} characters{tenant_note}; every batch would fail (value too long). Widen the column or choose another method",
                col.name,
                col.display_type,
                a.method.kind()
            ));
        }
    }
}

/// The method suits the column: NULL if nullable, one value if not unique, text if text.
fn check_anonymise_method(
    table: &TableInfo,
    a: &AnonymisedColumn,
    col: &ColumnInfo,
    problems: &mut Vec<String>,
) {
    match &a.method {
        AnonymiseMethod::Null if col.not_null => problems.push(format!(
            "column {:?} is anonymised to NULL but is NOT NULL; use empty, a literal or a custom anonymiser",
            col.name
        )),
        AnonymiseMethod::Empty | AnonymiseMethod::Literal(_)
            if table.indexes.iter().any(|i| {
                (i.primary || i.unique) && !i.partial && i.columns == [col.name.clone()]
            }) =>
        {
            problems.push(format!(
                "column {:?} is unique, but the {} anonymise method writes the same value into every row: the second row of a batch would violate the unique index and retention would never happen. Use null, hash or a custom anonymiser",
                col.name,
                a.method.kind()
            ))
        }
        AnonymiseMethod::Empty | AnonymiseMethod::Literal(_) | AnonymiseMethod::Hash if !is_text(col) => {
            problems.push(format!(
                "column {:?} is {}; the {} anonymise method needs a text column",
                col.name,
                col.display_type,
                a.method.kind()
            ))
        }
        _ => {}
    }
}
