//! Global limits across worker processes: five child processes (this binary run again with
//! the `limits_child` filter) serve one queue on one backend, each allowing 8 handlers at
//! once (one in the concurrency case, so that 3 at once means 3 processes at once), and write every handler's start and end to a shared ledger file (appends of one line,
//! atomic between processes). The parent publishes the jobs, waits for the ledger to show
//! every job done, and reads it back:
//!
//! | what | where |
//! |---|---|
//! | `.global_concurrency(3)`: 60 jobs of 40 ms; no point of the ledger has more than 3 handlers between their start and end, 3 is reached (by three processes, each allowing one), more than one process ran jobs, each job ran once (a held-back job spends no attempt) | [`concurrency`] |
//! | a worker killed holding both permits of `.global_concurrency(2)`: a second worker runs every job within a lease or so, never more than 2 at once | [`dead_worker`] |
//! | `.rate_limit(50, 1 s)`: 150 jobs; no window of the ledger's starts holds more than 50 (windows of 900 ms: a start is logged a little after its permit is taken, see [`rate`]); the last start is at least 2 s after the first; each job ran once | [`rate`] |
//!
//! On SQLite (a file the processes share), Postgres, Redis and a Redis Cluster. Servers come
//! from `scripts/test-all`; a missing variable fails the test.

mod common;

#[path = "../examples/hold_expiry.rs"]
#[allow(dead_code)]
mod hold_expiry;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Db as _, Lite, Pg};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{Broker, Publish, RouteBuilder};
use stagedoor_jobs_redis::RedisBroker;

const QUEUE: &str = "limited";
const PROCESSES: usize = 5;
const ENV_CHILD: &str = "STAGEDOOR_LIMITS_CHILD";
const ENV_MODE: &str = "STAGEDOOR_LIMITS_MODE";
const ENV_LEDGER: &str = "STAGEDOOR_LIMITS_LEDGER";
const ENV_NAMESPACE: &str = "STAGEDOOR_LIMITS_NAMESPACE";
/// One run at a time: five busy processes per run are plenty for two cores, and a start
/// logged late under load would blur the rate check.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// The longest the parent waits for every job to be done.
const PATIENCE: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------------------------
// The ledger
// ---------------------------------------------------------------------------------------------

/// The file every process appends to: `start <n> <pid> <µs>` and `end <n> <pid> <µs>`.
struct Ledger {
    file: std::fs::File,
    hold: Duration,
}

impl Ledger {
    fn open(path: &Path, hold: Duration) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open the ledger");
        Self { file, hold }
    }

    fn write(&self, what: &str, n: u64) {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        let line = format!("{what} {n} {} {micros}\n", std::process::id());
        // One write(2) of one short line on a file opened for appending: whole, in order.
        (&self.file)
            .write_all(line.as_bytes())
            .expect("append to the ledger");
    }
}

/// One line of the ledger.
struct Entry {
    start: bool,
    n: u64,
    pid: u32,
    micros: u128,
}

fn read_ledger(path: &Path) -> Vec<Entry> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let start = match f.next()? {
                "start" => true,
                "end" => false,
                _ => return None,
            };
            Some(Entry {
                start,
                n: f.next()?.parse().ok()?,
                pid: f.next()?.parse().ok()?,
                micros: f.next()?.parse().ok()?,
            })
        })
        .collect()
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Work {
    n: u64,
}

/// Logs its start, holds `hold`, logs its end.
async fn work(msg: &Work, Data(ledger): Data<Arc<Ledger>>) -> HandlerOutcome {
    ledger.write("start", msg.n);
    tokio::time::sleep(ledger.hold).await;
    ledger.write("end", msg.n);
    HandlerOutcome::ack()
}

// ---------------------------------------------------------------------------------------------
// The backends
// ---------------------------------------------------------------------------------------------

fn env_url(var: &str) -> String {
    match std::env::var(var) {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "{var} is not set: run the tests with `scripts/test-all`, which starts the servers and exports it"
        ),
    }
}

fn cluster_urls() -> Vec<String> {
    env_url("REDIS_CLUSTER_URLS")
        .split(',')
        .map(str::to_owned)
        .collect()
}

enum Backend {
    Sqlite(Lite),
    Postgres(Pg),
    Redis(String),
    Cluster(String),
}

impl Backend {
    async fn fresh(kind: &str) -> Self {
        let ns = || format!("limits-{}:", common::unique());
        match kind {
            "sqlite" => Backend::Sqlite(Lite::fresh("limits", hold_expiry::SQLITE_JOBS).await),
            "postgres" => Backend::Postgres(Pg::fresh("limits", hold_expiry::POSTGRES_JOBS).await),
            "redis" => Backend::Redis(ns()),
            "cluster" => Backend::Cluster(ns()),
            other => panic!("unknown backend {other}"),
        }
    }

    async fn from_env(kind: &str) -> Self {
        let ns = || std::env::var(ENV_NAMESPACE).expect("the child's namespace");
        match kind {
            "sqlite" => Backend::Sqlite(Lite::from_env().await.expect("the child's SQLite file")),
            "postgres" => Backend::Postgres(Pg::from_env().await.expect("the child's schema")),
            "redis" => Backend::Redis(ns()),
            "cluster" => Backend::Cluster(ns()),
            other => panic!("unknown backend {other}"),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
            Backend::Redis(_) => "redis",
            Backend::Cluster(_) => "cluster",
        }
    }

    fn child_env(&self) -> Vec<(String, String)> {
        let mut env = vec![(ENV_CHILD.to_owned(), self.kind().to_owned())];
        match self {
            Backend::Sqlite(db) => {
                env.extend(db.child_env().into_iter().map(|(k, v)| (k.to_owned(), v)))
            }
            Backend::Postgres(db) => {
                env.extend(db.child_env().into_iter().map(|(k, v)| (k.to_owned(), v)))
            }
            Backend::Redis(ns) | Backend::Cluster(ns) => {
                env.push((ENV_NAMESPACE.to_owned(), ns.clone()))
            }
        }
        env
    }

    /// A service on this backend, `mount` on its broker.
    fn service(&self, service: Service, mode: Mode) -> Service {
        match self {
            Backend::Sqlite(db) => service.with_broker(
                db.broker().route::<hold_expiry::JobRow>(QUEUE),
                mode.mount(),
            ),
            Backend::Postgres(db) => service.with_broker(
                db.broker().route::<hold_expiry::JobRow>(QUEUE),
                mode.mount(),
            ),
            Backend::Redis(ns) => service.with_broker(
                RedisBroker::from_url(env_url("REDIS_URL")).namespace(ns.clone()),
                mode.mount(),
            ),
            Backend::Cluster(ns) => service.with_broker(
                RedisBroker::cluster(cluster_urls()).namespace(ns.clone()),
                mode.mount(),
            ),
        }
    }

    /// Publishes jobs `1..=n` with a broker of the parent's own.
    async fn publish(&self, n: u64) {
        async fn all<B: Publish>(b: B, n: u64) {
            b.connect().await.expect("connect the publisher");
            let jobs: Vec<Job> = (1..=n)
                .map(|i| Job::new(QUEUE, &Work { n: i }).expect("encode"))
                .collect();
            b.publish_jobs(jobs).await.expect("publish the jobs");
        }
        match self {
            Backend::Sqlite(db) => all(db.broker().route::<hold_expiry::JobRow>(QUEUE), n).await,
            Backend::Postgres(db) => all(db.broker().route::<hold_expiry::JobRow>(QUEUE), n).await,
            Backend::Redis(ns) => {
                all(
                    RedisBroker::from_url(env_url("REDIS_URL")).namespace(ns.clone()),
                    n,
                )
                .await
            }
            Backend::Cluster(ns) => {
                all(
                    RedisBroker::cluster(cluster_urls()).namespace(ns.clone()),
                    n,
                )
                .await
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Concurrency,
    Rate,
    /// `global_concurrency(2)`, handlers that hold their job a minute (killed meanwhile).
    Stuck,
    /// `global_concurrency(2)`, quick handlers.
    Quick,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Concurrency => "concurrency",
            Mode::Rate => "rate",
            Mode::Stuck => "stuck",
            Mode::Quick => "quick",
        }
    }

    fn hold(self) -> Duration {
        match self {
            Mode::Concurrency => Duration::from_millis(40),
            Mode::Rate => Duration::from_millis(5),
            Mode::Stuck => Duration::from_secs(60),
            Mode::Quick => Duration::from_millis(10),
        }
    }

    /// Handlers each process allows at once: one in [`Mode::Concurrency`], so that reaching the
    /// limit of 3 takes three processes at once (a process that gives its permits back and
    /// takes them again at once would otherwise run every job alone, which proves nothing about
    /// processes); 8 otherwise.
    fn slots(self) -> usize {
        match self {
            Mode::Concurrency => 1,
            _ => 8,
        }
    }

    fn mount<B: Broker>(self) -> impl FnOnce(&mut RouteBuilder<B>) {
        move |b| {
            let m = b
                .include(Subscriber::new(QUEUE, work).name("work"))
                .concurrency(self.slots());
            match self {
                Mode::Concurrency => {
                    m.global_concurrency(3);
                }
                Mode::Rate => {
                    m.rate_limit(50, Duration::from_secs(1));
                }
                Mode::Stuck | Mode::Quick => {
                    m.global_concurrency(2);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The child workers
// ---------------------------------------------------------------------------------------------

/// A child worker: serves [`QUEUE`] with the limit its parent names until it is killed. A
/// no-op unless a parent set [`ENV_CHILD`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_child() {
    let Ok(kind) = std::env::var(ENV_CHILD) else {
        return;
    };
    let mode = match std::env::var(ENV_MODE).as_deref() {
        Ok("rate") => Mode::Rate,
        Ok("stuck") => Mode::Stuck,
        Ok("quick") => Mode::Quick,
        _ => Mode::Concurrency,
    };
    let ledger = PathBuf::from(std::env::var(ENV_LEDGER).expect("the ledger's path"));
    let backend = Backend::from_env(&kind).await;
    let service = Service::new(AppInfo::new(
        format!("child-{}", std::process::id()),
        "0.1.0",
    ))
    .state(Arc::new(Ledger::open(&ledger, mode.hold())));
    let running = backend
        .service(service, mode)
        .start()
        .await
        .unwrap_or_else(|e| panic!("the child worker starts: {e}"));
    println!("READY");
    // The parent publishes once every child is claiming: else, on a loaded machine, the
    // first child up takes every job before the others start, and the test shows nothing of
    // a limit across processes.
    let mut ready = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ledger.with_extension("ready"))
        .expect("the ready file");
    writeln!(ready, "{}", std::process::id()).expect("write the ready file");
    tokio::time::sleep(PATIENCE * 2).await;
    running.shutdown().await;
}

/// A child worker process; killed when dropped.
struct ChildWorker(Child);

impl ChildWorker {
    fn spawn(backend: &Backend, mode: Mode, ledger: &Path) -> Self {
        let exe = std::env::current_exe().expect("the test binary");
        let child = Command::new(exe)
            .args(["limits_child", "--exact", "--nocapture", "--test-threads=1"])
            .envs(backend.child_env())
            .env(ENV_MODE, mode.name())
            .env(ENV_LEDGER, ledger)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a child worker");
        Self(child)
    }

    /// The child's stderr if it has exited (a worker that failed to start).
    fn failure(&mut self) -> Option<String> {
        let status = self.0.try_wait().ok()??;
        let mut err = String::new();
        if let Some(mut e) = self.0.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        Some(format!("a child worker exited ({status}):\n{err}"))
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `jobs` jobs through five child workers in `mode`; the ledger once every job is done.
async fn run(kind: &str, mode: Mode, jobs: u64) -> Vec<Entry> {
    let _one = SERIAL.lock().await;
    let backend = Backend::fresh(kind).await;
    let dir = std::env::temp_dir().join(format!("stagedoor-limits-{}", common::unique()));
    std::fs::create_dir_all(&dir).expect("the ledger's directory");
    let ledger = dir.join("ledger");
    let mut children: Vec<ChildWorker> = (0..PROCESSES)
        .map(|_| ChildWorker::spawn(&backend, mode, &ledger))
        .collect();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let ready = std::fs::read_to_string(ledger.with_extension("ready")).unwrap_or_default();
        if ready.lines().count() >= PROCESSES {
            break;
        }
        for c in &mut children {
            if let Some(f) = c.failure() {
                panic!("{f}");
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{kind}: the child workers did not all start within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    backend.publish(jobs).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let done = read_ledger(&ledger).iter().filter(|e| !e.start).count() as u64;
        if done >= jobs {
            break;
        }
        for c in &mut children {
            if let Some(f) = c.failure() {
                panic!("{f}");
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{kind}: only {done} of {jobs} jobs done after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A moment for a job run twice (which would be a bug) to show in the ledger.
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(children);
    let entries = read_ledger(&ledger);
    let _ = std::fs::remove_dir_all(&dir);
    let starts: Vec<u64> = entries.iter().filter(|e| e.start).map(|e| e.n).collect();
    let distinct: BTreeSet<u64> = starts.iter().copied().collect();
    assert_eq!(
        distinct,
        (1..=jobs).collect::<BTreeSet<_>>(),
        "{kind}: every job ran"
    );
    assert_eq!(
        starts.len() as u64,
        jobs,
        "{kind}: each job ran once (a job held back by the limit spends no attempt and is not run twice)"
    );
    let pids: BTreeSet<u32> = entries.iter().map(|e| e.pid).collect();
    assert!(
        pids.len() > 1,
        "{kind}: more than one process ran jobs ({pids:?})"
    );
    entries
}

/// `.global_concurrency(3)` on five processes.
async fn concurrency(kind: &str) {
    let entries = run(kind, Mode::Concurrency, 60).await;
    let (mut now, mut max) = (0i64, 0i64);
    for e in &entries {
        now += if e.start { 1 } else { -1 };
        max = max.max(now);
    }
    assert!(
        max <= 3,
        "{kind}: {max} handlers ran at once across the processes, above global_concurrency(3)"
    );
    assert_eq!(
        max, 3,
        "{kind}: with 60 jobs waiting, 3 handlers run at once at some point"
    );
}

/// `.rate_limit(50, 1 s)` on five processes. A start is logged after its permit was taken (by
/// the claim, a few milliseconds earlier at most), so two starts less than a second apart may
/// have permits a little more than a second apart: windows of 900 ms are checked, which a
/// broken limit (hundreds of starts a second here) fails by far.
async fn rate(kind: &str) {
    let entries = run(kind, Mode::Rate, 150).await;
    let mut starts: Vec<u128> = entries
        .iter()
        .filter(|e| e.start)
        .map(|e| e.micros)
        .collect();
    starts.sort_unstable();
    let window = 900_000;
    let mut worst = 0;
    for (i, t) in starts.iter().enumerate() {
        let within = starts[i..].iter().take_while(|u| **u < t + window).count();
        worst = worst.max(within);
    }
    assert!(
        worst <= 50,
        "{kind}: {worst} jobs started within 900 ms across the processes, above rate_limit(50, 1 s)"
    );
    let span = starts.last().copied().unwrap_or(0) - starts.first().copied().unwrap_or(0);
    assert!(
        span >= 1_900_000,
        "{kind}: 150 jobs at 50 per second take at least 2 s from the first start to the last; they took {} ms",
        span / 1000
    );
}

/// A worker killed (SIGKILL) while it holds both permits of `global_concurrency(2)`: its
/// permits run out after its lease (3 s), so a second worker runs every job (the two the dead
/// one held come back after their lease too), never more than 2 at once.
async fn dead_worker(kind: &str) {
    let _one = SERIAL.lock().await;
    let backend = Backend::fresh(kind).await;
    let dir = std::env::temp_dir().join(format!("stagedoor-limits-{}", common::unique()));
    std::fs::create_dir_all(&dir).expect("the ledger's directory");
    let ledger = dir.join("ledger");
    let mut stuck = ChildWorker::spawn(&backend, Mode::Stuck, &ledger);
    backend.publish(6).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while read_ledger(&ledger).iter().filter(|e| e.start).count() < 2 {
        if let Some(f) = stuck.failure() {
            panic!("{f}");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{kind}: the first worker did not start 2 jobs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first: Vec<Entry> = read_ledger(&ledger);
    assert_eq!(
        first.iter().filter(|e| e.start).count(),
        2,
        "{kind}: global_concurrency(2) held the first worker to 2 jobs"
    );
    drop(stuck); // SIGKILL, holding both permits
    let dead_pid = first[0].pid;
    let mut quick = ChildWorker::spawn(&backend, Mode::Quick, &ledger);
    let done = |entries: &[Entry]| -> BTreeSet<u64> {
        entries
            .iter()
            .filter(|e| !e.start && e.pid != dead_pid)
            .map(|e| e.n)
            .collect()
    };
    loop {
        let entries = read_ledger(&ledger);
        if done(&entries).len() == 6 {
            break;
        }
        if let Some(f) = quick.failure() {
            panic!("{f}");
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{kind}: after the first worker died, only {:?} of 6 jobs done: its permits were not given back",
            done(&entries)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(quick);
    let entries = read_ledger(&ledger);
    let _ = std::fs::remove_dir_all(&dir);
    let (mut now, mut max) = (0i64, 0i64);
    for e in entries.iter().filter(|e| e.pid != dead_pid) {
        now += if e.start { 1 } else { -1 };
        max = max.max(now);
    }
    assert!(
        max <= 2,
        "{kind}: {max} at once, above global_concurrency(2)"
    );
}

mod dead_worker_gives_its_permits_back {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::dead_worker("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::dead_worker("postgres").await;
    }
    #[ignore = "needs Redis: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        super::dead_worker("redis").await;
    }
}

mod global_concurrency_across_processes {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::concurrency("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::concurrency("postgres").await;
    }
    #[ignore = "needs Redis: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        super::concurrency("redis").await;
    }
    #[ignore = "needs a Redis Cluster: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_cluster() {
        super::concurrency("cluster").await;
    }
}

mod rate_limit_across_processes {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::rate("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::rate("postgres").await;
    }
    #[ignore = "needs Redis: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        super::rate("redis").await;
    }
    #[ignore = "needs a Redis Cluster: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_cluster() {
        super::rate("cluster").await;
    }
}

// ---------------------------------------------------------------------------------------------
// A rate window counted from the permit's time (issue 29, item 8)
// ---------------------------------------------------------------------------------------------

/// Holds the lock a take of pool `pool`'s permits waits for (Postgres: the advisory lock on the
/// pool's name; SQLite: the write lock) 400 ms at a time, 100 ms apart, until `until`.
async fn hold_the_permits_lock(env: Vec<(&'static str, String)>, pool: String, until: Instant) {
    use sqlx::Connection as _;
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("the database's {name}"))
    };
    let held = Duration::from_millis(400);
    if var(common::ENV_BACKEND) == "sqlite" {
        let mut conn = sqlx::SqliteConnection::connect(&var(common::ENV_URL))
            .await
            .expect("open the database");
        while Instant::now() < until {
            sqlx::raw_sql("BEGIN IMMEDIATE")
                .execute(&mut conn)
                .await
                .expect("take the write lock");
            tokio::time::sleep(held).await;
            sqlx::raw_sql("COMMIT")
                .execute(&mut conn)
                .await
                .expect("commit");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    } else {
        let mut conn = sqlx::PgConnection::connect(&var(common::ENV_URL))
            .await
            .expect("connect");
        while Instant::now() < until {
            sqlx::raw_sql("BEGIN")
                .execute(&mut conn)
                .await
                .expect("begin");
            sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                .bind(format!("stagedoor_permits:{pool}"))
                .execute(&mut conn)
                .await
                .expect("take the pool's lock");
            tokio::time::sleep(held).await;
            sqlx::raw_sql("COMMIT")
                .execute(&mut conn)
                .await
                .expect("commit");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `rate_limit(20, 1 s)`'s pool, taken by 30 takers at once while the pool's lock is held 400 ms
/// at a time: each take counts its permit's second from when it holds the lock, not from
/// before it waited, so no 1 s window holds more than 20 starts (a start is when its take
/// returned, a little after its permit's time: windows of 950 ms). Before, a take that waited
/// for the lock wrote a permit that ran out up to 400 ms early, and up to 40 started in one
/// window.
async fn rate_window_counts_from_the_permit<D: common::Db>()
where
    D::DB: stagedoor_jobs_sqlx::Dialect,
{
    use stagedoor_jobs::broker::{Inspect as _, Locks as _};
    let db = D::fresh("ratewin", common::conf_ddl::<D>()).await;
    let route = db.broker().route::<common::ConfRow>("limited");
    route.connect().await.expect("connect");
    let pool = format!("rate:win:{}", common::unique());
    let (limit, per) = (20_u32, Duration::from_secs(1));
    let until = Instant::now() + Duration::from_secs(4);
    // The bookkeeping tables exist before the lock is held.
    route
        .take_permits(&pool, limit, &[], per)
        .await
        .expect("probe");
    let blocker = tokio::spawn(hold_the_permits_lock(db.child_env(), pool.clone(), until));
    let starts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut takers = Vec::new();
    for t in 0..30 {
        let (route, pool, starts) = (route.clone(), pool.clone(), Arc::clone(&starts));
        takers.push(tokio::spawn(async move {
            let mut n = 0;
            while Instant::now() < until {
                n += 1;
                let token = format!("{t}-{n}");
                let got = route
                    .take_permits(&pool, limit, &[token], per)
                    .await
                    .expect("take a permit");
                if got.taken == 1 {
                    starts
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(Instant::now());
                } else {
                    let wait = got.next_free.unwrap_or(Duration::from_millis(20));
                    tokio::time::sleep(
                        wait.clamp(Duration::from_millis(5), Duration::from_millis(50)),
                    )
                    .await;
                }
            }
        }));
    }
    for t in takers {
        t.await.expect("a taker");
    }
    blocker.await.expect("the blocker");
    let mut starts = starts
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    starts.sort();
    assert!(
        starts.len() >= 3 * limit as usize,
        "the takers took permits all along: {} starts in 4 s",
        starts.len()
    );
    let window = Duration::from_millis(950);
    let most = (0..starts.len())
        .map(|i| {
            starts[i..]
                .iter()
                .take_while(|s| s.duration_since(starts[i]) < window)
                .count()
        })
        .max()
        .unwrap_or(0);
    assert!(
        most <= limit as usize,
        "{most} starts in one window of {window:?}, above rate_limit({limit}, 1 s)"
    );
}

mod rate_window_counts_from_the_permit {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::rate_window_counts_from_the_permit::<crate::common::Lite>().await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::rate_window_counts_from_the_permit::<crate::common::Pg>().await;
    }
}
