//! A message argument named `self_` (and a message type named `Self_`) is not a receiver.
use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Self_ {
    to: String,
}

#[subscriber("emails")]
async fn send(self_: &Self_) -> HandlerOutcome {
    let _ = &self_.to;
    HandlerOutcome::ack()
}

fn main() {
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(send);
    });
}
