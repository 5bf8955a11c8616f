//! `cancel QUEUE ID`: removes a waiting job, or tells a running one to stop.

use stagedoor_jobs::{Cancelled, DeadLetters};

use crate::ctx::Ctx;
use crate::error::{Failure, NOT_FOUND, OK};
use crate::output::Out;

/// `cancel QUEUE ID`.
pub(super) async fn cancel<B: DeadLetters>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    queue: &str,
    id: &str,
) -> Result<u8, Failure> {
    let job = stagedoor_jobs::JobId::from_string(id);
    let what = b.cancel(queue, &job).await.map_err(Failure::broker)?;
    if what == Cancelled::NotFound {
        let names = ctx.queues(b).await.map_err(Failure::broker)?;
        if !names.iter().any(|n| n == queue) {
            return Err(Failure::not_found(format!(
                "unknown queue `{queue}`: {} has no queue of that name (`stagedoor-jobs queues` lists them)",
                ctx.place
            )));
        }
    }
    let (word, line) = match what {
        Cancelled::Removed => (
            "removed",
            format!(
                "cancelled job {id} of `{queue}`: it was waiting, and is removed; it will not run"
            ),
        ),
        Cancelled::Running => (
            "running",
            format!(
                "cancelled job {id} of `{queue}`: it is running; its handler is told to stop, and the job is dropped when the handler returns"
            ),
        ),
        Cancelled::NotFound => (
            "not_found",
            format!("no job {id} in `{queue}`: it finished, was cancelled already, or never was"),
        ),
    };
    if out.json {
        out.json(&serde_json::json!({ "queue": queue, "job_id": id, "cancelled": word }));
    } else if what == Cancelled::NotFound {
        return Err(Failure::not_found(line));
    } else {
        out.line(line);
    }
    Ok(if what == Cancelled::NotFound {
        NOT_FOUND
    } else {
        OK
    })
}
