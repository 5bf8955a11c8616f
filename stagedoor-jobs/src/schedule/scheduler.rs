//! The scheduler loop of a running service: each schedule bound to the route that enqueues
//! its jobs, missed ticks caught up at start, each due tick enqueued once across every worker
//! (its job and its guard in one `publish_once`), and a tick the broker failed to take tried
//! again on every wake. What a schedule is, and when it ticks, is in `schedule.rs`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use super::{MAX_BACKLOG, Missed, Schedule};
use crate::broker::tick_job_id;
use crate::clock::Clock;
use crate::envelope::Job;
use crate::kit::ClockWatch;
use crate::runtime::ErasedRoute;

/// A schedule bound to the route that enqueues its jobs.
#[derive(Clone)]
pub(crate) struct Bound {
    pub(crate) schedule: Schedule,
    pub(crate) route: Arc<dyn ErasedRoute>,
}

/// The scheduler's progress, for the test harness: the clock time it has caught up to, and its
/// next tick.
#[derive(Clone, Debug, Default)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) struct Progress {
    pub(crate) caught_up_to: Option<DateTime<Utc>>,
    pub(crate) next_tick: Option<DateTime<Utc>>,
    /// Each schedule's next tick, in the order the scheduler was given them (what workers
    /// report).
    pub(crate) ticks: Vec<Option<DateTime<Utc>>>,
}

/// One schedule's state in the loop: its next tick, and the due ticks whose enqueue failed (the
/// broker was unreachable), oldest first, retried on every wake.
struct Pending {
    next: Option<DateTime<Utc>>,
    failed: VecDeque<DateTime<Utc>>,
}

/// The scheduler loop of one service.
pub(crate) async fn run(
    bound: Vec<Bound>,
    clock: Clock,
    mut stop: watch::Receiver<bool>,
    progress: Arc<watch::Sender<Progress>>,
) {
    // The time of a schedule is its broker's clock (the backend's, see `Clock::sync`), unless
    // the test harness moves a manual clock.
    let now_of = |b: &Bound| {
        if clock.is_manual() {
            clock.now()
        } else {
            b.route.clock().now()
        }
    };
    let start = bound.first().map_or_else(|| clock.now(), now_of);
    let mut pending: Vec<Pending> = Vec::with_capacity(bound.len());
    for b in &bound {
        let (missed, next) = catch_up(b, now_of(b)).await;
        let mut p = Pending {
            next,
            failed: VecDeque::new(),
        };
        enqueue_due(b, &mut p, missed).await;
        pending.push(p);
    }
    publish_progress(&progress, start, &pending);
    let mut clock_watch = ClockWatch::new(&clock);
    loop {
        let nap = bound
            .iter()
            .zip(&pending)
            .filter_map(|(b, p)| p.next.map(|t| (t - now_of(b)).to_std().unwrap_or_default()))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep(nap) => {}
            () = clock_watch.changed() => {}
            _ = stop.changed() => return,
        }
        let mut now = start;
        for (b, p) in bound.iter().zip(pending.iter_mut()) {
            now = now_of(b);
            let mut due = Vec::new();
            while let Some(t) = p.next
                && t <= now
            {
                due.push(t);
                p.next = b.schedule.tick_after(t);
            }
            enqueue_due(b, p, due).await;
        }
        publish_progress(&progress, now, &pending);
    }
}

/// Enqueues `due` (in order) after the ticks that failed before. Failed ticks that a newer tick
/// has overtaken are missed ticks: the schedule's policy decides (`RunAll` keeps them, the
/// others keep only the newest). A tick that fails now waits, with every tick after it, for
/// the next wake.
async fn enqueue_due(b: &Bound, p: &mut Pending, due: Vec<DateTime<Utc>>) {
    if due.is_empty() && p.failed.is_empty() {
        return;
    }
    let s = &b.schedule;
    let retried = p.failed.len();
    if retried > 0 && !due.is_empty() && s.missed != Missed::RunAll {
        tracing::warn!(
            schedule = %s.name,
            dropped = retried,
            policy = ?s.missed,
            "ticks not enqueued while the broker failed were overtaken by a newer tick: dropped"
        );
        p.failed.clear();
    }
    let mut queue: VecDeque<DateTime<Utc>> = p.failed.drain(..).collect();
    queue.extend(due);
    while let Some(tick) = queue.pop_front() {
        if let Enqueued::Failed = enqueue(b, tick).await {
            p.failed.push_back(tick);
            p.failed.extend(queue);
            while p.failed.len() > MAX_BACKLOG {
                p.failed.pop_front();
            }
            return;
        }
    }
}

fn publish_progress(progress: &watch::Sender<Progress>, now: DateTime<Utc>, pending: &[Pending]) {
    progress.send_replace(Progress {
        caught_up_to: Some(now),
        next_tick: pending.iter().filter_map(|p| p.next).min(),
        ticks: pending.iter().map(|p| p.next).collect(),
    });
}

/// Applies the missed-tick policy at start: returns the missed ticks to enqueue (none, the
/// latest, or up to the latest 1,000) and the first tick to wait for.
async fn catch_up(b: &Bound, now: DateTime<Utc>) -> (Vec<DateTime<Utc>>, Option<DateTime<Utc>>) {
    let s = &b.schedule;
    let next = s.tick_after(now);
    // A broker that is briefly unreachable at start should not cost the catch-up.
    let mut wait = Duration::from_millis(100);
    let last = loop {
        match b.route.last_tick(&s.name).await {
            Ok(l) => break l,
            Err(e) if wait < Duration::from_secs(1) => {
                tracing::warn!(schedule = %s.name, error = %e, "cannot read the schedule's last tick; trying again in {wait:?}");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            Err(e) => {
                tracing::warn!(schedule = %s.name, error = %e, "cannot read the schedule's last tick: missed ticks are not caught up");
                break None;
            }
        }
    };
    let Some(last) = last else {
        return (Vec::new(), next);
    };
    let (count, missed) = s.missed_between(last, now);
    if count == 0 {
        return (Vec::new(), next);
    }
    tracing::warn!(
        schedule = %s.name,
        last = %last,
        missed = count,
        policy = ?s.missed,
        "ticks were missed while no worker ran"
    );
    let enqueue = match s.missed {
        Missed::Skip => Vec::new(),
        Missed::RunOnce => missed.back().copied().into_iter().collect(),
        Missed::RunAll => missed.into_iter().collect(),
    };
    (enqueue, next)
}

/// What became of one tick.
enum Enqueued {
    /// Enqueued here, or by another worker (its lock is taken), or never to be (its payload
    /// does not encode).
    Done,
    /// The broker failed: try again.
    Failed,
}

/// Enqueues one tick unless another worker has: the tick's job and its guard go to the broker
/// in one atomic step ([`publish_once`](crate::Broker::publish_once)), so a worker dying at any
/// point leaves the tick either enqueued or free for another worker (or this one's retry),
/// never taken and lost.
async fn enqueue(b: &Bound, tick: DateTime<Utc>) -> Enqueued {
    let s = &b.schedule;
    let payload = match (s.payload)(tick) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(schedule = %s.name, %tick, error = %e, "the payload does not encode: tick not enqueued");
            return Enqueued::Done;
        }
    };
    let job = Job::from_bytes(s.queue_name(), payload)
        .kind(s.kind_name())
        .id(tick_job_id(&s.name, tick));
    let guard = format!("sched:{}:{}", s.name, tick.timestamp_millis());
    match b.route.publish_once(job, &guard, s.lock_ttl()).await {
        Ok(p) => {
            if p.is_stored() {
                tracing::info!(schedule = %s.name, %tick, queue = s.queue_name(), "tick enqueued");
            }
            if let Err(e) = b.route.mark_tick(&s.name, tick).await {
                tracing::warn!(schedule = %s.name, error = %e, "cannot record the tick");
            }
            Enqueued::Done
        }
        Err(e) => {
            tracing::error!(schedule = %s.name, %tick, error = %e, "the tick could not be enqueued: trying again in a second");
            Enqueued::Failed
        }
    }
}
