//! The queues page: each queue's ready, running, delayed and dead jobs and its oldest job's
//! age, refreshed every 2 s from `api/queues`, and the chart of the last hour.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use maud::{Markup, html};
use serde_json::{Value, json};

use crate::chart;
use crate::data::{App, Backend, Polled, QueueRow};
use crate::params::query_string;
use crate::render::{self, Tab};
use crate::security::ReqCtx;

/// What the page and its JSON show.
struct Overview {
    polled: Arc<Polled>,
    chart: Markup,
}

/// What every tab shows, read from the backend at most once a second for all of them.
async fn overview<B: Backend>(app: &App<B>) -> Overview {
    let polled = app.polled(chart::since).await;
    let chart = chart::svg(&polled.minutes, polled.now);
    Overview { polled, chart }
}

fn cell<T>(r: &Result<T, String>, f: impl Fn(&T) -> String) -> String {
    match r {
        Ok(v) => f(v),
        Err(_) => "error".to_owned(),
    }
}

/// The values of a row, by field: what the table shows and the JSON carries.
fn fields(r: &QueueRow) -> [(&'static str, String); 5] {
    [
        ("ready", cell(&r.stats, |s| s.ready.to_string())),
        ("running", cell(&r.stats, |s| s.pending.to_string())),
        ("delayed", cell(&r.stats, |s| s.delayed.to_string())),
        ("dead", cell(&r.dead, u64::to_string)),
        (
            "oldest",
            cell(&r.stats, |s| s.oldest.map_or("-".to_owned(), render::age)),
        ),
    ]
}

fn row_error(r: &QueueRow) -> Option<String> {
    match (&r.stats, &r.dead) {
        (Err(e), _) => Some(format!("counts of `{}`: {e}", r.queue)),
        (_, Err(e)) => Some(format!("dead letters of `{}`: {e}", r.dead_letter)),
        _ => None,
    }
}

/// `GET /`: the queues page.
pub(crate) async fn page<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
) -> Response {
    let o = overview(&app).await;
    let body = html! {
        section id="queues" data-live="queues" {
            @match &o.polled.rows {
                Err(e) => { (render::problem("Cannot list the queues", e)) }
                Ok(rows) if rows.is_empty() => { (render::notice("No queues yet: the backend holds no jobs.")) }
                Ok(rows) => {
                    @for r in rows {
                        @if let Some(e) = row_error(r) { (render::problem("The backend answered with an error", &e)) }
                    }
                    table.queues {
                        thead { tr {
                            th { "Queue" } th.num { "Ready" } th.num { "Running" } th.num { "Delayed" }
                            th.num { "Dead" } th.num { "Oldest" }
                        } }
                        tbody {
                            @for r in rows {
                                tr data-queue=(r.queue) {
                                    td.name { (r.queue) }
                                    @for (name, value) in fields(r) {
                                        td.num data-field=(name) {
                                            @if name == "dead" {
                                                a href={(ctx.url("/dead")) "?" (query_string([("dl", r.dead_letter.as_str())]))} { (value) }
                                            } @else { (value) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            p.live-status { "Refreshed every 2 s." }
        }
        section.chart-box {
            h2 { "Last hour" }
            @if let Some(e) = &o.polled.chart_error { (render::problem("Cannot read the per-minute counts", e)) }
            div id="chart" { (o.chart) }
        }
    };
    render::respond(
        StatusCode::OK,
        render::page(&app, &ctx, Tab::Queues, "Queues", body),
    )
}

/// `GET api/queues`: the same counts as JSON (what the page's script polls), and the chart.
pub(crate) async fn json<B: Backend>(State(app): State<Arc<App<B>>>) -> Response {
    let o = overview(&app).await;
    let (queues, error) = match &o.polled.rows {
        Ok(rows) => (
            rows.iter()
                .map(|r| {
                    let mut v = serde_json::Map::new();
                    v.insert("queue".into(), json!(r.queue));
                    v.insert("dead_letter".into(), json!(r.dead_letter));
                    if let Ok(s) = &r.stats {
                        v.insert("ready_count".into(), json!(s.ready));
                        v.insert("running_count".into(), json!(s.pending));
                        v.insert("delayed_count".into(), json!(s.delayed));
                        v.insert(
                            "oldest_seconds".into(),
                            json!(s.oldest.map(|d| d.as_secs_f64())),
                        );
                    }
                    if let Ok(d) = &r.dead {
                        v.insert("dead_count".into(), json!(d));
                    }
                    for (name, value) in fields(r) {
                        v.insert(name.into(), json!(value));
                    }
                    v.insert("error".into(), json!(row_error(r)));
                    Value::Object(v)
                })
                .collect::<Vec<_>>(),
            None,
        ),
        Err(e) => (Vec::new(), Some(e.clone())),
    };
    Json(json!({
        "queues": queues,
        "error": error,
        "chart": o.chart.into_string(),
        "chart_error": o.polled.chart_error,
    }))
    .into_response()
}
