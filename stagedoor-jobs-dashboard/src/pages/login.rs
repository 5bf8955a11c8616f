//! Signing in with the token (a form that sets a session cookie), signing out, and the 401
//! answers to a request without credentials.

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};

use super::refusal::{csrf_refused, form as read_form, refusal, throttled};
use crate::auth::{Auth, token_eq};
use crate::data::{App, Backend};
use crate::render::{self, Tab};
use crate::security::ReqCtx;
use crate::security::request::SESSION_COOKIE;
use crate::security::sessions::SESSION_TTL;

/// The sign-in form.
fn form(ctx: &ReqCtx, error: Option<&str>) -> Markup {
    html! {
        @if let Some(e) = error {
            div.error role="alert" { (e) }
        }
        form.login method="post" action=(ctx.url("/login")) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            label for="token" { "Access token" }
            input id="token" type="password" name="token" autocomplete="current-password" required autofocus;
            button type="submit" { "Sign in" }
        }
        p.hint { "The token is the secret the dashboard was started with (its environment variable, or "
            code { "Auth::Token" } "). Scripts can send it as " code { "Authorization: Bearer <token>" } "." }
    }
}

/// 401 for a request without credentials: basic auth asks the browser; a token shows the
/// sign-in form (or a JSON error to a script).
pub(crate) fn refuse<B: Backend>(app: &App<B>, ctx: &ReqCtx, api: bool) -> Response {
    match &app.dashboard.auth {
        Some(Auth::Basic { .. }) => {
            let mut resp = render::respond(
                StatusCode::UNAUTHORIZED,
                render::page(
                    app,
                    ctx,
                    Tab::None,
                    "Sign-in required",
                    html! { p { "This dashboard needs a user name and password." } },
                ),
            );
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"stagedoor-jobs\", charset=\"UTF-8\""),
            );
            resp
        }
        _ if api => (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({
                "error": "sign in first: send Authorization: Bearer <token>, or sign in on the dashboard's page"
            })),
        )
            .into_response(),
        _ => render::respond(
            StatusCode::UNAUTHORIZED,
            render::page(app, ctx, Tab::None, "Sign in", form(ctx, None)),
        ),
    }
}

/// `GET login`: the sign-in form (or the queues, when there is nothing to sign in to).
pub(crate) async fn page<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
) -> Response {
    if !matches!(app.dashboard.auth, Some(Auth::Token(_))) {
        return Redirect::to(&ctx.home()).into_response();
    }
    render::respond(
        StatusCode::OK,
        render::page(&app, &ctx, Tab::None, "Sign in", form(&ctx, None)),
    )
}

/// `POST login`: checks the CSRF token and the access token, then starts a session.
pub(crate) async fn submit<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    body: Bytes,
) -> Response {
    let Some(Auth::Token(secret)) = &app.dashboard.auth else {
        return Redirect::to(&ctx.home()).into_response();
    };
    let form_data = match read_form(&app, &ctx, &body) {
        Ok(f) => f,
        Err(resp) => return resp,
    };
    if !ctx.csrf_ok(form_data.get("csrf")) {
        return csrf_refused(&app, &ctx);
    }
    if let Some(wait) = app.throttle.blocked(ctx.client) {
        return throttled(&app, &ctx, wait);
    }
    if !form_data
        .get("token")
        .is_some_and(|t| token_eq(t.trim(), secret))
    {
        app.throttle.failed(ctx.client);
        return render::respond(
            StatusCode::UNAUTHORIZED,
            render::page(
                &app,
                &ctx,
                Tab::None,
                "Sign in",
                form(&ctx, Some("That is not the dashboard's token.")),
            ),
        );
    }
    let Some(session) = app.sessions.start() else {
        return refusal(
            &app,
            &ctx,
            StatusCode::INTERNAL_SERVER_ERROR,
            "Cannot sign in",
            "The operating system gave no random bytes for a session id.",
        );
    };
    let mut resp = Redirect::to(&ctx.home()).into_response();
    if let Ok(v) =
        HeaderValue::from_str(&ctx.cookie(SESSION_COOKIE, &session, Some(SESSION_TTL.as_secs())))
    {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    resp
}

/// `POST logout`: ends the session.
pub(crate) async fn logout<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    body: Bytes,
) -> Response {
    let form_data = match read_form(&app, &ctx, &body) {
        Ok(f) => f,
        Err(resp) => return resp,
    };
    if !ctx.csrf_ok(form_data.get("csrf")) {
        return csrf_refused(&app, &ctx);
    }
    if let Some(s) = &ctx.session {
        app.sessions.end(s);
    }
    let mut resp = Redirect::to(&ctx.url("/login")).into_response();
    if let Ok(v) = HeaderValue::from_str(&ctx.cookie(SESSION_COOKIE, "", Some(0))) {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    resp
}
