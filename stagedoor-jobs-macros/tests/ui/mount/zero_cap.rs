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

fn main() {
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(send)
            .max_attempts(nonzero!(0u32))
            .dead_letter("emails.dead");
    });
}
