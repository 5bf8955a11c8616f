//! ruststream 0.7: the inbox of `ruststream-sqlx` on SQLite and Postgres (a queue table its
//! broker claims rows from), and Redis Streams read through a consumer group with
//! `ruststream-fred`.
//!
//! Each side is a RustStream service built the way the crates' guides build one: a broker value,
//! a subscription descriptor (`InboxQueue`, `RedisStream`), a handler mounted with `include`,
//! `workers(n)`, and the retry cap `max_attempts(3)` with the dead letter it must name. The
//! handler is the manual path's `Handle` body, because it holds the measurement's [`Hook`] and
//! reads a queue whose name is known only at run time. A producer publishes through a publisher
//! paired from a started app with no subscriptions (`bindable`, `bind`,
//! `RunningApp::publisher`), one `publish` per job, and shuts that app down when dropped.
//!
//! A handler settles with a `HandlerOutcome`: `Ok(())` acks, and a planned failure returns
//! `Err(HandlerOutcome::retry())`, which requeues (an error of any other type drops the
//! message). On the inbox a retry counts the attempt and returns the row to the queue at once;
//! on a stream the runtime appends a copy carrying its retry count and acks the original. A job
//! that fails its third attempt moves to the `<queue>.dead` group (inbox) or stream (Redis).
//!
//! Knobs: `workers(n)` everywhere, n the target's concurrency (`CONCURRENCY` unless the
//! scenario sets it). The inbox table is in the lease form on both SQL
//! backends (a claim writes the lease and commits, so a job in work holds no connection and four
//! worker processes fit Postgres's connection limit); a single-message handler claims a row per
//! free worker (on SQLite one claim serves every free worker), and a claim that comes back short
//! waits the 50 ms poll interval (a publish wakes only the subscriptions of its own broker, and
//! the producer's is another one). A stream subscription reads up to 64 entries per
//! `XREADGROUP` (the crate's fixed prefetch for a single-message handler) and blocks on the
//! server. `batch(n)` exists only as a slice handler, whose whole batch is one unit of
//! concurrency, so `BATCH` is not used.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use ruststream::prelude::{Context, Handle, HandlerOutcome, Outgoing, PublishExt};
use ruststream::runtime::RunningApp;
use serde::Serialize;

use crate::common::{Backend, BenchJob, Hook, Target};

/// Handlers in work at once: the target's concurrency (at least one).
fn workers(t: &Target) -> NonZeroUsize {
    NonZeroUsize::new(t.concurrency).unwrap_or(NonZeroUsize::MIN)
}

/// How long an inbox subscription waits after a claim that found fewer rows than it asked for.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The most connections a worker's Postgres pool opens.
const PG_POOL: u32 = 16;

/// The most connections a producer's Postgres pool opens.
const PRODUCER_POOL: u32 = 2;

/// Whether the Postgres brokers wake their subscriptions with `LISTEN` / `NOTIFY`
/// (`SqlxBroker::listen_notify`: each publish also sends `pg_notify`): on, as the crate's guide
/// recommends for a worker that should not wait out its poll interval.
const LISTEN_NOTIFY: bool = true;

/// What the producer publishes: the job itself on the wire (`serde(transparent)`), declared as an
/// outgoing message whose destination the call names.
#[derive(Serialize, Outgoing)]
#[serde(transparent)]
struct Enqueued(BenchJob);

/// Where a job goes after its third failure.
fn dead_letter(t: &Target) -> String {
    format!("{}.dead", t.queue)
}

/// SQLite and Postgres (the inbox, lease form) and Redis (Streams).
pub fn supports(b: Backend) -> bool {
    matches!(b, Backend::Sqlite | Backend::Postgres | Backend::Redis)
}

/// On Redis, a transaction of the stream publisher (`PublishExt::begin`, `publish` per job,
/// `commit`) sends its buffered `XADD`s as one `MULTI` / `EXEC` block: that is the bulk call.
/// The inbox has no multi-row publish: one `publish` per job (the harness runs 8 producers).
pub fn has_bulk(b: Backend) -> bool {
    b == Backend::Redis
}

/// Redis: the group's pending entries and lag (the crate never deletes entries; a retry is a
/// new entry of the same stream); SQL: the queue's rows (an ack deletes the row).
pub fn remaining(t: &Target) -> super::probe::Remaining {
    use super::probe::{RedisPlace, Remaining, lit};
    match t.backend {
        Backend::Redis => Remaining::Redis(vec![RedisPlace::Group {
            stream: t.queue.clone(),
            group: redis::GROUP.to_owned(),
        }]),
        _ => Remaining::Sql(format!(
            "SELECT count(*) FROM ruststream_jobs WHERE queue = {}",
            lit(&t.queue)
        )),
    }
}

/// How it runs (single-message handler).
pub fn legend(b: Backend) -> String {
    match b {
        Backend::Redis => "`ruststream-fred` stream subscription, `workers(64)`, prefetch 64 per \
            `XREADGROUP`, 3 attempts; never deletes entries, no fence on the ack; bulk = a \
            publisher transaction (`MULTI`/`EXEC`)"
            .to_owned(),
        Backend::Postgres => "`ruststream-sqlx` inbox (lease form), `workers(64)`, pool of 16, \
            `listen_notify()` and a 50 ms poll, 3 attempts; one `publish` per job"
            .to_owned(),
        Backend::Sqlite => "`ruststream-sqlx` inbox (lease form), `workers(64)`, 50 ms poll, \
            opened in WAL with `synchronous = NORMAL`; one `publish` per job"
            .to_owned(),
    }
}

/// How the batch-handler row runs.
pub fn legend_batch(b: Backend) -> String {
    format!(
        "as ruststream, but the handler is a batch body over `[T]` with `batch({BATCH_SIZE})` \
         (one batch at a time, one outcome per element){}",
        if b == Backend::Redis {
            ": one `XREADGROUP COUNT 100` per batch"
        } else {
            ": one claim of up to 100 rows per batch"
        }
    )
}

/// Messages per call of the batch handler: the bench's `BATCH`.
const BATCH_SIZE: usize = crate::common::BATCH;

/// Creates the queue table and its claim index (SQLite, Postgres) and empties it. Redis needs
/// nothing: the worker creates its group at the stream's start, and the harness flushes the
/// server.
pub async fn reset(t: &Target) -> anyhow::Result<()> {
    match t.backend {
        Backend::Sqlite => sqlite::reset(t).await,
        Backend::Postgres => postgres::reset(t).await,
        Backend::Redis => Ok(()),
    }
}

/// The live publisher of one backend.
enum Publisher {
    Sqlite(sqlite::Publisher),
    Postgres(postgres::Publisher),
    Redis(redis::Publisher),
}

/// Publishes jobs to the queue through the publisher of a started app with no subscriptions.
pub struct Producer {
    queue: String,
    publisher: Publisher,
    /// The app the publisher was paired from; shut down on drop, which closes its pool.
    app: Option<RunningApp>,
}

impl Producer {
    /// Starts an app on the target's broker and pairs its publisher.
    pub async fn connect(t: &Target) -> anyhow::Result<Self> {
        let (publisher, app) = match t.backend {
            Backend::Sqlite => {
                let (p, app) = sqlite::publisher(t).await?;
                (Publisher::Sqlite(p), app)
            }
            Backend::Postgres => {
                let (p, app) = postgres::publisher(t).await?;
                (Publisher::Postgres(p), app)
            }
            Backend::Redis => {
                let (p, app) = redis::publisher(t).await?;
                (Publisher::Redis(p), app)
            }
        };
        Ok(Producer {
            queue: t.queue.clone(),
            publisher,
            app: Some(app),
        })
    }

    /// One `publish` call.
    pub async fn one(&mut self, job: BenchJob) -> anyhow::Result<()> {
        let job = Enqueued(job);
        let queue = self.queue.as_str();
        match &self.publisher {
            Publisher::Sqlite(p) => p.message(&job).to(queue).publish().await?,
            Publisher::Postgres(p) => p.message(&job).to(queue).publish().await?,
            Publisher::Redis(p) => p.message(&job).to(queue).publish().await?,
        }
        Ok(())
    }

    /// Redis: one transaction (`begin`, a `publish` per job, `commit`: one `MULTI` / `EXEC`).
    /// The inbox: one `publish` call per job, one after another.
    pub async fn bulk(&mut self, jobs: &[BenchJob]) -> anyhow::Result<()> {
        if let Publisher::Redis(p) = &self.publisher {
            let mut scope = p.begin().await?;
            for job in jobs {
                scope.publish(self.queue.as_str(), &Enqueued(*job)).await?;
            }
            scope.commit().await?;
            return Ok(());
        }
        for job in jobs {
            self.one(*job).await?;
        }
        Ok(())
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        // Dropping a `RunningApp` detaches it; its graceful shutdown closes the broker's pool.
        if let (Some(app), Ok(runtime)) = (self.app.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(app.shutdown());
        }
    }
}

/// Runs the queue's service until the process is killed: returns only when the service fails to
/// start or tears itself down.
pub async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
    match t.backend {
        Backend::Sqlite => sqlite::work(t, hook).await,
        Backend::Postgres => postgres::work(t, hook).await,
        Backend::Redis => redis::work(t, hook).await,
    }?;
    anyhow::bail!("the ruststream service stopped")
}

/// Runs the queue's service with the batch handler until the process is killed.
pub async fn work_batch(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
    match t.backend {
        Backend::Sqlite => sqlite::work_batch(t, hook).await,
        Backend::Postgres => postgres::work_batch(t, hook).await,
        Backend::Redis => redis::work_batch(t, hook).await,
    }?;
    anyhow::bail!("the ruststream service stopped")
}

/// The batch handler body: the hook for each job, one outcome per element (ack, or a retry
/// where the hook says fail).
struct RunBatch {
    hook: Arc<Hook>,
}

impl Handle<[BenchJob]> for RunBatch {
    async fn handle(
        &self,
        jobs: &[BenchJob],
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), Vec<HandlerOutcome>> {
        let ok: Vec<bool> = jobs.iter().map(|j| self.hook.run(j)).collect();
        if ok.iter().all(|k| *k) {
            return Ok(());
        }
        Err(ok
            .into_iter()
            .map(|k| {
                if k {
                    HandlerOutcome::ack()
                } else {
                    HandlerOutcome::retry()
                }
            })
            .collect())
    }
}

/// The handler body: runs the hook first, and asks for a retry when it says fail.
struct RunJob {
    hook: Arc<Hook>,
}

impl Handle<BenchJob> for RunJob {
    async fn handle(
        &self,
        job: &BenchJob,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> Result<(), HandlerOutcome> {
        if self.hook.run(job) {
            Ok(())
        } else {
            Err(HandlerOutcome::retry())
        }
    }
}

/// The inbox row, on SQLite and Postgres alike: `queue` is the group a subscription reads,
/// `attempt` what the retry cap counts, `locked_until` the lease that selects the lease form.
mod inbox {
    use chrono::{DateTime, Utc};
    use ruststream::OutgoingMessage;
    use ruststream_sqlx::prelude::*;
    use sqlx::{PgConnection, Postgres, Sqlite, SqliteConnection};

    /// One job of the queue table.
    #[derive(Inbox, sqlx::FromRow)]
    #[inbox(table = "ruststream_jobs")]
    pub(super) struct Job {
        #[field(id, generated)]
        id: i64,
        #[field(group)]
        queue: String,
        #[field(attempt, generated)]
        attempt: i16,
        #[field(locked_until)]
        locked_until: Option<DateTime<Utc>>,
        #[field(payload)]
        payload: Vec<u8>,
    }

    /// A publish writes the name into the group column and the bytes into the payload.
    impl Publish<Sqlite> for Job {
        async fn publish(
            conn: &mut SqliteConnection,
            message: &OutgoingMessage<'_>,
        ) -> Result<(), sqlx::Error> {
            sqlx::query("INSERT INTO ruststream_jobs (queue, payload) VALUES (?, ?)")
                .bind(message.name())
                .bind(message.payload())
                .execute(conn)
                .await?;
            Ok(())
        }
    }

    /// A publish writes the name into the group column and the bytes into the payload.
    impl Publish<Postgres> for Job {
        async fn publish(
            conn: &mut PgConnection,
            message: &OutgoingMessage<'_>,
        ) -> Result<(), sqlx::Error> {
            sqlx::query("INSERT INTO ruststream_jobs (queue, payload) VALUES ($1, $2)")
                .bind(message.name())
                .bind(message.payload())
                .execute(conn)
                .await?;
            Ok(())
        }
    }
}

/// The inbox on SQLite (WAL).
mod sqlite {
    use std::str::FromStr;
    use std::sync::Arc;

    use ruststream::runtime::RunningApp;
    use ruststream_sqlx::RepositoryPublisher;
    use ruststream_sqlx::prelude::*;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    use sqlx::{Connection, Sqlite, SqliteConnection};

    use super::inbox::Job;
    use super::{BATCH_SIZE, POLL_INTERVAL, RunBatch, RunJob, dead_letter, workers};
    use crate::common::{Hook, Target};

    /// The producer's live publisher: a publish is an insert into [`Job`]'s table.
    pub(super) type Publisher = RepositoryPublisher<Sqlite, Job>;

    /// The table and its claim index.
    const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS ruststream_jobs (
        id INTEGER PRIMARY KEY,
        queue TEXT NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 1,
        locked_until TEXT,
        payload BLOB NOT NULL
    );
    CREATE INDEX IF NOT EXISTS ruststream_jobs_claim ON ruststream_jobs (queue, id);";

    /// The target's file, in WAL mode, `synchronous = NORMAL` like every SQLite system here.
    fn options(t: &Target) -> anyhow::Result<SqliteConnectOptions> {
        Ok(SqliteConnectOptions::from_str(&t.url)?
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal))
    }

    /// Creates the table and empties it.
    pub(super) async fn reset(t: &Target) -> anyhow::Result<()> {
        let mut conn = SqliteConnection::connect_with(&options(t)?).await?;
        sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
        sqlx::query("DELETE FROM ruststream_jobs")
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        Ok(())
    }

    /// Starts an app with no subscriptions and pairs a `Repository` publisher from it.
    pub(super) async fn publisher(t: &Target) -> anyhow::Result<(Publisher, RunningApp)> {
        let broker =
            SqlxBroker::from_connect_options(options(t)?, SqlitePoolOptions::new()).bindable();
        let jobs = broker.bind(Repository::<Job>::default());
        let app = RustStream::new(AppInfo::new("bench-producer", "0.1.0"))
            .with_broker(broker, |_b| {})
            .start()
            .await?;
        let publisher = app.publisher(jobs).await?;
        Ok((publisher, app))
    }

    /// Serves the queue until the service stops.
    pub(super) async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
        let broker = SqlxBroker::from_connect_options(options(t)?, SqlitePoolOptions::new())
            .poll_interval(POLL_INTERVAL);
        let queue = t.queue.clone();
        let dead = dead_letter(t);
        let n = workers(t);
        RustStream::new(AppInfo::new("bench-worker", "0.1.0"))
            .with_broker(broker, |b| {
                let run = subscriber(queue.clone(), RunJob { hook })
                    .map_source(move |_| InboxQueue::<Job>::new(queue))
                    .workers(n);
                b.include(run.build())
                    .max_attempts(nonzero!(3u32))
                    .dead_letter(dead);
            })
            .run_until(std::future::pending())
            .await?;
        Ok(())
    }

    /// Serves the queue with the batch handler until the service stops.
    pub(super) async fn work_batch(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
        let broker = SqlxBroker::from_connect_options(options(t)?, SqlitePoolOptions::new())
            .poll_interval(POLL_INTERVAL);
        let queue = t.queue.clone();
        let dead = dead_letter(t);
        RustStream::new(AppInfo::new("bench-worker", "0.1.0"))
            .with_broker(broker, |b| {
                let run = subscriber(queue.clone(), RunBatch { hook })
                    .map_source(move |_| InboxQueue::<Job>::new(queue))
                    .batch(nonzero!(BATCH_SIZE));
                b.include(run.build())
                    .max_attempts(nonzero!(3u32))
                    .dead_letter(dead);
            })
            .run_until(std::future::pending())
            .await?;
        Ok(())
    }
}

/// The inbox on Postgres.
mod postgres {
    use std::str::FromStr;
    use std::sync::Arc;

    use ruststream::runtime::RunningApp;
    use ruststream_sqlx::RepositoryPublisher;
    use ruststream_sqlx::prelude::*;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use sqlx::{Connection, PgConnection, Postgres};

    use super::inbox::Job;
    use super::{
        BATCH_SIZE, LISTEN_NOTIFY, PG_POOL, POLL_INTERVAL, PRODUCER_POOL, RunBatch, RunJob,
        dead_letter, workers,
    };
    use crate::common::{Hook, Target};

    /// The producer's live publisher: a publish is an insert into [`Job`]'s table.
    pub(super) type Publisher = RepositoryPublisher<Postgres, Job>;

    /// The table and its claim index, as the crate's production guide has them.
    const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS ruststream_jobs (
        id BIGSERIAL PRIMARY KEY,
        queue TEXT NOT NULL,
        attempt SMALLINT NOT NULL DEFAULT 1,
        locked_until TIMESTAMPTZ,
        payload BYTEA NOT NULL
    );
    CREATE INDEX IF NOT EXISTS ruststream_jobs_claim ON ruststream_jobs (queue, id);";

    /// The target's database.
    fn options(t: &Target) -> anyhow::Result<PgConnectOptions> {
        Ok(PgConnectOptions::from_str(&t.url)?)
    }

    /// A broker on the target's database, listening for notifications where configured.
    fn broker(t: &Target, pool: PgPoolOptions) -> anyhow::Result<SqlxBroker<Postgres>> {
        let broker = SqlxBroker::from_connect_options(options(t)?, pool);
        Ok(if LISTEN_NOTIFY {
            broker.listen_notify()
        } else {
            broker
        })
    }

    /// Creates the table afresh: the database may hold a previous run's table, of an older
    /// schema too.
    pub(super) async fn reset(t: &Target) -> anyhow::Result<()> {
        let mut conn = PgConnection::connect_with(&options(t)?).await?;
        sqlx::raw_sql("DROP TABLE IF EXISTS ruststream_jobs")
            .execute(&mut conn)
            .await?;
        sqlx::raw_sql(SCHEMA).execute(&mut conn).await?;
        conn.close().await?;
        Ok(())
    }

    /// Starts an app with no subscriptions and pairs a `Repository` publisher from it.
    pub(super) async fn publisher(t: &Target) -> anyhow::Result<(Publisher, RunningApp)> {
        // Two connections: a producer publishes one job at a time, and 8 producers at sqlx's
        // default of 10 each (with their LISTEN connections, and 4 worker processes' pools)
        // ran Postgres out of connections.
        let broker = broker(t, PgPoolOptions::new().max_connections(PRODUCER_POOL))?.bindable();
        let jobs = broker.bind(Repository::<Job>::default());
        let app = RustStream::new(AppInfo::new("bench-producer", "0.1.0"))
            .with_broker(broker, |_b| {})
            .start()
            .await?;
        let publisher = app.publisher(jobs).await?;
        Ok((publisher, app))
    }

    /// Serves the queue until the service stops.
    pub(super) async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
        let pool = PgPoolOptions::new().max_connections(PG_POOL);
        let broker = broker(t, pool)?.poll_interval(POLL_INTERVAL);
        let queue = t.queue.clone();
        let dead = dead_letter(t);
        let n = workers(t);
        RustStream::new(AppInfo::new("bench-worker", "0.1.0"))
            .with_broker(broker, |b| {
                let run = subscriber(queue.clone(), RunJob { hook })
                    .map_source(move |_| InboxQueue::<Job>::new(queue))
                    .workers(n);
                b.include(run.build())
                    .max_attempts(nonzero!(3u32))
                    .dead_letter(dead);
            })
            .run_until(std::future::pending())
            .await?;
        Ok(())
    }

    /// Serves the queue with the batch handler until the service stops.
    pub(super) async fn work_batch(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
        let pool = PgPoolOptions::new().max_connections(PG_POOL);
        let broker = broker(t, pool)?.poll_interval(POLL_INTERVAL);
        let queue = t.queue.clone();
        let dead = dead_letter(t);
        RustStream::new(AppInfo::new("bench-worker", "0.1.0"))
            .with_broker(broker, |b| {
                let run = subscriber(queue.clone(), RunBatch { hook })
                    .map_source(move |_| InboxQueue::<Job>::new(queue))
                    .batch(nonzero!(BATCH_SIZE));
                b.include(run.build())
                    .max_attempts(nonzero!(3u32))
                    .dead_letter(dead);
            })
            .run_until(std::future::pending())
            .await?;
        Ok(())
    }
}

/// Redis Streams: `XADD` to publish, `XREADGROUP` through one consumer group to work.
mod redis {
    use std::sync::Arc;

    use ruststream::runtime::RunningApp;
    use ruststream_fred::RedisPublisher;
    use ruststream_fred::stream::prelude::*;

    use super::{BATCH_SIZE, RunBatch, RunJob, dead_letter, workers};
    use crate::common::{Hook, Target};

    /// The producer's live publisher: a publish is an `XADD` to the stream it names.
    pub(super) type Publisher = RedisPublisher;

    /// The consumer group every worker reads through.
    pub(super) const GROUP: &str = "bench";

    /// Starts an app with no subscriptions and pairs a stream publisher from it.
    pub(super) async fn publisher(t: &Target) -> anyhow::Result<(Publisher, RunningApp)> {
        let broker = RedisBroker::standalone(t.url.clone()).bindable();
        let jobs = broker.bind(Publish);
        let app = RustStream::new(AppInfo::new("bench-producer", "0.1.0"))
            .with_broker(broker, |_b| {})
            .start()
            .await?;
        let publisher = app.publisher(jobs).await?;
        Ok((publisher, app))
    }

    /// Serves the stream until the service stops. A group created here reads the stream from
    /// its start, so jobs published before the worker came up are served too. The consumer is
    /// named after the process: the crate's generated names count from zero in each process.
    pub(super) async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
        let stream = RedisStream::new(t.queue.clone())
            .group(GROUP)
            .consumer(format!("bench-{}", std::process::id()))
            .start_id(StreamStart::Beginning);
        let dead = dead_letter(t);
        let n = workers(t);
        RustStream::new(AppInfo::new("bench-worker", "0.1.0"))
            .with_broker(RedisBroker::standalone(t.url.clone()), |b| {
                let run = subscriber(stream, RunJob { hook }).workers(n);
                b.include(run.build())
                    .max_attempts(nonzero!(3u32))
                    .dead_letter(dead);
            })
            .run_until(std::future::pending())
            .await?;
        Ok(())
    }

    /// Serves the stream with the batch handler until the service stops.
    pub(super) async fn work_batch(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
        let stream = RedisStream::new(t.queue.clone())
            .group(GROUP)
            .consumer(format!("bench-{}", std::process::id()))
            .start_id(StreamStart::Beginning);
        let dead = dead_letter(t);
        RustStream::new(AppInfo::new("bench-worker", "0.1.0"))
            .with_broker(RedisBroker::standalone(t.url.clone()), |b| {
                let run = subscriber(stream, RunBatch { hook }).batch(nonzero!(BATCH_SIZE));
                b.include(run.build())
                    .max_attempts(nonzero!(3u32))
                    .dead_letter(dead);
            })
            .run_until(std::future::pending())
            .await?;
        Ok(())
    }
}
