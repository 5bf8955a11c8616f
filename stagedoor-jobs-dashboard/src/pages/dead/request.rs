//! What an action request names (the dead letter, the action, the selection), and the check
//! that it names a dead letter, not a live queue.

use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};

use crate::data::{App, Backend};
use crate::pages::refusal::refusal;
use crate::params::{MAX_SELECTED, Params};
use crate::security::ReqCtx;

/// Which dead letters an action takes.
#[derive(Clone, Debug)]
pub(super) enum Selection {
    /// These ids.
    Ids(Vec<String>),
    /// Every dead letter of this kind.
    Kind(String),
    /// Every dead letter.
    All,
}

impl Selection {
    /// The selection a request names (`Ok(None)`: none); `Err(n)` when it names `n` ids, more
    /// than [`MAX_SELECTED`] (refused before they are compared or looked up).
    pub(super) fn from(p: &Params) -> Result<Option<Self>, usize> {
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

    /// The selection in words, for the pages.
    pub(super) fn describe(&self, dl: &str) -> String {
        match self {
            Self::Ids(ids) => match ids.as_slice() {
                [one] => format!("dead letter `{one}` of `{dl}`"),
                _ => format!("the {} selected dead letters of `{dl}`", ids.len()),
            },
            Self::Kind(k) => format!("every dead letter of kind `{k}` in `{dl}`"),
            Self::All => format!("every dead letter in `{dl}`"),
        }
    }

    /// The selection as the form's hidden fields.
    pub(super) fn hidden(&self) -> Markup {
        html! {
            @match self {
                Self::Ids(ids) => { @for id in ids { input type="hidden" name="id" value=(id); } }
                Self::Kind(k) => { input type="hidden" name="kind" value=(k); }
                Self::All => { input type="hidden" name="all" value="1"; }
            }
        }
    }
}

/// What an action does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Back to the queues.
    Replay,
    /// Deleted for good.
    Purge,
}

impl Action {
    /// The action a request names, if any.
    pub(super) fn from(p: &Params) -> Option<Self> {
        match p.get("action") {
            Some("replay") => Some(Self::Replay),
            Some("purge") => Some(Self::Purge),
            _ => None,
        }
    }

    /// The action's name in forms and on the pages.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Purge => "purge",
        }
    }
}

/// What an action request names, or the refusal page.
#[allow(clippy::result_large_err)]
pub(super) fn request<B: Backend>(
    app: &App<B>,
    ctx: &ReqCtx,
    p: &Params,
) -> Result<(String, Action, Selection), Response> {
    let bad = |m: &str| refusal(app, ctx, StatusCode::BAD_REQUEST, "Nothing to do", m);
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
pub(super) async fn dead_letter_named<B: Backend>(
    app: &App<B>,
    ctx: &ReqCtx,
    dl: &str,
) -> Result<(), Response> {
    let refuse = |m: &str| {
        refusal(
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
