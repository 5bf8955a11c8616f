//! The server's side of the outage rule: no entry is reclaimed until the process now serving
//! the queue's slot has served it for a whole lease.
//!
//! The broker's own rule ([`Errors::quiet_for`](crate::errors::Errors::quiet_for)) waits a
//! lease after a connection error it saw. It cannot see every outage: the Cluster client
//! retries inside redis-rs through a failover (a replica promoted after its master died), so
//! the broker's calls only look slow; and a worker that happened to call nothing during a
//! restart saw no error at all. Yet after either, every entry whose holder could not renew
//! looks idle past the lease, and reclaiming it at once runs its job a second time while its
//! holder still runs it.
//!
//! So the reclaim asks the server first. The mark `{q}:serving` (a hash) holds the `run_id` of
//! the process that last served the queue and the server time (ms) it first did. A different
//! `run_id` (a promoted replica, a restarted server: each is a new process) means the queue
//! changed hands: the mark is rewritten with now, and nothing is reclaimed until a lease has
//! passed since, by which time every live holder has renewed (they renew every third of a
//! lease). A mark that is not ours (a key of another type, a value that is not a time) is
//! rewritten the same way: it can delay a reclaim by one lease, never stop it.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use stagedoor_jobs::broker::BrokerError;

use crate::broker::RedisBroker;
use crate::keys::Keys;
use crate::scripts::OomScript;

/// KEYS: the queue's serving mark. ARGV: the lease (ms). Returns how many ms remain before
/// entries may be reclaimed (0: they may be now).
static SERVING: LazyLock<OomScript> = LazyLock::new(|| {
    OomScript::new(
        r"
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or '?'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
local cur = redis.pcall('HMGET', KEYS[1], 'run_id', 'since')
if type(cur) == 'table' and cur.err then
  redis.call('DEL', KEYS[1])
  cur = {false, false}
end
local since = tonumber(cur[2])
if cur[1] ~= run or not since or since > now then
  redis.call('HSET', KEYS[1], 'run_id', run, 'since', now)
  return lease
end
if now - since >= lease then return 0 end
return lease - (now - since)
",
    )
});

/// Whether the fallback was said (once per process).
static WARNED: AtomicBool = AtomicBool::new(false);

impl RedisBroker {
    /// Whether the server now serving `keys`' queue has done so for a whole lease, so that an
    /// entry idle past the lease was really abandoned (see the module's notes). An error
    /// answers no (and is reported as the claim's: the reclaim waits for the next look).
    ///
    /// A server that refuses the script for another reason than a connection (`INFO` renamed
    /// away, say) falls back to the broker's own rule, said once at WARN: the reclaim must
    /// never stop for it.
    pub(crate) async fn served_for_a_lease(&self, keys: &Keys) -> Result<bool, BrokerError> {
        let reply: redis::RedisResult<i64> = SERVING
            .pick(self.allow_oom())
            .key(keys.serving())
            .arg(u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX))
            .invoke_async(&mut self.conn()?)
            .await;
        let remaining = match reply {
            Ok(r) => r,
            Err(e) => {
                return match self.err(e) {
                    e @ BrokerError::Connection(_) => Err(e),
                    e => {
                        if !WARNED.swap(true, Ordering::Relaxed) {
                            tracing::warn!(
                                queue = keys.name,
                                error = %e,
                                "the server refused the check of who serves the queue (is INFO renamed or disabled?): entries idle past the lease are reclaimed after the broker's own outage rule only, so a Cluster failover may run a job twice; allow INFO in scripts to fix it"
                            );
                        }
                        Ok(true)
                    }
                };
            }
        };
        if remaining > 0 {
            tracing::debug!(
                queue = keys.name,
                wait = ?Duration::from_millis(remaining.unsigned_abs()),
                "the queue's server has served it for less than a lease (a failover or a restart): no reclaim yet"
            );
        }
        Ok(remaining <= 0)
    }
}
