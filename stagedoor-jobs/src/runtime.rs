//! The worker: claim loops per queue, dispatch by kind, the outcome-to-settlement rules, lease
//! renewal and graceful shutdown. Generic over the broker; erased per route for the service.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use tracing::Instrument;

use crate::broker::{
    Broker, BrokerError, DeadLetter, DeadSelector, Delivery, MountInfo, Problem, QueueStats,
    ReplayReport, Settled, Settlement,
};
use crate::clock::Clock;
use crate::envelope::{Envelope, Job};
use crate::extract::{JobContext, State};
use crate::handler::{BoxFuture, Ran};
use crate::health::{Board, TaskCell, lock};
use crate::mount::{MountSpec, OnDecodeError, RouteBuilder};
use crate::outcome::{Failure, FailureCause, Verdict};
use crate::panic::CatchPanic;
use crate::report::{QueueActivity, Tally};
use crate::supervise::{RestartLimit, supervise};

/// The shortest time between two renewals of one delivery's lease, whatever the broker says
/// its lease is.
const MIN_RENEW_EVERY: Duration = Duration::from_millis(10);
/// How long one claim waits for work before the loop checks for shutdown.
const CLAIM_WAIT: Duration = Duration::from_millis(500);
/// The most deliveries one claim asks for.
const MAX_BATCH: usize = 64;
/// When fewer than half of a busy queue's slots are free, how long the claim loop waits for
/// more to free up before it claims: settlements finish in bursts, and one claim for many jobs
/// costs about what a claim for one does.
const GATHER: Duration = Duration::from_millis(2);
/// The longest wait between two tries of a settlement that failed on the connection.
const SETTLE_RETRY_MAX: Duration = Duration::from_secs(1);
/// The longest wait between two claims that failed: a queue resumes within about this long
/// of its server answering again.
const CLAIM_RETRY_MAX: Duration = Duration::from_millis(500);

/// Sees every settled delivery (the test harness records them; metrics will count them).
pub(crate) trait Observer: Send + Sync + 'static {
    fn settled(&self, subscriber: &str, queue: &str, envelope: &Envelope, settlement: &Settlement);
    /// The settlement last reported for this delivery did not take effect (its lease was lost).
    fn lease_lost(&self, subscriber: &str, queue: &str, envelope: &Envelope);
}

/// What every worker loop of a running service shares.
#[derive(Clone)]
pub(crate) struct RunCtx {
    pub(crate) state: Arc<State>,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) observers: Arc<[Arc<dyn Observer>]>,
    /// Deliveries this service has claimed and not yet finished with (settled or abandoned).
    pub(crate) in_flight: Arc<AtomicUsize>,
    /// Woken when a job is dead-lettered, so the dead-letter gauges and alert look at once.
    pub(crate) dead_lettered: Arc<tokio::sync::Notify>,
    /// The health of every supervised task, the service's state and its stop signal.
    pub(crate) board: Arc<Board>,
    /// When a failing task stops the service.
    pub(crate) restart_limit: RestartLimit,
}

/// A route with its broker type erased. (Some methods serve only the test harness.)
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) trait ErasedRoute: Send + Sync + 'static {
    fn backend(&self) -> &'static str;
    fn mounts(&self) -> &[MountSpec];
    fn default_dead_letter(&self, queue: &str) -> String;
    fn use_clock(&self, clock: &Clock) -> bool;
    fn connect(&self) -> BoxFuture<'_, Result<(), BrokerError>>;
    fn check(&self) -> BoxFuture<'_, Vec<Problem>>;
    fn spawn<'a>(
        self: Arc<Self>,
        ctx: &'a RunCtx,
    ) -> BoxFuture<'a, Result<Vec<JoinHandle<()>>, BrokerError>>;
    fn publish(&self, job: Job) -> BoxFuture<'_, Result<crate::broker::Published, BrokerError>>;
    fn publish_once<'a>(
        &'a self,
        job: Job,
        guard: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<crate::broker::Published, BrokerError>>;
    /// The broker's clock (shared with the broker: a sync moves both).
    fn clock(&self) -> Clock;
    /// Measures the broker's clock against the backend's (best of three round trips).
    fn sync_clock(&self) -> BoxFuture<'_, Result<(), BrokerError>>;
    fn try_lock<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, BrokerError>>;
    fn last_tick<'a>(
        &'a self,
        schedule: &'a str,
    ) -> BoxFuture<'a, Result<Option<DateTime<Utc>>, BrokerError>>;
    fn mark_tick<'a>(
        &'a self,
        schedule: &'a str,
        tick: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), BrokerError>>;
    fn stats<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueStats, BrokerError>>;
    fn dead_len<'a>(&'a self, dead: &'a str) -> BoxFuture<'a, Result<u64, BrokerError>>;
    fn next_due<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Option<DateTime<Utc>>>;
    fn dead_letters<'a>(
        &'a self,
        dead: &'a str,
        sel: &'a DeadSelector,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, BrokerError>>;
    fn replay<'a>(
        &'a self,
        dead: &'a str,
        sel: &'a DeadSelector,
    ) -> BoxFuture<'a, Result<ReplayReport, BrokerError>>;
    fn purge<'a>(
        &'a self,
        dead: &'a str,
        sel: &'a DeadSelector,
    ) -> BoxFuture<'a, Result<u64, BrokerError>>;
    /// The queues started by [`spawn`](Self::spawn): their in-flight counters and tallies.
    fn activity(&self) -> Vec<Arc<QueueActivity>>;
    /// [`Activity::report`](crate::Activity::report) through the broker.
    fn report<'a>(
        &'a self,
        worker: &'a crate::activity::WorkerReport,
        counts: &'a [crate::activity::QueueCounts],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BrokerError>>;
}

struct MountRt {
    spec: MountSpec,
    permits: Arc<Semaphore>,
}

struct QueueRt {
    name: Arc<str>,
    by_kind: HashMap<String, usize>,
    every_kind: Option<usize>,
    slots: usize,
}

pub(crate) struct RouteRuntime<B> {
    broker: B,
    mounts: Vec<MountSpec>,
    /// The queues `spawn` started, for the worker reports.
    activity: Mutex<Vec<Arc<QueueActivity>>>,
}

impl<B: Broker> RouteRuntime<B> {
    pub(crate) fn new(builder: RouteBuilder<B>) -> Self {
        Self {
            broker: builder.broker,
            mounts: builder.mounts,
            activity: Mutex::new(Vec::new()),
        }
    }
}

impl<B: Broker> ErasedRoute for RouteRuntime<B> {
    fn backend(&self) -> &'static str {
        self.broker.backend()
    }
    fn mounts(&self) -> &[MountSpec] {
        &self.mounts
    }
    fn default_dead_letter(&self, queue: &str) -> String {
        self.broker.default_dead_letter(queue)
    }
    fn use_clock(&self, clock: &Clock) -> bool {
        self.broker.use_clock(clock)
    }
    fn connect(&self) -> BoxFuture<'_, Result<(), BrokerError>> {
        Box::pin(self.broker.connect())
    }
    fn check(&self) -> BoxFuture<'_, Vec<Problem>> {
        Box::pin(async move {
            let infos: Vec<MountInfo> = self
                .mounts
                .iter()
                .map(|m| MountInfo {
                    subscriber: m.subscriber.clone(),
                    queue: m.queue.clone(),
                    kind: m.kind.clone(),
                    max_attempts: m.max_attempts.map(|n| n.get()),
                    dead_letter: m.dead_letter.clone(),
                    backend: m.backend,
                })
                .collect();
            let mut problems = Vec::new();
            for m in &infos {
                if let Some(b) = m.backend
                    && b != self.broker.backend()
                {
                    problems.push(Problem {
                            mount: format!("mount `{}` on queue `{}`", m.subscriber, m.queue),
                            message: format!(
                                "its queue descriptor belongs to the {b} backend, but it is mounted on a {} broker: mount it there, or subscribe by name",
                                self.broker.backend()
                            ),
                        });
                }
            }
            problems.extend(self.broker.check(&infos).await);
            problems
        })
    }
    fn spawn<'a>(
        self: Arc<Self>,
        ctx: &'a RunCtx,
    ) -> BoxFuture<'a, Result<Vec<JoinHandle<()>>, BrokerError>> {
        Box::pin(async move {
            let mounts: Arc<[MountRt]> = self
                .mounts
                .iter()
                .map(|m| MountRt {
                    spec: m.clone(),
                    permits: Arc::new(Semaphore::new(m.concurrency.max(1))),
                })
                .collect();
            let mut queues: Vec<QueueRt> = Vec::new();
            for (i, m) in mounts.iter().enumerate() {
                let q = match queues.iter_mut().position(|q| *q.name == *m.spec.queue) {
                    Some(p) => &mut queues[p],
                    None => {
                        queues.push(QueueRt {
                            name: Arc::from(m.spec.queue.as_str()),
                            by_kind: HashMap::new(),
                            every_kind: None,
                            slots: 0,
                        });
                        queues.last_mut().expect("just pushed")
                    }
                };
                match &m.spec.kind {
                    Some(k) => {
                        q.by_kind.insert(k.clone(), i);
                    }
                    None => q.every_kind = Some(i),
                }
                q.slots += m.spec.concurrency.max(1);
            }
            let mut handles = Vec::new();
            let mut activity = Vec::new();
            for q in queues {
                self.broker.prepare(&q.name).await?;
                let capacity = q.slots + (q.slots / 2).min(MAX_BATCH);
                let health = ctx.board.queue(&q.name, self.broker.backend());
                let tally = Arc::new(Tally::default());
                activity.push(Arc::new(QueueActivity {
                    queue: q.name.to_string(),
                    in_flight: Arc::clone(&health.in_flight),
                    tally: Arc::clone(&tally),
                }));
                let worker = Worker {
                    broker: self.broker.clone(),
                    mounts: Arc::clone(&mounts),
                    tally,
                    health,
                    queue: Arc::new(q),
                    ctx: ctx.clone(),
                    capacity,
                    slots: Arc::new(Semaphore::new(capacity)),
                    running: Mutex::new(JoinSet::new()),
                };
                handles.push(tokio::spawn(Arc::new(worker).run()));
            }
            *lock(&self.activity) = activity;
            Ok(handles)
        })
    }
    fn publish(&self, job: Job) -> BoxFuture<'_, Result<crate::broker::Published, BrokerError>> {
        Box::pin(crate::broker::Publish::publish_job(&self.broker, job))
    }
    fn publish_once<'a>(
        &'a self,
        job: Job,
        guard: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<crate::broker::Published, BrokerError>> {
        Box::pin(async move {
            let (queue, envelope, at) = job.into_parts(self.broker.clock().now());
            self.broker
                .publish_once(&queue, (envelope, at), guard, ttl)
                .await
        })
    }
    fn clock(&self) -> Clock {
        self.broker.clock()
    }
    fn sync_clock(&self) -> BoxFuture<'_, Result<(), BrokerError>> {
        Box::pin(async move {
            let clock = self.broker.clock();
            if clock.is_manual() {
                return Ok(());
            }
            // [sent, the server's time, received]: the sample with the shortest round trip.
            let mut best: Option<[DateTime<Utc>; 3]> = None;
            for _ in 0..3 {
                let sent = clock.local();
                let Some(server) = self.broker.server_time().await? else {
                    return Ok(());
                };
                let received = clock.local();
                if best.is_none_or(|[s, _, r]| received - sent < r - s) {
                    best = Some([sent, server, received]);
                }
            }
            if let Some([sent, server, received]) = best {
                let before = clock.offset();
                clock.sync(sent, server, received);
                let after = clock.offset();
                if after.abs() > chrono::Duration::milliseconds(500)
                    && (after - before).abs() > chrono::Duration::milliseconds(250)
                {
                    tracing::warn!(
                        backend = self.broker.backend(),
                        offset_ms = after.num_milliseconds(),
                        "this machine's clock is {} ms off the backend's: due times, leases and schedule ticks follow the backend's clock; fix the machine's time sync (NTP) all the same",
                        -after.num_milliseconds()
                    );
                }
            }
            Ok(())
        })
    }
    fn stats<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Result<QueueStats, BrokerError>> {
        Box::pin(self.broker.stats(queue))
    }
    fn try_lock<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, BrokerError>> {
        Box::pin(self.broker.try_lock(key, token, ttl))
    }
    fn dead_len<'a>(&'a self, dead: &'a str) -> BoxFuture<'a, Result<u64, BrokerError>> {
        Box::pin(self.broker.dead_len(dead))
    }
    fn last_tick<'a>(
        &'a self,
        schedule: &'a str,
    ) -> BoxFuture<'a, Result<Option<DateTime<Utc>>, BrokerError>> {
        Box::pin(self.broker.last_tick(schedule))
    }
    fn mark_tick<'a>(
        &'a self,
        schedule: &'a str,
        tick: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<(), BrokerError>> {
        Box::pin(self.broker.mark_tick(schedule, tick))
    }
    fn next_due<'a>(&'a self, queue: &'a str) -> BoxFuture<'a, Option<DateTime<Utc>>> {
        Box::pin(self.broker.next_due(queue))
    }
    fn dead_letters<'a>(
        &'a self,
        dead: &'a str,
        sel: &'a DeadSelector,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeadLetter>, BrokerError>> {
        Box::pin(self.broker.dead_letters(dead, sel, limit))
    }
    fn replay<'a>(
        &'a self,
        dead: &'a str,
        sel: &'a DeadSelector,
    ) -> BoxFuture<'a, Result<ReplayReport, BrokerError>> {
        Box::pin(self.broker.replay(dead, sel))
    }
    fn purge<'a>(
        &'a self,
        dead: &'a str,
        sel: &'a DeadSelector,
    ) -> BoxFuture<'a, Result<u64, BrokerError>> {
        Box::pin(self.broker.purge(dead, sel))
    }
    fn activity(&self) -> Vec<Arc<QueueActivity>> {
        lock(&self.activity).clone()
    }
    fn report<'a>(
        &'a self,
        worker: &'a crate::activity::WorkerReport,
        counts: &'a [crate::activity::QueueCounts],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), BrokerError>> {
        Box::pin(crate::activity::Activity::report(
            &self.broker,
            worker,
            counts,
            ttl,
        ))
    }
}

/// Counts one delivery out of the service's in-flight count, and its queue's, when dropped
/// (settled, or its task aborted at the shutdown deadline).
struct InFlight([Arc<AtomicUsize>; 2]);

impl InFlight {
    fn new(service: &Arc<AtomicUsize>, queue: &Arc<AtomicUsize>) -> Self {
        for n in [service, queue] {
            n.fetch_add(1, Ordering::SeqCst);
        }
        Self([Arc::clone(service), Arc::clone(queue)])
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        for n in &self.0 {
            n.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A queue of one broker: its claim loop, supervised, and the deliveries it started.
struct Worker<B> {
    broker: B,
    mounts: Arc<[MountRt]>,
    queue: Arc<QueueRt>,
    ctx: RunCtx,
    /// How many deliveries may be in flight: the mounts' concurrency, plus up to half of it
    /// claimed ahead (at most one claim's worth), so that the next batch is claimed while this
    /// one settles. A delivery claimed ahead waits for its mount's permit with its lease
    /// renewed. A queue served one or two at a time claims nothing ahead: a job held behind a
    /// long handler would wait while other workers idle.
    capacity: usize,
    /// One permit per delivery in flight. Never closed: only this worker holds it and nothing
    /// calls `close` on it.
    slots: Arc<Semaphore>,
    /// The deliveries being processed. Held here, not in the claim loop, so that a claim loop
    /// restarted after a panic leaves them running and a shutdown still waits for them.
    running: Mutex<JoinSet<()>>,
    /// What the queue's health reports.
    health: Arc<TaskCell>,
    /// The queue's outcomes per minute, for the worker reports.
    tally: Arc<Tally>,
}

impl<B: Broker> Worker<B> {
    /// The claim loop under supervision until the service stops, then the graceful wait for
    /// the running handlers.
    async fn run(self: Arc<Self>) {
        let w = Arc::clone(&self);
        supervise(
            Arc::clone(&self.health),
            Arc::clone(&self.ctx.board),
            self.ctx.restart_limit,
            move || Arc::clone(&w).claim_loop(),
        )
        .await;
        self.finish().await;
    }

    /// Claims while the service runs. Returns when it stops; a panic here is the supervisor's
    /// to catch and restart.
    async fn claim_loop(self: Arc<Self>) {
        let mut stop = self.ctx.stop.clone();
        loop {
            if *stop.borrow() {
                return;
            }
            self.reap();
            let first = tokio::select! {
                // `slots` is never closed (see its field).
                p = Arc::clone(&self.slots).acquire_owned() => p.expect("semaphore never closed"),
                _ = stop.changed() => return,
            };
            let mut permits = vec![first];
            let want = self.capacity.min(MAX_BATCH);
            while permits.len() < want {
                match Arc::clone(&self.slots).try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            if permits.len() < want / 2 {
                let until = tokio::time::Instant::now() + GATHER;
                while permits.len() < want {
                    match tokio::time::timeout_at(until, Arc::clone(&self.slots).acquire_owned())
                        .await
                    {
                        // `slots` is never closed (see its field).
                        Ok(p) => permits.push(p.expect("semaphore never closed")),
                        Err(_) => break,
                    }
                }
            }
            let asked = permits.len();
            // A claim is never cancelled half-way: it waits at most CLAIM_WAIT.
            match self.broker.claim(&self.queue.name, asked, CLAIM_WAIT).await {
                Ok(deliveries) => {
                    let failed = self.health.claim_ok();
                    if failed > 0 {
                        tracing::info!(queue = %self.queue.name, "claiming again after {failed} failed attempts");
                    }
                    if deliveries.len() > asked {
                        tracing::error!(
                            queue = %self.queue.name,
                            backend = self.broker.backend(),
                            asked,
                            got = deliveries.len(),
                            "the broker returned {} deliveries for a claim of at most {asked}, which breaks its contract: the {} extra are processed all the same (they are leased already)",
                            deliveries.len(),
                            deliveries.len() - asked
                        );
                    }
                    for d in deliveries {
                        // One beyond the claim's permits (a broker returning more than asked)
                        // takes a free slot if there is one, and runs without one otherwise:
                        // its handler still waits for its mount's permit.
                        let permit = permits
                            .pop()
                            .or_else(|| Arc::clone(&self.slots).try_acquire_owned().ok());
                        self.start(d, permit);
                    }
                }
                Err(e) => {
                    let failures = self.health.claim_failed(&e.to_string());
                    let wait = Duration::from_millis(50u64.saturating_mul(1 << failures.min(6)))
                        .min(CLAIM_RETRY_MAX);
                    // The first failure, then one line every 20 (about every 10 s).
                    if failures == 1 || failures.is_multiple_of(20) {
                        tracing::warn!(queue = %self.queue.name, error = %e, "claim failed ({failures} in a row); retrying every {CLAIM_RETRY_MAX:?} at most");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.changed() => return,
                    }
                }
            }
        }
    }

    /// Starts processing a claimed delivery, holding `permit` (its slot) until it is settled.
    fn start(
        self: &Arc<Self>,
        delivery: Delivery<B::Receipt>,
        permit: Option<OwnedSemaphorePermit>,
    ) {
        let done = InFlight::new(&self.ctx.in_flight, &self.health.in_flight);
        let w = Arc::clone(self);
        lock(&self.running).spawn(async move {
            w.process(delivery).await;
            drop(permit);
            drop(done);
        });
    }

    /// Collects the deliveries that are done; one whose task panicked (outside its handler,
    /// whose panics are caught) is logged.
    fn reap(&self) {
        let mut running = lock(&self.running);
        while let Some(done) = running.try_join_next() {
            self.log_join(done);
        }
    }

    fn log_join(&self, done: Result<(), tokio::task::JoinError>) {
        if let Err(e) = done
            && e.is_panic()
        {
            let message = crate::panic::panic_message(&*e.into_panic());
            tracing::error!(
                queue = %self.queue.name,
                error = %message,
                "processing a delivery panicked outside its handler: it is delivered again after its lease"
            );
        }
    }

    /// Graceful shutdown: no more claims; running handlers get until the deadline.
    async fn finish(&self) {
        let mut running = std::mem::take(&mut *lock(&self.running));
        if running.is_empty() {
            return;
        }
        let n = running.len();
        tracing::info!(queue = %self.queue.name, "waiting for {n} running handlers");
        let all = async {
            while let Some(done) = running.join_next().await {
                self.log_join(done);
            }
        };
        if tokio::time::timeout(self.ctx.shutdown_timeout, all)
            .await
            .is_err()
        {
            tracing::warn!(
                queue = %self.queue.name,
                "{} handlers still running at the shutdown deadline: abandoned, their jobs come back after their lease",
                running.len()
            );
            running.abort_all();
            while running.join_next().await.is_some() {}
        }
    }

    fn mount_for(&self, kind: &str) -> Option<&MountRt> {
        let i = self
            .queue
            .by_kind
            .get(kind)
            .copied()
            .or(self.queue.every_kind)?;
        Some(&self.mounts[i])
    }

    async fn process(&self, delivery: Delivery<B::Receipt>) {
        let env = &delivery.envelope;
        let span = tracing::info_span!(
            "job",
            queue = %self.queue.name,
            kind = %env.kind(),
            job_id = %env.id(),
            attempt = env.attempt(),
            request_id = env.headers().request_id.as_deref().unwrap_or(""),
            trace = env.headers().trace.as_deref().unwrap_or(""),
            subscriber = tracing::field::Empty,
        );
        async {
            let Some(mount) = self.mount_for(env.kind()) else {
                let target = self.broker.default_dead_letter(&self.queue.name);
                let failure = Failure::new(
                    FailureCause::UnknownKind,
                    format!(
                        "no handler for kind `{}` on queue `{}`: mount a subscriber with `kind = \"{}\"` (or one for every kind), then replay this dead letter",
                        env.kind(),
                        self.queue.name,
                        env.kind()
                    ),
                    String::new(),
                );
                tracing::error!(dead_letter = %target, "{}", failure.error);
                self.settle("", &delivery, Settlement::DeadLetter { target, failure }).await;
                return;
            };
            let spec = &mount.spec;
            tracing::Span::current().record("subscriber", spec.subscriber.as_str());
            if let (Some(cap), Some(target)) = (spec.max_attempts, &spec.dead_letter)
                && env.attempt() > cap.get()
            {
                    let failure = Failure::new(
                        FailureCause::Poison,
                        poison_message(env.attempt(), cap.get()),
                        String::new(),
                    );
                    tracing::error!(dead_letter = %target, "{}", failure.error);
                    let s = Settlement::DeadLetter { target: target.clone(), failure };
                    self.settle(&spec.subscriber, &delivery, s).await;
                    return;
            }
            // The lease is renewed from here on, while the delivery waits for a slot of its
            // mount and while its handler runs.
            let run = async {
                // A mount's permits are never closed: nothing calls `close` on them.
                let _slot = mount.permits.acquire().await.expect("semaphore never closed");
                let ctx = Arc::new(JobContext::new(
                    Arc::clone(&self.queue.name),
                    env.clone(),
                    Arc::clone(&self.ctx.state),
                ));
                let started = std::time::Instant::now();
                let ran = CatchPanic::new(spec.handler.run(ctx)).await;
                crate::counters::handler_duration(&self.queue.name, env.kind(), started.elapsed());
                ran
            };
            let ran = self.with_renewal(&delivery, run).await;
            let settlement = match ran {
                Ok(Ran::Verdict(Verdict::Ack)) => Settlement::Ack,
                Ok(Ran::Verdict(Verdict::Drop)) => {
                    tracing::info!("dropped by its handler");
                    Settlement::Drop
                }
                Ok(Ran::Verdict(Verdict::Failed(f, after))) => self.failed(spec, env, f, after),
                Ok(Ran::Undecodable(f)) => match (&spec.on_decode_error, &spec.dead_letter) {
                    (OnDecodeError::DeadLetter, Some(target)) => {
                        tracing::error!(dead_letter = %target, error = %f.error, "undecodable payload dead-lettered");
                        Settlement::DeadLetter { target: target.clone(), failure: f }
                    }
                    _ => self.failed(spec, env, f, None),
                },
                Err(panic) => self.failed(spec, env, panic, None),
            };
            self.settle(&spec.subscriber, &delivery, settlement).await;
        }
        .instrument(span)
        .await
    }

    /// Runs `fut` while renewing the delivery's lease every third of it. A renewal under way
    /// when `fut` completes is finished, never cancelled half-way, so a backend that moves its
    /// fence on renewal always knows the fence it settles with.
    async fn with_renewal<T>(
        &self,
        delivery: &Delivery<B::Receipt>,
        fut: impl Future<Output = T>,
    ) -> T {
        // A broker reporting a lease of (nearly) zero would make this loop spin: renew at most
        // every 10 ms.
        let every = (self.broker.lease() / 3).max(MIN_RENEW_EVERY);
        let (done_tx, mut done_rx) = watch::channel(false);
        let renew = async {
            // A server away fails every renewal of every delivery: one line per delivery for
            // the first failure of a streak, the rest at debug level.
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = done_rx.changed() => return,
                }
                match self.broker.renew(&self.queue.name, &delivery.receipt).await {
                    Ok(true) => failing = false,
                    Ok(false) => tracing::warn!(
                        "lease lost while the handler runs: another worker may run this job; this worker's outcome will be discarded"
                    ),
                    Err(e) if failing => tracing::debug!(error = %e, "could not renew the lease"),
                    Err(e) => {
                        failing = true;
                        tracing::warn!(error = %e, "could not renew the lease: trying again every {every:?}");
                    }
                }
            }
        };
        let work = async {
            let out = fut.await;
            let _ = done_tx.send(true);
            out
        };
        let (out, ()) = tokio::join!(work, renew);
        out
    }

    /// A failed attempt: retried after the backoff (or the handler's delay), or dead-lettered
    /// at the cap.
    fn failed(
        &self,
        spec: &MountSpec,
        env: &Envelope,
        failure: Failure,
        after: Option<Duration>,
    ) -> Settlement {
        match (spec.max_attempts, &spec.dead_letter) {
            (Some(cap), Some(target)) if env.attempt() >= cap.get() => {
                tracing::error!(
                    dead_letter = %target,
                    error = %failure.error,
                    traceback = %failure.traceback,
                    "attempt {} of {cap} failed: dead-lettered",
                    env.attempt()
                );
                Settlement::DeadLetter {
                    target: target.clone(),
                    failure,
                }
            }
            _ => {
                let asked = after.unwrap_or_else(|| spec.backoff.delay(env.attempt()));
                let delay =
                    crate::backoff::retry_delay(spec.max_attempts.is_some(), asked, env.attempt());
                tracing::warn!(error = %failure.error, cause = %failure.cause, "attempt {} failed: retry in {delay:?}", env.attempt());
                Settlement::Retry { delay, failure }
            }
        }
    }

    async fn settle(
        &self,
        subscriber: &str,
        delivery: &Delivery<B::Receipt>,
        settlement: Settlement,
    ) {
        // Observers see the settlement before it is made, so they see settlements in the
        // order they happen; one that turns out fenced is taken back.
        for o in self.ctx.observers.iter() {
            o.settled(
                subscriber,
                &self.queue.name,
                &delivery.envelope,
                &settlement,
            );
        }
        // A settlement that fails on a connection error is tried again until it takes effect
        // or its fence says the lease was lost, renewing the lease between tries: a server
        // restarting for a few seconds must not make a finished job run again. (Renewals run
        // between tries, never beside one: a backend that moves its fence on renewal settles
        // with the fence it last renewed.) The shutdown deadline ends the tries (the task is
        // aborted); the job is then delivered again after its lease. An error that is not about
        // the connection is tried 5 times.
        let every = (self.broker.lease() / 3).max(MIN_RENEW_EVERY);
        let mut renewed: Option<tokio::time::Instant> = None;
        let mut wait = Duration::from_millis(50);
        let mut failures: u32 = 0;
        loop {
            match self
                .broker
                .settle(&self.queue.name, delivery, settlement.clone())
                .await
            {
                Ok(Settled::Done) => {
                    if failures > 0 {
                        tracing::info!("settled after {failures} failed tries");
                    }
                    crate::counters::count(&self.queue.name, delivery.envelope.kind(), &settlement);
                    self.tally.count(&settlement, self.broker.clock().now());
                    if matches!(settlement, Settlement::DeadLetter { .. }) {
                        self.ctx.dead_lettered.notify_one();
                    }
                    return;
                }
                Ok(Settled::LeaseLost) => {
                    for o in self.ctx.observers.iter() {
                        o.lease_lost(subscriber, &self.queue.name, &delivery.envelope);
                    }
                    if failures > 0 {
                        tracing::warn!(
                            "the job was no longer held when its settlement was tried again: either an earlier try took effect before the connection broke (nothing more to do), or its lease ran out meanwhile and another worker took it (its outcome stands)"
                        );
                    } else {
                        tracing::warn!(
                            "the lease was lost before settling: the job was reclaimed by another worker, whose outcome stands; nothing changed"
                        );
                    }
                    return;
                }
                Err(e) if e.is_transient() || failures < 4 => {
                    failures += 1;
                    // The first failure, then one line every 10 tries (about every 10 s).
                    if failures == 1 || failures.is_multiple_of(10) {
                        tracing::warn!(error = %e, "could not settle ({failures} tries): trying again, the lease renewed meanwhile");
                    }
                    // Renewed at once (the handler's last renewal may be most of a third of
                    // the lease ago), then every third of the lease.
                    if renewed.is_none_or(|t| t.elapsed() >= every) {
                        renewed = Some(tokio::time::Instant::now());
                        if let Ok(false) =
                            self.broker.renew(&self.queue.name, &delivery.receipt).await
                        {
                            for o in self.ctx.observers.iter() {
                                o.lease_lost(subscriber, &self.queue.name, &delivery.envelope);
                            }
                            tracing::warn!(
                                "the lease was lost while the settlement waited for the server: another worker may run this job; this outcome is discarded"
                            );
                            return;
                        }
                    }
                    tokio::time::sleep(wait.min(every)).await;
                    wait = (wait * 2).min(SETTLE_RETRY_MAX);
                }
                Err(e) => {
                    tracing::error!(error = %e, "could not settle after {} tries: the job will be delivered again after its lease", failures + 1);
                    return;
                }
            }
        }
    }
}

/// The error of a delivery claimed beyond its mount's cap, dead-lettered without running. The
/// runtime cannot tell why the count is past the cap, so it names every cause that leads there.
fn poison_message(attempt: u32, cap: u32) -> String {
    format!(
        "this is delivery {attempt} of the job, past max_attempts({cap}), so it is dead-lettered without running again. \
         Possible causes: a worker died or lost its lease during its earlier deliveries (each claim spends an attempt), \
         the cap was lowered after those deliveries (a deploy), or the stored attempt count was edited. \
         Replay it once the cause is fixed (a replay resets its attempts)"
    )
}

#[cfg(test)]
mod tests {
    use super::poison_message;

    #[test]
    fn the_poison_message_names_the_delivery_the_cap_and_every_cause() {
        let m = poison_message(40, 3);
        for part in [
            "delivery 40 ",
            "max_attempts(3)",
            "a worker died",
            "cap was lowered",
            "stored attempt count was edited",
            "Replay",
        ] {
            assert!(m.contains(part), "{part:?} missing from {m:?}");
        }
        assert!(!m.contains("a worker died while running it"), "{m}");
    }
}
