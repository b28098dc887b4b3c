//! Moving Cohort's tables to another schema (`cohort migrate --schema NEW
//! --move-from OLD`): every table with its rows, identity sequences,
//! indexes, constraints and grants, in one transaction, with nothing
//! rewritten (`ALTER TABLE … SET SCHEMA` moves the relation as it is).

use sqlx::{Connection, PgConnection};

use super::migrate::installed_version;
use crate::base::ident::check_schema_name;
use crate::error::{Error, Problems, Result};
use crate::sql::schema as statements;
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
/// [`super::migrate()`] first); `to` already has Cohort's tables (or any
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

/// The move inside the caller's transaction; an error refuses it (the caller rolls back).
async fn move_in(tx: &mut PgConnection, from: &str, to: &str) -> Result<Vec<String>> {
    lock_migrations(tx, from, to).await?;
    check_source(tx, from).await?;
    let names: Vec<&str> = CohortTable::ALL
        .iter()
        .map(|t| t.name())
        .chain([SQLX_HISTORY])
        .collect();
    let owned: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    clear_target(tx, to, owned.clone()).await?;
    refuse_in_flight(tx, from).await?;
    statements::create_schema(to)
        .raw()
        .execute(&mut *tx)
        .await?;
    let moved = move_tables(tx, from, to, &names, owned).await?;
    move_hold_functions(tx, from, to).await?;
    if moved.iter().any(|t| t == SQLX_HISTORY) {
        rewrite_sqlx_checksums(tx, from, to).await?;
    }
    leave_marker(tx, from, to).await?;
    Ok(moved)
}

/// Takes both schemas' migration locks, in a fixed order.
async fn lock_migrations(tx: &mut PgConnection, from: &str, to: &str) -> Result<()> {
    // Both migration locks, in a fixed order: no migration or other move of
    // either schema runs meanwhile.
    let (first, second) = if from < to { (from, to) } else { (to, from) };
    for schema in [first, second] {
        crate::sql::locks::xact_lock(crate::base::locks::LockKey::Migrate(schema))
            .query()
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

/// `from` holds a current install of Cohort's tables (not the marker of a move).
async fn check_source(tx: &mut PgConnection, from: &str) -> Result<()> {
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
    Ok(())
}

/// `to` has none of the tables' names, but what a move away left there (dropped).
async fn clear_target(tx: &mut PgConnection, to: &str, owned: Vec<String>) -> Result<()> {
    let taken: Vec<String> = statements::taken(to.to_owned(), owned)
        .query_scalar()
        .fetch_all(&mut *tx)
        .await?;
    if !taken.is_empty() && leftovers_only(tx, to, &taken).await? {
        // Moving back to a schema the tables once left: its marker goes
        // (with the empty sqlx history a stale migrator run left there).
        for name in &taken {
            let table = crate::base::ident::QualifiedName::new(to, name.as_str());
            statements::drop_table(&table)
                .raw()
                .execute(&mut *tx)
                .await?;
        }
    } else if !taken.is_empty() {
        return Err(Error::Conflict(format!(
            "schema {to:?} already has {}: nothing moved",
            taken.join(", ")
        )));
    }
    Ok(())
}

/// Refuses the move while a run or a delivery is in flight in `from`.
async fn refuse_in_flight(tx: &mut PgConnection, from: &str) -> Result<()> {
    // Nothing may be mid-flight: its process would go on writing to names
    // that no longer exist. Locks on both tables keep new work out until
    // the move commits.
    statements::lock_ledger(from)
        .raw()
        .execute(&mut *tx)
        .await?;
    // A run still `started` whose run lock is free lost its process (it is
    // recovered as failed later, in the new schema), and a claim that has
    // expired is reclaimed there: neither holds the move back.
    let started: Vec<uuid::Uuid> = statements::started_runs(from)
        .query_scalar()
        .fetch_all(&mut *tx)
        .await?;
    let mut runs = 0;
    for run_id in started {
        let free: bool = statements::try_run_lock(run_id)
            .query_scalar()
            .fetch_one(&mut *tx)
            .await?;
        runs += i64::from(!free);
    }
    let deliveries: i64 = statements::open_deliveries(from)
        .query_scalar()
        .fetch_one(&mut *tx)
        .await?;
    if runs > 0 || deliveries > 0 {
        return Err(Error::Refused(format!(
            "{runs} run(s) still started and {deliveries} delivery(ies) in flight in {from:?}: \
             stop the workers and dispatchers (or wait for them), then move"
        )));
    }
    Ok(())
}

/// Moves each table of `names` present in `from` to `to`; the names moved, in order.
async fn move_tables(
    tx: &mut PgConnection,
    from: &str,
    to: &str,
    names: &[&str],
    owned: Vec<String>,
) -> Result<Vec<String>> {
    let present: Vec<String> = statements::present(from.to_owned(), owned)
        .query_scalar()
        .fetch_all(&mut *tx)
        .await?;
    let mut moved = Vec::new();
    for name in names.iter().filter(|n| present.iter().any(|p| p == *n)) {
        let table = crate::base::ident::QualifiedName::new(from, *name);
        statements::set_schema(&table, to)
            .raw()
            .execute(&mut *tx)
            .await?;
        moved.push((*name).to_owned());
    }
    Ok(moved)
}

/// Makes the hold functions in `to` and drops them from `from`.
async fn move_hold_functions(tx: &mut PgConnection, from: &str, to: &str) -> Result<()> {
    // The hold functions: made again in `to` (the trigger of the moved
    // hold table repointed to them), then dropped from `from`.
    let functions = super::migrate::render(super::migrate::HOLD_FUNCTIONS, to);
    sqlx::raw_sql(sqlx::AssertSqlSafe(functions.as_str().to_owned()))
        .execute(&mut *tx)
        .await?;
    statements::drop_hold_functions(from)
        .raw()
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Leaves the marker in `from` that says where the tables went.
async fn leave_marker(tx: &mut PgConnection, from: &str, to: &str) -> Result<()> {
    // The marker: a process still configured with `from` finds this, not
    // an empty schema it would install a fresh ledger into.
    let marker = CohortTable::SweepRun.qualified(from);
    statements::create_marker(&marker)
        .raw()
        .execute(&mut *tx)
        .await?;
    statements::insert_marker(&marker, to.to_owned())
        .query()
        .execute(&mut *tx)
        .await?;
    statements::comment_marker(&marker)
        .raw()
        .execute(&mut *tx)
        .await?;
    Ok(())
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
        let history = crate::base::ident::QualifiedName::new(schema, SQLX_HISTORY);
        let n: i64 = statements::count_rows(&history)
            .query_scalar()
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
    let comment: Option<Option<String>> = statements::installed_comment(schema.to_owned())
        .query_scalar()
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
    let history = crate::base::ident::QualifiedName::new(to, SQLX_HISTORY);
    for (o, n) in old.iter().zip(new.iter()) {
        debug_assert_eq!(o.version, n.version);
        let checksum = statements::Checksum {
            new: n.checksum.to_vec(),
            version: n.version,
            old: o.checksum.to_vec(),
        };
        statements::rewrite_checksum(&history, checksum)
            .query()
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}
