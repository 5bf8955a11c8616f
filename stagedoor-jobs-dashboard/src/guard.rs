//! The guard every request passes before its handler (the checks of `security/`, in order),
//! and the headers every response carries.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, OriginalUri, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::data::{App, Backend, DEADLINE};
use crate::pages::{login, refusal};
use crate::params::MAX_INPUT;
use crate::security::ReqCtx;
use crate::security::credentials::{Credentials, authorized};
use crate::security::csrf::{csrf_token, random_token, well_formed};
use crate::security::hosts::{cross_site, host_allowed};
use crate::security::request::{CSRF_COOKIE, SESSION_COOKIE, cookie};

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

/// Runs before every handler: refuses a `Host` the dashboard does not answer to (421), a POST
/// from another site (403), too many failed credentials (429), a request without credentials
/// (401) and an oversized query (414); works out the mount point and the CSRF token; runs the
/// handler within the request's deadline; adds the security headers to every response.
pub(crate) async fn guard<B: Backend>(
    State(app): State<Arc<App<B>>>,
    req: Request,
    next: Next,
) -> Response {
    let mut ctx = request_ctx(&app, &req);
    if let Some(refused) = refused_unread(&app, &ctx, &req) {
        return with_headers(refused);
    }
    let Some(key) = ctx.key.clone() else {
        return with_headers(no_random("the CSRF key"));
    };
    let csrf_sent = cookie(req.headers(), &ctx.cookie_name(CSRF_COOKIE))
        .filter(|t| well_formed(t))
        .map(str::to_owned);
    let (nonce, new_nonce) = match &csrf_sent {
        Some(t) => (t.clone(), false),
        None => match random_token() {
            Some(t) => (t, true),
            None => return with_headers(no_random("a CSRF token")),
        },
    };
    let (creds, session) = authorized(
        app.dashboard.auth.as_ref(),
        &app.sessions,
        req.headers(),
        &ctx.cookie_name(SESSION_COOKIE),
    );
    ctx.csrf = csrf_token(&key, &nonce, session.as_deref());
    // Only a cookie the browser sent can vouch for a form; a nonce made now cannot.
    ctx.csrf_sent = csrf_sent;
    ctx.nonce = Some(nonce);
    ctx.session = session;
    ctx.authorized = matches!(
        creds,
        Credentials::Open | Credentials::Session | Credentials::Sent(true)
    );
    let mut resp = answer(&app, &ctx, creds, req, next).await;
    if new_nonce
        && let Some(n) = &ctx.nonce
        && let Ok(v) = HeaderValue::from_str(&ctx.cookie(CSRF_COOKIE, n, None))
    {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    with_headers(resp)
}

/// What is known of a request before its cookies are read: the mount point, HTTPS, the
/// client, the CSRF key.
fn request_ctx<B: Backend>(app: &App<B>, req: &Request) -> ReqCtx {
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
    ReqCtx {
        base: base_of(req),
        csrf: String::new(),
        csrf_sent: None,
        session: None,
        https,
        authorized: false,
        client,
        nonce: None,
        key: app.keys.0.clone(),
    }
}

/// The refusal of a request turned away before anything of it is read: a `Host` the
/// dashboard does not answer to (421), a POST from another site (403), an oversized query
/// (414).
fn refused_unread<B: Backend>(app: &App<B>, ctx: &ReqCtx, req: &Request) -> Option<Response> {
    let host = req
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}").to_owned())
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
    let allowed = &app.dashboard.allowed_hosts;
    if let Some(h) = &host
        && !host_allowed(h, app.dashboard.served_port, allowed)
    {
        return Some(refusal::misdirected(app, ctx, h));
    }
    if req.method() == Method::POST
        && let Some(why) = cross_site(req.headers(), host.as_deref(), allowed)
    {
        return Some(refusal::cross_site_refused(app, ctx, &why));
    }
    if req.uri().query().is_some_and(|q| q.len() > MAX_INPUT) {
        return Some(refusal::too_large(app, ctx, StatusCode::URI_TOO_LONG));
    }
    None
}

/// 500: the OS gave no random bytes for `what`.
fn no_random(what: &str) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("the operating system gave no random bytes for {what}"),
    )
        .into_response()
}

/// The handler's answer within the request's deadline, when the request may see it (its
/// credentials, or a public path: the assets, the sign-in page); else 429 for a client
/// throttled, 401 for a request without credentials.
async fn answer<B: Backend>(
    app: &App<B>,
    ctx: &ReqCtx,
    creds: Credentials,
    mut req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path().to_owned();
    let public = path.starts_with("/assets/") || path == "/login";
    if let Credentials::Sent(_) = creds
        && let Some(wait) = app.throttle.blocked(ctx.client)
    {
        return refusal::throttled(app, ctx, wait);
    }
    if creds == Credentials::Sent(false) {
        app.throttle.failed(ctx.client);
    }
    if ctx.authorized || public {
        req.extensions_mut().insert(ctx.clone());
        let deadline = Instant::now() + app.dashboard.timeout;
        DEADLINE.scope(deadline, next.run(req)).await
    } else {
        login::refuse(app, ctx, path.starts_with("/api/"))
    }
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
