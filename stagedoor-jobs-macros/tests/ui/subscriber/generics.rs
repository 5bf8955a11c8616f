use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails")]
async fn send<M: serde::de::DeserializeOwned>(mail: &M) -> HandlerOutcome {
    let _ = mail;
    HandlerOutcome::ack()
}

fn main() {}
