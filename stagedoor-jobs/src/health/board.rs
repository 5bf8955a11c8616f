//! The board of a running service: every supervised task's live state (a queue's claim loop
//! also counts its claims), the service's state, and its stop signal, which every loop
//! watches and a shutdown or a failure beyond the restart limit sends. [`Board::health`]
//! reads it as a [`Health`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use super::{Health, LoopState, QueueHealth, ServiceState, TaskHealth};
use crate::kit::lock;

/// What the supervisor sets of a task's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Run {
    Running,
    Restarting,
    Stopped,
    Failed,
}

#[derive(Debug)]
struct CellInner {
    run: Run,
    restarts: u32,
    last_error: Option<String>,
    last_claim_at: Option<DateTime<Utc>>,
    consecutive_failed_claims: u32,
    failed_claims_total: u64,
    /// The value last given to the `stagedoor_jobs_queue_healthy` gauge.
    gauge: Option<bool>,
}

/// The live state of one supervised task; a queue's claim loop also counts its claims.
#[derive(Debug)]
pub(crate) struct TaskCell {
    pub(crate) task: String,
    /// The queue and its backend, for a claim loop.
    queue: Option<(String, &'static str)>,
    /// Deliveries of this queue in flight.
    pub(crate) in_flight: Arc<AtomicUsize>,
    inner: Mutex<CellInner>,
}

impl TaskCell {
    fn new(task: String, queue: Option<(String, &'static str)>) -> Self {
        let cell = Self {
            task,
            queue,
            in_flight: Arc::new(AtomicUsize::new(0)),
            inner: Mutex::new(CellInner {
                run: Run::Running,
                restarts: 0,
                last_error: None,
                last_claim_at: None,
                consecutive_failed_claims: 0,
                failed_claims_total: 0,
                gauge: None,
            }),
        };
        cell.update(|_| {});
        cell
    }

    /// Changes the cell, then the queue's health gauge if its health changed.
    fn update<T>(&self, f: impl FnOnce(&mut CellInner) -> T) -> T {
        let mut inner = lock(&self.inner);
        let out = f(&mut inner);
        if let Some((queue, _)) = &self.queue {
            let healthy = inner.run == Run::Running && inner.consecutive_failed_claims == 0;
            if inner.gauge != Some(healthy) {
                inner.gauge = Some(healthy);
                metrics::gauge!("stagedoor_jobs_queue_healthy", "queue" => queue.clone())
                    .set(if healthy { 1.0 } else { 0.0 });
            }
        }
        out
    }

    pub(crate) fn set_run(&self, run: Run) {
        self.update(|i| i.run = run);
    }

    /// The task panicked (or ended by itself): it restarts.
    pub(crate) fn restarting(&self, error: &str) {
        self.update(|i| {
            i.run = Run::Restarting;
            i.restarts += 1;
            i.last_error = Some(error.to_owned());
        });
    }

    /// The task failed beyond its restart limit.
    pub(crate) fn failed(&self, error: &str) {
        self.update(|i| {
            i.run = Run::Failed;
            i.last_error = Some(error.to_owned());
        });
    }

    /// A claim succeeded; returns how many had failed before it.
    pub(crate) fn claim_ok(&self) -> u32 {
        self.update(|i| {
            i.last_claim_at = Some(Utc::now());
            std::mem::take(&mut i.consecutive_failed_claims)
        })
    }

    /// A claim failed; returns how many have failed in a row.
    pub(crate) fn claim_failed(&self, error: &str) -> u32 {
        if let Some((queue, _)) = &self.queue {
            metrics::counter!("stagedoor_jobs_claim_failures_total", "queue" => queue.clone())
                .increment(1);
        }
        self.update(|i| {
            i.consecutive_failed_claims = i.consecutive_failed_claims.saturating_add(1);
            i.failed_claims_total += 1;
            i.last_error = Some(error.to_owned());
            i.consecutive_failed_claims
        })
    }

    fn state(i: &CellInner) -> LoopState {
        match i.run {
            Run::Running if i.consecutive_failed_claims > 0 => LoopState::BackingOff,
            Run::Running => LoopState::Running,
            Run::Restarting => LoopState::Restarting,
            Run::Stopped => LoopState::Stopped,
            Run::Failed => LoopState::Failed,
        }
    }
}

/// Every supervised task of a running service, the service's state, and its stop signal.
#[derive(Debug)]
pub(crate) struct Board {
    pub(crate) app: String,
    state: watch::Sender<ServiceState>,
    stop: watch::Sender<bool>,
    cells: Mutex<Vec<Arc<TaskCell>>>,
}

impl Board {
    pub(crate) fn new(app: String) -> Self {
        Self {
            app,
            state: watch::Sender::new(ServiceState::Running),
            stop: watch::Sender::new(false),
            cells: Mutex::new(Vec::new()),
        }
    }

    /// The stop signal every loop watches.
    pub(crate) fn stop_signal(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Asks every loop to stop (a shutdown).
    pub(crate) fn stop(&self) {
        self.state.send_if_modified(|s| {
            if *s == ServiceState::Running {
                *s = ServiceState::Stopping;
                true
            } else {
                false
            }
        });
        self.stop.send_replace(true);
    }

    /// A task failed beyond its restart limit: the service fails and every loop stops.
    pub(crate) fn fail(&self, task: &str, error: &str) {
        tracing::error!(
            app = %self.app,
            task,
            error,
            "the service stops: `{task}` failed more often than its restart limit allows"
        );
        self.state.send_if_modified(|s| {
            if matches!(s, ServiceState::Failed { .. }) {
                false
            } else {
                *s = ServiceState::Failed {
                    task: task.to_owned(),
                    error: error.to_owned(),
                };
                true
            }
        });
        self.stop.send_replace(true);
    }

    /// The failure that stopped the service, if one did.
    pub(crate) fn failure(&self) -> Option<(String, String)> {
        match &*self.state.borrow() {
            ServiceState::Failed { task, error } => Some((task.clone(), error.clone())),
            _ => None,
        }
    }

    /// Waits until the service fails.
    pub(crate) async fn wait_failed(&self) -> (String, String) {
        let mut rx = self.state.subscribe();
        // The sender lives in `self`, so the channel cannot close while this waits.
        let _ = rx
            .wait_for(|s| matches!(s, ServiceState::Failed { .. }))
            .await;
        self.failure().unwrap_or_default()
    }

    /// Registers a queue's claim loop.
    pub(crate) fn queue(&self, queue: &str, backend: &'static str) -> Arc<TaskCell> {
        let cell = Arc::new(TaskCell::new(
            format!("claim:{queue}"),
            Some((queue.to_owned(), backend)),
        ));
        lock(&self.cells).push(Arc::clone(&cell));
        cell
    }

    /// Registers another task.
    pub(crate) fn task(&self, task: &str) -> Arc<TaskCell> {
        let cell = Arc::new(TaskCell::new(task.to_owned(), None));
        lock(&self.cells).push(Arc::clone(&cell));
        cell
    }

    /// The service's health now: its state, and each task's as it was last set.
    pub(crate) fn health(&self) -> Health {
        let mut queues = Vec::new();
        let mut tasks = Vec::new();
        for cell in lock(&self.cells).iter() {
            let i = lock(&cell.inner);
            let state = TaskCell::state(&i);
            match &cell.queue {
                Some((queue, backend)) => queues.push(QueueHealth {
                    queue: queue.clone(),
                    backend,
                    state,
                    last_claim_at: i.last_claim_at,
                    in_flight: cell.in_flight.load(Ordering::SeqCst),
                    consecutive_failed_claims: i.consecutive_failed_claims,
                    failed_claims_total: i.failed_claims_total,
                    restarts: i.restarts,
                    last_error: i.last_error.clone(),
                }),
                None => tasks.push(TaskHealth {
                    task: cell.task.clone(),
                    state,
                    restarts: i.restarts,
                    last_error: i.last_error.clone(),
                }),
            }
        }
        Health {
            app: self.app.clone(),
            service: self.state.borrow().clone(),
            queues,
            tasks,
        }
    }
}
