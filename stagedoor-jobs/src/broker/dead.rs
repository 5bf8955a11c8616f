//! The dead letters of a backend: [`DeadLetters`] (listing, replaying, purging, and
//! cancelling a job), the values it exchanges, and the rule that refuses a live queue as a dead
//! letter ([`ensure_dead_letter`]).

use std::future::Future;

use chrono::{DateTime, Utc};

use super::{Activity, BrokerError, Cancelled, Inspect};
use crate::envelope::{Envelope, JobId};

/// A dead letter: the job as it was, plus why and when it failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The dead letter's own id in the backend (a stream entry id, a row id).
    pub id: String,
    /// The job as it was when it failed (attempt = attempts spent).
    pub envelope: Envelope,
    /// The queue it failed on, where a replay sends it.
    pub origin: String,
    /// The last error.
    pub error: String,
    /// The last traceback.
    pub traceback: String,
    /// Attempts spent.
    pub attempts: u32,
    /// When it was dead-lettered.
    pub failed_at: DateTime<Utc>,
}

/// Which dead letters a list, replay or purge takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeadSelector {
    /// One, by its dead-letter id (or job id).
    Id(String),
    /// Every dead letter of a kind.
    Kind(String),
    /// Every dead letter.
    All,
}

impl DeadSelector {
    /// Whether `d` is selected.
    pub fn matches(&self, d: &DeadLetter) -> bool {
        match self {
            DeadSelector::Id(id) => d.id == *id || d.envelope.id().as_str() == id,
            DeadSelector::Kind(k) => d.envelope.kind() == k,
            DeadSelector::All => true,
        }
    }
}

/// What a replay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Moved back to their queue with attempts reset.
    pub replayed: u64,
    /// Selected but left where they were (already replayed by someone else).
    pub skipped: u64,
    /// Selected but could not be moved (the error is logged).
    pub failed: u64,
}

/// The dead letters of a backend: listing, replaying and purging them, each replay one atomic
/// step per letter (an interrupted replay loses and duplicates nothing).
pub trait DeadLetters: Inspect {
    /// The dead letters in `dead` that `selector` takes, newest first, at most `limit`.
    fn dead_letters(
        &self,
        dead: &str,
        selector: &DeadSelector,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, BrokerError>> + Send;

    /// Moves the selected dead letters back to the queue each failed on, attempts reset, each in
    /// one atomic step (an interrupted replay loses and duplicates nothing).
    fn replay(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> impl Future<Output = Result<ReplayReport, BrokerError>> + Send;

    /// Deletes the selected dead letters; returns how many.
    fn purge(
        &self,
        dead: &str,
        selector: &DeadSelector,
    ) -> impl Future<Output = Result<u64, BrokerError>> + Send;

    /// Refuses `name` unless it is a dead letter that [`replay`](DeadLetters::replay) and
    /// [`purge`](DeadLetters::purge) may act on ([`BrokerError::Invalid`], saying what a dead
    /// letter is here): both call it first, and a tool (a dashboard) asks it before it shows a
    /// confirmation. The backends apply [`ensure_dead_letter`]; the default accepts every
    /// name, which a backend of a user's own should override.
    fn check_dead_letter(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<(), BrokerError>> + Send {
        let _ = name;
        async { Ok(()) }
    }

    /// The oldest dead letter of `dead` (the one that made it non-empty), if any: what the
    /// monitor names a dead-letter incident by. A backend reads one entry; the default lists
    /// every dead letter and keeps the last, which a backend of a user's own should override.
    fn oldest_dead_letter(
        &self,
        dead: &str,
    ) -> impl Future<Output = Result<Option<DeadLetter>, BrokerError>> + Send {
        async move {
            Ok(self
                .dead_letters(dead, &DeadSelector::All, usize::MAX)
                .await?
                .pop())
        }
    }

    /// How many dead letters `dead` holds.
    fn dead_len(&self, dead: &str) -> impl Future<Output = Result<u64, BrokerError>> + Send;

    /// Cancels job `id` of `queue`: a waiting or delayed job is removed (it will not run); a
    /// running one is marked, so that its handler's [`Cancellation`](crate::Cancellation) fires
    /// (the runtime asks [`Broker::cancelled`](super::Broker::cancelled) every third of the lease)
    /// and it is dropped when its handler returns, recorded as cancelled. The default cannot cancel
    /// and says so.
    fn cancel(
        &self,
        queue: &str,
        id: &JobId,
    ) -> impl Future<Output = Result<Cancelled, BrokerError>> + Send {
        let _ = (queue, id);
        async {
            Err(BrokerError::Backend(format!(
                "the {} broker cannot cancel jobs: implement `DeadLetters::cancel` and `Broker::cancelled`",
                self.backend()
            )))
        }
    }

    /// The dead letter a failure goes to when the mount declares none (a job of a kind nobody
    /// handles, a payload that cannot be parsed): `<stream>:dead`, `<group>.dead`.
    fn default_dead_letter(&self, queue: &str) -> String;
}

/// Whether `name` is named as a dead letter by `suffix` (`emails.dead` by `.dead`): it ends
/// with the suffix, after a queue's name. The rule [`ensure_dead_letter`] applies first.
pub fn named_dead_letter(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() && name.ends_with(suffix)
}

/// Refuses an operator's replay or purge of `name` unless it is a dead letter, so that no tool (a
/// dashboard trusting its URL, a script with a typo) moves or deletes the jobs of a live queue. A
/// dead letter is named as the backend names them (`suffix`: `.dead` for `emails.dead`, `:dead` on
/// Redis, `_dead` for a dead-letter table), or declared by a mount: of this process (`declared`,
/// what [`Broker::check`](super::Broker::check) was told) or of a live worker, as its report says
/// ([`WorkerQueue::dead_letters`](crate::activity::WorkerQueue::dead_letters)). The error says what
/// is a dead letter here.
pub async fn ensure_dead_letter<B: Activity>(
    b: &B,
    name: &str,
    suffix: &str,
    declared: &[String],
) -> Result<(), BrokerError> {
    if named_dead_letter(name, suffix) || declared.iter().any(|d| d == name) {
        return Ok(());
    }
    let mut known: Vec<String> = declared.to_vec();
    for w in b.workers().await? {
        for q in w.queues {
            for d in q.dead_letters {
                if d == name {
                    return Ok(());
                }
                if !known.contains(&d) {
                    known.push(d);
                }
            }
        }
    }
    known.sort();
    let declared = if known.is_empty() {
        String::new()
    } else {
        let shown: Vec<String> = known.iter().take(10).map(|d| format!("`{d}`")).collect();
        format!(" ({} here)", shown.join(", "))
    };
    Err(BrokerError::Invalid(format!(
        "`{name}` is not a dead letter, so nothing was replayed or purged: a dead letter is named `<queue>{suffix}` (the one of queue `{name}` is `{name}{suffix}`) or declared by a mount's `.dead_letter(..)`{declared}"
    )))
}
