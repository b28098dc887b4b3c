//! Resolved entities: a declaration with conventions applied and every
//! column role decided. Everything downstream (validation, SQL planning,
//! execution) works on [`EntityDescriptor`] only.

use std::collections::BTreeSet;

use uuid::Uuid;

use super::anonymise::AnonymiseMethod;
use super::declaration::{DeclaredColumn, EntityDeclaration, Marker, Origin, Partitions};
use crate::base::ident::{check_identifier, QualifiedName};

/// Global column conventions (config), used when a declaration names no
/// column for a marker. Priority: declaration, then these, then the
/// built-in defaults ([`Marker::default_column`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Conventions {
    /// Record key column.
    pub record_id: Option<String>,
    /// Tenant column.
    pub tenant: Option<String>,
    /// Soft-delete flag column.
    pub soft_delete: Option<String>,
    /// Deleted-at column.
    pub deleted_at: Option<String>,
    /// Anonymised-at column.
    pub anonymised_at: Option<String>,
}

impl Conventions {
    /// The configured column for a marker, if any.
    pub fn get(&self, marker: Marker) -> Option<&str> {
        match marker {
            Marker::RecordId => self.record_id.as_deref(),
            Marker::Tenant => self.tenant.as_deref(),
            Marker::SoftDelete => self.soft_delete.as_deref(),
            Marker::DeletedAt => self.deleted_at.as_deref(),
            Marker::AnonymisedAt => self.anonymised_at.as_deref(),
        }
    }
}

/// An anonymised column and how it is scrubbed.
#[derive(Debug, Clone, PartialEq)]
pub struct AnonymisedColumn {
    /// The column.
    pub column: String,
    /// The method.
    pub method: AnonymiseMethod,
}

/// A resolved erasure-subject column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectColumn {
    /// The column.
    pub column: String,
    /// Its subject kind, if any.
    pub kind: Option<String>,
}

/// Where the `archive` strategy moves an entity's rows, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveTarget {
    /// The archive table, always schema-qualified.
    pub table: QualifiedName,
    /// The columns copied, in order; validation fills in every column of
    /// the source table when none were declared.
    pub columns: Vec<String>,
    /// Whether the entity's anonymise methods apply to the copy.
    pub anonymise: bool,
}

/// The archive table's column that records when a row was moved.
pub const ARCHIVED_AT: &str = "archived_at";
/// The archive table's column that records the run that moved a row.
pub const ARCHIVE_RUN_ID: &str = "run_id";

/// How a marker's column was chosen, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// Named by the declaration.
    Declared,
    /// From the global conventions.
    Convention,
    /// The built-in default name, found among the entity's columns.
    Default,
}

/// A resolved retained entity.
#[derive(Debug, Clone, PartialEq)]
pub struct EntityDescriptor {
    /// Durable identity.
    pub id: Uuid,
    /// Display ("type") name.
    pub name: String,
    /// Retention category.
    pub category: String,
    /// The table, always schema-qualified.
    pub table: QualifiedName,
    /// Anchor column.
    pub anchor: String,
    /// Record key column: the first of [`EntityDescriptor::record_key`].
    pub record_id: String,
    /// Every record key column, in key order: one, or several for a
    /// composite key (shown and taken as a JSON array of its parts).
    pub record_key: Vec<String>,
    /// Tenant column; `None` for tenantless entities.
    pub tenant: Option<String>,
    /// Columns of a tenantless entity's table that look like a tenant id
    /// but are declared not to be one
    /// ([`EntityDeclaration::not_tenant`](crate::domain::model::EntityDeclaration::not_tenant)).
    pub not_tenant: Vec<String>,
    /// Soft-delete flag column.
    pub soft_delete: Option<String>,
    /// Deleted-at column.
    pub deleted_at: Option<String>,
    /// Anonymised-at column.
    pub anonymised_at: Option<String>,
    /// Columns scrubbed by Anonymise.
    pub anonymise: Vec<AnonymisedColumn>,
    /// Erasure-subject columns.
    pub subjects: Vec<SubjectColumn>,
    /// Whether a purge may drop whole expired partitions.
    pub partitions: Partitions,
    /// Connections a sweep of this entity uses at once, when the entity
    /// sets it (`None`: the global `sweep_parallelism`).
    pub sweep_parallelism: Option<u32>,
    /// The entity's own `max_rows_per_second` (`None`: the global one
    /// and the live values alone).
    pub max_rows_per_second: Option<u32>,
    /// The entity's own `max_replica_lag` (`None`: the global one and the
    /// live values alone).
    pub max_replica_lag: Option<std::time::Duration>,
    /// Where the `archive` strategy moves rows (`None`: nowhere declared).
    pub archive: Option<ArchiveTarget>,
    /// The entity's own audit detail, which wins over its rule's.
    pub audit: Option<crate::domain::model::audit::AuditDetail>,
    /// Columns declared in Rust (derive), with their Rust types.
    pub declared_columns: Option<Vec<DeclaredColumn>>,
    /// How each marker was resolved.
    pub marker_resolution: Vec<(Marker, Resolution)>,
    /// Where the declaration came from.
    pub origin: Origin,
}

impl EntityDescriptor {
    /// The column for a marker, if resolved.
    pub fn marker(&self, marker: Marker) -> Option<&str> {
        match marker {
            Marker::RecordId => Some(self.record_id.as_str()),
            Marker::Tenant => self.tenant.as_deref(),
            Marker::SoftDelete => self.soft_delete.as_deref(),
            Marker::DeletedAt => self.deleted_at.as_deref(),
            Marker::AnonymisedAt => self.anonymised_at.as_deref(),
        }
    }

    /// Whether the entity has no tenant column.
    pub fn is_tenantless(&self) -> bool {
        self.tenant.is_none()
    }

    /// Whether the record key has several columns.
    pub fn has_composite_key(&self) -> bool {
        self.record_key.len() > 1
    }

    /// The Rust type declared for a column, when known.
    pub fn rust_type_of(&self, column: &str) -> Option<&str> {
        self.declared_columns
            .as_ref()?
            .iter()
            .find(|c| c.column == column)
            .map(|c| c.rust_type.as_str())
    }

    /// Every column the descriptor uses, each once.
    pub fn used_columns(&self) -> BTreeSet<&str> {
        let mut cols: BTreeSet<&str> = BTreeSet::new();
        cols.insert(&self.anchor);
        for m in Marker::ALL {
            if let Some(c) = self.marker(m) {
                cols.insert(c);
            }
        }
        cols.extend(self.record_key.iter().map(String::as_str));
        cols.extend(self.anonymise.iter().map(|a| a.column.as_str()));
        cols.extend(self.subjects.iter().map(|s| s.column.as_str()));
        cols
    }
}

/// An explicitly exempt entity: documented, never touched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExemptEntity {
    /// Durable identity.
    pub id: Uuid,
    /// Display name.
    pub name: String,
    /// Why it is exempt.
    pub reason: String,
}

/// The outcome of resolving one declaration.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub(crate) enum Resolved {
    /// A retained entity.
    Retained(Box<EntityDescriptor>),
    /// An explicitly exempt entity.
    Exempt(ExemptEntity),
}

/// Parses a durable entity id: a non-nil UUID.
pub(crate) fn parse_entity_id(raw: &str) -> Result<Uuid, String> {
    if raw.trim().is_empty() {
        return Err("the retained-entity id is missing or empty".into());
    }
    match Uuid::parse_str(raw.trim()) {
        Ok(id) if id.is_nil() => Err("the retained-entity id must not be the nil UUID".into()),
        Ok(id) => Ok(id),
        Err(_) => Err(format!("the retained-entity id {raw:?} is not a UUID")),
    }
}

/// Applies conventions to a declaration. `available` lists the columns
/// conventions and defaults may pick from: the declared columns when the
/// declaration lists any (derive), else the live table's columns (policy
/// file). Returns every problem found, not just the first.
pub(crate) fn resolve(
    decl: &EntityDeclaration,
    conventions: &Conventions,
    default_schema: &str,
    available: &[String],
) -> Result<Resolved, Vec<String>> {
    let mut problems = Vec::new();
    let id = parse_entity_id(&decl.id).map_err(|e| problems.push(e)).ok();

    if let Some(reason) = &decl.exempt {
        return resolve_exempt(decl, id, reason, problems);
    }

    let category = required_category(decl, &mut problems);
    let anchor = required_anchor(decl, &mut problems);
    let table = QualifiedName::resolve(
        decl.table.as_deref(),
        &heck::ToSnakeCase::to_snake_case(decl.name.as_str()),
        decl.schema.as_deref(),
        default_schema,
    )
    .map_err(|e| problems.push(e))
    .ok();

    let available: Vec<&str> = match &decl.columns {
        Some(cols) => cols.iter().map(|c| c.column.as_str()).collect(),
        None => available.iter().map(String::as_str).collect(),
    };
    let markers = resolve_markers(decl, conventions, &available, &mut problems);
    check_record_key_and_tenant(decl, conventions, &available, &markers, &mut problems);
    check_anonymised_columns(decl, &mut problems);
    check_subject_columns(decl, &mut problems);
    let archive = resolve_archive(decl, table.as_ref(), default_schema, &mut problems);
    check_column_names(decl, anchor.as_deref(), &mut problems);

    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Resolved::Retained(Box::new(retained_descriptor(
        decl, id, category, table, anchor, markers, archive,
    ))))
}

/// An exempt declaration: a reason, and neither a category nor `not_tenant`.
fn resolve_exempt(
    decl: &EntityDeclaration,
    id: Option<Uuid>,
    reason: &str,
    mut problems: Vec<String>,
) -> Result<Resolved, Vec<String>> {
    if decl.category.is_some() {
        problems.push(format!(
            "declared both retained (category {:?}) and exempt from retention; choose one",
            decl.category.as_deref().unwrap_or_default()
        ));
    }
    if reason.trim().is_empty() {
        problems.push("an exemption needs a non-empty reason".into());
    }
    if !decl.not_tenant.is_empty() {
        problems.push(format!(
            "not_tenant ({}) has no effect on an exempt entity, which Cohort never sweeps; remove it",
            decl.not_tenant.join(", ")
        ));
    }
    match (id, problems.is_empty()) {
        (Some(id), true) => Ok(Resolved::Exempt(ExemptEntity {
            id,
            name: decl.name.clone(),
            reason: reason.to_owned(),
        })),
        _ => Err(problems),
    }
}

/// The declared retention category, trimmed; `None` (a problem) when missing or blank.
fn required_category(decl: &EntityDeclaration, problems: &mut Vec<String>) -> Option<String> {
    match decl.category.as_deref().map(str::trim) {
        Some(c) if !c.is_empty() => Some(c.to_owned()),
        _ => {
            problems.push("no retention category declared".into());
            None
        }
    }
}

/// The declared anchor column; `None` (a problem) when missing or empty.
fn required_anchor(decl: &EntityDeclaration, problems: &mut Vec<String>) -> Option<String> {
    match decl.anchor.as_deref() {
        Some(a) if !a.is_empty() => Some(a.to_owned()),
        _ => {
            problems.push("no anchor column declared".into());
            None
        }
    }
}

/// The marker columns of one declaration, resolved, and how each was chosen.
struct MarkerColumns {
    /// The record key's columns in key order (empty: none resolved).
    record_key: Vec<String>,
    tenant: Option<String>,
    soft_delete: Option<String>,
    deleted_at: Option<String>,
    anonymised_at: Option<String>,
    resolution: Vec<(Marker, Resolution)>,
}

/// Every marker's column ([`marker_column`]), each marker declared at most once.
fn resolve_markers(
    decl: &EntityDeclaration,
    conventions: &Conventions,
    available: &[&str],
    problems: &mut Vec<String>,
) -> MarkerColumns {
    let explicit = explicit_markers(decl, problems);
    let mut resolution = Vec::new();
    let declared_key: Vec<String> = decl
        .markers
        .iter()
        .filter(|(m, _)| *m == Marker::RecordId)
        .map(|(_, c)| c.clone())
        .collect();
    let record_key = if declared_key.len() > 1 {
        resolution.push((Marker::RecordId, Resolution::Declared));
        declared_key
    } else {
        marker_column(
            Marker::RecordId,
            &explicit,
            conventions,
            available,
            &mut resolution,
        )
        .into_iter()
        .collect()
    };
    let mut column =
        |marker: Marker| marker_column(marker, &explicit, conventions, available, &mut resolution);
    let tenant = column(Marker::Tenant);
    let soft_delete = column(Marker::SoftDelete);
    let deleted_at = column(Marker::DeletedAt);
    let anonymised_at = column(Marker::AnonymisedAt);
    MarkerColumns {
        record_key,
        tenant,
        soft_delete,
        deleted_at,
        anonymised_at,
        resolution,
    }
}

/// The markers the declaration names, each at most once (a second is a problem).
fn explicit_markers<'d>(
    decl: &'d EntityDeclaration,
    problems: &mut Vec<String>,
) -> Vec<(Marker, &'d str)> {
    let mut explicit: Vec<(Marker, &str)> = Vec::new();
    for (marker, column) in &decl.markers {
        if *marker == Marker::RecordId {
            // Several record_id columns are a composite key, each once.
            if explicit.iter().any(|(m, c)| m == marker && c == column) {
                problems.push(format!(
                    "the record key lists the column {column:?} twice; each key column appears once"
                ));
            } else if !explicit.iter().any(|(m, _)| m == marker) {
                explicit.push((*marker, column));
            }
            continue;
        }
        if let Some((_, first)) = explicit.iter().find(|(m, _)| m == marker) {
            problems.push(format!(
                "the {marker} marker is declared twice (columns {first:?} and {column:?}); each marker may be on at most one column"
            ));
        } else {
            explicit.push((*marker, column));
        }
    }
    explicit
}

/// One marker's column: declared, else the convention's, else the default, if available.
fn marker_column(
    marker: Marker,
    explicit: &[(Marker, &str)],
    conventions: &Conventions,
    available: &[&str],
    resolution: &mut Vec<(Marker, Resolution)>,
) -> Option<String> {
    if let Some((_, col)) = explicit.iter().find(|(m, _)| *m == marker) {
        resolution.push((marker, Resolution::Declared));
        return Some((*col).to_owned());
    }
    if let Some(col) = conventions.get(marker) {
        if available.contains(&col) {
            resolution.push((marker, Resolution::Convention));
            return Some(col.to_owned());
        }
    }
    let default = marker.default_column();
    if available.contains(&default) {
        resolution.push((marker, Resolution::Default));
        return Some(default.to_owned());
    }
    None
}

/// A record key resolved, and a tenant column exactly when the entity is not tenantless.
fn check_record_key_and_tenant(
    decl: &EntityDeclaration,
    conventions: &Conventions,
    available: &[&str],
    markers: &MarkerColumns,
    problems: &mut Vec<String>,
) {
    if markers.record_key.is_empty() {
        problems.push(format!(
            "no record key column: none declared and the default {:?} does not exist",
            conventions.get(Marker::RecordId).unwrap_or("id")
        ));
    }
    match (&markers.tenant, decl.tenantless) {
        (Some(col), true) => problems.push(format!(
            "declared tenantless, but the tenant column {col:?} resolves; remove `tenantless` or map the tenant"
        )),
        (None, false) => problems.push(format!(
            "no tenant column: none declared and {:?} does not exist; declare the tenant column{} or mark the entity tenantless",
            conventions.get(Marker::Tenant).unwrap_or("tenant_id"),
            match available.iter().find(|c| crate::domain::model::looks_like_tenant(c)) {
                Some(c) => format!(" (`tenant = {c:?}` reads as one)"),
                None => String::new(),
            }
        )),
        _ => {}
    }
}

/// Each anonymised column has one method.
fn check_anonymised_columns(decl: &EntityDeclaration, problems: &mut Vec<String>) {
    let mut seen = BTreeSet::new();
    for (column, _) in &decl.anonymise {
        if !seen.insert(column.as_str()) {
            problems.push(format!(
                "column {column:?} has more than one anonymise method"
            ));
        }
    }
}

/// Each erasure subject column is declared once, its kind (if any) a word.
fn check_subject_columns(decl: &EntityDeclaration, problems: &mut Vec<String>) {
    let mut seen = BTreeSet::new();
    for s in &decl.subjects {
        if !seen.insert(s.column.as_str()) {
            problems.push(format!(
                "erasure subject column {:?} is declared twice",
                s.column
            ));
        }
        if s.kind.as_deref().is_some_and(|k| k.trim().is_empty()) {
            problems.push(format!(
                "erasure subject column {:?} has an empty kind",
                s.column
            ));
        } else if let Some(k) = s
            .kind
            .as_deref()
            .filter(|k| !crate::base::ident::is_kind_word(k))
        {
            problems.push(format!(
                "erasure subject column {:?} has the kind {k:?}; a kind is a word of at most 63 ASCII letters, digits, `_`, `-` or `.` (e.g. `user`, `email`)",
                s.column
            ));
        }
    }
}

/// The archive target, if declared, with its columns and anonymise-on-archive checked.
fn resolve_archive(
    decl: &EntityDeclaration,
    table: Option<&QualifiedName>,
    default_schema: &str,
    problems: &mut Vec<String>,
) -> Option<ArchiveTarget> {
    let archive = match &decl.archive {
        None => None,
        Some(a) if a.table.trim().is_empty() => {
            problems.push("the archive needs a table (archive_table)".into());
            None
        }
        Some(a) => {
            let mut seen = BTreeSet::new();
            for c in &a.columns {
                if let Err(e) = check_identifier(c) {
                    problems.push(format!("archive column name: {e}"));
                } else if !seen.insert(c.as_str()) {
                    problems.push(format!("archive column {c:?} is listed twice"));
                }
            }
            let schema = table.map(|t| t.schema.as_str()).unwrap_or(default_schema);
            QualifiedName::parse(&a.table, schema)
                .map_err(|e| problems.push(format!("archive table: {e}")))
                .ok()
                .map(|t| ArchiveTarget {
                    table: t,
                    columns: a.columns.clone(),
                    anonymise: a.anonymise,
                })
        }
    };
    if archive
        .as_ref()
        .is_some_and(|a| a.anonymise && decl.anonymise.is_empty())
    {
        problems
            .push("anonymise-on-archive is set, but no column is marked for anonymisation".into());
    }
    archive
}

/// Every column the declaration names is a valid identifier.
fn check_column_names(decl: &EntityDeclaration, anchor: Option<&str>, problems: &mut Vec<String>) {
    for name in decl
        .markers
        .iter()
        .map(|(_, c)| c.as_str())
        .chain(decl.anonymise.iter().map(|(c, _)| c.as_str()))
        .chain(decl.subjects.iter().map(|s| s.column.as_str()))
        .chain(anchor)
    {
        if let Err(e) = check_identifier(name) {
            problems.push(format!("column name: {e}"));
        }
    }
}

/// The descriptor of a retained declaration whose every part resolved without a problem.
fn retained_descriptor(
    decl: &EntityDeclaration,
    id: Option<Uuid>,
    category: Option<String>,
    table: Option<QualifiedName>,
    anchor: Option<String>,
    markers: MarkerColumns,
    archive: Option<ArchiveTarget>,
) -> EntityDescriptor {
    EntityDescriptor {
        id: id.expect("checked"),
        name: decl.name.clone(),
        category: category.expect("checked"),
        table: table.expect("checked"),
        anchor: anchor.expect("checked"),
        record_id: markers.record_key.first().cloned().expect("checked"),
        record_key: markers.record_key,
        tenant: markers.tenant,
        not_tenant: decl.not_tenant.clone(),
        soft_delete: markers.soft_delete,
        deleted_at: markers.deleted_at,
        anonymised_at: markers.anonymised_at,
        anonymise: decl
            .anonymise
            .iter()
            .map(|(column, method)| AnonymisedColumn {
                column: column.clone(),
                method: method.clone(),
            })
            .collect(),
        subjects: decl
            .subjects
            .iter()
            .map(|s| SubjectColumn {
                column: s.column.clone(),
                kind: s.kind.clone(),
            })
            .collect(),
        partitions: decl.partitions,
        sweep_parallelism: decl.sweep_parallelism,
        max_rows_per_second: decl.max_rows_per_second,
        max_replica_lag: decl.max_replica_lag,
        archive,
        audit: decl.audit,
        declared_columns: decl.columns.clone(),
        marker_resolution: markers.resolution,
        origin: decl.origin.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8";

    fn cols(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn retained(r: Result<Resolved, Vec<String>>) -> EntityDescriptor {
        match r {
            Ok(Resolved::Retained(d)) => *d,
            other => panic!("expected a retained entity, got {other:?}"),
        }
    }

    fn base() -> EntityDeclaration {
        EntityDeclaration::new("SessionNote", ID)
            .category("notes")
            .anchor("created_at")
    }

    #[test]
    fn convention_resolution_table() {
        // (declared markers, conventions.tenant, available columns, expected tenant, expected resolution)
        let org = Conventions {
            tenant: Some("organisation_id".into()),
            ..Conventions::default()
        };
        let none = Conventions::default();
        type Case<'a> = (
            EntityDeclaration,
            &'a Conventions,
            Vec<String>,
            Option<&'a str>,
            Resolution,
        );
        let cases: Vec<Case<'_>> = vec![
            // Built-in default when the column exists.
            (
                base(),
                &none,
                cols(&["id", "tenant_id", "created_at"]),
                Some("tenant_id"),
                Resolution::Default,
            ),
            // Convention beats the default.
            (
                base(),
                &org,
                cols(&["id", "tenant_id", "organisation_id", "created_at"]),
                Some("organisation_id"),
                Resolution::Convention,
            ),
            // Convention naming a missing column falls back to the default.
            (
                base(),
                &org,
                cols(&["id", "tenant_id", "created_at"]),
                Some("tenant_id"),
                Resolution::Default,
            ),
            // Declaration beats both.
            (
                base().marker(Marker::Tenant, "owner"),
                &org,
                cols(&["id", "tenant_id", "organisation_id", "owner"]),
                Some("owner"),
                Resolution::Declared,
            ),
        ];
        for (decl, conv, available, tenant, how) in cases {
            let d = retained(resolve(&decl, conv, "public", &available));
            assert_eq!(d.tenant.as_deref(), tenant, "{available:?}");
            assert!(
                d.marker_resolution.contains(&(Marker::Tenant, how)),
                "{:?}",
                d.marker_resolution
            );
        }
    }

    #[test]
    fn declared_columns_win_over_catalog_columns() {
        let decl = base()
            .column("id", "id", "Uuid")
            .column("created_at", "created_at", "DateTime<Utc>")
            .tenantless();
        // The live table has tenant_id, but the Rust type does not declare it.
        let d = retained(resolve(
            &decl,
            &Conventions::default(),
            "public",
            &cols(&["id", "tenant_id", "created_at"]),
        ));
        assert_eq!(d.tenant, None);
        assert_eq!(d.table, QualifiedName::new("public", "session_note"));
    }

    #[test]
    fn table_and_schema_resolution_table() {
        let cases = [
            (base().table("notes"), "public", ("public", "notes")),
            (base().table("notes"), "app", ("app", "notes")),
            (base().table("archive.notes"), "app", ("archive", "notes")),
            (base().table("notes").schema("s2"), "app", ("s2", "notes")),
            (base(), "public", ("public", "session_note")),
        ];
        for (decl, default, (schema, name)) in cases {
            let d = retained(resolve(
                &decl.tenantless(),
                &Conventions::default(),
                default,
                &cols(&["id", "created_at"]),
            ));
            assert_eq!(d.table, QualifiedName::new(schema, name));
        }
    }

    #[test]
    fn every_problem_is_reported() {
        let decl = EntityDeclaration::new("Bad", "not-a-uuid")
            .marker(Marker::Tenant, "a")
            .marker(Marker::Tenant, "b")
            .anonymise("email", AnonymiseMethod::Null)
            .anonymise("email", AnonymiseMethod::Empty)
            .subject("user_id", Some(" "));
        let problems = resolve(
            &decl,
            &Conventions::default(),
            "public",
            &cols(&["created_at"]),
        )
        .unwrap_err();
        let text = problems.join("\n");
        for expected in [
            "is not a UUID",
            "no retention category",
            "no anchor column",
            "tenant marker is declared twice",
            "no record key column",
            "more than one anonymise method",
            "empty kind",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
        }
    }

    #[test]
    fn a_subject_kind_must_be_a_word() {
        for (kind, ok) in [
            ("user", true),
            ("e-mail.v2_x", true),
            ("user's", false),
            ("user kind", false),
            ("élève", false),
        ] {
            let decl = EntityDeclaration::new("Note", ID)
                .category("notes")
                .anchor("created_at")
                .subject("user_id", Some(kind));
            let result = resolve(
                &decl,
                &Conventions::default(),
                "public",
                &cols(&["id", "tenant_id", "created_at", "user_id"]),
            );
            match result {
                Ok(_) => assert!(ok, "{kind:?} accepted"),
                Err(problems) => {
                    assert!(!ok, "{kind:?} refused: {problems:?}");
                    assert!(
                        problems.join("\n").contains("a kind is a word"),
                        "{problems:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn ids_table() {
        assert!(parse_entity_id(ID).is_ok());
        assert!(parse_entity_id("A3F467FE-C5D0-4F17-9897-83C373CC1DC8").is_ok());
        for bad in [
            "",
            "  ",
            "xyz",
            "00000000-0000-0000-0000-000000000000",
            "a3f467fe-c5d0-4f17-9897",
        ] {
            assert!(parse_entity_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tenantless_conflicts_and_missing_tenant() {
        let both = resolve(
            &base().tenantless(),
            &Conventions::default(),
            "public",
            &cols(&["id", "tenant_id", "created_at"]),
        )
        .unwrap_err();
        assert!(
            both[0].contains("declared tenantless, but the tenant column \"tenant_id\" resolves"),
            "{both:?}"
        );
        let neither = resolve(
            &base(),
            &Conventions::default(),
            "public",
            &cols(&["id", "created_at"]),
        )
        .unwrap_err();
        assert!(neither[0].contains("no tenant column"), "{neither:?}");
    }

    #[test]
    fn retained_and_exempt_conflict() {
        let problems = resolve(
            &base().exempt("audit log"),
            &Conventions::default(),
            "public",
            &[],
        )
        .unwrap_err();
        assert!(problems[0].contains("both retained"), "{problems:?}");
        let ok = resolve(
            &EntityDeclaration::new("Log", ID).exempt("audit log"),
            &Conventions::default(),
            "public",
            &[],
        )
        .unwrap();
        assert!(
            matches!(ok, Resolved::Exempt(ExemptEntity { ref reason, .. }) if reason == "audit log")
        );
    }
}
