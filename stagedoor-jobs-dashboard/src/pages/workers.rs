//! The workers page: the live workers (host, pid, queues, jobs in flight, last heartbeat),
//! refreshed every 2 s from `api/workers`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use maud::html;
use serde_json::json;
use stagedoor_jobs::activity::WorkerReport;

use crate::data::{App, Backend};
use crate::render::{self, Tab};
use crate::security::ReqCtx;

fn queues(w: &WorkerReport) -> String {
    w.queues
        .iter()
        .map(|q| format!("{} ({}/{})", q.queue, q.in_flight, q.concurrency))
        .collect::<Vec<_>>()
        .join(", ")
}

fn in_flight(w: &WorkerReport) -> usize {
    w.queues.iter().map(|q| q.in_flight).sum()
}

fn ago(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    render::at_relative(t, now)
}

/// `GET workers`.
pub(crate) async fn page<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
) -> Response {
    let now = Utc::now();
    let workers = app.workers().await;
    let body = html! {
        section id="workers" data-live="workers" {
            @match &*workers {
                Err(e) => { (render::problem("Cannot read the workers' reports", e)) }
                Ok(list) => {
                    p.summary { strong data-field="count" { (list.len()) } " live " (if list.len() == 1 { "worker" } else { "workers" }) "." }
                    table.workers {
                        thead { tr {
                            th { "Host" } th.num { "Pid" } th { "Service" } th { "Queues (in flight/concurrency)" }
                            th.num { "In flight" } th { "Started" } th { "Last heartbeat" }
                        } }
                        tbody {
                            @for w in list {
                                tr data-worker=(w.id) {
                                    td data-field="host" { (w.host) }
                                    td.num data-field="pid" { (w.pid) }
                                    td data-field="app" { (if w.app.is_empty() { "-" } else { &w.app }) }
                                    td data-field="queues" { (queues(w)) }
                                    td.num data-field="in_flight" { (in_flight(w)) }
                                    td data-field="started" { (ago(w.started_at, now)) }
                                    td data-field="heartbeat" { (ago(w.heartbeat_at, now)) }
                                }
                            }
                        }
                    }
                    @if list.is_empty() {
                        (render::notice("No live workers: no service has reported in the last 15 s."))
                    }
                }
            }
            p.live-status { "Refreshed every 2 s." }
        }
    };
    render::respond(
        StatusCode::OK,
        render::page(&app, &ctx, Tab::Workers, "Workers", body),
    )
}

/// `GET api/workers`: the live workers as JSON (what the page's script polls).
pub(crate) async fn json<B: Backend>(State(app): State<Arc<App<B>>>) -> Response {
    let now = Utc::now();
    match &*app.workers().await {
        Ok(list) => Json(json!({
            "workers": list.iter().map(|w| json!({
                "id": w.id,
                "host": w.host,
                "pid": w.pid,
                "app": if w.app.is_empty() { "-" } else { w.app.as_str() },
                "queues": queues(w),
                "in_flight": in_flight(w),
                "started": ago(w.started_at, now),
                "heartbeat": ago(w.heartbeat_at, now),
                "heartbeat_at": w.heartbeat_at,
            })).collect::<Vec<_>>(),
            "error": null,
        }))
        .into_response(),
        Err(e) => Json(json!({ "workers": [], "error": e })).into_response(),
    }
}
