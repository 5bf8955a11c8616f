//! The in-memory broker's [`DeadLetters`]: listing, replaying and purging dead letters, and
//! cancelling a job.

use chrono::{DateTime, Utc};

use super::{Mem, MemoryBroker, Stored};
use crate::broker::{BrokerError, Cancelled, DeadLetter, DeadLetters, DeadSelector, ReplayReport};
use crate::envelope::JobId;

impl MemoryBroker {
    /// The dead letters of `dead` that `selector` takes, each with its key in the queue,
    /// newest first.
    fn dead_of(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Vec<((DateTime<Utc>, u64), DeadLetter)> {
        let mem = self.mem();
        let Some(q) = mem.queues.get(dead) else {
            return Vec::new();
        };
        let mut out: Vec<_> = q
            .waiting
            .iter()
            .filter_map(|(k, s)| {
                let d = s.dead.as_ref()?;
                let letter = DeadLetter {
                    id: s.envelope.id().to_string(),
                    envelope: s.envelope.clone(),
                    origin: d.origin.clone(),
                    error: d.failure.error.clone(),
                    traceback: d.failure.traceback.clone(),
                    attempts: s.envelope.attempt(),
                    failed_at: d.failed_at,
                };
                selector.matches(&letter).then_some((*k, letter))
            })
            .collect();
        out.sort_by(|a, b| b.1.failed_at.cmp(&a.1.failed_at).then(b.0.1.cmp(&a.0.1)));
        out
    }
}
impl DeadLetters for MemoryBroker {
    async fn cancel(&self, queue: &str, id: &JobId) -> Result<Cancelled, BrokerError> {
        let (what, removed) = {
            let mut mem = self.mem();
            match mem.queues.get_mut(queue) {
                None => (Cancelled::NotFound, None),
                Some(q) => {
                    let key = q
                        .waiting
                        .iter()
                        .find(|(_, s)| s.envelope.id() == id)
                        .map(|(k, _)| *k);
                    if let Some(key) = key {
                        q.ids.remove(id);
                        (Cancelled::Removed, q.waiting.remove(&key))
                    } else if q.running.values().any(|r| r.stored.envelope.id() == id) {
                        q.cancelled.insert(id.clone());
                        (Cancelled::Running, None)
                    } else {
                        (Cancelled::NotFound, None)
                    }
                }
            }
        };
        if let Some(r) = removed {
            crate::broker::release_unique(self, queue, r.envelope.headers(), id).await?;
        }
        Ok(what)
    }

    async fn dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> Result<Vec<DeadLetter>, BrokerError> {
        Ok(self
            .dead_of(dead, selector)
            .into_iter()
            .take(limit)
            .map(|(_, d)| d)
            .collect())
    }

    async fn replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> Result<ReplayReport, BrokerError> {
        self.check_dead_letter(dead).await?;
        let now = self.now();
        let selected = self.dead_of(dead, selector);
        let mut report = ReplayReport::default();
        {
            let mut mem = self.mem();
            let Mem { queues, seq, .. } = &mut *mem;
            for (key, letter) in selected {
                // A job whose id is back in its queue already is left where it is.
                if queues
                    .get(&letter.origin)
                    .is_some_and(|q| q.ids.contains(letter.envelope.id()))
                {
                    report.skipped += 1;
                    continue;
                }
                let Some(stored) = queues.get_mut(dead).and_then(|q| q.waiting.remove(&key)) else {
                    report.skipped += 1;
                    continue;
                };
                if let Some(q) = queues.get_mut(dead) {
                    q.ids.remove(stored.envelope.id());
                }
                let origin = queues.entry(letter.origin.clone()).or_default();
                origin.ids.insert(stored.envelope.id().clone());
                *seq += 1;
                let envelope = stored.envelope.with_attempt(0);
                origin.waiting.insert(
                    (now, *seq),
                    Stored {
                        envelope,
                        dead: None,
                        unread_dead: false,
                        delivered: 0,
                    },
                );
                report.replayed += 1;
            }
        }
        self.inner.changed.notify_waiters();
        Ok(report)
    }

    async fn purge(&self, dead: &str, selector: &DeadSelector) -> Result<u64, BrokerError> {
        self.check_dead_letter(dead).await?;
        let selected = self.dead_of(dead, selector);
        let mut mem = self.mem();
        let Some(q) = mem.queues.get_mut(dead) else {
            return Ok(0);
        };
        let mut n = 0;
        for (key, _) in selected {
            if let Some(s) = q.waiting.remove(&key) {
                q.ids.remove(s.envelope.id());
                n += 1;
            }
        }
        Ok(n)
    }

    async fn check_dead_letter(&self, name: &str) -> Result<(), BrokerError> {
        let declared = self.mem().declared_dead.clone();
        crate::broker::ensure_dead_letter(self, name, ".dead", &declared).await
    }

    async fn dead_len(&self, dead: &str) -> Result<u64, BrokerError> {
        let mem = self.mem();
        Ok(mem.queues.get(dead).map_or(0, |q| {
            q.waiting.values().filter(|s| s.dead.is_some()).count() as u64
        }))
    }

    fn default_dead_letter(&self, queue: &str) -> String {
        format!("{queue}.dead")
    }
}
