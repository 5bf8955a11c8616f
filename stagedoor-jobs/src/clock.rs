//! The clock the runtime and the in-memory broker read: the system's, or one the test harness
//! moves by hand.

use std::sync::Arc;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

/// A source of wall-clock time.
#[derive(Clone, Debug)]
pub struct Clock {
    manual: Option<Arc<Manual>>,
}

#[derive(Debug)]
struct Manual {
    now: Mutex<DateTime<Utc>>,
    changed: watch::Sender<DateTime<Utc>>,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Self { manual: None }
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
        }
    }

    /// Whether this clock is moved by hand.
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }

    /// The time now.
    pub fn now(&self) -> DateTime<Utc> {
        match &self.manual {
            None => Utc::now(),
            Some(m) => *m.now.lock().expect("clock lock"),
        }
    }

    /// Moves a manual clock to `t` (never backwards). No effect on the system clock.
    pub fn set(&self, t: DateTime<Utc>) {
        if let Some(m) = &self.manual {
            let mut now = m.now.lock().expect("clock lock");
            if t > *now {
                *now = t;
                m.changed.send_replace(t);
            }
        }
    }

    /// Moves a manual clock forward by `d`.
    pub fn advance(&self, d: std::time::Duration) {
        let t = self.now() + crate::broker::chrono_duration(d);
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
