//! The error context: every problem found while reading the input is
//! recorded here with its span, so one compile reports all of them
//! (in the style of `serde_derive`).

use std::cell::RefCell;
use std::fmt::Display;
use std::thread;

use proc_macro2::Span;
use quote::ToTokens;

/// Collects the errors found while parsing one derive input.
///
/// [`Ctxt::check`] must be called before the context is dropped; forgetting
/// it is a bug in the macro and panics.
pub(crate) struct Ctxt {
    /// `None` once [`Ctxt::check`] has consumed the errors.
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    /// A context with no errors yet.
    pub(crate) fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// Records an error spanning the tokens of `obj` (first to last token).
    pub(crate) fn error_spanned_by<A: ToTokens, T: Display>(&self, obj: A, msg: T) {
        self.syn_error(syn::Error::new_spanned(obj.into_token_stream(), msg));
    }

    /// Records an error at `span`.
    pub(crate) fn error_at<T: Display>(&self, span: Span, msg: T) {
        self.syn_error(syn::Error::new(span, msg));
    }

    /// Records an error produced by `syn`.
    pub(crate) fn syn_error(&self, err: syn::Error) {
        if let Some(errors) = self.errors.borrow_mut().as_mut() {
            errors.push(err);
        }
    }

    /// Consumes the context: `Ok` when no error was recorded, otherwise all
    /// of them combined into one [`syn::Error`] (one `compile_error!` each).
    pub(crate) fn check(self) -> syn::Result<()> {
        let errors = self.errors.borrow_mut().take().unwrap_or_default();
        let mut iter = errors.into_iter();
        let Some(mut combined) = iter.next() else {
            return Ok(());
        };
        for err in iter {
            combined.combine(err);
        }
        Err(combined)
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !thread::panicking() && self.errors.borrow().is_some() {
            panic!("cohort-macros: Ctxt dropped without checking for errors");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_errors_is_ok() {
        let cx = Ctxt::new();
        assert!(cx.check().is_ok());
    }

    #[test]
    fn errors_are_combined_in_order() {
        let cx = Ctxt::new();
        cx.error_at(Span::call_site(), "first");
        cx.error_spanned_by(quote::quote!(a b), "second");
        let err = cx.check().unwrap_err();
        let messages: Vec<String> = err.into_iter().map(|e| e.to_string()).collect();
        assert_eq!(messages, ["first", "second"]);
    }

    #[test]
    #[should_panic(expected = "without checking")]
    fn unchecked_context_panics() {
        let _cx = Ctxt::new();
    }
}
