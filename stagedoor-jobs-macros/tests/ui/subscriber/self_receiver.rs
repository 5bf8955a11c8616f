use serde::Deserialize;
use stagedoor_jobs::prelude::*;

#[derive(Deserialize)]
struct Mail {
    to: String,
}

struct Mailer;

impl Mailer {
    #[subscriber("emails")]
    async fn send(&self, mail: &Mail) -> HandlerOutcome {
        let _ = &mail.to;
        HandlerOutcome::ack()
    }
}

fn main() {}
