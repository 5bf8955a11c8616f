//! Extractors: the arguments of a handler after its message.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::envelope::Envelope;

/// What a delivery offers to extractors: the job's envelope, its queue and the service's state.
#[derive(Debug)]
pub struct JobContext {
    queue: Arc<str>,
    envelope: Envelope,
    state: Arc<State>,
    cancellation: Cancellation,
    /// Where the job's progress goes (the runtime's contexts have one).
    keeper: Option<crate::results::Keeper>,
    /// The job's flow, when it belongs to one.
    flow: Option<Arc<FlowInfo>>,
}

impl JobContext {
    /// A context for one delivery.
    pub fn new(queue: Arc<str>, envelope: Envelope, state: Arc<State>) -> Self {
        Self {
            queue,
            envelope,
            state,
            cancellation: Cancellation::default(),
            keeper: None,
            flow: None,
        }
    }
    /// The context the runtime gives a delivery: `cancellation` as the job's, without making
    /// a token of its own first (as [`new`](Self::new) then
    /// [`with_cancellation`](Self::with_cancellation) would, an allocation per job).
    pub(crate) fn of_delivery(
        queue: Arc<str>,
        envelope: Envelope,
        state: Arc<State>,
        cancellation: Cancellation,
        keeper: crate::results::Keeper,
        flow: Option<Arc<FlowInfo>>,
    ) -> Self {
        Self {
            queue,
            envelope,
            state,
            cancellation,
            keeper: Some(keeper),
            flow,
        }
    }
    /// The context with `cancellation` as the job's (the runtime's, fired by
    /// [`DeadLetters::cancel`](crate::DeadLetters::cancel)).
    pub fn with_cancellation(mut self, cancellation: Cancellation) -> Self {
        self.cancellation = cancellation;
        self
    }
    /// The queue the job was delivered from.
    pub fn queue(&self) -> &str {
        &self.queue
    }
    /// The job's envelope (attempt is this delivery's number, 1 for the first).
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }
    /// Where the job's progress goes, when the runtime made this context.
    pub(crate) fn keeper(&self) -> Option<&crate::results::Keeper> {
        self.keeper.as_ref()
    }
    /// A value the service registered with [`Service::state`](crate::Service::state).
    pub fn state<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.state.get::<T>()
    }
}

/// Values shared by every handler of a service, one per type.
#[derive(Default)]
pub struct State {
    map: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
}

impl State {
    /// Stores `value`, replacing any earlier value of its type.
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        self.map.insert(TypeId::of::<T>(), Box::new(value));
    }
    /// The value of type `T`.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.map
            .get(&TypeId::of::<T>())
            .and_then(|b| b.downcast_ref())
    }
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("State")
            .field("values", &self.map.len())
            .finish()
    }
}

/// Why an extractor refused a delivery. The attempt fails with this as its error.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Rejection(pub String);

/// A running job's cancellation, as its handler sees it: `cancel: Cancellation` among the
/// handler's arguments. [`DeadLetters::cancel`](crate::DeadLetters::cancel) (or
/// `stagedoor-jobs cancel`) of a running job fires it within about a third of the lease; the
/// handler may stop early (`cancel.cancelled().await` in a `select!`, or `is_cancelled()`
/// between steps). Whatever it returns then, the job is dropped, recorded as cancelled (the
/// log, the `TestApp`'s `Outcome::Cancelled`): a cancelled job is never retried.
#[derive(Clone, Debug, Default)]
pub struct Cancellation(Arc<CancelState>);

/// A flag and the handlers waiting on it: one allocation per job, and no lock to drop it
/// (a `tokio_util` `CancellationToken` is a node of a tree behind a mutex, which a job that is
/// never a parent does not need).
#[derive(Debug, Default)]
struct CancelState {
    fired: std::sync::atomic::AtomicBool,
    waiters: tokio::sync::Notify,
}

impl Cancellation {
    /// Whether the job was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.0.fired.load(std::sync::atomic::Ordering::Acquire)
    }
    /// Waits until the job is cancelled (forever if it never is).
    pub async fn cancelled(&self) {
        loop {
            let notified = self.0.waiters.notified();
            tokio::pin!(notified);
            // Registered before the flag is read: a `cancel` in between still wakes it.
            notified.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
    /// Fires it.
    pub(crate) fn cancel(&self) {
        self.0
            .fired
            .store(true, std::sync::atomic::Ordering::Release);
        self.0.waiters.notify_waiters();
    }
}

impl FromJob for Cancellation {
    fn from_job(job: &JobContext) -> Result<Self, Rejection> {
        Ok(job.cancellation.clone())
    }
}

/// A handler argument taken from the delivery.
///
/// Implemented by [`Ctx<K>`] for every key of [`keys`], by [`Data<T>`] and by [`Cancellation`]; implement it for
/// your own types to extract anything else from a [`JobContext`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an extractor, so it cannot be an argument of a job handler",
    label = "not an extractor",
    note = "a handler takes its message first (`msg: &T`); every other argument is an extractor: `Ctx<keys::Attempt>`, `Ctx<keys::JobId>`, `Ctx<keys::Kind>`, `Ctx<keys::EnqueuedAt>`, `Ctx<keys::RequestId>`, `Ctx<keys::Trace>`, `Ctx<keys::Queue>`, `Data<T>`, `Cancellation`, `JobProgress`, `FlowInfo`",
    note = "or implement `stagedoor_jobs::FromJob` for `{Self}`"
)]
pub trait FromJob: Sized + Send + 'static {
    /// Takes the value from the delivery, or refuses it (a failed attempt).
    fn from_job(job: &JobContext) -> Result<Self, Rejection>;
}

/// A key of the job context that [`Ctx`] extracts.
pub trait Key: Send + 'static {
    /// The value extracted.
    type Value: Send + 'static;
    /// Reads the value.
    fn get(job: &JobContext) -> Self::Value;
}

/// A value of the job context: `Ctx(attempt): Ctx<keys::Attempt>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ctx<K: Key>(pub K::Value);

impl<K: Key> FromJob for Ctx<K> {
    fn from_job(job: &JobContext) -> Result<Self, Rejection> {
        Ok(Ctx(K::get(job)))
    }
}

/// The keys [`Ctx`] reads.
pub mod keys {
    use super::*;

    /// The delivery's attempt, `Some(1)` for the first. Every broker of stagedoor-jobs counts
    /// attempts, so it is always `Some`; it is an `Option` for brokers that do not.
    #[derive(Debug)]
    pub struct Attempt;
    impl Key for Attempt {
        type Value = Option<u32>;
        fn get(job: &JobContext) -> Option<u32> {
            Some(job.envelope().attempt())
        }
    }

    /// The job's id, the same on every attempt.
    #[derive(Debug)]
    pub struct JobId;
    impl Key for JobId {
        type Value = crate::JobId;
        fn get(job: &JobContext) -> crate::JobId {
            job.envelope().id().clone()
        }
    }

    /// The job's kind.
    #[derive(Debug)]
    pub struct Kind;
    impl Key for Kind {
        type Value = String;
        fn get(job: &JobContext) -> String {
            job.envelope().kind().to_owned()
        }
    }

    /// When the job was enqueued.
    #[derive(Debug)]
    pub struct EnqueuedAt;
    impl Key for EnqueuedAt {
        type Value = DateTime<Utc>;
        fn get(job: &JobContext) -> DateTime<Utc> {
            job.envelope().enqueued_at()
        }
    }

    /// The request id the publisher set, if any.
    #[derive(Debug)]
    pub struct RequestId;
    impl Key for RequestId {
        type Value = Option<String>;
        fn get(job: &JobContext) -> Option<String> {
            job.envelope().headers().request_id.clone()
        }
    }

    /// The trace the publisher set, if any.
    #[derive(Debug)]
    pub struct Trace;
    impl Key for Trace {
        type Value = Option<String>;
        fn get(job: &JobContext) -> Option<String> {
            job.envelope().headers().trace.clone()
        }
    }

    /// The queue the job came from.
    #[derive(Debug)]
    pub struct Queue;
    impl Key for Queue {
        type Value = String;
        fn get(job: &JobContext) -> String {
            job.queue().to_owned()
        }
    }
}

/// A value the service registered with [`Service::state`](crate::Service::state), cloned for
/// the handler: a database pool, an HTTP client.
#[derive(Clone, Debug)]
pub struct Data<T>(pub T);

impl<T: Clone + Send + Sync + 'static> FromJob for Data<T> {
    fn from_job(job: &JobContext) -> Result<Self, Rejection> {
        job.state::<T>().cloned().map(Data).ok_or_else(|| {
            Rejection(format!(
                "no service state of type `{}`: register it with `Service::state(value)`",
                std::any::type_name::<T>()
            ))
        })
    }
}

/// A handler's argument to report progress: `progress: JobProgress`, then
/// `progress.set(0.5, "half of the pages").await`. The latest report is readable by the job's id
/// from any process ([`Results::progress`](crate::Results::progress)); a failed write is returned, and the job goes on.
#[derive(Clone, Debug)]
pub struct JobProgress {
    job_id: crate::JobId,
    keeper: Option<crate::results::Keeper>,
}

impl JobProgress {
    /// Records `fraction` (kept within 0.0 to 1.0; not a number reads as 0) and `message` (cut
    /// at [`MAX_PROGRESS_MESSAGE`](crate::results::MAX_PROGRESS_MESSAGE) characters) as the job's latest progress.
    pub async fn set(
        &self,
        fraction: f32,
        message: impl Into<String>,
    ) -> Result<(), crate::BrokerError> {
        let Some(keeper) = &self.keeper else {
            return Err(crate::BrokerError::Backend(
                "this job context has no broker to keep progress in (a context made by hand, outside the runtime)".into(),
            ));
        };
        let fraction = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        let mut message: String = message.into();
        if let Some((cut, _)) = message
            .char_indices()
            .nth(crate::results::MAX_PROGRESS_MESSAGE)
        {
            message.truncate(cut);
        }
        let p = crate::results::Progress {
            fraction,
            message,
            at: keeper.sink.now(),
        };
        let value =
            serde_json::to_vec(&p).map_err(|e| crate::BrokerError::Backend(e.to_string()))?;
        let key = crate::results::progress_key(self.job_id.as_str());
        keeper.sink.put(key, value.into(), keeper.retention).await
    }
}

impl FromJob for JobProgress {
    fn from_job(job: &JobContext) -> Result<Self, Rejection> {
        Ok(JobProgress {
            job_id: job.envelope().id().clone(),
            keeper: job.keeper().cloned(),
        })
    }
}

/// What a flow's job may read of its flow: `flow: FlowInfo` among its handler's arguments (a
/// job outside any flow gets an empty one: [`is_in_flow`](Self::is_in_flow) is false). For a batch's callback, its
/// parents are the batch's jobs: [`succeeded`](Self::succeeded) and [`failed`](Self::failed)
/// are the batch's counts and failed ids.
#[derive(Clone, Default)]
pub struct FlowInfo {
    flow: String,
    parents: Vec<String>,
    succeeded: Vec<String>,
    failed: Vec<String>,
    sink: Option<Arc<dyn crate::results::RecordSink>>,
}

impl fmt::Debug for FlowInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlowInfo")
            .field("flow", &self.flow)
            .field("parents", &self.parents)
            .field("succeeded", &self.succeeded)
            .field("failed", &self.failed)
            .finish()
    }
}

impl FlowInfo {
    pub(crate) fn new(
        flow: String,
        parents: Vec<String>,
        succeeded: Vec<String>,
        failed: Vec<String>,
        sink: Arc<dyn crate::results::RecordSink>,
    ) -> Self {
        Self {
            flow,
            parents,
            succeeded,
            failed,
            sink: Some(sink),
        }
    }
    /// Whether the job belongs to a flow or a batch.
    pub fn is_in_flow(&self) -> bool {
        !self.flow.is_empty()
    }
    /// The flow's (or batch's) id; empty outside any flow.
    pub fn flow_id(&self) -> &str {
        &self.flow
    }
    /// The jobs this one waited for.
    pub fn parents(&self) -> &[String] {
        &self.parents
    }
    /// The parents that succeeded, when this job was delivered.
    pub fn succeeded(&self) -> &[String] {
        &self.succeeded
    }
    /// The parents that failed (dead-lettered, dropped, cancelled) or were skipped.
    pub fn failed(&self) -> &[String] {
        &self.failed
    }
    /// The results the parents that succeeded returned (those that returned one and whose
    /// result has not run out), read now, by job id.
    pub async fn parent_results(
        &self,
    ) -> Result<std::collections::BTreeMap<String, crate::JobResult>, crate::BrokerError> {
        let mut out = std::collections::BTreeMap::new();
        let Some(sink) = &self.sink else {
            return Ok(out);
        };
        for id in &self.succeeded {
            if let Some(r) = sink.result(id.clone()).await? {
                out.insert(id.clone(), r);
            }
        }
        Ok(out)
    }
}

impl FromJob for FlowInfo {
    fn from_job(job: &JobContext) -> Result<Self, Rejection> {
        Ok(job.flow.as_deref().cloned().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Cancellation;

    #[tokio::test]
    async fn a_cancellation_wakes_every_waiter_and_stays_fired() {
        let c = Cancellation::default();
        assert!(!c.is_cancelled());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move { c.cancelled().await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(waiters.iter().all(|w| !w.is_finished()), "none woke early");
        c.clone().cancel();
        for w in waiters {
            tokio::time::timeout(Duration::from_secs(5), w)
                .await
                .expect("woken by the cancel")
                .expect("the waiter");
        }
        assert!(c.is_cancelled());
        // A wait that starts after the cancel returns at once.
        tokio::time::timeout(Duration::from_secs(5), c.cancelled())
            .await
            .expect("already fired");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancel_racing_the_start_of_a_wait_is_never_missed() {
        for _ in 0..500 {
            let c = Cancellation::default();
            let w = {
                let c = c.clone();
                tokio::spawn(async move { c.cancelled().await })
            };
            c.cancel();
            tokio::time::timeout(Duration::from_secs(5), w)
                .await
                .expect("a cancel during the wait's start still wakes it")
                .expect("the waiter");
        }
    }
}
