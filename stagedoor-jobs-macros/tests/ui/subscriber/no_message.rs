use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails")]
async fn send(Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    let _ = attempt;
    HandlerOutcome::ack()
}

fn main() {}
