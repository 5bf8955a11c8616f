//! Subscriber definitions: a handler bound to a queue (and optionally a kind), ready to mount.

use std::fmt;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::broker::Broker;
use crate::handler::{ErasedHandler, FromJobTuple, Handler, Typed};

/// A queue a subscriber reads: a plain name (any broker that routes it serves it) or a typed
/// descriptor of one backend (`Stream::new("jobs")`, `InboxQueue::<Row>::new("emails")`).
pub trait QueueDescriptor: Send + Sync + 'static {
    /// The queue's name within its broker.
    fn queue_name(&self) -> String;
    /// The kind this descriptor selects, if it selects one.
    fn queue_kind(&self) -> Option<String> {
        None
    }
    /// The backend a typed descriptor belongs to; `None` for a plain name.
    fn backend(&self) -> Option<&'static str> {
        None
    }
}

/// Says that queues described by `Self` can be mounted on broker `B`. Plain names fit every
/// broker; a typed descriptor fits its own backend only, which makes mounting it on another a
/// compile error.
#[diagnostic::on_unimplemented(
    message = "a subscriber on a `{Self}` queue cannot be mounted on a `{B}` broker",
    label = "this subscriber's queue belongs to another backend",
    note = "mount it with `.with_broker(..)` on a broker of its own backend, or subscribe by name (`#[subscriber(\"queue\")]`) to run it on any broker"
)]
pub trait QueueFor<B: Broker> {}

impl QueueDescriptor for &'static str {
    fn queue_name(&self) -> String {
        (*self).to_owned()
    }
}
impl<B: Broker> QueueFor<B> for &'static str {}

impl QueueDescriptor for String {
    fn queue_name(&self) -> String {
        self.clone()
    }
}
impl<B: Broker> QueueFor<B> for String {}

/// A queue named by any expression that converts to a string: `#[subscriber(EMAILS)]` with a
/// `const EMAILS: &str`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ByName(String);

impl ByName {
    /// The queue `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }
}
impl QueueDescriptor for ByName {
    fn queue_name(&self) -> String {
        self.0.clone()
    }
}
impl<B: Broker> QueueFor<B> for ByName {}

/// A handler bound to a queue: what `#[subscriber]` produces and [`RouteBuilder::include`]
/// mounts. Build one without the macro with [`Subscriber::new`].
///
/// [`RouteBuilder::include`]: crate::RouteBuilder::include
pub struct Subscriber<Q> {
    pub(crate) queue: Q,
    pub(crate) kind: Option<String>,
    pub(crate) name: String,
    pub(crate) handler: Arc<dyn ErasedHandler>,
}

impl<Q: QueueDescriptor> Subscriber<Q> {
    /// Binds `handler` to `queue`. The handler is an `async fn(&M, extractors..)`; its message
    /// type is what payloads decode into.
    pub fn new<M, Args, H>(queue: Q, handler: H) -> Self
    where
        H: Handler<M, Args>,
        M: DeserializeOwned + Send + Sync + 'static,
        Args: FromJobTuple,
    {
        let kind = queue.queue_kind();
        let name = short_type_name::<H>();
        Self {
            queue,
            kind,
            name,
            handler: Arc::new(Typed::<H, M, Args>::new(handler)),
        }
    }

    /// Handles only jobs of `kind` on the queue (several kinds can share one queue, each with
    /// its own handler, cap and backoff). Without it, the subscriber takes every kind that has
    /// no handler of its own.
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// Names the subscriber in logs, startup messages and test assertions (the macro uses the
    /// function's name).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The subscriber's name.
    pub fn subscriber_name(&self) -> &str {
        &self.name
    }
}

impl<Q: QueueDescriptor + fmt::Debug> fmt::Debug for Subscriber<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriber")
            .field("name", &self.name)
            .field("queue", &self.queue)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// Anything that becomes a [`Subscriber`]: a `Subscriber` itself, or the item that
/// `#[subscriber]` makes of an async fn.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a subscriber",
    label = "not a subscriber",
    note = "annotate the handler with `#[subscriber(\"queue\")]`, or build one with `Subscriber::new(\"queue\", handler)`"
)]
pub trait IntoSubscriber {
    /// The queue descriptor's type.
    type Queue: QueueDescriptor;
    /// The subscriber.
    fn into_subscriber(self) -> Subscriber<Self::Queue>;
}

impl<Q: QueueDescriptor> IntoSubscriber for Subscriber<Q> {
    type Queue = Q;
    fn into_subscriber(self) -> Subscriber<Q> {
        self
    }
}

fn short_type_name<T>() -> String {
    let full = std::any::type_name::<T>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base).to_owned()
}
