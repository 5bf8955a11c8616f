//! `RedisBroker`: the [`Broker`] on Redis Streams.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::{Value, cmd};
use stagedoor_jobs::broker::{
    Broker, BrokerError, DEFAULT_LEASE, DeadLetter, DeadSelector, Delivery, MountInfo, Problem,
    QueueStats, ReplayReport, Settled, Settlement,
};
use stagedoor_jobs::{Clock, Envelope};
use tokio::sync::OnceCell;

use crate::conn::{Conn, Target, cluster_client};
use crate::entry::{self, Fields};
use crate::errors::{Errors, is_oom};
use crate::keys::{DEAD_SUFFIX, Keys};
use crate::scripts;
use crate::value;

/// The consumer group every worker joins.
pub(crate) const GROUP: &str = "stagedoor";
/// How long the dead stream grows before it is trimmed (approximately).
pub(crate) const DEAD_MAXLEN: u64 = 10_000;
/// Delayed jobs moved per script call.
pub(crate) const MOVE_BATCH: usize = 100;

/// A job backend on Redis Streams (seed 000): one stream per queue read by a consumer group,
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
    /// This process's consumer name in every group.
    pub(crate) consumer: String,
    /// When each queue last looked for entries to reclaim and for due delayed jobs.
    pub(crate) housekeeping: Mutex<HashMap<String, Housekeeping>>,
    /// Dead-stream entries trimmed away so far (also logged).
    pub(crate) trimmed: AtomicU64,
    /// Per stream, the task that acknowledges settled deliveries in batches.
    pub(crate) acks: Mutex<HashMap<String, tokio::sync::mpsc::UnboundedSender<AckReq>>>,
    /// Per queue, the caps of its mounts that have a dead letter (told by [`Broker::check`]
    /// at startup): an entry whose `attempts` field alone reaches its mount's cap is
    /// dead-lettered at claim time, saying so.
    pub(crate) caps: Mutex<HashMap<String, Vec<Cap>>>,
}

/// The cap of one mount with a dead letter.
#[derive(Clone, Debug)]
pub(crate) struct Cap {
    pub(crate) subscriber: String,
    pub(crate) kind: Option<String>,
    pub(crate) max_attempts: u32,
}

/// A delivery to acknowledge in its stream's next [`scripts::ACK_MANY`] call.
pub(crate) struct AckReq {
    pub(crate) id: String,
    pub(crate) deliveries: u64,
    pub(crate) job: String,
    pub(crate) reply: tokio::sync::oneshot::Sender<Result<bool, BrokerError>>,
}

/// Acknowledges deliveries in batches: what settled while the previous call ran goes in the
/// next one (one script call for up to `ACK_BATCH` deliveries, each fenced on its own). Runs
/// under `restart_on_panic`: the receiver is shared so that a restarted loop reads the same
/// channel (a panic fails only the batch it interrupted; the runtime settles those again).
async fn ack_loop(
    mut c: Conn,
    keys: Keys,
    consumer: String,
    errors: Arc<Errors>,
    allow_oom: bool,
    rx: stagedoor_jobs::supervise::SharedReceiver<AckReq>,
) {
    let mut rx = rx.lock().await;
    let mut batch = Vec::with_capacity(scripts::ACK_BATCH);
    while rx.recv_many(&mut batch, scripts::ACK_BATCH).await > 0 {
        let mut call = scripts::ACK_MANY.pick(allow_oom).key(&keys.stream);
        call.key(&keys.ids).arg(GROUP).arg(&consumer);
        for r in &batch {
            call.arg(&r.id).arg(r.deliveries).arg(&r.job);
        }
        match call.invoke_async::<Vec<i64>>(&mut c).await {
            Ok(done) => {
                for (i, r) in batch.drain(..).enumerate() {
                    let _ = r.reply.send(Ok(done.get(i) == Some(&1)));
                }
            }
            Err(e) => {
                let e = errors.of(e);
                for r in batch.drain(..) {
                    let _ = r.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Housekeeping {
    pub(crate) reclaimed_at: Option<tokio::time::Instant>,
    pub(crate) next_delayed: Option<tokio::time::Instant>,
}

/// A delivery's receipt: its entry, the delivery count it was claimed with (the fence), and
/// its fields (a retry or a dead letter re-adds them).
#[derive(Debug)]
pub struct RedisReceipt {
    pub(crate) id: String,
    pub(crate) deliveries: u64,
    pub(crate) fields: Fields,
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

use stagedoor_jobs::broker::Published;
use stagedoor_jobs::broker::mask_url as mask;

pub(crate) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

impl RedisBroker {
    pub(crate) fn with_target(target: Result<Target, String>, url_for_messages: String) -> Self {
        let consumer = format!(
            "{}-{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".to_owned()),
            std::process::id(),
            &uuid::Uuid::now_v7().simple().to_string()[20..]
        );
        Self {
            inner: Arc::new(Inner {
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
                acks: Mutex::new(HashMap::new()),
                caps: Mutex::new(HashMap::new()),
            }),
            lease: DEFAULT_LEASE,
            max_deliveries: 3,
            namespace: String::new(),
        }
    }

    /// A broker for the server at `url` (`redis://[user:password@]host:port/db`, or
    /// `rediss://` with the `tls` feature). No I/O happens here; a wrong URL or an unreachable
    /// server is reported when the service starts.
    pub fn from_url(url: impl AsRef<str>) -> Self {
        let url = url.as_ref();
        let target = if url.starts_with("rediss://") && !cfg!(feature = "tls") {
            Err(format!(
                "`{}` asks for TLS: enable the `tls` feature of stagedoor-jobs-redis",
                mask(url)
            ))
        } else {
            redis::Client::open(url).map(Target::Single).map_err(|e| {
                format!(
                    "`{}` is not a Redis URL ({e}): write redis://[user:password@]host:port/db",
                    mask(url)
                )
            })
        };
        Self::with_target(target, mask(url))
    }

    /// A broker for a Redis Cluster reached through any of `urls`.
    pub fn cluster<S: AsRef<str>>(urls: impl IntoIterator<Item = S>) -> Self {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        let shown = urls.iter().map(|u| mask(u)).collect::<Vec<_>>().join(",");
        let target = cluster_client(&urls)
            .map(|c| Target::Cluster(Box::new(c)))
            .map_err(|e| format!("`{shown}` are not Redis Cluster URLs ({e})"));
        Self::with_target(target, shown)
    }

    /// How long a delivery may go without being settled or renewed before another worker
    /// reclaims it (default [`DEFAULT_LEASE`], 3 s). The runtime renews every delivery it
    /// holds every third of it (1 s by default), from its claim until it is settled, so a
    /// worker that dies gives its jobs back within about a lease while a live worker keeps
    /// the jobs of its slow handlers however long they run. A longer lease only delays the
    /// jobs of a dead worker; a shorter one needs renewals to reach the server that often.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How many deliveries an entry may have without being settled (each one a worker that
    /// died) before it goes to the dead stream without running again (default 3, seed 000).
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n.max(1);
        self
    }

    /// The fields of the dead letters `ids` of dead stream `dead` (`jobs:dead`) exactly as
    /// stored: names and values as bytes, in order; `None` for an id with no such entry. One
    /// round trip per 500 ids. For tools that show every field of a dead letter (a
    /// [`DeadLetter`] decodes only the known ones).
    pub async fn dead_letter_fields(
        &self,
        dead: &str,
        ids: &[String],
    ) -> Result<Vec<Option<Vec<(Vec<u8>, Vec<u8>)>>>, BrokerError> {
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(500) {
            let mut pipe = redis::pipe();
            for id in chunk {
                pipe.cmd("XRANGE").arg(&keys.dead).arg(id).arg(id);
            }
            let replies: Vec<Value> = pipe.query_async(&mut c).await.map_err(|e| self.err(e))?;
            for (id, reply) in chunk
                .iter()
                .zip(replies.iter().chain(std::iter::repeat(&Value::Nil)))
            {
                out.push(
                    value::entries(reply)
                        .into_iter()
                        .find(|(i, _)| i == id)
                        .map(|(_, f)| f),
                );
            }
        }
        Ok(out)
    }

    /// This worker's consumer name in the groups.
    pub fn consumer(&self) -> &str {
        &self.inner.consumer
    }

    /// Dead-stream entries trimmed away by this process (each trim is also logged).
    pub fn trimmed(&self) -> u64 {
        self.inner.trimmed.load(Ordering::Relaxed)
    }

    /// The channel to the task that acknowledges `keys`' stream, which is started at the
    /// stream's first acknowledgement and again whenever it is found stopped (it ran on a tokio
    /// runtime that has shut down, say): one dead task never makes every later acknowledgement
    /// fail. A panic inside it restarts it in place.
    pub(crate) fn ack_sender(
        &self,
        c: &Conn,
        keys: &Keys,
    ) -> tokio::sync::mpsc::UnboundedSender<AckReq> {
        let mut acks = self
            .inner
            .acks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tx) = acks.get(&keys.stream).filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let task = format!("redis acknowledgements of `{}`", keys.stream);
        if acks.contains_key(&keys.stream) {
            tracing::error!(task = %task, "the acknowledgement task had stopped: starting it again");
        }
        let (c, k, consumer) = (c.clone(), keys.clone(), self.inner.consumer.clone());
        let (errors, allow_oom) = (Arc::clone(&self.inner.errors), self.allow_oom());
        let tx = stagedoor_jobs::supervise::spawn_consumer(task, move |rx| {
            ack_loop(
                c.clone(),
                k.clone(),
                consumer.clone(),
                Arc::clone(&errors),
                allow_oom,
                rx,
            )
        });
        acks.insert(keys.stream.clone(), tx.clone());
        tx
    }

    pub(crate) fn keys(&self, name: &str) -> Keys {
        Keys::of(&self.namespace, name)
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

    pub(crate) fn conn(&self) -> Result<Conn, BrokerError> {
        self.inner
            .conn
            .get()
            .cloned()
            .ok_or(BrokerError::NotConnected)
    }

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

    /// The time now on the broker's clock (the server's, once the runtime has synced it).
    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    /// The broker's error for the server's error `e` (a connection-level one is recorded).
    pub(crate) fn err(&self, e: redis::RedisError) -> BrokerError {
        self.inner.errors.of(e)
    }

    /// Makes the delayed mover of `queue` look by `due` (read at `now` on the broker's clock):
    /// a delayed job just published may be due before its next look.
    pub(crate) fn look_for_due_by(&self, queue: &str, due: DateTime<Utc>, now: DateTime<Utc>) {
        if let Some(h) = self
            .inner
            .housekeeping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_mut(queue)
        {
            let at = tokio::time::Instant::now() + (due - now).to_std().unwrap_or_default();
            h.next_delayed = Some(h.next_delayed.map_or(at, |t| t.min(at)));
        }
    }

    /// Whether the scripts run with `allow-oom` (the server is Redis 7 or later).
    pub(crate) fn allow_oom(&self) -> bool {
        self.inner.allow_oom.load(Ordering::Relaxed)
    }

    /// Whether `keys`' stream has the consumer group (`XINFO GROUPS`, which a full server
    /// answers); `false` when that cannot be told.
    pub(crate) async fn group_exists(&self, keys: &Keys) -> bool {
        let Ok(mut c) = self.conn() else {
            return false;
        };
        let groups: Value = match cmd("XINFO")
            .arg("GROUPS")
            .arg(&keys.stream)
            .query_async(&mut c)
            .await
        {
            Ok(v) => v,
            Err(_) => return false,
        };
        value::array(&groups)
            .iter()
            .any(|g| entry::text(&value::fields(g), "name").as_deref() == Some(GROUP))
    }

    /// The fields of the dead letter of an entry with `fields`: every field it had, then its
    /// `attempts` (spent; `None` keeps the entry's own field as it was, a malformed one
    /// included), `error`, `traceback`, `failed_at` and `origin`.
    pub(crate) fn dead_fields(
        &self,
        fields: &Fields,
        attempts: Option<u32>,
        error: &str,
        traceback: &str,
        origin: &str,
    ) -> Fields {
        let mut f = match attempts {
            Some(n) => entry::with(fields, "attempts", n.to_string()),
            None => fields.clone(),
        };
        f = entry::without(&f, &["error", "traceback", "failed_at", "origin"]);
        f.push(("error".into(), error.as_bytes().to_vec()));
        f.push(("traceback".into(), traceback.as_bytes().to_vec()));
        f.push(("failed_at".into(), self.now().to_rfc3339().into_bytes()));
        f.push(("origin".into(), origin.as_bytes().to_vec()));
        f
    }

    pub(crate) fn note_trimmed(&self, dead: &str, n: i64) {
        if n > 0 {
            self.inner.trimmed.fetch_add(n as u64, Ordering::Relaxed);
            metrics::counter!("stagedoor_jobs_dead_trimmed_total", "dead_letter" => dead.to_owned()).increment(n as u64);
            tracing::warn!(
                dead_stream = dead,
                trimmed = n,
                "the dead stream reached about {DEAD_MAXLEN} entries: its oldest were trimmed"
            );
        }
    }

    /// Dead-letters an entry this worker holds, in one step; returns whether it was still ours.
    /// `attempts`: the attempts spent it reports (`None`: its own field, kept as it was).
    pub(crate) async fn dead_letter_held(
        &self,
        keys: &Keys,
        (id, deliveries, fields): (&str, u64, &Fields),
        attempts: Option<u32>,
        error: &str,
        traceback: &str,
    ) -> Result<bool, BrokerError> {
        let f = self.dead_fields(fields, attempts, error, traceback, &keys.name);
        let job = entry::text(fields, "job_id").unwrap_or_default();
        let mut c = self.conn()?;
        let reply: Vec<i64> = scripts::DEAD
            .pick(self.allow_oom())
            .key(&keys.stream)
            .key(&keys.dead)
            .key(&keys.ids)
            .arg(GROUP)
            .arg(&self.inner.consumer)
            .arg(id)
            .arg(deliveries)
            .arg(&job)
            .arg(DEAD_MAXLEN)
            .arg(entry::flat(&f))
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        self.note_trimmed(&keys.dead, reply.get(1).copied().unwrap_or(0));
        Ok(reply.first() == Some(&1))
    }

    /// Moves due delayed jobs to the stream under the mover's lock; returns when the next is due.
    pub(crate) async fn move_due(&self, keys: &Keys) -> Result<Option<DateTime<Utc>>, BrokerError> {
        let mut c = self.conn()?;
        let token = &self.inner.consumer;
        // Through a script, which a full server runs too (a plain `SET NX` it refuses): moving
        // due jobs goes on while the workers drain it.
        let got: i64 = scripts::TAKE_LOCK
            .pick(self.allow_oom())
            .key(&keys.mover)
            .arg(token)
            .arg(5_000)
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        if got != 1 {
            // Another worker is moving; look again soon.
            return Ok(Some(self.now() + chrono::Duration::milliseconds(250)));
        }
        let result = async {
            loop {
                let reply: Value = scripts::MOVE_DUE
                    .pick(self.allow_oom())
                    .key(&keys.delayed)
                    .key(&keys.stream)
                    .arg(ms(self.now()))
                    .arg(MOVE_BATCH)
                    .invoke_async(&mut c)
                    .await
                    .map_err(|e| self.err(e))?;
                let parts = value::array(&reply);
                let moved = parts.first().and_then(value::int).unwrap_or(0);
                let next = parts
                    .get(1)
                    .and_then(value::string)
                    .and_then(|s| s.parse::<f64>().ok());
                if moved < MOVE_BATCH as i64 {
                    return Ok(next.and_then(|n| DateTime::<Utc>::from_timestamp_millis(n as i64)));
                }
            }
        }
        .await;
        let _: Result<i64, _> = scripts::UNLOCK
            .key(&keys.mover)
            .arg(token)
            .invoke_async(&mut c)
            .await;
        result
    }

    /// Reclaims entries idle past the lease (at most every quarter lease per queue).
    pub(crate) async fn reclaim(
        &self,
        keys: &Keys,
        max: usize,
    ) -> Result<Vec<Delivery<RedisReceipt>>, BrokerError> {
        let mut c = self.conn()?;
        let reply: redis::RedisResult<Value> = scripts::RECLAIM
            .pick(self.allow_oom())
            .key(&keys.stream)
            .key(&keys.dead)
            .key(&keys.ids)
            .arg(GROUP)
            .arg(&self.inner.consumer)
            .arg(self.lease.as_millis() as u64)
            .arg(max)
            .arg(self.max_deliveries)
            .arg(DEAD_MAXLEN)
            .arg(self.now().to_rfc3339())
            .arg(&keys.name)
            .arg(stagedoor_jobs::broker::MAX_ATTEMPT)
            .invoke_async(&mut c)
            .await;
        let reply = match reply {
            Ok(v) => v,
            // The stream or its group is gone (a server restarted without persistence, a
            // FLUSHALL): make them again. Failing here instead would fail every claim from now
            // on, since the claim never got as far as the read that re-creates the group.
            Err(e) if e.to_string().contains("NOGROUP") => {
                self.prepare(&keys.name).await?;
                return Ok(Vec::new());
            }
            Err(e) => return Err(self.err(e)),
        };
        // {entries to run, dead-stream entries trimmed by the dead letters it made}
        let (items, trimmed) = match value::array(&reply) {
            [items, trimmed] => (value::array(items), value::int(trimmed).unwrap_or(0)),
            _ => (&[][..], 0),
        };
        self.note_trimmed(&keys.dead, trimmed);
        let mut out = Vec::new();
        for item in items {
            let [id, f, d] = value::array(item) else {
                continue;
            };
            let (Some(id), fields, Some(d)) = (value::string(id), value::fields(f), value::int(d))
            else {
                continue;
            };
            let d = d.max(1) as u64;
            if let Some(delivery) = self.delivery(keys, id, fields, d).await? {
                out.push(delivery);
            }
        }
        Ok(out)
    }

    /// The cap of the mount that runs `kind` on `queue` (its own kind's mount, else the one
    /// for every kind), when that mount has a dead letter and `spent` attempts reach it. A
    /// fresh entry (`spent` 0, the common case) never does: no lock is taken.
    pub(crate) fn cap_reached(&self, queue: &str, kind: &str, spent: u32) -> Option<Cap> {
        if spent == 0 {
            return None;
        }
        let caps = self
            .inner
            .caps
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mounts = caps.get(queue)?;
        mounts
            .iter()
            .find(|c| c.kind.as_deref() == Some(kind))
            .or_else(|| mounts.iter().find(|c| c.kind.is_none()))
            .filter(|c| spent >= c.max_attempts)
            .cloned()
    }

    /// A delivery from an entry, or `None` when the entry cannot run: it is dead-lettered by
    /// itself (the other entries of the claim run), with an error that names what is wrong.
    /// That is an entry that is malformed (no `kind`, no `payload`, an `attempts` field that
    /// is not a whole number of 0 or more: its fields are kept as they were), and an entry
    /// whose `attempts` field alone reaches its mount's cap (it arrived with its attempts
    /// already spent: no worker died running it here).
    pub(crate) async fn delivery(
        &self,
        keys: &Keys,
        id: String,
        fields: Fields,
        deliveries: u64,
    ) -> Result<Option<Delivery<RedisReceipt>>, BrokerError> {
        // An entry without a `job_id` (added by hand) takes its entry id as its job id: the
        // delivery, its retry (a new entry), its dead letter and the CLI all show that one id.
        let fields = if entry::text(&fields, "job_id").is_some_and(|j| !j.is_empty()) {
            fields
        } else {
            entry::with(&fields, "job_id", id.clone())
        };
        let dead_stream = Keys::is_dead(&keys.name);
        let decoded = entry::attempts(&fields).and_then(|spent| {
            let attempt = entry::attempt_of(spent, deliveries, dead_stream);
            entry::decode(&fields, attempt, entry::id_time(&id)).map(|e| (spent, e))
        });
        let (spent, envelope) = match decoded {
            Ok(d) => d,
            Err(why) => {
                let error = format!(
                    "malformed entry {id} on `{}`: {why}; it was not run (replay it once fixed)",
                    keys.name
                );
                tracing::error!(queue = %keys.name, "{error}: dead-lettered");
                self.dead_letter_held(keys, (&id, deliveries, &fields), None, &error, "")
                    .await?;
                return Ok(None);
            }
        };
        // On a queue's stream, an entry whose field says its mount's cap is spent already
        // never runs; the runtime would say a worker died, which is not what happened.
        // (Not on a dead stream: a dead letter's reader sees the attempts it spent.)
        if !dead_stream && let Some(cap) = self.cap_reached(&keys.name, envelope.kind(), spent) {
            let raw = entry::get(&fields, "attempts").map_or_else(String::new, entry::shown);
            let counted = if raw == spent.to_string() {
                String::new()
            } else {
                format!(", counted as {spent}, the most an attempt counter holds")
            };
            let before = if deliveries > 1 {
                format!(
                    "; it had been delivered {} times before without being settled",
                    deliveries - 1
                )
            } else {
                "; this was its first delivery: it never ran here".to_owned()
            };
            let error = format!(
                "entry {id} arrived on `{}` having already spent {spent} attempts by its `attempts` field (`{raw}`{counted}), and max_attempts({}) of subscriber `{}` allows no more: dead-lettered without running{before}. Replay it to run it again from attempt 1",
                keys.name, cap.max_attempts, cap.subscriber
            );
            tracing::error!(queue = %keys.name, job_id = %envelope.id(), "{error}");
            self.dead_letter_held(keys, (&id, deliveries, &fields), Some(spent), &error, "")
                .await?;
            return Ok(None);
        }
        Ok(Some(Delivery {
            envelope,
            receipt: RedisReceipt {
                id,
                deliveries,
                fields,
            },
        }))
    }

    /// A dead letter from its entry, keeping what is stored and making nothing up: without a
    /// `job_id` its job id is the entry's id (the same on every read, and `dead show` finds
    /// it); without a `kind` its kind is empty; without `enqueued_at` or `failed_at` the time
    /// is the entry's own (when it was added to the dead stream). An `attempts` field that is
    /// not a number reports 0 (the field is kept as it is).
    pub(crate) fn dead_letter_of(&self, dead: &str, id: String, fields: &Fields) -> DeadLetter {
        let attempts = entry::attempts_or_zero(fields);
        let origin = entry::text(fields, "origin")
            .unwrap_or_else(|| dead.trim_end_matches(DEAD_SUFFIX).to_owned());
        let added = entry::id_time(&id);
        let envelope = entry::decode(fields, attempts, added).unwrap_or_else(|_| {
            Envelope::new(
                entry::text(fields, "kind").unwrap_or_default(),
                entry::get(fields, "payload").unwrap_or_default().to_vec(),
                entry::enqueued_at(fields).unwrap_or(added),
            )
            .with_attempt(attempts)
        });
        let job_id = entry::text(fields, "job_id")
            .filter(|j| !j.is_empty())
            .unwrap_or_else(|| id.clone());
        let envelope = envelope.with_id(stagedoor_jobs::JobId::from_string(job_id));
        DeadLetter {
            id,
            envelope,
            origin,
            error: entry::text(fields, "error").unwrap_or_default(),
            traceback: entry::text(fields, "traceback").unwrap_or_default(),
            attempts,
            failed_at: entry::text(fields, "failed_at")
                .and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
                .map_or(added, |t| t.with_timezone(&Utc)),
        }
    }
}

impl Broker for RedisBroker {
    type Receipt = RedisReceipt;

    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn connect(&self) -> Result<(), BrokerError> {
        let target = self
            .inner
            .target
            .as_ref()
            .map_err(|e| BrokerError::Connection(e.clone()))?;
        let conn = self
            .inner
            .conn
            .get_or_try_init(|| async {
                target.connect().await.map_err(|e| match self.err(e) {
                    BrokerError::Connection(e) => BrokerError::Connection(format!(
                        "cannot reach Redis at `{}`: {e}: check the URL and that the server is running",
                        self.inner.url_for_messages
                    )),
                    other => other,
                })
            })
            .await?;
        let mut c = conn.clone();
        // A cluster answers with every node's INFO: the oldest node decides.
        let info: Value = cmd("INFO")
            .arg("server")
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        let texts: Vec<String> = match &info {
            Value::Map(m) => m.iter().filter_map(|(_, v)| value::string(v)).collect(),
            other => value::string(other).into_iter().collect(),
        };
        let versions: Vec<(u32, u32, String)> = texts
            .iter()
            .map(|t| {
                let v = t
                    .lines()
                    .find_map(|l| l.strip_prefix("redis_version:"))
                    .unwrap_or("0")
                    .trim()
                    .to_owned();
                let p: Vec<u32> = v.split('.').filter_map(|x| x.parse().ok()).collect();
                (
                    p.first().copied().unwrap_or(0),
                    p.get(1).copied().unwrap_or(0),
                    v,
                )
            })
            .collect();
        let (major, minor, version) =
            versions
                .into_iter()
                .min()
                .unwrap_or((0, 0, "unknown".to_owned()));
        if (major, minor) < (6, 2) {
            return Err(BrokerError::Connection(format!(
                "Redis {version} at `{}` is too old: stagedoor-jobs needs 6.2 or later (XAUTOCLAIM, ZRANGE BYSCORE)",
                self.inner.url_for_messages
            )));
        }
        // Script flags (`#!lua flags=allow-oom`) came with Redis 7.
        self.inner.allow_oom.store(major >= 7, Ordering::Relaxed);
        Ok(())
    }

    async fn check(&self, mounts: &[MountInfo]) -> Vec<Problem> {
        let mut problems = Vec::new();
        {
            let mut caps = self
                .inner
                .caps
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for m in mounts {
                if let (Some(max_attempts), Some(_)) = (m.max_attempts, &m.dead_letter) {
                    let known = caps.entry(m.queue.clone()).or_default();
                    known.retain(|c| c.kind != m.kind);
                    known.push(Cap {
                        subscriber: m.subscriber.clone(),
                        kind: m.kind.clone(),
                        max_attempts,
                    });
                }
            }
        }
        for m in mounts {
            if let Some(dead) = &m.dead_letter {
                let expected = format!("{}{DEAD_SUFFIX}", m.queue);
                if *dead != expected {
                    problems.push(Problem {
                        mount: format!("mount `{}` on queue `{}`", m.subscriber, m.queue),
                        message: format!(
                            "on Redis a dead letter is its stream's dead stream, which shares the stream's hash tag so that the move is one atomic step: write `.dead_letter(\"{expected}\")`"
                        ),
                    });
                }
            }
        }
        problems
    }

    async fn prepare(&self, queue: &str) -> Result<(), BrokerError> {
        let keys = self.keys(queue);
        let mut c = self.conn()?;
        let r: redis::RedisResult<Value> = cmd("XGROUP")
            .arg("CREATE")
            .arg(&keys.stream)
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("BUSYGROUP") => Ok(()),
            // A full server refuses `XGROUP CREATE` even when the group exists (the command may
            // grow its memory, so it is refused before it looks): a group that exists is all a
            // worker needs, and it drains the full server like any other.
            Err(e) if is_oom(&e) && self.group_exists(&keys).await => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }

    async fn claim(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery<RedisReceipt>>, BrokerError> {
        let keys = self.keys(queue);
        let now = tokio::time::Instant::now();
        let hk = self
            .inner
            .housekeeping
            .lock()
            .expect("lock")
            .get(queue)
            .copied()
            .unwrap_or(Housekeeping {
                reclaimed_at: None,
                next_delayed: None,
            });
        let mut out = Vec::new();
        let mut next_delayed = hk.next_delayed;
        let mut reclaimed_at = hk.reclaimed_at;
        // Entries whose workers went quiet past the lease, every quarter lease; but not until
        // this broker has talked to the server for a whole lease without a connection error:
        // after an outage (a server restarting, a network cut) every lease looks lapsed, and
        // the workers holding those entries renew them within a third of a lease of the server
        // answering again. Reclaiming sooner would run their jobs twice. Fresh entries are
        // read at once all the same.
        if reclaimed_at.is_none_or(|t| now.duration_since(t) >= self.lease / 4)
            && self.inner.errors.quiet_for(self.lease)
        {
            reclaimed_at = Some(now);
            out = self.reclaim(&keys, max).await?;
        }
        // Delayed jobs that are due, when the last look said one would be.
        if next_delayed.is_none_or(|t| now >= t) {
            let next = self.move_due(&keys).await?;
            next_delayed = Some(match next {
                Some(t) => {
                    let d = (t - self.now()).to_std().unwrap_or(Duration::ZERO);
                    now + d.min(Duration::from_secs(1))
                }
                None => now + Duration::from_secs(1),
            });
        }
        self.inner.housekeeping.lock().expect("lock").insert(
            queue.to_owned(),
            Housekeeping {
                reclaimed_at,
                next_delayed,
            },
        );
        if out.len() >= max {
            return Ok(out);
        }
        // New entries: block until one arrives, the wait ends, or a delayed job is due.
        let mut block = if out.is_empty() { wait } else { Duration::ZERO };
        if let Some(t) = next_delayed {
            block = block.min(t.saturating_duration_since(tokio::time::Instant::now()));
        }
        let mut read = cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(GROUP)
            .arg(&self.inner.consumer)
            .arg("COUNT")
            .arg(max - out.len());
        let mut c = if block.is_zero() {
            read.arg("STREAMS").arg(&keys.stream).arg(">");
            self.conn()?
        } else {
            read.arg("BLOCK")
                .arg(block.as_millis().max(1) as u64)
                .arg("STREAMS")
                .arg(&keys.stream)
                .arg(">");
            self.blocking_conn(queue).await?
        };
        // Both reads, blocking or not, make a deleted stream again (it used to be only the
        // blocking one: the other failed every claim until a blocking read happened).
        let reply: Value = match read.query_async(&mut c).await {
            Ok(v) => v,
            Err(e) if e.to_string().contains("NOGROUP") => {
                // The stream was deleted under us: make it again.
                self.prepare(queue).await?;
                Value::Nil
            }
            Err(e) => return Err(self.err(e)),
        };
        for (id, fields) in value::read_reply(&reply) {
            if let Some(d) = self.delivery(&keys, id, fields, 1).await? {
                out.push(d);
            }
        }
        Ok(out)
    }

    async fn renew(&self, queue: &str, receipt: &RedisReceipt) -> Result<bool, BrokerError> {
        let keys = self.keys(queue);
        let mut c = self.conn()?;
        let r: i64 = scripts::RENEW
            .pick(self.allow_oom())
            .key(&keys.stream)
            .arg(GROUP)
            .arg(&self.inner.consumer)
            .arg(&receipt.id)
            .arg(receipt.deliveries)
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(r == 1)
    }

    async fn settle(
        &self,
        queue: &str,
        delivery: &Delivery<RedisReceipt>,
        settlement: Settlement,
    ) -> Result<Settled, BrokerError> {
        let keys = self.keys(queue);
        let r = &delivery.receipt;
        let job = delivery.envelope.id().to_string();
        let mut c = self.conn()?;
        let done = match settlement {
            Settlement::Ack | Settlement::Drop => {
                let (reply, answer) = tokio::sync::oneshot::channel();
                let stopped =
                    || BrokerError::Connection("the acknowledgement task stopped".to_owned());
                let mut req = AckReq {
                    id: r.id.clone(),
                    deliveries: r.deliveries,
                    job,
                    reply,
                };
                // A send fails only if the task stopped since `ack_sender` looked: the second
                // look starts it again.
                let mut sent = false;
                for _ in 0..2 {
                    match self.ack_sender(&c, &keys).send(req) {
                        Ok(()) => {
                            sent = true;
                            break;
                        }
                        Err(e) => req = e.0,
                    }
                }
                if !sent {
                    return Err(stopped());
                }
                answer.await.map_err(|_| stopped())??
            }
            Settlement::Retry { delay, .. } => {
                // The next entry carries the attempts spent so far (its next delivery is this
                // one's number + 1).
                let spent =
                    entry::attempts_after(delivery.envelope.attempt(), Keys::is_dead(queue));
                let fields = entry::with(&r.fields, "attempts", spent.to_string());
                let due = if delay.is_zero() {
                    0
                } else {
                    ms(self.now() + stagedoor_jobs::broker::chrono_duration(delay)).max(1)
                };
                let n: i64 = scripts::RETRY
                    .pick(self.allow_oom())
                    .key(&keys.stream)
                    .key(&keys.delayed)
                    .arg(GROUP)
                    .arg(&self.inner.consumer)
                    .arg(&r.id)
                    .arg(r.deliveries)
                    .arg(due)
                    .arg(entry::member(&fields))
                    .arg(entry::flat(&fields))
                    .invoke_async(&mut c)
                    .await
                    .map_err(|e| self.err(e))?;
                if n == 1 && due > 0 {
                    // The mover should look by then.
                    let at = tokio::time::Instant::now() + delay;
                    if let Some(h) = self.inner.housekeeping.lock().expect("lock").get_mut(queue) {
                        h.next_delayed = Some(h.next_delayed.map_or(at, |t| t.min(at)));
                    }
                }
                n == 1
            }
            Settlement::DeadLetter { target, failure } => {
                let target_keys = self.keys(&target);
                if target_keys.dead != keys.dead {
                    return Err(BrokerError::Backend(format!(
                        "dead letter `{target}` is not the dead stream of `{queue}` (`{}`)",
                        keys.name.clone() + DEAD_SUFFIX
                    )));
                }
                self.dead_letter_held(
                    &keys,
                    (&r.id, r.deliveries, &r.fields),
                    Some(delivery.envelope.attempt()),
                    &failure.error,
                    &failure.traceback,
                )
                .await?
            }
        };
        Ok(if done {
            Settled::Done
        } else {
            Settled::LeaseLost
        })
    }

    async fn publish(
        &self,
        queue: &str,
        jobs: Vec<(Envelope, Option<DateTime<Utc>>)>,
    ) -> Result<Vec<Published>, BrokerError> {
        self.publish(queue, jobs).await
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
        self.publish_once(queue, job, guard, ttl).await
    }

    async fn server_time(&self) -> Result<Option<DateTime<Utc>>, BrokerError> {
        self.server_time().await
    }

    async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, BrokerError> {
        self.try_lock(key, token, ttl).await
    }

    async fn last_tick(&self, schedule: &str) -> Result<Option<DateTime<Utc>>, BrokerError> {
        self.last_tick(schedule).await
    }

    async fn mark_tick(&self, schedule: &str, tick: DateTime<Utc>) -> Result<(), BrokerError> {
        self.mark_tick(schedule, tick).await
    }

    async fn unlock(&self, key: &str, token: &str) -> Result<(), BrokerError> {
        self.unlock(key, token).await
    }

    async fn dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        let reply: Value = match selector {
            DeadSelector::All => {
                cmd("XREVRANGE")
                    .arg(&keys.dead)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(limit.min(1_000_000))
                    .query_async(&mut c)
                    .await
            }
            _ => {
                cmd("XREVRANGE")
                    .arg(&keys.dead)
                    .arg("+")
                    .arg("-")
                    .query_async(&mut c)
                    .await
            }
        }
        .map_err(|e| self.err(e))?;
        Ok(value::entries(&reply)
            .into_iter()
            .map(|(id, f)| self.dead_letter_of(dead, id, &f))
            .filter(|d| selector.matches(d))
            .take(limit)
            .collect())
    }

    async fn replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<ReplayReport, BrokerError> {
        let letters = self.dead_letters(dead, selector, usize::MAX).await?;
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        let mut report = ReplayReport::default();
        let mut all: Vec<(String, Fields)> = Vec::new();
        if !letters.is_empty() {
            let reply: Value = cmd("XRANGE")
                .arg(&keys.dead)
                .arg("-")
                .arg("+")
                .query_async(&mut c)
                .await
                .map_err(|e| self.err(e))?;
            all = value::entries(&reply);
        }
        for d in letters {
            let Some((_, fields)) = all.iter().find(|(id, _)| *id == d.id) else {
                report.skipped += 1;
                continue;
            };
            let origin = self.keys(&d.origin);
            let f = entry::with(
                &entry::without(fields, &["error", "traceback", "failed_at", "origin"]),
                "attempts",
                "0",
            );
            // A dead letter without a job id is shown with its entry's id: the job keeps it.
            let f = if entry::get(&f, "job_id").is_none_or(<[u8]>::is_empty) {
                entry::with(&f, "job_id", d.envelope.id().as_str())
            } else {
                f
            };
            let r: redis::RedisResult<i64> = scripts::REPLAY
                .key(&keys.dead)
                .key(&origin.stream)
                .key(&origin.ids)
                .arg(&d.id)
                .arg(d.envelope.id().as_str())
                .arg(entry::flat(&f))
                .invoke_async(&mut c)
                .await;
            match r {
                Ok(1) => report.replayed += 1,
                Ok(_) => report.skipped += 1,
                Err(e) => {
                    tracing::error!(dead_letter = %d.id, error = %e, "replay failed");
                    report.failed += 1;
                }
            }
        }
        Ok(report)
    }

    async fn purge(&self, dead: &str, selector: &DeadSelector) -> Result<u64, BrokerError> {
        let letters = self.dead_letters(dead, selector, usize::MAX).await?;
        if letters.is_empty() {
            return Ok(0);
        }
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        let mut n = 0;
        for chunk in letters.chunks(500) {
            let mut x = cmd("XDEL");
            x.arg(&keys.dead);
            for d in chunk {
                x.arg(&d.id);
            }
            let deleted: i64 = x.query_async(&mut c).await.map_err(|e| self.err(e))?;
            n += deleted as u64;
        }
        Ok(n)
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, BrokerError> {
        self.stats(queue).await
    }

    async fn queues(&self) -> Result<Vec<String>, BrokerError> {
        self.queues().await
    }

    async fn dead_len(&self, dead: &str) -> Result<u64, BrokerError> {
        self.dead_len(dead).await
    }

    fn default_dead_letter(&self, queue: &str) -> String {
        format!("{queue}{DEAD_SUFFIX}")
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    /// The broker's one clock (clones share it and the offset the runtime measures against
    /// the server's `TIME`).
    fn clock(&self) -> Clock {
        self.inner.clock.clone()
    }

    async fn next_due(&self, queue: &str) -> Option<DateTime<Utc>> {
        self.next_due(queue).await
    }
}
