//! Cancelling a job: what [`DeadLetters::cancel`](super::DeadLetters::cancel) found
//! ([`Cancelled`]), and how long a running job's cancellation mark is kept.

use std::time::Duration;

/// How long a backend keeps the mark of a running job's cancellation, for a broker of lease
/// `lease`: ten leases, at least a minute. Its worker looks every third of its lease, so this
/// is many looks; a job republished under the same id within it is cancelled too.
pub fn cancel_mark_ttl(lease: Duration) -> Duration {
    lease.saturating_mul(10).max(Duration::from_secs(60))
}

/// What [`DeadLetters::cancel`](super::DeadLetters::cancel) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// The job was waiting or delayed: it is removed and will not run.
    Removed,
    /// The job is running (claimed by a worker): its handler's cancellation fires, and the job
    /// is dropped when the handler returns.
    Running,
    /// No job of this id is in the queue (it finished, or never was).
    NotFound,
}
