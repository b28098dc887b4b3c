//! Cohort's own tables: the contract (names, columns, version) and the
//! versioned migrations that install it.

mod contract;
mod migrate;

pub use contract::{ColumnContract, CohortTable, SCHEMA_VERSION};
pub use migrate::{installed_version, migrate, migrations, Migration, MigrationReport};
pub(crate) use migrate::parse_version_comment;
