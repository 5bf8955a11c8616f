//! A queue named by a constant (or any expression that converts into a `String`).
use serde::Deserialize;
use stagedoor_jobs::IntoSubscriber;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

const EMAILS: &str = "emails";

mod queues {
    pub const DEAD: &str = "emails.dead";

    pub fn reports() -> String {
        "reports".to_owned()
    }
}

#[subscriber(EMAILS)]
async fn send(mail: &Mail) -> HandlerOutcome {
    let _ = &mail.to;
    HandlerOutcome::ack()
}

#[subscriber(queues::DEAD)]
async fn review(mail: &Mail) -> HandlerOutcome {
    let _ = &mail.to;
    HandlerOutcome::ack()
}

// A function of a module is not a descriptor type: its result is taken as a name.
#[subscriber(queues::reports())]
async fn report(mail: &Mail) -> HandlerOutcome {
    let _ = &mail.to;
    HandlerOutcome::ack()
}

fn main() {
    assert_eq!(send.into_subscriber().subscriber_name(), "send");
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(send);
        b.include(review);
        b.include(report);
    });
}
