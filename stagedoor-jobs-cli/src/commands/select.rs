//! Which dead letters a command names: the dead letter QUEUE stands for, the letters a
//! selector takes, and what the backend stored for each.

use stagedoor_jobs::{DeadLetter, DeadLetters, DeadSelector};

use crate::ctx::Ctx;
use crate::error::Failure;
use crate::output;

/// What `sel` takes, in words: "dead letter `id`", "dead letters of kind `k`".
pub(super) fn describe(sel: &DeadSelector) -> String {
    match sel {
        DeadSelector::Id(id) => format!("dead letter `{id}`"),
        DeadSelector::Kind(k) => format!("dead letters of kind `{k}`"),
        DeadSelector::All => "dead letters".to_owned(),
    }
}

/// The dead letter that QUEUE names (QUEUE, or its default dead letter), checked to exist.
pub(super) async fn resolve<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    queue: &str,
) -> Result<String, Failure> {
    let (source, dead) = if ctx.is_dead(queue) {
        (ctx.source_of(queue), queue.to_owned())
    } else {
        (queue.to_owned(), b.default_dead_letter(queue))
    };
    let unknown = || {
        Failure::not_found(format!(
            "unknown queue `{queue}`: {} has no queue or dead letter of that name (`stagedoor-jobs queues` lists them)",
            ctx.place
        ))
    };
    if !ctx.dead_exists(&dead) {
        return Err(unknown());
    }
    let names = ctx.queues(b).await.map_err(Failure::broker)?;
    if names.iter().any(|n| *n == source || *n == dead) {
        return Ok(dead);
    }
    // A Redis Cluster lists the streams of the nodes given only: ask the dead letter itself.
    if b.dead_len(&dead).await.map_err(Failure::broker)? > 0 {
        return Ok(dead);
    }
    Err(unknown())
}

/// What the backend stored for each of `letters` (see [`output::Stored`]), in order: on
/// Redis, each entry's fields as they are.
pub(super) async fn stored(
    ctx: &Ctx,
    dead: &str,
    letters: &[DeadLetter],
) -> Result<Vec<output::Stored>, Failure> {
    let fields = match &ctx.redis {
        Some(r) => {
            let ids: Vec<String> = letters.iter().map(|d| d.id.clone()).collect();
            r.dead_letter_fields(dead, &ids)
                .await
                .map_err(Failure::broker)?
        }
        None => vec![None; letters.len()],
    };
    Ok(fields
        .into_iter()
        .map(|fields| output::Stored {
            fields,
            stores_enqueued: ctx.stores_enqueued,
        })
        .collect())
}

/// The error for a dead letter `id` that `dead` does not hold.
pub(super) fn no_such_id(dead: &str, id: &str) -> Failure {
    Failure::not_found(format!(
        "no dead letter `{id}` in `{dead}` (`stagedoor-jobs dead list` lists them)"
    ))
}

/// The dead letters `sel` takes now; an unknown id is an error.
pub(super) async fn selected<B: DeadLetters>(
    b: &B,
    dead: &str,
    sel: &DeadSelector,
) -> Result<Vec<DeadLetter>, Failure> {
    let letters = b
        .dead_letters(dead, sel, usize::MAX)
        .await
        .map_err(Failure::broker)?;
    if let (DeadSelector::Id(id), true) = (sel, letters.is_empty()) {
        return Err(no_such_id(dead, id));
    }
    Ok(letters)
}
