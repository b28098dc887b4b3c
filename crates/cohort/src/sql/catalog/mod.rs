//! Catalog lookups: only `pg_catalog` relations and functions, always
//! schema-qualified, objects found by (schema, name) or oid bound as
//! values, so neither `search_path` nor a same-named table elsewhere can
//! change what is inspected.

use sqlx::postgres::types::Oid;

mod rows;

pub(crate) use rows::*;

use super::statement::Statement;
use crate::base::ident::SqlText;

/// The server's version number (`num`) and banner (`version`).
pub(crate) fn server_info() -> Statement<()> {
    Statement::new(
        SqlText::new(
            "SELECT pg_catalog.current_setting('server_version_num')::int4 AS num, \
                pg_catalog.version() AS version",
        ),
        (),
    )
}

/// A relation by schema and name: `oid, relkind, relispartition, inherits,
/// has_children, comment`.
pub(crate) fn table(schema: String, name: String) -> Statement<(String, String)> {
    Statement::new(
        SqlText::new(
            "SELECT c.oid, c.relkind::text AS relkind, c.relispartition, \
            EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i WHERE i.inhrelid = c.oid) AS inherits, \
            EXISTS (SELECT 1 FROM pg_catalog.pg_inherits i \
                    JOIN pg_catalog.pg_class ch ON ch.oid = i.inhrelid \
                    WHERE i.inhparent = c.oid AND NOT ch.relispartition) AS has_children, \
            pg_catalog.obj_description(c.oid, 'pg_class') AS comment \
         FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2",
        ),
        (schema, name),
    )
}

/// Tables a missing one may have meant: `schema, name` of every table,
/// view or foreign table named `$2` in another schema, and of every one in
/// schema `$1` (system schemas left out).
pub(crate) fn near_tables(schema: String, name: String) -> Statement<(String, String)> {
    Statement::new(
        SqlText::new(
            "SELECT n.nspname AS schema, c.relname AS name \
         FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT c.relispartition \
           AND (c.relname = $2 OR n.nspname = $1) \
           AND n.nspname NOT IN ('pg_catalog', 'information_schema') \
           AND n.nspname NOT LIKE 'pg\\_toast%' \
         ORDER BY n.nspname, c.relname LIMIT 10000",
        ),
        (schema, name),
    )
}

/// A relation's live columns in order (see `ColumnInfo`).
pub(crate) fn columns(table: Oid) -> Statement<(Oid,)> {
    Statement::new(
        SqlText::new(
            "SELECT a.attname::text AS name, \
                pg_catalog.format_type(a.atttypid, a.atttypmod) AS display_type, \
                COALESCE(bt.typname, t.typname)::text AS type_name, \
                tn.nspname::text AS type_schema, \
                CASE WHEN COALESCE(bt.typname, t.typname) IN ('varchar', 'bpchar') \
                     AND COALESCE(NULLIF(a.atttypmod, -1), NULLIF(t.typtypmod, -1)) IS NOT NULL \
                     THEN COALESCE(NULLIF(a.atttypmod, -1), t.typtypmod) - 4 END AS max_chars, \
                COALESCE(NULLIF(a.atttypmod, -1), t.typtypmod) AS typmod, \
                a.attnotnull AS not_null, a.atthasdef AS has_default, \
                (SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid) FROM pg_catalog.pg_attrdef d \
                 WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum) AS default_expr, \
                a.attidentity <> '' AS identity, a.attgenerated <> '' AS generated, \
                COALESCE((SELECT co.collisdeterministic FROM pg_catalog.pg_collation co \
                          WHERE co.oid = a.attcollation), true) AS deterministic \
         FROM pg_catalog.pg_attribute a \
         JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
         LEFT JOIN pg_catalog.pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype \
         JOIN pg_catalog.pg_namespace tn ON tn.oid = COALESCE(bt.typnamespace, t.typnamespace) \
         WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
         ORDER BY a.attnum",
        ),
        (table,),
    )
}

/// A relation's indexes with their key columns (see `IndexInfo`).
pub(crate) fn indexes(table: Oid) -> Statement<(Oid,)> {
    Statement::new(
        SqlText::new(
            "SELECT i.indisprimary AS is_primary, i.indisunique AS is_unique, \
                i.indpred IS NOT NULL AS partial, \
                pg_catalog.pg_get_expr(i.indpred, i.indrelid) AS predicate, \
                (i.indisvalid AND i.indisready AND i.indimmediate) AS usable, \
                i.indisvalid AS valid, \
                ARRAY(SELECT COALESCE(a.attname::text, '') \
                      FROM pg_catalog.unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) \
                      LEFT JOIN pg_catalog.pg_attribute a \
                        ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                      WHERE k.ord <= i.indnkeyatts \
                      ORDER BY k.ord) AS columns \
         FROM pg_catalog.pg_index i WHERE i.indrelid = $1",
        ),
        (table,),
    )
}

/// A relation's own foreign keys (see `ForeignKeyInfo`).
pub(crate) fn foreign_keys(table: Oid) -> Statement<(Oid,)> {
    Statement::new(
        SqlText::new(
            "SELECT con.conname::text AS name, con.confdeltype::text AS on_delete, \
                rn.nspname::text AS ref_schema, rc.relname::text AS ref_table \
         FROM pg_catalog.pg_constraint con \
         JOIN pg_catalog.pg_class rc ON rc.oid = con.confrelid \
         JOIN pg_catalog.pg_namespace rn ON rn.oid = rc.relnamespace \
         WHERE con.contype = 'f' AND con.conrelid = $1 \
         ORDER BY con.conname",
        ),
        (table,),
    )
}

/// Foreign keys referencing a relation (see `IncomingKey`).
pub(crate) fn referenced_by(table: Oid) -> Statement<(Oid,)> {
    Statement::new(SqlText::new("SELECT con.conname::text AS name, con.confdeltype::text AS on_delete, \
                cn.nspname::text AS child_schema, cc.relname::text AS child_table, \
                ARRAY(SELECT a.attname::text FROM pg_catalog.unnest(con.conkey) WITH ORDINALITY AS k(n, ord) \
                      JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.n \
                      ORDER BY k.ord) AS child_columns, \
                ARRAY(SELECT a.attname::text FROM pg_catalog.unnest(con.confkey) WITH ORDINALITY AS k(n, ord) \
                      JOIN pg_catalog.pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.n \
                      ORDER BY k.ord) AS parent_columns, \
                EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
                        WHERE i.indrelid = con.conrelid AND i.indisvalid AND i.indpred IS NULL \
                          AND (SELECT pg_catalog.array_agg(k.n ORDER BY k.n) \
                               FROM pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS k(n, ord) \
                               WHERE k.ord <= pg_catalog.cardinality(con.conkey)) \
                            = (SELECT pg_catalog.array_agg(k.n ORDER BY k.n) \
                               FROM pg_catalog.unnest(con.conkey) AS k(n))) AS child_indexed \
         FROM pg_catalog.pg_constraint con \
         JOIN pg_catalog.pg_class cc ON cc.oid = con.conrelid \
         JOIN pg_catalog.pg_namespace cn ON cn.oid = cc.relnamespace \
         WHERE con.contype = 'f' AND con.confrelid = $1 AND con.conparentid = 0 \
         ORDER BY con.conname"), (table,))
}

/// Every CASCADE / SET NULL / SET DEFAULT action a DELETE from a table
/// reaches, following CASCADE chains transitively (see `CascadeEdge`).
pub(crate) fn cascade_edges(table: Oid) -> Statement<(Oid,)> {
    Statement::new(SqlText::new("WITH RECURSIVE edge AS ( \
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
         ORDER BY pg_catalog.cardinality(e.path), c.conname"), (table,))
}

/// What can rewrite or swallow an INSERT into a table: its INSERT rules,
/// and the `BEFORE INSERT ... FOR EACH ROW` triggers of the table and of
/// every partition below it (enabled or not: one can be enabled later),
/// as `kind`, `name`, `relation`.
pub(crate) fn insert_hooks(table: Oid) -> Statement<(Oid,)> {
    Statement::new(
        SqlText::new(
            "SELECT 'rule' AS kind, r.rulename::text AS name, \
                    pg_catalog.format('%I.%I', n.nspname, c.relname) AS relation \
             FROM pg_catalog.pg_rewrite r \
             JOIN pg_catalog.pg_class c ON c.oid = r.ev_class \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE r.ev_class = $1 AND r.ev_type = '3' \
             UNION ALL \
             SELECT 'trigger', t.tgname::text, pg_catalog.format('%I.%I', n.nspname, c.relname) \
             FROM pg_catalog.pg_trigger t \
             JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE (t.tgrelid = $1 \
                    OR t.tgrelid IN (SELECT p.relid FROM pg_catalog.pg_partition_tree($1) p)) \
               AND NOT t.tgisinternal \
               AND (t.tgtype::int & 7) = 7 \
             ORDER BY 1, 3, 2",
        ),
        (table,),
    )
}

/// The trigger `$2` of the hold table in schema `$1` (the stamp trigger,
/// the reach triggers), if it exists:
/// how it fires (`enabled`, `pg_trigger.tgenabled`: `A` always, `O`
/// origin, `R` replica, `D` disabled), when (`tgtype`) and what its
/// function runs (`source`).
pub(crate) fn hold_trigger(
    schema: String,
    name: &'static str,
) -> Statement<(String, &'static str)> {
    Statement::new(
        SqlText::new(
            "SELECT t.tgenabled::text AS enabled, t.tgtype::int4 AS tgtype, p.prosrc AS source \
         FROM pg_catalog.pg_trigger t \
         JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid \
         JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = 'retention_hold' \
           AND t.tgname = $2",
        ),
        (schema, name),
    )
}

/// The comment on `sweep_run` in a schema, if the table exists.
pub(crate) fn ledger_comment(schema: String) -> Statement<(String,)> {
    Statement::new(
        SqlText::new(
            "SELECT pg_catalog.obj_description(c.oid, 'pg_class') \
         FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = 'sweep_run'",
        ),
        (schema,),
    )
}

/// A partitioned table's strategy and key columns.
pub(crate) fn partitioning(table: Oid) -> Statement<(Oid,)> {
    Statement::new(
        SqlText::new(
            "SELECT pt.partstrat::text AS strategy, \
            ARRAY(SELECT COALESCE(a.attname::text, '') \
                  FROM pg_catalog.unnest(pt.partattrs::int2[]) WITH ORDINALITY AS k(attnum, ord) \
                  LEFT JOIN pg_catalog.pg_attribute a \
                    ON a.attrelid = pt.partrelid AND a.attnum = k.attnum \
                  ORDER BY k.ord) AS key \
         FROM pg_catalog.pg_partitioned_table pt WHERE pt.partrelid = $1",
        ),
        (table,),
    )
}

/// Relations of a partition tree the current role cannot act as owner of.
pub(crate) fn partitions_not_owned(table: Oid) -> Statement<(Oid,)> {
    Statement::new(
        SqlText::new(
            "SELECT n.nspname::text AS schema, c.relname::text AS name, \
                pg_catalog.pg_get_userbyid(c.relowner)::text AS owner \
         FROM pg_catalog.pg_partition_tree($1::pg_catalog.regclass) t \
         JOIN pg_catalog.pg_class c ON c.oid = t.relid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE NOT pg_catalog.pg_has_role(c.relowner, 'USAGE') \
         ORDER BY t.level, n.nspname, c.relname",
        ),
        (table,),
    )
}

/// Foreign keys referencing any relation of a partition tree.
pub(crate) fn partition_tree_referenced_by(table: Oid) -> Statement<(Oid,)> {
    Statement::new(
        SqlText::new(
            "SELECT con.conname::text AS name, \
                cn.nspname::text AS child_schema, cc.relname::text AS child_table, \
                pn.nspname::text AS parent_schema, pc.relname::text AS parent_table \
         FROM pg_catalog.pg_partition_tree($1::pg_catalog.regclass) t \
         JOIN pg_catalog.pg_constraint con \
           ON con.confrelid = t.relid AND con.contype = 'f' AND con.conparentid = 0 \
         JOIN pg_catalog.pg_class cc ON cc.oid = con.conrelid \
         JOIN pg_catalog.pg_namespace cn ON cn.oid = cc.relnamespace \
         JOIN pg_catalog.pg_class pc ON pc.oid = con.confrelid \
         JOIN pg_catalog.pg_namespace pn ON pn.oid = pc.relnamespace \
         ORDER BY con.conname",
        ),
        (table,),
    )
}

/// Sets a session-level setting (the pooling probe).
pub(crate) fn set_probe(name: &'static str, value: String) -> Statement<(&'static str, String)> {
    Statement::new(
        SqlText::new("SELECT pg_catalog.set_config($1, $2, false)"),
        (name, value),
    )
}

/// Opens a transaction (pins a pooled session).
pub(crate) fn begin() -> Statement<()> {
    Statement::new(SqlText::new("BEGIN"), ())
}

/// A round trip on a connection.
pub(crate) fn round_trip() -> Statement<()> {
    Statement::new(SqlText::new("SELECT 1"), ())
}

/// A session setting's value, or NULL when it was never set.
pub(crate) fn read_setting(name: &'static str) -> Statement<(&'static str,)> {
    Statement::new(
        SqlText::new("SELECT pg_catalog.current_setting($1, true)"),
        (name,),
    )
}

/// Rolls the open transaction back.
pub(crate) fn rollback() -> Statement<()> {
    Statement::new(SqlText::new("ROLLBACK"), ())
}

/// Clears the pooling probe.
pub(crate) fn clear_probe(name: &'static str) -> Statement<(&'static str,)> {
    Statement::new(
        SqlText::new("SELECT pg_catalog.set_config($1, '', false)"),
        (name,),
    )
}

/// The tables (plain, and partitioned parents; not partitions) of these
/// schemas that have a `timestamptz` column: `schema, name, timestamps`
/// (those columns' names, in order), by schema and name.
pub(crate) fn timestamped_tables(schemas: Vec<String>) -> Statement<(Vec<String>,)> {
    Statement::new(
        SqlText::new(
            "SELECT n.nspname::text AS schema, c.relname::text AS name, \
               ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a \
                     WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                       AND a.atttypid = 'pg_catalog.timestamptz'::pg_catalog.regtype \
                     ORDER BY a.attnum) AS timestamps \
             FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = ANY($1) AND c.relkind IN ('r', 'p') AND NOT c.relispartition \
               AND EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a WHERE a.attrelid = c.oid \
                 AND a.attnum > 0 AND NOT a.attisdropped \
                 AND a.atttypid = 'pg_catalog.timestamptz'::pg_catalog.regtype) \
             ORDER BY 1, 2",
        ),
        (schemas,),
    )
}

/// A server setting's current value, as text (`value`).
pub(crate) fn current_setting(name: String) -> Statement<(String,)> {
    Statement::new(
        SqlText::new("SELECT pg_catalog.current_setting($1) AS value"),
        (name,),
    )
}

/// A table's dead tuples and size in bytes (`dead`, `bytes`), summed over
/// its partitions (`pg_partition_tree` lists nothing for a plain table,
/// which is then its own only leaf), as the statistics system reports
/// them now. `$1` the table, quoted and qualified.
pub(crate) fn table_health(table: String) -> Statement<(String,)> {
    Statement::new(
        SqlText::new(
            "WITH leaves AS (SELECT t.relid FROM pg_catalog.pg_partition_tree($1::pg_catalog.regclass) t \
               WHERE t.isleaf UNION ALL SELECT $1::pg_catalog.regclass WHERE NOT EXISTS \
               (SELECT 1 FROM pg_catalog.pg_partition_tree($1::pg_catalog.regclass))) \
             SELECT COALESCE(pg_catalog.sum(s.n_dead_tup), 0)::int8 AS dead, \
               COALESCE(pg_catalog.sum(pg_catalog.pg_table_size(l.relid)), 0)::int8 AS bytes \
             FROM leaves l LEFT JOIN pg_catalog.pg_stat_user_tables s ON s.relid = l.relid",
        ),
        (table,),
    )
}

/// Reports this session's pending statistics at its next transaction's
/// end instead of up to a second later (PostgreSQL 15 and later).
pub(crate) fn force_stats_flush() -> Statement<()> {
    Statement::new(
        SqlText::new("SELECT pg_catalog.pg_stat_force_next_flush()"),
        (),
    )
}

/// `ANALYZE` of a table, or `VACUUM (ANALYZE)` (not in a transaction
/// block: sent as simple-protocol text).
pub(crate) fn vacuum(
    table: &crate::base::ident::QualifiedName,
    full_vacuum: bool,
) -> Statement<()> {
    let mut s = SqlText::new(if full_vacuum {
        "VACUUM (ANALYZE) "
    } else {
        "ANALYZE "
    });
    s.table(table);
    Statement::new(s, ())
}

/// The table and every relation of its partition tree the current role
/// cannot act as owner of: `schema, name, owner` (`pg_partition_tree`
/// lists nothing for a plain table, so the table is named on its own).
pub(crate) fn tables_not_owned(table: Oid) -> Statement<(Oid,)> {
    Statement::new(
        SqlText::new(
            "SELECT n.nspname::text AS schema, c.relname::text AS name, \
                pg_catalog.pg_get_userbyid(c.relowner)::text AS owner \
             FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE (c.oid = $1 OR c.oid IN (SELECT t.relid FROM \
                 pg_catalog.pg_partition_tree($1::pg_catalog.regclass) t)) \
               AND NOT pg_catalog.pg_has_role(c.relowner, 'USAGE') \
             ORDER BY n.nspname, c.relname",
        ),
        (table,),
    )
}
