use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[derive(Deserialize)]
struct Template {
    body: String,
}

#[subscriber("emails")]
async fn send(mail: &Mail, template: &Template) -> HandlerOutcome {
    let _ = (&mail.to, &template.body);
    HandlerOutcome::ack()
}

fn main() {}
