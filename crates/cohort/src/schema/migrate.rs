//! Versioned migrations for Cohort's tables, parameterised by schema.
//!
//! The SQL is fixed text in which table placeholders become quoted,
//! schema-qualified names ([`migrations`]); hosts can feed it to their own
//! migration tool, or call [`migrate`] (what `cohort migrate` does). The
//! installed version is recorded as the comment of `sweep_run`, so no sixth
//! table is needed. Runtime code never runs DDL.

use sqlx::{Connection, PgConnection};

use crate::base::ident::check_schema_name;
use crate::base::ident::{from_template, SqlText};
use crate::error::{Error, Problems, Result};
use crate::sql::schema as statements;
use crate::sql::tables::{CohortTable, MOVED_COMMENT, SCHEMA_VERSION, VERSION_COMMENT_PREFIX};

/// One versioned migration, rendered for a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The version this migration brings the schema to.
    pub version: u32,
    /// A short name (`cohort_tables`).
    pub name: &'static str,
    /// The SQL, with every table name quoted and schema-qualified.
    pub sql: String,
}

/// Released migrations are never edited: a new version appends one
/// (a test pins each released file's checksum).
const SOURCES: &[(u32, &str, &str)] = &[
    (
        1,
        "cohort_tables",
        include_str!("../../migrations/0001_cohort_tables.sql"),
    ),
    (
        2,
        "kept_counts",
        include_str!("../../migrations/0002_kept_counts.sql"),
    ),
    (
        3,
        "structured_failures",
        include_str!("../../migrations/0003_structured_failures.sql"),
    ),
    (
        4,
        "worker",
        include_str!("../../migrations/0004_worker.sql"),
    ),
    (
        5,
        "peers_and_order",
        include_str!("../../migrations/0005_peers_and_order.sql"),
    ),
    (
        6,
        "skipped_rows",
        include_str!("../../migrations/0006_skipped_rows.sql"),
    ),
    (
        7,
        "erasure_subject_kind",
        include_str!("../../migrations/0007_erasure_subject_kind.sql"),
    ),
    (
        8,
        "subject_holds",
        include_str!("../../migrations/0008_subject_holds.sql"),
    ),
    (
        9,
        "archive_strategy",
        include_str!("../../migrations/0009_archive_strategy.sql"),
    ),
    (
        10,
        "shared_occurrences",
        include_str!("../../migrations/0010_shared_occurrences.sql"),
    ),
    (
        11,
        "batch_size",
        include_str!("../../migrations/0011_batch_size.sql"),
    ),
    (
        12,
        "hold_writers",
        concat!(
            include_str!("../../migrations/0012_hold_writers.sql"),
            include_str!("../../migrations/0012_hold_functions.sql")
        ),
    ),
    (
        13,
        "hold_guard",
        concat!(
            include_str!("../../migrations/0013_hold_guard.sql"),
            include_str!("../../migrations/0013_hold_functions.sql")
        ),
    ),
    (
        14,
        "summary_note",
        include_str!("../../migrations/0014_summary_note.sql"),
    ),
    (
        15,
        "detail_writes",
        include_str!("../../migrations/0015_detail_writes.sql"),
    ),
    (
        16,
        "table_health",
        include_str!("../../migrations/0016_table_health.sql"),
    ),
    (
        17,
        "pacing",
        include_str!("../../migrations/0017_pacing.sql"),
    ),
    (
        18,
        "erasure_requests",
        include_str!("../../migrations/0018_erasure_requests.sql"),
    ),
    (
        19,
        "ledger_chain",
        include_str!("../../migrations/0019_ledger_chain.sql"),
    ),
    (
        20,
        "hold_reach",
        concat!(
            include_str!("../../migrations/0020_hold_reach.sql"),
            include_str!("../../migrations/0020_hold_functions.sql")
        ),
    ),
];

/// The hold functions and triggers as versions 13 and 20 installed them,
/// run again where the tables move to (see [`super::relocate`]). A later
/// version that changes them appends a migration and adds its file here.
pub(crate) const HOLD_FUNCTIONS: &str = concat!(
    include_str!("../../migrations/0013_hold_functions.sql"),
    include_str!("../../migrations/0020_hold_functions.sql")
);

/// Cohort's functions, by the name their placeholders use.
pub(crate) const FUNCTIONS: [&str; 4] = [
    "retention_hold_stamp",
    "retention_hold_reach",
    "retention_hold_recent",
    "retention_archive_check",
];

/// Indexes a migration names (to drop them), by the name their
/// placeholders use.
const INDEXES: [&str; 2] = [
    "sweep_run_row_detail_run_idx",
    "sweep_run_row_detail_record_idx",
];

pub(crate) fn render(template: &'static str, schema: &str) -> SqlText {
    let tables: Vec<(&str, crate::base::ident::QualifiedName)> = CohortTable::ALL
        .iter()
        .map(|t| (t.name(), t.qualified(schema)))
        .chain(
            FUNCTIONS
                .iter()
                .chain(INDEXES.iter())
                .map(|f| (*f, crate::base::ident::QualifiedName::new(schema, *f))),
        )
        .collect();
    from_template(template, &tables)
}

/// Every migration, rendered for `schema`, in order. The last one's version
/// is [`SCHEMA_VERSION`].
///
/// ```
/// let all = cohort::schema::migrations("retention").unwrap();
/// assert_eq!(all.last().unwrap().version, cohort::schema::SCHEMA_VERSION);
/// assert!(all[0].sql.contains("CREATE TABLE \"retention\".\"sweep_run\""));
/// ```
pub fn migrations(schema: &str) -> Result<Vec<Migration>> {
    check_schema_name(schema)
        .map_err(|e| Error::Config(Problems::one(format!("schema name: {e}"))))?;
    Ok(SOURCES
        .iter()
        .map(|(version, name, sql)| Migration {
            version: *version,
            name,
            sql: render(sql, schema).as_str().to_owned(),
        })
        .collect())
}

/// Cohort's migrations as a [`sqlx::migrate::Migrator`], for applications
/// that run `sqlx migrate`: the same SQL as [`migrate`], versions 1 to
/// [`SCHEMA_VERSION`], recorded in a history table of their own,
/// `"<schema>"."_cohort_sqlx_migrations"`, so their versions never collide
/// with the application's migrations. The migrator creates the schema.
/// Run it beside your own:
///
/// ```no_run
/// # async fn f(pool: cohort::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// // sqlx::migrate!().run(&pool).await?;   // the application's own
/// cohort::schema::sqlx_migrator("retention")?.run(&pool).await?;
/// # Ok(()) }
/// ```
///
/// A schema already installed by [`migrate`] (or `cohort migrate`) has no
/// sqlx history yet: mark its versions applied once, without running them,
/// with `migrator.skip(&pool, Some(installed))`, where `installed` is
/// [`installed_version`].
pub fn sqlx_migrator(schema: &str) -> Result<sqlx::migrate::Migrator> {
    use sqlx::SqlSafeStr;
    let all = migrations(schema)?
        .into_iter()
        .map(|m| {
            sqlx::migrate::Migration::new(
                i64::from(m.version),
                format!("cohort {}", m.name).into(),
                sqlx::migrate::MigrationType::Simple,
                sqlx::AssertSqlSafe(m.sql).into_sql_str(),
                false,
            )
        })
        .collect();
    let mut migrator = sqlx::migrate::Migrator::with_migrations(all);
    let mut quoted = SqlText::default();
    quoted.ident(schema);
    migrator.create_schema(quoted.as_str().to_owned());
    let mut table = SqlText::default();
    table
        .ident(schema)
        .push(".")
        .ident("_cohort_sqlx_migrations");
    migrator.dangerous_set_table_name(table.as_str().to_owned());
    Ok(migrator)
}

/// The Cohort schema version installed in `schema`: `Ok(None)` when
/// `sweep_run` does not exist there; an error when it exists without a
/// version comment (created by hand or by something else).
pub async fn installed_version(conn: &mut PgConnection, schema: &str) -> Result<Option<u32>> {
    let row: Option<Option<String>> = statements::installed_comment(schema.to_owned())
        .query_scalar()
        .fetch_optional(&mut *conn)
        .await?;
    let Some(comment) = row else { return Ok(None) };
    if comment.as_deref() == Some(MOVED_COMMENT) {
        let to: Option<String> = statements::moved_to(schema)
            .query_scalar()
            .fetch_optional(&mut *conn)
            .await?;
        return Err(moved(schema, to.as_deref()));
    }
    version_of(schema, comment).map(Some)
}

/// The error for a schema whose tables were moved away.
fn moved(schema: &str, to: Option<&str>) -> Error {
    Error::Migration(format!(
        "Cohort's tables were moved out of schema {schema:?}{}: set `schema` to where they are \
         (a process configured with the old schema must not start an empty ledger)",
        to.map(|t| format!(" to {t:?}")).unwrap_or_default()
    ))
}

/// The version a found `sweep_run`'s comment records.
fn version_of(schema: &str, comment: Option<String>) -> Result<u32> {
    if comment.as_deref() == Some(MOVED_COMMENT) {
        return Err(moved(schema, None));
    }
    parse_version_comment(comment.as_deref()).ok_or_else(|| {
        Error::Migration(format!(
            "{}.sweep_run exists but carries no Cohort schema version (comment {:?}); \
             it was not created by Cohort's migrations",
            schema, comment
        ))
    })
}

/// What any migration runner (sqlx's connection, a SeaORM connection)
/// does, step by step, for one schema.
pub(crate) struct MigrationPlan {
    schema: String,
}

impl MigrationPlan {
    /// Checks the schema name.
    pub(crate) fn new(schema: &str) -> Result<Self> {
        check_schema_name(schema)
            .map_err(|e| Error::Config(Problems::one(format!("schema name: {e}"))))?;
        Ok(Self {
            schema: schema.to_owned(),
        })
    }

    /// The installed version from what [`installed_comment`](crate::sql::schema::installed_comment) returned:
    /// no row (`None`) is 0; a version newer than this build is refused.
    pub(crate) fn version_from(&self, found: Option<Option<String>>) -> Result<u32> {
        let from = match found {
            None => 0,
            Some(comment) => version_of(&self.schema, comment)?,
        };
        if from > SCHEMA_VERSION {
            return Err(Error::Migration(format!(
                "schema {:?} is at Cohort schema version {from}, newer than this build's {SCHEMA_VERSION}; upgrade Cohort",
                self.schema
            )));
        }
        Ok(from)
    }

    /// The migrations after `from`, rendered.
    pub(crate) fn pending(&self, from: u32) -> impl Iterator<Item = Migration> + '_ {
        SOURCES
            .iter()
            .filter(move |(v, _, _)| *v > from)
            .map(|(version, name, template)| Migration {
                version: *version,
                name,
                sql: render(template, &self.schema).as_str().to_owned(),
            })
    }

    /// The report of a run that found `from` and applied `applied`.
    pub(crate) fn report(&self, from: u32, applied: Vec<u32>) -> MigrationReport {
        MigrationReport {
            schema: self.schema.clone(),
            from_version: from,
            to_version: SCHEMA_VERSION,
            applied,
        }
    }
}

pub(crate) fn parse_version_comment(comment: Option<&str>) -> Option<u32> {
    comment?
        .strip_prefix(VERSION_COMMENT_PREFIX)?
        .trim()
        .parse()
        .ok()
}

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MigrationReport {
    /// The schema migrated.
    pub schema: String,
    /// The version found (0 when Cohort was not installed).
    pub from_version: u32,
    /// The version now installed.
    pub to_version: u32,
    /// The migrations applied, by version.
    pub applied: Vec<u32>,
}

/// Brings Cohort's tables in `schema` to [`SCHEMA_VERSION`]: creates the
/// schema if needed and applies every pending migration in one transaction
/// under an advisory lock, so concurrent callers apply them once. A newer
/// schema than this code knows is refused.
pub async fn migrate(conn: &mut PgConnection, schema: &str) -> Result<MigrationReport> {
    let plan = MigrationPlan::new(schema)?;
    let mut tx = conn.begin().await?;
    // A failure rolls back at once, releasing the lock, rather than when
    // the connection is next used.
    match apply(&mut tx, &plan, schema).await {
        Ok(report) => {
            tx.commit().await?;
            Ok(report)
        }
        Err(e) => {
            tx.rollback().await?;
            Err(e)
        }
    }
}

async fn apply(
    tx: &mut PgConnection,
    plan: &MigrationPlan,
    schema: &str,
) -> Result<MigrationReport> {
    crate::sql::locks::xact_lock(crate::base::locks::LockKey::Migrate(schema))
        .query()
        .execute(&mut *tx)
        .await?;
    statements::create_schema(schema)
        .raw()
        .execute(&mut *tx)
        .await?;
    let found: Option<Option<String>> = statements::installed_comment(schema.to_owned())
        .query_scalar()
        .fetch_optional(&mut *tx)
        .await?;
    let from = plan.version_from(found)?;
    let mut applied = Vec::new();
    for m in plan.pending(from) {
        // A migration's own file (crates/cohort/migrations/), rendered for
        // the schema through `ident::from_template`, run as written: the
        // one statement kept outside sql/.
        sqlx::raw_sql(sqlx::AssertSqlSafe(m.sql))
            .execute(&mut *tx)
            .await
            .map_err(|e| {
                Error::Migration(format!("migration {} ({}) failed: {e}", m.version, m.name))
            })?;
        applied.push(m.version);
    }
    if applied.is_empty() {
        // Already current: the hold triggers and their functions are made
        // again as the newest version has them, which puts back any that
        // were dropped, disabled or replaced (what startup validation
        // tells the operator to run). Idempotent when nothing changed.
        let functions = render(HOLD_FUNCTIONS, schema);
        sqlx::raw_sql(sqlx::AssertSqlSafe(functions.as_str().to_owned()))
            .execute(&mut *tx)
            .await
            .map_err(|e| Error::Migration(format!("reinstalling the hold triggers failed: {e}")))?;
    }
    Ok(plan.report(from, applied))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_comment_parsing() {
        assert_eq!(
            parse_version_comment(Some("cohort schema version 1")),
            Some(1)
        );
        assert_eq!(
            parse_version_comment(Some("cohort schema version 12 ")),
            Some(12)
        );
        assert_eq!(parse_version_comment(Some("my table")), None);
        assert_eq!(parse_version_comment(None), None);
    }

    #[test]
    fn migrations_are_fully_qualified() {
        let all = migrations("ret\"ention").unwrap();
        let sql: String = all.iter().map(|m| m.sql.as_str()).collect();
        for t in CohortTable::ALL {
            assert!(
                !sql.contains(&format!("{{{}}}", t.name())),
                "unreplaced placeholder"
            );
            assert!(
                sql.contains(&format!("\"ret\"\"ention\".\"{}\"", t.name())),
                "{}",
                t.name()
            );
        }
        assert!(migrations("").is_err());
    }
}
