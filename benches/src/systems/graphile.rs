//! graphile_worker 0.14 (the Rust port of Graphile Worker), PostgreSQL only, driven through its
//! own public API: `WorkerUtils` enqueues (`add_job`, `add_jobs`) and migrates, `WorkerOptions`
//! builds the worker, a `TaskHandler` runs the job.
//!
//! Knobs: concurrency the target's ([`crate::common::CONCURRENCY`] unless the scenario sets it); LocalQueue on with size [`BATCH`] (graphile's batch
//! fetch; without it each job slot fetches one job per poll tick or notification); poll interval
//! 50 ms on top of LISTEN/NOTIFY (`jobs:insert`, on by default); `max_attempts` 3 per job. The
//! worker's pool is graphile's own (`database_url`, default 20 connections).
//!
//! Retry delay: graphile's `fail_job` SQL sets `run_at = greatest(now(), run_at) +
//! exp(least(attempts, 10)) seconds`, hard-coded, with no option to change it. A job failing its
//! first attempt therefore runs again about e¹ ≈ 2.7 s later (a second failure: e² ≈ 7.4 s).
//!
//! The task identifier is a compile-time constant ([`TaskHandler::IDENTIFIER`]), so
//! [`Target::queue`] is not used: every job is a [`BenchTask`]. (Graphile's own `queue_name`
//! means "run these jobs one at a time", which is not what the benchmark's queue is.)

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use graphile_worker::{
    IntoTaskHandlerResult, JobSpec, LocalQueueConfig, TaskHandler, WorkerContext, WorkerOptions,
    WorkerUtils,
};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::common::{BATCH, Backend, BenchJob, Hook, PlannedFailure, Target};

/// graphile_worker's schema (its default).
const SCHEMA: &str = "graphile_worker";
/// Attempts a job gets before graphile gives up on it.
const MAX_ATTEMPTS: i16 = 3;
/// How often the worker polls besides LISTEN/NOTIFY.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Only PostgreSQL: graphile_worker is a PostgreSQL job queue.
pub fn supports(b: Backend) -> bool {
    b == Backend::Postgres
}

/// It has a bulk enqueue: `WorkerUtils::add_jobs` (one `INSERT` for the whole batch).
pub fn has_bulk(_b: Backend) -> bool {
    true
}

/// Every job row: a completed job is deleted.
pub fn remaining(_t: &Target) -> super::probe::Remaining {
    super::probe::Remaining::Sql("SELECT count(*) FROM graphile_worker._private_jobs".to_owned())
}

/// How it runs.
pub fn legend(_b: Backend) -> String {
    "`WorkerOptions` at concurrency 64, LocalQueue of 100, 50 ms poll besides LISTEN/NOTIFY, \
     3 attempts; a failed job runs again after graphile's fixed e^1 s; producers `add_job` / \
     `add_jobs`"
        .to_owned()
}

/// The job as graphile sees it: a [`BenchJob`] payload under one task identifier.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BenchTask(pub BenchJob);

impl TaskHandler for BenchTask {
    const IDENTIFIER: &'static str = "stagedoor_bench";

    /// Calls [`Hook::run`]; fails with [`PlannedFailure`] (so graphile retries) when it says so.
    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        let hook = ctx
            .get_ext::<Arc<Hook>>()
            .expect("work() registers the hook as an extension");
        if hook.run(&self.0) {
            Ok(())
        } else {
            Err(PlannedFailure)
        }
    }
}

/// The spec every job is added with: default queue-less, `max_attempts` 3.
fn spec() -> JobSpec {
    JobSpec {
        max_attempts: Some(MAX_ATTEMPTS),
        ..JobSpec::default()
    }
}

/// A pool of `connections` to the target.
async fn pool(t: &Target, connections: u32) -> anyhow::Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(connections)
        .connect(&t.url)
        .await
        .with_context(|| format!("connecting to {}", t.url))
}

/// Runs graphile's migrations, then deletes every job and job queue (raw SQL: graphile has no
/// "delete all jobs" call; the database is graphile's alone).
pub async fn reset(t: &Target) -> anyhow::Result<()> {
    let pool = pool(t, 1).await?;
    WorkerUtils::new(pool.clone(), SCHEMA)
        .migrate()
        .await
        .context("graphile_worker migrations")?;
    sqlx::raw_sql(
        "DELETE FROM graphile_worker._private_jobs; \
         DELETE FROM graphile_worker._private_job_queues;",
    )
    .execute(&pool)
    .await
    .context("deleting graphile_worker jobs")?;
    pool.close().await;
    Ok(())
}

/// Enqueues through `WorkerUtils` on its own pool.
pub struct Producer {
    utils: WorkerUtils,
    spec: JobSpec,
}

impl Producer {
    /// Connects a pool (2 connections; calls are sequential) and wraps it in `WorkerUtils`.
    pub async fn connect(t: &Target) -> anyhow::Result<Self> {
        Ok(Producer {
            utils: WorkerUtils::new(pool(t, 2).await?, SCHEMA),
            spec: spec(),
        })
    }

    /// One `add_job` call.
    pub async fn one(&mut self, job: BenchJob) -> anyhow::Result<()> {
        self.utils
            .add_job(BenchTask(job), self.spec.clone())
            .await?;
        Ok(())
    }

    /// One `add_jobs` call (a single batch insert).
    pub async fn bulk(&mut self, jobs: &[BenchJob]) -> anyhow::Result<()> {
        let batch: Vec<(BenchTask, &JobSpec)> =
            jobs.iter().map(|&j| (BenchTask(j), &self.spec)).collect();
        self.utils.add_jobs(&batch).await?;
        Ok(())
    }
}

/// Runs a graphile worker for [`BenchTask`] until the future is dropped (or the process is
/// killed). Graphile does not install its SIGINT/SIGTERM handlers here; dropping the worker
/// (when this future is dropped) requests its graceful shutdown, which stops its job slots.
pub async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
    let worker = WorkerOptions::default()
        .database_url(&t.url)
        .schema(SCHEMA)
        .concurrency(t.concurrency)
        .poll_interval(POLL_INTERVAL)
        .local_queue(LocalQueueConfig::default().with_size(BATCH))
        .listen_os_shutdown_signals(false)
        .define_job::<BenchTask>()
        .add_extension(hook)
        .init()
        .await
        .context("graphile_worker init")?;
    worker.run().await.context("graphile_worker run")?;
    anyhow::bail!("graphile_worker stopped")
}
