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
    /// Queues whose due jobs wait for a global limit, with when (by the broker's clock) its
    /// first permit runs out: the paused test harness moves its clock there instead of
    /// waiting for jobs that cannot start before.
    pub(crate) held_back: HeldBack,
}

/// See [`RunCtx::held_back`].
pub(crate) type HeldBack =
    Arc<std::sync::Mutex<std::collections::HashMap<String, chrono::DateTime<chrono::Utc>>>>;
