//! Moving Cohort's tables to another schema (`cohort migrate --schema NEW
//! --move-from OLD`): every table with its rows, identity sequences,
//! indexes, constraints and grants, in one transaction, with nothing
//! rewritten (`ALTER TABLE … SET SCHEMA` moves the relation as it is).

use sqlx::{Connection, PgConnection};

use super::migrate::installed_version;
use crate::error::{Error, Problems, Result};
use crate::ident::check_schema_name;
use crate::ident::SqlText;
use crate::sql::tables::{CohortTable, MOVED_COMMENT, SCHEMA_VERSION};

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
        sqlx::query(crate::sql::locks::XACT_LOCK_SQL)
            .bind(crate::locks::LockKey::Migrate(schema).text())
            .execute(&mut *tx)
            .await?;
    }
    if is_marker(tx, from).await? {
        return Err(Error::NotFound(format!(
            "Cohort's tables were already moved out of schema {from:?} (its sweep_run says where)"
        )));
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
    if !taken.is_empty() && leftovers_only(tx, to, &taken).await? {
        // Moving back to a schema the tables once left: its marker goes
        // (with the empty sqlx history a stale migrator run left there).
        for name in &taken {
            let mut drop = SqlText::new("DROP TABLE ");
            drop.table(&crate::ident::QualifiedName::new(to, name.as_str()));
            sqlx::query(drop.into_sql()).execute(&mut *tx).await?;
        }
    } else if !taken.is_empty() {
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
    // A run still `started` whose run lock is free lost its process (it is
    // recovered as failed later, in the new schema), and a claim that has
    // expired is reclaimed there: neither holds the move back.
    let mut started = SqlText::new("SELECT run_id FROM ");
    started
        .table(&CohortTable::SweepRun.qualified(from))
        .push(" WHERE status = 'started'");
    let started: Vec<uuid::Uuid> = sqlx::query_scalar(started.into_sql())
        .fetch_all(&mut *tx)
        .await?;
    let mut runs = 0;
    for run_id in started {
        let free: bool = sqlx::query_scalar(
            "SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended($1, 0))",
        )
        .bind(crate::locks::LockKey::Run(run_id).text())
        .fetch_one(&mut *tx)
        .await?;
        runs += i64::from(!free);
    }
    let mut open = SqlText::new("SELECT count(*) FROM ");
    open.table(&CohortTable::HandlerStatus.qualified(from))
        .push(" WHERE status = 'in_flight' AND claim_expires_at > pg_catalog.now()");
    let deliveries: i64 = sqlx::query_scalar(open.into_sql())
        .fetch_one(&mut *tx)
        .await?;
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
            .table(&crate::ident::QualifiedName::new(from, *name))
            .push(" SET SCHEMA ")
            .ident(to);
        sqlx::query(alter.into_sql()).execute(&mut *tx).await?;
        moved.push((*name).to_owned());
    }
    if moved.iter().any(|t| t == SQLX_HISTORY) {
        rewrite_sqlx_checksums(tx, from, to).await?;
    }
    // The marker: a process still configured with `from` finds this, not
    // an empty schema it would install a fresh ledger into.
    let marker = CohortTable::SweepRun.qualified(from);
    let mut create = SqlText::new("CREATE TABLE ");
    create
        .table(&marker)
        .push(" (moved_to text NOT NULL, moved_at timestamptz NOT NULL DEFAULT pg_catalog.now())");
    sqlx::query(create.into_sql()).execute(&mut *tx).await?;
    let mut insert = SqlText::new("INSERT INTO ");
    insert.table(&marker).push(" (moved_to) VALUES ($1)");
    sqlx::query(insert.into_sql())
        .bind(to)
        .execute(&mut *tx)
        .await?;
    let mut comment = SqlText::new("COMMENT ON TABLE ");
    comment
        .table(&marker)
        .push(" IS '")
        .push(MOVED_COMMENT)
        .push("'");
    sqlx::query(comment.into_sql()).execute(&mut *tx).await?;
    Ok(moved)
}

/// Whether the tables of Cohort's names in `schema` are only what a move
/// away leaves there: the marker `sweep_run`, and at most an empty sqlx
/// history (a stale process's failed `sqlx_migrator` run).
async fn leftovers_only(tx: &mut PgConnection, schema: &str, taken: &[String]) -> Result<bool> {
    if !taken.iter().any(|t| t == "sweep_run") || !is_marker(tx, schema).await? {
        return Ok(false);
    }
    for name in taken.iter().filter(|t| t.as_str() != "sweep_run") {
        if name != SQLX_HISTORY {
            return Ok(false);
        }
        let mut rows = SqlText::new("SELECT count(*) FROM ");
        rows.table(&crate::ident::QualifiedName::new(schema, SQLX_HISTORY));
        let n: i64 = sqlx::query_scalar(rows.into_sql())
            .fetch_one(&mut *tx)
            .await?;
        if n > 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether `schema.sweep_run` is the marker a move left behind.
async fn is_marker(tx: &mut PgConnection, schema: &str) -> Result<bool> {
    let comment: Option<Option<String>> = sqlx::query_scalar(super::migrate::INSTALLED_VERSION_SQL)
        .bind(schema)
        .bind(CohortTable::SweepRun.name())
        .fetch_optional(&mut *tx)
        .await?;
    Ok(comment.flatten().as_deref() == Some(MOVED_COMMENT))
}

/// sqlx records each migration's checksum, and Cohort's SQL names its
/// schema: the moved history gets the checksums of the same versions
/// rendered for `to`, where it still has those of `from` (anything else was
/// not written by [`super::sqlx_migrator`] and is left for sqlx to report).
async fn rewrite_sqlx_checksums(tx: &mut PgConnection, from: &str, to: &str) -> Result<()> {
    let old = super::sqlx_migrator(from)?;
    let new = super::sqlx_migrator(to)?;
    let mut update = SqlText::new("UPDATE ");
    update
        .table(&crate::ident::QualifiedName::new(to, SQLX_HISTORY))
        .push(" SET checksum = $1 WHERE version = $2 AND checksum = $3");
    for (o, n) in old.iter().zip(new.iter()) {
        debug_assert_eq!(o.version, n.version);
        sqlx::query(update.sql())
            .bind(n.checksum.as_ref())
            .bind(n.version)
            .bind(o.checksum.as_ref())
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}
