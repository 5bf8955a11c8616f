//! Claiming: new entries read by the group (blocking up to the wait), entries idle past the
//! lease reclaimed, delayed jobs that are due moved to the stream by the mover, and each
//! entry made a delivery, or dead-lettered when it cannot run (malformed, or its cap spent).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::{Value, cmd};
use stagedoor_jobs::Priority;
use stagedoor_jobs::broker::{BrokerError, ClaimOrder, Delivery};
use stagedoor_jobs::kit::lock;

use crate::broker::{Cap, DEAD_MAXLEN, GROUP, RedisBroker, RedisReceipt, ms};
use crate::entry::{self, Fields};
use crate::keys::Keys;
use crate::scripts;
use crate::value;

/// Delayed jobs moved per script call.
const MOVE_BATCH: usize = 100;

/// What one run of the delayed mover did.
#[derive(Debug, Default)]
pub(crate) struct Moved {
    /// When the next delayed job is due (`None`: none is).
    pub(crate) next: Option<DateTime<Utc>>,
    /// The levels other than normal it moved jobs to (bit `level + 2` each).
    pub(crate) levels: u8,
    /// Why members were left in the delayed set (a key of the wrong type in their way).
    pub(crate) errors: Vec<String>,
}

impl RedisBroker {
    /// [`Broker::claim`](stagedoor_jobs::broker::Broker::claim) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn claim(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        order: ClaimOrder,
    ) -> Result<Vec<Delivery<RedisReceipt>>, BrokerError> {
        self.claim_levels(queue, max, wait, order).await
    }

    /// The claim: reclaimed entries, then new ones of each level in use.
    async fn claim_levels(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        order: ClaimOrder,
    ) -> Result<Vec<Delivery<RedisReceipt>>, BrokerError> {
        // The priority levels to read, highest first: normal alone for a queue that never saw
        // another (its claim is one read, as it always was).
        let mut levels = self.levels_in_use(queue).await?;
        let now = tokio::time::Instant::now();
        let hk = self.housekeeping(queue);
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
            // The server's side of the same rule: a failover or restart the broker did not
            // see as an error (the Cluster client retries through one) waits a lease too.
            let served = self.served_for_a_lease(&self.cached_keys(queue)).await?;
            for level in levels.iter().filter(|_| served) {
                if out.len() >= max {
                    break;
                }
                let keys = self.keys_at(queue, *level);
                match self.reclaim(&keys, *level, max - out.len()).await {
                    Ok(got) => out.extend(got),
                    // A key of the wrong type (the dead stream, the ids set): logged, and the
                    // new entries are read all the same.
                    Err(BrokerError::Backend(e)) => tracing::error!(
                        queue,
                        "reclaiming the entries idle past their lease failed: {e}; the new entries of `{queue}` are still claimed"
                    ),
                    Err(e) => return Err(e),
                }
            }
        }
        // Delayed jobs that are due, when the last look said one would be. The mover failing
        // (a delayed set of the wrong type, a member it could not move) is logged and looked
        // at again a second later; it never stops the claim of the entries already in the
        // stream.
        if next_delayed.is_none_or(|t| now >= t) {
            let mut next = None;
            let stuck;
            match self.move_due(&self.cached_keys(queue)).await {
                Ok(Moved {
                    next: n,
                    levels: moved_to,
                    errors,
                }) => {
                    // A delayed job moved to a level's stream that did not exist: read it
                    // from now.
                    if moved_to & !self.housekeeping(queue).levels != 0 {
                        levels = self.add_levels(queue, moved_to).await?;
                    }
                    next = n;
                    for e in &errors {
                        tracing::error!(queue, "the delayed mover could not move a job: {e}");
                    }
                    stuck = !errors.is_empty();
                }
                Err(e) => {
                    tracing::error!(
                        queue,
                        "the delayed mover failed: {e}; no delayed job of `{queue}` moves until it is fixed (the jobs already in its stream are still claimed)"
                    );
                    stuck = true;
                }
            }
            next_delayed = Some(match next {
                Some(t) if !stuck => {
                    let d = (t - self.now()).to_std().unwrap_or(Duration::ZERO);
                    now + d.min(Duration::from_secs(1))
                }
                _ => now + Duration::from_secs(1),
            });
        }
        self.update_housekeeping(queue, |h| {
            h.reclaimed_at = reclaimed_at;
            h.next_delayed = next_delayed;
        });
        if out.len() >= max {
            return Ok(out);
        }
        // New entries: block until one arrives, the wait ends, or a delayed job is due.
        let mut block = if out.is_empty() { wait } else { Duration::ZERO };
        if let Some(t) = next_delayed {
            block = block.min(t.saturating_duration_since(tokio::time::Instant::now()));
        }
        if let [level] = levels.as_slice() {
            let keys = self.keys_at(queue, *level);
            let count = max - out.len();
            return self
                .read_new(queue, &[(*level, &keys)], count, block, out)
                .await;
        }
        // Several levels: the highest first, each read without blocking until the claim is
        // full; a claim in due order (the runtime's fair turn) starts at the level whose oldest
        // waiting job is the oldest instead, so that no level waits forever behind a busier
        // one.
        let mut keys: Vec<(Priority, Arc<Keys>)> = levels
            .iter()
            .map(|l| (*l, self.keys_at(queue, *l)))
            .collect();
        if order == ClaimOrder::Due {
            let mut call = scripts::OLDEST_WAITING.prepare_invoke();
            for (_, k) in &keys {
                call.key(&k.stream);
            }
            let oldest: i64 = call
                .arg(GROUP)
                .invoke_async(&mut self.conn()?)
                .await
                .map_err(|e| self.err(e))?;
            if let Some(i) = usize::try_from(oldest - 1).ok().filter(|i| *i < keys.len()) {
                let first = keys.remove(i);
                keys.insert(0, first);
            }
        }
        for (level, k) in &keys {
            if out.len() >= max {
                return Ok(out);
            }
            let count = max - out.len();
            out = self
                .read_new(queue, &[(*level, k)], count, Duration::ZERO, out)
                .await?;
        }
        if !out.is_empty() || block.is_zero() {
            return Ok(out);
        }
        // Nothing at any level: block on them all at once. A blocked read answers with the
        // entries of one stream on Redis 7.0, of each stream that has some on later versions:
        // each stream's count is the claim's share, so that the claim never holds more than
        // `max`; with fewer slots than levels, it blocks on the first `max` levels, for at
        // most 100 ms, and the next claim reads the others.
        let (count, streams) = if max >= keys.len() {
            (max / keys.len(), keys.len())
        } else {
            block = block.min(Duration::from_millis(100));
            (1, max)
        };
        let on: Vec<(Priority, &Keys)> = keys[..streams].iter().map(|(l, k)| (*l, &**k)).collect();
        self.read_new(queue, &on, count, block, out).await
    }

    /// Reads up to `count` new entries of each of the streams of `keys` (each with its
    /// level), blocking up to `block`, and adds their deliveries to `out`.
    async fn read_new(
        &self,
        queue: &str,
        keys: &[(Priority, &Keys)],
        count: usize,
        block: Duration,
        mut out: Vec<Delivery<RedisReceipt>>,
    ) -> Result<Vec<Delivery<RedisReceipt>>, BrokerError> {
        let mut read = cmd("XREADGROUP");
        read.arg("GROUP")
            .arg(GROUP)
            .arg(&self.inner.consumer)
            .arg("COUNT")
            .arg(count);
        let blocking = !block.is_zero();
        if blocking {
            read.arg("BLOCK").arg(block.as_millis().max(1) as u64);
        }
        read.arg("STREAMS");
        for (_, k) in keys {
            read.arg(&k.stream);
        }
        for _ in keys {
            read.arg(">");
        }
        let mut c = if blocking {
            self.blocking_conn(queue).await?
        } else {
            self.conn()?
        };
        // Both reads, blocking or not, make a deleted stream again (it used to be only the
        // blocking one: the other failed every claim until a blocking read happened).
        let reply: Value = match read.query_async(&mut c).await {
            Ok(v) => v,
            Err(e) if e.to_string().contains("NOGROUP") => {
                // A stream was deleted under us: make them again.
                self.prepare(queue).await?;
                for (_, k) in keys {
                    self.prepare_stream(k).await?;
                }
                Value::Nil
            }
            Err(e) => return Err(self.err(e)),
        };
        for (stream, entries) in value::into_streams_reply(reply) {
            let Some((level, k)) = keys.iter().find(|(_, k)| k.stream == stream) else {
                tracing::error!(
                    queue,
                    stream,
                    "a read answered for a stream it did not ask for"
                );
                continue;
            };
            for (id, fields) in entries {
                if let Some(d) = self.delivery(k, *level, id, fields, 1).await? {
                    out.push(d);
                }
            }
        }
        Ok(out)
    }

    /// Reclaims entries idle past the lease (at most every quarter lease per queue).
    pub(crate) async fn reclaim(
        &self,
        keys: &Keys,
        level: Priority,
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
            .arg(if self.trims(keys) { "1" } else { "0" })
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
            if let Some(delivery) = self.delivery(keys, level, id, fields, d).await? {
                out.push(delivery);
            }
        }
        Ok(out)
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
        level: Priority,
        id: String,
        fields: Fields,
        deliveries: u64,
    ) -> Result<Option<Delivery<RedisReceipt>>, BrokerError> {
        // The entry's level is its stream's, whatever its field says (an entry added by
        // hand): its retry goes back there.
        let fields = entry::at_level(fields, level);
        // An entry without a `job_id` (added by hand) takes its entry id as its job id: the
        // delivery, its retry (a new entry), its dead letter and the CLI all show that one id.
        let fields = if entry::get(&fields, "job_id").is_some_and(|j| !j.is_empty()) {
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
        Ok(Some(Delivery::new(
            envelope,
            RedisReceipt {
                id,
                deliveries,
                fields,
                level,
            },
        )))
    }

    /// The cap of the mount that runs `kind` on `queue` (its own kind's mount, else the one
    /// for every kind), when that mount has a dead letter and `spent` attempts reach it. A
    /// fresh entry (`spent` 0, the common case) never does: no lock is taken.
    pub(crate) fn cap_reached(&self, queue: &str, kind: &str, spent: u32) -> Option<Cap> {
        if spent == 0 {
            return None;
        }
        let caps = lock(&self.inner.caps);
        let mounts = caps.get(queue)?;
        mounts
            .iter()
            .find(|c| c.kind.as_deref() == Some(kind))
            .or_else(|| mounts.iter().find(|c| c.kind.is_none()))
            .filter(|c| spent >= c.max_attempts)
            .cloned()
    }

    /// Moves due delayed jobs to the stream under the mover's lock ([`scripts::MOVE_DUE`]):
    /// when the next is due, the levels other than normal it moved jobs to, and the errors of
    /// the members it left where they were.
    pub(crate) async fn move_due(&self, keys: &Keys) -> Result<Moved, BrokerError> {
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
            return Ok(Moved {
                next: Some(self.now() + chrono::Duration::milliseconds(250)),
                ..Moved::default()
            });
        }
        let mut out = Moved::default();
        let result = async {
            loop {
                let mut call = scripts::MOVE_DUE.pick(self.allow_oom()).key(&keys.delayed);
                for level in Priority::ALL.iter().rev() {
                    call.key(&keys.at(*level).stream);
                }
                let now = self.now();
                let reply: Value = call
                    .key(&keys.dead)
                    .key(&keys.ids)
                    .arg(ms(now))
                    .arg(MOVE_BATCH)
                    .arg(now.to_rfc3339())
                    .arg(&keys.name)
                    .arg(DEAD_MAXLEN)
                    .arg(scripts::LATEST_DUE_MS)
                    .invoke_async(&mut c)
                    .await
                    .map_err(|e| self.err(e))?;
                let parts = value::array(&reply);
                let next = parts
                    .get(1)
                    .and_then(value::string)
                    .and_then(|s| s.parse::<f64>().ok());
                let mask = parts.get(2).and_then(value::int).unwrap_or(0);
                out.levels |= u8::try_from(mask & 0x1f).unwrap_or(0);
                self.note_trimmed(&keys.dead, parts.get(3).and_then(value::int).unwrap_or(0));
                let more = parts.get(4).and_then(value::int) == Some(1);
                out.errors.extend(
                    parts
                        .get(5)
                        .map(value::array)
                        .unwrap_or_default()
                        .iter()
                        .filter_map(value::string),
                );
                if !more {
                    out.next = next.and_then(|n| DateTime::<Utc>::from_timestamp_millis(n as i64));
                    return Ok(out);
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

    /// Makes the delayed mover of `queue` look by `due` (read at `now` on the broker's clock):
    /// a delayed job just published may be due before its next look.
    pub(crate) fn look_for_due_by(&self, queue: &str, due: DateTime<Utc>, now: DateTime<Utc>) {
        self.look_within(queue, (due - now).to_std().unwrap_or_default());
    }

    /// Makes the delayed mover of `queue` look within `delay` from now: a job just retried with
    /// that delay may be due before its next look.
    pub(crate) fn look_within(&self, queue: &str, delay: std::time::Duration) {
        if let Some(h) = lock(&self.inner.housekeeping).get_mut(queue) {
            // A delay too long for an instant needs no earlier look.
            let Some(at) = tokio::time::Instant::now().checked_add(delay) else {
                return;
            };
            h.next_delayed = Some(h.next_delayed.map_or(at, |t| t.min(at)));
        }
    }
}
