//! Authentication, the CSRF token, the session cookie, and the headers every response carries.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{OriginalUri, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use subtle::ConstantTimeEq as _;

use crate::data::{App, Backend};

/// The cookie holding the CSRF token (double submit: forms repeat it in a hidden field).
pub(crate) const CSRF_COOKIE: &str = "sdj_csrf";
/// The cookie holding a signed-in session ([`Auth::Token`]).
pub(crate) const SESSION_COOKIE: &str = "sdj_session";
/// How long a session lasts.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);
/// At most this many sessions are kept; the oldest goes first.
const MAX_SESSIONS: usize = 1_000;

/// How the dashboard asks who is there. The secret is best read from an environment variable
/// (the command line's `--auth-token-env VAR`, `--basic-auth-env VAR`).
#[derive(Clone)]
#[non_exhaustive]
pub enum Auth {
    /// A shared token: `Authorization: Bearer <token>` on each request (scripts), or typed
    /// once into the sign-in page, which sets a session cookie (browsers).
    Token(String),
    /// HTTP basic auth: the browser asks for the user and password.
    Basic {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Token(_) => f.write_str("Token(***)"),
            Auth::Basic { user, .. } => write!(f, "Basic {{ user: {user:?}, password: *** }}"),
        }
    }
}

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

    /// Whether `sent` (a form's `csrf` field) is this request's CSRF cookie, in constant time.
    pub(crate) fn csrf_ok(&self, sent: Option<&str>) -> bool {
        match (&self.csrf_sent, sent) {
            (Some(cookie), Some(field)) if !cookie.is_empty() => {
                bool::from(cookie.as_bytes().ct_eq(field.as_bytes()))
            }
            _ => false,
        }
    }

    /// The `Path` of the dashboard's cookies.
    pub(crate) fn cookie_path(&self) -> String {
        self.home()
    }
}

/// Sessions signed in with the token: id → when it expires.
#[derive(Debug, Default)]
pub(crate) struct Sessions(std::sync::Mutex<HashMap<String, Instant>>);

impl Sessions {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts a session; returns its id.
    pub(crate) fn start(&self) -> Option<String> {
        let id = random_token()?;
        let now = Instant::now();
        let mut map = self.map();
        map.retain(|_, until| *until > now);
        while map.len() >= MAX_SESSIONS {
            let Some(oldest) = map.iter().min_by_key(|(_, u)| **u).map(|(k, _)| k.clone()) else {
                break;
            };
            map.remove(&oldest);
        }
        map.insert(id.clone(), now + SESSION_TTL);
        Some(id)
    }

    /// Whether `id` is a live session.
    pub(crate) fn valid(&self, id: &str) -> bool {
        self.map()
            .get(id)
            .is_some_and(|until| *until > Instant::now())
    }

    /// Ends session `id`.
    pub(crate) fn end(&self, id: &str) {
        self.map().remove(id);
    }
}

/// 32 random bytes from the OS, as hex; `None` if the OS has none to give.
pub(crate) fn random_token() -> Option<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether `t` looks like one of our tokens (64 hex digits).
fn well_formed(t: &str) -> bool {
    t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit())
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

/// A `Set-Cookie` value for the dashboard (HttpOnly, SameSite=Strict); `max_age` 0 deletes.
pub(crate) fn set_cookie(name: &str, value: &str, path: &str, max_age: Option<u64>) -> String {
    let age = max_age.map_or(String::new(), |s| format!("; Max-Age={s}"));
    format!("{name}={value}; Path={path}; HttpOnly; SameSite=Strict{age}")
}

/// Where the dashboard is mounted, from the full path and the path the router saw. Only
/// plain path characters are kept (it goes into links and cookie paths); anything else mounts
/// the links at the root.
fn base_of(req: &Request) -> String {
    let inner = req.uri().path();
    let full = req
        .extensions()
        .get::<OriginalUri>()
        .map_or_else(|| inner.to_owned(), |o| o.0.path().to_owned());
    let base = if inner == "/" {
        full.trim_end_matches('/')
    } else {
        full.strip_suffix(inner).unwrap_or_default()
    };
    let plain = base
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/-_.~%".contains(&b));
    if plain {
        base.to_owned()
    } else {
        String::new()
    }
}

/// Whether the request carries the dashboard's credentials.
fn authorized<B: Backend>(app: &App<B>, headers: &HeaderMap) -> (bool, Option<String>) {
    let session = cookie(headers, SESSION_COOKIE)
        .filter(|s| well_formed(s) && app.sessions.valid(s))
        .map(str::to_owned);
    let ok = match &app.dashboard.auth {
        None => true,
        Some(Auth::Token(token)) => {
            let bearer = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|b| token_eq(b.trim(), token));
            bearer || session.is_some()
        }
        Some(Auth::Basic { user, password }) => headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .ok()
            })
            .and_then(|b| String::from_utf8(b).ok())
            .is_some_and(|pair| match pair.split_once(':') {
                Some((u, p)) => token_eq(u, user) & token_eq(p, password),
                None => false,
            }),
    };
    (ok, session)
}

/// `given == secret` in constant time (for equal lengths); an empty secret never matches.
pub(crate) fn token_eq(given: &str, secret: &str) -> bool {
    !secret.is_empty() && bool::from(given.as_bytes().ct_eq(secret.as_bytes()))
}

/// Runs before every handler: works out the mount point and the CSRF token, refuses a request
/// without credentials (401), and adds the security headers to every response.
pub(crate) async fn guard<B: Backend>(
    State(app): State<Arc<App<B>>>,
    mut req: Request,
    next: Next,
) -> Response {
    let base = base_of(&req);
    let path = req.uri().path().to_owned();
    let csrf_sent = cookie(req.headers(), CSRF_COOKIE)
        .filter(|t| well_formed(t))
        .map(str::to_owned);
    let (csrf, new_csrf) = match &csrf_sent {
        Some(t) => (t.clone(), false),
        None => match random_token() {
            Some(t) => (t, true),
            None => {
                return with_headers(
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the operating system gave no random bytes for a CSRF token",
                    )
                        .into_response(),
                );
            }
        },
    };
    let (ok, session) = authorized(&app, req.headers());
    let ctx = ReqCtx {
        base,
        csrf,
        csrf_sent,
        session,
    };
    let public = path.starts_with("/assets/") || path == "/login";
    let mut resp = if ok || public {
        req.extensions_mut().insert(ctx.clone());
        next.run(req).await
    } else {
        crate::pages::login::refuse(&app, &ctx, path.starts_with("/api/"))
    };
    if new_csrf
        && let Ok(v) = HeaderValue::from_str(&set_cookie(
            CSRF_COOKIE,
            &ctx.csrf,
            &ctx.cookie_path(),
            None,
        ))
    {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    with_headers(resp)
}

/// The headers every response carries: a strict CSP, no sniffing, no framing, no caching of
/// pages.
fn with_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare() {
        assert!(token_eq("abc", "abc"));
        assert!(!token_eq("abd", "abc"));
        assert!(!token_eq("ab", "abc"));
        assert!(!token_eq("", ""));
    }

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

    #[test]
    fn random_tokens_are_well_formed_and_differ() {
        let a = random_token().unwrap();
        let b = random_token().unwrap();
        assert!(well_formed(&a), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn secrets_are_not_debug_printed() {
        let t = format!("{:?}", Auth::Token("s3cret".into()));
        let b = format!(
            "{:?}",
            Auth::Basic {
                user: "ops".into(),
                password: "s3cret".into()
            }
        );
        assert!(!t.contains("s3cret") && !b.contains("s3cret"), "{t} {b}");
    }
}
