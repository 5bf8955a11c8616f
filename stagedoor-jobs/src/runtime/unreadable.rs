//! An item a claim could not read as a job ([`Unreadable`]): it never runs; the runtime picks
//! its dead letter (the first, by name, that a mount of the queue declares that handles its
//! kind or every kind, else the backend's default) and has the backend move it there with its
//! raw content kept.

use std::sync::Arc;
use std::time::Duration;

use super::worker::Worker;
use crate::broker::{Broker, Settled, Unreadable};

/// How many times moving an unreadable item is tried before it is left to come back after its
/// lease.
const TRIES: u32 = 5;

impl<B: Broker> Worker<B> {
    /// The dead letter of an unreadable item of kind `kind` (if the backend read it): the first
    /// by name of the dead letters declared by the queue's mounts for that kind (or for every
    /// kind), else of every mount of the queue, else the backend's default.
    pub(super) fn unreadable_target(&self, kind: Option<&str>) -> String {
        let of_queue = self
            .mounts
            .iter()
            .map(|m| &m.spec)
            .filter(|s| *s.queue == *self.queue.name);
        let for_kind = of_queue
            .clone()
            .filter(|s| kind.is_some_and(|k| s.kind.as_deref() == Some(k)) || s.kind.is_none())
            .filter_map(|s| s.dead_letter.as_ref())
            .min();
        for_kind
            .or_else(|| of_queue.filter_map(|s| s.dead_letter.as_ref()).min())
            .cloned()
            .unwrap_or_else(|| self.broker.default_dead_letter(&self.queue.name))
    }

    /// Moves `item` to its dead letter, trying again (on a connection error until the service
    /// stops, else up to [`TRIES`] times); an item it cannot move comes back after its lease.
    pub(super) fn start_unreadable(self: &Arc<Self>, item: Unreadable<B::Receipt>) {
        let w = Arc::clone(self);
        crate::kit::lock(&self.running).spawn(async move {
            let target = w.unreadable_target(item.kind.as_deref());
            tracing::error!(queue = %w.queue.name, dead_letter = %target, "{}: dead-lettered", item.error);
            let mut wait = Duration::from_millis(50);
            let mut failures = 0;
            loop {
                let moved = (w.broker).dead_letter_unreadable(&w.queue.name, &item, &target);
                match Box::pin(moved).await {
                    Ok(Settled::Done) => {
                        w.ctx.dead_lettered.notify_one();
                        return;
                    }
                    Ok(Settled::LeaseLost) => return,
                    Err(e) if e.is_transient() || failures + 1 < TRIES => {
                        failures += 1;
                        tracing::warn!(queue = %w.queue.name, error = %e, "could not dead-letter an unreadable item ({failures} tries): trying again");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(1));
                    }
                    Err(e) => {
                        tracing::error!(queue = %w.queue.name, error = %e, "could not dead-letter an unreadable item: it comes back after its lease");
                        return;
                    }
                }
            }
        });
    }
}
