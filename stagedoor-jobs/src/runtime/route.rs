//! A route with its broker type erased ([`ErasedRoute`]), so that one service holds routes of
//! several backends, and [`RouteRuntime`], which implements it for a broker: it checks the
//! mounts, measures the backend's clock, and starts one [`Worker`] per queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

use super::context::RunCtx;
use super::limits::{Limiter, QueueLimits, concurrency_key, rate_key};
use super::worker::{MAX_BATCH, MountRt, QueueRt, Worker};
use crate::broker::{
    Broker, BrokerError, DeadLetter, DeadSelector, MountInfo, Problem, QueueStats, ReplayReport,
};
use crate::clock::Clock;
use crate::envelope::Job;
use crate::handler::BoxFuture;
use crate::kit::lock;
use crate::mount::{MountSpec, RouteBuilder};
use crate::tally::{QueueActivity, Tally};

/// A route with its broker type erased. (Some methods serve only the test harness.)
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) trait ErasedRoute: Send + Sync + 'static {
    fn backend(&self) -> &'static str;
    fn mounts(&self) -> &[MountSpec];
    fn default_dead_letter(&self, queue: &str) -> String;
    fn lease(&self) -> Duration;
    fn queue_name_problem(&self, queue: &str) -> Option<String>;
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
    fn oldest_dead_letter<'a>(
        &'a self,
        dead: &'a str,
    ) -> BoxFuture<'a, Result<Option<DeadLetter>, BrokerError>>;
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
    fn cancel<'a>(
        &'a self,
        queue: &'a str,
        id: &'a crate::JobId,
    ) -> BoxFuture<'a, Result<crate::broker::Cancelled, BrokerError>>;
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
    fn lease(&self) -> Duration {
        self.broker.lease()
    }
    fn queue_name_problem(&self, queue: &str) -> Option<String> {
        self.broker.queue_name_problem(queue)
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
            // A queue with global limits needs a backend that keeps permits.
            let mut asked: Vec<&str> = Vec::new();
            for m in &self.mounts {
                if asked.contains(&m.queue.as_str()) {
                    continue;
                }
                asked.push(&m.queue);
                let Ok(Some(limits)) = QueueLimits::of(&m.queue, self.mounts.iter()) else {
                    continue;
                };
                let probe = match (limits.concurrency, limits.rate) {
                    (Some(n), _) => (concurrency_key(&m.queue), n, self.broker.lease()),
                    (None, Some((r, per))) => (rate_key(&m.queue), r, per),
                    (None, None) => continue,
                };
                if let Err(e) = self
                    .broker
                    .take_permits(&probe.0, probe.1, &[], probe.2)
                    .await
                {
                    problems.push(Problem {
                        mount: format!("queue `{}`", m.queue),
                        message: format!("its global limits cannot be enforced: {e}"),
                    });
                }
            }
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
            let queues = queues_of(&mounts);
            let mut handles = Vec::new();
            let mut activity = Vec::new();
            for q in queues {
                self.broker.prepare(&q.name).await?;
                // Disagreeing mounts were refused at startup.
                let limits = QueueLimits::of(&q.name, self.mounts.iter()).ok().flatten();
                let capacity = capacity_of(q.slots, limits.as_ref());
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
                    queue: Arc::new(q.clone()),
                    ctx: ctx.clone(),
                    capacity,
                    slots: Arc::new(Semaphore::new(capacity)),
                    running: Mutex::new(JoinSet::new()),
                    limiter: limits.map(|l| Limiter::new(&q.name, l)),
                    held_id: ctx.held_back.register(&q.name),
                    fair: crate::broker::FairTurn::default(),
                    renewals: Default::default(),
                    records: Arc::new(self.broker.clone()),
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
            if let Some(p) = self
                .broker
                .queue_name_problem(job.queue())
                .or_else(|| job.problem())
            {
                return Err(BrokerError::Invalid(p));
            }
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
    fn oldest_dead_letter<'a>(
        &'a self,
        dead: &'a str,
    ) -> BoxFuture<'a, Result<Option<DeadLetter>, BrokerError>> {
        Box::pin(self.broker.oldest_dead_letter(dead))
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
    fn cancel<'a>(
        &'a self,
        queue: &'a str,
        id: &'a crate::JobId,
    ) -> BoxFuture<'a, Result<crate::broker::Cancelled, BrokerError>> {
        Box::pin(self.broker.cancel(queue, id))
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
        Box::pin(crate::broker::Activity::report(
            &self.broker,
            worker,
            counts,
            ttl,
        ))
    }
}

/// The queues of `mounts`, each with its mounts by kind (or for every kind) and its slots.
fn queues_of(mounts: &[MountRt]) -> Vec<QueueRt> {
    let mut queues: Vec<QueueRt> = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        let p = match queues.iter().position(|q| *q.name == *m.spec.queue) {
            Some(p) => p,
            None => {
                queues.push(QueueRt {
                    name: Arc::from(m.spec.queue.as_str()),
                    by_kind: HashMap::new(),
                    every_kind: None,
                    slots: 0,
                    kind_labels: Arc::default(),
                    metrics: Arc::default(),
                });
                queues.len() - 1
            }
        };
        let Some(q) = queues.get_mut(p) else { continue };
        match &m.spec.kind {
            Some(k) => {
                q.by_kind.insert(k.clone(), i);
            }
            None => q.every_kind = Some(i),
        }
        q.slots += m.spec.concurrency.max(1);
    }
    queues
}

/// How many deliveries a queue with `slots` handler slots holds at once: its slots and up to
/// half again claimed ahead, except that a rate-limited queue claims nothing ahead (a claimed
/// job starts at once) and a globally limited one claims no more than its limit.
fn capacity_of(slots: usize, limits: Option<&QueueLimits>) -> usize {
    let mut capacity = slots + (slots / 2).min(MAX_BATCH);
    if let Some(l) = limits {
        if l.rate.is_some() {
            capacity = slots;
        }
        if let Some(n) = l.concurrency {
            capacity = capacity.min((n as usize).max(1));
        }
    }
    capacity
}
