//! Identifier quoting and the one gate through which dynamic SQL text passes.
//!
//! Cohort's SQL is built from two kinds of pieces only: fixed text written in
//! this crate, and PostgreSQL identifiers (schema, table and column names)
//! that come from user declarations. Values are never part of SQL text: they
//! are always bound parameters. [`SqlText`] enforces that split: it accepts
//! `&'static str` fragments and [`quote_ident`]-quoted names, and it is the
//! only type in the crate that hands a dynamic string to sqlx (through
//! `AssertSqlSafe`).

use std::fmt;

/// Quotes a PostgreSQL identifier: wraps it in double quotes and doubles any
/// embedded double quote, so any string is a single, exact identifier
/// (see `quoting_table` below).
pub(crate) fn quote_ident(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 2);
    out.push('"');
    for ch in name.chars() {
        if ch == '"' {
            out.push('"');
        }
        out.push(ch);
    }
    out.push('"');
    out
}

/// Checks that a string can be a PostgreSQL identifier at all: non-empty, no
/// NUL byte, and at most 63 bytes (longer names are silently truncated by the
/// server, which would make Cohort inspect a different object).
pub(crate) fn check_identifier(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("an identifier cannot be empty".into());
    }
    if name.contains('\0') {
        return Err(format!("identifier {name:?} contains a NUL byte"));
    }
    if name.len() > 63 {
        return Err(format!(
            "identifier {name:?} is longer than PostgreSQL's 63-byte limit and would be truncated"
        ));
    }
    Ok(())
}

/// A schema-qualified table name. Displays quoted (`"schema"."table"`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedName {
    /// The schema (namespace) the table lives in.
    pub schema: String,
    /// The table's own name.
    pub name: String,
}

impl QualifiedName {
    /// Builds a name from its two parts, taken literally (no splitting on dots).
    pub fn new(schema: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            schema: schema.into(),
            name: name.into(),
        }
    }

    /// Parses `schema.table` or `table`; a missing schema becomes
    /// `default_schema`. Double-quoted parts may contain dots
    /// (`"my.schema"."t"`).
    pub fn parse(text: &str, default_schema: &str) -> Result<Self, String> {
        let parts = split_qualified(text)?;
        match parts.as_slice() {
            [(name, _)] => Ok(Self::new(default_schema, name.clone())),
            [(schema, _), (name, _)] => Ok(Self::new(schema.clone(), name.clone())),
            _ => Err(format!(
                "table name {text:?} has more than two parts; expected `schema.table` or `table`"
            )),
        }
    }

    /// Resolves a declaration's table: `table` (a `schema.table` path, or
    /// `fallback` when absent) with `schema` for a one-part path, then
    /// `default_schema`. A two-part path together with `schema` is refused
    /// as ambiguous, naming both readings: `schema = "public"` with
    /// `table = "a.b"` could mean the table `a.b` of `public` or the
    /// table `b` of `a`, and guessing wrong sweeps a table nobody listed.
    pub fn resolve(
        table: Option<&str>,
        fallback: &str,
        schema: Option<&str>,
        default_schema: &str,
    ) -> Result<Self, String> {
        let text = table.unwrap_or(fallback);
        let parsed = Self::parse(text, schema.unwrap_or(default_schema))?;
        if let Some(schema) = schema {
            if split_qualified(text)?.len() == 2 {
                let literal = Self::new(schema, text.trim());
                return Err(format!(
                    "table {text:?} with schema = {schema:?} is ambiguous: it reads as {} (schema {:?}, table {:?}), or as {} (a table named {:?} in schema {schema:?}); write the one you mean as table = {:?} and leave out schema",
                    parsed.path(),
                    parsed.schema,
                    parsed.name,
                    literal.path(),
                    literal.name,
                    literal.path(),
                ));
            }
        }
        Ok(parsed)
    }

    /// The name as a policy file writes it and PostgreSQL reads it:
    /// `schema.table`, each part double-quoted (quotes doubled) unless it
    /// is a plain lower-case identifier (`[a-z_][a-z0-9_$]*`), which reads
    /// the same quoted or not. It round-trips through [`QualifiedName::parse`].
    pub fn path(&self) -> String {
        format!("{}.{}", path_part(&self.schema), path_part(&self.name))
    }

    /// The unquoted `schema.table` form, for messages.
    pub fn display_plain(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}",
            quote_ident(&self.schema),
            quote_ident(&self.name)
        )
    }
}

/// One part of [`QualifiedName::path`]: bare when PostgreSQL would read
/// it bare the same way (reserved words too, which Cohort's parser takes
/// literally), quoted otherwise.
fn path_part(part: &str) -> String {
    let mut chars = part.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$');
    if plain {
        part.to_owned()
    } else {
        quote_ident(part)
    }
}

/// The policy file's stricter reading of a table path: an unquoted part
/// with an upper-case ASCII letter or white space is refused, because
/// PostgreSQL would read it differently (`Orders` as `orders`) than Cohort
/// takes it (as written), and the two can name different tables.
pub(crate) fn policy_table_problem(text: &str) -> Option<String> {
    let parts = split_qualified(text).ok()?;
    let (part, _) = parts.iter().find(|(part, quoted)| {
        !quoted
            && part
                .chars()
                .any(|c| c.is_ascii_uppercase() || c.is_whitespace())
    })?;
    Some(format!(
        "table {text:?}: the unquoted name {part:?} would be read by PostgreSQL as {:?}; write it quoted, {}, for the table named exactly {part:?}, or in lower case",
        part.trim().to_ascii_lowercase(),
        quote_ident(part),
    ))
}

/// Splits a `schema.table` path into its parts, each with whether it was
/// double-quoted.
fn split_qualified(text: &str) -> Result<Vec<(String, bool)>, String> {
    let mut parts = Vec::new();
    let mut chars = text.trim().chars().peekable();
    loop {
        let mut part = String::new();
        let quoted = chars.peek() == Some(&'"');
        if quoted {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') if chars.peek() == Some(&'"') => {
                        chars.next();
                        part.push('"');
                    }
                    Some('"') => break,
                    Some(c) => part.push(c),
                    None => return Err(format!("unterminated quote in {text:?}")),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                if c == '"' {
                    return Err(format!("stray quote in table name {text:?}"));
                }
                part.push(c);
                chars.next();
            }
        }
        check_identifier(&part).map_err(|e| format!("in table name {text:?}: {e}"))?;
        parts.push((part, quoted));
        match chars.next() {
            None => break,
            Some('.') => continue,
            Some(c) => return Err(format!("unexpected {c:?} in table name {text:?}")),
        }
    }
    Ok(parts)
}

/// Whether `kind` is a subject kind: 1 to 63 ASCII letters, digits, `_`,
/// `-` or `.`. Kinds are part of the model, like column names, and a
/// subject hold's check names them in the statement (see
/// [`SqlText::kind_literal`]), so they are held to a shape that needs no
/// escaping.
pub(crate) fn is_kind_word(kind: &str) -> bool {
    (1..=63).contains(&kind.len())
        && kind
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// SQL text assembled only from fixed fragments, quoted identifiers and
/// subject kinds (words of the model, checked by [`is_kind_word`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SqlText(String);

impl SqlText {
    /// Starts with a fixed fragment.
    pub(crate) fn new(fragment: &'static str) -> Self {
        Self(fragment.to_owned())
    }

    /// Appends a fixed fragment.
    pub(crate) fn push(&mut self, fragment: &'static str) -> &mut Self {
        self.0.push_str(fragment);
        self
    }

    /// Appends the placeholder of bound parameter `n` (`$n`).
    pub(crate) fn param(&mut self, n: usize) -> &mut Self {
        self.0.push('$');
        self.0.push_str(&n.to_string());
        self
    }

    /// Appends a number (an array subscript, a JSON element's index).
    pub(crate) fn number(&mut self, n: usize) -> &mut Self {
        self.0.push_str(&n.to_string());
        self
    }

    /// Appends another piece of checked SQL text.
    pub(crate) fn append(&mut self, other: &SqlText) -> &mut Self {
        self.0.push_str(&other.0);
        self
    }

    /// Appends a quoted, schema-qualified table name.
    pub(crate) fn table(&mut self, name: &QualifiedName) -> &mut Self {
        self.ident(&name.schema);
        self.0.push('.');
        self.ident(&name.name)
    }

    /// Appends `t.` followed by a quoted column name.
    pub(crate) fn col(&mut self, column: &str) -> &mut Self {
        self.0.push_str("t.");
        self.ident(column)
    }

    /// Appends a subject kind as a string literal. Kinds come from the
    /// validated model (never from a request) and are words that need no
    /// escaping; anything else is a bug, so it panics rather than emit it.
    pub(crate) fn kind_literal(&mut self, kind: &str) -> &mut Self {
        assert!(is_kind_word(kind), "not a validated subject kind: {kind:?}");
        self.0.push('\'');
        self.0.push_str(kind);
        self.0.push('\'');
        self
    }

    /// Appends a table's catalog lookup: its quoted, schema-qualified name
    /// as a string literal (single quotes doubled) cast to `regclass`.
    pub(crate) fn regclass(&mut self, name: &QualifiedName) -> &mut Self {
        self.0.push('\'');
        self.0.push_str(&name.to_string().replace('\'', "''"));
        self.0.push_str("'::pg_catalog.regclass");
        self
    }

    /// Appends a quoted identifier.
    pub(crate) fn ident(&mut self, name: &str) -> &mut Self {
        self.0.push_str(&quote_ident(name));
        self
    }

    /// The text, for tests and logs.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// Hands a copy of the text to sqlx (plans are built once and reused;
    /// sqlx caches the prepared statement by its text).
    pub(crate) fn sql(&self) -> sqlx::AssertSqlSafe<String> {
        sqlx::AssertSqlSafe(self.0.clone())
    }

    /// Hands the text to sqlx. Sound because every piece is either a
    /// `&'static str` written in this crate or a quoted identifier.
    pub(crate) fn into_sql(self) -> sqlx::AssertSqlSafe<String> {
        sqlx::AssertSqlSafe(self.0)
    }
}

/// Builds [`SqlText`] from fixed template text in which `{name}`
/// placeholders stand for tables; each is replaced by the quoted,
/// schema-qualified name. Used for migrations, whose text is fixed apart
/// from where Cohort's tables live. `{name:regclass}` stands for the
/// table's catalog lookup instead ([`SqlText::regclass`]).
pub(crate) fn from_template(template: &'static str, tables: &[(&str, QualifiedName)]) -> SqlText {
    // One pass over the template: text inserted for one placeholder is never
    // scanned again, so a schema name that itself looks like a placeholder
    // (`x{retention_hold}`) stays inside its own quotes.
    let mut text = String::with_capacity(template.len() + 64);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let found = after.find('}').and_then(|close| {
            let key = &after[..close];
            // `{name:regclass}`: the name as a string literal cast to
            // `regclass` (a catalog lookup of the same table).
            let (key, regclass) = match key.strip_suffix(":regclass") {
                Some(k) => (k, true),
                None => (key, false),
            };
            tables
                .iter()
                .find(|(placeholder, _)| *placeholder == key)
                .map(|(_, name)| (close, name, regclass))
        });
        match found {
            Some((close, name, regclass)) => {
                if regclass {
                    let mut lookup = SqlText::default();
                    lookup.regclass(name);
                    text.push_str(lookup.as_str());
                } else {
                    text.push_str(&name.to_string());
                }
                rest = &after[close + 1..];
            }
            None => {
                text.push('{');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    SqlText(text)
}

/// Problems with a schema Cohort would install into or read retained
/// tables from: PostgreSQL's own schemas and names that only differ from
/// a real one by white space are refused.
pub(crate) fn check_schema_name(name: &str) -> std::result::Result<(), String> {
    check_identifier(name)?;
    if name.trim() != name {
        return Err(format!(
            "{name:?} starts or ends with white space; that is a different schema from {:?}",
            name.trim()
        ));
    }
    let lower = name.to_ascii_lowercase();
    if lower == "information_schema" || lower.starts_with("pg_") {
        return Err(format!(
            "{name:?} is reserved for PostgreSQL's own catalogs"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_table() {
        let cases = [
            ("plain", "\"plain\""),
            ("MixedCase", "\"MixedCase\""),
            ("with space", "\"with space\""),
            ("a\"b", "\"a\"\"b\""),
            ("\"", "\"\"\"\""),
            ("x; DROP TABLE y; --", "\"x; DROP TABLE y; --\""),
            ("ünï", "\"ünï\""),
        ];
        for (input, expected) in cases {
            assert_eq!(quote_ident(input), expected, "input {input:?}");
        }
    }

    #[test]
    fn qualified_name_parsing_table() {
        let ok = [
            ("notes", "public", ("public", "notes")),
            ("app.notes", "public", ("app", "notes")),
            ("notes", "tenant_data", ("tenant_data", "notes")),
            ("\"my.schema\".\"t\"", "public", ("my.schema", "t")),
            ("\"We\"\"ird\"", "s", ("s", "We\"ird")),
            ("  spaced.t  ", "public", ("spaced", "t")),
        ];
        for (input, default, (schema, name)) in ok {
            let q = QualifiedName::parse(input, default).unwrap();
            assert_eq!(
                (q.schema.as_str(), q.name.as_str()),
                (schema, name),
                "{input}"
            );
        }
        for bad in [
            "",
            "a.b.c",
            ".t",
            "s.",
            "\"open",
            "a\"b\".c",
            &"x".repeat(64),
        ] {
            assert!(
                QualifiedName::parse(bad, "public").is_err(),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn paths_round_trip_for_hostile_identifiers() {
        let names = [
            ("public", "a.b"),
            ("a", "b"),
            ("public", "we\"ird name"),
            ("public", "_"),
            ("public", "é"),
            ("public", "Order_Lines"),
            ("public", "order-lines"),
            ("public", "order_lines"),
            ("My Schema", "select"),
            ("s", "\"\""),
            ("s", "$x"),
            ("s", "t$1"),
            ("s", " lead"),
        ];
        for (schema, name) in names {
            let q = QualifiedName::new(schema, name);
            let path = q.path();
            assert_eq!(QualifiedName::parse(&path, "other").unwrap(), q, "{path}");
            assert_eq!(policy_table_problem(&path), None, "{path}");
            assert_eq!(
                QualifiedName::resolve(Some(&path), "x", None, "other").unwrap(),
                q
            );
        }
        assert_eq!(QualifiedName::new("public", "a.b").path(), "public.\"a.b\"");
        assert_eq!(QualifiedName::new("app", "notes").path(), "app.notes");
    }

    #[test]
    fn a_schema_with_a_dotted_table_is_ambiguous() {
        let err = QualifiedName::resolve(Some("a.b"), "x", Some("public"), "d").unwrap_err();
        assert!(err.contains("ambiguous"), "{err}");
        assert!(err.contains("public.\"a.b\""), "{err}");
        assert!(err.contains("schema \"a\", table \"b\""), "{err}");
        // One part with a schema, or two parts without one, are not.
        assert_eq!(
            QualifiedName::resolve(Some("\"a.b\""), "x", Some("public"), "d").unwrap(),
            QualifiedName::new("public", "a.b")
        );
        assert_eq!(
            QualifiedName::resolve(Some("a.b"), "x", None, "d").unwrap(),
            QualifiedName::new("a", "b")
        );
        assert_eq!(
            QualifiedName::resolve(None, "fallback", Some("s"), "d").unwrap(),
            QualifiedName::new("s", "fallback")
        );
    }

    #[test]
    fn the_policy_file_refuses_unquoted_names_postgres_would_fold() {
        for bad in ["Orders", "app.Orders", "App.orders", "app. orders"] {
            assert!(policy_table_problem(bad).is_some(), "{bad}");
        }
        for good in [
            "orders",
            "app.orders",
            "\"App\".\"Orders\"",
            "order-lines",
            "é",
        ] {
            assert_eq!(policy_table_problem(good), None, "{good}");
        }
    }

    #[test]
    fn qualified_name_displays_quoted() {
        let q = QualifiedName::new("a\"s", "t");
        assert_eq!(q.to_string(), "\"a\"\"s\".\"t\"");
        let mut sql = SqlText::new("DELETE FROM ");
        sql.table(&q)
            .push(" t WHERE ")
            .col("i\"d")
            .push(" = ")
            .param(12);
        assert_eq!(
            sql.as_str(),
            "DELETE FROM \"a\"\"s\".\"t\" t WHERE t.\"i\"\"d\" = $12"
        );
    }

    #[test]
    fn template_quotes_tables() {
        let sql = from_template(
            "CREATE TABLE {t} (); COMMENT ON TABLE {t} IS 'x'",
            &[("t", QualifiedName::new("re\"tention", "t"))],
        );
        assert_eq!(
            sql.as_str(),
            "CREATE TABLE \"re\"\"tention\".\"t\" (); COMMENT ON TABLE \"re\"\"tention\".\"t\" IS 'x'"
        );
    }

    #[test]
    fn template_casts_a_table_to_regclass_as_a_literal() {
        let sql = from_template(
            "SELECT {t:regclass}::oid, {t:other}",
            &[("t", QualifiedName::new("it's", "t"))],
        );
        assert_eq!(
            sql.as_str(),
            "SELECT '\"it''s\".\"t\"'::pg_catalog.regclass::oid, {t:other}"
        );
    }
}
