//! Cohort's own tables: the contract (names, columns, version) and the
//! versioned migrations that install it.

mod migrate;
mod relocate;

pub(crate) use crate::sql::tables::MOVED_COMMENT;
pub use crate::sql::tables::{CohortTable, ColumnContract, SCHEMA_VERSION};
pub(crate) use migrate::parse_version_comment;
#[cfg(feature = "sea-orm")]
pub(crate) use migrate::MigrationPlan;
pub use migrate::{
    installed_version, migrate, migrations, sqlx_migrator, Migration, MigrationReport,
};
pub use relocate::{move_schema, MoveReport};

/// Keys the ledger's hash chain in `schema` with `key` (what `cohort
/// migrate` does when `COHORT_LEDGER_KEY` is in its environment): appends
/// a `key` link, after which every link carries a MAC under the key (see
/// [`crate::chain`]). Returns the link's number, or `None` when the chain
/// is already keyed with this key; refused when it is keyed with another.
pub async fn key_chain(
    conn: &mut sqlx::PgConnection,
    schema: &str,
    key: &crate::chain::LedgerKey,
) -> crate::Result<Option<i64>> {
    crate::ident::check_schema_name(schema)
        .map_err(|e| crate::Error::Config(crate::Problems::one(format!("schema name: {e}"))))?;
    crate::run::chain::key_chain(conn, schema, key).await
}

/// The id of the key the ledger's hash chain in `schema` is keyed with
/// ([`crate::chain::LedgerKey::id`]), or `None` when it is not keyed.
pub async fn chain_key_id(
    conn: &mut sqlx::PgConnection,
    schema: &str,
) -> crate::Result<Option<String>> {
    crate::ident::check_schema_name(schema)
        .map_err(|e| crate::Error::Config(crate::Problems::one(format!("schema name: {e}"))))?;
    Ok(crate::run::chain::keyed_with(conn, schema).await?)
}
