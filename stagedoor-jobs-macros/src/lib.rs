#![cfg_attr(docsrs, feature(doc_cfg))]
//! Procedural macros of stagedoor-jobs. Use them through `stagedoor_jobs` (its prelude
//! re-exports [`macro@subscriber`]); their expansions name `::stagedoor_jobs::__private`.
//!
//! The crate is laid out as serde_derive is: `ctxt` collects the errors of one expansion,
//! and each macro has a module with its parsing (`attr`), its model (`model`), its checks
//! (`check`) and its expansion (`expand`): `subscriber/` for `#[subscriber]`, `inbox/` for
//! `#[derive(Inbox)]`.

use proc_macro::TokenStream;

mod cron;
mod ctxt;
mod inbox;
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

/// Describes a struct as a row of a job table, for the SQL backend: implements
/// `stagedoor_jobs::Inbox`.
///
/// ```ignore
/// use chrono::{DateTime, Utc};
///
/// #[derive(Inbox, sqlx::FromRow)]
/// #[inbox(table = "mail_jobs")]
/// struct SendMail {
///     #[field(id, generated)]
///     id: i64,
///     #[field(group)]
///     name: String,
///     #[field(attempt, generated)]
///     attempt: i16,
///     #[field(retry_after)]
///     retry_after: DateTime<Utc>,
///     #[field(locked_until)]
///     locked_until: Option<DateTime<Utc>>,
///     #[field(payload)]
///     payload: Vec<u8>,
/// }
/// ```
///
/// # The table
///
/// `#[inbox(table = "mail_jobs")]` names the table; `schema = "jobs"` adds its schema. Both are
/// plain SQL identifiers: ASCII letters, digits and `_`, not starting with a digit, at most 63
/// bytes.
///
/// # The columns
///
/// The row is a struct with named fields (not generic), one per column, named after the field
/// (`r#type` is the column `type`). `#[field(role)]` gives a field its role; a field without it
/// is a plain column, which the backend carries along (into a dead letter, for one).
///
/// | role | type | |
/// |---|---|---|
/// | `id` | `i32`, `i64` (with `generated`), `String` | required |
/// | `payload` | `Vec<u8>`, `String` (JSON) | required |
/// | `locked_until` | `DateTime<Utc>`, `Option<DateTime<Utc>>` | required: the claim's lease |
/// | `group` | `String` | the queue's name; `#[field(group, fifo)]`: one at a time, in order |
/// | `attempt` | `i16`, `i32`, `i64` | may be `generated` |
/// | `retry_after`, `enqueued_at` | `DateTime<Utc>`, `Option<DateTime<Utc>>` | |
/// | `last_error`, `headers` | `String`, `Option<String>` | |
/// | `priority` | `i16`, `i32`, `i64` | the job's priority (`stagedoor_jobs::Priority`, `-2..=2`): the claim takes higher first |
///
/// `generated` marks a column the database fills on insert (an auto-increment `id`, an
/// `attempt` defaulting to 1): only `id` and `attempt` may be. An integer `id` is always
/// generated; an `id` that is not is a `String`, minted by the publisher.
///
/// # The expansion
///
/// `impl Inbox for SendMail { const TABLE: Table = Table { .. }; }`, each column's type taken
/// from its role's trait (`stagedoor_jobs::inbox::roles`), which checks it, spanned on the
/// field's type. Every misuse is reported at once, each error on the offending tokens.
#[proc_macro_derive(Inbox, attributes(inbox, field))]
pub fn derive_inbox(item: TokenStream) -> TokenStream {
    inbox::expand(item.into()).into()
}

/// A cron expression literal checked when the program compiles: `cron!("0 3 * * *")` is a
/// `stagedoor_jobs::CronExpr` for `Schedule::cron`; `cron!("61 * * * *")` does not compile.
#[proc_macro]
pub fn cron(input: TokenStream) -> TokenStream {
    cron::expand(input.into()).into()
}
