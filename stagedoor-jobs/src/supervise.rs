//! Supervision of long-running tasks: none of them stops without a trace.
//!
//! Every long-running task of a service (each queue's claim loop, the metrics monitor, the
//! scheduler) runs under [`supervise`](self): a panic (or the task ending by itself while the
//! service runs) is caught, logged at ERROR with its message and location, counted in
//! `stagedoor_jobs_task_restarts_total{task}`, and the task is started again after a capped
//! exponential backoff (100 ms, doubling, at most 10 s). A task that fails more than
//! [`Service::restart_limit`](crate::Service::restart_limit) times within its window (default:
//! more than 5 times within 60 s) is not restarted: the service fails, every loop stops,
//! [`Running::failed`](crate::Running::failed) resolves and `Service::run` returns
//! [`ServiceError::Failed`](crate::ServiceError::Failed).
//!
//! Backends supervise their own background tasks (settlement batchers, a `LISTEN`
//! connection) with [`restart_on_panic`] (from the [kit](crate::kit), and here too), which restarts forever: such a task cannot stop the
//! service, and the runtime's own supervision sees what its failures cause (failed claims and
//! settlements).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::health::{Board, Run, TaskCell};
use crate::kit::BACKOFF;
pub use crate::kit::{SharedReceiver, restart_on_panic, spawn_consumer};
use crate::panic::CatchPanic;

/// How many failures within how long a task may have before the service fails.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RestartLimit {
    pub(crate) max_restarts: u32,
    pub(crate) within: Duration,
}

impl Default for RestartLimit {
    fn default() -> Self {
        Self {
            max_restarts: 5,
            within: Duration::from_secs(60),
        }
    }
}

/// Runs the task `make` makes until the service stops, restarting it after a panic (see the
/// [module docs](self)). Returns when the service stops, or when the task failed beyond `limit`
/// (the service is then failed and stopping).
pub(crate) async fn supervise<F, Fut>(
    cell: Arc<TaskCell>,
    board: Arc<Board>,
    limit: RestartLimit,
    mut make: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut stop = board.stop_signal();
    let mut failures: VecDeque<Instant> = VecDeque::new();
    loop {
        cell.set_run(Run::Running);
        let ran = CatchPanic::new(make()).await;
        let stopping = *stop.borrow();
        let (error, traceback) = match ran {
            Ok(()) if stopping => {
                cell.set_run(Run::Stopped);
                return;
            }
            Ok(()) => (
                "it returned while the service runs".to_owned(),
                String::new(),
            ),
            Err(f) => (f.error, f.traceback),
        };
        let task = cell.task.as_str();
        if stopping {
            tracing::error!(task, error = %error, traceback = %traceback, "a task failed while the service stops");
            cell.set_run(Run::Stopped);
            return;
        }
        let now = Instant::now();
        failures.push_back(now);
        while failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > limit.within)
        {
            failures.pop_front();
        }
        let n = u32::try_from(failures.len()).unwrap_or(u32::MAX);
        if n > limit.max_restarts {
            tracing::error!(
                task,
                error = %error,
                traceback = %traceback,
                "a task failed {n} times within {:?}: not restarted",
                limit.within
            );
            cell.failed(&error);
            board.fail(task, &error);
            return;
        }
        let wait = BACKOFF.delay(n);
        tracing::error!(
            task,
            error = %error,
            traceback = %traceback,
            "a task failed: restarting it in {wait:?} (failure {n}; more than {} within {:?} stop the service)",
            limit.max_restarts,
            limit.within
        );
        metrics::counter!("stagedoor_jobs_task_restarts_total", "task" => task.to_owned())
            .increment(1);
        cell.restarting(&error);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => {
                cell.set_run(Run::Stopped);
                return;
            }
        }
    }
}
