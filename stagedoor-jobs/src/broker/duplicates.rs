//! What recognises a job published twice: the guard a unique job takes
//! ([`unique_guard_of`], given back by [`release_unique`]) and a schedule tick's job id
//! ([`tick_job_id`]).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Broker, BrokerError};
use crate::envelope::{Envelope, JobId};

/// Frees the unique key ([`Job::unique`](crate::Job::unique)) of job `id` of `queue`, whose headers
/// are `headers`, if the job holds it: a backend's
/// [`DeadLetters::cancel`](super::DeadLetters::cancel) calls it for a job it removed before it ran,
/// so that the key takes a new job at once. Nothing for a job that is not unique.
pub async fn release_unique<B: Broker>(
    broker: &B,
    queue: &str,
    headers: &crate::Headers,
    id: &JobId,
) -> Result<(), BrokerError> {
    if let Some((key, _)) = crate::envelope::unique_of(headers) {
        let guard = crate::envelope::unique_guard(queue, key);
        broker
            .finish_guard(queue, &guard, id, Duration::ZERO)
            .await?;
    }
    Ok(())
}

/// The guard a unique job ([`Job::unique`](crate::Job::unique)) takes with it when published on
/// `queue` at `now` (due at `at`), and how long it holds it before the job settles: what
/// [`Publish::publish_job`](super::Publish::publish_job) passes to [`Broker::publish_once`], and
/// what a backend's own publish path (a job in the caller's transaction) takes the same way. `None`
/// for a job that is not unique.
pub fn unique_guard_of(
    queue: &str,
    envelope: &Envelope,
    at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Option<(String, Duration)> {
    let (key, window) = crate::envelope::unique_of(envelope.headers())?;
    let guard = crate::envelope::unique_guard(queue, key);
    let delay = at.and_then(|a| (a - now).to_std().ok()).unwrap_or_default();
    Some((
        guard,
        window
            .saturating_add(crate::envelope::UNIQUE_PENDING_MAX)
            .saturating_add(delay),
    ))
}

/// A derived job id for a schedule tick, so a duplicate enqueue of the tick is recognised.
pub fn tick_job_id(schedule: &str, tick: DateTime<Utc>) -> JobId {
    JobId::from_string(format!("{schedule}@{}", tick.timestamp()))
}
