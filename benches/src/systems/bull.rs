//! bullmq-official 1.4 (BullMQ's Rust port: the Node library's Lua scripts and keys), on Redis,
//! driven the way its README shows: a `Queue` adds jobs (`add`, `add_bulk`), a `Worker` runs an
//! async closure over `Job`s.
//!
//! Knobs: worker concurrency the target's ([`crate::common::CONCURRENCY`] unless the scenario
//! sets it), everything else BullMQ's defaults (30 s lock renewed at half its duration, stalled
//! check every 30 s, a connection pool of 4). Jobs: `attempts(3)` with no backoff, so a failed
//! job goes straight back to the wait list; `remove_on_complete` / `remove_on_fail` keep the
//! last 1,000, as BullMQ's production guide recommends (its default keeps every finished job
//! in Redis).
//!
//! Completion: BullMQ moves a job to `completed` in the same script that fetches the next one
//! (`moveToFinished`); a job is done for the harness when no list or set of live jobs (wait,
//! active, delayed, prioritized, paused) holds it.

use std::sync::Arc;

use anyhow::Context as _;
use bullmq::options::RedisConnectionOptions;
use bullmq::types::RemoveOnFinish;
use bullmq::worker::CancellationToken;
use bullmq::{BulkJob, Job, JobOptions, Queue, QueueOptions, Worker, WorkerOptions};

use super::probe::{RedisPlace, Remaining};
use crate::common::{Backend, BenchJob, Hook, Target};

/// Attempts a job gets.
const ATTEMPTS: u32 = 3;
/// Finished jobs kept (BullMQ's production guide's example).
const KEEP: usize = 1_000;
/// The job name every job is added under.
const NAME: &str = "stagedoor_bench";
/// BullMQ's default key prefix.
const PREFIX: &str = "bull";

/// Only Redis.
pub fn supports(b: Backend) -> bool {
    b == Backend::Redis
}

/// It has a bulk enqueue: `Queue::add_bulk` (one script call per batch).
pub fn has_bulk(_b: Backend) -> bool {
    true
}

/// BullMQ's lists and sets of live jobs.
pub fn remaining(t: &Target) -> Remaining {
    let k = |s: &str| format!("{PREFIX}:{}:{s}", t.queue);
    Remaining::Redis(vec![
        RedisPlace::List(k("wait")),
        RedisPlace::List(k("active")),
        RedisPlace::List(k("paused")),
        RedisPlace::Zset(k("delayed")),
        RedisPlace::Zset(k("prioritized")),
    ])
}

/// How it runs.
pub fn legend(_b: Backend) -> String {
    "`Worker` at concurrency 64 with BullMQ's defaults (30 s lock, 30 s stalled check, pool of \
     4); jobs with 3 attempts and no backoff, the last 1,000 finished kept; producers `add` / \
     `add_bulk`"
        .to_owned()
}

/// The connection options for the target.
fn connection(t: &Target) -> RedisConnectionOptions {
    RedisConnectionOptions {
        url: t.url.clone(),
        ..RedisConnectionOptions::default()
    }
}

/// The options every job is added with.
fn job_options() -> JobOptions {
    JobOptions::default()
        .attempts(ATTEMPTS)
        .remove_on_complete(RemoveOnFinish::Count(KEEP))
        .remove_on_fail(RemoveOnFinish::Count(KEEP))
}

/// Nothing to set up (the harness empties Redis before each measurement): checks that a queue
/// opens on the server.
pub async fn reset(t: &Target) -> anyhow::Result<()> {
    let q = Queue::with_options(
        &t.queue,
        QueueOptions {
            connection: connection(t),
            ..QueueOptions::default()
        },
    )
    .await
    .with_context(|| format!("opening a BullMQ queue on {}", t.url))?;
    q.close().await;
    Ok(())
}

/// A `Queue` that adds jobs.
pub struct Producer {
    queue: Queue,
}

impl Producer {
    /// Opens the queue, its default job options set.
    pub async fn connect(t: &Target) -> anyhow::Result<Self> {
        let queue = Queue::with_options(
            &t.queue,
            QueueOptions {
                connection: connection(t),
                default_job_options: job_options(),
                ..QueueOptions::default()
            },
        )
        .await?;
        Ok(Producer { queue })
    }

    /// One `add` call.
    pub async fn one(&mut self, job: BenchJob) -> anyhow::Result<()> {
        self.queue.add(NAME, job).await?;
        Ok(())
    }

    /// One `add_bulk` call.
    pub async fn bulk(&mut self, jobs: &[BenchJob]) -> anyhow::Result<()> {
        let batch = jobs
            .iter()
            .map(|j| BulkJob::with_options(NAME, j, job_options()))
            .collect();
        self.queue.add_bulk(batch).await?;
        Ok(())
    }
}

/// Runs a BullMQ worker on the target's queue until the process is killed.
pub async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
    let opts = WorkerOptions {
        connection: connection(t),
        concurrency: t.concurrency,
        ..WorkerOptions::default()
    };
    let _worker = Worker::with_options(
        &t.queue,
        move |job: Job, _token: CancellationToken| {
            let hook = hook.clone();
            async move {
                let j: BenchJob = serde_json::from_value(job.data().clone())?;
                if hook.run(&j) {
                    Ok(serde_json::Value::Null)
                } else {
                    Err(bullmq::Error::ProcessingError(
                        "planned failure (the job succeeds on its retry)".to_owned(),
                    ))
                }
            }
        },
        opts,
    )
    .await
    .context("starting the BullMQ worker")?;
    std::future::pending::<()>().await;
    Ok(())
}
