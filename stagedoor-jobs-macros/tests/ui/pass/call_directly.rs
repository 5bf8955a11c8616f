//! The handler as written stays callable, as `send::call`, for unit tests.
use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails")]
async fn send(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    if mail.to.is_empty() || attempt == Some(3) {
        HandlerOutcome::drop()
    } else {
        HandlerOutcome::ack()
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mail = Mail {
        to: "a@example.com".to_owned(),
    };
    assert!(rt.block_on(send::call(&mail, Ctx(Some(1)))).is_ack());
    assert!(!rt.block_on(send::call(&mail, Ctx(Some(3)))).is_ack());
}
