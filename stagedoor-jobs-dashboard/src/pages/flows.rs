//! The flows page: a form for a flow's (or batch's) id or a job's id, and flow ID's jobs with
//! their states, parents and what holds the flow. `GET flows?id=..` and `GET flows/{id}`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use maud::{Markup, html};
use stagedoor_jobs::flow::{FlowView, NodeState, NodeView};

use crate::data::{App, Backend};
use crate::pages::refusal::refusal;
use crate::params::{MAX_ID, Params, id_problem, query_string};
use crate::render::{self, Tab};
use crate::security::ReqCtx;

/// A node's state as shown.
pub(crate) fn state_name(s: NodeState) -> &'static str {
    match s {
        NodeState::Waiting => "waiting",
        NodeState::Ready => "ready",
        NodeState::Released => "released",
        NodeState::Done => "done",
        NodeState::Failed => "failed",
        NodeState::Skipped => "skipped",
        NodeState::Held => "held",
    }
}

/// `GET flows?id=..`: the form, and the flow when an id is given.
pub(crate) async fn page<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    uri: Uri,
) -> Response {
    let p = Params::query(&uri);
    show(&app, &ctx, p.get("id")).await
}

/// `GET flows/{id}`.
pub(crate) async fn by_path<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    Path(id): Path<String>,
) -> Response {
    show(&app, &ctx, Some(&id)).await
}

async fn show<B: Backend>(app: &App<B>, ctx: &ReqCtx, id: Option<&str>) -> Response {
    let Some(id) = id else {
        let body = forms(ctx, "");
        return render::respond(
            StatusCode::OK,
            render::page(app, ctx, Tab::None, "Flows", body),
        );
    };
    if let Some(why) = id_problem(id) {
        return refusal(app, ctx, StatusCode::BAD_REQUEST, "Which flow?", &why);
    }
    let (status, shown) = match app.flow(id).await {
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            render::problem("Cannot read the flow", &e),
        ),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            render::notice(&format!(
                "No flow or batch `{}`: it was never published, or it finished and its record ran out.",
                render::clip(id, 80)
            )),
        ),
        Ok(Some(view)) => (StatusCode::OK, flow(ctx, &view)),
    };
    let body = html! { (forms(ctx, id)) (shown) };
    let heading = format!("Flow {}", render::clip(id, 80));
    render::respond(status, render::page(app, ctx, Tab::None, &heading, body))
}

/// The two GET forms: a flow by id, a job's result by id.
fn forms(ctx: &ReqCtx, id: &str) -> Markup {
    html! {
        form.inline method="get" action=(ctx.url("/flows")) {
            label { "Flow or batch id " input type="text" name="id" value=(id) maxlength=(MAX_ID) required; }
            " " button type="submit" { "Show the flow" }
        }
        form.inline method="get" action=(ctx.url("/jobs/result")) {
            label { "Job id " input type="text" name="id" maxlength=(MAX_ID) required; }
            " " button type="submit" { "Show its result" }
        }
    }
}

/// What a waiting or held node waits for: its parents not done yet, or the batch's seal.
fn holder(view: &FlowView, n: &NodeView) -> String {
    if n.state == NodeState::Held {
        return n
            .why
            .clone()
            .unwrap_or_else(|| "a failed parent".to_owned());
    }
    let open: Vec<&str> = n
        .parents
        .iter()
        .filter(|p| {
            view.nodes
                .iter()
                .find(|m| &m.id == *p)
                .is_none_or(|m| m.state != NodeState::Done)
        })
        .map(String::as_str)
        .collect();
    if open.is_empty() {
        "the batch to be sealed".to_owned()
    } else {
        open.join(", ")
    }
}

/// The counts by state, and what holds the flow (each waiting or held job and on what).
fn summary(view: &FlowView) -> (String, Vec<String>) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &view.nodes {
        *counts.entry(state_name(n.state)).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let held = view
        .nodes
        .iter()
        .filter(|n| matches!(n.state, NodeState::Waiting | NodeState::Held))
        .map(|n| {
            let verb = if n.state == NodeState::Held {
                "is held:"
            } else {
                "waits for"
            };
            format!("{} {verb} {}", n.id, holder(view, n))
        })
        .collect();
    (
        format!("{} jobs: {}.", view.nodes.len(), counts.join(", ")),
        held,
    )
}

/// The flow: its summary, then a row per job.
fn flow(ctx: &ReqCtx, view: &FlowView) -> Markup {
    let (counts, held) = summary(view);
    let result = |id: &str| ctx.url(&format!("/jobs/result?{}", query_string([("id", id)])));
    html! {
        section #flow {
            p.summary data-field="summary" {
                (counts) " " (if view.sealed { "Sealed." } else { "Open: jobs may still be added." })
            }
            @if held.is_empty() {
                (render::notice("Nothing holds it."))
            } @else {
                p { "What holds it:" }
                ul.held { @for h in &held { li { (h) } } }
            }
            table.flow {
                thead { tr {
                    th { "Job" } th { "Queue" } th { "Kind" } th { "State" }
                    th { "Parents" } th { "On a parent's failure" } th { "Why" }
                } }
                tbody {
                    @for n in &view.nodes {
                        tr data-node=(n.id) {
                            td { a href=(result(&n.id)) { (n.id) } }
                            td { (n.queue) }
                            td { (n.kind) }
                            td data-field="state" { span class={ "state " (state_name(n.state)) } { (state_name(n.state)) } }
                            td { (n.parents.join(", ")) }
                            td { (format!("{:?}", n.policy).to_lowercase()) }
                            td { (n.why.as_deref().map(|w| render::clip(w, 300)).unwrap_or_default()) }
                        }
                    }
                }
            }
        }
    }
}
