//! `GET dead/confirm`: says how many jobs an action takes, and asks to go on (a POST).

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use maud::{Markup, html};
use stagedoor_jobs::{DeadLetter, DeadSelector};

use super::links::dead_link;
use super::request::{Action, Selection, dead_letter_named, request};
use crate::data::{App, Backend, Shown, mask_text};
use crate::pages::refusal::read_only_refused;
use crate::params::Params;
use crate::render::{self, Tab};
use crate::security::ReqCtx;

/// A confirmation counts at most this many jobs of a kind.
const COUNT_CAP: usize = 100_000;

/// `GET dead/confirm`: says how many jobs the action takes, and asks to go on (a POST).
pub(crate) async fn confirm<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    uri: Uri,
) -> Response {
    if app.read_only() {
        return read_only_refused(&app, &ctx);
    }
    let p = Params::query(&uri);
    let (dl, action, sel) = match request(&app, &ctx, &p) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if let Err(resp) = dead_letter_named(&app, &ctx, &dl).await {
        return resp;
    }
    let what = sel.describe(&dl);
    let body = match count(&app, &dl, &sel).await {
        Err(e) => render::problem(&format!("Cannot count {what}"), &e),
        Ok((0, _)) => html! {
            (render::notice(&format!("Nothing to {}: {what} holds no job now.", action.name())))
            p { a href=(dead_link(&ctx, &dl, &[])) { "Back to " (dl) } }
        },
        Ok((n, sample)) => ask(&ctx, &dl, action, &sel, n, &sample),
    };
    let heading = match action {
        Action::Replay => "Replay?",
        Action::Purge => "Purge?",
    };
    render::respond(
        StatusCode::OK,
        render::page(&app, &ctx, Tab::Dead, heading, body),
    )
}

/// How many dead letters of `dl` the selection takes now, and a sample to show.
async fn count<B: Backend>(
    app: &App<B>,
    dl: &str,
    sel: &Selection,
) -> Shown<(u64, Vec<DeadLetter>)> {
    match sel {
        Selection::Ids(ids) => {
            let mut found = Vec::new();
            for id in ids {
                found.extend(app.letters(dl, &DeadSelector::Id(id.clone()), 1).await?);
            }
            Ok((found.len() as u64, found))
        }
        Selection::Kind(k) => app
            .letters(dl, &DeadSelector::Kind(k.clone()), COUNT_CAP)
            .await
            .map(|l| (l.len() as u64, l)),
        Selection::All => {
            let n = app.call(app.broker().dead_len(dl)).await?;
            app.letters(dl, &DeadSelector::All, 20)
                .await
                .map(|l| (n, l))
        }
    }
}

/// The question: what the action will do to the `n` jobs, its form, and a sample of them.
fn ask(
    ctx: &ReqCtx,
    dl: &str,
    action: Action,
    sel: &Selection,
    n: u64,
    sample: &[DeadLetter],
) -> Markup {
    let what = sel.describe(dl);
    let jobs = if n == 1 { "job" } else { "jobs" };
    let (sentence, button) = match action {
        Action::Replay => (
            format!(
                "This will move {n} {jobs} ({what}) back to the queue each failed on, with their attempts reset."
            ),
            format!("Replay {n} {jobs}"),
        ),
        Action::Purge => (
            format!(
                "This will delete {n} {jobs} ({what}) for good: they cannot be replayed afterwards."
            ),
            format!("Purge {n} {jobs}"),
        ),
    };
    html! {
        p.confirm data-count=(n) { (sentence) }
        @if matches!(sel, Selection::Kind(_)) && n as usize >= COUNT_CAP {
            p.hint { "Counted up to " (COUNT_CAP) "; the action takes every one." }
        }
        form.confirm method="post" action=(ctx.url("/dead/action")) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            input type="hidden" name="dl" value=(dl);
            input type="hidden" name="action" value=(action.name());
            (sel.hidden())
            button.danger[action == Action::Purge] type="submit" { (button) }
            " "
            a href=(dead_link(ctx, dl, &[])) { "Cancel" }
        }
        @if !sample.is_empty() {
            h2 { "Among them" }
            ul.sample {
                @for d in sample.iter().take(20) {
                    li { code { (d.envelope.id()) } " " (d.envelope.kind()) ": " (render::clip(&mask_text(&d.error), 120)) }
                }
            }
        }
    }
}
