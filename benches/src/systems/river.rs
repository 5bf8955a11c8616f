//! riverqueue 0.5 (River's official Rust client), on PostgreSQL and SQLite, driven the way its
//! README and examples show: `#[derive(JobArgs)]` arguments, a function worker registered with
//! `Workers::add_fn`, `Client::builder(pool)` with one queue, River's migrations
//! (`PostgresMigrator` / `SqliteMigrator`), producers `insert` and `insert_many`.
//!
//! Knobs: the queue's `max_workers` is the target's concurrency ([`crate::common::CONCURRENCY`]
//! unless the scenario sets it); fetch cooldown 2 ms, as River's own benchmark
//! (`riverqueue bench`) sets it (River's default, 100 ms, caps a client at `max_workers` jobs
//! per 100 ms: 640 jobs/s at 64); fetch poll interval 50 ms like every polling system here
//! (River's default is 1 s), besides LISTEN/NOTIFY on Postgres. Pools as the README opens
//! them: `PgPool::connect` (sqlx's default of 10 connections); on SQLite WAL with a 5 s busy
//! timeout as River's SQLite example sets, and `synchronous = NORMAL` like every SQLite system
//! of the bench.
//!
//! Retries: River's default policy waits `attempt⁴` seconds; the bench's rule is "retry at once
//! or after the shortest delay the system allows", so the client gets a retry policy of no
//! delay, which River turns into an `available` job straight away (a delay within the
//! scheduler's interval is not left to the scheduler). `default_max_attempts(3)`.
//!
//! Completion: River's completer marks a job `completed` in batches after its handler returns;
//! the harness counts a job done when its row is `completed` (the queue is verified empty when
//! no row of the queue is in another live state). Completed rows stay, as River keeps them by
//! default (24 h), so a table grows over a measurement as it does in production.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use riverqueue::jiff::Timestamp;
use riverqueue::migrate::{PostgresMigrator, SqliteMigrator};
use riverqueue::sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use riverqueue::sqlx::{PgPool, SqlitePool};
use riverqueue::{
    Client, InsertOpts, Job, JobArgs, JobRow, QueueConfig, RetryPolicy, WorkContext, WorkError,
    WorkOutcome, Workers,
};
use serde::{Deserialize, Serialize};

use crate::common::{Backend, BenchJob, Hook, PlannedFailure, Target};

/// Attempts a job gets (`default_max_attempts`).
const MAX_ATTEMPTS: i32 = 3;
/// The fetch cooldown of River's own benchmark.
const FETCH_COOLDOWN: Duration = Duration::from_millis(2);
/// How often an idle queue polls besides notifications.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Postgres and SQLite: River's two databases.
pub fn supports(b: Backend) -> bool {
    matches!(b, Backend::Postgres | Backend::Sqlite)
}

/// It has a bulk enqueue: `Client::insert_many` (one atomic insert of the batch).
pub fn has_bulk(_b: Backend) -> bool {
    true
}

/// Rows of the queue in a live state (completed, discarded and cancelled rows stay in the
/// table until River's cleaner deletes them).
pub fn remaining(t: &Target) -> super::probe::Remaining {
    super::probe::Remaining::Sql(format!(
        "SELECT count(*) FROM river_job WHERE queue = '{}' \
         AND state NOT IN ('completed', 'discarded', 'cancelled')",
        t.queue.replace('\'', "''")
    ))
}

/// How it runs.
pub fn legend(b: Backend) -> String {
    let common = "`Client` with one queue at `max_workers` 64, fetch cooldown 2 ms (River's own \
                  benchmark's), 50 ms poll, a retry policy of no delay, 3 attempts; producers \
                  `insert` / `insert_many`; completed rows kept (River's default)";
    match b {
        Backend::Postgres => format!("{common}; `PgPool::connect` (10 connections), LISTEN/NOTIFY"),
        _ => format!("{common}; WAL, 5 s busy timeout, `synchronous = NORMAL`"),
    }
}

/// The job as River sees it.
#[derive(Clone, Debug, Deserialize, JobArgs, Serialize)]
#[river(kind = "stagedoor_bench")]
struct RiverJob {
    i: u64,
    ts: u64,
}

/// Retries at once: the bench's rule for every system.
struct NoDelay;

impl RetryPolicy for NoDelay {
    fn next_retry(&self, _job: &JobRow, _error: &WorkError, _now: Timestamp) -> Duration {
        Duration::ZERO
    }
}

/// A pool on the target's database.
enum Pool {
    Pg(PgPool),
    Sqlite(SqlitePool),
}

impl Pool {
    async fn open(t: &Target) -> anyhow::Result<Pool> {
        Ok(match t.backend {
            Backend::Postgres => Pool::Pg(
                PgPool::connect(&t.url)
                    .await
                    .with_context(|| format!("connecting to {}", t.url))?,
            ),
            _ => {
                let opts = SqliteConnectOptions::from_str(&t.url)?
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal)
                    .busy_timeout(Duration::from_secs(5));
                Pool::Sqlite(SqlitePoolOptions::new().connect_with(opts).await?)
            }
        })
    }

    fn builder(&self) -> riverqueue::ClientBuilder {
        let b = match self {
            Pool::Pg(p) => Client::builder(p.clone()),
            Pool::Sqlite(p) => Client::builder(p.clone()),
        };
        b.default_max_attempts(MAX_ATTEMPTS)
            .retry_policy(NoDelay)
            .fetch_cooldown(FETCH_COOLDOWN)
    }
}

/// Applies River's migrations and deletes every job row.
pub async fn reset(t: &Target) -> anyhow::Result<()> {
    match Pool::open(t).await? {
        Pool::Pg(p) => {
            PostgresMigrator::new(p.clone())
                .migrate_up()
                .await
                .context("River's Postgres migrations")?;
            riverqueue::sqlx::raw_sql("TRUNCATE TABLE river_job")
                .execute(&p)
                .await
                .context("emptying river_job")?;
            p.close().await;
        }
        Pool::Sqlite(p) => {
            SqliteMigrator::new(p.clone())
                .migrate_up()
                .await
                .context("River's SQLite migrations")?;
            riverqueue::sqlx::raw_sql("DELETE FROM river_job")
                .execute(&p)
                .await
                .context("emptying river_job")?;
            p.close().await;
        }
    }
    Ok(())
}

/// An insert-only client (no workers, no queues).
pub struct Producer {
    client: Client,
    opts: InsertOpts,
}

impl Producer {
    /// Opens a pool and builds a client on it.
    pub async fn connect(t: &Target) -> anyhow::Result<Self> {
        let client = Pool::open(t).await?.builder().build()?;
        Ok(Producer {
            client,
            opts: InsertOpts::default().with_queue(t.queue.clone()),
        })
    }

    /// One `insert` call.
    pub async fn one(&mut self, job: BenchJob) -> anyhow::Result<()> {
        self.client
            .insert(RiverJob {
                i: job.i,
                ts: job.ts,
            })
            .opts(self.opts.clone())
            .await?;
        Ok(())
    }

    /// One `insert_many` call.
    pub async fn bulk(&mut self, jobs: &[BenchJob]) -> anyhow::Result<()> {
        let items = jobs
            .iter()
            .map(|j| (RiverJob { i: j.i, ts: j.ts }, self.opts.clone()));
        self.client.insert_many(items).await?;
        Ok(())
    }
}

/// Runs a River client working the target's queue until the process is killed.
pub async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
    let mut workers = Workers::new();
    workers.add_fn(move |_ctx: WorkContext, job: Job<RiverJob>| {
        let hook = hook.clone();
        async move {
            let j = BenchJob {
                i: job.args.i,
                ts: job.args.ts,
            };
            if hook.run(&j) {
                Ok(WorkOutcome::Complete)
            } else {
                Err(PlannedFailure)
            }
        }
    })?;
    let queue = QueueConfig::new(t.concurrency)
        .with_fetch_cooldown(FETCH_COOLDOWN)
        .with_fetch_poll_interval(POLL_INTERVAL);
    let client = Pool::open(t)
        .await?
        .builder()
        .workers(workers)
        .queue(t.queue.clone(), queue)
        .build()?;
    let mut run = client.start()?;
    run.wait().await.context("River client")?;
    anyhow::bail!("the River client stopped")
}
