//! Reads the derive input's attributes into a [`Container`]: the struct's
//! retention keys, and for every field its column name, markers,
//! anonymiser and erasure-subject role.
//!
//! Every problem is recorded in the [`Ctxt`] with its span and parsing goes
//! on, so a single compile reports all of them. Attributes of other crates
//! (`sqlx`, `sea_orm`, `diesel`) are read leniently: only the few keys that
//! name tables and columns are looked at, and their contents never cause an
//! error here (they belong to those crates).

use std::fmt;

use heck::{ToKebabCase, ToLowerCamelCase, ToShoutySnakeCase, ToSnakeCase, ToUpperCamelCase};
use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::Token;

use crate::ctxt::Ctxt;

/// The name of an attribute or of a key inside one.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Symbol(&'static str);

impl PartialEq<Symbol> for syn::Ident {
    fn eq(&self, word: &Symbol) -> bool {
        self == word.0
    }
}

impl PartialEq<Symbol> for syn::Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// `#[retain(...)]`, on the struct and on fields.
pub(crate) const RETAIN: Symbol = Symbol("retain");
/// `#[anonymise(...)]`, on fields.
pub(crate) const ANONYMISE: Symbol = Symbol("anonymise");
/// `#[erasure_subject]` / `#[erasure_subject(kind = "...")]`, on fields.
pub(crate) const ERASURE_SUBJECT: Symbol = Symbol("erasure_subject");
/// `#[exempt_from_retention("reason")]`, on the struct.
pub(crate) const EXEMPT_FROM_RETENTION: Symbol = Symbol("exempt_from_retention");
/// sqlx's attribute (read leniently).
pub(crate) const SQLX: Symbol = Symbol("sqlx");
/// SeaORM's attribute (read leniently).
pub(crate) const SEA_ORM: Symbol = Symbol("sea_orm");
/// Diesel's attribute (read leniently).
pub(crate) const DIESEL: Symbol = Symbol("diesel");

/// Struct key: the retention category.
pub(crate) const CATEGORY: Symbol = Symbol("category");
/// Struct key: the anchor field.
pub(crate) const ANCHOR: Symbol = Symbol("anchor");
/// Struct key: the durable UUID.
pub(crate) const ID: Symbol = Symbol("id");
/// Struct key: the table (`schema.table` or `table`).
pub(crate) const TABLE: Symbol = Symbol("table");
/// Struct key: the schema.
pub(crate) const SCHEMA: Symbol = Symbol("schema");
/// Struct key: the display name.
pub(crate) const NAME: Symbol = Symbol("name");
/// Struct flag: no tenant column.
pub(crate) const TENANTLESS: Symbol = Symbol("tenantless");

/// Field key: explicit column name.
pub(crate) const COLUMN: Symbol = Symbol("column");
/// Field marker: the record key.
pub(crate) const RECORD_ID: Symbol = Symbol("record_id");
/// Field marker: the tenant column.
pub(crate) const TENANT: Symbol = Symbol("tenant");
/// Field marker: the soft-delete flag.
pub(crate) const SOFT_DELETE: Symbol = Symbol("soft_delete");
/// Field marker: when the row was soft-deleted.
pub(crate) const DELETED_AT: Symbol = Symbol("deleted_at");
/// Field marker: when the row was anonymised.
pub(crate) const ANONYMISED_AT: Symbol = Symbol("anonymised_at");

/// Anonymise method: set to NULL.
pub(crate) const NULL: Symbol = Symbol("null");
/// Anonymise method: set to the empty string.
pub(crate) const EMPTY: Symbol = Symbol("empty");
/// Anonymise method: set to a fixed text.
pub(crate) const LITERAL: Symbol = Symbol("literal");
/// Anonymise method: one-way hash.
pub(crate) const HASH: Symbol = Symbol("hash");
/// Anonymise method: a Rust function.
pub(crate) const WITH: Symbol = Symbol("with");

/// Erasure-subject key: the subject kind.
pub(crate) const KIND: Symbol = Symbol("kind");

/// sqlx field key.
const RENAME: &str = "rename";
/// sqlx struct key.
const RENAME_ALL: &str = "rename_all";
/// SeaORM / Diesel field key.
const COLUMN_NAME: &str = "column_name";
/// SeaORM / Diesel struct key.
const TABLE_NAME: &str = "table_name";

/// The keys of the struct-level `#[retain(...)]`.
pub(crate) const CONTAINER_KEYS: &[Symbol] =
    &[CATEGORY, ANCHOR, ID, TABLE, SCHEMA, NAME, TENANTLESS];
/// The keys of a field-level `#[retain(...)]`.
pub(crate) const FIELD_KEYS: &[Symbol] = &[
    COLUMN,
    RECORD_ID,
    TENANT,
    SOFT_DELETE,
    DELETED_AT,
    ANONYMISED_AT,
];
/// The methods of `#[anonymise(...)]`.
pub(crate) const ANONYMISE_METHODS: &[Symbol] = &[NULL, EMPTY, LITERAL, HASH, WITH];
/// The keys of `#[erasure_subject(...)]`.
pub(crate) const SUBJECT_KEYS: &[Symbol] = &[KIND];

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
    pub(crate) const ALL: [MarkerKind; 5] = [
        MarkerKind::RecordId,
        MarkerKind::Tenant,
        MarkerKind::SoftDelete,
        MarkerKind::DeletedAt,
        MarkerKind::AnonymisedAt,
    ];

    /// The attribute key.
    pub(crate) fn symbol(self) -> Symbol {
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

/// sqlx's `rename_all` rules.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum RenameRule {
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
    pub(crate) fn parse(rule: &str) -> Option<Self> {
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
    pub(crate) fn apply(self, field: &str) -> String {
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
    pub(crate) fn key(&self) -> Symbol {
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
}

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
    /// The fields, in declaration order.
    pub(crate) fields: Vec<Field>,
}

/// A key that may be given once, remembering the first value.
struct Attr<'c, T> {
    /// Where a duplicate is reported.
    cx: &'c Ctxt,
    /// The attribute the key belongs to, for messages.
    attr: Symbol,
    /// The key, for messages.
    name: Symbol,
    /// The first value given.
    value: Option<T>,
}

impl<'c, T> Attr<'c, T> {
    /// No value yet.
    fn none(cx: &'c Ctxt, attr: Symbol, name: Symbol) -> Self {
        Attr {
            cx,
            attr,
            name,
            value: None,
        }
    }

    /// Sets the value; a second one is an error at `obj`.
    fn set<A: ToTokens>(&mut self, obj: A, value: T) {
        if self.value.is_some() {
            self.cx.error_spanned_by(
                obj,
                format!("duplicate key `{}` in `#[{}(...)]`", self.name, self.attr),
            );
        } else {
            self.value = Some(value);
        }
    }

    /// The value, if one was given.
    fn get(self) -> Option<T> {
        self.value
    }
}

/// Formats a list of keys for messages: `` `a`, `b`, `c` ``.
fn one_of(keys: &[Symbol]) -> String {
    keys.iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A path as written (`a::b`), for messages.
fn path_to_string(path: &syn::Path) -> String {
    let segments: Vec<String> = path
        .segments
        .iter()
        .map(|s| s.ident.unraw().to_string())
        .collect();
    segments.join("::")
}

/// Skips the value of a key we reject (`= expr` or `(...)`), so parsing can
/// go on with the next key.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        let _: syn::Expr = meta.value()?.parse()?;
    } else if meta.input.peek(syn::token::Paren) {
        let _: proc_macro2::Group = meta.input.parse()?;
    }
    Ok(())
}

/// Reads `key = "..."`; a missing or non-string value is recorded.
fn lit_str(
    cx: &Ctxt,
    meta: &ParseNestedMeta<'_>,
    attr: Symbol,
) -> syn::Result<Option<syn::LitStr>> {
    let key = path_to_string(&meta.path);
    if !meta.input.peek(Token![=]) {
        cx.error_spanned_by(
            &meta.path,
            format!("expected a value: `#[{attr}({key} = \"...\")]`"),
        );
        skip_value(meta)?;
        return Ok(None);
    }
    let mut expr: syn::Expr = meta.value()?.parse()?;
    while let syn::Expr::Group(group) = expr {
        expr = *group.expr;
    }
    if let syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Str(lit),
        ..
    }) = expr
    {
        Ok(Some(lit))
    } else {
        cx.error_spanned_by(
            &expr,
            format!("expected a string literal: `#[{attr}({key} = \"...\")]`"),
        );
        Ok(None)
    }
}

/// Reads a flag key (no value); a value is recorded as an error.
fn flag(cx: &Ctxt, meta: &ParseNestedMeta<'_>, attr: Symbol) -> syn::Result<()> {
    if meta.input.peek(Token![=]) || meta.input.peek(syn::token::Paren) {
        let key = path_to_string(&meta.path);
        cx.error_spanned_by(
            &meta.path,
            format!("`{key}` takes no value: `#[{attr}({key})]`"),
        );
        skip_value(meta)?;
    }
    Ok(())
}

/// Records an unknown key, listing the valid ones, and skips its value.
fn unknown(
    cx: &Ctxt,
    meta: &ParseNestedMeta<'_>,
    attr: Symbol,
    place: &str,
    valid: &[Symbol],
    hint: Option<String>,
) -> syn::Result<()> {
    let key = path_to_string(&meta.path);
    let mut msg = format!(
        "unknown key `{key}` in `#[{attr}(...)]` on {place}; expected one of {}",
        one_of(valid)
    );
    if let Some(hint) =
        hint.or_else(|| closest(&key, valid).map(|k| format!("did you mean `{k}`?")))
    {
        msg.push_str(&format!(" ({hint})"));
    }
    cx.error_spanned_by(&meta.path, msg);
    skip_value(meta)
}

/// The valid key closest to a misspelt one (at most two edits away).
fn closest(key: &str, valid: &[Symbol]) -> Option<Symbol> {
    valid
        .iter()
        .map(|k| (edit_distance(key, k.0), *k))
        .filter(|(d, _)| *d <= 2 && *d < key.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance between two short strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut row = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != *cb);
            row.push(substitute.min(prev[j + 1] + 1).min(row[j] + 1));
        }
        prev = row;
    }
    prev[b.len()]
}

/// Parses a list attribute `#[name(...)]` with `f`, recording errors; a
/// bare `#[name]` or `#[name = ...]` is an error.
fn parse_list(
    cx: &Ctxt,
    attr: &syn::Attribute,
    name: Symbol,
    f: impl FnMut(ParseNestedMeta<'_>) -> syn::Result<()>,
) {
    match &attr.meta {
        syn::Meta::List(_) => {
            if let Err(err) = attr.parse_nested_meta(f) {
                cx.syn_error(err);
            }
        }
        syn::Meta::Path(_) | syn::Meta::NameValue(_) => {
            cx.error_spanned_by(attr, format!("expected a list of keys: `#[{name}(...)]`"))
        }
    }
}

/// Reads the `key = value` pairs of another crate's attribute, leniently:
/// the list is split at top-level commas and only pairs whose value is a
/// string literal or a path are kept (a path gives its last segment).
/// Never fails: anything else is skipped.
pub(crate) fn foreign_pairs(attr: &syn::Attribute) -> Vec<(String, String)> {
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
fn foreign_key(attrs: &[syn::Attribute], name: Symbol, key: &str) -> Option<String> {
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
pub(crate) fn resolve_column(
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
pub(crate) fn resolve_table(
    struct_name: &str,
    explicit: Option<&str>,
    sea_orm_table: Option<&str>,
    diesel_table: Option<&str>,
) -> String {
    explicit
        .or(sea_orm_table)
        .or(diesel_table)
        .map(str::to_owned)
        .unwrap_or_else(|| struct_name.to_snake_case())
}

/// A type as text with whitespace removed, except where needed to keep two
/// words apart (`Option<DateTime<Utc>>`, `&'static str`, `dyn Any`).
pub(crate) fn type_string(ty: &syn::Type) -> String {
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

/// Checks a non-empty string value, recording an error for an empty one.
fn non_empty(cx: &Ctxt, lit: syn::LitStr, key: Symbol) -> Option<syn::LitStr> {
    if lit.value().trim().is_empty() {
        cx.error_spanned_by(&lit, format!("`{key}` must not be empty"));
        None
    } else {
        Some(lit)
    }
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
                         exempt type needs a durable UUID (generate one, e.g. with `uuidgen`)"
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

        // Markers: each on at most one field.
        let mut seen: Vec<(MarkerKind, &str)> = Vec::new();
        for field in &fields {
            for (marker, span) in &field.markers {
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
                "`id` must not be the nil UUID: generate a random one (e.g. with `uuidgen`)",
            );
            false
        }
        Ok(_) => true,
        Err(err) => {
            cx.error_spanned_by(
                lit,
                format!(
                    "`id` must be a UUID such as \"xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx\" \
                     (generate one, e.g. with `uuidgen`): {err}"
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

impl Field {
    /// Reads one named field's attributes.
    fn from_ast(cx: &Ctxt, field: &syn::Field, rename_all: Option<RenameRule>) -> Field {
        let name = field
            .ident
            .as_ref()
            .map(|i| i.unraw().to_string())
            .unwrap_or_default();
        let mut column = Attr::none(cx, RETAIN, COLUMN);
        let mut markers: Vec<(MarkerKind, Span)> = Vec::new();
        let mut anonymise: Option<(Anonymise, TokenStream)> = None;
        let mut subject: Option<Option<String>> = None;

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

    /// Parses a struct and returns its container, or the error messages.
    fn read(src: &str) -> Result<Container, Vec<String>> {
        let input: syn::DeriveInput = syn::parse_str(src).expect("test input parses");
        let cx = Ctxt::new();
        let container = Container::from_ast(&cx, &input);
        match cx.check() {
            Ok(()) => Ok(container.expect("container without errors")),
            Err(err) => Err(err.into_iter().map(|e| e.to_string()).collect()),
        }
    }

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

    /// Asserts that every expected fragment appears in some error message.
    fn assert_errors(src: &str, expected: &[&str]) {
        let errors = match read(src) {
            Ok(_) => panic!("expected errors for {src}"),
            Err(errors) => errors,
        };
        for fragment in expected {
            assert!(
                errors.iter().any(|e| e.contains(fragment)),
                "no error contains {fragment:?}; errors: {errors:#?}"
            );
        }
        assert_eq!(errors.len(), expected.len(), "errors: {errors:#?}");
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
                    "unknown key `bogus` in `#[retain(...)]` on a struct; expected one of `category`, `anchor`, `id`, `table`, `schema`, `name`, `tenantless`",
                    "unknown key `tenant` in `#[retain(...)]` on a struct; expected one of `category`, `anchor`, `id`, `table`, `schema`, `name`, `tenantless` (that key goes on a field, not on the struct)",
                ],
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
                    "unknown key `category` in `#[retain(...)]` on a field; expected one of `column`, `record_id`, `tenant`, `soft_delete`, `deleted_at`, `anonymised_at` (that key goes on the struct, not on a field)",
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

    #[test]
    fn misspelt_keys_get_a_suggestion() {
        assert_eq!(edit_distance("colum", "column"), 1);
        assert_eq!(edit_distance("anchor", "anchor"), 0);
        assert_eq!(closest("colum", FIELD_KEYS), Some(COLUMN));
        assert_eq!(closest("tenent", FIELD_KEYS), Some(TENANT));
        assert_eq!(closest("catgory", CONTAINER_KEYS), Some(CATEGORY));
        assert_eq!(closest("ttl", CONTAINER_KEYS), None);
        assert_eq!(closest("nul", ANONYMISE_METHODS), Some(NULL));
        assert_errors(
            r#"#[retain(category = "c", anchor = "t", id = "a3f467fe-c5d0-4f17-9897-83c373cc1dc8")]
               struct S { #[retain(colum = "x")] t: i64 }"#,
            &["unknown key `colum` in `#[retain(...)]` on a field; expected one of `column`, `record_id`, `tenant`, `soft_delete`, `deleted_at`, `anonymised_at` (did you mean `column`?)"],
        );
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
