//! A service built without any macro: handlers are plain async fns, bound to their queues with
//! `Subscriber::new`, run on the in-memory broker until every job has settled.
//!
//! `cargo run --example manual`

use std::time::Duration;

use serde::{Deserialize, Serialize};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::testing::Outcome;

#[derive(Debug, Serialize, Deserialize)]
struct Invoice {
    number: u32,
    amount_cents: i64,
}

#[derive(Debug, thiserror::Error)]
#[error("the ledger refused invoice {0}")]
struct LedgerRefused(u32);

/// Books an invoice; the ledger refuses negative amounts (an `Err` is a failed attempt).
async fn book(invoice: &Invoice, Ctx(attempt): Ctx<keys::Attempt>) -> Result<(), LedgerRefused> {
    println!("book: invoice {} attempt {:?}", invoice.number, attempt);
    if invoice.amount_cents < 0 {
        return Err(LedgerRefused(invoice.number));
    }
    Ok(())
}

/// Sends a receipt; the first attempt of every receipt finds the mail provider busy.
async fn receipt(invoice: &Invoice, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
    println!("receipt: invoice {} attempt {:?}", invoice.number, attempt);
    if attempt == Some(1) {
        HandlerOutcome::retry_after(Duration::from_secs(10))
    } else {
        HandlerOutcome::ack()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let broker = MemoryBroker::new();
    let service = Service::new(AppInfo::new("billing", "0.1.0")).with_broker(broker, |b| {
        b.include(Subscriber::new("billing", book).kind("book"))
            .max_attempts(nonzero!(3u32))
            .dead_letter("billing.dead")
            .backoff(Fixed::new(Duration::from_secs(1)));
        b.include(Subscriber::new("billing", receipt).kind("receipt"))
            .max_attempts(nonzero!(5u32))
            .dead_letter("billing.dead");
    });

    // The harness runs the production service on a clock it moves, so the example finishes
    // at once instead of waiting out the delays.
    let app = TestApp::start(service).await?;
    for (number, amount_cents) in [(1, 1200), (2, -50)] {
        let invoice = Invoice {
            number,
            amount_cents,
        };
        app.publish(Job::new("billing", &invoice)?.kind("book"))
            .await?;
        app.publish(Job::new("billing", &invoice)?.kind("receipt"))
            .await?;
    }
    app.advance(Duration::from_secs(60)).await;

    for record in app.records() {
        let what = match &record.outcome {
            Outcome::Acked => "acked".to_owned(),
            Outcome::Dropped => "dropped".to_owned(),
            Outcome::Cancelled => "cancelled".to_owned(),
            Outcome::Retried { delay, error, .. } => format!("retry in {delay:?} ({error})"),
            Outcome::DeadLettered { target, error, .. } => {
                format!("dead-lettered to {target} ({error})")
            }
        };
        println!(
            "{:>8} {:<8} attempt {}: {what}",
            record.subscriber, record.kind, record.attempt
        );
    }
    let dead = app.dead_letters("billing.dead").await;
    println!("{} dead letter(s) in billing.dead", dead.len());
    for d in &dead {
        println!(
            "  {} kind={} attempts={} error={}",
            d.id,
            d.envelope.kind(),
            d.attempts,
            d.error
        );
    }
    app.stop().await;
    Ok(())
}
