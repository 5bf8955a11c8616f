//! `dead purge QUEUE ID|--kind K|--all`: dead letters deleted for good, after a confirmation.

use std::io::{BufRead, IsTerminal, Write};

use stagedoor_jobs::{DeadLetters, DeadSelector};

use super::progress::{Interrupt, progress};
use super::report::{dry_run_listing, interrupted, plural, summary};
use super::select::{describe, selected};
use crate::ctx::Ctx;
use crate::error::{FAILED, Failure, OK};
use crate::output::Out;

/// Asks on the terminal; `Ok(false)` when the answer is not yes.
fn confirm(question: &str) -> Result<bool, Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::usage(
            "refusing to purge without a confirmation, and stdin is not a terminal to ask on: pass --yes to purge",
        ));
    }
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "{question} [y/N] ");
    let _ = err.flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::usage(format!("cannot read the answer: {e}: pass --yes to purge")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

/// Purges what `sel` takes of `dead`, after asking unless `yes` (or, with `dry_run`, lists
/// it).
pub(super) async fn purge<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    dead: &str,
    sel: DeadSelector,
    dry_run: bool,
    yes: bool,
) -> Result<u8, Failure> {
    let letters = selected(b, dead, &sel).await?;
    if letters.is_empty() {
        if out.json {
            summary(out, "purged", dead, "", 0, 0, None);
        } else {
            out.line(format!(
                "no {} in `{dead}`: nothing to purge",
                describe(&sel)
            ));
        }
        return Ok(OK);
    }
    if dry_run {
        let line = format!(
            "dry run: would purge {} {} from `{dead}`; nothing deleted",
            letters.len(),
            plural(letters.len())
        );
        dry_run_listing(ctx, out, dead, &letters, "purge", line).await?;
        return Ok(OK);
    }
    if !yes {
        let what = match &sel {
            DeadSelector::Id(id) => format!("dead letter `{id}`"),
            other => format!("{} {}", letters.len(), describe(other)),
        };
        if !confirm(&format!(
            "Delete {what} from `{dead}` for good? This cannot be undone."
        ))? {
            out.line("nothing purged");
            return Ok(FAILED);
        }
    }
    let (mut purged, mut skipped) = (0u64, 0u64);
    // Exactly what was listed (and confirmed), however many: never by selector, which would
    // also take the letters that arrived since.
    let bar = progress(letters.len(), "purging");
    let interrupt = Interrupt::listen();
    for (i, d) in letters.iter().enumerate() {
        if interrupt.raised() {
            bar.finish_and_clear();
            summary(out, "purged", dead, "", purged, skipped, None);
            return Err(interrupted(letters.len() - i, "purge", "purged"));
        }
        match b.purge(dead, &DeadSelector::Id(d.id.clone())).await {
            Ok(0) => skipped += 1,
            Ok(n) => purged += n,
            Err(e) => {
                bar.finish_and_clear();
                summary(out, "purged", dead, "", purged, skipped, None);
                return Err(Failure::broker(e));
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    summary(out, "purged", dead, "", purged, skipped, None);
    Ok(OK)
}
