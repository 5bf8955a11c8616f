//! `#[subscriber(QUEUE)]`: an `async fn` handler made into a mountable subscriber.
//!
//! - [`attr`] parses the attribute's arguments;
//! - [`model`] splits the function into its parts (message, extractors, result);
//! - [`queue`] classifies the queue;
//! - [`check`] validates the signature;
//! - [`expand`] writes the subscriber.
//!
//! Every problem is collected in one [`Ctxt`] and reported at once. On any error the function
//! is emitted unchanged next to the errors (as tokio's macros do): the rest of the crate and the
//! IDE keep seeing it, and nothing else fails because of the macro's error.

mod attr;
mod check;
mod expand;
mod model;
mod queue;

use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemFn;

use crate::ctxt::Ctxt;

/// Expands `#[subscriber(attr)] item`.
pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let cx = Ctxt::new();
    let attrs = attr::parse(&cx, attr);
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            cx.error_at(
                first_span(&item),
                "`#[subscriber]` goes on an `async fn`: \
                 `async fn send(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome`",
            );
            return with_errors(item, cx);
        }
    };
    let handler = model::Handler::from_ast(attrs, &func);
    check::check(&cx, &handler);
    if cx.has_errors() {
        return with_errors(item, cx);
    }
    cx.check().expect("no error recorded");
    expand::expand(&handler)
}

/// The item as written, followed by the errors.
fn with_errors(item: TokenStream, cx: Ctxt) -> TokenStream {
    let errors = cx.check().err().map(|e| e.into_compile_error());
    quote!(#item #errors)
}

/// Where to report that the item is not a function: its first token.
fn first_span(item: &TokenStream) -> proc_macro2::Span {
    item.clone()
        .into_iter()
        .next()
        .map_or_else(proc_macro2::Span::call_site, |t| t.span())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_come_after_the_item_as_written() {
        let item = quote!(
            fn send(mail: Mail) {}
        );
        let out = expand(quote!(42), item.clone()).to_string();
        assert!(out.starts_with(&item.to_string()), "{out}");
        assert_eq!(out.matches("compile_error").count(), 4, "{out}");
    }

    #[test]
    fn not_a_function() {
        let out = expand(
            quote!("emails"),
            quote!(
                struct Send;
            ),
        )
        .to_string();
        assert!(out.starts_with("struct Send ;"), "{out}");
        assert!(out.contains("goes on an `async fn`"), "{out}");
    }

    #[test]
    fn a_good_handler_expands() {
        let out = expand(
            quote!("emails"),
            quote!(
                async fn send(mail: &Mail) -> HandlerOutcome {
                    HandlerOutcome::ack()
                }
            ),
        )
        .to_string();
        assert!(!out.contains("compile_error"), "{out}");
        assert!(out.contains("IntoSubscriber for send"), "{out}");
    }
}
