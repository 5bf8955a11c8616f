//! The pages and JSON endpoints, one file each.

pub(crate) mod assets;
pub(crate) mod dead;
pub(crate) mod login;
pub(crate) mod queues;
pub(crate) mod scheduled;
pub(crate) mod workers;

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use maud::html;

use crate::data::{App, Backend};
use crate::render::{self, Tab};
use crate::security::ReqCtx;

/// Any other path: a page that says so, with the tabs to go on from.
pub(crate) async fn not_found<B: Backend>(
    State(app): State<Arc<App<B>>>,
    ctx: Option<Extension<ReqCtx>>,
) -> Response {
    let ctx = ctx.map(|Extension(c)| c).unwrap_or_else(|| ReqCtx {
        base: String::new(),
        csrf: String::new(),
        csrf_sent: None,
        session: None,
    });
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
