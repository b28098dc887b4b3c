//! `cohort init`: a starter policy file from the live catalog. Every table
//! of the schema with a `timestamptz` column becomes an `[[entity]]` with a
//! fresh id, `exempt = "not yet classified"` until a person chooses, and
//! comments proposing the anchor, tenant and record key it found. Its
//! `[cohort] schema` puts Cohort's own tables in a schema of their own.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use sqlx::Row;

use crate::Failure;
use cohort::Error;

/// One table as `init` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableFacts {
    pub(crate) name: String,
    /// `schema.table` as PostgreSQL's `quote_ident` writes each part: what
    /// the policy file's `table` gets, so that it round-trips exactly.
    pub(crate) path: String,
    /// `pg_class.reltuples` (-1 or 0 when never analysed).
    pub(crate) estimate: i64,
    pub(crate) columns: Vec<String>,
    pub(crate) timestamps: Vec<String>,
    pub(crate) primary_key: Vec<String>,
    /// Columns that are NOT NULL and alone make an immediate, non-partial
    /// unique index: record keys when there is no primary key.
    pub(crate) unique_not_null: Vec<String>,
    /// Single-column foreign keys: (column, the referenced table's `path`).
    pub(crate) references: Vec<(String, String)>,
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

/// The likeliest anchor: a known name, then one mentioning creation or
/// occurrence, then the first `timestamptz` column; never Cohort's own
/// markers.
pub(crate) fn anchor(t: &TableFacts) -> Option<&str> {
    let candidates: Vec<&str> = t
        .timestamps
        .iter()
        .map(String::as_str)
        .filter(|c| !matches!(*c, "deleted_at" | "anonymised_at"))
        .collect();
    ANCHORS
        .iter()
        .find(|a| candidates.contains(a))
        .copied()
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
        for (column, target) in &t.references {
            if by_reference_only(column) && *target != t.path {
                referencing.entry(target).or_default().insert(&t.path);
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
                .find(|(column, target)| {
                    by_reference_only(column) && tenant_tables.contains(target)
                })
                .map(|(column, _)| column.as_str())
        })
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
    let rows = sqlx::query(
        "SELECT c.relname::text AS name, c.reltuples::int8 AS estimate, \
            pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.relname) AS path, \
            ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute a \
                  WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
                  ORDER BY a.attnum) AS columns, \
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
                  ORDER BY k.conname) AS fk_targets \
         FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition \
         ORDER BY c.relname",
    )
    .bind(schema)
    .fetch_all(conn)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(TableFacts {
                name: r.try_get("name")?,
                path: r.try_get("path")?,
                estimate: r.try_get("estimate")?,
                columns: r.try_get("columns")?,
                timestamps: r.try_get("timestamps")?,
                primary_key: r.try_get("primary_key")?,
                unique_not_null: r.try_get("unique_not_null")?,
                references: {
                    let columns: Vec<String> = r.try_get("fk_columns")?;
                    let targets: Vec<String> = r.try_get("fk_targets")?;
                    columns.into_iter().zip(targets).collect()
                },
            })
        })
        .filter(|t: &Result<TableFacts, sqlx::Error>| {
            t.as_ref().map_or(true, |t| !own.contains(&t.name.as_str()))
        })
        .collect()
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
         # The database URL comes from --database-url or DATABASE_URL (or [database] url).\n\n\
         [cohort]\n",
    );
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
            let _ = writeln!(out, "#   {}", t.path);
        }
        out.push('\n');
    }
    let names = display_names(&with, &[]);
    let tenants = tenant_tables(tables);
    for (t, name) in with.iter().zip(&names) {
        entity_block(&mut out, t, name, new_id(), &tenants);
    }
    out.push_str(
        "# [[category]]\n\
         # name = \"...\"\n\
         # strategy = \"purge\"                # purge | soft_delete | anonymise | exempt\n\
         # period = \"365d\"\n",
    );
    (
        out,
        Written {
            entities: with.len(),
            without_timestamp,
        },
    )
}

/// One table's `[[entity]]`, exempt until classified, with the lines a
/// person uncomments to retain it (its anchor, tenant and record key as
/// found). `t` has a timestamptz column.
fn entity_block(
    out: &mut String,
    t: &TableFacts,
    name: &str,
    id: uuid::Uuid,
    tenant_tables: &std::collections::BTreeSet<String>,
) {
    let anchor = anchor(t).expect("partitioned by anchor");
    let rows = if t.estimate > 0 {
        format!("about {} rows", t.estimate)
    } else {
        "not analysed yet".to_owned()
    };
    let _ = writeln!(out, "# {}: {rows}", t.path);
    out.push_str("[[entity]]\n");
    let _ = writeln!(out, "name = {}", quoted(name));
    let _ = writeln!(out, "id = \"{id}\"");
    let _ = writeln!(out, "table = {}", quoted(&t.path));
    out.push_str("exempt = \"not yet classified\"\n");
    out.push_str("# To retain it, remove `exempt` and choose:\n");
    out.push_str("# category = \"...\"                  # one of the [[category]] names\n");
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
            others.join(", ")
        );
    }
    match tenant(t, tenant_tables) {
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
                        rest.join(", ")
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
    out.push('\n');
}

/// What `init --update` adds to an existing policy: the `[[entity]]`
/// blocks of the tables of `schema` with a timestamptz column that no
/// entity names (its table or its archive's) and `ignore_tables` does not
/// hold, named apart from the entities already there. Returns the text to
/// append (empty when nothing is new) and the tables added.
pub(crate) fn render_update(
    schema: &str,
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
        .filter(|t| !mentioned.contains(&cohort::QualifiedName::new(schema, t.name.as_str())))
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
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n# Added by `cohort init --update` from schema {} on {}: tables that appeared\n\
         # since this file was written, exempt until you classify them.\n",
        quoted(schema),
        chrono::Utc::now().format("%Y-%m-%d")
    );
    let tenants = tenant_tables(tables);
    for (t, name) in new.iter().zip(&names) {
        entity_block(&mut out, t, name, new_id(), &tenants);
    }
    (out, new.iter().map(|t| t.path.clone()).collect())
}

/// Appends `added` to the policy file at `path`, whose text was `before`:
/// the new text is written beside it and renamed over it, so the file is
/// never seen half-written, and what it held stays byte for byte. Refused
/// when the file changed since it was read.
pub(crate) fn append(path: &Path, before: &str, added: &str) -> Result<(), Failure> {
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
    let text = format!("{before}{added}");
    std::fs::write(&next, text.as_bytes())
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
            name: name.into(),
            path: cohort::QualifiedName::new("app", name).path(),
            estimate: 0,
            columns: v(columns),
            timestamps: v(timestamps),
            primary_key: v(pk),
            unique_not_null: Vec::new(),
            references: Vec::new(),
        }
    }

    fn referencing(mut t: TableFacts, column: &str, target: &str) -> TableFacts {
        t.references.push((column.into(), format!("app.{target}")));
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
}
