//! The dashboard in a real browser: headless Chromium, driven through `chromedriver`
//! (WebDriver) by fantoccini, against the dashboard's router served on loopback over a real
//! backend (SQLite through the sqlx backend with the conformance table, Redis).
//!
//! `scripts/test-all` installs Debian's `chromium` and `chromium-driver` and exports
//! `STAGEDOOR_CHROMEDRIVER` and `STAGEDOOR_CHROMIUM`; under `scripts/test-all` a test without them
//! FAILS, as do the tests without their server's URL (a plain `cargo test` lists them as ignored). Screenshots of each page are saved
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
use stagedoor_jobs::Activity as _;
use stagedoor_jobs::activity::{
    MinuteCounts, QueueCounts, ScheduleReport, WorkerQueue, WorkerReport,
};
use stagedoor_jobs::broker::{Broker, Delivery, Inspect as _, Settled, Settlement};
use stagedoor_jobs::{DeadLetters as _, DeadSelector, Failure, FailureCause, Job};
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
            "{var} is not set: it names {what}; run the tests with `scripts/test-all -- cargo test --workspace --test dashboard_browser -- --include-ignored`, which installs Debian's chromium and chromium-driver and exports it"
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

// ---------------------------------------------------------------------------------------------
// Backends made for a test, filled through the broker's own API.
// ---------------------------------------------------------------------------------------------

/// The queue the tests fill.
const QUEUE: &str = "mail";

/// How long a claim holds a job here: the tests' held jobs stay running while the page is read.
const LEASE: Duration = Duration::from_secs(300);

/// A fresh SQLite database with the conformance table, and its route (group `mail`).
async fn sqlite_route() -> (common::Lite, SqlxRoute<sqlx::Sqlite, common::ConfRow>) {
    use common::Db as _;
    let db = common::Lite::fresh("dashboard", common::SQLITE_CONF_SCHEMA).await;
    let route = db.broker().lease(LEASE).route::<common::ConfRow>(QUEUE);
    route.connect().await.expect("connect the route");
    (db, route)
}

/// A Redis broker on `REDIS_URL` in a namespace of its own.
async fn redis_broker() -> RedisBroker {
    let url = match std::env::var("REDIS_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "REDIS_URL is not set: run the tests with `scripts/test-all -- cargo test --workspace --test dashboard_browser -- --include-ignored`, which starts Redis and exports it"
        ),
    };
    let broker = RedisBroker::from_url(url)
        .namespace(format!("dashb{}:", common::unique()))
        .lease(LEASE);
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
            .claim(
                QUEUE,
                n - held.len(),
                Duration::from_millis(200),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
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

// ---------------------------------------------------------------------------------------------
// Reading pages
// ---------------------------------------------------------------------------------------------

/// The element `css`, once the page shows it.
async fn find(c: &Client, css: &str) -> fantoccini::elements::Element {
    match c
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::Css(css))
        .await
    {
        Ok(e) => e,
        Err(e) => {
            let url = c
                .current_url()
                .await
                .map(|u| u.to_string())
                .unwrap_or_default();
            let body = match c.find(Locator::Css("body")).await {
                Ok(b) => b.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            panic!("no `{css}` on {url} within {PATIENCE:?} ({e}); the page shows:\n{body}")
        }
    }
}

/// The visible text of the element `css`.
async fn text(c: &Client, css: &str) -> String {
    find(c, css).await.text().await.expect("an element's text")
}

/// The attribute `attr` of the element `css`.
async fn attr(c: &Client, css: &str, attr: &str) -> String {
    find(c, css)
        .await
        .attr(attr)
        .await
        .expect("an element's attribute")
        .unwrap_or_else(|| panic!("`{css}` has no attribute {attr}"))
}

/// Waits until the element `css` shows `want` (the live refresh changes it in place).
async fn wait_text(c: &Client, css: &str, want: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let got = text(c, css).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "`{css}` shows {got:?}, not {want:?}, after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `script` in the page, its value.
async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, vec![]).await.expect("run a script")
}

/// The text of every cell of queue `queue`'s row on the queues page, by field.
async fn queue_row(c: &Client, queue: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for field in ["ready", "running", "delayed", "dead"] {
        let css = format!("tr[data-queue=\"{queue}\"] td[data-field=\"{field}\"]");
        out.push((field.to_owned(), text(c, &css).await));
    }
    out
}

fn counts(ready: u64, running: u64, delayed: u64, dead: u64) -> Vec<(String, String)> {
    [
        ("ready", ready),
        ("running", running),
        ("delayed", delayed),
        ("dead", dead),
    ]
    .into_iter()
    .map(|(f, n)| (f.to_owned(), n.to_string()))
    .collect()
}

// ---------------------------------------------------------------------------------------------
// The queues page
// ---------------------------------------------------------------------------------------------

/// Fills [`QUEUE`] with 3 dead letters, 7 ready jobs, 2 running (claimed, held) and 4 delayed.
/// Returns the held deliveries (dropping them does not settle them).
async fn fill<B: Broker>(broker: &B) -> Vec<Delivery<B::Receipt>> {
    publish(broker, "mail.bounce", orders(3), None).await;
    let dead = dead_letter_all(broker, "mailbox full").await;
    assert_eq!(broker.dead_len(&dead).await.expect("dead_len"), 3);
    publish(broker, "mail.send", orders(9), None).await;
    publish(
        broker,
        "mail.digest",
        orders(4),
        Some(Utc::now() + chrono::Duration::hours(1)),
    )
    .await;
    let held = claim(broker, 2).await;
    let stats = broker.stats(QUEUE).await.expect("stats");
    assert_eq!(
        (stats.ready, stats.pending, stats.delayed),
        (7, 2, 4),
        "what the backend holds: {stats:?}"
    );
    held
}

/// The queues page shows the counts `broker` holds, and follows them live: 5 more published
/// jobs show in the ready cell without a reload.
async fn queues_page_shows_the_counts<B: Broker>(broker: B) -> Browser {
    let _held = fill(&broker).await;
    let base = serve(stagedoor_jobs_dashboard::Dashboard::new(broker.clone()).router()).await;
    let browser = Browser::start().await;
    let c = browser.client();
    c.goto(&format!("{base}/"))
        .await
        .expect("open the queues page");
    assert_eq!(queue_row(c, QUEUE).await, counts(7, 2, 4, 3));
    assert_eq!(
        text(c, &format!("tr[data-queue=\"{QUEUE}\"] td.name")).await,
        QUEUE
    );
    // The oldest ready job has waited a few seconds at most.
    let oldest = text(
        c,
        &format!("tr[data-queue=\"{QUEUE}\"] td[data-field=\"oldest\"]"),
    )
    .await;
    assert!(oldest.ends_with('s') && !oldest.contains('m'), "{oldest}");

    // Live: the page polls and updates the cells in place (a reload would drop the marker).
    js(c, "window.__stayed = 'yes'; return null").await;
    publish(&broker, "mail.send", orders(5), None).await;
    wait_text(
        c,
        &format!("tr[data-queue=\"{QUEUE}\"] td[data-field=\"ready\"]"),
        "12",
    )
    .await;
    assert_eq!(js(c, "return window.__stayed").await, json!("yes"));
    assert_eq!(queue_row(c, QUEUE).await, counts(12, 2, 4, 3));
    browser
}

#[ignore = "needs Chromium: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_page_shows_the_counts_of_sqlite() {
    let _one = SERIAL.lock().await;
    let (_db, route) = sqlite_route().await;
    let browser = queues_page_shows_the_counts(route).await;
    screenshot(browser.client(), "queues-sqlite").await;
    browser.close().await;
}

#[ignore = "needs Redis and Chromium: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_page_shows_the_counts_of_redis() {
    let _one = SERIAL.lock().await;
    let browser = queues_page_shows_the_counts(redis_broker().await).await;
    screenshot(browser.client(), "queues-redis").await;
    browser.close().await;
}

// ---------------------------------------------------------------------------------------------
// Dead letters
// ---------------------------------------------------------------------------------------------

/// From the dead-letter page: open the dead letter, press a kind's "Replay kind", read the
/// confirmation (40 jobs), confirm; the backend then holds 3 dead letters and 40 more jobs in
/// the queue.
#[ignore = "needs Chromium: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_a_kind_from_the_dead_letter_page() {
    let _one = SERIAL.lock().await;
    let (_db, route) = sqlite_route().await;
    publish(&route, "invoice.render", orders(40), None).await;
    publish(&route, "mail.bounce", orders(3), None).await;
    let dead = dead_letter_all(&route, "template missing: invoice.html").await;
    assert_eq!(route.dead_len(&dead).await.expect("dead_len"), 43);
    assert_eq!(route.stats(QUEUE).await.expect("stats").ready, 0);

    let base = serve(stagedoor_jobs_dashboard::Dashboard::new(route.clone()).router()).await;
    let browser = Browser::start().await;
    let c = browser.client();
    c.goto(&format!("{base}/dead"))
        .await
        .expect("open the dead letters");
    let row = format!("tr[data-dead=\"{dead}\"]");
    assert_eq!(
        text(c, &format!("{row} td[data-field=\"dead\"]")).await,
        "43"
    );
    screenshot(c, "dead-letters").await;

    find(c, &format!("{row} a"))
        .await
        .click()
        .await
        .expect("open the dead letter");
    assert_eq!(text(c, "[data-field=\"total\"]").await, "43");
    let kind_row = "tr[data-kind=\"invoice.render\"]";
    assert_eq!(text(c, &format!("{kind_row} td.num")).await, "40");
    assert_eq!(text(c, "tr[data-kind=\"mail.bounce\"] td.num").await, "3");
    screenshot(c, "dead-letter-jobs").await;
    let replay = find(c, &format!("{kind_row} a.button")).await;
    assert_eq!(replay.text().await.expect("text"), "Replay kind");
    replay.click().await.expect("press Replay kind");

    // The confirmation says how many it will move, and moves nothing yet.
    assert_eq!(attr(c, "p.confirm", "data-count").await, "40");
    let sentence = text(c, "p.confirm").await;
    assert!(sentence.contains("move 40 jobs"), "{sentence}");
    assert!(sentence.contains("invoice.render"), "{sentence}");
    let confirm = find(c, "form.confirm button[type=\"submit\"]").await;
    assert_eq!(confirm.text().await.expect("text"), "Replay 40 jobs");
    screenshot(c, "dead-confirm").await;
    assert_eq!(route.dead_len(&dead).await.expect("dead_len"), 43);

    confirm.click().await.expect("confirm the replay");
    assert_eq!(attr(c, "p.result", "data-replayed").await, "40");
    let result = text(c, "p.result").await;
    assert!(result.starts_with("Replayed 40 of"), "{result}");

    assert_eq!(route.dead_len(&dead).await.expect("dead_len"), 3);
    let left = route
        .dead_letters(&dead, &DeadSelector::All, 100)
        .await
        .expect("the dead letters");
    assert!(
        left.iter().all(|d| d.envelope.kind() == "mail.bounce"),
        "{left:?}"
    );
    let stats = route.stats(QUEUE).await.expect("stats");
    assert_eq!(stats.ready, 40, "{stats:?}");
    browser.close().await;
}

/// A payload holding `<script>` (and an error holding an `onerror` attribute) is shown as
/// text on the dead letter's page and in the list; neither runs.
#[ignore = "needs Chromium: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_in_a_payload_shows_as_text() {
    const SCRIPT: &str = "<script>window.__pwned = 1</script>";
    const IMG: &str = "<img src=x onerror=\"window.__pwned = 2\">";
    let _one = SERIAL.lock().await;
    let (_db, route) = sqlite_route().await;
    let payload = serde_json::to_vec(&json!({ "note": SCRIPT, "order": 7 })).expect("json");
    publish(&route, "note.render", vec![payload], None).await;
    let dead = dead_letter_all(&route, IMG).await;
    let letter = route
        .dead_letters(&dead, &DeadSelector::All, 1)
        .await
        .expect("the dead letter")
        .pop()
        .expect("one dead letter");

    let base = serve(stagedoor_jobs_dashboard::Dashboard::new(route.clone()).router()).await;
    let browser = Browser::start().await;
    let c = browser.client();
    c.goto(&format!("{base}/dead"))
        .await
        .expect("open the dead letters");
    find(c, &format!("tr[data-dead=\"{dead}\"] a"))
        .await
        .click()
        .await
        .expect("open the dead letter");
    let job_row = format!("tr[data-id=\"{}\"]", letter.id);
    assert_eq!(text(c, &format!("{job_row} td.error-text")).await, IMG);
    assert_eq!(
        js(c, "return typeof window.__pwned").await,
        json!("undefined")
    );

    find(c, &format!("{job_row} a"))
        .await
        .click()
        .await
        .expect("open the job");
    let shown = text(c, "pre[data-field=\"payload\"]").await;
    assert!(shown.contains(SCRIPT), "the payload as text: {shown}");
    assert!(shown.contains("\"order\": 7"), "pretty-printed: {shown}");
    assert_eq!(text(c, "pre[data-field=\"error\"]").await, IMG);
    assert_eq!(
        text(c, "[data-field=\"job-id\"]").await,
        letter.envelope.id().as_str()
    );
    assert_eq!(
        text(c, "[data-field=\"request-id\"]").await,
        "req-note.render-0"
    );
    assert_eq!(
        js(c, "return typeof window.__pwned").await,
        json!("undefined")
    );
    // No element was made of the payload or the error: no <img>, and the only <script> is
    // the dashboard's own.
    assert_eq!(js(c, "return document.images.length").await, json!(0));
    assert_eq!(
        js(
            c,
            "return Array.from(document.scripts).filter(s => s.textContent.includes('__pwned')).length"
        )
        .await,
        json!(0)
    );
    screenshot(c, "dead-letter").await;
    browser.close().await;
}

// ---------------------------------------------------------------------------------------------
// What services report: workers, schedules, per-minute counts (Redis)
// ---------------------------------------------------------------------------------------------

/// A worker's report through Redis shows on the workers page (host, pid, service, queues,
/// jobs in flight), its schedule on the scheduled page with the queue's delayed jobs, and its
/// per-minute counts in the queues page's chart. Saves the screenshots of those pages.
#[ignore = "needs Redis and Chromium: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_schedules_and_the_chart_from_redis_reports() {
    let _one = SERIAL.lock().await;
    let broker = redis_broker().await;
    let _held = fill(&broker).await;
    let now = Utc::now();
    let id = format!("worker-{}", common::unique());
    let mut worker = WorkerReport::new(
        id.clone(),
        "web-1",
        4242,
        now - chrono::Duration::hours(2),
        now,
    );
    worker.app = "billing 1.4.2".to_owned();
    let mut queue = WorkerQueue::new(QUEUE, 8, 2);
    queue.subscribers = vec!["send_mail".to_owned()];
    worker.queues = vec![queue];
    let mut schedule = ScheduleReport::new("nightly-digest", QUEUE, "0 3 * * * UTC", "run once");
    schedule.last_tick = Some(now - chrono::Duration::hours(2));
    schedule.next_tick = Some(now + chrono::Duration::hours(22));
    worker.schedules = vec![schedule];
    // 56 minutes up to now (all within the chart's hour while the test runs), a wave.
    let minutes: Vec<MinuteCounts> = (0..56u64)
        .map(|i| {
            let at = now - chrono::Duration::minutes(55 - i as i64);
            MinuteCounts::new(at, 40 + (i * 7) % 30, (i * 3) % 5, u64::from(i % 9 == 0))
        })
        .collect();
    let totals = minutes.iter().fold((0, 0, 0), |t, m| {
        (t.0 + m.processed, t.1 + m.failed, t.2 + m.dead)
    });
    broker
        .report(
            &worker,
            &[QueueCounts::new(QUEUE, minutes)],
            Duration::from_secs(600),
        )
        .await
        .expect("report through Redis");

    let base = serve(stagedoor_jobs_dashboard::Dashboard::new(broker.clone()).router()).await;
    let browser = Browser::start().await;
    let c = browser.client();

    c.goto(&format!("{base}/"))
        .await
        .expect("open the queues page");
    assert_eq!(queue_row(c, QUEUE).await, counts(7, 2, 4, 3));
    assert_eq!(
        attr(c, "#chart svg.chart", "aria-label").await,
        format!(
            "Jobs per minute over the last hour: {} processed, {} failed, {} dead-lettered",
            totals.0, totals.1, totals.2
        )
    );
    assert_eq!(
        c.find_all(Locator::Css("#chart polyline.series"))
            .await
            .expect("the chart's lines")
            .len(),
        3
    );
    screenshot(c, "queues").await;

    c.goto(&format!("{base}/workers"))
        .await
        .expect("open the workers page");
    let row = format!("tr[data-worker=\"{id}\"]");
    assert_eq!(
        text(c, &format!("{row} [data-field=\"host\"]")).await,
        "web-1"
    );
    assert_eq!(
        text(c, &format!("{row} [data-field=\"pid\"]")).await,
        "4242"
    );
    assert_eq!(
        text(c, &format!("{row} [data-field=\"app\"]")).await,
        "billing 1.4.2"
    );
    assert_eq!(
        text(c, &format!("{row} [data-field=\"queues\"]")).await,
        "mail (2/8)"
    );
    assert_eq!(
        text(c, &format!("{row} [data-field=\"in_flight\"]")).await,
        "2"
    );
    assert_eq!(text(c, "[data-field=\"count\"]").await, "1");
    screenshot(c, "workers").await;

    c.goto(&format!("{base}/scheduled"))
        .await
        .expect("open the scheduled page");
    let schedule = text(c, "tr[data-schedule=\"nightly-digest\"]").await;
    for part in ["nightly-digest", "0 3 * * * UTC", "run once", "web-1:4242"] {
        assert!(schedule.contains(part), "{part:?} in {schedule:?}");
    }
    find(c, &format!("table.delayed[data-queue=\"{QUEUE}\"]")).await;
    let delayed = c
        .find_all(Locator::Css(&format!(
            "table.delayed[data-queue=\"{QUEUE}\"] tbody tr"
        )))
        .await
        .expect("the delayed jobs");
    assert_eq!(delayed.len(), 4);
    for row in &delayed {
        let t = row.text().await.expect("a row's text");
        assert!(t.contains("mail.digest") && t.contains("(in 59m"), "{t}");
    }
    screenshot(c, "scheduled").await;
    browser.close().await;
}

// ---------------------------------------------------------------------------------------------
// A hostile page in the same browser (issue 30)
// ---------------------------------------------------------------------------------------------

/// A CSRF nonce of the attacker's choosing (64 hex digits, as the dashboard's cookie holds).
const PLANTED: &str = "0badc0de0badc0de0badc0de0badc0de0badc0de0badc0de0badc0de0badc0de";

/// Serves `html` at `/` on another loopback port (another origin, the same site and cookie
/// jar: cookies are not kept apart by port), setting the dashboard's CSRF cookie to
/// [`PLANTED`] for every port of 127.0.0.1. Its base URL.
async fn attacker_site(html: String) -> String {
    let page = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let html = html.clone();
            async move {
                (
                    [(
                        axum::http::header::SET_COOKIE,
                        format!("sdj_csrf={PLANTED}; Path=/; SameSite=Lax"),
                    )],
                    axum::response::Html(html),
                )
            }
        }),
    );
    serve(page).await
}

/// Three dead letters on SQLite and the dashboard of them: the route, its dead letter's name,
/// the dashboard's base URL.
async fn three_dead_letters() -> (
    common::Lite,
    SqlxRoute<sqlx::Sqlite, common::ConfRow>,
    String,
    String,
) {
    let (db, route) = sqlite_route().await;
    publish(&route, "mail.bounce", orders(3), None).await;
    let dead = dead_letter_all(&route, "mailbox full").await;
    assert_eq!(route.dead_len(&dead).await.expect("dead_len"), 3);
    let base = serve(stagedoor_jobs_dashboard::Dashboard::new(route.clone()).router()).await;
    (db, route, dead, base)
}

/// A page on another origin (another port of 127.0.0.1) plants the CSRF cookie and posts a
/// purge form carrying the same value to the dashboard the browser has open: refused (403,
/// the form came from another site), nothing purged. Before the fix the double-submit check
/// passed (cookie = field) and the three letters were purged.
#[ignore = "needs Chromium: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_origin_cannot_purge() {
    let _one = SERIAL.lock().await;
    let (_db, route, dead, base) = three_dead_letters().await;
    let form = format!(
        r#"<!DOCTYPE html><html><body><h1>Cute cats</h1>
<form id="f" method="post" action="{base}/dead/action">
<input type="hidden" name="dl" value="{dead}">
<input type="hidden" name="action" value="purge">
<input type="hidden" name="all" value="1">
<input type="hidden" name="csrf" value="{PLANTED}">
</form>
<script>document.getElementById("f").submit();</script></body></html>"#
    );
    let attacker = attacker_site(form).await;
    assert_ne!(attacker, base);
    let browser = Browser::start().await;
    let c = browser.client();
    // The operator has the dashboard open (its own CSRF cookie is set).
    c.goto(&format!("{base}/dead"))
        .await
        .expect("open the dashboard");
    find(c, "table.dead-letters").await;
    // Then visits the attacker's page, which posts the purge at once.
    c.goto(&attacker).await.expect("open the attacker's page");
    let heading = text(c, "main h1").await;
    let alert = text(c, "div.error").await;
    screenshot(c, "cross-origin-post").await;
    assert_eq!(heading, "Refused", "{alert}");
    assert!(alert.contains("another site"), "{alert}");
    assert_eq!(
        route.dead_len(&dead).await.expect("dead_len"),
        3,
        "nothing purged"
    );
    browser.close().await;
}

/// A planted CSRF cookie (set by another port of the same host) is no token: a form posted
/// from the dashboard's own origin with the planted value in its field is refused (403) and
/// purges nothing; the dashboard's own confirmation still works with the planted cookie
/// (its token is an HMAC of it). Before the fix the forged form purged the letters.
#[ignore = "needs Chromium: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_csrf_cookie_forges_nothing() {
    let _one = SERIAL.lock().await;
    let (_db, route, dead, base) = three_dead_letters().await;
    let attacker =
        attacker_site("<!DOCTYPE html><html><body>nothing to see</body></html>".to_owned()).await;
    let browser = Browser::start().await;
    let c = browser.client();
    c.goto(&attacker).await.expect("open the attacker's page");
    c.goto(&format!("{base}/dead"))
        .await
        .expect("open the dashboard");
    find(c, "table.dead-letters").await;
    let sent = js(
        c,
        &format!(
            r#"var f = document.createElement("form");
f.method = "post"; f.action = "{base}/dead/action";
[["dl", {dead:?}], ["action", "purge"], ["all", "1"], ["csrf", "{PLANTED}"]].forEach(function (kv) {{
  var i = document.createElement("input"); i.type = "hidden"; i.name = kv[0]; i.value = kv[1]; f.appendChild(i);
}});
document.body.appendChild(f); f.submit(); return document.cookie;"#
        ),
    )
    .await;
    let heading = text(c, "main h1").await;
    let alert = text(c, "div.error").await;
    screenshot(c, "planted-cookie").await;
    assert_eq!(heading, "Refused", "{alert} (cookies seen: {sent})");
    assert!(alert.contains("security token"), "{alert}");
    assert_eq!(
        route.dead_len(&dead).await.expect("dead_len"),
        3,
        "nothing purged"
    );
    // The operator's own confirmation works, planted cookie or not.
    c.goto(&format!(
        "{base}/dead/confirm?dl={}&action=purge&all=1",
        dead.replace(':', "%3A")
    ))
    .await
    .expect("open the confirmation");
    find(c, "form.confirm button[type=\"submit\"]")
        .await
        .click()
        .await
        .expect("confirm the purge");
    assert_eq!(attr(c, "p.result", "data-purged").await, "3");
    assert_eq!(route.dead_len(&dead).await.expect("dead_len"), 0);
    browser.close().await;
}

// ---------------------------------------------------------------------------------------------
// Flows and job results (issue 34), on the memory broker
// ---------------------------------------------------------------------------------------------

/// A report job's payload.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Pages {
    pages: u32,
}

/// A flow `nightly` of two report jobs (b after a), published, nothing run; its jobs' ids.
async fn flow_of_two(
    b: &stagedoor_jobs::MemoryBroker,
) -> (stagedoor_jobs::JobId, stagedoor_jobs::JobId) {
    use stagedoor_jobs::Flows as _;
    let mut flow = stagedoor_jobs::Flow::new().with_id("nightly");
    let a = flow.add(Job::new("reports", &Pages { pages: 3 }).expect("job"));
    let b_id = flow
        .add_after(Job::new("reports", &Pages { pages: 7 }).expect("job"), [&a])
        .expect("add after");
    b.publish_flow(flow).await.expect("publish the flow");
    (a, b_id)
}

/// A flow's page shows each job's row with its state and what holds the flow (b waits for
/// a); the `/flows` form opens the same page; a hostile id typed in the form shows as text:
/// no element made of it, no alert.
#[ignore = "needs Chromium: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_page_shows_nodes_and_what_holds_them() {
    const HOSTILE: &str = "<img src=x onerror=alert(1)>";
    let _one = SERIAL.lock().await;
    let broker = stagedoor_jobs::MemoryBroker::new();
    let (a, b) = flow_of_two(&broker).await;
    let (a, b) = (a.as_str().to_owned(), b.as_str().to_owned());
    let base = serve(stagedoor_jobs_dashboard::Dashboard::new(broker.clone()).router()).await;
    let browser = Browser::start().await;
    let c = browser.client();

    // What the flow's page must show, however it was opened.
    let check = |c: &Client| {
        let (a, b) = (a.clone(), b.clone());
        let c = c.clone();
        async move {
            assert_eq!(
                text(&c, &format!("tr[data-node=\"{a}\"] [data-field=\"state\"]")).await,
                "released"
            );
            assert_eq!(
                text(&c, &format!("tr[data-node=\"{b}\"] [data-field=\"state\"]")).await,
                "waiting"
            );
            assert_eq!(
                text(&c, "[data-field=\"summary\"]").await,
                "2 jobs: 1 released, 1 waiting. Sealed."
            );
            assert_eq!(text(&c, "ul.held").await, format!("{b} waits for {a}"));
            let first = text(&c, &format!("tr[data-node=\"{a}\"]")).await;
            assert!(first.contains("reports"), "{first}");
        }
    };

    c.goto(&format!("{base}/flows/nightly"))
        .await
        .expect("open the flow");
    check(c).await;
    screenshot(c, "flow").await;

    // The form: type the id, submit, the same page.
    c.goto(&format!("{base}/flows"))
        .await
        .expect("open the flows form");
    let own_images = js(c, "return document.querySelectorAll('img').length").await;
    find(c, "form[action$=\"/flows\"] input[name=\"id\"]")
        .await
        .send_keys("nightly")
        .await
        .expect("type the flow's id");
    find(c, "form[action$=\"/flows\"] button[type=\"submit\"]")
        .await
        .click()
        .await
        .expect("submit the form");
    check(c).await;
    let url = c.current_url().await.expect("the url").to_string();
    assert!(url.ends_with("/flows?id=nightly"), "{url}");

    // A hostile id typed in the form: shown as text, nothing injected, no alert.
    c.goto(&format!("{base}/flows"))
        .await
        .expect("open the flows form");
    find(c, "form[action$=\"/flows\"] input[name=\"id\"]")
        .await
        .send_keys(HOSTILE)
        .await
        .expect("type the hostile id");
    find(c, "form[action$=\"/flows\"] button[type=\"submit\"]")
        .await
        .click()
        .await
        .expect("submit the form");
    // An img with a broken src fails at once; give its onerror time to run.
    tokio::time::sleep(Duration::from_millis(500)).await;
    match c.get_alert_text().await {
        Err(fantoccini::error::CmdError::Standard(e))
            if e.error == fantoccini::error::ErrorStatus::NoSuchAlert => {}
        other => panic!("an alert is open (or the check failed): {other:?}"),
    }
    let notice = text(c, "p.notice").await;
    assert!(
        notice.contains(&format!("No flow or batch `{HOSTILE}`")),
        "the id as text: {notice}"
    );
    assert_eq!(
        js(c, "return document.querySelectorAll('img').length").await,
        own_images,
        "no element made of the id"
    );
    assert_eq!(
        js(
            c,
            "return document.querySelector('form[action$=\"/flows\"] input[name=\"id\"]').value"
        )
        .await,
        json!(HOSTILE),
        "the form keeps the id as its value"
    );
    screenshot(c, "flow-hostile-id").await;
    browser.close().await;
}

/// Lets [`slow_report`] return.
static REPORT_GO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Reports 40 %, waits for [`REPORT_GO`], then returns what it rendered.
async fn slow_report(
    r: &Pages,
    progress: stagedoor_jobs::JobProgress,
) -> stagedoor_jobs::HandlerOutcome {
    progress
        .set(0.4, "page 4 of 10")
        .await
        .expect("progress kept");
    while !REPORT_GO.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stagedoor_jobs::HandlerOutcome::ack_with(&json!({ "pages": r.pages, "file": "report.pdf" }))
}

/// A running job's result page shows its progress (bar, percent, message) and polls; once the
/// handler returns, the page shows the result by itself (live.js reloads it) within 10 s.
#[ignore = "needs Chromium: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_page_updates_progress_live() {
    use stagedoor_jobs::{Publish as _, Results as _};
    let _one = SERIAL.lock().await;
    let broker = stagedoor_jobs::MemoryBroker::new();
    let id = broker
        .publish_job(Job::new("reports", &Pages { pages: 10 }).expect("job"))
        .await
        .expect("publish")
        .into_id();
    let running =
        stagedoor_jobs::Service::new(stagedoor_jobs::AppInfo::new("dash-browser", "0.1.0"))
            .with_broker(broker.clone(), |m| {
                m.include(stagedoor_jobs::Subscriber::new("reports", slow_report));
            })
            .start()
            .await
            .expect("the service starts");
    let base = serve(stagedoor_jobs_dashboard::Dashboard::new(broker.clone()).router()).await;
    let browser = Browser::start().await;
    let c = browser.client();

    c.goto(&format!("{base}/jobs/{}/result", id.as_str()))
        .await
        .expect("open the job's result");
    find(c, "section#result[data-live=\"result\"]").await;
    // Drawn with the progress, or given it by the page's next poll.
    wait_text(c, "[data-field=\"percent\"]", "40%").await;
    wait_text(c, "[data-field=\"message\"]", "page 4 of 10").await;
    let bar = js(c, "return document.querySelector('[data-field=bar]').value").await;
    let bar = bar
        .as_f64()
        .unwrap_or_else(|| panic!("the bar's value: {bar}"));
    assert!((bar - 0.4).abs() < 1e-3, "the bar's value: {bar}");
    assert!(
        c.find(Locator::Css("pre[data-field=\"result\"]"))
            .await
            .is_err(),
        "no result yet"
    );
    screenshot(c, "result-progress").await;

    let released = Instant::now();
    REPORT_GO.store(true, std::sync::atomic::Ordering::SeqCst);
    broker
        .wait_result(id.as_str(), Duration::from_secs(30))
        .await
        .expect("the job ran");
    let shown = text(c, "pre[data-field=\"result\"]").await;
    let took = released.elapsed();
    assert!(shown.contains("\"pages\": 10"), "{shown}");
    assert!(shown.contains("report.pdf"), "{shown}");
    assert!(
        took <= Duration::from_secs(10),
        "the result showed {took:?} after the handler was let go"
    );
    assert_eq!(text(c, "[data-field=\"percent\"]").await, "40%");
    assert_eq!(
        js(c, "return document.querySelector('[data-live]') === null").await,
        json!(true),
        "a finished job's page no longer polls"
    );
    screenshot(c, "result-finished").await;
    eprintln!("result shown {took:?} after the handler was let go");
    browser.close().await;
    running.shutdown().await;
}
