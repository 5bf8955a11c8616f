//! The links between the dead-letter pages.

use crate::params::query_string;
use crate::security::ReqCtx;

/// The page of dead letter `dl`, with `extra` query fields (a filter, a page).
pub(super) fn dead_link(ctx: &ReqCtx, dl: &str, extra: &[(&str, &str)]) -> String {
    let mut pairs = vec![("dl", dl)];
    pairs.extend_from_slice(extra);
    format!("{}?{}", ctx.url("/dead"), query_string(pairs))
}

/// The confirmation of `action` on what `extra` selects of `dl`.
pub(super) fn confirm_link(ctx: &ReqCtx, dl: &str, action: &str, extra: (&str, &str)) -> String {
    format!(
        "{}?{}",
        ctx.url("/dead/confirm"),
        query_string([("dl", dl), ("action", action), extra])
    )
}
