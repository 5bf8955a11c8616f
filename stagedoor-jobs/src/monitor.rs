//! What a dashboard and an alert need: metrics through the `metrics` facade, sampled queue
//! gauges, and the dead-letter alert (a dead letter that went from empty to not empty), paged
//! by one worker per incident however many workers see it.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `stagedoor_jobs_processed_total` | counter | queue, kind |
//! | `stagedoor_jobs_failed_total` | counter | queue, kind |
//! | `stagedoor_jobs_retried_total` | counter | queue, kind |
//! | `stagedoor_jobs_dropped_total` | counter | queue, kind |
//! | `stagedoor_jobs_dead_lettered_total` | counter | queue, kind |
//! | `stagedoor_jobs_handler_duration_seconds` | histogram | queue, kind |
//! | `stagedoor_jobs_queue_depth` | gauge | queue |
//! | `stagedoor_jobs_queue_pending` | gauge | queue |
//! | `stagedoor_jobs_queue_delayed` | gauge | queue |
//! | `stagedoor_jobs_dead_letter_length` | gauge | dead_letter |
//! | `stagedoor_jobs_dead_trimmed_total` | counter | dead_letter (Redis) |
//! | `stagedoor_jobs_claim_failures_total` | counter | queue |
//! | `stagedoor_jobs_queue_healthy` | gauge (1 claiming, 0 not: failed claims, restarting, stopped) | queue |
//! | `stagedoor_jobs_task_restarts_total` | counter | task (`claim:<queue>`, `monitor`, `scheduler`, a backend's task) |
//!
//! A `kind` label is bounded, whoever wrote the entries: a kind a mount of the queue names
//! keeps its name; a kind no mount handles (dead-lettered unrun) is `unknown`; a kind run by
//! a mount for every kind keeps its name among the first 100 kinds the queue's worker labelled,
//! and is `other` past them.
//!
//! Install the recorder before the service starts: the job path registers its counters and
//! histogram once per queue and kind label (`counters::QueueMetrics`) and reuses the handles.
//!
//! The same health, per queue and task, is on [`Running::health`](crate::Running::health).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, watch};

use crate::runtime::ErasedRoute;

/// A dead letter that went from empty to not empty: every entry there is a job that needs a
/// person: a length that went from 0 to 1 is worth a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetterAlert {
    /// The dead letter (`jobs:dead`, `emails.dead`).
    pub dead_letter: String,
    /// The queues whose failures go there.
    pub queues: Vec<String>,
    /// Its length now.
    pub length: u64,
    /// When the change was seen.
    pub at: DateTime<Utc>,
}

/// A route, its queues, and its dead letters with the queues that fail into them.
type Watched = (
    Arc<dyn ErasedRoute>,
    Vec<String>,
    HashMap<String, Vec<String>>,
);

/// The alert hook: called once per transition from empty to not empty, by one worker.
pub(crate) type AlertHook = Arc<dyn Fn(&DeadLetterAlert) + Send + Sync>;

/// How long a page lock is held: the same incident is not paged again within it.
const PAGE_LOCK_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Who pages for a dead letter seen going from empty to not empty.
enum Page {
    /// This monitor took the incident's page lock: it pages.
    Mine,
    /// Another monitor (another worker) took it first: it has paged.
    Taken,
    /// The backend could not tell (an error listing or locking, or a listing that shows no
    /// entry to name the incident by): this monitor pages, rather than risk nobody paging.
    FailOpen,
}

/// Decides, across every worker of the backend, which monitor pages for the incident that made
/// `dead` non-empty. The incident is named by its first dead letter (the oldest entry: the one
/// that made it non-empty), and the monitor that takes the broker lock
/// `dead-alert:<dead>:<oldest id>:<its failed_at>` pages; every other monitor that saw the same
/// transition finds the lock taken. A failure of the backend fails open: this monitor pages.
async fn claim_page(route: &dyn ErasedRoute, dead: &str, token: &str) -> Page {
    let oldest = match route.oldest_dead_letter(dead).await {
        Ok(Some(d)) => d,
        Ok(None) => {
            tracing::warn!(dead_letter = %dead, "the dead letter lists no entry to name the incident by (emptied again, or its entries unreadable): paging from this worker");
            return Page::FailOpen;
        }
        Err(e) => {
            tracing::warn!(dead_letter = %dead, error = %e, "could not read the dead letter's oldest entry to tell whether another worker pages for it: paging from this worker");
            return Page::FailOpen;
        }
    };
    let key = format!(
        "dead-alert:{dead}:{}:{}",
        oldest.id,
        oldest.failed_at.timestamp_micros()
    );
    match route.try_lock(&key, token, PAGE_LOCK_TTL).await {
        Ok(true) => Page::Mine,
        Ok(false) => Page::Taken,
        Err(e) => {
            tracing::warn!(dead_letter = %dead, error = %e, "could not take the dead letter's page lock to tell whether another worker pages for it: paging from this worker");
            Page::FailOpen
        }
    }
}

/// Samples the gauges of every queue and dead letter of the service every `every`, and at once
/// when a job is dead-lettered; calls the alert hook (and logs at error level) when a dead
/// letter goes from empty to not empty, once across every worker of the backend (see
/// [`claim_page`]).
pub(crate) async fn run(
    routes: Vec<Arc<dyn ErasedRoute>>,
    every: Duration,
    dead_lettered: Arc<Notify>,
    hook: Option<AlertHook>,
    mut stop: watch::Receiver<bool>,
) {
    let watched: Vec<Watched> = routes.into_iter().map(watched).collect();
    let mut last: HashMap<String, u64> = HashMap::new();
    // This monitor's name as the owner of the page locks it takes.
    let token = format!("monitor-{}", uuid::Uuid::now_v7().simple());
    loop {
        for (route, queues, dead) in &watched {
            sample_queues(route.as_ref(), queues).await;
            for (d, from) in dead {
                let Ok(len) = route.dead_len(d).await else {
                    continue;
                };
                metrics::gauge!("stagedoor_jobs_dead_letter_length", "dead_letter" => d.clone())
                    .set(len as f64);
                let before = last.insert(d.clone(), len);
                if before == Some(0) && len > 0 {
                    let alert = DeadLetterAlert {
                        dead_letter: d.clone(),
                        queues: from.clone(),
                        length: len,
                        at: Utc::now(),
                    };
                    page(route.as_ref(), &alert, &token, hook.as_ref()).await;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = dead_lettered.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// The queues of `r`'s mounts, and its dead letters with the queues that fail into them.
fn watched(r: Arc<dyn ErasedRoute>) -> Watched {
    let mut queues: Vec<String> = Vec::new();
    let mut dead: HashMap<String, Vec<String>> = HashMap::new();
    for m in r.mounts() {
        if !queues.contains(&m.queue) {
            queues.push(m.queue.clone());
        }
        let target = m
            .dead_letter
            .clone()
            .unwrap_or_else(|| r.default_dead_letter(&m.queue));
        let from = dead.entry(target).or_default();
        if !from.contains(&m.queue) {
            from.push(m.queue.clone());
        }
    }
    (r, queues, dead)
}

/// Sets the depth, pending and delayed gauges of each of `queues` (a queue whose stats
/// cannot be read keeps its last values).
async fn sample_queues(route: &dyn ErasedRoute, queues: &[String]) {
    for q in queues {
        if let Ok(s) = route.stats(q).await {
            metrics::gauge!("stagedoor_jobs_queue_depth", "queue" => q.clone()).set(s.ready as f64);
            metrics::gauge!("stagedoor_jobs_queue_pending", "queue" => q.clone())
                .set(s.pending as f64);
            metrics::gauge!("stagedoor_jobs_queue_delayed", "queue" => q.clone())
                .set(s.delayed as f64);
        }
    }
}

/// Pages for `alert` (an error logged, the hook called) when this worker takes the dead
/// letter's page lock, or cannot tell; logs at info level when another worker has paged.
async fn page(
    route: &dyn ErasedRoute,
    alert: &DeadLetterAlert,
    token: &str,
    hook: Option<&AlertHook>,
) {
    let (d, len) = (&alert.dead_letter, alert.length);
    match claim_page(route, d, token).await {
        Page::Mine | Page::FailOpen => {
            tracing::error!(
                dead_letter = %alert.dead_letter,
                queues = ?alert.queues,
                length = alert.length,
                "a dead letter went from empty to {len}: every entry there is a job that needs a person"
            );
            if let Some(h) = hook {
                h(alert);
            }
        }
        Page::Taken => tracing::info!(
            dead_letter = %alert.dead_letter,
            length = alert.length,
            "a dead letter went from empty to {len}: another worker has paged for it"
        ),
    }
}
