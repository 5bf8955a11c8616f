//! A backend's own background tasks, restarted whenever they panic: [`restart_on_panic`], and
//! [`spawn_consumer`] for a task that consumes a channel.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::{Backoff, Exponential};
use crate::panic::CatchPanic;

/// Between restarts: 100 ms, doubling, at most 10 s (the service's supervisor waits the same).
pub(crate) const BACKOFF: Exponential =
    Exponential::new(Duration::from_millis(100), Duration::from_secs(10));

/// Runs the task `make` makes until it returns, restarting it whenever it panics: the panic is
/// logged at ERROR with its message and location, counted in
/// `stagedoor_jobs_task_restarts_total{task}`, and the task made again after a capped
/// exponential backoff (100 ms doubling to 10 s; back to 100 ms once a run lasted a minute).
///
/// For a backend's own background tasks (a settlement batcher, a `LISTEN` connection), so
/// that one panic never makes every later call that needs the task fail:
///
/// ```no_run
/// # async fn listen() {}
/// tokio::spawn(stagedoor_jobs::kit::restart_on_panic("my-backend listener", listen));
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

/// Spawns a task that consumes a channel (a backend's settlement batcher, say) under
/// [`restart_on_panic`]: a panic restarts it on the same channel, so only the work it held is
/// lost. Returns the channel's sender; a caller that finds it closed (the task ran on a tokio
/// runtime that has shut down) spawns another ([`Batchers`](super::Batchers) does all that).
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
