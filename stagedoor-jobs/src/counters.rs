//! The counters and the histogram the job path records for each delivery (the metric table is
//! in the docs of the `monitor` module). Kept apart from the monitor so that the runtime, which
//! records them, and the monitor, which reads the runtime's routes, do not import each other.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use crate::broker::Settlement;

/// The `kind` label of a job whose kind no mount of its queue handles (dead-lettered unrun).
pub(crate) const UNKNOWN_KIND_LABEL: &str = "unknown";
/// The `kind` label of the kinds a mount for every kind ran beyond the first
/// [`KIND_LABELS_MAX`] of its queue.
pub(crate) const OTHER_KIND_LABEL: &str = "other";
/// How many kinds of one queue a mount for every kind labels by name.
pub(crate) const KIND_LABELS_MAX: usize = 100;

/// The kinds a queue's mount for every kind has labelled by name: kinds come from the entries,
/// whoever wrote them, so the series they make are bounded.
#[derive(Debug, Default)]
pub(crate) struct KindLabels(Mutex<HashSet<String>>);

impl KindLabels {
    /// The label of `kind`, run by a mount for every kind: its name while the queue has
    /// labelled fewer than [`KIND_LABELS_MAX`] kinds, else [`OTHER_KIND_LABEL`].
    pub(crate) fn label<'a>(&self, kind: &'a str) -> &'a str {
        let mut seen = crate::kit::lock(&self.0);
        if seen.contains(kind) {
            return kind;
        }
        if seen.len() < KIND_LABELS_MAX {
            seen.insert(kind.to_owned());
            return kind;
        }
        OTHER_KIND_LABEL
    }
}

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
