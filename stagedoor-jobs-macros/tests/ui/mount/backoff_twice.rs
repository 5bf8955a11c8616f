use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails")]
async fn send(mail: &Mail) -> HandlerOutcome {
    let _ = &mail.to;
    HandlerOutcome::ack()
}

use std::time::Duration;

fn main() {
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(send)
            .backoff(Fixed::new(Duration::from_secs(1)))
            .max_attempts(nonzero!(5u32))
            .dead_letter("emails.dead")
            .backoff(Immediate);
    });
}
