//! Statements of `retention_setting`, the database's live settings.

use super::statement::{Args, Params, Statement};
use crate::base::ident::SqlText;
use crate::sql::tables::CohortTable;

/// Every setting the database holds.
/// A setting as stored (the rows of [`read`]).
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct SettingRow {
    pub(crate) name: String,
    pub(crate) enabled: bool,
    pub(crate) updated_at: chrono::DateTime<chrono::Utc>,
    /// The role that set it.
    pub(crate) updated_by: String,
}

pub(crate) fn read(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("SELECT name, enabled, updated_at, updated_by FROM ");
    sql.table(&CohortTable::Setting.qualified(schema));
    Statement::new(sql, ())
}

/// Sets one setting, recording when and by which role.
#[derive(Debug)]
pub(crate) struct Upsert {
    pub(crate) name: &'static str,
    pub(crate) enabled: bool,
}

impl Params for Upsert {
    fn bind(self, q: Args) -> Args {
        q.bind(self.name).bind(self.enabled)
    }
}

pub(crate) fn upsert(schema: &str, params: Upsert) -> Statement<Upsert> {
    let mut sql = SqlText::new("INSERT INTO ");
    sql.table(&CohortTable::Setting.qualified(schema)).push(
        " AS s (name, enabled) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE \
         SET enabled = EXCLUDED.enabled, updated_at = pg_catalog.clock_timestamp(), \
             updated_by = pg_catalog.\"session_user\"()",
    );
    Statement::new(sql, params)
}
