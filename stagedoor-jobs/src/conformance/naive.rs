//! [`NaiveBroker`]: a broker for tests that knows nothing of the runtime's rules (no cap, no
//! poison count, no fair turn, no choice of dead letter). It stores and moves what it is told,
//! over the in-memory broker, so that the suite can show that a backend of a user's own gets
//! every rule from the runtime.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::activity::{DelayedJob, MinuteCounts, QueueCounts, WorkerReport};
use crate::broker::{
    Activity, Broker, BrokerError, Cancelled, ClaimOrder, Claimed, DeadLetter, DeadLetters,
    DeadSelector, Delivery, Inspect, Locks, MountInfo, Permits, Problem, Published, QueueStats,
    Record, RecordWrite, Records, ReplayReport, Settled, Settlement, Unreadable,
};
use crate::clock::{Clock, later};
use crate::envelope::{Envelope, JobId};
use crate::kit::lock;
use crate::memory::{MemoryBroker, MemoryReceipt};

/// A deliberately naive broker for tests (feature `conformance`): the in-memory broker's store,
/// with none of the runtime's rules. Its claim returns what is stored, in the order it is
/// asked for, and reports how many times each job was delivered since last settled
/// ([`Delivery::delivered`]); it records every order it is asked for
/// ([`claim_orders`](Self::claim_orders)); it holds items it cannot read as jobs
/// ([`store_unreadable`](Self::store_unreadable)), which its claims return as [`Unreadable`],
/// and moves one, raw, to whatever dead letter it is told
/// ([`Broker::dead_letter_unreadable`]). Clones share the same store.
#[derive(Clone, Debug)]
pub struct NaiveBroker {
    memory: MemoryBroker,
    own: Arc<Mutex<Own>>,
}

/// What the naive broker keeps beside the in-memory store.
#[derive(Debug, Default)]
struct Own {
    /// Each queue's claims: the order asked for and how many items the claim took.
    orders: HashMap<String, Vec<(ClaimOrder, usize)>>,
    /// Unreadable items waiting in each queue.
    unreadable: HashMap<String, VecDeque<Raw>>,
    /// Unreadable items claimed, by token: their queue, the item, their lease's end.
    leased: HashMap<u64, (String, Raw, DateTime<Utc>)>,
    /// Unreadable items moved to a dead letter.
    dead: Vec<RawLetter>,
    seq: u64,
}

/// An item stored as it came: bytes that are no job.
#[derive(Clone, Debug)]
struct Raw {
    id: String,
    content: Vec<u8>,
    kind: Option<String>,
    error: String,
}

/// An unreadable item in a dead letter, raw.
#[derive(Clone, Debug)]
struct RawLetter {
    target: String,
    origin: String,
    raw: Raw,
    failed_at: DateTime<Utc>,
}

impl RawLetter {
    /// The letter as the contract lists it: its envelope holds the raw content as its payload
    /// (and the kind, if read, else `?`), attempt 0.
    fn letter(&self) -> DeadLetter {
        let kind = self.raw.kind.clone().unwrap_or_else(|| "?".to_owned());
        let envelope = Envelope::new(kind, self.raw.content.clone(), self.failed_at)
            .with_id(JobId::from_string(self.raw.id.clone()));
        DeadLetter {
            id: self.raw.id.clone(),
            envelope,
            origin: self.origin.clone(),
            error: self.raw.error.clone(),
            traceback: String::new(),
            attempts: 0,
            failed_at: self.failed_at,
        }
    }
}

/// A delivery's receipt on the naive broker: a job's, or an unreadable item's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NaiveReceipt {
    /// A job, held by the in-memory store.
    Job(MemoryReceipt),
    /// An unreadable item, by its token.
    Unreadable(u64),
}

impl Default for NaiveBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl NaiveBroker {
    /// A naive broker with the backends' lease.
    pub fn new() -> Self {
        Self::over(MemoryBroker::new())
    }

    /// A naive broker whose claims hold an item for `lease`.
    pub fn with_lease(lease: Duration) -> Self {
        Self::over(MemoryBroker::with_lease(lease))
    }

    fn over(memory: MemoryBroker) -> Self {
        Self {
            memory,
            own: Arc::new(Mutex::new(Own::default())),
        }
    }

    /// Stores in `queue` an item that is no job: `content` as it came, which a claim returns as
    /// [`Unreadable`] with `error` (and `kind`, if given), and which its dead letter keeps as
    /// its payload. Returns the item's id. A claim already waiting does not see it: store it
    /// before the service starts.
    pub fn store_unreadable(
        &self,
        queue: &str,
        content: &[u8],
        kind: Option<&str>,
        error: &str,
    ) -> String {
        let mut own = lock(&self.own);
        own.seq += 1;
        let id = format!("raw-{}", own.seq);
        let raw = Raw {
            id: id.clone(),
            content: content.to_vec(),
            kind: kind.map(str::to_owned),
            error: error.to_owned(),
        };
        own.unreadable
            .entry(queue.to_owned())
            .or_default()
            .push_back(raw);
        id
    }

    /// The order of every claim of `queue` so far, with how many items each took.
    pub fn claim_orders(&self, queue: &str) -> Vec<(ClaimOrder, usize)> {
        lock(&self.own)
            .orders
            .get(queue)
            .cloned()
            .unwrap_or_default()
    }

    /// Up to `max` unreadable items of `queue`, leased (those whose lease ran out first).
    fn claim_unreadable(&self, queue: &str, max: usize) -> Vec<Unreadable<NaiveReceipt>> {
        let now = self.memory.clock().now();
        let until = later(now, self.memory.lease());
        let mut own = lock(&self.own);
        let own = &mut *own;
        let expired: Vec<u64> = (own.leased.iter())
            .filter(|(_, (q, _, until))| q == queue && *until <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in expired {
            if let Some((q, raw, _)) = own.leased.remove(&t) {
                own.unreadable.entry(q).or_default().push_front(raw);
            }
        }
        let mut out = Vec::new();
        while out.len() < max {
            let Some(raw) = own.unreadable.get_mut(queue).and_then(VecDeque::pop_front) else {
                break;
            };
            own.seq += 1;
            out.push(Unreadable {
                error: raw.error.clone(),
                kind: raw.kind.clone(),
                receipt: NaiveReceipt::Unreadable(own.seq),
            });
            own.leased.insert(own.seq, (queue.to_owned(), raw, until));
        }
        out
    }

    /// The raw letters of `dead` that `selector` takes, newest first.
    fn raw_letters(&self, dead: &str, selector: &DeadSelector) -> Vec<DeadLetter> {
        let own = lock(&self.own);
        let mut out: Vec<DeadLetter> = (own.dead.iter())
            .filter(|l| l.target == dead)
            .map(RawLetter::letter)
            .filter(|d| selector.matches(d))
            .collect();
        out.reverse();
        out
    }

    /// Takes the raw letters of `dead` that `selector` takes out of the store.
    fn take_raw_letters(&self, dead: &str, selector: &DeadSelector) -> Vec<RawLetter> {
        let mut own = lock(&self.own);
        let (taken, kept) = std::mem::take(&mut own.dead)
            .into_iter()
            .partition(|l| l.target == dead && selector.matches(&l.letter()));
        own.dead = kept;
        taken
    }
}

/// The same delivery with the in-memory store's receipt, or `None` for an unreadable item's.
fn memory_delivery(d: &Delivery<NaiveReceipt>) -> Option<Delivery<MemoryReceipt>> {
    let NaiveReceipt::Job(receipt) = d.receipt else {
        return None;
    };
    Some(Delivery {
        envelope: d.envelope.clone(),
        receipt,
        delivered: d.delivered,
        spent_from: d.spent_from.clone(),
    })
}

impl Broker for NaiveBroker {
    type Receipt = NaiveReceipt;

    async fn check(&self, mounts: &[MountInfo]) -> Vec<Problem> {
        self.memory.check(mounts).await
    }

    async fn prepare(&self, queue: &str) -> Result<(), BrokerError> {
        self.memory.prepare(queue).await
    }

    /// Unreadable items first, then the stored jobs in `order` (without waiting when it took
    /// unreadable ones); the order is recorded with what the claim took.
    async fn claim(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        order: ClaimOrder,
    ) -> Result<Claimed<NaiveReceipt>, BrokerError> {
        let unreadable = self.claim_unreadable(queue, max);
        let rest = max.saturating_sub(unreadable.len());
        let wait = if unreadable.is_empty() {
            wait
        } else {
            Duration::ZERO
        };
        let jobs = if rest > 0 {
            self.memory.claim(queue, rest, wait, order).await?
        } else {
            Claimed::default()
        };
        let deliveries: Vec<Delivery<NaiveReceipt>> = (jobs.deliveries.into_iter())
            .map(|d| Delivery {
                envelope: d.envelope,
                receipt: NaiveReceipt::Job(d.receipt),
                delivered: d.delivered,
                spent_from: d.spent_from,
            })
            .collect();
        let claimed = Claimed {
            deliveries,
            unreadable,
        };
        (lock(&self.own).orders.entry(queue.to_owned()).or_default())
            .push((order, claimed.taken()));
        Ok(claimed)
    }

    /// Stores the item, raw, in `target` with its error, as it is told.
    async fn dead_letter_unreadable(
        &self,
        queue: &str,
        item: &Unreadable<NaiveReceipt>,
        target: &str,
    ) -> Result<Settled, BrokerError> {
        let NaiveReceipt::Unreadable(token) = item.receipt else {
            return Err(BrokerError::Backend(
                "a job's receipt is no unreadable item's".to_owned(),
            ));
        };
        let failed_at = self.memory.clock().now();
        let mut own = lock(&self.own);
        let Some((_, raw, _)) = own.leased.remove(&token) else {
            return Ok(Settled::LeaseLost);
        };
        own.dead.push(RawLetter {
            target: target.to_owned(),
            origin: queue.to_owned(),
            raw: Raw {
                error: item.error.clone(),
                ..raw
            },
            failed_at,
        });
        Ok(Settled::Done)
    }

    async fn renew(&self, queue: &str, receipt: &NaiveReceipt) -> Result<bool, BrokerError> {
        match receipt {
            NaiveReceipt::Job(r) => self.memory.renew(queue, r).await,
            NaiveReceipt::Unreadable(token) => {
                let until = later(self.memory.clock().now(), self.memory.lease());
                Ok(match lock(&self.own).leased.get_mut(token) {
                    Some(held) => {
                        held.2 = until;
                        true
                    }
                    None => false,
                })
            }
        }
    }

    async fn settle(
        &self,
        queue: &str,
        delivery: &Delivery<NaiveReceipt>,
        settlement: Settlement,
    ) -> Result<Settled, BrokerError> {
        let Some(d) = memory_delivery(delivery) else {
            return Err(BrokerError::Backend(
                "an unreadable item is settled by dead_letter_unreadable".to_owned(),
            ));
        };
        self.memory.settle(queue, &d, settlement).await
    }

    async fn publish(
        &self,
        queue: &str,
        jobs: Vec<(Envelope, Option<DateTime<Utc>>)>,
    ) -> Result<Vec<Published>, BrokerError> {
        self.memory.publish(queue, jobs).await
    }

    async fn publish_once(
        &self,
        queue: &str,
        job: (Envelope, Option<DateTime<Utc>>),
        guard: &str,
        ttl: Duration,
    ) -> Result<Published, BrokerError> {
        self.memory.publish_once(queue, job, guard, ttl).await
    }

    async fn finish_guard(
        &self,
        queue: &str,
        guard: &str,
        job_id: &JobId,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        self.memory.finish_guard(queue, guard, job_id, ttl).await
    }

    async fn cancelled(&self, queue: &str, ids: &[JobId]) -> Result<Vec<JobId>, BrokerError> {
        self.memory.cancelled(queue, ids).await
    }

    fn lease(&self) -> Duration {
        self.memory.lease()
    }

    fn clock(&self) -> Clock {
        self.memory.clock()
    }

    fn use_clock(&self, clock: &Clock) -> bool {
        self.memory.use_clock(clock)
    }
}

impl Inspect for NaiveBroker {
    fn backend(&self) -> &'static str {
        "naive"
    }

    async fn connect(&self) -> Result<(), BrokerError> {
        self.memory.connect().await
    }

    /// The in-memory store's stats, with the unreadable items counted as ready (waiting) or
    /// pending (claimed).
    async fn stats(&self, queue: &str) -> Result<QueueStats, BrokerError> {
        let mut s = self.memory.stats(queue).await?;
        let own = lock(&self.own);
        s.ready += own.unreadable.get(queue).map_or(0, |u| u.len() as u64);
        s.pending += own.leased.values().filter(|l| l.0 == queue).count() as u64;
        Ok(s)
    }

    async fn queues(&self) -> Result<Vec<String>, BrokerError> {
        self.memory.queues().await
    }

    async fn next_due(&self, queue: &str) -> Option<DateTime<Utc>> {
        let waiting = lock(&self.own)
            .unreadable
            .get(queue)
            .is_some_and(|u| !u.is_empty());
        let stored = self.memory.next_due(queue).await;
        if waiting {
            let now = self.memory.clock().now();
            return Some(stored.map_or(now, |t| t.min(now)));
        }
        stored
    }
}

impl DeadLetters for NaiveBroker {
    /// The in-memory store's letters, then the raw ones (each newest first).
    async fn dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        let mut out = self.memory.dead_letters(dead, selector, limit).await?;
        out.extend(self.raw_letters(dead, selector));
        out.truncate(limit);
        Ok(out)
    }

    /// The in-memory store's replay; a raw letter goes back to its queue as the unreadable item
    /// it was.
    async fn replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<ReplayReport, BrokerError> {
        let mut report = self.memory.replay(dead, selector).await?;
        let taken = self.take_raw_letters(dead, selector);
        let mut own = lock(&self.own);
        for l in taken {
            own.unreadable.entry(l.origin).or_default().push_back(l.raw);
            report.replayed += 1;
        }
        Ok(report)
    }

    async fn purge(&self, dead: &str, selector: &DeadSelector) -> Result<u64, BrokerError> {
        let n = self.memory.purge(dead, selector).await?;
        Ok(n + self.take_raw_letters(dead, selector).len() as u64)
    }

    async fn check_dead_letter(&self, name: &str) -> Result<(), BrokerError> {
        self.memory.check_dead_letter(name).await
    }

    async fn dead_len(&self, dead: &str) -> Result<u64, BrokerError> {
        let n = self.memory.dead_len(dead).await?;
        let own = lock(&self.own);
        Ok(n + own.dead.iter().filter(|l| l.target == dead).count() as u64)
    }

    async fn cancel(&self, queue: &str, id: &JobId) -> Result<Cancelled, BrokerError> {
        self.memory.cancel(queue, id).await
    }

    fn default_dead_letter(&self, queue: &str) -> String {
        self.memory.default_dead_letter(queue)
    }
}

impl Records for NaiveBroker {
    async fn read_record(&self, key: &str) -> Result<Option<Record>, BrokerError> {
        self.memory.read_record(key).await
    }
    async fn write_records(&self, writes: &[RecordWrite]) -> Result<Option<Vec<u64>>, BrokerError> {
        self.memory.write_records(writes).await
    }
}

impl Locks for NaiveBroker {
    async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, BrokerError> {
        self.memory.try_lock(key, token, ttl).await
    }

    async fn unlock(&self, key: &str, token: &str) -> Result<(), BrokerError> {
        self.memory.unlock(key, token).await
    }

    async fn last_tick(&self, schedule: &str) -> Result<Option<DateTime<Utc>>, BrokerError> {
        self.memory.last_tick(schedule).await
    }

    async fn mark_tick(&self, schedule: &str, tick: DateTime<Utc>) -> Result<(), BrokerError> {
        self.memory.mark_tick(schedule, tick).await
    }

    async fn take_permits(
        &self,
        key: &str,
        limit: u32,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<Permits, BrokerError> {
        self.memory.take_permits(key, limit, tokens, ttl).await
    }

    async fn renew_permits(
        &self,
        key: &str,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<usize, BrokerError> {
        self.memory.renew_permits(key, tokens, ttl).await
    }

    async fn release_permits(&self, key: &str, tokens: &[String]) -> Result<(), BrokerError> {
        self.memory.release_permits(key, tokens).await
    }
}

impl Activity for NaiveBroker {
    async fn report(
        &self,
        worker: &WorkerReport,
        counts: &[QueueCounts],
        ttl: Duration,
    ) -> Result<(), BrokerError> {
        self.memory.report(worker, counts, ttl).await
    }

    async fn workers(&self) -> Result<Vec<WorkerReport>, BrokerError> {
        self.memory.workers().await
    }

    async fn throughput(
        &self,
        queue: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteCounts>, BrokerError> {
        self.memory.throughput(queue, since).await
    }

    async fn delayed(&self, queue: &str, limit: usize) -> Result<Vec<DelayedJob>, BrokerError> {
        self.memory.delayed(queue, limit).await
    }
}
