use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails")]
struct Send {
    mail: Mail,
}

fn main() {}
