//! `dead replay QUEUE ID|--kind K|--all`: dead letters back to the queue each failed on.

use std::collections::BTreeSet;

use stagedoor_jobs::{BrokerError, DeadLetter, DeadLetters, DeadSelector, ReplayReport};

use super::progress::{Interrupt, progress, spinner};
use super::report::{dry_run_listing, interrupted, plural, summary};
use super::select::{describe, selected};
use crate::ctx::Ctx;
use crate::error::{FAILED, Failure, OK};
use crate::output::Out;

/// Up to this many, a replay moves the dead letters it listed one at a time, by id (the bar
/// moves); above it, one call with the selector, which the backends walk a page at a time. A
/// purge always deletes one at a time, by id: exactly what was listed and confirmed, never a
/// letter that arrived since (a backend looks one dead letter up by its id, not by reading the
/// dead letter).
const ONE_BY_ONE_UP_TO: usize = 1_000;

/// Replays what `sel` takes of `dead` (or, with `dry_run`, lists it).
pub(super) async fn replay<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    dead: &str,
    sel: DeadSelector,
    dry_run: bool,
) -> Result<u8, Failure> {
    let letters = selected(b, dead, &sel).await?;
    let origins: BTreeSet<&str> = letters.iter().map(|d| d.origin.as_str()).collect();
    let to = origins.into_iter().collect::<Vec<_>>().join(", ");
    if letters.is_empty() && !out.json {
        out.line(format!(
            "no {} in `{dead}`: nothing to replay",
            describe(&sel)
        ));
        return Ok(OK);
    }
    if dry_run {
        let line = format!(
            "dry run: would replay {} {} from `{dead}` to `{to}`; nothing moved",
            letters.len(),
            plural(letters.len())
        );
        dry_run_listing(ctx, out, dead, &letters, "replay", line).await?;
        return Ok(OK);
    }
    let (report, error, left) = if letters.len() <= ONE_BY_ONE_UP_TO {
        one_by_one(b, dead, &letters).await
    } else {
        let bar = spinner(letters.len(), "replaying");
        let done = b.replay(dead, &sel).await;
        bar.finish_and_clear();
        match done {
            Ok(r) => (r, None, 0),
            Err(e) => (ReplayReport::default(), Some(e), 0),
        }
    };
    summary(
        out,
        "replayed",
        dead,
        &to,
        report.replayed,
        report.skipped,
        Some(report.failed),
    );
    if let Some(e) = error {
        return Err(Failure::broker(e));
    }
    if left > 0 {
        return Err(interrupted(left, "replay", "replayed"));
    }
    Ok(if report.failed > 0 { FAILED } else { OK })
}

/// Replays `letters` one at a time, by id: what was done, the connection error that stopped
/// it, and how many were left when Ctrl-C stopped it.
async fn one_by_one<B: DeadLetters>(
    b: &B,
    dead: &str,
    letters: &[DeadLetter],
) -> (ReplayReport, Option<BrokerError>, usize) {
    let mut report = ReplayReport::default();
    let mut error = None;
    let mut left = 0;
    let bar = progress(letters.len(), "replaying");
    let interrupt = Interrupt::listen();
    for (i, d) in letters.iter().enumerate() {
        if interrupt.raised() {
            left = letters.len() - i;
            break;
        }
        match b.replay(dead, &DeadSelector::Id(d.id.clone())).await {
            Ok(r) if r.replayed + r.skipped + r.failed == 0 => report.skipped += 1,
            Ok(r) => {
                report.replayed += r.replayed;
                report.skipped += r.skipped;
                report.failed += r.failed;
            }
            Err(e @ (BrokerError::Connection(_) | BrokerError::NotConnected)) => {
                error = Some(e);
                break;
            }
            Err(e) => {
                tracing::error!(dead_letter = %d.id, error = %e, "replay failed");
                report.failed += 1;
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    (report, error, left)
}
