//! What a running service reports of itself through each of its brokers
//! ([`Activity::report`](crate::Activity::report)): the worker (host, pid, app, queues with
//! their subscribers, concurrency and jobs in flight, schedules with their ticks) and each
//! queue's outcomes per minute.
//!
//! The job path only counts: a settlement adds one to an atomic counter of its queue's minute
//! ([`Tally::count`]), the minute read from the route's clock. A supervised task (`activity`)
//! takes the counts out every [`REPORT_EVERY`] and sends one report per broker, standing for
//! [`REPORT_TTL`]. A report that fails keeps its counts for the next one (for at most
//! [`COUNTS_KEPT`]) and is logged once as a warning, then at debug level until one succeeds.
//! At shutdown the task waits for the running handlers (within the shutdown timeout), then
//! sends a last report with their counts, which runs out at once: the worker is gone.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::activity::{
    COUNTS_KEPT, MinuteCounts, QueueCounts, REPORT_EVERY, REPORT_TTL, ScheduleReport, WorkerQueue,
    WorkerReport,
};
use crate::clock::chrono_duration;
use crate::kit::lock;
use crate::runtime::ErasedRoute;
use crate::schedule::scheduler::Progress;
use crate::tally::QueueActivity;

/// The time to live of the last report, sent at shutdown: the worker is gone at once.
const LAST_TTL: Duration = Duration::from_millis(1);

/// A schedule as its route's reports show it.
pub(crate) struct ScheduleInfo {
    /// Its place in the scheduler's [`Progress::ticks`].
    pub(crate) index: usize,
    pub(crate) name: String,
    pub(crate) queue: String,
    pub(crate) when: String,
    pub(crate) missed: String,
}

/// One route: what it reports and the counts not yet sent.
struct RouteReporter {
    route: Arc<dyn ErasedRoute>,
    schedules: Vec<ScheduleInfo>,
    state: Mutex<Unsent>,
}

#[derive(Default)]
struct Unsent {
    /// Counts taken out but not yet stored, by queue and minute.
    counts: BTreeMap<(String, DateTime<Utc>), MinuteCounts>,
    /// Whether the last report failed (the next failure is logged at debug level).
    failing: bool,
}

/// The service's reporter: one per started service.
pub(crate) struct Reporter {
    worker: WorkerReport,
    routes: Vec<RouteReporter>,
    progress: Option<watch::Receiver<Progress>>,
    /// The service's deliveries in flight (the last report waits for them).
    in_flight: Arc<AtomicUsize>,
    shutdown_timeout: Duration,
}

/// The machine's host name: `/proc/sys/kernel/hostname`, else `HOSTNAME`, else `unknown`.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "unknown".to_owned())
}

impl Reporter {
    /// The reporter of a service `app` started now, on `routes`, with `schedules` (each bound
    /// to the route at its index).
    pub(crate) fn new(
        app: &crate::AppInfo,
        routes: &[Arc<dyn ErasedRoute>],
        schedules: Vec<(usize, ScheduleInfo)>,
        progress: Option<watch::Receiver<Progress>>,
        in_flight: Arc<AtomicUsize>,
        shutdown_timeout: Duration,
    ) -> Self {
        let started_at = routes.first().map_or_else(Utc::now, |r| r.clock().now());
        let mut worker = WorkerReport::new(
            uuid::Uuid::now_v7().to_string(),
            host_name(),
            std::process::id(),
            started_at,
            started_at,
        );
        worker.app = [app.name.as_str(), app.version.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        let mut per_route: Vec<RouteReporter> = routes
            .iter()
            .map(|r| RouteReporter {
                route: Arc::clone(r),
                schedules: Vec::new(),
                state: Mutex::new(Unsent::default()),
            })
            .collect();
        for (route, s) in schedules {
            if let Some(r) = per_route.get_mut(route) {
                r.schedules.push(s);
            }
        }
        Self {
            worker,
            routes: per_route,
            progress,
            in_flight,
            shutdown_timeout,
        }
    }

    /// Reports every [`REPORT_EVERY`] until the service stops, then once more (see the
    /// [module docs](self)).
    pub(crate) async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                break;
            }
            self.report_all(REPORT_TTL).await;
            tokio::select! {
                _ = tokio::time::sleep(REPORT_EVERY) => {}
                _ = stop.changed() => break,
            }
        }
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        while self.in_flight.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.report_all(LAST_TTL).await;
    }

    async fn report_all(&self, ttl: Duration) {
        for r in &self.routes {
            self.report_route(r, ttl).await;
        }
    }

    /// One report through route `r`.
    async fn report_route(&self, r: &RouteReporter, ttl: Duration) {
        let now = r.route.clock().now();
        let queues = r.route.activity();
        let counts = {
            let mut unsent = lock(&r.state);
            for q in &queues {
                for m in q.tally.take() {
                    let slot = unsent
                        .counts
                        .entry((q.queue.clone(), m.minute))
                        .or_insert_with(|| MinuteCounts::new(m.minute, 0, 0, 0));
                    slot.processed += m.processed;
                    slot.failed += m.failed;
                    slot.dead += m.dead;
                }
            }
            let keep_from = now - chrono_duration(COUNTS_KEPT);
            unsent.counts.retain(|(_, minute), _| *minute >= keep_from);
            let mut counts: Vec<QueueCounts> = Vec::new();
            for ((queue, _), m) in &unsent.counts {
                match counts.last_mut() {
                    Some(q) if q.queue == *queue => q.minutes.push(*m),
                    _ => counts.push(QueueCounts::new(queue.clone(), vec![*m])),
                }
            }
            counts
        };
        let worker = self.worker_report(r, now, &queues).await;
        let sent = tokio::time::timeout(REPORT_EVERY, r.route.report(&worker, &counts, ttl)).await;
        let error = match sent {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("no answer within {REPORT_EVERY:?}")),
        };
        let mut unsent = lock(&r.state);
        match error {
            None => {
                // Only this task adds to them: what was sent is all there is.
                unsent.counts.clear();
                if std::mem::take(&mut unsent.failing) {
                    tracing::info!(backend = r.route.backend(), "worker reports stored again");
                }
            }
            Some(error) if unsent.failing => {
                tracing::debug!(backend = r.route.backend(), error = %error, "the worker report failed again; its counts wait for the next");
            }
            Some(error) => {
                unsent.failing = true;
                tracing::warn!(backend = r.route.backend(), error = %error, "the worker report failed (dashboards miss this worker until one succeeds); its counts wait for the next, tried every {REPORT_EVERY:?}");
            }
        }
    }

    /// The worker's report through route `r` at `now`.
    async fn worker_report(
        &self,
        r: &RouteReporter,
        now: DateTime<Utc>,
        queues: &[Arc<QueueActivity>],
    ) -> WorkerReport {
        let mut worker = self.worker.clone();
        worker.heartbeat_at = now;
        for m in r.route.mounts() {
            let at = match worker.queues.iter().position(|q| q.queue == m.queue) {
                Some(i) => i,
                None => {
                    let in_flight = queues
                        .iter()
                        .find(|q| q.queue == m.queue)
                        .map_or(0, |q| q.in_flight.load(Ordering::SeqCst));
                    worker
                        .queues
                        .push(WorkerQueue::new(m.queue.clone(), 0, in_flight));
                    worker.queues.len() - 1
                }
            };
            let q = &mut worker.queues[at];
            q.subscribers.push(m.subscriber.clone());
            q.concurrency += m.concurrency.max(1);
            let dead = m
                .dead_letter
                .clone()
                .unwrap_or_else(|| r.route.default_dead_letter(&m.queue));
            if !q.dead_letters.contains(&dead) {
                q.dead_letters.push(dead);
            }
        }
        let ticks = self
            .progress
            .as_ref()
            .map(|p| p.borrow().ticks.clone())
            .unwrap_or_default();
        for s in &r.schedules {
            let mut report = ScheduleReport::new(&s.name, &s.queue, &s.when, &s.missed);
            // Bounded: a backend that does not answer must not hold up the counts' report.
            let last = tokio::time::timeout(REPORT_EVERY, r.route.last_tick(&s.name)).await;
            report.last_tick = match last {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::debug!(schedule = %s.name, error = %e, "cannot read the schedule's last tick for the worker report");
                    None
                }
                Err(_) => None,
            };
            report.next_tick = ticks.get(s.index).copied().flatten();
            worker.schedules.push(report);
        }
        worker
    }
}
