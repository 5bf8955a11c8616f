//! Inspection: a queue's counts ([`Inspect::stats`](stagedoor_jobs::broker::Inspect::stats)),
//! the queues there are, a dead stream's length, when the next delayed job is due, and the
//! server's time.

use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::{Value, cmd};
use stagedoor_jobs::Priority;
use stagedoor_jobs::broker::{BrokerError, QueueStats};

use crate::broker::{GROUP, RedisBroker, ms};
use crate::conn::Conn;
use crate::entry;
use crate::keys::Keys;
use crate::value;

impl RedisBroker {
    /// [`Broker::server_time`](stagedoor_jobs::broker::Broker::server_time) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_server_time(&self) -> Result<Option<DateTime<Utc>>, BrokerError> {
        let mut c = self.conn()?;
        let (secs, micros): (i64, i64) = cmd("TIME")
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        let nanos = u32::try_from(micros.clamp(0, 999_999) * 1_000).unwrap_or(0);
        match DateTime::<Utc>::from_timestamp(secs, nanos) {
            Some(t) => Ok(Some(t)),
            None => Err(BrokerError::Backend(format!(
                "Redis at `{}` answered TIME with {secs} s {micros} µs, not a time",
                self.inner.url_for_messages
            ))),
        }
    }

    /// [`Inspect::stats`](stagedoor_jobs::broker::Inspect::stats) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_stats(&self, queue: &str) -> Result<QueueStats, BrokerError> {
        let keys = self.keys(queue);
        let mut c = self.conn()?;
        if Keys::is_dead(queue) {
            let len: i64 = cmd("XLEN")
                .arg(&keys.stream)
                .query_async(&mut c)
                .await
                .map_err(|e| self.err(e))?;
            return Ok(QueueStats {
                ready: len.max(0) as u64,
                ..QueueStats::default()
            });
        }
        // The queue's stream and those of the other priority levels that exist: the
        // counts add up, the oldest is the oldest of all; the delayed set is the queue's one.
        let levels = crate::broker::levels_of(self.levels_present(&keys).await?);
        let mut total = self.stream_stats(&keys).await?;
        for level in levels {
            if level == Priority::NORMAL {
                continue;
            }
            let s = self.stream_stats(&keys.at(level)).await?;
            total.ready += s.ready;
            total.pending += s.pending;
            total.oldest = total.oldest.max(s.oldest);
        }
        Ok(total)
    }

    /// The counts of `keys`' stream (and the queue's delayed set).
    async fn stream_stats(&self, keys: &Keys) -> Result<QueueStats, BrokerError> {
        let mut c = self.conn()?;
        let mut pipe = redis::pipe();
        pipe.cmd("XLEN").arg(&keys.stream);
        pipe.cmd("XPENDING").arg(&keys.stream).arg(GROUP);
        pipe.cmd("ZCARD").arg(&keys.delayed);
        pipe.cmd("XINFO").arg("GROUPS").arg(&keys.stream);
        // Deliveries idle past the lease: their worker is gone, and the next claim reclaims
        // them, so they count as ready, not pending (bounded: at most 1,000 are counted).
        pipe.cmd("XPENDING")
            .arg(&keys.stream)
            .arg(GROUP)
            .arg("IDLE")
            .arg(self.lease.as_millis() as u64)
            .arg("-")
            .arg("+")
            .arg(1000);
        let replies: Vec<Value> = match pipe.query_async(&mut c).await {
            Ok(r) => r,
            // No stream yet (nothing published, no worker started): an empty queue.
            Err(e)
                if e.to_string().contains("no such key") || e.to_string().contains("NOGROUP") =>
            {
                return self.groupless_stats(&mut c, keys).await;
            }
            Err(e) => return Err(self.err(e)),
        };
        let len = replies.first().and_then(value::int).unwrap_or(0).max(0) as u64;
        let pending = replies
            .get(1)
            .map(|p| value::array(p).first().and_then(value::int).unwrap_or(0))
            .unwrap_or(0)
            .max(0) as u64;
        let delayed = replies.get(2).and_then(value::int).unwrap_or(0).max(0) as u64;
        let expired = (replies.get(4).map_or(0, |v| value::array(v).len()) as u64).min(pending);
        let group = replies.get(3).and_then(|groups| {
            value::array(groups).iter().find_map(|g| {
                let f = value::fields(g);
                (entry::text(&f, "name").as_deref() == Some(GROUP)).then_some(f)
            })
        });
        let last_delivered = group
            .as_ref()
            .and_then(|f| entry::text(f, "last-delivered-id"));
        // Entries not yet delivered: the group's lag (Redis 7), which counts right while
        // settled entries wait for the trim below the oldest pending one; on Redis 6.2 (every
        // settled entry deleted) and when the server cannot tell the lag, the entries that are
        // not pending.
        let lag = group
            .as_ref()
            .and_then(|f| entry::text(f, "lag"))
            .and_then(|l| l.parse::<u64>().ok());
        // The lag is never more than the entries not pending: after a Cluster failover the
        // promoted replica's group can report a lag its stream no longer has (16 "ready" jobs
        // on an empty queue, seen in tests/redis_failover.rs).
        let not_pending = len.saturating_sub(pending);
        let ready = lag.map_or(not_pending, |l| l.min(not_pending));
        // The oldest entry not yet delivered to the group is the first after its last-delivered id.
        let (ready, oldest) = if ready > 0 {
            self.waiting(&mut c, keys, last_delivered, lag, ready)
                .await?
        } else {
            (ready, None)
        };
        Ok(QueueStats {
            ready: ready + expired,
            pending: pending - expired,
            delayed,
            oldest,
        })
    }

    /// The entries of `keys`' stream not yet delivered to the group (`ready` as counted from
    /// the group's `lag` or the entries not pending, more than 0) made exact, and how long the
    /// oldest of them has waited: read from the entries after the group's `last_delivered` id.
    async fn waiting(
        &self,
        c: &mut Conn,
        keys: &Keys,
        last_delivered: Option<String>,
        lag: Option<u64>,
        mut ready: u64,
    ) -> Result<(u64, Option<Duration>), BrokerError> {
        let mut oldest = None;
        // With no lag to go by (Redis 6.2; a server that reloaded its data, whose group no
        // longer knows how many entries it read), the entries after the last-delivered id
        // are counted, up to `UNKNOWN_LAG_COUNTED`: "not pending" would also count settled
        // entries waiting for the trim.
        let count = if lag.is_none() {
            UNKNOWN_LAG_COUNTED + 1
        } else {
            1
        };
        let start = last_delivered.map_or("-".to_owned(), |id| format!("({id}"));
        let reply: Value = cmd("XRANGE")
            .arg(&keys.stream)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(c)
            .await
            .map_err(|e| self.err(e))?;
        let after = value::entries(&reply);
        if lag.is_none() && (after.len() as u64) <= UNKNOWN_LAG_COUNTED {
            ready = ready.min(after.len() as u64);
        }
        if let Some((id, _)) = after.first() {
            let added: i64 = id
                .split('-')
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            oldest = Some(Duration::from_millis((ms(self.now()) - added).max(0) as u64));
        } else {
            // Nothing after the group's last-delivered id: nothing waits, whatever the
            // lag said.
            ready = 0;
        }
        Ok((ready, oldest))
    }

    /// The counts of `keys`' stream when it or its group does not exist yet (nothing
    /// published, no worker started): its entries are ready, and the queue's delayed set.
    async fn groupless_stats(&self, c: &mut Conn, keys: &Keys) -> Result<QueueStats, BrokerError> {
        let delayed: i64 = cmd("ZCARD")
            .arg(&keys.delayed)
            .query_async(c)
            .await
            .map_err(|e| self.err(e))?;
        let len: i64 = cmd("XLEN")
            .arg(&keys.stream)
            .query_async(c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(QueueStats {
            ready: len.max(0) as u64,
            delayed: delayed.max(0) as u64,
            ..QueueStats::default()
        })
    }

    /// [`Inspect::queues`](stagedoor_jobs::broker::Inspect::queues) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_queues(&self) -> Result<Vec<String>, BrokerError> {
        // Every stream under this namespace: `{ns jobs}` is the queue `jobs`, `{ns jobs}:dead`
        // its dead stream. On a Redis Cluster SCAN answers for one node: name the queue
        // there instead of listing.
        let mut c = self.conn()?;
        let pattern = format!("{{{}*", self.namespace);
        let mut names = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .arg("TYPE")
                .arg("stream")
                .query_async(&mut c)
                .await
                .map_err(|e| self.err(e))?;
            for k in keys {
                if let Some(rest) = k.strip_prefix('{')
                    && let Some(end) = rest.find('}')
                {
                    let base = rest[..end]
                        .strip_prefix(self.namespace.as_str())
                        .unwrap_or(&rest[..end]);
                    let suffix = &rest[end + 1..];
                    // A priority level's stream is part of its queue.
                    let suffix = if Keys::is_level_suffix(suffix) {
                        ""
                    } else {
                        suffix
                    };
                    names.push(format!("{base}{suffix}"));
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// [`DeadLetters::dead_len`](stagedoor_jobs::broker::DeadLetters::dead_len) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_dead_len(&self, dead: &str) -> Result<u64, BrokerError> {
        let keys = self.keys(dead);
        let mut c = self.conn()?;
        let len: i64 = cmd("XLEN")
            .arg(&keys.dead)
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(len.max(0) as u64)
    }

    /// [`Inspect::next_due`](stagedoor_jobs::broker::Inspect::next_due) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_next_due(&self, queue: &str) -> Option<DateTime<Utc>> {
        let keys = self.keys(queue);
        let mut c = self.conn().ok()?;
        let reply: Value = cmd("ZRANGE")
            .arg(&keys.delayed)
            .arg(0)
            .arg(0)
            .arg("WITHSCORES")
            .query_async(&mut c)
            .await
            .ok()?;
        let score = value::array(&reply)
            .get(1)
            .and_then(value::string)?
            .parse::<f64>()
            .ok()?;
        DateTime::<Utc>::from_timestamp_millis(score as i64)
    }
}

/// How many entries after a group's last-delivered id `stats` counts when the server cannot
/// tell the group's lag; past it, the entries not pending are the estimate.
const UNKNOWN_LAG_COUNTED: u64 = 1_000;
