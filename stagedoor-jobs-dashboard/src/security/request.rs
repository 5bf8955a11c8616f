//! [`ReqCtx`], what the guard learnt of a request for the handlers, and the dashboard's
//! cookies.

use std::net::IpAddr;
use std::sync::Arc;

use axum::http::{HeaderMap, header};
use subtle::ConstantTimeEq as _;

use super::csrf::csrf_token;

/// The cookie holding the CSRF nonce over plain HTTP; forms carry an HMAC of it (bound to the
/// session), never the value itself.
pub(crate) const CSRF_COOKIE: &str = "sdj_csrf";
/// The cookie holding a signed-in session ([`Auth::Token`]) over plain HTTP.
pub(crate) const SESSION_COOKIE: &str = "sdj_session";
/// The prefix of the cookies' names over HTTPS: a `__Host-` cookie must be `Secure`, on path
/// `/` and without a domain, so a sibling subdomain cannot set it. Browsers refuse it without
/// `Secure`, hence plain names over plain HTTP.
const HOST_PREFIX: &str = "__Host-";

/// What the guard learnt of a request, for the handlers.
#[derive(Clone, Debug)]
pub(crate) struct ReqCtx {
    /// Where the dashboard is mounted: `""` at the root, `/jobs` when nested there.
    pub(crate) base: String,
    /// The CSRF token forms carry (the cookie's, or a new one set on this response).
    pub(crate) csrf: String,
    /// The CSRF cookie this request came with, if any.
    pub(crate) csrf_sent: Option<String>,
    /// The session cookie this request came with, if any (and valid).
    pub(crate) session: Option<String>,
    /// Whether the request came over HTTPS (its URI, or `X-Forwarded-Proto: https` from a
    /// proxy): the cookies are then `Secure` and `__Host-` named.
    pub(crate) https: bool,
    /// Whether the request may see the dashboard (no auth, or it carries the credentials):
    /// pages shown to anyone else show neither the title nor the backend.
    pub(crate) authorized: bool,
    /// The client's address, when the server gives it (what failed guesses are counted by).
    pub(crate) client: Option<IpAddr>,
    /// The CSRF nonce: the cookie's value, or the one set on this response.
    pub(crate) nonce: Option<String>,
    /// The per-process HMAC key of the CSRF tokens.
    pub(crate) key: Option<Arc<[u8; 32]>>,
}

impl ReqCtx {
    /// The path of a dashboard page: `url("/dead")` is `/jobs/dead` when mounted at `/jobs`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The queues page (the dashboard's root).
    pub(crate) fn home(&self) -> String {
        if self.base.is_empty() {
            "/".to_owned()
        } else {
            self.base.clone()
        }
    }

    /// A context for a response made outside the guard (nothing known of the request).
    pub(crate) fn bare() -> Self {
        Self {
            base: String::new(),
            csrf: String::new(),
            csrf_sent: None,
            session: None,
            https: false,
            authorized: false,
            client: None,
            nonce: None,
            key: None,
        }
    }

    /// Whether `sent` (a form's `csrf` field) is the token of this request's CSRF cookie and
    /// session (an HMAC under this process's key), compared in constant time. A value of the
    /// attacker's choosing in the cookie is no help: the token is not the cookie's value.
    pub(crate) fn csrf_ok(&self, sent: Option<&str>) -> bool {
        match (&self.csrf_sent, &self.key, sent) {
            (Some(nonce), Some(key), Some(field)) if !nonce.is_empty() => {
                let want = csrf_token(key, nonce, self.session.as_deref());
                bool::from(want.as_bytes().ct_eq(field.as_bytes()))
            }
            _ => false,
        }
    }

    /// The name of cookie `name` for this request: `__Host-` prefixed over HTTPS.
    pub(crate) fn cookie_name(&self, name: &str) -> String {
        if self.https {
            format!("{HOST_PREFIX}{name}")
        } else {
            name.to_owned()
        }
    }

    /// A `Set-Cookie` value for one of the dashboard's cookies (`HttpOnly`, `SameSite=Strict`;
    /// over HTTPS `__Host-` named, `Secure`, path `/` as that prefix requires; over plain HTTP
    /// the mount point's path); `max_age` 0 deletes it.
    pub(crate) fn cookie(&self, name: &str, value: &str, max_age: Option<u64>) -> String {
        let age = max_age.map_or(String::new(), |s| format!("; Max-Age={s}"));
        let (path, secure) = if self.https {
            ("/".to_owned(), "; Secure")
        } else {
            (self.home(), "")
        };
        format!(
            "{}={value}; Path={path}; HttpOnly; SameSite=Strict{age}{secure}",
            self.cookie_name(name)
        )
    }
}

/// The value of cookie `name`.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn cookies_parse() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; sdj_csrf=xyz ; b=2"),
        );
        assert_eq!(cookie(&h, CSRF_COOKIE), Some("xyz"));
        assert_eq!(cookie(&h, "c"), None);
    }
}
