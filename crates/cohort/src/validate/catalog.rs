//! Reads what validation needs from the live catalog. Only `pg_catalog`
//! relations and functions, always schema-qualified, and objects are found
//! by (schema, name) bound as values, so neither `search_path` nor a
//! same-named table elsewhere can change what is inspected.

use sqlx::postgres::types::Oid;
use sqlx::PgConnection;

use crate::base::ident::QualifiedName;
use crate::sql::catalog as statements;
pub(crate) use crate::sql::catalog::{
    CascadeEdge, ColumnInfo, ForeignKeyInfo, IndexInfo, InsertHook, ServerInfo, StampTrigger,
};
use crate::sql::catalog::{
    CascadeRow, ForeignKeyRow, IncomingKeyRow, NameRow, OwnerRow, TableRow, TimestampedRow,
};
pub(crate) use crate::sql::IncomingKey;

/// Column type families Cohort accepts per role (base `typname`s).
pub(super) const TEXT_TYPES: &[&str] = &["text", "varchar", "bpchar", "citext"];
/// The base types of a record key, a tenant or an erasure subject.
pub(super) const KEY_TYPES: &[&str] = &[
    "uuid", "int2", "int4", "int8", "text", "varchar", "bpchar", "citext",
];

/// A relation found by schema and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableInfo {
    pub(crate) oid: u32,
    pub(crate) name: QualifiedName,
    /// `r` table, `p` partitioned table, `v` view, …
    pub(crate) relkind: String,
    pub(crate) is_partition: bool,
    pub(crate) inherits: bool,
    pub(crate) has_inheritance_children: bool,
    pub(crate) comment: Option<String>,
    pub(crate) columns: Vec<ColumnInfo>,
    pub(crate) indexes: Vec<IndexInfo>,
    pub(crate) foreign_keys: Vec<ForeignKeyInfo>,
    /// Foreign keys referencing this table.
    pub(crate) referenced_by: Vec<IncomingKey>,
}

impl TableInfo {
    pub(crate) fn column(&self, name: &str) -> Option<&ColumnInfo> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The foreign keys into this table that forbid deleting a row they
    /// reference (NO ACTION, RESTRICT): purge leaves such rows alone.
    pub(crate) fn blocking_references(&self) -> Vec<IncomingKey> {
        self.referenced_by
            .iter()
            .filter(|k| matches!(k.on_delete.as_str(), "a" | "r"))
            .cloned()
            .collect()
    }
}

pub(crate) async fn server_info(conn: &mut PgConnection) -> Result<ServerInfo, sqlx::Error> {
    statements::server_info().query_as().fetch_one(conn).await
}

/// What a table that does not exist may have been meant to be: the same
/// name in other schemas (the usual slip: the table is in `public`, the
/// policy names `app`), or else the closest name in its schema.
pub(crate) async fn did_you_mean_table(
    conn: &mut PgConnection,
    missing: &QualifiedName,
) -> Result<String, sqlx::Error> {
    let names: Vec<QualifiedName> =
        statements::near_tables(missing.schema.clone(), missing.name.clone())
            .query_as::<NameRow>()
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .map(QualifiedName::from)
            .collect();
    let elsewhere: Vec<String> = names
        .iter()
        .filter(|n| n.name == missing.name && n.schema != missing.schema)
        .map(|n| n.display_plain())
        .collect();
    if !elsewhere.is_empty() {
        return Ok(format!(
            "; a table of that name exists in {}",
            elsewhere.join(", ")
        ));
    }
    let same_schema: Vec<&str> = names
        .iter()
        .filter(|n| n.schema == missing.schema)
        .map(|n| n.name.as_str())
        .collect();
    Ok(crate::base::suggest::closest(&missing.name, same_schema)
        .map(|c| {
            format!(
                "; did you mean {}?",
                QualifiedName::new(missing.schema.clone(), c).display_plain()
            )
        })
        .unwrap_or_default())
}

/// The relation `name` with its columns, indexes and foreign keys, both
/// ways (`None`: there is no such relation).
pub(crate) async fn load_table(
    conn: &mut PgConnection,
    name: &QualifiedName,
) -> Result<Option<TableInfo>, sqlx::Error> {
    let Some(row) = statements::table(name.schema.clone(), name.name.clone())
        .query_as::<TableRow>()
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let oid = row.oid;
    let columns = load_columns(conn, oid).await?;
    let indexes = load_indexes(conn, oid).await?;
    let foreign_keys = load_foreign_keys(conn, oid).await?;
    let referenced_by = load_referenced_by(conn, oid).await?;
    Ok(Some(TableInfo {
        referenced_by,
        oid: oid.0,
        name: name.clone(),
        relkind: row.relkind,
        is_partition: row.relispartition,
        inherits: row.inherits,
        has_inheritance_children: row.has_children,
        comment: row.comment,
        columns,
        indexes,
        foreign_keys,
    }))
}

/// The columns of the relation `oid`, in order.
async fn load_columns(conn: &mut PgConnection, oid: Oid) -> Result<Vec<ColumnInfo>, sqlx::Error> {
    statements::columns(oid)
        .query_as()
        .fetch_all(&mut *conn)
        .await
}

/// The indexes of the relation `oid`.
async fn load_indexes(conn: &mut PgConnection, oid: Oid) -> Result<Vec<IndexInfo>, sqlx::Error> {
    statements::indexes(oid)
        .query_as()
        .fetch_all(&mut *conn)
        .await
}

/// The foreign keys of the relation `oid`.
async fn load_foreign_keys(
    conn: &mut PgConnection,
    oid: Oid,
) -> Result<Vec<ForeignKeyInfo>, sqlx::Error> {
    let rows = statements::foreign_keys(oid)
        .query_as::<ForeignKeyRow>()
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows.into_iter().map(ForeignKeyInfo::from).collect())
}

/// The foreign keys that reference the relation `oid`.
async fn load_referenced_by(
    conn: &mut PgConnection,
    oid: Oid,
) -> Result<Vec<IncomingKey>, sqlx::Error> {
    let rows = statements::referenced_by(oid)
        .query_as::<IncomingKeyRow>()
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows.into_iter().map(IncomingKey::from).collect())
}

/// Every CASCADE / SET NULL / SET DEFAULT action a DELETE from `table`
/// reaches, following CASCADE chains transitively (cycles cut).
pub(crate) async fn cascade_edges(
    conn: &mut PgConnection,
    table: u32,
) -> Result<Vec<CascadeEdge>, sqlx::Error> {
    let rows = statements::cascade_edges(Oid(table))
        .query_as::<CascadeRow>()
        .fetch_all(conn)
        .await?;
    Ok(rows.into_iter().map(CascadeEdge::from).collect())
}

/// The INSERT rules and `BEFORE INSERT` row triggers of `table` and its
/// partitions.
pub(crate) async fn insert_hooks(
    conn: &mut PgConnection,
    table: u32,
) -> Result<Vec<InsertHook>, sqlx::Error> {
    statements::insert_hooks(Oid(table))
        .query_as()
        .fetch_all(conn)
        .await
}

/// The hold trigger `name` in `schema` (`retention_hold_stamp`,
/// `retention_hold_reach`, `retention_hold_reach_truncate`), or `None`
/// when it does not exist.
pub(crate) async fn hold_trigger(
    conn: &mut PgConnection,
    schema: &str,
    name: &'static str,
) -> Result<Option<StampTrigger>, sqlx::Error> {
    statements::hold_trigger(schema.to_owned(), name)
        .query_as()
        .fetch_optional(conn)
        .await
}

/// Whether `schema` holds Cohort's ledger (a `sweep_run` table carrying a
/// Cohort schema-version comment).
pub(crate) async fn is_cohort_schema(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<bool, sqlx::Error> {
    let comment: Option<Option<String>> = statements::ledger_comment(schema.to_owned())
        .query_scalar()
        .fetch_optional(conn)
        .await?;
    Ok(comment
        .flatten()
        .is_some_and(|c| crate::schema::parse_version_comment(Some(&c)).is_some()))
}

/// A table with a `timestamptz` column, as [`timestamped_tables`] lists it.
#[derive(Debug, Clone)]
pub(crate) struct TimestampedTable {
    pub(crate) name: QualifiedName,
    /// Its `timestamptz` columns, in order.
    pub(crate) timestamps: Vec<String>,
}

/// The tables of `schemas` that have a `timestamptz` column (plain and
/// partitioned parents, not partitions), by schema and name.
pub(crate) async fn timestamped_tables(
    conn: &mut PgConnection,
    schemas: Vec<String>,
) -> Result<Vec<TimestampedTable>, sqlx::Error> {
    let rows = statements::timestamped_tables(schemas)
        .query_as::<TimestampedRow>()
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| TimestampedTable {
            name: QualifiedName::new(r.schema, r.name),
            timestamps: r.timestamps,
        })
        .collect())
}

/// A server setting's current value.
pub(crate) async fn current_setting(
    conn: &mut PgConnection,
    name: &str,
) -> Result<String, sqlx::Error> {
    statements::current_setting(name.to_owned())
        .query_scalar()
        .fetch_one(&mut *conn)
        .await
}

/// The table `oid` and the relations of its partition tree that the
/// current role cannot act as owner of: (relation, owner).
pub(crate) async fn not_owned(
    conn: &mut PgConnection,
    oid: u32,
) -> Result<Vec<(QualifiedName, String)>, sqlx::Error> {
    let rows = statements::tables_not_owned(Oid(oid))
        .query_as::<OwnerRow>()
        .fetch_all(&mut *conn)
        .await?;
    Ok(rows.into_iter().map(Into::into).collect())
}
