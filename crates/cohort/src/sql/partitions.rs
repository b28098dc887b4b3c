//! Statements of partition purge: the expired partitions of a parent, the
//! hold check on one partition, its lock, audit, detach and drop, and the
//! detail rows read back for observers. Text naming one partition is never
//! kept prepared (it would not be reused).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::statement::{Args, Params, Statement};
use crate::base::ident::{QualifiedName, SqlText};
use crate::domain::model::{EntityDescriptor, KeyType};
use crate::sql::tables::CohortTable;
use crate::sql::{bound_rows, BoundHolds, Casts};

/// The partitions of a parent (by schema and name) whose upper bound is at
/// or before `cutoff`, oldest first: `schema, name, lower, upper` (a `-infinity`
/// lower bound reads as NULL). Partitions being detached concurrently,
/// `DEFAULT` and `MAXVALUE` ones, and trees holding a foreign table never
/// qualify.
/// An expired partition, as [`expired`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct ExpiredRow {
    pub(crate) schema: String,
    pub(crate) name: String,
    pub(crate) lower: Option<DateTime<Utc>>,
    pub(crate) upper: DateTime<Utc>,
}

/// What a partition's rows came to: how many, and the first detail row
/// written for them (`None` without details), as [`insert_details`] and
/// [`purge_unheld`] return it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct PurgedRow {
    pub(crate) n: i64,
    pub(crate) first: Option<i64>,
}

/// One tenant's rows in a partition, as [`tenants_in`] returns it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TenantRowsRow {
    pub(crate) tenant: Option<String>,
    pub(crate) n: i64,
}

pub(crate) use super::ledger::DetailRow;

pub(crate) fn expired(
    schema: String,
    name: String,
    cutoff: DateTime<Utc>,
) -> Statement<(String, String, DateTime<Utc>)> {
    let sql = SqlText::new(
        "SELECT n.nspname::text AS schema, c.relname::text AS name, b.lower, b.upper \
         FROM pg_catalog.pg_inherits i \
         JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         CROSS JOIN LATERAL (SELECT pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS bound) e \
         CROSS JOIN LATERAL (SELECT \
             NULLIF(pg_catalog.substring(e.bound, '^FOR VALUES FROM \\(''([^'']*)''\\) TO ')::pg_catalog.timestamptz, \
                 '-infinity'::pg_catalog.timestamptz) AS lower, \
             pg_catalog.substring(e.bound, ' TO \\(''([^'']*)''\\)$')::pg_catalog.timestamptz AS upper) b \
         WHERE i.inhparent = (SELECT pc.oid FROM pg_catalog.pg_class pc \
                              JOIN pg_catalog.pg_namespace pn ON pn.oid = pc.relnamespace \
                              WHERE pn.nspname = $1 AND pc.relname = $2) \
           AND c.relispartition AND c.relkind IN ('r', 'p') AND b.upper <= $3 \
           AND (pg_catalog.to_jsonb(i) ->> 'inhdetachpending') IS DISTINCT FROM 'true' \
           AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_partition_tree(c.oid::pg_catalog.regclass) pt \
                           JOIN pg_catalog.pg_class fc ON fc.oid = pt.relid WHERE fc.relkind = 'f') \
         ORDER BY b.upper, n.nspname, c.relname",
    );
    Statement::new(sql, (schema, name, cutoff))
}

/// Which rows of a partition the hold check looks at.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) entity: Uuid,
    /// The entity's active holds as bound values (with the record key's
    /// type): only rows with those keys or subjects are checked (through
    /// their indexes). `None`: every row.
    pub(crate) keys: Option<(KeyType, BoundHolds)>,
}

impl Params for Held {
    fn bind(self, q: Args) -> Args {
        let q = q.bind(self.entity);
        match self.keys {
            Some((key_type, holds)) => holds.bind(q, key_type),
            None => q,
        }
    }
}

/// Whether any row of `partition` is under an active hold (one boolean).
pub(crate) fn held(
    partition: &QualifiedName,
    e: &EntityDescriptor,
    casts: &Casts,
    hold: &SqlText,
    params: Held,
) -> Statement<Held> {
    let mut sql = SqlText::new("SELECT EXISTS (SELECT 1 FROM ");
    sql.table(partition).push(" t WHERE ");
    if let Some((_, holds)) = &params.keys {
        assert_eq!(
            holds.subjects.len(),
            e.subjects.len(),
            "one bound array per subject column"
        );
        sql.append(&bound_rows(e, casts, 2)).push(" AND ");
    }
    sql.append(hold).push(")");
    Statement::new(sql, params).not_persistent()
}

/// How long this transaction waits for a lock (`lock_timeout`, e.g. `"5000ms"`).
pub(crate) fn set_lock_timeout(timeout: String) -> Statement<(String,)> {
    let sql = SqlText::new("SELECT pg_catalog.set_config('lock_timeout', $1, true)");
    Statement::new(sql, (timeout,))
}

/// Locks a partition against writes; reads go on.
pub(crate) fn lock_exclusive(partition: &QualifiedName) -> Statement<()> {
    let mut sql = SqlText::new("LOCK TABLE ");
    sql.table(partition).push(" IN EXCLUSIVE MODE");
    Statement::new(sql, ())
}

/// One purge detail row per row of the partition, before the rows go.
#[derive(Debug)]
pub(crate) struct Details {
    pub(crate) run_id: Uuid,
    pub(crate) entity: Uuid,
    pub(crate) entity_name: String,
    pub(crate) action: &'static str,
}

impl Params for Details {
    fn bind(self, q: Args) -> Args {
        q.bind(self.run_id)
            .bind(self.entity)
            .bind(self.entity_name)
            .bind(self.action)
    }
}

/// Returns `n` (rows written) and `first` (the first detail id).
pub(crate) fn insert_details(
    schema: &str,
    partition: &QualifiedName,
    key_text: &SqlText,
    tenant_text: Option<&SqlText>,
    params: Details,
) -> Statement<Details> {
    let mut sql = SqlText::new("WITH d AS (INSERT INTO ");
    sql.table(&CohortTable::RowDetail.qualified(schema))
        .push(
            " (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) \
             SELECT $1, $2, $3, ",
        )
        .append(key_text)
        .push(", ")
        .append(&tenant_or_null(tenant_text))
        .push(", $4 FROM ")
        .table(partition)
        .push(
            " t RETURNING row_detail_id) SELECT pg_catalog.count(*) AS n, pg_catalog.min(row_detail_id) AS first FROM d",
        );
    Statement::new(sql, params).not_persistent()
}

/// Purges the rows of a held partition that no active hold protects, in
/// one statement (the partition is locked against writes, so no hold can
/// be placed meanwhile), with one detail row per purged row when `details`
/// are asked for.
#[derive(Debug)]
pub(crate) struct PurgeUnheld {
    pub(crate) entity: Uuid,
    pub(crate) details: Option<Details>,
}

impl Params for PurgeUnheld {
    fn bind(self, q: Args) -> Args {
        let q = q.bind(self.entity);
        match self.details {
            Some(d) => q.bind(d.run_id).bind(d.entity_name).bind(d.action),
            None => q,
        }
    }
}

/// Returns `n` (rows purged) and `first` (the first detail id, NULL
/// without details). `held` is the hold check on `t` (`$1` entity id).
pub(crate) fn purge_unheld(
    schema: &str,
    partition: &QualifiedName,
    key_text: &SqlText,
    tenant_text: Option<&SqlText>,
    held: &SqlText,
    params: PurgeUnheld,
) -> Statement<PurgeUnheld> {
    let mut sql = SqlText::new("WITH gone AS (DELETE FROM ");
    sql.table(partition).push(" t WHERE NOT (").append(held);
    if params.details.is_some() {
        sql.push(") RETURNING ")
            .append(key_text)
            .push(" AS record_id, ")
            .append(&tenant_or_null(tenant_text))
            .push(" AS tenant_id), d AS (INSERT INTO ")
            .table(&CohortTable::RowDetail.qualified(schema))
            .push(
                " (run_id, retention_entity_id, entity_type, record_id, tenant_id, action) \
                 SELECT $2, $1, $3, record_id, tenant_id, $4 FROM gone RETURNING row_detail_id) \
                 SELECT pg_catalog.count(*) AS n, pg_catalog.min(row_detail_id) AS first FROM d",
            );
    } else {
        sql.push(") RETURNING 1) SELECT pg_catalog.count(*) AS n, NULL::int8 AS first FROM gone");
    }
    Statement::new(sql, params).not_persistent()
}

/// The row's tenant as text (`NULL` for a tenantless entity).
fn tenant_or_null(tenant_text: Option<&SqlText>) -> SqlText {
    match tenant_text {
        Some(t) => t.clone(),
        None => SqlText::new("NULL::text"),
    }
}

/// The tenants whose rows a partition holds, canonical (`tenant_text`
/// over `t`), with how many rows each: `tenant, n` (a NULL tenant is a
/// row of no tenant).
pub(crate) fn tenants_in(partition: &QualifiedName, tenant_text: &SqlText) -> Statement<()> {
    let mut sql = SqlText::new("SELECT ");
    sql.append(tenant_text)
        .push(" AS tenant, pg_catalog.count(*) AS n FROM ")
        .table(partition)
        .push(" t GROUP BY 1 ORDER BY 1");
    Statement::new(sql, ()).not_persistent()
}

/// The partition's row count.
pub(crate) fn count(partition: &QualifiedName) -> Statement<()> {
    let mut sql = SqlText::new("SELECT pg_catalog.count(*) FROM ");
    sql.table(partition);
    Statement::new(sql, ()).not_persistent()
}

/// Detaches the partition from its parent.
pub(crate) fn detach(parent: &QualifiedName, partition: &QualifiedName) -> Statement<()> {
    let mut sql = SqlText::new("ALTER TABLE ");
    sql.table(parent)
        .push(" DETACH PARTITION ")
        .table(partition);
    Statement::new(sql, ())
}

/// Drops the (detached) partition.
pub(crate) fn drop(partition: &QualifiedName) -> Statement<()> {
    let mut sql = SqlText::new("DROP TABLE ");
    sql.table(partition);
    Statement::new(sql, ())
}

/// A page of a dropped partition's detail rows.
#[derive(Debug)]
pub(crate) struct DetailPage {
    pub(crate) from_id: i64,
    pub(crate) run_id: Uuid,
    pub(crate) entity: Uuid,
    pub(crate) limit: i64,
}

impl Params for DetailPage {
    fn bind(self, q: Args) -> Args {
        q.bind(self.from_id)
            .bind(self.run_id)
            .bind(self.entity)
            .bind(self.limit)
    }
}

/// Columns `row_detail_id, record_id`, in id order.
pub(crate) fn detail_page(schema: &str, params: DetailPage) -> Statement<DetailPage> {
    let mut sql = SqlText::new("SELECT row_detail_id, record_id FROM ");
    sql.table(&CohortTable::RowDetail.qualified(schema)).push(
        " WHERE row_detail_id >= $1 AND run_id = $2 AND retention_entity_id = $3 \
         ORDER BY row_detail_id LIMIT $4",
    );
    Statement::new(sql, params)
}
