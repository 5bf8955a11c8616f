//! What a replay or purge says it did (or, in a dry run, would do).

use stagedoor_jobs::DeadLetter;

use super::select::stored;
use crate::ctx::Ctx;
use crate::error::{FAILED, Failure};
use crate::output::{self, Out};

/// The error of a replay or purge stopped by Ctrl-C with `left` dead letters not `done`.
pub(super) fn interrupted(left: usize, verb: &str, done: &str) -> Failure {
    Failure::new(
        FAILED,
        format!(
            "interrupted: {left} {} not {done}; run the same command again to {verb} them",
            plural(left)
        ),
    )
}

pub(super) fn plural(n: usize) -> &'static str {
    if n == 1 {
        "dead letter"
    } else {
        "dead letters"
    }
}

/// The last line of a replay or purge: what was done, skipped and failed.
pub(super) fn summary(
    out: &Out,
    verb: &str,
    dead: &str,
    to: &str,
    done: u64,
    skipped: u64,
    failed: Option<u64>,
) {
    if out.json {
        let mut v = serde_json::json!({
            "dead_letter": dead,
            verb: done,
            "skipped": skipped,
        });
        if let Some(f) = failed {
            v["failed"] = f.into();
        }
        out.json(&v);
        return;
    }
    let mut line = format!("{verb} {done}, skipped {skipped}");
    if let Some(f) = failed {
        line.push_str(&format!(", failed {f}"));
    }
    if to.is_empty() {
        line.push_str(&format!(" (`{dead}`)"));
    } else {
        line.push_str(&format!(" (`{dead}` -> `{to}`)"));
    }
    out.line(line);
}

/// A dry run's listing of `letters`: as JSON (`would_<verb>`: how many), else their table
/// and `line`, which says what would be done.
pub(super) async fn dry_run_listing(
    ctx: &Ctx,
    out: &Out,
    dead: &str,
    letters: &[DeadLetter],
    verb: &str,
    line: String,
) -> Result<(), Failure> {
    if out.json {
        let facts = stored(ctx, dead, letters).await?;
        let v: Vec<_> = letters
            .iter()
            .zip(&facts)
            .map(|(d, s)| output::dead_json(d, dead, s))
            .collect();
        out.json(&serde_json::json!({
            "dry_run": true,
            "dead_letter": dead,
            format!("would_{verb}"): letters.len(),
            "dead_letters": v,
        }));
    } else {
        output::print_table(out, &output::dead_table(letters, &[]));
        out.line(line);
    }
    Ok(())
}
