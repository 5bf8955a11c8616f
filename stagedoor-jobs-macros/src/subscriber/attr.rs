//! Parsing of the attribute's arguments: `#[subscriber(QUEUE, kind = "..", name = "..")]`.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, Ident, Lit, LitStr, Token};

use super::queue::{QUEUE_HELP, Queue};
use crate::ctxt::Ctxt;

/// The keys accepted after the queue, for the messages that reject one.
const KEYS_HELP: &str =
    "after the queue, `#[subscriber]` accepts `kind = \"..\"` and `name = \"..\"`";

/// The attribute's arguments. A field is `None` when it was not given or was rejected (the
/// rejection is in the [`Ctxt`]).
#[derive(Default)]
pub(crate) struct Attrs {
    /// The queue the subscriber reads.
    pub(crate) queue: Option<Queue>,
    /// `kind = ".."`: only jobs of this kind.
    pub(crate) kind: Option<LitStr>,
    /// `name = ".."`: the subscriber's name instead of the function's.
    pub(crate) name: Option<LitStr>,
}

/// Parses the attribute's tokens, recording every problem in `cx`.
pub(crate) fn parse(cx: &Ctxt, tokens: TokenStream) -> Attrs {
    let mut attrs = Attrs::default();
    if tokens.is_empty() {
        cx.error_at(
            Span::call_site(),
            format!(
                "`#[subscriber]` needs a queue: {QUEUE_HELP}, as in `#[subscriber(\"emails\")]`"
            ),
        );
        return attrs;
    }
    let parser = |input: ParseStream<'_>| parse_args(cx, input, &mut attrs);
    if let Err(e) = parser.parse2(tokens) {
        cx.syn_error(e);
    }
    attrs
}

/// `ident =` (and not `ident ==`) starts a `key = value` argument.
fn at_key(input: ParseStream<'_>) -> bool {
    input.peek(Ident::peek_any) && input.peek2(Token![=]) && !input.peek2(Token![==])
}

fn parse_args(cx: &Ctxt, input: ParseStream<'_>, attrs: &mut Attrs) -> syn::Result<()> {
    let mut seen_kind: Option<Ident> = None;
    let mut seen_name: Option<Ident> = None;
    let mut first = true;
    while !input.is_empty() {
        if !first {
            input.parse::<Token![,]>().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    format!("expected `,`: {KEYS_HELP}, separated by commas"),
                )
            })?;
            if input.is_empty() {
                break;
            }
        }
        if at_key(input) {
            if first {
                cx.error_at(
                    input.span(),
                    format!("the queue comes first: `#[subscriber(\"emails\", ..)]`; {QUEUE_HELP}"),
                );
            }
            let key = Ident::parse_any(input)?;
            input.parse::<Token![=]>()?;
            let value: Expr = input.parse().map_err(|e| {
                syn::Error::new(
                    e.span(),
                    format!("`{key}` takes a string literal: `{key} = \"..\"`"),
                )
            })?;
            let (seen, slot, example) = match key.to_string().as_str() {
                "kind" => (&mut seen_kind, &mut attrs.kind, "kind = \"send_email\""),
                "name" => (&mut seen_name, &mut attrs.name, "name = \"send_email\""),
                _ => {
                    cx.error_spanned_by(&key, format!("unknown argument `{key}`: {KEYS_HELP}"));
                    first = false;
                    continue;
                }
            };
            if seen.is_some() {
                cx.error_spanned_by(&key, format!("`{key}` is given twice: keep one of the two"));
            } else {
                *seen = Some(key.clone());
                match string_literal(&value) {
                    Some(s) if s.value().is_empty() => cx.error_spanned_by(
                        s,
                        format!("`{key}` cannot be empty: write a name, as in `{example}`"),
                    ),
                    Some(s) => *slot = Some(s.clone()),
                    None => cx.error_spanned_by(
                        &value,
                        format!("`{key}` takes a string literal: `{example}`"),
                    ),
                }
            }
        } else if first {
            let expr: Expr = input
                .parse()
                .map_err(|e| syn::Error::new(e.span(), QUEUE_HELP))?;
            match Queue::from_expr(expr) {
                Ok(q) => attrs.queue = Some(q),
                Err(e) => cx.syn_error(e),
            }
        } else {
            let expr: Expr = input.parse()?;
            cx.error_spanned_by(&expr, format!("unexpected argument: {KEYS_HELP}"));
        }
        first = false;
    }
    Ok(())
}

/// The string literal `expr` is, looking through the invisible groups of `macro_rules!`.
fn string_literal(expr: &Expr) -> Option<&LitStr> {
    match expr {
        Expr::Lit(lit) if lit.attrs.is_empty() => match &lit.lit {
            Lit::Str(s) => Some(s),
            _ => None,
        },
        Expr::Group(g) => string_literal(&g.expr),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn errors(tokens: TokenStream) -> (Attrs, Vec<String>) {
        let cx = Ctxt::new();
        let attrs = parse(&cx, tokens);
        let msgs = match cx.check() {
            Ok(()) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        };
        (attrs, msgs)
    }

    #[test]
    fn queue_alone() {
        let (attrs, errs) = errors(quote!("emails"));
        assert!(errs.is_empty(), "{errs:?}");
        assert!(matches!(attrs.queue, Some(Queue::Name(_))));
        assert!(attrs.kind.is_none() && attrs.name.is_none());
    }

    #[test]
    fn queue_kind_and_name_with_trailing_comma() {
        let (attrs, errs) = errors(quote!(
            Stream::new("jobs"),
            kind = "send_email",
            name = "other",
        ));
        assert!(errs.is_empty(), "{errs:?}");
        assert!(matches!(attrs.queue, Some(Queue::Descriptor { .. })));
        assert_eq!(attrs.kind.unwrap().value(), "send_email");
        assert_eq!(attrs.name.unwrap().value(), "other");
    }

    #[test]
    fn turbofish_with_two_arguments_is_one_queue() {
        let (attrs, errs) = errors(quote!(Queue::<A, B>::new("q"), kind = "k"));
        assert!(errs.is_empty(), "{errs:?}");
        assert!(matches!(attrs.queue, Some(Queue::Descriptor { .. })));
    }

    #[test]
    fn empty_attribute_asks_for_a_queue() {
        let (_, errs) = errors(TokenStream::new());
        assert_eq!(errs.len(), 1);
        assert!(errs[0].contains("needs a queue"), "{errs:?}");
    }

    #[test]
    fn every_problem_is_reported() {
        let (_, errs) = errors(quote!(
            42,
            kind = 1,
            colour = "red",
            name = "a",
            name = "b",
            kind = "x"
        ));
        assert_eq!(errs.len(), 5, "{errs:?}");
        assert!(errs[0].contains("queue descriptor"));
        assert!(errs[1].contains("`kind` takes a string literal"));
        assert!(errs[2].contains("unknown argument `colour`"));
        assert!(errs[3].contains("`name` is given twice"));
        assert!(errs[4].contains("`kind` is given twice"));
    }

    #[test]
    fn key_before_queue() {
        let (_, errs) = errors(quote!(kind = "x"));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].contains("the queue comes first"), "{errs:?}");
    }

    #[test]
    fn unparsable_queue_names_the_forms() {
        let (_, errs) = errors(quote!(struct));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].contains("queue descriptor"), "{errs:?}");
    }

    #[test]
    fn missing_comma() {
        let (_, errs) = errors(quote!("emails" kind = "x"));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].contains("expected `,`"), "{errs:?}");
    }

    #[test]
    fn empty_kind() {
        let (_, errs) = errors(quote!("emails", kind = ""));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].contains("cannot be empty"), "{errs:?}");
    }

    #[test]
    fn positional_argument_after_queue() {
        let (_, errs) = errors(quote!("emails", "other"));
        assert_eq!(errs.len(), 1);
        assert!(errs[0].contains("unexpected argument"), "{errs:?}");
    }
}
