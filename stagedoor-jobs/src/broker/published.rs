//! [`Published`]: what publishing one job did (its id as stored, whether this publish stored
//! it), and the log line of a job not stored twice.

use std::fmt;

use crate::envelope::JobId;

/// What publishing one job did: the id it is stored under, and whether this publish stored it.
///
/// One id per job everywhere: [`id`](Published::id) is the id the job's handler sees
/// (`Ctx<keys::JobId>`), its dead letter keeps
/// ([`DeadLetter::envelope`](crate::broker::DeadLetter::envelope)) and the CLI shows. It is the
/// id the job was published with, except on a SQL table whose id the database generates and
/// that has no headers column: there the job is known by its new row id. It is also what the
/// report displays as (`println!("published {p}")` prints the id).
///
/// A job whose id was already in its queue (waiting, delayed, running, or earlier in the same
/// batch) is not stored again: [`is_stored`](Published::is_stored) is `false`, and the job
/// already there is the one that runs.
///
/// ```
/// # async fn f(broker: impl stagedoor_jobs::Broker) -> Result<(), Box<dyn std::error::Error>> {
/// use stagedoor_jobs::{Job, JobId, Publish};
/// let id = JobId::from_string("invoice-42");
/// let first = broker.publish_job(Job::new("billing", &42)?.id(id.clone())).await?;
/// let again = broker.publish_job(Job::new("billing", &42)?.id(id.clone())).await?;
/// assert!(first.is_stored());
/// assert!(!again.is_stored(), "invoice-42 was already waiting: nothing added");
/// assert_eq!(again.id(), &id);
/// println!("published {first}"); // prints the id: "published invoice-42"
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    id: JobId,
    stored: bool,
}

impl Published {
    /// A report: the job is known as `id`; `stored` is whether this publish added it.
    pub fn new(id: JobId, stored: bool) -> Self {
        Self { id, stored }
    }

    /// A job this publish stored under `id`.
    pub fn stored(id: JobId) -> Self {
        Self::new(id, true)
    }

    /// A job whose id `id` was already in the queue: nothing was added.
    pub fn already_there(id: JobId) -> Self {
        Self::new(id, false)
    }

    /// The job's id as stored: what its handler, its dead letter and the CLI show.
    pub fn id(&self) -> &JobId {
        &self.id
    }

    /// The job's id, by value.
    pub fn into_id(self) -> JobId {
        self.id
    }

    /// `true` when this publish stored the job; `false` when a job with this id was already
    /// in the queue (or earlier in the same batch) and nothing was added.
    pub fn is_stored(&self) -> bool {
        self.stored
    }
}

/// Shows the job's id as stored ([`id`](Published::id)), whether or not this publish stored
/// it: `println!("published {p}")` prints `published invoice-42`.
impl fmt::Display for Published {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.id, f)
    }
}

/// Logs a job a publish did not store because its id was already in the queue (info level:
/// a duplicate publish is worth seeing, not an error).
pub fn log_not_stored(queue: &str, id: &JobId) {
    tracing::info!(queue, job_id = %id, "a job with this id is already in the queue: not added twice");
}

#[cfg(test)]
mod tests {
    use super::Published;
    use crate::envelope::JobId;

    /// A report displays as its id, stored or not.
    #[test]
    fn displays_its_id() {
        let id = JobId::from_string("invoice-42");
        assert_eq!(Published::stored(id.clone()).to_string(), "invoice-42");
        assert_eq!(
            format!("published {}", Published::already_there(id)),
            "published invoice-42"
        );
    }
}
