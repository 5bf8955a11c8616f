//! The in-memory broker's [`Inspect`]: its queues and what they hold.

use chrono::{DateTime, Utc};

use super::MemoryBroker;
use crate::broker::{BrokerError, Inspect, QueueStats};

impl Inspect for MemoryBroker {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn connect(&self) -> Result<(), BrokerError> {
        Ok(())
    }

    async fn stats(&self, queue: &str) -> Result<QueueStats, BrokerError> {
        // The lock first, then the clock: a settlement cannot land between the two.
        let mem = self.mem();
        let now = self.now();
        let Some(q) = mem.queues.get(queue) else {
            return Ok(QueueStats::default());
        };
        let mut s = QueueStats {
            pending: q.running.values().filter(|r| r.lease_until > now).count() as u64,
            ready: q.running.values().filter(|r| r.lease_until <= now).count() as u64,
            ..QueueStats::default()
        };
        for (due, _) in q.waiting.keys() {
            if *due <= now {
                s.ready += 1;
                let waited = (now - *due).to_std().unwrap_or_default();
                s.oldest = Some(s.oldest.map_or(waited, |o| o.max(waited)));
            } else {
                s.delayed += 1;
            }
        }
        Ok(s)
    }

    async fn queues(&self) -> Result<Vec<String>, BrokerError> {
        let mut names: Vec<String> = self.mem().queues.keys().cloned().collect();
        names.sort();
        Ok(names)
    }

    async fn next_due(&self, queue: &str) -> Option<DateTime<Utc>> {
        Self::next_due_locked(&self.mem(), queue)
    }
}
