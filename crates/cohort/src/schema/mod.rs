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
