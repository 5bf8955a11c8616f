//! Retry policies, declared on a mount next to its cap: how long a failed attempt waits before
//! the next one. A handler never loops to retry.

use std::fmt;
use std::time::Duration;

/// How long the job waits after failed attempt number `attempt` (1 for the first).
pub trait Backoff: Send + Sync + fmt::Debug + 'static {
    /// The delay before the next attempt.
    fn delay(&self, attempt: u32) -> Duration;
}

/// No wait: the job is due again at once (the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Immediate;

impl Backoff for Immediate {
    fn delay(&self, _attempt: u32) -> Duration {
        Duration::ZERO
    }
}

/// The same wait after every failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fixed(Duration);

impl Fixed {
    /// Waits `delay` after every failure.
    pub const fn new(delay: Duration) -> Self {
        Self(delay)
    }
}

impl Backoff for Fixed {
    fn delay(&self, _attempt: u32) -> Duration {
        self.0
    }
}

/// `base`, doubling after each failed attempt, never more than `cap`: 1 s, 2 s, 4 s, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exponential {
    base: Duration,
    cap: Duration,
}

impl Exponential {
    /// Starts at `base` and doubles up to `cap`.
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Self { base, cap }
    }

    /// The ceiling for attempt `attempt`: `min(cap, base * 2^(attempt - 1))`.
    fn ceiling(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(63);
        self.base
            .checked_mul(1u32.checked_shl(exp).unwrap_or(u32::MAX))
            .unwrap_or(self.cap)
            .min(self.cap)
    }
}

impl Backoff for Exponential {
    fn delay(&self, attempt: u32) -> Duration {
        self.ceiling(attempt)
    }
}

/// Exponential backoff with full jitter: each delay is uniform in `[0, min(cap, base *
/// 2^(attempt - 1))]`, so workers that failed together do not retry together. Seed 000's
/// email send: `FullJitter::new(Duration::from_secs(1), Duration::from_secs(60))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FullJitter(Exponential);

impl FullJitter {
    /// Ceilings start at `base` and double up to `cap`.
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Self(Exponential::new(base, cap))
    }
}

impl Backoff for FullJitter {
    fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.0.ceiling(attempt);
        // fastrand: a small, well-kept generator; jitter needs uniformity, not cryptography.
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(fastrand::u64(0..=nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_doubles_to_its_cap() {
        let b = Exponential::new(Duration::from_secs(1), Duration::from_secs(60));
        let got: Vec<u64> = (1..=9).map(|a| b.delay(a).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(b.delay(200), Duration::from_secs(60));
    }

    #[test]
    fn full_jitter_stays_within_the_ceiling_and_varies() {
        let b = FullJitter::new(Duration::from_secs(1), Duration::from_secs(60));
        for attempt in 1..=10 {
            let ceiling =
                Exponential::new(Duration::from_secs(1), Duration::from_secs(60)).delay(attempt);
            for _ in 0..200 {
                assert!(b.delay(attempt) <= ceiling);
            }
        }
        let samples: std::collections::HashSet<_> = (0..50).map(|_| b.delay(7)).collect();
        assert!(
            samples.len() > 10,
            "full jitter should spread delays, got {samples:?}"
        );
    }

    #[test]
    fn fixed_and_immediate() {
        assert_eq!(
            Fixed::new(Duration::from_secs(3)).delay(9),
            Duration::from_secs(3)
        );
        assert_eq!(Immediate.delay(1), Duration::ZERO);
    }
}
