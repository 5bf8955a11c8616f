//! The dashboard under attack (issue 30), over HTTP: a rebound `Host`, cross-site and forged
//! POSTs, a planted CSRF cookie, guessing the token, requests that cost the backend much, a
//! title with a secret shown before sign-in, and the mount point with a trailing slash.
//!
//! The guard, the parsing, the cache and the rendering sit above the broker, so each item runs
//! on the memory broker; `attacks_leave_every_backend_untouched` also runs the browser-side
//! attacks (a rebound Host, a cross-site POST, a planted cookie, guessing) against memory,
//! SQLite, Postgres and Redis and checks the backend kept every dead letter; the payload
//! download is checked on every backend in `dashboard_http.rs` (`every_route`).

mod common;
mod common_dashboard;
#[allow(dead_code)]
mod common_redis;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use chrono::{DateTime, Utc};
use common_dashboard::{Resp, Web, query};
use serde_json::json;
use stagedoor_jobs::activity::{DelayedJob, MinuteCounts, QueueCounts, WorkerReport};
use stagedoor_jobs::broker::Settlement;
use stagedoor_jobs::{
    Activity, Broker, BrokerError, DeadLetter, DeadLetters, DeadSelector, Failure, FailureCause,
    Inspect, Job, JobId, MemoryBroker, Publish, QueueStats, ReplayReport,
};
use stagedoor_jobs_dashboard::{Auth, Dashboard};

/// The value of the hidden `csrf` field of a page's form.
#[track_caller]
fn form_token(body: &str) -> String {
    let at = body
        .find(r#"name="csrf" value=""#)
        .unwrap_or_else(|| panic!("no CSRF field in:\n{body}"));
    let rest = &body[at + r#"name="csrf" value=""#.len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

/// Queue `mail` with `dead` jobs dead-lettered to `mail.dead` (kind `welcome`, ids `m-<n>`),
/// each with `payload`.
async fn seed(b: &MemoryBroker, dead: usize, payload: &serde_json::Value) {
    b.connect().await.unwrap();
    let jobs: Vec<Job> = (0..dead)
        .map(|n| {
            Job::new("mail", payload)
                .unwrap()
                .kind("welcome")
                .id(JobId::from_string(format!("m-{n}")))
        })
        .collect();
    b.publish_jobs(jobs).await.unwrap();
    for d in b
        .claim(
            "mail",
            dead,
            Duration::ZERO,
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .unwrap()
    {
        b.settle(
            "mail",
            &d,
            Settlement::DeadLetter {
                target: "mail.dead".into(),
                failure: Failure::new(FailureCause::Error, "bad", ""),
            },
        )
        .await
        .unwrap();
    }
    assert_eq!(b.dead_len("mail.dead").await.unwrap(), dead as u64);
}

async fn seeded(
    d: impl FnOnce(Dashboard<MemoryBroker>) -> Dashboard<MemoryBroker>,
) -> (MemoryBroker, Router) {
    let b = MemoryBroker::new();
    seed(&b, 3, &json!({"to": "a@example.com"})).await;
    let router = d(Dashboard::new(b.clone())).router();
    (b, router)
}

// ---------------------------------------------------------------------------------------------
// 1. DNS rebinding: the Host header.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_rebound_host_is_refused() {
    let (_, router) = seeded(|d| d).await;
    for host in [
        "attacker.example:8787",
        "attacker.example",
        "127.0.0.1.nip.io:8787",
    ] {
        let r = Web::new(router.clone()).header("host", host).get("/").await;
        assert_eq!(
            r.status,
            StatusCode::MISDIRECTED_REQUEST,
            "{host}: {}",
            r.body
        );
        assert!(
            r.body.contains("allowed_host") && r.body.contains("--allowed-host"),
            "{host}: the refusal names the fix: {}",
            r.body
        );
        assert!(
            !r.body.contains("mail"),
            "{host}: nothing shown: {}",
            r.body
        );
    }
    for host in [
        "127.0.0.1:8787",
        "localhost:8787",
        "[::1]:8787",
        "localhost",
    ] {
        let r = Web::new(router.clone()).header("host", host).get("/").await;
        assert_eq!(r.status, StatusCode::OK, "{host}: {}", r.body);
    }
}

#[tokio::test]
async fn an_allowed_host_is_served_and_a_bound_server_knows_its_port() {
    let (_, router) = seeded(|d| d.allowed_host("jobs.example.com")).await;
    for (host, status) in [
        ("jobs.example.com", StatusCode::OK),
        ("JOBS.example.com:443", StatusCode::OK),
        ("evil.jobs.example.com", StatusCode::MISDIRECTED_REQUEST),
    ] {
        let r = Web::new(router.clone()).header("host", host).get("/").await;
        assert_eq!(r.status, status, "{host}: {}", r.body);
    }

    // A standalone server on loopback: its own address and port, and no other port.
    let server = stagedoor_jobs_dashboard::bind(Dashboard::new(MemoryBroker::new()), "127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(server.run_until(async {
        let _ = stopped.await;
    }));
    let port = addr.port();
    let other = if port == 65_535 { 1 } else { port + 1 };
    for (host, want) in [
        (format!("127.0.0.1:{port}"), "200"),
        (format!("localhost:{port}"), "200"),
        (format!("attacker.example:{port}"), "421"),
        (format!("localhost:{other}"), "421"),
    ] {
        let got = raw_status(addr, &host).await;
        assert_eq!(got, want, "Host: {host}");
    }
    let _ = stop.send(());
    run.await.unwrap().unwrap();
}

/// The status code of `GET /workers` with `Host: host`, over TCP.
async fn raw_status(addr: SocketAddr, host: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET /workers HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split(' ').nth(1).unwrap_or_default().to_owned()
}

// ---------------------------------------------------------------------------------------------
// 2. CSRF: cross-site POSTs, a planted cookie, the token bound to the session.
// ---------------------------------------------------------------------------------------------

fn purge_all(token: &str) -> Vec<(&'static str, String)> {
    vec![
        ("dl", "mail.dead".to_owned()),
        ("action", "purge".to_owned()),
        ("all", "1".to_owned()),
        ("csrf", token.to_owned()),
    ]
}

async fn post_purge(web: &mut Web, token: &str) -> Resp {
    let form = purge_all(token);
    let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    web.post("/dead/action", &form).await
}

#[tokio::test]
async fn cross_site_posts_are_refused() {
    let (b, router) = seeded(|d| d).await;
    for (name, value) in [
        ("origin", "http://attacker.example"),
        ("origin", "null"),
        ("origin", "http://127.0.0.1:9999"),
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-site", "same-site"),
    ] {
        let mut web = Web::new(router.clone()).header("host", "127.0.0.1:8787");
        let page = web
            .get("/dead/confirm?dl=mail.dead&action=purge&all=1")
            .await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let token = form_token(&page.body);
        web.headers.push((name, value.to_owned()));
        let r = post_purge(&mut web, &token).await;
        assert_eq!(
            r.status,
            StatusCode::FORBIDDEN,
            "{name}: {value}: {}",
            r.body
        );
        assert!(
            r.body.contains("another site"),
            "{name}: {value}: {}",
            r.body
        );
        assert_eq!(
            b.dead_len("mail.dead").await.unwrap(),
            3,
            "{name}: {value}: nothing purged"
        );
    }
    // The dashboard's own page: same origin.
    let mut web = Web::new(router.clone())
        .header("host", "127.0.0.1:8787")
        .header("origin", "http://127.0.0.1:8787")
        .header("sec-fetch-site", "same-origin");
    let page = web
        .get("/dead/confirm?dl=mail.dead&action=purge&all=1")
        .await;
    let token = form_token(&page.body);
    let r = post_purge(&mut web, &token).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains(r#"data-purged="3""#), "{}", r.body);
}

#[tokio::test]
async fn a_planted_csrf_cookie_is_refused() {
    let (b, router) = seeded(|d| d).await;
    // A sibling site sets the cookie to a value of its choosing and posts it back.
    let planted = "ab".repeat(32);
    let mut web = Web::new(router.clone());
    web.cookies.insert("sdj_csrf".into(), planted.clone());
    let r = post_purge(&mut web, &planted).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert_eq!(b.dead_len("mail.dead").await.unwrap(), 3, "nothing purged");

    // The token a page carries is not its cookie's value (so the cookie alone forges nothing).
    let mut web = Web::new(router.clone());
    let page = web
        .get("/dead/confirm?dl=mail.dead&action=purge&all=1")
        .await;
    let token = form_token(&page.body);
    let cookie = web.cookies["sdj_csrf"].clone();
    assert_ne!(token, cookie);
    let r = post_purge(&mut web, &cookie).await;
    assert_eq!(
        r.status,
        StatusCode::FORBIDDEN,
        "the cookie's value is no token"
    );
    assert_eq!(b.dead_len("mail.dead").await.unwrap(), 3);
    let r = post_purge(&mut web, &token).await;
    assert!(r.body.contains(r#"data-purged="3""#), "{}", r.body);
}

#[tokio::test]
async fn over_tls_the_cookies_are_host_prefixed() {
    let (_, router) = seeded(|d| d).await;
    let app = Router::new().nest("/jobs", router);
    let mut web = Web::new(app).header("x-forwarded-proto", "https");
    let r = web.get("/jobs/dead").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let set = r.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(set.starts_with("__Host-sdj_csrf="), "{set}");
    assert!(set.contains("; Secure") && set.contains("Path=/;"), "{set}");
    // The unprefixed cookie (which a sibling subdomain can set) is not read over TLS.
    let planted = "cd".repeat(32);
    let mut web = Web::new(Router::new().nest("/jobs", seeded(|d| d).await.1))
        .header("x-forwarded-proto", "https");
    web.cookies.insert("sdj_csrf".into(), planted.clone());
    let page = web
        .get("/jobs/dead/confirm?dl=mail.dead&action=purge&all=1")
        .await;
    assert!(
        page.headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .starts_with("__Host-sdj_csrf="),
        "a __Host- cookie is set next to the planted one"
    );
}

#[tokio::test]
async fn the_csrf_token_is_bound_to_the_session() {
    let (b, router) = seeded(|d| d.auth(Auth::Token("s3cret-token".into()))).await;
    let mut web = Web::new(router);
    let page = web.get("/login").await;
    let before = form_token(&page.body);
    let r = web
        .post("/login", &[("token", "s3cret-token"), ("csrf", &before)])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let page = web
        .get("/dead/confirm?dl=mail.dead&action=purge&all=1")
        .await;
    let after = form_token(&page.body);
    assert_ne!(before, after, "signing in changes the token");
    let r = post_purge(&mut web, &before).await;
    assert_eq!(
        r.status,
        StatusCode::FORBIDDEN,
        "the signed-out token: {}",
        r.body
    );
    assert_eq!(b.dead_len("mail.dead").await.unwrap(), 3);
    let r = post_purge(&mut web, &after).await;
    assert!(r.body.contains(r#"data-purged="3""#), "{}", r.body);
}

// ---------------------------------------------------------------------------------------------
// 3. Guessing the token.
// ---------------------------------------------------------------------------------------------

fn client(n: u32) -> SocketAddr {
    SocketAddr::from((n.to_be_bytes(), 40_000))
}

#[tokio::test]
async fn guesses_are_throttled_per_client_and_in_total() {
    let (_, router) = seeded(|d| d.auth(Auth::Token("s3cret-token".into()))).await;
    let mut guesser = Web::new(router.clone());
    guesser.client = Some(client(0x0a00_0001));
    for n in 0..5 {
        guesser.headers = vec![("authorization", format!("Bearer guess-{n}"))];
        assert_eq!(
            guesser.get("/").await.status,
            StatusCode::UNAUTHORIZED,
            "guess {n}"
        );
    }
    // The sixth attempt is refused unheard, even with the right token.
    guesser.headers = vec![("authorization", "Bearer s3cret-token".to_owned())];
    let r = guesser.get("/").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.body);
    let retry: u64 = r.headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    // The sign-in form counts the same.
    guesser.headers.clear();
    let page = guesser.get("/login").await;
    let token = form_token(&page.body);
    let r = guesser
        .post("/login", &[("token", "s3cret-token"), ("csrf", &token)])
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.body);
    // Another client is not held up by this one.
    let mut other = Web::new(router.clone()).header("authorization", "Bearer s3cret-token");
    other.client = Some(client(0x0a00_0002));
    assert_eq!(other.get("/").await.status, StatusCode::OK);

    // In total: 50 failures a minute, spread over clients, stop every guess.
    let (_, router) = seeded(|d| d.auth(Auth::Token("s3cret-token".into()))).await;
    for n in 0..50 {
        let mut w = Web::new(router.clone()).header("authorization", "Bearer wrong");
        w.client = Some(client(0x0b00_0000 + n));
        assert_eq!(
            w.get("/").await.status,
            StatusCode::UNAUTHORIZED,
            "client {n}"
        );
    }
    let mut w = Web::new(router.clone()).header("authorization", "Bearer wrong");
    w.client = Some(client(0x0c00_0000));
    let r = w.get("/").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.body);
    assert!(r.headers.contains_key(header::RETRY_AFTER));
}

// ---------------------------------------------------------------------------------------------
// 4. The cost of a request.
// ---------------------------------------------------------------------------------------------

/// A memory broker that counts the calls the dashboard makes, and can answer slowly.
#[derive(Clone, Default)]
struct Counting {
    inner: MemoryBroker,
    queues: Arc<AtomicUsize>,
    stats: Arc<AtomicUsize>,
    letters: Arc<AtomicUsize>,
    delay: Duration,
}

impl Counting {
    async fn slow(&self) {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
    }
}

impl Inspect for Counting {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn connect(&self) -> Result<(), BrokerError> {
        self.inner.connect().await
    }
    async fn stats(&self, queue: &str) -> Result<QueueStats, BrokerError> {
        self.stats.fetch_add(1, Ordering::SeqCst);
        self.inner.stats(queue).await
    }
    async fn queues(&self) -> Result<Vec<String>, BrokerError> {
        self.queues.fetch_add(1, Ordering::SeqCst);
        self.inner.queues().await
    }
}

impl DeadLetters for Counting {
    async fn dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        self.letters.fetch_add(1, Ordering::SeqCst);
        self.slow().await;
        self.inner.dead_letters(dead, selector, limit).await
    }
    async fn replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<ReplayReport, BrokerError> {
        self.slow().await;
        self.inner.replay(dead, selector).await
    }
    async fn purge(&self, dead: &str, selector: &DeadSelector) -> Result<u64, BrokerError> {
        self.slow().await;
        self.inner.purge(dead, selector).await
    }
    async fn dead_len(&self, dead: &str) -> Result<u64, BrokerError> {
        self.inner.dead_len(dead).await
    }
    async fn check_dead_letter(&self, name: &str) -> Result<(), BrokerError> {
        self.inner.check_dead_letter(name).await
    }
    fn default_dead_letter(&self, queue: &str) -> String {
        self.inner.default_dead_letter(queue)
    }
}

/// Records (a flow, a job's result) answer as slowly as the rest.
impl stagedoor_jobs::broker::Records for Counting {
    async fn read_record(
        &self,
        key: &str,
    ) -> Result<Option<stagedoor_jobs::broker::Record>, stagedoor_jobs::BrokerError> {
        self.slow().await;
        self.inner.read_record(key).await
    }
    async fn write_records(
        &self,
        writes: &[stagedoor_jobs::broker::RecordWrite],
    ) -> Result<Option<Vec<u64>>, stagedoor_jobs::BrokerError> {
        self.inner.write_records(writes).await
    }
}

impl Activity for Counting {
    async fn report(
        &self,
        worker: &WorkerReport,
        counts: &[QueueCounts],
        ttl: Duration,
    ) -> Result<(), BrokerError> {
        self.inner.report(worker, counts, ttl).await
    }
    async fn workers(&self) -> Result<Vec<WorkerReport>, BrokerError> {
        self.inner.workers().await
    }
    async fn throughput(
        &self,
        queue: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteCounts>, BrokerError> {
        self.inner.throughput(queue, since).await
    }
    async fn delayed(&self, queue: &str, limit: usize) -> Result<Vec<DelayedJob>, BrokerError> {
        self.inner.delayed(queue, limit).await
    }
}

async fn counting(dead: usize) -> Counting {
    let c = Counting::default();
    seed(&c.inner, dead, &json!({"to": "a@example.com"})).await;
    c
}

#[tokio::test]
async fn a_huge_selection_is_refused_before_any_work() {
    let c = counting(3).await;
    let router = Dashboard::new(c.clone()).router();
    // 1,001 ids (the same one: de-duplicating them first would make it one).
    let ids: Vec<(&str, &str)> = std::iter::repeat_n(("id", "m-0"), 1_001).collect();
    let mut pairs = vec![("dl", "mail.dead"), ("action", "purge")];
    pairs.extend(ids);
    let r = Web::new(router.clone())
        .get(&format!("/dead/confirm?{}", query(&pairs)))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body.contains("At most 1000"), "{}", r.body);
    assert_eq!(c.letters.load(Ordering::SeqCst), 0, "no backend call");

    // A query of 7,000 distinct ids (63 KB, just under the longest URI `http` takes) is
    // refused unread.
    let ids: Vec<String> = (0..7_000).map(|n| format!("id={n:05}")).collect();
    let uri = format!("/dead/confirm?dl=mail.dead&action=purge&{}", ids.join("&"));
    assert!(uri.len() > 60_000 && uri.len() < 65_000, "{}", uri.len());
    let r = Web::new(router.clone()).get(&uri).await;
    assert_eq!(r.status, StatusCode::URI_TOO_LONG, "{}", r.body);
    assert!(r.body.contains("by kind"), "names the fix: {}", r.body);
    // A 400 KB form (40,000 distinct ids) too.
    let ids: Vec<String> = (0..40_000).map(|n| format!("id={n:07}")).collect();
    let body = format!("dl=mail.dead&action=purge&{}", ids.join("&"));
    assert!(body.len() > 400_000);
    let r = Web::new(router.clone())
        .send(
            Request::post("/dead/action")
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from(body))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.body);
    assert_eq!(c.letters.load(Ordering::SeqCst), 0, "no backend call");
    assert_eq!(c.inner.dead_len("mail.dead").await.unwrap(), 3);
}

#[tokio::test]
async fn a_request_stops_at_its_deadline() {
    let mut c = counting(20).await;
    c.delay = Duration::from_millis(100);
    let router = Dashboard::new(c.clone())
        .timeout(Duration::from_millis(450))
        .router();
    let mut pairs = vec![("dl", "mail.dead"), ("action", "purge")];
    let ids: Vec<String> = (0..20).map(|n| format!("m-{n}")).collect();
    pairs.extend(ids.iter().map(|i| ("id", i.as_str())));
    let r = Web::new(router.clone())
        .get(&format!("/dead/confirm?{}", query(&pairs)))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains("deadline") && r.body.contains("0.45s"),
        "the page says it stopped at the request's deadline: {}",
        r.body
    );
    assert!(
        !r.body.contains("data-count"),
        "no count offered: {}",
        r.body
    );
    let calls = c.letters.load(Ordering::SeqCst);
    assert!(calls < 20, "{calls} calls: it went on past the deadline");
}

#[tokio::test]
async fn polling_tabs_share_one_backend_read() {
    let c = counting(3).await;
    c.inner
        .publish_jobs(vec![Job::new("other", &1).unwrap()])
        .await
        .unwrap();
    let router = Dashboard::new(c.clone()).router();
    let mut tabs = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let r = router.clone();
        tabs.spawn(async move { Web::new(r).get("/api/queues").await });
    }
    while let Some(r) = tabs.join_next().await {
        let r = r.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    let page = Web::new(router.clone()).get("/").await;
    assert_eq!(page.status, StatusCode::OK);
    let queues = c.queues.load(Ordering::SeqCst);
    let stats = c.stats.load(Ordering::SeqCst);
    // 11 tabs read at once: one read (two, if the second came over a second later).
    assert!(queues <= 2, "{queues} reads of queues() for 11 tabs");
    assert!(
        stats <= 4,
        "{stats} reads of stats() for 11 tabs of 2 queues"
    );
    // An action's effect shows on the next read, not a second later.
    let mut web = Web::new(router.clone());
    let confirm = web
        .get("/dead/confirm?dl=mail.dead&action=purge&all=1")
        .await;
    let r = post_purge(&mut web, &form_token(&confirm.body)).await;
    assert!(r.body.contains(r#"data-purged="3""#), "{}", r.body);
    let v: serde_json::Value = serde_json::from_str(&web.get("/api/queues").await.body).unwrap();
    let mail = v["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "mail")
        .unwrap();
    assert_eq!(mail["dead_count"], 0, "{v}");
}

#[tokio::test]
async fn a_large_payload_is_shown_bounded_and_downloaded_whole() {
    let b = MemoryBroker::new();
    let big = "x".repeat(200_000);
    seed(&b, 1, &json!({ "blob": big })).await;
    let exact = b
        .dead_letters("mail.dead", &DeadSelector::All, 1)
        .await
        .unwrap()[0]
        .envelope
        .payload()
        .to_vec();
    let mut web = Web::new(Dashboard::new(b.clone()).router());
    let r = web.get("/dead/letter?dl=mail.dead&id=m-0").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.body.len() < 100_000,
        "the page holds {} bytes",
        r.body.len()
    );
    let more = exact.len() - 65_536;
    assert!(
        r.body.contains(&format!("… {more} bytes more")),
        "{}",
        &r.body[r.body.len() - 3_000..]
    );
    assert!(
        r.body.contains("/dead/payload?dl=mail.dead&amp;id="),
        "a download link"
    );
    let d = web.get("/dead/payload?dl=mail.dead&id=m-0").await;
    assert_eq!(d.status, StatusCode::OK);
    assert_eq!(d.headers[header::CONTENT_TYPE], "application/octet-stream");
    let cd = d.headers[header::CONTENT_DISPOSITION].to_str().unwrap();
    assert!(
        cd.starts_with("attachment; filename=") && cd.contains("m-0"),
        "{cd}"
    );
    assert_eq!(d.body.as_bytes(), &exact[..], "the exact bytes");
    let none = web.get("/dead/payload?dl=mail.dead&id=nope").await;
    assert_eq!(none.status, StatusCode::NOT_FOUND);
}

// ---------------------------------------------------------------------------------------------
// 5. Secrets, 6. the mount point.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_sign_in_page_shows_no_title() {
    let title = "ops of redis://:hunter2@secret-db.internal:6379/";
    let (_, router) = seeded(|d| d.title(title).auth(Auth::Token("s3cret-token".into()))).await;
    let mut web = Web::new(router);
    for path in ["/", "/login", "/dead", "/nope"] {
        let r = web.get(path).await;
        assert!(
            !r.body.contains("secret-db") && !r.body.contains("ops of"),
            "{path}: {}",
            r.body
        );
        assert!(!r.body.contains("hunter2"), "{path}");
    }
    let page = web.get("/login").await;
    let token = form_token(&page.body);
    web.post("/login", &[("token", "s3cret-token"), ("csrf", &token)])
        .await;
    let r = web.get("/").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.body
            .contains("ops of redis://:***@secret-db.internal:6379/"),
        "{}",
        r.body
    );
    assert!(!r.body.contains("hunter2"));
}

#[tokio::test]
async fn mounted_at_jobs_the_page_answers_with_a_trailing_slash() {
    let (_, router) = seeded(|d| d).await;
    // `nest_service`, as the docs mount it (axum's `nest` never passes `/jobs/` on).
    let mut web = Web::new(Router::new().nest_service("/jobs", router));
    for path in ["/jobs", "/jobs/", "/jobs/dead"] {
        let r = web.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.body);
        assert!(r.body.contains("mail"), "{path}: {}", r.body);
        assert!(
            r.body.contains(r#"href="/jobs/dead""#),
            "{path}: links keep the mount: {}",
            r.body
        );
    }
}

/// A dead letter's error and traceback naming a URL with its password (a handler that could
/// not connect) show the URL masked on the list, the letter's page and the confirmation.
#[tokio::test]
async fn passwords_in_a_letters_error_are_masked() {
    let b = MemoryBroker::new();
    b.connect().await.unwrap();
    b.publish_jobs(vec![
        Job::new("mail", &1)
            .unwrap()
            .kind("welcome")
            .id(JobId::from_string("m-0")),
    ])
    .await
    .unwrap();
    for d in b
        .claim(
            "mail",
            1,
            Duration::ZERO,
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .unwrap()
    {
        b.settle(
            "mail",
            &d,
            Settlement::DeadLetter {
                target: "mail.dead".into(),
                failure: Failure::new(
                    FailureCause::Error,
                    "cannot send:\nconnect to `smtp://mailer:hunter2@smtp.internal:25/` refused",
                    "at send (postgres://app:hunter2@db/app?sslmode=require)",
                ),
            },
        )
        .await
        .unwrap();
    }
    let mut web = Web::new(Dashboard::new(b).router());
    for path in [
        "/dead?dl=mail.dead",
        "/dead/letter?dl=mail.dead&id=m-0",
        "/dead/confirm?dl=mail.dead&action=purge&all=1",
    ] {
        let r = web.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.body);
        assert!(!r.body.contains("hunter2"), "{path}: {}", r.body);
        assert!(
            r.body.contains("smtp://mailer:***@smtp.internal:25/"),
            "{path}: {}",
            r.body
        );
    }
    let r = web.get("/dead/letter?dl=mail.dead&id=m-0").await;
    assert!(r.body.contains("postgres://app:***@db/app"), "{}", r.body);
}

// ---------------------------------------------------------------------------------------------
// Every backend: the attacks change nothing stored.
// ---------------------------------------------------------------------------------------------

/// Publishes 4 jobs to `mail` and dead-letters them to its default dead letter; its name.
async fn dead_four<B: Broker>(b: &B) -> String {
    b.connect().await.expect("connect");
    b.prepare("mail").await.expect("prepare");
    let jobs: Vec<Job> = (0..4)
        .map(|n| {
            Job::new("mail", &n)
                .unwrap()
                .kind("welcome")
                .id(JobId::from_string(format!("w-{n}")))
        })
        .collect();
    b.publish_jobs(jobs).await.expect("publish");
    let dead = b.default_dead_letter("mail");
    let mut settled = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while settled < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "claimed {settled} of 4"
        );
        for d in b
            .claim(
                "mail",
                4 - settled,
                Duration::from_millis(200),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim")
        {
            b.settle(
                "mail",
                &d,
                Settlement::DeadLetter {
                    target: dead.clone(),
                    failure: Failure::new(FailureCause::Error, "bad", ""),
                },
            )
            .await
            .expect("settle");
            settled += 1;
        }
    }
    assert_eq!(b.dead_len(&dead).await.unwrap(), 4);
    dead
}

async fn attacks_on<B: Broker>(b: B) {
    let dead = dead_four(&b).await;
    let confirm = format!(
        "/dead/confirm?{}",
        query(&[("dl", &dead), ("action", "purge"), ("all", "1")])
    );
    let router = Dashboard::new(b.clone())
        .auth(Auth::Token("s3cret-token".into()))
        .router();
    let purge = [("dl", dead.as_str()), ("action", "purge"), ("all", "1")];
    let signed_in = |host: &str| {
        Web::new(router.clone())
            .header("host", host)
            .header("authorization", "Bearer s3cret-token")
    };

    // A rebound Host: nothing shown, nothing done.
    let mut web = signed_in("attacker.example:8787");
    let r = web.get(&confirm).await;
    assert_eq!(r.status, StatusCode::MISDIRECTED_REQUEST, "{}", r.body);
    assert!(!r.body.contains("name=\"csrf\""), "no token shown");
    let r = web.post("/dead/action", &purge).await;
    assert_eq!(r.status, StatusCode::MISDIRECTED_REQUEST);

    // A cross-site POST with a good token, and a planted cookie echoed in the form.
    let mut web = signed_in("127.0.0.1:8787");
    let token = form_token(&web.get(&confirm).await.body);
    web.headers
        .push(("origin", "http://attacker.example".to_owned()));
    let mut form = purge.to_vec();
    form.push(("csrf", &token));
    assert_eq!(
        web.post("/dead/action", &form).await.status,
        StatusCode::FORBIDDEN
    );
    let mut web = signed_in("127.0.0.1:8787");
    let planted = "ef".repeat(32);
    web.cookies.insert("sdj_csrf".into(), planted.clone());
    let mut form = purge.to_vec();
    form.push(("csrf", &planted));
    assert_eq!(
        web.post("/dead/action", &form).await.status,
        StatusCode::FORBIDDEN
    );

    // Guessing the token: throttled.
    let mut guesser = Web::new(router.clone()).header("authorization", "Bearer guess");
    guesser.client = Some(client(0x0a0a_0a0a));
    for _ in 0..5 {
        assert_eq!(guesser.get("/").await.status, StatusCode::UNAUTHORIZED);
    }
    guesser.headers = vec![("authorization", "Bearer s3cret-token".to_owned())];
    assert_eq!(
        guesser.get(&confirm).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    assert_eq!(
        b.dead_len(&dead).await.unwrap(),
        4,
        "every dead letter is still there"
    );

    // The live queue `mail`, named as a dead letter (a URL the page never links): waiting,
    // delayed and running jobs there, and neither the confirmation nor the action touches
    // them, even with a good token from the page.
    let waiting = b
        .publish_job(
            Job::new("mail", &10)
                .unwrap()
                .id(JobId::from_string("live-1")),
        )
        .await
        .expect("publish");
    assert!(waiting.is_stored());
    b.publish_job(
        Job::new("mail", &11)
            .unwrap()
            .id(JobId::from_string("live-2"))
            .after(Duration::from_secs(3600)),
    )
    .await
    .expect("publish delayed");
    let mut running = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while running.is_empty() {
        assert!(std::time::Instant::now() < deadline, "claimed nothing");
        running = b
            .claim(
                "mail",
                1,
                Duration::from_millis(200),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim")
            .deliveries;
    }
    b.publish_job(
        Job::new("mail", &12)
            .unwrap()
            .id(JobId::from_string("live-3")),
    )
    .await
    .expect("publish");
    let live_before = b.stats("mail").await.expect("stats");
    assert_eq!(
        (live_before.ready, live_before.pending, live_before.delayed),
        (1, 1, 1),
        "{live_before:?}"
    );
    let mut web = signed_in("127.0.0.1:8787").header("origin", "http://127.0.0.1:8787");
    let token = form_token(&web.get(&confirm).await.body);
    let running_id = running[0].envelope.id().to_string();
    for action in ["purge", "replay"] {
        for sel in [
            ("all", "1"),
            ("id", "live-3"),
            ("id", running_id.as_str()),
            ("kind", "mail"),
        ] {
            let pairs = [("dl", "mail"), ("action", action), sel];
            let r = web.get(&format!("/dead/confirm?{}", query(&pairs))).await;
            assert_eq!(
                r.status,
                StatusCode::BAD_REQUEST,
                "{action} {sel:?}: {}",
                r.body
            );
            assert!(
                r.body.contains("Not a dead letter")
                    && (r.body.contains("mail.dead") || r.body.contains("mail:dead")),
                "the refusal names the queue's dead letter: {}",
                r.body
            );
            assert!(!r.body.contains("name=\"csrf\""), "no form to go on");
            let mut form = pairs.to_vec();
            form.push(("csrf", &token));
            let r = web.post("/dead/action", &form).await;
            assert_eq!(
                r.status,
                StatusCode::BAD_REQUEST,
                "{action} {sel:?}: {}",
                r.body
            );
        }
    }
    let live_after = b.stats("mail").await.expect("stats");
    assert_eq!(
        (live_after.ready, live_after.pending, live_after.delayed),
        (1, 1, 1),
        "nothing of the live queue moved: {live_after:?}"
    );
    assert_eq!(
        b.settle("mail", &running[0], Settlement::Ack)
            .await
            .expect("settle"),
        stagedoor_jobs::broker::Settled::Done,
        "the running job settles as usual"
    );

    // The operator's own purge, from the page, same origin.
    let token = form_token(&web.get(&confirm).await.body);
    let mut form = purge.to_vec();
    form.push(("csrf", &token));
    let r = web.post("/dead/action", &form).await;
    assert!(r.body.contains(r#"data-purged="4""#), "{}", r.body);
    assert_eq!(b.dead_len(&dead).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacks_leave_every_backend_untouched_memory() {
    attacks_on(MemoryBroker::new()).await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacks_leave_every_backend_untouched_redis() {
    let url = common_redis::env_url("REDIS_URL");
    let b = stagedoor_jobs_redis::RedisBroker::from_url(url)
        .namespace(common_redis::fresh_namespace("dashatk"));
    attacks_on(b).await;
}

async fn attacks_leave_every_backend_untouched<D: common::Db>() {
    let db = D::fresh("dashatk", common::conf_ddl::<D>()).await;
    let route = D::route::<common::ConfRow>(&db.broker(), "mail");
    attacks_on(route).await;
}

common::on_both!(attacks_leave_every_backend_untouched);

/// A dead letter named otherwise (`mail.dlq`) is one when a live worker's mount declares it,
/// as its report says: the page confirms and purges it; `mail` stays refused.
#[tokio::test]
async fn a_dead_letter_a_worker_declares_is_one() {
    use stagedoor_jobs::activity::WorkerQueue;
    let b = MemoryBroker::new();
    b.connect().await.unwrap();
    b.publish_jobs((0..2).map(|n| Job::new("mail.dlq", &n).unwrap()))
        .await
        .unwrap();
    for d in b
        .claim(
            "mail.dlq",
            2,
            Duration::ZERO,
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .unwrap()
    {
        b.settle(
            "mail.dlq",
            &d,
            Settlement::DeadLetter {
                target: "mail.dlq".into(),
                failure: Failure::new(FailureCause::Error, "bad", ""),
            },
        )
        .await
        .unwrap();
    }
    assert_eq!(b.dead_len("mail.dlq").await.unwrap(), 2);
    let router = Dashboard::new(b.clone()).router();
    let confirm = format!(
        "/dead/confirm?{}",
        query(&[("dl", "mail.dlq"), ("action", "purge"), ("all", "1")])
    );
    let mut web = Web::new(router.clone()).header("host", "127.0.0.1:8787");
    let r = web.get(&confirm).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "undeclared: {}", r.body);

    let now = Utc::now();
    let mut worker = WorkerReport::new("w-1", "host", 1, now, now);
    let mut q = WorkerQueue::new("mail", 1, 0);
    q.dead_letters.push("mail.dlq".into());
    worker.queues.push(q);
    b.report(&worker, &[], Duration::from_secs(60))
        .await
        .unwrap();
    let r = web.get(&confirm).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "declared by a live worker: {}",
        r.body
    );
    let token = form_token(&r.body);
    let r = web
        .header("origin", "http://127.0.0.1:8787")
        .post(
            "/dead/action",
            &[
                ("dl", "mail.dlq"),
                ("action", "purge"),
                ("all", "1"),
                ("csrf", &token),
            ],
        )
        .await;
    assert!(r.body.contains(r#"data-purged="2""#), "{}", r.body);
    let r = Web::new(router)
        .header("host", "127.0.0.1:8787")
        .get(&format!(
            "/dead/confirm?{}",
            query(&[("dl", "mail"), ("action", "purge"), ("all", "1")])
        ))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
}
