//! A typed queue descriptor, built by an associated function (with a turbofish) and methods.
use std::marker::PhantomData;

use serde::Deserialize;
use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{IntoSubscriber, QueueDescriptor, QueueFor};

#[derive(Deserialize)]
struct Mail {
    to: String,
}

/// A queue of `T` rows that only the memory broker serves.
struct Topic<T> {
    name: &'static str,
    kind: Option<&'static str>,
    _rows: PhantomData<fn() -> T>,
}

impl<T: 'static> Topic<T> {
    fn new(name: &'static str) -> Self {
        Topic {
            name,
            kind: None,
            _rows: PhantomData,
        }
    }
    fn kind(mut self, kind: &'static str) -> Self {
        self.kind = Some(kind);
        self
    }
}

impl<T: 'static> QueueDescriptor for Topic<T> {
    fn queue_name(&self) -> String {
        self.name.to_owned()
    }
    fn queue_kind(&self) -> Option<String> {
        self.kind.map(str::to_owned)
    }
    fn backend(&self) -> Option<&'static str> {
        Some(MemoryBroker::new().backend())
    }
}
impl<T: 'static> QueueFor<MemoryBroker> for Topic<T> {}

#[subscriber(Topic::<Mail>::new("emails").kind("send_email"))]
async fn send(mail: &Mail) -> HandlerOutcome {
    let _ = &mail.to;
    HandlerOutcome::ack()
}

fn main() {
    let s = send.into_subscriber();
    assert_eq!(s.subscriber_name(), "send");
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(send);
    });
}
