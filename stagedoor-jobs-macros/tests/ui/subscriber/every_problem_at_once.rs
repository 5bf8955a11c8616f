use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails", kind = 1, colour = "red")]
fn send(mail: Mail, template: &String) {
    let _ = (mail.to, template);
}

fn main() {}
