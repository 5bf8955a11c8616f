//! The scheduler on every backend (issue 5): memory, SQLite, Postgres, Redis and Redis Cluster.
//!
//! | issue item | tests |
//! |---|---|
//! | 2. one enqueue per tick across workers: three services in one process sharing a database or Redis, and three child processes (this binary run again with the `sched_child` filter), every-1 s, every-2 s and every-second cron schedules, live clock; every tick's job id `schedule@tick` is seen by the handlers exactly once, no gap between the first and the last | [`exactly_once_in_one_process`], [`exactly_once_in_child_processes`] |
//! | 2. a worker whose clock is seconds behind enqueues no tick twice | [`a_lagging_clock`] |
//! | 2. a tick whose enqueue the broker refused is enqueued once it recovers (it was lost) | [`a_failed_enqueue_is_retried`] |
//! | 3. missed ticks: skip, run once, run all (at most 1,000), counted from the tick recorded before every worker stopped | [`missed_ticks`] |
//! | 1. a cron schedule at its wall-clock time in its zone, across both DST changes (a skipped time, a repeated time, hourly and every 15 minutes); a day on the harness's clock | [`cron`] |
//! | 4. delayed publishing (`after`, `at`) survives a restart of every worker | [`delayed_job_survives_a_restart`] |
//! | issue 13, 7. a scheduler dying between taking a tick and enqueueing it (or just after): the tick runs once | [`a_scheduler_dying_mid_tick`] |
//! | issue 13, 6. a worker whose clock is 3 s fast runs no tick and no delayed job early, and no tick twice | [`a_fast_clock`] |
//! | 5. the hold-expiry example: no expired hold and no seat `held` without a hold; a duplicate run (the handler called twice, two sweeps at once, the same tick published twice) changes nothing | [`hold_expiry_sweep`] |
//!
//! Servers come from `scripts/test-all` (`DATABASE_URL`, `REDIS_URL`, `REDIS_CLUSTER_URLS`);
//! a missing variable fails the test. Every test has its own SQLite file, Postgres schema or
//! Redis namespace.

mod common;

#[path = "../examples/hold_expiry.rs"]
#[allow(dead_code)]
mod hold_expiry;

use stagedoor_jobs::Activity;
use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{Db as SqlDb, Lite, Pg, Sql as _, eventually};
use serde_json::json;
use stagedoor_jobs::broker::tick_job_id;
use stagedoor_jobs::broker::{DeadLetters, Inspect, Locks};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::schedule::{Tz, chrono_tz};
use stagedoor_jobs::testing::Outcome;
use stagedoor_jobs::{Broker, RouteBuilder, Running};
use stagedoor_jobs_redis::RedisBroker;

/// The queue every schedule here enqueues on.
const QUEUE: &str = "jobs";
/// The child worker's backend (`sqlite`, `postgres`, `redis`, `cluster`); set only in a child.
const ENV_CHILD: &str = "STAGEDOOR_SCHED_CHILD";
/// The child's Redis namespace.
const ENV_NAMESPACE: &str = "STAGEDOOR_SCHED_NAMESPACE";
/// How long three workers run the exactly-once schedules.
const RUN: Duration = Duration::from_millis(3_600);
/// How long a test waits for something a worker does.
const PATIENCE: Duration = Duration::from_secs(20);
const PRAGUE: Tz = chrono_tz::Europe::Prague;

// ---------------------------------------------------------------------------------------------
// What the handlers saw
// ---------------------------------------------------------------------------------------------

/// Every job id a handler of this process ran, with the time it ran.
#[derive(Default)]
struct Seen {
    runs: Mutex<Vec<(String, DateTime<Utc>)>>,
    /// Also print `SEEN <id>` (a child process reports to its parent this way).
    echo: bool,
}

impl Seen {
    fn echoing() -> Arc<Self> {
        Arc::new(Self {
            echo: true,
            ..Self::default()
        })
    }

    fn ids(&self) -> Vec<String> {
        self.runs
            .lock()
            .expect("seen lock")
            .iter()
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn runs(&self) -> Vec<(String, DateTime<Utc>)> {
        self.runs.lock().expect("seen lock").clone()
    }

    fn add(&self, id: String) {
        self.runs.lock().expect("seen lock").push((id, Utc::now()));
    }

    /// The ticks of `schedule` that ran, in order (duplicates kept).
    fn ticks(&self, schedule: &str) -> Vec<DateTime<Utc>> {
        let mut t: Vec<_> = self
            .ids()
            .iter()
            .filter_map(|id| {
                let (name, _) = id.rsplit_once('@')?;
                (name == schedule)
                    .then(|| hold_expiry::tick_of(id))
                    .flatten()
            })
            .collect();
        t.sort();
        t
    }
}

/// Records the job id (every kind of the queue comes here).
async fn record(
    _: &serde_json::Value,
    Ctx(id): Ctx<keys::JobId>,
    Data(seen): Data<Arc<Seen>>,
) -> HandlerOutcome {
    if seen.echo {
        println!("SEEN {id}");
    }
    seen.add(id.to_string());
    HandlerOutcome::ack()
}

fn mount<B: Broker>(b: &mut RouteBuilder<B>) {
    b.include(Subscriber::new(QUEUE, record).name("record"));
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

fn namespace() -> String {
    format!("sched-{}:", common::unique())
}

/// Where the jobs of a test live. Every [`Backend::service`] gets a broker of its own (its own
/// pool or connection), as another process would; the memory broker is shared by its clones.
#[derive(Clone)]
enum Backend {
    Memory(MemoryBroker),
    Sqlite(Lite),
    Postgres(Pg),
    Redis {
        url: String,
        namespace: String,
    },
    Cluster {
        urls: Vec<String>,
        namespace: String,
    },
}

impl Backend {
    async fn fresh(kind: &str) -> Self {
        match kind {
            "memory" => Backend::Memory(MemoryBroker::new()),
            "sqlite" => Backend::Sqlite(Lite::fresh("sched", hold_expiry::SQLITE_JOBS).await),
            "postgres" => Backend::Postgres(Pg::fresh("sched", hold_expiry::POSTGRES_JOBS).await),
            "redis" => Backend::Redis {
                url: env_url("REDIS_URL"),
                namespace: namespace(),
            },
            "cluster" => Backend::Cluster {
                urls: cluster_urls(),
                namespace: namespace(),
            },
            other => panic!("unknown backend {other}"),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
            Backend::Redis { .. } => "redis",
            Backend::Cluster { .. } => "cluster",
        }
    }

    /// A worker: `record` on every kind of [`QUEUE`], and `schedules`.
    fn service(&self, app: &str, seen: &Arc<Seen>, schedules: Vec<Schedule>) -> Service {
        self.service_with(app, seen, schedules, &Tweak::default())
    }

    /// A worker as [`service`](Self::service), its broker changed as `tweak` says.
    fn service_with(
        &self,
        app: &str,
        seen: &Arc<Seen>,
        schedules: Vec<Schedule>,
        tweak: &Tweak,
    ) -> Service {
        let mut service = Service::new(AppInfo::new(app, "0.1.0"))
            .state(Arc::clone(seen))
            // A worker whose scheduler dies mid-tick never sees it return: its shutdown waits
            // out the whole timeout, so keep that short (its handler records in microseconds).
            .shutdown_timeout(Duration::from_secs(if tweak.die.is_some() { 1 } else { 5 }));
        for s in schedules {
            service = service.schedule(s);
        }
        match self {
            Backend::Memory(b) => tweak.attach(service, b.clone()),
            Backend::Sqlite(db) => {
                tweak.attach(service, db.broker().route::<hold_expiry::JobRow>(QUEUE))
            }
            Backend::Postgres(db) => {
                tweak.attach(service, db.broker().route::<hold_expiry::JobRow>(QUEUE))
            }
            Backend::Redis { url, namespace } => tweak.attach(
                service,
                RedisBroker::from_url(url).namespace(namespace.clone()),
            ),
            Backend::Cluster { urls, namespace } => tweak.attach(
                service,
                RedisBroker::cluster(urls).namespace(namespace.clone()),
            ),
        }
    }

    /// What a child process needs to reach the same jobs.
    fn child_env(&self) -> Vec<(String, String)> {
        let mut env = vec![(ENV_CHILD.to_owned(), self.kind().to_owned())];
        match self {
            Backend::Memory(_) => panic!("a memory broker cannot be shared with a child process"),
            Backend::Sqlite(db) => {
                env.extend(db.child_env().into_iter().map(|(k, v)| (k.to_owned(), v)))
            }
            Backend::Postgres(db) => {
                env.extend(db.child_env().into_iter().map(|(k, v)| (k.to_owned(), v)))
            }
            Backend::Redis { namespace, .. } | Backend::Cluster { namespace, .. } => {
                env.push((ENV_NAMESPACE.to_owned(), namespace.clone()));
            }
        }
        env
    }

    /// The backend a parent handed to this child process.
    async fn from_env(kind: &str) -> Self {
        match kind {
            "sqlite" => Backend::Sqlite(Lite::from_env().await.expect("the child's SQLite file")),
            "postgres" => Backend::Postgres(Pg::from_env().await.expect("the child's schema")),
            "redis" => Backend::Redis {
                url: env_url("REDIS_URL"),
                namespace: std::env::var(ENV_NAMESPACE).expect("the child's namespace"),
            },
            "cluster" => Backend::Cluster {
                urls: cluster_urls(),
                namespace: std::env::var(ENV_NAMESPACE).expect("the child's namespace"),
            },
            other => panic!("unknown backend {other}"),
        }
    }

    /// The schedule's latest recorded tick, read with a broker of its own.
    async fn last_tick(&self, schedule: &str) -> Option<DateTime<Utc>> {
        async fn read<B: Broker>(b: B, schedule: &str) -> Option<DateTime<Utc>> {
            b.connect().await.expect("connect");
            b.last_tick(schedule).await.expect("last tick")
        }
        match self {
            Backend::Memory(b) => read(b.clone(), schedule).await,
            Backend::Sqlite(db) => {
                read(db.broker().route::<hold_expiry::JobRow>(QUEUE), schedule).await
            }
            Backend::Postgres(db) => {
                read(db.broker().route::<hold_expiry::JobRow>(QUEUE), schedule).await
            }
            Backend::Redis { url, namespace } => {
                read(
                    RedisBroker::from_url(url).namespace(namespace.clone()),
                    schedule,
                )
                .await
            }
            Backend::Cluster { urls, namespace } => {
                read(
                    RedisBroker::cluster(urls).namespace(namespace.clone()),
                    schedule,
                )
                .await
            }
        }
    }
}

/// Runs what is left in the queue (jobs enqueued just before the last worker stopped) with a
/// worker that has no schedules, recording into `seen`.
async fn drain_rest(backend: &Backend, seen: &Arc<Seen>) {
    let app = TestApp::start_live(backend.service("drain", seen, Vec::new()))
        .await
        .unwrap_or_else(|e| panic!("the draining worker starts: {e}"));
    app.drain().await;
    app.stop().await;
}

/// Shuts the workers down at the same time.
async fn stop_all(workers: Vec<Running>) {
    let stops: Vec<_> = workers
        .into_iter()
        .map(|r| tokio::spawn(r.shutdown()))
        .collect();
    for s in stops {
        s.await.expect("a shutdown");
    }
}

/// The ticks of `s` in `(after, until]`.
fn ticks_between(s: &Schedule, after: DateTime<Utc>, until: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    let mut t = s.next_after(after);
    while let Some(tick) = t.filter(|t| *t <= until) {
        out.push(tick);
        t = s.next_after(tick);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Item 2: one enqueue per tick across workers
// ---------------------------------------------------------------------------------------------

/// Three schedules on one queue: every second, every 2 seconds (a kind of its own), and a cron
/// expression with a seconds field in a time zone.
fn three_schedules() -> Vec<Schedule> {
    vec![
        Schedule::every("every_1s", Duration::from_secs(1)).on(QUEUE),
        Schedule::every("every_2s", Duration::from_secs(2))
            .on(QUEUE)
            .kind("two_seconds"),
        Schedule::cron("cron_1s", "* * * * * *")
            .in_tz(PRAGUE)
            .on(QUEUE)
            .missed(Missed::Skip),
    ]
}

/// Each schedule of [`three_schedules`] and its period in seconds.
const PERIODS: [(&str, i64); 3] = [("every_1s", 1), ("every_2s", 2), ("cron_1s", 1)];

/// Every id is `schedule@tick` of a known schedule; per schedule no tick twice, none missing
/// between the first and the last, each on its period's grid, and at least `min_run` seconds of
/// ticks.
fn assert_each_tick_once(what: &str, ids: &[String], min_run: i64) {
    let mut by: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for id in ids {
        let (name, secs) = id
            .rsplit_once('@')
            .unwrap_or_else(|| panic!("{what}: `{id}` is not a tick's job id"));
        by.entry(name.to_owned())
            .or_default()
            .push(secs.parse().expect("seconds"));
    }
    for (name, period) in PERIODS {
        let mut ticks = by.remove(name).unwrap_or_default();
        ticks.sort_unstable();
        let twice: Vec<i64> = ticks
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        assert!(
            twice.is_empty(),
            "{what}: ticks of `{name}` run more than once: {twice:?} (all: {ticks:?})"
        );
        let gaps: Vec<(i64, i64)> = ticks
            .windows(2)
            .filter(|w| w[1] - w[0] != period)
            .map(|w| (w[0], w[1]))
            .collect();
        assert!(
            gaps.is_empty(),
            "{what}: ticks of `{name}` missing between {gaps:?} (all: {ticks:?})"
        );
        assert!(
            ticks.iter().all(|t| t % period == 0),
            "{what}: ticks of `{name}` off the {period} s grid: {ticks:?}"
        );
        let span = ticks.last().zip(ticks.first()).map_or(-1, |(l, f)| l - f);
        assert!(
            span + period > min_run - period,
            "{what}: `{name}` ran too few ticks for the time its workers ran: {ticks:?}"
        );
    }
    assert!(by.is_empty(), "{what}: ids of no schedule: {by:?}");
}

/// Three services in this process, each with its own broker on the same jobs, run the three
/// schedules on the real clock.
async fn three_services_in_one_process(kind: &str) {
    let backend = Backend::fresh(kind).await;
    let seen = Arc::new(Seen::default());
    let mut workers = Vec::new();
    for w in 0..3 {
        workers.push(
            backend
                .service(&format!("worker-{w}"), &seen, three_schedules())
                .start()
                .await
                .unwrap_or_else(|e| panic!("worker {w} starts: {e}")),
        );
    }
    tokio::time::sleep(RUN).await;
    stop_all(workers).await;
    drain_rest(&backend, &seen).await;
    assert_each_tick_once(kind, &seen.ids(), 3);
}

mod exactly_once_in_one_process {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn memory() {
        super::three_services_in_one_process("memory").await;
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        super::three_services_in_one_process("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::three_services_in_one_process("postgres").await;
    }
    #[ignore = "needs Redis: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn redis() {
        super::three_services_in_one_process("redis").await;
    }
    #[ignore = "needs a Redis Cluster: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn redis_cluster() {
        super::three_services_in_one_process("cluster").await;
    }
}

/// A child worker: the three schedules for [`RUN`], printing `SEEN <id>` for each job it runs.
/// A no-op unless a parent set [`ENV_CHILD`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sched_child() {
    let Ok(kind) = std::env::var(ENV_CHILD) else {
        return;
    };
    let backend = Backend::from_env(&kind).await;
    let running = backend
        .service(
            &format!("child-{}", std::process::id()),
            &Seen::echoing(),
            three_schedules(),
        )
        .start()
        .await
        .unwrap_or_else(|e| panic!("the child worker starts: {e}"));
    tokio::time::sleep(RUN).await;
    running.shutdown().await;
}

/// A child worker process; killed if still running when dropped.
struct ChildWorker(Child);

impl ChildWorker {
    fn spawn(backend: &Backend) -> Self {
        let exe = std::env::current_exe().expect("the test binary");
        let child = Command::new(exe)
            .args(["sched_child", "--exact", "--nocapture", "--test-threads=1"])
            .envs(backend.child_env())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a child worker");
        Self(child)
    }

    /// Waits for the child to exit (at most [`PATIENCE`]); its `SEEN` ids.
    async fn seen(&mut self) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let status = loop {
            if let Some(status) = self.0.try_wait().expect("the child's status") {
                break status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "a child worker did not exit within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (mut out, mut err) = (String::new(), String::new());
        if let Some(mut o) = self.0.stdout.take() {
            o.read_to_string(&mut out).expect("the child's stdout");
        }
        if let Some(mut e) = self.0.stderr.take() {
            e.read_to_string(&mut err).expect("the child's stderr");
        }
        assert!(
            status.success(),
            "a child worker failed ({status}):\n{out}\n{err}"
        );
        assert!(
            out.contains("test result: ok. 1 passed"),
            "the child ran its worker:\n{out}\n{err}"
        );
        out.lines()
            // The harness's `test sched_child ... ` may share the first id's line.
            .filter_map(|l| l.split_once("SEEN ").map(|(_, id)| id.trim()))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Three worker processes on the same jobs run the three schedules on the real clock.
async fn three_child_processes(kind: &str) {
    let backend = Backend::fresh(kind).await;
    let mut children: Vec<ChildWorker> = (0..3).map(|_| ChildWorker::spawn(&backend)).collect();
    let mut ids = Vec::new();
    for c in &mut children {
        ids.extend(c.seen().await);
    }
    let seen = Arc::new(Seen::default());
    drain_rest(&backend, &seen).await;
    ids.extend(seen.ids());
    assert_each_tick_once(&format!("{kind}, 3 processes"), &ids, 3);
}

mod exactly_once_in_child_processes {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::three_child_processes("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::three_child_processes("postgres").await;
    }
    #[ignore = "needs Redis: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        super::three_child_processes("redis").await;
    }
}

/// Two workers on the same database, each on a paused clock, one seconds behind the other:
/// every tick the lagging one reaches was enqueued by the other already (the lock per tick
/// outlives a few seconds of skew), so no tick runs twice.
async fn a_lagging_clock_enqueues_no_tick_twice(kind: &str) {
    let backend = Backend::fresh(kind).await;
    let seen = Arc::new(Seen::default());
    let every = || vec![Schedule::every("every_1s", Duration::from_secs(1)).on(QUEUE)];
    let ahead = TestApp::start(backend.service("ahead", &seen, every()))
        .await
        .expect("start");
    let behind = TestApp::start(backend.service("behind", &seen, every()))
        .await
        .expect("start");
    ahead.advance(Duration::from_secs(6)).await;
    let by_ahead = seen.ids().len();
    assert!(by_ahead >= 5, "{:?}", seen.ids());
    // Three seconds behind: every tick it passes was enqueued by the other.
    behind.advance(Duration::from_secs(3)).await;
    assert_eq!(seen.ids().len(), by_ahead, "{:?}", seen.ids());
    ahead.advance(Duration::from_secs(2)).await;
    behind.advance(Duration::from_secs(6)).await;
    ahead.advance(Duration::from_secs(2)).await;
    let end = ahead.now().max(behind.now());
    ahead.stop().await;
    behind.stop().await;
    let ids = seen.ids();
    // Every tick once, none missing, from either worker.
    let ticks = seen.ticks("every_1s");
    assert!(ticks.len() >= 10, "{ids:?}");
    assert!(*ticks.last().expect("ticks") <= end);
    let mut all = ids.clone();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), ids.len(), "a tick ran twice: {ids:?}");
    assert!(
        ticks
            .windows(2)
            .all(|w| w[1] - w[0] == chrono::Duration::seconds(1)),
        "a tick is missing: {ids:?}"
    );
}

mod a_lagging_clock {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::a_lagging_clock_enqueues_no_tick_twice("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::a_lagging_clock_enqueues_no_tick_twice("postgres").await;
    }
}

/// A tick whose enqueue fails (the broker refuses the lock or the insert) is tried again every
/// second until the broker recovers, so a blip at 03:00 does not cost the night's run; failed
/// ticks overtaken by newer ones are missed ticks, which the policy decides. SQLite on the
/// harness's clock, failures injected with triggers.
async fn a_tick_the_broker_failed_is_enqueued_when_it_recovers(policy: Missed) {
    let Backend::Sqlite(db) = Backend::fresh("sqlite").await else {
        unreachable!()
    };
    let backend = Backend::Sqlite(db.clone());
    let seen = Arc::new(Seen::default());
    let minute = Duration::from_secs(60);
    let s = Schedule::every("sweep", minute).on(QUEUE).missed(policy);
    let app = TestApp::start(backend.service("flaky", &seen, vec![s.clone()]))
        .await
        .expect("start");
    let start = app.now();
    app.advance(minute).await;
    assert_eq!(seen.ticks("sweep").len(), 1, "the first tick ran as usual");
    let fail_locks = "CREATE TRIGGER fail_locks BEFORE INSERT ON stagedoor_locks \
                      BEGIN SELECT RAISE(ABORT, 'injected: no lock'); END";
    let fail_jobs = "CREATE TRIGGER fail_jobs BEFORE INSERT ON jobs \
                     BEGIN SELECT RAISE(ABORT, 'injected: no insert'); END";
    let recovered = |n: usize| {
        let seen = Arc::clone(&seen);
        async move {
            eventually("the failed tick was enqueued", PATIENCE, || async {
                seen.ticks("sweep").len() >= n
            })
            .await;
        }
    };
    // The lock cannot be taken, then the job cannot be inserted: each tick waits for the
    // broker and runs once it is back.
    for (fail, drop) in [
        (fail_locks, "DROP TRIGGER fail_locks"),
        (fail_jobs, "DROP TRIGGER fail_jobs"),
    ] {
        let before = seen.ticks("sweep").len();
        db.run(fail.to_owned()).await;
        app.advance(minute).await;
        assert_eq!(
            seen.ticks("sweep").len(),
            before,
            "nothing enqueued while failing"
        );
        db.run(drop.to_owned()).await;
        recovered(before + 1).await;
    }
    // Three ticks fail in a row; the policy decides about the two that were overtaken.
    let before = seen.ticks("sweep");
    db.run(fail_locks.to_owned()).await;
    for _ in 0..3 {
        app.advance(minute).await;
    }
    let failed = ticks_between(&s, *before.last().expect("ticks"), app.now());
    assert_eq!(failed.len(), 3);
    db.run("DROP TRIGGER fail_locks".to_owned()).await;
    recovered(before.len() + 1).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    app.drain().await;
    let want: Vec<_> = match policy {
        Missed::RunAll => failed.clone(),
        _ => failed[2..].to_vec(),
    };
    assert_eq!(seen.ticks("sweep"), [before, want].concat(), "{policy:?}");
    app.advance(minute).await;
    let all = seen.ticks("sweep");
    assert_eq!(
        all.last(),
        ticks_between(&s, start, app.now()).last(),
        "ticking on"
    );
    let mut unique = all.clone();
    unique.dedup();
    assert_eq!(unique, all, "no tick twice");
    app.stop().await;
}

mod a_failed_enqueue_is_retried {
    use stagedoor_jobs::Missed;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_once() {
        super::a_tick_the_broker_failed_is_enqueued_when_it_recovers(Missed::RunOnce).await;
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_all() {
        super::a_tick_the_broker_failed_is_enqueued_when_it_recovers(Missed::RunAll).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Item 3: missed ticks
// ---------------------------------------------------------------------------------------------

mod missed_ticks {
    use super::*;

    fn sweep(policy: Missed, period: Duration) -> Schedule {
        Schedule::every("sweep", period).on(QUEUE).missed(policy)
    }

    /// What the policy enqueues of `missed`.
    fn expected(policy: Missed, missed: &[DateTime<Utc>]) -> Vec<DateTime<Utc>> {
        match policy {
            Missed::Skip => Vec::new(),
            Missed::RunOnce => missed.last().copied().into_iter().collect(),
            Missed::RunAll => missed[missed.len().saturating_sub(1_000)..].to_vec(),
        }
    }

    /// Every worker stopped after the tick `ago` before now (recorded in the broker); a worker
    /// starts on the harness's clock: the policy decides what it enqueues of the missed ticks,
    /// then it ticks as usual.
    async fn after_a_long_stop(policy: Missed, period: Duration, ago: chrono::Duration) {
        let broker = MemoryBroker::new();
        let s = sweep(policy, period);
        let last = s.next_after(Utc::now() - ago).expect("a tick");
        broker.mark_tick("sweep", last).await.expect("mark");
        let seen = Arc::new(Seen::default());
        let app =
            TestApp::start(Backend::Memory(broker).service("restarted", &seen, vec![s.clone()]))
                .await
                .expect("start");
        app.advance(Duration::ZERO).await;
        let restart = app.now();
        let missed = ticks_between(&s, last, restart);
        assert!(!missed.is_empty());
        let want = expected(policy, &missed);
        assert_eq!(
            seen.ticks("sweep"),
            want,
            "{policy:?} after {} missed ticks",
            missed.len()
        );
        // From here on, every tick as usual.
        app.advance(period * 2).await;
        let next = ticks_between(&s, restart, app.now());
        assert_eq!(next.len(), 2);
        assert_eq!(seen.ticks("sweep"), [want, next].concat());
        app.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn skip_enqueues_none_of_them() {
        after_a_long_stop(
            Missed::Skip,
            Duration::from_secs(60),
            chrono::Duration::minutes(10),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_once_enqueues_the_latest() {
        after_a_long_stop(
            Missed::RunOnce,
            Duration::from_secs(60),
            chrono::Duration::minutes(10),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_all_enqueues_each_once() {
        after_a_long_stop(
            Missed::RunAll,
            Duration::from_secs(60),
            chrono::Duration::minutes(10),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_all_enqueues_at_most_the_latest_thousand() {
        after_a_long_stop(
            Missed::RunAll,
            Duration::from_secs(1),
            chrono::Duration::hours(2),
        )
        .await;
    }

    #[test]
    fn run_once_is_the_default() {
        assert_eq!(Missed::default(), Missed::RunOnce);
    }

    /// A first service runs an every-second schedule on the real clock and records its ticks;
    /// every worker stops; three ticks later a new one starts (on the harness's clock).
    async fn recorded_by_a_first_run(policy: Missed) {
        let broker = MemoryBroker::new();
        let backend = Backend::Memory(broker.clone());
        let s = sweep(policy, Duration::from_secs(1));
        let seen = Arc::new(Seen::default());
        let first = TestApp::start_live(backend.service("first", &seen, vec![s.clone()]))
            .await
            .expect("start");
        eventually("the first run ran a tick", PATIENCE, || async {
            !seen.ticks("sweep").is_empty()
        })
        .await;
        first.stop().await;
        let last = broker
            .last_tick("sweep")
            .await
            .expect("read")
            .expect("the first run recorded its tick");
        let wait = (last + chrono::Duration::milliseconds(3_300) - Utc::now())
            .to_std()
            .unwrap_or_default();
        tokio::time::sleep(wait).await;
        let app = TestApp::start(backend.service("restarted", &seen, vec![s.clone()]))
            .await
            .expect("start");
        app.advance(Duration::ZERO).await;
        let restart = app.now();
        let missed = ticks_between(&s, last, restart);
        assert!(missed.len() >= 3, "{missed:?}");
        let after: Vec<_> = seen
            .ticks("sweep")
            .into_iter()
            .filter(|t| *t > last)
            .collect();
        assert_eq!(after, expected(policy, &missed), "{policy:?}");
        app.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn counted_from_the_tick_a_first_run_recorded() {
        tokio::join!(
            recorded_by_a_first_run(Missed::Skip),
            recorded_by_a_first_run(Missed::RunOnce),
            recorded_by_a_first_run(Missed::RunAll),
        );
    }

    /// On SQLite, live: a worker runs an every-second schedule, stops; nothing runs for three
    /// seconds; a new worker with `RunAll` enqueues the ticks it missed, so the ticks that ran
    /// have no gap and no tick twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_all_on_sqlite_live() {
        let backend = Backend::fresh("sqlite").await;
        let s = || sweep(Missed::RunAll, Duration::from_secs(1));
        let seen = Arc::new(Seen::default());
        let first = backend
            .service("first", &seen, vec![s()])
            .start()
            .await
            .expect("start");
        eventually("the first run ran 2 ticks", PATIENCE, || async {
            seen.ticks("sweep").len() >= 2
        })
        .await;
        first.shutdown().await;
        let last = backend
            .last_tick("sweep")
            .await
            .expect("the first run recorded its tick");
        let wait = (last + chrono::Duration::milliseconds(3_300) - Utc::now())
            .to_std()
            .unwrap_or_default();
        tokio::time::sleep(wait).await;
        let restart = Utc::now();
        let second = backend
            .service("second", &seen, vec![s()])
            .start()
            .await
            .expect("start");
        eventually("the missed ticks ran", PATIENCE, || async {
            seen.ticks("sweep").last().is_some_and(|t| *t > restart)
        })
        .await;
        second.shutdown().await;
        drain_rest(&backend, &seen).await;
        let ticks = seen.ticks("sweep");
        let missed = ticks_between(&s(), last, restart);
        assert!(missed.len() >= 3, "{missed:?}");
        for t in &missed {
            assert!(ticks.contains(t), "missed tick {t} not run: {ticks:?}");
        }
        assert!(
            ticks
                .windows(2)
                .all(|w| w[1] - w[0] == chrono::Duration::seconds(1)),
            "a gap or a tick twice: {ticks:?}"
        );
        // The missed ticks ran after the restart, not before.
        for (id, at) in seen.runs() {
            let tick = hold_expiry::tick_of(&id).expect("a tick id");
            if missed.contains(&tick) {
                assert!(
                    at >= restart,
                    "{id} ran at {at}, before the restart at {restart}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Item 1: cron schedules in a time zone
// ---------------------------------------------------------------------------------------------

mod cron {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("a time")
            .with_timezone(&Utc)
    }

    /// The first `n` ticks after `t`.
    fn ticks(s: &Schedule, t: &str, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::new();
        let mut at = utc(t);
        for _ in 0..n {
            at = s.next_after(at).expect("a next tick");
            out.push(at);
        }
        out
    }

    /// 03:00 in Prague is 02:00 UTC in winter (CET) and 01:00 UTC in summer (CEST); summer time
    /// starts on 2026-03-29 at 02:00 and ends on 2026-10-25 at 03:00.
    #[test]
    fn reconcile_at_three_in_prague_keeps_its_wall_clock_time_across_both_changes() {
        let s = Schedule::cron("reconcile_payments", cron!("0 3 * * *"))
            .in_tz(PRAGUE)
            .on(QUEUE);
        assert_eq!(
            ticks(&s, "2026-03-27T12:00:00Z", 3),
            [
                utc("2026-03-28T02:00:00Z"),
                utc("2026-03-29T01:00:00Z"),
                utc("2026-03-30T01:00:00Z")
            ]
        );
        assert_eq!(
            ticks(&s, "2026-10-23T12:00:00Z", 3),
            [
                utc("2026-10-24T01:00:00Z"),
                utc("2026-10-25T02:00:00Z"),
                utc("2026-10-26T02:00:00Z")
            ]
        );
        for t in ticks(&s, "2026-01-01T00:00:00Z", 366) {
            assert_eq!(
                t.with_timezone(&PRAGUE).format("%H:%M:%S").to_string(),
                "03:00:00",
                "{t}"
            );
        }
    }

    /// A time the spring change skips (02:30 on 2026-03-29 does not exist in Prague) runs at
    /// the first instant after the gap; a time the autumn change repeats (02:30 on 2026-10-25
    /// happens twice) runs once, at the first.
    #[test]
    fn a_skipped_time_runs_after_the_gap_and_a_repeated_time_runs_once() {
        let s = Schedule::daily_at("nightly", 2, 30).in_tz(PRAGUE).on(QUEUE);
        assert_eq!(
            ticks(&s, "2026-03-27T12:00:00Z", 3),
            [
                utc("2026-03-28T01:30:00Z"), // 02:30 CET
                utc("2026-03-29T01:00:00Z"), // 03:00 CEST, the first instant after the gap
                utc("2026-03-30T00:30:00Z"), // 02:30 CEST
            ]
        );
        assert_eq!(
            ticks(&s, "2026-10-23T12:00:00Z", 3),
            [
                utc("2026-10-24T00:30:00Z"), // 02:30 CEST
                utc("2026-10-25T00:30:00Z"), // the first 02:30 (CEST); not again at 01:30 UTC
                utc("2026-10-26T01:30:00Z"), // 02:30 CET
            ]
        );
    }

    /// On the hour in Prague is every real hour: 23 ticks on the spring day, 25 on the autumn
    /// day (both 02:00s); every 15 minutes likewise never pauses or doubles up.
    #[test]
    fn hourly_in_a_zone_ticks_every_real_hour_across_dst() {
        let hourly = Schedule::hourly("purge_idempotency_keys")
            .in_tz(PRAGUE)
            .on(QUEUE);
        for (day_start, day_end, n) in [
            ("2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23), // local midnight to midnight
            ("2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25),
        ] {
            let got = ticks_between(
                &hourly,
                utc(day_start) - chrono::Duration::seconds(1),
                utc(day_end) - chrono::Duration::seconds(1),
            );
            assert_eq!(got.len(), n, "{got:?}");
            assert!(
                got.windows(2)
                    .all(|w| w[1] - w[0] == chrono::Duration::hours(1)),
                "{got:?}"
            );
        }
        let quarter = Schedule::cron("q", "*/15 * * * *").in_tz(PRAGUE).on(QUEUE);
        let got = ticks_between(
            &quarter,
            utc("2026-10-24T23:00:00Z"),
            utc("2026-10-25T03:00:00Z"),
        );
        assert_eq!(got.len(), 16, "{got:?}");
        assert!(
            got.windows(2)
                .all(|w| w[1] - w[0] == chrono::Duration::minutes(15)),
            "{got:?}"
        );
    }

    /// New York's 09:00 is 14:00 UTC before its change (2026-03-08) and 13:00 UTC after;
    /// Kolkata's 09:30 (UTC+05:30, no DST) is 04:00 UTC; no zone means UTC.
    #[test]
    fn other_zones() {
        let ny = Schedule::daily_at("ny", 9, 0)
            .in_tz("America/New_York".parse().expect("a zone"))
            .on(QUEUE);
        assert_eq!(
            ticks(&ny, "2026-03-07T00:00:00Z", 2),
            [utc("2026-03-07T14:00:00Z"), utc("2026-03-08T13:00:00Z")]
        );
        let kolkata = Schedule::cron("k", cron!("30 9 * * *"))
            .in_tz(chrono_tz::Asia::Kolkata)
            .on(QUEUE);
        assert_eq!(
            ticks(&kolkata, "2026-06-01T00:00:00Z", 1),
            [utc("2026-06-01T04:00:00Z")]
        );
        let plain = Schedule::cron("u", cron!("0 3 * * *")).on(QUEUE);
        assert_eq!(
            ticks(&plain, "2026-06-01T00:00:00Z", 1),
            [utc("2026-06-01T03:00:00Z")]
        );
        // An every-N schedule is on the epoch's grid whatever the zone.
        let every = Schedule::every("e", Duration::from_secs(3600)).in_tz(PRAGUE);
        assert_eq!(
            ticks(&every, "2026-03-29T00:30:00Z", 2),
            [utc("2026-03-29T01:00:00Z"), utc("2026-03-29T02:00:00Z")]
        );
    }

    /// What a cron job saw: its tick, and when it was enqueued.
    #[derive(Default)]
    struct Fired(Mutex<Vec<(String, DateTime<Utc>)>>);

    async fn fired(
        _: &serde_json::Value,
        Ctx(id): Ctx<keys::JobId>,
        Ctx(at): Ctx<keys::EnqueuedAt>,
        Data(f): Data<Arc<Fired>>,
    ) -> HandlerOutcome {
        f.0.lock().expect("lock").push((id.to_string(), at));
        HandlerOutcome::ack()
    }

    /// A day on the harness's paused clock: the 03:00 Prague job, the 09:30 Kolkata job and
    /// the hourly job each fire at their wall-clock time, enqueued at that very instant.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_day_on_the_harness_clock_fires_each_at_its_wall_clock_time() {
        let f = Arc::new(Fired::default());
        let service = Service::new(AppInfo::new("cron", "0.1.0"))
            .state(Arc::clone(&f))
            .schedule(
                Schedule::cron("reconcile_payments", cron!("0 3 * * *"))
                    .in_tz(PRAGUE)
                    .on(QUEUE),
            )
            .schedule(
                Schedule::daily_at("kolkata", 9, 30)
                    .in_tz(chrono_tz::Asia::Kolkata)
                    .on(QUEUE),
            )
            .schedule(Schedule::hourly("hourly").on(QUEUE))
            .with_broker(MemoryBroker::new(), |b| {
                b.include(Subscriber::new(QUEUE, fired));
            });
        let app = TestApp::start(service).await.expect("start");
        let start = app.now();
        app.advance(Duration::from_secs(24 * 3600)).await;
        let end = app.now();
        app.stop().await;
        let got = f.0.lock().expect("lock").clone();
        let of = |name: &str| -> Vec<DateTime<Utc>> {
            got.iter()
                .filter(|(id, _)| id.rsplit_once('@').is_some_and(|(n, _)| n == name))
                .map(|(id, at)| {
                    let tick = hold_expiry::tick_of(id).expect("a tick id");
                    assert_eq!(*at, tick, "{id} was enqueued at {at}, not at its tick");
                    tick
                })
                .collect()
        };
        let prague = of("reconcile_payments");
        assert_eq!(prague.len(), 1, "{got:?}");
        assert_eq!(
            prague[0]
                .with_timezone(&PRAGUE)
                .format("%H:%M:%S")
                .to_string(),
            "03:00:00"
        );
        let kolkata = of("kolkata");
        assert_eq!(kolkata.len(), 1, "{got:?}");
        assert_eq!(
            kolkata[0]
                .with_timezone(&chrono_tz::Asia::Kolkata)
                .format("%H:%M:%S")
                .to_string(),
            "09:30:00"
        );
        let hourly = of("hourly");
        assert_eq!(hourly.len(), 24, "{got:?}");
        for t in prague.iter().chain(&kolkata).chain(&hourly) {
            assert!(*t > start && *t <= end, "{t} outside {start}..{end}");
        }
        assert!(
            hourly
                .iter()
                .all(|t| t.format("%M:%S").to_string() == "00:00")
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Item 4: delayed publishing survives a restart of every worker
// ---------------------------------------------------------------------------------------------

async fn a_delayed_job_survives_a_restart_of_every_worker(kind: &str) {
    let backend = Backend::fresh(kind).await;
    let seen = Arc::new(Seen::default());
    let first = backend
        .service("before", &seen, Vec::new())
        .start()
        .await
        .unwrap_or_else(|e| panic!("start: {e}"));
    let published = Utc::now();
    let after = first
        .publish(
            Job::new(QUEUE, &json!({"event": 7}))
                .expect("encodes")
                .kind("send_reminder")
                .after(Duration::from_secs(2)),
        )
        .await
        .expect("publish after");
    let at_time = published + chrono::Duration::milliseconds(2_500);
    let at = first
        .publish(
            Job::new(QUEUE, &json!({"event": 8}))
                .expect("encodes")
                .kind("send_reminder")
                .at(at_time),
        )
        .await
        .expect("publish at");
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.shutdown().await;
    assert!(
        seen.ids().is_empty(),
        "ran before its time: {:?}",
        seen.ids()
    );
    // Every worker is down for a moment; then a new one (a broker of its own) starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = backend
        .service("after", &seen, Vec::new())
        .start()
        .await
        .unwrap_or_else(|e| panic!("restart: {e}"));
    eventually("both delayed jobs ran", PATIENCE, || async {
        seen.ids().len() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    second.shutdown().await;
    let runs = seen.runs();
    assert_eq!(runs.len(), 2, "each ran once: {runs:?}");
    // Due times are kept to the millisecond.
    let slack = chrono::Duration::milliseconds(2);
    for (id, due) in [
        (
            after.id().as_str(),
            published + chrono::Duration::seconds(2),
        ),
        (at.id().as_str(), at_time),
    ] {
        let (_, ran) = runs
            .iter()
            .find(|(i, _)| i == id)
            .unwrap_or_else(|| panic!("{id} ran: {runs:?}"));
        assert!(*ran + slack >= due, "{id} ran at {ran}, before {due}");
    }
}

mod delayed_job_survives_a_restart {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory() {
        super::a_delayed_job_survives_a_restart_of_every_worker("memory").await;
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::a_delayed_job_survives_a_restart_of_every_worker("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::a_delayed_job_survives_a_restart_of_every_worker("postgres").await;
    }
    #[ignore = "needs Redis: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        super::a_delayed_job_survives_a_restart_of_every_worker("redis").await;
    }
    #[ignore = "needs a Redis Cluster: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_cluster() {
        super::a_delayed_job_survives_a_restart_of_every_worker("cluster").await;
    }
}

// ---------------------------------------------------------------------------------------------
// Item 5: the hold-expiry example
// ---------------------------------------------------------------------------------------------

mod hold_expiry_sweep {
    use super::hold_expiry::{Db, Health, Jobs, Sweep, Tick};
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    /// A fresh database of the example, its tables created (the job table too).
    async fn fresh_db(kind: &str) -> Db {
        let db = match kind {
            "sqlite" => Db::open(&common::fresh_sqlite_url("holds"), None).await,
            "postgres" => {
                let url = common::postgres_url();
                let schema = format!("holds_{}", common::unique());
                let Db::Postgres(admin) = Db::open(&url, None).await.expect("connect") else {
                    unreachable!()
                };
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
                    .execute(&admin)
                    .await
                    .expect("create the schema");
                admin.close().await;
                Db::open(&url, Some(&schema)).await
            }
            other => panic!("unknown database {other}"),
        }
        .expect("open the database");
        db.create_tables(true).await.expect("create the tables");
        db
    }

    fn healthy() -> Health {
        Health {
            expired_holds: 0,
            held_without_hold: 0,
        }
    }

    /// Seats 1-3 (expired holds) available at version 2, seat 8 still sold at version 1, seats
    /// 4-7 still held at version 1.
    async fn assert_swept_once(db: &Db) {
        let seats = db.seats().await.expect("seats");
        let expect: Vec<(i64, String, i64)> = [
            (1, "available", 2),
            (2, "available", 2),
            (3, "available", 2),
            (4, "held", 1),
            (5, "held", 1),
            (6, "held", 1),
            (7, "held", 1),
            (8, "sold", 1),
            (9, "available", 1),
            (10, "available", 1),
        ]
        .into_iter()
        .map(|(i, s, v)| (i, s.to_owned(), v))
        .collect();
        assert_eq!(seats, expect);
        assert_eq!(
            db.count("holds").await.expect("count"),
            4,
            "the live holds stay"
        );
    }

    /// The handler, called twice with the same tick: the first deletes every expired hold and
    /// frees only the seats still held; the second changes nothing.
    async fn the_handler_called_twice_changes_nothing_the_second_time(kind: &str) {
        let db = fresh_db(kind).await;
        let now = Utc::now();
        db.seed(now, MINUTE).await.expect("seed");
        assert_ne!(db.health(now).await.expect("health"), healthy());
        let tick = Tick { at: now };
        hold_expiry::expire_holds(&tick, Data(db.clone()))
            .await
            .expect("the first sweep");
        assert_eq!(db.health(now).await.expect("health"), healthy());
        assert_swept_once(&db).await;
        hold_expiry::expire_holds(&tick, Data(db.clone()))
            .await
            .expect("the second sweep");
        assert_swept_once(&db).await;
        assert_eq!(
            db.expire_holds(now).await.expect("a third"),
            Sweep::default()
        );
    }

    /// Two sweeps of the same tick at once: between them every expired hold is deleted once,
    /// and every seat moves once.
    async fn two_sweeps_at_once(kind: &str) {
        let db = fresh_db(kind).await;
        let now = Utc::now();
        db.seed(now, MINUTE).await.expect("seed");
        let (a, b) = tokio::join!(db.expire_holds(now), db.expire_holds(now));
        let (a, b) = (a.expect("sweep a"), b.expect("sweep b"));
        let mut holds: Vec<i64> = a.holds.iter().chain(&b.holds).map(|(_, s)| *s).collect();
        holds.sort_unstable();
        assert_eq!(
            holds,
            [1, 2, 3, 8],
            "each expired hold deleted once: {a:?} {b:?}"
        );
        let mut freed: Vec<i64> = a.released.iter().chain(&b.released).copied().collect();
        freed.sort_unstable();
        assert_eq!(freed, [1, 2, 3], "{a:?} {b:?}");
        assert_eq!(db.health(now).await.expect("health"), healthy());
        assert_swept_once(&db).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handler_twice_sqlite() {
        the_handler_called_twice_changes_nothing_the_second_time("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handler_twice_postgres() {
        the_handler_called_twice_changes_nothing_the_second_time("postgres").await;
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_at_once_sqlite() {
        two_sweeps_at_once("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn two_at_once_postgres() {
        two_sweeps_at_once("postgres").await;
    }

    /// The example's service on its SQL queue, on the harness's clock: the same tick published
    /// twice runs twice and the second run changes nothing; then three minutes of scheduled
    /// sweeps keep the promise at every tick.
    async fn the_same_tick_twice_through_the_sql_queue(kind: &str) {
        let db = fresh_db(kind).await;
        let app = TestApp::start(hold_expiry::service(&db, &Jobs::Sql, MINUTE))
            .await
            .expect("start");
        let now = app.now();
        db.seed(now, MINUTE).await.expect("seed");
        let id = tick_job_id("expire_holds", now);
        for _ in 0..2 {
            app.publish(
                Job::new(QUEUE, &Tick { at: now })
                    .expect("encodes")
                    .kind("expire_holds")
                    .id(id.clone()),
            )
            .await
            .expect("publish");
            app.drain().await;
        }
        let runs: Vec<_> = app
            .outcomes("expire_holds")
            .into_iter()
            .map(|r| (r.job_id, r.outcome))
            .collect();
        assert_eq!(
            runs,
            [(id.clone(), Outcome::Acked), (id, Outcome::Acked)],
            "the tick ran twice"
        );
        assert_eq!(db.health(now).await.expect("health"), healthy());
        assert_swept_once(&db).await;
        for _ in 0..3 {
            app.advance(MINUTE).await;
            let ticks = hold_expiry::ticks_by_kind(&app.records());
            let last = *ticks["expire_holds"].last().expect("a sweep ran");
            assert_eq!(
                db.health(last).await.expect("health"),
                healthy(),
                "at {last}"
            );
        }
        // The hold of seat 4 expired 90 s after the start: freed by a scheduled sweep.
        let seats = db.seats().await.expect("seats");
        assert_eq!(seats[3], (4, "available".to_owned(), 2));
        let ticks = hold_expiry::ticks_by_kind(&app.records());
        assert_eq!(
            ticks["expire_holds"].len(),
            2 + 3,
            "the two published runs and one sweep a minute: {ticks:?}"
        );
        app.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn same_tick_twice_sqlite_queue() {
        the_same_tick_twice_through_the_sql_queue("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn same_tick_twice_postgres_queue() {
        the_same_tick_twice_through_the_sql_queue("postgres").await;
    }

    /// The example with its jobs on Redis (data on SQLite), live, the sweep every second: the
    /// same tick published twice, then the scheduled sweeps.
    #[ignore = "needs Redis: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn same_tick_twice_redis_queue() {
        let db = fresh_db("sqlite").await;
        let url = env_url("REDIS_URL");
        let jobs = Jobs::Redis {
            url: url.clone(),
            namespace: namespace(),
        };
        let second = Duration::from_secs(1);
        let app = TestApp::start_live(hold_expiry::service(&db, &jobs, second))
            .await
            .expect("start");
        let now = Utc::now();
        db.seed(now, second).await.expect("seed");
        let id = tick_job_id("expire_holds", now);
        for _ in 0..2 {
            app.publish(
                Job::new(QUEUE, &Tick { at: now })
                    .expect("encodes")
                    .kind("expire_holds")
                    .id(id.clone()),
            )
            .await
            .expect("publish");
            app.drain().await;
        }
        assert_eq!(db.health(now).await.expect("health"), healthy());
        assert_eq!(
            db.seats().await.expect("seats")[7],
            (8, "sold".to_owned(), 1)
        );
        app.advance(Duration::from_millis(2_500)).await;
        let ticks = hold_expiry::ticks_by_kind(&app.records());
        app.stop().await;
        let sweeps = &ticks["expire_holds"];
        let last = *sweeps.last().expect("sweeps");
        assert!(last > now, "a scheduled sweep ran: {sweeps:?}");
        assert_eq!(db.health(last).await.expect("health"), healthy());
        // Seat 4's hold expired 1.5 s after the start.
        assert_eq!(
            db.seats().await.expect("seats")[3],
            (4, "available".to_owned(), 2)
        );
        if let Jobs::Redis { url, namespace } = &jobs {
            hold_expiry::remove_keys(url, namespace)
                .await
                .expect("clean up");
        }
    }

    /// The four schedules name their kinds and queue, and the 03:00 one is in Prague.
    #[test]
    fn the_examples_schedules() {
        let s = hold_expiry::schedules(MINUTE);
        let names: Vec<_> = s.iter().map(Schedule::name).collect();
        assert_eq!(
            names,
            [
                "expire_holds",
                "reconcile_payments",
                "purge_idempotency_keys",
                "purge_outbox"
            ]
        );
        assert!(s.iter().all(|s| s.queue() == Some(QUEUE)));
        let t = DateTime::parse_from_rfc3339("2026-07-01T12:00:00Z")
            .expect("a time")
            .with_timezone(&Utc);
        let reconcile = s[1].next_after(t).expect("a tick");
        assert_eq!(reconcile.to_rfc3339(), "2026-07-02T01:00:00+00:00");
        assert_eq!(
            s[0].next_after(t).expect("a tick").to_rfc3339(),
            "2026-07-01T12:01:00+00:00"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Issue 13: clocks that disagree, a scheduler that dies mid-tick
// ---------------------------------------------------------------------------------------------

/// How [`Backend::service_with`] changes a worker's broker.
#[derive(Clone, Default)]
struct Tweak {
    /// The worker's machine clock is this far off (as libfaketime would make it).
    skew: Option<chrono::Duration>,
    /// The worker's scheduler dies at a tick, as [`DieAt`] says.
    die: Option<Arc<DieAt>>,
}

impl Tweak {
    fn attach<B: Broker>(&self, service: Service, broker: B) -> Service {
        if let Some(skew) = self.skew {
            broker.clock().set_skew(skew);
        }
        match &self.die {
            Some(die) => service.with_broker(
                Dying {
                    inner: broker,
                    die: Arc::clone(die),
                },
                mount,
            ),
            None => service.with_broker(broker, mount),
        }
    }
}

/// Where a dying scheduler stops for good: at its `nth` tick, before or after the step that
/// enqueues it. Stopping is waiting forever: nothing this worker's scheduler does comes after
/// it, as if its process were SIGKILLed there (its queue workers run on, which does not matter
/// to the tick).
struct DieAt {
    nth: usize,
    after: bool,
    ticks: std::sync::atomic::AtomicUsize,
    dead: tokio::sync::Notify,
    died: std::sync::atomic::AtomicBool,
}

impl DieAt {
    fn new(nth: usize, after: bool) -> Arc<Self> {
        Arc::new(Self {
            nth,
            after,
            ticks: Default::default(),
            dead: tokio::sync::Notify::new(),
            died: Default::default(),
        })
    }

    /// Called at a step that takes a tick: whether this is the step to die at.
    fn is_the_one(&self) -> bool {
        self.ticks.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == self.nth
    }

    async fn die(&self) -> ! {
        self.died.store(true, std::sync::atomic::Ordering::SeqCst);
        self.dead.notify_waiters();
        std::future::pending().await
    }

    async fn wait_dead(&self) {
        tokio::time::timeout(PATIENCE, async {
            while !self.died.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the scheduler reaches the tick it dies at");
    }
}

/// A broker whose scheduler dies at a tick (see [`DieAt`]); everything else is its inner
/// broker's. A tick is taken with `publish_once`, or (before issue 13) with `try_lock` on a
/// `sched:` key and then `publish`: the dying step is either.
#[derive(Clone)]
struct Dying<B> {
    inner: B,
    die: Arc<DieAt>,
}

impl<B: Broker> Inspect for Dying<B> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn connect(&self) -> Result<(), stagedoor_jobs::BrokerError> {
        self.inner.connect().await
    }

    async fn stats(
        &self,
        queue: &str,
    ) -> Result<stagedoor_jobs::QueueStats, stagedoor_jobs::BrokerError> {
        self.inner.stats(queue).await
    }

    async fn queues(&self) -> Result<Vec<String>, stagedoor_jobs::BrokerError> {
        self.inner.queues().await
    }

    async fn next_due(&self, queue: &str) -> Option<DateTime<Utc>> {
        self.inner.next_due(queue).await
    }
}

impl<B: Broker> DeadLetters for Dying<B> {
    async fn dead_letters(
        &self,
        dead: &str,
        selector: &stagedoor_jobs::DeadSelector,
        limit: usize,
    ) -> Result<Vec<stagedoor_jobs::DeadLetter>, stagedoor_jobs::BrokerError> {
        self.inner.dead_letters(dead, selector, limit).await
    }

    async fn replay(
        &self,
        dead: &str,
        selector: &stagedoor_jobs::DeadSelector,
    ) -> Result<stagedoor_jobs::ReplayReport, stagedoor_jobs::BrokerError> {
        self.inner.replay(dead, selector).await
    }

    async fn purge(
        &self,
        dead: &str,
        selector: &stagedoor_jobs::DeadSelector,
    ) -> Result<u64, stagedoor_jobs::BrokerError> {
        self.inner.purge(dead, selector).await
    }

    async fn dead_len(&self, dead: &str) -> Result<u64, stagedoor_jobs::BrokerError> {
        self.inner.dead_len(dead).await
    }

    fn default_dead_letter(&self, queue: &str) -> String {
        self.inner.default_dead_letter(queue)
    }
}

impl<B: Broker> stagedoor_jobs::broker::Records for Dying<B> {
    async fn read_record(
        &self,
        key: &str,
    ) -> Result<Option<stagedoor_jobs::broker::Record>, stagedoor_jobs::BrokerError> {
        self.inner.read_record(key).await
    }
    async fn write_records(
        &self,
        writes: &[stagedoor_jobs::broker::RecordWrite],
    ) -> Result<Option<Vec<u64>>, stagedoor_jobs::BrokerError> {
        self.inner.write_records(writes).await
    }
}

impl<B: Broker> Locks for Dying<B> {
    async fn try_lock(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, stagedoor_jobs::BrokerError> {
        let taken = self.inner.try_lock(key, token, ttl).await;
        if key.starts_with("sched:") && self.die.is_the_one() && matches!(taken, Ok(true)) {
            self.die.die().await;
        }
        taken
    }

    async fn unlock(&self, key: &str, token: &str) -> Result<(), stagedoor_jobs::BrokerError> {
        self.inner.unlock(key, token).await
    }

    async fn last_tick(
        &self,
        schedule: &str,
    ) -> Result<Option<DateTime<Utc>>, stagedoor_jobs::BrokerError> {
        self.inner.last_tick(schedule).await
    }

    async fn mark_tick(
        &self,
        schedule: &str,
        tick: DateTime<Utc>,
    ) -> Result<(), stagedoor_jobs::BrokerError> {
        self.inner.mark_tick(schedule, tick).await
    }
}

impl<B: Broker> Activity for Dying<B> {
    async fn report(
        &self,
        worker: &stagedoor_jobs::activity::WorkerReport,
        counts: &[stagedoor_jobs::activity::QueueCounts],
        ttl: Duration,
    ) -> Result<(), stagedoor_jobs::BrokerError> {
        self.inner.report(worker, counts, ttl).await
    }

    async fn workers(
        &self,
    ) -> Result<Vec<stagedoor_jobs::activity::WorkerReport>, stagedoor_jobs::BrokerError> {
        self.inner.workers().await
    }

    async fn throughput(
        &self,
        queue: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<stagedoor_jobs::activity::MinuteCounts>, stagedoor_jobs::BrokerError> {
        self.inner.throughput(queue, since).await
    }

    async fn delayed(
        &self,
        queue: &str,
        limit: usize,
    ) -> Result<Vec<stagedoor_jobs::activity::DelayedJob>, stagedoor_jobs::BrokerError> {
        self.inner.delayed(queue, limit).await
    }
}

impl<B: Broker> Broker for Dying<B> {
    type Receipt = B::Receipt;

    async fn check(
        &self,
        mounts: &[stagedoor_jobs::broker::MountInfo],
    ) -> Vec<stagedoor_jobs::broker::Problem> {
        self.inner.check(mounts).await
    }

    async fn prepare(&self, queue: &str) -> Result<(), stagedoor_jobs::BrokerError> {
        self.inner.prepare(queue).await
    }

    async fn claim(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        order: stagedoor_jobs::broker::ClaimOrder,
    ) -> Result<stagedoor_jobs::broker::Claimed<B::Receipt>, stagedoor_jobs::BrokerError> {
        self.inner.claim(queue, max, wait, order).await
    }

    async fn renew(
        &self,
        queue: &str,
        receipt: &B::Receipt,
    ) -> Result<bool, stagedoor_jobs::BrokerError> {
        self.inner.renew(queue, receipt).await
    }

    async fn settle(
        &self,
        queue: &str,
        delivery: &stagedoor_jobs::broker::Delivery<B::Receipt>,
        settlement: stagedoor_jobs::broker::Settlement,
    ) -> Result<stagedoor_jobs::broker::Settled, stagedoor_jobs::BrokerError> {
        self.inner.settle(queue, delivery, settlement).await
    }

    async fn publish(
        &self,
        queue: &str,
        jobs: Vec<(stagedoor_jobs::Envelope, Option<DateTime<Utc>>)>,
    ) -> Result<Vec<stagedoor_jobs::Published>, stagedoor_jobs::BrokerError> {
        self.inner.publish(queue, jobs).await
    }

    async fn publish_once(
        &self,
        queue: &str,
        job: (stagedoor_jobs::Envelope, Option<DateTime<Utc>>),
        guard: &str,
        ttl: Duration,
    ) -> Result<stagedoor_jobs::Published, stagedoor_jobs::BrokerError> {
        let dies = self.die.is_the_one();
        if dies && !self.die.after {
            self.die.die().await;
        }
        let out = self.inner.publish_once(queue, job, guard, ttl).await;
        if dies {
            self.die.die().await;
        }
        out
    }

    fn lease(&self) -> Duration {
        self.inner.lease()
    }

    async fn server_time(&self) -> Result<Option<DateTime<Utc>>, stagedoor_jobs::BrokerError> {
        self.inner.server_time().await
    }

    fn clock(&self) -> stagedoor_jobs::Clock {
        self.inner.clock()
    }

    fn use_clock(&self, clock: &stagedoor_jobs::Clock) -> bool {
        self.inner.use_clock(clock)
    }
}

/// A scheduler dies at its second tick, before or after the step that enqueues it; a second
/// worker started then catches the tick up (it is the latest missed one): the tick runs once.
/// Before issue 13 the tick's lock was taken first and the job published after it: a worker
/// dying between the two held the lock for an hour and the tick never ran.
async fn a_scheduler_dying_mid_tick_loses_no_tick(kind: &str, after: bool) {
    let backend = Backend::fresh(kind).await;
    let seen = Arc::new(Seen::default());
    let every = || vec![Schedule::every("every_2s", Duration::from_secs(2)).on(QUEUE)];
    let die = DieAt::new(2, after);
    let dying = backend
        .service_with(
            "dying",
            &seen,
            every(),
            &Tweak {
                die: Some(Arc::clone(&die)),
                ..Tweak::default()
            },
        )
        .start()
        .await
        .expect("the dying worker starts");
    die.wait_dead().await;
    let second = backend
        .service("second", &seen, every())
        .start()
        .await
        .expect("the second worker starts");
    // The dying tick, then two more by the second worker.
    let ticks = |seen: &Seen| seen.ticks("every_2s");
    eventually("four ticks ran", PATIENCE, || {
        let t = ticks(&seen);
        async move { t.len() >= 4 }
    })
    .await;
    // The dying worker's scheduler never returns: its shutdown stops it 1 s after the deadline.
    stop_all(vec![second, dying]).await;
    let t = ticks(&seen);
    let mut unique = t.clone();
    unique.dedup();
    assert_eq!(unique.len(), t.len(), "{kind}: a tick ran twice: {t:?}");
    assert!(
        t.windows(2)
            .all(|w| w[1] - w[0] == chrono::Duration::seconds(2)),
        "{kind}: a tick is missing (the one the first worker died at, {}): {t:?}",
        if after {
            "after enqueueing it"
        } else {
            "before enqueueing it"
        }
    );
}

mod a_scheduler_dying_mid_tick {
    macro_rules! rows {
        ($($name:ident: $kind:literal $(#[$attr:meta])*),*) => {$(
            mod $name {
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn before_the_enqueue() {
                    super::super::a_scheduler_dying_mid_tick_loses_no_tick($kind, false).await;
                }
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn after_the_enqueue() {
                    super::super::a_scheduler_dying_mid_tick_loses_no_tick($kind, true).await;
                }
            }
        )*};
    }
    rows!(
        memory: "memory",
        sqlite: "sqlite",
        postgres: "postgres" #[ignore = "needs Postgres: run scripts/test-all"],
        redis: "redis" #[ignore = "needs Redis: run scripts/test-all"],
        redis_cluster: "cluster" #[ignore = "needs a Redis Cluster: run scripts/test-all"]
    );
}

/// One of two workers has its clock 3 s fast. Ticks and due times come from the backend's
/// clock, so no tick's job runs before its tick (by the real clock), no tick runs twice or goes
/// missing, and a job the fast worker publishes to run in 2 s does not run sooner. Before issue
/// 13 the fast worker enqueued every tick about 3 s early.
async fn a_fast_clock_runs_nothing_early(kind: &str) {
    let backend = Backend::fresh(kind).await;
    let seen = Arc::new(Seen::default());
    let every = || vec![Schedule::every("every_1s", Duration::from_secs(1)).on(QUEUE)];
    let fast = backend
        .service_with(
            "fast",
            &seen,
            every(),
            &Tweak {
                skew: Some(chrono::Duration::seconds(3)),
                ..Tweak::default()
            },
        )
        .start()
        .await
        .expect("the fast worker starts");
    let normal = backend
        .service("normal", &seen, every())
        .start()
        .await
        .expect("the normal worker starts");
    let mut delayed = Vec::new();
    for i in 0..5 {
        let published = Utc::now();
        let id = format!("delayed-{i}");
        fast.publish(
            Job::new(QUEUE, &json!({ "i": i }))
                .expect("json")
                .kind("delayed")
                .id(stagedoor_jobs::JobId::from_string(id.clone()))
                .after(Duration::from_secs(2)),
        )
        .await
        .expect("publish");
        delayed.push((id, published));
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_all(vec![fast, normal]).await;
    // Within the offset measurement (half a round trip on loopback) and the timestamps' rounding.
    let slack = chrono::Duration::milliseconds(150);
    let runs = seen.runs();
    for (id, published) in &delayed {
        let ran: Vec<_> = runs.iter().filter(|(r, _)| r == id).collect();
        assert_eq!(ran.len(), 1, "{kind}: {id} ran {} times", ran.len());
        let early = *published + chrono::Duration::seconds(2) - ran[0].1;
        assert!(
            early < slack,
            "{kind}: {id}, published to run in 2 s, ran {} ms early",
            early.num_milliseconds()
        );
    }
    let mut ticks = 0;
    for (id, at) in &runs {
        let Some(tick) = hold_expiry::tick_of(id) else {
            continue;
        };
        ticks += 1;
        assert!(
            tick - *at < slack,
            "{kind}: the tick {tick} ran {} ms early",
            (tick - *at).num_milliseconds()
        );
    }
    assert!(ticks >= 5, "{kind}: only {ticks} ticks ran: {runs:?}");
    let t = seen.ticks("every_1s");
    let mut unique = t.clone();
    unique.dedup();
    assert_eq!(unique.len(), t.len(), "{kind}: a tick ran twice: {t:?}");
}

mod a_fast_clock {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        super::a_fast_clock_runs_nothing_early("sqlite").await;
    }
    #[ignore = "needs Postgres: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        super::a_fast_clock_runs_nothing_early("postgres").await;
    }
    #[ignore = "needs Redis: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis() {
        super::a_fast_clock_runs_nothing_early("redis").await;
    }
    #[ignore = "needs a Redis Cluster: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_cluster() {
        super::a_fast_clock_runs_nothing_early("cluster").await;
    }
}
