//! A queue's housekeeping state in this process: when it last looked for entries to reclaim,
//! when its delayed mover looks next, and the priority levels its claims read.

use stagedoor_jobs::kit::lock;

use super::RedisBroker;

/// When a queue last looked for entries to reclaim, and when its delayed mover looks next;
/// the priority levels its claims read.
#[derive(Clone, Copy, Default)]
pub(crate) struct Housekeeping {
    pub(crate) reclaimed_at: Option<tokio::time::Instant>,
    pub(crate) next_delayed: Option<tokio::time::Instant>,
    /// The levels other than normal whose streams exist, one bit each (bit `level + 2`), and
    /// when they were looked for (again every second).
    pub(crate) levels: u8,
    pub(crate) levels_read: Option<tokio::time::Instant>,
}

impl RedisBroker {
    /// `queue`'s housekeeping (a fresh one the first time).
    pub(crate) fn housekeeping(&self, queue: &str) -> Housekeeping {
        lock(&self.inner.housekeeping)
            .get(queue)
            .copied()
            .unwrap_or_default()
    }

    /// Changes `queue`'s housekeeping in place.
    pub(crate) fn update_housekeeping(&self, queue: &str, f: impl FnOnce(&mut Housekeeping)) {
        let mut all = lock(&self.inner.housekeeping);
        f(all.entry(queue.to_owned()).or_default());
    }
}
