//! awa 0.6 (Postgres, "vacuum-aware storage", heartbeat recovery), driven the way its README
//! shows: `#[derive(JobArgs)]` arguments, `Client::builder(pool)` with one queue and a
//! handler registered with `register`, `awa::migrations::run`, producers `insert_with` and,
//! for bulk, `insert_many_copy_from_pool` (awa's COPY path).
//!
//! Knobs: the queue's `max_workers` is the target's concurrency
//! ([`crate::common::CONCURRENCY`] unless the scenario sets it; awa's default is 50); poll
//! interval 50 ms like every polling system here (awa's default is 200 ms); everything else
//! awa's defaults (its claim batch, one claimer, heartbeats, the storage engine its migrations
//! select). Pool as the README opens it: `PgPool::connect` (sqlx 0.8, awa's; 10 connections).
//!
//! Retries: a failed first run answers `JobResult::RetryAfter(0)` (awa's "this attempt
//! failed, retry after this delay", which counts the attempt), since awa's `Retryable` error
//! waits an exponential backoff and the bench's rule is "retry at once or after the shortest
//! delay the system allows". `max_attempts` 3.
//!
//! Completion: a job is done for the harness when the `awa.jobs` view shows it in no live
//! state (`scheduled`, `available`, `retryable`, `running`, `waiting_external`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use awa::{Client, InsertOpts, JobArgs, JobContext, JobResult, QueueConfig};
use serde::{Deserialize, Serialize};
use sqlx08::PgPool;

use crate::common::{Backend, BenchJob, Hook, Target};

/// Attempts a job gets.
const MAX_ATTEMPTS: i16 = 3;
/// How often an idle queue polls.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Only PostgreSQL.
pub fn supports(b: Backend) -> bool {
    b == Backend::Postgres
}

/// It has a bulk enqueue: `insert_many_copy_from_pool` (COPY into a staging table).
pub fn has_bulk(_b: Backend) -> bool {
    true
}

/// Jobs of the queue in a live state, through awa's `awa.jobs` view.
pub fn remaining(t: &Target) -> super::probe::Remaining {
    super::probe::Remaining::Sql(format!(
        "SELECT count(*) FROM awa.jobs WHERE queue = '{}' \
         AND state IN ('scheduled', 'available', 'retryable', 'running', 'waiting_external')",
        t.queue.replace('\'', "''")
    ))
}

/// How it runs.
pub fn legend(_b: Backend) -> String {
    "`Client` with one queue at `max_workers` 64, 50 ms poll, awa's other defaults (claim \
     batch, heartbeats, its storage engine); a failed run answers `RetryAfter(0)`, 3 attempts; \
     `PgPool::connect` (10 connections); producers `insert_with` / \
     `insert_many_copy_from_pool` (COPY)"
        .to_owned()
}

/// The job as awa sees it (kind `bench_args`).
#[derive(Clone, Debug, Deserialize, JobArgs, Serialize)]
struct BenchArgs {
    i: u64,
    ts: u64,
}

async fn pool(t: &Target) -> anyhow::Result<PgPool> {
    PgPool::connect(&t.url)
        .await
        .with_context(|| format!("connecting to {}", t.url))
}

fn opts(t: &Target) -> InsertOpts {
    InsertOpts {
        queue: t.queue.clone(),
        max_attempts: MAX_ATTEMPTS,
        ..InsertOpts::default()
    }
}

/// Drops awa's schema and runs its migrations: every measurement starts from an empty,
/// freshly migrated awa (awa has no "delete every job" call across its storage tables).
pub async fn reset(t: &Target) -> anyhow::Result<()> {
    let p = pool(t).await?;
    sqlx08::raw_sql("DROP SCHEMA IF EXISTS awa CASCADE")
        .execute(&p)
        .await
        .context("dropping awa's schema")?;
    awa::migrations::run(&p).await.context("awa's migrations")?;
    p.close().await;
    Ok(())
}

/// Inserts on its own pool.
pub struct Producer {
    pool: PgPool,
    opts: InsertOpts,
}

impl Producer {
    /// Opens a pool.
    pub async fn connect(t: &Target) -> anyhow::Result<Self> {
        Ok(Producer {
            pool: pool(t).await?,
            opts: opts(t),
        })
    }

    /// One `insert_with` call.
    pub async fn one(&mut self, job: BenchJob) -> anyhow::Result<()> {
        let args = BenchArgs {
            i: job.i,
            ts: job.ts,
        };
        awa::insert_with(&self.pool, &args, self.opts.clone()).await?;
        Ok(())
    }

    /// One `insert_many_copy_from_pool` call.
    pub async fn bulk(&mut self, jobs: &[BenchJob]) -> anyhow::Result<()> {
        let params = jobs
            .iter()
            .map(|j| {
                let args = BenchArgs { i: j.i, ts: j.ts };
                awa::insert::params_with(&args, self.opts.clone())
            })
            .collect::<Result<Vec<_>, _>>()?;
        awa::insert_many_copy_from_pool(&self.pool, &params).await?;
        Ok(())
    }
}

/// Runs an awa client on the target's queue until the process is killed.
pub async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
    let config = QueueConfig {
        max_workers: u32::try_from(t.concurrency).unwrap_or(u32::MAX),
        poll_interval: POLL_INTERVAL,
        ..QueueConfig::default()
    };
    let client = Client::builder(pool(t).await?)
        .queue(t.queue.clone(), config)
        .register::<BenchArgs, _, _>(move |args: BenchArgs, _ctx: &JobContext| {
            let hook = hook.clone();
            async move {
                let j = BenchJob {
                    i: args.i,
                    ts: args.ts,
                };
                if hook.run(&j) {
                    Ok(JobResult::Completed)
                } else {
                    Ok(JobResult::RetryAfter(Duration::ZERO))
                }
            }
        })
        .build()
        .context("building the awa client")?;
    client.start().await.context("starting the awa client")?;
    std::future::pending::<()>().await;
    Ok(())
}
