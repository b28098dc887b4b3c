//! The rows the catalog lookups return, decoded by column name here and
//! nowhere else (validation turns them into its own types).

use sqlx::postgres::types::Oid;

use crate::base::ident::QualifiedName;

/// The row of [`super::server_info`].
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct ServerInfo {
    /// `server_version_num`, e.g. `150004`.
    #[sqlx(rename = "num")]
    pub(crate) version_num: i32,
    /// `version()`: the banner.
    pub(crate) version: String,
}

/// A `schema, name` row ([`super::near_tables`]).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct NameRow {
    pub(crate) schema: String,
    pub(crate) name: String,
}

impl From<NameRow> for QualifiedName {
    fn from(row: NameRow) -> Self {
        QualifiedName::new(row.schema, row.name)
    }
}

/// The row of [`super::table`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TableRow {
    pub(crate) oid: Oid,
    /// `r` table, `p` partitioned table, `v` view, …
    pub(crate) relkind: String,
    pub(crate) relispartition: bool,
    pub(crate) inherits: bool,
    pub(crate) has_children: bool,
    pub(crate) comment: Option<String>,
}

/// A column as the catalog reports it (the row of [`super::columns`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct ColumnInfo {
    pub(crate) name: String,
    /// `format_type` output, e.g. `timestamp with time zone`.
    pub(crate) display_type: String,
    /// The base type's `typname`, e.g. `timestamptz`, `int4`.
    pub(crate) type_name: String,
    /// Whether its collation compares deterministically (byte-wise equal
    /// means equal); a non-deterministic collation (e.g. case-insensitive
    /// ICU) makes SQL equality disagree with Cohort's identity of values.
    pub(crate) deterministic: bool,
    /// The schema of that base type (`pg_catalog`, or where an extension
    /// such as citext is installed).
    pub(crate) type_schema: String,
    /// The declared length of `varchar(n)` / `char(n)` (also through a
    /// domain), in characters.
    pub(crate) max_chars: Option<i32>,
    /// The type modifier in force (`atttypmod`, or a domain's
    /// `typtypmod`): `-1` when the type is unconstrained.
    pub(crate) typmod: i32,
    pub(crate) not_null: bool,
    /// Whether the column has a DEFAULT expression.
    pub(crate) has_default: bool,
    /// That expression, as the server prints it (`pg_get_expr`).
    pub(crate) default_expr: Option<String>,
    /// Whether it is an identity column (filled by its sequence).
    pub(crate) identity: bool,
    /// Whether it is a generated column (computed; cannot be written).
    pub(crate) generated: bool,
}

impl ColumnInfo {
    /// The base type, schema-qualified (for casts in SQL).
    pub(crate) fn qualified_type(&self) -> QualifiedName {
        QualifiedName::new(self.type_schema.clone(), self.type_name.clone())
    }
}

/// An index's key columns (an expression shows as an empty name): the row
/// of [`super::indexes`].
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct IndexInfo {
    #[sqlx(rename = "is_primary")]
    pub(crate) primary: bool,
    #[sqlx(rename = "is_unique")]
    pub(crate) unique: bool,
    pub(crate) partial: bool,
    /// A partial index's predicate as the server prints it
    /// (`pg_get_expr`, e.g. `(is_deleted IS NOT TRUE)`).
    pub(crate) predicate: Option<String>,
    /// `indisvalid AND indisready AND indimmediate`: an index left invalid
    /// by a failed `CREATE INDEX CONCURRENTLY`, or a deferrable one, does
    /// not guarantee uniqueness when a statement runs.
    pub(crate) usable: bool,
    /// `indisvalid`: the planner reads through it. An index a failed
    /// `CREATE INDEX CONCURRENTLY` left behind is not, so it serves no
    /// scan and silences no advice.
    pub(crate) valid: bool,
    pub(crate) columns: Vec<String>,
}

/// A foreign key of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ForeignKeyInfo {
    pub(crate) name: String,
    /// `pg_constraint.confdeltype`: `c` is ON DELETE CASCADE.
    pub(crate) on_delete: String,
    pub(crate) references: QualifiedName,
}

/// The row of [`super::foreign_keys`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ForeignKeyRow {
    name: String,
    on_delete: String,
    ref_schema: String,
    ref_table: String,
}

impl From<ForeignKeyRow> for ForeignKeyInfo {
    fn from(r: ForeignKeyRow) -> Self {
        ForeignKeyInfo {
            name: r.name,
            on_delete: r.on_delete,
            references: QualifiedName::new(r.ref_schema, r.ref_table),
        }
    }
}

/// The row of [`super::referenced_by`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct IncomingKeyRow {
    name: String,
    on_delete: String,
    child_schema: String,
    child_table: String,
    child_columns: Vec<String>,
    parent_columns: Vec<String>,
    child_indexed: bool,
}

impl From<IncomingKeyRow> for crate::sql::IncomingKey {
    fn from(r: IncomingKeyRow) -> Self {
        crate::sql::IncomingKey {
            name: r.name,
            on_delete: r.on_delete,
            child: QualifiedName::new(r.child_schema, r.child_table),
            child_columns: r.child_columns,
            parent_columns: r.parent_columns,
            child_indexed: r.child_indexed,
        }
    }
}

/// A foreign-key action that a DELETE from a table sets off, directly or
/// through a chain of `ON DELETE CASCADE` keys (through any tables,
/// retained or not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CascadeEdge {
    /// The constraint's name.
    pub(crate) name: String,
    /// `c` CASCADE, `n` SET NULL, `d` SET DEFAULT.
    pub(crate) action: String,
    /// The table whose rows the action deletes or changes.
    pub(crate) child: QualifiedName,
    /// The tables from the deleted one to `child`, in order.
    pub(crate) path: Vec<QualifiedName>,
    /// For SET NULL / SET DEFAULT: key columns of `child` the action would
    /// set to NULL although they are NOT NULL (so every delete fails).
    pub(crate) failing_columns: Vec<String>,
}

impl CascadeEdge {
    /// `CASCADE`, `SET NULL` or `SET DEFAULT`.
    pub(crate) fn action_sql(&self) -> &'static str {
        match self.action.as_str() {
            "c" => "CASCADE",
            "n" => "SET NULL",
            _ => "SET DEFAULT",
        }
    }
}

/// The row of [`super::cascade_edges`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct CascadeRow {
    name: String,
    action: String,
    child_schema: String,
    child_table: String,
    path_schemas: Vec<String>,
    path_names: Vec<String>,
    failing_columns: Vec<String>,
}

impl From<CascadeRow> for CascadeEdge {
    fn from(r: CascadeRow) -> Self {
        CascadeEdge {
            name: r.name,
            action: r.action,
            child: QualifiedName::new(r.child_schema, r.child_table),
            path: r
                .path_schemas
                .into_iter()
                .zip(r.path_names)
                .map(|(s, n)| QualifiedName::new(s, n))
                .collect(),
            failing_columns: r.failing_columns,
        }
    }
}

/// An INSERT rule or a `BEFORE INSERT` row trigger on a table (or one of
/// its partitions): something that can change or swallow a row on its way
/// in (the row of [`super::insert_hooks`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct InsertHook {
    /// `rule` or `trigger`.
    pub(crate) kind: String,
    pub(crate) name: String,
    /// The relation it is on, as `schema.table`.
    pub(crate) relation: String,
}

/// A trigger on the hold table as the catalog has it (the row of
/// [`super::hold_trigger`]).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub(crate) struct StampTrigger {
    /// `pg_trigger.tgenabled` (`A` always, `O` origin, `R` replica, `D`
    /// disabled).
    pub(crate) enabled: String,
    /// `pg_trigger.tgtype`: row, before, on which events.
    pub(crate) tgtype: i32,
    /// Its function's source.
    pub(crate) source: String,
}

/// The row of [`super::timestamped_tables`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TimestampedRow {
    pub(crate) schema: String,
    pub(crate) name: String,
    /// Its `timestamptz` columns, in order.
    pub(crate) timestamps: Vec<String>,
}

/// A `schema, name, owner` row ([`super::tables_not_owned`],
/// [`super::partitions_not_owned`]): a relation the current role does not own.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct OwnerRow {
    schema: String,
    name: String,
    owner: String,
}

impl From<OwnerRow> for (QualifiedName, String) {
    fn from(r: OwnerRow) -> Self {
        (QualifiedName::new(r.schema, r.name), r.owner)
    }
}

/// The row of [`super::partitioning`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct PartitioningRow {
    /// `pg_partitioned_table.partstrat`: `r` range, `l` list, `h` hash.
    pub(crate) strategy: String,
    /// The partition key's columns (an expression shows as an empty name).
    pub(crate) key: Vec<String>,
}

/// The row of [`super::partition_tree_referenced_by`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TreeKeyRow {
    name: String,
    child_schema: String,
    child_table: String,
    parent_schema: String,
    parent_table: String,
}

impl From<TreeKeyRow> for (String, QualifiedName, QualifiedName) {
    fn from(r: TreeKeyRow) -> Self {
        (
            r.name,
            QualifiedName::new(r.child_schema, r.child_table),
            QualifiedName::new(r.parent_schema, r.parent_table),
        )
    }
}

/// The row of [`super::table_health`].
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct HealthRow {
    pub(crate) dead: i64,
    pub(crate) bytes: i64,
}
