//! `POST dead/action`: does the replay or purge (CSRF token required; refused read-only),
//! then says what it did.

use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use stagedoor_jobs::{DeadSelector, ReplayReport};

use super::links::dead_link;
use super::request::{Action, Selection, dead_letter_named, request};
use crate::data::{App, Backend};
use crate::pages::refusal::{csrf_refused, form, read_only_refused};
use crate::render::{self, Tab};
use crate::security::ReqCtx;

/// What an action did: the replay's report, how many were purged, the error that stopped it.
#[derive(Default)]
struct Done {
    report: ReplayReport,
    purged: u64,
    error: Option<String>,
}

/// `POST dead/action`: does the replay or purge (CSRF token required; refused read-only).
pub(crate) async fn action<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    body: Bytes,
) -> Response {
    if app.read_only() {
        return read_only_refused(&app, &ctx);
    }
    let p = match form(&app, &ctx, &body) {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    if !ctx.csrf_ok(p.get("csrf")) {
        return csrf_refused(&app, &ctx);
    }
    let (dl, action, sel) = match request(&app, &ctx, &p) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if let Err(resp) = dead_letter_named(&app, &ctx, &dl).await {
        return resp;
    }
    let done = perform(&app, &dl, action, &sel).await;
    app.changed().await;
    tracing::info!(
        dead_letter = %dl,
        action = action.name(),
        replayed = done.report.replayed,
        purged = done.purged,
        "dashboard action"
    );
    let heading = match action {
        Action::Replay => "Replayed",
        Action::Purge => "Purged",
    };
    render::respond(
        StatusCode::OK,
        render::page(
            &app,
            &ctx,
            Tab::Dead,
            heading,
            result(&ctx, &dl, action, &sel, &done),
        ),
    )
}

/// Replays or purges what `sel` takes of `dl`, one selector after another, stopping at the
/// first error.
async fn perform<B: Backend>(app: &App<B>, dl: &str, action: Action, sel: &Selection) -> Done {
    let selectors: Vec<DeadSelector> = match sel {
        Selection::Ids(ids) => ids.iter().cloned().map(DeadSelector::Id).collect(),
        Selection::Kind(k) => vec![DeadSelector::Kind(k.clone())],
        Selection::All => vec![DeadSelector::All],
    };
    let mut done = Done::default();
    for s in &selectors {
        let step = match action {
            Action::Replay => app.call(app.broker().replay(dl, s)).await.map(|r| {
                done.report.replayed += r.replayed;
                done.report.skipped += r.skipped;
                done.report.failed += r.failed;
            }),
            Action::Purge => app
                .call(app.broker().purge(dl, s))
                .await
                .map(|n| done.purged = done.purged.saturating_add(n)),
        };
        if let Err(e) = step {
            done.error = Some(e);
            break;
        }
    }
    done
}

/// The result's page body: the error, if one stopped the action, and what was done.
fn result(ctx: &ReqCtx, dl: &str, action: Action, sel: &Selection, done: &Done) -> Markup {
    let what = sel.describe(dl);
    let report = &done.report;
    html! {
        @if let Some(e) = &done.error {
            (render::problem(&format!("The {} stopped with an error", action.name()), e))
        }
        @match action {
            Action::Replay => {
                p.result data-replayed=(report.replayed) data-skipped=(report.skipped) data-failed=(report.failed) {
                    "Replayed " strong { (report.replayed) } " of " (what) "."
                    @if report.skipped > 0 { " " (report.skipped) " were skipped (replayed by someone else meanwhile)." }
                    @if report.failed > 0 { " " (report.failed) " could not be moved (see the service's log)." }
                }
            }
            Action::Purge => {
                p.result data-purged=(done.purged) { "Purged " strong { (done.purged) } " of " (what) "." }
            }
        }
        p { a href=(dead_link(ctx, dl, &[])) { "Back to " (dl) } " · " a href=(ctx.home()) { "Queues" } }
    }
}
