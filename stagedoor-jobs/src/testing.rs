//! `TestApp`: run the production service in a test, on a clock the test moves, and assert what
//! happened to every job.
//!
//! ```
//! use std::time::Duration;
//! use stagedoor_jobs::prelude::*;
//! use stagedoor_jobs::testing::Outcome;
//!
//! #[subscriber("emails")]
//! async fn send(to: &String, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
//!     if attempt < Some(4) { HandlerOutcome::retry() } else { HandlerOutcome::ack() }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let service = Service::new(AppInfo::new("mailer", "0.1.0")).with_broker(MemoryBroker::new(), |b| {
//!     b.include(send)
//!         .max_attempts(nonzero!(5u32))
//!         .dead_letter("emails.dead")
//!         .backoff(Exponential::new(Duration::from_secs(1), Duration::from_secs(60)));
//! });
//! let app = TestApp::start(service).await.unwrap();
//! // On the paused clock, `publish` returns once the job due now has settled: the first
//! // attempt ran and was retried (its retry is due in 1 s).
//! let published = app.publish(Job::new("emails", "ada@example.com").unwrap()).await.unwrap();
//! assert!(published.is_stored());
//! assert_eq!(app.outcomes("send").len(), 1);
//! // One advance runs the whole chain of delayed retries: 1 s, 2 s, 4 s.
//! app.advance(Duration::from_secs(120)).await;
//! let outcomes: Vec<_> = app.outcomes("send").into_iter().map(|r| r.outcome).collect();
//! assert_eq!(outcomes.len(), 4);
//! assert!(matches!(outcomes[3], Outcome::Acked));
//! app.stop().await;
//! # }
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::broker::{
    BrokerError, DeadLetter, DeadSelector, Published, QueueStats, ReplayReport, Settlement,
};
use crate::clock::Clock;
use crate::envelope::{Envelope, Job, JobId};
use crate::outcome::FailureCause;
use crate::runtime::{ErasedRoute, Observer};
use crate::service::{Running, Service, ServiceError};

/// What happened to one delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `ack()` (or `Ok(())`).
    Acked,
    /// `drop()`.
    Dropped,
    /// Cancelled while running ([`DeadLetters::cancel`](crate::DeadLetters::cancel)): dropped,
    /// whatever the handler answered.
    Cancelled,
    /// A failed attempt, to be retried after `delay`.
    Retried {
        /// The delay before the next attempt.
        delay: Duration,
        /// The error.
        error: String,
        /// What kind of failure.
        cause: FailureCause,
    },
    /// Moved to the dead letter `target`.
    DeadLettered {
        /// The dead letter.
        target: String,
        /// The error.
        error: String,
        /// The traceback.
        traceback: String,
        /// What kind of failure.
        cause: FailureCause,
    },
}

/// One settled delivery, as recorded by the harness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The subscriber that ran it (empty when none could: an unknown kind).
    pub subscriber: String,
    /// The queue.
    pub queue: String,
    /// The job id.
    pub job_id: JobId,
    /// The kind.
    pub kind: String,
    /// This delivery's attempt.
    pub attempt: u32,
    /// What happened.
    pub outcome: Outcome,
}

#[derive(Default)]
struct Recorder {
    records: Mutex<Vec<Record>>,
    /// Jobs cancelled while running, whose next `Drop` is recorded as cancelled.
    cancelled: Mutex<std::collections::HashSet<JobId>>,
}

impl Observer for Recorder {
    fn cancelled(&self, _queue: &str, envelope: &Envelope) {
        self.cancelled
            .lock()
            .expect("recorder lock")
            .insert(envelope.id().clone());
    }

    fn lease_lost(&self, subscriber: &str, queue: &str, envelope: &Envelope) {
        let mut records = self.records.lock().expect("recorder lock");
        if let Some(pos) = records.iter().rposition(|r| {
            r.subscriber == subscriber
                && r.queue == queue
                && r.job_id == *envelope.id()
                && r.attempt == envelope.attempt()
        }) {
            records.remove(pos);
        }
    }

    fn settled(&self, subscriber: &str, queue: &str, envelope: &Envelope, settlement: &Settlement) {
        let outcome = match settlement {
            Settlement::Ack => Outcome::Acked,
            Settlement::Drop
                if self
                    .cancelled
                    .lock()
                    .expect("recorder lock")
                    .remove(envelope.id()) =>
            {
                Outcome::Cancelled
            }
            Settlement::Drop => Outcome::Dropped,
            Settlement::Retry { delay, failure } => Outcome::Retried {
                delay: *delay,
                error: failure.error.clone(),
                cause: failure.cause,
            },
            Settlement::DeadLetter { target, failure } => Outcome::DeadLettered {
                target: target.clone(),
                error: failure.error.clone(),
                traceback: failure.traceback.clone(),
                cause: failure.cause,
            },
        };
        self.records.lock().expect("recorder lock").push(Record {
            subscriber: subscriber.to_owned(),
            queue: queue.to_owned(),
            job_id: envelope.id().clone(),
            kind: envelope.kind().to_owned(),
            attempt: envelope.attempt(),
            outcome,
        });
    }
}

/// A running service under test. See the [module docs](self).
pub struct TestApp {
    running: Option<Running>,
    routes: Vec<Arc<dyn ErasedRoute>>,
    clock: Clock,
    live: bool,
    recorder: Arc<Recorder>,
    /// The longest `drain` waits before it panics with what is still busy.
    pub drain_timeout: Duration,
}

impl std::fmt::Debug for TestApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestApp")
            .field("live", &self.live)
            .finish_non_exhaustive()
    }
}

impl TestApp {
    /// Starts `service` in this process on a paused clock: no delay passes until
    /// [`advance`](Self::advance) moves it. Every broker of the service must be able to follow
    /// the harness's clock (the in-memory broker does); for Redis or SQL use
    /// [`start_live`](Self::start_live).
    pub async fn start(mut service: Service) -> Result<Self, ServiceError> {
        let clock = Clock::manual(Utc::now());
        for route in &service.routes {
            if !route.use_clock(&clock) {
                return Err(ServiceError::Harness(format!(
                    "TestApp::start runs on a paused clock, which the {} broker cannot follow (its server keeps its own time): use TestApp::start_live",
                    route.backend()
                )));
            }
        }
        service.clock = clock.clone();
        Self::launch(service, clock, false).await
    }

    /// Starts `service` on the real clock, against its real brokers: `advance(d)` waits `d`.
    pub async fn start_live(service: Service) -> Result<Self, ServiceError> {
        Self::launch(service, Clock::system(), true).await
    }

    async fn launch(mut service: Service, clock: Clock, live: bool) -> Result<Self, ServiceError> {
        let recorder = Arc::new(Recorder::default());
        service.observers.push(recorder.clone());
        let routes = service.routes.clone();
        let running = service.start().await?;
        Ok(Self {
            running: Some(running),
            routes,
            clock,
            live,
            recorder,
            drain_timeout: Duration::from_secs(30),
        })
    }

    /// The harness's time now.
    pub fn now(&self) -> DateTime<Utc> {
        if self.live {
            Utc::now()
        } else {
            self.clock.now()
        }
    }

    fn running(&self) -> &Running {
        self.running.as_ref().expect("the TestApp is running")
    }

    /// The running service's health (see [`Running::health`]).
    pub fn health(&self) -> crate::Health {
        self.running().health()
    }

    /// Publishes a job as the service's own publisher would; returns its id as stored and
    /// whether it was stored (see [`Published`]: a job whose id is already in its queue is not
    /// added twice).
    ///
    /// On the paused harness ([`start`](Self::start)) a job due now has settled when this
    /// returns: it ran, and so did whatever it caused at the same instant (a retry without
    /// delay, its dead letter's subscriber), the clock unmoved, as [`drain`](Self::drain)
    /// runs them. So a test reads the outcome right after publishing:
    ///
    /// ```ignore
    /// app.publish(Job::new("emails", &mail)?).await?;
    /// assert_eq!(app.outcomes("send").len(), 1);
    /// ```
    ///
    /// A delayed job (`Job::after`, `Job::at`) is only stored: [`advance`](Self::advance) runs
    /// it. A test whose handler waits for something the test does after publishing (a gate it
    /// opens, a shutdown) publishes with [`enqueue`](Self::enqueue), which returns at once;
    /// here `publish` would wait for the handler, then panic after
    /// [`drain_timeout`](Self::drain_timeout).
    ///
    /// On the live harness ([`start_live`](Self::start_live)) `publish` returns once the job is
    /// stored, like a producer's: call [`drain`](Self::drain) before reading the outcome.
    pub async fn publish(&self, job: Job) -> Result<Published, BrokerError> {
        let due_now = !self.live
            && job
                .run_at()
                .resolve(self.now())
                .is_none_or(|t| t <= self.now());
        let published = self.running().publish(job).await?;
        if due_now {
            self.drain_or_panic(|busy| {
                format!(
                    "TestApp::publish: job `{}` has not settled after {:?}: {busy}. On the paused harness a publish waits for the job it makes due; a handler that waits for the test must be published with TestApp::enqueue",
                    published.id(),
                    self.drain_timeout
                )
            })
            .await;
        }
        Ok(published)
    }

    /// Publishes a job and returns as soon as it is stored, on either harness: its handler may
    /// run meanwhile or later ([`drain`](Self::drain) and [`advance`](Self::advance) wait for
    /// it). For a test whose handler waits for something the test does after publishing; to
    /// read a job's outcome, use [`publish`](Self::publish).
    pub async fn enqueue(&self, job: Job) -> Result<Published, BrokerError> {
        self.running().publish(job).await
    }

    /// Cancels job `id` of `queue` ([`Running::cancel`]).
    pub async fn cancel(
        &self,
        queue: &str,
        id: &JobId,
    ) -> Result<crate::broker::Cancelled, BrokerError> {
        self.running().cancel(queue, id).await
    }

    fn subscribed(&self) -> Vec<(&Arc<dyn ErasedRoute>, &str)> {
        let mut out: Vec<(&Arc<dyn ErasedRoute>, &str)> = Vec::new();
        for r in &self.routes {
            for m in r.mounts() {
                if !out
                    .iter()
                    .any(|(r2, q)| Arc::ptr_eq(r2, r) && *q == m.queue)
                {
                    out.push((r, &m.queue));
                }
            }
        }
        out
    }

    /// Runs until every subscribed queue is idle: nothing due, nothing running. Delayed jobs
    /// stay delayed. Panics with what is still busy after [`drain_timeout`](Self::drain_timeout).
    pub async fn drain(&self) {
        self.drain_or_panic(|busy| {
            format!(
                "TestApp::drain: still busy after {:?}: {busy}",
                self.drain_timeout
            )
        })
        .await;
    }

    /// [`drain`](Self::drain), panicking with `message(what is busy)` after the drain timeout.
    async fn drain_or_panic(&self, message: impl Fn(&str) -> String) {
        let started = tokio::time::Instant::now();
        // Deliveries the broker reports as running that no handler of this app holds (a worker
        // that died, a handler abandoned at a shutdown deadline) are not waited for: their
        // lease returns them. The claim itself opens a window of microseconds in which a
        // delivery is the broker's and not yet this app's, so such foreign deliveries are
        // ignored only once they have lasted a moment.
        let mut foreign_since: Option<tokio::time::Instant> = None;
        loop {
            let mut busy = Vec::new();
            let mut pending = 0;
            for (route, queue) in self.subscribed() {
                // Due jobs held back by a global limit cannot start before its first permit
                // runs out: on the paused clock that is for `advance` to reach.
                if !self.live
                    && let Some(r) = &self.running
                    && r.held_back.held_until(queue, self.now()).is_some()
                {
                    continue;
                }
                // A job made due "now" by a retry that settled while the stats were read can
                // count as delayed for an instant: a delayed job due within the margin is busy.
                let soon = self.now() + self.due_margin();
                if let Some(t) = route.next_due(queue).await
                    && t <= soon
                    && !self.is_lease_expiry(route, queue, t).await
                {
                    busy.push(format!("{queue}: a job due at {t}"));
                    continue;
                }
                match route.stats(queue).await {
                    Ok(s) if s.ready == 0 => pending += s.pending,
                    Ok(s) => {
                        busy.push(format!("{queue}: {} ready, {} running", s.ready, s.pending))
                    }
                    Err(e) => busy.push(format!("{queue}: {e}")),
                }
            }
            let in_flight = self
                .running
                .as_ref()
                .map_or(0, |r| r.in_flight.load(std::sync::atomic::Ordering::SeqCst));
            if in_flight > 0 {
                busy.push(format!("{in_flight} handlers running"));
            } else if pending > 0 && busy.is_empty() {
                let since = *foreign_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() < Duration::from_millis(200) {
                    busy.push(format!("{pending} deliveries claimed"));
                }
            } else {
                foreign_since = None;
            }
            if busy.is_empty() {
                return;
            }
            if started.elapsed() > self.drain_timeout {
                panic!("{}", message(&busy.join("; ")));
            }
            tokio::time::sleep(Duration::from_millis(if self.live { 20 } else { 1 })).await;
        }
    }

    /// Whether `t`, a queue's next due time, is only the lease expiry of a running delivery
    /// (which the harness must not wait for).
    async fn is_lease_expiry(
        &self,
        route: &Arc<dyn ErasedRoute>,
        queue: &str,
        t: DateTime<Utc>,
    ) -> bool {
        t > self.now()
            && route
                .stats(queue)
                .await
                .is_ok_and(|s| s.ready == 0 && s.delayed == 0)
    }

    fn due_margin(&self) -> chrono::Duration {
        if self.live {
            chrono::Duration::milliseconds(50)
        } else {
            chrono::Duration::zero()
        }
    }

    /// Moves time forward by `d`, and every delivery due within it happens, in order, including
    /// chains of delayed retries (a backoff of 1, 2, 4, 8 s all runs within one
    /// `advance(2 min)`). On a live app, waits `d` and drains.
    pub async fn advance(&self, d: Duration) {
        if self.live {
            tokio::time::sleep(d).await;
            self.drain().await;
            return;
        }
        let target = crate::clock::later(self.clock.now(), d);
        loop {
            self.scheduler_caught_up().await;
            self.drain().await;
            let mut next: Option<DateTime<Utc>> = self.next_tick();
            // A queue held back by a global limit is due again when its first permit runs out.
            if let Some(r) = &self.running {
                for t in r.held_back.times() {
                    if t > self.clock.now() {
                        next = Some(next.map_or(t, |n| n.min(t)));
                    }
                }
            }
            for (r, q) in self.subscribed() {
                // A job due by now after the drain is held back by a global limit: the time
                // its permit frees (above) is the one to move to, never back to its due time.
                if let Some(t) = r.next_due(q).await
                    && t > self.clock.now()
                {
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
            }
            match next {
                Some(t) if t <= target => self.clock.set(t),
                _ => break,
            }
        }
        self.clock.set(target);
        self.scheduler_caught_up().await;
        self.drain().await;
    }

    /// The scheduler's next tick, if the service has schedules.
    fn next_tick(&self) -> Option<DateTime<Utc>> {
        self.running.as_ref()?.progress.as_ref()?.borrow().next_tick
    }

    /// Waits until the scheduler has enqueued every tick due by the harness's clock.
    async fn scheduler_caught_up(&self) {
        let Some(mut rx) = self.running.as_ref().and_then(|r| r.progress.clone()) else {
            return;
        };
        let now = self.now();
        let waited = tokio::time::timeout(
            self.drain_timeout,
            rx.wait_for(|p| p.caught_up_to.is_some_and(|t| t >= now)),
        )
        .await;
        if waited.is_err() {
            panic!(
                "TestApp: the scheduler did not catch up to {now} within {:?}",
                self.drain_timeout
            );
        }
    }

    /// Every settled delivery of `subscriber`, in order.
    pub fn outcomes(&self, subscriber: &str) -> Vec<Record> {
        self.records()
            .into_iter()
            .filter(|r| r.subscriber == subscriber)
            .collect()
    }

    /// Every settled delivery of the service, in order.
    pub fn records(&self) -> Vec<Record> {
        self.recorder.records.lock().expect("recorder lock").clone()
    }

    /// The dead letters in `dead`, newest first.
    pub async fn dead_letters(&self, dead: &str) -> Vec<DeadLetter> {
        self.route_for(dead)
            .dead_letters(dead, &DeadSelector::All, usize::MAX)
            .await
            .expect("listing dead letters")
    }

    /// Replays the selected dead letters of `dead` to the queues they failed on.
    pub async fn replay(&self, dead: &str, selector: DeadSelector) -> ReplayReport {
        self.route_for(dead)
            .replay(dead, &selector)
            .await
            .expect("replaying dead letters")
    }

    /// Purges the selected dead letters of `dead`.
    pub async fn purge(&self, dead: &str, selector: DeadSelector) -> u64 {
        self.route_for(dead)
            .purge(dead, &selector)
            .await
            .expect("purging dead letters")
    }

    /// What `queue` holds now.
    pub async fn stats(&self, queue: &str) -> QueueStats {
        self.route_for(queue)
            .stats(queue)
            .await
            .expect("queue stats")
    }

    fn route_for(&self, queue: &str) -> &Arc<dyn ErasedRoute> {
        self.routes
            .iter()
            .find(|r| {
                r.mounts()
                    .iter()
                    .any(|m| m.queue == queue || m.dead_letter.as_deref() == Some(queue))
            })
            .or_else(|| self.routes.first())
            .expect("the service has a broker")
    }

    /// Stops the service gracefully.
    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await;
        }
    }
}
