//! `#[db_test]`: the test attribute of Cohort's end-to-end tests, in the
//! manner of `#[sqlx::test(fixtures(...))]`. The test function takes the
//! database as its one argument; the attribute makes it a `#[tokio::test]`
//! that first gets a fresh database from the test binary's own
//! `crate::support::fixture`, cloned from a template the fixture names:
//!
//! ```text
//! #[db_test(engine)]
//! async fn purges_old_notes(db: TestDatabase) {
//!     // `db` has Cohort's tables and the engine fixture's tables.
//! }
//!
//! #[db_test(migrated, flavor = "multi_thread", worker_threads = 4)]
//! async fn races(db: TestDatabase) { /* … */ }
//! ```
//!
//! The first argument names the fixture (`crate::support::Fixture`'s
//! variant, in snake case: `empty`, `migrated`, `engine`); whatever
//! follows it is handed to `#[tokio::test]` as it is.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{FnArg, Ident, ItemFn, Meta, Pat, Token};

/// The attribute's arguments: the fixture, then `#[tokio::test]`'s.
struct Args {
    fixture: Ident,
    tokio: Punctuated<Meta, Token![,]>,
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let fixture: Ident = input.parse()?;
        let tokio = if input.is_empty() {
            Punctuated::new()
        } else {
            input.parse::<Token![,]>()?;
            Punctuated::parse_terminated(input)?
        };
        Ok(Args { fixture, tokio })
    }
}

/// A test on a fresh database from a fixture (see the crate's docs).
#[proc_macro_attribute]
pub fn db_test(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = syn::parse_macro_input!(args as Args);
    let test = syn::parse_macro_input!(item as ItemFn);
    expand(args, test)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

fn expand(args: Args, mut test: ItemFn) -> syn::Result<Tokens> {
    if test.sig.asyncness.is_none() {
        return Err(syn::Error::new_spanned(
            test.sig.fn_token,
            "#[db_test] takes an async fn",
        ));
    }
    let (binding, ty) = match test.sig.inputs.iter().collect::<Vec<_>>().as_slice() {
        [FnArg::Typed(arg)] => match &*arg.pat {
            Pat::Ident(name) => (name.clone(), arg.ty.clone()),
            other => {
                return Err(syn::Error::new_spanned(
                    other,
                    "#[db_test]: name the database argument (`db: TestDatabase`)",
                ))
            }
        },
        _ => {
            return Err(syn::Error::new_spanned(
                &test.sig.inputs,
                "#[db_test] takes one argument, the database (`db: TestDatabase`)",
            ))
        }
    };
    let variant = Ident::new(&camel(&args.fixture.to_string()), args.fixture.span());
    test.sig.inputs.clear();
    let body = &test.block;
    let tokio = &args.tokio;
    let attrs = &test.attrs;
    let vis = &test.vis;
    let sig = &test.sig;
    let support = Ident::new("support", Span::call_site());
    Ok(quote! {
        #(#attrs)*
        #[::tokio::test(#tokio)]
        #vis #sig {
            let #binding: #ty = crate::#support::fixture(crate::#support::Fixture::#variant).await;
            #body
        }
    })
}

/// `seeded_notes` → `SeededNotes`.
fn camel(snake: &str) -> String {
    snake
        .split('_')
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(args: Tokens, item: Tokens) -> String {
        let args: Args = syn::parse2(args).unwrap();
        let test: ItemFn = syn::parse2(item).unwrap();
        match expand(args, test) {
            Ok(t) => t.to_string(),
            Err(e) => format!("error: {e}"),
        }
    }

    #[test]
    fn the_database_comes_from_the_named_fixture_before_the_body() {
        let out = expanded(
            quote!(engine),
            quote!(
                async fn purges(db: TestDatabase) {
                    check(&db).await;
                }
            ),
        );
        assert!(out.contains(":: tokio :: test ()"), "{out}");
        assert!(out.contains("async fn purges ()"), "{out}");
        assert!(
            out.contains("let db : TestDatabase = crate :: support :: fixture (crate :: support :: Fixture :: Engine) . await ; { check (& db) . await ; }"),
            "{out}"
        );
    }

    #[test]
    fn the_rest_of_the_arguments_go_to_tokio_test() {
        let out = expanded(
            quote!(migrated, flavor = "multi_thread", worker_threads = 4),
            quote!(
                async fn races(db: TestDatabase) {}
            ),
        );
        assert!(
            out.contains(":: tokio :: test (flavor = \"multi_thread\" , worker_threads = 4)"),
            "{out}"
        );
        assert!(out.contains("Fixture :: Migrated"), "{out}");
        assert_eq!(camel("seeded_notes"), "SeededNotes");
    }

    #[test]
    fn a_test_without_its_database_or_not_async_is_refused() {
        let none = expanded(
            quote!(engine),
            quote!(
                async fn t() {}
            ),
        );
        assert!(none.contains("takes one argument"), "{none}");
        let sync = expanded(
            quote!(engine),
            quote!(
                fn t(db: TestDatabase) {}
            ),
        );
        assert!(sync.contains("takes an async fn"), "{sync}");
        let pattern = expanded(
            quote!(engine),
            quote!(
                async fn t((a, b): (u8, u8)) {}
            ),
        );
        assert!(pattern.contains("name the database argument"), "{pattern}");
    }
}
