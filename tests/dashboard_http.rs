//! The dashboard over HTTP (its axum Router driven with `tower::ServiceExt::oneshot`): every
//! route on the memory broker, SQLite, Postgres and Redis (real servers), with the counts the
//! backend holds, the actions' effects on the backend, and the refusals (CSRF, auth,
//! read-only); plus what is the same on every backend (sign-in, basic auth, mounting under a
//! prefix, escaping, masked passwords, the standalone server's refusal) on memory.
//!
//! The seed on each backend: queue `mail` with 5 ready and 2 delayed jobs; 43 jobs of queue
//! `billing` dead-lettered (40 `invoice`, 3 `refund`), the first invoice's payload holding a
//! `<script>`. A missing `REDIS_URL` or `DATABASE_URL` fails the test under `scripts/test-all`; a
//! plain `cargo test` without it lists the test as ignored.

mod common;
mod common_dashboard;
#[allow(dead_code)]
mod common_redis;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use chrono::Utc;
use common::{ConfRow, Db, conf_ddl};
use common_dashboard::{Web, enc};
use serde_json::{Value, json};
use stagedoor_jobs::activity::{
    MinuteCounts, QueueCounts, REPORT_TTL, ScheduleReport, WorkerQueue, WorkerReport,
};
use stagedoor_jobs::broker::Settlement;
use stagedoor_jobs::{
    Activity, Broker, DeadLetters, Failure, FailureCause, Inspect, Job, JobId, MemoryBroker,
    Publish,
};
use stagedoor_jobs_dashboard::{Auth, Dashboard, ServeError};

const SCRIPT: &str = "<script>alert('pwned')</script>";

/// The text of the first `data-field="<field>"` element after `anchor` (tags inside skipped).
#[track_caller]
fn cell(body: &str, anchor: &str, field: &str) -> String {
    let start = body
        .find(anchor)
        .unwrap_or_else(|| panic!("no `{anchor}` in:\n{body}"));
    let rest = &body[start..];
    let marker = format!("data-field=\"{field}\"");
    let at = rest
        .find(&marker)
        .unwrap_or_else(|| panic!("no {marker} after `{anchor}` in:\n{body}"));
    let mut rest = &rest[at..];
    loop {
        let gt = rest.find('>').expect("a tag ends");
        rest = &rest[gt + 1..];
        let lt = rest.find('<').unwrap_or(rest.len());
        let text = rest[..lt].trim();
        if !text.is_empty() {
            return text.to_owned();
        }
        rest = &rest[lt..];
    }
}

/// The JSON row of `queue` in `api/queues`.
#[track_caller]
fn queue_json(v: &Value, queue: &str) -> Value {
    v["queues"]
        .as_array()
        .expect("a list of queues")
        .iter()
        .find(|q| q["queue"] == queue)
        .cloned()
        .unwrap_or_else(|| panic!("no queue `{queue}` in {v}"))
}

/// Puts the seed in `b` (see the module docs).
async fn seed<B: Broker>(b: &B) {
    b.connect().await.expect("connect");
    for q in ["mail", "billing"] {
        b.prepare(q).await.expect("prepare");
    }
    let mut mail = Vec::new();
    for n in 0..5 {
        mail.push(
            Job::new("mail", &json!({ "n": n }))
                .unwrap()
                .kind("welcome")
                .id(JobId::from_string(format!("wel-{n}"))),
        );
    }
    for n in 0..2 {
        mail.push(
            Job::new("mail", &json!({ "later": n }))
                .unwrap()
                .kind("reminder")
                .id(JobId::from_string(format!("rem-{n}")))
                .after(Duration::from_secs(3_600)),
        );
    }
    b.publish_jobs(mail).await.expect("publish mail");
    let mut billing = Vec::new();
    for n in 0..43 {
        let (kind, id) = if n < 40 {
            ("invoice", format!("inv-{n}"))
        } else {
            ("refund", format!("ref-{}", n - 40))
        };
        let note = if n == 0 { SCRIPT } else { "ok" };
        billing.push(
            Job::new("billing", &json!({ "n": n, "note": note }))
                .unwrap()
                .kind(kind)
                .id(JobId::from_string(id))
                .request_id(format!("req-{n}"))
                .trace("trace-abc"),
        );
    }
    b.publish_jobs(billing).await.expect("publish billing");
    let dead = b.default_dead_letter("billing");
    let mut settled = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while settled < 43 {
        assert!(
            std::time::Instant::now() < deadline,
            "claimed only {settled} of 43"
        );
        let got = b
            .claim(
                "billing",
                43 - settled,
                Duration::from_millis(200),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim");
        for d in &got {
            let failure = Failure::new(
                FailureCause::Error,
                format!("boom-{} {}", d.envelope.kind(), d.envelope.id()),
                "at billing.rs:1",
            );
            b.settle(
                "billing",
                d,
                Settlement::DeadLetter {
                    target: dead.clone(),
                    failure,
                },
            )
            .await
            .expect("settle");
        }
        settled += got.len();
    }
    assert_eq!(
        b.dead_len(&dead).await.unwrap(),
        43,
        "the seed's dead letters"
    );
}

/// A worker report with one schedule, and per-minute counts of `mail`.
async fn report<B: Activity>(b: &B) {
    let now = Utc::now();
    let mut w = WorkerReport::new(
        "w-test-1",
        "host-dash",
        4242,
        now - chrono::Duration::minutes(5),
        now,
    );
    w.app = "billing-service 1.2".to_owned();
    w.queues.push(WorkerQueue::new("mail", 8, 3));
    let mut s = ScheduleReport::new("nightly-report", "mail", "0 3 * * * UTC", "run once");
    s.last_tick = Some(now - chrono::Duration::hours(2));
    s.next_tick = Some(now + chrono::Duration::hours(3));
    w.schedules.push(s);
    let counts = [QueueCounts::new(
        "mail",
        vec![MinuteCounts::new(now, 7, 2, 1)],
    )];
    b.report(&w, &counts, REPORT_TTL).await.expect("report");
}

/// Every route on backend `b` (seeded here, with a worker's report and per-minute counts).
async fn every_route<B: Broker>(b: B) {
    seed(&b).await;
    report(&b).await;
    let dl = b.default_dead_letter("billing");
    let mut web = Web::new(Dashboard::new(b.clone()).title("ops").router());

    // Queues: the counts the backend holds.
    let r = web.get("/").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(cell(&r.body, r#"data-queue="mail""#, "ready"), "5");
    assert_eq!(cell(&r.body, r#"data-queue="mail""#, "running"), "0");
    assert_eq!(cell(&r.body, r#"data-queue="mail""#, "delayed"), "2");
    assert_eq!(cell(&r.body, r#"data-queue="billing""#, "dead"), "43");
    assert!(r.body.contains("<svg"), "the chart");
    assert!(
        r.body.contains("7 processed, 2 failed, 1 dead-lettered"),
        "the chart's totals: {}",
        r.body
    );
    let j = web.get("/api/queues").await;
    assert_eq!(j.status, StatusCode::OK);
    let v = j.json();
    let mail = queue_json(&v, "mail");
    assert_eq!(mail["ready_count"], 5, "{v}");
    assert_eq!(mail["delayed_count"], 2, "{v}");
    assert_eq!(queue_json(&v, "billing")["dead_count"], 43, "{v}");
    assert!(v["chart"].as_str().unwrap().starts_with("<svg"), "{v}");

    // Dead letters: the list of dead letters, then this one's jobs.
    let r = web.get("/dead").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        cell(&r.body, &format!("data-dead=\"{dl}\""), "dead"),
        "43",
        "{}",
        r.body
    );
    let list = format!("/dead?dl={}", enc(&dl));
    let r = web.get(&list).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(cell(&r.body, "summary", "total"), "43");
    assert_eq!(r.count("<tr data-id="), 43, "{}", r.body);
    assert!(r.body.contains(r#"data-kind="invoice""#));
    assert!(r.body.contains("Replay selected"));
    assert!(!r.body.contains("<script>alert"), "escaped");
    let r = web.get(&format!("{list}&kind=refund")).await;
    assert_eq!(r.count("<tr data-id="), 3, "{}", r.body);
    let r = web.get(&format!("{list}&q=BOOM-REFUND")).await;
    assert_eq!(r.count("<tr data-id="), 3, "filter by error text");
    let r = web.get(&format!("{list}&q=no-such-error")).await;
    assert_eq!(r.count("<tr data-id="), 0);

    // One dead letter: every field, the payload escaped.
    let r = web
        .get(&format!("/dead/letter?dl={}&id=inv-0", enc(&dl)))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(!r.body.contains("<script>alert"), "{}", r.body);
    assert!(r.body.contains("&lt;script&gt;alert"), "{}", r.body);
    assert_eq!(cell(&r.body, "fields", "kind"), "invoice");
    assert_eq!(cell(&r.body, "fields", "request-id"), "req-0");
    assert_eq!(cell(&r.body, "fields", "trace"), "trace-abc");
    assert_eq!(cell(&r.body, "fields", "attempts"), "1");
    assert!(r.body.contains("boom-invoice inv-0"));
    assert!(r.body.contains("at billing.rs:1"), "the traceback");
    assert!(r.body.contains("&quot;note&quot;") || r.body.contains("\"note\""));
    let r = web
        .get(&format!("/dead/letter?dl={}&id=nope", enc(&dl)))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // Its payload's exact bytes, as a file.
    let stored = b
        .dead_letters(&dl, &stagedoor_jobs::DeadSelector::Id("inv-0".into()), 1)
        .await
        .unwrap();
    let r = web
        .get(&format!("/dead/payload?dl={}&id=inv-0", enc(&dl)))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.headers[header::CONTENT_TYPE], "application/octet-stream");
    assert!(
        r.headers[header::CONTENT_DISPOSITION]
            .to_str()
            .unwrap()
            .starts_with("attachment; filename=\"inv-0"),
        "{:?}",
        r.headers
    );
    assert_eq!(
        r.body.as_bytes(),
        stored[0].envelope.payload(),
        "the exact bytes"
    );

    // Replay a kind: the confirmation counts, a POST without the CSRF token is refused, the
    // POST with it moves exactly the 40 invoices.
    let r = web
        .get(&format!(
            "/dead/confirm?dl={}&action=replay&kind=invoice",
            enc(&dl)
        ))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains(r#"data-count="40""#), "{}", r.body);
    assert!(r.body.contains("This will move 40 jobs"));
    let form = [
        ("dl", dl.as_str()),
        ("action", "replay"),
        ("kind", "invoice"),
    ];
    let r = web.post("/dead/action", &form).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "no CSRF token");
    let mut wrong = form.to_vec();
    let forged = "0".repeat(64);
    wrong.push(("csrf", &forged));
    let r = web.post("/dead/action", &wrong).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "a wrong CSRF token");
    assert_eq!(b.dead_len(&dl).await.unwrap(), 43, "nothing moved");
    let csrf = web.csrf();
    let mut good = form.to_vec();
    good.push(("csrf", &csrf));
    let r = web.post("/dead/action", &good).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains(r#"data-replayed="40""#), "{}", r.body);
    assert_eq!(b.dead_len(&dl).await.unwrap(), 3, "40 moved, 3 stay");
    assert_eq!(b.stats("billing").await.unwrap().ready, 40);
    let left = web.get(&list).await;
    assert_eq!(left.count("<tr data-id="), 3);
    assert!(!left.body.contains(r#"data-kind="invoice""#));

    // Replay the selected (one refund by its job id).
    let r = web
        .get(&format!(
            "/dead/confirm?dl={}&action=replay&id=ref-1",
            enc(&dl)
        ))
        .await;
    assert!(r.body.contains(r#"data-count="1""#), "{}", r.body);
    let r = web
        .post(
            "/dead/action",
            &[
                ("dl", dl.as_str()),
                ("action", "replay"),
                ("id", "ref-1"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert!(r.body.contains(r#"data-replayed="1""#), "{}", r.body);
    assert_eq!(b.dead_len(&dl).await.unwrap(), 2);

    // Purge all: the confirmation says 2, the POST deletes them.
    let r = web
        .get(&format!("/dead/confirm?dl={}&action=purge&all=1", enc(&dl)))
        .await;
    assert!(r.body.contains(r#"data-count="2""#), "{}", r.body);
    let r = web
        .post(
            "/dead/action",
            &[
                ("dl", dl.as_str()),
                ("action", "purge"),
                ("all", "1"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert!(r.body.contains(r#"data-purged="2""#), "{}", r.body);
    assert_eq!(b.dead_len(&dl).await.unwrap(), 0);
    assert_eq!(
        b.stats("billing").await.unwrap().ready,
        41,
        "purged, not moved"
    );

    // Scheduled: the schedule the worker reports, and the delayed jobs.
    let r = web.get("/scheduled").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let w = web.get("/workers").await;
    assert_eq!(w.status, StatusCode::OK, "{}", w.body);
    let wj = web.get("/api/workers").await;
    assert_eq!(wj.status, StatusCode::OK);
    assert!(
        r.body.contains(r#"data-schedule="nightly-report""#),
        "{}",
        r.body
    );
    assert!(r.body.contains("run once"));
    assert_eq!(r.count(r#"<tr data-id="rem-"#), 2, "{}", r.body);
    assert!(w.body.contains("host-dash"), "{}", w.body);
    assert_eq!(cell(&w.body, "data-worker=\"w-test-1\"", "pid"), "4242");
    assert_eq!(cell(&w.body, "data-worker=\"w-test-1\"", "in_flight"), "3");
    assert!(w.body.contains("mail (3/8)"));
    let v = wj.json();
    assert_eq!(v["workers"][0]["host"], "host-dash", "{v}");
    assert_eq!(v["workers"][0]["pid"], 4242, "{v}");

    // The assets.
    let css = web.get("/assets/style.css").await;
    assert_eq!(css.status, StatusCode::OK);
    assert!(
        css.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/css")
    );
    let js = web.get("/assets/live.js").await;
    assert!(js.body.contains("/api/"), "the script polls the JSON");
    let r = web.get("/nope").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_on_memory() {
    every_route(MemoryBroker::new()).await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_on_redis() {
    let url = common_redis::env_url("REDIS_URL");
    let b = stagedoor_jobs_redis::RedisBroker::from_url(url)
        .namespace(common_redis::fresh_namespace("dash"));
    every_route(b).await;
}

async fn every_route_sql<D: Db>() {
    let db = D::fresh("dash", conf_ddl::<D>()).await;
    let route = D::route::<ConfRow>(&db.broker(), "billing");
    every_route(route).await;
}

common::on_both!(every_route_sql);

/// The seed on memory, and a dashboard of it.
async fn seeded(
    d: impl FnOnce(Dashboard<MemoryBroker>) -> Dashboard<MemoryBroker>,
) -> (MemoryBroker, Web) {
    let b = MemoryBroker::new();
    seed(&b).await;
    let web = Web::new(d(Dashboard::new(b.clone())).router());
    (b, web)
}

#[tokio::test]
async fn read_only_shows_no_actions_and_refuses_them() {
    let (b, mut web) = seeded(|d| d.read_only(true)).await;
    let r = web.get("/dead?dl=billing.dead").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.count("<tr data-id="), 43, "the list is there");
    for action in [
        "Replay selected",
        "Purge selected",
        "Replay kind",
        "Replay all",
        "/dead/confirm",
    ] {
        assert!(!r.body.contains(action), "read-only shows no `{action}`");
    }
    let letter = web.get("/dead/letter?dl=billing.dead&id=inv-3").await;
    assert!(!letter.body.contains("/dead/confirm"), "{}", letter.body);
    assert!(letter.body.contains("read-only"));
    let r = web
        .get("/dead/confirm?dl=billing.dead&action=replay&all=1")
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // No page of a read-only dashboard has a form; read-only is refused before the token is
    // looked at.
    let csrf = "0".repeat(64);
    let r = web
        .post(
            "/dead/action",
            &[
                ("dl", "billing.dead"),
                ("action", "replay"),
                ("all", "1"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.body.contains("read-only"));
    let r = web
        .post(
            "/dead/action",
            &[
                ("dl", "billing.dead"),
                ("action", "purge"),
                ("all", "1"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        b.dead_len("billing.dead").await.unwrap(),
        43,
        "nothing moved"
    );
}

#[tokio::test]
async fn a_token_is_required_as_bearer_or_by_signing_in() {
    let (_, mut web) = seeded(|d| d.auth(Auth::Token("s3cret-token".into()))).await;
    for path in [
        "/",
        "/dead",
        "/dead?dl=billing.dead",
        "/scheduled",
        "/workers",
    ] {
        let r = web.get(path).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path}");
        assert!(
            !r.body.contains("billing"),
            "{path} shows nothing: {}",
            r.body
        );
        assert!(r.body.contains("name=\"token\""), "the sign-in form");
    }
    let r = web.get("/api/queues").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.json()["error"].as_str().unwrap().contains("Bearer"));
    // An action without credentials is refused before anything else.
    let csrf = web.csrf();
    let r = web
        .post(
            "/dead/action",
            &[
                ("dl", "billing.dead"),
                ("action", "purge"),
                ("all", "1"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);

    // Bearer.
    web.authorization = Some("Bearer wrong".into());
    assert_eq!(web.get("/").await.status, StatusCode::UNAUTHORIZED);
    web.authorization = Some("Bearer s3cret-token".into());
    let r = web.get("/").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains(r#"data-queue="mail""#));
    web.authorization = None;

    // The sign-in form: the CSRF token is required, a wrong token is refused, the right one
    // sets a session cookie.
    let r = web.get("/login").await;
    assert_eq!(r.status, StatusCode::OK);
    let r = web.post("/login", &[("token", "s3cret-token")]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "no CSRF token");
    let csrf = web.csrf();
    let r = web
        .post("/login", &[("token", "nope"), ("csrf", &csrf)])
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(!web.cookies.contains_key("sdj_session"));
    let r = web
        .post("/login", &[("token", "s3cret-token"), ("csrf", &csrf)])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let cookie = r
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|c| c.starts_with("sdj_session="))
        .expect("a session cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let r = web.get("/").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains("Sign out"));
    // Signing out ends the session (its form's token is bound to the session).
    let csrf = web.csrf();
    let r = web.post("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(web.get("/").await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn basic_auth_asks_the_browser() {
    let (_, mut web) = seeded(|d| {
        d.auth(Auth::Basic {
            user: "ops".into(),
            password: "pa55".into(),
        })
    })
    .await;
    let r = web.get("/").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(
        r.headers[header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
            .starts_with("Basic realm="),
        "{:?}",
        r.headers
    );
    // base64 of `ops:wrong`, then of `ops:pa55`.
    web.authorization = Some("Basic b3BzOndyb25n".into());
    assert_eq!(web.get("/").await.status, StatusCode::UNAUTHORIZED);
    web.authorization = Some("Basic b3BzOnBhNTU=".into());
    let r = web.get("/").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(cell(&r.body, r#"data-queue="mail""#, "ready"), "5");
}

#[tokio::test]
async fn links_work_nested_under_a_prefix() {
    let b = MemoryBroker::new();
    seed(&b).await;
    let app = Router::new().nest("/jobs", Dashboard::new(b.clone()).router());
    let mut web = Web::new(app);
    let r = web.get("/jobs").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(
        r.body.contains(r#"href="/jobs/assets/style.css""#),
        "{}",
        r.body
    );
    assert!(r.body.contains(r#"src="/jobs/assets/live.js""#));
    assert!(r.body.contains(r#"href="/jobs/dead""#));
    assert!(r.body.contains(r#"href="/jobs/dead?dl=billing.dead""#));
    assert!(r.body.contains(r#"data-base="/jobs""#), "the script's base");
    let set = r.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(set.contains("Path=/jobs"), "{set}");
    let r = web.get("/jobs/dead?dl=billing.dead").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body.contains(r#"action="/jobs/dead/confirm""#));
    let r = web
        .get("/jobs/dead/confirm?dl=billing.dead&action=purge&kind=refund")
        .await;
    assert!(
        r.body.contains(r#"action="/jobs/dead/action""#),
        "{}",
        r.body
    );
    let csrf = web.csrf();
    let r = web
        .post(
            "/jobs/dead/action",
            &[
                ("dl", "billing.dead"),
                ("action", "purge"),
                ("kind", "refund"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert!(r.body.contains(r#"data-purged="3""#), "{}", r.body);
    assert_eq!(b.dead_len("billing.dead").await.unwrap(), 40);
    assert_eq!(
        web.get("/jobs/assets/style.css").await.status,
        StatusCode::OK
    );
    // At the root, the same links have no prefix.
    let mut root = Web::new(Dashboard::new(b).router());
    let r = root.get("/").await;
    assert!(r.body.contains(r#"href="/assets/style.css""#));
    assert!(r.body.contains(r#"href="/dead""#));
}

#[tokio::test]
async fn pages_carry_security_headers_and_paging_works() {
    let b = MemoryBroker::new();
    b.connect().await.unwrap();
    let jobs: Vec<Job> = (0..120)
        .map(|n| {
            Job::new("q", &n)
                .unwrap()
                .kind(if n % 2 == 0 { "even" } else { "odd" })
                .id(JobId::from_string(format!("j{n:03}")))
        })
        .collect();
    b.publish_jobs(jobs).await.unwrap();
    let got = b
        .claim(
            "q",
            120,
            Duration::ZERO,
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .unwrap();
    for d in &got {
        b.settle(
            "q",
            d,
            Settlement::DeadLetter {
                target: "q.dead".into(),
                failure: Failure::new(FailureCause::Error, "bad", ""),
            },
        )
        .await
        .unwrap();
    }
    let mut web = Web::new(Dashboard::new(b).router());
    let r = web.get("/dead?dl=q.dead").await;
    let csp = r.headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(r.headers[header::X_FRAME_OPTIONS], "DENY");
    let set = r.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    let behind_tls = Web::new(web.router.clone())
        .send(
            Request::get("/workers")
                .header("x-forwarded-proto", "https")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(behind_tls.status, StatusCode::OK);
    let set = behind_tls.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(set.contains("; Secure"), "behind a TLS proxy: {set}");
    assert_eq!(r.count("<tr data-id="), 50, "a page holds 50");
    assert!(r.body.contains("page 1 of 3"));
    let r = web.get("/dead?dl=q.dead&page=3").await;
    assert_eq!(r.count("<tr data-id="), 20);
    let r = web.get("/dead?dl=q.dead&kind=odd&page=2").await;
    assert_eq!(
        r.count("<tr data-id="),
        10,
        "60 odd: the second page holds 10"
    );
    assert!(r.body.contains("page 2 of 2"));
    assert!(
        r.body.contains("kind=odd&amp;page=1"),
        "paging keeps the filter"
    );
}

#[tokio::test]
async fn passwords_are_masked_and_backend_errors_shown() {
    // A Redis server that is not there, its URL holding a password: every page answers, shows
    // the error, and never the password.
    let b = stagedoor_jobs_redis::RedisBroker::from_url("redis://:hunter2@127.0.0.1:1/");
    let mut web = Web::new(
        Dashboard::new(b)
            .title("ops of redis://:hunter2@127.0.0.1:1/")
            .timeout(Duration::from_secs(2))
            .router(),
    );
    for path in [
        "/",
        "/api/queues",
        "/dead",
        "/dead?dl=x:dead",
        "/dead/letter?dl=x:dead&id=1",
        "/dead/confirm?dl=x:dead&action=replay&all=1",
        "/scheduled",
        "/workers",
        "/api/workers",
    ] {
        let r = web.get(path).await;
        assert!(
            r.status == StatusCode::OK,
            "{path}: {} {}",
            r.status,
            r.body
        );
        assert!(!r.body.contains("hunter2"), "{path}: {}", r.body);
        assert!(
            r.body.contains("class=\"error\"") || r.body.contains("\"error\":\""),
            "{path} shows the error: {}",
            r.body
        );
    }
    let r = web.get("/").await;
    assert!(
        r.body.contains("redis://:***@127.0.0.1:1/"),
        "the title, masked"
    );
}

/// A title holding a URL whose password is in its query (`?password=`, `sslpassword`, any
/// case) shows it masked on every page.
#[tokio::test]
async fn a_query_password_in_the_title_is_masked() {
    let mut web = Web::new(
        Dashboard::new(MemoryBroker::new())
            .title(
                "ops of postgres://app@db:5432/app?sslmode=require&PASSWORD=hunter2&sslpassword=hunter2",
            )
            .router(),
    );
    for path in ["/", "/dead", "/scheduled", "/workers"] {
        let r = web.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.body);
        assert!(!r.body.contains("hunter2"), "{path}: {}", r.body);
        assert!(
            r.body.contains(
                "postgres://app@db:5432/app?sslmode=require&amp;PASSWORD=***&amp;sslpassword=***"
            ),
            "{path}: the title, masked: {}",
            r.body
        );
    }
}

#[tokio::test]
async fn the_standalone_server_refuses_open_addresses_without_auth() {
    let b = MemoryBroker::new();
    let e = stagedoor_jobs_dashboard::bind(Dashboard::new(b.clone()), "0.0.0.0:0")
        .await
        .unwrap_err();
    assert!(matches!(e, ServeError::NoAuth(_)), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("--auth-token-env") && msg.contains("127.0.0.1"),
        "{msg}"
    );
    let open = stagedoor_jobs_dashboard::bind(
        Dashboard::new(b.clone()).auth(Auth::Token("t".into())),
        "0.0.0.0:0",
    )
    .await
    .expect("with auth, any address");
    drop(open);
    let e = stagedoor_jobs_dashboard::bind(
        Dashboard::new(b.clone()).auth(Auth::Token(String::new())),
        "127.0.0.1:0",
    )
    .await
    .unwrap_err();
    assert!(matches!(e, ServeError::EmptySecret), "{e:?}");
    let server = stagedoor_jobs_dashboard::bind(Dashboard::new(b), "127.0.0.1:0")
        .await
        .expect("loopback without auth");
    let addr = server.local_addr();
    assert!(addr.ip().is_loopback() && addr.port() != 0);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(server.run_until(async {
        let _ = stopped.await;
    }));
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // The Host a browser sends (any other name is refused: DNS rebinding).
    s.write_all(
        format!("GET /workers HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let _ = stop.send(());
    run.await.unwrap().unwrap();
}
