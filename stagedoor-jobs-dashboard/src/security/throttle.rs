//! [`Throttle`]: failed credentials counted per client and in total; past the limits, the
//! next attempt is refused unchecked.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// How many failed credentials one client may send per [`GUESS_WINDOW`].
pub(crate) const GUESSES_PER_CLIENT: usize = 5;
/// How many failed credentials all clients together may send per [`GUESS_WINDOW`].
pub(crate) const GUESSES_IN_TOTAL: usize = 50;
/// The window the failures are counted over.
pub(crate) const GUESS_WINDOW: Duration = Duration::from_secs(60);
/// At most this many clients' failures are remembered (the total still counts the rest).
const MAX_CLIENTS: usize = 10_000;

/// Failed credentials (a wrong Bearer token, basic-auth pair or sign-in token) over the last
/// [`GUESS_WINDOW`], per client and in total.
#[derive(Debug, Default)]
pub(crate) struct Throttle(std::sync::Mutex<Failures>);

#[derive(Debug, Default)]
struct Failures {
    total: VecDeque<Instant>,
    clients: HashMap<Option<IpAddr>, VecDeque<Instant>>,
}

impl Throttle {
    fn state(&self) -> std::sync::MutexGuard<'_, Failures> {
        stagedoor_jobs::kit::lock(&self.0)
    }

    /// `Some(how long to wait)` when `client` (or everyone) has failed too often: its next
    /// attempt is then refused without being checked.
    pub(crate) fn blocked(&self, client: Option<IpAddr>) -> Option<Duration> {
        let now = Instant::now();
        let mut st = self.state();
        let expire = |q: &mut VecDeque<Instant>| {
            while q
                .front()
                .is_some_and(|t| now.duration_since(*t) >= GUESS_WINDOW)
            {
                q.pop_front();
            }
        };
        expire(&mut st.total);
        let wait = |q: &VecDeque<Instant>| {
            q.front()
                .map(|t| GUESS_WINDOW.saturating_sub(now.duration_since(*t)))
        };
        let mut longest: Option<Duration> = None;
        if st.total.len() >= GUESSES_IN_TOTAL {
            longest = wait(&st.total);
        }
        if let Some(q) = st.clients.get_mut(&client) {
            expire(q);
            if q.len() >= GUESSES_PER_CLIENT {
                longest = longest.max(wait(q));
            }
        }
        longest
    }

    /// Counts a failed attempt of `client`.
    pub(crate) fn failed(&self, client: Option<IpAddr>) {
        let now = Instant::now();
        let mut st = self.state();
        st.total.push_back(now);
        while st.total.len() > GUESSES_IN_TOTAL {
            st.total.pop_front();
        }
        if !st.clients.contains_key(&client) && st.clients.len() >= MAX_CLIENTS {
            st.clients.retain(|_, q| {
                q.back()
                    .is_some_and(|t| now.duration_since(*t) < GUESS_WINDOW)
            });
            if st.clients.len() >= MAX_CLIENTS {
                return;
            }
        }
        let q = st.clients.entry(client).or_default();
        q.push_back(now);
        while q.len() > GUESSES_PER_CLIENT {
            q.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_throttled() {
        let t = Throttle::default();
        let a = Some(IpAddr::from([10, 0, 0, 1]));
        let b = Some(IpAddr::from([10, 0, 0, 2]));
        for _ in 0..GUESSES_PER_CLIENT {
            assert!(t.blocked(a).is_none());
            t.failed(a);
        }
        let wait = t.blocked(a).expect("blocked");
        assert!(wait <= GUESS_WINDOW && !wait.is_zero(), "{wait:?}");
        assert!(t.blocked(b).is_none(), "another client");
    }
}
