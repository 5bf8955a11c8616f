//! `kind = ".."` and `name = ".."` after the queue, in any order, with a trailing comma.
use serde::Deserialize;
use stagedoor_jobs::IntoSubscriber;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails", kind = "send_email")]
async fn send(mail: &Mail) -> HandlerOutcome {
    let _ = &mail.to;
    HandlerOutcome::ack()
}

#[subscriber("emails", name = "welcome_mailer", kind = "welcome")]
async fn welcome(mail: &Mail) -> HandlerOutcome {
    let _ = &mail.to;
    HandlerOutcome::ack()
}

fn main() {
    assert_eq!(send.into_subscriber().subscriber_name(), "send");
    assert_eq!(
        welcome.into_subscriber().subscriber_name(),
        "welcome_mailer"
    );
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(send);
        b.include(welcome);
    });
}
