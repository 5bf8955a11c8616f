//! The broker contract: what a backend does for the runtime, split by concern into
//! [`Inspect`] (queues and what they hold), [`DeadLetters`], [`Locks`] (the scheduler's) and
//! [`Broker`] (moving jobs; it requires the other three).
//!
//! The runtime owns every decision (which handler, whether an attempt is retried or
//! dead-lettered, after how long); a broker stores and moves jobs and keeps the promises
//! documented on each method. The same runtime drives Redis Streams (one stream per queue with a
//! consumer group, a delayed sorted set, a dead stream), SQL tables (rows claimed with a lease)
//! and the in-memory broker without special cases.
//!
//! # Attempts
//! Attempts are counted when a job is claimed: [`Broker::claim`] returns each delivery with the
//! number of this delivery (1 for the first). A worker that dies inside a handler has spent the
//! attempt; the runtime dead-letters a job claimed beyond its cap without running it.
//!
//! # Crashes
//! A delivery that is claimed and never settled (the process died, the shutdown deadline
//! passed) comes back after its lease; nothing between claim and settle may lose a job.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

pub use crate::claim_order::{ClaimOrder, FairTurn};
use crate::clock::Clock;
use crate::envelope::{Envelope, JobId};
use crate::outcome::Failure;

// The rest of the contract, one concern a file, re-exported here so that every path stays
// `stagedoor_jobs::broker::X`; this file keeps the `Broker` trait and what it exchanges.
mod activity;
mod bounds;
mod cancel;
mod dead;
mod duplicates;
mod error;
mod inspect;
mod locks;
mod mask;
mod publish;
mod published;
mod records;

pub use activity::Activity;
pub use bounds::{
    DEFAULT_LEASE, MAX_ATTEMPT, MAX_LEASE, MAX_QUEUE_NAME_LEN, MIN_LEASE, queue_name_problem,
};
pub use cancel::{Cancelled, cancel_mark_ttl};
pub use dead::{
    DeadLetter, DeadLetters, DeadSelector, ReplayReport, ensure_dead_letter, named_dead_letter,
};
pub use duplicates::{release_unique, tick_job_id, unique_guard_of};
pub use error::BrokerError;
pub use inspect::{Inspect, QueueStats};
pub use locks::{Locks, Permits};
pub use mask::mask_url;
pub use publish::Publish;
pub use published::{Published, log_not_stored};
pub use records::{
    MAX_RECORD_BYTES, MAX_RECORD_KEY, Record, RecordWrite, Records, check_record_writes,
};

pub use crate::clock::{chrono_duration, later};

/// The poison count of the backends here unless configured ([`Broker::poison_count`]): a job
/// delivered more than 3 times without being settled is dead-lettered without running again.
pub const DEFAULT_POISON_COUNT: u32 = 3;

/// One claimed job: its envelope (attempt = this delivery's number), the backend's receipt,
/// which settles it, and what the backend knows of how it got here, for the runtime's rules
/// (the poison count, the cap on arrival) and their messages.
#[derive(Debug)]
pub struct Delivery<R> {
    /// The job.
    pub envelope: Envelope,
    /// What the backend needs to settle or renew this delivery (a stream entry id, a row id and
    /// the lease it was claimed with).
    pub receipt: R,
    /// How many times the job has been delivered since it was last settled, this delivery
    /// included (1 for a job claimed once), when the backend counts it (Redis: the entry's
    /// delivery count; memory: a counter); `None` when it cannot (SQL counts attempts at the
    /// claim instead, so a crash loop there ends at the mount's cap). The runtime dead-letters
    /// a delivery past the poison count without running it
    /// ([`Broker::poison_count`]).
    pub delivered: Option<u32>,
    /// Where the backend read the attempts the job had spent before these deliveries, for the
    /// runtime's message when they reach its mount's cap on arrival: a phrase that follows
    /// "job X arrived having spent N attempts", such as "by the `attempts` field (`7`) of
    /// entry 1-0". `None`: nothing to add.
    pub spent_from: Option<String>,
}

impl<R> Delivery<R> {
    /// A delivery of `envelope`, settled with `receipt`, with no delivery count and nothing to
    /// say about its spent attempts.
    pub fn new(envelope: Envelope, receipt: R) -> Self {
        Self {
            envelope,
            receipt,
            delivered: None,
            spent_from: None,
        }
    }

    /// The same, delivered `n` times since last settled ([`delivered`](Self::delivered)).
    pub fn with_delivered(mut self, n: u32) -> Self {
        self.delivered = Some(n);
        self
    }

    /// The same, with where its spent attempts were read ([`spent_from`](Self::spent_from)).
    pub fn with_spent_from(mut self, from: impl Into<String>) -> Self {
        self.spent_from = Some(from.into());
        self
    }
}

/// A claimed item the backend could not read as a job (a stream entry without a `kind`, a row
/// whose payload column is not text): it is leased like a delivery, and the runtime moves it
/// to a dead letter of its choice ([`Broker::dead_letter_unreadable`]) with its raw content
/// kept. It never runs.
#[derive(Debug)]
pub struct Unreadable<R> {
    /// What is wrong with it, and how to fix it: the backend's words, which the dead letter
    /// keeps as its error.
    pub error: String,
    /// The job's kind, when the backend could read it (to pick the mount's dead letter).
    pub kind: Option<String>,
    /// What the backend needs to move it.
    pub receipt: R,
}

/// What one [`Broker::claim`] took: the deliveries to run and the items it could not read.
/// It dereferences to its deliveries, so a caller that expects none unreadable reads it as
/// the list of deliveries.
#[derive(Debug)]
pub struct Claimed<R> {
    /// The jobs to run.
    pub deliveries: Vec<Delivery<R>>,
    /// The items that cannot run: the runtime dead-letters each.
    pub unreadable: Vec<Unreadable<R>>,
}

impl<R> Claimed<R> {
    /// A claim that took `deliveries` and nothing unreadable.
    pub fn of(deliveries: Vec<Delivery<R>>) -> Self {
        Self {
            deliveries,
            unreadable: Vec::new(),
        }
    }

    /// Whether it took nothing at all.
    pub fn is_empty(&self) -> bool {
        self.deliveries.is_empty() && self.unreadable.is_empty()
    }

    /// How many items it took, readable or not.
    pub fn taken(&self) -> usize {
        self.deliveries.len() + self.unreadable.len()
    }
}

impl<R> Default for Claimed<R> {
    fn default() -> Self {
        Self::of(Vec::new())
    }
}

impl<R> std::ops::Deref for Claimed<R> {
    type Target = Vec<Delivery<R>>;

    fn deref(&self) -> &Self::Target {
        &self.deliveries
    }
}

impl<R> std::ops::DerefMut for Claimed<R> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.deliveries
    }
}

impl<'a, R> IntoIterator for &'a Claimed<R> {
    type Item = &'a Delivery<R>;
    type IntoIter = std::slice::Iter<'a, Delivery<R>>;

    fn into_iter(self) -> Self::IntoIter {
        self.deliveries.iter()
    }
}

impl<R> IntoIterator for Claimed<R> {
    type Item = Delivery<R>;
    type IntoIter = std::vec::IntoIter<Delivery<R>>;

    fn into_iter(self) -> Self::IntoIter {
        self.deliveries.into_iter()
    }
}

/// What to do with a delivery, decided by the runtime from the handler's outcome, the mount's
/// cap and its backoff.
#[derive(Clone, Debug)]
pub enum Settlement {
    /// Done: the job leaves the queue.
    Ack,
    /// Done without success: the job leaves the queue; no dead letter.
    Drop,
    /// A failed attempt under the cap: the job becomes due again `delay` after now (by the
    /// broker's clock), keeping the attempts it has spent.
    Retry {
        /// How long until it is due again; zero for at once.
        delay: Duration,
        /// Why the attempt failed (backends with an error column keep it).
        failure: Failure,
    },
    /// The job leaves its queue for the dead letter `target`, with every field it had plus the
    /// failure, the attempts spent and the time it failed.
    DeadLetter {
        /// The dead letter: a queue name, a group, a table, `<stream>:dead`.
        target: String,
        /// Why the last attempt failed.
        failure: Failure,
    },
}

/// What settling did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// The settlement took effect.
    Done,
    /// The delivery's lease had been lost (the job was reclaimed by another worker): nothing was
    /// changed, so the new owner's work stands.
    LeaseLost,
}

/// A mount as a broker sees it at startup, to check that it can serve it.
#[derive(Clone, Debug)]
pub struct MountInfo {
    /// The subscriber's name (its function's name), for messages.
    pub subscriber: String,
    /// The queue it reads.
    pub queue: String,
    /// The kind it handles, `None` for every kind without a handler of its own.
    pub kind: Option<String>,
    /// The cap, if declared.
    pub max_attempts: Option<u32>,
    /// The dead letter, if declared.
    pub dead_letter: Option<String>,
    /// The name of the typed queue descriptor's backend, if the subscriber used one.
    pub backend: Option<&'static str>,
}

/// A problem a broker finds in a mount at startup: the service refuses to start and lists every
/// problem at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Which mount (or `*` for the broker itself).
    pub mount: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// A backend: where jobs are stored and how they move (claim, renew, settle, publish). See the
/// [module docs](self). It is also [`DeadLetters`], [`Locks`], [`Activity`] and [`Inspect`]:
/// the runtime needs every part.
pub trait Broker: DeadLetters + Locks + Activity + Records {
    /// What a delivery carries to be settled or renewed.
    type Receipt: Send + Sync + 'static;

    /// Checks, after connecting, that the broker can serve these mounts (a table has the columns
    /// a cap needs, a dead letter can be held, a typed queue belongs to this backend). Returns
    /// every problem.
    fn check(&self, mounts: &[MountInfo]) -> impl Future<Output = Vec<Problem>> + Send;

    /// Prepares a queue before its first claim (creates the consumer group, ...). Idempotent.
    fn prepare(&self, queue: &str) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// Claims up to `max` due jobs of `queue` in `order`, waiting up to `wait` for the first
    /// one. Each claimed job has its attempt counted in the same atomic step (so a crash after
    /// the claim spends it) and is leased for [`lease`](Broker::lease): a delivery not settled
    /// or renewed within the lease is claimable again. Jobs whose lease expired are claimed
    /// like due jobs.
    ///
    /// The runtime chooses `order` ([`FairTurn`]: every
    /// [`FAIR_CLAIM_EVERY`](crate::FAIR_CLAIM_EVERY)-th claim that takes jobs is in due order);
    /// a backend follows it and counts nothing itself. A backend without priorities takes due
    /// order either way.
    fn claim(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        order: ClaimOrder,
    ) -> impl Future<Output = Result<Claimed<Self::Receipt>, BrokerError>> + Send;

    /// Moves `item`, an [`Unreadable`] item a claim of `queue` returned, to the dead letter
    /// `target` in one atomic step, with its raw content kept as it was (fields, columns) and
    /// `item.error` as its error; fenced like [`settle`](Broker::settle). The runtime picks
    /// `target`: the first dead letter (by name) declared by a mount of `queue`, else
    /// [`default_dead_letter`](DeadLetters::default_dead_letter). The default refuses: a
    /// broker whose claims never return an unreadable item needs no other.
    fn dead_letter_unreadable(
        &self,
        queue: &str,
        item: &Unreadable<Self::Receipt>,
        target: &str,
    ) -> impl Future<Output = Result<Settled, BrokerError>> + Send {
        let _ = (item, target);
        let e = BrokerError::Backend(format!(
            "the {} backend returned an unreadable item of `{queue}` but cannot dead-letter one",
            self.backend()
        ));
        async { Err(e) }
    }

    /// Extends a held delivery's lease. `Ok(false)` when it was already lost. The runtime
    /// renews every delivery it holds every third of the lease, from its claim until it is
    /// settled (with [`renew_many`](Broker::renew_many), one call per queue): that is the
    /// worker's heartbeat, so a worker that dies gives its jobs back within a lease while a
    /// live one keeps its slow handlers' jobs. It also renews one delivery alone between the
    /// tries of a settlement that failed on the connection.
    fn renew(
        &self,
        queue: &str,
        receipt: &Self::Receipt,
    ) -> impl Future<Output = Result<bool, BrokerError>> + Send;

    /// Extends the leases of several held deliveries of `queue`: one answer per receipt, in
    /// order, each as [`renew`](Broker::renew) answers it. The runtime calls it once per queue
    /// every third of the lease with every delivery it holds there. The default sends every
    /// [`renew`](Broker::renew) at once and waits for all; a backend that can renew many in
    /// one round trip may do so.
    fn renew_many(
        &self,
        queue: &str,
        receipts: &[&Self::Receipt],
    ) -> impl Future<Output = Vec<Result<bool, BrokerError>>> + Send {
        futures_util::future::join_all(receipts.iter().map(|r| self.renew(queue, r)))
    }

    /// Settles a delivery in one atomic step: a crash before it leaves the delivery to be
    /// reclaimed after its lease; a crash after it cannot have half-done it (a retry is both
    /// re-queued and acknowledged, a dead letter both written and removed). A delivery whose
    /// lease was lost is fenced: [`Settled::LeaseLost`], nothing changed.
    fn settle(
        &self,
        queue: &str,
        delivery: &Delivery<Self::Receipt>,
        settlement: Settlement,
    ) -> impl Future<Output = Result<Settled, BrokerError>> + Send;

    /// Publishes jobs to `queue`, each due at its time (`None` for now), all or none. A job
    /// whose id is already in the queue (waiting, delayed or running), or earlier in the same
    /// batch, is not added twice.
    ///
    /// Returns one [`Published`] per job, in order: the job's id as stored (the id its
    /// handler, its dead letter and the CLI show; a table whose id the database generates and
    /// that has no headers column to keep the envelope's id stores the job under its new row
    /// id) and whether this call stored it. A job not stored is logged at info level.
    fn publish(
        &self,
        queue: &str,
        jobs: Vec<(Envelope, Option<DateTime<Utc>>)>,
    ) -> impl Future<Output = Result<Vec<Published>, BrokerError>> + Send;

    /// Publishes `job` to `queue` and takes `guard` for `ttl` (held by the job's id), in one
    /// atomic step, unless `guard` is held already: then nothing is stored and the result is
    /// [`Published::already_there`] with the id of the job holding the guard (the backends
    /// here; a guard written by an earlier version, which kept no holder, gives this job's
    /// id). The scheduler enqueues each tick this way (the guard
    /// names the schedule and the tick), so a worker dying at any point enqueues the tick
    /// either entirely or not at all, and a tick is never enqueued twice within `ttl`.
    ///
    /// The default takes the guard with [`try_lock`](Locks::try_lock) and then publishes:
    /// two steps, so a crash between them loses the tick. Every backend of this project
    /// overrides it with one atomic step; a broker of your own should too.
    fn publish_once(
        &self,
        queue: &str,
        job: (Envelope, Option<DateTime<Utc>>),
        guard: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Published, BrokerError>> + Send {
        async move {
            let id = job.0.id().clone();
            if !self.try_lock(guard, "publish_once", ttl).await? {
                return Ok(Published::already_there(id));
            }
            let mut out = self.publish(queue, vec![job]).await?;
            Ok(out.pop().unwrap_or(Published::already_there(id)))
        }
    }

    /// Makes `guard` of `queue` (taken by [`publish_once`](Broker::publish_once)) run out `ttl`
    /// from now, if the job `job_id` still holds it. The runtime calls it when a unique job
    /// ([`Job::unique`](crate::Job::unique)) is settled (acknowledged, dropped or
    /// dead-lettered): its window starts then. `Ok(false)` when the guard was not this job's
    /// (or gone). The default does nothing, so the guard lasts the time it was taken for.
    fn finish_guard(
        &self,
        queue: &str,
        guard: &str,
        job_id: &JobId,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, BrokerError>> + Send {
        let _ = (queue, guard, job_id, ttl);
        async { Ok(false) }
    }

    /// Which of `ids` (jobs of `queue` this worker runs) were cancelled while running
    /// ([`DeadLetters::cancel`]). The runtime asks every third of the lease while a queue has
    /// jobs running: one call per queue, not per job. The default: none.
    fn cancelled(
        &self,
        queue: &str,
        ids: &[JobId],
    ) -> impl Future<Output = Result<Vec<JobId>, BrokerError>> + Send {
        let _ = (queue, ids);
        async { Ok(Vec::new()) }
    }

    /// The poison count: the runtime dead-letters, without running it, a delivery that
    /// reports ([`Delivery::delivered`]) more deliveries than this since its job was last
    /// settled (its workers died running it each time). The default is
    /// [`DEFAULT_POISON_COUNT`] (3); a broker may let
    /// its user set another. Only the number lives here: the decision is the runtime's.
    fn poison_count(&self) -> u32 {
        DEFAULT_POISON_COUNT
    }

    /// How long a claim holds a job; the runtime renews a held delivery every third of it. The
    /// backends here default to [`DEFAULT_LEASE`]. A service refuses to start with a lease
    /// below [`MIN_LEASE`] or above [`MAX_LEASE`].
    fn lease(&self) -> Duration;

    /// What is wrong with `queue` as a queue or dead letter name on this backend, with the
    /// fix; `None` for a name it takes. The service refuses to start with a mount on such a
    /// queue, and [`Publish`] refuses to publish to one ([`BrokerError::Invalid`]). The
    /// default refuses what no backend takes ([`queue_name_problem`]).
    fn queue_name_problem(&self, queue: &str) -> Option<String> {
        queue_name_problem(queue)
    }

    /// Why a job of a [flow](crate::flow) cannot be published to `queue` here, naming the fix;
    /// `None` (the default) when it can. A flow's job must carry its flow's header, and a job
    /// published twice under one id must be stored once while it is in its queue (two processes
    /// may publish a child at once).
    fn flow_problem(&self, queue: &str) -> Option<String> {
        let _ = queue;
        None
    }

    /// The backend's clock now (Redis `TIME`, Postgres `now()`), or `None` for a backend that
    /// keeps no clock of its own. The runtime measures the broker's [`clock`](Broker::clock)
    /// against it at start and every [`SYNC_EVERY`](crate::clock::SYNC_EVERY), so that due
    /// times, leases and ticks follow the backend's clock, not this machine's.
    fn server_time(
        &self,
    ) -> impl Future<Output = Result<Option<DateTime<Utc>>, BrokerError>> + Send {
        async { Ok(None) }
    }

    /// The broker's clock: due times, leases and the scheduler read it. A broker keeps one
    /// clock and returns clones of it (clones share the offset the runtime measures).
    fn clock(&self) -> Clock {
        Clock::system()
    }

    /// Runs the broker on `clock` instead of its own (the test harness's paused clock).
    /// Returns `false` when the backend cannot (servers keep their own time).
    fn use_clock(&self, clock: &Clock) -> bool {
        let _ = clock;
        false
    }
}
