//! The scheduler's locks and ticks: a lock is a key set `NX` with a time to live and a
//! token, a schedule's last tick a key only ever raised. (The permit pools of the global
//! limits are in `permits.rs`.)

use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::cmd;
use stagedoor_jobs::broker::BrokerError;

use crate::broker::{RedisBroker, ms};
use crate::scripts;

impl RedisBroker {
    /// [`Locks::try_lock`](stagedoor_jobs::broker::Locks::try_lock) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_try_lock(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        let mut c = self.conn()?;
        let got: Option<String> = cmd("SET")
            .arg(format!("stagedoor:lock:{{{}{key}}}", self.namespace))
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(got.is_some())
    }

    /// [`Locks::last_tick`](stagedoor_jobs::broker::Locks::last_tick) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_last_tick(
        &self,
        schedule: &str,
    ) -> Result<Option<DateTime<Utc>>, BrokerError> {
        let mut c = self.conn()?;
        let v: Option<i64> = cmd("GET")
            .arg(format!("stagedoor:sched:{{{}{schedule}}}", self.namespace))
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(v.and_then(DateTime::<Utc>::from_timestamp_millis))
    }

    /// [`Locks::mark_tick`](stagedoor_jobs::broker::Locks::mark_tick) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_mark_tick(
        &self,
        schedule: &str,
        tick: DateTime<Utc>,
    ) -> Result<(), BrokerError> {
        let mut c = self.conn()?;
        let _: i64 = scripts::SET_MAX
            .key(format!("stagedoor:sched:{{{}{schedule}}}", self.namespace))
            .arg(ms(tick))
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// [`Locks::unlock`](stagedoor_jobs::broker::Locks::unlock) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn redis_unlock(&self, key: &str, token: &str) -> Result<(), BrokerError> {
        let mut c = self.conn()?;
        let _: i64 = scripts::UNLOCK
            .key(format!("stagedoor:lock:{{{}{key}}}", self.namespace))
            .arg(token)
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(())
    }
}
