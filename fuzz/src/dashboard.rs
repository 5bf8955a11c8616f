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
        for d in b
            .claim(
                "billing",
                3,
                Duration::from_millis(1),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await?
        {
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
    let rest = inp.rest().to_vec();
    let nested = flags & 0x80 != 0;
    let prefix = if nested { "/jobs" } else { "" };
    let uri = format!(
        "{prefix}{path}{}{query}",
        if query.is_empty() { "" } else { "?" }
    );
    let auth_header = match flags & 0x0c {
        0x04 => Some(format!("Bearer {TOKEN}").into_bytes()),
        0x08 => Some(authorization),
        _ => None,
    };
    let mut cookies = Vec::new();
    if flags & 0x20 != 0 {
        cookies.extend_from_slice(format!("sdj_csrf={CSRF}; ").as_bytes());
    }
    cookies.extend_from_slice(&cookie);
    // The request, with `token` as the form's CSRF field when the input asks for one. A URI or
    // header value the http crate refuses never reaches the dashboard.
    let build = |method: &str, uri: &str, token: Option<&str>| {
        let mut body = Vec::new();
        if let Some(t) = token {
            body.extend_from_slice(format!("csrf={t}&").as_bytes());
        }
        body.extend_from_slice(&rest);
        let mut req = Request::builder().method(method).uri(uri);
        if method == "POST" {
            req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        if !cookies.is_empty() {
            req = req.header(header::COOKIE, cookies.clone());
        }
        if let Some(a) = &auth_header {
            req = req.header(header::AUTHORIZATION, a.clone());
        }
        req.body(Body::from(body)).ok()
    };
    let method = if flags & 1 != 0 { "POST" } else { "GET" };
    if build(method, &uri, None).is_none() {
        return;
    }
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
        // A form's CSRF field: the token a confirmation page gives this input's cookie and
        // credentials (the dashboard binds it to them), so that a POST reaches the action.
        let token = if flags & 0x10 != 0 {
            let page = format!("{prefix}/dead/confirm?dl=billing.dead&action=purge&all=1");
            let mut token = CSRF.to_owned();
            if let Some(req) = build("GET", &page, None)
                && let Ok(Ok(resp)) =
                    tokio::time::timeout(Duration::from_secs(10), router.clone().oneshot(req)).await
                && let Ok(Ok(body)) =
                    tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect()).await
            {
                let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
                if let Some(at) = text.find("name=\"csrf\" value=\"") {
                    let from = at + "name=\"csrf\" value=\"".len();
                    if let Some(v) = text.get(from..from + 64) {
                        token = v.to_owned();
                    }
                }
            }
            Some(token)
        } else {
            None
        };
        let Some(req) = build(method, &uri, token.as_deref()) else {
            return;
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
