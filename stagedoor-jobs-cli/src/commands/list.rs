//! `dead list QUEUE`: the newest dead letters, one line each.

use stagedoor_jobs::{DeadLetters, DeadSelector};

use super::select::{describe, stored};
use crate::ctx::Ctx;
use crate::error::{Failure, OK};
use crate::output::{self, Out};

/// Lists at most `limit` dead letters of `dead` (of `kind`, if given), newest first.
pub(super) async fn list<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    dead: &str,
    kind: Option<String>,
    limit: usize,
) -> Result<u8, Failure> {
    let sel = kind.map_or(DeadSelector::All, DeadSelector::Kind);
    let mut letters = b
        .dead_letters(dead, &sel, limit.saturating_add(1))
        .await
        .map_err(Failure::broker)?;
    let more = letters.len() > limit;
    letters.truncate(limit);
    let facts = stored(ctx, dead, &letters).await?;
    if out.json {
        let v: Vec<_> = letters
            .iter()
            .zip(&facts)
            .map(|(d, s)| output::dead_json(d, dead, s))
            .collect();
        out.json(&serde_json::Value::Array(v));
        return Ok(OK);
    }
    if letters.is_empty() {
        out.line(format!("no {} in `{dead}`", describe(&sel)));
        return Ok(OK);
    }
    output::print_table(out, &output::dead_table(&letters, &facts));
    if more {
        out.line(format!(
            "(the newest {limit} shown: --limit N shows more, `dead show` one in full)"
        ));
    }
    Ok(OK)
}
