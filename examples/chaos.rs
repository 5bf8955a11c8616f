//! The chaos harness behind `scripts/chaos`: worker processes SIGKILLed while they drain a queue,
//! and the server restarted under them, on Redis, Postgres and SQLite, with the library's
//! default settings (no lease or poll tuning), so the figures are what an application gets.
//!
//! `scripts/chaos` starts the servers and runs this program; by hand:
//!
//! ```text
//! cargo run --example chaos -- run --backend redis --url redis://127.0.0.1:6395/ \
//!     --scenario kill --jobs 20000 --kills 5 --dir /tmp/chaos --rows /tmp/chaos/rows.jsonl
//! cargo run --example chaos -- report /tmp/chaos/rows.jsonl
//! ```
//!
//! - `worker`: one worker process. Its handler appends `S <n>` to the process's own ledger file
//!   (`O_APPEND`, one `write` per line, so a SIGKILL loses no written line), sleeps 1-3 ms, and
//!   appends `E <n>` before it acknowledges.
//! - `run`: one scenario on one backend. It publishes the jobs up front, starts 3 workers, and
//!   either SIGKILLs a random busy one once the drain is under way (a twentieth of the jobs
//!   done), then every 1.5 s (`kill`: each is started again at once), or restarts the server
//!   when 30% of the jobs are done with the command `--restart` (`restart`), and waits until
//!   the queue is drained: the queue holds none of the jobs any more (nothing ready, running
//!   or delayed) and the ledgers hold an `E` for every job (or it is in the dead letter). It
//!   appends one JSON row of figures to `--rows`.
//! - `report`: the Markdown table of the rows, goals marked; with `--check`, exits 1 when a job
//!   was lost or dead-lettered, or the duplicate runs of a kill scenario exceed their bound
//!   (timings are printed, never asserted).
//!
//! What is counted:
//! - lost: jobs without an `E` line once the run ended (drained or timed out);
//! - duplicate runs: for each job, its `S` lines minus one (a handler that started again after
//!   its first run was killed counts);
//! - the bound of a kill scenario: the jobs the killed processes held at their kills, i.e. jobs
//!   a killed process had started (its ledger has their `S`) that the backend still held as
//!   claimed right after the kill (not acknowledged: running, finished but not settled);
//! - time to resume after a restart: from the first answer of the restarted server (the driver
//!   polls `PING` / `SELECT 1` on a new connection every 50 ms) to the first poll that sees the
//!   backend hold fewer jobs than at that answer (a job acknowledged after it; 50 ms resolution).

use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;
use stagedoor_jobs::broker::Broker;
use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs::{Envelope, JobId};
use stagedoor_jobs_redis::RedisBroker;
use stagedoor_jobs_sqlx::SqlxRoute;
use stagedoor_jobs_sqlx::prelude::*;

/// The queue (stream, group) of every scenario.
const QUEUE: &str = "chaos";
/// Worker processes per scenario.
const WORKERS: usize = 3;
/// Time between two kills.
const KILL_EVERY: Duration = Duration::from_millis(1500);
/// How often the driver reads the ledgers and the backend.
const TICK: Duration = Duration::from_millis(50);
/// How far into the drain (fraction of the jobs finished) the server is restarted.
const RESTART_AT: f64 = 0.3;
/// Goals of the issue (printed, and marked met or missed in the table).
const GOAL_KILL_DRAIN: f64 = 5.0;
const GOAL_RESUME: f64 = 1.0;

const SQLITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS chaos_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_after TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
    locked_until TEXT,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chaos_jobs_due ON chaos_jobs (name, retry_after, id);";

const POSTGRES_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS chaos_jobs (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL,
    attempt SMALLINT NOT NULL DEFAULT 1,
    retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
    locked_until TIMESTAMPTZ,
    payload BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS chaos_jobs_due ON chaos_jobs (name, retry_after, id);";

/// One row of `chaos_jobs`; `name` is the group (queue) the row waits in.
#[derive(Inbox)]
#[inbox(table = "chaos_jobs")]
#[allow(dead_code)]
struct ChaosRow {
    #[field(id, generated)]
    id: i64,
    #[field(group)]
    name: String,
    #[field(attempt, generated)]
    attempt: i16,
    #[field(retry_after)]
    retry_after: DateTime<Utc>,
    #[field(locked_until)]
    locked_until: Option<DateTime<Utc>>,
    #[field(payload)]
    payload: Vec<u8>,
}

/// A job: its number, 0..jobs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Work {
    n: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Backend {
    Redis,
    Postgres,
    Sqlite,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// SIGKILL a random worker every 1.5 s.
    Kill,
    /// Restart the server mid-drain (`--restart`).
    Restart,
}

#[derive(Parser)]
#[command(about = "Chaos harness of stagedoor-jobs (run by scripts/chaos)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One worker process (started by `run`).
    Worker {
        #[arg(long, value_enum)]
        backend: Backend,
        #[arg(long)]
        url: String,
        /// Redis namespace.
        #[arg(long, default_value = "")]
        ns: String,
        /// The ledger file this process appends to.
        #[arg(long)]
        ledger: PathBuf,
    },
    /// One scenario on one backend; appends a JSON row to `--rows`.
    Run(RunArgs),
    /// The Markdown table of a rows file.
    Report {
        rows: PathBuf,
        /// Exit 1 when a job was lost or duplicates exceed their bound.
        #[arg(long)]
        check: bool,
    },
}

#[derive(Parser, Clone)]
struct RunArgs {
    #[arg(long, value_enum)]
    backend: Backend,
    #[arg(long)]
    url: String,
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// The row's name for the scenario (`restart (-m fast)`...); default: the scenario's.
    #[arg(long)]
    label: Option<String>,
    #[arg(long, default_value_t = 20_000)]
    jobs: u64,
    /// Kills of the kill scenario (fewer if the queue drains first).
    #[arg(long, default_value_t = 5)]
    kills: u32,
    /// The command that restarts the server (restart scenario), run with `sh -c`.
    #[arg(long)]
    restart: Option<String>,
    /// Where the ledgers and the workers' logs go.
    #[arg(long)]
    dir: PathBuf,
    /// The file the row of figures is appended to.
    #[arg(long)]
    rows: PathBuf,
    /// Give up waiting for the drain after this many seconds.
    #[arg(long, default_value_t = 150)]
    timeout: u64,
}

/// The figures of one scenario.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Row {
    backend: String,
    scenario: String,
    /// `kill` or `restart`.
    kind: String,
    jobs: u64,
    lost: u64,
    drained: bool,
    duplicates: u64,
    /// Kill scenario: jobs the killed processes held at their kills.
    bound: Option<u64>,
    kills: u32,
    /// Seconds from the last kill of a worker that held jobs to drained.
    last_kill_to_drained: Option<f64>,
    /// Seconds from the restart command to the server's first answer.
    outage: Option<f64>,
    /// Seconds from the server's first answer to the first job acknowledged after it.
    resume: Option<f64>,
    /// Seconds from the server's first answer to drained.
    answer_to_drained: Option<f64>,
    /// Seconds from the workers' start to drained (or to the timeout).
    total: f64,
    /// Jobs in the dead letter at the end.
    dead: u64,
    /// Workers that exited without being killed.
    unexpected_exits: u32,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    match Cli::parse().cmd {
        Cmd::Worker {
            backend,
            url,
            ns,
            ledger,
        } => worker(backend, url, ns, ledger).await,
        Cmd::Run(args) => {
            let row = run(args.clone()).await?;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&args.rows)?;
            writeln!(f, "{}", serde_json::to_string(&row)?)?;
            Ok(())
        }
        Cmd::Report { rows, check } => {
            let text = std::fs::read_to_string(&rows)?;
            let rows: Vec<Row> = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(serde_json::from_str)
                .collect::<Result<_, _>>()?;
            let failures = report(&rows);
            if check && !failures.is_empty() {
                for f in &failures {
                    eprintln!("chaos: FAILED: {f}");
                }
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The worker process
// ---------------------------------------------------------------------------------------------

/// The process's ledger: one `write` per line on an `O_APPEND` file.
struct Ledger(std::fs::File);

impl Ledger {
    fn line(&self, tag: char, n: u64) {
        // One write call: the line is in the kernel's hands before the handler goes on.
        if let Err(e) = (&self.0).write_all(format!("{tag} {n}\n").as_bytes()) {
            eprintln!("chaos worker: cannot write the ledger: {e}");
            std::process::exit(3);
        }
    }
}

/// Marks the start, works 1-3 ms, marks the end; then the runtime acknowledges.
async fn work(job: &Work, Data(ledger): Data<Arc<Ledger>>) -> HandlerOutcome {
    ledger.line('S', job.n);
    tokio::time::sleep(Duration::from_millis(1 + job.n % 3)).await;
    ledger.line('E', job.n);
    HandlerOutcome::ack()
}

async fn worker(
    backend: Backend,
    url: String,
    ns: String,
    ledger: PathBuf,
) -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_ansi(false)
        .init();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&ledger)?;
    let app = Service::new(AppInfo::new("chaos", "0.1.0")).state(Arc::new(Ledger(file)));
    // The library's defaults: no lease, poll or concurrency tuning.
    let service = match backend {
        Backend::Redis => {
            let broker = RedisBroker::from_url(&url).namespace(&ns);
            app.with_broker(broker, |b| {
                b.include(Subscriber::new(QUEUE, work));
            })
        }
        Backend::Postgres => {
            let route = SqlxBroker::from_url(url, PgPoolOptions::new()).route::<ChaosRow>(QUEUE);
            app.with_broker(route, |b| {
                b.include(Subscriber::new(QUEUE, work));
            })
        }
        Backend::Sqlite => {
            let route =
                SqlxBroker::from_url(url, SqlitePoolOptions::new()).route::<ChaosRow>(QUEUE);
            app.with_broker(route, |b| {
                b.include(Subscriber::new(QUEUE, work));
            })
        }
    };
    // A worker whose driver died (interrupted) goes too, as if killed.
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_millis(200));
            if std::os::unix::process::parent_id() != parent {
                std::process::exit(1);
            }
        }
    });
    // Until SIGTERM (the driver's end of the scenario) or SIGKILL.
    service.run().await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The driver's view of the backend (raw queries, independent of the library's own stats)
// ---------------------------------------------------------------------------------------------

enum Store {
    Redis {
        url: String,
        broker: RedisBroker,
        conn: Option<redis::aio::MultiplexedConnection>,
    },
    Postgres {
        url: String,
        route: SqlxRoute<sqlx::Postgres, ChaosRow>,
        conn: Option<sqlx::PgConnection>,
    },
    Sqlite {
        route: SqlxRoute<sqlx::Sqlite, ChaosRow>,
        pool: sqlx::SqlitePool,
    },
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// A stream entry as `XRANGE` returns it: its id and its fields.
type StreamEntry = (String, HashMap<String, Vec<u8>>);

/// A connection attempt or a query, bounded (a server that went away may not answer).
async fn bounded<T, E: Into<Box<dyn std::error::Error>>>(
    fut: impl Future<Output = Result<T, E>>,
) -> Res<T> {
    match tokio::time::timeout(Duration::from_millis(1000), fut).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => Err("timed out".into()),
    }
}

impl Store {
    /// Opens the backend, creates the table, empties the queue, prepares it.
    async fn open(backend: Backend, url: &str, ns: &str) -> Res<Self> {
        let store = match backend {
            Backend::Redis => {
                let broker = RedisBroker::from_url(url).namespace(ns);
                broker.connect().await?;
                broker.prepare(QUEUE).await?;
                Store::Redis {
                    url: url.to_owned(),
                    broker,
                    conn: None,
                }
            }
            Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(url).await?;
                sqlx::raw_sql(POSTGRES_SCHEMA).execute(&mut conn).await?;
                sqlx::raw_sql("DELETE FROM chaos_jobs")
                    .execute(&mut conn)
                    .await?;
                conn.close().await?;
                let route =
                    SqlxBroker::from_url(url, PgPoolOptions::new()).route::<ChaosRow>(QUEUE);
                route.connect().await?;
                route.prepare(QUEUE).await?;
                Store::Postgres {
                    url: url.to_owned(),
                    route,
                    conn: None,
                }
            }
            Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(url).await?;
                sqlx::raw_sql(SQLITE_SCHEMA).execute(&mut conn).await?;
                sqlx::raw_sql("DELETE FROM chaos_jobs")
                    .execute(&mut conn)
                    .await?;
                conn.close().await?;
                let route =
                    SqlxBroker::from_url(url, SqlitePoolOptions::new()).route::<ChaosRow>(QUEUE);
                route.connect().await?;
                route.prepare(QUEUE).await?;
                let pool = SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect(url)
                    .await?;
                Store::Sqlite { route, pool }
            }
        };
        Ok(store)
    }

    /// Publishes jobs `0..jobs`, in batches.
    async fn publish(&self, jobs: u64) -> Res<()> {
        let now = Utc::now();
        let mut n = 0;
        while n < jobs {
            let end = (n + 1000).min(jobs);
            let batch: Vec<(Envelope, Option<DateTime<Utc>>)> = (n..end)
                .map(|n| {
                    // On Redis the job id is the number (the driver reads it back from the
                    // pending entries); a generated SQL row id replaces it.
                    let job = Job::new(QUEUE, &Work { n })
                        .expect("a number encodes")
                        .id(JobId::from_string(n.to_string()));
                    let (_, envelope, at) = job.into_parts(now);
                    (envelope, at)
                })
                .collect();
            match self {
                Store::Redis { broker, .. } => broker.publish(QUEUE, batch).await?,
                Store::Postgres { route, .. } => Broker::publish(route, QUEUE, batch).await?,
                Store::Sqlite { route, .. } => Broker::publish(route, QUEUE, batch).await?,
            };
            n = end;
        }
        Ok(())
    }

    async fn redis_conn(
        url: &str,
        slot: &mut Option<redis::aio::MultiplexedConnection>,
    ) -> Res<redis::aio::MultiplexedConnection> {
        if let Some(c) = slot {
            return Ok(c.clone());
        }
        let client = redis::Client::open(url)?;
        let c = bounded(client.get_multiplexed_async_connection()).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn pg_conn<'a>(
        url: &str,
        slot: &'a mut Option<sqlx::PgConnection>,
    ) -> Res<&'a mut sqlx::PgConnection> {
        if slot.is_none() {
            *slot = Some(bounded(sqlx::PgConnection::connect(url)).await?);
        }
        Ok(slot.as_mut().expect("just set"))
    }

    /// Jobs the backend still holds (ready, claimed, delayed) and its dead letters. An error
    /// drops the connection; the next call opens a new one.
    async fn remaining(&mut self) -> Res<(u64, u64)> {
        let r = self.remaining_once().await;
        if r.is_err() {
            match self {
                Store::Redis { conn, .. } => *conn = None,
                Store::Postgres { conn, .. } => *conn = None,
                Store::Sqlite { .. } => {}
            }
        }
        r
    }

    async fn remaining_once(&mut self) -> Res<(u64, u64)> {
        match self {
            Store::Redis { url, broker, conn } => {
                let mut c = Self::redis_conn(url, conn).await?;
                let key = broker.stream_key(QUEUE);
                // Acknowledged entries are deleted: the stream's length counts ready and
                // claimed jobs.
                let (len, delayed, dead): (u64, u64, u64) = bounded(
                    redis::pipe()
                        .cmd("XLEN")
                        .arg(&key)
                        .cmd("ZCARD")
                        .arg(format!("{key}:delayed"))
                        .cmd("XLEN")
                        .arg(format!("{key}:dead"))
                        .query_async(&mut c),
                )
                .await?;
                Ok((len + delayed, dead))
            }
            Store::Postgres { url, conn, .. } => {
                let c = Self::pg_conn(url, conn).await?;
                let (left, dead): (i64, i64) = bounded(
                    sqlx::query_as(
                        "SELECT COUNT(*) FILTER (WHERE name = 'chaos'), COUNT(*) FILTER (WHERE name <> 'chaos') FROM chaos_jobs",
                    )
                    .fetch_one(&mut *c),
                )
                .await?;
                Ok((left as u64, dead as u64))
            }
            Store::Sqlite { pool, .. } => {
                let (left, dead): (i64, i64) = sqlx::query_as(
                    "SELECT COALESCE(SUM(name = 'chaos'), 0), COALESCE(SUM(name <> 'chaos'), 0) FROM chaos_jobs",
                )
                .fetch_one(&*pool)
                .await?;
                Ok((left as u64, dead as u64))
            }
        }
    }

    /// The numbers of the jobs claimed now (leased, not acknowledged).
    async fn claimed(&mut self) -> Res<HashSet<u64>> {
        let mut out = HashSet::new();
        let parse = |payload: &[u8]| serde_json::from_slice::<Work>(payload).ok().map(|w| w.n);
        match self {
            Store::Redis { url, broker, conn } => {
                let mut c = Self::redis_conn(url, conn).await?;
                let key = broker.stream_key(QUEUE);
                let pending: Vec<(String, String, u64, u64)> = redis::cmd("XPENDING")
                    .arg(&key)
                    .arg("stagedoor")
                    .arg("-")
                    .arg("+")
                    .arg(100_000)
                    .query_async(&mut c)
                    .await?;
                // An empty pipeline is an error ("empty command"): nothing pending, nothing held.
                if pending.is_empty() {
                    return Ok(out);
                }
                let mut pipe = redis::pipe();
                for (id, ..) in &pending {
                    pipe.cmd("XRANGE").arg(&key).arg(id).arg(id);
                }
                let entries: Vec<Vec<StreamEntry>> = pipe.query_async(&mut c).await?;
                for e in entries.iter().flatten() {
                    let n =
                        e.1.get("job_id")
                            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
                            .or_else(|| e.1.get("payload").and_then(|p| parse(p)));
                    out.extend(n);
                }
            }
            Store::Postgres { url, conn, .. } => {
                let c = Self::pg_conn(url, conn).await?;
                let rows: Vec<(Vec<u8>,)> = sqlx::query_as(
                    "SELECT payload FROM chaos_jobs WHERE name = 'chaos' AND locked_until IS NOT NULL",
                )
                .fetch_all(&mut *c)
                .await?;
                out.extend(rows.iter().filter_map(|r| parse(&r.0)));
            }
            Store::Sqlite { pool, .. } => {
                let rows: Vec<(Vec<u8>,)> = sqlx::query_as(
                    "SELECT payload FROM chaos_jobs WHERE name = 'chaos' AND locked_until IS NOT NULL",
                )
                .fetch_all(&*pool)
                .await?;
                out.extend(rows.iter().filter_map(|r| parse(&r.0)));
            }
        }
        Ok(out)
    }

    /// Whether the server answers `PING` / `SELECT 1` on a new connection.
    async fn answers(&self) -> bool {
        match self {
            Store::Redis { url, .. } => {
                let ping = async {
                    let client = redis::Client::open(url.as_str())?;
                    let mut c = client.get_multiplexed_async_connection().await?;
                    redis::cmd("PING").query_async::<String>(&mut c).await
                };
                matches!(tokio::time::timeout(Duration::from_millis(250), ping).await, Ok(Ok(p)) if p == "PONG")
            }
            Store::Postgres { url, .. } => {
                let ping = async {
                    let mut c = sqlx::PgConnection::connect(url).await?;
                    let one: (i32,) = sqlx::query_as("SELECT 1").fetch_one(&mut c).await?;
                    let _ = c.close().await;
                    Ok::<_, sqlx::Error>(one.0)
                };
                matches!(
                    tokio::time::timeout(Duration::from_millis(250), ping).await,
                    Ok(Ok(1))
                )
            }
            Store::Sqlite { .. } => true,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The driver
// ---------------------------------------------------------------------------------------------

/// One worker process and what its ledger said so far.
struct Proc {
    slot: usize,
    child: Child,
    ledger: PathBuf,
    offset: u64,
    partial: String,
    started: HashSet<u64>,
    /// When the process was seen to have exited by itself.
    exited: Option<Instant>,
}

/// Every ledger's lines, added up.
#[derive(Default)]
struct Tally {
    starts: HashMap<u64, u32>,
    ended: HashSet<u64>,
}

impl Proc {
    /// Reads the ledger's new complete lines into `tally`.
    fn read(&mut self, tally: &mut Tally) -> std::io::Result<()> {
        let mut f = match std::fs::File::open(&self.ledger) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut buf = String::new();
        let read = f.read_to_string(&mut buf)?;
        self.offset += read as u64;
        self.partial.push_str(&buf);
        let Some(last) = self.partial.rfind('\n') else {
            return Ok(());
        };
        let complete: String = self.partial.drain(..=last).collect();
        for line in complete.lines() {
            let mut parts = line.split(' ');
            let (Some(tag), Some(n)) = (parts.next(), parts.next().and_then(|n| n.parse().ok()))
            else {
                continue;
            };
            match tag {
                "S" => {
                    *tally.starts.entry(n).or_default() += 1;
                    self.started.insert(n);
                }
                "E" => {
                    tally.ended.insert(n);
                }
                _ => {}
            }
        }
        Ok(())
    }
}

struct Driver {
    args: RunArgs,
    ns: String,
    generation: usize,
    procs: Vec<Proc>,
    tally: Tally,
    unexpected_exits: u32,
}

impl Driver {
    fn spawn(&mut self, slot: usize) -> Res<Proc> {
        self.generation += 1;
        let tag = format!("worker{}-{}", slot + 1, self.generation);
        let ledger = self.args.dir.join(format!("{tag}.ledger"));
        let log = std::fs::File::create(self.args.dir.join(format!("{tag}.log")))?;
        let backend = match self.args.backend {
            Backend::Redis => "redis",
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        };
        let child = Command::new(std::env::current_exe()?)
            .args(["worker", "--backend", backend, "--url", &self.args.url])
            .args(["--ns", &self.ns])
            .arg("--ledger")
            .arg(&ledger)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        Ok(Proc {
            slot,
            child,
            ledger,
            offset: 0,
            partial: String::new(),
            started: HashSet::new(),
            exited: None,
        })
    }

    fn read_all(&mut self) -> Res<()> {
        for p in &mut self.procs {
            p.read(&mut self.tally)?;
        }
        Ok(())
    }

    /// Starts again a worker that exited by itself (and counts it).
    fn respawn_exited(&mut self) -> Res<()> {
        for i in 0..self.procs.len() {
            if let Some(exited) = self.procs[i].exited {
                // A second apart, so that a worker that cannot start does not spin.
                if exited.elapsed() >= Duration::from_secs(1) {
                    let fresh = self.spawn(i)?;
                    let mut old = std::mem::replace(&mut self.procs[i], fresh);
                    old.read(&mut self.tally)?;
                }
            } else if let Some(status) = self.procs[i].child.try_wait()? {
                self.unexpected_exits += 1;
                self.procs[i].exited = Some(Instant::now());
                println!(
                    "  worker {} (pid {}) exited by itself: {status} (its log: {}); starting it again in 1 s",
                    self.procs[i].slot + 1,
                    self.procs[i].child.id(),
                    self.procs[i].ledger.with_extension("log").display()
                );
            }
        }
        Ok(())
    }

    /// SIGTERM to every worker, then SIGKILL after 10 s.
    fn stop_all(&mut self) {
        for p in &self.procs {
            let _ = Command::new("kill")
                .args(["-TERM", &p.child.id().to_string()])
                .status();
        }
        let until = Instant::now() + Duration::from_secs(10);
        for p in &mut self.procs {
            while Instant::now() < until {
                if !matches!(p.child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 100.0).round() / 100.0
}

/// A small deterministic generator (the victims of the kills).
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

async fn run(args: RunArgs) -> Res<Row> {
    std::fs::create_dir_all(&args.dir)?;
    let label = args.label.clone().unwrap_or_else(|| match args.scenario {
        Scenario::Kill => "kill -9 loop".to_owned(),
        Scenario::Restart => "server restart".to_owned(),
    });
    let backend_name = format!("{:?}", args.backend);
    println!(
        "chaos: {backend_name}, {label}: {} jobs, {WORKERS} workers, default settings",
        args.jobs
    );
    let ns = format!(
        "chaos{}-{}:",
        std::process::id(),
        Utc::now().timestamp_millis()
    );
    let mut store = Store::open(args.backend, &args.url, &ns).await?;
    let published = Instant::now();
    store.publish(args.jobs).await?;
    println!(
        "  published {} jobs in {:.2}s",
        args.jobs,
        published.elapsed().as_secs_f64()
    );

    let mut d = Driver {
        args: args.clone(),
        ns,
        generation: 0,
        procs: Vec::new(),
        tally: Tally::default(),
        unexpected_exits: 0,
    };
    for slot in 0..WORKERS {
        let p = d.spawn(slot)?;
        d.procs.push(p);
    }
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(args.timeout);
    let mut row = Row {
        backend: backend_name.clone(),
        scenario: label.clone(),
        kind: match args.scenario {
            Scenario::Kill => "kill",
            Scenario::Restart => "restart",
        }
        .to_owned(),
        jobs: args.jobs,
        ..Row::default()
    };

    // Kill scenario.
    let mut rng = (std::process::id() as u64) << 32 | 0x9e37_79b9;
    let mut next_kill = t0 + KILL_EVERY;
    let mut last_kill: Option<Instant> = None;
    let mut bound = 0u64;
    // Restart scenario.
    let mut restart: Option<(Instant, Child)> = None;
    let mut restart_done = false;
    let mut seen_down = false;
    let mut answered: Option<Instant> = None;
    let mut at_answer: Option<u64> = None;
    let mut resumed: Option<Instant> = None;

    let mut drained_at = None;
    let mut dead = 0;
    loop {
        tokio::time::sleep(TICK).await;
        d.read_all()?;
        let now = Instant::now();
        match args.scenario {
            Scenario::Kill => {
                // The first kill once the drain is under way (a twentieth of the jobs done, or
                // 1.5 s), then one every 1.5 s.
                if row.kills == 0 && d.tally.ended.len() as u64 * 20 >= args.jobs {
                    next_kill = next_kill.min(now);
                }
                if row.kills < args.kills && now >= next_kill {
                    // A random worker among those that have run a job (a worker still
                    // starting holds nothing: killing it would test nothing).
                    let busy: Vec<usize> = (0..WORKERS)
                        .filter(|&i| d.procs[i].exited.is_none() && !d.procs[i].started.is_empty())
                        .collect();
                    let pick = next_random(&mut rng) as usize;
                    let victim = if busy.is_empty() {
                        pick % WORKERS
                    } else {
                        busy[pick % busy.len()]
                    };
                    let p = &mut d.procs[victim];
                    let pid = p.child.id();
                    p.child.kill()?;
                    let killed_at = Instant::now();
                    p.child.wait()?;
                    p.read(&mut d.tally)?;
                    let claimed = store.claimed().await?;
                    let held = p.started.intersection(&claimed).count() as u64;
                    bound += held;
                    row.kills += 1;
                    // Recovery is timed from the last kill that took jobs down with it: a
                    // worker killed holding nothing leaves nothing to recover.
                    if held > 0 {
                        last_kill = Some(killed_at);
                    }
                    next_kill = killed_at + KILL_EVERY;
                    println!(
                        "  {:>5.2}s kill {}: SIGKILL worker {} (pid {pid}), which held {held} started, unacknowledged jobs; {} of {} done",
                        secs(killed_at - t0),
                        row.kills,
                        victim + 1,
                        d.tally.ended.len(),
                        args.jobs
                    );
                    let fresh = d.spawn(victim)?;
                    d.procs[victim] = fresh;
                    // (the killed process's ledger is fully counted: its lines stay in tally)
                }
            }
            Scenario::Restart => {
                if restart.is_none()
                    && !restart_done
                    && d.tally.ended.len() as f64 >= RESTART_AT * args.jobs as f64
                {
                    let cmd = args.restart.as_deref().ok_or("--restart is required")?;
                    println!(
                        "  {:>5.2}s restarting the server ({} of {} done): {cmd}",
                        secs(now - t0),
                        d.tally.ended.len(),
                        args.jobs
                    );
                    let child = Command::new("sh")
                        .args(["-c", cmd])
                        .stdin(Stdio::null())
                        .spawn()?;
                    restart = Some((Instant::now(), child));
                }
                if let Some((started, child)) = &mut restart
                    && answered.is_none()
                {
                    let exited = child.try_wait()?;
                    if let Some(status) = exited {
                        if !status.success() {
                            return Err(format!("the restart command failed: {status}").into());
                        }
                        restart_done = true;
                    }
                    let up = store.answers().await;
                    seen_down |= !up;
                    if up && (seen_down || restart_done) {
                        let at = Instant::now();
                        answered = Some(at);
                        row.outage = Some(secs(at - *started));
                        println!(
                            "  {:>5.2}s the server answers again ({:.2}s after the restart began)",
                            secs(at - t0),
                            secs(at - *started)
                        );
                    }
                }
                if let Some((_, child)) = &mut restart
                    && answered.is_some()
                    && !restart_done
                    && let Some(status) = child.try_wait()?
                {
                    if !status.success() {
                        return Err(format!("the restart command failed: {status}").into());
                    }
                    restart_done = true;
                }
                if let Some(a) = answered
                    && resumed.is_none()
                    && let Ok((left, _)) = store.remaining().await
                {
                    match at_answer {
                        None => at_answer = Some(left),
                        Some(before) if left < before => {
                            let at = Instant::now();
                            resumed = Some(at);
                            row.resume = Some(secs(at - a));
                            println!(
                                "  {:>5.2}s first job acknowledged after the restart ({:.2}s after the server answered)",
                                secs(at - t0),
                                secs(at - a)
                            );
                        }
                        Some(_) => {}
                    }
                }
            }
        }
        d.respawn_exited()?;

        // Drained: every job ran to its end (or sits in the dead letter) and the backend holds
        // none in the queue. (A restart scenario also waits for its restart.)
        let restarted = args.scenario == Scenario::Kill || answered.is_some();
        if restarted
            && d.tally.ended.len() as u64 + dead >= args.jobs
            && let Ok((left, dl)) = store.remaining().await
        {
            dead = dl;
            if left == 0 && d.tally.ended.len() as u64 + dead >= args.jobs {
                drained_at = Some(Instant::now());
                break;
            }
        }
        if now >= deadline {
            println!(
                "  gave up after {}s: {} of {} jobs done",
                args.timeout,
                d.tally.ended.len(),
                args.jobs
            );
            if let Ok((_, dl)) = store.remaining().await {
                dead = dl;
            }
            break;
        }
    }
    let end = drained_at.unwrap_or_else(Instant::now);
    d.stop_all();
    d.read_all()?;

    row.drained = drained_at.is_some();
    row.lost = args.jobs - d.tally.ended.len() as u64;
    row.duplicates = d
        .tally
        .starts
        .values()
        .map(|&s| u64::from(s.saturating_sub(1)))
        .sum();
    row.dead = dead;
    row.total = secs(end - t0);
    row.unexpected_exits = d.unexpected_exits;
    match args.scenario {
        Scenario::Kill => {
            row.bound = Some(bound);
            row.last_kill_to_drained = last_kill.filter(|_| row.drained).map(|k| secs(end - k));
        }
        Scenario::Restart => {
            row.answer_to_drained = answered.filter(|_| row.drained).map(|a| secs(end - a));
        }
    }
    println!(
        "  {}: lost {}, duplicate runs {}{}, dead letters {}, total {:.2}s{}",
        if row.drained {
            "drained"
        } else {
            "NOT drained"
        },
        row.lost,
        row.duplicates,
        row.bound
            .map(|b| format!(" (bound: {b} jobs held by the killed workers)"))
            .unwrap_or_default(),
        row.dead,
        row.total,
        match (row.last_kill_to_drained, row.answer_to_drained) {
            (Some(k), _) => format!(", last kill holding jobs to drained {k:.2}s"),
            (_, Some(a)) => format!(", server answer to drained {a:.2}s"),
            _ => String::new(),
        }
    );
    print_log_summary(&args.dir)?;
    Ok(row)
}

/// The workers' warnings and errors of the scenario, by message (numbers masked), most
/// frequent first: the evidence of what the library did.
fn print_log_summary(dir: &Path) -> Res<()> {
    let mut counts: HashMap<String, u32> = HashMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("log") {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            let Some(i) = line.find(" WARN ").or_else(|| line.find(" ERROR ")) else {
                continue;
            };
            let msg: String = line[i + 1..]
                .chars()
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .collect();
            let msg: String = msg.chars().take(220).collect();
            *counts.entry(msg).or_default() += 1;
        }
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    if !counts.is_empty() {
        println!("  workers' warnings and errors (count, message with digits masked):");
        for (msg, n) in counts.iter().take(8) {
            println!("    {n:>6} {msg}");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

/// A goal's cell: the value and "met" or "missed".
fn mark(value: String, met: bool) -> String {
    format!("{value} {}", if met { "✅" } else { "❌" })
}

fn opt_secs(v: Option<f64>) -> String {
    v.map_or("–".to_owned(), |s| format!("{s:.2} s"))
}

/// Prints the Markdown table; returns what `--check` fails on.
fn report(rows: &[Row]) -> Vec<String> {
    let mut failures = Vec::new();
    println!(
        "| Backend | Scenario | Jobs | Lost (goal 0) | Duplicate runs (bound) | Last kill → drained (goal < {GOAL_KILL_DRAIN:.0} s) | Outage | Resume (goal < {GOAL_RESUME:.0} s) | Answer → drained | Total |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let lost = mark(r.lost.to_string(), r.lost == 0 && r.drained);
        let dups = match (r.kind.as_str(), r.bound) {
            ("kill", Some(b)) => mark(format!("{} (≤ {b})", r.duplicates), r.duplicates <= b),
            _ => mark(format!("{} (goal 0)", r.duplicates), r.duplicates == 0),
        };
        let kill_drain = if r.kind == "kill" {
            match r.last_kill_to_drained {
                Some(s) => mark(format!("{s:.2} s"), s < GOAL_KILL_DRAIN),
                None if !r.drained => mark("not drained".to_owned(), false),
                None => "no kill".to_owned(),
            }
        } else {
            "–".to_owned()
        };
        let resume = if r.kind == "restart" {
            match r.resume {
                Some(s) => mark(format!("{s:.2} s"), s < GOAL_RESUME),
                None => mark("never".to_owned(), false),
            }
        } else {
            "–".to_owned()
        };
        let mut total = format!("{:.2} s", r.total);
        if !r.drained {
            total.push_str(" (timed out)");
        }
        println!(
            "| {} | {} | {} | {lost} | {dups} | {kill_drain} | {} | {resume} | {} | {total} |",
            r.backend,
            r.scenario,
            r.jobs,
            opt_secs(r.outage),
            opt_secs(r.answer_to_drained),
        );
        let name = format!("{} {}", r.backend, r.scenario);
        if r.lost > 0 || !r.drained {
            failures.push(format!(
                "{name}: {} job(s) lost{}",
                r.lost,
                if r.drained { "" } else { " (not drained)" }
            ));
        }
        if let Some(b) = r.bound
            && r.duplicates > b
        {
            failures.push(format!(
                "{name}: {} duplicate runs, more than the {b} jobs the killed workers held",
                r.duplicates
            ));
        }
        if r.dead > 0 {
            failures.push(format!("{name}: {} job(s) in the dead letter", r.dead));
        }
    }
    println!();
    println!(
        "Lost: jobs never run to their end. Duplicate runs: handler starts beyond a job's first; \
         a kill loop's bound is the jobs the killed workers held (started, and still claimed in \
         the backend right after the kill). Last kill → drained: from the last kill of a worker \
         that held jobs. Outage: restart command to the server's first answer \
         (PING / SELECT 1 every 50 ms); resume: that answer to the first job acknowledged after \
         it. Total: from the workers' start to drained."
    );
    failures
}
