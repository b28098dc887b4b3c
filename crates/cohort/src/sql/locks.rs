//! The statements that take and release Cohort's advisory locks (the keys
//! are `locks::LockKey`).

use sqlx::PgConnection;

use super::statement::Statement;
use crate::ident::SqlText;
use crate::locks::LockKey;

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
