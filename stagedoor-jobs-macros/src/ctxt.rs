//! The error collector of one expansion (serde_derive's `Ctxt`): every check records its
//! errors here instead of returning at the first one, so that a user sees all of them at once.

use std::cell::RefCell;
use std::fmt::Display;
use std::thread;

use proc_macro2::Span;
use quote::ToTokens;

/// Collects the errors of one macro invocation. Must be consumed with [`Ctxt::check`].
pub(crate) struct Ctxt {
    /// `None` once checked: dropping an unchecked context is a bug of the macro.
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    pub(crate) fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// An error spanned on the tokens of `obj` (from its first token to its last).
    pub(crate) fn error_spanned_by<A: ToTokens, T: Display>(&self, obj: A, msg: T) {
        self.syn_error(syn::Error::new_spanned(obj.into_token_stream(), msg));
    }

    /// An error at `span`.
    pub(crate) fn error_at<T: Display>(&self, span: Span, msg: T) {
        self.syn_error(syn::Error::new(span, msg));
    }

    /// An error as syn reported it (a parse error).
    pub(crate) fn syn_error(&self, err: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("Ctxt used after check")
            .push(err);
    }

    /// Whether an error has been recorded so far.
    pub(crate) fn has_errors(&self) -> bool {
        self.errors.borrow().as_ref().is_some_and(|e| !e.is_empty())
    }

    /// Consumes the context: all the recorded errors combined into one, in the order recorded.
    pub(crate) fn check(self) -> syn::Result<()> {
        let errors = self.errors.borrow_mut().take().expect("Ctxt checked twice");
        let mut iter = errors.into_iter();
        match iter.next() {
            None => Ok(()),
            Some(mut first) => {
                for e in iter {
                    first.combine(e);
                }
                Err(first)
            }
        }
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !thread::panicking() && self.errors.borrow().is_some() {
            panic!("stagedoor-jobs-macros: a Ctxt was dropped without being checked");
        }
    }
}

/// Renders tokens as a user would write them (`&Mail`, `Ctx<keys::Attempt>`), for messages.
pub(crate) fn display<T: ToTokens>(tokens: T) -> String {
    let mut s = tokens.into_token_stream().to_string();
    for (from, to) in [
        (" :: ", "::"),
        (":: ", "::"),
        (" < ", "<"),
        ("< ", "<"),
        (" <", "<"),
        (" >", ">"),
        (" ,", ","),
        ("& ", "&"),
        (" (", "("),
        ("( ", "("),
        (" )", ")"),
        (" . ", "."),
        (" : ", ": "),
        (",>", ">"),
        ("[ ", "["),
        (" ]", "]"),
    ] {
        while s.contains(from) {
            s = s.replace(from, to);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn collects_every_error_in_order() {
        let cx = Ctxt::new();
        cx.error_at(Span::call_site(), "first");
        cx.error_spanned_by(quote!(a b), "second");
        assert!(cx.has_errors());
        let err = cx.check().unwrap_err();
        let msgs: Vec<String> = err.into_iter().map(|e| e.to_string()).collect();
        assert_eq!(msgs, ["first", "second"]);
    }

    #[test]
    fn no_error_is_ok() {
        let cx = Ctxt::new();
        assert!(!cx.has_errors());
        assert!(cx.check().is_ok());
    }

    #[test]
    fn displays_types_as_written() {
        let ty: syn::Type = syn::parse_quote!(&mut Vec<keys::Attempt>);
        assert_eq!(display(&ty), "&mut Vec<keys::Attempt>");
        let ty: syn::Type = syn::parse_quote!(Result<HandlerOutcome, Box<dyn Error + Send>>);
        assert_eq!(
            display(&ty),
            "Result<HandlerOutcome, Box<dyn Error + Send>>"
        );
        let pat: syn::Pat = syn::parse_quote!(Ctx(attempt));
        assert_eq!(display(&pat), "Ctx(attempt)");
        let generics: syn::Generics = syn::parse_quote!(<T: serde::Deserialize, 'a>);
        assert_eq!(display(&generics), "<'a, T: serde::Deserialize>");
    }
}
