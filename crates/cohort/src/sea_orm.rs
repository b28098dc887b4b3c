//! SeaORM integration (cargo feature `sea-orm`; SeaORM 2, which runs on the
//! same sqlx as Cohort).
//!
//! - [`builder`]: a [`CohortBuilder`] on the pool of a SeaORM
//!   `DatabaseConnection`, so both share connections.
//! - [`Cohort::guard_deletion_sea_orm`]: guarded deletion inside the
//!   application's own SeaORM `DatabaseTransaction` (the same locks and hold
//!   check as [`Cohort::guard_deletion`]).
//! - [`migrate`]: Cohort's migrations on any SeaORM connection, e.g. the
//!   `SchemaManager`'s connection inside a `sea-orm-migration` migration.

use sea_orm::sea_query::{ArrayType, Value};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, Statement,
    TransactionSession, TransactionTrait,
};
use uuid::Uuid;

use crate::base::ident::SqlText;
use crate::error::{Error, Problems, Result};
use crate::ops::guarded::{GuardSession, Guarded, GuardedDeletion};
use crate::schema::MigrationReport;
use crate::sql::sea::first;
use crate::sql::{KeyType, KeyValue, LockedRow, RecordRow};
use crate::{Cohort, CohortBuilder};

/// A [`CohortBuilder`] on the PostgreSQL pool of a SeaORM connection.
/// Refused for a connection that is not a PostgreSQL pool (MySQL, SQLite,
/// a mock or a proxy).
pub fn builder(db: &DatabaseConnection) -> Result<CohortBuilder> {
    if !matches!(
        db.inner,
        sea_orm::DatabaseConnectionType::SqlxPostgresPoolConnection(_)
    ) {
        return Err(Error::Config(Problems::one(format!(
            "Cohort runs on PostgreSQL through sqlx; this SeaORM connection is {:?}",
            db.get_database_backend()
        ))));
    }
    Ok(Cohort::builder(db.get_postgres_connection_pool().clone()))
}

impl Cohort {
    /// [`Cohort::guard_deletion`] inside a SeaORM transaction: locks the
    /// target rows `FOR UPDATE` there, then checks for active holds.
    /// `Completed` means delete them in `txn` and commit; `Protected` names
    /// the held ids. Refused unless the transaction is READ COMMITTED.
    pub async fn guard_deletion_sea_orm(
        &self,
        txn: &DatabaseTransaction,
        request: GuardedDeletion,
    ) -> Result<Guarded<()>> {
        let cx = self.context();
        let ready = cx.ready().await?;
        crate::ops::guarded::guard_on(&ready, &mut SeaSession(txn), request).await
    }
}

fn db_err(e: DbErr) -> Error {
    Error::Orm(e.to_string())
}

fn statement(sql: &str, values: Vec<Value>) -> Statement {
    Statement::from_sql_and_values(DbBackend::Postgres, sql, values)
}

/// The keys as one array parameter in their column's type.
fn key_array(key_type: KeyType, keys: &[KeyValue]) -> Value {
    let (ty, values): (ArrayType, Vec<Value>) = match key_type {
        KeyType::Uuid => (
            ArrayType::Uuid,
            keys.iter()
                .filter_map(|k| match k {
                    KeyValue::Uuid(v) => Some(Value::from(*v)),
                    _ => None,
                })
                .collect(),
        ),
        KeyType::Int2 => (
            ArrayType::SmallInt,
            keys.iter()
                .filter_map(|k| match k {
                    KeyValue::Int2(v) => Some(Value::from(*v)),
                    _ => None,
                })
                .collect(),
        ),
        KeyType::Int4 => (
            ArrayType::Int,
            keys.iter()
                .filter_map(|k| match k {
                    KeyValue::Int4(v) => Some(Value::from(*v)),
                    _ => None,
                })
                .collect(),
        ),
        KeyType::Int8 => (
            ArrayType::BigInt,
            keys.iter()
                .filter_map(|k| match k {
                    KeyValue::Int8(v) => Some(Value::from(*v)),
                    _ => None,
                })
                .collect(),
        ),
        KeyType::Text | KeyType::CiText => (
            ArrayType::String,
            keys.iter()
                .filter_map(|k| match k {
                    KeyValue::Text(v) => Some(Value::from(v.clone())),
                    _ => None,
                })
                .collect(),
        ),
    };
    Value::Array(ty, Some(Box::new(values)))
}

struct SeaSession<'t>(&'t DatabaseTransaction);

#[async_trait::async_trait]
impl GuardSession for SeaSession<'_> {
    async fn isolation(&mut self) -> Result<String> {
        let row = self
            .0
            .query_one_raw(statement(crate::sql::ISOLATION_LEVEL, Vec::new()))
            .await
            .map_err(db_err)?
            .ok_or_else(|| Error::Orm("no row for the isolation level".into()))?;
        first(&row).map_err(db_err)
    }

    async fn lock(
        &mut self,
        sql: &SqlText,
        key_type: KeyType,
        keys: &[KeyValue],
    ) -> Result<Vec<(String, Option<String>)>> {
        let rows = self
            .0
            .query_all_raw(statement(sql.as_str(), vec![key_array(key_type, keys)]))
            .await
            .map_err(db_err)?;
        rows.iter()
            .map(|r| {
                let row = LockedRow::from_sea(r).map_err(db_err)?;
                Ok((row.record, row.tenant))
            })
            .collect()
    }

    async fn execute(&mut self, sql: &str) -> Result<()> {
        self.0
            .execute_raw(statement(sql, Vec::new()))
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn held(
        &mut self,
        sql: &SqlText,
        entity: Uuid,
        key_type: KeyType,
        keys: &[KeyValue],
    ) -> Result<Vec<String>> {
        let rows = self
            .0
            .query_all_raw(statement(
                sql.as_str(),
                vec![Value::from(entity), key_array(key_type, keys)],
            ))
            .await
            .map_err(db_err)?;
        rows.iter()
            .map(|r| Ok(RecordRow::from_sea(r).map_err(db_err)?.record))
            .collect()
    }
}

/// Brings Cohort's tables in `schema` to [`crate::schema::SCHEMA_VERSION`]
/// on a SeaORM connection: creates the schema if needed, reads the installed
/// version and applies the pending migrations, in a transaction of its own
/// (a savepoint when `conn` is already a transaction, as in a
/// `sea-orm-migration` migration on PostgreSQL) under a transaction-scoped
/// advisory lock, so concurrent callers apply each version once. Applied
/// twice, the second call does nothing.
///
/// From a `sea-orm-migration` migration (the complete application is
/// `examples/seaorm-notes` in Cohort's repository, built and tested in CI):
///
/// ```text
/// async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
///     cohort::sea_orm::migrate(manager.get_connection(), "retention")
///         .await
///         .map_err(|e| DbErr::Migration(e.to_string()))?;
///     Ok(())
/// }
/// ```
pub async fn migrate<C>(conn: &C, schema: &str) -> Result<MigrationReport>
where
    C: ConnectionTrait + TransactionTrait,
{
    let plan = crate::schema::MigrationPlan::new(schema)?;
    // Its own transaction (a savepoint inside one already open): the
    // advisory lock is transaction-scoped, and the versions apply together.
    let txn = conn.begin().await.map_err(db_err)?;
    let report = apply(&txn, &plan, schema).await;
    match report {
        Ok(report) => {
            txn.commit().await.map_err(db_err)?;
            Ok(report)
        }
        Err(e) => {
            txn.rollback().await.map_err(db_err)?;
            Err(e)
        }
    }
}

async fn apply<T: ConnectionTrait>(
    conn: &T,
    plan: &crate::schema::MigrationPlan,
    schema: &str,
) -> Result<MigrationReport> {
    conn.execute_raw(statement(
        crate::sql::locks::XACT_LOCK_SQL,
        vec![Value::from(
            crate::base::locks::LockKey::Migrate(schema).text(),
        )],
    ))
    .await
    .map_err(db_err)?;
    conn.execute_unprepared(crate::sql::schema::create_schema(schema).text())
        .await
        .map_err(db_err)?;
    let installed = crate::sql::schema::installed_comment(schema.to_owned());
    let row = conn
        .query_one_raw(statement(
            installed.text(),
            vec![
                Value::from(schema.to_owned()),
                Value::from(crate::schema::CohortTable::SweepRun.name().to_owned()),
            ],
        ))
        .await
        .map_err(db_err)?;
    let found: Option<Option<String>> = row.map(|r| first(&r).map_err(db_err)).transpose()?;
    let from = plan.version_from(found)?;
    let mut applied = Vec::new();
    for m in plan.pending(from) {
        conn.execute_unprepared(&m.sql).await.map_err(|e| {
            Error::Migration(format!("migration {} ({}) failed: {e}", m.version, m.name))
        })?;
        applied.push(m.version);
    }
    Ok(plan.report(from, applied))
}
