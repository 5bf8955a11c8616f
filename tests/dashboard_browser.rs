//! The dashboard in a real browser: headless Chromium, driven through `chromedriver`
//! (WebDriver) by fantoccini, against the dashboard's router served on loopback over a real
//! backend (SQLite through the sqlx backend with the conformance table, Redis).
//!
//! `scripts/test-all` installs Debian's `chromium` and `chromium-driver` and exports
//! `STAGEDOOR_CHROMEDRIVER` and `STAGEDOOR_CHROMIUM`; a test without them FAILS (it is never
//! skipped), as do the tests without their server's URL. Screenshots of each page are saved
//! under `target/dashboard-screenshots/` (`$CARGO_TARGET_DIR` when set).

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use stagedoor_jobs::broker::{Broker, Delivery, Inspect as _, Settled, Settlement};
use stagedoor_jobs::{Failure, FailureCause, Job};
use stagedoor_jobs_redis::RedisBroker;
use stagedoor_jobs_sqlx::SqlxRoute;

/// One browser test at a time: Chromium is heavy on a small machine, and the tests' timings
/// stay those of one browser.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long the browser may take to show what a test waits for.
const PATIENCE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// The browser: chromedriver as a child process and one WebDriver session on it.
// ---------------------------------------------------------------------------------------------

/// The executable named by `var`; a missing one fails the test.
fn tool(var: &str, what: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "{var}={} is not a file: it names {what}; `scripts/test-all` installs it (Debian's package) and exports {var}",
                p.display()
            );
            p
        }
        _ => panic!(
            "{var} is not set: it names {what}; run the tests with `scripts/test-all -- cargo test --workspace --test dashboard_browser`, which installs Debian's chromium and chromium-driver and exports it"
        ),
    }
}

/// A port nobody listens on now (the OS's pick; chromedriver binds it right after).
fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("pick a free port")
        .port()
}

/// `GET /status` answered with `"ready": true`.
fn driver_ready(port: u16) -> bool {
    let Ok(mut conn) = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    ) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    if conn
        .write_all(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer.replace(' ', "").contains("\"ready\":true")
}

/// A running chromedriver (its own process group, killed with its browsers on drop), a
/// Chromium session on it, and a folder of its own (profile, temporary files, chromedriver's
/// log; removed on drop).
struct Browser {
    client: Option<Client>,
    driver: Child,
    dir: PathBuf,
    log: PathBuf,
}

impl Browser {
    /// Starts chromedriver on a free port, waits until it answers, opens a headless session.
    async fn start() -> Self {
        let chromedriver = tool("STAGEDOOR_CHROMEDRIVER", "the chromedriver executable");
        let chromium = tool("STAGEDOOR_CHROMIUM", "the Chromium browser");
        let dir = std::env::temp_dir().join(format!(
            "stagedoor-browser-{}-{}",
            std::process::id(),
            common::unique()
        ));
        let profile = dir.join("profile");
        std::fs::create_dir_all(&profile).expect("create the browser's folder");
        let log = dir.join("chromedriver.log");
        let port = free_port();
        let driver = {
            use std::os::unix::process::CommandExt as _;
            Command::new(&chromedriver)
                .arg(format!("--port={port}"))
                .arg(format!("--log-path={}", log.display()))
                // Chromium's temporary files go to the folder removed on drop.
                .env("TMPDIR", &dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                // Its own process group: on drop the group goes, Chromium included.
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", chromedriver.display()))
        };
        let mut browser = Browser {
            client: None,
            driver,
            dir,
            log,
        };
        let deadline = Instant::now() + PATIENCE;
        while !driver_ready(port) {
            if let Ok(Some(status)) = browser.driver.try_wait() {
                panic!(
                    "chromedriver exited ({status}) before answering:\n{}",
                    browser.driver_log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not answer on port {port} within {PATIENCE:?}:\n{}",
                browser.driver_log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".to_owned(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new",
                    // Chromium refuses to run as root with its sandbox.
                    "--no-sandbox",
                    "--disable-gpu",
                    "--window-size=1280,900",
                    // Containers have a small /dev/shm.
                    "--disable-dev-shm-usage",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "open a Chromium session ({}): {e}\n{}",
                    chromium.display(),
                    browser.driver_log()
                )
            });
        browser.client = Some(client);
        browser
    }

    fn driver_log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn client(&self) -> &Client {
        self.client.as_ref().expect("a session is open")
    }

    /// Ends the session (Chromium quits); the drop then stops chromedriver.
    async fn close(mut self) {
        if let Some(client) = self.client.take() {
            client.close().await.expect("close the browser session");
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The group: chromedriver and the Chromium it started, when a test failed mid-session.
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &group])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ---------------------------------------------------------------------------------------------
// Screenshots
// ---------------------------------------------------------------------------------------------

/// `target/dashboard-screenshots/` (under `$CARGO_TARGET_DIR` when set), created.
fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|t| !t.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// Saves what the browser shows as `<name>.png`; checks it is a PNG.
async fn screenshot(client: &Client, name: &str) -> PathBuf {
    let png = client.screenshot().await.expect("take a screenshot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "the screenshot of {name} is not a PNG"
    );
    let path = screenshot_dir().join(format!("{name}.png"));
    std::fs::write(&path, &png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_smoke() {
    let _one = SERIAL.lock().await;
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(|| async { axum::response::Html("<h1 id=t>hello &lt;b&gt;</h1>") }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let browser = Browser::start().await;
    let c = browser.client();
    c.goto(&format!("http://{addr}/")).await.expect("goto");
    let t = c
        .find(Locator::Id("t"))
        .await
        .expect("find")
        .text()
        .await
        .expect("text");
    assert_eq!(t, "hello <b>");
    let v: Value = c
        .execute("return typeof window.__pwned", vec![])
        .await
        .expect("js");
    assert_eq!(v, json!("undefined"));
    screenshot(c, "smoke").await;
    assert!(std::env::var_os("I15_BOOM").is_none(), "boom");
    browser.close().await;
}

// ---------------------------------------------------------------------------------------------
// Backends made for a test, filled through the broker's own API.
// ---------------------------------------------------------------------------------------------

/// The queue the tests fill.
const QUEUE: &str = "mail";

/// A fresh SQLite database with the conformance table, and its route (group `mail`).
async fn sqlite_route() -> (
    common::Lite,
    SqlxRoute<sqlx::Sqlite, common::ConfRow>,
) {
    use common::Db as _;
    let db = common::Lite::fresh("dashboard", common::SQLITE_CONF_SCHEMA).await;
    let route = db.broker().route::<common::ConfRow>(QUEUE);
    route.connect().await.expect("connect the route");
    (db, route)
}

/// A Redis broker on `REDIS_URL` in a namespace of its own.
async fn redis_broker() -> RedisBroker {
    let url = match std::env::var("REDIS_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "REDIS_URL is not set: run the tests with `scripts/test-all -- cargo test --workspace --test dashboard_browser`, which starts Redis and exports it"
        ),
    };
    let broker = RedisBroker::from_url(url).namespace(format!("dashb{}:", common::unique()));
    broker.connect().await.expect("connect to REDIS_URL");
    broker.prepare(QUEUE).await.expect("prepare the queue");
    broker
}

/// Publishes one job per payload, of `kind`, to [`QUEUE`]; due at `due` (now when `None`).
async fn publish<B: Broker>(
    broker: &B,
    kind: &str,
    payloads: Vec<Vec<u8>>,
    due: Option<DateTime<Utc>>,
) {
    let now = Utc::now();
    let jobs = payloads
        .into_iter()
        .enumerate()
        .map(|(n, payload)| {
            let mut job = Job::from_bytes(QUEUE, payload)
                .kind(kind)
                .request_id(format!("req-{kind}-{n}"));
            if let Some(at) = due {
                job = job.at(at);
            }
            let (_, envelope, at) = job.into_parts(now);
            (envelope, at)
        })
        .collect();
    let published = broker.publish(QUEUE, jobs).await.expect("publish");
    assert!(published.iter().all(|p| p.is_stored()), "{published:?}");
}

/// `n` JSON payloads `{"order": i}`.
fn orders(n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("{{\"order\":{i}}}").into_bytes())
        .collect()
}

/// Claims `n` due jobs of [`QUEUE`] (held, not settled: they count as running).
async fn claim<B: Broker>(broker: &B, n: usize) -> Vec<Delivery<B::Receipt>> {
    let mut held = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while held.len() < n {
        assert!(Instant::now() < deadline, "claimed {} of {n}", held.len());
        let got = broker
            .claim(QUEUE, n - held.len(), Duration::from_millis(200))
            .await
            .expect("claim");
        held.extend(got);
    }
    held
}

/// Claims every due job of [`QUEUE`] and sends each to the queue's dead letter with `error`.
/// Returns the dead letter's name.
async fn dead_letter_all<B: Broker>(broker: &B, error: &str) -> String {
    let dead = broker.default_dead_letter(QUEUE);
    let ready = broker.stats(QUEUE).await.expect("stats").ready;
    let ready = usize::try_from(ready).expect("a count");
    for delivery in claim(broker, ready).await {
        let settled = broker
            .settle(
                QUEUE,
                &delivery,
                Settlement::DeadLetter {
                    target: dead.clone(),
                    failure: Failure::new(
                        FailureCause::Error,
                        error,
                        "at mail::send (src/mail.rs:42)\nat stagedoor_jobs::runtime",
                    ),
                },
            )
            .await
            .expect("settle");
        assert_eq!(settled, Settled::Done);
    }
    dead
}

/// Serves `router` on a free loopback port; its base URL (no trailing slash).
async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("the bound address");
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}
