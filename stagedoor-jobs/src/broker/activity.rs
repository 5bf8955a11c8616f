//! [`Activity`]: what services report through a backend and what a dashboard reads back. The
//! values it exchanges are in [`crate::activity`].

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{BrokerError, Inspect};
use crate::activity::{DelayedJob, MinuteCounts, QueueCounts, WorkerReport};

/// What services report through a backend and what a dashboard reads back: live workers,
/// per-minute counts, delayed jobs. Every backend implements it; the runtime reports through it
/// every [`REPORT_EVERY`](crate::activity::REPORT_EVERY).
pub trait Activity: Inspect {
    /// Records `worker` (replacing its previous report; gone after `ttl` without another) and
    /// adds `counts` to each queue's per-minute counts (kept [`COUNTS_KEPT`](crate::activity::COUNTS_KEPT)). One call per
    /// report; after a failed call the runtime logs it and sends the same counts again with
    /// the next report.
    fn report(
        &self,
        worker: &WorkerReport,
        counts: &[QueueCounts],
        ttl: Duration,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// The workers whose last report has not expired, by id.
    fn workers(&self) -> impl Future<Output = Result<Vec<WorkerReport>, BrokerError>> + Send;

    /// The per-minute counts of `queue` from the minute holding `since` on, oldest first;
    /// minutes with nothing counted are left out.
    fn throughput(
        &self,
        queue: &str,
        since: DateTime<Utc>,
    ) -> impl Future<Output = Result<Vec<MinuteCounts>, BrokerError>> + Send;

    /// The delayed jobs of `queue` (due later than now), soonest first, at most `limit`.
    fn delayed(
        &self,
        queue: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DelayedJob>, BrokerError>> + Send;
}
