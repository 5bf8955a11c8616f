//! The queue of `#[subscriber(QUEUE)]`: what the expression is, and the type and expression
//! the expansion names for it.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use syn::punctuated::Punctuated;
use syn::{Expr, Lit, LitStr, Path, UnOp};

use crate::ctxt::display;

/// What the queue may be, for the messages that reject one.
pub(crate) const QUEUE_HELP: &str =
    "the queue is a name (`\"emails\"`) or a queue descriptor (`Stream::new(\"jobs\")`)";

/// The queue of `#[subscriber(QUEUE)]`, classified by what the expansion must name.
pub(crate) enum Queue {
    /// A string literal, `"emails"`: the queue type is `&'static str`.
    Name(LitStr),
    /// A descriptor built by a call of an associated function, possibly followed by method
    /// calls: `Stream::new("jobs").kind("k")`, `InboxQueue::<SendMail>::new("emails")`. The
    /// queue type is the path before the function (`Stream`, `InboxQueue<SendMail>`).
    Descriptor {
        /// The descriptor's type.
        ty: Path,
        /// The expression, as written.
        expr: Expr,
    },
    /// Any other expression (a `const EMAILS: &str`, a function call): a name, wrapped in
    /// `ByName::new(..)`.
    ByName(Expr),
}

impl Queue {
    /// Classifies the queue expression, or rejects it (a literal other than a string).
    pub(crate) fn from_expr(expr: Expr) -> syn::Result<Queue> {
        let expr = ungroup(expr);
        match &expr {
            Expr::Lit(lit) => match &lit.lit {
                Lit::Str(s) if s.value().is_empty() => Err(syn::Error::new_spanned(
                    s,
                    "the queue name cannot be empty: `#[subscriber(\"emails\")]`",
                )),
                Lit::Str(s) => Ok(Queue::Name(s.clone())),
                other => Err(syn::Error::new_spanned(
                    other,
                    format!("{QUEUE_HELP}; `{}` is neither", display(other)),
                )),
            },
            Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) && matches!(*u.expr, Expr::Lit(_)) => {
                Err(syn::Error::new_spanned(
                    &expr,
                    format!("{QUEUE_HELP}; `{}` is neither", display(&expr)),
                ))
            }
            _ => match descriptor_type(&expr) {
                Some(ty) => Ok(Queue::Descriptor { ty, expr }),
                None => Ok(Queue::ByName(expr)),
            },
        }
    }

    /// The queue's type and the expression that builds it, as the expansion names them.
    pub(crate) fn type_and_expr(&self) -> (TokenStream, TokenStream) {
        match self {
            Queue::Name(lit) => (quote!(&'static str), lit.to_token_stream()),
            Queue::Descriptor { ty, expr } => (ty.to_token_stream(), expr.to_token_stream()),
            Queue::ByName(expr) => (
                quote!(::stagedoor_jobs::__private::ByName),
                quote!(::stagedoor_jobs::__private::ByName::new(#expr)),
            ),
        }
    }
}

/// Looks through the invisible groups that `macro_rules!` wraps around `$e:expr`.
fn ungroup(expr: Expr) -> Expr {
    match expr {
        Expr::Group(g) => ungroup(*g.expr),
        e => e,
    }
}

/// The type `T` of a descriptor written `T::f(..)` or `T::f(..).m(..)..`: the path of the
/// root call minus its last segment, when the segment before the function looks like a type
/// (an upper-case name, `Self`, or one with generic arguments). A path through modules only
/// (`queues::emails()`) is not a type: such a queue is taken by name.
fn descriptor_type(expr: &Expr) -> Option<Path> {
    let mut root = expr;
    while let Expr::MethodCall(m) = root {
        root = &m.receiver;
    }
    let Expr::Call(call) = root else { return None };
    let Expr::Path(func) = &*call.func else {
        return None;
    };
    if func.qself.is_some() || func.path.segments.len() < 2 {
        return None;
    }
    let n = func.path.segments.len();
    let owner = &func.path.segments[n - 2];
    let looks_like_type = owner.ident == "Self"
        || !owner.arguments.is_none()
        || owner
            .ident
            .to_string()
            .trim_start_matches("r#")
            .starts_with(char::is_uppercase);
    if !looks_like_type {
        return None;
    }
    let mut segments = Punctuated::new();
    for seg in func.path.segments.iter().take(n - 1) {
        let mut seg = seg.clone();
        // `InboxQueue::<Row>` is written `InboxQueue<Row>` in a type.
        if let syn::PathArguments::AngleBracketed(args) = &mut seg.arguments {
            args.colon2_token = None;
        }
        segments.push(seg);
    }
    Some(Path {
        leading_colon: func.path.leading_colon,
        segments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    /// The queue type and expression the expansion names for `expr`.
    fn mapped(expr: Expr) -> (String, String) {
        let q = Queue::from_expr(expr).unwrap_or_else(|e| panic!("rejected: {e}"));
        let (ty, expr) = q.type_and_expr();
        (display(ty), display(expr))
    }

    #[test]
    fn string_literal_is_a_static_str() {
        assert_eq!(
            mapped(parse_quote!("emails")),
            ("&'static str".into(), "\"emails\"".into())
        );
    }

    #[test]
    fn associated_function_call_is_its_type() {
        let (ty, expr) = mapped(parse_quote!(Stream::new("jobs")));
        assert_eq!(
            (ty.as_str(), expr.as_str()),
            ("Stream", "Stream::new(\"jobs\")")
        );
    }

    #[test]
    fn method_chain_keeps_the_root_type() {
        let (ty, expr) = mapped(parse_quote!(Stream::new("jobs").kind("k")));
        assert_eq!(ty, "Stream");
        assert_eq!(expr, "Stream::new(\"jobs\").kind(\"k\")");
    }

    #[test]
    fn turbofish_generics_are_kept() {
        let (ty, _) = mapped(parse_quote!(InboxQueue::<SendMail>::new("emails")));
        assert_eq!(ty, "InboxQueue<SendMail>");
        let (ty, _) = mapped(parse_quote!(::backend::InboxQueue::<A, B>::with(
            "emails", 3
        )));
        assert_eq!(ty, "::backend::InboxQueue<A, B>");
    }

    #[test]
    fn paths_through_modules_keep_them() {
        let (ty, _) = mapped(parse_quote!(stagedoor_jobs_redis::Stream::new("jobs")));
        assert_eq!(ty, "stagedoor_jobs_redis::Stream");
    }

    #[test]
    fn const_is_taken_by_name() {
        let (ty, expr) = mapped(parse_quote!(EMAILS));
        assert_eq!(ty, "::stagedoor_jobs::__private::ByName");
        assert_eq!(expr, "::stagedoor_jobs::__private::ByName::new(EMAILS)");
        let (ty, _) = mapped(parse_quote!(queues::EMAILS));
        assert_eq!(ty, "::stagedoor_jobs::__private::ByName");
    }

    #[test]
    fn calls_that_name_no_type_are_taken_by_name() {
        for expr in [
            parse_quote!(queue_name()),
            parse_quote!(queues::emails()),
            parse_quote!(std::env::var("QUEUE").unwrap()),
            parse_quote!(format!("{}.emails", PREFIX)),
        ] {
            let (ty, _) = mapped(expr);
            assert_eq!(ty, "::stagedoor_jobs::__private::ByName");
        }
    }

    #[test]
    fn other_literals_are_rejected() {
        for expr in [
            parse_quote!(42),
            parse_quote!(-1),
            parse_quote!(b"emails"),
            parse_quote!(""),
        ] {
            let err = Queue::from_expr(expr).err().expect("rejected").to_string();
            assert!(err.contains("\"emails\""), "{err}");
        }
        let err = Queue::from_expr(parse_quote!(42))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("queue descriptor (`Stream::new(\"jobs\")`); `42` is neither"),
            "{err}"
        );
    }
}
