//! The wait for a clock change: what a claim or the scheduler waits on besides its timer, so
//! that a test moving a manual clock wakes it at once.

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::Clock;

/// Watches a [`Clock`] for moves: on a manual clock, [`changed`](Self::changed) resolves each
/// time it is moved; on the system clock (which moves by itself) it never resolves, nor once
/// the manual clock is gone.
///
/// Made once before a loop that waits, so that a move made while the loop worked is not lost:
///
/// ```no_run
/// # async fn claim_loop(clock: stagedoor_jobs::Clock) {
/// let mut watch = stagedoor_jobs::kit::ClockWatch::new(&clock);
/// loop {
///     // ... nothing due: wait for the next due time, a wake-up, or the clock to move.
///     tokio::select! {
///         () = watch.changed() => {}
///         () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct ClockWatch(Option<watch::Receiver<DateTime<Utc>>>);

impl ClockWatch {
    /// Watches `clock` from now on.
    pub fn new(clock: &Clock) -> Self {
        Self(clock.subscribe())
    }

    /// Whether the clock watched is a manual one (a test's), which moves only when told.
    pub fn is_manual(&self) -> bool {
        self.0.is_some()
    }

    /// Resolves when a manual clock moved since the last call (or since [`new`](Self::new));
    /// never on the system clock, nor once the manual clock is dropped. Cancel-safe: a move
    /// seen by a dropped call is seen by the next one.
    pub async fn changed(&mut self) {
        match self.0.as_mut() {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_manual_clock_moved_wakes_the_watch_and_the_system_clock_never_does() {
        let clock = Clock::manual(Utc::now());
        let mut w = ClockWatch::new(&clock);
        assert!(w.is_manual());
        let quiet = tokio::time::timeout(Duration::from_millis(20), w.changed()).await;
        assert!(quiet.is_err(), "not moved yet");
        clock.advance(Duration::from_secs(1));
        let moved = tokio::time::timeout(Duration::from_secs(1), w.changed()).await;
        assert!(moved.is_ok(), "moved");
        let mut system = ClockWatch::new(&Clock::system());
        assert!(!system.is_manual());
        let never = tokio::time::timeout(Duration::from_millis(20), system.changed()).await;
        assert!(never.is_err());
    }
}
