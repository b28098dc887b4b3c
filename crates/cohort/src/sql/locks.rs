//! The statements that take and release Cohort's advisory locks (the keys
//! are `locks::LockKey`).

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};

use super::statement::Statement;
use crate::base::ident::SqlText;
use crate::base::locks::LockKey;

/// [`XACT_LOCK_SQL`] for `key`, as a statement.
pub(crate) fn xact_lock(key: LockKey<'_>) -> Statement<(String,)> {
    Statement::new(SqlText::new(XACT_LOCK_SQL), (key.text(),))
}

/// Takes a transaction-scoped lock (released at commit or rollback),
/// waiting for it; `$1` the key's text. Hashed with `hashtext` (int4), as
/// released versions hashed the migration lock, so old and new binaries
/// migrating at once still exclude each other.
pub(crate) const XACT_LOCK_SQL: &str =
    "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext($1))";

/// Takes the hold gate ([`crate::base::locks::HOLD_GATE_CLASS`]) of the install
/// in `schema` for the transaction, waiting for it: shared (a batch, after
/// locking its rows and before re-checking holds) or exclusive (a subject
/// hold's creation, after locking the subject's rows and before its
/// insert).
pub(crate) fn hold_gate(schema: &str, shared: bool) -> Statement<()> {
    Statement::new(hold_gate_sql(schema, shared), ())
}

/// [`hold_gate`]'s text (a batch's plan keeps it, built once).
pub(crate) fn hold_gate_sql(schema: &str, shared: bool) -> SqlText {
    let mut sql = SqlText::new(if shared {
        "SELECT pg_catalog.pg_advisory_xact_lock_shared("
    } else {
        "SELECT pg_catalog.pg_advisory_xact_lock("
    });
    sql.push(crate::base::locks::HOLD_GATE_CLASS)
        .push(", ")
        .regclass(&crate::sql::tables::CohortTable::Hold.qualified(schema))
        .push("::pg_catalog.oid::int4)");
    sql
}

/// Takes a session-level lock, waiting for it.
pub(crate) async fn lock(conn: &mut PgConnection, key: LockKey<'_>) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended($1, 0))")
        .bind(key.text())
        .execute(conn)
        .await
        .map(drop)
}

/// Takes a session-level lock if it is free; `false` when another session
/// holds it (for a run: the run is live).
pub(crate) async fn try_lock(
    conn: &mut PgConnection,
    key: LockKey<'_>,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_catalog.pg_try_advisory_lock(pg_catalog.hashtextextended($1, 0))")
        .bind(key.text())
        .fetch_one(conn)
        .await
}

/// Releases a session-level lock taken with [`lock`].
pub(crate) async fn unlock(conn: &mut PgConnection, key: LockKey<'_>) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_catalog.pg_advisory_unlock(pg_catalog.hashtextextended($1, 0))")
        .bind(key.text())
        .execute(conn)
        .await
        .map(drop)
}

/// A pooled connection that holds (or is about to hold) a session-level
/// advisory lock. Dropped without [`Held::into_inner`] (a panic in user
/// code, or its future dropped by an abort), the connection is closed
/// instead of going back to the pool, so the lock can never outlive its
/// holder inside the pool, where it would make a lost run look live.
pub(crate) struct Held(Option<PoolConnection<Postgres>>);

impl Held {
    pub(crate) fn new(conn: PoolConnection<Postgres>) -> Self {
        Self(Some(conn))
    }

    /// The connection, for the normal path that releases the lock itself.
    pub(crate) fn into_inner(mut self) -> PoolConnection<Postgres> {
        self.0.take().expect("present until taken")
    }
}

impl std::ops::Deref for Held {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.0.as_ref().expect("present until taken")
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.0.as_mut().expect("present until taken")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(conn) = self.0.as_mut() {
            conn.close_on_drop();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gate_statement_names_the_gate_key_and_the_hold_table() {
        assert_eq!(
            super::hold_gate("re'tention", true).text(),
            "SELECT pg_catalog.pg_advisory_xact_lock_shared(1131375665, \
             '\"re''tention\".\"retention_hold\"'::pg_catalog.regclass::pg_catalog.oid::int4)"
        );
    }
}
