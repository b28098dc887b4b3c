//! Statements of installing and moving Cohort's own tables: the installed
//! version, the migration lock, creating the schema, and each step of a
//! move (what the target holds, what is still running, the `SET SCHEMA`
//! of each table, the marker left behind, sqlx's checksums).

use uuid::Uuid;

use super::statement::{Args, Params, Statement};
use crate::base::ident::{QualifiedName, SqlText};
use crate::sql::tables::{CohortTable, MOVED_COMMENT};

/// The comment of `sweep_run` in `schema` (column `comment`): a version
/// comment, the move marker's, or none; no row when there is no such table.
pub(crate) fn installed_comment(schema: String) -> Statement<(String, &'static str)> {
    let sql = SqlText::new(
        "SELECT pg_catalog.obj_description(c.oid, 'pg_class') AS comment \
         FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
    );
    Statement::new(sql, (schema, CohortTable::SweepRun.name()))
}

/// Where a move marker says the tables went (column `moved_to`).
pub(crate) fn moved_to(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("SELECT moved_to FROM ");
    sql.table(&CohortTable::SweepRun.qualified(schema));
    Statement::new(sql, ())
}

/// `CREATE SCHEMA IF NOT EXISTS "schema"`.
pub(crate) fn create_schema(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("CREATE SCHEMA IF NOT EXISTS ");
    sql.ident(schema);
    Statement::new(sql, ())
}

/// Which of `names` are relations in `schema` (column `relname`, sorted).
pub(crate) fn taken(schema: String, names: Vec<String>) -> Statement<(String, Vec<String>)> {
    let sql = SqlText::new(
        "SELECT c.relname::text FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = ANY($2::text[]) ORDER BY 1",
    );
    Statement::new(sql, (schema, names))
}

/// Which of `names` are tables in `schema` (column `relname`).
pub(crate) fn present(schema: String, names: Vec<String>) -> Statement<(String, Vec<String>)> {
    let sql = SqlText::new(
        "SELECT c.relname::text FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = ANY($2::text[]) AND c.relkind IN ('r', 'p')",
    );
    Statement::new(sql, (schema, names))
}

/// Drops a table left behind by an earlier move.
pub(crate) fn drop_table(table: &QualifiedName) -> Statement<()> {
    let mut sql = SqlText::new("DROP TABLE ");
    sql.table(table);
    Statement::new(sql, ())
}

/// Keeps runs and deliveries from starting in `schema` until the move
/// commits.
pub(crate) fn lock_ledger(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("LOCK TABLE ");
    sql.table(&CohortTable::SweepRun.qualified(schema))
        .push(", ")
        .table(&CohortTable::HandlerStatus.qualified(schema))
        .push(" IN SHARE ROW EXCLUSIVE MODE");
    Statement::new(sql, ())
}

/// Runs still `started` (column `run_id`).
pub(crate) fn started_runs(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("SELECT run_id FROM ");
    sql.table(&CohortTable::SweepRun.qualified(schema))
        .push(" WHERE status = 'started'");
    Statement::new(sql, ())
}

/// Takes a run's lock for the transaction if it is free (one boolean):
/// a `started` run whose lock is free lost its process.
pub(crate) fn try_run_lock(run_id: Uuid) -> Statement<(String,)> {
    let sql = SqlText::new(
        "SELECT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended($1, 0))",
    );
    Statement::new(sql, (crate::base::locks::LockKey::Run(run_id).text(),))
}

/// Deliveries in flight whose claim has not expired (one count).
pub(crate) fn open_deliveries(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("SELECT pg_catalog.count(*) FROM ");
    sql.table(&CohortTable::HandlerStatus.qualified(schema))
        .push(" WHERE status = 'in_flight' AND claim_expires_at > pg_catalog.now()");
    Statement::new(sql, ())
}

/// Moves one table to schema `to`.
pub(crate) fn set_schema(table: &QualifiedName, to: &str) -> Statement<()> {
    let mut sql = SqlText::new("ALTER TABLE ");
    sql.table(table).push(" SET SCHEMA ").ident(to);
    Statement::new(sql, ())
}

/// Drops the hold functions a move left behind in `schema` (the trigger
/// on the moved table already calls the new schema's own).
pub(crate) fn drop_hold_functions(schema: &str) -> Statement<()> {
    let mut sql = SqlText::new("DROP FUNCTION IF EXISTS ");
    sql.table(&QualifiedName::new(schema, "retention_hold_stamp"))
        .push("(), ")
        .table(&QualifiedName::new(schema, "retention_hold_reach"))
        .push("(), ")
        .table(&QualifiedName::new(schema, "retention_hold_recent"))
        .push("(uuid, pg_snapshot, int8), ")
        .table(&QualifiedName::new(schema, "retention_archive_check"))
        .push("(int8, int8, int8)");
    Statement::new(sql, ())
}

/// The marker `sweep_run` a move leaves in the old schema.
pub(crate) fn create_marker(marker: &QualifiedName) -> Statement<()> {
    let mut sql = SqlText::new("CREATE TABLE ");
    sql.table(marker)
        .push(" (moved_to text NOT NULL, moved_at timestamptz NOT NULL DEFAULT pg_catalog.now())");
    Statement::new(sql, ())
}

/// Records where the tables went.
pub(crate) fn insert_marker(marker: &QualifiedName, to: String) -> Statement<(String,)> {
    let mut sql = SqlText::new("INSERT INTO ");
    sql.table(marker).push(" (moved_to) VALUES ($1)");
    Statement::new(sql, (to,))
}

/// Marks the marker as one, for every later process to recognise.
pub(crate) fn comment_marker(marker: &QualifiedName) -> Statement<()> {
    let mut sql = SqlText::new("COMMENT ON TABLE ");
    sql.table(marker)
        .push(" IS '")
        .push(MOVED_COMMENT)
        .push("'");
    Statement::new(sql, ())
}

/// A table's row count.
pub(crate) fn count_rows(table: &QualifiedName) -> Statement<()> {
    let mut sql = SqlText::new("SELECT pg_catalog.count(*) FROM ");
    sql.table(table);
    Statement::new(sql, ())
}

/// One migration's checksum in sqlx's history, rewritten for the new
/// schema where it is still the old one.
#[derive(Debug)]
pub(crate) struct Checksum {
    pub(crate) new: Vec<u8>,
    pub(crate) version: i64,
    pub(crate) old: Vec<u8>,
}

impl Params for Checksum {
    fn bind(self, q: Args) -> Args {
        q.bind(self.new).bind(self.version).bind(self.old)
    }
}

pub(crate) fn rewrite_checksum(history: &QualifiedName, p: Checksum) -> Statement<Checksum> {
    let mut sql = SqlText::new("UPDATE ");
    sql.table(history)
        .push(" SET checksum = $1 WHERE version = $2 AND checksum = $3");
    Statement::new(sql, p)
}
