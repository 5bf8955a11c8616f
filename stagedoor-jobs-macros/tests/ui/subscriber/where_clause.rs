use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails")]
async fn send(mail: &Mail) -> HandlerOutcome
where
    Mail: Send,
{
    let _ = &mail.to;
    HandlerOutcome::ack()
}

fn main() {}
