use serde::Deserialize;
use stagedoor_jobs::QueueDescriptor;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

/// A queue of another backend: a descriptor that is not `QueueFor<MemoryBroker>`.
struct Stream {
    name: &'static str,
}

impl Stream {
    fn new(name: &'static str) -> Self {
        Stream { name }
    }
}

impl QueueDescriptor for Stream {
    fn queue_name(&self) -> String {
        self.name.to_owned()
    }
    fn backend(&self) -> Option<&'static str> {
        Some("redis")
    }
}

#[subscriber(Stream::new("jobs"))]
async fn send(mail: &Mail) -> HandlerOutcome {
    let _ = &mail.to;
    HandlerOutcome::ack()
}

fn main() {
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(send);
    });
}
