//! The service's metrics on a Prometheus endpoint: `cargo run --example metrics`, then
//! `curl` the address it prints while it runs (`METRICS_ADDR=127.0.0.1:9898` picks one) (it runs for a few seconds, prints one
//! scrape itself, and stops; `METRICS_SECONDS=600` keeps it up longer).

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use stagedoor_jobs::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(serde::Serialize, serde::Deserialize)]
struct Task {
    n: u32,
}

async fn work(t: &Task) -> HandlerOutcome {
    tokio::time::sleep(Duration::from_millis(5)).await;
    if t.n.is_multiple_of(5) {
        HandlerOutcome::retry()
    } else {
        HandlerOutcome::ack()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The recorder renders the Prometheus text format; this example serves it itself, so the
    // exporter's own HTTP server (and its dependencies) are not needed.
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let addr = std::env::var("METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:0".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let addr = listener.local_addr()?;
    let handle = prometheus.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let body = handle.render();
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = sock.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(reply.as_bytes()).await;
            });
        }
    });
    println!("metrics on http://{addr}/metrics");

    let running = Service::new(AppInfo::new("metrics-demo", "0.1.0"))
        .metrics_interval(Duration::from_millis(500))
        .on_dead_letter(|alert| {
            println!(
                "PAGE: {} went from empty to {}",
                alert.dead_letter, alert.length
            )
        })
        .with_broker(MemoryBroker::new(), |b| {
            b.include(Subscriber::new("tasks", work))
                .max_attempts(nonzero!(2u32))
                .dead_letter("tasks.dead")
                .backoff(Fixed::new(Duration::from_millis(100)));
        })
        .start()
        .await?;
    for n in 1..=50 {
        running
            .publish(Job::new("tasks", &Task { n })?.kind("task"))
            .await?;
    }
    let seconds: u64 = std::env::var("METRICS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    tokio::time::sleep(Duration::from_secs(seconds)).await;

    // One scrape, as Prometheus would see it.
    let mut sock = tokio::net::TcpStream::connect(addr).await?;
    sock.write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await?;
    let mut text = String::new();
    sock.read_to_string(&mut text).await?;
    for line in text
        .lines()
        .filter(|l| l.starts_with("stagedoor_jobs_") && !l.contains("_bucket"))
    {
        println!("{line}");
    }
    running.shutdown().await;
    Ok(())
}
