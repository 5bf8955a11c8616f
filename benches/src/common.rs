//! What every system's driver shares: the job, the target, and the hook a handler calls.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The job every system runs: a sequence number and its publish time (unix nanoseconds, 0 when
/// the scenario does not measure latency).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct BenchJob {
    /// Sequence number, unique within a measurement.
    pub i: u64,
    /// When it was published (unix nanoseconds), or 0.
    pub ts: u64,
}

/// The server a measurement runs on.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
pub enum Backend {
    /// Redis (Streams where the system uses them).
    Redis,
    /// PostgreSQL.
    Postgres,
    /// SQLite (one file, WAL).
    Sqlite,
}

impl Backend {
    /// Short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        }
    }
}

/// Where a driver connects and which queue it uses.
#[derive(Debug, Clone)]
pub struct Target {
    /// The backend.
    pub backend: Backend,
    /// `redis://127.0.0.1:P/`, `postgres://user@127.0.0.1:P/db`, or
    /// `sqlite:///abs/path/file.db?mode=rwc` (a fresh file per measurement).
    pub url: String,
    /// The queue (stream, group, job type) name.
    pub queue: String,
    /// Handlers a worker process runs at once: [`CONCURRENCY`] unless the scenario says
    /// otherwise.
    pub concurrency: usize,
    /// The queue's `global_concurrency` across every worker process (stagedoor-jobs only; the
    /// `limited` scenario).
    pub global_concurrency: Option<u32>,
}

/// The `limited` scenario's `global_concurrency`: what one worker process runs at once, so
/// that four together are held to one's worth.
pub const LIMITED_TO: u32 = 64;

/// What a worker's handler does: call [`Hook::run`] first thing with the decoded job, and
/// return an error from the handler (so the system retries the job) when it returns `false`.
#[derive(Debug, Default)]
pub struct Hook {
    /// Jobs completed (handler returned success).
    pub done: AtomicU64,
    /// Handler runs, failed ones included.
    pub runs: AtomicU64,
    /// Unix nanos of the first handler run (0 until then).
    pub first_ns: AtomicU64,
    /// Unix nanos of the latest completion.
    pub last_ns: AtomicU64,
    /// Fail every job's first run (the failure-path scenario).
    pub fail_once: bool,
    seen: Mutex<HashSet<u64>>,
    /// Publish-to-start latencies (nanoseconds) of jobs with `ts != 0`.
    pub latencies: Mutex<Vec<u64>>,
}

/// Unix time in nanoseconds.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Hook {
    /// A hook; `fail_once` fails each job's first run.
    pub fn new(fail_once: bool) -> Self {
        Hook {
            fail_once,
            ..Hook::default()
        }
    }

    /// Called by the handler with its job. `true`: the handler succeeds. `false`: the handler
    /// must fail (return an error) so that the system retries the job.
    pub fn run(&self, job: &BenchJob) -> bool {
        let now = now_ns();
        self.runs.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .first_ns
            .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        if job.ts != 0 {
            self.latencies
                .lock()
                .unwrap()
                .push(now.saturating_sub(job.ts));
        }
        if self.fail_once && self.seen.lock().unwrap().insert(job.i) {
            return false;
        }
        self.last_ns.fetch_max(now, Ordering::Relaxed);
        self.done.fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// The error a driver's handler returns when [`Hook::run`] says fail.
#[derive(Debug)]
pub struct PlannedFailure;

impl std::fmt::Display for PlannedFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("planned failure (the job succeeds on its retry)")
    }
}

impl std::error::Error for PlannedFailure {}

/// The settings every system's worker gets, the same for each. Concurrency: the default of
/// [`Target::concurrency`] (a scenario may set another, the same for every system).
pub const CONCURRENCY: usize = 64;
/// Fetch batch where a system has the knob (the size the raw loops use).
pub const BATCH: usize = 100;
