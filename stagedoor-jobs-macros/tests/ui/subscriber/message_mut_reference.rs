use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails")]
async fn send(mail: &mut Mail) -> HandlerOutcome {
    mail.to.clear();
    HandlerOutcome::ack()
}

fn main() {}
