//! Each queue's outcomes per minute, counted at settlement with atomics (nothing else on the
//! job path) and taken out by the reporter (`report.rs`) every few seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};

use chrono::{DateTime, Utc};

use crate::activity::MinuteCounts;
use crate::broker::Settlement;

/// How many minutes a queue's counters hold before a slot is reused: far more than the time
/// between two reports, so a slot is always taken out before its minute comes round again.
const RING: usize = 8;

/// One minute's counters of a queue.
#[derive(Debug)]
struct Slot {
    /// The minute (seconds since the epoch / 60) the counts belong to; `i64::MIN` for none.
    minute: AtomicI64,
    processed: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
}

impl Default for Slot {
    fn default() -> Self {
        Self {
            minute: AtomicI64::new(i64::MIN),
            processed: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            dead: AtomicU64::new(0),
        }
    }
}

/// A queue's outcomes per minute, counted at settlement and taken out by the reporter.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    slots: [Slot; RING],
}

impl Tally {
    /// Counts one settlement made at `now` (the route's clock): processed (ack, drop), failed
    /// (retry, dead letter), dead (dead letter).
    pub(crate) fn count(&self, settlement: &Settlement, now: DateTime<Utc>) {
        let minute = now.timestamp().div_euclid(60);
        let slot = &self.slots[minute.rem_euclid(RING as i64) as usize];
        let held = slot.minute.load(Ordering::Acquire);
        if held != minute {
            // A new minute takes the slot (its last minute's counts were taken out long ago);
            // a counter racing here sets the same minute.
            let _ = slot
                .minute
                .compare_exchange(held, minute, Ordering::AcqRel, Ordering::Acquire);
        }
        match settlement {
            Settlement::Ack | Settlement::Drop => {
                slot.processed.fetch_add(1, Ordering::Relaxed);
            }
            Settlement::Retry { .. } => {
                slot.failed.fetch_add(1, Ordering::Relaxed);
            }
            Settlement::DeadLetter { .. } => {
                slot.failed.fetch_add(1, Ordering::Relaxed);
                slot.dead.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Takes the counts out: each minute with something counted.
    pub(crate) fn take(&self) -> Vec<MinuteCounts> {
        let mut out = Vec::new();
        for slot in &self.slots {
            let minute = slot.minute.load(Ordering::Acquire);
            let processed = slot.processed.swap(0, Ordering::Relaxed);
            let failed = slot.failed.swap(0, Ordering::Relaxed);
            let dead = slot.dead.swap(0, Ordering::Relaxed);
            let Some(at) = minute
                .checked_mul(60)
                .and_then(|s| DateTime::<Utc>::from_timestamp(s, 0))
            else {
                continue;
            };
            let m = MinuteCounts::new(at, processed, failed, dead);
            if !m.is_empty() {
                out.push(m);
            }
        }
        out
    }
}

/// A queue of a started route, as the reporter reads it.
#[derive(Debug)]
pub(crate) struct QueueActivity {
    pub(crate) queue: String,
    /// The queue's deliveries in flight (its health's counter).
    pub(crate) in_flight: Arc<AtomicUsize>,
    pub(crate) tally: Arc<Tally>,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::outcome::{Failure, FailureCause};

    fn at(minute: i64, second: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000 / 60 * 60 + minute * 60 + second, 0)
            .unwrap_or_default()
    }

    #[test]
    fn a_tally_counts_by_minute_and_is_emptied_by_taking() {
        let t = Tally::default();
        let failure = || Failure::new(FailureCause::Error, "e", "");
        t.count(&Settlement::Ack, at(0, 1));
        t.count(&Settlement::Drop, at(0, 59));
        t.count(
            &Settlement::Retry {
                delay: Duration::ZERO,
                failure: failure(),
            },
            at(0, 30),
        );
        t.count(
            &Settlement::DeadLetter {
                target: "q.dead".into(),
                failure: failure(),
            },
            at(1, 0),
        );
        let mut got = t.take();
        got.sort_by_key(|m| m.minute);
        assert_eq!(
            got,
            [
                MinuteCounts::new(at(0, 0), 2, 1, 0),
                MinuteCounts::new(at(1, 0), 0, 1, 1),
            ]
        );
        assert_eq!(t.take(), [], "taken out");
        // The slot of minute 0 comes round again RING minutes later.
        t.count(&Settlement::Ack, at(RING as i64, 5));
        assert_eq!(t.take(), [MinuteCounts::new(at(RING as i64, 0), 1, 0, 0)]);
    }
}
