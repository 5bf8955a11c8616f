//! What a supervisor (a readiness probe, a dashboard) can read of a running service: the state
//! of every queue's claim loop and of the service's other long-running tasks, and whether the
//! service itself is running or has failed. Read it with [`Running::health`](crate::Running::health).
//!
//! The live state behind it, and the service's stop signal, are the board's (`health/board.rs`).

mod board;

use chrono::{DateTime, Utc};

pub(crate) use board::{Board, Run, TaskCell};

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
