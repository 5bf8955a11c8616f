//! Crashes on the Redis backend: a worker process dies inside a handler, and nothing is lost.
//!
//! The worker is a child process: this test binary run again with the `crash_child` filter and
//! the environment naming its namespace and what its handler does (`crash_child` is a no-op in a
//! normal run). Each handler call first appends a mark (job, attempt, process, time) to a list of
//! the test's namespace, so the parent sees which deliveries happened, in which process, even in
//! one that died.
//!
//! - [`a_worker_killed_inside_a_handler_loses_nothing`]: the child hangs in a handler and is
//!   SIGKILLed; after the lease another worker reclaims the entry (XAUTOCLAIM) and runs it with
//!   its attempt one higher, and every job completes.
//! - [`a_job_that_kills_its_workers_ends_in_the_dead_stream`]: a job whose handler aborts the
//!   process on every delivery: child workers are started until it is in the dead stream; it
//!   gets there after 3 deliveries (the default `max_deliveries`), without a 4th run, and every
//!   other job published with it completes.
//!
//! Both run on `REDIS_URL` (under `scripts/test-all`).

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use redis::{Value, cmd};
use serde::{Deserialize, Serialize};
use stagedoor_jobs::broker::{DeadLetters, Inspect};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{Broker, DeadSelector, Running};
use stagedoor_jobs_redis::{RedisBroker, Stream};

/// The lease of every worker here: a dead worker's entry is reclaimable after it.
const LEASE: Duration = Duration::from_millis(500);
/// The stream.
const QUEUE: &str = "jobs";
/// Its dead stream.
const DEAD: &str = "jobs:dead";
/// The kind of every job here.
const KIND: &str = "render_tickets";
/// The mount's cap: above the broker's max_deliveries (3), so that the broker's delivery count
/// is what contains the job that kills its workers.
const CAP: u32 = 5;
/// What the child's handler does with the victim: `Hang` or `Abort`.
const ENV_MODE: &str = "STAGEDOOR_REDIS_CRASH_MODE";
/// The child's namespace.
const ENV_NS: &str = "STAGEDOOR_REDIS_CRASH_NS";
/// How long the parent waits for something a child does.
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Msg {
    n: u64,
    /// The job whose handler hangs or aborts.
    victim: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The victim's handler sleeps for an hour (until the process is killed).
    Hang,
    /// The victim's handler aborts the process.
    Abort,
    /// Every handler acks (the surviving worker).
    Ack,
}

fn redis_url() -> String {
    match std::env::var("REDIS_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "REDIS_URL is not set: run the tests with `scripts/test-all -- cargo test --workspace --test redis_crash -- --include-ignored`, which starts Redis and exports it"
        ),
    }
}

fn fresh_namespace() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("rc{}-{}:", std::process::id(), nanos % 1_000_000_000_000)
}

/// What a test (or its child) needs: its namespace and a plain connection.
#[derive(Clone)]
struct Fx {
    ns: String,
    conn: redis::aio::MultiplexedConnection,
}

impl Fx {
    async fn new(ns: String) -> Self {
        let url = redis_url();
        let conn = redis::Client::open(url.as_str())
            .expect("REDIS_URL is a URL")
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
        Self { ns, conn }
    }

    fn key(&self, suffix: &str) -> String {
        format!("{{{}{QUEUE}}}{suffix}", self.ns)
    }

    fn marks_key(&self) -> String {
        format!("{}marks", self.ns)
    }

    async fn q<T: redis::FromRedisValue>(&self, c: &redis::Cmd) -> T {
        let mut conn = self.conn.clone();
        c.query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{c:?}: {e}"))
    }

    fn broker(&self) -> RedisBroker {
        RedisBroker::from_url(redis_url())
            .namespace(&self.ns)
            .lease(LEASE)
    }

    async fn xlen(&self, suffix: &str) -> i64 {
        self.q(cmd("XLEN").arg(self.key(suffix))).await
    }

    /// `(consumer, idle ms, deliveries)` of every pending entry.
    async fn pending(&self) -> Vec<(String, i64, i64)> {
        let v: Value = self
            .q(cmd("XPENDING")
                .arg(self.key(""))
                .arg("stagedoor")
                .arg("-")
                .arg("+")
                .arg(100))
            .await;
        let Value::Array(entries) = v else {
            panic!("XPENDING: {v:?}")
        };
        entries
            .iter()
            .map(|e| match e {
                Value::Array(f) => match f.as_slice() {
                    [_, consumer, idle, n] => (
                        redis::from_redis_value_ref(consumer).expect("a consumer"),
                        redis::from_redis_value_ref(idle).expect("idle ms"),
                        redis::from_redis_value_ref(n).expect("deliveries"),
                    ),
                    other => panic!("an XPENDING entry: {other:?}"),
                },
                other => panic!("an XPENDING entry: {other:?}"),
            })
            .collect()
    }

    /// Records a delivery: `n attempt pid at_ms`.
    async fn mark(&self, n: u64, attempt: u32) {
        let _: i64 = self
            .q(cmd("RPUSH").arg(self.marks_key()).arg(format!(
                "{n} {attempt} {} {}",
                std::process::id(),
                Utc::now().timestamp_millis()
            )))
            .await;
    }

    /// `(attempt, pid, at_ms)` of every delivery of message `n`, in order.
    async fn marks_of(&self, n: u64) -> Vec<(u32, u32, i64)> {
        let all: Vec<String> = self
            .q(cmd("LRANGE").arg(self.marks_key()).arg(0).arg(-1))
            .await;
        all.iter()
            .filter_map(|m| {
                let f: Vec<i64> = m.split(' ').map(|x| x.parse().expect("a number")).collect();
                (f[0] == n as i64).then(|| (f[1] as u32, f[2] as u32, f[3]))
            })
            .collect()
    }

    async fn marks(&self) -> i64 {
        self.q(cmd("LLEN").arg(self.marks_key())).await
    }
}

/// What the handler needs.
struct Crash {
    fx: Fx,
    mode: Mode,
}

/// Marks the delivery, then hangs, aborts or acks.
async fn crashes(
    msg: &Msg,
    Data(c): Data<Arc<Crash>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    c.fx.mark(msg.n, attempt.expect("Redis counts attempts"))
        .await;
    if msg.victim {
        match c.mode {
            Mode::Hang => tokio::time::sleep(Duration::from_secs(3600)).await,
            Mode::Abort => std::process::abort(),
            Mode::Ack => {}
        }
    }
    HandlerOutcome::ack()
}

/// A worker: one handler at a time (a dying worker takes only the victim with it), a lease of
/// [`LEASE`], the default max_deliveries (3).
fn worker(fx: &Fx, mode: Mode) -> Service {
    let crash = Arc::new(Crash {
        fx: fx.clone(),
        mode,
    });
    Service::new(AppInfo::new("redis-crash", "0.1.0"))
        .state(crash)
        .shutdown_timeout(Duration::from_secs(5))
        .with_broker(fx.broker(), |b| {
            b.include(Subscriber::new(Stream::new(QUEUE).kind(KIND), crashes).name("crashes"))
                .max_attempts(stagedoor_jobs::nonzero!(CAP))
                .dead_letter(DEAD)
                .concurrency(1);
        })
}

/// Publishes the victim first (so a worker claims it first), then messages 1..=5.
async fn publish_jobs(fx: &Fx) -> JobId {
    let broker = fx.broker();
    broker.connect().await.expect("connect");
    let mut jobs = Vec::new();
    for n in 0..=5 {
        let job = Job::new(QUEUE, &Msg { n, victim: n == 0 })
            .expect("encodes")
            .kind(KIND);
        let (_, envelope, at) = job.into_parts(Utc::now());
        jobs.push((envelope, at));
    }
    let victim = jobs[0].0.id().clone();
    for j in jobs {
        broker.publish(QUEUE, vec![j]).await.expect("publish");
    }
    victim
}

/// Polls `cond` until it holds, at most `patience`.
async fn eventually<F, Fu>(what: &str, patience: Duration, mut cond: F)
where
    F: FnMut() -> Fu,
    Fu: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + patience;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {patience:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A child worker process; killed (if still running) when dropped.
struct ChildWorker(Child);

impl ChildWorker {
    fn spawn(fx: &Fx, mode: Mode) -> Self {
        let exe = std::env::current_exe().expect("the test binary");
        let child = Command::new(exe)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env(ENV_NS, &fx.ns)
            .env(ENV_MODE, format!("{mode:?}"))
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn a child worker");
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Waits for the child to exit, at most [`PATIENCE`].
    async fn exit(&mut self) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.0.try_wait().expect("the child's status") {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the child worker did not exit within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ChildWorker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The child worker: runs until the stream is empty (or until it is killed, or aborts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let Ok(mode) = std::env::var(ENV_MODE) else {
        return;
    };
    let mode = match mode.as_str() {
        "Hang" => Mode::Hang,
        "Abort" => Mode::Abort,
        other => panic!("unknown mode {other}"),
    };
    let fx = Fx::new(std::env::var(ENV_NS).expect("the child's namespace")).await;
    let running: Running = worker(&fx, mode)
        .start()
        .await
        .unwrap_or_else(|e| panic!("the child worker starts: {e}"));
    // Every entry acked or dead-lettered is deleted from the stream.
    eventually("the stream is empty", Duration::from_secs(120), || async {
        fx.xlen("").await == 0
    })
    .await;
    running.shutdown().await;
}

/// A worker SIGKILLed inside a handler: after the lease another worker reclaims the entry and
/// runs it, attempt one higher; every job completes.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_inside_a_handler_loses_nothing() {
    let fx = Fx::new(fresh_namespace()).await;
    let victim = publish_jobs(&fx).await;

    let mut child = ChildWorker::spawn(&fx, Mode::Hang);
    let child_pid = child.pid();
    eventually(
        "the child is inside the victim's handler",
        PATIENCE,
        || async { !fx.marks_of(0).await.is_empty() },
    )
    .await;
    child.0.kill().expect("SIGKILL the child");
    let status = child.exit().await;
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status}");
    let killed_at = Utc::now().timestamp_millis();
    let pending = fx.pending().await;
    assert_eq!(pending.len(), 1, "the victim is pending: {pending:?}");
    let (consumer, idle, deliveries) = pending[0].clone();
    assert!(
        consumer.contains(&format!("-{child_pid}-")),
        "with the dead child's consumer: {consumer}"
    );
    assert_eq!(deliveries, 1, "delivered once");
    // The lease ends `LEASE` after the dead worker's last renewal (its idle time started then).
    let lease_end = killed_at - idle + LEASE.as_millis() as i64;
    assert_eq!(fx.marks().await, 1, "the child ran only the victim");
    assert_eq!(fx.xlen("").await, 6, "nothing is lost");

    let running = worker(&fx, Mode::Ack)
        .start()
        .await
        .unwrap_or_else(|e| panic!("the surviving worker starts: {e}"));
    eventually("every job completed", PATIENCE, || async {
        fx.xlen("").await == 0
    })
    .await;
    running.shutdown().await;

    let me = std::process::id();
    let marks = fx.marks_of(0).await;
    assert_eq!(
        marks.iter().map(|(a, p, _)| (*a, *p)).collect::<Vec<_>>(),
        [(1, child_pid), (2, me)],
        "reclaimed and run again, attempt one higher, by the other worker"
    );
    assert!(
        marks[1].2 >= lease_end - 5,
        "not before the dead worker's lease ended: {marks:?}, lease until {lease_end}"
    );
    for n in 1..=5 {
        let m = fx.marks_of(n).await;
        assert_eq!(
            m.iter().map(|(a, p, _)| (*a, *p)).collect::<Vec<_>>(),
            [(1, me)],
            "message {n} ran once"
        );
    }
    assert!(fx.pending().await.is_empty(), "nothing pending");
    assert_eq!(fx.xlen(":dead").await, 0, "nothing dead");
    let _ = victim;
}

/// A job that aborts its worker process on every delivery: after its 3 deliveries (the default
/// max_deliveries) it is dead-lettered on its next claim without running; every other job
/// completes.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_kills_its_workers_ends_in_the_dead_stream() {
    let fx = Fx::new(fresh_namespace()).await;
    let victim = publish_jobs(&fx).await;

    let mut statuses = Vec::new();
    let dead_lettered =
        |fx: Fx| async move { fx.xlen(":dead").await == 1 && fx.xlen("").await == 0 };
    for _ in 0..8 {
        let mut child = ChildWorker::spawn(&fx, Mode::Abort);
        statuses.push(child.exit().await);
        if dead_lettered(fx.clone()).await {
            break;
        }
    }
    assert!(
        dead_lettered(fx.clone()).await,
        "the victim is in the dead stream and the stream is empty after {} workers: {statuses:?}",
        statuses.len()
    );
    let aborted = statuses.iter().filter(|s| s.signal() == Some(6)).count();
    assert_eq!(
        aborted, 3,
        "3 workers died in the victim's handler: {statuses:?}"
    );
    assert!(
        statuses.last().is_some_and(ExitStatus::success),
        "the last worker dead-lettered the victim and finished: {statuses:?}"
    );

    let runs: Vec<u32> = fx.marks_of(0).await.iter().map(|m| m.0).collect();
    assert_eq!(runs, [1, 2, 3], "3 deliveries ran; no 4th");
    for n in 1..=5 {
        let m = fx.marks_of(n).await;
        assert_eq!(m.len(), 1, "message {n} ran once: {m:?}");
    }
    assert!(fx.pending().await.is_empty(), "nothing pending");

    let broker = fx.broker();
    broker.connect().await.expect("connect");
    let letters = broker
        .dead_letters(DEAD, &DeadSelector::All, 10)
        .await
        .expect("list");
    assert_eq!(letters.len(), 1, "only the victim: {letters:?}");
    let d = &letters[0];
    assert_eq!(d.envelope.id(), &victim);
    assert_eq!(d.origin, QUEUE);
    assert_eq!(d.attempts, 3, "3 deliveries spent");
    assert!(
        d.error.contains("delivered 4 times") && d.error.contains("max_deliveries 3"),
        "the error says it was delivered too many times: {:?}",
        d.error
    );
}
