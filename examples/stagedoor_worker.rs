//! Seed 000's worker on Redis Streams: several job kinds on one stream, a retry policy per kind,
//! delayed retries in a sorted set, and a dead stream a person reads in the morning.
//!
//! `cargo run --example stagedoor_worker` with a Redis at `REDIS_URL` (default
//! `redis://127.0.0.1:6379/`). Each run uses a namespace of its own and removes its keys at
//! the end (`STAGEDOOR_KEEP=1` keeps them, for a look with the `stagedoor-jobs` tool).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs::prelude::*;
use stagedoor_jobs_redis::{RedisBroker, Stream};

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    order_id: u64,
    outbox_id: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Email {
    to: String,
    template: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Sweep {}

/// A seat label the barcode encoder refuses.
#[derive(Debug, thiserror::Error)]
#[error("SeatLabelInvalid: '{label}' is not a row letter and a seat number")]
struct SeatLabelInvalid {
    label: String,
    #[source]
    source: BarcodeSyntax,
}

/// What the encoder found, and where.
#[derive(Debug, thiserror::Error)]
#[error(
    "barcode_for: {label:?} does not start with a row letter followed by a seat number (at {location})"
)]
struct BarcodeSyntax {
    label: String,
    location: &'static std::panic::Location<'static>,
}

#[track_caller]
fn syntax(label: &str) -> BarcodeSyntax {
    BarcodeSyntax {
        label: label.to_owned(),
        location: std::panic::Location::caller(),
    }
}

/// The barcode of a seat label: a row letter and a seat number (`A12`).
fn barcode_for(label: &str) -> Result<String, SeatLabelInvalid> {
    let mut chars = label.chars();
    let row_ok = chars.next().is_some_and(|c| c.is_ascii_uppercase());
    let seat = chars.as_str();
    if row_ok && !seat.is_empty() && seat.chars().all(|c| c.is_ascii_digit()) {
        Ok(format!("BC-{label}"))
    } else {
        Err(SeatLabelInvalid {
            label: label.to_owned(),
            source: syntax(label),
        })
    }
}

/// The mail provider's answer.
#[derive(Debug, thiserror::Error)]
#[error("mail provider answered 503 Service Unavailable")]
struct Provider503;

/// Renders the PDF tickets of an order; the organizer typed a seat label as `14-C`.
async fn render_tickets(
    order: &Order,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> Result<(), SeatLabelInvalid> {
    println!(
        "render_tickets     order {} attempt {}",
        order.order_id,
        attempt.unwrap_or(1)
    );
    for label in ["A12", "14-C"] {
        barcode_for(label)?;
    }
    Ok(())
}

static EMAIL_TRIES: AtomicU32 = AtomicU32::new(0);

/// Sends an email; the provider answers 503 twice, then takes it.
async fn send_email(email: &Email, Ctx(attempt): Ctx<keys::Attempt>) -> Result<(), Provider503> {
    let n = EMAIL_TRIES.fetch_add(1, Ordering::SeqCst) + 1;
    println!(
        "send_email         {} ({}) attempt {}",
        email.to,
        email.template,
        attempt.unwrap_or(1)
    );
    if n <= 2 { Err(Provider503) } else { Ok(()) }
}

/// Walks every payment of the day; never retried (the next night's run covers it).
async fn reconcile_payments(_: &Sweep) -> HandlerOutcome {
    println!("reconcile_payments walked the day's payments");
    HandlerOutcome::ack()
}

/// Deletes expired holds (the SQL is in the hold-expiry example).
async fn expire_holds(_: &Sweep) -> HandlerOutcome {
    println!("expire_holds       swept the expired holds");
    HandlerOutcome::ack()
}

fn jobs(kind: &str) -> Stream {
    Stream::new("jobs").kind(kind)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The runtime's retry and dead-letter events, so the email's retry delays show.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "stagedoor_jobs=warn".into()),
        )
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .init();
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    let namespace = format!("stagedoor-example-{}:", std::process::id());
    let broker = RedisBroker::from_url(&url).namespace(&namespace);

    let running = Service::new(AppInfo::new("stagedoor-worker", "0.1.0"))
        .with_broker(broker.clone(), |b| {
            // 5 tries with full jitter from 1 s to a cap of 60 s: a 503 passes.
            b.include(Subscriber::new(jobs("send_email"), send_email))
                .max_attempts(nonzero!(5u32))
                .dead_letter("jobs:dead")
                .backoff(FullJitter::new(
                    Duration::from_secs(1),
                    Duration::from_secs(60),
                ));
            // One retry: a render that failed on an order's data fails again on the same data.
            b.include(Subscriber::new(jobs("render_tickets"), render_tickets))
                .max_attempts(nonzero!(2u32))
                .dead_letter("jobs:dead")
                .backoff(Fixed::new(Duration::from_millis(500)));
            // No retry at all.
            b.include(Subscriber::new(
                jobs("reconcile_payments"),
                reconcile_payments,
            ))
            .max_attempts(nonzero!(1u32))
            .dead_letter("jobs:dead");
            b.include(Subscriber::new(jobs("expire_holds"), expire_holds))
                .max_attempts(nonzero!(3u32))
                .dead_letter("jobs:dead");
        })
        .start()
        .await
        .map_err(|e| format!("{e} (start a Redis, or point REDIS_URL at one)"))?;

    let order = Order {
        order_id: 4471,
        outbox_id: 88210,
    };
    running
        .publish(
            Job::new("jobs", &order)?
                .kind("render_tickets")
                .request_id("7f3a9c2e")
                .trace("4bf92f35"),
        )
        .await?;
    let email = Email {
        to: "buyer@example.com".into(),
        template: "tickets_ready".into(),
    };
    running
        .publish(
            Job::new("jobs", &email)?
                .kind("send_email")
                .request_id("7f3a9c2f"),
        )
        .await?;
    running
        .publish(Job::new("jobs", &Sweep {})?.kind("reconcile_payments"))
        .await?;
    running
        .publish(Job::new("jobs", &Sweep {})?.kind("expire_holds"))
        .await?;

    // Until the stream is empty: nothing waiting, running or delayed.
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let s = broker.stats("jobs").await?;
        if s.ready + s.pending + s.delayed == 0 {
            break;
        }
    }
    running.shutdown().await;

    // The dead entry, as `XRANGE jobs:dead - + COUNT 1` shows it.
    let dead_key = format!("{{{namespace}jobs}}:dead");
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(&dead_key)
        .arg("-")
        .arg("+")
        .arg("COUNT")
        .arg(1)
        .query_async(&mut conn)
        .await?;
    println!("\nXRANGE {dead_key} - + COUNT 1");
    for (id, fields) in &entries {
        println!("1) 1) \"{id}\"");
        for (i, (k, v)) in fields.iter().enumerate() {
            let n = 2 * i + 1;
            let lead = if i == 0 { "   2) " } else { "      " };
            println!(
                "{lead}{n:>2}) {:<14} {:>2}) {:?}",
                format!("{k:?}"),
                n + 1,
                v
            );
        }
    }
    // Leave nothing behind, unless asked to keep the keys for the command line tool:
    // `STAGEDOOR_KEEP=1 cargo run --example stagedoor_worker`, then
    // `stagedoor-jobs --url $REDIS_URL --namespace <printed namespace> queues`.
    if std::env::var_os("STAGEDOOR_KEEP").is_some() {
        println!("\nkept: namespace {namespace}");
        return Ok(());
    }
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{namespace}*"))
        .query_async(&mut conn)
        .await?;
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut conn).await?;
    }
    Ok(())
}
