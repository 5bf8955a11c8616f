//! A job's result and its last progress: `GET jobs/result?id=..` (and `jobs/{id}/result`),
//! refreshed every 2 s from `api/result?id=..` until the result is there; the value (escaped,
//! at most [`SHOWN`] bytes on the page) and `jobs/result/download?id=..`, the whole of it.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use chrono::Utc;
use maud::{Markup, html};
use serde_json::json;
use stagedoor_jobs::results::{JobResult, Progress, ResultError};

use crate::data::{App, Backend};
use crate::pages::refusal::refusal;
use crate::params::{Params, id_problem, query_string};
use crate::render::{self, Tab};
use crate::security::ReqCtx;

/// The most bytes of a result's JSON the page shows; the download has all of it.
pub(crate) const SHOWN: usize = 64 * 1024;

/// `GET jobs/result?id=..`.
pub(crate) async fn page<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    uri: Uri,
) -> Response {
    show(&app, &ctx, Params::query(&uri).get("id")).await
}

/// `GET jobs/{id}/result`.
pub(crate) async fn by_path<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    Path(id): Path<String>,
) -> Response {
    show(&app, &ctx, Some(&id)).await
}

/// The id, or why it names no job (for a 400 page).
fn checked(id: Option<&str>) -> Result<&str, String> {
    match id {
        None => Err("The link names no job: it needs id (the job's id).".to_owned()),
        Some(id) => id_problem(id).map_or(Ok(id), Err),
    }
}

/// The 400 page of an id that names no job.
fn bad_id<B: Backend>(app: &App<B>, ctx: &ReqCtx, why: &str) -> Response {
    refusal(app, ctx, StatusCode::BAD_REQUEST, "Which job?", why)
}

async fn show<B: Backend>(app: &App<B>, ctx: &ReqCtx, id: Option<&str>) -> Response {
    let id = match checked(id) {
        Ok(id) => id,
        Err(why) => return bad_id(app, ctx, &why),
    };
    let (status, body) = match app.result(id).await {
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            render::problem("Cannot read the job's result", &e),
        ),
        Ok((r, p)) => {
            let status = if r.is_none() && p.is_none() {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::OK
            };
            (status, body(ctx, id, r.as_ref(), p.as_ref()))
        }
    };
    let heading = format!("Result of job {}", render::clip(id, 80));
    render::respond(status, render::page(app, ctx, Tab::None, &heading, body))
}

fn body(ctx: &ReqCtx, id: &str, r: Option<&JobResult>, p: Option<&Progress>) -> Markup {
    let q = query_string([("id", id)]);
    let api = ctx.url(&format!("/api/result?{q}"));
    html! {
        section #result data-live=[r.is_none().then_some("result")] data-src=(api) {
            (progress(p))
            @match r {
                None => {
                    (render::notice("No result yet: the job has not finished, finished without a value, or its result is past its retention."))
                    p.live-status { "Refreshed every 2 s." }
                }
                Some(r) => { (value(ctx, &q, r)) }
            }
        }
    }
}

fn progress(p: Option<&Progress>) -> Markup {
    let fraction = p.map_or(0.0, |p| p.fraction.clamp(0.0, 1.0));
    html! {
        div.progress {
            progress max="1" value=(fraction) data-field="bar" {}
            " " span data-field="percent" { (percent(fraction)) }
            " " span data-field="message" { (p.map(|p| render::clip(&p.message, 1024)).unwrap_or_default()) }
            @if let Some(p) = p {
                " " span.meta data-field="at" { "(" (render::at_relative(p.at, Utc::now())) ")" }
            }
        }
    }
}

fn percent(fraction: f32) -> String {
    format!("{:.0}%", f64::from(fraction) * 100.0)
}

fn value(ctx: &ReqCtx, q: &str, r: &JobResult) -> Markup {
    let finished = render::at_relative(r.finished_at(), Utc::now());
    let download = ctx.url(&format!("/jobs/result/download?{q}"));
    html! {
        p { "Finished " span data-field="finished" { (finished) } "." }
        @match r.json() {
            Ok(bytes) => {
                @let (text, cut) = shown(bytes);
                pre.result data-field="result" { (text) }
                @if cut {
                    p.notice { "Truncated: the first " (SHOWN) " bytes of " (bytes.len()) " are shown. " a href=(download) { "Download all of it" } "." }
                }
            }
            Err(ResultError::TooLarge { bytes, limit, .. }) => {
                (render::notice(&format!("Not kept: the handler returned {bytes} bytes of JSON, past the limit of {limit}.")))
            }
            Err(e) => { (render::problem("Cannot show the result", &e.to_string())) }
        }
    }
}

/// At most [`SHOWN`] bytes of `bytes` as text (pretty JSON when it is short enough to parse
/// and fits), and whether it was cut.
fn shown(bytes: &[u8]) -> (String, bool) {
    if bytes.len() <= SHOWN
        && let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes)
        && let Ok(pretty) = serde_json::to_string_pretty(&v)
        && pretty.len() <= SHOWN
    {
        return (pretty, false);
    }
    let end = bytes.len().min(SHOWN);
    (
        String::from_utf8_lossy(&bytes[..end]).into_owned(),
        end < bytes.len(),
    )
}

/// `GET jobs/result/download?id=..`: the result's JSON, whole, as a file.
pub(crate) async fn download<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    uri: Uri,
) -> Response {
    let p = Params::query(&uri);
    let id = match checked(p.get("id")) {
        Ok(id) => id,
        Err(why) => return bad_id(&app, &ctx, &why),
    };
    let found = app.result(id).await;
    let Ok((Some(r), _)) = found else {
        let why = match found {
            Err(e) => e,
            _ => "No result for this job.".to_owned(),
        };
        return refusal(&app, &ctx, StatusCode::NOT_FOUND, "No result", &why);
    };
    let Ok(bytes) = r.json() else {
        return refusal(
            &app,
            &ctx,
            StatusCode::NOT_FOUND,
            "No result",
            "The result was too large to keep.",
        );
    };
    let mut resp = bytes.to_vec().into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"result.json\""),
    );
    resp
}

/// `GET api/result?id=..`: whether the result is there, and the last progress (what the
/// page's script polls).
pub(crate) async fn json<B: Backend>(State(app): State<Arc<App<B>>>, uri: Uri) -> Response {
    let p = Params::query(&uri);
    let id = p.get("id").unwrap_or_default();
    if let Some(why) = id_problem(id) {
        return (StatusCode::BAD_REQUEST, Json(json!({ "error": why }))).into_response();
    }
    match app.result(id).await {
        Ok((r, p)) => Json(json!({
            "found": r.is_some(),
            "progress": p.map(|p| json!({
                "fraction": p.fraction,
                "percent": percent(p.fraction.clamp(0.0, 1.0)),
                "message": render::clip(&p.message, 1024),
                "at": render::at_relative(p.at, Utc::now()),
            })),
            "error": null,
        }))
        .into_response(),
        Err(e) => Json(json!({ "found": false, "progress": null, "error": e })).into_response(),
    }
}
