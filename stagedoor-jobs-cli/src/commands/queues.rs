//! `queues`: every queue with its counts and its dead letters'.

use std::collections::BTreeSet;
use std::time::Duration;

use stagedoor_jobs::DeadLetters;

use crate::ctx::Ctx;
use crate::error::{Failure, OK};
use crate::output::{self, Out};

/// One row of `queues`.
struct QueueRow {
    queue: String,
    dead_letter: String,
    ready: u64,
    pending: u64,
    delayed: u64,
    dead: u64,
    oldest: Option<Duration>,
}

/// Prints every queue with its counts (a dead letter whose queue is gone has a row too).
pub(super) async fn queues<B: DeadLetters>(b: &B, ctx: &Ctx, out: &Out) -> Result<u8, Failure> {
    let names = ctx.queues(b).await.map_err(Failure::broker)?;
    // A queue and its dead letter are one row; a dead letter whose queue is gone has a row too.
    let mut sources: BTreeSet<String> = BTreeSet::new();
    for n in &names {
        if ctx.is_dead(n) {
            sources.insert(ctx.source_of(n));
        } else {
            sources.insert(n.clone());
        }
    }
    let mut rows = Vec::new();
    for q in sources {
        let dead_letter = b.default_dead_letter(&q);
        let s = b.stats(&q).await.map_err(Failure::broker)?;
        let dead = if ctx.dead_exists(&dead_letter) {
            b.dead_len(&dead_letter).await.map_err(Failure::broker)?
        } else {
            0
        };
        rows.push(QueueRow {
            queue: q,
            dead_letter,
            ready: s.ready,
            pending: s.pending,
            delayed: s.delayed,
            dead,
            oldest: s.oldest,
        });
    }
    if out.json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "queue": r.queue,
                    "dead_letter": r.dead_letter,
                    "ready": r.ready,
                    "pending": r.pending,
                    "delayed": r.delayed,
                    "dead": r.dead,
                    "oldest_seconds": r.oldest.map(|d| d.as_secs_f64()),
                })
            })
            .collect();
        out.json(&serde_json::Value::Array(v));
    } else if rows.is_empty() {
        out.line(format!("no queues in {}", ctx.place));
    } else {
        let mut t = output::table(
            &["QUEUE", "READY", "PENDING", "DELAYED", "DEAD", "OLDEST"],
            &[1, 2, 3, 4, 5],
        );
        for r in &rows {
            t.add_row(vec![
                r.queue.clone(),
                r.ready.to_string(),
                r.pending.to_string(),
                r.delayed.to_string(),
                r.dead.to_string(),
                r.oldest.map_or("-".to_owned(), output::age),
            ]);
        }
        output::print_table(out, &t);
    }
    Ok(OK)
}
