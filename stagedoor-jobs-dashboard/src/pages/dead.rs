//! The dead letters: the list of dead letters, one dead letter's jobs (filter by kind and by
//! text in the error, paging), one job, and the actions (replay or purge one, the selected, a
//! kind, all), each through a confirmation page that says how many jobs it takes, then a POST,
//! then a page with the result.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use maud::{Markup, html};
use stagedoor_jobs::{DeadLetter, DeadSelector, ReplayReport};

use crate::data::{App, Backend, mask_text};
use crate::params::{Params, query_string};
use crate::render::{self, Tab};
use crate::security::ReqCtx;

/// Jobs per page.
pub(crate) const PAGE: usize = 50;
/// The list reads at most this many of a dead letter's newest jobs to filter and page them.
pub(crate) const SCAN: usize = 2_000;
/// A confirmation counts at most this many jobs of a kind.
pub(crate) const COUNT_CAP: usize = 100_000;
/// A selection holds at most this many ids.
pub(crate) const MAX_SELECTED: usize = 1_000;

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

fn dead_link(ctx: &ReqCtx, dl: &str, extra: &[(&str, &str)]) -> String {
    let mut pairs = vec![("dl", dl)];
    pairs.extend_from_slice(extra);
    format!("{}?{}", ctx.url("/dead"), query_string(pairs))
}

fn confirm_link(ctx: &ReqCtx, dl: &str, action: &str, extra: (&str, &str)) -> String {
    format!(
        "{}?{}",
        ctx.url("/dead/confirm"),
        query_string([("dl", dl), ("action", action), extra])
    )
}

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
    let kind = p.get("kind");
    let text = p.get("q").map(str::trim).filter(|t| !t.is_empty());
    let needle = text.map(str::to_lowercase);
    let matching: Vec<&DeadLetter> = scanned
        .iter()
        .filter(|d| kind.is_none_or(|k| d.envelope.kind() == k))
        .filter(|d| {
            needle
                .as_deref()
                .is_none_or(|n| d.error.to_lowercase().contains(n))
        })
        .collect();
    let pages = matching.len().div_ceil(PAGE).max(1);
    let page = p
        .get("page")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, pages);
    let shown = &matching[(page - 1) * PAGE..(page * PAGE).min(matching.len())];
    let read_only = app.read_only();
    let filters: Vec<(&str, &str)> = [("kind", kind), ("q", text)]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
    let page_link = |n: usize| {
        let n = n.to_string();
        let mut extra: Vec<(&str, &str)> = filters.to_vec();
        extra.push(("page", n.as_str()));
        dead_link(ctx, dl, &extra)
    };
    let now = Utc::now();
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
        @if !kinds.is_empty() {
            table.kinds {
                thead { tr { th { "Kind" } th.num { "Jobs" } @if !read_only { th { "Actions" } } } }
                tbody {
                    @for (k, n) in &kinds {
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
        form.filters method="get" action=(ctx.url("/dead")) {
            input type="hidden" name="dl" value=(dl);
            label { "Kind " select name="kind" {
                option value="" { "any" }
                @for k in kinds.keys() {
                    option value=(k) selected[kind == Some(*k)] { (k) }
                }
            } }
            " "
            label { "Error contains " input type="search" name="q" value=(text.unwrap_or_default()); }
            " "
            button type="submit" { "Filter" }
            @if kind.is_some() || text.is_some() {
                " " a href=(dead_link(ctx, dl, &[])) { "Clear" }
            }
        }
        p.count { (matching.len()) " matching, page " (page) " of " (pages) "." }
        @if shown.is_empty() {
            (render::notice("No dead letters here."))
        } @else {
            @let rows = html! {
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
            nav.pager {
                @if page > 1 { a rel="prev" href=(page_link(page - 1)) { "← Newer" } " " }
                @if page < pages { a rel="next" href=(page_link(page + 1)) { "Older →" } }
            }
        }
    }
}

/// The letter's page shows at most this many bytes of a payload (the rest is downloaded).
pub(crate) const VIEW_MAX: usize = 64 * 1024;

/// A payload for reading: pretty JSON, else text, else a hex dump, each bounded (a text or
/// JSON payload over [`VIEW_MAX`] shows its first bytes as text, then how many more).
fn payload(bytes: &[u8]) -> (&'static str, String) {
    const HEX_MAX: usize = 4_096;
    if bytes.len() > VIEW_MAX {
        let head = &bytes[..VIEW_MAX];
        let text = match std::str::from_utf8(head) {
            Ok(t) => Some(t),
            // Cut inside a character: the whole characters before it.
            Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).ok(),
            Err(_) => None,
        };
        if let Some(t) = text {
            let more = bytes.len() - t.len();
            return (
                "text, the beginning",
                format!("{t}\n… {more} bytes more (download the payload for every byte)\n"),
            );
        }
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes)
        && let Ok(pretty) = serde_json::to_string_pretty(&v)
    {
        return ("JSON", pretty);
    }
    if let Ok(s) = std::str::from_utf8(bytes) {
        return ("text", s.to_owned());
    }
    let mut out = String::new();
    for (n, chunk) in bytes[..bytes.len().min(HEX_MAX)].chunks(16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        let ascii: String = chunk
            .iter()
            .map(|b| {
                if b.is_ascii_graphic() || *b == b' ' {
                    *b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!(
            "{:08x}  {:<47}  |{ascii}|\n",
            n * 16,
            hex.join(" ")
        ));
    }
    if bytes.len() > HEX_MAX {
        out.push_str(&format!(
            "… {} bytes more (download the payload for every byte)\n",
            bytes.len() - HEX_MAX
        ));
    }
    ("binary, shown as hex", out)
}

/// `GET dead/letter?dl=..&id=..`: one dead letter with every field.
pub(crate) async fn letter<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    uri: Uri,
) -> Response {
    let p = Params::query(&uri);
    let (Some(dl), Some(id)) = (p.get("dl"), p.get("id")) else {
        return super::refusal(
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
        return super::refusal(
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
            None => super::refusal(
                &app,
                &ctx,
                StatusCode::NOT_FOUND,
                "No such dead letter",
                &format!(
                    "No dead letter `{id}` in `{dl}`: it was replayed or purged, or never was."
                ),
            ),
        },
        Err(e) => super::refusal(
            &app,
            &ctx,
            StatusCode::BAD_GATEWAY,
            "Cannot read the payload",
            &format!("Cannot read `{dl}`: {e}"),
        ),
    }
}

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

/// Which dead letters an action takes.
#[derive(Clone, Debug)]
enum Selection {
    Ids(Vec<String>),
    Kind(String),
    All,
}

impl Selection {
    /// The selection a request names (`Ok(None)`: none); `Err(n)` when it names `n` ids, more
    /// than [`MAX_SELECTED`] (refused before they are compared or looked up).
    fn from(p: &Params) -> Result<Option<Self>, usize> {
        let ids = p.all("id", MAX_SELECTED)?;
        Ok(if !ids.is_empty() {
            Some(Self::Ids(ids))
        } else if let Some(k) = p.get("kind") {
            Some(Self::Kind(k.to_owned()))
        } else if p.get("all") == Some("1") {
            Some(Self::All)
        } else {
            None
        })
    }

    fn describe(&self, dl: &str) -> String {
        match self {
            Self::Ids(ids) if ids.len() == 1 => format!("dead letter `{}` of `{dl}`", ids[0]),
            Self::Ids(ids) => format!("the {} selected dead letters of `{dl}`", ids.len()),
            Self::Kind(k) => format!("every dead letter of kind `{k}` in `{dl}`"),
            Self::All => format!("every dead letter in `{dl}`"),
        }
    }

    fn hidden(&self) -> Markup {
        html! {
            @match self {
                Self::Ids(ids) => { @for id in ids { input type="hidden" name="id" value=(id); } }
                Self::Kind(k) => { input type="hidden" name="kind" value=(k); }
                Self::All => { input type="hidden" name="all" value="1"; }
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Replay,
    Purge,
}

impl Action {
    fn from(p: &Params) -> Option<Self> {
        match p.get("action") {
            Some("replay") => Some(Self::Replay),
            Some("purge") => Some(Self::Purge),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Purge => "purge",
        }
    }
}

/// What an action request names, or the refusal page.
#[allow(clippy::result_large_err)]
fn request<B: Backend>(
    app: &App<B>,
    ctx: &ReqCtx,
    p: &Params,
) -> Result<(String, Action, Selection), Response> {
    let bad = |m: &str| super::refusal(app, ctx, StatusCode::BAD_REQUEST, "Nothing to do", m);
    let Some(dl) = p.get("dl") else {
        return Err(bad("The request names no dead letter (dl)."));
    };
    let Some(action) = Action::from(p) else {
        return Err(bad("The request names no action: replay or purge."));
    };
    let sel = match Selection::from(p) {
        Ok(Some(sel)) => sel,
        Ok(None) => {
            return Err(bad(
                "Nothing was selected: tick the dead letters to act on, or use a kind's or the whole dead letter's button.",
            ));
        }
        Err(n) => {
            return Err(bad(&format!(
                "At most {MAX_SELECTED} dead letters can be selected at once ({n} were sent): replay or purge them by kind instead."
            )));
        }
    };
    Ok((dl.to_owned(), action, sel))
}

/// Refuses a replay or purge of `dl` unless it names a dead letter, not a live queue. The
/// dashboard's rule ([`Dashboard::dead_letters_named`], when given) must accept it, then the
/// backend ([`DeadLetters::check_dead_letter`](stagedoor_jobs::DeadLetters::check_dead_letter):
/// named as its dead letters are, or declared by a mount of a live worker); when the backend
/// cannot tell, the backend's naming decides. The confirmation and the action alike ask it,
/// so a URL the page never links (`dl=emails`) gets a refusal, never a count of live jobs;
/// and the backend checks once more before it moves or deletes anything.
///
/// [`Dashboard::dead_letters_named`]: crate::Dashboard::dead_letters_named
async fn dead_letter_named<B: Backend>(
    app: &App<B>,
    ctx: &ReqCtx,
    dl: &str,
) -> Result<(), Response> {
    let refuse = |m: &str| {
        super::refusal(
            app,
            ctx,
            StatusCode::BAD_REQUEST,
            "Not a dead letter",
            &format!("{m} Nothing was replayed or purged."),
        )
    };
    let by_name = || {
        format!(
            "`{dl}` is not a dead letter here: replay and purge act on dead letters only (`{}` is the one of queue `{dl}`).",
            app.broker().default_dead_letter(dl)
        )
    };
    if app.dead_rule_says(dl) == Some(false) {
        return Err(refuse(&by_name()));
    }
    match app.dead_letter_check(dl).await {
        Some(Ok(())) => Ok(()),
        Some(Err(m)) => Err(refuse(&m)),
        None if app.is_dead_letter_name(dl) => Ok(()),
        None => Err(refuse(&by_name())),
    }
}

/// `GET dead/confirm`: says how many jobs the action takes, and asks to go on (a POST).
pub(crate) async fn confirm<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    uri: Uri,
) -> Response {
    if app.read_only() {
        return super::read_only_refused(&app, &ctx);
    }
    let p = Params::query(&uri);
    let (dl, action, sel) = match request(&app, &ctx, &p) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if let Err(resp) = dead_letter_named(&app, &ctx, &dl).await {
        return resp;
    }
    // How many, and a sample to show.
    let counted: Result<(u64, Vec<DeadLetter>), String> = match &sel {
        Selection::Ids(ids) => {
            let mut found = Vec::new();
            let mut error = None;
            for id in ids {
                match app.letters(&dl, &DeadSelector::Id(id.clone()), 1).await {
                    Ok(l) => found.extend(l),
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            match error {
                Some(e) => Err(e),
                None => Ok((found.len() as u64, found)),
            }
        }
        Selection::Kind(k) => app
            .letters(&dl, &DeadSelector::Kind(k.clone()), COUNT_CAP)
            .await
            .map(|l| (l.len() as u64, l)),
        Selection::All => match app.call(app.broker().dead_len(&dl)).await {
            Ok(n) => app
                .letters(&dl, &DeadSelector::All, 20)
                .await
                .map(|l| (n, l)),
            Err(e) => Err(e),
        },
    };
    let what = sel.describe(&dl);
    let body = match counted {
        Err(e) => render::problem(&format!("Cannot count {what}"), &e),
        Ok((0, _)) => html! {
            (render::notice(&format!("Nothing to {}: {what} holds no job now.", action.name())))
            p { a href=(dead_link(&ctx, &dl, &[])) { "Back to " (dl) } }
        },
        Ok((n, sample)) => {
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
                    a href=(dead_link(&ctx, &dl, &[])) { "Cancel" }
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

/// `POST dead/action`: does the replay or purge (CSRF token required; refused read-only).
pub(crate) async fn action<B: Backend>(
    State(app): State<Arc<App<B>>>,
    Extension(ctx): Extension<ReqCtx>,
    body: Bytes,
) -> Response {
    if app.read_only() {
        return super::read_only_refused(&app, &ctx);
    }
    let p = match super::form(&app, &ctx, &body) {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    if !ctx.csrf_ok(p.get("csrf")) {
        return super::csrf_refused(&app, &ctx);
    }
    let (dl, action, sel) = match request(&app, &ctx, &p) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if let Err(resp) = dead_letter_named(&app, &ctx, &dl).await {
        return resp;
    }
    let selectors: Vec<DeadSelector> = match &sel {
        Selection::Ids(ids) => ids.iter().cloned().map(DeadSelector::Id).collect(),
        Selection::Kind(k) => vec![DeadSelector::Kind(k.clone())],
        Selection::All => vec![DeadSelector::All],
    };
    let mut report = ReplayReport::default();
    let mut purged = 0u64;
    let mut error = None;
    for s in &selectors {
        let done = match action {
            Action::Replay => app.call(app.broker().replay(&dl, s)).await.map(|r| {
                report.replayed += r.replayed;
                report.skipped += r.skipped;
                report.failed += r.failed;
            }),
            Action::Purge => app
                .call(app.broker().purge(&dl, s))
                .await
                .map(|n| purged = purged.saturating_add(n)),
        };
        if let Err(e) = done {
            error = Some(e);
            break;
        }
    }
    app.changed().await;
    tracing::info!(
        dead_letter = %dl,
        action = action.name(),
        replayed = report.replayed,
        purged,
        "dashboard action"
    );
    let what = sel.describe(&dl);
    let body = html! {
        @if let Some(e) = &error {
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
                p.result data-purged=(purged) { "Purged " strong { (purged) } " of " (what) "." }
            }
        }
        p { a href=(dead_link(&ctx, &dl, &[])) { "Back to " (dl) } " · " a href=(ctx.home()) { "Queues" } }
    };
    let heading = match action {
        Action::Replay => "Replayed",
        Action::Purge => "Purged",
    };
    render::respond(
        StatusCode::OK,
        render::page(&app, &ctx, Tab::Dead, heading, body),
    )
}

#[cfg(test)]
mod tests {
    use super::payload;

    #[test]
    fn payloads_read_as_json_text_or_hex() {
        assert_eq!(
            payload(br#"{"a":1}"#),
            ("JSON", "{\n  \"a\": 1\n}".to_owned())
        );
        assert_eq!(payload(b"plain"), ("text", "plain".to_owned()));
        let (what, hex) = payload(&[0xff, 0x00, b'A']);
        assert_eq!(what, "binary, shown as hex");
        assert!(hex.starts_with("00000000  ff 00 41"), "{hex}");
        assert!(hex.contains("|..A|"), "{hex}");
    }
}
