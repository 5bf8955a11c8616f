//! The scenarios: what each measures, with which sizes, and how.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::child::{Report, Workers};
use crate::common::{Backend, BenchJob, Target, now_ns};
use crate::systems::System;
use crate::systems::probe::Probe;

/// Sizes of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Sizes {
    /// Jobs enqueued one call each.
    pub enqueue_one: u64,
    /// Jobs enqueued in bulk calls.
    pub enqueue_bulk: u64,
    /// Jobs per bulk call.
    pub bulk_batch: usize,
    /// Backlog drained by 1 and by 4 worker processes.
    pub drain: u64,
    /// Backlog of the failure path (each job fails once).
    pub failure: u64,
    /// Jobs per second of the latency scenario.
    pub latency_rate: u64,
    /// Jobs of the latency scenario.
    pub latency_jobs: u64,
    /// Length of one step of the steady-state search.
    pub steady_step: Duration,
    /// Steps of the steady-state search.
    pub steady_steps: usize,
    /// Backlog of the memory scenario.
    pub memory: u64,
    /// Offered rate of the pinned-xmin scenario (jobs/s).
    pub xmin_rate: u64,
    /// How long the pinned-xmin scenario holds its snapshot and produces.
    pub xmin_hold: Duration,
    /// Handlers of the pinned-xmin scenario's worker process.
    pub xmin_handlers: usize,
    /// How long the pinned-xmin scenario runs at its offered rate before it pins xmin, so that
    /// the table is in the state production is in (rows come and go, autovacuum has run).
    pub xmin_history: Duration,
    /// Busy loops at `nice 10` beside the pinned-xmin scenario (a CPU neighbour, as database
    /// hosts have); 0 for none.
    pub xmin_neighbours: usize,
    /// The most any one measurement may take (a system that has not finished by then is
    /// reported with what it did, marked capped).
    pub cap: Duration,
}

impl Sizes {
    /// The quick mode: the whole run (all but pinned-xmin) in about 15-18 minutes on 2 cores.
    pub fn quick() -> Self {
        Sizes {
            enqueue_one: 1_000,
            enqueue_bulk: 20_000,
            bulk_batch: 1_000,
            drain: 20_000,
            failure: 5_000,
            latency_rate: 100,
            latency_jobs: 150,
            steady_step: Duration::from_millis(500),
            steady_steps: 5,
            memory: 40_000,
            xmin_rate: 800,
            xmin_hold: Duration::from_secs(60),
            xmin_handlers: 32,
            xmin_history: Duration::from_secs(60),
            xmin_neighbours: 0,
            cap: Duration::from_secs(6),
        }
    }

    /// The full mode.
    pub fn full() -> Self {
        Sizes {
            enqueue_one: 5_000,
            enqueue_bulk: 100_000,
            bulk_batch: 1_000,
            drain: 100_000,
            failure: 20_000,
            latency_rate: 200,
            latency_jobs: 2_000,
            steady_step: Duration::from_secs(3),
            steady_steps: 8,
            memory: 1_000_000,
            xmin_rate: 800,
            xmin_hold: Duration::from_secs(60),
            xmin_handlers: 32,
            xmin_history: Duration::from_secs(60),
            xmin_neighbours: 0,
            cap: Duration::from_secs(60),
        }
    }
}

/// A scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
pub enum Scenario {
    /// Enqueue one job per call.
    EnqueueOne,
    /// Enqueue in bulk calls.
    EnqueueBulk,
    /// Drain a backlog with one worker process.
    Drain1,
    /// Drain a backlog with four worker processes.
    Drain4,
    /// Producer and consumer together at the highest rate that keeps the backlog flat.
    Steady,
    /// Publish-to-handler-start latency at a modest fixed rate.
    Latency,
    /// Every job fails once and succeeds on its retry.
    Failure,
    /// Peak memory of a worker draining a big backlog.
    Memory,
    /// A steady rate while a Postgres session idle in transaction pins xmin (Postgres only).
    PinnedXmin,
    /// Drain a backlog with four worker processes, the queue held to
    /// `global_concurrency(64)` (stagedoor-jobs only).
    Limited,
}

impl Scenario {
    /// Every scenario, in report order.
    pub const ALL: [Scenario; 10] = [
        Scenario::EnqueueOne,
        Scenario::EnqueueBulk,
        Scenario::Drain1,
        Scenario::Drain4,
        Scenario::Steady,
        Scenario::Latency,
        Scenario::Failure,
        Scenario::Memory,
        Scenario::PinnedXmin,
        Scenario::Limited,
    ];

    /// The scenarios of a run that names none: all but the pinned-xmin one (about 65 s per
    /// Postgres system and repeat).
    pub const DEFAULT: [Scenario; 9] = [
        Scenario::EnqueueOne,
        Scenario::EnqueueBulk,
        Scenario::Drain1,
        Scenario::Drain4,
        Scenario::Steady,
        Scenario::Latency,
        Scenario::Failure,
        Scenario::Memory,
        Scenario::Limited,
    ];

    /// Whether the scenario measures `system`: the enqueue scenarios leave out "ruststream
    /// batch", whose producer is ruststream's (the row would repeat ruststream's).
    pub fn measures(self, system: System) -> bool {
        if self == Scenario::Limited {
            return system == System::Stagedoor;
        }
        !(system == System::RuststreamBatch
            && matches!(self, Scenario::EnqueueOne | Scenario::EnqueueBulk))
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::EnqueueOne => "enqueue-one",
            Scenario::EnqueueBulk => "enqueue-bulk",
            Scenario::Drain1 => "drain-1",
            Scenario::Drain4 => "drain-4",
            Scenario::Steady => "steady",
            Scenario::Latency => "latency",
            Scenario::Failure => "failure",
            Scenario::Memory => "memory",
            Scenario::PinnedXmin => "pinned-xmin",
            Scenario::Limited => "limited",
        }
    }

    /// What it measures, with the sizes.
    pub fn describe(self, s: &Sizes) -> String {
        match self {
            Scenario::EnqueueOne => format!(
                "enqueue, one call per job ({} jobs, one producer)",
                s.enqueue_one
            ),
            Scenario::EnqueueBulk => format!(
                "enqueue in bulk ({} jobs, {} per call)",
                s.enqueue_bulk, s.bulk_batch
            ),
            Scenario::Drain1 => format!(
                "drain a backlog of {} no-op jobs, 1 worker process; from the first handler \
                 start to the queue verified empty; worker CPU: user + system time of the \
                 worker processes (`/proc/<pid>/stat`) from their first job done to the end, \
                 per job",
                s.drain
            ),
            Scenario::Drain4 => format!(
                "drain a backlog of {} no-op jobs, 4 worker processes; from the first handler \
                 start to the queue verified empty; worker CPU: user + system time of the \
                 worker processes (`/proc/<pid>/stat`) from their first job done to the end, \
                 per job",
                s.drain
            ),
            Scenario::Limited => format!(
                "drain-4 ({} no-op jobs, 4 worker processes of {} handlers) with the queue held \
                 to `.global_concurrency({})` across the processes: the cost of a global limit \
                 (a permit taken before each claim, given back at each settlement; \
                 stagedoor-jobs only, the peers have no such limit)",
                s.drain,
                crate::common::CONCURRENCY,
                crate::common::LIMITED_TO
            ),
            Scenario::Steady => format!(
                "steady state: highest producer rate that keeps the backlog flat, 1 worker \
                 process; every 10 ms what is due, in one bulk call where the system has one, \
                 else over 8 producers at once; {} steps of {:.1} s from 0.6 of the drain-1 rate \
                 (x1.5 until a step is not flat, then bisection)",
                s.steady_steps,
                s.steady_step.as_secs_f64()
            ),
            Scenario::Latency => format!(
                "publish to handler start at {} jobs/s ({} jobs)",
                s.latency_rate, s.latency_jobs
            ),
            Scenario::Failure => format!(
                "failure path: {} jobs, each fails once then succeeds; to the queue verified \
                 empty; worker CPU per job as in drain-1",
                s.failure
            ),
            Scenario::Memory => format!(
                "one worker draining a backlog of {} jobs (jobs/s to the queue verified empty)",
                s.memory
            ),
            Scenario::PinnedXmin => format!(
                "after {} s at the offered rate (the table's history), a session idle in \
                 transaction (REPEATABLE READ, `txid_current()`) pins xmin on the system's \
                 database for {} s while producers offer {} jobs/s to 1 worker process with {} \
                 handlers{}: completions/s and % of what was offered over the window, backlog \
                 (published − completed) at its end and its max, publish to handler start of \
                 the jobs started in the window. Postgres only (the pin is a Postgres snapshot; \
                 Redis and SQLite are not run)",
                s.xmin_history.as_secs_f64(),
                s.xmin_hold.as_secs_f64(),
                s.xmin_rate,
                s.xmin_handlers,
                if s.xmin_neighbours > 0 {
                    format!(", {} busy loops at `nice 10` beside it", s.xmin_neighbours)
                } else {
                    String::new()
                }
            ),
        }
    }

    /// Whether the scenario runs on `b`.
    pub fn runs_on(self, b: Backend) -> bool {
        match self {
            Scenario::PinnedXmin => b == Backend::Postgres,
            _ => true,
        }
    }

    /// The order of the table's metric columns, where it is not alphabetical.
    pub fn metric_order(self) -> &'static [&'static str] {
        match self {
            Scenario::PinnedXmin => &[
                "jobs/s",
                "% offered",
                "backlog",
                "max backlog",
                "p50 ms",
                "p99 ms",
            ],
            _ => &[],
        }
    }
}

/// The workers' CPU per job (user and system, every worker process, every thread), µs, from
/// their first report of a job done to the queue verified empty.
pub const WORKER_CPU: &str = "worker CPU µs/job";

/// One measurement's figures, by metric ("jobs/s", "p50 ms", ...), and a note when it did not
/// finish (capped, failed).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// Metric name to value.
    pub values: BTreeMap<String, f64>,
    /// Capped, failed, producer-bound...
    pub note: Option<String>,
    /// Redis rows of the drain scenarios: the server's command profile of the drain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
}

/// What Redis spent on a drain, per job: from `CONFIG RESETSTAT` (after the backlog is in,
/// before the workers start) to `INFO commandstats` once the queue is verified empty, less the
/// harness's own probe commands.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Profile {
    /// Server CPU (user + system, `INFO cpu`) per job, µs: every command, the network and
    /// protocol work included.
    pub cpu_us: f64,
    /// Per command (`INFO commandstats` name): (calls per job, µs of command time per job).
    /// A script's time (`evalsha`) includes the commands it calls, which are also listed under
    /// their own names.
    pub commands: BTreeMap<String, (f64, f64)>,
}

impl Figures {
    fn one(metric: &str, v: f64) -> Self {
        let mut f = Figures::default();
        f.values.insert(metric.to_owned(), v);
        f
    }
    fn with(mut self, metric: &str, v: f64) -> Self {
        self.values.insert(metric.to_owned(), v);
        self
    }
    fn noted(mut self, note: Option<String>) -> Self {
        self.note = note;
        self
    }
}

/// Where the servers are and where files go.
pub struct Env {
    /// `redis://...`
    pub redis_url: String,
    /// `postgres://...` of a database the bench may create others from.
    pub pg_url: String,
    /// A temp folder for SQLite files and logs.
    pub dir: PathBuf,
    /// The sizes.
    pub sizes: Sizes,
    counter: std::sync::atomic::AtomicU64,
}

impl Env {
    /// An environment.
    pub fn new(redis_url: String, pg_url: String, dir: PathBuf, sizes: Sizes) -> Self {
        Env {
            redis_url,
            pg_url,
            dir,
            sizes,
            counter: Default::default(),
        }
    }

    /// The worker processes' log.
    pub fn log(&self) -> PathBuf {
        self.dir.join("workers.log")
    }

    /// The Postgres URL of `system`'s own database.
    pub fn pg_db_url(&self, system: System) -> String {
        let base = self.pg_url.split('?').next().unwrap_or(&self.pg_url);
        let cut = base.rfind('/').map_or(base.len(), |i| i);
        format!("{}/bench_{}", &base[..cut], system.flag().replace('-', "_"))
    }

    /// Creates each system's Postgres database if missing.
    pub async fn create_databases(&self, systems: &[System]) -> anyhow::Result<()> {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&self.pg_url).await?;
        for s in systems {
            let name = format!("bench_{}", s.flag().replace('-', "_"));
            let exists: Option<i32> =
                sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
                    .bind(&name)
                    .fetch_optional(&mut c)
                    .await?;
            if exists.is_none() {
                let made = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut c)
                    .await;
                // Made meanwhile by another run (42P04, or the catalog's unique index when
                // both creations overlapped): it exists, which is all this asks.
                if let Err(e) = made {
                    let code = e
                        .as_database_error()
                        .and_then(|d| d.code())
                        .unwrap_or_default();
                    if code != "42P04" && code != "23505" {
                        return Err(e.into());
                    }
                }
            }
        }
        Ok(())
    }

    /// A clean target for one measurement: Redis flushed, a fresh SQLite file, the system's
    /// own Postgres database; then the system's reset.
    pub async fn target(&self, system: System, backend: Backend) -> anyhow::Result<Target> {
        let n = self
            .counter
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let url = match backend {
            Backend::Redis => {
                let mut c = redis::Client::open(self.redis_url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                let () = redis::cmd("FLUSHALL").query_async(&mut c).await?;
                self.redis_url.clone()
            }
            Backend::Postgres => self.pg_db_url(system),
            Backend::Sqlite => {
                for f in std::fs::read_dir(&self.dir)?.flatten() {
                    if f.file_name().to_string_lossy().contains(".db") {
                        let _ = std::fs::remove_file(f.path());
                    }
                }
                format!(
                    "sqlite://{}?mode=rwc",
                    self.dir.join(format!("{}-{n}.db", system.flag())).display()
                )
            }
        };
        let t = Target {
            backend,
            url,
            queue: "bench".to_owned(),
            concurrency: crate::common::CONCURRENCY,
            global_concurrency: None,
        };
        system.reset(&t).await?;
        Ok(t)
    }
}

fn jobs(from: u64, n: u64) -> Vec<BenchJob> {
    (from..from + n).map(|i| BenchJob { i, ts: 0 }).collect()
}

/// Enqueues `n` jobs as fast as the system allows (bulk calls, or 8 producers calling one at a
/// time), stopping at `deadline`; returns how many went in.
async fn fill(
    system: System,
    t: &Target,
    n: u64,
    batch: usize,
    deadline: Instant,
) -> anyhow::Result<u64> {
    if system.has_bulk(t.backend) {
        let mut p = system.producer(t).await?;
        let mut sent = 0;
        while sent < n && Instant::now() < deadline {
            let k = (n - sent).min(batch as u64);
            p.bulk(&jobs(sent, k)).await?;
            sent += k;
        }
        return Ok(sent);
    }
    let sent = std::sync::atomic::AtomicU64::new(0);
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        producers.push(system.producer(t).await?);
    }
    let sent_ref = &sent;
    futures::future::try_join_all(producers.into_iter().map(|mut p| async move {
        loop {
            let i = sent_ref.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= n || Instant::now() >= deadline {
                sent_ref.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                return anyhow::Ok(());
            }
            p.one(BenchJob { i, ts: 0 }).await?;
        }
    }))
    .await?;
    Ok(sent.load(std::sync::atomic::Ordering::Relaxed).min(n))
}

/// Waits until the workers have completed `n` jobs, one stopped with an error, or `deadline`.
async fn wait_done(w: &Workers, n: u64, deadline: Instant) -> Report {
    loop {
        let r = w.total();
        if r.done >= n || r.error.is_some() || Instant::now() >= deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How often the harness looks at the backend at the end of a drain.
const PROBE_EVERY: Duration = Duration::from_millis(2);

/// Jobs per second from a report: `n` over the time from the first handler start to
/// `empty_at`, when the harness found the queue empty with every job reported done; a run that
/// did not get there counts what was done up to now.
fn rate(r: &Report, n: u64, empty_at: Option<u64>) -> (f64, Option<String>) {
    if r.first_ns == 0 {
        return (
            0.0,
            Some(r.error.clone().unwrap_or_else(|| "no job ran".to_owned())),
        );
    }
    let (end, done, note) = match empty_at {
        Some(at) if r.done >= n => (at, n, None),
        _ => {
            let why = r
                .error
                .clone()
                .map_or("capped".to_owned(), |e| format!("stopped: {e}"));
            let left = if r.done >= n {
                "; the queue never read empty"
            } else {
                ""
            };
            (
                now_ns(),
                r.done.min(n),
                Some(format!("{why}; {} of {n} done{left}", r.done)),
            )
        }
    };
    let secs = (end.saturating_sub(r.first_ns)) as f64 / 1e9;
    (done as f64 / secs.max(1e-6), note)
}

/// `CONFIG RESETSTAT` on the bench's Redis; returns its CPU seconds so far (user + system).
async fn redis_reset_stats(url: &str) -> anyhow::Result<f64> {
    let mut c = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut c)
        .await?;
    let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut c).await?;
    Ok(redis_cpu(&info))
}

/// `used_cpu_user + used_cpu_sys` of an `INFO cpu` reply.
fn redis_cpu(info: &str) -> f64 {
    info.lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            matches!(k, "used_cpu_user" | "used_cpu_sys").then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

/// The drain's command profile per job: `INFO commandstats` less the probe's own calls (at
/// the command's mean time per call) and the harness's `INFO` / `CONFIG`.
async fn redis_profile(
    url: &str,
    cpu0: f64,
    probe_calls: &BTreeMap<String, u64>,
    jobs: u64,
) -> anyhow::Result<Profile> {
    let mut c = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await?;
    let cpu: String = redis::cmd("INFO").arg("cpu").query_async(&mut c).await?;
    let per = jobs.max(1) as f64;
    let mut commands = BTreeMap::new();
    for line in stats.lines() {
        // cmdstat_xack:calls=200,usec=3000,usec_per_call=15.00,...
        let Some((name, rest)) = line
            .trim()
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if matches!(name, "info" | "config|resetstat" | "config") {
            continue;
        }
        let field = |k: &str| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let (calls, usec) = (field("calls"), field("usec"));
        let mine = probe_calls.get(name).copied().unwrap_or(0) as f64;
        let left = (calls - mine).max(0.0);
        let usec = if calls > 0.0 {
            usec * left / calls
        } else {
            0.0
        };
        if left > 0.0 {
            commands.insert(name.to_owned(), (left / per, usec / per));
        }
    }
    Ok(Profile {
        cpu_us: (redis_cpu(&cpu) - cpu0).max(0.0) * 1e6 / per,
        commands,
    })
}

/// Runs one measurement. `hint` is this system's drain rate on this backend, if measured (the
/// steady-state search starts from half of it).
pub async fn measure(
    env: &Env,
    sc: Scenario,
    system: System,
    backend: Backend,
    hint: Option<f64>,
) -> anyhow::Result<Figures> {
    let s = &env.sizes;
    let t = env.target(system, backend).await?;
    let deadline = || Instant::now() + s.cap;
    match sc {
        Scenario::EnqueueOne => {
            let mut p = system.producer(&t).await?;
            let (start, end) = (Instant::now(), deadline());
            let mut sent = 0;
            while sent < s.enqueue_one && Instant::now() < end {
                p.one(BenchJob { i: sent, ts: 0 }).await?;
                sent += 1;
            }
            let note =
                (sent < s.enqueue_one).then(|| format!("capped; {sent} of {}", s.enqueue_one));
            Ok(Figures::one("jobs/s", sent as f64 / start.elapsed().as_secs_f64()).noted(note))
        }
        Scenario::EnqueueBulk => {
            if !system.has_bulk(t.backend) {
                return Ok(Figures::default().noted(Some("no bulk enqueue".to_owned())));
            }
            let start = Instant::now();
            let sent = fill(system, &t, s.enqueue_bulk, s.bulk_batch, deadline()).await?;
            let note =
                (sent < s.enqueue_bulk).then(|| format!("capped; {sent} of {}", s.enqueue_bulk));
            Ok(Figures::one("jobs/s", sent as f64 / start.elapsed().as_secs_f64()).noted(note))
        }
        Scenario::Drain1
        | Scenario::Drain4
        | Scenario::Failure
        | Scenario::Memory
        | Scenario::Limited => {
            let t = Target {
                global_concurrency: (sc == Scenario::Limited).then_some(crate::common::LIMITED_TO),
                ..t.clone()
            };
            let (n, procs, fail) = match sc {
                Scenario::Drain1 => (s.drain, 1, false),
                Scenario::Drain4 | Scenario::Limited => (s.drain, 4, false),
                Scenario::Failure => (s.failure, 1, true),
                _ => (s.memory, 1, false),
            };
            let filled = fill(system, &t, n, s.bulk_batch, Instant::now() + s.cap * 6).await?;
            let mut probe = Probe::connect(&t, system.remaining(&t)).await?;
            let profiled =
                t.backend == Backend::Redis && matches!(sc, Scenario::Drain1 | Scenario::Drain4);
            let cpu0 = if profiled {
                Some(redis_reset_stats(&env.redis_url).await?)
            } else {
                None
            };
            let w = Workers::spawn(system, &t, procs, fail, &env.log())?;
            let end = deadline();
            let mut samples: Vec<(u64, u64)> = Vec::new();
            let sample_every = Duration::from_millis(if sc == Scenario::Memory { 100 } else { 10 });
            // The workers' CPU from their first report of a job done (start-up left out).
            let mut cpu_from: Option<(f64, u64)> = None;
            // Until the workers report most of the jobs done: their reports (every 20 ms).
            let mut r = loop {
                let r = w.total();
                if cpu_from.is_none() && r.done > 0 {
                    cpu_from = Some((w.cpu_seconds(), r.done));
                }
                if sc == Scenario::Memory {
                    let rss = w.memory().first().map_or(0, |m| m.0);
                    samples.push((r.done, rss));
                }
                if r.done * 10 >= filled * 8 || r.error.is_some() || Instant::now() >= end {
                    break r;
                }
                tokio::time::sleep(sample_every).await;
            };
            // Then the backend, every PROBE_EVERY: the end is the first look that finds the
            // queue empty (nothing ready, in flight or delayed), once every job is reported done.
            let mut empty_at: Option<u64> = None;
            while r.error.is_none() && Instant::now() < end {
                if empty_at.is_none() && probe.remaining().await? == 0 {
                    empty_at = Some(now_ns());
                }
                r = w.total();
                if empty_at.is_some() && r.done >= filled {
                    break;
                }
                if sc == Scenario::Memory {
                    samples.push((r.done, w.memory().first().map_or(0, |m| m.0)));
                }
                tokio::time::sleep(PROBE_EVERY).await;
            }
            let cpu_to = (w.cpu_seconds(), r.done);
            let (jobs_s, mut note) = rate(&r, filled, empty_at);
            if filled < n {
                note = Some(format!(
                    "{}backlog capped at {filled} of {n}",
                    note.map_or(String::new(), |n| n + "; ")
                ));
            }
            if r.done == 0 {
                // Nothing ran: a failure, not a figure.
                w.stop().await;
                return Ok(Figures::default().noted(note));
            }
            let profile = match cpu0 {
                Some(cpu0) if empty_at.is_some() => {
                    Some(redis_profile(&env.redis_url, cpu0, &probe.calls, filled).await?)
                }
                _ => None,
            };
            let mut f = Figures::one("jobs/s", jobs_s);
            if let Some((cpu0, done0)) = cpu_from
                && cpu_to.1 > done0
                && empty_at.is_some()
            {
                f = f.with(
                    WORKER_CPU,
                    (cpu_to.0 - cpu0) * 1e6 / (cpu_to.1 - done0) as f64,
                );
            }
            if sc == Scenario::Memory {
                let peak = w.memory().first().map_or(0, |m| m.1);
                // Growth: resident memory at the end against a quarter of the way through.
                let quarter = samples
                    .iter()
                    .find(|(d, _)| *d >= r.done / 4)
                    .map_or(0, |s| s.1);
                let last = samples.last().map_or(0, |s| s.1);
                f = Figures::one("peak MiB", peak as f64 / 1024.0)
                    .with("growth MiB", (last as f64 - quarter as f64) / 1024.0)
                    .with("jobs/s", jobs_s);
            }
            w.stop().await;
            f.profile = profile;
            Ok(f.noted(note))
        }
        Scenario::Steady => steady(env, system, &t, hint).await,
        Scenario::PinnedXmin => pinned_xmin(env, system, &t).await,
        Scenario::Latency => {
            let w = Workers::spawn(system, &t, 1, false, &env.log())?;
            let mut p = system.producer(&t).await?;
            if let Some(f) = warm_up(&w, &mut p, s.cap).await {
                w.stop().await;
                return Ok(f);
            }
            let gap = Duration::from_secs_f64(1.0 / s.latency_rate as f64);
            let start = tokio::time::Instant::now();
            for k in 0..s.latency_jobs {
                tokio::time::sleep_until(start + gap * k as u32).await;
                p.one(BenchJob {
                    i: k + 1,
                    ts: now_ns(),
                })
                .await?;
            }
            let r = wait_done(&w, s.latency_jobs + 1, deadline()).await;
            w.stop().await;
            let mut l = r.latencies.clone();
            if l.is_empty() {
                return Ok(Figures::default()
                    .noted(Some(r.error.unwrap_or_else(|| "no job ran".to_owned()))));
            }
            l.sort_unstable();
            let q = |p: f64| l[((l.len() as f64 * p) as usize).min(l.len() - 1)] as f64 / 1e6;
            let note = (r.done < s.latency_jobs + 1)
                .then(|| format!("{} of {} done", r.done, s.latency_jobs + 1));
            Ok(Figures::one("p50 ms", q(0.5))
                .with("p99 ms", q(0.99))
                .noted(note))
        }
    }
}

/// Publishes one job and waits for it: the worker is up. `Some` when it never ran.
async fn warm_up(w: &Workers, p: &mut crate::systems::Producer, cap: Duration) -> Option<Figures> {
    if let Err(e) = p.one(BenchJob { i: 0, ts: 0 }).await {
        return Some(Figures::default().noted(Some(format!("enqueue failed: {e:#}"))));
    }
    let r = wait_done(w, 1, Instant::now() + cap).await;
    (r.done < 1).then(|| {
        Figures::default().noted(Some(
            r.error
                .unwrap_or_else(|| "the warm-up job never ran".to_owned()),
        ))
    })
}

/// Producers a system without a bulk enqueue gets (fill and steady state alike).
const PRODUCERS: usize = 8;

/// The steady-state search: the producer side offers a fixed rate for a step (every 10 ms what
/// is due: one bulk call where the system has one, else spread over [`PRODUCERS`] producers
/// publishing one job per call at once); a step is flat when, 300 ms after it, less than a
/// quarter second of work is left. Starts at 0.6 of the system's drain rate, grows by half
/// until a step is not flat, then bisects between the best flat rate and the lowest one that
/// was not; after a step that is not flat the backlog gets four steps' time to drain (else the
/// search ends there). Reports the highest flat rate the producers achieved.
async fn steady(
    env: &Env,
    system: System,
    t: &Target,
    hint: Option<f64>,
) -> anyhow::Result<Figures> {
    let s = &env.sizes;
    let bulk = system.has_bulk(t.backend);
    let w = Workers::spawn(system, t, 1, false, &env.log())?;
    let mut producers = Vec::new();
    for _ in 0..if bulk { 1 } else { PRODUCERS } {
        producers.push(system.producer(t).await?);
    }
    if let Some(f) = warm_up(&w, &mut producers[0], s.cap).await {
        w.stop().await;
        return Ok(f);
    }
    let mut published = 1u64;
    let mut rate = hint.map_or(500.0, |h| (h * 0.6).max(50.0));
    let (mut best, mut hi): (Option<f64>, Option<f64>) = (None, None);
    let mut bound = None;
    for _ in 0..s.steady_steps {
        let start = tokio::time::Instant::now();
        let mut sent = 0u64;
        let mut tick = 0u32;
        while start.elapsed() < s.steady_step {
            tick += 1;
            tokio::time::sleep_until(start + Duration::from_millis(10) * tick).await;
            let due = (rate * start.elapsed().as_secs_f64()) as u64;
            if due > sent {
                let batch = jobs(published, due - sent);
                if bulk {
                    for chunk in batch.chunks(s.bulk_batch) {
                        producers[0].bulk(chunk).await?;
                    }
                } else {
                    let per = batch.len().div_ceil(producers.len());
                    futures::future::try_join_all(producers.iter_mut().zip(batch.chunks(per)).map(
                        |(p, chunk)| async move {
                            for j in chunk {
                                p.one(*j).await?;
                            }
                            anyhow::Ok(())
                        },
                    ))
                    .await?;
                }
                published += due - sent;
                sent = due;
            }
        }
        let achieved = sent as f64 / start.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = w.total();
        if let Some(e) = r.error {
            w.stop().await;
            let f = best.map_or_else(Figures::default, |b| Figures::one("jobs/s", b));
            return Ok(f.noted(Some(format!("stopped: {e}"))));
        }
        let backlog = published.saturating_sub(r.done);
        let flat = (backlog as f64) <= rate * 0.25 + 10.0;
        if achieved < rate * 0.9 {
            bound = Some(format!("producers reached {achieved:.0} of {rate:.0}/s"));
        }
        if flat {
            best = Some(best.map_or(achieved, |b: f64| b.max(achieved)));
            rate = match hi {
                None => rate * 1.5,
                Some(h) => (rate + h) / 2.0,
            };
        } else {
            hi = Some(rate);
            rate = (best.unwrap_or(rate / 3.0) + rate) / 2.0;
            // Let the backlog drain before the next step (ends the search when it does not
            // within four steps' time).
            let r = wait_done(&w, published, Instant::now() + s.steady_step * 4).await;
            if r.done < published {
                break;
            }
        }
    }
    w.stop().await;
    let note = match (best, bound) {
        (None, _) => Some("no step was flat".to_owned()),
        (_, b) => b,
    };
    let f = best.map_or_else(Figures::default, |b| Figures::one("jobs/s", b));
    Ok(f.noted(note))
}

/// Producers of the pinned-xmin scenario for a system without bulk enqueue (one call per job).
const XMIN_PRODUCERS: usize = 4;

/// How long the pinned-xmin scenario waits, after the rollback, for the backlog to drain.
const XMIN_DRAIN: Duration = Duration::from_secs(5);

/// Offers `rate` jobs/s for `dur` through `producers` (paced like the steady scenario: every
/// 10 ms what is due, in one bulk call of at most `batch` where the system has one, else one
/// call per job spread over the producers), counting into `published` and numbering from
/// `next`.
async fn offer(
    producers: &mut [crate::systems::Producer],
    has_bulk: bool,
    rate: u64,
    dur: Duration,
    batch: usize,
    (published, next): (&std::sync::atomic::AtomicU64, &std::sync::atomic::AtomicU64),
) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering::Relaxed;
    let per = rate as f64 / producers.len().max(1) as f64;
    let start = tokio::time::Instant::now();
    let end = start + dur;
    futures::future::try_join_all(producers.iter_mut().map(|p| async move {
        let mut sent = 0u64;
        let mut tick = 0u32;
        loop {
            tick += 1;
            let at = start + Duration::from_millis(10) * tick;
            if at > end {
                return anyhow::Ok(());
            }
            tokio::time::sleep_until(at).await;
            let due = (per * start.elapsed().min(dur).as_secs_f64()) as u64;
            if due <= sent {
                continue;
            }
            let k = due - sent;
            let first = next.fetch_add(k, Relaxed);
            if has_bulk {
                let ts = now_ns();
                let jobs: Vec<BenchJob> = (first..first + k).map(|i| BenchJob { i, ts }).collect();
                for chunk in jobs.chunks(batch) {
                    p.bulk(chunk).await?;
                    published.fetch_add(chunk.len() as u64, Relaxed);
                }
            } else {
                for i in first..first + k {
                    p.one(BenchJob { i, ts: now_ns() }).await?;
                    published.fetch_add(1, Relaxed);
                }
            }
            sent = due;
        }
    }))
    .await
    .map(|_| ())
}

/// Busy loops at `nice 10` (a CPU neighbour), stopped when dropped.
struct Neighbours(Vec<std::process::Child>);

impl Neighbours {
    fn start(n: usize) -> Self {
        let mut children = Vec::new();
        for _ in 0..n {
            match std::process::Command::new("nice")
                .args(["-n", "10", "sh", "-c", "while :; do :; done"])
                .stdout(std::process::Stdio::null())
                .spawn()
            {
                Ok(c) => children.push(c),
                Err(e) => eprintln!("cannot start a busy loop beside the scenario: {e}"),
            }
        }
        Self(children)
    }
}

impl Drop for Neighbours {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Postgres, vacuumed; a worker process at `xmin_handlers`; one warm-up job; then a session
/// takes a snapshot and an xid and stays idle in transaction while producers offer `xmin_rate`
/// jobs/s (paced like the steady scenario: every 10 ms what is due, in one bulk call where the
/// system has one, else one call per job spread over [`XMIN_PRODUCERS`]) for `xmin_hold`. The
/// backlog is sampled every 100 ms. Then the session rolls back and the backlog gets
/// [`XMIN_DRAIN`] to drain (a note when it does not).
async fn pinned_xmin(env: &Env, system: System, t: &Target) -> anyhow::Result<Figures> {
    use sqlx::Connection;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let s = &env.sizes;
    if !Scenario::PinnedXmin.runs_on(t.backend) {
        return Ok(Figures::default().noted(Some("Postgres only".to_owned())));
    }
    let t = Target {
        concurrency: s.xmin_handlers,
        ..t.clone()
    };
    // No dead rows left by the measurements before this one.
    let mut admin = sqlx::PgConnection::connect(&t.url).await?;
    sqlx::raw_sql("VACUUM").execute(&mut admin).await?;
    let w = Workers::spawn(system, &t, 1, false, &env.log())?;
    let n_producers = if system.has_bulk(t.backend) {
        1
    } else {
        XMIN_PRODUCERS
    };
    let mut producers = Vec::new();
    for _ in 0..n_producers {
        producers.push(system.producer(&t).await?);
    }
    if let Some(f) = warm_up(&w, &mut producers[0], s.cap).await {
        w.stop().await;
        return Ok(f);
    }

    let published = AtomicU64::new(1);
    let next = AtomicU64::new(1);
    let max_backlog = AtomicU64::new(0);
    let has_bulk = system.has_bulk(t.backend);
    let neighbours = Neighbours::start(s.xmin_neighbours);
    // The table's history: the offered rate for a while before the pin.
    if !s.xmin_history.is_zero() {
        offer(
            &mut producers,
            has_bulk,
            s.xmin_rate,
            s.xmin_history,
            s.bulk_batch,
            (&published, &next),
        )
        .await
        .map_err(|e| e.context("producing the table's history"))?;
    }

    // The pin: an xid and a transaction snapshot, then idle in transaction.
    let mut pin = sqlx::PgConnection::connect(&t.url).await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut pin)
        .await?;
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT txid_current()")
        .execute(&mut pin)
        .await?;
    let pinned = "SELECT backend_xmin IS NOT NULL AND state = 'idle in transaction' \
        FROM pg_stat_activity WHERE pid = $1";
    let held: Option<bool> = sqlx::query_scalar(pinned)
        .bind(pid)
        .fetch_optional(&mut admin)
        .await?;
    anyhow::ensure!(
        held == Some(true),
        "the pinning session (pid {pid}) holds no xmin"
    );

    let before = w.total();
    let (done0, lat0) = (before.done, before.latencies.len());
    let published_at_pin = published.load(Relaxed);
    let start = tokio::time::Instant::now();
    let end = start + s.xmin_hold;
    let produce = offer(
        &mut producers,
        has_bulk,
        s.xmin_rate,
        s.xmin_hold,
        s.bulk_batch,
        (&published, &next),
    );
    let sample = async {
        while tokio::time::Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let backlog = published.load(Relaxed).saturating_sub(w.done());
            max_backlog.fetch_max(backlog, Relaxed);
        }
    };
    let (produced, ()) = futures::future::join(produce, sample).await;
    let produced = produced.map(|_| ());
    let window = start.elapsed().as_secs_f64();
    let r = w.total();
    let published = published.load(Relaxed);

    // Still pinned at the end? Then release it.
    let held: Option<bool> = sqlx::query_scalar(pinned)
        .bind(pid)
        .fetch_optional(&mut admin)
        .await?;
    sqlx::raw_sql("ROLLBACK").execute(&mut pin).await?;
    pin.close().await?;
    admin.close().await?;
    if let Err(e) = produced {
        w.stop().await;
        return Err(e.context("producing while xmin was pinned"));
    }
    let drained = wait_done(&w, published, Instant::now() + XMIN_DRAIN).await;
    w.stop().await;

    let mut notes = Vec::new();
    if let Some(e) = &r.error {
        notes.push(format!("stopped: {e}"));
    }
    if held != Some(true) {
        notes.push("the pin was lost before the end".to_owned());
    }
    drop(neighbours);
    let offered = published.saturating_sub(published_at_pin) as f64;
    if offered < s.xmin_rate as f64 * window * 0.9 {
        notes.push(format!(
            "producer reached {:.0} of {}/s",
            offered / window,
            s.xmin_rate
        ));
    }
    if drained.done < published && drained.error.is_none() {
        notes.push(format!(
            "not drained {} s after the rollback",
            XMIN_DRAIN.as_secs()
        ));
    }
    let completed = r.done.saturating_sub(done0) as f64;
    let backlog = published.saturating_sub(r.done);
    let mut f = Figures::one("jobs/s", completed / window)
        .with("% offered", 100.0 * completed / offered.max(1.0))
        .with("backlog", backlog as f64)
        .with("max backlog", max_backlog.load(Relaxed).max(backlog) as f64);
    let mut l = r.latencies.get(lat0..).unwrap_or_default().to_vec();
    if l.is_empty() {
        notes.push("no job started in the window".to_owned());
    } else {
        l.sort_unstable();
        let q = |p: f64| l[((l.len() as f64 * p) as usize).min(l.len() - 1)] as f64 / 1e6;
        f = f.with("p50 ms", q(0.5)).with("p99 ms", q(0.99));
    }
    Ok(f.noted((!notes.is_empty()).then(|| notes.join("; "))))
}
