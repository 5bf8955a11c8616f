//! Authentication, the CSRF token, the session cookie, and the headers every response carries.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, OriginalUri, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hmac::{KeyInit as _, Mac as _};
use sha2::Digest as _;
use subtle::ConstantTimeEq as _;

use crate::data::{App, Backend};
use stagedoor_jobs::kit::lock;

/// The cookie holding the CSRF nonce over plain HTTP; forms carry an HMAC of it (bound to the
/// session), never the value itself.
pub(crate) const CSRF_COOKIE: &str = "sdj_csrf";
/// The cookie holding a signed-in session ([`Auth::Token`]) over plain HTTP.
pub(crate) const SESSION_COOKIE: &str = "sdj_session";
/// The prefix of the cookies' names over HTTPS: a `__Host-` cookie must be `Secure`, on path
/// `/` and without a domain, so a sibling subdomain cannot set it. Browsers refuse it without
/// `Secure`, hence plain names over plain HTTP.
const HOST_PREFIX: &str = "__Host-";
/// How many failed credentials one client may send per [`GUESS_WINDOW`].
pub(crate) const GUESSES_PER_CLIENT: usize = 5;
/// How many failed credentials all clients together may send per [`GUESS_WINDOW`].
pub(crate) const GUESSES_IN_TOTAL: usize = 50;
/// The window the failures are counted over.
pub(crate) const GUESS_WINDOW: Duration = Duration::from_secs(60);
/// At most this many clients' failures are remembered (the total still counts the rest).
const MAX_CLIENTS: usize = 10_000;
/// A query string or a form body longer than this is refused unread: a selection of 1,000 ids
/// of up to 56 characters fits (a URI longer than 64 KB is refused by the HTTP layer itself).
pub(crate) const MAX_INPUT: usize = 60 * 1024;
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
    /// Whether the request came over HTTPS (its URI, or `X-Forwarded-Proto: https` from a
    /// proxy): the cookies are then `Secure` and `__Host-` named.
    pub(crate) https: bool,
    /// Whether the request may see the dashboard (no auth, or it carries the credentials):
    /// pages shown to anyone else show neither the title nor the backend.
    pub(crate) authorized: bool,
    /// The client's address, when the server gives it (what failed guesses are counted by).
    pub(crate) client: Option<IpAddr>,
    /// The CSRF nonce: the cookie's value, or the one set on this response.
    nonce: Option<String>,
    /// The per-process HMAC key of the CSRF tokens.
    key: Option<Arc<[u8; 32]>>,
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

/// The CSRF token of `nonce` (the cookie's value) and `session`: HMAC-SHA-256 under `key`, as
/// hex.
fn csrf_token(key: &[u8; 32], nonce: &str, session: Option<&str>) -> String {
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(key) else {
        // An HMAC takes a key of any length; this is never reached.
        return String::new();
    };
    mac.update(b"stagedoor-jobs dashboard csrf\0");
    mac.update(nonce.as_bytes());
    mac.update(b"\0");
    mac.update(session.unwrap_or_default().as_bytes());
    hex(&mac.finalize().into_bytes())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The per-process secrets: the CSRF tokens' HMAC key (`None` if the OS gave no random bytes:
/// every request is then refused).
#[derive(Debug)]
pub(crate) struct Keys(Option<Arc<[u8; 32]>>);

impl Keys {
    pub(crate) fn new() -> Self {
        let mut key = [0u8; 32];
        Self(getrandom::fill(&mut key).ok().map(|()| Arc::new(key)))
    }
}

/// Failed credentials (a wrong Bearer token, basic-auth pair or sign-in token) over the last
/// [`GUESS_WINDOW`], per client and in total.
#[derive(Debug, Default)]
pub(crate) struct Throttle(std::sync::Mutex<Failures>);

#[derive(Debug, Default)]
struct Failures {
    total: VecDeque<Instant>,
    clients: HashMap<Option<IpAddr>, VecDeque<Instant>>,
}

impl Throttle {
    fn state(&self) -> std::sync::MutexGuard<'_, Failures> {
        lock(&self.0)
    }

    /// `Some(how long to wait)` when `client` (or everyone) has failed too often: its next
    /// attempt is then refused without being checked.
    pub(crate) fn blocked(&self, client: Option<IpAddr>) -> Option<Duration> {
        let now = Instant::now();
        let mut st = self.state();
        let expire = |q: &mut VecDeque<Instant>| {
            while q
                .front()
                .is_some_and(|t| now.duration_since(*t) >= GUESS_WINDOW)
            {
                q.pop_front();
            }
        };
        expire(&mut st.total);
        let wait = |q: &VecDeque<Instant>| {
            q.front()
                .map(|t| GUESS_WINDOW.saturating_sub(now.duration_since(*t)))
        };
        let mut longest: Option<Duration> = None;
        if st.total.len() >= GUESSES_IN_TOTAL {
            longest = wait(&st.total);
        }
        if let Some(q) = st.clients.get_mut(&client) {
            expire(q);
            if q.len() >= GUESSES_PER_CLIENT {
                longest = longest.max(wait(q));
            }
        }
        longest
    }

    /// Counts a failed attempt of `client`.
    pub(crate) fn failed(&self, client: Option<IpAddr>) {
        let now = Instant::now();
        let mut st = self.state();
        st.total.push_back(now);
        while st.total.len() > GUESSES_IN_TOTAL {
            st.total.pop_front();
        }
        if !st.clients.contains_key(&client) && st.clients.len() >= MAX_CLIENTS {
            st.clients.retain(|_, q| {
                q.back()
                    .is_some_and(|t| now.duration_since(*t) < GUESS_WINDOW)
            });
            if st.clients.len() >= MAX_CLIENTS {
                return;
            }
        }
        let q = st.clients.entry(client).or_default();
        q.push_back(now);
        while q.len() > GUESSES_PER_CLIENT {
            q.pop_front();
        }
    }
}

/// Sessions signed in with the token: id → when it expires.
#[derive(Debug, Default)]
pub(crate) struct Sessions(std::sync::Mutex<HashMap<String, Instant>>);

impl Sessions {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        lock(&self.0)
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
    Some(hex(&bytes))
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

/// What the request's credentials are worth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Credentials {
    /// The dashboard asks for none.
    Open,
    /// A live session (its id is 256 random bits: not guessed).
    Session,
    /// A Bearer token or a basic-auth pair was sent: right or wrong. Either is refused while
    /// the client is throttled; a wrong one is counted.
    Sent(bool),
    /// None were sent: not a guess.
    Missing,
}

/// Whether the request carries the dashboard's credentials, and its live session.
fn authorized<B: Backend>(
    app: &App<B>,
    headers: &HeaderMap,
    session_cookie: &str,
) -> (Credentials, Option<String>) {
    let session = cookie(headers, session_cookie)
        .filter(|s| well_formed(s) && app.sessions.valid(s))
        .map(str::to_owned);
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let verdict = Credentials::Sent;
    let c = match &app.dashboard.auth {
        None => Credentials::Open,
        Some(_) if session.is_some() => Credentials::Session,
        Some(Auth::Token(token)) => match authorization.and_then(|v| v.strip_prefix("Bearer ")) {
            Some(b) => verdict(token_eq(b.trim(), token)),
            None => Credentials::Missing,
        },
        Some(Auth::Basic { user, password }) => {
            match authorization.and_then(|v| v.strip_prefix("Basic ")) {
                Some(b) => verdict(
                    base64::engine::general_purpose::STANDARD
                        .decode(b.trim())
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())
                        .is_some_and(|pair| match pair.split_once(':') {
                            Some((u, p)) => token_eq(u, user) & token_eq(p, password),
                            None => false,
                        }),
                ),
                None => Credentials::Missing,
            }
        }
    };
    (c, session)
}

/// `given == secret`, comparing their SHA-256 digests in constant time: the time taken says
/// nothing of where they differ, nor of the secret's length. An empty secret never matches.
pub(crate) fn token_eq(given: &str, secret: &str) -> bool {
    let a = sha2::Sha256::digest(given.as_bytes());
    let b = sha2::Sha256::digest(secret.as_bytes());
    !secret.is_empty() && bool::from(a.as_slice().ct_eq(b.as_slice()))
}

/// A host as `Host` or `Origin` name it: the name (lowercase, brackets kept on IPv6) and the
/// port, if given.
fn split_host(host: &str) -> (String, Option<u16>) {
    let host = host.trim().to_ascii_lowercase();
    let (name, port) = if host.starts_with('[') {
        match host.find(']') {
            Some(end) => (
                host[..=end].to_owned(),
                host[end + 1..].strip_prefix(':').map(str::to_owned),
            ),
            None => (host.clone(), None),
        }
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) => (n.to_owned(), Some(p.to_owned())),
            None => (host.clone(), None),
        }
    };
    let port = port.and_then(|p| p.parse::<u16>().ok());
    (name.trim_end_matches('.').to_owned(), port)
}

/// Whether `name` is an IP address (`127.0.0.1`, `[::1]`): a host a web page cannot rebind, as
/// no DNS answer is involved.
fn is_ip(name: &str) -> bool {
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    bare.parse::<IpAddr>().is_ok()
}

/// Whether the dashboard answers to `host` (a `Host` header): `localhost` or an IP address
/// (on the port it serves, when it knows it), or a name allowed with
/// [`Dashboard::allowed_host`](crate::Dashboard::allowed_host). Any other name may be a DNS
/// rebinding: a page of that name pointed at this address.
pub(crate) fn host_allowed(host: &str, served_port: Option<u16>, allowed: &[String]) -> bool {
    let (name, port) = split_host(host);
    let allowed_name = allowed.iter().any(|a| {
        let (a_name, a_port) = split_host(a);
        a_name == name && (a_port.is_none() || a_port == port)
    });
    if allowed_name {
        return true;
    }
    let local = name == "localhost" || is_ip(&name);
    let port_ok = match served_port {
        None => true,
        Some(p) => port.unwrap_or(80) == p,
    };
    local && port_ok
}

/// Why a POST is refused as coming from another site: an `Origin` that is neither the `Host`
/// it was sent to nor an allowed host, or a `Sec-Fetch-Site` other than `same-origin`/`none`.
fn cross_site(headers: &HeaderMap, host: Option<&str>, allowed: &[String]) -> Option<String> {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return Some(format!(
            "the browser says it was sent {site} (Sec-Fetch-Site)"
        ));
    }
    let origin = headers.get(header::ORIGIN)?;
    let Some(origin) = origin.to_str().ok() else {
        return Some("its Origin header is not text".to_owned());
    };
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    let same = authority.is_some_and(|a| {
        let a = split_host(a);
        host.is_some_and(|h| split_host(h) == a)
            || allowed.iter().any(|x| {
                let x = split_host(x);
                x.0 == a.0 && (x.1.is_none() || x.1 == a.1)
            })
    });
    if same {
        None
    } else {
        Some(format!("its Origin is `{origin}`"))
    }
}

/// Runs before every handler: refuses a `Host` the dashboard does not answer to (421), a POST
/// from another site (403), too many failed credentials (429), a request without credentials
/// (401) and an oversized query (414); works out the mount point and the CSRF token; runs the
/// handler within the request's deadline; adds the security headers to every response.
pub(crate) async fn guard<B: Backend>(
    State(app): State<Arc<App<B>>>,
    mut req: Request,
    next: Next,
) -> Response {
    let base = base_of(&req);
    let path = req.uri().path().to_owned();
    let https = req.uri().scheme_str() == Some("https")
        || req
            .headers()
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https"));
    let client = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let mut ctx = ReqCtx {
        base,
        csrf: String::new(),
        csrf_sent: None,
        session: None,
        https,
        authorized: false,
        client,
        nonce: None,
        key: app.keys.0.clone(),
    };
    let host = req
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}").to_owned())
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
    let allowed = &app.dashboard.allowed_hosts;
    if let Some(h) = &host
        && !host_allowed(h, app.dashboard.served_port, allowed)
    {
        return with_headers(crate::pages::misdirected(&app, &ctx, h));
    }
    if req.method() == Method::POST
        && let Some(why) = cross_site(req.headers(), host.as_deref(), allowed)
    {
        return with_headers(crate::pages::cross_site_refused(&app, &ctx, &why));
    }
    if req.uri().query().is_some_and(|q| q.len() > MAX_INPUT) {
        return with_headers(crate::pages::too_large(
            &app,
            &ctx,
            StatusCode::URI_TOO_LONG,
        ));
    }
    let Some(key) = ctx.key.clone() else {
        return with_headers(
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the operating system gave no random bytes for the CSRF key",
            )
                .into_response(),
        );
    };
    let csrf_sent = cookie(req.headers(), &ctx.cookie_name(CSRF_COOKIE))
        .filter(|t| well_formed(t))
        .map(str::to_owned);
    let (nonce, new_nonce) = match &csrf_sent {
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
    let (creds, session) = {
        let name = ctx.cookie_name(SESSION_COOKIE);
        authorized(&app, req.headers(), &name)
    };
    ctx.csrf = csrf_token(&key, &nonce, session.as_deref());
    // Only a cookie the browser sent can vouch for a form; a nonce made now cannot.
    ctx.csrf_sent = csrf_sent;
    ctx.nonce = Some(nonce);
    ctx.session = session;
    ctx.authorized = matches!(
        creds,
        Credentials::Open | Credentials::Session | Credentials::Sent(true)
    );
    let public = path.starts_with("/assets/") || path == "/login";
    let mut resp = if let Credentials::Sent(_) = creds
        && let Some(wait) = app.throttle.blocked(client)
    {
        crate::pages::throttled(&app, &ctx, wait)
    } else {
        if creds == Credentials::Sent(false) {
            app.throttle.failed(client);
        }
        if ctx.authorized || public {
            req.extensions_mut().insert(ctx.clone());
            let deadline = Instant::now() + app.dashboard.timeout;
            crate::data::DEADLINE.scope(deadline, next.run(req)).await
        } else {
            crate::pages::login::refuse(&app, &ctx, path.starts_with("/api/"))
        }
    };
    if new_nonce
        && let Some(n) = &ctx.nonce
        && let Ok(v) = HeaderValue::from_str(&ctx.cookie(CSRF_COOKIE, n, None))
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
        assert!(!token_eq("abcd", "abc"));
        assert!(!token_eq("", ""));
    }

    #[test]
    fn hosts_answered() {
        let allowed = [
            "jobs.example.com".to_owned(),
            "ops.example.com:8443".to_owned(),
        ];
        for (host, port, ok) in [
            ("127.0.0.1:8787", Some(8787), true),
            ("localhost:8787", Some(8787), true),
            ("[::1]:8787", Some(8787), true),
            ("10.1.2.3:8787", Some(8787), true),
            ("localhost:8788", Some(8787), false),
            ("localhost", Some(80), true),
            ("localhost", Some(8787), false),
            ("localhost:3000", None, true),
            ("attacker.example:8787", Some(8787), false),
            ("attacker.example:8787", None, false),
            ("127.0.0.1.nip.io", None, false),
            ("Jobs.Example.com", Some(8787), true),
            ("jobs.example.com:443", None, true),
            ("ops.example.com:8443", None, true),
            ("ops.example.com", None, false),
            ("evil.jobs.example.com", None, false),
        ] {
            assert_eq!(host_allowed(host, port, &allowed), ok, "{host} {port:?}");
        }
    }

    #[test]
    fn origins_checked() {
        let mut h = HeaderMap::new();
        let allowed = ["jobs.example.com".to_owned()];
        assert!(
            cross_site(&h, Some("127.0.0.1:8787"), &allowed).is_none(),
            "no headers"
        );
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8787"),
        );
        assert!(cross_site(&h, Some("127.0.0.1:8787"), &allowed).is_none());
        assert!(cross_site(&h, Some("127.0.0.1:9999"), &allowed).is_some());
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://jobs.example.com"),
        );
        assert!(
            cross_site(&h, Some("10.0.0.5:8787"), &allowed).is_none(),
            "allowed"
        );
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(cross_site(&h, Some("127.0.0.1:8787"), &allowed).is_some());
        h.remove(header::ORIGIN);
        h.insert("sec-fetch-site", HeaderValue::from_static("same-site"));
        assert!(cross_site(&h, Some("127.0.0.1:8787"), &allowed).is_some());
    }

    #[test]
    fn csrf_tokens_bind_key_nonce_and_session() {
        let (k1, k2) = ([1u8; 32], [2u8; 32]);
        let n = "ab".repeat(32);
        let t = csrf_token(&k1, &n, None);
        assert_eq!(t.len(), 64);
        assert_ne!(t, n, "the token is not the cookie");
        assert_eq!(t, csrf_token(&k1, &n, None));
        assert_ne!(t, csrf_token(&k2, &n, None), "another process's key");
        assert_ne!(t, csrf_token(&k1, &"cd".repeat(32), None), "another cookie");
        assert_ne!(t, csrf_token(&k1, &n, Some("s")), "another session");
    }

    #[test]
    fn failures_are_throttled() {
        let t = Throttle::default();
        let a = Some(IpAddr::from([10, 0, 0, 1]));
        let b = Some(IpAddr::from([10, 0, 0, 2]));
        for _ in 0..GUESSES_PER_CLIENT {
            assert!(t.blocked(a).is_none());
            t.failed(a);
        }
        let wait = t.blocked(a).expect("blocked");
        assert!(wait <= GUESS_WINDOW && !wait.is_zero(), "{wait:?}");
        assert!(t.blocked(b).is_none(), "another client");
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
