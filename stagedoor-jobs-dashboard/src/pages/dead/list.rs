//! `GET dead`: every dead letter with its count; with `dl`, that dead letter's jobs (filtered
//! by kind and by text in the error, a page at a time).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use chrono::Utc;
use maud::{Markup, html};
use stagedoor_jobs::{DeadLetter, DeadSelector};

use super::links::{confirm_link, dead_link};
use crate::data::{App, Backend, mask_text};
use crate::params::{Params, query_string};
use crate::render::{self, Tab};
use crate::security::ReqCtx;

/// Jobs per page.
const PAGE: usize = 50;
/// The list reads at most this many of a dead letter's newest jobs to filter and page them.
const SCAN: usize = 2_000;

/// `GET dead`: every dead letter with its count; with `dl`, that dead letter's jobs.
pub(crate) async fn list<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    uri: Uri,
) -> Response {
    let p = Params::query(&uri);
    let body = match p.get("dl") {
        None => overview(&app, &ctx).await,
        Some(dl) => letters(&app, &ctx, dl, &p).await,
    };
    let heading = match p.get("dl") {
        Some(dl) => format!("Dead letters: {dl}"),
        None => "Dead letters".to_owned(),
    };
    render::respond(
        StatusCode::OK,
        render::page(&app, &ctx, Tab::Dead, &heading, body),
    )
}

/// Every dead letter with its count.
async fn overview<B: Backend>(app: &App<B>, ctx: &ReqCtx) -> Markup {
    let names = match app.names().await {
        Ok(n) => n,
        Err(e) => return render::problem("Cannot list the dead letters", &e),
    };
    let rows = app.dead_rows(&names).await;
    html! {
        @if rows.is_empty() {
            (render::notice("No dead letters: no job has failed for good."))
        } @else {
            table.dead-letters {
                thead { tr { th { "Dead letter" } th { "Queue" } th.num { "Jobs" } } }
                tbody {
                    @for r in &rows {
                        tr data-dead=(r.name) {
                            td { a href=(dead_link(ctx, &r.name, &[])) { (r.name) } }
                            td { (r.source.as_deref().unwrap_or("-")) }
                            td.num data-field="dead" {
                                @match &r.len {
                                    Ok(n) => { (n) }
                                    Err(e) => { span.error-inline title=(e) { "error" } }
                                }
                            }
                        }
                    }
                }
            }
            @for r in &rows {
                @if let Err(e) = &r.len { (render::problem(&format!("Cannot count `{}`", r.name), e)) }
            }
        }
    }
}

/// The filters a list was asked for: a kind, and text the error contains.
struct Filter<'a> {
    kind: Option<&'a str>,
    text: Option<&'a str>,
}

impl<'a> Filter<'a> {
    fn of(p: &'a Params) -> Self {
        Self {
            kind: p.get("kind"),
            text: p.get("q").map(str::trim).filter(|t| !t.is_empty()),
        }
    }

    /// The dead letters of `scanned` that pass.
    fn apply<'d>(&self, scanned: &'d [DeadLetter]) -> Vec<&'d DeadLetter> {
        let needle = self.text.map(str::to_lowercase);
        scanned
            .iter()
            .filter(|d| self.kind.is_none_or(|k| d.envelope.kind() == k))
            .filter(|d| {
                needle
                    .as_deref()
                    .is_none_or(|n| d.error.to_lowercase().contains(n))
            })
            .collect()
    }

    /// The filters as query fields, for the pager's links.
    fn fields(&self) -> Vec<(&'a str, &'a str)> {
        [("kind", self.kind), ("q", self.text)]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    }
}

/// Dead letter `dl`'s jobs: its count, its kinds, the filters, a page of the matching jobs.
async fn letters<B: Backend>(app: &App<B>, ctx: &ReqCtx, dl: &str, p: &Params) -> Markup {
    let len = app.call(app.broker().dead_len(dl)).await;
    let scanned = match app.letters(dl, &DeadSelector::All, SCAN).await {
        Ok(l) => l,
        Err(e) => {
            return html! {
                (render::problem(&format!("Cannot read `{dl}`"), &e))
                p { a href=(ctx.url("/dead")) { "All dead letters" } }
            };
        }
    };
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &scanned {
        *kinds.entry(d.envelope.kind()).or_default() += 1;
    }
    let filter = Filter::of(p);
    let matching = filter.apply(&scanned);
    let pages = matching.len().div_ceil(PAGE).max(1);
    let page = p
        .get("page")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, pages);
    let shown = matching
        .get((page - 1) * PAGE..(page * PAGE).min(matching.len()))
        .unwrap_or_default();
    let read_only = app.read_only();
    let page_link = |n: usize| {
        let n = n.to_string();
        let mut extra = filter.fields();
        extra.push(("page", n.as_str()));
        dead_link(ctx, dl, &extra)
    };
    html! {
        p.summary {
            @match &len {
                Ok(n) => { strong data-field="total" { (n) } " dead letters in " code { (dl) } "." }
                Err(e) => { (render::problem("Cannot count them", e)) }
            }
            @if matches!(len, Ok(n) if n as usize > SCAN) {
                " The list, the kinds and the filters cover the newest " (SCAN) "."
            }
            " " a href=(ctx.url("/dead")) { "All dead letters" }
        }
        (kinds_table(ctx, dl, &kinds, read_only))
        (filter_form(ctx, dl, &kinds, &filter))
        p.count { (matching.len()) " matching, page " (page) " of " (pages) "." }
        @if shown.is_empty() {
            (render::notice("No dead letters here."))
        } @else {
            (selection(ctx, dl, shown, read_only))
            nav.pager {
                @if page > 1 { a rel="prev" href=(page_link(page - 1)) { "← Newer" } " " }
                @if page < pages { a rel="next" href=(page_link(page + 1)) { "Older →" } }
            }
        }
    }
}

/// The kinds among the jobs read, with their counts and actions.
fn kinds_table(ctx: &ReqCtx, dl: &str, kinds: &BTreeMap<&str, usize>, read_only: bool) -> Markup {
    html! {
        @if !kinds.is_empty() {
            table.kinds {
                thead { tr { th { "Kind" } th.num { "Jobs" } @if !read_only { th { "Actions" } } } }
                tbody {
                    @for (k, n) in kinds {
                        tr data-kind=(k) {
                            td { a href=(dead_link(ctx, dl, &[("kind", k)])) { (k) } }
                            td.num { (n) }
                            @if !read_only {
                                td.actions {
                                    a.button href=(confirm_link(ctx, dl, "replay", ("kind", k))) { "Replay kind" }
                                    " "
                                    a.button.danger href=(confirm_link(ctx, dl, "purge", ("kind", k))) { "Purge kind" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The filters' form: a kind, text in the error.
fn filter_form(ctx: &ReqCtx, dl: &str, kinds: &BTreeMap<&str, usize>, f: &Filter<'_>) -> Markup {
    html! {
        form.filters method="get" action=(ctx.url("/dead")) {
            input type="hidden" name="dl" value=(dl);
            label { "Kind " select name="kind" {
                option value="" { "any" }
                @for k in kinds.keys() {
                    option value=(k) selected[f.kind == Some(*k)] { (k) }
                }
            } }
            " "
            label { "Error contains " input type="search" name="q" value=(f.text.unwrap_or_default()); }
            " "
            button type="submit" { "Filter" }
            @if f.kind.is_some() || f.text.is_some() {
                " " a href=(dead_link(ctx, dl, &[])) { "Clear" }
            }
        }
    }
}

/// The jobs shown, one row each; with their checkboxes and the actions' buttons unless
/// `read_only`.
fn selection(ctx: &ReqCtx, dl: &str, shown: &[&DeadLetter], read_only: bool) -> Markup {
    let now = Utc::now();
    let rows = html! {
        table.letters {
            thead { tr {
                @if !read_only { th { span.sr { "Select" } } }
                th { "Failed" } th { "Kind" } th { "Job" } th.num { "Attempts" } th { "Queue" } th { "Error" }
            } }
            tbody {
                @for d in shown {
                    tr data-id=(d.id) {
                        @if !read_only {
                            td { input type="checkbox" name="id" value=(d.id) aria-label={"select " (d.id)}; }
                        }
                        td.time title=(render::at(d.failed_at)) { (render::at_relative(d.failed_at, now)) }
                        td { (d.envelope.kind()) }
                        td { a href={(ctx.url("/dead/letter")) "?" (query_string([("dl", dl), ("id", d.id.as_str())]))} { (d.envelope.id()) } }
                        td.num { (d.attempts) }
                        td { (d.origin) }
                        td.error-text { (render::clip(&mask_text(&d.error), 200)) }
                    }
                }
            }
        }
    };
    html! {
        @if read_only {
            (rows)
        } @else {
            form.selection method="get" action=(ctx.url("/dead/confirm")) {
                input type="hidden" name="dl" value=(dl);
                (rows)
                div.actions {
                    button type="submit" name="action" value="replay" { "Replay selected" }
                    " "
                    button.danger type="submit" name="action" value="purge" { "Purge selected" }
                    " "
                    a.button href=(confirm_link(ctx, dl, "replay", ("all", "1"))) { "Replay all" }
                    " "
                    a.button.danger href=(confirm_link(ctx, dl, "purge", ("all", "1"))) { "Purge all" }
                }
            }
        }
    }
}
