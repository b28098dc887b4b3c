//! Every statement in the snapshots calls PostgreSQL's built-in functions
//! as `pg_catalog.name(...)`: a role that can put a schema of its own ahead
//! of `pg_catalog` in the connection's `search_path` could otherwise shadow
//! them with exact overloads. SQL syntax that looks like a call (`COALESCE`,
//! `NULLIF`, `GREATEST`, `LEAST`, `EXISTS`, `CASE`, `CAST`, `EXTRACT`, `ANY`,
//! `ARRAY[...]`, `ROW(...)`) is not a function and is not listed.

use std::path::Path;

/// Built-in functions that must be called schema-qualified. A name ending
/// in `*` stands for every function whose name starts with the rest.
const BUILTINS: &[&str] = &[
    // aggregates and window functions
    "count",
    "sum",
    "min",
    "max",
    "avg",
    "string_agg",
    "array_agg",
    "bool_or",
    "bool_and",
    "jsonb_agg",
    "jsonb_object_agg",
    "json_agg",
    "row_number",
    "rank",
    "dense_rank",
    "ntile",
    "lead",
    "lag",
    "first_value",
    "last_value",
    // json
    "jsonb_build_object",
    "jsonb_build_array",
    "json_build_object",
    "json_build_array",
    "jsonb_array_elements",
    "jsonb_array_elements_text",
    "jsonb_array_length",
    "jsonb_each",
    "jsonb_each_text",
    "jsonb_object_keys",
    "jsonb_typeof",
    "jsonb_extract_path",
    "jsonb_extract_path_text",
    "jsonb_populate_record",
    "jsonb_populate_recordset",
    "jsonb_set",
    "jsonb_strip_nulls",
    "to_jsonb",
    "to_json",
    "row_to_json",
    // time
    "now",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "date_trunc",
    "date_part",
    "make_interval",
    "age",
    "timezone",
    "to_char",
    "to_timestamp",
    "isfinite",
    // hashing, text and numbers
    "hashtext",
    "hashtextextended",
    "lower",
    "upper",
    "btrim",
    "length",
    "left",
    "right",
    "substr",
    "substring",
    "replace",
    "lpad",
    "rpad",
    "concat",
    "concat_ws",
    "split_part",
    "encode",
    "decode",
    "sha256",
    "md5",
    "convert_to",
    "convert_from",
    "format",
    "quote_ident",
    "quote_literal",
    "floor",
    "ceil",
    "abs",
    "round",
    "random",
    "gen_random_uuid",
    // sets and arrays
    "unnest",
    "generate_series",
    "cardinality",
    "array_length",
    "array_position",
    "array_remove",
    "array_append",
    // locks, snapshots, transactions
    "pg_advisory_lock",
    "pg_advisory_xact_lock",
    "pg_advisory_xact_lock_shared",
    "pg_try_advisory_lock",
    "pg_try_advisory_xact_lock",
    "pg_advisory_unlock",
    "pg_advisory_unlock_all",
    "pg_visible_in_snapshot",
    "pg_current_xact_id",
    "pg_current_snapshot",
    "pg_snapshot_xmin",
    "txid_current",
    "pg_backend_pid",
    // catalog and server
    "to_regclass",
    "to_regprocedure",
    "format_type",
    "obj_description",
    "pg_get_expr",
    "pg_get_userbyid",
    "pg_has_role",
    "has_table_privilege",
    "has_function_privilege",
    "has_schema_privilege",
    "pg_relation_size",
    "pg_table_size",
    "pg_total_relation_size",
    "pg_partition_tree",
    "pg_partition_root",
    "pg_control_system",
    "pg_current_wal_lsn",
    "pg_postmaster_start_time",
    "pg_logical_emit_message",
    "pg_stat_get_*",
    "pg_stat_force_next_flush",
    "current_setting",
    "set_config",
    "current_database",
    "version",
];

/// The unqualified calls of [`BUILTINS`] in `sql`, each as the text around
/// it. A call is the name directly followed by `(`, not preceded by `.` (a
/// schema, `pg_catalog.` or another) nor by a character of an identifier
/// (so `max` inside `fmax(` or `count` inside `row_count(` does not count).
/// Names are matched without regard to ASCII case, as PostgreSQL folds them.
fn unqualified_calls(sql: &str) -> Vec<String> {
    let bytes = sql.as_bytes();
    let lower = sql.to_ascii_lowercase();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut found = Vec::new();
    for name in BUILTINS {
        let (stem, prefix) = match name.strip_suffix('*') {
            Some(stem) => (stem, true),
            None => (*name, false),
        };
        let mut from = 0;
        while let Some(at) = lower[from..].find(stem) {
            let start = from + at;
            from = start + stem.len();
            if start > 0 && (bytes[start - 1] == b'.' || is_ident(bytes[start - 1])) {
                continue;
            }
            let mut end = start + stem.len();
            if prefix {
                while end < bytes.len() && is_ident(bytes[end]) {
                    end += 1;
                }
            }
            if bytes.get(end) != Some(&b'(') {
                continue;
            }
            let lo = floor_boundary(sql, start.saturating_sub(40));
            let hi = ceil_boundary(sql, (end + 40).min(sql.len()));
            found.push(format!("{}(: …{}…", &sql[start..end], &sql[lo..hi]));
        }
    }
    found
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// A snapshot's body: what follows the insta header (the text up to and
/// including the second line that is exactly `---`).
fn body(snap: &str) -> &str {
    let mut dashes = 0;
    let mut offset = 0;
    for line in snap.split_inclusive('\n') {
        offset += line.len();
        if line.trim_end_matches(['\n', '\r']) == "---" {
            dashes += 1;
            if dashes == 2 {
                return &snap[offset..];
            }
        }
    }
    snap
}

#[test]
fn snapshots_call_builtins_schema_qualified() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src/sql/snapshots"));
    let mut checked = 0;
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the snapshot directory is readable") {
        let path = entry.expect("a snapshot directory entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".snap") {
            // `.snap.new` (pending review) and anything else
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a snapshot is text");
        checked += 1;
        for call in unqualified_calls(body(&text)) {
            problems.push(format!("{name}: {call}"));
        }
    }
    assert!(checked > 0, "no snapshots found in {}", dir.display());
    assert!(
        problems.is_empty(),
        "built-in functions called without `pg_catalog.` ({} calls):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_scanner_finds_unqualified_calls_only() {
    let bad = unqualified_calls("SELECT count(*) FROM t");
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].starts_with("count("), "{bad:?}");
    assert!(unqualified_calls("SELECT pg_catalog.count(*) AS count FROM t").is_empty());
    // Columns and aliases that start or end with a name, syntax, and
    // another schema's functions are not calls of a built-in.
    assert!(unqualified_calls(
        "SELECT t.count, row_count(x), max_rows, COALESCE(a, b), s.now(), \
         x.lower(y) FROM t LEFT JOIN u ON true"
    )
    .is_empty());
    // Upper case is the same function; a prefix entry matches its family;
    // `count` inside `pg_catalog.count` is qualified, a second bare one not.
    assert_eq!(unqualified_calls("SELECT MAX(a), Now()").len(), 2);
    assert_eq!(
        unqualified_calls("SELECT pg_stat_get_live_tuples(c.oid)").len(),
        1
    );
    assert_eq!(
        unqualified_calls("SELECT pg_catalog.count(*), (SELECT count(*) FROM u)").len(),
        1
    );
}

#[test]
fn the_header_is_not_scanned() {
    let snap = "---\nsource: x.rs\nexpression: count(refs)\n---\nSELECT pg_catalog.now()\n";
    assert_eq!(body(snap), "SELECT pg_catalog.now()\n");
    assert!(unqualified_calls(body(snap)).is_empty());
}
