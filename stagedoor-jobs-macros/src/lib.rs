//! Procedural macros of stagedoor-jobs. Use them through `stagedoor_jobs` (its prelude
//! re-exports [`macro@subscriber`]); their expansions name `::stagedoor_jobs::__private`.
//!
//! The crate is laid out as serde_derive is: `ctxt` collects the errors of one expansion,
//! and each macro has a module with its parsing (`attr`), its model (`model`), its checks
//! (`check`) and its expansion (`expand`). `#[derive(Inbox)]` will be `inbox/`, next to
//! `subscriber/`, sharing `ctxt`.

use proc_macro::TokenStream;

mod ctxt;
mod subscriber;

/// Makes an `async fn` a subscriber of a queue, ready to mount with `b.include(name)`.
///
/// ```ignore
/// use stagedoor_jobs::prelude::*;
///
/// #[subscriber("emails")]
/// pub async fn send(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
///     HandlerOutcome::ack()
/// }
/// ```
///
/// # The queue
///
/// The first argument is the queue:
///
/// - a name, `#[subscriber("emails")]`, which every broker serves;
/// - a queue descriptor of one backend, built by an associated function and possibly methods:
///   `#[subscriber(Stream::new("jobs").kind("k"))]`, `#[subscriber(InboxQueue::<Row>::new("emails"))]`;
///   such a subscriber mounts only on a broker of that backend;
/// - any other expression that converts into a `String`, taken as a name: `#[subscriber(EMAILS)]`
///   with `const EMAILS: &str = "emails";`.
///
/// Then, optionally:
///
/// - `kind = "send_email"`: the subscriber handles only jobs of that kind on the queue;
/// - `name = "mailer"`: the subscriber's name in logs and tests (default: the function's name).
///
/// # The handler
///
/// An `async fn` (not generic, not a method) whose first argument is the message, borrowed
/// (`mail: &Mail`, where `Mail: serde::Deserialize`), followed by extractors (`Ctx<keys::..>`,
/// `Data<T>`, any `FromJob`), and which returns `HandlerOutcome`, `Result<HandlerOutcome, E>` or
/// `Result<(), E>`.
///
/// # The expansion
///
/// The function becomes a unit struct of the same name (with its docs) that implements
/// `IntoSubscriber`; the function itself stays callable as `send::call(&mail, ..)`, for unit
/// tests. Every misuse is reported at once, each error on the offending tokens.
#[proc_macro_attribute]
pub fn subscriber(attr: TokenStream, item: TokenStream) -> TokenStream {
    subscriber::expand(attr.into(), item.into()).into()
}
