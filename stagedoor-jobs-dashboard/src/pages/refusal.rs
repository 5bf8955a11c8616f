//! The pages that say no: no such page, a refused request (CSRF, read-only, another site,
//! another host, too large, too many attempts), a form too large to read.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use maud::html;

use crate::data::{App, Backend};
use crate::params::{MAX_INPUT, MAX_SELECTED, Params};
use crate::render::{self, Tab};
use crate::security::ReqCtx;
use crate::security::throttle::{GUESSES_IN_TOTAL, GUESSES_PER_CLIENT};

/// Any other path: a page that says so, with the tabs to go on from.
pub(crate) async fn not_found<B: Backend>(
    State(app): State<Arc<App<B>>>,
    ctx: Option<Extension<ReqCtx>>,
) -> Response {
    let ctx = ctx.map(|Extension(c)| c).unwrap_or_else(ReqCtx::bare);
    let body = html! { p { "There is no such page. The tabs above lead to every page." } };
    render::respond(
        StatusCode::NOT_FOUND,
        render::page(&app, &ctx, Tab::None, "Not found", body),
    )
}

/// A refusal page with `status` (403 for CSRF and read-only, 400 for a bad request).
pub(crate) fn refusal<B: Backend>(
    app: &App<B>,
    ctx: &ReqCtx,
    status: StatusCode,
    heading: &str,
    message: &str,
) -> Response {
    let body = html! {
        div.error role="alert" { (message) }
        p { a href=(ctx.home()) { "Back to the queues" } }
    };
    render::respond(status, render::page(app, ctx, Tab::None, heading, body))
}

/// 403: the form's CSRF token is missing or wrong.
pub(crate) fn csrf_refused<B: Backend>(app: &App<B>, ctx: &ReqCtx) -> Response {
    refusal(
        app,
        ctx,
        StatusCode::FORBIDDEN,
        "Refused",
        "The form's security token (CSRF) is missing or does not match this browser's cookie: nothing was changed. Reload the page and submit the form again.",
    )
}

/// 403: the dashboard is read-only.
pub(crate) fn read_only_refused<B: Backend>(app: &App<B>, ctx: &ReqCtx) -> Response {
    refusal(
        app,
        ctx,
        StatusCode::FORBIDDEN,
        "Read-only",
        "This dashboard is read-only: replaying and purging are off (it was started with read_only / --read-only). Nothing was changed.",
    )
}

/// A form body, or 413 when it is larger than any form of the dashboard.
#[allow(clippy::result_large_err)]
pub(crate) fn form<B: Backend>(
    app: &App<B>,
    ctx: &ReqCtx,
    body: &[u8],
) -> Result<Params, Response> {
    if body.len() > MAX_INPUT {
        return Err(too_large(app, ctx, StatusCode::PAYLOAD_TOO_LARGE));
    }
    Ok(Params::parse(body))
}

/// 421: the `Host` is none the dashboard answers to (a DNS rebinding, or a name to allow).
pub(crate) fn misdirected<B: Backend>(app: &App<B>, ctx: &ReqCtx, host: &str) -> Response {
    let message = format!(
        "This dashboard does not answer to the host `{host}`: a web page under another name pointed at this address (DNS rebinding) could otherwise read and change it. Open it at localhost or its IP address, or, if `{host}` is its real name (behind a proxy), allow it: Dashboard::allowed_host(\"{host}\") in code, --allowed-host {host} on the command line."
    );
    refusal(
        app,
        ctx,
        StatusCode::MISDIRECTED_REQUEST,
        "Unknown host",
        &message,
    )
}

/// 403: a POST sent from another site (its `Origin` or `Sec-Fetch-Site`).
pub(crate) fn cross_site_refused<B: Backend>(app: &App<B>, ctx: &ReqCtx, why: &str) -> Response {
    let message = format!(
        "This form was sent from another site ({why}): nothing was changed. Open the dashboard at its own address and submit the form there; behind a proxy that rewrites the Host, allow the public name with --allowed-host / Dashboard::allowed_host."
    );
    refusal(app, ctx, StatusCode::FORBIDDEN, "Refused", &message)
}

/// 414 or 413: the query string or the form is larger than any the dashboard makes.
pub(crate) fn too_large<B: Backend>(app: &App<B>, ctx: &ReqCtx, status: StatusCode) -> Response {
    let message = format!(
        "The request is larger than {} KB, more than any form of this dashboard sends: nothing was read or changed. Select fewer dead letters (at most {}), or replay or purge them by kind or all at once.",
        MAX_INPUT / 1024,
        MAX_SELECTED
    );
    refusal(app, ctx, status, "Too large", &message)
}

/// 429: too many failed credentials from this client, or from everyone.
pub(crate) fn throttled<B: Backend>(
    app: &App<B>,
    ctx: &ReqCtx,
    wait: std::time::Duration,
) -> Response {
    let secs = wait.as_secs().max(1);
    let message = format!(
        "Too many wrong tokens or passwords were tried (at most {} a minute per client, {} in all): this attempt was not checked. Try again in {secs}s.",
        GUESSES_PER_CLIENT, GUESSES_IN_TOTAL
    );
    let mut resp = refusal(
        app,
        ctx,
        StatusCode::TOO_MANY_REQUESTS,
        "Too many attempts",
        &message,
    );
    if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}
