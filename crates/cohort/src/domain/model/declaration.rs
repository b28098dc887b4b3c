//! What a derive, a policy file or hand-written code *declares* about an
//! entity, before conventions and the catalog are applied.
//!
//! Declarations are in column terms: the derive macro has already turned
//! field names into column names (explicit `column = …`, then the ORM's
//! rename attributes, then the field name).

use std::fmt;

use super::anonymise::AnonymiseMethod;

/// One of the five column roles Cohort understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Marker {
    /// The record key (default column `id`).
    RecordId,
    /// The tenant column (default `tenant_id`).
    Tenant,
    /// The soft-delete flag (default `is_deleted`).
    SoftDelete,
    /// When the row was soft-deleted (default `deleted_at`).
    DeletedAt,
    /// When the row was anonymised (default `anonymised_at`).
    AnonymisedAt,
}

impl Marker {
    /// Every marker.
    pub const ALL: [Marker; 5] = [
        Marker::RecordId,
        Marker::Tenant,
        Marker::SoftDelete,
        Marker::DeletedAt,
        Marker::AnonymisedAt,
    ];

    /// The attribute / policy-file key (`record_id`, `tenant`, `soft_delete`, `deleted_at`, `anonymised_at`).
    pub fn key(self) -> &'static str {
        match self {
            Marker::RecordId => "record_id",
            Marker::Tenant => "tenant",
            Marker::SoftDelete => "soft_delete",
            Marker::DeletedAt => "deleted_at",
            Marker::AnonymisedAt => "anonymised_at",
        }
    }

    /// The built-in default column name.
    pub fn default_column(self) -> &'static str {
        match self {
            Marker::RecordId => "id",
            Marker::Tenant => "tenant_id",
            Marker::SoftDelete => "is_deleted",
            Marker::DeletedAt => "deleted_at",
            Marker::AnonymisedAt => "anonymised_at",
        }
    }
}

impl fmt::Display for Marker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// How a sweep treats a partitioned table's expired partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Partitions {
    /// Every row goes through the row path (lock, mutate, audit in
    /// batches). The default.
    #[default]
    Rows,
    /// Opt-in partition purge: a purge detaches and drops each whole
    /// partition whose upper bound is at or before the cutoff, when none of
    /// its rows is under an active hold and the entity has no row
    /// handlers; everything else goes through the row path. Only for
    /// tenantless entities on tables range-partitioned on the anchor.
    Drop,
}

impl Partitions {
    /// The policy-file and attribute spelling (`rows`, `drop`).
    pub fn as_str(self) -> &'static str {
        match self {
            Partitions::Rows => "rows",
            Partitions::Drop => "drop",
        }
    }

    /// Parses `rows` or `drop`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "rows" => Some(Partitions::Rows),
            "drop" => Some(Partitions::Drop),
            _ => None,
        }
    }
}

/// A column the declaration knows about, with its Rust type when declared
/// by the derive (used to check the column's type is compatible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredColumn {
    /// The column name.
    pub column: String,
    /// The Rust field it came from.
    pub field: String,
    /// The field's Rust type as written (`Option<DateTime<Utc>>`), for compatibility checks.
    pub rust_type: String,
}

/// An erasure-subject column, optionally with a subject kind (e.g. `user`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectDeclaration {
    /// The column holding the subject identifier.
    pub column: String,
    /// A subject kind that narrows which columns an erasure request uses.
    pub kind: Option<String>,
}

/// Where a declaration came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// `#[derive(Retained)]` on a Rust type.
    Derive {
        /// The type's path as written (`my_app::SessionNote`).
        type_path: String,
    },
    /// An `[[entity]]` of a policy file.
    PolicyFile,
    /// Built in code with [`EntityDeclaration::new`].
    Code,
}

/// A retained (or explicitly exempt) entity as declared.
///
/// Built by the derive, by the policy-file loader, or by hand:
///
/// ```
/// use cohort::model::EntityDeclaration;
/// let decl = EntityDeclaration::new("SessionNote", "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")
///     .category("session-notes")
///     .anchor("created_at")
///     .table("public.session_notes");
/// assert_eq!(decl.name(), "SessionNote");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct EntityDeclaration {
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) category: Option<String>,
    pub(crate) anchor: Option<String>,
    pub(crate) table: Option<String>,
    pub(crate) schema: Option<String>,
    pub(crate) tenantless: bool,
    pub(crate) not_tenant: Vec<String>,
    pub(crate) exempt: Option<String>,
    pub(crate) partitions: Partitions,
    pub(crate) sweep_parallelism: Option<u32>,
    pub(crate) max_rows_per_second: Option<u32>,
    pub(crate) max_replica_lag: Option<std::time::Duration>,
    pub(crate) audit: Option<crate::domain::model::audit::AuditDetail>,
    pub(crate) columns: Option<Vec<DeclaredColumn>>,
    pub(crate) markers: Vec<(Marker, String)>,
    pub(crate) anonymise: Vec<(String, AnonymiseMethod)>,
    pub(crate) subjects: Vec<SubjectDeclaration>,
    pub(crate) archive: Option<ArchiveDeclaration>,
    pub(crate) origin: Origin,
}

/// Where the `archive` strategy moves an entity's rows, as declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveDeclaration {
    /// The archive table, `schema.table` or `table` (in the entity's schema).
    pub table: String,
    /// The columns copied; empty means every column of the source table.
    pub columns: Vec<String>,
    /// Whether the entity's anonymise methods apply to the copy.
    pub anonymise: bool,
}

impl EntityDeclaration {
    /// Starts a declaration with its display name and durable id (a UUID, as text).
    pub fn new(name: impl Into<String>, id: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            id: id.into(),
            category: None,
            anchor: None,
            table: None,
            schema: None,
            tenantless: false,
            not_tenant: Vec::new(),
            exempt: None,
            partitions: Partitions::Rows,
            sweep_parallelism: None,
            max_rows_per_second: None,
            max_replica_lag: None,
            audit: None,
            columns: None,
            markers: Vec::new(),
            anonymise: Vec::new(),
            subjects: Vec::new(),
            archive: None,
            origin: Origin::Code,
        }
    }

    /// The retention category.
    pub fn category(mut self, category: impl Into<String>) -> Self {
        self.category = Some(category.into());
        self
    }

    /// The anchor column (the timestamp a row's age is measured from).
    pub fn anchor(mut self, column: impl Into<String>) -> Self {
        self.anchor = Some(column.into());
        self
    }

    /// The table, `schema.table` or `table`.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = Some(table.into());
        self
    }

    /// The table's schema, when `table` does not name one.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Marks a global entity with no tenant column.
    pub fn tenantless(mut self) -> Self {
        self.tenantless = true;
        self
    }

    /// Says that a column of a tenantless entity's table, whose name
    /// reads as a tenant id ([`looks_like_tenant`]), is not one. Without
    /// it validation refuses `tenantless` on such a table: the rows would
    /// be swept across every tenant, and per-tenant overrides would not
    /// apply. Each call adds a column; it must exist, look like a tenant
    /// and the entity must be tenantless (otherwise validation refuses it:
    /// it would do nothing).
    pub fn not_tenant(mut self, column: impl Into<String>) -> Self {
        self.not_tenant.push(column.into());
        self
    }

    /// Documents an explicit exemption: Cohort never touches this entity.
    pub fn exempt(mut self, reason: impl Into<String>) -> Self {
        self.exempt = Some(reason.into());
        self
    }

    /// How much audit this entity's mutations write, whatever its
    /// category's rule asks (the entity's setting wins): `PerRow` records
    /// every changed record id, `Summary` only the counts. Entities whose
    /// rule is `exempt` mutate nothing, so it never applies to them.
    pub fn audit(mut self, audit: crate::domain::model::audit::AuditDetail) -> Self {
        self.audit = Some(audit);
        self
    }

    /// How a sweep treats the table's expired partitions (default `Rows`;
    /// [`Partitions::Drop`] opts the entity into partition purge).
    pub fn partitions(mut self, partitions: Partitions) -> Self {
        self.partitions = partitions;
        self
    }

    /// Sweeps this entity on `n` connections at once (its eligible rows
    /// split into `n` disjoint keyset ranges), whatever the global
    /// `sweep_parallelism` says. 1 is the run's own connection alone;
    /// validation refuses 0, more than 64 and more than the pool can serve.
    pub fn sweep_parallelism(mut self, n: u32) -> Self {
        self.sweep_parallelism = Some(n);
        self
    }

    /// Paces this entity's sweeps under `n` changed rows a second, beside
    /// the global `max_rows_per_second` and the live values in the
    /// database (the strictest wins). Validation refuses 0.
    pub fn max_rows_per_second(mut self, n: u32) -> Self {
        self.max_rows_per_second = Some(n);
        self
    }

    /// Waits before each batch of this entity while a standby's replay is
    /// further behind than `lag`, beside the global `max_replica_lag` and
    /// the live values (the strictest wins). Validation refuses less than
    /// a second.
    pub fn max_replica_lag(mut self, lag: std::time::Duration) -> Self {
        self.max_replica_lag = Some(lag);
        self
    }

    /// Declares a known column (the derive declares every field). Once any
    /// column is declared, only declared columns are candidates for
    /// conventions; otherwise the live table's columns are.
    pub fn column(
        mut self,
        column: impl Into<String>,
        field: impl Into<String>,
        rust_type: impl Into<String>,
    ) -> Self {
        self.columns
            .get_or_insert_with(Vec::new)
            .push(DeclaredColumn {
                column: column.into(),
                field: field.into(),
                rust_type: rust_type.into(),
            });
        self
    }

    /// Assigns a marker role to a column explicitly. `record_id` may be
    /// given to several columns: together, in the order given, they are a
    /// composite record key ([`EntityDeclaration::record_key`]).
    pub fn marker(mut self, marker: Marker, column: impl Into<String>) -> Self {
        self.markers.push((marker, column.into()));
        self
    }

    /// The record key as several columns, in key order (a composite key:
    /// the table's primary key or a unique index of exactly these NOT NULL
    /// columns). One column is the same as `marker(Marker::RecordId, c)`.
    ///
    /// ```
    /// use cohort::model::EntityDeclaration;
    /// let decl = EntityDeclaration::new("AuditLog", "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")
    ///     .record_key(["id", "logged_at"]);
    /// assert_eq!(decl.name(), "AuditLog");
    /// ```
    pub fn record_key<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        for c in columns {
            self.markers.push((Marker::RecordId, c.into()));
        }
        self
    }

    /// Scrubs `column` with `method` when anonymising.
    pub fn anonymise(mut self, column: impl Into<String>, method: AnonymiseMethod) -> Self {
        self.anonymise.push((column.into(), method));
        self
    }

    /// Adds an erasure-subject column, optionally with a kind.
    pub fn subject(mut self, column: impl Into<String>, kind: Option<&str>) -> Self {
        self.subjects.push(SubjectDeclaration {
            column: column.into(),
            kind: kind.map(str::to_owned),
        });
        self
    }

    /// Where the `archive` strategy moves rows: `schema.table`, or `table`
    /// in the entity's schema. The table needs the archived columns (all
    /// of the source's, or those of [`archive_columns`](Self::archive_columns))
    /// in the same types, plus `archived_at timestamptz` and `run_id uuid`;
    /// startup validation checks it against the catalog.
    pub fn archive_to(mut self, table: impl Into<String>) -> Self {
        self.archive_mut().table = table.into();
        self
    }

    /// Archives only these columns (the record key among them) instead of
    /// every column of the source.
    pub fn archive_columns<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.archive_mut().columns = columns.into_iter().map(Into::into).collect();
        self
    }

    /// Applies the entity's anonymise methods to the archived copy, so the
    /// archive keeps the row's shape but not the person.
    pub fn anonymise_on_archive(mut self) -> Self {
        self.archive_mut().anonymise = true;
        self
    }

    fn archive_mut(&mut self) -> &mut ArchiveDeclaration {
        self.archive.get_or_insert_with(|| ArchiveDeclaration {
            table: String::new(),
            columns: Vec::new(),
            anonymise: false,
        })
    }

    /// Records where the declaration came from.
    pub fn origin(mut self, origin: Origin) -> Self {
        self.origin = origin;
        self
    }

    /// The display name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The durable id as declared (not yet validated).
    pub fn raw_id(&self) -> &str {
        &self.id
    }

    /// The tables this declaration names, resolved as validation resolves
    /// them: its table (a name without a schema in `default_schema`; none
    /// declared: the entity's name in snake case), then its archive table
    /// (in the entity's schema unless it names one). A name that does not
    /// parse is left out (validation reports it).
    ///
    /// ```
    /// let e = cohort::EntityDeclaration::new("OrderLine", "5d6c0a3e-0000-4000-8000-000000000001")
    ///     .archive_to("archive.order_lines");
    /// let names: Vec<String> = e.named_tables("app").iter().map(|t| t.path()).collect();
    /// assert_eq!(names, ["app.order_line", "archive.order_lines"]);
    /// ```
    pub fn named_tables(&self, default_schema: &str) -> Vec<crate::base::ident::QualifiedName> {
        let table = crate::base::ident::QualifiedName::resolve(
            self.table.as_deref(),
            &heck::ToSnakeCase::to_snake_case(self.name.as_str()),
            self.schema.as_deref(),
            default_schema,
        )
        .ok();
        let schema = table.as_ref().map_or(default_schema, |t| t.schema.as_str());
        let archive = self
            .archive
            .as_ref()
            .and_then(|a| crate::base::ident::QualifiedName::parse(&a.table, schema).ok());
        table.into_iter().chain(archive).collect()
    }

    /// Whether this entity is explicitly exempt.
    pub fn is_exempt(&self) -> bool {
        self.exempt.is_some()
    }

    /// The declared origin.
    pub fn declared_origin(&self) -> &Origin {
        &self.origin
    }

    /// The anonymised columns and how each is scrubbed, in declaration
    /// order.
    pub fn anonymised(&self) -> &[(String, AnonymiseMethod)] {
        &self.anonymise
    }
}

/// Implemented by `#[derive(Retained)]`: the type's declaration.
pub trait Retained {
    /// The declaration the derive built from the type's attributes.
    fn declaration() -> EntityDeclaration;
}

/// Names that read as a tenant id once case and every character that is
/// not a letter or digit are ignored.
const TENANT_NAMES: [&str; 7] = [
    "tenantid",
    "tenant",
    "tenantuuid",
    "tenantkey",
    "organisationid",
    "organizationid",
    "orgid",
];

/// Whether a column's name reads as a tenant id: ignoring case and every
/// character that is not a letter or digit, it is `tenant_id`, `tenant`,
/// `tenant_uuid`, `tenant_key`, `organisation_id`, `organization_id` or
/// `org_id` (so `TenantId`, `tenantid` and `Tenant_ID` all do). The one
/// rule `cohort init` proposes a tenant column by, and validation refuses
/// `tenantless` by (together with the configured tenant convention),
/// unless the entity says the column is not a tenant
/// ([`EntityDeclaration::not_tenant`]).
pub fn looks_like_tenant(column: &str) -> bool {
    TENANT_NAMES.contains(&folded_column_name(column).as_str())
}

/// A column's name as the naming conventions compare it: lower case, with
/// every character that is not a letter or digit left out (`"Tenant_ID"`
/// and `tenantid` both fold to `tenantid`).
pub fn folded_column_name(column: &str) -> String {
    column
        .chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}
