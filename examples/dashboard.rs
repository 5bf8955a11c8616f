//! The web dashboard mounted in a service's own axum app, on an SQLite file with jobs,
//! retries and dead letters made up front.
//!
//! A shop's service runs on one SQLite table: queue `orders` (kinds `charge_card`,
//! `send_receipt`, `sync_inventory`) and queue `emails`. Its handler fails some jobs once (they
//! are retried and pass), and some every time (three attempts, then the dead letter
//! `orders.dead`); one receipt's payload holds a `<script>` (the dashboard shows it as text).
//! Three emails wait an hour (delayed jobs); a schedule sends a digest every hour. The
//! dashboard is mounted at `/jobs`:
//!
//! ```text
//! cargo run --example dashboard                      # then open http://127.0.0.1:8787/jobs
//! cargo run --example dashboard -- --listen 127.0.0.1:9000
//! cargo run --example dashboard -- --exit-after 3    # stops after 3 s (CI)
//! ```
//!
//! `STAGEDOOR_DASHBOARD_EXIT_AFTER=3` does what `--exit-after 3` does.

use std::time::Duration;

use axum::response::Redirect;
use axum::routing::get;
use serde_json::{Value, json};
use sqlx::Connection;
use sqlx::sqlite::SqlitePoolOptions;
use stagedoor_jobs::BoxError;
use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs_dashboard::Dashboard;
use stagedoor_jobs_sqlx::prelude::*;

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS shop_jobs (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL,
    locked_until TEXT,
    payload BLOB NOT NULL,
    enqueued_at TEXT NOT NULL,
    last_error TEXT,
    headers TEXT
);
CREATE INDEX IF NOT EXISTS shop_jobs_due ON shop_jobs (queue, retry_after, id);";

/// One row of `shop_jobs`: `queue` is the queue it waits in; `headers` carries the kind, the
/// request id and the trace; `last_error` the last failure.
#[derive(Inbox)]
#[inbox(table = "shop_jobs")]
#[allow(dead_code)]
struct ShopJob {
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
    #[field(enqueued_at)]
    enqueued_at: DateTime<Utc>,
    #[field(last_error)]
    last_error: Option<String>,
    #[field(headers)]
    headers: Option<String>,
}

/// Every job of `orders`: fails as its payload says (`"fail": "always"` or `"once"`).
#[subscriber("orders")]
async fn work(
    job: &Value,
    Ctx(kind): Ctx<keys::Kind>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> Result<(), BoxError> {
    let attempt = attempt.unwrap_or(1);
    match job["fail"].as_str() {
        Some("always") => {
            Err(format!("{}: {}", kind, job["error"].as_str().unwrap_or("failed")).into())
        }
        Some("once") if attempt == 1 => Err("timed out talking to the provider".into()),
        _ => Ok(()),
    }
}

/// Every email is sent.
#[subscriber("emails")]
async fn send(_mail: &Value) -> Result<(), BoxError> {
    Ok(())
}

/// The jobs the example publishes.
fn jobs() -> Result<Vec<Job>, BoxError> {
    let mut jobs = Vec::new();
    for n in 0..30 {
        let fail = match n {
            n if n % 5 == 0 => "always",
            n if n % 3 == 0 => "once",
            _ => "never",
        };
        jobs.push(
            Job::new(
                "orders",
                &json!({ "order": 1000 + n, "amount_cents": 1999 + n, "fail": fail,
                         "error": "card declined (insufficient funds)" }),
            )?
            .kind("charge_card")
            .request_id(format!("req-{:04}", 1000 + n))
            .trace(format!(
                "00-4bf92f3577b34da6a3ce929d0e0e{n:04}-00f067aa0ba902b7-01"
            )),
        );
    }
    for n in 0..10 {
        let note = if n == 3 {
            "<script>alert('a payload is shown as text')</script>"
        } else {
            "thanks!"
        };
        let fail = if n % 4 == 3 { "always" } else { "never" };
        jobs.push(
            Job::new(
                "orders",
                &json!({ "order": 2000 + n, "note": note, "fail": fail,
                         "error": "smtp: mailbox unavailable" }),
            )?
            .kind("send_receipt")
            .request_id(format!("req-{:04}", 2000 + n)),
        );
    }
    for n in 0..5 {
        jobs.push(
            Job::new(
                "orders",
                &json!({ "sku": format!("SKU-{n}"), "fail": "always",
                         "error": "inventory service: connection refused" }),
            )?
            .kind("sync_inventory"),
        );
    }
    for n in 0..10 {
        jobs.push(Job::new(
            "emails",
            &json!({ "to": format!("user{n}@example.com") }),
        )?);
    }
    for n in 0..3 {
        jobs.push(
            Job::new("emails", &json!({ "to": format!("later{n}@example.com") }))?
                .kind("reminder")
                .after(Duration::from_secs(3_600)),
        );
    }
    Ok(jobs)
}

/// `--listen ADDR` and `--exit-after SECS` (or `STAGEDOOR_DASHBOARD_EXIT_AFTER`).
fn args() -> Result<(String, Option<Duration>), BoxError> {
    let mut listen = "127.0.0.1:8787".to_owned();
    let mut exit_after = std::env::var("STAGEDOOR_DASHBOARD_EXIT_AFTER").ok();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs ADDR (host:port)")?,
            "--exit-after" => {
                exit_after = Some(args.next().ok_or("--exit-after needs SECS")?);
            }
            other => {
                return Err(format!(
                    "unknown argument `{other}`: use --listen ADDR and --exit-after SECS"
                )
                .into());
            }
        }
    }
    let exit_after = match exit_after {
        Some(s) => Some(Duration::from_secs_f64(s.parse().map_err(|_| {
            format!("--exit-after `{s}`: write a number of seconds")
        })?)),
        None => None,
    };
    Ok((listen, exit_after))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The dead letters made up front would each log an error: `RUST_LOG=error` shows them.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into()),
        )
        .with_target(false)
        .init();
    let (listen, exit_after) = args()?;

    // A fresh SQLite file in the temp folder, removed at the end.
    let dir = std::env::temp_dir().join(format!("stagedoor-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _cleanup = TempDir(dir.clone());
    let url = format!("sqlite://{}?mode=rwc", dir.join("shop.db").display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await?;
    sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
    conn.close().await?;

    let route = SqlxBroker::from_url(&url, SqlitePoolOptions::new())
        .poll_interval(Duration::from_millis(50))
        .route::<ShopJob>("orders");
    let running = Service::new(AppInfo::new("shop", "0.1.0"))
        // A schedule, for the dashboard's Scheduled page: its last and next tick.
        .schedule(
            Schedule::hourly("nightly_digest")
                .on("emails")
                .missed(Missed::Skip),
        )
        .with_broker(route.clone(), |b| {
            b.include(work)
                .max_attempts(nonzero!(3u32))
                .dead_letter("orders.dead")
                .backoff(Fixed::new(Duration::from_millis(100)));
            b.include(send);
        })
        .start()
        .await?;
    for job in jobs()? {
        route.publish(job).await?;
    }

    // The service's own app, with the dashboard mounted at /jobs (`nest_service` serves
    // /jobs/ too; `nest` answers 404 there).
    let app = axum::Router::new()
        .route("/", get(|| async { Redirect::to("/jobs") }))
        .nest_service(
            "/jobs",
            Dashboard::new(route.clone())
                .title("shop · stagedoor-jobs")
                .router(),
        );
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e} (pass --listen ADDR)"))?;
    let addr = listener.local_addr()?;
    println!("dashboard at http://{addr}/jobs");

    // Until the failing jobs have spent their attempts: then the dead letters are all there.
    let settle = async {
        for _ in 0..100 {
            let s = route.stats("orders").await?;
            if s.ready + s.pending + s.delayed == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let dead = route.stats("orders.dead").await?;
        Ok::<_, BoxError>(dead.ready)
    };
    let stop = async move {
        match exit_after {
            Some(d) => tokio::time::sleep(d).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
    });
    match settle.await {
        Ok(dead) => println!(
            "{dead} jobs in the dead letter orders.dead; {}",
            match exit_after {
                Some(d) => format!("stopping {:.0} s after start", d.as_secs_f64()),
                None => "Ctrl-C stops".to_owned(),
            }
        ),
        Err(e) => eprintln!("could not count the dead letters: {e}"),
    }
    server.await??;
    running.shutdown().await;
    Ok(())
}

/// Removes the example's SQLite folder at the end.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
