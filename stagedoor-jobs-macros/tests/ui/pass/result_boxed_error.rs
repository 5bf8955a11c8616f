//! `Result<HandlerOutcome, Box<dyn Error + Send + Sync>>` is a handler's result.
use std::error::Error;

use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

#[subscriber("emails")]
async fn send(mail: &Mail) -> Result<HandlerOutcome, Box<dyn Error + Send + Sync>> {
    if mail.to.is_empty() {
        return Err("no recipient".into());
    }
    Ok(HandlerOutcome::ack())
}

fn main() {
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(send);
    });
}
