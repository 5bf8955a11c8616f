//! Retry policies, declared on a mount next to its cap: how long a failed attempt waits before
//! the next one. A handler never loops to retry.

use std::fmt;
use std::time::Duration;

/// How long the job waits after failed attempt number `attempt` (1 for the first).
pub trait Backoff: Send + Sync + fmt::Debug + 'static {
    /// The delay before the next attempt.
    fn delay(&self, attempt: u32) -> Duration;
}

/// No wait: the job is due again at once (the default of a mount with a cap; a mount without
/// one still waits [`UNCAPPED_FLOOR`]).
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

/// The least a failed attempt of a mount without `max_attempts` waits: 1 s after the first
/// failed attempt, doubling after each one, at most 60 s (1, 2, 4, 8, 16, 32, 60, 60, ... s).
///
/// Such a mount never dead-letters, so a job that always fails would otherwise be retried
/// forever at full speed (thousands of deliveries a second). The runtime waits
/// `max(asked, UNCAPPED_FLOOR.delay(attempt))`, where `asked` is the mount's
/// [`backoff`](crate::Mount::backoff) or the handler's `retry_after(d)`: a longer delay
/// is kept, a shorter one (or [`Immediate`]) is raised to the floor. A mount with a cap keeps
/// its own backoff exactly (none declared: at once).
///
/// ```
/// use std::time::Duration;
/// use stagedoor_jobs::{Backoff, UNCAPPED_FLOOR};
/// assert_eq!(UNCAPPED_FLOOR.delay(1), Duration::from_secs(1));
/// assert_eq!(UNCAPPED_FLOOR.delay(3), Duration::from_secs(4));
/// assert_eq!(UNCAPPED_FLOOR.delay(u32::MAX), Duration::from_secs(60));
/// ```
pub const UNCAPPED_FLOOR: Exponential =
    Exponential::new(Duration::from_secs(1), Duration::from_secs(60));

/// The delay of failed attempt `attempt` of a mount: `asked` (the mount's backoff or the
/// handler's `retry_after`) on a mount with a cap, at least [`UNCAPPED_FLOOR`] on one without.
pub(crate) fn retry_delay(capped: bool, asked: Duration, attempt: u32) -> Duration {
    if capped {
        asked
    } else {
        asked.max(UNCAPPED_FLOOR.delay(attempt))
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
    fn the_uncapped_floor_doubles_from_one_second_to_a_minute() {
        let got: Vec<u64> = (1..=9).map(|a| UNCAPPED_FLOOR.delay(a).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        for attempt in [0, 1_000, crate::broker::MAX_ATTEMPT, u32::MAX] {
            assert!(UNCAPPED_FLOOR.delay(attempt) <= Duration::from_secs(60));
            assert!(UNCAPPED_FLOOR.delay(attempt) >= Duration::from_secs(1));
        }
        assert_eq!(UNCAPPED_FLOOR.delay(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn retry_delay_raises_an_uncapped_mount_to_the_floor_only() {
        let ms = Duration::from_millis;
        // Capped: what was asked, exactly (none declared: at once).
        assert_eq!(retry_delay(true, Duration::ZERO, 1), Duration::ZERO);
        assert_eq!(retry_delay(true, ms(150), 9), ms(150));
        // Uncapped: at least the floor; a longer delay asked is kept.
        assert_eq!(retry_delay(false, Duration::ZERO, 1), ms(1_000));
        assert_eq!(retry_delay(false, ms(150), 2), ms(2_000));
        assert_eq!(retry_delay(false, ms(90_000), 3), ms(90_000));
        assert_eq!(retry_delay(false, Duration::ZERO, u32::MAX), ms(60_000));
    }

    #[test]
    fn every_policy_takes_any_attempt_number() {
        let policies: [&dyn Backoff; 4] = [
            &Immediate,
            &Fixed::new(Duration::from_secs(3)),
            &Exponential::new(Duration::from_secs(1), Duration::from_secs(60)),
            &FullJitter::new(Duration::from_secs(1), Duration::from_secs(60)),
        ];
        for p in policies {
            for attempt in [0, 1, 31, 32, 33, 64, u32::MAX - 1, u32::MAX] {
                assert!(
                    p.delay(attempt) <= Duration::from_secs(60),
                    "{p:?} {attempt}"
                );
            }
        }
        let huge = Exponential::new(Duration::MAX, Duration::MAX);
        assert_eq!(huge.delay(u32::MAX), Duration::MAX);
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
