//! The expansion of a checked handler.
//!
//! ```text
//! /// (the function's docs)
//! #[allow(non_camel_case_types)]
//! #[derive(Clone, Copy, Debug)]
//! pub struct send;
//! impl send {
//!     /// The handler as written; call it directly in unit tests.
//!     #[allow(clippy::unused_async)]
//!     pub async fn call(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome { .. }
//! }
//! const _: () = {
//!     // One assertion per type, spanned on it: the message, each extractor, the result (and
//!     // a descriptor queue's type).
//!     const _: () = ::stagedoor_jobs::__private::assert_message::<Mail>();
//!     const _: () = ::stagedoor_jobs::__private::assert_extractor::<Ctx<keys::Attempt>>();
//!     const _: () = ::stagedoor_jobs::__private::assert_outcome::<HandlerOutcome>();
//!
//!     trait __StagedoorBuild { fn __stagedoor_build(&self) -> Subscriber<&'static str>; }
//!     impl __StagedoorBuild for send
//!     where
//!         for<'__stagedoor> Mail: ::stagedoor_jobs::__private::Message,
//!         for<'__stagedoor> Ctx<keys::Attempt>: ::stagedoor_jobs::__private::FromJob,
//!         for<'__stagedoor> HandlerOutcome: ::stagedoor_jobs::__private::IntoOutcome,
//!     {
//!         fn __stagedoor_build(&self) -> Subscriber<&'static str> {
//!             Subscriber::<&'static str>::new::<Mail, (Ctx<keys::Attempt>,), _>("emails", send::call)
//!                 .name("send") // .kind("..") when given
//!         }
//!     }
//!     trait __StagedoorUnbuildable { fn __stagedoor_build(&self) -> Subscriber<&'static str>; }
//!     impl __StagedoorUnbuildable for &send { .. unreachable!() .. }
//!
//!     impl ::stagedoor_jobs::__private::IntoSubscriber for send {
//!         type Queue = &'static str;
//!         fn into_subscriber(self) -> Subscriber<&'static str> {
//!             (&self).__stagedoor_build()
//!         }
//!     }
//! };
//! ```
//!
//! (`Subscriber` stands for `::stagedoor_jobs::__private::Subscriber`.)
//!
//! One misuse gives one error: an argument that is not an extractor fails its assertion,
//! spanned on the argument with `FromJob`'s message, and nothing else fails because of it:
//!
//! - the impl that calls `Subscriber::new` assumes the asserted facts in `where` clauses, so its
//!   body does not fail a second time (spanned on the attribute). A bound under a `for<..>`
//!   binder is not checked where it is declared, as a trivially false bound without one would
//!   be, so the impl is well-formed either way;
//! - `into_subscriber` picks that impl by method resolution (autoref specialization): when its
//!   `where` clauses hold, it is found at the first step; when one does not, the `&send`
//!   fallback is found instead, so `IntoSubscriber` is still implemented and mounting `send`
//!   adds no error either. The fallback is only ever picked in a program that does not
//!   compile (an assertion failed), so its `unreachable!()` never runs.
//!
//! A descriptor queue's type is also a `where` clause of the `IntoSubscriber` impl (its
//! `type Queue` needs it): mounting a subscriber whose queue is not a descriptor fails there
//! too.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Attribute, Ident, Lifetime, LitStr, Type, TypeBareFn, TypeReference};

use super::model::Handler;
use super::queue::Queue;

/// The lifetime of the `for<..>` binder of the expansion's `where` clauses.
const BINDER: &str = "'__stagedoor";

/// Expands a handler that passed the checks.
pub(crate) fn expand(h: &Handler<'_>) -> TokenStream {
    let item = h.item;
    let vis = &item.vis;
    let ident = &item.sig.ident;
    let private = quote!(::stagedoor_jobs::__private);
    let (docs, cfgs, others) = split_attrs(&item.attrs);

    let mut sig = item.sig.clone();
    sig.ident = Ident::new("call", ident.span());
    let block = &item.block;

    let queue = h
        .attrs
        .queue
        .as_ref()
        .expect("checked: the attribute names a queue");
    let (queue_ty, queue_expr) = queue.type_and_expr();
    let message = h.message_type().expect("checked: the message is `&M`");
    let output = h
        .output()
        .expect("checked: the handler declares its result");
    let extractors: Vec<&Type> = h.extractors.iter().map(|a| &*a.ty).collect();

    let name = h
        .attrs
        .name
        .clone()
        .unwrap_or_else(|| LitStr::new(&ident.unraw().to_string(), ident.span()));
    let kind = h.attrs.kind.as_ref().map(|k| quote!(.kind(#k)));

    let facts = Facts::of(&private, message, &extractors, output, queue, &queue_ty);

    // Spanned on the function's name: an error about the handler as a whole (a future that is
    // not `Send`) points there.
    let build = quote_spanned! {ident.span()=>
        #private::Subscriber::<#queue_ty>::new::<#message, (#(#extractors,)*), _>(
            #queue_expr, #ident::call
        )
    };
    let build = quote!(#build .name(#name) #kind);
    let registration = registration(&private, ident, &queue_ty, &facts, &build);

    quote! {
        #(#cfgs)*
        #(#docs)*
        #[allow(non_camel_case_types)]
        #[derive(::core::clone::Clone, ::core::marker::Copy, ::core::fmt::Debug)]
        #vis struct #ident;

        #(#cfgs)*
        impl #ident {
            /// The handler as written; call it directly in unit tests.
            #[allow(clippy::unused_async)]
            #(#others)*
            #vis #sig #block
        }

        #(#cfgs)*
        #registration
    }
}

/// The function's attributes: its docs, its `cfg`s, and the others.
fn split_attrs(attrs: &[Attribute]) -> (Vec<&Attribute>, Vec<&Attribute>, Vec<&Attribute>) {
    let mut docs = Vec::new();
    let mut cfgs = Vec::new();
    let mut others = Vec::new();
    for attr in attrs {
        if attr.path().is_ident("doc") {
            docs.push(attr);
        } else if attr.path().is_ident("cfg") {
            cfgs.push(attr);
        } else {
            others.push(attr);
        }
    }
    (docs, cfgs, others)
}

/// The assertions, spanned on the user's tokens so that their errors land there, and the
/// same facts as `where` clauses of the impl that builds the subscriber.
struct Facts {
    /// One `const _` per type: the message, each extractor, the result, a descriptor queue.
    asserts: Vec<TokenStream>,
    /// The same facts under the `for<..>` binder.
    bounds: Vec<TokenStream>,
    /// A descriptor queue's `where` clause on the `IntoSubscriber` impl.
    queue_bound: Option<TokenStream>,
}

impl Facts {
    fn of(
        private: &TokenStream,
        message: &Type,
        extractors: &[&Type],
        output: &Type,
        queue: &Queue,
        queue_ty: &TokenStream,
    ) -> Self {
        let mut asserts = Vec::new();
        let mut bounds = Vec::new();
        let binder = Lifetime::new(BINDER, Span::call_site());
        asserts.push(quote_spanned! {message.span()=>
            const _: () = #private::assert_message::<#message>();
        });
        let m = for_bound(message);
        bounds.push(quote!(for<#binder> #m: #private::Message));
        for ty in extractors {
            asserts.push(quote_spanned! {ty.span()=>
                const _: () = #private::assert_extractor::<#ty>();
            });
            let t = for_bound(ty);
            bounds.push(quote!(for<#binder> #t: #private::FromJob));
        }
        asserts.push(quote_spanned! {output.span()=>
            const _: () = #private::assert_outcome::<#output>();
        });
        let r = for_bound(output);
        bounds.push(quote!(for<#binder> #r: #private::IntoOutcome));
        let mut queue_bound = None;
        if let Queue::Descriptor { expr, .. } = queue {
            asserts.push(quote_spanned! {expr.span()=>
                const _: () = #private::assert_queue::<#queue_ty>();
            });
            queue_bound = Some(quote!(where for<#binder> #queue_ty: #private::Queue));
            bounds.push(quote!(for<#binder> #queue_ty: #private::Queue));
        }
        Facts {
            asserts,
            bounds,
            queue_bound,
        }
    }
}

/// The `const _` block: the assertions, and `IntoSubscriber` by autoref specialization over
/// the impl that calls `build` (see the module's docs).
fn registration(
    private: &TokenStream,
    ident: &Ident,
    queue_ty: &TokenStream,
    facts: &Facts,
    build: &TokenStream,
) -> TokenStream {
    let subscriber = quote!(#private::Subscriber<#queue_ty>);
    let Facts {
        asserts,
        bounds,
        queue_bound,
    } = facts;
    quote! {
        const _: () = {
            #(#asserts)*

            trait __StagedoorBuild {
                fn __stagedoor_build(&self) -> #subscriber;
            }
            impl __StagedoorBuild for #ident
            where
                #(#bounds,)*
            {
                fn __stagedoor_build(&self) -> #subscriber {
                    #build
                }
            }

            // Chosen only when a `where` clause above does not hold, which an assertion above
            // reports: such a program does not compile, so this never runs.
            trait __StagedoorUnbuildable {
                fn __stagedoor_build(&self) -> #subscriber;
            }
            impl __StagedoorUnbuildable for &#ident {
                fn __stagedoor_build(&self) -> #subscriber {
                    ::core::unreachable!()
                }
            }

            impl #private::IntoSubscriber for #ident #queue_bound {
                type Queue = #queue_ty;

                fn into_subscriber(self) -> #subscriber {
                    (&self).__stagedoor_build()
                }
            }
        };
    }
}

/// `ty` as it can be written in a `where` clause under the `for<..>` binder: elided lifetimes
/// (`&T`, `'_`) are not allowed there, so they become the binder's lifetime (which assumes the
/// bound for every lifetime, the most an elided one can be).
fn for_bound(ty: &Type) -> Type {
    struct Named(Lifetime);
    impl VisitMut for Named {
        fn visit_lifetime_mut(&mut self, lt: &mut Lifetime) {
            if lt.ident == "_" {
                *lt = Lifetime::new(&self.0.to_string(), lt.span());
            }
        }
        fn visit_type_reference_mut(&mut self, r: &mut TypeReference) {
            if r.lifetime.is_none() {
                r.lifetime = Some(Lifetime::new(&self.0.to_string(), r.and_token.span));
            }
            syn::visit_mut::visit_type_reference_mut(self, r);
        }
        // Elision inside `fn(&T)` is the function type's own: leave it.
        fn visit_type_bare_fn_mut(&mut self, _: &mut TypeBareFn) {}
        fn visit_parenthesized_generic_arguments_mut(
            &mut self,
            _: &mut syn::ParenthesizedGenericArguments,
        ) {
        }
    }
    let mut ty = ty.clone();
    Named(Lifetime::new(BINDER, Span::call_site())).visit_type_mut(&mut ty);
    ty
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctxt::{Ctxt, display};
    use crate::subscriber::attr;
    use quote::ToTokens;
    use syn::{File, Item, ItemFn, parse_quote};

    /// The tokens without any whitespace, to look for needles written without any.
    fn compact<T: ToTokens>(tokens: T) -> String {
        tokens
            .to_token_stream()
            .to_string()
            .split_whitespace()
            .collect()
    }

    fn docs(attrs: &[Attribute]) -> usize {
        attrs.iter().filter(|a| a.path().is_ident("doc")).count()
    }

    fn expanded(attr: TokenStream, item: ItemFn) -> File {
        let cx = Ctxt::new();
        let attrs = attr::parse(&cx, attr);
        let h = Handler::from_ast(attrs, &item);
        super::super::check::check(&cx, &h);
        cx.check().expect("no error");
        syn::parse2(expand(&h)).expect("the expansion parses as items")
    }

    #[test]
    fn expansion_shape() {
        let file = expanded(
            quote!("emails", kind = "send_email"),
            parse_quote! {
                /// Sends the mail.
                #[cfg(all())]
                #[allow(clippy::all)]
                pub async fn send(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>, r: Data<&'static str>) -> HandlerOutcome {
                    HandlerOutcome::ack()
                }
            },
        );
        let [Item::Struct(st), Item::Impl(imp), Item::Const(c)] = &file.items[..] else {
            panic!("struct, impl, const expected: {}", quote!(#file));
        };
        assert_eq!(st.ident, "send");
        assert_eq!(docs(&st.attrs), 1);
        assert!(st.attrs.iter().any(|a| a.path().is_ident("cfg")));
        assert!(imp.attrs.iter().any(|a| a.path().is_ident("cfg")));
        assert!(c.attrs.iter().any(|a| a.path().is_ident("cfg")));
        let call = compact(imp);
        assert!(call.contains("pubasyncfncall"), "{call}");
        assert!(call.contains("#[allow(clippy::all)]"), "{call}");
        let body = compact(&c.expr);
        assert!(body.contains("assert_message::<Mail>()"), "{body}");
        assert!(
            body.contains("assert_extractor::<Ctx<keys::Attempt>>()"),
            "{body}"
        );
        assert!(
            body.contains("assert_outcome::<HandlerOutcome>()"),
            "{body}"
        );
        assert!(body.contains("typeQueue=&'staticstr"), "{body}");
        assert!(
            body.contains(
                "new::<Mail,(Ctx<keys::Attempt>,Data<&'staticstr>,),_>(\"emails\",send::call)"
            ),
            "{body}"
        );
        assert!(
            body.contains(".name(\"send\").kind(\"send_email\")"),
            "{body}"
        );
        assert!(!body.contains("assert_queue"), "{body}");
    }

    #[test]
    fn descriptor_queue_and_name() {
        let file = expanded(
            quote!(InboxQueue::<SendMail>::new("emails"), name = "other"),
            parse_quote!(
                async fn r#send(mail: &SendMail) -> Result<(), Error> {
                    Ok(())
                }
            ),
        );
        let body = compact(&file.items[2]);
        assert!(body.contains("typeQueue=InboxQueue<SendMail>"), "{body}");
        assert!(
            body.contains("assert_queue::<InboxQueue<SendMail>>()"),
            "{body}"
        );
        assert!(
            body.contains("InboxQueue::<SendMail>::new(\"emails\")"),
            "{body}"
        );
        assert!(body.contains(".name(\"other\")"), "{body}");
        assert!(!body.contains(".kind("), "{body}");
    }

    #[test]
    fn raw_identifiers_are_named_without_prefix() {
        let file = expanded(
            quote!(EMAILS),
            parse_quote!(
                async fn r#type(m: &M) -> R {
                    todo!()
                }
            ),
        );
        let body = compact(&file.items[2]);
        assert!(body.contains(".name(\"type\")"), "{body}");
        assert!(body.contains("ByName::new(EMAILS)"), "{body}");
    }

    #[test]
    fn bounds_name_elided_lifetimes() {
        let ty: Type = parse_quote!(Foo<'_, &Bar, fn(&u8), Box<dyn Fn(&u8)>>);
        assert_eq!(
            display(for_bound(&ty)),
            "Foo<'__stagedoor, &'__stagedoor Bar, fn(&u8), Box<dyn Fn(&u8)>>"
        );
    }
}
