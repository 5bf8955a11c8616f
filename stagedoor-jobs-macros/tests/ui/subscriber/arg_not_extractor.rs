use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails")]
async fn send(mail: &Mail, retries: u32) -> HandlerOutcome {
    let _ = (&mail.to, retries);
    HandlerOutcome::ack()
}

fn main() {
    // Mounting it adds no error: the one above is the only one.
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(send);
    });
}
