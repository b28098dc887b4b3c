//! The struct-level attributes: `#[retain(...)]` (category, anchor, id,
//! table, schema, name, tenantless, partitions, audit) and `#[exempt_from_retention("...")]`,
//! read into a [`Container`] together with its fields.

use syn::ext::IdentExt;
use syn::spanned::Spanned;

use super::field::{Field, MarkerKind};
use super::orm::{foreign_key, resolve_table, RenameRule, RENAME_ALL, TABLE_NAME};
use super::parse::{
    flag, lit_int_in, lit_str, non_empty, parse_list, path_to_string, unknown, Attr,
};
use super::symbols::{
    ANCHOR, ANONYMISE, ANONYMISE_ON_ARCHIVE, ARCHIVE, AUDIT, CATEGORY, CONTAINER_KEYS, DIESEL,
    ERASURE_SUBJECT, EXEMPT_FROM_RETENTION, FIELD_KEYS, ID, NAME, PARTITIONS, RETAIN, SCHEMA,
    SEA_ORM, SQLX, SWEEP_PARALLELISM, TABLE, TENANTLESS,
};
use crate::ctxt::Ctxt;

/// The struct as the derive declares it (only built when the input is a
/// struct with named fields; validity is tracked by the [`Ctxt`]).
#[derive(Clone, Debug)]
pub(crate) struct Container {
    /// The struct's identifier.
    pub(crate) ident: syn::Ident,
    /// The struct's generics.
    pub(crate) generics: syn::Generics,
    /// The display name.
    pub(crate) name: String,
    /// The durable id, as written.
    pub(crate) id: String,
    /// The retention category.
    pub(crate) category: Option<String>,
    /// The anchor, already turned into its field's column name.
    pub(crate) anchor: Option<String>,
    /// The table (explicit or derived).
    pub(crate) table: String,
    /// The schema, if given.
    pub(crate) schema: Option<String>,
    /// `#[retain(tenantless)]`.
    pub(crate) tenantless: bool,
    /// The exemption reason.
    pub(crate) exempt: Option<String>,
    /// `#[retain(partitions = "drop")]`: opt-in partition purge.
    pub(crate) drop_partitions: bool,
    /// `#[retain(sweep_parallelism = N)]`: connections one sweep of the
    /// entity uses at once.
    pub(crate) sweep_parallelism: Option<u32>,
    /// `#[retain(audit = "per_row" | "summary")]`: the entity's own audit
    /// detail, which wins over its category's.
    pub(crate) audit: Option<String>,
    /// `#[retain(archive = "schema.table")]`: the archive strategy's table.
    pub(crate) archive: Option<String>,
    /// `#[retain(anonymise_on_archive)]`.
    pub(crate) anonymise_on_archive: bool,
    /// The fields, in declaration order.
    pub(crate) fields: Vec<Field>,
}

impl Container {
    /// Reads the derive input. Returns `None` when the input is not a
    /// struct with named fields or a required key is missing; every problem
    /// is recorded in `cx` (callers must check it before using the result).
    pub(crate) fn from_ast(cx: &Ctxt, input: &syn::DeriveInput) -> Option<Container> {
        let mut category = Attr::none(cx, RETAIN, CATEGORY);
        let mut anchor = Attr::none(cx, RETAIN, ANCHOR);
        let mut id = Attr::none(cx, RETAIN, ID);
        let mut table = Attr::none(cx, RETAIN, TABLE);
        let mut schema = Attr::none(cx, RETAIN, SCHEMA);
        let mut name = Attr::none(cx, RETAIN, NAME);
        let mut tenantless = Attr::none(cx, RETAIN, TENANTLESS);
        let mut partitions = Attr::none(cx, RETAIN, PARTITIONS);
        let mut parallelism = Attr::none(cx, RETAIN, SWEEP_PARALLELISM);
        let mut audit = Attr::none(cx, RETAIN, AUDIT);
        let mut archive = Attr::none(cx, RETAIN, ARCHIVE);
        let mut anonymise_on_archive = Attr::none(cx, RETAIN, ANONYMISE_ON_ARCHIVE);
        let mut exempt: Option<syn::LitStr> = None;
        let mut saw_retain = false;
        let mut saw_exempt = false;

        for attr in &input.attrs {
            let path = attr.path();
            if *path == RETAIN {
                saw_retain = true;
                parse_list(cx, attr, RETAIN, |meta| {
                    let p = &meta.path;
                    if *p == CATEGORY {
                        if let Some(s) = lit_str(cx, &meta, RETAIN)? {
                            if let Some(s) = non_empty(cx, s, CATEGORY) {
                                category.set(p, s);
                            }
                        }
                    } else if *p == ANCHOR {
                        if let Some(s) = lit_str(cx, &meta, RETAIN)? {
                            anchor.set(p, s);
                        }
                    } else if *p == ID {
                        if let Some(s) = lit_str(cx, &meta, RETAIN)? {
                            id.set(p, s);
                        }
                    } else if *p == TABLE {
                        if let Some(s) = lit_str(cx, &meta, RETAIN)? {
                            if let Some(s) = non_empty(cx, s, TABLE) {
                                table.set(p, s);
                            }
                        }
                    } else if *p == SCHEMA {
                        if let Some(s) = lit_str(cx, &meta, RETAIN)? {
                            if let Some(s) = non_empty(cx, s, SCHEMA) {
                                schema.set(p, s);
                            }
                        }
                    } else if *p == NAME {
                        if let Some(s) = lit_str(cx, &meta, RETAIN)? {
                            if let Some(s) = non_empty(cx, s, NAME) {
                                name.set(p, s);
                            }
                        }
                    } else if *p == TENANTLESS {
                        flag(cx, &meta, RETAIN)?;
                        tenantless.set(p, p.span());
                    } else if *p == PARTITIONS {
                        if let Some(s) = lit_str(cx, &meta, RETAIN)? {
                            match s.value().as_str() {
                                "drop" | "rows" => partitions.set(p, s),
                                other => cx.error_spanned_by(
                                    &s,
                                    format!(
                                        "`partitions = {other:?}` is unknown: use \"drop\" \
                                         (drop whole expired partitions) or \"rows\" (the default)"
                                    ),
                                ),
                            }
                        }
                    } else if *p == SWEEP_PARALLELISM {
                        if let Some(n) = lit_int_in(cx, &meta, RETAIN, 1..=64)? {
                            parallelism.set(p, n);
                        }
                    } else if *p == ARCHIVE {
                        if let Some(s) = lit_str(cx, &meta, RETAIN)? {
                            if let Some(s) = non_empty(cx, s, ARCHIVE) {
                                archive.set(p, s);
                            }
                        }
                    } else if *p == ANONYMISE_ON_ARCHIVE {
                        flag(cx, &meta, RETAIN)?;
                        anonymise_on_archive.set(p, p.span());
                    } else if *p == AUDIT {
                        if let Some(s) = lit_str(cx, &meta, RETAIN)? {
                            match s.value().as_str() {
                                "summary" | "per_row" => audit.set(p, s),
                                other => cx.error_spanned_by(
                                    &s,
                                    format!(
                                        "`audit = {other:?}` is unknown: use \"per_row\" \
                                         (every changed record id) or \"summary\" (counts only)"
                                    ),
                                ),
                            }
                        }
                    } else {
                        let hint = FIELD_KEYS
                            .iter()
                            .any(|k| *p == *k)
                            .then(|| "that key goes on a field, not on the struct".to_owned());
                        unknown(cx, &meta, RETAIN, "a struct", CONTAINER_KEYS, hint)?;
                    }
                    Ok(())
                });
            } else if *path == EXEMPT_FROM_RETENTION {
                saw_exempt = true;
                if let Some(reason) = parse_exempt(cx, attr) {
                    if exempt.is_some() {
                        cx.error_spanned_by(attr, "duplicate `#[exempt_from_retention]`");
                    } else {
                        exempt = Some(reason);
                    }
                }
            } else if *path == ANONYMISE || *path == ERASURE_SUBJECT {
                cx.error_spanned_by(
                    attr,
                    format!(
                        "`#[{}]` goes on a field, not on the struct",
                        path_to_string(path)
                    ),
                );
            }
        }

        let rename_all =
            foreign_key(&input.attrs, SQLX, RENAME_ALL).and_then(|r| RenameRule::parse(&r));

        let fields = match &input.data {
            syn::Data::Struct(syn::DataStruct {
                fields: syn::Fields::Named(named),
                ..
            }) => Some(
                named
                    .named
                    .iter()
                    .map(|f| Field::from_ast(cx, f, rename_all))
                    .collect::<Vec<_>>(),
            ),
            syn::Data::Struct(syn::DataStruct {
                fields: syn::Fields::Unnamed(unnamed),
                ..
            }) => {
                cx.error_spanned_by(
                    unnamed,
                    "`#[derive(Retained)]` supports only structs with named fields, not tuple structs",
                );
                None
            }
            syn::Data::Struct(syn::DataStruct {
                fields: syn::Fields::Unit,
                ..
            }) => {
                cx.error_spanned_by(
                    &input.ident,
                    "`#[derive(Retained)]` supports only structs with named fields, not unit structs",
                );
                None
            }
            syn::Data::Enum(data) => {
                cx.error_spanned_by(
                    data.enum_token,
                    "`#[derive(Retained)]` supports only structs with named fields, not enums",
                );
                None
            }
            syn::Data::Union(data) => {
                cx.error_spanned_by(
                    data.union_token,
                    "`#[derive(Retained)]` supports only structs with named fields, not unions",
                );
                None
            }
        };

        let ident_name = input.ident.unraw().to_string();
        let category = category.get();
        let anchor = anchor.get();
        let tenantless = tenantless.get();

        // Nothing declared at all: one error instead of three.
        if !saw_retain && !saw_exempt {
            cx.error_spanned_by(
                &input.ident,
                format!(
                    "`{ident_name}` derives `Retained` but has no `#[retain(...)]`: declare \
                     `#[retain(category = \"...\", anchor = \"...\", id = \"<uuid>\")]`, or \
                     `#[exempt_from_retention(\"reason\")]` with `#[retain(id = \"<uuid>\")]`"
                ),
            );
            return None;
        }

        let id = match id.get() {
            Some(lit) => check_id(cx, &lit).then(|| lit.value()),
            None => {
                cx.error_spanned_by(
                    &input.ident,
                    format!(
                        "missing `#[retain(id = \"...\")]` on `{ident_name}`: every retained or \
                         exempt type needs a durable UUID (generate one, e.g. with `cohort new-id`)"
                    ),
                );
                None
            }
        };

        if exempt.is_some() {
            if let Some(category) = &category {
                cx.error_spanned_by(
                    category,
                    format!(
                        "`{ident_name}` cannot be both retained (`category`) and exempt \
                         (`#[exempt_from_retention]`) (SCOPE-002): remove one of them"
                    ),
                );
            }
            if let Some(anchor) = &anchor {
                cx.error_spanned_by(
                    anchor,
                    format!(
                        "`anchor` is not allowed on `{ident_name}`, which is exempt from retention"
                    ),
                );
            }
        } else {
            if category.is_none() && !saw_exempt {
                cx.error_spanned_by(
                    &input.ident,
                    format!(
                        "missing `#[retain(category = \"...\")]` on `{ident_name}` (or document \
                         an exemption with `#[exempt_from_retention(\"reason\")]`)"
                    ),
                );
            }
            if anchor.is_none() && !saw_exempt {
                cx.error_spanned_by(
                    &input.ident,
                    format!(
                        "missing `#[retain(anchor = \"...\")]` on `{ident_name}`: name the \
                         timestamp field a row's age is measured from"
                    ),
                );
            }
        }

        let fields = fields?;
        let archive = archive.get();
        let anonymise_on_archive = anonymise_on_archive.get();
        if archive.is_none() {
            if let Some(span) = anonymise_on_archive {
                cx.error_at(
                    span,
                    "`anonymise_on_archive` needs `archive = \"schema.table\"` (the table the \
                     archive strategy moves rows to)",
                );
            }
            if let Some(field) = fields.iter().find(|f| f.not_archived) {
                cx.error_spanned_by(
                    &input.ident,
                    format!(
                        "field `{}` is `not_archived`, but `{ident_name}` names no \
                         `archive = \"schema.table\"`",
                        field.name
                    ),
                );
            }
        }

        // Markers: each on at most one field, but `record_id`, which on
        // several fields is a composite key in field order.
        let mut seen: Vec<(MarkerKind, &str)> = Vec::new();
        for field in &fields {
            for (marker, span) in &field.markers {
                if *marker == MarkerKind::RecordId {
                    continue;
                }
                if let Some((_, first)) = seen.iter().find(|(m, _)| m == marker) {
                    cx.error_at(
                        *span,
                        format!(
                            "duplicate marker `{}`: field `{first}` already has \
                             `#[retain({})]`",
                            marker.symbol(),
                            marker.symbol()
                        ),
                    );
                } else {
                    seen.push((*marker, &field.name));
                }
                if *marker == MarkerKind::Tenant {
                    if let Some(flag_span) = tenantless {
                        cx.error_at(
                            *span,
                            "a `tenantless` type cannot have a `#[retain(tenant)]` field",
                        );
                        cx.error_at(flag_span, "`tenantless` declared here");
                    }
                }
            }
        }

        let anchor = anchor.and_then(|lit| resolve_anchor(cx, &lit, &ident_name, &fields));

        let table = table.get();
        let table = resolve_table(
            &ident_name,
            table.as_ref().map(syn::LitStr::value).as_deref(),
            foreign_key(&input.attrs, SEA_ORM, TABLE_NAME).as_deref(),
            foreign_key(&input.attrs, DIESEL, TABLE_NAME).as_deref(),
        );

        Some(Container {
            ident: input.ident.clone(),
            generics: input.generics.clone(),
            name: name.get().map_or(ident_name, |n| n.value()),
            id: id?,
            category: category.map(|c| c.value()),
            anchor,
            table,
            schema: schema.get().map(|s| s.value()),
            tenantless: tenantless.is_some(),
            exempt: exempt.map(|e| e.value()),
            drop_partitions: partitions.get().is_some_and(|p| p.value() == "drop"),
            sweep_parallelism: parallelism.get(),
            audit: audit.get().map(|a| a.value()),
            archive: archive.map(|a| a.value()),
            anonymise_on_archive: anonymise_on_archive.is_some(),
            fields,
        })
    }
}

/// Reads `#[exempt_from_retention("reason")]`.
fn parse_exempt(cx: &Ctxt, attr: &syn::Attribute) -> Option<syn::LitStr> {
    const USAGE: &str = "`#[exempt_from_retention]` needs a reason: \
                         `#[exempt_from_retention(\"why this type keeps its data\")]`";
    let syn::Meta::List(list) = &attr.meta else {
        cx.error_spanned_by(attr, USAGE);
        return None;
    };
    match syn::parse2::<syn::LitStr>(list.tokens.clone()) {
        Ok(reason) if reason.value().trim().is_empty() => {
            cx.error_spanned_by(&reason, "the exemption reason must not be empty");
            None
        }
        Ok(reason) => Some(reason),
        Err(_) => {
            cx.error_spanned_by(attr, USAGE);
            None
        }
    }
}

/// Checks the durable id is a non-nil UUID, recording an error at the
/// literal otherwise.
fn check_id(cx: &Ctxt, lit: &syn::LitStr) -> bool {
    match uuid::Uuid::parse_str(&lit.value()) {
        Ok(uuid) if uuid.is_nil() => {
            cx.error_spanned_by(
                lit,
                "`id` must not be the nil UUID: generate a random one (e.g. with `cohort new-id`)",
            );
            false
        }
        Ok(_) => true,
        Err(err) => {
            cx.error_spanned_by(
                lit,
                format!(
                    "`id` must be a UUID such as \"xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx\" \
                     (generate one, e.g. with `cohort new-id`): {err}"
                ),
            );
            false
        }
    }
}

/// Turns the anchor's field name into that field's column.
fn resolve_anchor(
    cx: &Ctxt,
    lit: &syn::LitStr,
    ident_name: &str,
    fields: &[Field],
) -> Option<String> {
    let value = lit.value();
    let wanted = value.strip_prefix("r#").unwrap_or(&value);
    if let Some(field) = fields.iter().find(|f| f.name == wanted) {
        return Some(field.column.clone());
    }
    let msg = match fields.iter().find(|f| f.column == wanted) {
        Some(field) => format!(
            "`anchor` names a field, not a column: `{ident_name}` has no field `{wanted}`; \
             did you mean `anchor = \"{}\"` (column `{wanted}`)?",
            field.name
        ),
        None => {
            let names: Vec<String> = fields.iter().map(|f| format!("`{}`", f.name)).collect();
            format!(
                "`anchor` must name a field of `{ident_name}`, and there is no field \
                 `{wanted}` (fields: {})",
                names.join(", ")
            )
        }
    };
    cx.error_spanned_by(lit, msg);
    None
}

#[cfg(test)]
mod tests {
    use crate::attr::test_support::{assert_errors, read};

    #[test]
    fn struct_keys_are_read() {
        let c = read(
            r#"#[retain(category = "c", anchor = "r#when", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")]
               #[retain(schema = "app", name = "Display", tenantless)]
               struct S { #[retain(column = "when_col")] r#when: i64 }"#,
        )
        .expect("valid");
        assert_eq!(c.name, "Display");
        assert_eq!(c.category.as_deref(), Some("c"));
        assert_eq!(c.anchor.as_deref(), Some("when_col"));
        assert_eq!(c.schema.as_deref(), Some("app"));
        assert!(c.tenantless);
        assert_eq!(c.exempt, None);
    }

    #[test]
    fn exempt_type_needs_only_an_id() {
        let c = read(
            r#"#[exempt_from_retention("legal hold")] #[retain(id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")]
               struct S { x: i64 }"#,
        )
        .expect("valid");
        assert_eq!(c.exempt.as_deref(), Some("legal hold"));
        assert_eq!(c.category, None);
        assert_eq!(c.anchor, None);
    }

    #[test]
    fn bad_inputs_report_every_problem() {
        let ok_id = r#"id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8""#;
        let cases: Vec<(String, Vec<&str>)> = vec![
            ("struct S { t: i64 }".into(), vec!["has no `#[retain(...)]`"]),
            (
                r#"#[retain(category = "c", anchor = "t")] struct S { t: i64 }"#.into(),
                vec!["missing `#[retain(id"],
            ),
            (
                format!("#[retain({ok_id})] struct S {{ t: i64 }}"),
                vec!["missing `#[retain(category", "missing `#[retain(anchor"],
            ),
            (
                r#"#[retain(category = "c", anchor = "t", id = "not-a-uuid")] struct S { t: i64 }"#.into(),
                vec!["`id` must be a UUID"],
            ),
            (
                r#"#[retain(category = "c", anchor = "t", id = "00000000-0000-0000-0000-000000000000")] struct S { t: i64 }"#.into(),
                vec!["nil UUID"],
            ),
            (
                format!(r#"#[exempt_from_retention("kept")] #[retain(category = "c", anchor = "t", {ok_id})] struct S {{ t: i64 }}"#),
                vec!["SCOPE-002", "`anchor` is not allowed"],
            ),
            (
                format!(r#"#[exempt_from_retention("  ")] #[retain({ok_id})] struct S {{ t: i64 }}"#),
                vec!["reason must not be empty"],
            ),
            (
                format!(r#"#[exempt_from_retention] #[retain({ok_id})] struct S {{ t: i64 }}"#),
                vec!["needs a reason"],
            ),
            (
                format!(r#"#[retain(category = "c", category = "d", anchor = "t", {ok_id}, bogus = 1, tenant)] struct S {{ t: i64 }}"#),
                vec![
                    "duplicate key `category`",
                    "unknown key `bogus` in `#[retain(...)]` on a struct; expected one of `category`, `anchor`, `id`, `table`, `schema`, `name`, `tenantless`, `partitions`, `sweep_parallelism`, `audit`, `archive`, `anonymise_on_archive`",
                    "unknown key `tenant` in `#[retain(...)]` on a struct; expected one of `category`, `anchor`, `id`, `table`, `schema`, `name`, `tenantless`, `partitions`, `sweep_parallelism`, `audit`, `archive`, `anonymise_on_archive` (that key goes on a field, not on the struct)",
                ],
            ),
            (
                format!(r#"#[retain(category = "c", anchor = "t", {ok_id}, sweep_parallelism = 65)] struct S {{ t: i64 }}"#),
                vec!["expected `#[retain(sweep_parallelism = N)]`, N from 1 to 64"],
            ),
            (
                format!(r#"#[retain(category = "c", anchor = "t", {ok_id}, sweep_parallelism)] struct S {{ t: i64 }}"#),
                vec!["expected a value: `#[retain(sweep_parallelism = N)]`, N from 1 to 64"],
            ),
            (
                format!(r#"#[retain(category = 5, anchor = "t", {ok_id}, tenantless = true)] struct S {{ t: i64 }}"#),
                vec!["expected a string literal: `#[retain(category = \"...\")]`", "`tenantless` takes no value", "missing `#[retain(category"],
            ),
            (
                format!(r#"#[retain(category = "c", anchor = "missing", {ok_id})] struct S {{ t: i64, u: i64 }}"#),
                vec!["there is no field `missing` (fields: `t`, `u`)"],
            ),
            (
                format!(r#"#[retain(category = "c", anchor = "when_col", {ok_id})] struct S {{ #[retain(column = "when_col")] t: i64 }}"#),
                vec!["did you mean `anchor = \"t\"`"],
            ),
            (
                format!(r#"#[retain(category = "c", anchor = "t", {ok_id})] struct S {{
                    t: i64,
                    #[retain(tenant)] a: i64,
                    #[retain(tenant, tenant)] b: i64,
                    #[retain(category = "x")] c: i64,
                }}"#),
                vec![
                    "duplicate marker `tenant`: field `a` already has `#[retain(tenant)]`",
                    "duplicate key `tenant` in `#[retain(...)]`",
                    "unknown key `category` in `#[retain(...)]` on a field; expected one of `column`, `record_id`, `tenant`, `soft_delete`, `deleted_at`, `anonymised_at`, `not_archived`, `not_tenant` (that key goes on the struct, not on a field)",
                ],
            ),
            (
                format!(r#"#[retain(category = "c", anchor = "t", {ok_id})] struct S {{
                    t: i64,
                    #[anonymise(null, hash)] a: Option<String>,
                    #[anonymise(null)] #[anonymise(empty)] b: String,
                    #[retain(record_id)] #[anonymise(hash)] c: String,
                    #[anonymise(scramble)] d: String,
                    #[anonymise()] e: String,
                    #[anonymise] f: String,
                    #[anonymise(with = "not a path")] g: String,
                    #[anonymise(null = 1)] h: String,
                }}"#),
                vec![
                    "field `a` has two anonymise methods, `null` and `hash`",
                    "field `b` has two anonymise methods, `null` and `empty`",
                    "field `c` is the `record_id` marker column and cannot also be anonymised",
                    "unknown key `scramble` in `#[anonymise(...)]` on a field; expected one of `null`, `empty`, `literal`, `hash`, `with`",
                    "`#[anonymise(...)]` needs a method",
                    "expected a list of keys: `#[anonymise(...)]`",
                    "`with` must name a function by its path",
                    "`null` takes no value",
                ],
            ),
            (
                format!(r#"#[retain(category = "c", anchor = "t", {ok_id})] struct S {{
                    t: i64,
                    #[erasure_subject(kind = "")] a: i64,
                    #[erasure_subject] #[erasure_subject] b: i64,
                    #[erasure_subject(role = "x")] c: i64,
                    #[exempt_from_retention("x")] d: i64,
                }}"#),
                vec![
                    "`kind` must not be empty",
                    "duplicate `#[erasure_subject]`",
                    "unknown key `role` in `#[erasure_subject(...)]`",
                    "goes on the struct, not on a field",
                ],
            ),
            (
                format!(r#"#[retain(category = "c", anchor = "t", {ok_id}, tenantless)] #[anonymise(null)] struct S {{ t: i64, #[retain(tenant)] o: i64 }}"#),
                vec!["`#[anonymise]` goes on a field", "`tenantless` type cannot have a `#[retain(tenant)]`", "`tenantless` declared here"],
            ),
            (format!("#[retain(category = \"c\", anchor = \"t\", {ok_id})] struct S(i64);"), vec!["not tuple structs"]),
            (format!("#[retain(category = \"c\", anchor = \"t\", {ok_id})] struct S;"), vec!["not unit structs"]),
            (format!("#[retain(category = \"c\", anchor = \"t\", {ok_id})] enum S {{ A }}"), vec!["not enums"]),
            (format!("#[retain(category = \"c\", anchor = \"t\", {ok_id})] union S {{ a: i64 }}"), vec!["not unions"]),
            (
                r#"#[retain(category = "", anchor = "t", id = "nope", table = "")] enum S { A }"#.into(),
                vec!["`category` must not be empty", "`table` must not be empty", "`id` must be a UUID", "not enums", "missing `#[retain(category"],
            ),
        ];
        for (src, expected) in cases {
            assert_errors(&src, &expected);
        }
    }
}
