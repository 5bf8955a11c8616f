//! A documented public handler: its docs go on the item the macro makes, so `missing_docs`
//! stays quiet; other attributes stay on the function.
#![deny(missing_docs)]

use serde::Deserialize;
use stagedoor_jobs::prelude::*;

/// A mail to send.
#[derive(Deserialize)]
pub struct Mail {
    /// The recipient.
    pub to: String,
}

/// Sends a mail.
///
/// Retries while the provider is busy.
#[subscriber("emails")]
#[allow(clippy::needless_return)]
pub async fn send(mail: &Mail) -> HandlerOutcome {
    let _ = &mail.to;
    return HandlerOutcome::ack();
}

fn main() {
    let _ = Service::new(AppInfo::new("t", "0")).with_broker(MemoryBroker::new(), |b| {
        b.include(send);
    });
}
