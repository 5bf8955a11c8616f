//! The commands, written once for every backend (generic over [`DeadLetters`] and
//! [`Records`]), one file each; `select.rs` resolves which dead letters a command names, `report.rs` says what a
//! replay or purge did, `progress.rs` shows it moving.

mod cancel;
mod flow;
mod list;
mod progress;
mod purge;
mod queues;
mod replay;
mod report;
mod result;
mod select;
mod show;

use stagedoor_jobs::broker::Records;
use stagedoor_jobs::{DeadLetters, DeadSelector};

use crate::args::{Command, Dead, Select};
use crate::ctx::Ctx;
use crate::error::Failure;
use crate::output::Out;

/// Runs `command` on broker `b`; returns the exit code.
pub(crate) async fn run<B: DeadLetters + Records>(
    b: &B,
    ctx: &Ctx,
    out: &Out,
    command: Command,
) -> Result<u8, Failure> {
    match command {
        Command::Queues => queues::queues(b, ctx, out).await,
        Command::Dead(Dead::List { queue, kind, limit }) => {
            let dead = select::resolve(b, ctx, &queue).await?;
            list::list(b, ctx, out, &dead, kind, limit as usize).await
        }
        Command::Dead(Dead::Show {
            queue,
            id,
            payload_to,
        }) => {
            let dead = select::resolve(b, ctx, &queue).await?;
            show::show(b, ctx, out, &dead, &id, payload_to.as_deref()).await
        }
        Command::Dead(Dead::Replay {
            queue,
            select,
            dry_run,
        }) => {
            let dead = select::resolve(b, ctx, &queue).await?;
            replay::replay(b, ctx, out, &dead, selector(select), dry_run).await
        }
        Command::Dead(Dead::Purge {
            queue,
            select,
            dry_run,
            yes,
        }) => {
            let dead = select::resolve(b, ctx, &queue).await?;
            purge::purge(b, ctx, out, &dead, selector(select), dry_run, yes).await
        }
        Command::Cancel { queue, id } => cancel::cancel(b, ctx, out, &queue, &id).await,
        Command::Result { id } => result::result(b, out, &id).await,
        Command::Flow { id } => flow::flow(b, out, &id).await,
        // Served by `dashboard::serve` before the commands run.
        Command::Dashboard(_) => Err(Failure::usage(
            "the dashboard is not a listing command: run `stagedoor-jobs dashboard`",
        )),
    }
}

fn selector(s: Select) -> DeadSelector {
    match (s.id, s.kind) {
        (Some(id), _) => DeadSelector::Id(id),
        (None, Some(kind)) => DeadSelector::Kind(kind),
        (None, None) => DeadSelector::All,
    }
}
