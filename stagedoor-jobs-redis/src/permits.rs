//! The permit pools of the global limits: a sorted set `stagedoor:permits:{<pool>}` of tokens
//! scored by when each runs out, taken and renewed by one script each.

use std::time::Duration;

use redis::cmd;
use stagedoor_jobs::broker::{BrokerError, Permits};

use crate::broker::{RedisBroker, ms};
use crate::scripts;

impl RedisBroker {
    /// The key of the permit pool `key` (in the pool's own hash slot).
    fn permits_key(&self, key: &str) -> String {
        format!("stagedoor:permits:{{{}{key}}}", self.namespace)
    }

    /// [`Locks::take_permits`](stagedoor_jobs::broker::Locks::take_permits) on Redis: one
    /// script, so takers on every node and process see one pool.
    pub(crate) async fn redis_take_permits(
        &self,
        key: &str,
        limit: u32,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<Permits, BrokerError> {
        let mut c = self.conn()?;
        let now = ms(self.now());
        let until = now + ttl.as_millis().max(1) as i64;
        let (taken, first): (i64, i64) = scripts::TAKE_PERMITS
            .key(self.permits_key(key))
            .arg(now)
            .arg(limit)
            .arg(until)
            .arg(PERMITS_KEPT_MS)
            .arg(tokens)
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(Permits {
            taken: usize::try_from(taken).unwrap_or(0).min(tokens.len()),
            next_free: u64::try_from(first).ok().map(Duration::from_millis),
        })
    }

    /// [`Locks::renew_permits`](stagedoor_jobs::broker::Locks::renew_permits) on Redis.
    pub(crate) async fn redis_renew_permits(
        &self,
        key: &str,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<usize, BrokerError> {
        if tokens.is_empty() {
            return Ok(0);
        }
        let mut c = self.conn()?;
        let now = ms(self.now());
        let held: i64 = scripts::RENEW_PERMITS
            .pick(self.allow_oom())
            .key(self.permits_key(key))
            .arg(now)
            .arg(now + ttl.as_millis().max(1) as i64)
            .arg(PERMITS_KEPT_MS)
            .arg(tokens)
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(usize::try_from(held).unwrap_or(0))
    }

    /// [`Locks::release_permits`](stagedoor_jobs::broker::Locks::release_permits) on Redis.
    pub(crate) async fn redis_release_permits(
        &self,
        key: &str,
        tokens: &[String],
    ) -> Result<(), BrokerError> {
        if tokens.is_empty() {
            return Ok(());
        }
        let mut c = self.conn()?;
        let _: i64 = cmd("ZREM")
            .arg(self.permits_key(key))
            .arg(tokens)
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }
}

/// How long a permit pool's key outlives its newest permit (clocks of workers differ a little).
const PERMITS_KEPT_MS: i64 = 60_000;
