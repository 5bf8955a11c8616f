//! The model of an annotated handler: its queue and the parts of its signature, as the checks
//! and the expansion see them.

use syn::{FnArg, ItemFn, PatType, Receiver, ReturnType, Type};

use super::attr::Attrs;

/// One typed argument of the handler.
pub(crate) type Arg<'a> = &'a PatType;

/// An annotated handler: the attribute's arguments and the function's parts. Nothing here is
/// validated; [`check`](super::check) does that.
pub(crate) struct Handler<'a> {
    /// The attribute's arguments.
    pub(crate) attrs: Attrs,
    /// The function as written.
    pub(crate) item: &'a ItemFn,
    /// A `self` receiver, which a handler must not have.
    pub(crate) receiver: Option<&'a Receiver>,
    /// The first typed argument: the message (`mail: &Mail`).
    pub(crate) message: Option<Arg<'a>>,
    /// The other arguments: the extractors.
    pub(crate) extractors: Vec<Arg<'a>>,
}

impl<'a> Handler<'a> {
    /// Splits the function into the parts the checks and the expansion look at.
    pub(crate) fn from_ast(attrs: Attrs, item: &'a ItemFn) -> Self {
        let mut receiver = None;
        let mut typed = Vec::new();
        for arg in &item.sig.inputs {
            match arg {
                FnArg::Receiver(r) => receiver = receiver.or(Some(r)),
                FnArg::Typed(t) => typed.push(t),
            }
        }
        let mut typed = typed.into_iter();
        let message = typed.next();
        Handler {
            attrs,
            item,
            receiver,
            message,
            extractors: typed.collect(),
        }
    }

    /// The message's type: `Mail` of `mail: &Mail`, when the message is a reference.
    pub(crate) fn message_type(&self) -> Option<&'a Type> {
        match &*self.message?.ty {
            Type::Reference(r) => Some(&r.elem),
            _ => None,
        }
    }

    /// The declared return type.
    pub(crate) fn output(&self) -> Option<&'a Type> {
        match &self.item.sig.output {
            ReturnType::Default => None,
            ReturnType::Type(_, ty) => Some(ty),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctxt::display;
    use syn::parse_quote;
    #[test]
    fn splits_message_and_extractors() {
        let item: ItemFn = parse_quote! {
            async fn send(mail: &Mail, Ctx(a): Ctx<keys::Attempt>, d: Data<Pool>) -> HandlerOutcome {
                HandlerOutcome::ack()
            }
        };
        let h = Handler::from_ast(Attrs::default(), &item);
        assert!(h.receiver.is_none());
        assert_eq!(display(h.message_type().unwrap()), "Mail");
        let ex: Vec<String> = h.extractors.iter().map(|a| display(&a.ty)).collect();
        assert_eq!(ex, ["Ctx<keys::Attempt>", "Data<Pool>"]);
        assert_eq!(display(h.output().unwrap()), "HandlerOutcome");
    }

    #[test]
    fn receiver_is_set_apart() {
        let item: ItemFn = parse_quote!(
            async fn send(&self, mail: &Mail) {}
        );
        let h = Handler::from_ast(Attrs::default(), &item);
        assert!(h.receiver.is_some());
        assert_eq!(display(h.message_type().unwrap()), "Mail");
        assert!(h.output().is_none());
    }
}
