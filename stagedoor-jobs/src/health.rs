//! What a supervisor (a readiness probe, a dashboard) can read of a running service: the state
//! of every queue's claim loop and of the service's other long-running tasks, and whether the
//! service itself is running or has failed. Read it with [`Running::health`](crate::Running::health).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::kit::lock;

/// The state of one supervised loop: a queue's claim loop, the metrics monitor, the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LoopState {
    /// Working.
    Running,
    /// Running, but its last claims failed (the broker is unreachable, a statement fails): it
    /// claims again after a backoff. Only a queue's claim loop is in this state.
    BackingOff,
    /// It panicked (or ended by itself) and is started again after a backoff.
    Restarting,
    /// Stopped with the service.
    Stopped,
    /// It failed more often than the restart limit allows: the service stops with an error.
    Failed,
}

/// Whether the service runs.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
#[non_exhaustive]
pub enum ServiceState {
    /// Started and not asked to stop.
    Running,
    /// Asked to stop: it claims nothing more and waits for running handlers.
    Stopping,
    /// A task failed more often than the restart limit allows: the service stopped claiming.
    /// [`Running::failed`](crate::Running::failed) resolves, and `Service::run` returns the
    /// error.
    Failed {
        /// The task that failed: `claim:<queue>` (a queue's claim loop), `monitor` (the
        /// metrics monitor), `scheduler`.
        task: String,
        /// Its last error (a panic's message).
        error: String,
    },
}

/// One queue's claim loop.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct QueueHealth {
    /// The queue.
    pub queue: String,
    /// Its broker's backend ("memory", "redis", "sqlx").
    pub backend: &'static str,
    /// Its claim loop's state; only [`LoopState::Running`] is healthy.
    pub state: LoopState,
    /// When a claim last succeeded (whether or not it found jobs); `None` before the first.
    pub last_claim_at: Option<DateTime<Utc>>,
    /// Deliveries claimed by this service and not yet settled (waiting for a handler slot or
    /// running).
    pub in_flight: usize,
    /// Claims that failed since the last one that succeeded.
    pub consecutive_failed_claims: u32,
    /// Claims that failed since the service started.
    pub failed_claims_total: u64,
    /// How many times the claim loop was restarted after a panic.
    pub restarts: u32,
    /// The last error: of a failed claim, or the panic that restarted the loop.
    pub last_error: Option<String>,
}

impl QueueHealth {
    /// Whether this queue is claiming: its loop runs and its last claim succeeded.
    pub fn is_healthy(&self) -> bool {
        self.state == LoopState::Running
    }
}

/// One of the service's other long-running tasks: `monitor` (the metrics monitor), `scheduler`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct TaskHealth {
    /// The task.
    pub task: String,
    /// Its state; only [`LoopState::Running`] is healthy.
    pub state: LoopState,
    /// How many times it was restarted after a panic.
    pub restarts: u32,
    /// The panic that last restarted it.
    pub last_error: Option<String>,
}

/// The health of a running service: see [`Running::health`](crate::Running::health).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Health {
    /// The application.
    pub app: String,
    /// Whether the service runs.
    pub service: ServiceState,
    /// Every queue the service claims from, in the order they were mounted.
    pub queues: Vec<QueueHealth>,
    /// The other supervised tasks.
    pub tasks: Vec<TaskHealth>,
}

impl Health {
    /// Whether the service runs and every queue and task is [`LoopState::Running`]: what a
    /// readiness probe answers.
    pub fn is_healthy(&self) -> bool {
        self.problems().is_empty()
    }

    /// Why the service is not healthy, one line per problem; empty when it is.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        match &self.service {
            ServiceState::Running => {}
            ServiceState::Stopping => out.push("the service is stopping".to_owned()),
            ServiceState::Failed { task, error } => {
                out.push(format!("the service failed: {task}: {error}"))
            }
        }
        for q in &self.queues {
            if q.is_healthy() {
                continue;
            }
            let why = match q.state {
                LoopState::BackingOff => format!(
                    "{} failed claim{} in a row (last error: {})",
                    q.consecutive_failed_claims,
                    if q.consecutive_failed_claims == 1 {
                        ""
                    } else {
                        "s"
                    },
                    q.last_error.as_deref().unwrap_or("unknown")
                ),
                LoopState::Restarting => format!(
                    "its claim loop is restarting after a panic (last error: {})",
                    q.last_error.as_deref().unwrap_or("unknown")
                ),
                LoopState::Stopped => "its claim loop is stopped".to_owned(),
                _ => format!("its claim loop is {:?}", q.state),
            };
            out.push(format!("queue `{}`: {why}", q.queue));
        }
        for t in &self.tasks {
            if t.state != LoopState::Running {
                out.push(format!(
                    "{}: {:?} (last error: {})",
                    t.task,
                    t.state,
                    t.last_error.as_deref().unwrap_or("none")
                ));
            }
        }
        out
    }
}

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
