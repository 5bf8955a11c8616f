//! The counters and the histogram the job path records for each delivery (the metric table is
//! in the docs of the `monitor` module). Kept apart from the monitor so that the runtime, which
//! records them, and the monitor, which reads the runtime's routes, do not import each other.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
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

/// One kind's metric handles on one queue, each registered with the installed recorder at its
/// first use (a series appears once it has something to say, as before handles were kept),
/// then reused by every delivery: no label is allocated per job.
struct KindMetrics {
    labels: [(&'static str, String); 2],
    processed: OnceLock<metrics::Counter>,
    dropped: OnceLock<metrics::Counter>,
    failed: OnceLock<metrics::Counter>,
    retried: OnceLock<metrics::Counter>,
    dead_lettered: OnceLock<metrics::Counter>,
    duration: OnceLock<metrics::Histogram>,
}

impl KindMetrics {
    fn new(queue: &str, kind: &str) -> Self {
        Self {
            labels: [("queue", queue.to_owned()), ("kind", kind.to_owned())],
            processed: OnceLock::new(),
            dropped: OnceLock::new(),
            failed: OnceLock::new(),
            retried: OnceLock::new(),
            dead_lettered: OnceLock::new(),
            duration: OnceLock::new(),
        }
    }

    /// Adds one to the counter `name` held in `cell`.
    fn add(&self, cell: &OnceLock<metrics::Counter>, name: &'static str) {
        cell.get_or_init(|| metrics::counter!(name, &self.labels))
            .increment(1);
    }
}

/// A queue's metric handles by `kind` label. The labels are bounded (the kinds its mounts
/// name, [`UNKNOWN_KIND_LABEL`], and [`KindLabels`]' at most [`KIND_LABELS_MAX`]), so are the
/// handles. Registered when a kind is first counted: a recorder installed after that is not
/// seen, so install it before the service starts.
#[derive(Default)]
pub(crate) struct QueueMetrics {
    by_kind: Mutex<HashMap<String, Arc<KindMetrics>>>,
}

impl std::fmt::Debug for QueueMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueMetrics").finish_non_exhaustive()
    }
}

impl QueueMetrics {
    fn of(&self, queue: &str, kind: &str) -> Arc<KindMetrics> {
        let mut by_kind = crate::kit::lock(&self.by_kind);
        if let Some(m) = by_kind.get(kind) {
            return Arc::clone(m);
        }
        Arc::clone(
            by_kind
                .entry(kind.to_owned())
                .or_insert_with(|| Arc::new(KindMetrics::new(queue, kind))),
        )
    }

    /// Counts one settled delivery of `kind` (its label) on `queue`.
    pub(crate) fn count(&self, queue: &str, kind: &str, settlement: &Settlement) {
        let m = self.of(queue, kind);
        m.add(&m.processed, "stagedoor_jobs_processed_total");
        match settlement {
            Settlement::Ack => {}
            Settlement::Drop => m.add(&m.dropped, "stagedoor_jobs_dropped_total"),
            Settlement::Retry { .. } => {
                m.add(&m.failed, "stagedoor_jobs_failed_total");
                m.add(&m.retried, "stagedoor_jobs_retried_total");
            }
            Settlement::DeadLetter { .. } => {
                m.add(&m.failed, "stagedoor_jobs_failed_total");
                m.add(&m.dead_lettered, "stagedoor_jobs_dead_lettered_total");
            }
        }
    }

    /// Records how long a handler of `kind` (its label) on `queue` ran.
    pub(crate) fn handler_duration(&self, queue: &str, kind: &str, d: Duration) {
        let m = self.of(queue, kind);
        m.duration
            .get_or_init(|| {
                metrics::histogram!("stagedoor_jobs_handler_duration_seconds", &m.labels)
            })
            .record(d.as_secs_f64());
    }
}
