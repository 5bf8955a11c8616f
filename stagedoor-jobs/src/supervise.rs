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
//! Backends supervise their own background tasks (acknowledgement batchers, a `LISTEN`
//! connection) with [`restart_on_panic`], which restarts forever: such a task cannot stop the
//! service, and the runtime's own supervision sees what its failures cause (failed claims and
//! settlements).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::{Backoff, Exponential};
use crate::health::{Board, Run, TaskCell};
use crate::panic::CatchPanic;

/// Between restarts: 100 ms, doubling, at most 10 s.
const BACKOFF: Exponential = Exponential::new(Duration::from_millis(100), Duration::from_secs(10));

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

/// Runs the task `make` makes until it returns, restarting it whenever it panics: the panic is
/// logged at ERROR with its message and location, counted in
/// `stagedoor_jobs_task_restarts_total{task}`, and the task made again after a capped
/// exponential backoff (100 ms doubling to 10 s; back to 100 ms once a run lasted a minute).
///
/// For a backend's own background tasks (an acknowledgement batcher, a `LISTEN` connection), so
/// that one panic never makes every later call that needs the task fail:
///
/// ```no_run
/// # async fn listen() {}
/// tokio::spawn(stagedoor_jobs::supervise::restart_on_panic("my-backend listener", listen));
/// ```
pub async fn restart_on_panic<F, Fut>(task: &str, mut make: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut failures: u32 = 0;
    loop {
        let started = Instant::now();
        let Err(f) = CatchPanic::new(make()).await else {
            return;
        };
        if started.elapsed() >= Duration::from_secs(60) {
            failures = 0;
        }
        failures = failures.saturating_add(1);
        let wait = BACKOFF.delay(failures);
        tracing::error!(
            task,
            error = %f.error,
            traceback = %f.traceback,
            "a background task panicked: restarting it in {wait:?}"
        );
        metrics::counter!("stagedoor_jobs_task_restarts_total", "task" => task.to_owned())
            .increment(1);
        tokio::time::sleep(wait).await;
    }
}

/// The receiving end of a channel, shared by the runs of a task that [`spawn_consumer`]
/// restarts, so that every run reads the same channel.
pub type SharedReceiver<T> = Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<T>>>;

/// Spawns a task that consumes a channel (a backend's acknowledgement batcher, say) under
/// [`restart_on_panic`]: a panic restarts it on the same channel, so only the work it held is
/// lost. Returns the channel's sender; a caller that finds it closed (the task ran on a tokio
/// runtime that has shut down) spawns another.
pub fn spawn_consumer<T, F, Fut>(task: String, mut make: F) -> tokio::sync::mpsc::UnboundedSender<T>
where
    T: Send + 'static,
    F: FnMut(SharedReceiver<T>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let rx: SharedReceiver<T> = Arc::new(tokio::sync::Mutex::new(rx));
    tokio::spawn(async move { restart_on_panic(&task, || make(Arc::clone(&rx))).await });
    tx
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn restart_on_panic_runs_the_task_again_until_it_returns() {
        let runs = Arc::new(AtomicU32::new(0));
        let r = Arc::clone(&runs);
        let started = Instant::now();
        restart_on_panic("test task", move || {
            let r = Arc::clone(&r);
            async move {
                if r.fetch_add(1, Ordering::SeqCst) < 2 {
                    panic!("injected");
                }
            }
        })
        .await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "two panics, then a clean run"
        );
        assert!(
            started.elapsed() >= BACKOFF.delay(1) + BACKOFF.delay(2),
            "it waited its backoff between runs: {:?}",
            started.elapsed()
        );
    }
}
