use stagedoor_jobs::prelude::*;

#[subscriber("emails")]
async fn send() -> HandlerOutcome {
    HandlerOutcome::ack()
}

fn main() {}
