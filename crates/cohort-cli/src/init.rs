//! `cohort init`: a starter policy file from the live catalog. Every table
//! of the schema with a `timestamptz` column becomes an `[[entity]]` with a
//! fresh id, `exempt = "not yet classified"` until a person chooses, and
//! comments proposing what it found: the anchor, tenant, record key,
//! erasure subjects and partition purge, and a tenants query when the
//! tenant columns point at one table. Its `[cohort] schema` puts Cohort's
//! own tables in a schema of their own.
//!
//! `cohort init --update` appends the tables that appeared since, reading
//! the schemas the file was made from (or `--schema`); it refuses, with
//! nothing written, when the file does not say which. The file is replaced
//! whole by a rename, so it is never seen half-written, and keeps its own
//! line endings.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use sqlx::Row;

use crate::{Cli, Failure};
use cohort::Error;

/// The schema `init` reads without `--update` or `--schema`.
pub(crate) const DEFAULT_SCHEMA: &str = "public";

/// One table as `init` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableFacts {
    /// The schema, as named in the catalog.
    pub(crate) schema: String,
    pub(crate) name: String,
    /// `schema.table` as PostgreSQL's `quote_ident` writes each part: what
    /// the policy file's `table` gets, so that it round-trips exactly.
    pub(crate) path: String,
    /// `pg_class.reltuples`: -1 while the planner has no statistics for it
    /// (PostgreSQL 14 and later; 0 before).
    pub(crate) estimate: i64,
    pub(crate) columns: Vec<String>,
    /// Each column's type name (a domain's base type), as `columns`.
    pub(crate) types: Vec<String>,
    pub(crate) timestamps: Vec<String>,
    pub(crate) primary_key: Vec<String>,
    /// Columns that are NOT NULL and alone make an immediate, non-partial
    /// unique index: record keys when there is no primary key.
    pub(crate) unique_not_null: Vec<String>,
    /// Single-column foreign keys.
    pub(crate) references: Vec<Reference>,
    /// The column a partitioned table is partitioned `BY RANGE` on, when
    /// its key is that one column.
    pub(crate) range_key: Option<String>,
    /// Whether a foreign key references the table or one of its
    /// partitions (partition purge cannot drop a partition then).
    pub(crate) referenced: bool,
    /// Whether the current role acts as owner of the table and of every
    /// partition (partition purge detaches and drops them).
    pub(crate) owned: bool,
}

/// A single-column foreign key of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    pub(crate) column: String,
    /// The referenced table's `path`.
    pub(crate) target: String,
    /// The referenced column, as `quote_ident` writes it.
    pub(crate) target_key: String,
}

/// Anchor names, likeliest first.
const ANCHORS: &[&str] = &[
    "created_at",
    "created",
    "inserted_at",
    "occurred_at",
    "recorded_at",
    "logged_at",
    "timestamp",
    "updated_at",
    "modified_at",
];

/// The likeliest anchor: the `timestamptz` column the table is range
/// partitioned on (its partitions' bounds say when their rows expire), a
/// known name, then one mentioning creation or occurrence, then the first
/// `timestamptz` column; never Cohort's own markers.
pub(crate) fn anchor(t: &TableFacts) -> Option<&str> {
    let candidates: Vec<&str> = t
        .timestamps
        .iter()
        .map(String::as_str)
        .filter(|c| !matches!(*c, "deleted_at" | "anonymised_at"))
        .collect();
    t.range_key
        .as_deref()
        .filter(|k| candidates.contains(k))
        .or_else(|| ANCHORS.iter().find(|a| candidates.contains(a)).copied())
        .or_else(|| {
            candidates
                .iter()
                .find(|c| ["creat", "occur", "insert"].iter().any(|w| c.contains(w)))
                .copied()
        })
        .or_else(|| candidates.first().copied())
}

/// Column names (case and every character that is not a letter or digit
/// ignored) that name a tenant only when a foreign key shows it: an
/// `account_id` may be the tenant of a B2B schema or a person's account.
const TENANT_BY_REFERENCE: &[&str] = &["accountid"];

/// Whether `column` is named like [`TENANT_BY_REFERENCE`].
fn by_reference_only(column: &str) -> bool {
    TENANT_BY_REFERENCE.contains(&cohort::model::folded_column_name(column).as_str())
}

/// The tables a tenant column points at: referenced through a
/// single-column foreign key named like [`TENANT_BY_REFERENCE`] by most
/// (more than half) of the other tables listed.
pub(crate) fn tenant_tables(tables: &[TableFacts]) -> std::collections::BTreeSet<String> {
    let mut referencing: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
        std::collections::BTreeMap::new();
    for t in tables {
        for r in &t.references {
            if by_reference_only(&r.column) && r.target != t.path {
                referencing.entry(&r.target).or_default().insert(&t.path);
            }
        }
    }
    referencing
        .into_iter()
        .filter(|(target, from)| {
            let listed = tables.iter().any(|t| t.path == *target);
            from.len() * 2 > tables.len() - usize::from(listed)
        })
        .map(|(target, _)| target.to_owned())
        .collect()
}

/// The tenant column: the first whose name reads as a tenant id, by the
/// rule validation refuses `tenantless` by
/// ([`cohort::model::looks_like_tenant`]); else an `account_id` whose
/// foreign key points at one of `tenant_tables` (see [`tenant_tables`]).
fn tenant<'t>(
    t: &'t TableFacts,
    tenant_tables: &std::collections::BTreeSet<String>,
) -> Option<&'t str> {
    t.columns
        .iter()
        .map(String::as_str)
        .find(|c| cohort::model::looks_like_tenant(c))
        .or_else(|| {
            t.references
                .iter()
                .find(|r| by_reference_only(&r.column) && tenant_tables.contains(&r.target))
                .map(|r| r.column.as_str())
        })
}

/// Where the tenants are listed: the one table (its `path` and key column)
/// that the tenant columns of the listed tables point at through foreign
/// keys. `None` when none does, or they point at several.
fn tenant_source(
    tables: &[TableFacts],
    tenant_tables: &std::collections::BTreeSet<String>,
) -> Option<(String, String)> {
    let mut targets: Vec<(&str, &str)> = Vec::new();
    for t in tables {
        let Some(column) = tenant(t, tenant_tables) else {
            continue;
        };
        for r in t.references.iter().filter(|r| r.column == column) {
            if !targets.contains(&(&r.target, &r.target_key)) {
                targets.push((&r.target, &r.target_key));
            }
        }
    }
    match targets.as_slice() {
        [(table, key)] => Some(((*table).to_owned(), (*key).to_owned())),
        _ => None,
    }
}

/// Column names (folded as [`cohort::model::folded_column_name`] folds
/// them) that name a person: erasure subjects. Any name ending in `userid`
/// (`author_user_id`, `createdByUserId`) counts too.
const SUBJECT_NAMES: &[&str] = &[
    "customerid",
    "personid",
    "memberid",
    "patientid",
    "employeeid",
    "subjectid",
];

/// The types validation accepts for an erasure subject column.
const SUBJECT_TYPES: &[&str] = &[
    "uuid", "int2", "int4", "int8", "text", "varchar", "bpchar", "citext",
];

/// The columns that name a person, of a type a subject may have: the
/// erasure subjects `init` proposes (never the tenant column).
fn subjects<'t>(t: &'t TableFacts, tenant: Option<&str>) -> Vec<&'t str> {
    t.columns
        .iter()
        .zip(&t.types)
        .filter(|(column, ty)| {
            let folded = cohort::model::folded_column_name(column);
            (folded.ends_with("userid") || SUBJECT_NAMES.contains(&folded.as_str()))
                && SUBJECT_TYPES.contains(&ty.as_str())
                && Some(column.as_str()) != tenant
        })
        .map(|(column, _)| column.as_str())
        .collect()
}

/// What partition purge of `t` (range partitioned on its anchor) would
/// need that it lacks, as validation would refuse it; `None` when nothing.
fn partition_drop_blocked(t: &TableFacts) -> Option<&'static str> {
    if t.referenced {
        Some("no foreign key referencing the table or a partition")
    } else if !t.owned {
        Some("the role to be (a member of) the owner of the table and of every partition")
    } else {
        None
    }
}

/// `order_lines` → `OrderLines`, `é` → `É`; a name without letters or
/// digits (`_`) becomes `Table`.
fn display_name(table: &str) -> String {
    let name: String = table
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut chars = w.chars();
            let first = chars.next().expect("non-empty");
            first.to_uppercase().chain(chars).collect::<String>()
        })
        .collect();
    if name.is_empty() {
        "Table".to_owned()
    } else {
        name
    }
}

/// One distinct display name per table, in the tables' order: tables whose
/// names read alike (`order_lines`, `order-lines`, `Order_Lines`) get a
/// number after the first (`OrderLines`, `OrderLines2`, …), never a name
/// another table already has.
fn display_names(tables: &[&TableFacts], taken: &[String]) -> Vec<String> {
    let bases: Vec<String> = tables.iter().map(|t| display_name(&t.name)).collect();
    let mut taken: std::collections::HashSet<String> = taken.iter().cloned().collect();
    let mut out = Vec::with_capacity(bases.len());
    for base in &bases {
        let mut name = base.clone();
        let mut n = 2;
        // Skip names taken, and numbered names that are another table's own.
        while taken.contains(&name) || (name != *base && bases.contains(&name)) {
            name = format!("{base}{n}");
            n += 1;
        }
        taken.insert(name.clone());
        out.push(name);
    }
    out
}

/// A TOML basic string.
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `text` for a comment line: control characters (a line break would end
/// the comment) written as `\u{..}` escapes.
fn commented(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                format!("\\u{:04X}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The catalog query behind [`read_tables`]: one row per table of the
/// schema `$1` (plain and partitioned parents, not partitions), with what
/// [`TableFacts`] holds.
const TABLES_SQL: &str = "SELECT n.nspname::text AS schema, c.relname::text AS name, c.reltuples::int8 AS estimate, \
        pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) AS path, \
        ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a \
              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
              ORDER BY a.attnum) AS columns, \
        ARRAY(SELECT COALESCE(bt.typname, t.typname)::text FROM pg_catalog.pg_attribute a \
              JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
              LEFT JOIN pg_catalog.pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype \
              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
              ORDER BY a.attnum) AS types, \
        ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a \
              WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                AND a.atttypid = 'pg_catalog.timestamptz'::pg_catalog.regtype \
              ORDER BY a.attnum) AS timestamps, \
        ARRAY(SELECT a.attname::text FROM pg_catalog.pg_index i \
              JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
              WHERE i.indrelid = c.oid AND i.indisprimary ORDER BY a.attnum) AS primary_key, \
        ARRAY(SELECT DISTINCT a.attname::text FROM pg_catalog.pg_index i \
              JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
              WHERE i.indrelid = c.oid AND i.indisunique AND i.indimmediate AND i.indnkeyatts = 1 \
                AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attnotnull \
              ORDER BY 1) AS unique_not_null, \
        ARRAY(SELECT a.attname::text FROM pg_catalog.pg_constraint k \
              JOIN pg_catalog.pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = k.conkey[1] \
              WHERE k.conrelid = c.oid AND k.contype = 'f' AND pg_catalog.cardinality(k.conkey) = 1 \
              ORDER BY k.conname) AS fk_columns, \
        ARRAY(SELECT pg_catalog.quote_ident(tn.nspname) || '.' || pg_catalog.quote_ident(tc.relname) \
              FROM pg_catalog.pg_constraint k \
              JOIN pg_catalog.pg_class tc ON tc.oid = k.confrelid \
              JOIN pg_catalog.pg_namespace tn ON tn.oid = tc.relnamespace \
              WHERE k.conrelid = c.oid AND k.contype = 'f' AND pg_catalog.cardinality(k.conkey) = 1 \
              ORDER BY k.conname) AS fk_targets, \
        ARRAY(SELECT pg_catalog.quote_ident(ta.attname) FROM pg_catalog.pg_constraint k \
              JOIN pg_catalog.pg_attribute ta ON ta.attrelid = k.confrelid AND ta.attnum = k.confkey[1] \
              WHERE k.conrelid = c.oid AND k.contype = 'f' AND pg_catalog.cardinality(k.conkey) = 1 \
              ORDER BY k.conname) AS fk_target_keys, \
        (SELECT a.attname::text FROM pg_catalog.pg_partitioned_table p \
              JOIN pg_catalog.pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] \
              WHERE p.partrelid = c.oid AND p.partstrat = 'r' AND p.partnatts = 1) AS range_key, \
        c.relkind = 'p' AND EXISTS (SELECT 1 FROM pg_catalog.pg_partition_tree(c.oid) pt \
              JOIN pg_catalog.pg_constraint k ON k.confrelid = pt.relid \
                AND k.contype = 'f' AND k.conparentid = 0) AS referenced, \
        c.relkind <> 'p' OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_partition_tree(c.oid) pt \
              JOIN pg_catalog.pg_class pc ON pc.oid = pt.relid \
              WHERE NOT pg_catalog.pg_has_role(pc.relowner, 'USAGE')) AS owned \
     FROM pg_catalog.pg_class c \
     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
     WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition \
     ORDER BY c.relname";

/// Reads the schema's tables (plain and partitioned parents, not
/// partitions), leaving out Cohort's own.
pub(crate) async fn read_tables(
    conn: &mut sqlx::PgConnection,
    schema: &str,
) -> Result<Vec<TableFacts>, sqlx::Error> {
    let own: Vec<&str> = cohort::schema::CohortTable::ALL
        .iter()
        .map(|t| t.name())
        .collect();
    let rows = sqlx::query(TABLES_SQL).bind(schema).fetch_all(conn).await?;
    rows.iter()
        .map(table_facts)
        .filter(|t: &Result<TableFacts, sqlx::Error>| {
            t.as_ref().map_or(true, |t| !own.contains(&t.name.as_str()))
        })
        .collect()
}

/// One row of [`TABLES_SQL`] as a table's facts.
fn table_facts(r: &sqlx::postgres::PgRow) -> Result<TableFacts, sqlx::Error> {
    Ok(TableFacts {
        schema: r.try_get("schema")?,
        name: r.try_get("name")?,
        path: r.try_get("path")?,
        estimate: r.try_get("estimate")?,
        columns: r.try_get("columns")?,
        types: r.try_get("types")?,
        timestamps: r.try_get("timestamps")?,
        primary_key: r.try_get("primary_key")?,
        unique_not_null: r.try_get("unique_not_null")?,
        references: {
            let columns: Vec<String> = r.try_get("fk_columns")?;
            let targets: Vec<String> = r.try_get("fk_targets")?;
            let keys: Vec<String> = r.try_get("fk_target_keys")?;
            columns
                .into_iter()
                .zip(targets)
                .zip(keys)
                .map(|((column, target), target_key)| Reference {
                    column,
                    target,
                    target_key,
                })
                .collect()
        },
        range_key: r.try_get("range_key")?,
        referenced: r.try_get("referenced")?,
        owned: r.try_get("owned")?,
    })
}

/// The schema `init` proposes for Cohort's own tables: `cohort`, or
/// `cohort_ledger` when `cohort` is the schema whose tables it lists.
pub(crate) fn ledger_schema(inspected: &str) -> &'static str {
    if inspected == "cohort" {
        "cohort_ledger"
    } else {
        "cohort"
    }
}

/// What `init` wrote.
pub(crate) struct Written {
    pub(crate) entities: usize,
    pub(crate) without_timestamp: Vec<String>,
}

/// The policy file for `tables` of `schema`; each entity gets an id from
/// `new_id`.
pub(crate) fn render(
    schema: &str,
    tables: &[TableFacts],
    mut new_id: impl FnMut() -> uuid::Uuid,
) -> (String, Written) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Cohort policy file, started by `cohort init` from schema {} on {}.",
        quoted(schema),
        chrono::Utc::now().format("%Y-%m-%d")
    );
    out.push_str(
        "# Every table below is exempt (never touched) until you classify it: for each,\n\
         # either keep it exempt and write why, or remove `exempt`, uncomment the lines\n\
         # below it and name a [[category]]. Install Cohort's tables with `cohort migrate`,\n\
         # check with `cohort validate`, look with `cohort preview` before the first\n\
         # `cohort sweep`.\n\
         # The database URL comes from --database-url or DATABASE_URL (or [database] url).\n\n",
    );
    let tenants = tenant_tables(tables);
    // A top-level key: it must come before the first table.
    tenants_query_block(&mut out, tables, &tenants);
    out.push_str("[cohort]\n");
    // Cohort's ledger in a schema of its own, apart from the application's
    // tables: `cohort migrate` reads this line and installs it there.
    let _ = writeln!(
        out,
        "schema = {}                 # Cohort's own tables: `cohort migrate` installs them here\n\
         #                                   # (already installed elsewhere? name that schema)\n",
        quoted(ledger_schema(schema))
    );
    let (with, without): (Vec<&TableFacts>, Vec<&TableFacts>) =
        tables.iter().partition(|t| anchor(t).is_some());
    let without_timestamp: Vec<String> = without.iter().map(|t| t.name.clone()).collect();
    if !without.is_empty() {
        out.push_str(
            "# Tables without a timestamptz column (no age to retain them by), left out:\n",
        );
        for t in &without {
            let _ = writeln!(out, "#   {}", commented(&t.path));
        }
        out.push('\n');
    }
    let names = display_names(&with, &[]);
    for (t, name) in with.iter().zip(&names) {
        entity_block(&mut out, t, name, new_id(), &tenants);
    }
    out.push_str(CATEGORY_TEMPLATES);
    (
        out,
        Written {
            entities: with.len(),
            without_timestamp,
        },
    )
}

/// The `[[category]]` examples at the end of a new file, commented: each
/// strategy's name, and an archive, which needs an `archive_table` on every
/// entity of it. Uncommented (`# ` taken off each line) they validate.
const CATEGORY_TEMPLATES: &str = "\
# [[category]]
# name = \"...\"
# strategy = \"purge\"                # purge | soft_delete | anonymise | archive | exempt
# period = \"365d\"

# [[category]]                      # archive: moves the expired rows of each entity of it
# name = \"archived\"                 # into its archive_table (a table you create with the
# strategy = \"archive\"              # same columns; see docs/archive.md)
# period = \"2y\"
";

/// The commented `tenants_query` reading the table the tenant columns
/// point at ([`tenant_source`]), when there is one.
fn tenants_query_block(
    out: &mut String,
    tables: &[TableFacts],
    tenant_tables: &std::collections::BTreeSet<String>,
) {
    let Some((table, key)) = tenant_source(tables, tenant_tables) else {
        return;
    };
    let _ = writeln!(
        out,
        "# Tenants: the tenant columns below point at {}. `cohort sweep --all-tenants`\n\
         # and `cohort worker` sweep each tenant this query returns (its id; a jurisdiction\n\
         # and tags may follow); uncomment it, or list the tenants as [[tenant]] tables:\n\
         # tenants_query = {}\n",
        commented(&table),
        quoted(&format!("SELECT {key} FROM {table}"))
    );
}

/// A commented proposal with a note after it, aligned as the others.
fn proposal(out: &mut String, line: &str, note: &str) {
    let _ = writeln!(out, "{line:<35} # {note}");
}

/// What `pg_class.reltuples` says of a table's rows.
fn rows(estimate: i64) -> String {
    match estimate {
        1 => "about 1 row".to_owned(),
        n if n > 0 => format!("about {n} rows"),
        0 => "no rows in the planner's statistics".to_owned(),
        _ => "the planner has no statistics for it yet (no row estimate before ANALYZE)".to_owned(),
    }
}

/// One table's `[[entity]]`, exempt until classified, with the lines a
/// person uncomments to retain it (its anchor, tenant, record key, erasure
/// subjects and partition purge as found). `t` has a timestamptz column.
fn entity_block(
    out: &mut String,
    t: &TableFacts,
    name: &str,
    id: uuid::Uuid,
    tenant_tables: &std::collections::BTreeSet<String>,
) {
    let anchor = anchor(t).expect("partitioned by anchor");
    let _ = writeln!(out, "# {}: {}", commented(&t.path), rows(t.estimate));
    out.push_str("[[entity]]\n");
    let _ = writeln!(out, "name = {}", quoted(name));
    let _ = writeln!(out, "id = \"{id}\"");
    let _ = writeln!(out, "table = {}", quoted(&t.path));
    out.push_str("exempt = \"not yet classified\"\n");
    out.push_str("# To retain it, remove `exempt` and choose:\n");
    out.push_str("# category = \"...\"                  # one of the [[category]] names\n");
    anchor_line(out, t, anchor);
    let tenant = tenant(t, tenant_tables);
    tenant_line(out, tenant);
    record_id_line(out, t);
    let subjects = subjects(t, tenant);
    if !subjects.is_empty() {
        let list: Vec<String> = subjects.iter().map(|s| quoted(s)).collect();
        proposal(
            out,
            &format!("# subjects = [{}]", list.join(", ")),
            "erasure (`cohort erase`) finds a person's rows by these",
        );
    }
    partitions_line(out, t, anchor);
    out.push('\n');
}

/// The proposed anchor, and the table's other timestamptz columns.
fn anchor_line(out: &mut String, t: &TableFacts, anchor: &str) {
    let others: Vec<&str> = t
        .timestamps
        .iter()
        .map(String::as_str)
        .filter(|c| *c != anchor)
        .collect();
    let _ = write!(out, "# anchor = {}", quoted(anchor));
    if others.is_empty() {
        out.push('\n');
    } else {
        let _ = writeln!(
            out,
            "              # other timestamptz columns: {}",
            commented(&others.join(", "))
        );
    }
}

/// The proposed tenant column, or `tenantless`.
fn tenant_line(out: &mut String, tenant: Option<&str>) {
    match tenant {
        Some("tenant_id") => out.push_str(
            "#                                   # tenant column: tenant_id (the default)\n",
        ),
        Some(col) => {
            let _ = writeln!(out, "# tenant = {}", quoted(col));
        }
        None => {
            out.push_str("# tenantless = true                 # no column reads as a tenant id\n")
        }
    }
}

/// The proposed record key when it is not `id`: the primary key, else a
/// unique NOT NULL column.
fn record_id_line(out: &mut String, t: &TableFacts) {
    match t.primary_key.as_slice() {
        [id] if id == "id" => {}
        [key] => {
            let _ = writeln!(out, "# record_id = {}", quoted(key));
        }
        [] => match t.unique_not_null.as_slice() {
            [] => {
                out.push_str("# (no primary key: Cohort needs a unique single-column record key)\n")
            }
            [key, rest @ ..] => {
                let _ = write!(out, "# record_id = {}", quoted(key));
                if rest.is_empty() {
                    out.push_str("              # unique and not null (no primary key)\n");
                } else {
                    let _ = writeln!(
                        out,
                        "              # unique and not null; so are: {}",
                        commented(&rest.join(", "))
                    );
                }
            }
        },
        keys => {
            let _ = writeln!(
                out,
                "# record_id = [{}]",
                keys.iter()
                    .map(|k| quoted(k))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
}

/// Partition purge, for a table range partitioned on its anchor: proposed
/// when validation would accept it, else what it would need.
fn partitions_line(out: &mut String, t: &TableFacts, anchor: &str) {
    if t.range_key.as_deref() != Some(anchor) {
        return;
    }
    match partition_drop_blocked(t) {
        None => proposal(
            out,
            "# partitions = \"drop\"",
            "with a category that purges: expired partitions dropped whole",
        ),
        Some(needs) => {
            let _ = writeln!(
                out,
                "# (range partitioned on the anchor; partitions = \"drop\" would need {needs})"
            );
        }
    }
}

/// What `init --update` adds to an existing policy: the `[[entity]]`
/// blocks of the `tables` (of one schema or several) with a timestamptz
/// column that no entity names (its table or its archive's) and
/// `ignore_tables` does not hold, named apart from the entities already
/// there, under one header per schema. Returns the text to append (empty
/// when nothing is new) and the tables added.
fn render_update(
    tables: &[TableFacts],
    policy: &cohort::policy::PolicyFile,
    mut new_id: impl FnMut() -> uuid::Uuid,
) -> (String, Vec<String>) {
    let default_schema = policy.config.table_schema();
    let mut mentioned: Vec<cohort::QualifiedName> = policy
        .entities
        .iter()
        .flat_map(|e| e.named_tables(default_schema))
        .collect();
    mentioned.extend(
        policy
            .config
            .ignore_tables
            .iter()
            .filter_map(|t| cohort::QualifiedName::parse(t, default_schema).ok()),
    );
    let new: Vec<&TableFacts> = tables
        .iter()
        .filter(|t| anchor(t).is_some())
        .filter(|t| {
            !mentioned.contains(&cohort::QualifiedName::new(
                t.schema.as_str(),
                t.name.as_str(),
            ))
        })
        .collect();
    if new.is_empty() {
        return (String::new(), Vec::new());
    }
    let taken: Vec<String> = policy
        .entities
        .iter()
        .map(|e| e.name().to_owned())
        .collect();
    let names = display_names(&new, &taken);
    let tenants = tenant_tables(tables);
    let mut out = String::new();
    let mut schema: Option<&str> = None;
    for (t, name) in new.iter().zip(&names) {
        if schema != Some(t.schema.as_str()) {
            schema = Some(&t.schema);
            // `update_schemas` reads this line back.
            let _ = writeln!(
                out,
                "\n# Added by `cohort init --update` from schema {} on {}: tables that appeared\n\
                 # since this file was written, exempt until you classify them.\n",
                quoted(&t.schema),
                chrono::Utc::now().format("%Y-%m-%d")
            );
        }
        entity_block(&mut out, t, name, new_id(), &tenants);
    }
    (out, new.iter().map(|t| t.path.clone()).collect())
}

/// The starts of the comment lines `init` and `init --update` write,
/// followed by the schema they read as a TOML string.
const MADE_FROM: &[&str] = &[
    "# Cohort policy file, started by `cohort init` from schema ",
    "# Added by `cohort init --update` from schema ",
];

/// The TOML basic string at the start of `s`, as [`quoted`] writes it.
fn unquoted(s: &str) -> Option<String> {
    let mut chars = s.strip_prefix('"')?.chars();
    let mut out = String::new();
    loop {
        match chars.next()? {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    let code = u32::from_str_radix(&hex, 16)
                        .ok()
                        .filter(|_| hex.len() == 4)?;
                    out.push(char::from_u32(code)?);
                }
                _ => return None,
            },
            c if c.is_control() => return None,
            c => out.push(c),
        }
    }
}

/// The schemas `init --update` reads: `explicit` (`--schema`) when given;
/// else those the file's own `init` lines name ([`MADE_FROM`]), then those
/// of the tables its entities name (their archives' too: the schemas
/// `validate` looks for tables the policy does not mention in). Refused,
/// with the reason, when a line of `init`'s cannot be read or nothing
/// names a schema.
fn update_schemas(
    text: &str,
    policy: &cohort::policy::PolicyFile,
    explicit: Option<&str>,
) -> Result<Vec<String>, String> {
    if let Some(schema) = explicit {
        return Ok(vec![schema.to_owned()]);
    }
    let mut schemas: Vec<String> = Vec::new();
    let mut add = |schema: String| {
        if !schemas.contains(&schema) {
            schemas.push(schema);
        }
    };
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        let Some(rest) = MADE_FROM.iter().find_map(|m| line.strip_prefix(m)) else {
            continue;
        };
        match unquoted(rest).filter(|s| !s.is_empty()) {
            Some(schema) => add(schema),
            None => {
                return Err(format!(
                    "line {} says which schema `cohort init` read, but the schema's name cannot be read there ({:?})",
                    n + 1,
                    line
                ))
            }
        }
    }
    let default_schema = policy.config.table_schema();
    for e in &policy.entities {
        for t in e.named_tables(default_schema) {
            add(t.schema);
        }
    }
    if schemas.is_empty() {
        return Err(
            "it does not say which schema it was made from: no line `cohort init` writes names one, and no entity names a table"
                .to_owned(),
        );
    }
    Ok(schemas)
}

/// `schema "app"`, or `schemas "app", "vault"`.
fn schemas_shown(schemas: &[String]) -> String {
    let list: Vec<String> = schemas.iter().map(|s| format!("{s:?}")).collect();
    match list.as_slice() {
        [one] => format!("schema {one}"),
        _ => format!("schemas {}", list.join(", ")),
    }
}

/// `cohort init --update`: appends to the policy file `output` the tables
/// that appeared since it was written, exempt until classified, reading
/// `schema` or, without it, the schemas the file was made from
/// ([`update_schemas`]); what a person wrote stays byte for byte. Refused
/// (exit 2, nothing written) when the file cannot be read or parsed, does
/// not say which schemas, or one of them has no tables.
pub(crate) async fn update(cli: &Cli, schema: Option<&str>, output: &Path) -> Result<(), Failure> {
    let refuse = |what: String| Failure::Input(Error::InvalidInput(what));
    let before = std::fs::read_to_string(output).map_err(|e| {
        refuse(format!(
            "{} cannot be read ({e}); `cohort init` without --update writes a new one",
            output.display()
        ))
    })?;
    let policy = cohort::policy::PolicyFile::parse(&before).map_err(|e| {
        refuse(format!(
            "{} is not a valid policy file, so what it mentions is not known; nothing written: {e}",
            output.display()
        ))
    })?;
    let schemas = update_schemas(&before, &policy, schema).map_err(|why| {
        refuse(format!(
            "{}: {why}; nothing written (name the schema with --schema)",
            output.display()
        ))
    })?;
    let url = crate::open::database_url(cli, Some(&policy))?;
    let mut conn = crate::open::connect(&url).await?;
    let mut tables = Vec::new();
    for s in &schemas {
        let found = read_tables(&mut conn, s)
            .await
            .map_err(|e| Failure::Run(e.into()))?;
        if found.is_empty() {
            let named = if schema.is_some() {
                String::new()
            } else {
                format!(", though {} names it", output.display())
            };
            return Err(refuse(format!(
                "schema {s:?} has no tables (names are case-sensitive){named}; nothing written"
            )));
        }
        tables.extend(found);
    }
    let (added_text, added) = render_update(&tables, &policy, uuid::Uuid::new_v4);
    if !added.is_empty() {
        append(output, &before, &added_text)?;
    }
    if cli.json {
        crate::output::print_json(&serde_json::json!({
            "output": output.display().to_string(),
            "schemas": schemas,
            "added": added,
        }));
    } else if added.is_empty() {
        outln!(
            "{}: no table of {} with a timestamptz column is missing from it; nothing written",
            output.display(),
            schemas_shown(&schemas)
        );
    } else {
        outln!(
            "added {} table(s) of {} to {}, every one exempt until you classify it: {}",
            added.len(),
            schemas_shown(&schemas),
            output.display(),
            added.join(", ")
        );
    }
    Ok(())
}

/// The line ending `text` uses: its first line's (`\n` for a single line).
fn line_ending(text: &str) -> &'static str {
    match text.find('\n') {
        Some(at) if text[..at].ends_with('\r') => "\r\n",
        _ => "\n",
    }
}

/// Appends `added` (written with `\n`) to the policy file at `path`, whose
/// text was `before`, in the file's own line endings: the new text is
/// written beside it, with its permissions, and renamed over it, so the
/// file is never seen half-written, and what it held stays byte for byte.
/// Refused when the file changed since it was read.
fn append(path: &Path, before: &str, added: &str) -> Result<(), Failure> {
    let refuse = |what: String| Failure::Input(Error::InvalidInput(what));
    let now = std::fs::read_to_string(path)
        .map_err(|e| refuse(format!("cannot read {}: {e}", path.display())))?;
    if now != before {
        return Err(refuse(format!(
            "{} changed while it was being updated; nothing written (run again)",
            path.display()
        )));
    }
    let mut next = path.as_os_str().to_owned();
    next.push(".cohort-update");
    let next = std::path::PathBuf::from(next);
    let added = added.replace('\n', line_ending(before));
    let text = format!("{before}{added}");
    std::fs::write(&next, text.as_bytes())
        .and_then(|()| std::fs::set_permissions(&next, std::fs::metadata(path)?.permissions()))
        .and_then(|()| std::fs::rename(&next, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&next);
            refuse(format!("cannot write {}: {e}", path.display()))
        })
}

/// The refusal to replace an existing file without `--force`.
pub(crate) fn kept(path: &Path) -> Failure {
    Failure::Input(Error::InvalidInput(format!(
        "{} exists; it is kept (pass --force to replace it)",
        path.display()
    )))
}

/// Writes `text` to `path`: never over an existing file unless `force`.
pub(crate) fn write(path: &Path, text: &str, force: bool) -> Result<(), Failure> {
    let refuse = |what: String| Failure::Input(Error::InvalidInput(what));
    let mut file = if force {
        std::fs::File::create(path)
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
    }
    .map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => kept(path),
        _ => refuse(format!("cannot write {}: {e}", path.display())),
    })?;
    file.write_all(text.as_bytes())
        .map_err(|e| refuse(format!("cannot write {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str, columns: &[&str], timestamps: &[&str], pk: &[&str]) -> TableFacts {
        let v = |s: &[&str]| s.iter().map(|c| c.to_string()).collect();
        TableFacts {
            schema: "app".into(),
            name: name.into(),
            path: cohort::QualifiedName::new("app", name).path(),
            estimate: 0,
            columns: v(columns),
            types: columns
                .iter()
                .map(|c| {
                    if timestamps.contains(c) {
                        "timestamptz".to_owned()
                    } else {
                        "int8".to_owned()
                    }
                })
                .collect(),
            timestamps: v(timestamps),
            primary_key: v(pk),
            unique_not_null: Vec::new(),
            references: Vec::new(),
            range_key: None,
            referenced: false,
            owned: true,
        }
    }

    fn referencing(mut t: TableFacts, column: &str, target: &str) -> TableFacts {
        t.references.push(Reference {
            column: column.into(),
            target: format!("app.{target}"),
            target_key: "id".into(),
        });
        t
    }

    /// An `account_id` is a tenant only when most tables point at the
    /// same table through it; one table's is a plain column.
    #[test]
    fn an_account_id_referenced_from_most_tables_reads_as_the_tenant() {
        let cols = &["id", "account_id", "created_at"];
        let ts = &["created_at"];
        let tables = vec![
            table("accounts", &["id", "created_at"], ts, &["id"]),
            referencing(
                table("projects", cols, ts, &["id"]),
                "account_id",
                "accounts",
            ),
            referencing(
                table("invoices", cols, ts, &["id"]),
                "account_id",
                "accounts",
            ),
            referencing(
                table("comments", cols, ts, &["id"]),
                "Account_ID",
                "accounts",
            ),
            table("events", &["id", "created_at"], ts, &["id"]),
        ];
        let tenants = tenant_tables(&tables);
        assert_eq!(tenants.iter().collect::<Vec<_>>(), ["app.accounts"]);
        assert_eq!(tenant(&tables[1], &tenants), Some("account_id"));
        assert_eq!(tenant(&tables[3], &tenants), Some("Account_ID"));
        assert_eq!(tenant(&tables[4], &tenants), None);
        let (text, _) = render("app", &tables, uuid::Uuid::new_v4);
        assert_eq!(
            text.matches("# tenant = \"account_id\"").count(),
            2,
            "{text}"
        );
        // The table they point at lists the tenants, before [cohort].
        assert!(
            text.contains("# tenants_query = \"SELECT id FROM app.accounts\"\n\n[cohort]\n"),
            "{text}"
        );
        // Two of four other tables is not most: no tenant is proposed.
        let fewer: Vec<TableFacts> = tables
            .iter()
            .cloned()
            .map(|mut t| {
                if t.name == "comments" {
                    t.references.clear();
                }
                t
            })
            .collect();
        let tenants = tenant_tables(&fewer);
        assert!(tenants.is_empty(), "{tenants:?}");
        assert_eq!(tenant(&fewer[1], &tenants), None);
        // A name that reads as a tenant needs no reference.
        let org = table("orders", &["id", "org_id", "created_at"], ts, &["id"]);
        assert_eq!(tenant(&org, &tenants), Some("org_id"));
    }

    #[test]
    fn anchor_choice_table() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (&["updated_at", "created_at"], Some("created_at")),
            (&["deleted_at", "updated_at"], Some("updated_at")),
            (&["first_seen", "date_created"], Some("date_created")),
            (&["first_seen", "last_seen"], Some("first_seen")),
            (&["deleted_at", "anonymised_at"], None),
            (&[], None),
        ];
        for (timestamps, expected) in cases {
            let t = table("t", timestamps, timestamps, &["id"]);
            assert_eq!(anchor(&t), *expected, "{timestamps:?}");
        }
    }

    #[test]
    fn names_and_quoting() {
        assert_eq!(display_name("order_lines"), "OrderLines");
        assert_eq!(display_name("events2024"), "Events2024");
        assert_eq!(display_name("_"), "Table");
        assert_eq!(display_name("é"), "É");
        let tables: Vec<TableFacts> = [
            "Order_Lines",
            "order-lines",
            "order_lines",
            "OrderLines2",
            "_",
            "__",
        ]
        .iter()
        .map(|n| table(n, &[], &[], &[]))
        .collect();
        let names = display_names(&tables.iter().collect::<Vec<_>>(), &[]);
        assert_eq!(
            names,
            [
                "OrderLines",
                "OrderLines3",
                "OrderLines4",
                "OrderLines2",
                "Table",
                "Table2"
            ]
        );
        assert_eq!(quoted("a\"b\\c\u{1}"), "\"a\\\"b\\\\c\\u0001\"");
    }

    #[test]
    fn rendered_file_parses_as_a_policy() {
        let tables = vec![
            table(
                "orders",
                &["order_id", "organisation_id", "placed_at", "created_at"],
                &["placed_at", "created_at"],
                &["order_id"],
            ),
            table("settings", &["key", "value"], &[], &["key"]),
            table("we\"ird", &["id", "at"], &["at"], &[]),
            table(
                "audit_log",
                &["id", "logged_at", "tenant_id"],
                &["logged_at"],
                &["id", "logged_at"],
            ),
        ];
        let (text, written) = render("app", &tables, uuid::Uuid::new_v4);
        assert_eq!(written.entities, 3);
        assert_eq!(written.without_timestamp, vec!["settings".to_string()]);
        let policy = cohort::policy::PolicyFile::parse(&text).unwrap();
        assert_eq!(policy.entities.len(), 3);
        assert!(policy.entities.iter().all(|e| e.is_exempt()));
        // A composite primary key is proposed as the composite record key
        // (the newcomer's partitioned audit_log), a line that parses.
        assert!(
            text.contains(r#"# record_id = ["id", "logged_at"]"#),
            "{text}"
        );
        // Cohort's ledger goes to a schema of its own, not the application's.
        assert_eq!(policy.config.schema, "cohort", "{text}");
        let (text, _) = render("cohort", &tables, uuid::Uuid::new_v4);
        let policy = cohort::policy::PolicyFile::parse(&text).unwrap();
        assert_eq!(policy.config.schema, "cohort_ledger", "{text}");
        assert!(text.contains("# anchor = \"created_at\""), "{text}");
        assert!(text.contains("# tenant = \"organisation_id\""), "{text}");
        assert!(text.contains("# record_id = \"order_id\""), "{text}");
        assert!(text.contains(r#"table = "app.\"we\"\"ird\"""#), "{text}");
    }

    /// A proposed line with its `# ` taken off, as a person uncomments it.
    fn proposed(line: &str) -> Option<&str> {
        line.strip_prefix("# ").filter(|rest| {
            rest.starts_with("[[")
                || rest.split_once(" = ").is_some_and(|(key, _)| {
                    key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
        })
    }

    fn typed(mut t: TableFacts, column: &str, ty: &str) -> TableFacts {
        let at = t
            .columns
            .iter()
            .position(|c| c == column)
            .expect("a column");
        t.types[at] = ty.into();
        t
    }

    /// Erasure subjects: person-like names of a key type, never the
    /// tenant; partition purge: only on the anchor, and only when
    /// validation would accept it.
    #[test]
    fn subjects_and_partition_purge_are_proposed_where_they_validate() {
        let t = typed(
            typed(
                table(
                    "events",
                    &[
                        "id",
                        "tenant_id",
                        "user_id",
                        "Author_UserId",
                        "customer_id",
                        "member_id",
                        "logged_at",
                        "created_at",
                    ],
                    &["logged_at", "created_at"],
                    &["id", "logged_at"],
                ),
                "customer_id",
                "jsonb",
            ),
            "member_id",
            "uuid",
        );
        assert_eq!(
            subjects(&t, Some("tenant_id")),
            ["user_id", "Author_UserId", "member_id"]
        );
        assert_eq!(
            subjects(&t, Some("user_id")),
            ["Author_UserId", "member_id"]
        );
        let block = |t: &TableFacts| {
            let mut out = String::new();
            entity_block(
                &mut out,
                t,
                "Events",
                uuid::Uuid::nil(),
                &Default::default(),
            );
            out
        };
        let text = block(&t);
        assert!(
            text.contains("# subjects = [\"user_id\", \"Author_UserId\", \"member_id\"]"),
            "{text}"
        );
        assert!(!text.contains("partitions"), "not partitioned:\n{text}");
        // Range partitioned on logged_at: that is the anchor, dropped whole.
        let mut p = t.clone();
        p.range_key = Some("logged_at".into());
        assert_eq!(anchor(&p), Some("logged_at"));
        let text = block(&p);
        assert!(text.contains("# anchor = \"logged_at\""), "{text}");
        assert!(text.contains("# partitions = \"drop\" "), "{text}");
        // What validation would refuse is said, not proposed.
        for (referenced, owned, needs) in [
            (true, true, "no foreign key referencing"),
            (false, false, "the owner"),
        ] {
            let blocked = TableFacts {
                referenced,
                owned,
                ..p.clone()
            };
            let text = block(&blocked);
            assert!(!text.contains("# partitions = \"drop\" "), "{text}");
            assert!(text.contains(needs), "{text}");
        }
        // Partitioned on a column that is not a timestamptz: not the anchor.
        let mut by_id = t.clone();
        by_id.range_key = Some("id".into());
        assert_eq!(anchor(&by_id), Some("created_at"));
        assert!(!block(&by_id).contains("partitions"));
        // A template of every strategy, the archive among them, that
        // parses once uncommented.
        let (text, _) = render("app", std::slice::from_ref(&p), uuid::Uuid::new_v4);
        let uncommented: String = text
            .lines()
            .map(|l| proposed(l).unwrap_or(l))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
            .replace("exempt = \"not yet classified\"\n", "");
        let policy = cohort::policy::PolicyFile::parse(&uncommented)
            .unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
        assert!(policy.entities.iter().all(|e| !e.is_exempt()));
        assert!(text.contains("| archive |"), "{text}");
        assert!(
            uncommented.contains("strategy = \"archive\""),
            "{uncommented}"
        );
    }

    #[test]
    fn row_estimates_say_what_the_planner_knows() {
        assert_eq!(rows(42), "about 42 rows");
        assert_eq!(rows(1), "about 1 row");
        assert!(rows(0).contains("no rows in the planner's statistics"));
        assert!(rows(-1).contains("the planner has no statistics for it yet"));
    }

    #[test]
    fn quoted_names_read_back() {
        for s in [
            "app",
            "we\"ird",
            "back\\slash",
            "line\nbreak",
            "é",
            "\u{7f}",
        ] {
            assert_eq!(unquoted(&quoted(s)).as_deref(), Some(s), "{s:?}");
        }
        for bad in ["app", "\"open", "\"bad\\x\"", "\"\\u12\""] {
            assert_eq!(unquoted(bad), None, "{bad:?}");
        }
        assert_eq!(unquoted("\"app\" on 2026-01-01.").as_deref(), Some("app"));
    }

    /// `--update` reads the schema the header names, then the entities'
    /// tables' schemas; `--schema` wins; it refuses when it cannot tell.
    #[test]
    fn the_schemas_an_update_reads() {
        let tables = [table(
            "orders",
            &["id", "created_at"],
            &["created_at"],
            &["id"],
        )];
        let (text, _) = render("we\"ird", &tables, uuid::Uuid::new_v4);
        let policy = cohort::policy::PolicyFile::parse(&text).unwrap();
        let schemas = |text: &str, explicit| update_schemas(text, &policy, explicit);
        assert_eq!(schemas(&text, None).unwrap(), ["we\"ird", "app"]);
        assert_eq!(
            schemas(&text.replace('\n', "\r\n"), None).unwrap(),
            ["we\"ird", "app"]
        );
        assert_eq!(schemas(&text, Some("x")).unwrap(), ["x"]);
        let (added, _) = render_update(
            &[TableFacts {
                schema: "other".into(),
                ..table("new", &["id", "at"], &["at"], &["id"])
            }],
            &policy,
            uuid::Uuid::new_v4,
        );
        assert_eq!(
            schemas(&format!("{text}{added}"), None).unwrap(),
            ["we\"ird", "other", "app"]
        );
        // No header: the entities' tables say it.
        let body: String = text.lines().skip(1).map(|l| format!("{l}\n")).collect();
        assert_eq!(schemas(&body, None).unwrap(), ["app"]);
        // Nothing says it.
        let empty = "[cohort]\nschema = \"cohort\"\n";
        let none = cohort::policy::PolicyFile::parse(empty).unwrap();
        let why = update_schemas(empty, &none, None).unwrap_err();
        assert!(why.contains("does not say which schema"), "{why}");
        assert_eq!(update_schemas(empty, &none, Some("app")).unwrap(), ["app"]);
        // A header edited past reading is not guessed around.
        let edited = text.replacen("from schema \"we\\\"ird\"", "from schema we-ird", 1);
        assert_ne!(edited, text);
        let why = schemas(&edited, None).unwrap_err();
        assert!(why.starts_with("line 1 "), "{why}");
    }

    #[test]
    fn the_line_ending_of_a_file_is_its_first_lines() {
        assert_eq!(line_ending("a\r\nb\n"), "\r\n");
        assert_eq!(line_ending("a\nb\r\n"), "\n");
        assert_eq!(line_ending("a"), "\n");
        assert_eq!(line_ending(""), "\n");
    }
}
