//! The quickstart: a mailer with `#[subscriber]` handlers on the in-memory broker, run on the
//! real clock until every email has settled, printing what happened to each.
//!
//! `cargo run --example quickstart`

use std::time::Duration;

use serde::{Deserialize, Serialize};
use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs::prelude::*;

#[derive(Debug, Serialize, Deserialize)]
struct Mail {
    to: String,
    subject: String,
}

/// How the (pretend) provider answers an address.
enum Refusal {
    Busy,
    Unavailable,
    Rejected,
}

fn deliver(mail: &Mail, attempt: u32) -> Result<(), Refusal> {
    match mail.to.split('@').next().unwrap_or_default() {
        // Busy on the first attempt, then fine.
        "busy" if attempt < 2 => Err(Refusal::Busy),
        // Never answers: spends every attempt and lands in the dead letter.
        "down" => Err(Refusal::Unavailable),
        "nobody" => Err(Refusal::Rejected),
        _ => Ok(()),
    }
}

#[subscriber("emails")]
async fn send(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    let attempt = attempt.unwrap_or(1);
    match deliver(mail, attempt) {
        Ok(()) => {
            println!("send    {:<22} attempt {attempt}: sent", mail.to);
            HandlerOutcome::ack()
        }
        Err(Refusal::Busy) => {
            println!(
                "send    {:<22} attempt {attempt}: provider busy, retry in 200ms",
                mail.to
            );
            HandlerOutcome::retry_after(Duration::from_millis(200))
        }
        Err(Refusal::Unavailable) => {
            println!(
                "send    {:<22} attempt {attempt}: provider unavailable, retry",
                mail.to
            );
            HandlerOutcome::retry()
        }
        Err(Refusal::Rejected) => {
            println!(
                "send    {:<22} attempt {attempt}: address rejected, dropped",
                mail.to
            );
            HandlerOutcome::drop()
        }
    }
}

#[subscriber("emails.dead")]
async fn review(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    println!(
        "review  {:<22} dead letter read (delivery {attempt:?}): needs a person",
        mail.to
    );
    HandlerOutcome::ack()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = MemoryBroker::new();
    let running = Service::new(AppInfo::new("mailer", "0.1.0"))
        .with_broker(broker.clone(), |b| {
            b.include(send)
                .max_attempts(nonzero!(3u32))
                .dead_letter("emails.dead")
                .backoff(Fixed::new(Duration::from_millis(100)));
            b.include(review);
        })
        .start()
        .await?;

    for to in [
        "ada@example.com",
        "busy@example.com",
        "down@example.com",
        "nobody@example.com",
    ] {
        let mail = Mail {
            to: to.to_owned(),
            subject: "Your tickets".to_owned(),
        };
        running
            .publish(Job::new("emails", &mail)?.request_id(format!("req-{to}")))
            .await?;
    }

    // Wait until both queues are empty, then stop gracefully.
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (main, dead) = (
            broker.stats("emails").await?,
            broker.stats("emails.dead").await?,
        );
        if main == Default::default() && dead == Default::default() {
            break;
        }
    }
    running.shutdown().await;
    println!("all emails settled");
    Ok(())
}
