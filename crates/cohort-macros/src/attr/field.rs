//! The field-level attributes: `#[retain(column = "...")]` and the marker
//! keys, `#[anonymise(...)]` and `#[erasure_subject]`, read into a
//! [`Field`] with its resolved column name and its type as text.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::spanned::Spanned;

use super::orm::{foreign_key, resolve_column, RenameRule, COLUMN_NAME, RENAME};
use super::parse::{flag, lit_str, non_empty, one_of, parse_list, path_to_string, unknown, Attr};
use super::symbols::{
    Symbol, ANONYMISE, ANONYMISED_AT, ANONYMISE_METHODS, COLUMN, CONTAINER_KEYS, DELETED_AT,
    DIESEL, EMPTY, ERASURE_SUBJECT, EXEMPT_FROM_RETENTION, FIELD_KEYS, HASH, KIND, LITERAL,
    NOT_ARCHIVED, NOT_TENANT, NULL, RECORD_ID, RETAIN, SEA_ORM, SOFT_DELETE, SQLX, SUBJECT_KEYS,
    TENANT, WITH,
};
use crate::ctxt::Ctxt;

/// One of the five column roles (mirrors `cohort::model::Marker`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum MarkerKind {
    /// The record key.
    RecordId,
    /// The tenant column.
    Tenant,
    /// The soft-delete flag.
    SoftDelete,
    /// When the row was soft-deleted.
    DeletedAt,
    /// When the row was anonymised.
    AnonymisedAt,
}

impl MarkerKind {
    /// Every marker.
    const ALL: [MarkerKind; 5] = [
        MarkerKind::RecordId,
        MarkerKind::Tenant,
        MarkerKind::SoftDelete,
        MarkerKind::DeletedAt,
        MarkerKind::AnonymisedAt,
    ];

    /// The attribute key.
    pub(super) fn symbol(self) -> Symbol {
        match self {
            MarkerKind::RecordId => RECORD_ID,
            MarkerKind::Tenant => TENANT,
            MarkerKind::SoftDelete => SOFT_DELETE,
            MarkerKind::DeletedAt => DELETED_AT,
            MarkerKind::AnonymisedAt => ANONYMISED_AT,
        }
    }

    /// The name of the `cohort::model::Marker` variant.
    pub(crate) fn variant(self) -> &'static str {
        match self {
            MarkerKind::RecordId => "RecordId",
            MarkerKind::Tenant => "Tenant",
            MarkerKind::SoftDelete => "SoftDelete",
            MarkerKind::DeletedAt => "DeletedAt",
            MarkerKind::AnonymisedAt => "AnonymisedAt",
        }
    }

    /// The marker a key names, if any.
    fn from_path(path: &syn::Path) -> Option<Self> {
        Self::ALL.into_iter().find(|m| *path == m.symbol())
    }
}

/// How a field is scrubbed.
#[derive(Clone, Debug)]
pub(crate) enum Anonymise {
    /// `#[anonymise(null)]`
    Null,
    /// `#[anonymise(empty)]`
    Empty,
    /// `#[anonymise(literal = "...")]`
    Literal(String),
    /// `#[anonymise(hash)]`
    Hash,
    /// `#[anonymise(with = "path::to::fn")]`
    With {
        /// The function, spanned at the string literal.
        path: syn::ExprPath,
        /// The path as written, used as the anonymiser's name.
        name: String,
        /// The string literal's span.
        span: Span,
    },
}

impl Anonymise {
    /// The method's key, for messages.
    fn key(&self) -> Symbol {
        match self {
            Anonymise::Null => NULL,
            Anonymise::Empty => EMPTY,
            Anonymise::Literal(_) => LITERAL,
            Anonymise::Hash => HASH,
            Anonymise::With { .. } => WITH,
        }
    }
}

/// A struct field as the derive declares it.
#[derive(Clone, Debug)]
pub(crate) struct Field {
    /// The field name (raw identifiers without `r#`).
    pub(crate) name: String,
    /// The resolved column name.
    pub(crate) column: String,
    /// The field's type.
    pub(crate) ty: syn::Type,
    /// The field's type as text (see [`type_string`]).
    pub(crate) rust_type: String,
    /// Explicit markers, with the span of each key.
    pub(crate) markers: Vec<(MarkerKind, Span)>,
    /// The anonymise method, if any.
    pub(crate) anonymise: Option<Anonymise>,
    /// `Some(kind)` when the field is an erasure subject.
    pub(crate) subject: Option<Option<String>>,
    /// `#[retain(not_archived)]`: left out of the archived copy.
    pub(crate) not_archived: bool,
    /// `#[retain(not_tenant)]`: its name reads as a tenant id, but it is
    /// not one (lets a `tenantless` type pass validation).
    pub(crate) not_tenant: bool,
}

/// A type as text with whitespace removed, except where needed to keep two
/// words apart (`Option<DateTime<Utc>>`, `&'static str`, `dyn Any`).
fn type_string(ty: &syn::Type) -> String {
    fn is_word(c: char) -> bool {
        c.is_alphanumeric() || c == '_'
    }
    let raw = ty.to_token_stream().to_string();
    let mut out = String::with_capacity(raw.len());
    let mut pending_space = false;
    for c in raw.chars() {
        if c.is_whitespace() {
            pending_space = true;
            continue;
        }
        if pending_space && out.chars().last().is_some_and(is_word) && is_word(c) {
            out.push(' ');
        }
        pending_space = false;
        out.push(c);
    }
    out
}

impl Field {
    /// Reads one named field's attributes.
    pub(super) fn from_ast(cx: &Ctxt, field: &syn::Field, rename_all: Option<RenameRule>) -> Field {
        let name = field
            .ident
            .as_ref()
            .map(|i| i.unraw().to_string())
            .unwrap_or_default();
        let mut column = Attr::none(cx, RETAIN, COLUMN);
        let mut markers: Vec<(MarkerKind, Span)> = Vec::new();
        let mut anonymise: Option<(Anonymise, TokenStream)> = None;
        let mut subject: Option<Option<String>> = None;
        let mut not_archived = Attr::none(cx, RETAIN, NOT_ARCHIVED);
        let mut not_tenant = Attr::none(cx, RETAIN, NOT_TENANT);

        for attr in &field.attrs {
            let path = attr.path();
            if *path == RETAIN {
                parse_list(cx, attr, RETAIN, |meta| {
                    let p = &meta.path;
                    if *p == COLUMN {
                        if let Some(s) = lit_str(cx, &meta, RETAIN)? {
                            if let Some(s) = non_empty(cx, s, COLUMN) {
                                column.set(p, s);
                            }
                        }
                    } else if *p == NOT_ARCHIVED {
                        flag(cx, &meta, RETAIN)?;
                        not_archived.set(p, ());
                    } else if *p == NOT_TENANT {
                        flag(cx, &meta, RETAIN)?;
                        not_tenant.set(p, ());
                    } else if let Some(marker) = MarkerKind::from_path(p) {
                        flag(cx, &meta, RETAIN)?;
                        if markers.iter().any(|(m, _)| *m == marker) {
                            cx.error_spanned_by(
                                p,
                                format!("duplicate key `{}` in `#[retain(...)]`", marker.symbol()),
                            );
                        } else {
                            markers.push((marker, p.span()));
                        }
                    } else {
                        let hint = CONTAINER_KEYS
                            .iter()
                            .any(|k| *p == *k)
                            .then(|| "that key goes on the struct, not on a field".to_owned());
                        unknown(cx, &meta, RETAIN, "a field", FIELD_KEYS, hint)?;
                    }
                    Ok(())
                });
            } else if *path == ANONYMISE {
                let mut keys = 0usize;
                parse_list(cx, attr, ANONYMISE, |meta| {
                    keys += 1;
                    let p = &meta.path;
                    let method = if *p == NULL {
                        flag(cx, &meta, ANONYMISE)?;
                        Some(Anonymise::Null)
                    } else if *p == EMPTY {
                        flag(cx, &meta, ANONYMISE)?;
                        Some(Anonymise::Empty)
                    } else if *p == HASH {
                        flag(cx, &meta, ANONYMISE)?;
                        Some(Anonymise::Hash)
                    } else if *p == LITERAL {
                        lit_str(cx, &meta, ANONYMISE)?.map(|s| Anonymise::Literal(s.value()))
                    } else if *p == WITH {
                        lit_str(cx, &meta, ANONYMISE)?.and_then(|s| parse_with(cx, &s))
                    } else {
                        unknown(cx, &meta, ANONYMISE, "a field", ANONYMISE_METHODS, None)?;
                        None
                    };
                    if let Some(method) = method {
                        match &anonymise {
                            Some((first, _)) => cx.error_spanned_by(
                                p,
                                format!(
                                    "field `{name}` has two anonymise methods, `{}` and `{}`: \
                                     a field takes exactly one",
                                    first.key(),
                                    method.key()
                                ),
                            ),
                            None => anonymise = Some((method, attr.to_token_stream())),
                        }
                    }
                    Ok(())
                });
                if keys == 0 && matches!(attr.meta, syn::Meta::List(_)) {
                    cx.error_spanned_by(
                        attr,
                        format!(
                            "`#[anonymise(...)]` needs a method: one of {}",
                            one_of(ANONYMISE_METHODS)
                        ),
                    );
                }
            } else if *path == ERASURE_SUBJECT {
                let kind = parse_subject(cx, attr);
                if subject.is_some() {
                    cx.error_spanned_by(attr, "duplicate `#[erasure_subject]`");
                } else if let Some(kind) = kind {
                    subject = Some(kind);
                }
            } else if *path == EXEMPT_FROM_RETENTION {
                cx.error_spanned_by(
                    attr,
                    "`#[exempt_from_retention]` goes on the struct, not on a field",
                );
            }
        }

        let column = column.get().map(|c| c.value());
        let column = resolve_column(
            &name,
            column.as_deref(),
            foreign_key(&field.attrs, SQLX, RENAME).as_deref(),
            foreign_key(&field.attrs, SEA_ORM, COLUMN_NAME).as_deref(),
            foreign_key(&field.attrs, DIESEL, COLUMN_NAME).as_deref(),
            rename_all,
        );

        if let (Some((method, tokens)), Some((marker, _))) = (&anonymise, markers.first()) {
            cx.error_spanned_by(
                tokens,
                format!(
                    "field `{name}` is the `{}` marker column and cannot also be anonymised \
                     (`{}`)",
                    marker.symbol(),
                    method.key()
                ),
            );
        }

        Field {
            name,
            column,
            ty: field.ty.clone(),
            rust_type: type_string(&field.ty),
            markers,
            anonymise: anonymise.map(|(m, _)| m),
            subject,
            not_archived: not_archived.get().is_some(),
            not_tenant: not_tenant.get().is_some(),
        }
    }
}

/// Parses `with = "path::to::fn"` into a path spanned at the literal.
fn parse_with(cx: &Ctxt, lit: &syn::LitStr) -> Option<Anonymise> {
    match lit.parse::<syn::ExprPath>() {
        Ok(path) => Some(Anonymise::With {
            name: path_to_string(&path.path),
            path,
            span: lit.span(),
        }),
        Err(_) => {
            cx.error_spanned_by(
                lit,
                "`with` must name a function by its path, e.g. `with = \"crate::anon::mask\"`",
            );
            None
        }
    }
}

/// Reads `#[erasure_subject]` / `#[erasure_subject(kind = "...")]`: the
/// kind, or `None` when the attribute is malformed (recorded).
fn parse_subject(cx: &Ctxt, attr: &syn::Attribute) -> Option<Option<String>> {
    match &attr.meta {
        syn::Meta::Path(_) => Some(None),
        syn::Meta::NameValue(_) => {
            cx.error_spanned_by(
                attr,
                "expected `#[erasure_subject]` or `#[erasure_subject(kind = \"...\")]`",
            );
            None
        }
        syn::Meta::List(_) => {
            let mut kind = Attr::none(cx, ERASURE_SUBJECT, KIND);
            let mut ok = true;
            let result = attr.parse_nested_meta(|meta| {
                if meta.path == KIND {
                    match lit_str(cx, &meta, ERASURE_SUBJECT)? {
                        Some(s) if s.value().trim().is_empty() => {
                            ok = false;
                            cx.error_spanned_by(
                                &s,
                                "`kind` must not be empty: omit it, or name the subject kind \
                                 (e.g. `kind = \"user\"`)",
                            );
                        }
                        Some(s) => kind.set(&meta.path, s.value()),
                        None => ok = false,
                    }
                } else {
                    ok = false;
                    unknown(cx, &meta, ERASURE_SUBJECT, "a field", SUBJECT_KEYS, None)?;
                }
                Ok(())
            });
            if let Err(err) = result {
                cx.syn_error(err);
                ok = false;
            }
            ok.then(|| kind.get())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::test_support::read;

    #[test]
    fn type_strings_drop_whitespace_between_symbols_only() {
        let cases = [
            ("Option<DateTime<Utc>>", "Option<DateTime<Utc>>"),
            (
                "chrono :: DateTime < chrono :: Utc >",
                "chrono::DateTime<chrono::Utc>",
            ),
            ("&'static str", "&'static str"),
            (
                "Box<dyn Fn(&str) -> String + Send>",
                "Box<dyn Fn(&str)->String+Send>",
            ),
            ("[u8; 16]", "[u8;16]"),
            ("(i32, Vec<u8>)", "(i32,Vec<u8>)"),
        ];
        for (src, expected) in cases {
            let ty: syn::Type = syn::parse_str(src).expect("type parses");
            assert_eq!(type_string(&ty), expected);
        }
    }

    #[test]
    fn field_roles_are_read() {
        let c = read(
            r#"#[retain(category = "c", anchor = "t", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")]
               struct S {
                   t: i64,
                   #[retain(record_id)] key: i64,
                   #[retain(tenant, column = "org")] org_id: i64,
                   #[retain(soft_delete)] gone: bool,
                   #[retain(deleted_at)] gone_at: Option<i64>,
                   #[retain(anonymised_at)] anon_at: Option<i64>,
                   #[anonymise(literal = "x")] a: String,
                   #[anonymise(with = "crate::m::f")] b: String,
                   #[erasure_subject] u: i64,
                   #[erasure_subject(kind = "user")] v: i64,
                   #[erasure_subject()] w: i64,
               }"#,
        )
        .expect("valid");
        let markers: Vec<(String, Vec<MarkerKind>)> = c
            .fields
            .iter()
            .filter(|f| !f.markers.is_empty())
            .map(|f| {
                (
                    f.column.clone(),
                    f.markers.iter().map(|(m, _)| *m).collect(),
                )
            })
            .collect();
        assert_eq!(
            markers,
            vec![
                ("key".to_owned(), vec![MarkerKind::RecordId]),
                ("org".to_owned(), vec![MarkerKind::Tenant]),
                ("gone".to_owned(), vec![MarkerKind::SoftDelete]),
                ("gone_at".to_owned(), vec![MarkerKind::DeletedAt]),
                ("anon_at".to_owned(), vec![MarkerKind::AnonymisedAt]),
            ]
        );
        let field = |n: &str| c.fields.iter().find(|f| f.name == n).expect("field");
        assert!(matches!(&field("a").anonymise, Some(Anonymise::Literal(s)) if s == "x"));
        assert!(
            matches!(&field("b").anonymise, Some(Anonymise::With { name, .. }) if name == "crate::m::f")
        );
        assert_eq!(field("u").subject, Some(None));
        assert_eq!(field("v").subject, Some(Some("user".to_owned())));
        assert_eq!(field("w").subject, Some(None));
    }
}
