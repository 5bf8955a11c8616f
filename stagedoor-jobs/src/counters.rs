//! The counters and the histogram the job path records for each delivery (the metric table is
//! in the docs of the `monitor` module). Kept apart from the monitor so that the runtime, which
//! records them, and the monitor, which reads the runtime's routes, do not import each other.

use std::time::Duration;

use crate::broker::Settlement;

/// Counts one settled delivery.
pub(crate) fn count(queue: &str, kind: &str, settlement: &Settlement) {
    let labels = [("queue", queue.to_owned()), ("kind", kind.to_owned())];
    metrics::counter!("stagedoor_jobs_processed_total", &labels).increment(1);
    match settlement {
        Settlement::Ack => {}
        Settlement::Drop => metrics::counter!("stagedoor_jobs_dropped_total", &labels).increment(1),
        Settlement::Retry { .. } => {
            metrics::counter!("stagedoor_jobs_failed_total", &labels).increment(1);
            metrics::counter!("stagedoor_jobs_retried_total", &labels).increment(1);
        }
        Settlement::DeadLetter { .. } => {
            metrics::counter!("stagedoor_jobs_failed_total", &labels).increment(1);
            metrics::counter!("stagedoor_jobs_dead_lettered_total", &labels).increment(1);
        }
    }
}

/// Records how long a handler ran.
pub(crate) fn handler_duration(queue: &str, kind: &str, d: Duration) {
    metrics::histogram!("stagedoor_jobs_handler_duration_seconds", "queue" => queue.to_owned(), "kind" => kind.to_owned())
        .record(d.as_secs_f64());
}
