//! The broker's cache of the keys of the queues it settles on, per namespace and queue (and
//! priority level): a settlement looks its keys up instead of formatting them again.

use std::collections::HashMap;
use std::sync::Arc;

use stagedoor_jobs::Priority;
use stagedoor_jobs::kit::lock;

use super::RedisBroker;
use crate::keys::Keys;

/// The most queues whose keys [`RedisBroker::cached_keys`] keeps.
pub(crate) const KEYS_CACHED: usize = 1024;

impl RedisBroker {
    /// [`keys`](Self::keys), shared: looked up once formatted (the settlement path).
    pub(crate) fn cached_keys(&self, name: &str) -> Arc<Keys> {
        let mut cache = lock(&self.inner.keys);
        if let Some(k) = cache.get(&self.namespace).and_then(|m| m.get(name)) {
            return Arc::clone(k);
        }
        if cache.values().map(HashMap::len).sum::<usize>() >= KEYS_CACHED {
            cache.clear();
        }
        let k = Arc::new(self.keys(name));
        cache
            .entry(self.namespace.clone())
            .or_default()
            .insert(name.to_owned(), Arc::clone(&k));
        k
    }

    /// [`cached_keys`](Self::cached_keys) with the stream of priority `level` (see
    /// [`Keys::at`]).
    pub(crate) fn keys_at(&self, name: &str, level: Priority) -> Arc<Keys> {
        if level == Priority::NORMAL {
            return self.cached_keys(name);
        }
        let mut cache = lock(&self.inner.keys);
        // Not a queue's name (`#` cannot start a level's suffix): no clash with a queue.
        let cached = format!("{name}#{level}");
        if let Some(k) = cache.get(&self.namespace).and_then(|m| m.get(&cached)) {
            return Arc::clone(k);
        }
        if cache.values().map(HashMap::len).sum::<usize>() >= KEYS_CACHED {
            cache.clear();
        }
        let k = Arc::new(self.keys(name).at(level));
        cache
            .entry(self.namespace.clone())
            .or_default()
            .insert(cached, Arc::clone(&k));
        k
    }
}
