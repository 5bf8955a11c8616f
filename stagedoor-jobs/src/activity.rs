//! What running services report of themselves through their backend, for a dashboard or an
//! operator's tool on another machine: each worker process (host, pid, queues, jobs in flight,
//! schedules, last heartbeat) and each queue's processed, failed and dead-lettered jobs per
//! minute.
//!
//! The trait through which they go is [`Activity`](crate::Activity), in `broker/activity.rs`
//! with the rest of the contract; this file holds what it exchanges.
//!
//! The runtime counts outcomes in memory (atomic counters, nothing on the job path) and a
//! supervised task sends them with the worker's report every [`REPORT_EVERY`]; a report not
//! renewed within [`REPORT_TTL`] is gone (the worker stopped or died). Backends keep the
//! per-minute counts for [`COUNTS_KEPT`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// How often a running service reports.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// How long a report stands without the next one: three missed reports and the worker is gone.
pub const REPORT_TTL: Duration = Duration::from_secs(15);

/// How long a backend keeps per-minute counts.
pub const COUNTS_KEPT: Duration = Duration::from_secs(2 * 60 * 60);

/// One worker process, as it reports itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Unique per started service (a new one at every start).
    pub id: String,
    /// The machine's host name.
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// The service's name and version ([`AppInfo`](crate::AppInfo)), when it set them.
    pub app: String,
    /// When the service started.
    pub started_at: DateTime<Utc>,
    /// When this report was made (the worker's heartbeat).
    pub heartbeat_at: DateTime<Utc>,
    /// The queues it consumes on this backend.
    pub queues: Vec<WorkerQueue>,
    /// The schedules it runs whose jobs go to this backend.
    pub schedules: Vec<ScheduleReport>,
}

impl WorkerReport {
    /// A report of worker `id` made at `heartbeat_at`, with no queues or schedules yet.
    pub fn new(
        id: impl Into<String>,
        host: impl Into<String>,
        pid: u32,
        started_at: DateTime<Utc>,
        heartbeat_at: DateTime<Utc>,
    ) -> Self {
        Self {
            id: id.into(),
            host: host.into(),
            pid,
            app: String::new(),
            started_at,
            heartbeat_at,
            queues: Vec::new(),
            schedules: Vec::new(),
        }
    }
}

/// A queue a worker consumes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkerQueue {
    /// The queue's name.
    pub queue: String,
    /// The subscribers mounted on it.
    pub subscribers: Vec<String>,
    /// How many of its jobs the worker runs at once at most.
    pub concurrency: usize,
    /// How many of its jobs the worker holds now (claimed and not yet settled).
    pub in_flight: usize,
    /// The dead letters its mounts fail into (declared, or the backend's default): what an
    /// operator's replay and purge may act on ([`ensure_dead_letter`](crate::broker::ensure_dead_letter)).
    #[serde(default)]
    pub dead_letters: Vec<String>,
}

impl WorkerQueue {
    /// Queue `queue`, run `concurrency` at a time, `in_flight` held now.
    pub fn new(queue: impl Into<String>, concurrency: usize, in_flight: usize) -> Self {
        Self {
            queue: queue.into(),
            subscribers: Vec::new(),
            concurrency,
            in_flight,
            dead_letters: Vec::new(),
        }
    }
}

/// A schedule a worker runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ScheduleReport {
    /// The schedule's name.
    pub name: String,
    /// The queue its jobs go to.
    pub queue: String,
    /// When it ticks, as written (`every 5m`, `0 3 * * *` and its time zone).
    pub when: String,
    /// What it does with ticks missed while no worker ran (`skip`, `run once`, `run all`).
    pub missed: String,
    /// The last tick enqueued, as the backend records it.
    pub last_tick: Option<DateTime<Utc>>,
    /// The next tick.
    pub next_tick: Option<DateTime<Utc>>,
}

impl ScheduleReport {
    /// Schedule `name` into `queue`, ticking `when`, missed ticks handled as `missed`.
    pub fn new(
        name: impl Into<String>,
        queue: impl Into<String>,
        when: impl Into<String>,
        missed: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            queue: queue.into(),
            when: when.into(),
            missed: missed.into(),
            last_tick: None,
            next_tick: None,
        }
    }
}

/// A queue's outcomes in one minute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MinuteCounts {
    /// The minute's start (seconds and below zero).
    pub minute: DateTime<Utc>,
    /// Jobs acknowledged (succeeded or dropped).
    pub processed: u64,
    /// Failed attempts (retried or dead-lettered).
    pub failed: u64,
    /// Jobs moved to a dead letter.
    pub dead: u64,
}

impl MinuteCounts {
    /// The counts of the minute that holds `at`.
    pub fn new(at: DateTime<Utc>, processed: u64, failed: u64, dead: u64) -> Self {
        Self {
            minute: minute_of(at),
            processed,
            failed,
            dead,
        }
    }

    /// Whether every count is zero.
    pub fn is_empty(&self) -> bool {
        self.processed == 0 && self.failed == 0 && self.dead == 0
    }
}

/// The start of the minute that holds `at`.
pub fn minute_of(at: DateTime<Utc>) -> DateTime<Utc> {
    let secs = at.timestamp().div_euclid(60) * 60;
    DateTime::from_timestamp(secs, 0).unwrap_or(at)
}

/// Counts to add to a queue's per-minute counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueCounts {
    /// The queue.
    pub queue: String,
    /// What happened in each minute since the last report (added to what the backend holds).
    pub minutes: Vec<MinuteCounts>,
}

impl QueueCounts {
    /// Counts of `queue`.
    pub fn new(queue: impl Into<String>, minutes: Vec<MinuteCounts>) -> Self {
        Self {
            queue: queue.into(),
            minutes,
        }
    }
}

/// A job waiting for a time in the future (a delayed job, a delayed retry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DelayedJob {
    /// The job's id.
    pub id: String,
    /// Its kind.
    pub kind: String,
    /// When it is due.
    pub due: DateTime<Utc>,
    /// The attempt it will run as.
    pub attempt: u32,
}

impl DelayedJob {
    /// Job `id` of `kind`, due at `due`, to run as attempt `attempt`.
    pub fn new(
        id: impl Into<String>,
        kind: impl Into<String>,
        due: DateTime<Utc>,
        attempt: u32,
    ) -> Self {
        Self {
            id: id.into(),
            kind: kind.into(),
            due,
            attempt,
        }
    }
}
