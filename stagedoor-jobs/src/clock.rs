//! The clock the runtime and the brokers read: the system's, kept in step with the backend's
//! clock (Redis `TIME`, Postgres `now()`), or one the test harness moves by hand.
//!
//! Every due time, lease and scheduler tick is computed from [`Clock::now`]. On a system clock
//! that is this machine's time plus an offset the runtime measures against the backend's clock
//! at start and every [`SYNC_EVERY`] after (see [`Clock::sync`]), so that workers whose clocks
//! disagree still agree on when a job is due and when a tick falls.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

/// A `std` duration as a `chrono` one, kept at [`MAX_DELAY`]: no delay, lease or time to live
/// the runtime and the backends keep is longer, so adding one to a time never overflows.
pub fn chrono_duration(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d.min(MAX_DELAY)).unwrap_or(chrono::Duration::MAX)
}

/// `t` plus `d`, with `d` kept at [`MAX_DELAY`]: never an overflow (a time past the latest one
/// chrono holds is that latest time).
pub fn later(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t.checked_add_signed(chrono_duration(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// The longest delay a job is kept for: ten years (3,650 days). A longer one (a handler's
/// [`retry_after`](crate::HandlerOutcome::retry_after), [`Job::after`](crate::Job::after), a
/// [`Job::at`](crate::Job::at) further ahead, say a delay read from an upstream's
/// `Retry-After`) is kept at this bound, on every backend.
pub const MAX_DELAY: Duration = Duration::from_secs(3650 * 24 * 60 * 60);

/// How often the runtime measures a broker's clock against the backend's.
pub const SYNC_EVERY: Duration = Duration::from_secs(30);

/// A source of wall-clock time.
#[derive(Clone, Debug)]
pub struct Clock {
    manual: Option<Arc<Manual>>,
    /// Shared by every clone: the backend's offset and the simulated error of this machine.
    system: Arc<SystemParts>,
}

#[derive(Debug)]
struct Manual {
    now: Mutex<DateTime<Utc>>,
    changed: watch::Sender<DateTime<Utc>>,
}

#[derive(Debug, Default)]
struct SystemParts {
    /// Microseconds added to this machine's reading to get the backend's time.
    offset_us: AtomicI64,
    /// Microseconds this machine's reading is off (tests of a wrong system clock).
    skew_us: AtomicI64,
}

fn micros(d: chrono::Duration) -> i64 {
    d.num_microseconds()
        .unwrap_or(if d > chrono::Duration::zero() {
            i64::MAX
        } else {
            i64::MIN
        })
}

impl Clock {
    /// The system clock (no offset until [`sync`](Clock::sync) measures one).
    pub fn system() -> Self {
        Self {
            manual: None,
            system: Arc::default(),
        }
    }

    /// A clock that stands still at `start` until [`set`](Clock::set) or
    /// [`advance`](Clock::advance) moves it.
    pub fn manual(start: DateTime<Utc>) -> Self {
        let (changed, _) = watch::channel(start);
        Self {
            manual: Some(Arc::new(Manual {
                now: Mutex::new(start),
                changed,
            })),
            system: Arc::default(),
        }
    }

    /// Whether this clock is moved by hand.
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }

    /// The time now: the backend's time on a synced system clock.
    pub fn now(&self) -> DateTime<Utc> {
        match &self.manual {
            None => {
                self.local()
                    + chrono::Duration::microseconds(self.system.offset_us.load(Ordering::Relaxed))
            }
            Some(m) => *m.now.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// This machine's reading, before the backend's offset (with the skew set by
    /// [`set_skew`](Clock::set_skew)). A manual clock reads its own time.
    pub fn local(&self) -> DateTime<Utc> {
        match &self.manual {
            None => {
                Utc::now()
                    + chrono::Duration::microseconds(self.system.skew_us.load(Ordering::Relaxed))
            }
            Some(_) => self.now(),
        }
    }

    /// Makes this clock's machine reading `skew` off the system's, for every clone of it: a
    /// test of a worker whose clock is wrong (what libfaketime does to a process). The offset
    /// measured by [`sync`](Clock::sync) takes it back out.
    pub fn set_skew(&self, skew: chrono::Duration) {
        self.system.skew_us.store(micros(skew), Ordering::Relaxed);
    }

    /// What [`now`](Clock::now) adds to this machine's reading: the backend's clock minus
    /// ours, as last measured.
    pub fn offset(&self) -> chrono::Duration {
        chrono::Duration::microseconds(self.system.offset_us.load(Ordering::Relaxed))
    }

    /// Takes one measurement of the backend's clock: `server` was read between the local
    /// readings `sent` and `received` (both from [`local`](Clock::local)). The offset becomes
    /// `server` minus the midpoint, off by at most half the round trip. No effect on a manual
    /// clock.
    pub fn sync(&self, sent: DateTime<Utc>, server: DateTime<Utc>, received: DateTime<Utc>) {
        if self.manual.is_some() {
            return;
        }
        let mid = sent + (received - sent) / 2;
        self.system
            .offset_us
            .store(micros(server - mid), Ordering::Relaxed);
    }

    /// Moves a manual clock to `t` (never backwards). No effect on the system clock.
    pub fn set(&self, t: DateTime<Utc>) {
        if let Some(m) = &self.manual {
            let mut now = m.now.lock().unwrap_or_else(|e| e.into_inner());
            if t > *now {
                *now = t;
                m.changed.send_replace(t);
            }
        }
    }

    /// Moves a manual clock forward by `d` (at most [`MAX_DELAY`]).
    pub fn advance(&self, d: std::time::Duration) {
        let t = later(self.now(), d);
        self.set(t);
    }

    /// A receiver that changes whenever a manual clock moves (never for the system clock).
    pub fn subscribe(&self) -> Option<watch::Receiver<DateTime<Utc>>> {
        self.manual.as_ref().map(|m| m.changed.subscribe())
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::system()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_synced_clock_reads_the_backends_time_whatever_its_skew() {
        let clock = Clock::system();
        let twin = clock.clone();
        clock.set_skew(chrono::Duration::seconds(3));
        let sent = clock.local();
        let server = Utc::now();
        let received = clock.local();
        twin.sync(sent, server, received);
        let off = (clock.now() - Utc::now()).num_milliseconds().abs();
        assert!(off < 50, "the synced clock is {off} ms off");
        assert!(
            (clock.offset() + chrono::Duration::seconds(3))
                .num_milliseconds()
                .abs()
                < 50
        );
    }

    #[test]
    fn an_unsynced_skewed_clock_is_off_by_its_skew() {
        let clock = Clock::system();
        clock.set_skew(chrono::Duration::seconds(-5));
        let off = (Utc::now() - clock.now()).num_milliseconds();
        assert!((4_900..5_100).contains(&off), "{off}");
    }

    #[test]
    fn a_manual_clock_ignores_sync() {
        let t = Utc::now();
        let clock = Clock::manual(t);
        clock.sync(t, t + chrono::Duration::hours(1), t);
        assert_eq!(clock.now(), t);
    }
}
