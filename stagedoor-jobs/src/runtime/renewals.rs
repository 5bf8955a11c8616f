//! The leases of a worker's deliveries in flight, renewed together: every third of the lease,
//! one [`Broker::renew_many`] call per queue with every delivery held there, from a task of the
//! worker's own. A delivery is held from the moment it starts waiting for its mount's slot
//! until its handler is done; a handler that blocks its thread holds up no renewal, since none
//! runs in its task.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::broker::{Broker, Delivery};
use crate::extract::Cancellation;
use crate::kit::lock;

/// The shortest time between two renewals, whatever the broker says its lease is.
pub(super) const MIN_RENEW_EVERY: Duration = Duration::from_millis(10);

/// What is held: the deliveries by key (each with its job's cancellation, fired when the
/// broker says the job was cancelled), and the keys of the renewal under way.
struct State<R> {
    held: HashMap<u64, (Arc<Delivery<R>>, Cancellation)>,
    under_way: HashSet<u64>,
}

/// A worker's deliveries whose leases it renews.
pub(super) struct Renewals<R> {
    next: AtomicU64,
    state: Mutex<State<R>>,
    /// Woken when a renewal is done, for a delivery waiting to settle.
    done: Notify,
}

impl<R> Default for Renewals<R> {
    fn default() -> Self {
        Self {
            next: AtomicU64::new(0),
            state: Mutex::new(State {
                held: HashMap::new(),
                under_way: HashSet::new(),
            }),
            done: Notify::new(),
        }
    }
}

impl<R> Renewals<R> {
    /// Holds `delivery` for renewal until the guard is released (or dropped, when its task is
    /// aborted: a delivery nobody will settle is never renewed again).
    pub(super) fn hold(&self, delivery: &Arc<Delivery<R>>, cancel: &Cancellation) -> Held<'_, R> {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.state)
            .held
            .insert(key, (Arc::clone(delivery), cancel.clone()));
        Held { of: self, key }
    }

    /// The jobs held and not cancelled yet, with their cancellations: what the worker asks the
    /// broker about every third of the lease.
    pub(super) fn cancellable(&self) -> Vec<(crate::JobId, Cancellation)> {
        lock(&self.state)
            .held
            .values()
            .filter(|(_, c)| !c.is_cancelled())
            .map(|(d, c)| (d.envelope.id().clone(), c.clone()))
            .collect()
    }

    /// The held deliveries, marked as under renewal in the same step (so that a delivery
    /// released after this waits for the renewal: see [`Held::release`]).
    fn start(&self) -> Vec<(u64, Arc<Delivery<R>>)> {
        let mut s = lock(&self.state);
        let batch: Vec<(u64, Arc<Delivery<R>>)> = s
            .held
            .iter()
            .map(|(k, (d, _))| (*k, Arc::clone(d)))
            .collect();
        s.under_way = batch.iter().map(|(k, _)| *k).collect();
        batch
    }

    fn finish(&self) {
        lock(&self.state).under_way.clear();
        self.done.notify_waiters();
    }
}

/// One held delivery; releasing it stops its renewals.
pub(super) struct Held<'a, R> {
    of: &'a Renewals<R>,
    key: u64,
}

impl<R> Held<'_, R> {
    /// Stops renewing the delivery and returns once no renewal of it is under way: a backend
    /// that moves its fence on renewal then knows the fence the settlement is checked against.
    pub(super) async fn release(self) {
        // Removed here, once: the guard's drop has nothing left to do.
        let (of, key) = (self.of, self.key);
        std::mem::forget(self);
        {
            let mut s = lock(&of.state);
            s.held.remove(&key);
            if !s.under_way.contains(&key) {
                return;
            }
        }
        loop {
            let notified = of.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !lock(&of.state).under_way.contains(&key) {
                return;
            }
            notified.await;
        }
    }
}

impl<R> Drop for Held<'_, R> {
    fn drop(&mut self) {
        lock(&self.of.state).held.remove(&self.key);
    }
}

impl<R: Send + Sync + 'static> Renewals<R> {
    /// Every third of `broker`'s lease, until the worker is done (the worker aborts it after
    /// its last handler): renews every held delivery of `queue` in one call.
    pub(super) async fn run<B: Broker<Receipt = R>>(&self, broker: &B, queue: &str) {
        // A broker reporting a lease of (nearly) zero would make this loop spin: renew at most
        // every 10 ms.
        let every = (broker.lease() / 3).max(MIN_RENEW_EVERY);
        // A server away fails every renewal: one line for the first round of a streak, the
        // rest at debug level.
        let mut failing = false;
        loop {
            tokio::time::sleep(every).await;
            let batch = self.start();
            if batch.is_empty() {
                self.finish();
                continue;
            }
            let receipts: Vec<&R> = batch.iter().map(|(_, d)| &d.receipt).collect();
            // Boxed: a backend's future can be many kilobytes (sqlx's are).
            let answers = Box::pin(broker.renew_many(queue, &receipts)).await;
            drop(receipts);
            self.finish();
            let round = Round {
                queue,
                backend: broker.backend(),
                every,
            };
            failing = round.report(&batch, &answers, failing);
        }
    }
}

/// One round of renewals, for its report.
struct Round<'a> {
    queue: &'a str,
    backend: &'static str,
    every: Duration,
}

impl Round<'_> {
    /// Logs what the round's renewals answered; whether any failed (for the next round's level).
    fn report<R>(
        &self,
        batch: &[(u64, Arc<Delivery<R>>)],
        answers: &[Result<bool, crate::BrokerError>],
        failing: bool,
    ) -> bool {
        let queue = self.queue;
        if answers.len() != batch.len() {
            tracing::error!(
                queue,
                backend = self.backend,
                "the broker answered {} renewals for {} leases, which breaks its contract: the leases it did not answer for may run out",
                answers.len(),
                batch.len()
            );
        }
        let mut errors = 0usize;
        let mut first = None;
        for ((_, d), a) in batch.iter().zip(answers) {
            match a {
                Ok(true) => {}
                Ok(false) => tracing::warn!(
                    queue,
                    job_id = %d.envelope.id(),
                    kind = d.envelope.kind(),
                    "lease lost while the handler runs: another worker may run this job; this worker's outcome will be discarded"
                ),
                Err(e) => {
                    errors += 1;
                    first.get_or_insert(e);
                }
            }
        }
        let Some(e) = first else {
            return false;
        };
        if failing {
            tracing::debug!(queue, error = %e, "could not renew {errors} leases");
        } else {
            tracing::warn!(queue, error = %e, "could not renew {errors} of {} leases: trying again every {:?}", batch.len(), self.every);
        }
        true
    }
}
