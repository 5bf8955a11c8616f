//! A queue's global limits (`.global_concurrency(n)`, `.rate_limit(r, per)`), enforced through
//! the backend's permit pools ([`Locks::take_permits`]): before each claim the worker takes a
//! permit per job it may claim, so a job held back by a limit stays in its queue and spends no
//! attempt.
//!
//! - Concurrency: pool `concurrency:<queue>` of `n`; one permit per claimed job, renewed every
//!   third of the lease with every other permit this worker holds (one call), given back when
//!   its job is settled. A worker that dies gives its permits back within a lease.
//! - Rate: pool `rate:<queue>` of `r`; one permit per started job, held `per` and never given
//!   back (unless the claim found fewer jobs than permits), so no window of `per` sees more
//!   than `r` claims. A claim that waited for its jobs renews the permits it used, so that each
//!   is held `per` from the job's start rather than from the claim's.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use crate::broker::{Broker, BrokerError};
use crate::envelope::JobId;
use crate::kit::lock;
use crate::mount::MountSpec;

/// The longest a worker waits before asking a full pool again.
const FULL_WAIT_MAX: Duration = Duration::from_millis(100);
/// The shortest.
const FULL_WAIT_MIN: Duration = Duration::from_millis(5);
/// How long a worker waits before asking a full concurrency pool again.
const RUNNING_FULL_WAIT: Duration = Duration::from_millis(20);

/// A queue's global limits, as its mounts declare them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct QueueLimits {
    pub(crate) concurrency: Option<u32>,
    pub(crate) rate: Option<(u32, Duration)>,
}

impl QueueLimits {
    /// The limits of `queue` from its mounts: `Err` naming the two mounts when they disagree.
    pub(crate) fn of<'a>(
        queue: &str,
        mounts: impl Iterator<Item = &'a MountSpec>,
    ) -> Result<Option<Self>, String> {
        let mut limits = QueueLimits::default();
        let mut from: [Option<&str>; 2] = [None, None];
        for m in mounts.filter(|m| m.queue == queue) {
            if let Some(n) = m.global_concurrency {
                match (limits.concurrency, from[0]) {
                    (Some(prev), Some(other)) if prev != n => {
                        return Err(format!(
                            "global_concurrency({n}) differs from `{other}`'s global_concurrency({prev}) on the same queue: the limit is the queue's, declare the same on both (or one only)"
                        ));
                    }
                    _ => {
                        limits.concurrency = Some(n);
                        from[0] = Some(&m.subscriber);
                    }
                }
            }
            if let Some((r, per)) = m.rate_limit {
                match (limits.rate, from[1]) {
                    (Some(prev), Some(other)) if prev != (r, per) => {
                        return Err(format!(
                            "rate_limit({r}, {per:?}) differs from `{other}`'s rate_limit({}, {:?}) on the same queue: the limit is the queue's, declare the same on both (or one only)",
                            prev.0, prev.1
                        ));
                    }
                    _ => {
                        limits.rate = Some((r, per));
                        from[1] = Some(&m.subscriber);
                    }
                }
            }
        }
        Ok((limits != QueueLimits::default()).then_some(limits))
    }

    /// What is wrong with one mount's own values, each with its fix.
    pub(crate) fn problems(m: &MountSpec) -> Vec<String> {
        let mut out = Vec::new();
        if m.global_concurrency == Some(0) {
            out.push("global_concurrency(0) would never run a job: use 1 or more".to_owned());
        }
        if let Some((r, per)) = m.rate_limit {
            if r == 0 {
                out.push("rate_limit(0, ..) would never start a job: use 1 or more".to_owned());
            }
            if per < Duration::from_millis(1) {
                out.push(format!(
                    "rate_limit({r}, {per:?}): the period must be at least 1 ms, such as `Duration::from_secs(1)`"
                ));
            }
        }
        out
    }
}

/// The pool names of `queue`'s limits.
pub(crate) fn concurrency_key(queue: &str) -> String {
    format!("concurrency:{queue}")
}

pub(crate) fn rate_key(queue: &str) -> String {
    format!("rate:{queue}")
}

/// What a worker took before a claim: a concurrency permit per job it may claim (if the queue
/// has that limit) and a rate permit each (if it has that one).
pub(super) struct Grant {
    pub(super) n: usize,
    pub(super) running: Vec<String>,
    pub(super) rate: Vec<String>,
}

/// A full pool: how long to wait before asking again, and when its first permit runs out.
pub(super) struct Full {
    pub(super) wait: Duration,
    pub(super) next_free: Option<Duration>,
}

/// A worker's side of its queue's limits: the pools' names and the concurrency permits it
/// holds (renewed together).
pub(super) struct Limiter {
    limits: QueueLimits,
    running_key: String,
    rate_key: String,
    held: Mutex<HashSet<String>>,
    /// Permits of settled jobs, given back together by [`release_loop`](Self::release_loop).
    released: Mutex<Vec<String>>,
    wake: tokio::sync::Notify,
}

fn tokens(n: usize) -> Vec<String> {
    (0..n).map(|_| JobId::new().as_str().to_owned()).collect()
}

impl Limiter {
    pub(super) fn new(queue: &str, limits: QueueLimits) -> Self {
        Self {
            limits,
            running_key: concurrency_key(queue),
            rate_key: rate_key(queue),
            held: Mutex::new(HashSet::new()),
            released: Mutex::new(Vec::new()),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// Takes up to `want` permits of each limit. `Ok(Err(full))` when a pool is full: how long
    /// to wait before trying again, and when its first permit runs out if the backend said.
    pub(super) async fn take<B: Broker>(
        &self,
        broker: &B,
        want: usize,
    ) -> Result<Result<Grant, Full>, BrokerError> {
        // This worker's own settled permits go back first, so that the pool has them.
        self.flush(broker).await;
        let mut n = want;
        let mut running = Vec::new();
        if let Some(limit) = self.limits.concurrency {
            running = tokens(n);
            let got = broker
                .take_permits(&self.running_key, limit, &running, broker.lease())
                .await?;
            running.truncate(got.taken);
            n = got.taken;
            if n == 0 {
                // Permits are given back at settlements, well before they run out: no time
                // has to pass for one to free.
                return Ok(Err(Full {
                    wait: RUNNING_FULL_WAIT,
                    next_free: None,
                }));
            }
            lock(&self.held).extend(running.iter().cloned());
        }
        let mut rate = Vec::new();
        if let Some((limit, per)) = self.limits.rate {
            rate = tokens(n);
            let got = match broker.take_permits(&self.rate_key, limit, &rate, per).await {
                Ok(got) => got,
                Err(e) => {
                    self.release_running(broker, running).await;
                    return Err(e);
                }
            };
            rate.truncate(got.taken);
            if got.taken < n {
                let extra = running.split_off(got.taken.min(running.len()));
                self.release_running(broker, extra).await;
            }
            n = got.taken;
            if n == 0 {
                return Ok(Err(Full {
                    wait: full_wait(got.next_free),
                    next_free: got.next_free,
                }));
            }
        }
        Ok(Ok(Grant { n, running, rate }))
    }

    /// After a claim that returned `got` of a grant's jobs: gives back the permits not used
    /// and, when the claim waited, holds the rate permits used for their whole period from now.
    pub(super) async fn after_claim<B: Broker>(
        &self,
        broker: &B,
        grant: &mut Grant,
        got: usize,
        waited: bool,
    ) {
        if grant.running.len() > got {
            let extra = grant.running.split_off(got);
            self.release_running(broker, extra).await;
        }
        if grant.rate.len() > got {
            let extra = grant.rate.split_off(got);
            if let Err(e) = broker.release_permits(&self.rate_key, &extra).await {
                tracing::debug!(error = %e, "could not give back rate permits not used: they run out by themselves");
            }
        }
        if waited
            && !grant.rate.is_empty()
            && let Some((_, per)) = self.limits.rate
            && let Err(e) = broker.renew_permits(&self.rate_key, &grant.rate, per).await
        {
            tracing::warn!(error = %e, "could not restart the rate permits of a claim that waited for its jobs");
        }
    }

    /// Gives back concurrency permits (a settled job's, or ones not used).
    pub(super) async fn release_running<B: Broker>(&self, broker: &B, tokens: Vec<String>) {
        if tokens.is_empty() {
            return;
        }
        {
            let mut held = lock(&self.held);
            for t in &tokens {
                held.remove(t);
            }
        }
        if let Err(e) = broker.release_permits(&self.running_key, &tokens).await {
            tracing::warn!(error = %e, "could not give back a global concurrency permit: it runs out after its lease");
        }
    }

    /// A settled job's concurrency permit: given back by the release loop, with every other
    /// given back meanwhile, in one call (one round trip for a burst of settlements, not one
    /// per job).
    pub(super) fn settled(&self, token: String) {
        lock(&self.held).remove(&token);
        lock(&self.released).push(token);
        self.wake.notify_one();
    }

    /// Gives back the permits of settled jobs as they come, batched: while one call is under
    /// way, the next settlements wait for the one after it. Runs until the worker is done (the
    /// caller aborts it after a last [`flush`](Self::flush)).
    pub(super) async fn release_loop<B: Broker>(&self, broker: &B) {
        if self.limits.concurrency.is_none() {
            return;
        }
        loop {
            self.wake.notified().await;
            self.flush(broker).await;
        }
    }

    /// Gives back every permit of a settled job not given back yet.
    pub(super) async fn flush<B: Broker>(&self, broker: &B) {
        let batch = std::mem::take(&mut *lock(&self.released));
        if batch.is_empty() {
            return;
        }
        if let Err(e) = broker.release_permits(&self.running_key, &batch).await {
            tracing::warn!(error = %e, "could not give back {} global concurrency permits: they run out after their lease", batch.len());
        }
    }

    /// Renews every concurrency permit this worker holds, every third of the lease, until the
    /// worker is dropped (the caller aborts it).
    pub(super) async fn renew_loop<B: Broker>(&self, broker: &B) {
        if self.limits.concurrency.is_none() {
            return;
        }
        let every = (broker.lease() / 3).max(Duration::from_millis(10));
        let mut failing = false;
        loop {
            tokio::time::sleep(every).await;
            let tokens: Vec<String> = lock(&self.held).iter().cloned().collect();
            if tokens.is_empty() {
                continue;
            }
            match broker
                .renew_permits(&self.running_key, &tokens, broker.lease())
                .await
            {
                Ok(n) if n < tokens.len() => {
                    failing = false;
                    tracing::warn!(
                        "{} of {} global concurrency permits ran out before their renewal (the worker was stalled or the server away longer than a lease): other workers may run more jobs at once until these settle",
                        tokens.len() - n,
                        tokens.len()
                    );
                }
                Ok(_) => failing = false,
                Err(e) if failing => tracing::debug!(error = %e, "could not renew permits"),
                Err(e) => {
                    failing = true;
                    tracing::warn!(error = %e, "could not renew the global concurrency permits: trying again every {every:?}");
                }
            }
        }
    }
}

fn full_wait(next_free: Option<Duration>) -> Duration {
    next_free
        .unwrap_or(FULL_WAIT_MAX)
        .clamp(FULL_WAIT_MIN, FULL_WAIT_MAX)
}
