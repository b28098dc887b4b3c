//! Table and column names taken from other crates' attributes, read
//! leniently: sqlx's `rename` / `rename_all`, SeaORM's `table_name` /
//! `column_name` and Diesel's `table_name` / `column_name`, and how they
//! combine with Cohort's own `table` / `column` keys.

use heck::{ToKebabCase, ToLowerCamelCase, ToShoutySnakeCase, ToSnakeCase, ToUpperCamelCase};
use proc_macro2::{TokenStream, TokenTree};
use syn::ext::IdentExt;

use super::symbols::Symbol;

/// sqlx field key.
pub(super) const RENAME: &str = "rename";
/// sqlx struct key.
pub(super) const RENAME_ALL: &str = "rename_all";
/// SeaORM / Diesel field key.
pub(super) const COLUMN_NAME: &str = "column_name";
/// SeaORM / Diesel struct key.
pub(super) const TABLE_NAME: &str = "table_name";

/// sqlx's `rename_all` rules.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum RenameRule {
    /// `snake_case`
    Snake,
    /// `lowercase`
    Lower,
    /// `UPPERCASE`
    Upper,
    /// `camelCase`
    Camel,
    /// `PascalCase`
    Pascal,
    /// `SCREAMING_SNAKE_CASE`
    ScreamingSnake,
    /// `kebab-case`
    Kebab,
}

impl RenameRule {
    /// Parses sqlx's spelling of a rule; `None` for anything else (sqlx
    /// reports those itself).
    pub(super) fn parse(rule: &str) -> Option<Self> {
        Some(match rule {
            "snake_case" => RenameRule::Snake,
            "lowercase" => RenameRule::Lower,
            "UPPERCASE" => RenameRule::Upper,
            "camelCase" => RenameRule::Camel,
            "PascalCase" => RenameRule::Pascal,
            "SCREAMING_SNAKE_CASE" => RenameRule::ScreamingSnake,
            "kebab-case" => RenameRule::Kebab,
            _ => return None,
        })
    }

    /// Applies the rule to a field name.
    fn apply(self, field: &str) -> String {
        match self {
            RenameRule::Snake => field.to_snake_case(),
            RenameRule::Lower => field.to_lowercase(),
            RenameRule::Upper => field.to_uppercase(),
            RenameRule::Camel => field.to_lower_camel_case(),
            RenameRule::Pascal => field.to_upper_camel_case(),
            RenameRule::ScreamingSnake => field.to_shouty_snake_case(),
            RenameRule::Kebab => field.to_kebab_case(),
        }
    }
}

/// Reads the `key = value` pairs of another crate's attribute, leniently:
/// the list is split at top-level commas and only pairs whose value is a
/// string literal or a path are kept (a path gives its last segment).
/// Never fails: anything else is skipped.
fn foreign_pairs(attr: &syn::Attribute) -> Vec<(String, String)> {
    let syn::Meta::List(list) = &attr.meta else {
        return Vec::new();
    };
    let tokens: Vec<TokenTree> = list.tokens.clone().into_iter().collect();
    tokens
        .split(|tt| matches!(tt, TokenTree::Punct(p) if p.as_char() == ','))
        .filter_map(|chunk| match chunk {
            [TokenTree::Ident(key), TokenTree::Punct(eq), rest @ ..]
                if eq.as_char() == '=' && !rest.is_empty() =>
            {
                foreign_value(rest).map(|value| (key.unraw().to_string(), value))
            }
            _ => None,
        })
        .collect()
}

/// The value of a foreign `key = value` pair: a string literal's contents or
/// a path's last segment.
fn foreign_value(tokens: &[TokenTree]) -> Option<String> {
    let stream: TokenStream = tokens.iter().cloned().collect();
    if let Ok(lit) = syn::parse2::<syn::LitStr>(stream.clone()) {
        return Some(lit.value());
    }
    let path = syn::parse2::<syn::Path>(stream).ok()?;
    path.segments.last().map(|s| s.ident.unraw().to_string())
}

/// The value of the last `key` pair of the foreign attributes named `name`.
pub(super) fn foreign_key(attrs: &[syn::Attribute], name: Symbol, key: &str) -> Option<String> {
    attrs
        .iter()
        .filter(|a| *a.path() == name)
        .flat_map(foreign_pairs)
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .next_back()
}

/// The column of a field: explicit `#[retain(column)]`, else sqlx's
/// `rename`, else SeaORM's `column_name`, else Diesel's `column_name`, else
/// the field name (through sqlx's `rename_all` if the struct has one).
pub(super) fn resolve_column(
    field: &str,
    explicit: Option<&str>,
    sqlx_rename: Option<&str>,
    sea_orm_column: Option<&str>,
    diesel_column: Option<&str>,
    rename_all: Option<RenameRule>,
) -> String {
    explicit
        .or(sqlx_rename)
        .or(sea_orm_column)
        .or(diesel_column)
        .map(str::to_owned)
        .unwrap_or_else(|| match rename_all {
            Some(rule) => rule.apply(field),
            None => field.to_owned(),
        })
}

/// The table of a struct: explicit `table`, else SeaORM's `table_name`, else
/// Diesel's `table_name` (last path segment), else the struct name in
/// snake case.
pub(super) fn resolve_table(
    struct_name: &str,
    explicit: Option<&str>,
    sea_orm_table: Option<&str>,
    diesel_table: Option<&str>,
) -> String {
    // `table = "..."` is a `schema.table` path; an ORM's table name is one
    // identifier, which the ORM quotes: quote it too when it would
    // otherwise split on a dot or stop at a quote.
    let orm_name = |name: &str| {
        if name.contains(['.', '"']) {
            format!("\"{}\"", name.replace('"', "\"\""))
        } else {
            name.to_owned()
        }
    };
    explicit
        .map(str::to_owned)
        .or(sea_orm_table.map(orm_name))
        .or(diesel_table.map(orm_name))
        .unwrap_or_else(|| struct_name.to_snake_case())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::test_support::read;
    use crate::attr::Container;
    use crate::ctxt::Ctxt;

    const HEADER: &str = r#"#[retain(category = "c", anchor = "created_at", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")]"#;

    fn columns(src: &str) -> Vec<(String, String)> {
        let c = read(src).unwrap_or_else(|e| panic!("errors for {src}: {e:?}"));
        c.fields.into_iter().map(|f| (f.name, f.column)).collect()
    }

    /// (field, explicit, sqlx rename, sea_orm, diesel, rename_all, expected)
    type ColumnCase<'a> = (
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        Option<RenameRule>,
        &'a str,
    );

    #[test]
    fn resolve_column_table() {
        use RenameRule::*;
        let cases: &[ColumnCase<'_>] = &[
            ("body", None, None, None, None, None, "body"),
            (
                "body",
                Some("explicit"),
                Some("sqlx"),
                Some("sea"),
                Some("diesel"),
                Some(Upper),
                "explicit",
            ),
            (
                "body",
                None,
                Some("sqlx"),
                Some("sea"),
                Some("diesel"),
                Some(Upper),
                "sqlx",
            ),
            (
                "body",
                None,
                None,
                Some("sea"),
                Some("diesel"),
                Some(Upper),
                "sea",
            ),
            (
                "body",
                None,
                None,
                None,
                Some("diesel"),
                Some(Upper),
                "diesel",
            ),
            (
                "created_at",
                None,
                None,
                None,
                None,
                Some(Snake),
                "created_at",
            ),
            (
                "created_at",
                None,
                None,
                None,
                None,
                Some(Lower),
                "created_at",
            ),
            (
                "created_at",
                None,
                None,
                None,
                None,
                Some(Upper),
                "CREATED_AT",
            ),
            (
                "created_at",
                None,
                None,
                None,
                None,
                Some(Camel),
                "createdAt",
            ),
            (
                "created_at",
                None,
                None,
                None,
                None,
                Some(Pascal),
                "CreatedAt",
            ),
            (
                "created_at",
                None,
                None,
                None,
                None,
                Some(ScreamingSnake),
                "CREATED_AT",
            ),
            (
                "created_at",
                None,
                None,
                None,
                None,
                Some(Kebab),
                "created-at",
            ),
        ];
        for (field, explicit, sqlx, sea, diesel, rule, expected) in cases {
            assert_eq!(
                resolve_column(field, *explicit, *sqlx, *sea, *diesel, *rule),
                *expected,
                "{field} {explicit:?} {sqlx:?} {sea:?} {diesel:?} {rule:?}"
            );
        }
    }

    /// (struct name, explicit, sea_orm, diesel, expected)
    type TableCase<'a> = (
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        &'a str,
    );

    #[test]
    fn resolve_table_table() {
        let cases: &[TableCase<'_>] = &[
            ("SessionNote", None, None, None, "session_note"),
            ("HTTPRequest", None, None, None, "http_request"),
            (
                "SessionNote",
                Some("app.notes"),
                Some("sea"),
                Some("diesel"),
                "app.notes",
            ),
            ("SessionNote", None, Some("sea"), Some("diesel"), "sea"),
            ("SessionNote", None, None, Some("diesel"), "diesel"),
            // An ORM's name is one identifier, dots and quotes included.
            ("SessionNote", None, Some("a.b"), None, "\"a.b\""),
            ("SessionNote", None, None, Some("we\"ird"), "\"we\"\"ird\""),
        ];
        for (name, explicit, sea, diesel, expected) in cases {
            assert_eq!(resolve_table(name, *explicit, *sea, *diesel), *expected);
        }
    }

    #[test]
    fn rename_rules_parse_sqlx_spellings() {
        for (text, rule) in [
            ("snake_case", RenameRule::Snake),
            ("lowercase", RenameRule::Lower),
            ("UPPERCASE", RenameRule::Upper),
            ("camelCase", RenameRule::Camel),
            ("PascalCase", RenameRule::Pascal),
            ("SCREAMING_SNAKE_CASE", RenameRule::ScreamingSnake),
            ("kebab-case", RenameRule::Kebab),
        ] {
            assert_eq!(RenameRule::parse(text), Some(rule));
        }
        assert_eq!(RenameRule::parse("Title Case"), None);
    }

    #[test]
    fn columns_from_attributes() {
        let cases: &[(&str, &[(&str, &str)])] = &[
            (
                "struct S { id: u32, created_at: i64, r#type: String }",
                &[("id", "id"), ("created_at", "created_at"), ("type", "type")],
            ),
            (
                r#"#[sqlx(rename_all = "camelCase")] struct S {
                    created_at: i64,
                    #[sqlx(rename = "Body")] body_text: String,
                    #[sqlx(default, try_from = "i64", rename = "x_y", json)] other: String,
                }"#,
                &[
                    ("created_at", "createdAt"),
                    ("body_text", "Body"),
                    ("other", "x_y"),
                ],
            ),
            (
                r#"struct S {
                    created_at: i64,
                    #[sea_orm(primary_key, auto_increment = false, column_name = "pk")] id: i32,
                    #[sea_orm(column_type = "Text", nullable)] notes: Option<String>,
                }"#,
                &[
                    ("created_at", "created_at"),
                    ("id", "pk"),
                    ("notes", "notes"),
                ],
            ),
            (
                r#"struct S {
                    created_at: i64,
                    #[diesel(column_name = pk, serialize_as = Option<Vec<u8>>)] id: i32,
                    #[diesel(sql_type = Nullable<Text>, column_name = "txt")] body: String,
                }"#,
                &[("created_at", "created_at"), ("id", "pk"), ("body", "txt")],
            ),
            (
                r#"#[sqlx(rename_all = "UPPERCASE")] struct S {
                    #[retain(column = "org", tenant)] #[sqlx(rename = "ignored")] tenant: u32,
                    created_at: i64,
                }"#,
                &[("tenant", "org"), ("created_at", "CREATED_AT")],
            ),
        ];
        for (body, expected) in cases {
            let src = format!("{HEADER} {body}");
            let got = columns(&src);
            let expected: Vec<(String, String)> = expected
                .iter()
                .map(|(f, c)| (f.to_string(), c.to_string()))
                .collect();
            assert_eq!(got, expected, "{body}");
        }
    }

    #[test]
    fn tables_from_attributes() {
        let id = r#"id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8""#;
        let cases: &[(&str, &str)] = &[
            ("struct SessionNote { t: i64 }", "session_note"),
            (r#"#[retain(table = "app.notes")] struct SessionNote { t: i64 }"#, "app.notes"),
            (r#"#[sea_orm(table_name = "notes", schema_name = "app")] struct Model { t: i64 }"#, "notes"),
            ("#[diesel(table_name = crate::schema::notes)] #[diesel(check_for_backend(diesel::pg::Pg))] struct Note { t: i64 }", "notes"),
            (r#"#[diesel(table_name = "quoted")] struct Note { t: i64 }"#, "quoted"),
            (r#"#[retain(table = "explicit")] #[sea_orm(table_name = "sea")] #[diesel(table_name = d)] struct N { t: i64 }"#, "explicit"),
            (r#"#[sea_orm(table_name = "sea")] #[diesel(table_name = d)] struct N { t: i64 }"#, "sea"),
        ];
        for (body, expected) in cases {
            let src = format!(r#"#[retain(category = "c", anchor = "t", {id})] {body}"#);
            let c = read(&src).unwrap_or_else(|e| panic!("{body}: {e:?}"));
            assert_eq!(c.table, *expected, "{body}");
        }
    }

    #[test]
    fn foreign_attributes_never_fail() {
        for src in [
            "#[sqlx(rename_all)] struct S { #[sqlx] a: i64 }",
            "#[diesel = 1] struct S { #[diesel(,,)] a: i64 }",
            "#[sea_orm(entity = \"x\", 1 + 2 = 3)] struct S { #[sea_orm(column_name = )] a: i64 }",
            "#[sqlx(rename_all = \"Title Case\")] struct S { #[sqlx(rename = 5)] a: i64 }",
        ] {
            let src = format!("{HEADER} {src}");
            let input: syn::DeriveInput = syn::parse_str(&src).expect("parses");
            let cx = Ctxt::new();
            let _ = Container::from_ast(&cx, &input);
            let err = cx.check().expect_err("only the anchor is wrong");
            let messages: Vec<String> = err.into_iter().map(|e| e.to_string()).collect();
            assert_eq!(messages.len(), 1, "{src}: {messages:?}");
            assert!(
                messages[0].contains("no field `created_at`"),
                "{messages:?}"
            );
        }
    }
}
