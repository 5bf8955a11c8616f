//! stagedoor-jobs: `RedisBroker` on Redis, `SqlxBroker` routes on Postgres and SQLite, a
//! `#[derive(Inbox)]` table, a service with one subscriber, producers through `Publish`.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::{Broker, Inspect, Publish};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{Inbox, RouteBuilder};
use stagedoor_jobs_redis::RedisBroker;
use stagedoor_jobs_sqlx::{SqlxBroker, SqlxRoute};

use crate::common::{Backend, BenchJob, Hook, PlannedFailure, Target};

/// Every backend.
pub fn supports(_b: Backend) -> bool {
    true
}

/// `Publish::publish_jobs`: one round trip per batch.
pub fn has_bulk(_b: Backend) -> bool {
    true
}

/// Redis: the stream's group (pending + lag) and the delayed set; SQL: the queue's rows.
pub fn remaining(t: &Target) -> super::probe::Remaining {
    use super::probe::{RedisPlace, Remaining, lit};
    match t.backend {
        Backend::Redis => Remaining::Redis(vec![
            RedisPlace::Group {
                stream: format!("{{{}}}", t.queue),
                group: "stagedoor".to_owned(),
            },
            RedisPlace::Zset(format!("{{{}}}:delayed", t.queue)),
        ]),
        _ => Remaining::Sql(format!(
            "SELECT count(*) FROM bench_jobs WHERE queue = {}",
            lit(&t.queue)
        )),
    }
}

/// How it runs.
pub fn legend(b: Backend) -> String {
    match b {
        Backend::Redis => "`RedisBroker`, one subscriber at concurrency 64, `Immediate` backoff, \
            3 attempts; producers `publish_job` / `publish_jobs`"
            .to_owned(),
        Backend::Postgres => "`SqlxBroker` route on a `#[derive(Inbox)]` table, pool of 8, \
            50 ms poll besides LISTEN/NOTIFY, concurrency 64"
            .to_owned(),
        Backend::Sqlite => "`SqlxBroker` route, pool of 4, 50 ms poll, concurrency 64; the \
            crate opens SQLite in WAL with `synchronous = NORMAL`"
            .to_owned(),
    }
}

const SQLITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS bench_jobs (
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    locked_until TEXT,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS bench_jobs_due3 ON bench_jobs (queue, retry_after, id);";

const POSTGRES_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS bench_jobs (
    id BIGSERIAL PRIMARY KEY,
    queue TEXT NOT NULL,
    attempt SMALLINT NOT NULL DEFAULT 1,
    retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_until TIMESTAMPTZ,
    payload BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS bench_jobs_due3 ON bench_jobs (queue, retry_after, id);";

/// One row of `bench_jobs`.
#[derive(Inbox)]
#[inbox(table = "bench_jobs")]
#[allow(dead_code)]
pub struct BenchRow {
    #[field(id, generated)]
    id: i64,
    #[field(group)]
    queue: String,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

/// Where a worker polls (SQLite across processes; Postgres between notifications): the bench's
/// 50 ms for every system.
const POLL: std::time::Duration = std::time::Duration::from_millis(50);

type PgRoute = SqlxRoute<sqlx::Postgres, BenchRow>;
type LiteRoute = SqlxRoute<sqlx::Sqlite, BenchRow>;

fn pg_route(url: &str) -> PgRoute {
    SqlxBroker::<sqlx::Postgres>::from_url(
        url,
        sqlx::postgres::PgPoolOptions::new().max_connections(8),
    )
    .poll_interval(POLL)
    .route::<BenchRow>("bench")
}

fn lite_route(url: &str) -> LiteRoute {
    SqlxBroker::<sqlx::Sqlite>::from_url(
        url,
        sqlx::sqlite::SqlitePoolOptions::new().max_connections(4),
    )
    .poll_interval(POLL)
    .route::<BenchRow>("bench")
}

/// Creates the table and empties it (Redis: the harness flushes the server).
pub async fn reset(t: &Target) -> anyhow::Result<()> {
    use sqlx::Connection;
    match t.backend {
        Backend::Redis => {}
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&t.url).await?;
            sqlx::raw_sql(POSTGRES_SCHEMA).execute(&mut c).await?;
            sqlx::raw_sql("TRUNCATE bench_jobs").execute(&mut c).await?;
        }
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&t.url).await?;
            sqlx::raw_sql(SQLITE_SCHEMA).execute(&mut c).await?;
            sqlx::raw_sql("DELETE FROM bench_jobs")
                .execute(&mut c)
                .await?;
        }
    }
    Ok(())
}

/// A connected broker.
pub enum Producer {
    /// Redis.
    Redis(RedisBroker, String),
    /// Postgres.
    Postgres(PgRoute, String),
    /// SQLite.
    Sqlite(LiteRoute, String),
}

fn job(queue: &str, j: &BenchJob) -> anyhow::Result<Job> {
    Ok(Job::new(queue, j)?)
}

impl Producer {
    /// Connects.
    pub async fn connect(t: &Target) -> anyhow::Result<Self> {
        Ok(match t.backend {
            Backend::Redis => {
                let b = RedisBroker::from_url(&t.url);
                Inspect::connect(&b).await?;
                Producer::Redis(b, t.queue.clone())
            }
            Backend::Postgres => {
                let r = pg_route(&t.url);
                Inspect::connect(&r).await?;
                Producer::Postgres(r, t.queue.clone())
            }
            Backend::Sqlite => {
                let r = lite_route(&t.url);
                Inspect::connect(&r).await?;
                Producer::Sqlite(r, t.queue.clone())
            }
        })
    }

    /// One job: `publish_job`.
    pub async fn one(&mut self, j: BenchJob) -> anyhow::Result<()> {
        match self {
            Producer::Redis(b, q) => b.publish_job(job(q, &j)?).await?,
            Producer::Postgres(r, q) => r.publish_job(job(q, &j)?).await?,
            Producer::Sqlite(r, q) => r.publish_job(job(q, &j)?).await?,
        };
        Ok(())
    }

    /// A batch: `publish_jobs`.
    pub async fn bulk(&mut self, jobs: &[BenchJob]) -> anyhow::Result<()> {
        let q = match self {
            Producer::Redis(_, q) | Producer::Postgres(_, q) | Producer::Sqlite(_, q) => q.clone(),
        };
        let batch = jobs
            .iter()
            .map(|j| job(&q, j))
            .collect::<anyhow::Result<Vec<_>>>()?;
        match self {
            Producer::Redis(b, _) => b.publish_jobs(batch).await?,
            Producer::Postgres(r, _) => r.publish_jobs(batch).await?,
            Producer::Sqlite(r, _) => r.publish_jobs(batch).await?,
        };
        Ok(())
    }
}

/// The handler: the hook decides, a planned failure is retried at once.
async fn run(job: &BenchJob, Data(hook): Data<Arc<Hook>>) -> Result<(), PlannedFailure> {
    if hook.run(job) {
        Ok(())
    } else {
        Err(PlannedFailure)
    }
}

fn mount<B: Broker>(b: &mut RouteBuilder<B>, queue: &str, concurrency: usize, global: Option<u32>)
where
    String: stagedoor_jobs::QueueFor<B>,
{
    let dead = b.broker().default_dead_letter(queue);
    let m = b
        .include(Subscriber::new(queue.to_owned(), run))
        .max_attempts(nonzero!(3u32))
        .dead_letter(dead)
        .backoff(Immediate)
        .concurrency(concurrency);
    if let Some(n) = global {
        m.global_concurrency(n);
    }
}

/// A service with one subscriber at the target's concurrency, until killed.
pub async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
    let service = Service::new(AppInfo::new("bench", "0.1.0")).state(hook);
    let (q, n, g) = (t.queue.clone(), t.concurrency, t.global_concurrency);
    let service = match t.backend {
        Backend::Redis => {
            service.with_broker(RedisBroker::from_url(&t.url), |b| mount(b, &q, n, g))
        }
        Backend::Postgres => service.with_broker(pg_route(&t.url), |b| mount(b, &q, n, g)),
        Backend::Sqlite => service.with_broker(lite_route(&t.url), |b| mount(b, &q, n, g)),
    };
    service.run_until(std::future::pending()).await?;
    Ok(())
}
