//! What the runtime shares: the context every worker loop of a running service holds
//! ([`RunCtx`]), and the observers that see every settlement.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tokio::sync::watch;

use crate::broker::Settlement;
use crate::envelope::Envelope;
use crate::extract::State;
use crate::health::Board;
use crate::supervise::RestartLimit;

/// Sees every settled delivery (the test harness records them; metrics will count them).
pub(crate) trait Observer: Send + Sync + 'static {
    fn settled(&self, subscriber: &str, queue: &str, envelope: &Envelope, settlement: &Settlement);
    /// The delivery was cancelled while running: the `Drop` settlement that follows is its.
    fn cancelled(&self, queue: &str, envelope: &Envelope) {
        let _ = (queue, envelope);
    }
    /// The settlement last reported for this delivery did not take effect (its lease was lost).
    fn lease_lost(&self, subscriber: &str, queue: &str, envelope: &Envelope);
}

/// What every worker loop of a running service shares.
#[derive(Clone)]
pub(crate) struct RunCtx {
    pub(crate) state: Arc<State>,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) observers: Arc<[Arc<dyn Observer>]>,
    /// Deliveries this service has claimed and not yet finished with (settled or abandoned).
    pub(crate) in_flight: Arc<AtomicUsize>,
    /// Woken when a job is dead-lettered, so the dead-letter gauges and alert look at once.
    pub(crate) dead_lettered: Arc<tokio::sync::Notify>,
    /// The health of every supervised task, the service's state and its stop signal.
    pub(crate) board: Arc<Board>,
    /// When a failing task stops the service.
    pub(crate) restart_limit: RestartLimit,
    /// Workers whose due jobs wait for a rate limit, with when (by the broker's clock) its
    /// first permit runs out: the paused test harness moves its clock there instead of
    /// waiting for jobs that cannot start before.
    pub(crate) held_back: HeldBack,
}

/// Each worker's state against its queue's rate limit: `Some(t)` while it waits for a permit
/// that frees at `t`, `None` otherwise. See [`RunCtx::held_back`].
#[derive(Clone, Default)]
pub(crate) struct HeldBack(Arc<std::sync::Mutex<HeldBy>>);

/// Each worker (queue, id) and the time it waits for, if it waits.
type HeldBy = std::collections::HashMap<(String, u64), Option<chrono::DateTime<chrono::Utc>>>;

impl HeldBack {
    /// A new worker of `queue`, not held back: its id.
    pub(crate) fn register(&self, queue: &str) -> u64 {
        let mut m = crate::kit::lock(&self.0);
        let id = m.len() as u64;
        m.insert((queue.to_owned(), id), None);
        id
    }

    /// Worker `id` of `queue` is held back until `until` (`None`: not held back).
    pub(crate) fn set(&self, queue: &str, id: u64, until: Option<chrono::DateTime<chrono::Utc>>) {
        if let Some(v) = crate::kit::lock(&self.0).get_mut(&(queue.to_owned(), id)) {
            *v = until;
        }
    }

    /// When every worker of `queue` is held back past `now`: the earliest time one frees. A
    /// worker not held back may be claiming, so the queue is not held back then.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn held_until(
        &self,
        queue: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let m = crate::kit::lock(&self.0);
        let mut first: Option<chrono::DateTime<chrono::Utc>> = None;
        for ((q, _), until) in m.iter() {
            if q != queue {
                continue;
            }
            match until {
                Some(t) if *t > now => first = Some(first.map_or(*t, |f| f.min(*t))),
                _ => return None,
            }
        }
        first
    }

    /// Every time a worker waits for.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn times(&self) -> Vec<chrono::DateTime<chrono::Utc>> {
        crate::kit::lock(&self.0)
            .values()
            .flatten()
            .copied()
            .collect()
    }
}
