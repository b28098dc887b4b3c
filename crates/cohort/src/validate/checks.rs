//! The checks of the server and Cohort's own tables (SPEC §4's first
//! checks: a supported PostgreSQL, the schema at this build's version, the
//! hold triggers in force), and of the sweep parallelism against the pool,
//! as pure functions over a catalog snapshot. Each returns problems;
//! nothing here does I/O. The checks of entities are in `entity`, `keys`,
//! `anonymise` and `foreign_keys`, the advice in `advice`.

use super::catalog::{ServerInfo, TableInfo};
use crate::base::ident::QualifiedName;
use crate::domain::model::EntityDescriptor;
use crate::error::Problem;
use crate::schema::{CohortTable, SCHEMA_VERSION};

/// The oldest PostgreSQL Cohort supports (13).
pub const MIN_SERVER_VERSION_NUM: i32 = 130_000;

/// Rejects anything but PostgreSQL 13 or newer.
pub(crate) fn check_server(server: &ServerInfo) -> Vec<Problem> {
    let mut problems = Vec::new();
    if !server.version.starts_with("PostgreSQL ")
        || ["CockroachDB", "Redshift", "Greenplum", "YugabyteDB"]
            .iter()
            .any(|fork| server.version.contains(fork))
    {
        problems.push(Problem::global(format!(
            "the server is not a supported PostgreSQL (it reports {:?}); Cohort needs PostgreSQL 13 or newer",
            server.version
        )));
    } else if server.version_num < MIN_SERVER_VERSION_NUM {
        problems.push(Problem::global(format!(
            "PostgreSQL {}.{} is too old; Cohort needs PostgreSQL 13 or newer",
            server.version_num / 10_000,
            server.version_num % 10_000
        )));
    }
    problems
}

/// Checks that Cohort's tables exist in `schema` with the contracted
/// columns and the current version.
pub(crate) fn check_cohort_schema(
    schema: &str,
    tables: &[(CohortTable, Option<TableInfo>)],
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let missing: Vec<&str> = tables
        .iter()
        .filter(|(_, info)| info.is_none())
        .map(|(t, _)| t.name())
        .collect();
    if missing.len() == tables.len() {
        return vec![Problem::global(format!(
            "Cohort's tables are not installed in schema {schema:?}; run `cohort migrate` (or apply cohort::schema::migrations) first"
        ))];
    }
    for name in &missing {
        problems.push(Problem::global(format!(
            "Cohort table {schema}.{name} is missing; the Cohort schema is incomplete, run `cohort migrate`"
        )));
    }
    for (table, info) in tables {
        let Some(info) = info else { continue };
        if !matches!(info.relkind.as_str(), "r" | "p") {
            problems.push(Problem::global(format!(
                "{schema}.{} is not a table",
                table.name()
            )));
            continue;
        }
        for expected in table.columns() {
            match info.column(expected.name) {
                None => problems.push(Problem::global(format!(
                    "Cohort table {schema}.{} lacks column {:?}; the Cohort schema is old or incomplete, run `cohort migrate`",
                    table.name(),
                    expected.name
                ))),
                Some(actual) if actual.display_type != expected.sql_type => {
                    problems.push(Problem::global(format!(
                        "Cohort column {schema}.{}.{} is {} but must be {}",
                        table.name(),
                        expected.name,
                        actual.display_type,
                        expected.sql_type
                    )))
                }
                Some(actual) if actual.not_null == expected.nullable => {
                    problems.push(Problem::global(format!(
                        "Cohort column {schema}.{}.{} must be {}",
                        table.name(),
                        expected.name,
                        if expected.nullable { "nullable" } else { "NOT NULL" }
                    )))
                }
                Some(_) => {}
            }
        }
        if *table == CohortTable::SweepRun {
            match crate::schema::parse_version_comment(info.comment.as_deref()) {
                Some(v) if v == SCHEMA_VERSION => {}
                Some(v) if v < SCHEMA_VERSION => problems.push(Problem::global(format!(
                    "the Cohort schema in {schema:?} is version {v}, older than this build's {SCHEMA_VERSION}; run `cohort migrate`"
                ))),
                Some(v) => problems.push(Problem::global(format!(
                    "the Cohort schema in {schema:?} is version {v}, newer than this build's {SCHEMA_VERSION}; upgrade Cohort"
                ))),
                None if info.comment.as_deref() == Some(crate::schema::MOVED_COMMENT) => {
                    problems.push(Problem::global(format!(
                        "Cohort's tables were moved out of schema {schema:?} (see {schema}.sweep_run.moved_to): set `schema` to where they are now"
                    )))
                }
                None => problems.push(Problem::global(format!(
                    "{schema}.sweep_run carries no Cohort schema version; it was not created by Cohort's migrations"
                ))),
            }
        }
    }
    problems
}

/// Checks that the trigger stamping `retention_hold.written_xid` fires for
/// every writer (`ENABLE ALWAYS`): a sweep batch finds the holds written
/// while it ran by that stamp, and a hold written while the trigger did
/// not fire (disabled, or under `session_replication_role = replica`
/// while enabled only for origin) would carry an old one. Every process
/// validates at startup, so a database where the check cannot see every
/// hold is refused with the statement that fixes it. (A batch that finds
/// the trigger changed since its snapshot trusts no stamp either: see
/// `migrations/0013_hold_functions.sql`.)
pub(crate) fn check_hold_stamp_trigger(
    schema: &str,
    trigger: Option<&super::catalog::StampTrigger>,
) -> Vec<Problem> {
    let table = CohortTable::Hold.qualified(schema);
    let function = QualifiedName::new(schema, "retention_hold_stamp");
    let fix = format!(
        "ALTER TABLE {table} ENABLE ALWAYS TRIGGER retention_hold_stamp;",
        table = table
    );
    // FOR EACH ROW (1), BEFORE (2), INSERT (4), UPDATE (16).
    const ROW_BEFORE_INSERT_OR_UPDATE: i32 = 1 | 2 | 4 | 16;
    let stamps = trigger.is_some_and(|t| {
        t.tgtype == ROW_BEFORE_INSERT_OR_UPDATE
            && t.source
                .contains("NEW.written_xid := pg_catalog.pg_current_xact_id();")
    });
    if trigger.is_some() && !stamps {
        return vec![Problem::global(format!(
            "the trigger retention_hold_stamp on {} no longer stamps written_xid before every insert and update \
             (it or its function {} was changed): a batch could miss holds written while it runs; restore both with \
             `CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp \
             AS $$ BEGIN NEW.written_xid := pg_catalog.pg_current_xact_id(); RETURN NEW; END $$; \
             DROP TRIGGER retention_hold_stamp ON {table}; CREATE TRIGGER retention_hold_stamp BEFORE INSERT OR UPDATE ON \
             {table} FOR EACH ROW EXECUTE FUNCTION {function}(); {fix}`",
            table.display_plain(),
            function.display_plain(),
        ))];
    }
    let why = match trigger.map(|t| t.enabled.as_str()) {
        Some("A") => return Vec::new(),
        None => format!(
            "the trigger retention_hold_stamp on {} is missing: holds written now would not be \
             seen by a batch already running, which could delete held rows; recreate it with \
             `CREATE TRIGGER retention_hold_stamp BEFORE INSERT OR UPDATE ON {table} FOR EACH ROW \
             EXECUTE FUNCTION {}(); {fix}`",
            table.display_plain(),
            QualifiedName::new(schema, "retention_hold_stamp"),
        ),
        Some("D") => format!(
            "the trigger retention_hold_stamp on {} is disabled: holds written now would not be \
             seen by a batch already running, which could delete held rows; enable it with `{fix}`",
            table.display_plain()
        ),
        Some(mode) => format!(
            "the trigger retention_hold_stamp on {} fires only {} (tgenabled {mode:?}): holds \
             written {} would not be seen by a batch already running, which could delete held \
             rows; make it fire always with `{fix}`",
            table.display_plain(),
            if mode == "R" {
                "under session_replication_role = replica"
            } else {
                "outside session_replication_role = replica"
            },
            if mode == "R" {
                "by ordinary sessions"
            } else {
                "by replica-role writers (pg_restore --disable-triggers, logical replication)"
            },
        ),
    };
    vec![Problem::global(why)]
}

/// The reach triggers' function body as version 20 installed it (the
/// text between `AS $reach$` and `$reach$` in
/// `migrations/0020_hold_functions.sql`). The batch's recent-hold check
/// compares the function with the md5 of the same text.
fn reach_source() -> &'static str {
    const FILE: &str = include_str!("../../migrations/0020_hold_functions.sql");
    const OPEN: &str = "AS $reach$";
    let start = FILE.find(OPEN).map_or(0, |i| i + OPEN.len());
    let len = FILE[start..].find("$reach$").unwrap_or(0);
    &FILE[start..start + len]
}

/// Checks that the triggers keeping a hold's reach (RS-042) are in force:
/// `retention_hold_reach` before every update and delete of a hold row,
/// `retention_hold_reach_truncate` before a truncate, both firing always
/// and running Cohort's function unchanged. Without them a writer could
/// narrow a hold (another subject, an earlier expiry) and the next batch
/// would delete what it kept; every batch also refuses to run without
/// them (see `migrations/0020_hold_functions.sql`).
pub(crate) fn check_hold_reach_triggers(
    schema: &str,
    row: Option<&super::catalog::StampTrigger>,
    truncate: Option<&super::catalog::StampTrigger>,
) -> Vec<Problem> {
    let table = CohortTable::Hold.qualified(schema);
    let function = QualifiedName::new(schema, "retention_hold_reach");
    // FOR EACH ROW (1), BEFORE (2), DELETE (8), UPDATE (16); TRUNCATE (32)
    // is a statement trigger (no ROW bit).
    const ROW_BEFORE_UPDATE_OR_DELETE: i32 = 1 | 2 | 8 | 16;
    const BEFORE_TRUNCATE: i32 = 2 | 32;
    let ours = |t: &super::catalog::StampTrigger, tgtype: i32| {
        t.tgtype == tgtype && t.source == reach_source()
    };
    let mut problems = Vec::new();
    for (name, trigger, tgtype) in [
        ("retention_hold_reach", row, ROW_BEFORE_UPDATE_OR_DELETE),
        ("retention_hold_reach_truncate", truncate, BEFORE_TRUNCATE),
    ] {
        let (table, function) = (table.display_plain(), function.display_plain());
        let message = match trigger {
            None => format!(
                "the trigger {name} on {table} is missing: a hold's reach (its subject, record, tenant, expiry) \
                 could be narrowed in place and a sweep would then delete rows it keeps; no batch runs until \
                 `cohort migrate` makes it again (with its function {function})"
            ),
            Some(t) if !ours(t, tgtype) => format!(
                "the trigger {name} on {table} or its function {function} is not the one Cohort installed: a hold's \
                 reach could be narrowed in place and a sweep would then delete rows it keeps; no batch runs until \
                 `cohort migrate` makes both again"
            ),
            Some(t) if t.enabled != "A" => format!(
                "the trigger {name} on {table} does not fire always (it was disabled, or enabled only for some \
                 sessions): a hold's reach could be narrowed in place and a sweep would then delete rows it keeps; \
                 no batch runs until `cohort migrate` enables it again"
            ),
            Some(_) => continue,
        };
        problems.push(Problem::global(message));
    }
    problems
}

/// Each entity's sweep parallelism (its own, else the global setting)
/// within `1..=64` and within what the pool can serve: a run holds its
/// run-lock connection, which sweeps the first key range, so `n` ranges
/// need `n` connections of the pool (the others are taken for the entity
/// and given back after it). Problems name the setting and where it was set.
pub(crate) fn check_sweep_parallelism(
    entities: &[EntityDescriptor],
    global: u32,
    pool_max: u32,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let too_many = |n: u32| {
        format!(
            "{n} needs {n} connections at once (the run's own and {} more), but the pool allows {pool_max}: lower it or enlarge the pool",
            n - 1
        )
    };
    if crate::config::check_sweep_parallelism(global).is_ok() && global > pool_max {
        problems.push(Problem::global(format!(
            "sweep_parallelism = {}",
            too_many(global)
        )));
    }
    for e in entities {
        let Some(n) = e.sweep_parallelism else {
            continue;
        };
        match crate::config::check_sweep_parallelism(n) {
            Err(why) => problems.push(Problem::entity(
                &e.name,
                format!("sweep_parallelism = {why}"),
            )),
            Ok(()) if n > pool_max => problems.push(Problem::entity(
                &e.name,
                format!("sweep_parallelism = {}", too_many(n)),
            )),
            Ok(()) => {}
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_parallelism_table() {
        let entity = |n: Option<u32>| {
            let mut d = crate::domain::model::EntityDeclaration::new(
                "Note",
                "a3f467fe-c5d0-4f17-9897-83c373cc1dc8",
            )
            .category("notes")
            .anchor("created_at")
            .table("app.notes")
            .tenantless();
            if let Some(n) = n {
                d = d.sweep_parallelism(n);
            }
            let columns = ["id", "created_at"].map(String::from);
            match crate::domain::model::resolve(
                &d,
                &crate::domain::model::Conventions::default(),
                "public",
                &columns,
            ) {
                Ok(crate::domain::model::Resolved::Retained(e)) => *e,
                other => panic!("{other:?}"),
            }
        };
        // (entity's own, global, pool max, problems)
        let cases = [
            (None, 1, 1, 0),
            (None, 4, 4, 0),
            (None, 5, 4, 1),
            (Some(4), 1, 4, 0),
            (Some(5), 1, 4, 1),
            (Some(0), 1, 8, 1),
            (Some(65), 1, 100, 1),
            (Some(2), 9, 8, 1),
        ];
        for (own, global, pool, expected) in cases {
            let problems = check_sweep_parallelism(&[entity(own)], global, pool);
            assert_eq!(
                problems.len(),
                expected,
                "{own:?} {global} {pool}: {problems:?}"
            );
            for p in &problems {
                assert!(p.message.starts_with("sweep_parallelism = "), "{p}");
            }
        }
    }

    #[test]
    fn server_check_table() {
        let cases = [
            (
                "PostgreSQL 15.18 (Debian 15.18-0+deb12u1) on x86_64",
                150018,
                true,
            ),
            ("PostgreSQL 13.0 on x86_64", 130000, true),
            ("PostgreSQL 12.9 on x86_64", 120009, false),
            ("CockroachDB CCL v23.1.0", 130000, false),
            (
                "PostgreSQL 8.0.2 on i686-pc-linux-gnu, compiled by GCC, Redshift 1.0.1",
                80002,
                false,
            ),
        ];
        for (version, num, ok) in cases {
            let problems = check_server(&ServerInfo {
                version_num: num,
                version: version.into(),
            });
            assert_eq!(problems.is_empty(), ok, "{version}: {problems:?}");
        }
    }
}
