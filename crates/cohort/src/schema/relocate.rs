//! Moving Cohort's tables to another schema (`cohort migrate --schema NEW
//! --move-from OLD`): every table with its rows, identity sequences,
//! indexes, constraints and grants, in one transaction, with nothing
//! rewritten (`ALTER TABLE … SET SCHEMA` moves the relation as it is).

use sqlx::{Connection, PgConnection};

use super::contract::{CohortTable, SCHEMA_VERSION};
use super::migrate::installed_version;
use crate::config::check_schema_name;
use crate::error::{Error, Problems, Result};
use crate::ident::SqlText;

/// The history table of [`super::sqlx_migrator`], moved along when present.
const SQLX_HISTORY: &str = "_cohort_sqlx_migrations";

/// What [`move_schema`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MoveReport {
    /// Where the tables were.
    pub from: String,
    /// Where they are now.
    pub to: String,
    /// The tables moved, by name.
    pub tables: Vec<String>,
}

/// Moves Cohort's tables from schema `from` to schema `to` (created if
/// needed), in one transaction under both schemas' migration locks.
///
/// Refused, changing nothing, when: the names are the same or invalid;
/// `from` has no Cohort install or one older than this build (run
/// [`super::migrate`] first); `to` already has Cohort's tables (or any
/// table of the same name); a run is still `started` or handler work is in
/// flight (stop the workers and dispatchers first: a process configured
/// with the old schema cannot follow the move). Afterwards, point every
/// process's `schema` setting at `to`.
pub async fn move_schema(conn: &mut PgConnection, from: &str, to: &str) -> Result<MoveReport> {
    for (what, name) in [("--move-from", from), ("schema", to)] {
        check_schema_name(name)
            .map_err(|e| Error::Config(Problems::one(format!("{what}: {e}"))))?;
    }
    if from == to {
        return Err(Error::InvalidInput(format!(
            "the tables are already in schema {to:?}"
        )));
    }
    let mut tx = conn.begin().await?;
    // A refusal rolls back at once (not when the connection is next used):
    // the locks taken so far must not outlive the call.
    match move_in(&mut tx, from, to).await {
        Ok(tables) => {
            tx.commit().await?;
            Ok(MoveReport {
                from: from.to_owned(),
                to: to.to_owned(),
                tables,
            })
        }
        Err(e) => {
            tx.rollback().await?;
            Err(e)
        }
    }
}

async fn move_in(tx: &mut PgConnection, from: &str, to: &str) -> Result<Vec<String>> {
    // Both migration locks, in a fixed order: no migration or other move of
    // either schema runs meanwhile.
    let (first, second) = if from < to { (from, to) } else { (to, from) };
    for schema in [first, second] {
        sqlx::query(crate::locks::XACT_LOCK_SQL)
            .bind(crate::locks::LockKey::Migrate(schema).text())
            .execute(&mut *tx)
            .await?;
    }
    match installed_version(&mut *tx, from).await? {
        None => {
            return Err(Error::NotFound(format!(
                "schema {from:?} has no Cohort tables to move"
            )))
        }
        Some(v) if v != SCHEMA_VERSION => {
            return Err(Error::Refused(format!(
            "schema {from:?} is at Cohort schema version {v}, this build's is {SCHEMA_VERSION}: \
                 migrate it first (cohort migrate --schema {from:?})"
        )))
        }
        Some(_) => {}
    }
    let names: Vec<&str> = CohortTable::ALL
        .iter()
        .map(|t| t.name())
        .chain([SQLX_HISTORY])
        .collect();
    let taken: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = ANY($2::text[]) ORDER BY 1",
    )
    .bind(to)
    .bind(&names)
    .fetch_all(&mut *tx)
    .await?;
    if !taken.is_empty() {
        return Err(Error::Conflict(format!(
            "schema {to:?} already has {}: nothing moved",
            taken.join(", ")
        )));
    }
    // Nothing may be mid-flight: its process would go on writing to names
    // that no longer exist. Locks on both tables keep new work out until
    // the move commits.
    let mut busy = SqlText::new("LOCK TABLE ");
    busy.table(&CohortTable::SweepRun.qualified(from))
        .push(", ")
        .table(&CohortTable::HandlerStatus.qualified(from))
        .push(" IN SHARE ROW EXCLUSIVE MODE");
    sqlx::query(busy.into_sql()).execute(&mut *tx).await?;
    let mut open = SqlText::new("SELECT (SELECT count(*) FROM ");
    open.table(&CohortTable::SweepRun.qualified(from))
        .push(" WHERE status = 'started'), (SELECT count(*) FROM ")
        .table(&CohortTable::HandlerStatus.qualified(from))
        .push(" WHERE status = 'in_flight')");
    let (runs, deliveries): (i64, i64) =
        sqlx::query_as(open.into_sql()).fetch_one(&mut *tx).await?;
    if runs > 0 || deliveries > 0 {
        return Err(Error::Refused(format!(
            "{runs} run(s) still started and {deliveries} delivery(ies) in flight in {from:?}: \
             stop the workers and dispatchers (or wait for them), then move"
        )));
    }
    let mut create = SqlText::new("CREATE SCHEMA IF NOT EXISTS ");
    create.ident(to);
    sqlx::query(create.into_sql()).execute(&mut *tx).await?;
    let present: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = ANY($2::text[]) AND c.relkind IN ('r', 'p')",
    )
    .bind(from)
    .bind(&names)
    .fetch_all(&mut *tx)
    .await?;
    let mut moved = Vec::new();
    for name in names.iter().filter(|n| present.iter().any(|p| p == *n)) {
        let mut alter = SqlText::new("ALTER TABLE ");
        alter
            .table(&crate::QualifiedName::new(from, *name))
            .push(" SET SCHEMA ")
            .ident(to);
        sqlx::query(alter.into_sql()).execute(&mut *tx).await?;
        moved.push((*name).to_owned());
    }
    Ok(moved)
}
