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

use crate::activity::{DelayedJob, MinuteCounts, QueueCounts, WorkerReport};
pub use crate::claim_order::{ClaimOrder, FairTurn};
use crate::clock::Clock;
use crate::envelope::{Envelope, JobId};
use crate::outcome::Failure;

/// The highest attempt number any backend counts to. The counter saturates here on every
/// backend, so it fits the smallest attempt column the SQL derive accepts (`SMALLINT`, `i16`) and
/// can never overflow a column or stop a claim; a cap (`max_attempts`) above it could never be
/// reached and is refused at startup.
pub const MAX_ATTEMPT: u32 = 32_767;

/// The lease of the backends here unless configured: a claimed job not renewed within it is
/// claimable again. The runtime renews what it holds every third of it (1 s), so a worker
/// killed with jobs in hand gives them back within about 3 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(3);

/// The poison count of the backends here unless configured ([`Broker::poison_count`]): a job
/// delivered more than 3 times without being settled is dead-lettered without running again.
pub const DEFAULT_POISON_COUNT: u32 = 3;

/// The shortest lease a service starts with: 100 ms. A shorter one (zero) would have a job
/// claimed again while its handler runs, and run twice.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// The longest lease a service starts with: one day. The runtime renews a lease every third of
/// it, so a long handler needs no long lease; a longer one would keep the jobs of a worker that
/// died from running again for that long.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest queue (or dead letter) name, in bytes: 200.
pub const MAX_QUEUE_NAME_LEN: usize = 200;

/// What is wrong with `queue` as a queue or dead letter name on any backend, with the fix: an
/// empty name, a NUL, or a name longer than [`MAX_QUEUE_NAME_LEN`] bytes.
/// [`Broker::queue_name_problem`] adds what a backend refuses besides.
pub fn queue_name_problem(queue: &str) -> Option<String> {
    if queue.is_empty() {
        Some("the queue name is empty: name the queue, such as `emails`".to_owned())
    } else if queue.contains('\0') {
        Some(format!(
            "the queue name {queue:?} holds a NUL character, which backends cannot store: remove it"
        ))
    } else if queue.len() > MAX_QUEUE_NAME_LEN {
        Some(format!(
            "the queue name `{}…` is {} bytes long, more than the {MAX_QUEUE_NAME_LEN} a queue name may have (stagedoor_jobs::broker::MAX_QUEUE_NAME_LEN): shorten it",
            queue.chars().take(40).collect::<String>(),
            queue.len()
        ))
    } else {
        None
    }
}

/// An error of a broker: the server could not be reached, a statement failed, a stored entry
/// is malformed.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The server is unreachable or the connection broke; the runtime retries with backoff.
    #[error("connection: {0}")]
    Connection(String),
    /// The broker was used before [`Inspect::connect`].
    #[error("the broker is not connected: the service connects it at start")]
    NotConnected,
    /// The queue (or dead letter) is not known to this broker.
    #[error("unknown queue `{0}`")]
    UnknownQueue(String),
    /// A stored entry could not be read.
    #[error("malformed entry {id}: {reason}")]
    Malformed {
        /// The entry's id in the backend.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server refused to store more (Redis at `maxmemory` with `noeviction`). Reading,
    /// acknowledging and deleting keep working, so a draining worker frees memory; publishing
    /// waits for room. The message names the limit and the fix.
    #[error("the server is full: {0}")]
    Full(String),
    /// Anything else the backend reported.
    #[error("{0}")]
    Backend(String),
    /// The call was refused before it reached the backend: a value it cannot take (an empty
    /// queue name). The message names the value and the fix.
    #[error("refused: {0}")]
    Invalid(String),
}

impl BrokerError {
    /// Whether the error is about reaching or using the server (a broken or refused
    /// connection, a server restarting or full), so that the same call can succeed later
    /// unchanged; not about the call itself (an unknown queue, a malformed entry, a statement
    /// the database refuses).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Connection(_) | Self::Full(_))
    }
}

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

/// What publishing one job did: the id it is stored under, and whether this publish stored it.
///
/// One id per job everywhere: [`id`](Published::id) is the id the job's handler sees
/// (`Ctx<keys::JobId>`), its dead letter keeps ([`DeadLetter::envelope`]) and the CLI shows.
/// It is the id the job was published with, except on a SQL table whose id the database
/// generates and that has no headers column: there the job is known by its new row id.
///
/// A job whose id was already in its queue (waiting, delayed, running, or earlier in the same
/// batch) is not stored again: [`is_stored`](Published::is_stored) is `false`, and the job
/// already there is the one that runs.
///
/// ```
/// # async fn f(broker: impl stagedoor_jobs::Broker) -> Result<(), Box<dyn std::error::Error>> {
/// use stagedoor_jobs::{Job, JobId, Publish};
/// let id = JobId::from_string("invoice-42");
/// let first = broker.publish_job(Job::new("billing", &42)?.id(id.clone())).await?;
/// let again = broker.publish_job(Job::new("billing", &42)?.id(id.clone())).await?;
/// assert!(first.is_stored());
/// assert!(!again.is_stored(), "invoice-42 was already waiting: nothing added");
/// assert_eq!(again.id(), &id);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    id: JobId,
    stored: bool,
}

impl Published {
    /// A report: the job is known as `id`; `stored` is whether this publish added it.
    pub fn new(id: JobId, stored: bool) -> Self {
        Self { id, stored }
    }

    /// A job this publish stored under `id`.
    pub fn stored(id: JobId) -> Self {
        Self::new(id, true)
    }

    /// A job whose id `id` was already in the queue: nothing was added.
    pub fn already_there(id: JobId) -> Self {
        Self::new(id, false)
    }

    /// The job's id as stored: what its handler, its dead letter and the CLI show.
    pub fn id(&self) -> &JobId {
        &self.id
    }

    /// The job's id, by value.
    pub fn into_id(self) -> JobId {
        self.id
    }

    /// `true` when this publish stored the job; `false` when a job with this id was already
    /// in the queue (or earlier in the same batch) and nothing was added.
    pub fn is_stored(&self) -> bool {
        self.stored
    }
}

/// Logs a job a publish did not store because its id was already in the queue (info level:
/// a duplicate publish is worth seeing, not an error).
pub fn log_not_stored(queue: &str, id: &JobId) {
    tracing::info!(queue, job_id = %id, "a job with this id is already in the queue: not added twice");
}

/// A dead letter: the job as it was, plus why and when it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The dead letter's own id in the backend (a stream entry id, a row id).
    pub id: String,
    /// The job as it was when it failed (attempt = attempts spent).
    pub envelope: Envelope,
    /// The queue it failed on, where a replay sends it.
    pub origin: String,
    /// The last error.
    pub error: String,
    /// The last traceback.
    pub traceback: String,
    /// Attempts spent.
    pub attempts: u32,
    /// When it was dead-lettered.
    pub failed_at: DateTime<Utc>,
}

/// Which dead letters a list, replay or purge takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeadSelector {
    /// One, by its dead-letter id (or job id).
    Id(String),
    /// Every dead letter of a kind.
    Kind(String),
    /// Every dead letter.
    All,
}

impl DeadSelector {
    /// Whether `d` is selected.
    pub fn matches(&self, d: &DeadLetter) -> bool {
        match self {
            DeadSelector::Id(id) => d.id == *id || d.envelope.id().as_str() == id,
            DeadSelector::Kind(k) => d.envelope.kind() == k,
            DeadSelector::All => true,
        }
    }
}

/// What a replay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Moved back to their queue with attempts reset.
    pub replayed: u64,
    /// Selected but left where they were (already replayed by someone else).
    pub skipped: u64,
    /// Selected but could not be moved (the error is logged).
    pub failed: u64,
}

/// What a queue holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Due and waiting to be claimed.
    pub ready: u64,
    /// Claimed and not yet settled.
    pub pending: u64,
    /// Waiting for a time in the future (delayed jobs and delayed retries).
    pub delayed: u64,
    /// How long the oldest due job has waited.
    pub oldest: Option<Duration>,
}

/// What an operator's tool or a dashboard reads of a backend: its queues and what they hold.
/// The contract is split by concern: [`Inspect`] (this), [`DeadLetters`], [`Locks`] (the
/// scheduler's) and [`Broker`] (moving jobs, which needs all of them). The command-line tool
/// asks only for `Inspect + DeadLetters`; the runtime for a whole [`Broker`].
///
/// A value is cheap to clone (it holds its connection behind an `Arc`) and does no I/O until
/// [`connect`](Inspect::connect).
pub trait Inspect: Clone + Send + Sync + 'static {
    /// The backend's name, as typed queue descriptors name it ("memory", "redis", "sqlx").
    fn backend(&self) -> &'static str;

    /// Connects (builds a pool, opens a connection), when the service starts. Errors name the
    /// URL's problem and the fix. Called once; idempotent.
    fn connect(&self) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// What `queue` holds now.
    fn stats(&self, queue: &str) -> impl Future<Output = Result<QueueStats, BrokerError>> + Send;

    /// The names of the queues (and dead letters) the backend holds now, sorted: what an
    /// operator's `queues` lists.
    fn queues(&self) -> impl Future<Output = Result<Vec<String>, BrokerError>> + Send;

    /// When the next delayed job of `queue` is due, if the broker can tell cheaply (the harness
    /// uses it to step its clock through chains of delayed retries).
    fn next_due(&self, queue: &str) -> impl Future<Output = Option<DateTime<Utc>>> + Send {
        let _ = queue;
        async { None }
    }
}

/// The dead letters of a backend: listing, replaying and purging them, each replay one atomic
/// step per letter (an interrupted replay loses and duplicates nothing).
pub trait DeadLetters: Inspect {
    /// The dead letters in `dead` that `selector` takes, newest first, at most `limit`.
    fn dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, BrokerError>> + Send;

    /// Moves the selected dead letters back to the queue each failed on, attempts reset, each in
    /// one atomic step (an interrupted replay loses and duplicates nothing).
    fn replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> impl Future<Output = Result<ReplayReport, BrokerError>> + Send;

    /// Deletes the selected dead letters; returns how many.
    fn purge(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> impl Future<Output = Result<u64, BrokerError>> + Send;

    /// Refuses `name` unless it is a dead letter that [`replay`](DeadLetters::replay) and
    /// [`purge`](DeadLetters::purge) may act on ([`BrokerError::Invalid`], saying what a dead
    /// letter is here): both call it first, and a tool (a dashboard) asks it before it shows a
    /// confirmation. The backends apply [`ensure_dead_letter`]; the default accepts every
    /// name, which a backend of a user's own should override.
    fn check_dead_letter(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send {
        let _ = name;
        async { Ok(()) }
    }

    /// The oldest dead letter of `dead` (the one that made it non-empty), if any: what the
    /// monitor names a dead-letter incident by. A backend reads one entry; the default lists
    /// every dead letter and keeps the last, which a backend of a user's own should override.
    fn oldest_dead_letter(
        &self,
        dead: &str,
    ) -> impl Future<Output = Result<Option<DeadLetter>, BrokerError>> + Send {
        async move {
            Ok(self
                .dead_letters(dead, &DeadSelector::All, usize::MAX)
                .await?
                .pop())
        }
    }

    /// How many dead letters `dead` holds.
    fn dead_len(&self, dead: &str) -> impl Future<Output = Result<u64, BrokerError>> + Send;

    /// Cancels job `id` of `queue`: a waiting or delayed job is removed (it will not run); a
    /// running one is marked, so that its handler's [`Cancellation`](crate::Cancellation)
    /// fires (the runtime asks [`Broker::cancelled`] every third of the lease) and it is
    /// dropped when its handler returns, recorded as cancelled. The default cannot cancel and
    /// says so.
    fn cancel(
        &self,
        queue: &str,
        id: &JobId,
    ) -> impl Future<Output = Result<Cancelled, BrokerError>> + Send {
        let _ = (queue, id);
        async {
            Err(BrokerError::Backend(format!(
                "the {} broker cannot cancel jobs: implement `DeadLetters::cancel` and `Broker::cancelled`",
                self.backend()
            )))
        }
    }

    /// The dead letter a failure goes to when the mount declares none (a job of a kind nobody
    /// handles, a payload that cannot be parsed): `<stream>:dead`, `<group>.dead`.
    fn default_dead_letter(&self, queue: &str) -> String;
}

/// Whether `name` is named as a dead letter by `suffix` (`emails.dead` by `.dead`): it ends
/// with the suffix, after a queue's name. The rule [`ensure_dead_letter`] applies first.
pub fn named_dead_letter(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() && name.ends_with(suffix)
}

/// Refuses an operator's replay or purge of `name` unless it is a dead letter, so that no
/// tool (a dashboard trusting its URL, a script with a typo) moves or deletes the jobs of a
/// live queue. A dead letter is named as the backend names them (`suffix`: `.dead` for
/// `emails.dead`, `:dead` on Redis, `_dead` for a dead-letter table), or declared by a mount:
/// of this process (`declared`, what [`Broker::check`] was told) or of a live worker, as its
/// report says ([`WorkerQueue::dead_letters`](crate::activity::WorkerQueue::dead_letters)).
/// The error says what is a dead letter here.
pub async fn ensure_dead_letter<B: Activity>(
    b: &B,
    name: &str,
    suffix: &str,
    declared: &[String],
) -> Result<(), BrokerError> {
    if named_dead_letter(name, suffix) || declared.iter().any(|d| d == name) {
        return Ok(());
    }
    let mut known: Vec<String> = declared.to_vec();
    for w in b.workers().await? {
        for q in w.queues {
            for d in q.dead_letters {
                if d == name {
                    return Ok(());
                }
                if !known.contains(&d) {
                    known.push(d);
                }
            }
        }
    }
    known.sort();
    let declared = if known.is_empty() {
        String::new()
    } else {
        let shown: Vec<String> = known.iter().take(10).map(|d| format!("`{d}`")).collect();
        format!(" ({} here)", shown.join(", "))
    };
    Err(BrokerError::Invalid(format!(
        "`{name}` is not a dead letter, so nothing was replayed or purged: a dead letter is named `<queue>{suffix}` (the one of queue `{name}` is `{name}{suffix}`) or declared by a mount's `.dead_letter(..)`{declared}"
    )))
}

/// The scheduler's bookkeeping: locks with an owner and a time to live, and each schedule's
/// last tick (the memory of the scheduler across restarts of every worker).
pub trait Locks: Inspect {
    /// Takes the lock `key` for `ttl` if nobody holds it, recording `token` as the owner
    /// (scheduler ticks). `Ok(true)` when taken.
    fn try_lock(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, BrokerError>> + Send;

    /// Releases the lock `key` if `token` still owns it; another owner's lock is left alone.
    fn unlock(
        &self,
        key: &str,
        token: &str,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// The latest tick of `schedule` recorded by [`mark_tick`](Locks::mark_tick): the
    /// scheduler's memory across restarts of every worker (missed ticks are counted from it).
    fn last_tick(
        &self,
        schedule: &str,
    ) -> impl Future<Output = Result<Option<DateTime<Utc>>, BrokerError>> + Send;

    /// Records that `schedule`'s tick `tick` was enqueued; the record only moves forward.
    fn mark_tick(
        &self,
        schedule: &str,
        tick: DateTime<Utc>,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// Takes permits of the pool `key`, which holds at most `limit` at once across every
    /// process: as many of `tokens` as are free (in order), each held for `ttl` (by the
    /// backend's clock, as leases are) unless renewed or released. One atomic step: two
    /// callers together never hold more than `limit`. The global limits of a queue are pools
    /// (`.global_concurrency(n)`: a permit per running job, renewed with its lease and released
    /// at its settlement; `.rate_limit(r, per)`: a permit per started job, held `per` and never
    /// released, so no window of `per` sees more than `r` starts).
    ///
    /// `tokens` may be empty: the startup check calls it so to learn that the backend keeps
    /// permits. The default keeps none and fails, naming the fix.
    fn take_permits(
        &self,
        key: &str,
        limit: u32,
        tokens: &[String],
        ttl: Duration,
    ) -> impl Future<Output = Result<Permits, BrokerError>> + Send {
        let _ = (key, limit, tokens, ttl);
        async { Err(no_permits(self.backend())) }
    }

    /// Extends the permits `tokens` of pool `key` to `ttl` from now. Returns how many were still
    /// held (one that ran out is not taken again).
    fn renew_permits(
        &self,
        key: &str,
        tokens: &[String],
        ttl: Duration,
    ) -> impl Future<Output = Result<usize, BrokerError>> + Send {
        let _ = (key, tokens, ttl);
        async { Err(no_permits(self.backend())) }
    }

    /// Gives back the permits `tokens` of pool `key` (those held; others are ignored).
    fn release_permits(
        &self,
        key: &str,
        tokens: &[String],
    ) -> impl Future<Output = Result<(), BrokerError>> + Send {
        let _ = (key, tokens);
        async { Err(no_permits(self.backend())) }
    }
}

/// How long a backend keeps the mark of a running job's cancellation, for a broker of lease
/// `lease`: ten leases, at least a minute. Its worker looks every third of its lease, so this
/// is many looks; a job republished under the same id within it is cancelled too.
pub fn cancel_mark_ttl(lease: Duration) -> Duration {
    lease.saturating_mul(10).max(Duration::from_secs(60))
}

/// What [`DeadLetters::cancel`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// The job was waiting or delayed: it is removed and will not run.
    Removed,
    /// The job is running (claimed by a worker): its handler's cancellation fires, and the job
    /// is dropped when the handler returns.
    Running,
    /// No job of this id is in the queue (it finished, or never was).
    NotFound,
}

/// What [`Locks::take_permits`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Permits {
    /// How many permits were taken: the first `taken` of the tokens offered.
    pub taken: usize,
    /// When the pool was full: how long until its first permit runs out, if the backend knows
    /// (a hint for how long to wait; a released permit frees a place sooner).
    pub next_free: Option<Duration>,
}

fn no_permits(backend: &str) -> BrokerError {
    BrokerError::Backend(format!(
        "the {backend} broker keeps no permits, so it cannot enforce global limits: implement `Locks::take_permits`, `renew_permits` and `release_permits`, or remove `global_concurrency`/`rate_limit` from the mounts"
    ))
}

/// What services report through a backend and what a dashboard reads back: live workers,
/// per-minute counts, delayed jobs. Every backend implements it; the runtime reports through it
/// every [`REPORT_EVERY`](crate::activity::REPORT_EVERY).
pub trait Activity: Inspect {
    /// Records `worker` (replacing its previous report; gone after `ttl` without another) and
    /// adds `counts` to each queue's per-minute counts (kept [`COUNTS_KEPT`](crate::activity::COUNTS_KEPT)). One call per
    /// report; after a failed call the runtime logs it and sends the same counts again with
    /// the next report.
    fn report(
        &self,
        worker: &WorkerReport,
        counts: &[QueueCounts],
        ttl: Duration,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// The workers whose last report has not expired, by id.
    fn workers(&self) -> impl Future<Output = Result<Vec<WorkerReport>, BrokerError>> + Send;

    /// The per-minute counts of `queue` from the minute holding `since` on, oldest first;
    /// minutes with nothing counted are left out.
    fn throughput(
        &self,
        queue: &str,
        since: DateTime<Utc>,
    ) -> impl Future<Output = Result<Vec<MinuteCounts>, BrokerError>> + Send;

    /// The delayed jobs of `queue` (due later than now), soonest first, at most `limit`.
    fn delayed(
        &self,
        queue: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DelayedJob>, BrokerError>> + Send;
}

/// A backend: where jobs are stored and how they move (claim, renew, settle, publish). See the
/// [module docs](self). It is also [`DeadLetters`], [`Locks`], [`Activity`] and [`Inspect`]:
/// the runtime needs every part.
pub trait Broker: DeadLetters + Locks + Activity {
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
    /// settled: that is the worker's heartbeat, so a worker that dies gives its jobs back
    /// within a lease while a live one keeps its slow handlers' jobs.
    fn renew(
        &self,
        queue: &str,
        receipt: &Self::Receipt,
    ) -> impl Future<Output = Result<bool, BrokerError>> + Send;

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

/// Frees the unique key ([`Job::unique`](crate::Job::unique)) of job `id` of `queue`, whose
/// headers are `headers`, if the job holds it: a backend's [`DeadLetters::cancel`] calls it
/// for a job it removed before it ran, so that the key takes a new job at once. Nothing for a
/// job that is not unique.
pub async fn release_unique<B: Broker>(
    broker: &B,
    queue: &str,
    headers: &crate::Headers,
    id: &JobId,
) -> Result<(), BrokerError> {
    if let Some((key, _)) = crate::envelope::unique_of(headers) {
        let guard = crate::envelope::unique_guard(queue, key);
        broker
            .finish_guard(queue, &guard, id, Duration::ZERO)
            .await?;
    }
    Ok(())
}

/// The guard a unique job ([`Job::unique`](crate::Job::unique)) takes with it when published
/// on `queue` at `now` (due at `at`), and how long it holds it before the job settles: what
/// [`Publish::publish_job`] passes to [`Broker::publish_once`], and what a backend's own
/// publish path (a job in the caller's transaction) takes the same way. `None` for a job that
/// is not unique.
pub fn unique_guard_of(
    queue: &str,
    envelope: &Envelope,
    at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<(String, Duration)> {
    let (key, window) = crate::envelope::unique_of(envelope.headers())?;
    let guard = crate::envelope::unique_guard(queue, key);
    let delay = at.and_then(|a| (a - now).to_std().ok()).unwrap_or_default();
    Some((
        guard,
        window
            .saturating_add(crate::envelope::UNIQUE_PENDING_MAX)
            .saturating_add(delay),
    ))
}

/// `url` with every password masked, for messages and logs: the user-info's
/// (`postgres://app:***@db/app`, `redis://***@h/` for a Redis token alone) and the value of
/// each query parameter that carries a secret (`?password=***`, `sslpassword`, any case or
/// position, its name percent-encoded or not: every name holding `pass`, `pwd`, `secret` or
/// `token`); several URLs separated by commas each masked.
pub fn mask_url(url: &str) -> String {
    // A comma starts another URL only where a scheme follows it: a comma inside a password or
    // a parameter's value stays in its URL (and is masked with it).
    let mut out = String::with_capacity(url.len());
    let mut start = 0;
    for (i, _) in url.match_indices(',') {
        if i < start || !starts_with_scheme(url[i + 1..].trim_start()) {
            continue;
        }
        out.push_str(&mask_one(&url[start..i]));
        out.push(',');
        start = i + 1;
    }
    out.push_str(&mask_one(&url[start..]));
    out
}

/// Whether `s` begins with `scheme://`.
fn starts_with_scheme(s: &str) -> bool {
    let Some(end) = s.find("://") else {
        return false;
    };
    let scheme = &s[..end];
    scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'))
}

/// One URL masked (see [`mask_url`]).
fn mask_one(u: &str) -> String {
    let mut out = String::with_capacity(u.len());
    let mut rest = u;
    if let Some(s) = u.find("://") {
        let after = &u[s + 3..];
        // The user-info ends at the last `@` before the query; with none there, at the last
        // `@` at all (a password holding `?`): masking too much never shows a secret.
        let query = after.find(['?', '#']).unwrap_or(after.len());
        let at = after[..query].rfind('@').or_else(|| after.rfind('@'));
        out.push_str(&u[..s + 3]);
        rest = after;
        if let Some(at) = at {
            let creds = &after[..at];
            match creds.find(':') {
                Some(c) => {
                    out.push_str(&creds[..c]);
                    out.push_str(":***");
                }
                None if u.starts_with("redis") || u.starts_with("unix") => out.push_str("***"),
                None => out.push_str(creds),
            }
            rest = &after[at..];
        }
    }
    // Every `name=value` after a `?`, `&` or `;`: a secret's value masked.
    let Some(q) = rest.find('?') else {
        out.push_str(rest);
        return out;
    };
    out.push_str(&rest[..=q]);
    let (query, fragment) = match rest[q + 1..].find('#') {
        Some(f) => rest[q + 1..].split_at(f),
        None => (&rest[q + 1..], ""),
    };
    let mut params = query;
    loop {
        let end = params.find(['&', ';']).unwrap_or(params.len());
        let param = &params[..end];
        match param.split_once('=') {
            Some((name, _)) if is_secret_name(name) => {
                out.push_str(name);
                out.push_str("=***");
            }
            _ => out.push_str(param),
        }
        if end == params.len() {
            break;
        }
        out.push_str(&params[end..=end]); // the separator
        params = &params[end + 1..];
    }
    out.push_str(fragment);
    out
}

/// Whether a query parameter's name (percent-decoded, in any case) names a secret.
fn is_secret_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                decoded.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                decoded.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    let name = String::from_utf8_lossy(&decoded).to_ascii_lowercase();
    ["pass", "pwd", "secret", "token"]
        .iter()
        .any(|s| name.contains(s))
}

pub use crate::clock::{chrono_duration, later};

/// A derived job id for a schedule tick, so a duplicate enqueue of the tick is recognised.
pub fn tick_job_id(schedule: &str, tick: DateTime<Utc>) -> JobId {
    JobId::from_string(format!("{schedule}@{}", tick.timestamp()))
}

/// Jobs of one queue for [`Broker::publish`]: each envelope with its due time.
type Batch = Vec<(Envelope, Option<DateTime<Utc>>)>;

/// Publishing straight through a broker, for producers that run no service: connect it
/// ([`Inspect::connect`]), then publish [`Job`](crate::Job)s one at a time or in batches.
///
/// ```no_run
/// use stagedoor_jobs::broker::{Inspect, Publish};
/// use stagedoor_jobs::Job;
///
/// async fn enqueue(broker: &impl Publish) -> Result<(), Box<dyn std::error::Error>> {
///     broker.connect().await?;
///     let jobs = (0..1000).map(|n| Job::new("emails", &n)).collect::<Result<Vec<_>, _>>()?;
///     let published = broker.publish_jobs(jobs).await?; // one round trip per queue
///     assert!(published.iter().all(|p| p.is_stored()));
///     Ok(())
/// }
/// ```
pub trait Publish: Broker {
    /// Publishes one job now, at its time or after its delay; returns its id as stored and
    /// whether it was stored (see [`Published`]). A queue name the backend cannot take
    /// ([`Broker::queue_name_problem`]) is refused with [`BrokerError::Invalid`].
    fn publish_job(
        &self,
        job: crate::Job,
    ) -> impl Future<Output = Result<Published, BrokerError>> + Send {
        async move {
            if let Some(p) = self
                .queue_name_problem(job.queue())
                .or_else(|| job.problem())
            {
                return Err(BrokerError::Invalid(p));
            }
            let now = self.clock().now();
            let (queue, envelope, at) = job.into_parts(now);
            if let Some((guard, ttl)) = unique_guard_of(&queue, &envelope, at, now) {
                return self.publish_once(&queue, (envelope, at), &guard, ttl).await;
            }
            let id = envelope.id().clone();
            let mut out = self.publish(&queue, vec![(envelope, at)]).await?;
            match out.pop() {
                Some(p) if out.is_empty() => Ok(p),
                _ => Err(BrokerError::Backend(format!(
                    "the {} broker reported {} results for one published job `{id}`: expected one",
                    self.backend(),
                    out.len() + 1
                ))),
            }
        }
    }

    /// Publishes jobs in one [`publish`](Broker::publish) call per queue (the jobs of a queue
    /// land all or none); returns one [`Published`] per job, in order: its id as stored and
    /// whether it was stored (a job whose id was already in the queue, or earlier in the
    /// batch, is not). Jobs of several queues are grouped by queue, in order of first
    /// appearance. Unique jobs ([`Job::unique`](crate::Job::unique)) are published one at a
    /// time after the batches, each with its key in one step (not all or none with the rest).
    /// A queue name the backend cannot take ([`Broker::queue_name_problem`]) refuses the whole
    /// call with [`BrokerError::Invalid`], before anything is stored.
    fn publish_jobs<I>(
        &self,
        jobs: I,
    ) -> impl Future<Output = Result<Vec<Published>, BrokerError>> + Send
    where
        I: IntoIterator<Item = crate::Job>,
    {
        let now = self.clock().now();
        let jobs: Vec<crate::Job> = jobs.into_iter().collect();
        // A queue name the backend cannot take refuses the whole call, before anything is
        // stored.
        let refused = jobs
            .iter()
            .find_map(|j| self.queue_name_problem(j.queue()).or_else(|| j.problem()));
        // For each job: its queue's batch and its place in that batch.
        let mut places = Vec::new();
        let mut by_queue: Vec<(String, Batch)> = Vec::new();
        let mut unique: Vec<crate::Job> = Vec::new();
        for job in jobs {
            if job.is_unique() {
                places.push((usize::MAX, unique.len()));
                unique.push(job);
                continue;
            }
            let (queue, envelope, at) = job.into_parts(now);
            let b = match by_queue.iter().position(|(q, _)| *q == queue) {
                Some(b) => b,
                None => {
                    by_queue.push((queue, Vec::new()));
                    by_queue.len() - 1
                }
            };
            places.push((b, by_queue[b].1.len()));
            by_queue[b].1.push((envelope, at));
        }
        async move {
            if let Some(p) = refused {
                return Err(BrokerError::Invalid(p));
            }
            let mut reports = Vec::with_capacity(by_queue.len());
            for (queue, batch) in by_queue {
                let n = batch.len();
                let got = self.publish(&queue, batch).await?;
                if got.len() != n {
                    return Err(BrokerError::Backend(format!(
                        "the {} broker reported {} results for {n} jobs published to `{queue}`",
                        self.backend(),
                        got.len()
                    )));
                }
                reports.push(got.into_iter().map(Some).collect::<Vec<_>>());
            }
            let mut uniques = Vec::with_capacity(unique.len());
            for job in unique {
                uniques.push(Some(self.publish_job(job).await?));
            }
            places
                .into_iter()
                .map(|(b, i)| {
                    let slot = if b == usize::MAX {
                        &mut uniques[i]
                    } else {
                        &mut reports[b][i]
                    };
                    slot.take().ok_or_else(|| {
                        BrokerError::Backend("a published job was reported twice".to_owned())
                    })
                })
                .collect()
        }
    }
}

impl<B: Broker> Publish for B {}

#[cfg(test)]
mod tests {
    use super::mask_url;

    #[test]
    fn masks_passwords() {
        assert_eq!(
            mask_url("postgres://app:s3cret@db/app"),
            "postgres://app:***@db/app"
        );
        assert_eq!(mask_url("redis://:pw@h:6379/"), "redis://:***@h:6379/");
        assert_eq!(mask_url("redis://tok@h:6379/"), "redis://***@h:6379/");
        assert_eq!(mask_url("sqlite://mail.db"), "sqlite://mail.db");
        assert_eq!(
            mask_url("redis://:a@h:1/,redis://:b@h:2/"),
            "redis://:***@h:1/,redis://:***@h:2/"
        );
    }

    /// Every password a URL can carry is masked, wherever it sits; the rest is kept.
    #[test]
    fn masks_every_password() {
        let cases = [
            (
                "postgres://u@host/db?password=secret",
                "postgres://u@host/db?password=***",
            ),
            (
                "postgres://u@host/db?sslmode=require&PASSWORD=secret&x=1",
                "postgres://u@host/db?sslmode=require&PASSWORD=***&x=1",
            ),
            (
                "postgres://u@host/db?Password=secret#frag",
                "postgres://u@host/db?Password=***#frag",
            ),
            (
                "postgres://u@host/db?sslpassword=secret&password=secret",
                "postgres://u@host/db?sslpassword=***&password=***",
            ),
            (
                "postgres://u@host/db?%70assword=secret",
                "postgres://u@host/db?%70assword=***",
            ),
            (
                "postgres://u@host/db?PASS%57ORD=secret;a=b",
                "postgres://u@host/db?PASS%57ORD=***;a=b",
            ),
            (
                "postgres://u:secret@host/db?password=secret",
                "postgres://u:***@host/db?password=***",
            ),
            (
                "postgres://u:se@cret@host/db?application_name=me",
                "postgres://u:***@host/db?application_name=me",
            ),
            ("postgres://u:se?cret@host/db", "postgres://u:***@host/db"),
            (
                "postgres://u@host/db?password=se,cret",
                "postgres://u@host/db?password=***",
            ),
            (
                "redis://:a,b@h:1/,redis://h:2/?password=secret",
                "redis://:***@h:1/,redis://h:2/?password=***",
            ),
            ("sqlite://mail.db?mode=rwc", "sqlite://mail.db?mode=rwc"),
        ];
        for (url, masked) in cases {
            let got = mask_url(url);
            assert_eq!(got, masked, "{url}");
            assert!(
                !got.contains("secret") && !got.contains("cret"),
                "{url}: {got}"
            );
        }
    }
}
