//! The dashboard's parsing of what a browser (or anyone reaching it) sends: paths, query
//! strings (`dl`, `id`, `kind`, `q`, `page`, selections), forms (CSRF tokens, actions, the
//! sign-in token), cookies and `Authorization` headers, through its axum `Router` with
//! `tower::ServiceExt::oneshot`.
//!
//! The backend is the in-memory broker, seeded afresh for each input: what is fuzzed is the
//! dashboard's reading of requests, which is the same on every backend (the backends' own
//! readings have their targets), and a fresh memory broker keeps each run independent and fast.

use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use http_body_util::BodyExt;
use stagedoor_jobs::broker::Settlement;
use stagedoor_jobs::{
    Broker, DeadLetters, Failure, FailureCause, Inspect, Job, JobId, MemoryBroker, Publish,
};
use stagedoor_jobs_dashboard::{Auth, Dashboard};
use tower::ServiceExt;

use crate::input::Input;

/// A well-formed CSRF token (64 hex digits) that an input can send as both cookie and field.
pub const CSRF: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
/// The dashboard's token when its auth is a token.
pub const TOKEN: &str = "s3cret-token";

/// The routes, so that inputs reach them without guessing their spelling; a byte past them
/// takes the path from the input.
const PATHS: &[&str] = &[
    "/",
    "/api/queues",
    "/dead",
    "/dead/letter",
    "/dead/confirm",
    "/dead/action",
    "/scheduled",
    "/workers",
    "/api/workers",
    "/login",
    "/logout",
    "/assets/style.css",
    "/assets/live.js",
];

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime for the fuzz target: {e}"))
    })
}

/// A memory broker holding 2 ready jobs of queue `mail`, one delayed, and 3 dead letters of
/// `billing` in `billing.dead` (ids `inv-0`, `inv-1`, `ref-0`).
async fn seeded() -> MemoryBroker {
    let b = MemoryBroker::new();
    let ok = async {
        b.connect().await?;
        for q in ["mail", "billing"] {
            b.prepare(q).await?;
        }
        let mut jobs = Vec::new();
        for _ in 0..2 {
            jobs.push(Job::from_bytes("mail", b"{}".to_vec()).kind("welcome"));
        }
        jobs.push(Job::from_bytes("mail", b"{}".to_vec()).after(Duration::from_secs(3600)));
        for (kind, id) in [
            ("invoice", "inv-0"),
            ("invoice", "inv-1"),
            ("refund", "ref-0"),
        ] {
            jobs.push(
                Job::from_bytes("billing", b"{\"n\":1}".to_vec())
                    .kind(kind)
                    .id(JobId::from_string(id)),
            );
        }
        b.publish_jobs(jobs).await?;
        let dead = b.default_dead_letter("billing");
        for d in b.claim("billing", 3, Duration::from_millis(1)).await? {
            let failure = Failure::new(FailureCause::Error, "boom", "at billing.rs:1");
            b.settle(
                "billing",
                &d,
                Settlement::DeadLetter {
                    target: dead.clone(),
                    failure,
                },
            )
            .await?;
        }
        Ok::<_, stagedoor_jobs::BrokerError>(())
    };
    if let Err(e) = ok.await {
        panic!("seeding the memory broker: {e}");
    }
    b
}

/// Bytes as a URI's path or query: bytes a URI may hold as they are, others percent-encoded.
fn uri_part(bytes: &[u8]) -> String {
    let mut s = String::new();
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&b) {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// Target `dashboard`: one request built from the input (method, route or any path, query,
/// body, cookies, credentials, auth mode, a mount prefix). The response comes within 10 s,
/// is no server error (5xx: none is intended for any request) and, unless nested, carries
/// the security headers.
pub fn request(data: &[u8]) {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let route = inp.u8();
    let path = match PATHS.get(usize::from(route)) {
        Some(p) => (*p).to_owned(),
        None => format!("/{}", uri_part(inp.chunk())),
    };
    let query = uri_part(inp.chunk());
    let cookie = inp.chunk().to_vec();
    let authorization = inp.chunk().to_vec();
    let mut body = Vec::new();
    if flags & 0x10 != 0 {
        body.extend_from_slice(format!("csrf={CSRF}&").as_bytes());
    }
    body.extend_from_slice(inp.rest());

    let nested = flags & 0x80 != 0;
    let uri = format!(
        "{}{path}{}{query}",
        if nested { "/jobs" } else { "" },
        if query.is_empty() { "" } else { "?" }
    );
    let mut req = Request::builder()
        .method(if flags & 1 != 0 { "POST" } else { "GET" })
        .uri(uri.as_str());
    if flags & 1 != 0 {
        req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    }
    let mut cookies = Vec::new();
    if flags & 0x20 != 0 {
        cookies.extend_from_slice(format!("sdj_csrf={CSRF}; ").as_bytes());
    }
    cookies.extend_from_slice(&cookie);
    if !cookies.is_empty() {
        req = req.header(header::COOKIE, cookies);
    }
    match flags & 0x0c {
        0x04 => req = req.header(header::AUTHORIZATION, format!("Bearer {TOKEN}")),
        0x08 => req = req.header(header::AUTHORIZATION, authorization),
        _ => {}
    }
    // A URI or header value the http crate refuses never reaches the dashboard.
    let Ok(req) = req.body(Body::from(body)) else {
        return;
    };
    let mode = (flags >> 1) & 3;
    runtime().block_on(async move {
        let b = seeded().await;
        let d = Dashboard::new(b).timeout(Duration::from_secs(2));
        let d = match mode {
            1 => d.auth(Auth::Token(TOKEN.to_owned())),
            2 => d.auth(Auth::Basic {
                user: "ops".to_owned(),
                password: "pw".to_owned(),
            }),
            3 => d.read_only(true),
            _ => d,
        };
        let router = if nested {
            Router::new().nest("/jobs", d.router())
        } else {
            d.router()
        };
        let resp = tokio::time::timeout(Duration::from_secs(10), router.oneshot(req))
            .await
            .unwrap_or_else(|_| panic!("no response within 10 s to {uri}"))
            .unwrap_or_else(|e| match e {});
        let status = resp.status();
        assert!(!status.is_server_error(), "{uri} answered {status}");
        // Nested, a path the outer router answers itself (outside the dashboard) has none.
        if !nested {
            assert!(
                resp.headers().contains_key(header::CONTENT_SECURITY_POLICY),
                "{uri}: no Content-Security-Policy"
            );
        }
        let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect())
            .await
            .unwrap_or_else(|_| panic!("no body within 10 s from {uri}"));
        assert!(body.is_ok(), "{uri}: the body failed");
    });
}
