//! [`Publish`]: publishing [`Job`](crate::Job)s straight through a broker, for producers that
//! run no service.

use std::future::Future;

use chrono::{DateTime, Utc};

use super::{Broker, BrokerError, Published, unique_guard_of};
use crate::envelope::Envelope;

/// Jobs of one queue for [`Broker::publish`]: each envelope with its due time.
type Batch = Vec<(Envelope, Option<DateTime<Utc>>)>;

/// Publishing straight through a broker, for producers that run no service: connect it
/// ([`Inspect::connect`](super::Inspect::connect)), then publish [`Job`](crate::Job)s one at a time
/// or in batches.
///
/// ```no_run
/// use stagedoor_jobs::broker::{Inspect, Publish};
/// use stagedoor_jobs::Job;
///
/// async fn enqueue(broker: &impl Publish) -> Result<(), Box<dyn std::error::Error>> {
///     broker.connect().await?;
///     let jobs = (0..1000).map(|n| Job::new("emails", &n)).collect::<Result<Vec<_>, _>>()?;
///     let published = broker.publish_jobs(jobs).await?; // one round trip per queue
///     assert!(published.iter().all(|p| p.is_stored()));
///     Ok(())
/// }
/// ```
pub trait Publish: Broker {
    /// Publishes one job now, at its time or after its delay; returns its id as stored and
    /// whether it was stored (see [`Published`]). A queue name the backend cannot take
    /// ([`Broker::queue_name_problem`]) is refused with [`BrokerError::Invalid`].
    fn publish_job(
        &self,
        job: crate::Job,
    ) -> impl Future<Output = Result<Published, BrokerError>> + Send {
        async move {
            if let Some(p) = self
                .queue_name_problem(job.queue())
                .or_else(|| job.problem())
            {
                return Err(BrokerError::Invalid(p));
            }
            let now = self.clock().now();
            let (queue, envelope, at) = job.into_parts(now);
            if let Some((guard, ttl)) = unique_guard_of(&queue, &envelope, at, now) {
                return self.publish_once(&queue, (envelope, at), &guard, ttl).await;
            }
            let id = envelope.id().clone();
            let mut out = self.publish(&queue, vec![(envelope, at)]).await?;
            match out.pop() {
                Some(p) if out.is_empty() => Ok(p),
                _ => Err(BrokerError::Backend(format!(
                    "the {} broker reported {} results for one published job `{id}`: expected one",
                    self.backend(),
                    out.len() + 1
                ))),
            }
        }
    }

    /// Publishes jobs in one [`publish`](Broker::publish) call per queue (the jobs of a queue
    /// land all or none); returns one [`Published`] per job, in order: its id as stored and
    /// whether it was stored (a job whose id was already in the queue, or earlier in the
    /// batch, is not). Jobs of several queues are grouped by queue, in order of first
    /// appearance. Unique jobs ([`Job::unique`](crate::Job::unique)) are published one at a
    /// time after the batches, each with its key in one step (not all or none with the rest).
    /// A queue name the backend cannot take ([`Broker::queue_name_problem`]) refuses the whole
    /// call with [`BrokerError::Invalid`], before anything is stored.
    fn publish_jobs<I>(
        &self,
        jobs: I,
    ) -> impl Future<Output = Result<Vec<Published>, BrokerError>> + Send
    where
        I: IntoIterator<Item = crate::Job>,
    {
        let now = self.clock().now();
        let jobs: Vec<crate::Job> = jobs.into_iter().collect();
        // A queue name the backend cannot take refuses the whole call, before anything is
        // stored.
        let refused = jobs
            .iter()
            .find_map(|j| self.queue_name_problem(j.queue()).or_else(|| j.problem()));
        // For each job: its queue's batch and its place in that batch.
        let mut places = Vec::new();
        let mut by_queue: Vec<(String, Batch)> = Vec::new();
        let mut unique: Vec<crate::Job> = Vec::new();
        for job in jobs {
            if job.is_unique() {
                places.push((usize::MAX, unique.len()));
                unique.push(job);
                continue;
            }
            let (queue, envelope, at) = job.into_parts(now);
            let b = match by_queue.iter().position(|(q, _)| *q == queue) {
                Some(b) => b,
                None => {
                    by_queue.push((queue, Vec::new()));
                    by_queue.len() - 1
                }
            };
            places.push((b, by_queue[b].1.len()));
            by_queue[b].1.push((envelope, at));
        }
        async move {
            if let Some(p) = refused {
                return Err(BrokerError::Invalid(p));
            }
            let mut reports = Vec::with_capacity(by_queue.len());
            for (queue, batch) in by_queue {
                let n = batch.len();
                let got = self.publish(&queue, batch).await?;
                if got.len() != n {
                    return Err(BrokerError::Backend(format!(
                        "the {} broker reported {} results for {n} jobs published to `{queue}`",
                        self.backend(),
                        got.len()
                    )));
                }
                reports.push(got.into_iter().map(Some).collect::<Vec<_>>());
            }
            let mut uniques = Vec::with_capacity(unique.len());
            for job in unique {
                uniques.push(Some(self.publish_job(job).await?));
            }
            places
                .into_iter()
                .map(|(b, i)| {
                    let slot = if b == usize::MAX {
                        &mut uniques[i]
                    } else {
                        &mut reports[b][i]
                    };
                    slot.take().ok_or_else(|| {
                        BrokerError::Backend("a published job was reported twice".to_owned())
                    })
                })
                .collect()
        }
    }
}

impl<B: Broker> Publish for B {}
