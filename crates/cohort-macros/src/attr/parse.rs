//! Parsing helpers shared by the struct and field attributes: keys given
//! at most once, string and flag values, unknown keys with a suggestion,
//! and list attributes. Every problem is recorded in the [`Ctxt`].

use quote::ToTokens;
use syn::ext::IdentExt;
use syn::meta::ParseNestedMeta;
use syn::Token;

use super::symbols::Symbol;
use crate::ctxt::Ctxt;

/// A key that may be given once, remembering the first value.
pub(super) struct Attr<'c, T> {
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
    pub(super) fn none(cx: &'c Ctxt, attr: Symbol, name: Symbol) -> Self {
        Attr {
            cx,
            attr,
            name,
            value: None,
        }
    }

    /// Sets the value; a second one is an error at `obj`.
    pub(super) fn set<A: ToTokens>(&mut self, obj: A, value: T) {
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
    pub(super) fn get(self) -> Option<T> {
        self.value
    }
}

/// Formats a list of keys for messages: `` `a`, `b`, `c` ``.
pub(super) fn one_of(keys: &[Symbol]) -> String {
    keys.iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A path as written (`a::b`), for messages.
pub(super) fn path_to_string(path: &syn::Path) -> String {
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
pub(super) fn lit_str(
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

/// Reads `key = N`, an integer literal in `range`; anything else is
/// recorded as an error.
pub(super) fn lit_int_in(
    cx: &Ctxt,
    meta: &ParseNestedMeta<'_>,
    attr: Symbol,
    range: std::ops::RangeInclusive<u32>,
) -> syn::Result<Option<u32>> {
    let key = path_to_string(&meta.path);
    let usage = format!(
        "`#[{attr}({key} = N)]`, N from {} to {}",
        range.start(),
        range.end()
    );
    if !meta.input.peek(Token![=]) {
        cx.error_spanned_by(&meta.path, format!("expected a value: {usage}"));
        skip_value(meta)?;
        return Ok(None);
    }
    let mut expr: syn::Expr = meta.value()?.parse()?;
    while let syn::Expr::Group(group) = expr {
        expr = *group.expr;
    }
    if let syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Int(lit),
        ..
    }) = &expr
    {
        if let Ok(n) = lit.base10_parse::<u32>() {
            if range.contains(&n) {
                return Ok(Some(n));
            }
        }
    }
    cx.error_spanned_by(&expr, format!("expected {usage}"));
    Ok(None)
}

/// Reads a flag key (no value); a value is recorded as an error.
pub(super) fn flag(cx: &Ctxt, meta: &ParseNestedMeta<'_>, attr: Symbol) -> syn::Result<()> {
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
pub(super) fn unknown(
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
        .map(|k| (edit_distance(key, k.as_str()), *k))
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
pub(super) fn parse_list(
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

/// Checks a non-empty string value, recording an error for an empty one.
pub(super) fn non_empty(cx: &Ctxt, lit: syn::LitStr, key: Symbol) -> Option<syn::LitStr> {
    if lit.value().trim().is_empty() {
        cx.error_spanned_by(&lit, format!("`{key}` must not be empty"));
        None
    } else {
        Some(lit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::symbols::{
        ANONYMISE_METHODS, CATEGORY, COLUMN, CONTAINER_KEYS, FIELD_KEYS, NULL, TENANT,
    };
    use crate::attr::test_support::assert_errors;

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
            &["unknown key `colum` in `#[retain(...)]` on a field; expected one of `column`, `record_id`, `tenant`, `soft_delete`, `deleted_at`, `anonymised_at`, `not_archived`, `not_tenant` (did you mean `column`?)"],
        );
    }
}
