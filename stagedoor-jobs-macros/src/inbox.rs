//! `#[derive(Inbox)]`: a struct described as a row of a job table.
//!
//! - [`attr`] parses `#[inbox(..)]` and `#[field(..)]`;
//! - [`model`] splits the item into its table attributes and its fields, each with its role;
//! - [`role`] names the roles a column plays;
//! - [`check`] validates the row;
//! - [`expand`] writes the `Inbox` impl.
//!
//! Every problem is collected in one [`Ctxt`] and reported at once. On any error a stub impl of
//! `Inbox` is emitted next to the errors, so that the uses of the row add none of their own.

mod attr;
mod check;
mod expand;
mod model;
mod role;

use proc_macro2::TokenStream;
use quote::quote;
use syn::DeriveInput;

use crate::ctxt::Ctxt;

/// Expands `#[derive(Inbox)] item`.
pub(crate) fn expand(item: TokenStream) -> TokenStream {
    let input: DeriveInput = match syn::parse2(item) {
        Ok(input) => input,
        // The compiler parsed the item already: this is not reached with a struct, an enum or
        // a union, the only items a derive is applied to.
        Err(e) => return e.into_compile_error(),
    };
    let cx = Ctxt::new();
    let row = model::Row::from_ast(&cx, &input);
    check::check(&cx, &row);
    if cx.has_errors() {
        let errors = cx.check().err().map(|e| e.into_compile_error());
        let stub = expand::stub(&input);
        return quote!(#errors #stub);
    }
    cx.check().expect("no error recorded");
    expand::expand(&row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_come_with_a_stub_impl() {
        let out = expand(quote!(
            #[inbox(table = "mail jobs")]
            struct SendMail {
                #[field(idd)]
                id: i64,
            }
        ))
        .to_string();
        // The unknown role (a typo of `id`) and the table's name; not the missing roles,
        // which the typo may have been meant as.
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
        assert!(out.contains("Inbox for SendMail"), "{out}");
        assert!(out.contains("name : \"\""), "{out}");
    }

    #[test]
    fn a_good_row_expands() {
        let out = expand(quote!(
            #[inbox(table = "mail_jobs")]
            struct SendMail {
                #[field(id, generated)]
                id: i64,
                #[field(locked_until)]
                l: Option<DateTime<Utc>>,
                #[field(payload)]
                p: Vec<u8>,
            }
        ))
        .to_string();
        assert!(!out.contains("compile_error"), "{out}");
        assert!(out.contains("Inbox for SendMail"), "{out}");
        assert!(out.contains("name : \"mail_jobs\""), "{out}");
    }
}
