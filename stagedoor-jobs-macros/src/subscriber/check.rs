//! The checks of a handler's signature. Each problem is recorded in the [`Ctxt`], spanned on
//! the offending tokens, with a message that names the fix; one misuse gives one error.
//!
//! What only the type checker can judge (is this argument an extractor, is this a handler's
//! result, does the message deserialize) is left to the assertions of the expansion.

use syn::visit::Visit;
use syn::{GenericParam, Signature, Type, TypeImplTrait};

use super::model::Handler;
use crate::ctxt::{Ctxt, display};

/// The form of a handler, for messages.
const HANDLER_FORM: &str =
    "`async fn send(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome`";

/// Records every problem of `h`'s signature.
pub(crate) fn check(cx: &Ctxt, h: &Handler<'_>) {
    let sig = &h.item.sig;
    check_qualifiers(cx, sig);
    check_generics(cx, sig);
    check_receiver(cx, h);
    check_message(cx, h);
    check_extractors(cx, h);
    check_variadic(cx, sig);
    check_output(cx, h);
    check_where_clause(cx, sig);
}

fn check_qualifiers(cx: &Ctxt, sig: &Signature) {
    if let Some(c) = &sig.constness {
        cx.error_spanned_by(
            c,
            "a subscriber is an `async fn`, not a `const fn`: replace `const` with `async`",
        );
    } else if sig.asyncness.is_none() {
        cx.error_spanned_by(
            sig.fn_token,
            format!(
                "a subscriber is an `async fn`: write `async fn {}(..)`",
                sig.ident
            ),
        );
    }
    if let Some(u) = &sig.unsafety {
        cx.error_spanned_by(
            u,
            "a subscriber cannot be `unsafe`: the runtime calls it with no precondition to uphold; \
             remove `unsafe` (and use `unsafe` blocks inside)",
        );
    }
    if let Some(abi) = &sig.abi {
        cx.error_spanned_by(
            abi,
            format!(
                "a subscriber cannot be `{}`: remove it; the runtime calls the handler as a Rust `async fn`",
                display(abi)
            ),
        );
    }
}

fn check_generics(cx: &Ctxt, sig: &Signature) {
    let generics = &sig.generics;
    if generics.params.is_empty() {
        return;
    }
    let only_lifetimes = generics
        .params
        .iter()
        .all(|p| matches!(p, GenericParam::Lifetime(_)));
    let msg = if only_lifetimes {
        format!(
            "a subscriber declares no lifetimes: remove `{}` and write the message as `&Mail`; \
             the extractors are owned types",
            display(generics)
        )
    } else {
        format!(
            "a subscriber cannot be generic: it decodes one concrete message type and takes concrete \
             extractors; remove `{}` and name the types",
            display(generics)
        )
    };
    cx.error_spanned_by(generics, msg);
}

fn check_where_clause(cx: &Ctxt, sig: &Signature) {
    // With generic parameters the `where` clause goes with them: one error is enough.
    if let Some(w) = &sig.generics.where_clause
        && sig.generics.params.is_empty()
    {
        cx.error_spanned_by(
            w,
            "a subscriber has no `where` clause: its message and extractors are concrete types; remove it",
        );
    }
}

fn check_receiver(cx: &Ctxt, h: &Handler<'_>) {
    if let Some(r) = h.receiver {
        cx.error_spanned_by(
            r,
            format!(
                "a subscriber is a free `async fn`, not a method: move it out of the `impl` block and remove \
                 `{}`; its first argument is the message (`mail: &Mail`)",
                display(r)
            ),
        );
    }
}

fn check_message(cx: &Ctxt, h: &Handler<'_>) {
    let sig = &h.item.sig;
    let Some(arg) = h.message else {
        // A `self` receiver has its own error already.
        if h.receiver.is_none() {
            cx.error_at(
                sig.paren_token.span.join(),
                format!(
                    "a handler takes its message first: `async fn {}(mail: &Mail) -> HandlerOutcome`; \
                     extractors such as `Ctx<keys::Attempt>` come after it",
                    sig.ident
                ),
            );
        }
        return;
    };
    if contains_impl_trait(&arg.ty) {
        cx.error_spanned_by(
            &arg.ty,
            "a handler cannot be generic: name the message's type (`mail: &Mail`) instead of `impl ..`",
        );
        return;
    }
    let pat = display(&arg.pat);
    match &*arg.ty {
        Type::Reference(r) if r.mutability.is_some() => cx.error_spanned_by(
            &arg.ty,
            format!("the message is borrowed immutably: write `{pat}: &{}`", display(&r.elem)),
        ),
        Type::Reference(r) => {
            if let Some(lt) = &r.lifetime {
                let declared = sig.generics.lifetimes().any(|l| l.lifetime.ident == lt.ident);
                if lt.ident != "_" && !declared {
                    cx.error_spanned_by(
                        lt,
                        format!(
                            "the message is borrowed for the call only: write `{pat}: &{}`",
                            display(&r.elem)
                        ),
                    );
                }
            }
        }
        ty if looks_like_extractor(ty) => cx.error_spanned_by(
            arg,
            format!(
                "a handler takes its message first (`mail: &Mail`); extractors such as `{}` come after it",
                display(ty)
            ),
        ),
        ty => cx.error_spanned_by(
            ty,
            format!("the message is borrowed: write `{pat}: &{}`", display(ty)),
        ),
    }
}

fn check_extractors(cx: &Ctxt, h: &Handler<'_>) {
    for arg in &h.extractors {
        if contains_impl_trait(&arg.ty) {
            cx.error_spanned_by(
                &arg.ty,
                "a handler cannot be generic: name the extractor's type (`Ctx<keys::Attempt>`) instead of `impl ..`",
            );
        } else if let Type::Reference(_) = &*arg.ty {
            cx.error_spanned_by(
                arg,
                format!(
                    "a handler takes one message; the other arguments are extractors such as \
                     `Ctx<keys::Attempt>`: move `{}` into the message type or extract it",
                    display(&arg.pat)
                ),
            );
        }
    }
}

fn check_variadic(cx: &Ctxt, sig: &Signature) {
    if let Some(v) = &sig.variadic {
        cx.error_spanned_by(
            v,
            format!("a subscriber cannot be variadic: remove `...`; a handler is {HANDLER_FORM}"),
        );
    }
}

fn check_output(cx: &Ctxt, h: &Handler<'_>) {
    let sig = &h.item.sig;
    match h.output() {
        None => cx.error_at(
            sig.paren_token.span.close(),
            "a handler returns what happens to the job: add `-> HandlerOutcome` \
             (or `-> Result<HandlerOutcome, E>`, `-> Result<(), E>`)",
        ),
        Some(ty) if contains_impl_trait(ty) => cx.error_spanned_by(
            ty,
            "a handler names its result type: `-> HandlerOutcome` (or `-> Result<HandlerOutcome, E>`, \
             `-> Result<(), E>`), not `impl ..`",
        ),
        Some(_) => {}
    }
}

/// `Ctx<..>` or `Data<..>`: an argument written where the message goes.
fn looks_like_extractor(ty: &Type) -> bool {
    match ty {
        Type::Path(p) if p.qself.is_none() => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "Ctx" || s.ident == "Data"),
        _ => false,
    }
}

/// Whether `ty` contains an `impl Trait`, which makes the function generic.
fn contains_impl_trait(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'ast> Visit<'ast> for Finder {
        fn visit_type_impl_trait(&mut self, _: &'ast TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut f = Finder(false);
    f.visit_type(ty);
    f.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscriber::attr::Attrs;
    use syn::{ItemFn, parse_quote};

    fn errors(item: ItemFn) -> Vec<String> {
        let cx = Ctxt::new();
        check(&cx, &Handler::from_ast(Attrs::default(), &item));
        match cx.check() {
            Ok(()) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    fn one_error(item: ItemFn, needle: &str) {
        let errs = errors(item);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0].contains(needle),
            "{:?} does not contain {needle:?}",
            errs[0]
        );
    }

    #[test]
    fn a_good_handler_passes() {
        assert!(
            errors(parse_quote! {
                pub async fn send(mail: &Mail, Ctx(a): Ctx<keys::Attempt>) -> HandlerOutcome { todo!() }
            })
            .is_empty()
        );
        assert!(
            errors(parse_quote!(
                async fn send(_: &'_ Mail) -> R {
                    todo!()
                }
            ))
            .is_empty()
        );
    }

    #[test]
    fn one_error_per_misuse_of_the_qualifiers_and_receiver() {
        one_error(
            parse_quote!(
                fn send(m: &Mail) -> R {}
            ),
            "write `async fn send(..)`",
        );
        one_error(
            parse_quote!(
                const fn send(m: &Mail) -> R {}
            ),
            "replace `const` with `async`",
        );
        one_error(
            parse_quote!(
                async unsafe fn send(m: &Mail) -> R {}
            ),
            "remove `unsafe`",
        );
        one_error(
            parse_quote!(
                async extern "C" fn send(m: &Mail) -> R {}
            ),
            "cannot be `extern \"C\"`",
        );
        one_error(
            parse_quote!(
                async fn send(&self, m: &Mail) -> R {}
            ),
            "remove `&self`",
        );
        one_error(
            parse_quote!(
                async fn send(&self) -> R {}
            ),
            "not a method",
        );
    }

    #[test]
    fn one_error_per_misuse_of_the_message() {
        one_error(
            parse_quote!(
                async fn send() -> R {}
            ),
            "takes its message first",
        );
        one_error(
            parse_quote!(
                async fn send(mail: Mail) -> R {}
            ),
            "write `mail: &Mail`",
        );
        one_error(
            parse_quote!(
                async fn send(mail: &mut Mail) -> R {}
            ),
            "borrowed immutably: write `mail: &Mail`",
        );
        one_error(
            parse_quote!(
                async fn send(mail: &'static Mail) -> R {}
            ),
            "for the call only",
        );
        one_error(
            parse_quote!(
                async fn send(a: Ctx<keys::Attempt>) -> R {}
            ),
            "extractors such as `Ctx<keys::Attempt>` come after it",
        );
    }

    #[test]
    fn one_error_per_misuse_of_the_arguments_and_result() {
        one_error(
            parse_quote!(
                async fn send(m: &Mail, o: &Other) -> R {}
            ),
            "a handler takes one message",
        );
        one_error(
            parse_quote!(
                async fn send(m: &Mail, o: &mut Other) -> R {}
            ),
            "move `o` into the message",
        );
        one_error(
            parse_quote!(
                async fn send(m: &Mail, a: impl FromJob) -> R {}
            ),
            "cannot be generic",
        );
        one_error(
            parse_quote!(
                async fn send(m: &impl Msg) -> R {}
            ),
            "cannot be generic",
        );
        one_error(
            parse_quote!(
                async fn send(m: &Mail) {}
            ),
            "add `-> HandlerOutcome`",
        );
        one_error(
            parse_quote!(
                async fn send(m: &Mail) -> impl Outcome {}
            ),
            "not `impl ..`",
        );
    }

    #[test]
    fn one_error_per_misuse_of_generics() {
        one_error(
            parse_quote!(
                async fn send<T>(m: &T) -> R {}
            ),
            "remove `<T>`",
        );
        one_error(
            parse_quote!(
                async fn send<T>(m: &T) -> R
                where
                    T: Msg,
                {
                }
            ),
            "cannot be generic",
        );
        one_error(
            parse_quote!(
                async fn send<'a>(m: &'a Mail) -> R {}
            ),
            "declares no lifetimes",
        );
        one_error(
            parse_quote!(
                async fn send(m: &Mail) -> R
                where
                    Mail: Msg,
                {
                }
            ),
            "no `where` clause",
        );
    }

    #[test]
    fn every_problem_is_reported_in_order() {
        let errs = errors(parse_quote!(
            unsafe fn send<T>(&self, m: Mail, o: &Other) {}
        ));
        let expected = [
            "write `async fn send(..)`",
            "remove `unsafe`",
            "cannot be generic",
            "not a method",
            "write `m: &Mail`",
            "a handler takes one message",
            "add `-> HandlerOutcome`",
        ];
        assert_eq!(errs.len(), expected.len(), "{errs:?}");
        for (e, needle) in errs.iter().zip(expected) {
            assert!(e.contains(needle), "{e:?} does not contain {needle:?}");
        }
    }
}
