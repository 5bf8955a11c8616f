//! Extractors behind type aliases are still extractors.
use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

type Attempt = Ctx<keys::Attempt>;
type JobIdOf = Ctx<keys::JobId>;

#[subscriber("emails")]
async fn send(mail: &Mail, attempt: Attempt, id: JobIdOf) -> HandlerOutcome {
    let _ = (&mail.to, attempt.0, id.0);
    HandlerOutcome::ack()
}

fn main() {
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(send);
    });
}
