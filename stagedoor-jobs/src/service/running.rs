//! A started service ([`Running`]): publishing through it, its health, and the graceful
//! shutdown (handlers get the shutdown timeout, other tasks 5 s more). Also the task that
//! keeps each route's clock in step with its backend's.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::builder::AppInfo;
use super::error::ServiceError;
use crate::broker::BrokerError;
use crate::clock::SYNC_EVERY;
use crate::envelope::Job;
use crate::health::{Board, Health};
use crate::runtime::ErasedRoute;
use crate::schedule::scheduler::Progress;

/// A started service. [`shutdown`](Running::shutdown) stops it gracefully.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub struct Running {
    pub(super) app: AppInfo,
    pub(super) board: Arc<Board>,
    pub(super) tasks: Vec<JoinHandle<()>>,
    /// How long running handlers get at shutdown (the other tasks get 5 s more).
    pub(super) shutdown_timeout: Duration,
    pub(crate) routes: Vec<Arc<dyn ErasedRoute>>,
    pub(crate) in_flight: Arc<std::sync::atomic::AtomicUsize>,
    pub(crate) progress: Option<watch::Receiver<Progress>>,
    pub(crate) held_back: crate::runtime::HeldBack,
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("app", &self.app)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// Publishes a job through the broker that serves its queue (the first broker when none
    /// mounts it). Returns its id as stored and whether it was stored (see
    /// [`Published`](crate::broker::Published)): a job whose id is already in its queue is
    /// not added twice.
    pub async fn publish(&self, job: Job) -> Result<crate::broker::Published, BrokerError> {
        let route = self
            .routes
            .iter()
            .find(|r| r.mounts().iter().any(|m| m.queue == job.queue()))
            .or_else(|| self.routes.first())
            .ok_or_else(|| BrokerError::UnknownQueue(job.queue().to_owned()))?;
        route.publish(job).await
    }

    /// Cancels job `id` of `queue` through the broker that serves the queue (the first broker
    /// when none mounts it): see [`DeadLetters::cancel`](crate::DeadLetters::cancel).
    pub async fn cancel(
        &self,
        queue: &str,
        id: &crate::JobId,
    ) -> Result<crate::broker::Cancelled, BrokerError> {
        let route = self
            .routes
            .iter()
            .find(|r| r.mounts().iter().any(|m| m.queue == queue))
            .or_else(|| self.routes.first())
            .ok_or_else(|| BrokerError::UnknownQueue(queue.to_owned()))?;
        route.cancel(queue, id).await
    }

    /// The health of every queue's claim loop, of the service's other tasks and of the service
    /// itself: what a readiness probe reads ([`Health::is_healthy`]).
    pub fn health(&self) -> Health {
        self.board.health()
    }

    /// Resolves when the service has failed: a task failed more often than its
    /// [`restart_limit`](crate::Service::restart_limit) allows. The service is stopping by itself
    /// then; [`shutdown`](Self::shutdown) waits for its running handlers. Never resolves for a
    /// service that does not fail.
    pub async fn failed(&self) -> ServiceError {
        let (task, error) = self.board.wait_failed().await;
        ServiceError::Failed {
            app: self.app.name.clone(),
            task,
            error,
        }
    }

    /// Stops claiming, waits for running handlers up to the shutdown timeout, and returns when
    /// every worker loop has ended. (A service that failed is stopped the same way; its error
    /// is logged, and [`failed`](Self::failed) or [`health`](Self::health) tell it.)
    pub async fn shutdown(self) {
        self.board.stop();
        // The queue workers give their handlers the shutdown timeout; a task still running 5 s
        // after that (a backend call that never returns) is stopped, so shutdown always ends.
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout + SHUTDOWN_GRACE;
        for t in self.tasks {
            let abort = t.abort_handle();
            match tokio::time::timeout_at(deadline, t).await {
                Ok(Err(e)) if e.is_panic() => {
                    tracing::error!(app = %self.app.name, "a supervised task panicked outside its supervision: {e}");
                }
                Ok(_) => {}
                Err(_) => {
                    tracing::warn!(app = %self.app.name, "a task of the service had not stopped {SHUTDOWN_GRACE:?} after the shutdown deadline (a backend call that does not return?): stopped");
                    abort.abort();
                }
            }
        }
        match self.board.failure() {
            Some((task, error)) => tracing::error!(
                app = %self.app.name,
                task,
                error,
                "service stopped after a task failed"
            ),
            None => tracing::info!(app = %self.app.name, "service stopped"),
        }
    }
}

/// How long after the shutdown timeout a task that has not stopped is stopped.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Keeps each route's clock in step with its backend's, every [`SYNC_EVERY`] until the
/// service stops. A failed measurement keeps the last offset and is tried again at the next.
pub(super) async fn sync_clocks(
    routes: Vec<Arc<dyn ErasedRoute>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SYNC_EVERY) => {}
            _ = stop.changed() => return,
        }
        for route in &routes {
            if let Err(e) = route.sync_clock().await {
                tracing::debug!(backend = route.backend(), error = %e, "cannot read the backend's clock: keeping the last offset");
            }
        }
    }
}
