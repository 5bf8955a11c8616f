use std::rc::Rc;

use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

async fn deliver(_: &str) {}

#[subscriber("emails")]
async fn send(mail: &Mail) -> HandlerOutcome {
    let to = Rc::new(mail.to.clone());
    deliver(&to).await;
    HandlerOutcome::ack()
}

fn main() {}
