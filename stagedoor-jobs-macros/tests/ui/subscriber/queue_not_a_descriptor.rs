use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

struct Jobs;

impl Jobs {
    fn new(_: &str) -> Self {
        Jobs
    }
}

#[subscriber(Jobs::new("jobs"))]
async fn send(mail: &Mail) -> HandlerOutcome {
    let _ = &mail.to;
    HandlerOutcome::ack()
}

fn main() {}
