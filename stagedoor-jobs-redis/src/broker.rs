//! `RedisBroker`: the [`Broker`] on Redis Streams: the struct and its state, the builder
//! methods, the small helpers every file shares, and the trait impls (`Inspect`,
//! `DeadLetters`, `Activity`, `Records`, `Locks`, `Broker`), whose methods each call the
//! inherent method of the same name (inherent methods come first in Rust's method lookup) in
//! the file of its concern:
//!
//! | file | what |
//! |---|---|
//! | `broker/urls.rs` | making a broker from a server's or a Cluster's URLs |
//! | `broker/key_cache.rs` | the cache of the queues' keys |
//! | `broker/levels.rs` | which priority levels of a queue have a stream |
//! | `broker/housekeeping.rs` | a queue's housekeeping state (reclaims, the delayed mover, levels) |
//! | `broker/settle_req.rs` | the requests the settle batcher is sent |
//! | `startup.rs` | connect, check, prepare |
//! | `claim.rs` | claim, reclaim, deliveries (and the entries that cannot run), the delayed mover |
//! | `settle.rs` | settle, the acknowledgement batcher, renew |
//! | `publish.rs` | publish, publish_once |
//! | `dead.rs` | dead-lettering, dead letters, replay, purge |
//! | `cancel.rs` | cancel, cancelled |
//! | `schedule.rs` | the scheduler's locks and ticks |
//! | `permits.rs` | the permit pools of the global limits |
//! | `records.rs` | records: values by key with a version and a ttl |
//! | `activity.rs` | workers' reports, per-minute counts, delayed jobs |
//! | `stats.rs` | stats, queues, dead_len, next_due, server_time |
//! | `errors.rs` | how the server's errors are read |
//! | `scripts.rs` | the Lua scripts |

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use stagedoor_jobs::activity::{DelayedJob, MinuteCounts, QueueCounts, WorkerReport};
use stagedoor_jobs::broker::{
    Broker, BrokerError, ClaimOrder, Claimed, DEFAULT_LEASE, DEFAULT_POISON_COUNT, DeadLetter,
    DeadSelector, Delivery, MountInfo, Permits, Problem, Published, QueueStats, ReplayReport,
    Settled, Settlement, Unreadable,
};
use stagedoor_jobs::{Activity, Clock, Envelope, Priority};
use tokio::sync::OnceCell;

use crate::conn::{Conn, Target};
use crate::entry::Fields;
use crate::errors::Errors;
use crate::keys::{DEAD_SUFFIX, Keys};
use stagedoor_jobs::broker::{DeadLetters, Inspect, Locks, Record, RecordWrite, Records};

mod housekeeping;
mod key_cache;
mod levels;
mod settle_req;
mod urls;

pub(crate) use housekeeping::Housekeeping;
pub(crate) use levels::levels_of;
pub(crate) use settle_req::{SettleOp, SettleReq};

/// The consumer group every worker joins.
pub(crate) const GROUP: &str = "stagedoor";
/// How long the dead stream grows before it is trimmed (approximately).
pub(crate) const DEAD_MAXLEN: u64 = 10_000;

/// A job backend on Redis Streams: one stream per queue read by a consumer group,
/// delayed jobs and retries in a sorted set, a dead stream `<stream>:dead`.
///
/// ```no_run
/// # use stagedoor_jobs_redis::RedisBroker;
/// // Nothing connects here: the service connects when it starts.
/// let broker = RedisBroker::from_url("redis://127.0.0.1:6379/");
/// ```
#[derive(Clone)]
pub struct RedisBroker {
    pub(crate) inner: Arc<Inner>,
    pub(crate) lease: Duration,
    /// The poison count ([`max_deliveries`](Self::max_deliveries)), which
    /// [`Broker::poison_count`] answers.
    pub(crate) max_deliveries: u32,
    pub(crate) namespace: String,
}

pub(crate) struct Inner {
    pub(crate) target: Result<Target, String>,
    pub(crate) url_for_messages: String,
    pub(crate) conn: OnceCell<Conn>,
    /// The broker's clock, shared by its clones: the runtime keeps it in step with the
    /// server's (`TIME`), and every due time, `failed_at` and delayed score is read from it.
    pub(crate) clock: Clock,
    /// Reads the server's errors and remembers the last connection-level one.
    pub(crate) errors: Arc<Errors>,
    /// Whether the server knows script flags (Redis 7 and later, found at connect): the
    /// scripts that settle, reclaim and move jobs then run on a full server too.
    pub(crate) allow_oom: AtomicBool,
    /// One connection per queue for blocking reads, which would hold up the shared one.
    pub(crate) blocking: tokio::sync::Mutex<HashMap<String, Conn>>,
    /// Where a queue's claim reads go on a connection of their own with the reply reader of
    /// `read_conn.rs` (a standalone server over TCP or a Unix socket; `None`: through
    /// redis-rs), and each queue's such connection.
    pub(crate) read_target: Option<crate::read_conn::ReadTarget>,
    pub(crate) read_conns: Mutex<HashMap<String, Arc<crate::read_conn::ReadConn>>>,
    /// This process's consumer name in every group.
    pub(crate) consumer: String,
    /// When each queue last looked for entries to reclaim and for due delayed jobs.
    pub(crate) housekeeping: Mutex<HashMap<String, Housekeeping>>,
    /// Dead-stream entries trimmed away so far (also logged).
    pub(crate) trimmed: AtomicU64,
    /// Dead-stream entries the server sent to listings, replays, purges and field reads
    /// (`dead.rs`), and the most one read sent: what tests check reads are sized by.
    pub(crate) dead_read: AtomicU64,
    pub(crate) dead_read_largest: AtomicU64,
    /// Per namespace and queue, its keys: a settlement looks them up instead of formatting
    /// them again (emptied past [`KEYS_CACHED`](key_cache::KEYS_CACHED) queues).
    pub(crate) keys: Mutex<HashMap<String, HashMap<String, Arc<Keys>>>>,
    /// Per stream, the task that settles deliveries in batches.
    pub(crate) settles: stagedoor_jobs::kit::Batchers<SettleReq>,
}

/// A delivery's receipt: its entry, the delivery count it was claimed with (the fence), and
/// its fields (a retry or a dead letter re-adds them).
#[derive(Debug)]
pub struct RedisReceipt {
    pub(crate) id: String,
    pub(crate) deliveries: u64,
    pub(crate) fields: Fields,
    /// The priority level of the stream the entry was read from.
    pub(crate) level: Priority,
}

impl fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBroker")
            .field("url", &self.inner.url_for_messages)
            .field("consumer", &self.inner.consumer)
            .field("lease", &self.lease)
            .field("max_deliveries", &self.max_deliveries)
            .finish()
    }
}

/// `t` in milliseconds since the epoch (a delayed score, a tick).
pub(crate) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

impl RedisBroker {
    fn with_target(target: Result<Target, String>, url_for_messages: String) -> Self {
        let consumer = format!(
            "{}-{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".to_owned()),
            std::process::id(),
            &uuid::Uuid::now_v7().simple().to_string()[20..]
        );
        let read_target = match &target {
            Ok(Target::Single(client)) => crate::read_conn::ReadTarget::of(client),
            _ => None,
        };
        Self {
            inner: Arc::new(Inner {
                read_target,
                read_conns: Mutex::new(HashMap::new()),
                target,
                errors: Arc::new(Errors::new(url_for_messages.clone())),
                url_for_messages,
                conn: OnceCell::new(),
                clock: Clock::system(),
                allow_oom: AtomicBool::new(false),
                blocking: tokio::sync::Mutex::new(HashMap::new()),
                consumer,
                housekeeping: Mutex::new(HashMap::new()),
                trimmed: AtomicU64::new(0),
                dead_read: AtomicU64::new(0),
                dead_read_largest: AtomicU64::new(0),
                settles: stagedoor_jobs::kit::Batchers::new(),
                keys: Mutex::new(HashMap::new()),
            }),
            lease: DEFAULT_LEASE,
            max_deliveries: DEFAULT_POISON_COUNT,
            namespace: String::new(),
        }
    }

    /// How long a delivery may go without being settled or renewed before another worker
    /// reclaims it (default [`DEFAULT_LEASE`], 3 s). The runtime renews every delivery it
    /// holds every third of it (1 s by default), from its claim until it is settled, so a
    /// worker that dies gives its jobs back within about a lease while a live worker keeps
    /// the jobs of its slow handlers however long they run. A longer lease only delays the
    /// jobs of a dead worker; a shorter one needs renewals to reach the server that often.
    /// A service refuses to start with a lease below [`MIN_LEASE`](stagedoor_jobs::broker::MIN_LEASE)
    /// (100 ms) or above [`MAX_LEASE`](stagedoor_jobs::broker::MAX_LEASE) (one day).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets the broker's poison count ([`Broker::poison_count`], default
    /// [`DEFAULT_POISON_COUNT`], 3; at least 1): how many deliveries an entry may have without
    /// being settled (each one a worker that died) before the runtime dead-letters it without
    /// running it again. Each delivery reports the entry's delivery count
    /// ([`Delivery::delivered`]); the decision is the runtime's.
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n.max(1);
        self
    }

    /// This worker's consumer name in the groups.
    pub fn consumer(&self) -> &str {
        &self.inner.consumer
    }

    /// Dead-stream entries trimmed away by this process (each trim is also logged).
    pub fn trimmed(&self) -> u64 {
        self.inner.trimmed.load(Ordering::Relaxed)
    }

    /// The keys of queue (or dead stream) `name` in this broker's namespace.
    pub(crate) fn keys(&self, name: &str) -> Keys {
        Keys::of(&self.namespace, name)
    }

    /// Whether settled entries leave `keys`' stream by trimming (see
    /// [`SETTLE_MANY`](crate::scripts::SETTLE_MANY)): on Redis 7 (which has the group's lag
    /// to count ready entries from), and not on a dead stream, whose length is the count of
    /// its dead letters and whose entries the CLI lists: there each is deleted.
    pub(crate) fn trims(&self, keys: &Keys) -> bool {
        self.allow_oom() && !Keys::is_dead(&keys.name)
    }

    /// Puts every key of this broker in namespace `ns` (`{ns<queue>}`), so that several
    /// applications or test runs share one server without meeting. Queue names are unchanged.
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = ns.into();
        self
    }

    /// The key of `queue`'s stream (`{<namespace><queue>}`; `{jobs}:dead` for the dead stream
    /// `jobs:dead`): what to give `redis-cli XRANGE` or `XADD` to look at or add entries by hand.
    pub fn stream_key(&self, queue: &str) -> String {
        self.keys(queue).stream
    }

    /// The shared connection ([`BrokerError::NotConnected`] before `connect`).
    pub(crate) fn conn(&self) -> Result<Conn, BrokerError> {
        self.inner
            .conn
            .get()
            .cloned()
            .ok_or(BrokerError::NotConnected)
    }

    /// `queue`'s own connection for blocking reads, made at its first one.
    pub(crate) async fn blocking_conn(&self, queue: &str) -> Result<Conn, BrokerError> {
        let mut map = self.inner.blocking.lock().await;
        if let Some(c) = map.get(queue) {
            return Ok(c.clone());
        }
        let target = self
            .inner
            .target
            .as_ref()
            .map_err(|e| BrokerError::Connection(e.clone()))?;
        let c = target.connect().await.map_err(|e| self.err(e))?;
        map.insert(queue.to_owned(), c.clone());
        Ok(c)
    }

    /// `queue`'s connection for claim reads read by `read_conn.rs`, when the server is reached
    /// that way.
    pub(crate) fn read_conn(&self, queue: &str) -> Option<Arc<crate::read_conn::ReadConn>> {
        let target = self.inner.read_target.as_ref()?;
        let mut map = stagedoor_jobs::kit::lock(&self.inner.read_conns);
        // Looked up first: the key is copied only for a queue's first claim.
        if let Some(c) = map.get(queue) {
            return Some(Arc::clone(c));
        }
        let c = Arc::new(crate::read_conn::ReadConn::new(target.clone()));
        map.insert(queue.to_owned(), Arc::clone(&c));
        Some(c)
    }

    /// The time now on the broker's clock (the server's, once the runtime has synced it).
    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    /// The broker's error for the server's error `e` (a connection-level one is recorded).
    pub(crate) fn err(&self, e: redis::RedisError) -> BrokerError {
        self.inner.errors.of(e)
    }

    /// Whether the scripts run with `allow-oom` (the server is Redis 7 or later).
    pub(crate) fn allow_oom(&self) -> bool {
        self.inner.allow_oom.load(Ordering::Relaxed)
    }
}

impl Inspect for RedisBroker {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn connect(&self) -> Result<(), BrokerError> {
        self.redis_connect().await
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, BrokerError> {
        self.redis_stats(queue).await
    }

    async fn queues(&self) -> Result<Vec<String>, BrokerError> {
        self.redis_queues().await
    }

    async fn next_due(&self, queue: &str) -> Option<DateTime<Utc>> {
        self.redis_next_due(queue).await
    }
}

impl DeadLetters for RedisBroker {
    async fn cancel(
        &self,
        queue: &str,
        id: &stagedoor_jobs::JobId,
    ) -> Result<stagedoor_jobs::broker::Cancelled, BrokerError> {
        self.redis_cancel(queue, id).await
    }

    async fn dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        self.redis_dead_letters(dead, selector, limit).await
    }

    async fn replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<ReplayReport, BrokerError> {
        DeadLetters::check_dead_letter(self, dead).await?;
        self.redis_replay(dead, selector).await
    }

    async fn purge(&self, dead: &str, selector: &DeadSelector) -> Result<u64, BrokerError> {
        DeadLetters::check_dead_letter(self, dead).await?;
        self.redis_purge(dead, selector).await
    }

    async fn dead_len(&self, dead: &str) -> Result<u64, BrokerError> {
        self.redis_dead_len(dead).await
    }

    async fn check_dead_letter(&self, name: &str) -> Result<(), BrokerError> {
        // A mount's dead letter is always `<queue>:dead` here (see `check`).
        stagedoor_jobs::broker::ensure_dead_letter(self, name, DEAD_SUFFIX, &[]).await
    }

    async fn oldest_dead_letter(&self, dead: &str) -> Result<Option<DeadLetter>, BrokerError> {
        // The first entry of the dead stream: one entry read, whatever the stream holds.
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        let reply: redis::Value = redis::cmd("XRANGE")
            .arg(&keys.dead)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(crate::value::entries(&reply)
            .into_iter()
            .next()
            .map(|(id, f)| self.dead_letter_of(dead, id, &f)))
    }

    fn default_dead_letter(&self, queue: &str) -> String {
        format!("{queue}{DEAD_SUFFIX}")
    }
}

impl Activity for RedisBroker {
    async fn report(
        &self,
        worker: &WorkerReport,
        counts: &[QueueCounts],
        ttl: Duration,
    ) -> Result<(), BrokerError> {
        self.redis_report(worker, counts, ttl).await
    }

    async fn workers(&self) -> Result<Vec<WorkerReport>, BrokerError> {
        self.redis_workers().await
    }

    async fn throughput(
        &self,
        queue: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteCounts>, BrokerError> {
        self.redis_throughput(queue, since).await
    }

    async fn delayed(&self, queue: &str, limit: usize) -> Result<Vec<DelayedJob>, BrokerError> {
        self.redis_delayed(queue, limit).await
    }
}

impl Records for RedisBroker {
    async fn read_record(&self, key: &str) -> Result<Option<Record>, BrokerError> {
        self.redis_read_record(key).await
    }

    async fn write_records(&self, writes: &[RecordWrite]) -> Result<Option<Vec<u64>>, BrokerError> {
        self.redis_write_records(writes).await
    }
}

impl Locks for RedisBroker {
    async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, BrokerError> {
        self.redis_try_lock(key, token, ttl).await
    }

    async fn last_tick(&self, schedule: &str) -> Result<Option<DateTime<Utc>>, BrokerError> {
        self.redis_last_tick(schedule).await
    }

    async fn mark_tick(&self, schedule: &str, tick: DateTime<Utc>) -> Result<(), BrokerError> {
        self.redis_mark_tick(schedule, tick).await
    }

    async fn unlock(&self, key: &str, token: &str) -> Result<(), BrokerError> {
        self.redis_unlock(key, token).await
    }

    async fn take_permits(
        &self,
        key: &str,
        limit: u32,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<Permits, BrokerError> {
        self.redis_take_permits(key, limit, tokens, ttl).await
    }

    async fn renew_permits(
        &self,
        key: &str,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<usize, BrokerError> {
        self.redis_renew_permits(key, tokens, ttl).await
    }

    async fn release_permits(&self, key: &str, tokens: &[String]) -> Result<(), BrokerError> {
        self.redis_release_permits(key, tokens).await
    }
}

impl Broker for RedisBroker {
    type Receipt = RedisReceipt;

    async fn check(&self, mounts: &[MountInfo]) -> Vec<Problem> {
        self.redis_check(mounts).await
    }

    async fn prepare(&self, queue: &str) -> Result<(), BrokerError> {
        self.redis_prepare(queue).await
    }

    async fn claim(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        order: ClaimOrder,
    ) -> Result<Claimed<RedisReceipt>, BrokerError> {
        self.redis_claim(queue, max, wait, order).await
    }

    /// Moves the entry to the dead stream `target` (the queue's own: see `check`) in one
    /// script, fenced on its delivery count, with every field kept as it was (a malformed
    /// `attempts` field too) and the item's error.
    async fn dead_letter_unreadable(
        &self,
        queue: &str,
        item: &Unreadable<RedisReceipt>,
        target: &str,
    ) -> Result<Settled, BrokerError> {
        self.dead_letter_unreadable(queue, item, target).await
    }

    fn poison_count(&self) -> u32 {
        self.max_deliveries
    }

    async fn renew(&self, queue: &str, receipt: &RedisReceipt) -> Result<bool, BrokerError> {
        self.redis_renew(queue, receipt).await
    }

    async fn settle(
        &self,
        queue: &str,
        delivery: &Delivery<RedisReceipt>,
        settlement: Settlement,
    ) -> Result<Settled, BrokerError> {
        self.redis_settle(queue, delivery, settlement).await
    }

    async fn publish(
        &self,
        queue: &str,
        jobs: Vec<(Envelope, Option<DateTime<Utc>>)>,
    ) -> Result<Vec<Published>, BrokerError> {
        self.redis_publish(queue, jobs).await
    }

    /// One script: when the guard's key (`{<queue>}:once:<guard>`,
    /// in the queue's hash slot) exists nothing is stored; otherwise the guard is set for
    /// `ttl` and the job published as [`publish`](Broker::publish) does (its id once, to the
    /// delayed set when it is due later), in the same step. A full server refuses it whole.
    async fn publish_once(
        &self,
        queue: &str,
        job: (Envelope, Option<DateTime<Utc>>),
        guard: &str,
        ttl: Duration,
    ) -> Result<Published, BrokerError> {
        self.redis_publish_once(queue, job, guard, ttl).await
    }

    async fn finish_guard(
        &self,
        queue: &str,
        guard: &str,
        job_id: &stagedoor_jobs::JobId,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        self.redis_finish_guard(queue, guard, job_id, ttl).await
    }

    async fn server_time(&self) -> Result<Option<DateTime<Utc>>, BrokerError> {
        self.redis_server_time().await
    }

    async fn cancelled(
        &self,
        queue: &str,
        ids: &[stagedoor_jobs::JobId],
    ) -> Result<Vec<stagedoor_jobs::JobId>, BrokerError> {
        self.redis_cancelled(queue, ids).await
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    fn queue_name_problem(&self, queue: &str) -> Option<String> {
        crate::keys::name_problem(queue)
    }

    /// The broker's one clock (clones share it and the offset the runtime measures against
    /// the server's `TIME`).
    fn clock(&self) -> Clock {
        self.inner.clock.clone()
    }
}
