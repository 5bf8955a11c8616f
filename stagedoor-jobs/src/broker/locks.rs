//! [`Locks`]: the scheduler's bookkeeping (locks, last ticks) and the permit pools of the
//! global limits, with [`Permits`].

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{BrokerError, Inspect};

/// The scheduler's bookkeeping: locks with an owner and a time to live, and each schedule's
/// last tick (the memory of the scheduler across restarts of every worker).
pub trait Locks: Inspect {
    /// Takes the lock `key` for `ttl` if nobody holds it, recording `token` as the owner
    /// (scheduler ticks). `Ok(true)` when taken.
    fn try_lock(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, BrokerError>> + Send;

    /// Releases the lock `key` if `token` still owns it; another owner's lock is left alone.
    fn unlock(
        &self,
        key: &str,
        token: &str,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// The latest tick of `schedule` recorded by [`mark_tick`](Locks::mark_tick): the
    /// scheduler's memory across restarts of every worker (missed ticks are counted from it).
    fn last_tick(
        &self,
        schedule: &str,
    ) -> impl Future<Output = Result<Option<DateTime<Utc>>, BrokerError>> + Send;

    /// Records that `schedule`'s tick `tick` was enqueued; the record only moves forward.
    fn mark_tick(
        &self,
        schedule: &str,
        tick: DateTime<Utc>,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send;

    /// Takes permits of the pool `key`, which holds at most `limit` at once across every
    /// process: as many of `tokens` as are free (in order), each held for `ttl` (by the
    /// backend's clock, as leases are) unless renewed or released. One atomic step: two
    /// callers together never hold more than `limit`. The global limits of a queue are pools
    /// (`.global_concurrency(n)`: a permit per running job, renewed with its lease and released
    /// at its settlement; `.rate_limit(r, per)`: a permit per started job, held `per` and never
    /// released, so no window of `per` sees more than `r` starts).
    ///
    /// `tokens` may be empty: the startup check calls it so to learn that the backend keeps
    /// permits. The default keeps none and fails, naming the fix.
    fn take_permits(
        &self,
        key: &str,
        limit: u32,
        tokens: &[String],
        ttl: Duration,
    ) -> impl Future<Output = Result<Permits, BrokerError>> + Send {
        let _ = (key, limit, tokens, ttl);
        async { Err(no_permits(self.backend())) }
    }

    /// Extends the permits `tokens` of pool `key` to `ttl` from now. Returns how many were still
    /// held (one that ran out is not taken again).
    fn renew_permits(
        &self,
        key: &str,
        tokens: &[String],
        ttl: Duration,
    ) -> impl Future<Output = Result<usize, BrokerError>> + Send {
        let _ = (key, tokens, ttl);
        async { Err(no_permits(self.backend())) }
    }

    /// Gives back the permits `tokens` of pool `key` (those held; others are ignored).
    fn release_permits(
        &self,
        key: &str,
        tokens: &[String],
    ) -> impl Future<Output = Result<(), BrokerError>> + Send {
        let _ = (key, tokens);
        async { Err(no_permits(self.backend())) }
    }
}

/// What [`Locks::take_permits`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Permits {
    /// How many permits were taken: the first `taken` of the tokens offered.
    pub taken: usize,
    /// When the pool was full: how long until its first permit runs out, if the backend knows
    /// (a hint for how long to wait; a released permit frees a place sooner).
    pub next_free: Option<Duration>,
}

fn no_permits(backend: &str) -> BrokerError {
    BrokerError::Backend(format!(
        "the {backend} broker keeps no permits, so it cannot enforce global limits: implement `Locks::take_permits`, `renew_permits` and `release_permits`, or remove `global_concurrency`/`rate_limit` from the mounts"
    ))
}
