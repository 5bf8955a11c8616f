//! apalis 1.0: `RedisStorage` (apalis-redis), `PostgresStorage` (apalis-postgres) and
//! `SqliteStorage` (apalis-sqlite), driven the way their READMEs show: `TaskBuilder` tasks pushed
//! through `TaskSink` (`push_task`, `push_all`), and a `WorkerBuilder` worker with the `limit`,
//! `retry` and `parallelize` layers running an async fn handler.
//!
//! Knobs: `batch_size(BATCH)` on each backend's `Config`; `poll_with_interval(50 ms)` on each
//! backend (Postgres also listens with `with_pubsub()`, apalis's LISTEN/NOTIFY wake-up; SQLite's
//! update-hook wake-up only sees writes from its own pool, so it is of no use across processes);
//! `concurrency` the target's (`CONCURRENCY` unless the scenario sets it); `RetryPolicy::retries(2)`, which retries a failed run at once, in
//! the worker, and `max_attempts(3)` on every task so that the SQL backends do not run a job
//! again after its third failure (apalis-redis ignores `max_attempts`: its Lua script hardcodes
//! 25). Everything else keeps apalis's defaults (task locking and result persistence on).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use apalis::prelude::{
    BackendExt, Data, ParallelizeExt, RetryPolicy, Task, TaskBuilder, TaskSink, WorkerBuilder,
    WorkerBuilderExt,
};
use apalis_postgres::{PgPool, PostgresStorage};
use apalis_redis::RedisStorage;
use apalis_sqlite::{SqlitePool, SqliteStorage};
use futures::stream;

use crate::common::{BATCH, Backend, BenchJob, Hook, PlannedFailure, Target, now_ns};

/// Redis, Postgres and SQLite: the three persistent backends apalis 1.0 publishes.
pub fn supports(b: Backend) -> bool {
    matches!(b, Backend::Redis | Backend::Postgres | Backend::Sqlite)
}

/// `TaskSink::push_all`: the tasks are buffered and written in one `push_tasks` call (one Lua
/// script on Redis, one multi-row `INSERT` on Postgres and SQLite).
pub fn has_bulk(_b: Backend) -> bool {
    true
}

/// Redis: the active list, the scheduled set and every worker's in-flight set; SQL: the queue's
/// rows not done nor killed (apalis keeps finished rows).
pub fn remaining(t: &Target) -> super::probe::Remaining {
    use super::probe::{RedisPlace, Remaining, lit};
    let q = &t.queue;
    match t.backend {
        Backend::Redis => Remaining::Redis(vec![
            RedisPlace::List(format!("{q}:active")),
            RedisPlace::Zset(format!("{q}:scheduled")),
            RedisPlace::Sets(format!("{q}:inflight*")),
        ]),
        Backend::Postgres => Remaining::Sql(format!(
            "SELECT count(*) FROM apalis.jobs WHERE job_type = {} AND status NOT IN ('Done', 'Killed')",
            lit(q)
        )),
        Backend::Sqlite => Remaining::Sql(format!(
            "SELECT count(*) FROM Jobs WHERE job_type = {} AND status NOT IN ('Done', 'Killed')",
            lit(q)
        )),
    }
}

/// How it runs.
pub fn legend(b: Backend) -> String {
    let common = "`WorkerBuilder` at concurrency 64, `parallelize(tokio::spawn)`, \
        `RetryPolicy::retries(2)`, `batch_size(100)`, 50 ms poll";
    match b {
        Backend::Redis => format!("{common}; producers `push_task` / `push_all`"),
        Backend::Postgres => format!("{common} besides `with_pubsub()` (LISTEN/NOTIFY)"),
        Backend::Sqlite => format!(
            "{common}; its pools opened with `synchronous = NORMAL` (apalis's `setup` sets OFF \
             on its own connection only; sqlx's default is FULL)"
        ),
    }
}

/// An apalis SQLite pool on the target: WAL (set by `setup`), `synchronous = NORMAL` like
/// every SQLite system of the bench.
async fn sqlite_pool(t: &Target) -> anyhow::Result<SqlitePool> {
    use std::str::FromStr;
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&t.url)?
        .synchronous(sqlx::sqlite::SqliteSynchronous::Normal);
    Ok(SqlitePool::connect_with(opts).await?)
}

/// Runs of a job at most: the first plus two immediate retries.
const MAX_ATTEMPTS: usize = 3;

/// How often an idle worker looks for new tasks.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Runs apalis's migrations and removes every job (and worker) a previous run left.
///
/// Redis needs no schema and the harness flushes the database before each measurement, so this
/// only checks that the server answers. apalis's `Vacuum` only deletes finished jobs, so the SQL
/// backends are emptied with plain SQL on apalis's tables.
pub async fn reset(t: &Target) -> anyhow::Result<()> {
    match t.backend {
        Backend::Redis => {
            apalis_redis::connect(t.url.as_str()).await?;
        }
        Backend::Postgres => {
            let pool = PgPool::connect(&t.url).await?;
            PostgresStorage::setup(&pool).await?;
            sqlx::raw_sql("TRUNCATE apalis.jobs, apalis.workers")
                .execute(&pool)
                .await?;
            pool.close().await;
        }
        Backend::Sqlite => {
            let pool = SqlitePool::connect(&t.url).await?;
            SqliteStorage::setup(&pool).await?;
            sqlx::raw_sql("DELETE FROM Jobs; DELETE FROM Workers;")
                .execute(&pool)
                .await?;
            pool.close().await;
        }
    }
    Ok(())
}

/// A storage for `BenchJob` on the target's queue, used as a `TaskSink`.
pub enum Producer {
    /// apalis-redis over a `ConnectionManager`.
    Redis(RedisStorage<BenchJob>),
    /// apalis-postgres over a `PgPool`.
    Postgres(PostgresStorage<BenchJob>),
    /// apalis-sqlite over a `SqlitePool`.
    Sqlite(SqliteStorage<BenchJob>),
}

/// The task for one job: its arguments and the attempt limit.
fn task(job: BenchJob) -> Task<BenchJob> {
    TaskBuilder::new(job).max_attempts(MAX_ATTEMPTS).build()
}

/// apalis-redis's settings: the target's queue, `BATCH` tasks per fetch.
fn redis_config(t: &Target) -> apalis_redis::Config {
    apalis_redis::Config::default()
        .queue(&t.queue)
        .batch_size(BATCH)
}

/// apalis-postgres's settings: the target's queue, `BATCH` tasks per fetch.
fn postgres_config(t: &Target) -> apalis_postgres::Config {
    apalis_postgres::Config::default()
        .queue(&t.queue)
        .batch_size(BATCH)
}

/// apalis-sqlite's settings: the target's queue, `BATCH` tasks per fetch.
fn sqlite_config(t: &Target) -> apalis_sqlite::Config {
    apalis_sqlite::Config::default()
        .queue(&t.queue)
        .batch_size(BATCH)
}

impl Producer {
    /// Connects (a Redis connection manager, or a sqlx pool) and builds the storage.
    pub async fn connect(t: &Target) -> anyhow::Result<Self> {
        Ok(match t.backend {
            Backend::Redis => {
                let conn = apalis_redis::connect(t.url.as_str()).await?;
                Producer::Redis(RedisStorage::new(conn).with_config(redis_config(t)))
            }
            Backend::Postgres => {
                let pool = PgPool::connect(&t.url).await?;
                Producer::Postgres(PostgresStorage::new(&pool).with_config(postgres_config(t)))
            }
            Backend::Sqlite => {
                let pool = sqlite_pool(t).await?;
                Producer::Sqlite(SqliteStorage::new(&pool).with_config(sqlite_config(t)))
            }
        })
    }

    /// One job: `TaskSink::push_task`.
    pub async fn one(&mut self, job: BenchJob) -> anyhow::Result<()> {
        match self {
            Producer::Redis(s) => s.push_task(task(job)).await?,
            Producer::Postgres(s) => s.push_task(task(job)).await?,
            Producer::Sqlite(s) => s.push_task(task(job)).await?,
        }
        Ok(())
    }

    /// The slice: one `TaskSink::push_all` call.
    pub async fn bulk(&mut self, jobs: &[BenchJob]) -> anyhow::Result<()> {
        let tasks = || stream::iter(jobs.iter().copied().map(task));
        match self {
            Producer::Redis(s) => s.push_all(tasks()).await?,
            Producer::Postgres(s) => s.push_all(tasks()).await?,
            Producer::Sqlite(s) => s.push_all(tasks()).await?,
        }
        Ok(())
    }
}

/// The handler: the hook decides; a planned failure goes back to apalis's retry layer.
async fn handle(job: BenchJob, hook: Data<Arc<Hook>>) -> Result<(), PlannedFailure> {
    if hook.run(&job) {
        Ok(())
    } else {
        Err(PlannedFailure)
    }
}

/// A name no other worker has: apalis-redis refuses to register a name seen within the
/// heartbeat threshold, and the SQL backends key their workers table by it.
fn worker_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "bench-{}-{}-{}",
        std::process::id(),
        now_ns(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Builds the worker on `$backend` and runs it: `$concurrency` tasks at once, each spawned on
/// the runtime, a failed run retried at once up to `MAX_ATTEMPTS` runs in all.
macro_rules! run_worker {
    ($backend:expr, $hook:expr, $concurrency:expr) => {
        WorkerBuilder::new(worker_name())
            .backend($backend)
            .data($hook)
            .concurrency($concurrency)
            .parallelize(tokio::spawn)
            .retry(RetryPolicy::retries(MAX_ATTEMPTS - 1))
            .build(handle)
            .run()
            .await
    };
}

/// One worker on the target's queue; returns only when apalis reports a backend error.
pub async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
    match t.backend {
        Backend::Redis => {
            // Polls: apalis-redis's pubsub wake-up (`RedisStorageFactory`) never fires for these
            // tasks, since every push goes through the scheduled set, which publishes nothing.
            let conn = apalis_redis::connect(t.url.as_str()).await?;
            let storage = RedisStorage::<BenchJob>::new(conn)
                .with_config(redis_config(t))
                .poll_with_interval(POLL_INTERVAL);
            run_worker!(storage, hook, t.concurrency)?;
        }
        Backend::Postgres => {
            let pool = PgPool::connect(&t.url).await?;
            let storage = PostgresStorage::<BenchJob>::new(&pool)
                .with_config(postgres_config(t))
                .with_pubsub()
                .poll_with_interval(POLL_INTERVAL);
            run_worker!(storage, hook, t.concurrency)?;
        }
        Backend::Sqlite => {
            let pool = sqlite_pool(t).await?;
            let storage = SqliteStorage::<BenchJob>::new(&pool)
                .with_config(sqlite_config(t))
                .poll_with_interval(POLL_INTERVAL);
            run_worker!(storage, hook, t.concurrency)?;
        }
    }
    anyhow::bail!("the apalis worker stopped")
}
