//! Statements of the journal's table in another database
//! (`"public"."cohort_journal"`, see [`crate::domain::journal`]): one row per
//! entry, its place and its line.

use super::statement::Statement;
use crate::base::ident::SqlText;

/// The journal's table, in the journal's own database.
pub(crate) const TABLE: &str = "\"public\".\"cohort_journal\"";

/// Creates the table on first use.
pub(crate) fn create() -> Statement<()> {
    Statement::new(
        SqlText::new(
            "CREATE TABLE IF NOT EXISTS \"public\".\"cohort_journal\" (seq bigint PRIMARY KEY, \
             entry text NOT NULL, \
             written_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp())",
        ),
        (),
    )
}

/// One writer at a time, for the rest of the transaction.
pub(crate) fn lock() -> Statement<()> {
    Statement::new(
        SqlText::new("LOCK TABLE \"public\".\"cohort_journal\" IN EXCLUSIVE MODE"),
        (),
    )
}

/// The last entry's line.
pub(crate) fn last() -> Statement<()> {
    Statement::new(
        SqlText::new("SELECT entry FROM \"public\".\"cohort_journal\" ORDER BY seq DESC LIMIT 1"),
        (),
    )
}

/// Appends an entry: `$1` its place, `$2` its line.
pub(crate) fn append(seq: i64, line: String) -> Statement<(i64, String)> {
    Statement::new(
        SqlText::new("INSERT INTO \"public\".\"cohort_journal\" (seq, entry) VALUES ($1, $2)"),
        (seq, line),
    )
}

/// Whether the table exists yet.
pub(crate) fn exists() -> Statement<(&'static str,)> {
    Statement::new(
        SqlText::new("SELECT pg_catalog.to_regclass($1) IS NOT NULL"),
        (TABLE,),
    )
}

/// Every entry's line, in order.
pub(crate) fn all() -> Statement<()> {
    Statement::new(
        SqlText::new("SELECT entry FROM \"public\".\"cohort_journal\" ORDER BY seq"),
        (),
    )
}

/// Which database a connection is on, to tell the journal's server from
/// the retained database's: its name, its oid and when its server started.
pub(crate) fn identity() -> Statement<()> {
    Statement::new(
        SqlText::new(
            "SELECT pg_catalog.current_database()::text, \
             (SELECT d.oid::int8 FROM pg_catalog.pg_database d \
              WHERE d.datname = pg_catalog.current_database()), \
             pg_catalog.pg_postmaster_start_time()",
        ),
        (),
    )
}

/// The server's clock now (entries are dated on the retained database's
/// clock, the one its rows are written by).
pub(crate) fn clock() -> Statement<()> {
    Statement::new(SqlText::new("SELECT pg_catalog.clock_timestamp()"), ())
}

/// The server's system identifier (`pg_control_system()`), as text.
pub(crate) fn system_identifier() -> Statement<()> {
    Statement::new(
        SqlText::new("SELECT s.system_identifier::text FROM pg_catalog.pg_control_system() s"),
        (),
    )
}
