//! One dead letter: its page with every field, and its payload's exact bytes as a file.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use maud::{Markup, html};
use stagedoor_jobs::{DeadLetter, DeadSelector};

use super::links::{confirm_link, dead_link};
use super::payload::payload;
use crate::data::{App, Backend, mask_text};
use crate::pages::refusal::refusal;
use crate::params::{Params, query_string};
use crate::render::{self, Tab};
use crate::security::ReqCtx;

/// `GET dead/letter?dl=..&id=..`: one dead letter with every field.
pub(crate) async fn letter<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    uri: Uri,
) -> Response {
    let p = Params::query(&uri);
    let (Some(dl), Some(id)) = (p.get("dl"), p.get("id")) else {
        return refusal(
            &app,
            &ctx,
            StatusCode::BAD_REQUEST,
            "Which dead letter?",
            "The link names no dead letter: it needs dl (the dead letter) and id (the job).",
        );
    };
    let found = app.letters(dl, &DeadSelector::Id(id.to_owned()), 1).await;
    let back = dead_link(&ctx, dl, &[]);
    let (status, body) = match found {
        Err(e) => (
            StatusCode::OK,
            html! { (render::problem(&format!("Cannot read `{dl}`"), &e)) p { a href=(back) { "Back" } } },
        ),
        Ok(list) => match list.into_iter().next() {
            None => (
                StatusCode::NOT_FOUND,
                html! {
                    (render::notice(&format!("No dead letter `{id}` in `{dl}`: it was replayed or purged, or never was.")))
                    p { a href=(back) { "Back to " (dl) } }
                },
            ),
            Some(d) => (StatusCode::OK, one(&app, &ctx, dl, &d)),
        },
    };
    render::respond(
        status,
        render::page(&app, &ctx, Tab::Dead, &format!("Dead letter {id}"), body),
    )
}

/// `GET dead/payload?dl=..&id=..`: the exact bytes of one dead letter's payload, as a file.
pub(crate) async fn download<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    uri: Uri,
) -> Response {
    let p = Params::query(&uri);
    let (Some(dl), Some(id)) = (p.get("dl"), p.get("id")) else {
        return refusal(
            &app,
            &ctx,
            StatusCode::BAD_REQUEST,
            "Which payload?",
            "The link names no dead letter: it needs dl (the dead letter) and id (the job).",
        );
    };
    match app.letters(dl, &DeadSelector::Id(id.to_owned()), 1).await {
        Ok(list) => match list.into_iter().next() {
            Some(d) => {
                let name: String = d
                    .envelope
                    .id()
                    .to_string()
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                let disposition = format!("attachment; filename=\"{name}.payload\"");
                let mut resp = d.envelope.payload().to_vec().into_response();
                let h = resp.headers_mut();
                h.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                );
                if let Ok(v) = HeaderValue::from_str(&disposition) {
                    h.insert(header::CONTENT_DISPOSITION, v);
                }
                resp
            }
            None => refusal(
                &app,
                &ctx,
                StatusCode::NOT_FOUND,
                "No such dead letter",
                &format!(
                    "No dead letter `{id}` in `{dl}`: it was replayed or purged, or never was."
                ),
            ),
        },
        Err(e) => refusal(
            &app,
            &ctx,
            StatusCode::BAD_GATEWAY,
            "Cannot read the payload",
            &format!("Cannot read `{dl}`: {e}"),
        ),
    }
}

/// One dead letter's page: every field, its error, traceback and payload, its actions.
fn one<B: Backend>(app: &App<B>, ctx: &ReqCtx, dl: &str, d: &DeadLetter) -> Markup {
    let e = &d.envelope;
    let h = e.headers();
    let (what, text) = payload(e.payload());
    let now = Utc::now();
    html! {
        dl.fields {
            dt { "Job id" } dd data-field="job-id" { (e.id()) }
            dt { "Dead letter id" } dd { (d.id) }
            dt { "Kind" } dd data-field="kind" { (e.kind()) }
            dt { "Queue" } dd { (d.origin) }
            dt { "Dead letter" } dd { (dl) }
            dt { "Attempts" } dd data-field="attempts" { (d.attempts) }
            dt { "Failed" } dd { (render::at_relative(d.failed_at, now)) }
            dt { "Enqueued" } dd { (render::at(e.enqueued_at())) }
            dt { "Request id" } dd data-field="request-id" { (h.request_id.as_deref().unwrap_or("-")) }
            dt { "Trace" } dd data-field="trace" { (h.trace.as_deref().unwrap_or("-")) }
            @for (k, v) in &h.extra {
                dt { "Header " (k) } dd { (v) }
            }
        }
        h2 { "Error" }
        pre.error-text data-field="error" { (mask_text(&d.error)) }
        h2 { "Traceback" }
        @if d.traceback.is_empty() { p.hint { "None recorded." } } @else { pre data-field="traceback" { (mask_text(&d.traceback)) } }
        h2 { "Payload " span.hint { "(" (what) ", " (e.payload().len()) " bytes)" } }
        pre.payload data-field="payload" { (text) }
        p { a.button href={(ctx.url("/dead/payload")) "?" (query_string([("dl", dl), ("id", d.id.as_str())]))} download { "Download the payload" } " " span.hint { "(its exact bytes)" } }
        @if !app.read_only() {
            div.actions {
                a.button href=(confirm_link(ctx, dl, "replay", ("id", &d.id))) { "Replay" }
                " "
                a.button.danger href=(confirm_link(ctx, dl, "purge", ("id", &d.id))) { "Purge" }
            }
        }
        p { a href=(dead_link(ctx, dl, &[])) { "Back to " (dl) } }
    }
}
