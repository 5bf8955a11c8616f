//! A readiness probe and a health endpoint for a worker: `GET /ready` answers 200 while every
//! queue claims (503 with the reasons otherwise), `GET /health` the JSON of
//! [`Running::health`](stagedoor_jobs::Running::health). Served by hand, as the metrics example
//! does, so no web framework is needed.
//!
//! `cargo run --example readiness` runs a short demo on an SQLite file in a temporary folder
//! and probes itself: ready once the jobs ran; not ready while the job table is gone (renamed
//! away, as a database outage would look: every claim fails); ready again once it is back. It
//! exits with an error if a probe says otherwise. `READINESS_ADDR=127.0.0.1:9899` picks the
//! address; `READINESS_SECONDS=600` keeps it up longer at the end, for `curl`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sqlx::Connection;
use sqlx::sqlite::SqlitePoolOptions;
use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs::{Health, LoopState, Running};
use stagedoor_jobs_sqlx::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS tasks (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    locked_until TEXT,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_due ON tasks (queue, retry_after, id);";

/// One row of `tasks`; `queue` is the queue the row waits in.
#[derive(Inbox)]
#[inbox(table = "tasks")]
#[allow(dead_code)]
struct TaskRow {
    #[field(id, generated)]
    id: i64,
    #[field(group)]
    queue: String,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Task {
    n: u32,
}

async fn work(t: &Task) -> HandlerOutcome {
    tokio::time::sleep(Duration::from_millis(5)).await;
    let _ = t.n;
    HandlerOutcome::ack()
}

/// The answer to one request: status, content type, body.
fn answer(running: &Running, request_line: &str) -> (u16, &'static str, String) {
    let path = request_line.split_whitespace().nth(1).unwrap_or("/");
    match path {
        "/ready" => {
            let health = running.health();
            if health.is_healthy() {
                (200, "text/plain", "ready\n".to_owned())
            } else {
                let reasons = health.problems().join("\n");
                (503, "text/plain", format!("not ready:\n{reasons}\n"))
            }
        }
        "/health" => match serde_json::to_string_pretty(&running.health()) {
            Ok(json) => (200, "application/json", json + "\n"),
            Err(e) => (500, "text/plain", format!("{e}\n")),
        },
        _ => (404, "text/plain", "try /ready or /health\n".to_owned()),
    }
}

/// Serves `/ready` and `/health`, one request at a time (a probe's load), until the task is
/// aborted.
async fn serve(listener: tokio::net::TcpListener, running: Arc<Running>) {
    while let Ok((mut sock, _)) = listener.accept().await {
        let mut buf = [0u8; 1024];
        let n = sock.read(&mut buf).await.unwrap_or(0);
        let request = String::from_utf8_lossy(&buf[..n]);
        let (status, kind, body) = answer(&running, request.lines().next().unwrap_or(""));
        let reason = match status {
            200 => "OK",
            404 => "Not Found",
            503 => "Service Unavailable",
            _ => "Internal Server Error",
        };
        let reply = format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = sock.write_all(reply.as_bytes()).await;
    }
}

/// `GET path` on `addr`, as a probe would: the status and the body.
async fn get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut sock = tokio::net::TcpStream::connect(addr).await?;
    sock.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut text = String::new();
    sock.read_to_string(&mut text).await?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}

/// Probes `/ready`, prints the answer, and fails unless its status is `want`.
async fn probe(addr: std::net::SocketAddr, want: u16) -> Result<(), Box<dyn std::error::Error>> {
    let (status, body) = get(addr, "/ready").await?;
    println!("GET /ready -> {status}\n{}", indent(&body));
    if status != want {
        return Err(format!("/ready answered {status}, expected {want}").into());
    }
    Ok(())
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits up to 15 s for the service's health to satisfy `ok`.
async fn until(
    running: &Running,
    what: &str,
    ok: impl Fn(&Health) -> bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !ok(&running.health()) {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}: {:?}", running.health()).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Deletes the demo's folder when dropped.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_target(false)
        .init();
    let dir = std::env::temp_dir().join(format!("stagedoor-readiness-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _dir = TempDir(dir.clone());
    let url = format!("sqlite://{}?mode=rwc", dir.join("tasks.db").display());

    let route =
        SqlxBroker::from_url(url.clone(), SqlitePoolOptions::new()).route::<TaskRow>("tasks");
    let schema_url = url.clone();
    let running = Service::new(AppInfo::new("readiness-demo", "0.1.0"))
        .on_startup(async move |()| {
            let mut conn = sqlx::SqliteConnection::connect(&schema_url).await?;
            sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
            conn.close().await
        })
        .with_broker(route.clone(), |b| {
            b.include(Subscriber::new("tasks", work))
                .max_attempts(nonzero!(3u32))
                .dead_letter("tasks.dead");
        })
        .start()
        .await?;
    let running = Arc::new(running);

    let addr = std::env::var("READINESS_ADDR").unwrap_or_else(|_| "127.0.0.1:0".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(serve(listener, Arc::clone(&running)));
    println!("probes on http://{addr}/ready and http://{addr}/health");

    // 1. Jobs run: ready.
    for n in 1..=5 {
        route.publish(Job::new("tasks", &Task { n })?).await?;
    }
    loop {
        let s = route.stats("tasks").await?;
        if s.ready + s.pending + s.delayed == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("\n5 jobs ran");
    probe(addr, 200).await?;

    // 2. The job table goes away (as in a database outage): every claim fails, not ready.
    let mut admin = sqlx::SqliteConnection::connect(&url).await?;
    sqlx::raw_sql("ALTER TABLE tasks RENAME TO tasks_offline")
        .execute(&mut admin)
        .await?;
    println!("\nthe table `tasks` is renamed away");
    until(&running, "failed claims", |h| {
        h.queues.iter().any(|q| q.state == LoopState::BackingOff)
    })
    .await?;
    probe(addr, 503).await?;
    let (_, health) = get(addr, "/health").await?;
    println!("GET /health ->\n{}", indent(&health));

    // 3. It is back: claims succeed again, ready.
    sqlx::raw_sql("ALTER TABLE tasks_offline RENAME TO tasks")
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    println!("\nthe table `tasks` is back");
    until(&running, "the recovery", Health::is_healthy).await?;
    probe(addr, 200).await?;

    let seconds: u64 = std::env::var("READINESS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_secs(seconds)).await;

    server.abort();
    let _ = server.await;
    match Arc::into_inner(running) {
        Some(running) => running.shutdown().await,
        None => return Err("the probe server still holds the service".into()),
    }
    Ok(())
}
