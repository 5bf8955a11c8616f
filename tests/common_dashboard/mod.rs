//! What the dashboard's tests share: a request's answer ([`Resp`]), a browser that keeps its
//! cookies ([`Web`]), query strings and forms ([`query`]).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// A response, its body as text.
#[derive(Debug)]
pub(crate) struct Resp {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: String,
}

impl Resp {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// How many times `needle` occurs in the body.
    pub(crate) fn count(&self, needle: &str) -> usize {
        self.body.matches(needle).count()
    }
}

/// Sends `req` to `router`.
pub(crate) async fn send(router: &Router, req: Request<Body>) -> Resp {
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    Resp {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// A browser of one dashboard: keeps the cookies it is given and sends them back, sends extra
/// headers (and its `Authorization`) on every request, remembers the last form's CSRF token.
pub(crate) struct Web {
    pub(crate) router: Router,
    pub(crate) cookies: BTreeMap<String, String>,
    pub(crate) headers: Vec<(&'static str, String)>,
    pub(crate) client: Option<SocketAddr>,
    pub(crate) authorization: Option<String>,
    /// The CSRF token of the last form read (bound to the cookie and the session).
    pub(crate) token: Option<String>,
}

impl Web {
    pub(crate) fn new(router: Router) -> Self {
        Self {
            router,
            cookies: BTreeMap::new(),
            headers: Vec::new(),
            client: None,
            authorization: None,
            token: None,
        }
    }

    /// Sends header `name` on every request.
    pub(crate) fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    pub(crate) async fn send(&mut self, mut req: Request<Body>) -> Resp {
        if !self.cookies.is_empty() {
            let c: Vec<String> = self
                .cookies
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            req.headers_mut()
                .insert(header::COOKIE, c.join("; ").parse().unwrap());
        }
        if let Some(a) = &self.authorization {
            req.headers_mut()
                .insert(header::AUTHORIZATION, a.parse().unwrap());
        }
        for (k, v) in &self.headers {
            req.headers_mut().insert(*k, v.parse().unwrap());
        }
        if let Some(c) = self.client {
            req.extensions_mut().insert(ConnectInfo(c));
        }
        let r = send(&self.router, req).await;
        for sc in r.headers.get_all(header::SET_COOKIE) {
            let sc = sc.to_str().unwrap();
            let (kv, attrs) = sc.split_once(';').unwrap_or((sc, ""));
            let (k, v) = kv.split_once('=').unwrap();
            if attrs.contains("Max-Age=0") {
                self.cookies.remove(k);
            } else {
                self.cookies.insert(k.to_owned(), v.to_owned());
            }
        }
        const FIELD: &str = r#"name="csrf" value=""#;
        if let Some(at) = r.body.find(FIELD) {
            let rest = &r.body[at + FIELD.len()..];
            self.token = rest.find('"').map(|end| rest[..end].to_owned());
        }
        r
    }

    pub(crate) async fn get(&mut self, uri: &str) -> Resp {
        self.send(Request::get(uri).body(Body::empty()).unwrap())
            .await
    }

    pub(crate) async fn post(&mut self, uri: &str, form: &[(&str, &str)]) -> Resp {
        let body = query(form);
        self.send(
            Request::post(uri)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from(body))
                .unwrap(),
        )
        .await
    }

    /// The CSRF token of the last form the dashboard showed (an HMAC of its cookie and the
    /// session, never the cookie itself); a page with a form must have been read first.
    pub(crate) fn csrf(&self) -> String {
        self.token
            .clone()
            .expect("a page with a form (and its CSRF token) was read first")
    }
}

/// `s` percent-encoded for a query string or a form.
pub(crate) fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A query string (or form body) of `pairs`, encoded.
pub(crate) fn query(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}
