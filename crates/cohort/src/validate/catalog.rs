//! Reads what validation needs from the live catalog. Only `pg_catalog`
//! relations and functions, always schema-qualified, and objects are found
//! by (schema, name) bound as values, so neither `search_path` nor a
//! same-named table elsewhere can change what is inspected.

use sqlx::postgres::types::Oid;
use sqlx::{PgConnection, Row};

use crate::ident::QualifiedName;
pub(crate) use crate::sql::IncomingKey;

/// The server's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerInfo {
    pub(crate) version_num: i32,
    pub(crate) version: String,
}

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
    pub(crate) not_null: bool,
    /// Whether the column has a DEFAULT expression.
    pub(crate) has_default: bool,
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
    /// `indisvalid AND indisready AND indimmediate`: an index left invalid
    /// by a failed `CREATE INDEX CONCURRENTLY`, or a deferrable one, does
    /// not guarantee uniqueness when a statement runs.
    pub(crate) usable: bool,
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
}

pub(crate) async fn server_info(conn: &mut PgConnection) -> Result<ServerInfo, sqlx::Error> {
    let row = sqlx::query(
        "SELECT pg_catalog.current_setting('server_version_num')::int4 AS num, \
                pg_catalog.version() AS version",
    )
    .fetch_one(conn)
    .await?;
    Ok(ServerInfo {
        version_num: row.try_get("num")?,
        version: row.try_get("version")?,
    })
}

pub(crate) async fn load_table(
    conn: &mut PgConnection,
    name: &QualifiedName,
) -> Result<Option<TableInfo>, sqlx::Error> {
    let Some(row) = sqlx::query(
        "SELECT c.oid, c.relkind::text AS relkind, c.relispartition, \
            EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid) AS inherits, \
            EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i \
                    JOIN pg_catalog.pg_class ch ON ch.oid = i.inhrelid \
                    WHERE i.inhparent = c.oid AND NOT ch.relispartition) AS has_children, \
            pg_catalog.obj_description(c.oid, 'pg_class') AS comment \
         FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind(&name.schema)
    .bind(&name.name)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let oid: Oid = row.try_get("oid")?;

    let columns = sqlx::query(
        "SELECT a.attname::text AS name, \
                pg_catalog.format_type(a.atttypid, a.atttypmod) AS display_type, \
                COALESCE(bt.typname, t.typname)::text AS type_name, \
                tn.nspname::text AS type_schema, \
                CASE WHEN COALESCE(bt.typname, t.typname) IN ('varchar', 'bpchar') \
                     AND COALESCE(NULLIF(a.atttypmod, -1), NULLIF(t.typtypmod, -1)) IS NOT NULL \
                     THEN COALESCE(NULLIF(a.atttypmod, -1), t.typtypmod) - 4 END AS max_chars, \
                a.attnotnull AS not_null, a.atthasdef AS has_default, \
                COALESCE((SELECT co.collisdeterministic FROM pg_catalog.pg_collation co \
                          WHERE co.oid = a.attcollation), true) AS deterministic \
         FROM pg_catalog.pg_attribute a \
         JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
         LEFT JOIN pg_catalog.pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype \
         JOIN pg_catalog.pg_namespace tn ON tn.oid = COALESCE(bt.typnamespace, t.typnamespace) \
         WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
         ORDER BY a.attnum",
    )
    .bind(oid)
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
            not_null: r.try_get("not_null")?,
            has_default: r.try_get("has_default")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;

    let indexes = sqlx::query(
        "SELECT i.indisprimary AS is_primary, i.indisunique AS is_unique, \
                i.indpred IS NOT NULL AS partial, \
                (i.indisvalid AND i.indisready AND i.indimmediate) AS usable, \
                ARRAY(SELECT COALESCE(a.attname::text, '') \
                      FROM pg_catalog.unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
                      LEFT JOIN pg_catalog.pg_attribute a \
                        ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                      WHERE k.ord <= i.indnkeyatts \
                      ORDER BY k.ord) AS columns \
         FROM pg_catalog.pg_index i WHERE i.indrelid = $1",
    )
    .bind(oid)
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| {
        Ok(IndexInfo {
            primary: r.try_get("is_primary")?,
            unique: r.try_get("is_unique")?,
            partial: r.try_get("partial")?,
            usable: r.try_get("usable")?,
            columns: r.try_get("columns")?,
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;

    let foreign_keys = sqlx::query(
        "SELECT con.conname::text AS name, con.confdeltype::text AS on_delete, \
                rn.nspname::text AS ref_schema, rc.relname::text AS ref_table \
         FROM pg_catalog.pg_constraint con \
         JOIN pg_catalog.pg_class rc ON rc.oid = con.confrelid \
         JOIN pg_catalog.pg_namespace rn ON rn.oid = rc.relnamespace \
         WHERE con.contype = 'f' AND con.conrelid = $1 \
         ORDER BY con.conname",
    )
    .bind(oid)
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
    .collect::<Result<Vec<_>, sqlx::Error>>()?;

    let referenced_by = sqlx::query(
        "SELECT con.conname::text AS name, con.confdeltype::text AS on_delete, \
                cn.nspname::text AS child_schema, cc.relname::text AS child_table, \
                ARRAY(SELECT a.attname::text FROM pg_catalog.unnest(con.conkey) WITH ORDINALITY AS k(n, ord) \
                      JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.n \
                      ORDER BY k.ord) AS child_columns, \
                ARRAY(SELECT a.attname::text FROM pg_catalog.unnest(con.confkey) WITH ORDINALITY AS k(n, ord) \
                      JOIN pg_catalog.pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.n \
                      ORDER BY k.ord) AS parent_columns \
         FROM pg_catalog.pg_constraint con \
         JOIN pg_catalog.pg_class cc ON cc.oid = con.conrelid \
         JOIN pg_catalog.pg_namespace cn ON cn.oid = cc.relnamespace \
         WHERE con.contype = 'f' AND con.confrelid = $1 AND con.conparentid = 0 \
         ORDER BY con.conname",
    )
    .bind(oid)
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
        })
    })
    .collect::<Result<Vec<_>, sqlx::Error>>()?;

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
    sqlx::query(
        "WITH RECURSIVE edge AS ( \
            SELECT con.oid AS con, con.conrelid AS child, con.confdeltype::text AS action, \
                   ARRAY[con.confrelid, con.conrelid]::oid[] AS path, \
                   con.conrelid = con.confrelid AS is_cycle \
            FROM pg_catalog.pg_constraint con \
            WHERE con.contype = 'f' AND con.conparentid = 0 AND con.confrelid = $1 \
              AND con.confdeltype IN ('c', 'n', 'd') \
          UNION ALL \
            SELECT con.oid, con.conrelid, con.confdeltype::text, e.path || con.conrelid, \
                   con.conrelid = ANY (e.path) \
            FROM edge e \
            JOIN pg_catalog.pg_constraint con ON con.confrelid = e.child \
            WHERE e.action = 'c' AND NOT e.is_cycle AND con.contype = 'f' AND con.conparentid = 0 \
              AND con.confdeltype IN ('c', 'n', 'd') AND pg_catalog.cardinality(e.path) < 64 \
         ) \
         SELECT c.conname::text AS name, e.action, cn.nspname::text AS child_schema, \
                cc.relname::text AS child_table, \
                ARRAY(SELECT pn.nspname::text FROM pg_catalog.unnest(e.path) WITH ORDINALITY AS p(rel, ord) \
                      JOIN pg_catalog.pg_class pc ON pc.oid = p.rel \
                      JOIN pg_catalog.pg_namespace pn ON pn.oid = pc.relnamespace ORDER BY p.ord) AS path_schemas, \
                ARRAY(SELECT pc.relname::text FROM pg_catalog.unnest(e.path) WITH ORDINALITY AS p(rel, ord) \
                      JOIN pg_catalog.pg_class pc ON pc.oid = p.rel ORDER BY p.ord) AS path_names, \
                ARRAY(SELECT a.attname::text FROM pg_catalog.unnest(c.conkey) WITH ORDINALITY AS k(n, ord) \
                      JOIN pg_catalog.pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n \
                      WHERE e.action <> 'c' AND a.attnotnull AND (e.action = 'n' OR NOT a.atthasdef) \
                      ORDER BY k.ord) AS failing_columns \
         FROM edge e \
         JOIN pg_catalog.pg_constraint c ON c.oid = e.con \
         JOIN pg_catalog.pg_class cc \
           ON cc.oid = COALESCE(pg_catalog.pg_partition_root(e.child), e.child) \
         JOIN pg_catalog.pg_namespace cn ON cn.oid = cc.relnamespace \
         ORDER BY pg_catalog.cardinality(e.path), c.conname",
    )
    .bind(Oid(table))
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

/// Whether `schema` holds Cohort's ledger (a `sweep_run` table carrying a
/// Cohort schema-version comment).
pub(crate) async fn is_cohort_schema(
    conn: &mut PgConnection,
    schema: &str,
) -> Result<bool, sqlx::Error> {
    let comment: Option<Option<String>> = sqlx::query_scalar(
        "SELECT pg_catalog.obj_description(c.oid, 'pg_class') \
         FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = 'sweep_run'",
    )
    .bind(schema)
    .fetch_optional(conn)
    .await?;
    Ok(comment
        .flatten()
        .is_some_and(|c| crate::schema::parse_version_comment(Some(&c)).is_some()))
}
