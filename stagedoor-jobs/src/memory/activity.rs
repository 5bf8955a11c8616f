//! The in-memory broker's [`Activity`]: workers' reports, per-minute counts, delayed jobs.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::MemoryBroker;
use crate::activity::{
    COUNTS_KEPT, DelayedJob, MinuteCounts, QueueCounts, WorkerReport, minute_of,
};
use crate::broker::{Activity, BrokerError};
use crate::clock::{chrono_duration, later};

impl Activity for MemoryBroker {
    async fn report(
        &self,
        worker: &WorkerReport,
        counts: &[QueueCounts],
        ttl: Duration,
    ) -> Result<(), BrokerError> {
        let now = self.now();
        let mut mem = self.mem();
        mem.workers
            .insert(worker.id.clone(), (worker.clone(), later(now, ttl)));
        let keep_from = now - chrono_duration(COUNTS_KEPT);
        for q in counts {
            let minutes = mem.minutes.entry(q.queue.clone()).or_default();
            for m in &q.minutes {
                let at = minute_of(m.minute);
                let slot = minutes
                    .entry(at)
                    .or_insert_with(|| MinuteCounts::new(at, 0, 0, 0));
                slot.processed += m.processed;
                slot.failed += m.failed;
                slot.dead += m.dead;
            }
            minutes.retain(|at, _| *at >= keep_from);
        }
        Ok(())
    }

    async fn workers(&self) -> Result<Vec<WorkerReport>, BrokerError> {
        let now = self.now();
        let mut mem = self.mem();
        mem.workers.retain(|_, (_, until)| *until > now);
        let mut out: Vec<WorkerReport> = mem.workers.values().map(|(w, _)| w.clone()).collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn throughput(
        &self,
        queue: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteCounts>, BrokerError> {
        let from = minute_of(since);
        Ok(self
            .mem()
            .minutes
            .get(queue)
            .map(|m| {
                m.range(from..)
                    .map(|(_, c)| *c)
                    .filter(|c| !c.is_empty())
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn delayed(&self, queue: &str, limit: usize) -> Result<Vec<DelayedJob>, BrokerError> {
        let mem = self.mem();
        let now = self.now();
        let Some(q) = mem.queues.get(queue) else {
            return Ok(Vec::new());
        };
        Ok(q.waiting
            .iter()
            .filter(|((due, _), _)| *due > now)
            .take(limit)
            .map(|((due, _), stored)| {
                // The stored attempt is the attempts spent; a claim makes it the next one (a
                // dead letter's first delivery keeps it, as `claim` does).
                let e = &stored.envelope;
                let attempt = if stored.unread_dead {
                    e.attempt().max(1)
                } else {
                    e.attempt().saturating_add(1)
                };
                DelayedJob::new(e.id().to_string(), e.kind(), *due, attempt)
            })
            .collect())
    }
}
