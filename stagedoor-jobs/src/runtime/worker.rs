//! A queue's worker: its claim loop under supervision, the deliveries it started and their
//! in-flight count, and the graceful wait for them at shutdown. Running one delivery is in
//! `delivery.rs`; renewing its lease, in `renewals.rs`; settling it, in `settle.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::context::RunCtx;
use super::limits::Limiter;
use crate::broker::{Broker, Claimed, FairTurn};
use crate::health::TaskCell;
use crate::kit::lock;
use crate::mount::MountSpec;
use crate::supervise::supervise;
use crate::tally::Tally;

/// How long one claim waits for work before the loop checks for shutdown.
const CLAIM_WAIT: Duration = Duration::from_millis(500);
/// The most deliveries one claim asks for.
pub(super) const MAX_BATCH: usize = 64;
/// When fewer than half of a busy queue's slots are free, how long the claim loop waits for
/// more to free up before it claims: settlements finish in bursts, and one claim for many jobs
/// costs about what a claim for one does.
const GATHER: Duration = Duration::from_millis(2);
/// The longest wait between two claims that failed: a queue resumes within about this long
/// of its server answering again.
const CLAIM_RETRY_MAX: Duration = Duration::from_millis(500);

pub(super) struct MountRt {
    pub(super) spec: MountSpec,
    pub(super) permits: Arc<Semaphore>,
}

#[derive(Clone)]
pub(super) struct QueueRt {
    pub(super) name: Arc<str>,
    pub(super) by_kind: HashMap<String, usize>,
    pub(super) every_kind: Option<usize>,
    pub(super) slots: usize,
    /// The kinds the mount for every kind labelled in the metrics.
    pub(super) kind_labels: Arc<crate::counters::KindLabels>,
    /// The queue's metric handles, by kind label.
    pub(super) metrics: Arc<crate::counters::QueueMetrics>,
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
pub(super) struct Worker<B: Broker> {
    pub(super) broker: B,
    pub(super) mounts: Arc<[MountRt]>,
    pub(super) queue: Arc<QueueRt>,
    pub(super) ctx: RunCtx,
    /// How many deliveries may be in flight: the mounts' concurrency, plus up to half of it
    /// claimed ahead (at most one claim's worth), so that the next batch is claimed while this
    /// one settles. A delivery claimed ahead waits for its mount's permit with its lease
    /// renewed. A queue served one or two at a time claims nothing ahead: a job held behind a
    /// long handler would wait while other workers idle.
    pub(super) capacity: usize,
    /// One permit per delivery in flight. Never closed: only this worker holds it and nothing
    /// calls `close` on it.
    pub(super) slots: Arc<Semaphore>,
    /// The deliveries being processed. Held here, not in the claim loop, so that a claim loop
    /// restarted after a panic leaves them running and a shutdown still waits for them.
    pub(super) running: Mutex<JoinSet<()>>,
    /// What the queue's health reports.
    pub(super) health: Arc<TaskCell>,
    /// The queue's outcomes per minute, for the worker reports.
    pub(super) tally: Arc<Tally>,
    /// The queue's global limits, when its mounts declare any.
    pub(super) limiter: Option<Limiter>,
    /// This worker's id in [`RunCtx::held_back`](super::context::RunCtx::held_back).
    pub(super) held_id: u64,
    /// The claims that took jobs, which pick each claim's order (the fair turn).
    pub(super) fair: FairTurn,
    /// The deliveries in flight whose leases the worker renews (`Renewals::run`).
    pub(super) renewals: super::renewals::Renewals<B::Receipt>,
    /// The broker's records, where results and progress are kept.
    pub(super) records: Arc<dyn crate::results::RecordSink>,
}

impl<B: Broker> Worker<B> {
    /// The claim loop under supervision until the service stops, then the graceful wait for
    /// the running handlers.
    pub(super) async fn run(self: Arc<Self>) {
        let w = Arc::clone(&self);
        // The leases and the global concurrency permits are renewed, and the running jobs'
        // cancellations looked for, until every handler is done. The loops cannot fail (they log and try
        // again) and are aborted here.
        let renewer = {
            let w = Arc::clone(&self);
            tokio::spawn(async move {
                let permits = async {
                    if let Some(l) = &w.limiter {
                        tokio::join!(l.renew_loop(&w.broker), l.release_loop(&w.broker));
                    }
                };
                tokio::join!(
                    permits,
                    w.watch_cancels(),
                    w.renewals.run(&w.broker, &w.queue.name)
                );
            })
        };
        supervise(
            Arc::clone(&self.health),
            Arc::clone(&self.ctx.board),
            self.ctx.restart_limit,
            move || Arc::clone(&w).claim_loop(),
        )
        .await;
        self.finish().await;
        renewer.abort();
        if let Some(l) = &self.limiter {
            l.flush(&self.broker).await;
        }
    }

    /// Every third of the lease while jobs run: asks the broker which were cancelled and fires
    /// their cancellations.
    async fn watch_cancels(&self) {
        let every = (self.broker.lease() / 3).max(Duration::from_millis(10));
        let mut failing = false;
        loop {
            tokio::time::sleep(every).await;
            let running: HashMap<crate::JobId, crate::Cancellation> =
                self.renewals.cancellable().into_iter().collect();
            if running.is_empty() {
                continue;
            }
            let ids: Vec<crate::JobId> = running.keys().cloned().collect();
            match self.broker.cancelled(&self.queue.name, &ids).await {
                Ok(cancelled) => {
                    failing = false;
                    for id in cancelled {
                        if let Some(c) = running.get(&id) {
                            tracing::info!(queue = %self.queue.name, job_id = %id, "cancelled while running: its handler's Cancellation fires");
                            c.cancel();
                        }
                    }
                }
                Err(e) if failing => {
                    tracing::debug!(error = %e, "could not look for cancelled jobs")
                }
                Err(e) => {
                    failing = true;
                    tracing::warn!(queue = %self.queue.name, error = %e, "could not look for cancelled jobs: trying again every {every:?}");
                }
            }
        }
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
            let Some(mut permits) = self.free_slots(&mut stop).await else {
                return;
            };
            let mut asked = permits.len();
            // The queue's global limits: a permit of each per job claimed, taken first.
            let mut grant = None;
            if let Some(l) = &self.limiter {
                match l.take(&self.broker, asked).await {
                    Ok(Ok(g)) => {
                        self.ctx.held_back.set(&self.queue.name, self.held_id, None);
                        asked = g.n;
                        permits.truncate(asked);
                        grant = Some(g);
                    }
                    Ok(Err(full)) => {
                        drop(permits);
                        let until = full
                            .next_free
                            .map(|d| crate::clock::later(self.broker.clock().now(), d));
                        self.ctx
                            .held_back
                            .set(&self.queue.name, self.held_id, until);
                        tokio::select! {
                            _ = tokio::time::sleep(full.wait) => {}
                            _ = stop.changed() => return,
                        }
                        continue;
                    }
                    Err(e) => {
                        drop(permits);
                        if self.claim_failed(&e, &mut stop).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            let claimed_at = tokio::time::Instant::now();
            // A claim is never cancelled half-way: it waits at most CLAIM_WAIT.
            let order = self.fair.order();
            let claimed = (self.broker)
                .claim(&self.queue.name, asked, CLAIM_WAIT, order)
                .await;
            if let (Some(l), Some(g)) = (&self.limiter, grant.as_mut()) {
                let got = claimed.as_ref().map_or(0, Claimed::taken);
                let waited = claimed_at.elapsed() > Duration::from_millis(5);
                l.after_claim(&self.broker, g, got, waited).await;
            }
            let running = grant.map(|g| g.running).unwrap_or_default();
            match claimed {
                Ok(claimed) => self.claimed(claimed, asked, permits, running),
                Err(e) => {
                    if self.claim_failed(&e, &mut stop).await {
                        return;
                    }
                }
            }
        }
    }

    /// The slots of the next claim: at least one (waiting for it), as many more as are free,
    /// and, when fewer than half are, those that free up within [`GATHER`]. `None` when the
    /// service stopped meanwhile.
    async fn free_slots(
        &self,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<Vec<OwnedSemaphorePermit>> {
        let first = tokio::select! {
            // `slots` is never closed (see its field).
            p = Arc::clone(&self.slots).acquire_owned() => p.expect("semaphore never closed"),
            _ = stop.changed() => return None,
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
                match tokio::time::timeout_at(until, Arc::clone(&self.slots).acquire_owned()).await
                {
                    // `slots` is never closed (see its field).
                    Ok(p) => permits.push(p.expect("semaphore never closed")),
                    Err(_) => break,
                }
            }
        }
        Some(permits)
    }

    /// Starts the deliveries a claim of at most `asked` returned, each holding one of
    /// `permits` (and one of `running`, the queue's global concurrency permits).
    fn claimed(
        self: &Arc<Self>,
        claimed: Claimed<B::Receipt>,
        asked: usize,
        mut permits: Vec<OwnedSemaphorePermit>,
        mut running: Vec<String>,
    ) {
        self.fair.claimed(claimed.taken());
        let Claimed {
            deliveries,
            unreadable,
        } = claimed;
        // An unreadable item never runs: it gives back its slot at once.
        for item in unreadable {
            self.start_unreadable(item);
        }
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
            // One beyond the claim's permits (a broker returning more than asked) takes a free
            // slot if there is one, and runs without one otherwise: its handler still waits
            // for its mount's permit.
            let permit = permits
                .pop()
                .or_else(|| Arc::clone(&self.slots).try_acquire_owned().ok());
            self.start(d, permit, running.pop());
        }
    }

    /// Records a failed claim (or a failure to take the queue's permits) and waits before the
    /// next try. `true` when the service stopped meanwhile.
    async fn claim_failed(
        &self,
        e: &crate::broker::BrokerError,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> bool {
        let failures = self.health.claim_failed(&e.to_string());
        let wait =
            Duration::from_millis(50u64.saturating_mul(1 << failures.min(6))).min(CLAIM_RETRY_MAX);
        // The first failure, then one line every 20 (about every 10 s).
        if failures == 1 || failures.is_multiple_of(20) {
            tracing::warn!(queue = %self.queue.name, error = %e, "claim failed ({failures} in a row); retrying every {CLAIM_RETRY_MAX:?} at most");
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => false,
            _ = stop.changed() => true,
        }
    }

    /// Starts processing a claimed delivery, holding `permit` (its slot) and `global` (its
    /// global concurrency permit, if the queue has that limit) until it is settled.
    fn start(
        self: &Arc<Self>,
        delivery: crate::broker::Delivery<B::Receipt>,
        permit: Option<OwnedSemaphorePermit>,
        global: Option<String>,
    ) {
        let done = InFlight::new(&self.ctx.in_flight, &self.health.in_flight);
        let w = Arc::clone(self);
        let cancel = crate::Cancellation::default();
        lock(&self.running).spawn(async move {
            w.process(delivery, cancel).await;
            if let (Some(l), Some(token)) = (&w.limiter, global) {
                l.settled(token);
            }
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
}
