//! The in-memory broker (feature `testing`): the full semantics of every backend, in one
//! process, on a clock the test harness can control. For users' tests and examples; it keeps
//! nothing across a restart of the process.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::activity::{MinuteCounts, WorkerReport};
use crate::broker::{
    Broker, BrokerError, Claimed, Delivery, MountInfo, Problem, Published, Settled, Settlement,
};
use crate::clock::{Clock, later};
use crate::envelope::{Envelope, JobId};
use crate::kit::{ClockWatch, lock};
use crate::outcome::Failure;

// The trait impls other than `Broker`, one a file; the store, the claim and the `Broker` impl
// are here.
mod activity;
mod dead;
mod inspect;
mod locks;
mod records;

/// The in-memory broker. Clones share the same queues.
///
/// Queues spring into being when first used; a dead letter is a queue like any other, whose
/// jobs carry their failure (so a subscriber of the dead letter can read it).
#[derive(Clone, Debug)]
pub struct MemoryBroker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    clock: Mutex<Clock>,
    state: Mutex<Mem>,
    changed: Notify,
    lease: Duration,
}

#[derive(Debug, Default)]
struct Mem {
    queues: HashMap<String, MemQueue>,
    locks: HashMap<String, (String, DateTime<Utc>)>,
    /// Permit pools: each held token with when it runs out.
    permits: HashMap<String, HashMap<String, DateTime<Utc>>>,
    ticks: HashMap<String, DateTime<Utc>>,
    seq: u64,
    /// Workers' last reports, with when each expires.
    workers: HashMap<String, (WorkerReport, DateTime<Utc>)>,
    /// Each queue's per-minute counts.
    minutes: HashMap<String, BTreeMap<DateTime<Utc>, MinuteCounts>>,
    /// The dead letters mounts declared ([`Broker::check`]).
    declared_dead: Vec<String>,
    /// Records: each value and version, with when it expires.
    records: HashMap<String, (crate::broker::Record, Option<DateTime<Utc>>)>,
}

#[derive(Debug, Default)]
struct MemQueue {
    /// Waiting jobs by (due, publish order).
    waiting: BTreeMap<(DateTime<Utc>, u64), Stored>,
    /// Claimed jobs by receipt token.
    running: HashMap<u64, Running>,
    /// Ids of every job in the queue, waiting or running.
    ids: HashSet<JobId>,
    /// Running jobs cancelled (until they are settled).
    cancelled: HashSet<JobId>,
}

#[derive(Clone, Debug)]
struct Stored {
    envelope: Envelope,
    dead: Option<DeadInfo>,
    /// A dead letter not yet delivered from its dead letter: its envelope's attempt is the
    /// attempts it spent, which a subscriber reading the dead letter sees on its first
    /// delivery (later deliveries count up from there).
    unread_dead: bool,
    /// How many times it was claimed since it was last settled (the runtime's poison count
    /// reads it).
    delivered: u32,
}

#[derive(Clone, Debug)]
struct DeadInfo {
    origin: String,
    failure: Failure,
    failed_at: DateTime<Utc>,
}

#[derive(Debug)]
struct Running {
    stored: Stored,
    lease_until: DateTime<Utc>,
}

/// A delivery's receipt on the in-memory broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryReceipt(u64);

impl Default for MemoryBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBroker {
    /// A broker with the backends' lease, [`DEFAULT_LEASE`](crate::broker::DEFAULT_LEASE).
    pub fn new() -> Self {
        Self::with_lease(crate::broker::DEFAULT_LEASE)
    }

    /// A broker whose claims hold a job for `lease`. A service refuses to start with a lease
    /// below [`MIN_LEASE`](crate::broker::MIN_LEASE) (100 ms) or above
    /// [`MAX_LEASE`](crate::broker::MAX_LEASE) (one day).
    pub fn with_lease(lease: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                clock: Mutex::new(Clock::system()),
                state: Mutex::new(Mem::default()),
                changed: Notify::new(),
                lease,
            }),
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.inner.clock.lock().expect("clock lock").now()
    }

    fn mem(&self) -> MutexGuard<'_, Mem> {
        lock(&self.inner.state)
    }

    /// Claims due jobs now, without waiting.
    fn try_claim(
        &self,
        queue: &str,
        max: usize,
        now: DateTime<Utc>,
        order: crate::broker::ClaimOrder,
    ) -> Vec<Delivery<MemoryReceipt>> {
        let mut mem = self.mem();
        let Mem { queues, seq, .. } = &mut *mem;
        let q = queues.entry(queue.to_owned()).or_default();
        // Leases that ran out: the job is due again, its attempt already spent.
        let expired: Vec<u64> = q
            .running
            .iter()
            .filter(|(_, r)| r.lease_until <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in expired {
            if let Some(r) = q.running.remove(&t) {
                *seq += 1;
                q.waiting.insert((now, *seq), r.stored);
            }
        }
        // Of the due jobs, the highest priority first, in due order among equals; in due
        // order alone when the runtime asks (its fair turn).
        let mut due: Vec<(crate::Priority, (DateTime<Utc>, u64))> = q
            .waiting
            .range(..=(now, u64::MAX))
            .map(|(k, s)| (s.envelope.priority(), *k))
            .collect();
        if order == crate::broker::ClaimOrder::Priority {
            // A stable sort: due order stays among equals.
            due.sort_by_key(|d| std::cmp::Reverse(d.0));
        }
        let mut out = Vec::new();
        for (_, key) in due.into_iter().take(max) {
            let Some(mut stored) = q.waiting.remove(&key) else {
                continue;
            };
            // The counter saturates at MAX_ATTEMPT, as on every backend; a dead letter's
            // reader sees the attempts it spent on its first delivery.
            let attempt = if std::mem::take(&mut stored.unread_dead) {
                stored.envelope.attempt().max(1)
            } else {
                stored.envelope.attempt().saturating_add(1)
            }
            .min(crate::broker::MAX_ATTEMPT);
            stored.envelope = stored.envelope.clone().with_attempt(attempt);
            stored.delivered = stored.delivered.saturating_add(1);
            *seq += 1;
            let token = *seq;
            out.push(
                Delivery::new(stored.envelope.clone(), MemoryReceipt(token))
                    .with_delivered(stored.delivered),
            );
            q.running.insert(
                token,
                Running {
                    stored,
                    lease_until: later(now, self.inner.lease),
                },
            );
        }
        out
    }

    fn next_due_locked(mem: &Mem, queue: &str) -> Option<DateTime<Utc>> {
        let q = mem.queues.get(queue)?;
        let waiting = q.waiting.keys().next().map(|k| k.0);
        let lease = q.running.values().map(|r| r.lease_until).min();
        match (waiting, lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl Broker for MemoryBroker {
    type Receipt = MemoryReceipt;

    async fn check(&self, mounts: &[MountInfo]) -> Vec<Problem> {
        let mut mem = self.mem();
        for d in mounts.iter().filter_map(|m| m.dead_letter.clone()) {
            if !mem.declared_dead.contains(&d) {
                mem.declared_dead.push(d);
            }
        }
        Vec::new()
    }

    async fn prepare(&self, queue: &str) -> Result<(), BrokerError> {
        self.mem().queues.entry(queue.to_owned()).or_default();
        Ok(())
    }

    async fn claim(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        order: crate::broker::ClaimOrder,
    ) -> Result<Claimed<MemoryReceipt>, BrokerError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut clock = ClockWatch::new(&self.clock());
        loop {
            let notified = self.inner.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now = self.now();
            let got = self.try_claim(queue, max, now, order);
            if !got.is_empty() {
                return Ok(Claimed::of(got));
            }
            let mut until = deadline;
            if !clock.is_manual() {
                // On the system clock, wake for the next due job.
                if let Some(next) = Self::next_due_locked(&self.mem(), queue) {
                    let d = (next - now).to_std().unwrap_or(Duration::ZERO);
                    until = until.min(tokio::time::Instant::now() + d);
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(Claimed::default());
            }
            tokio::select! {
                _ = notified => {}
                () = clock.changed() => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    async fn renew(&self, queue: &str, receipt: &MemoryReceipt) -> Result<bool, BrokerError> {
        let until = later(self.now(), self.inner.lease);
        let mut mem = self.mem();
        let r = mem
            .queues
            .get_mut(queue)
            .and_then(|q| q.running.get_mut(&receipt.0));
        Ok(match r {
            Some(r) => {
                r.lease_until = until;
                true
            }
            None => false,
        })
    }

    async fn settle(
        &self,
        queue: &str,
        delivery: &Delivery<MemoryReceipt>,
        settlement: Settlement,
    ) -> Result<Settled, BrokerError> {
        let now = self.now();
        {
            let mut mem = self.mem();
            let Mem { queues, seq, .. } = &mut *mem;
            let Some(q) = queues.get_mut(queue) else {
                return Ok(Settled::LeaseLost);
            };
            let Some(running) = q.running.remove(&delivery.receipt.0) else {
                return Ok(Settled::LeaseLost);
            };
            let mut stored = running.stored;
            q.cancelled.remove(stored.envelope.id());
            match settlement {
                Settlement::Ack | Settlement::Drop => {
                    q.ids.remove(stored.envelope.id());
                }
                Settlement::Retry { delay, .. } => {
                    stored.delivered = 0;
                    *seq += 1;
                    q.waiting.insert((later(now, delay), *seq), stored);
                }
                Settlement::DeadLetter { target, failure } => {
                    q.ids.remove(stored.envelope.id());
                    let origin = match stored.dead.take() {
                        // A dead letter's own subscriber failed: keep the first origin.
                        Some(d) => d.origin,
                        None => queue.to_owned(),
                    };
                    stored.dead = Some(DeadInfo {
                        origin,
                        failure,
                        failed_at: now,
                    });
                    stored.unread_dead = true;
                    stored.delivered = 0;
                    let t = queues.entry(target).or_default();
                    t.ids.insert(stored.envelope.id().clone());
                    *seq += 1;
                    t.waiting.insert((now, *seq), stored);
                }
            }
        }
        self.inner.changed.notify_waiters();
        Ok(Settled::Done)
    }

    async fn publish(
        &self,
        queue: &str,
        jobs: Vec<(Envelope, Option<DateTime<Utc>>)>,
    ) -> Result<Vec<Published>, BrokerError> {
        let now = self.now();
        let out = store(&mut self.mem(), queue, jobs, now);
        self.inner.changed.notify_waiters();
        Ok(out)
    }

    async fn publish_once(
        &self,
        queue: &str,
        job: (Envelope, Option<DateTime<Utc>>),
        guard: &str,
        ttl: Duration,
    ) -> Result<Published, BrokerError> {
        let now = self.now();
        let id = job.0.id().clone();
        let out = {
            let mut mem = self.mem();
            if let Some((holder, until)) = mem.locks.get(guard)
                && *until > now
            {
                return Ok(Published::already_there(JobId::from_string(holder.clone())));
            }
            mem.locks.retain(|_, (_, until)| *until > now);
            mem.locks
                .insert(guard.to_owned(), (id.to_string(), later(now, ttl)));
            store(&mut mem, queue, vec![job], now)
        };
        self.inner.changed.notify_waiters();
        Ok(out
            .into_iter()
            .next()
            .unwrap_or(Published::already_there(id)))
    }

    async fn finish_guard(
        &self,
        _queue: &str,
        guard: &str,
        job_id: &JobId,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        let now = self.now();
        let mut mem = self.mem();
        match mem.locks.get_mut(guard) {
            Some((holder, until)) if holder == job_id.as_str() && *until > now => {
                *until = later(now, ttl);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn cancelled(&self, queue: &str, ids: &[JobId]) -> Result<Vec<JobId>, BrokerError> {
        let mem = self.mem();
        Ok(match mem.queues.get(queue) {
            Some(q) => ids
                .iter()
                .filter(|id| q.cancelled.contains(*id))
                .cloned()
                .collect(),
            None => Vec::new(),
        })
    }

    fn lease(&self) -> Duration {
        self.inner.lease
    }

    fn clock(&self) -> Clock {
        self.inner.clock.lock().expect("clock lock").clone()
    }

    fn use_clock(&self, clock: &Clock) -> bool {
        *self.inner.clock.lock().expect("clock lock") = clock.clone();
        self.inner.changed.notify_waiters();
        true
    }
}

/// Stores `jobs` in `queue` (each id once), under the broker's lock.
fn store(
    mem: &mut Mem,
    queue: &str,
    jobs: Vec<(Envelope, Option<DateTime<Utc>>)>,
    now: DateTime<Utc>,
) -> Vec<Published> {
    let mut out = Vec::with_capacity(jobs.len());
    let Mem { queues, seq, .. } = mem;
    let q = queues.entry(queue.to_owned()).or_default();
    for (envelope, at) in jobs {
        if !q.ids.insert(envelope.id().clone()) {
            crate::broker::log_not_stored(queue, envelope.id());
            out.push(Published::already_there(envelope.id().clone()));
            continue;
        }
        out.push(Published::stored(envelope.id().clone()));
        *seq += 1;
        q.waiting.insert(
            (at.unwrap_or(now).max(now), *seq),
            Stored {
                envelope,
                dead: None,
                unread_dead: false,
                delivered: 0,
            },
        );
    }
    out
}
