//! [`Locks`]: the scheduler's locks (one holder per tick) and each schedule's last enqueued
//! tick, in the bookkeeping tables (`stagedoor_locks`, `stagedoor_schedules`; their statements
//! are in `locks.rs`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;
use stagedoor_jobs::broker::{BrokerError, Locks, Permits};

use super::SqlxRoute;
use crate::dialect::sealed::Value;
use crate::dialect::{Dialect, acquire, db_err};
use crate::locks::{DROP_OLD_LOCKS, LAST_TICK, MARK_TICK, UNLOCK, ensure_bookkeeping, take_lock};

impl<DB: Dialect, Row: Inbox> Locks for SqlxRoute<DB, Row> {
    async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, BrokerError> {
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let now = self.broker.now();
        let until = now + stagedoor_jobs::broker::chrono_duration(ttl);
        let mut conn = acquire(pool).await?;
        let taken = take_lock::<DB>(&mut conn, key, token, until, now).await?;
        // Locks that ran out long ago are only history: keep the table small.
        let old = vec![Value::Time(Some(now - chrono::Duration::hours(1)))];
        DB::run(&mut conn, DROP_OLD_LOCKS.to_owned(), old)
            .await
            .map_err(db_err)?;
        Ok(taken)
    }

    async fn last_tick(&self, schedule: &str) -> Result<Option<DateTime<Utc>>, BrokerError> {
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let mut conn = acquire(pool).await?;
        let binds = vec![Value::Text(Some(schedule.to_owned()))];
        let rows = DB::fetch(&mut conn, LAST_TICK.to_owned(), binds)
            .await
            .map_err(db_err)?;
        match rows.first() {
            Some(row) => DB::time(row, 0).map_err(db_err),
            None => Ok(None),
        }
    }

    async fn mark_tick(&self, schedule: &str, tick: DateTime<Utc>) -> Result<(), BrokerError> {
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let mut conn = acquire(pool).await?;
        let binds = vec![
            Value::Text(Some(schedule.to_owned())),
            Value::Time(Some(tick)),
        ];
        DB::run(&mut conn, MARK_TICK.to_owned(), binds)
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn take_permits(
        &self,
        key: &str,
        limit: u32,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<Permits, BrokerError> {
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let clock = self.broker.clock();
        crate::locks::take_permits::<DB>(pool, key, limit, tokens, &clock, ttl).await
    }

    async fn renew_permits(
        &self,
        key: &str,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<usize, BrokerError> {
        if tokens.is_empty() {
            return Ok(0);
        }
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let now = self.broker.now();
        let until = now + stagedoor_jobs::broker::chrono_duration(ttl);
        crate::locks::renew_permits::<DB>(pool, key, tokens, now, until).await
    }

    async fn release_permits(&self, key: &str, tokens: &[String]) -> Result<(), BrokerError> {
        if tokens.is_empty() {
            return Ok(());
        }
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        crate::locks::release_permits::<DB>(pool, key, tokens).await
    }

    async fn unlock(&self, key: &str, token: &str) -> Result<(), BrokerError> {
        let mut conn = acquire(self.pool()?).await?;
        let binds = vec![
            Value::Text(Some(key.to_owned())),
            Value::Text(Some(token.to_owned())),
        ];
        DB::run(&mut conn, UNLOCK.to_owned(), binds)
            .await
            .map_err(db_err)?;
        Ok(())
    }
}
