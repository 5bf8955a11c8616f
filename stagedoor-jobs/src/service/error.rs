//! Why a service did not start or did not stop cleanly ([`ServiceError`]).

use crate::broker::{BrokerError, Problem};
use crate::outcome::BoxError;

/// Why a service did not start or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The configuration has problems; every one is listed, each naming its mount and the fix.
    #[error("the service `{app}` refuses to start:\n{}", list(.problems))]
    Refused {
        /// The application.
        app: String,
        /// Every problem found.
        problems: Vec<Problem>,
    },
    /// An `on_startup` hook failed.
    #[error("an on_startup hook of `{app}` failed: {source}")]
    Startup {
        /// The application.
        app: String,
        /// The hook's error.
        source: BoxError,
    },
    /// A broker could not connect, or its server refused to prepare the queues (a full Redis
    /// says it is full, not that it could not connect).
    #[error("the {backend} broker {}: {source}", connect_failure(.source))]
    Connect {
        /// The backend.
        backend: &'static str,
        /// Its error.
        source: BrokerError,
    },
    /// The test harness cannot run this service as asked.
    #[error("{0}")]
    Harness(String),
    /// A task of the running service (a queue's claim loop, the monitor, the scheduler) failed
    /// more often than [`Service::restart_limit`] allows: the service stopped.
    ///
    /// [`Service::restart_limit`]: crate::Service::restart_limit
    #[error("the service `{app}` stopped: its task `{task}` kept failing; last error: {error}")]
    Failed {
        /// The application.
        app: String,
        /// The task: `claim:<queue>`, `monitor` or `scheduler`.
        task: String,
        /// Its last error.
        error: String,
    },
}

/// What a [`ServiceError::Connect`] says happened: a server that answered but is full is
/// reached, and says so.
fn connect_failure(e: &BrokerError) -> &'static str {
    match e {
        BrokerError::Full(_) => "cannot start",
        _ => "could not connect",
    }
}

fn list(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| format!("  - {}: {}", p.mount, p.message))
        .collect::<Vec<_>>()
        .join("\n")
}
