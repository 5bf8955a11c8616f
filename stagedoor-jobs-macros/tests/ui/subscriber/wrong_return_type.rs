use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails")]
async fn send(mail: &Mail) -> bool {
    !mail.to.is_empty()
}

fn main() {}
