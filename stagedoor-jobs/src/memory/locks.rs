//! The in-memory broker's [`Locks`]: the scheduler's locks and last ticks, and the permit
//! pools of the global limits.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::MemoryBroker;
use crate::broker::{BrokerError, Locks, Permits};
use crate::clock::later;

impl Locks for MemoryBroker {
    async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, BrokerError> {
        let now = self.now();
        let mut mem = self.mem();
        match mem.locks.get(key) {
            Some((_, until)) if *until > now => Ok(false),
            _ => {
                mem.locks.retain(|_, (_, until)| *until > now);
                mem.locks
                    .insert(key.to_owned(), (token.to_owned(), later(now, ttl)));
                Ok(true)
            }
        }
    }

    async fn last_tick(&self, schedule: &str) -> Result<Option<DateTime<Utc>>, BrokerError> {
        Ok(self.mem().ticks.get(schedule).copied())
    }

    async fn mark_tick(&self, schedule: &str, tick: DateTime<Utc>) -> Result<(), BrokerError> {
        let mut mem = self.mem();
        let t = mem.ticks.entry(schedule.to_owned()).or_insert(tick);
        *t = (*t).max(tick);
        Ok(())
    }

    async fn unlock(&self, key: &str, token: &str) -> Result<(), BrokerError> {
        let mut mem = self.mem();
        if mem.locks.get(key).is_some_and(|(t, _)| t == token) {
            mem.locks.remove(key);
        }
        Ok(())
    }

    async fn take_permits(
        &self,
        key: &str,
        limit: u32,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<Permits, BrokerError> {
        let now = self.now();
        let mut mem = self.mem();
        let pool = mem.permits.entry(key.to_owned()).or_default();
        pool.retain(|_, until| *until > now);
        let free = (limit as usize).saturating_sub(pool.len());
        let taken = free.min(tokens.len());
        let until = later(now, ttl);
        for t in &tokens[..taken] {
            pool.insert(t.clone(), until);
        }
        let next_free = if taken == 0 {
            pool.values()
                .min()
                .and_then(|first| (*first - now).to_std().ok())
        } else {
            None
        };
        Ok(Permits { taken, next_free })
    }

    async fn renew_permits(
        &self,
        key: &str,
        tokens: &[String],
        ttl: Duration,
    ) -> Result<usize, BrokerError> {
        let now = self.now();
        let until = later(now, ttl);
        let mut mem = self.mem();
        let Some(pool) = mem.permits.get_mut(key) else {
            return Ok(0);
        };
        let mut held = 0;
        for t in tokens {
            if let Some(u) = pool.get_mut(t)
                && *u > now
            {
                *u = until;
                held += 1;
            }
        }
        Ok(held)
    }

    async fn release_permits(&self, key: &str, tokens: &[String]) -> Result<(), BrokerError> {
        let mut mem = self.mem();
        if let Some(pool) = mem.permits.get_mut(key) {
            for t in tokens {
                pool.remove(t);
            }
        }
        Ok(())
    }
}
