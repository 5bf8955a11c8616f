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
            .rate_limit(10, Duration::from_secs(1))
            .global_concurrency(3)
            .rate_limit(20, Duration::from_secs(1));
    });
}
