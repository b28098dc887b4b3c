//! Reads what validation needs from the live catalog. Only `pg_catalog`
//! relations and functions, always schema-qualified, and objects are found
//! by (schema, name) bound as values, so neither `search_path` nor a
//! same-named table elsewhere can change what is inspected.

use sqlx::postgres::types::Oid;
use sqlx::{PgConnection, Row};

use crate::base::ident::QualifiedName;
use crate::sql::catalog as statements;
pub(crate) use crate::sql::IncomingKey;

/// The server's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    pub(crate) version_num: i32,
    pub(crate) version: String,
}

/// Column type families Cohort accepts per role (base `typname`s).
pub(super) const TEXT_TYPES: &[&str] = &["text", "varchar", "bpchar", "citext"];
/// The base types of a record key, a tenant or an erasure subject.
pub(super) const KEY_TYPES: &[&str] = &[
    "uuid", "int2", "int4", "int8", "text", "varchar", "bpchar", "citext",
];

/// A column as the catalog reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// An index's key columns (an expression shows as an empty name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexInfo {
    pub(crate) primary: bool,
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
    let row = statements::server_info().query().fetch_one(conn).await?;
    Ok(ServerInfo {
        version_num: row.try_get("num")?,
        version: row.try_get("version")?,
    })
}

/// What a table that does not exist may have been meant to be: the same
/// name in other schemas (the usual slip: the table is in `public`, the
/// policy names `app`), or else the closest name in its schema.
pub(crate) async fn did_you_mean_table(
    conn: &mut PgConnection,
    missing: &QualifiedName,
) -> Result<String, sqlx::Error> {
    let rows = statements::near_tables(missing.schema.clone(), missing.name.clone())
        .query()
        .fetch_all(&mut *conn)
        .await?;
    let mut names = Vec::with_capacity(rows.len());
    for row in &rows {
        names.push(QualifiedName::new(
            row.try_get::<String, _>("schema")?,
            row.try_get::<String, _>("name")?,
        ));
    }
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
        .query()
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let oid: Oid = row.try_get("oid")?;
    let columns = load_columns(conn, oid).await?;
    let indexes = load_indexes(conn, oid).await?;
    let foreign_keys = load_foreign_keys(conn, oid).await?;
    let referenced_by = load_referenced_by(conn, oid).await?;
    Ok(Some(TableInfo {
        referenced_by,
        oid: oid.0,
        name: name.clone(),
        relkind: row.try_get("relkind")?,
        is_partition: row.try_get("relispartition")?,
        inherits: row.try_get("inherits")?,
        has_inheritance_children: row.try_get("has_children")?,
        comment: row.try_get("comment")?,
        columns,
        indexes,
        foreign_keys,
    }))
}

/// The columns of the relation `oid`, in order.
async fn load_columns(conn: &mut PgConnection, oid: Oid) -> Result<Vec<ColumnInfo>, sqlx::Error> {
    statements::columns(oid)
        .query()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|r| {
            Ok(ColumnInfo {
                name: r.try_get("name")?,
                display_type: r.try_get("display_type")?,
                type_name: r.try_get("type_name")?,
                deterministic: r.try_get("deterministic")?,
                type_schema: r.try_get("type_schema")?,
                max_chars: r.try_get("max_chars")?,
                typmod: r.try_get("typmod")?,
                not_null: r.try_get("not_null")?,
                has_default: r.try_get("has_default")?,
                default_expr: r.try_get("default_expr")?,
                identity: r.try_get("identity")?,
                generated: r.try_get("generated")?,
            })
        })
        .collect()
}

/// The indexes of the relation `oid`.
async fn load_indexes(conn: &mut PgConnection, oid: Oid) -> Result<Vec<IndexInfo>, sqlx::Error> {
    statements::indexes(oid)
        .query()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|r| {
            Ok(IndexInfo {
                primary: r.try_get("is_primary")?,
                unique: r.try_get("is_unique")?,
                partial: r.try_get("partial")?,
                predicate: r.try_get("predicate")?,
                usable: r.try_get("usable")?,
                valid: r.try_get("valid")?,
                columns: r.try_get("columns")?,
            })
        })
        .collect()
}

/// The foreign keys of the relation `oid`.
async fn load_foreign_keys(
    conn: &mut PgConnection,
    oid: Oid,
) -> Result<Vec<ForeignKeyInfo>, sqlx::Error> {
    statements::foreign_keys(oid)
        .query()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|r| {
            Ok(ForeignKeyInfo {
                name: r.try_get("name")?,
                on_delete: r.try_get("on_delete")?,
                references: QualifiedName::from_columns(&r, "ref_schema", "ref_table")?,
            })
        })
        .collect()
}

/// The foreign keys that reference the relation `oid`.
async fn load_referenced_by(
    conn: &mut PgConnection,
    oid: Oid,
) -> Result<Vec<IncomingKey>, sqlx::Error> {
    statements::referenced_by(oid)
        .query()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(|r| {
            Ok(IncomingKey {
                name: r.try_get("name")?,
                on_delete: r.try_get("on_delete")?,
                child: QualifiedName::from_columns(&r, "child_schema", "child_table")?,
                child_columns: r.try_get("child_columns")?,
                parent_columns: r.try_get("parent_columns")?,
                child_indexed: r.try_get("child_indexed")?,
            })
        })
        .collect()
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

/// Every CASCADE / SET NULL / SET DEFAULT action a DELETE from `table`
/// reaches, following CASCADE chains transitively (cycles cut).
pub(crate) async fn cascade_edges(
    conn: &mut PgConnection,
    table: u32,
) -> Result<Vec<CascadeEdge>, sqlx::Error> {
    statements::cascade_edges(Oid(table))
        .query()
        .fetch_all(conn)
        .await?
        .into_iter()
        .map(|r| {
            let schemas: Vec<String> = r.try_get("path_schemas")?;
            let names: Vec<String> = r.try_get("path_names")?;
            Ok(CascadeEdge {
                name: r.try_get("name")?,
                action: r.try_get("action")?,
                child: QualifiedName::from_columns(&r, "child_schema", "child_table")?,
                path: schemas
                    .into_iter()
                    .zip(names)
                    .map(|(s, n)| QualifiedName::new(s, n))
                    .collect(),
                failing_columns: r.try_get("failing_columns")?,
            })
        })
        .collect()
}

/// An INSERT rule or a `BEFORE INSERT` row trigger on a table (or one of
/// its partitions): something that can change or swallow a row on its way
/// in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InsertHook {
    /// `rule` or `trigger`.
    pub(crate) kind: String,
    pub(crate) name: String,
    /// The relation it is on, as `schema.table`.
    pub(crate) relation: String,
}

/// The INSERT rules and `BEFORE INSERT` row triggers of `table` and its
/// partitions.
pub(crate) async fn insert_hooks(
    conn: &mut PgConnection,
    table: u32,
) -> Result<Vec<InsertHook>, sqlx::Error> {
    statements::insert_hooks(Oid(table))
        .query()
        .fetch_all(conn)
        .await?
        .iter()
        .map(|r| {
            Ok(InsertHook {
                kind: r.try_get("kind")?,
                name: r.try_get("name")?,
                relation: r.try_get("relation")?,
            })
        })
        .collect()
}

/// A trigger on the hold table as the catalog has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StampTrigger {
    /// `pg_trigger.tgenabled` (`A` always, `O` origin, `R` replica, `D`
    /// disabled).
    pub(crate) enabled: String,
    /// `pg_trigger.tgtype`: row, before, on which events.
    pub(crate) tgtype: i32,
    /// Its function's source.
    pub(crate) source: String,
}

/// The hold trigger `name` in `schema` (`retention_hold_stamp`,
/// `retention_hold_reach`, `retention_hold_reach_truncate`), or `None`
/// when it does not exist.
pub(crate) async fn hold_trigger(
    conn: &mut PgConnection,
    schema: &str,
    name: &'static str,
) -> Result<Option<StampTrigger>, sqlx::Error> {
    let row = statements::hold_trigger(schema.to_owned(), name)
        .query()
        .fetch_optional(conn)
        .await?;
    row.map(|r| {
        Ok(StampTrigger {
            enabled: r.try_get("enabled")?,
            tgtype: r.try_get("tgtype")?,
            source: r.try_get("source")?,
        })
    })
    .transpose()
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
        .query()
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|r| {
            Ok(TimestampedTable {
                name: QualifiedName::new(
                    r.try_get::<String, _>("schema")?,
                    r.try_get::<String, _>("name")?,
                ),
                timestamps: r.try_get("timestamps")?,
            })
        })
        .collect()
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
        .query()
        .fetch_all(&mut *conn)
        .await?;
    owners(&rows)
}

/// Rows of `schema, name, owner` (the ownership statements') as
/// (relation, owner).
pub(crate) fn owners(
    rows: &[sqlx::postgres::PgRow],
) -> Result<Vec<(QualifiedName, String)>, sqlx::Error> {
    rows.iter()
        .map(|r| {
            Ok((
                QualifiedName::from_columns(r, "schema", "name")?,
                r.try_get("owner")?,
            ))
        })
        .collect()
}
