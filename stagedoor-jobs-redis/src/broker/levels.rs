//! The priority levels of a queue: which of its levels' streams exist (looked for at most once
//! a second, each new one given its consumer group), and the bit mask they are kept in.

use std::time::Duration;

use stagedoor_jobs::Priority;
use stagedoor_jobs::broker::BrokerError;

use super::RedisBroker;
use crate::keys::Keys;

/// The bit of priority `level` in [`Housekeeping::levels`](super::Housekeeping::levels).
pub(crate) fn level_bit(level: Priority) -> u8 {
    1 << (level.get() + 2)
}

/// The levels of `mask` and normal, highest first.
pub(crate) fn levels_of(mask: u8) -> Vec<Priority> {
    Priority::ALL
        .into_iter()
        .filter(|l| *l == Priority::NORMAL || mask & level_bit(*l) != 0)
        .collect()
}

impl RedisBroker {
    /// The priority levels of `queue`'s streams, highest first (normal always): the levels
    /// whose stream exists (a publish, the delayed mover or a replay made it), looked for at
    /// most once a second (at once after this process published at a level). A level seen for
    /// the first time gets its consumer group. Nothing else records which levels are in use,
    /// so nothing can say a level is unused while its stream holds jobs.
    pub(crate) async fn levels_in_use(&self, queue: &str) -> Result<Vec<Priority>, BrokerError> {
        if Keys::is_dead(queue) {
            return Ok(vec![Priority::NORMAL]);
        }
        let now = tokio::time::Instant::now();
        let hk = self.housekeeping(queue);
        if hk
            .levels_read
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            return Ok(levels_of(hk.levels));
        }
        let mask = self.levels_present(&self.cached_keys(queue)).await?;
        self.prepare_levels(queue, mask & !hk.levels).await?;
        self.update_housekeeping(queue, |h| {
            h.levels = mask;
            h.levels_read = Some(now);
        });
        Ok(levels_of(mask))
    }

    /// Adds the levels of `mask` to those `queue`'s claims read (giving each new one its
    /// group); returns them all, highest first.
    pub(crate) async fn add_levels(
        &self,
        queue: &str,
        mask: u8,
    ) -> Result<Vec<Priority>, BrokerError> {
        let known = self.housekeeping(queue).levels;
        self.prepare_levels(queue, mask & !known).await?;
        let mut all = known;
        self.update_housekeeping(queue, |h| {
            h.levels |= mask;
            all = h.levels;
        });
        Ok(levels_of(all))
    }

    /// Gives the streams of the levels of `mask` other than normal their consumer group.
    async fn prepare_levels(&self, queue: &str, mask: u8) -> Result<(), BrokerError> {
        let keys = self.cached_keys(queue);
        for l in levels_of(mask) {
            if l != Priority::NORMAL {
                self.prepare_stream(&keys.at(l)).await?;
            }
        }
        Ok(())
    }

    /// The levels other than normal whose stream exists on the server, one bit each
    /// ([`level_bit`]): one `EXISTS` per level, in one round trip.
    pub(crate) async fn levels_present(&self, keys: &Keys) -> Result<u8, BrokerError> {
        let others: Vec<Priority> = Priority::ALL
            .into_iter()
            .filter(|l| *l != Priority::NORMAL)
            .collect();
        let mut pipe = redis::pipe();
        for l in &others {
            pipe.cmd("EXISTS").arg(&keys.at(*l).stream);
        }
        let mut c = self.conn()?;
        let found: Vec<i64> = pipe.query_async(&mut c).await.map_err(|e| self.err(e))?;
        Ok(others
            .iter()
            .zip(found)
            .filter(|(_, n)| *n > 0)
            .fold(0u8, |m, (l, _)| m | level_bit(*l)))
    }
}
