//! The page around every page, and the small pieces pages share. maud escapes every value
//! spliced in; nothing here builds HTML from strings.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

use crate::auth::Auth;
use crate::data::{App, Backend};
use crate::security::ReqCtx;

/// The tabs of the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tab {
    Queues,
    Dead,
    Scheduled,
    Workers,
    None,
}

/// A whole page: header, tabs, `heading`, `body`.
pub(crate) fn page<B: Backend>(
    app: &App<B>,
    ctx: &ReqCtx,
    tab: Tab,
    heading: &str,
    body: Markup,
) -> Markup {
    let d = &app.dashboard;
    // Before a credential, the page shows neither the title (which may name a server) nor the
    // backend.
    let title = if ctx.authorized {
        d.title.as_str()
    } else {
        "stagedoor-jobs"
    };
    let tabs = [
        (Tab::Queues, "Queues", ctx.home()),
        (Tab::Dead, "Dead letters", ctx.url("/dead")),
        (Tab::Scheduled, "Scheduled", ctx.url("/scheduled")),
        (Tab::Workers, "Workers", ctx.url("/workers")),
    ];
    let signed_in = matches!(d.auth, Some(Auth::Token(_))) && ctx.session.is_some();
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (heading) " · " (title) }
                link rel="stylesheet" href=(ctx.url("/assets/style.css"));
                script src=(ctx.url("/assets/live.js")) defer {}
            }
            body data-base=(ctx.base) {
                header.top {
                    a.brand href=(ctx.home()) { (title) }
                    nav {
                        @for (t, label, href) in &tabs {
                            a.active[*t == tab] href=(href) { (label) }
                        }
                    }
                    span.meta {
                        @if ctx.authorized { span.backend { (app.broker().backend()) } }
                        @if d.read_only {
                            " " span.badge title="Actions are off: this dashboard was started read-only" { "read-only" }
                        }
                        @if signed_in {
                            form.inline method="post" action=(ctx.url("/logout")) {
                                input type="hidden" name="csrf" value=(ctx.csrf);
                                button.link type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main {
                    h1 { (heading) }
                    (body)
                }
            }
        }
    }
}

/// A page with `status`.
pub(crate) fn respond(status: StatusCode, markup: Markup) -> Response {
    (status, markup).into_response()
}

/// A backend error, shown in place of what could not be read.
pub(crate) fn problem(what: &str, message: &str) -> Markup {
    html! {
        div.error role="alert" {
            strong { (what) ": " }
            span.message { (message) }
        }
    }
}

/// A short notice.
pub(crate) fn notice(message: &str) -> Markup {
    html! { p.notice { (message) } }
}

/// A duration as `4s`, `2m 5s`, `3h 2m`, `2d 4h`.
pub(crate) fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m {}s", s / 60, s % 60),
        3_600..86_400 => format!("{}h {}m", s / 3_600, (s % 3_600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3_600),
    }
}

/// A time as `2026-12-01 04:05:06 UTC`.
pub(crate) fn at(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// A time and how far it is from now: `… (12s ago)`, `… (in 3m 0s)`.
pub(crate) fn at_relative(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let rel = if t <= now {
        format!("{} ago", age((now - t).to_std().unwrap_or_default()))
    } else {
        format!("in {}", age((t - now).to_std().unwrap_or_default()))
    };
    format!("{} ({rel})", at(t))
}

/// At most `max` characters of `s`, with `…` when cut.
pub(crate) fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        assert_eq!(age(Duration::from_secs(4)), "4s");
        assert_eq!(age(Duration::from_secs(125)), "2m 5s");
        assert_eq!(age(Duration::from_secs(3 * 3600 + 120)), "3h 2m");
        assert_eq!(age(Duration::from_secs(2 * 86_400 + 4 * 3600)), "2d 4h");
    }

    #[test]
    fn clips_on_characters() {
        assert_eq!(clip("héllo", 2), "hé…");
        assert_eq!(clip("hé", 2), "hé");
    }
}
