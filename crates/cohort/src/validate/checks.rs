//! The checks of startup validation, as pure functions over a catalog
//! snapshot. Each returns problems; nothing here does I/O.
//!
//! Why one long file: it holds one concern, the list of
//! SPEC §4's checks in the order the spec gives them, each a short pure
//! function; split, the list would no longer read as the spec does.

use std::collections::BTreeMap;

use super::catalog::{CascadeEdge, ColumnInfo, ServerInfo, TableInfo};
use crate::base::ident::QualifiedName;
use crate::config::CohortConfig;
use crate::domain::model::{
    looks_like_tenant, AnonymiseMethod, AnonymisedColumn, EntityDescriptor, Marker,
};
use crate::domain::rules::{CategoryCapabilities, Strategy};
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

/// Column type families Cohort accepts per role (base `typname`s).
const TEXT_TYPES: &[&str] = &["text", "varchar", "bpchar", "citext"];
const KEY_TYPES: &[&str] = &[
    "uuid", "int2", "int4", "int8", "text", "varchar", "bpchar", "citext",
];

fn is_text(c: &ColumnInfo) -> bool {
    TEXT_TYPES.contains(&c.type_name.as_str())
}

/// PostgreSQL base types a declared Rust type can map to, when known.
fn pg_types_for_rust(rust_type: &str) -> Option<&'static [&'static str]> {
    let mut t: String = rust_type.chars().filter(|c| !c.is_whitespace()).collect();
    while let Some(inner) = t
        .strip_prefix("Option<")
        .or_else(|| t.strip_prefix("::std::option::Option<"))
        .or_else(|| t.strip_prefix("std::option::Option<"))
        .and_then(|s| s.strip_suffix('>'))
    {
        t = inner.to_owned();
    }
    let last = t.rsplit("::").next().unwrap_or(&t);
    let last = last.split('<').next().unwrap_or(last);
    Some(match last {
        "Uuid" => &["uuid"],
        "String" | "str" | "&str" => TEXT_TYPES,
        "i16" => &["int2"],
        "i32" => &["int4"],
        "i64" => &["int8"],
        "bool" => &["bool"],
        "f32" => &["float4"],
        "f64" => &["float8"],
        "DateTime" | "OffsetDateTime" => &["timestamptz"],
        "NaiveDateTime" | "PrimitiveDateTime" => &["timestamp"],
        "NaiveDate" | "Date" => &["date"],
        "Value" | "JsonValue" => &["json", "jsonb"],
        _ => return None,
    })
}

/// Why no anonymised-at marker resolved, with the fix that applies: a
/// derived type resolves markers among its own fields only, so when the
/// table has the column the fix is a field, not a column.
fn no_anonymised_at(entity: &EntityDescriptor, table: &TableInfo) -> String {
    let category = &entity.category;
    let column = table.column("anonymised_at").map(|c| c.name.as_str());
    match (entity.declared_columns.is_some(), column) {
        (true, Some(c)) => format!(
            "category {category:?} may anonymise, but the type has no field for the table's {c:?} column \
             (a derived type finds its markers among its own fields): add `{c}: Option<chrono::DateTime<chrono::Utc>>` \
             to the struct, or mark the field that holds it #[retain(anonymised_at)]"
        ),
        (true, None) => format!(
            "category {category:?} may anonymise, but no anonymised_at marker resolves: add an `anonymised_at` \
             timestamptz column to the table and a field for it to the struct, or mark an existing timestamp \
             field #[retain(anonymised_at)]"
        ),
        (false, _) => format!(
            "category {category:?} may anonymise, but no anonymised_at marker resolves: name its column with \
             `anonymised_at = \"column\"`, or add an `anonymised_at` timestamptz column"
        ),
    }
}

/// Markers whose constraints or defaults make them meaningless. A marker
/// says "this row was changed by Cohort, at this time": a NOT NULL
/// timestamp marker or one with a default is set on rows Cohort never
/// changed, so an anonymising category would find every row "already
/// anonymised" and report `anonymise 0` while the personal data stays,
/// and a stage measured from `deleted_at` would purge rows never soft
/// deleted; a soft-delete flag defaulting to true hides new rows the
/// same way. Checked for the strategies the category may use.
fn marker_problems(
    entity: &EntityDescriptor,
    table: &TableInfo,
    caps: &CategoryCapabilities,
) -> Vec<String> {
    let mut problems = Vec::new();
    let t = table.name.display_plain();
    let mut timestamps = Vec::new();
    if caps.allows(Strategy::SoftDelete) {
        timestamps.extend(entity.deleted_at.as_deref().map(|c| ("deleted_at", c)));
    }
    if caps.allows(Strategy::Anonymise) {
        timestamps.extend(
            entity
                .anonymised_at
                .as_deref()
                .map(|c| ("anonymised_at", c)),
        );
    }
    for (marker, column) in timestamps {
        let Some(col) = table.column(column) else {
            continue;
        };
        if col.not_null {
            problems.push(format!(
                "{marker} marker column {column:?} is NOT NULL: every row would carry a marker Cohort never wrote \
                 (rows it never changed would look done); allow NULL with `ALTER TABLE {t} ALTER COLUMN {} DROP NOT NULL`",
                crate::base::ident::quote_ident(column)
            ));
        }
        if col.has_default {
            problems.push(format!(
                "{marker} marker column {column:?} has a default ({}): new rows would carry a marker Cohort never wrote \
                 (they would look done); remove it with `ALTER TABLE {t} ALTER COLUMN {} DROP DEFAULT`",
                col.default_expr.as_deref().unwrap_or("?"),
                crate::base::ident::quote_ident(column)
            ));
        }
    }
    if caps.allows(Strategy::SoftDelete) {
        if let Some(col) = entity.soft_delete.as_deref().and_then(|c| table.column(c)) {
            if col
                .default_expr
                .as_deref()
                .is_some_and(|d| d.trim().eq_ignore_ascii_case("true"))
            {
                problems.push(format!(
                    "soft-delete flag column {:?} defaults to true: new rows would look soft deleted already; \
                     default it to false (`ALTER TABLE {t} ALTER COLUMN {} SET DEFAULT false`)",
                    col.name,
                    crate::base::ident::quote_ident(&col.name)
                ));
            }
        }
    }
    problems
}

/// The longest text a tenant id of `column`'s type renders as (a `uuid`
/// 36 characters, `int8` 20 with its sign, `varchar(n)` n); `None` for a
/// type that sets no bound (`text`, `citext`).
fn longest_tenant_id(column: &ColumnInfo) -> Option<usize> {
    match column.type_name.as_str() {
        "uuid" => Some(36),
        "int2" => Some(6),
        "int4" => Some(11),
        "int8" => Some(20),
        "varchar" | "bpchar" => column.max_chars.and_then(|n| usize::try_from(n).ok()),
        _ => None,
    }
}

/// Checks one resolved entity against its table and its category's capabilities.
pub(crate) fn check_entity(
    entity: &EntityDescriptor,
    table: &TableInfo,
    capabilities: Option<&CategoryCapabilities>,
    tenant_candidates: &[&str],
    known_categories: &[String],
) -> Vec<String> {
    let mut problems = Vec::new();
    check_relation(table, &mut problems);
    check_columns(entity, table, &mut problems);
    check_record_key(entity, table, capabilities, &mut problems);
    check_keys(entity, table, tenant_candidates, &mut problems);
    check_markers_and_anonymise(entity, table, &mut problems);
    check_declared_types(entity, table, &mut problems);
    check_strategies(entity, table, capabilities, known_categories, &mut problems);
    problems
}

/// The relation: a plain or partitioned table, not a partition, in no inheritance.
fn check_relation(table: &TableInfo, problems: &mut Vec<String>) {
    let t = table.name.display_plain();
    match table.relkind.as_str() {
        "r" | "p" => {}
        "v" | "m" => problems.push(format!("{t} is a view; Cohort retains rows of tables only")),
        other => problems.push(format!("{t} is not a table (relkind {other:?})")),
    }
    if table.is_partition {
        problems.push(format!(
            "{t} is a partition of another table; declare the partitioned parent table instead"
        ));
    } else if table.inherits || table.has_inheritance_children {
        problems.push(format!(
            "{t} takes part in table inheritance; Cohort mutates one independently owned table per entity and rejects inheritance hierarchies"
        ));
    }
}

/// Every column the entity uses exists, and its times are `timestamptz`.
fn check_columns(entity: &EntityDescriptor, table: &TableInfo, problems: &mut Vec<String>) {
    let t = table.name.display_plain();
    // Every column the entity uses must exist.
    let mut roles: Vec<(String, &str)> = vec![("anchor".into(), entity.anchor.as_str())];
    for m in Marker::ALL {
        if let Some(c) = entity.marker(m) {
            roles.push((format!("{m} marker"), c));
        }
    }
    for a in &entity.anonymise {
        roles.push((format!("anonymised ({})", a.method.kind()), &a.column));
    }
    for s in &entity.subjects {
        roles.push(("erasure subject".into(), &s.column));
    }
    for (role, column) in &roles {
        if table.column(column).is_none() {
            problems.push(format!("{role} column {column:?} does not exist in {t}"));
        }
    }

    for (role, column) in [
        ("anchor", Some(entity.anchor.as_str())),
        ("deleted_at", entity.deleted_at.as_deref()),
        ("anonymised_at", entity.anonymised_at.as_deref()),
    ] {
        let Some(col) = column.and_then(|c| table.column(c)) else {
            continue;
        };
        match col.type_name.as_str() {
            "timestamptz" => {}
            "timestamp" => problems.push(format!(
                "{role} column {:?} is `timestamp without time zone`; Cohort compares and writes UTC instants, and a naive timestamp silently shifts with the session time zone. Change it to `timestamp with time zone` (timestamptz)",
                col.name
            )),
            _ => problems.push(format!(
                "{role} column {:?} is {} but must be timestamp with time zone",
                col.name, col.display_type
            )),
        }
    }
}

/// The record key: one column, unique on its own.
fn check_record_key(
    entity: &EntityDescriptor,
    table: &TableInfo,
    capabilities: Option<&CategoryCapabilities>,
    problems: &mut Vec<String>,
) {
    // The record key: one column, unique on its own. On a partitioned
    // table PostgreSQL only allows unique indexes that include the
    // partition key, so for partition purge of a purge-only category
    // (record key, anchor) is accepted: a purge deletes by key and
    // re-checks the cutoff, so rows that shared an id would both be past
    // it, and they would share its holds (never fewer protections).
    // Anonymise and soft delete would have to tell such rows apart.
    if entity.has_composite_key() {
        check_composite_key(entity, table, problems);
        return;
    }
    let purge_only = capabilities.is_some_and(|c| {
        !c.allows(crate::domain::rules::Strategy::Anonymise)
            && !c.allows(crate::domain::rules::Strategy::SoftDelete)
    });
    if let Some(col) = table.column(&entity.record_id) {
        check_primary_key(entity, table, purge_only, problems);
        check_key_unique(entity, table, purge_only, col, problems);
        check_key_column(col, problems);
    }
}

/// A composite record key: columns of supported types, NOT NULL, with a
/// deterministic collation, that are together the primary key or a
/// valid unique index of exactly these columns.
fn check_composite_key(entity: &EntityDescriptor, table: &TableInfo, problems: &mut Vec<String>) {
    let t = table.name.display_plain();
    let mut all_present = true;
    for c in &entity.record_key {
        let Some(col) = table.column(c) else {
            all_present = false;
            continue;
        };
        if crate::domain::model::PartType::from_type_name(&col.type_name).is_none()
            || col.type_name == "bpchar"
        {
            problems.push(format!(
                "record key column {:?} is {}; a composite key's parts may be uuid, integer types, text, varchar, citext, timestamptz, timestamp or date",
                col.name, col.display_type
            ));
        }
        if !col.not_null {
            problems.push(format!(
                "record key column {:?} allows NULL; a record key must be NOT NULL",
                col.name
            ));
        }
        if !col.deterministic {
            problems.push(format!(
                "record key column {:?} has a non-deterministic collation: SQL would treat values Cohort tells apart as equal (or the reverse). Use a deterministic collation, or citext for case-insensitive ids",
                col.name
            ));
        }
    }
    if !all_present {
        return;
    }
    let same_columns = |i: &&super::catalog::IndexInfo| {
        (i.primary || i.unique)
            && !i.partial
            && i.columns.len() == entity.record_key.len()
            && entity.record_key.iter().all(|c| i.columns.contains(c))
    };
    let key = entity.record_key.join(", ");
    match table.indexes.iter().filter(same_columns).find(|i| i.usable) {
        Some(_) => {}
        None if table.indexes.iter().any(|i| same_columns(&i)) => problems.push(format!(
            "the unique index on the record key ({key}) is not valid, ready and immediate (a failed CREATE UNIQUE INDEX CONCURRENTLY, or a DEFERRABLE constraint); duplicate keys would let one batch reach rows it did not select. Rebuild it (REINDEX) or drop and recreate it"
        )),
        None => problems.push(format!(
            "the record key ({key}) of {t} is not its primary key or a unique index of exactly these columns; holds and audit need a unique key{}",
            match table.indexes.iter().find(|i| i.primary) {
                Some(pk) => format!(" (the primary key is ({}))", pk.columns.join(", ")),
                None => String::new(),
            }
        )),
    }
}

/// Whether `columns` are the (record key, anchor) pair a partition purge may key by.
fn is_partitioned_key(
    entity: &EntityDescriptor,
    table: &TableInfo,
    purge_only: bool,
    columns: &[String],
) -> bool {
    table.relkind == "p"
        && entity.partitions == crate::domain::model::Partitions::Drop
        && purge_only
        && columns.len() == 2
        && columns.contains(&entity.record_id)
        && columns.contains(&entity.anchor)
}

/// Whether index `i` makes the record key unique on its own (the pair counts, too).
fn is_key_index(
    entity: &EntityDescriptor,
    table: &TableInfo,
    purge_only: bool,
    i: &super::catalog::IndexInfo,
) -> bool {
    (i.primary || i.unique)
        && !i.partial
        && (i.columns == [entity.record_id.clone()]
            || is_partitioned_key(entity, table, purge_only, &i.columns))
}

/// What a refused key on a partitioned table can do instead: with a
/// tenant column nothing yet (partition purge needs a tenantless entity,
/// and composite record keys are not supported), so it says so rather
/// than send the reader to a setting that is refused next.
fn partitioned_key_hint(entity: &EntityDescriptor, table: &TableInfo) -> &'static str {
    match (table.relkind == "p", entity.tenant.is_some()) {
        (false, _) => "",
        (true, false) => " (on a partitioned table a key unique together with the anchor is accepted only with partitions = \"drop\" and a category that only purges)",
        (true, true) => " (on a partitioned table every unique key includes the partition key: declare the primary key as a composite record key, record_id = [\"id\", \"logged_at\"] in its columns' order)",
    }
}

/// No primary key of several columns (but the accepted partitioned pair).
fn check_primary_key(
    entity: &EntityDescriptor,
    table: &TableInfo,
    purge_only: bool,
    problems: &mut Vec<String>,
) {
    let t = table.name.display_plain();
    if let Some(pk) = table.indexes.iter().find(|i| i.primary) {
        if pk.columns.len() > 1 && !is_partitioned_key(entity, table, purge_only, &pk.columns) {
            problems.push(format!(
                "{t} has a composite primary key ({}) and the record key is {:?} alone; declare the key's columns, record_id = [{}], or a column unique on its own{}",
                pk.columns.join(", "),
                entity.record_id,
                pk.columns.iter().map(|c| format!("{c:?}")).collect::<Vec<_>>().join(", "),
                partitioned_key_hint(entity, table)
            ));
        }
    }
}

/// The record key has a unique index of its own that is usable now.
fn check_key_unique(
    entity: &EntityDescriptor,
    table: &TableInfo,
    purge_only: bool,
    col: &ColumnInfo,
    problems: &mut Vec<String>,
) {
    // Only an index that guarantees uniqueness right now counts: a
    // failed CREATE UNIQUE INDEX CONCURRENTLY leaves an invalid index
    // over duplicate keys, and a deferrable one allows them mid-transaction.
    let key_index = |i: &&super::catalog::IndexInfo| is_key_index(entity, table, purge_only, i);
    let unique_alone = table.indexes.iter().filter(key_index).any(|i| i.usable);
    if !unique_alone && table.indexes.iter().any(|i| key_index(&i)) {
        problems.push(format!(
            "the unique index on record key column {:?} is not valid, ready and immediate (a failed CREATE UNIQUE INDEX CONCURRENTLY, or a DEFERRABLE constraint); duplicate keys would let one batch reach rows it did not select. Rebuild it (REINDEX) or drop and recreate it",
            col.name
        ));
    }
    if !unique_alone
        && !table.indexes.iter().any(|i| key_index(&i))
        && !table
            .indexes
            .iter()
            .any(|i| i.primary && i.columns.len() > 1)
    {
        problems.push(format!(
            "record key column {:?} is not a primary key or unique on its own; holds and audit need a unique single-column key{}",
            col.name,
            partitioned_key_hint(entity, table)
        ));
    }
}

/// The record key column is of a key type and NOT NULL.
fn check_key_column(col: &ColumnInfo, problems: &mut Vec<String>) {
    // char(n) is padded: its values would not compare equal to themselves as text.
    if !KEY_TYPES.contains(&col.type_name.as_str()) || col.type_name == "bpchar" {
        problems.push(format!(
            "record key column {:?} is {}; supported key types are uuid, integer types, text and varchar",
            col.name, col.display_type
        ));
    }
    if !col.not_null {
        problems.push(format!(
            "record key column {:?} allows NULL; a record key must be NOT NULL",
            col.name
        ));
    }
}

/// Key-like columns compare the way Cohort identifies values; the tenant column, or none that reads as one.
fn check_keys(
    entity: &EntityDescriptor,
    table: &TableInfo,
    tenant_candidates: &[&str],
    problems: &mut Vec<String>,
) {
    let t = table.name.display_plain();
    // Key-like columns must compare the way Cohort identifies their values.
    // A composite key's parts are checked with the key.
    let record = (!entity.has_composite_key()).then_some(entity.record_id.as_str());
    let key_like = std::iter::once(("record key", record))
        .chain(std::iter::once(("tenant", entity.tenant.as_deref())))
        .chain(
            entity
                .subjects
                .iter()
                .map(|s| ("erasure subject", Some(s.column.as_str()))),
        );
    for (role, column) in key_like {
        let Some(col) = column.and_then(|c| table.column(c)) else {
            continue;
        };
        if !col.deterministic {
            problems.push(format!(
                "{role} column {:?} has a non-deterministic collation: SQL would treat values Cohort tells apart as equal (or the reverse). Use a deterministic collation, or citext for case-insensitive ids",
                col.name
            ));
        }
        if role != "record key" && col.type_name == "bpchar" {
            problems.push(format!(
                "{role} column {:?} is {}; char(n) pads its values, so an id compared as text never matches. Use text or varchar",
                col.name, col.display_type
            ));
        }
    }
    if let Some(col) = entity.tenant.as_deref().and_then(|c| table.column(c)) {
        if !KEY_TYPES.contains(&col.type_name.as_str()) {
            problems.push(format!(
                "tenant column {:?} is {}; supported tenant types are uuid, integer types and text",
                col.name, col.display_type
            ));
        }
    }
    // One rule for what looks like a tenant column (`looks_like_tenant`,
    // and the configured convention), the rule `cohort init` proposes by.
    let tenant_like = |c: &str| looks_like_tenant(c) || tenant_candidates.contains(&c);
    if entity.is_tenantless() {
        for col in table
            .columns
            .iter()
            .filter(|c| tenant_like(&c.name) && !entity.not_tenant.contains(&c.name))
        {
            problems.push(format!(
                "entity is tenantless but {t} has a tenant column {:?} (its name reads as a tenant id); map it as the tenant (`tenant = {:?}`), or, if it is not one, say so (`not_tenant = [{:?}]`): a tenantless entity is swept across every tenant and per-tenant overrides do not apply to it",
                col.name, col.name, col.name
            ));
        }
    }
    for col in &entity.not_tenant {
        if let Some(tenant) = &entity.tenant {
            problems.push(format!(
                "not_tenant names {col:?}, but the entity is not tenantless (its tenant column is {tenant:?}); not_tenant applies only to a tenantless entity: remove it"
            ));
        } else if table.column(col).is_none() {
            problems.push(format!(
                "not_tenant names {col:?}, which {t} does not have; remove it or fix the name"
            ));
        } else if !tenant_like(col) {
            problems.push(format!(
                "not_tenant names {col:?}, whose name does not read as a tenant id: it has no effect; remove it"
            ));
        }
    }
}

/// The soft-delete flag, subject columns, markers and anonymised columns.
fn check_markers_and_anonymise(
    entity: &EntityDescriptor,
    table: &TableInfo,
    problems: &mut Vec<String>,
) {
    check_soft_delete_and_subjects(entity, table, problems);
    let markers: Vec<&str> = Marker::ALL
        .iter()
        .filter_map(|m| entity.marker(*m))
        .collect();
    for a in &entity.anonymise {
        check_anonymised_role(entity, table, &markers, a, problems);
        check_anonymise_literal(a, problems);
        let Some(col) = table.column(&a.column) else {
            continue;
        };
        check_anonymised_length(entity, table, a, col, problems);
        check_anonymise_method(table, a, col, problems);
    }
}

/// The soft-delete flag is boolean, and subject columns are of a key type.
fn check_soft_delete_and_subjects(
    entity: &EntityDescriptor,
    table: &TableInfo,
    problems: &mut Vec<String>,
) {
    if let Some(col) = entity.soft_delete.as_deref().and_then(|c| table.column(c)) {
        if col.type_name != "bool" {
            problems.push(format!(
                "soft-delete flag column {:?} is {} but must be boolean",
                col.name, col.display_type
            ));
        }
    }
    for s in &entity.subjects {
        let Some(col) = table.column(&s.column) else {
            continue;
        };
        if !KEY_TYPES.contains(&col.type_name.as_str()) {
            problems.push(format!(
                "erasure subject column {:?} is {}; subjects must be uuid, integer or text columns",
                col.name, col.display_type
            ));
        }
    }
}

/// An anonymised column is no marker or anchor, nor part of a referenced key.
fn check_anonymised_role(
    entity: &EntityDescriptor,
    table: &TableInfo,
    markers: &[&str],
    a: &AnonymisedColumn,
    problems: &mut Vec<String>,
) {
    if markers.contains(&a.column.as_str()) || a.column == entity.anchor {
        problems.push(format!(
            "column {:?} is both anonymised and a marker or anchor; Cohort will not scrub the columns it relies on",
            a.column
        ));
    }
    // Rewriting a referenced key would reach the rows that reference it
    // (ON UPDATE CASCADE rewrites them, held or not) or fail every batch.
    for k in table
        .referenced_by
        .iter()
        .filter(|k| k.parent_columns.contains(&a.column))
    {
        problems.push(format!(
            "column {:?} is anonymised but is part of a key that foreign key {:?} on {} references; scrubbing it would change or break the rows that reference it",
            a.column,
            k.name,
            k.child.display_plain()
        ));
    }
}

/// A literal method's text holds no NUL and renders.
fn check_anonymise_literal(a: &AnonymisedColumn, problems: &mut Vec<String>) {
    if let AnonymiseMethod::Literal(v) = &a.method {
        if v.contains('\0') {
            problems.push(format!(
                "the literal for column {:?} contains a NUL character, which PostgreSQL text cannot store",
                a.column
            ));
        }
        if let Err(e) = crate::domain::model::render_literal(v, chrono::DateTime::UNIX_EPOCH, None)
        {
            problems.push(format!("the literal for column {:?}: {e}", a.column));
        }
    }
}

/// What the method writes fits the column's length.
fn check_anonymised_length(
    entity: &EntityDescriptor,
    table: &TableInfo,
    a: &AnonymisedColumn,
    col: &ColumnInfo,
    problems: &mut Vec<String>,
) {
    // The longest tenant id a `{tenant}` can render, as the tenant
    // column's type allows (a uuid is 36 characters); `None` when the
    // type sets no bound (text): then each tenant is as long as it is.
    let tenant_column = entity.tenant.as_deref().and_then(|t| table.column(t));
    let longest_tenant = tenant_column.and_then(longest_tenant_id);
    let uses_tenant = matches!(&a.method, AnonymiseMethod::Literal(v) if v.contains("{tenant}"));
    let written = match &a.method {
        AnonymiseMethod::Hash => Some(crate::sql::HASH_HEX_CHARS),
        // As rendered: a `{now}` is 20 characters, a `{tenant}` as long
        // as the longest id the tenant column can hold.
        AnonymiseMethod::Literal(v) => {
            let tenant = "0".repeat(longest_tenant.unwrap_or(0));
            crate::domain::model::render_literal(v, chrono::DateTime::UNIX_EPOCH, Some(&tenant))
                .ok()
                .map(|r| r.chars().count())
        }
        _ => None,
    };
    if let (Some(n), Some(max)) = (written, col.max_chars) {
        if n > usize::try_from(max).unwrap_or(0) {
            let tenant_note = match (uses_tenant, tenant_column, longest_tenant) {
                (true, Some(tc), Some(k)) => format!(
                    ", its {{tenant}} counted as the longest id of the tenant column ({}: {k} characters)",
                    tc.display_type
                ),
                _ => String::new(),
            };
            problems.push(format!(
                "column {:?} is {} but the {} anonymise method writes {n} characters{tenant_note}; every batch would fail (value too long). Widen the column or choose another method",
                col.name,
                col.display_type,
                a.method.kind()
            ));
        }
    }
}

/// The method suits the column: NULL if nullable, one value if not unique, text if text.
fn check_anonymise_method(
    table: &TableInfo,
    a: &AnonymisedColumn,
    col: &ColumnInfo,
    problems: &mut Vec<String>,
) {
    match &a.method {
        AnonymiseMethod::Null if col.not_null => problems.push(format!(
            "column {:?} is anonymised to NULL but is NOT NULL; use empty, a literal or a custom anonymiser",
            col.name
        )),
        AnonymiseMethod::Empty | AnonymiseMethod::Literal(_)
            if table.indexes.iter().any(|i| {
                (i.primary || i.unique) && !i.partial && i.columns == [col.name.clone()]
            }) =>
        {
            problems.push(format!(
                "column {:?} is unique, but the {} anonymise method writes the same value into every row: the second row of a batch would violate the unique index and retention would never happen. Use null, hash or a custom anonymiser",
                col.name,
                a.method.kind()
            ))
        }
        AnonymiseMethod::Empty | AnonymiseMethod::Literal(_) | AnonymiseMethod::Hash if !is_text(col) => {
            problems.push(format!(
                "column {:?} is {}; the {} anonymise method needs a text column",
                col.name,
                col.display_type,
                a.method.kind()
            ))
        }
        _ => {}
    }
}

/// Declared Rust types fit the columns Cohort uses.
fn check_declared_types(entity: &EntityDescriptor, table: &TableInfo, problems: &mut Vec<String>) {
    // Declared Rust types must fit the columns Cohort uses.
    for column in entity.used_columns() {
        let (Some(rust), Some(col)) = (entity.rust_type_of(column), table.column(column)) else {
            continue;
        };
        if let Some(expected) = pg_types_for_rust(rust) {
            if !expected.contains(&col.type_name.as_str()) {
                problems.push(format!(
                    "field type {rust} does not match column {:?} of type {}",
                    col.name, col.display_type
                ));
            }
        }
    }
}

/// Every strategy the category may return is supported by the entity.
fn check_strategies(
    entity: &EntityDescriptor,
    table: &TableInfo,
    capabilities: Option<&CategoryCapabilities>,
    known_categories: &[String],
    problems: &mut Vec<String>,
) {
    // Strategy requirements, for every strategy the category may return.
    match capabilities {
        None => {
            let mut known: Vec<&str> = known_categories.iter().map(String::as_str).collect();
            known.sort_unstable();
            let listed = if known.is_empty() {
                String::new()
            } else {
                format!(" (it knows {})", known.join(", "))
            };
            problems.push(format!(
                "category {:?} is not known to the rule provider{listed}{}",
                entity.category,
                crate::base::suggest::did_you_mean(&entity.category, known.iter().copied())
            ))
        }
        Some(caps) => {
            problems.extend(marker_problems(entity, table, caps));
            for strategy in caps.iter() {
                match strategy {
                    Strategy::Anonymise => {
                        if entity.anonymised_at.is_none() {
                            problems.push(no_anonymised_at(entity, table));
                        }
                        if entity.anonymise.is_empty() {
                            problems.push(format!(
                                "category {:?} may anonymise, but no column is marked for anonymisation",
                                entity.category
                            ));
                        }
                    }
                    Strategy::SoftDelete if entity.soft_delete.is_none() => {
                        problems.push(format!(
                            "category {:?} may soft delete, but no soft-delete flag resolves (declare one, or add an `is_deleted` boolean column)",
                            entity.category
                        ));
                    }
                    _ => {}
                }
            }
            // A stage measured from the previous stage's marker needs the
            // entity to have that marker: the previous stage must write it.
            for (strategy, previous) in caps.marker_stages() {
                match previous.marker() {
                    Some(m) if entity.marker(m).is_none() => problems.push(format!(
                        "category {:?} has a {strategy} stage measured from the {previous} stage's marker, but the {previous} stage writes no {marker} here (map the {marker} marker to a timestamptz column, or measure the stage from the anchor)",
                        entity.category,
                        marker = m.key(),
                    )),
                    Some(_) => {}
                    None => problems.push(format!(
                        "category {:?} has a {strategy} stage measured from the {previous} stage's marker, but a {previous} stage writes no marker (only soft delete and anonymise do); measure the stage from the anchor",
                        entity.category
                    )),
                }
            }
        }
    }
}

/// Problems that span entities: duplicate ids, shared tables, cascades.
pub(crate) fn check_across(
    entities: &[(&EntityDescriptor, &TableInfo, Option<&CategoryCapabilities>)],
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut by_table: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
    for (e, t, _) in entities {
        by_table.entry(t.oid).or_default().push(&e.name);
    }
    for (e, t, _) in entities {
        let names = &by_table[&t.oid];
        if names.len() > 1 {
            problems.push(Problem::entity(
                &e.name,
                format!(
                    "table {} is also declared by {}; one independently owned table per retained entity",
                    t.name.display_plain(),
                    names.iter().filter(|n| **n != e.name).cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }
    let mut by_name: BTreeMap<&str, Vec<uuid::Uuid>> = BTreeMap::new();
    for (e, _, _) in entities {
        by_name.entry(e.name.as_str()).or_default().push(e.id);
    }
    for (name, ids) in by_name.iter().filter(|(_, ids)| ids.len() > 1) {
        problems.push(Problem::entity(
            *name,
            format!(
                "{} retained entities share the display name {name:?} (ids {}); names pick entities in the CLI and the ledger, so each must be unique",
                ids.len(),
                ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    problems
}

/// What a purge of each purgeable entity would set off through foreign
/// keys: refused when a CASCADE / SET NULL / SET DEFAULT action (directly or
/// through a chain of cascades over any tables) reaches a retained or exempt
/// entity's table, or when a SET NULL / SET DEFAULT would violate NOT NULL
/// (every purge would fail).
pub(crate) fn check_cascades(
    purgeable: &[(&EntityDescriptor, Vec<CascadeEdge>)],
    kept_tables: &[(&str, &QualifiedName)],
) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (parent, edges) in purgeable {
        for edge in edges {
            let from = edge.path[edge.path.len() - 2].display_plain();
            let origin = if edge.path.len() > 2 {
                format!(
                    "{from}, which a purge of entity {} reaches through {}",
                    parent.name,
                    edge.path
                        .iter()
                        .map(QualifiedName::display_plain)
                        .collect::<Vec<_>>()
                        .join(" -> ")
                )
            } else {
                format!("{from} (entity {}, which may be purged)", parent.name)
            };
            if let Some((kept, _)) = kept_tables.iter().find(|(_, t)| **t == edge.child) {
                let effect = if edge.action == "c" {
                    "delete"
                } else {
                    "change"
                };
                problems.push(Problem::entity(
                    *kept,
                    format!(
                        "foreign key {:?} on {} is ON DELETE {} from {origin}; purging would {effect} {kept} rows outside retention rules, holds and audit. Use ON DELETE RESTRICT/NO ACTION and let Cohort purge dependents first",
                        edge.name,
                        edge.child.display_plain(),
                        edge.action_sql(),
                    ),
                ));
            } else if !edge.failing_columns.is_empty() {
                problems.push(Problem::entity(
                    &parent.name,
                    format!(
                        "foreign key {:?} on {} is ON DELETE {} from {origin}, but its column(s) {} are NOT NULL{}; every purge of a referenced row would fail",
                        edge.name,
                        edge.child.display_plain(),
                        edge.action_sql(),
                        edge.failing_columns.join(", "),
                        if edge.action == "d" { " without a default" } else { "" },
                    ),
                ));
            }
        }
    }
    problems
}

/// Advice: a missing index usable for the sweep's `(tenant, anchor)` scan.
///
/// `reads` are the strategies whose statements read the table by that
/// anchor. When every one of them leaves out its done rows with the same
/// predicate (all soft deletes, or all anonymisations), a partial index
/// with exactly that predicate serves every read (the one
/// [`done_rows_index_advice`] suggests), so it counts; a full one is
/// needed as soon as one read takes every row (a purge, an archive, an
/// exempt category's count).
pub(crate) fn index_advice(
    entity: &EntityDescriptor,
    table: &TableInfo,
    reads: &[Strategy],
) -> Option<String> {
    let wanted = anchor_prefix(entity, &entity.anchor);
    let shared = shared_done_predicate(entity, reads);
    let covered = indexes_on(table, &wanted).any(|i| match &i.predicate {
        None => true,
        Some(p) => shared.as_deref().is_some_and(|s| same_predicate(p, s)),
    });
    if covered {
        return None;
    }
    Some(format!(
        "{}: no index starts with ({}); sweeps will scan {}. Suggested: CREATE INDEX ON {} ({});",
        entity.name,
        wanted.join(", "),
        table.name.display_plain(),
        table.name,
        quoted_list(&wanted),
    ))
}

/// The table's valid indexes whose key columns start with `wanted`.
fn indexes_on<'t>(
    table: &'t TableInfo,
    wanted: &'t [&str],
) -> impl Iterator<Item = &'t super::catalog::IndexInfo> {
    table.indexes.iter().filter(move |i| {
        i.valid
            && i.columns.len() >= wanted.len()
            && i.columns.iter().zip(wanted).all(|(a, b)| a == b)
    })
}

/// The columns, each quoted, comma-separated: an index's column list.
fn quoted_list(columns: &[&str]) -> String {
    columns
        .iter()
        .map(|c| crate::base::ident::quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns a sweep's scan by `anchor` starts with: the tenant (when
/// the entity has one), then the anchor.
fn anchor_prefix<'a>(entity: &'a EntityDescriptor, anchor: &'a str) -> Vec<&'a str> {
    entity
        .tenant
        .as_deref()
        .into_iter()
        .chain(std::iter::once(anchor))
        .collect()
}

/// How a strategy leaves out the rows it already changed: the column,
/// the test every one of its reads puts on it, and the word for those
/// rows. `None` for strategies whose rows leave the table (purge,
/// archive) or that change nothing (exempt), and for an entity without
/// the column.
fn done_test(
    entity: &EntityDescriptor,
    strategy: Strategy,
) -> Option<(&str, &'static str, &'static str)> {
    match strategy {
        Strategy::SoftDelete => Some((
            entity.soft_delete.as_deref()?,
            "IS NOT TRUE",
            "soft-deleted",
        )),
        Strategy::Anonymise => Some((entity.anonymised_at.as_deref()?, "IS NULL", "anonymised")),
        _ => None,
    }
}

/// The predicate (`column test`, unquoted) every read of `reads` carries,
/// when they all carry the same one.
fn shared_done_predicate(entity: &EntityDescriptor, reads: &[Strategy]) -> Option<String> {
    let mut shared: Option<String> = None;
    for &strategy in reads {
        let (column, test, _) = done_test(entity, strategy)?;
        let predicate = format!("{column} {test}");
        match &shared {
            Some(seen) if *seen != predicate => return None,
            _ => shared = Some(predicate),
        }
    }
    shared
}

/// Whether a partial index's predicate, as the server prints it
/// (parenthesised, quoting only names that need it), is `predicate`.
fn same_predicate(printed: &str, predicate: &str) -> bool {
    printed.replace('"', "").trim_matches(['(', ')']) == predicate
}

/// Advice: a soft delete or an anonymisation leaves the rows it changed in
/// the sweep's `(tenant, anchor)` range, so without a partial index that
/// leaves them out, every later sweep's first batch, its end-of-entity
/// counts and the backlog gauge read past every row ever changed (all of
/// them, one by one, each run). `anchor` is the column the stage is
/// measured from (the entity's anchor, or the marker a stage follows).
pub(crate) fn done_rows_index_advice(
    entity: &EntityDescriptor,
    table: &TableInfo,
    strategy: Strategy,
    anchor: &str,
) -> Option<String> {
    let (column, test, done) = done_test(entity, strategy)?;
    let wanted = anchor_prefix(entity, anchor);
    let predicate = format!("{column} {test}");
    let covered = indexes_on(table, &wanted).any(|i| {
        i.predicate
            .as_deref()
            .is_some_and(|p| same_predicate(p, &predicate))
    });
    if covered {
        return None;
    }
    Some(format!(
        "{}: {done} rows stay in the ({}) range a sweep reads, so each sweep's first batch, its counts and the backlog gauge read past every row ever {done}. Suggested: CREATE INDEX ON {} ({}) WHERE {} {test};",
        entity.name,
        wanted.join(", "),
        table.name,
        quoted_list(&wanted),
        crate::base::ident::quote_ident(column),
    ))
}

/// Advice: subject columns no index starts with. Erasing a subject,
/// placing a hold on one, and counting held rows after a run while a
/// subject hold is active each look rows up by these columns.
pub(crate) fn subject_index_advice(entity: &EntityDescriptor, table: &TableInfo) -> Vec<String> {
    entity
        .subjects
        .iter()
        .filter(|s| {
            !table
                .indexes
                .iter()
                .any(|i| i.valid && !i.partial && i.columns.first() == Some(&s.column))
        })
        .map(|s| {
            format!(
                "{}: no index starts with ({}); erasing a subject, placing a hold on one and counting held rows while a subject hold is active will scan {}. Suggested: CREATE INDEX ON {} ({});",
                entity.name,
                s.column,
                table.name.display_plain(),
                table.name,
                crate::base::ident::quote_ident(&s.column)
            )
        })
        .collect()
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

    #[test]
    fn rust_type_mapping_table() {
        let cases: [(&str, Option<&[&str]>); 8] = [
            ("Uuid", Some(&["uuid"])),
            ("uuid::Uuid", Some(&["uuid"])),
            ("Option<DateTime<Utc>>", Some(&["timestamptz"])),
            ("chrono::NaiveDateTime", Some(&["timestamp"])),
            ("Option<Option<i64>>", Some(&["int8"])),
            ("bool", Some(&["bool"])),
            ("Option<String>", Some(TEXT_TYPES)),
            ("MyNewtype", None),
        ];
        for (rust, expected) in cases {
            assert_eq!(pg_types_for_rust(rust), expected, "{rust}");
        }
    }
}

/// What keeps a purging entity's rows for good: the NO ACTION / RESTRICT
/// foreign keys into its table from a table whose rows Cohort never
/// deletes (a table no entity retains, an exempt declaration, or an entity
/// whose category never purges or archives). A row such a key references
/// is skipped on every run: nothing will ever delete the referencing row
/// first.
#[derive(Debug, Default)]
pub(crate) struct KeptByReferences {
    /// Advice naming each such key, the referencing table and what to do.
    pub(crate) warnings: Vec<String>,
    /// The referencing tables, as a run's note names them
    /// (`app.order_notes (not retained by Cohort)`); empty when none.
    pub(crate) tables: Vec<String>,
}

/// Whether purging `entity` (whose category may purge or archive) leaves
/// rows for good because of `keys`, the blocking keys into its table
/// (`retained`: the entities by table, with whether each may delete rows;
/// `exempt`: exempt declarations by table). Also advises an index on the
/// referencing columns where none starts with them: every batch looks the
/// referencing rows up by them.
pub(crate) fn references_kept_for_good(
    entity: &EntityDescriptor,
    keys: &[crate::sql::IncomingKey],
    retained: &[(&str, &QualifiedName, bool)],
    exempt: &[(&str, &QualifiedName)],
) -> KeptByReferences {
    let mut out = KeptByReferences::default();
    for key in keys {
        let action = if key.on_delete == "r" {
            "RESTRICT"
        } else {
            "NO ACTION"
        };
        let child = key.child.display_plain();
        if !key.child_indexed {
            out.warnings.push(format!(
                "{}: no index of {child} starts with ({}), the columns of foreign key {:?} that references it; every purge batch looks the referencing rows up by them and scans {child}. Suggested: CREATE INDEX ON {} ({});",
                entity.name,
                key.child_columns.join(", "),
                key.name,
                key.child,
                key.child_columns
                    .iter()
                    .map(|c| crate::base::ident::quote_ident(c))
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
        }
        if key.child == entity.table {
            // Rows referencing rows of their own table go with them.
            continue;
        }
        let why = match retained.iter().find(|(_, t, _)| **t == key.child) {
            Some((_, _, true)) => continue,
            Some((name, _, false)) => {
                format!("entity {name}, whose category never purges or archives")
            }
            None => match exempt.iter().find(|(_, t)| **t == key.child) {
                Some((name, _)) => format!("{name}, declared exempt"),
                None => "not retained by Cohort".to_owned(),
            },
        };
        out.warnings.push(format!(
            "{}: foreign key {:?} on {child} ({why}) references {} with ON DELETE {action}, and Cohort never deletes {child}'s rows: every {} row it references is skipped on every run, for good (runs count them as skipped and say why). Classify {child} with a category that purges (Cohort then deletes its rows first), or accept that the rows it references are kept",
            entity.name,
            key.name,
            entity.table.display_plain(),
            entity.name,
        ));
        let named = format!("{child} ({why})");
        if !out.tables.contains(&named) {
            out.tables.push(named);
        }
    }
    out
}

/// The warnings of tables the policy does not mention (see
/// `validate::unmentioned_tables`): each table of `found` that is neither
/// `mentioned`, nor listed in `ignore_tables`, nor one of Cohort's own;
/// and each `ignore_tables` entry that names a retained table or no table
/// `found` holds.
pub(crate) fn unmentioned_advice(
    config: &CohortConfig,
    mentioned: &std::collections::BTreeSet<QualifiedName>,
    found: &[super::catalog::TimestampedTable],
) -> Vec<String> {
    let ignored: Vec<(&str, QualifiedName)> = config
        .ignore_tables
        .iter()
        .filter_map(|t| {
            Some((
                t.as_str(),
                QualifiedName::parse(t, config.table_schema()).ok()?,
            ))
        })
        .collect();
    let own = |t: &QualifiedName| {
        t.schema == config.schema
            && crate::sql::tables::CohortTable::ALL
                .iter()
                .any(|c| c.name() == t.name)
    };
    let mut warnings = Vec::new();
    for t in found {
        if mentioned.contains(&t.name) || own(&t.name) || ignored.iter().any(|(_, i)| *i == t.name)
        {
            continue;
        }
        warnings.push(format!(
            "{} has timestamptz columns ({}) and the policy does not mention it: decide about its rows (`cohort init --update` adds it, exempt until classified), or list it in [cohort] ignore_tables",
            t.name.path(),
            t.timestamps.join(", ")
        ));
    }
    for (text, i) in &ignored {
        if mentioned.contains(i) {
            warnings.push(format!(
                "ignore_tables lists {text:?}, which an entity names: it has no effect; take it off"
            ));
        } else if !found.iter().any(|t| t.name == *i) {
            warnings.push(format!(
                "ignore_tables lists {text:?}, which is not a table with a timestamptz column in a schema the policy's tables live in: it has no effect"
            ));
        }
    }
    warnings
}
