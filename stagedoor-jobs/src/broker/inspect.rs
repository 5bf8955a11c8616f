//! [`Inspect`]: what a tool reads of a backend (its queues and what they hold), and
//! [`QueueStats`].

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::BrokerError;

/// What a queue holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Due and waiting to be claimed.
    pub ready: u64,
    /// Claimed and not yet settled.
    pub pending: u64,
    /// Waiting for a time in the future (delayed jobs and delayed retries).
    pub delayed: u64,
    /// How long the oldest due job has waited.
    pub oldest: Option<Duration>,
}

/// What an operator's tool or a dashboard reads of a backend: its queues and what they hold. The
/// contract is split by concern: [`Inspect`] (this), [`DeadLetters`](super::DeadLetters),
/// [`Locks`](super::Locks) (the scheduler's) and [`Broker`](super::Broker) (moving jobs, which
/// needs all of them). The command-line tool asks only for `Inspect + DeadLetters`; the runtime for
/// a whole [`Broker`](super::Broker).
///
/// A value is cheap to clone (it holds its connection behind an `Arc`) and does no I/O until
/// [`connect`](Inspect::connect).
pub trait Inspect: Clone + Send + Sync + 'static {
    /// The backend's name, as typed queue descriptors name it ("memory", "redis", "sqlx").
    fn backend(&self) -> &'static str;

    /// Connects (builds a pool, opens a connection), when the service starts. Errors name the
    /// URL's problem and the fix. Called once; idempotent.
    fn connect(&self) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// What `queue` holds now.
    fn stats(&self, queue: &str) -> impl Future<Output = Result<QueueStats, BrokerError>> + Send;

    /// The names of the queues (and dead letters) the backend holds now, sorted: what an
    /// operator's `queues` lists.
    fn queues(&self) -> impl Future<Output = Result<Vec<String>, BrokerError>> + Send;

    /// When the next delayed job of `queue` is due, if the broker can tell cheaply (the harness
    /// uses it to step its clock through chains of delayed retries).
    fn next_due(&self, queue: &str) -> impl Future<Output = Option<DateTime<Utc>>> + Send {
        let _ = queue;
        async { None }
    }
}
