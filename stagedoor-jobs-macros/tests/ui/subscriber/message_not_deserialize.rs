use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

struct Unframed {
    to: String,
}

#[subscriber("emails")]
async fn send(mail: &Unframed) -> HandlerOutcome {
    let _ = (&mail.to, Mail { to: String::new() }.to);
    HandlerOutcome::ack()
}

fn main() {}
