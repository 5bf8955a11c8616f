//! The scheduled page: each schedule the live workers run (its last and next tick, what it does
//! with missed ticks), and each queue's delayed jobs with their due time.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use maud::html;
use stagedoor_jobs::activity::{DelayedJob, ScheduleReport, WorkerReport};

use crate::data::{App, Backend};
use crate::render::{self, Tab};
use crate::security::ReqCtx;

/// Delayed jobs shown per queue.
pub(crate) const DELAYED_SHOWN: usize = 100;

/// Each schedule once (as the worker with the latest heartbeat reports it), by name.
fn schedules(workers: &[WorkerReport]) -> Vec<(&ScheduleReport, &WorkerReport)> {
    let mut by_name: BTreeMap<&str, (&ScheduleReport, &WorkerReport)> = BTreeMap::new();
    for w in workers {
        for s in &w.schedules {
            let newer = by_name
                .get(s.name.as_str())
                .is_none_or(|(_, seen)| seen.heartbeat_at < w.heartbeat_at);
            if newer {
                by_name.insert(&s.name, (s, w));
            }
        }
    }
    by_name.into_values().collect()
}

/// `GET scheduled`.
pub(crate) async fn page<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
) -> Response {
    let now = Utc::now();
    let workers = app.workers().await;
    let names = app.names().await;
    let mut delayed: Vec<(String, Result<Vec<DelayedJob>, String>)> = Vec::new();
    if let Ok(n) = &names {
        for q in &n.queues {
            let jobs = app.call(app.broker().delayed(q, DELAYED_SHOWN)).await;
            delayed.push((q.clone(), jobs));
        }
    }
    let when = |t: Option<chrono::DateTime<Utc>>| {
        t.map_or("-".to_owned(), |t| render::at_relative(t, now))
    };
    let body = html! {
        h2 { "Schedules" }
        @match &*workers {
            Err(e) => { (render::problem("Cannot read the workers' reports", e)) }
            Ok(w) => {
                @let list = schedules(w);
                @if list.is_empty() {
                    (render::notice("No schedules: no live worker reports one (schedules show while a service that runs them is up)."))
                } @else {
                    table.schedules {
                        thead { tr {
                            th { "Schedule" } th { "Queue" } th { "When" } th { "Missed ticks" }
                            th { "Last tick" } th { "Next tick" } th { "Reported by" }
                        } }
                        tbody {
                            @for (s, w) in &list {
                                tr data-schedule=(s.name) {
                                    td { (s.name) } td { (s.queue) } td { code { (s.when) } } td { (s.missed) }
                                    td { (when(s.last_tick)) } td { (when(s.next_tick)) }
                                    td { (w.host) ":" (w.pid) }
                                }
                            }
                        }
                    }
                }
            }
        }
        h2 { "Delayed jobs" }
        @if let Err(e) = &names { (render::problem("Cannot list the queues", e)) }
        @let any = delayed.iter().any(|(_, j)| !matches!(j, Ok(v) if v.is_empty()));
        @if names.is_ok() && !any {
            (render::notice("No delayed jobs: nothing waits for a later time."))
        }
        @for (q, jobs) in &delayed {
            @match jobs {
                Err(e) => { (render::problem(&format!("Cannot read the delayed jobs of `{q}`"), e)) }
                Ok(list) if list.is_empty() => {}
                Ok(list) => {
                    h3 { (q) " " span.hint { "(" (list.len()) @if list.len() >= DELAYED_SHOWN { "+" } ")" } }
                    table.delayed data-queue=(q) {
                        thead { tr { th { "Due" } th { "Kind" } th { "Job" } th.num { "Attempt" } } }
                        tbody {
                            @for j in list {
                                tr data-id=(j.id) {
                                    td { (render::at_relative(j.due, now)) }
                                    td { (j.kind) } td { (j.id) } td.num { (j.attempt) }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    render::respond(
        StatusCode::OK,
        render::page(&app, &ctx, Tab::Scheduled, "Scheduled", body),
    )
}
