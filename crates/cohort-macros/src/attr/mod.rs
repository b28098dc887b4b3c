//! Reads the derive input's attributes into a [`Container`]: the struct's
//! retention keys, and for every field its column name, markers,
//! anonymiser and erasure-subject role.
//!
//! Every problem is recorded in the [`Ctxt`](crate::ctxt::Ctxt) with its
//! span and parsing goes on, so a single compile reports all of them.
//! Attributes of other crates (`sqlx`, `sea_orm`, `diesel`) are read
//! leniently: only the few keys that name tables and columns are looked at,
//! and their contents never cause an error here (they belong to those
//! crates).
//!
//! The submodules:
//!
//! - [`symbols`]: the names of the attributes and of their keys;
//! - [`parse`]: parsing helpers shared by struct and field attributes;
//! - [`orm`]: table and column names from `sqlx`, `sea_orm` and `diesel`;
//! - [`field`]: the field attributes, read into a [`Field`](field::Field);
//! - [`container`]: the struct attributes, read into a [`Container`].

mod container;
mod field;
mod orm;
mod parse;
mod symbols;

pub(crate) use container::Container;
pub(crate) use field::Anonymise;

/// Helpers for the unit tests of the submodules.
#[cfg(test)]
mod test_support {
    use super::Container;
    use crate::ctxt::Ctxt;

    /// Parses a struct and returns its container, or the error messages.
    pub(super) fn read(src: &str) -> Result<Container, Vec<String>> {
        let input: syn::DeriveInput = syn::parse_str(src).expect("test input parses");
        let cx = Ctxt::new();
        let container = Container::from_ast(&cx, &input);
        match cx.check() {
            Ok(()) => Ok(container.expect("container without errors")),
            Err(err) => Err(err.into_iter().map(|e| e.to_string()).collect()),
        }
    }

    /// Asserts that every expected fragment appears in some error message.
    pub(super) fn assert_errors(src: &str, expected: &[&str]) {
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
}
