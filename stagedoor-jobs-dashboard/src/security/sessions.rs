//! [`Sessions`]: the sessions signed in with the token, each for [`SESSION_TTL`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::csrf::random_token;

/// How long a session lasts.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);
/// At most this many sessions are kept; the oldest goes first.
const MAX_SESSIONS: usize = 1_000;

/// Sessions signed in with the token: id → when it expires.
#[derive(Debug, Default)]
pub(crate) struct Sessions(std::sync::Mutex<HashMap<String, Instant>>);

impl Sessions {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        stagedoor_jobs::kit::lock(&self.0)
    }

    /// Starts a session; returns its id.
    pub(crate) fn start(&self) -> Option<String> {
        let id = random_token()?;
        let now = Instant::now();
        let mut map = self.map();
        map.retain(|_, until| *until > now);
        while map.len() >= MAX_SESSIONS {
            let Some(oldest) = map.iter().min_by_key(|(_, u)| **u).map(|(k, _)| k.clone()) else {
                break;
            };
            map.remove(&oldest);
        }
        map.insert(id.clone(), now + SESSION_TTL);
        Some(id)
    }

    /// Whether `id` is a live session.
    pub(crate) fn valid(&self, id: &str) -> bool {
        self.map()
            .get(id)
            .is_some_and(|until| *until > Instant::now())
    }

    /// Ends session `id`.
    pub(crate) fn end(&self, id: &str) {
        self.map().remove(id);
    }
}
