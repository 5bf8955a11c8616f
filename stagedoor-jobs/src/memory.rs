//! The in-memory broker (feature `testing`): the full semantics of every backend, in one
//! process, on a clock the test harness can control. For users' tests and examples; it keeps
//! nothing across a restart of the process.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;

use crate::activity::{
    COUNTS_KEPT, DelayedJob, MinuteCounts, QueueCounts, WorkerReport, minute_of,
};
use crate::broker::Activity;
use crate::broker::{
    Broker, BrokerError, Cancelled, Claimed, DeadLetter, DeadSelector, Delivery, MountInfo,
    Permits, Problem, Published, QueueStats, ReplayReport, Settled, Settlement,
};
use crate::broker::{DeadLetters, Inspect, Locks};
use crate::clock::{Clock, chrono_duration, later};
use crate::envelope::{Envelope, JobId};
use crate::kit::{ClockWatch, lock};
use crate::outcome::Failure;

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

    fn dead_of(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Vec<((DateTime<Utc>, u64), DeadLetter)> {
        let mem = self.mem();
        let Some(q) = mem.queues.get(dead) else {
            return Vec::new();
        };
        let mut out: Vec<_> = q
            .waiting
            .iter()
            .filter_map(|(k, s)| {
                let d = s.dead.as_ref()?;
                let letter = DeadLetter {
                    id: s.envelope.id().to_string(),
                    envelope: s.envelope.clone(),
                    origin: d.origin.clone(),
                    error: d.failure.error.clone(),
                    traceback: d.failure.traceback.clone(),
                    attempts: s.envelope.attempt(),
                    failed_at: d.failed_at,
                };
                selector.matches(&letter).then_some((*k, letter))
            })
            .collect();
        out.sort_by(|a, b| b.1.failed_at.cmp(&a.1.failed_at).then(b.0.1.cmp(&a.0.1)));
        out
    }
}

impl Inspect for MemoryBroker {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn connect(&self) -> Result<(), BrokerError> {
        Ok(())
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, BrokerError> {
        // The lock first, then the clock: a settlement cannot land between the two.
        let mem = self.mem();
        let now = self.now();
        let Some(q) = mem.queues.get(queue) else {
            return Ok(QueueStats::default());
        };
        let mut s = QueueStats {
            pending: q.running.values().filter(|r| r.lease_until > now).count() as u64,
            ready: q.running.values().filter(|r| r.lease_until <= now).count() as u64,
            ..QueueStats::default()
        };
        for (due, _) in q.waiting.keys() {
            if *due <= now {
                s.ready += 1;
                let waited = (now - *due).to_std().unwrap_or_default();
                s.oldest = Some(s.oldest.map_or(waited, |o| o.max(waited)));
            } else {
                s.delayed += 1;
            }
        }
        Ok(s)
    }

    async fn queues(&self) -> Result<Vec<String>, BrokerError> {
        let mut names: Vec<String> = self.mem().queues.keys().cloned().collect();
        names.sort();
        Ok(names)
    }

    async fn next_due(&self, queue: &str) -> Option<DateTime<Utc>> {
        Self::next_due_locked(&self.mem(), queue)
    }
}

impl DeadLetters for MemoryBroker {
    async fn cancel(&self, queue: &str, id: &JobId) -> Result<Cancelled, BrokerError> {
        let (what, removed) = {
            let mut mem = self.mem();
            match mem.queues.get_mut(queue) {
                None => (Cancelled::NotFound, None),
                Some(q) => {
                    let key = q
                        .waiting
                        .iter()
                        .find(|(_, s)| s.envelope.id() == id)
                        .map(|(k, _)| *k);
                    if let Some(key) = key {
                        q.ids.remove(id);
                        (Cancelled::Removed, q.waiting.remove(&key))
                    } else if q.running.values().any(|r| r.stored.envelope.id() == id) {
                        q.cancelled.insert(id.clone());
                        (Cancelled::Running, None)
                    } else {
                        (Cancelled::NotFound, None)
                    }
                }
            }
        };
        if let Some(r) = removed {
            crate::broker::release_unique(self, queue, r.envelope.headers(), id).await?;
        }
        Ok(what)
    }

    async fn dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        Ok(self
            .dead_of(dead, selector)
            .into_iter()
            .take(limit)
            .map(|(_, d)| d)
            .collect())
    }

    async fn replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<ReplayReport, BrokerError> {
        self.check_dead_letter(dead).await?;
        let now = self.now();
        let selected = self.dead_of(dead, selector);
        let mut report = ReplayReport::default();
        {
            let mut mem = self.mem();
            let Mem { queues, seq, .. } = &mut *mem;
            for (key, letter) in selected {
                // A job whose id is back in its queue already is left where it is.
                if queues
                    .get(&letter.origin)
                    .is_some_and(|q| q.ids.contains(letter.envelope.id()))
                {
                    report.skipped += 1;
                    continue;
                }
                let Some(stored) = queues.get_mut(dead).and_then(|q| q.waiting.remove(&key)) else {
                    report.skipped += 1;
                    continue;
                };
                if let Some(q) = queues.get_mut(dead) {
                    q.ids.remove(stored.envelope.id());
                }
                let origin = queues.entry(letter.origin.clone()).or_default();
                origin.ids.insert(stored.envelope.id().clone());
                *seq += 1;
                let envelope = stored.envelope.with_attempt(0);
                origin.waiting.insert(
                    (now, *seq),
                    Stored {
                        envelope,
                        dead: None,
                        unread_dead: false,
                        delivered: 0,
                    },
                );
                report.replayed += 1;
            }
        }
        self.inner.changed.notify_waiters();
        Ok(report)
    }

    async fn purge(&self, dead: &str, selector: &DeadSelector) -> Result<u64, BrokerError> {
        self.check_dead_letter(dead).await?;
        let selected = self.dead_of(dead, selector);
        let mut mem = self.mem();
        let Some(q) = mem.queues.get_mut(dead) else {
            return Ok(0);
        };
        let mut n = 0;
        for (key, _) in selected {
            if let Some(s) = q.waiting.remove(&key) {
                q.ids.remove(s.envelope.id());
                n += 1;
            }
        }
        Ok(n)
    }

    async fn check_dead_letter(&self, name: &str) -> Result<(), BrokerError> {
        let declared = self.mem().declared_dead.clone();
        crate::broker::ensure_dead_letter(self, name, ".dead", &declared).await
    }

    async fn dead_len(&self, dead: &str) -> Result<u64, BrokerError> {
        let mem = self.mem();
        Ok(mem.queues.get(dead).map_or(0, |q| {
            q.waiting.values().filter(|s| s.dead.is_some()).count() as u64
        }))
    }

    fn default_dead_letter(&self, queue: &str) -> String {
        format!("{queue}.dead")
    }
}

impl Activity for MemoryBroker {
    async fn report(
        &self,
        worker: &WorkerReport,
        counts: &[QueueCounts],
        ttl: Duration,
    ) -> Result<(), BrokerError> {
        let now = self.now();
        let mut mem = self.mem();
        mem.workers
            .insert(worker.id.clone(), (worker.clone(), later(now, ttl)));
        let keep_from = now - chrono_duration(COUNTS_KEPT);
        for q in counts {
            let minutes = mem.minutes.entry(q.queue.clone()).or_default();
            for m in &q.minutes {
                let at = minute_of(m.minute);
                let slot = minutes
                    .entry(at)
                    .or_insert_with(|| MinuteCounts::new(at, 0, 0, 0));
                slot.processed += m.processed;
                slot.failed += m.failed;
                slot.dead += m.dead;
            }
            minutes.retain(|at, _| *at >= keep_from);
        }
        Ok(())
    }

    async fn workers(&self) -> Result<Vec<WorkerReport>, BrokerError> {
        let now = self.now();
        let mut mem = self.mem();
        mem.workers.retain(|_, (_, until)| *until > now);
        let mut out: Vec<WorkerReport> = mem.workers.values().map(|(w, _)| w.clone()).collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn throughput(
        &self,
        queue: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteCounts>, BrokerError> {
        let from = minute_of(since);
        Ok(self
            .mem()
            .minutes
            .get(queue)
            .map(|m| {
                m.range(from..)
                    .map(|(_, c)| *c)
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn delayed(&self, queue: &str, limit: usize) -> Result<Vec<DelayedJob>, BrokerError> {
        let mem = self.mem();
        let now = self.now();
        let Some(q) = mem.queues.get(queue) else {
            return Ok(Vec::new());
        };
        Ok(q.waiting
            .iter()
            .filter(|((due, _), _)| *due > now)
            .take(limit)
            .map(|((due, _), stored)| {
                // The stored attempt is the attempts spent; a claim makes it the next one (a
                // dead letter's first delivery keeps it, as `claim` does).
                let e = &stored.envelope;
                let attempt = if stored.unread_dead {
                    e.attempt().max(1)
                } else {
                    e.attempt().saturating_add(1)
                };
                DelayedJob::new(e.id().to_string(), e.kind(), *due, attempt)
            })
            .collect())
    }
}

impl Locks for MemoryBroker {
    async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, BrokerError> {
        let now = self.now();
        let mut mem = self.mem();
        match mem.locks.get(key) {
            Some((_, until)) if *until > now => Ok(false),
            _ => {
                mem.locks.retain(|_, (_, until)| *until > now);
                mem.locks
                    .insert(key.to_owned(), (token.to_owned(), later(now, ttl)));
                Ok(true)
            }
        }
    }

    async fn last_tick(&self, schedule: &str) -> Result<Option<DateTime<Utc>>, BrokerError> {
        Ok(self.mem().ticks.get(schedule).copied())
    }

    async fn mark_tick(&self, schedule: &str, tick: DateTime<Utc>) -> Result<(), BrokerError> {
        let mut mem = self.mem();
        let t = mem.ticks.entry(schedule.to_owned()).or_insert(tick);
        *t = (*t).max(tick);
        Ok(())
    }

    async fn unlock(&self, key: &str, token: &str) -> Result<(), BrokerError> {
        let mut mem = self.mem();
        if mem.locks.get(key).is_some_and(|(t, _)| t == token) {
            mem.locks.remove(key);
        }
        Ok(())
    }

    async fn take_permits(
        &self,
        key: &str,
        limit: u32,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<Permits, BrokerError> {
        let now = self.now();
        let mut mem = self.mem();
        let pool = mem.permits.entry(key.to_owned()).or_default();
        pool.retain(|_, until| *until > now);
        let free = (limit as usize).saturating_sub(pool.len());
        let taken = free.min(tokens.len());
        let until = later(now, ttl);
        for t in &tokens[..taken] {
            pool.insert(t.clone(), until);
        }
        let next_free = if taken == 0 {
            pool.values()
                .min()
                .and_then(|first| (*first - now).to_std().ok())
        } else {
            None
        };
        Ok(Permits { taken, next_free })
    }

    async fn renew_permits(
        &self,
        key: &str,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<usize, BrokerError> {
        let now = self.now();
        let until = later(now, ttl);
        let mut mem = self.mem();
        let Some(pool) = mem.permits.get_mut(key) else {
            return Ok(0);
        };
        let mut held = 0;
        for t in tokens {
            if let Some(u) = pool.get_mut(t)
                && *u > now
            {
                *u = until;
                held += 1;
            }
        }
        Ok(held)
    }

    async fn release_permits(&self, key: &str, tokens: &[String]) -> Result<(), BrokerError> {
        let mut mem = self.mem();
        if let Some(pool) = mem.permits.get_mut(key) {
            for t in tokens {
                pool.remove(t);
            }
        }
        Ok(())
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
