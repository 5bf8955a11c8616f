//! Claiming: new entries read by the group (blocking up to the wait), entries idle past the
//! lease reclaimed, delayed jobs that are due moved to the stream by the mover, and each
//! entry made a delivery (with its delivery count and where its spent attempts were read) or,
//! when it cannot be read as a job, an unreadable item. What becomes of either is the
//! runtime's decision (`stagedoor-jobs/src/runtime/arrival.rs`, `runtime/unreadable.rs`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::{Value, cmd};
use stagedoor_jobs::Priority;
use stagedoor_jobs::broker::{BrokerError, ClaimOrder, Claimed, Delivery, Unreadable};
use stagedoor_jobs::kit::lock;

use crate::broker::{DEAD_MAXLEN, GROUP, RedisBroker, RedisReceipt, ms};
use crate::conn::RESPONSE_TIMEOUT;
use crate::entry::{self, Fields};
use crate::keys::Keys;
use crate::read_conn::ReadError;
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
    /// in `broker.rs` calls this): reclaimed entries, then new ones of each level in use.
    pub(crate) async fn redis_claim(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        order: ClaimOrder,
    ) -> Result<Claimed<RedisReceipt>, BrokerError> {
        // The priority levels to read, highest first: normal alone for a queue that never saw
        // another (its claim is one read, as it always was).
        let mut levels = self.levels_in_use(queue).await?;
        let now = tokio::time::Instant::now();
        let hk = self.housekeeping(queue);
        let mut out = Claimed::default();
        let reclaimed_at = self
            .reclaim_levels(queue, &levels, max, hk.reclaimed_at, &mut out)
            .await?;
        // Delayed jobs that are due, when the last look said one would be.
        let next_delayed = match hk.next_delayed {
            Some(t) if now < t => Some(t),
            _ => Some(self.move_delayed(queue, &mut levels, now).await?),
        };
        self.update_housekeeping(queue, |h| {
            h.reclaimed_at = reclaimed_at;
            h.next_delayed = next_delayed;
        });
        if out.taken() >= max {
            return Ok(out);
        }
        // New entries: block until one arrives, the wait ends, or a delayed job is due.
        let mut block = if out.is_empty() { wait } else { Duration::ZERO };
        if let Some(t) = next_delayed {
            block = block.min(t.saturating_duration_since(tokio::time::Instant::now()));
        }
        self.read_levels(queue, &levels, (max, block), order, out)
            .await
    }

    /// Entries whose workers went quiet past the lease, every quarter lease, added to `out`;
    /// returns when this queue last reclaimed. Not until this broker has talked to the server
    /// for a whole lease without a connection error: after an outage (a server restarting, a
    /// network cut) every lease looks lapsed, and the workers holding those entries renew them
    /// within a third of a lease of the server answering again. Reclaiming sooner would run
    /// their jobs twice. Fresh entries are read at once all the same.
    async fn reclaim_levels(
        &self,
        queue: &str,
        levels: &[Priority],
        max: usize,
        last: Option<tokio::time::Instant>,
        out: &mut Claimed<RedisReceipt>,
    ) -> Result<Option<tokio::time::Instant>, BrokerError> {
        let now = tokio::time::Instant::now();
        if !(last.is_none_or(|t| now.duration_since(t) >= self.lease / 4)
            && self.inner.errors.quiet_for(self.lease))
        {
            return Ok(last);
        }
        // The server's side of the same rule: a failover or restart the broker did not see as
        // an error (the Cluster client retries through one) waits a lease too.
        if !self.served_for_a_lease(&self.cached_keys(queue)).await? {
            return Ok(Some(now));
        }
        for level in levels {
            if out.taken() >= max {
                break;
            }
            let keys = self.keys_at(queue, *level);
            match self.reclaim(&keys, *level, max - out.taken()).await {
                Ok(got) => {
                    out.deliveries.extend(got.deliveries);
                    out.unreadable.extend(got.unreadable);
                }
                // A script refused (a key of the wrong type): logged, and the new entries are
                // read all the same.
                Err(BrokerError::Backend(e)) => tracing::error!(
                    queue,
                    "reclaiming the entries idle past their lease failed: {e}; the new entries of `{queue}` are still claimed"
                ),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(now))
    }

    /// Runs the delayed mover of `queue` (adding to `levels` the levels it moved jobs to that
    /// were not read yet) and answers when to look again. The mover failing (a delayed set of
    /// the wrong type, a member it could not move) is logged and looked at again a second
    /// later; it never stops the claim of the entries already in the stream.
    async fn move_delayed(
        &self,
        queue: &str,
        levels: &mut Vec<Priority>,
        now: tokio::time::Instant,
    ) -> Result<tokio::time::Instant, BrokerError> {
        let (next, stuck) = match self.move_due(&self.cached_keys(queue)).await {
            Ok(Moved {
                next,
                levels: moved_to,
                errors,
            }) => {
                // A delayed job moved to a level's stream that did not exist: read it from now.
                if moved_to & !self.housekeeping(queue).levels != 0 {
                    *levels = self.add_levels(queue, moved_to).await?;
                }
                for e in &errors {
                    tracing::error!(queue, "the delayed mover could not move a job: {e}");
                }
                (next, !errors.is_empty())
            }
            Err(e) => {
                tracing::error!(
                    queue,
                    "the delayed mover failed: {e}; no delayed job of `{queue}` moves until it is fixed (the jobs already in its stream are still claimed)"
                );
                (None, true)
            }
        };
        Ok(match next {
            Some(t) if !stuck => {
                let d = (t - self.now()).to_std().unwrap_or(Duration::ZERO);
                now + d.min(Duration::from_secs(1))
            }
            _ => now + Duration::from_secs(1),
        })
    }

    /// The new entries of `levels`, up to `max` taken in all (with `out`), blocking up to
    /// `block` when none is there: a single level in one read; several, the highest first,
    /// each read without blocking until the claim is full. A claim in due order (the
    /// runtime's fair turn) starts at the level whose oldest waiting job is the oldest
    /// instead, so that no level waits forever behind a busier one.
    async fn read_levels(
        &self,
        queue: &str,
        levels: &[Priority],
        (max, mut block): (usize, Duration),
        order: ClaimOrder,
        mut out: Claimed<RedisReceipt>,
    ) -> Result<Claimed<RedisReceipt>, BrokerError> {
        let mut keys: Vec<(Priority, Arc<Keys>)> = levels
            .iter()
            .map(|l| (*l, self.keys_at(queue, *l)))
            .collect();
        if let [(level, k)] = keys.as_slice() {
            let count = max - out.taken();
            return self
                .read_new(queue, &[(*level, k)], count, block, out)
                .await;
        }
        if order == ClaimOrder::Due {
            self.oldest_first(&mut keys).await?;
        }
        for (level, k) in &keys {
            if out.taken() >= max {
                return Ok(out);
            }
            let count = max - out.taken();
            out = self
                .read_new(queue, &[(*level, k)], count, Duration::ZERO, out)
                .await?;
        }
        if !out.is_empty() || block.is_zero() || keys.is_empty() {
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
        let on: Vec<(Priority, &Keys)> =
            keys.iter().take(streams).map(|(l, k)| (*l, &**k)).collect();
        self.read_new(queue, &on, count, block, out).await
    }

    /// Puts first in `keys` the level whose oldest waiting entry is the oldest
    /// ([`scripts::OLDEST_WAITING`]).
    async fn oldest_first(&self, keys: &mut Vec<(Priority, Arc<Keys>)>) -> Result<(), BrokerError> {
        let mut call = scripts::OLDEST_WAITING.prepare_invoke();
        for (_, k) in keys.iter() {
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
        Ok(())
    }
    /// Reads up to `count` new entries of each of the streams of `keys` (each with its
    /// level), blocking up to `block`, and adds what they are to `out`.
    async fn read_new(
        &self,
        queue: &str,
        keys: &[(Priority, &Keys)],
        count: usize,
        block: Duration,
        mut out: Claimed<RedisReceipt>,
    ) -> Result<Claimed<RedisReceipt>, BrokerError> {
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
        let reply = match self.read_conn(queue) {
            Some(r) => r
                .read(&read.get_packed_command(), block + RESPONSE_TIMEOUT)
                .await
                .map_err(|e| match e {
                    ReadError::Io(e) => redis::RedisError::from(e),
                    ReadError::Server(e) => e,
                }),
            None => {
                let mut c = if blocking {
                    self.blocking_conn(queue).await?
                } else {
                    self.conn()?
                };
                read.query_async(&mut c)
                    .await
                    .map(value::into_streams_reply)
            }
        };
        // Both reads, blocking or not, make a deleted stream again (it used to be only the
        // blocking one: the other failed every claim until a blocking read happened).
        let reply = match reply {
            Ok(v) => v,
            Err(e) if e.to_string().contains("NOGROUP") => {
                // A stream was deleted under us: make them again.
                self.redis_prepare(queue).await?;
                for (_, k) in keys {
                    self.prepare_stream(k).await?;
                }
                Vec::new()
            }
            Err(e) => return Err(self.err(e)),
        };
        for (stream, entries) in reply {
            let Some((level, k)) = keys.iter().find(|(_, k)| k.stream == stream) else {
                tracing::error!(
                    queue,
                    stream,
                    "a read answered for a stream it did not ask for"
                );
                continue;
            };
            for (id, fields) in entries {
                self.take_entry(k, *level, (id, fields, 1), &mut out);
            }
        }
        Ok(out)
    }

    /// Reclaims entries idle past the lease (at most every quarter lease per queue), each with
    /// its delivery count ([`scripts::RECLAIM`]).
    pub(crate) async fn reclaim(
        &self,
        keys: &Keys,
        level: Priority,
        max: usize,
    ) -> Result<Claimed<RedisReceipt>, BrokerError> {
        let mut c = self.conn()?;
        let reply: redis::RedisResult<Value> = scripts::RECLAIM
            .pick(self.allow_oom())
            .key(&keys.stream)
            .key(&keys.ids)
            .arg(GROUP)
            .arg(&self.inner.consumer)
            .arg(self.lease.as_millis() as u64)
            .arg(max)
            .arg(if self.trims(keys) { "1" } else { "0" })
            .invoke_async(&mut c)
            .await;
        let mut out = Claimed::default();
        let reply = match reply {
            Ok(v) => v,
            // The stream or its group is gone (a server restarted without persistence, a
            // FLUSHALL): make them again. Failing here instead would fail every claim from now
            // on, since the claim never got as far as the read that re-creates the group.
            Err(e) if e.to_string().contains("NOGROUP") => {
                self.redis_prepare(&keys.name).await?;
                return Ok(out);
            }
            Err(e) => return Err(self.err(e)),
        };
        // {id, fields, deliveries} of each entry claimed
        for item in value::array(&reply) {
            let [id, f, d] = value::array(item) else {
                continue;
            };
            let (Some(id), fields, Some(d)) = (value::string(id), value::fields(f), value::int(d))
            else {
                continue;
            };
            let d = d.max(1) as u64;
            self.take_entry(keys, level, (id, fields, d), &mut out);
        }
        Ok(out)
    }

    /// Adds entry `id` of `keys`' stream (at `level`), delivered `deliveries` times since it
    /// was last settled, to `out`: a delivery reporting that count and where its spent attempts
    /// were read (its `attempts` field), or, when it cannot be read as a job (no `kind`, no
    /// `payload`, an `attempts` field that is not a whole number of 0 or more), an unreadable
    /// item whose error names what is wrong. The runtime decides what becomes of each.
    pub(crate) fn take_entry(
        &self,
        keys: &Keys,
        level: Priority,
        (id, fields, deliveries): (String, Fields, u64),
        out: &mut Claimed<RedisReceipt>,
    ) {
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
        match decoded {
            Ok((spent, envelope)) => {
                let from = spent_from(&id, &fields, spent);
                let receipt = RedisReceipt {
                    id,
                    deliveries,
                    fields,
                    level,
                };
                let delivered = u32::try_from(deliveries).unwrap_or(u32::MAX);
                let d = Delivery::new(envelope, receipt).with_delivered(delivered);
                out.deliveries.push(match from {
                    Some(f) => d.with_spent_from(f),
                    None => d,
                });
            }
            Err(why) => {
                let error = format!(
                    "malformed entry {id} on `{}`: {why}; it was not run (replay it once fixed)",
                    keys.name
                );
                let kind = entry::text(&fields, "kind").filter(|k| !k.is_empty());
                let receipt = RedisReceipt {
                    id,
                    deliveries,
                    fields,
                    level,
                };
                out.unreadable.push(Unreadable {
                    error,
                    kind,
                    receipt,
                });
            }
        }
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

/// Where the `spent` attempts of entry `id` were read, for the runtime's message when they
/// reach a cap on arrival: its `attempts` field as it is, and what it was counted as when that
/// is not the same number. `None` for a fresh entry (nothing spent).
fn spent_from(id: &str, fields: &Fields, spent: u32) -> Option<String> {
    if spent == 0 {
        return None;
    }
    let raw = entry::get(fields, "attempts").map_or_else(String::new, entry::shown);
    let counted = if raw == spent.to_string() {
        String::new()
    } else {
        format!(", counted as {spent}, the most an attempt counter holds")
    };
    Some(format!(
        "by the `attempts` field (`{raw}`{counted}) of entry {id}"
    ))
}
