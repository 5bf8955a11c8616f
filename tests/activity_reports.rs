//! What a running service reports through its backend (issue 15): a service with a handler that
//! succeeds and one that always fails runs on SQLite, on Redis (real servers) and on the memory
//! broker; its worker is then listed by `workers()` with its queues, `throughput` shows the
//! processed, failed and dead counts, and after the service stops its report is gone. A report
//! the backend refuses is logged once and its counts go with the next report that succeeds.
//!
//! Servers come from `scripts/test-all` (`REDIS_URL`); a missing variable fails the test. Every
//! test has its own SQLite file or Redis namespace.

mod common;
#[allow(dead_code)]
mod common_redis;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use common::{ConfRow, SQLITE_CONF_SCHEMA, fresh_sqlite_url};
use sqlx::Connection;
use stagedoor_jobs::activity::{MinuteCounts, WorkerReport};
use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{Activity, Broker, Running};
use stagedoor_jobs_redis::RedisBroker;
use stagedoor_jobs_sqlx::SqlxBroker;

const GOOD: &str = "act_good";
const BAD: &str = "act_bad";
/// How long a test waits for a report to show something: more than two reports
/// (`REPORT_EVERY` is 5 s).
const PATIENCE: Duration = Duration::from_secs(15);

#[derive(Default)]
struct Ran(AtomicUsize);

async fn succeeds(_: &serde_json::Value, Data(ran): Data<Arc<Ran>>) -> HandlerOutcome {
    ran.0.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::ack()
}

async fn fails(_: &serde_json::Value, Data(ran): Data<Arc<Ran>>) -> HandlerOutcome {
    ran.0.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::retry()
}

fn service<B: Broker>(broker: B, ran: &Arc<Ran>) -> Service {
    let dead = broker.default_dead_letter(BAD);
    Service::new(AppInfo::new("activity-test", "9.9.9"))
        .state(Arc::clone(ran))
        // Never due during the test: reported, enqueues nothing.
        .schedule(
            Schedule::every("act_daily", Duration::from_secs(86_400))
                .on(GOOD)
                .missed(Missed::Skip),
        )
        .with_broker(broker, move |b| {
            b.include(Subscriber::new(GOOD, succeeds).name("succeeds"))
                .concurrency(3);
            b.include(Subscriber::new(BAD, fails).name("fails"))
                .max_attempts(nonzero!(2u32))
                .dead_letter(dead.clone());
        })
}

/// Polls `broker` until `check` finds what it looks for in the workers it lists.
async fn wait_for<B: Activity>(
    broker: &B,
    what: &str,
    mut check: impl FnMut(&[WorkerReport]) -> bool,
) -> Vec<WorkerReport> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let workers = broker.workers().await.expect("workers()");
        if check(&workers) {
            return workers;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}; workers: {workers:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The counts of `queue` over the last hour, added up.
async fn totals<B: Activity>(broker: &B, queue: &str) -> (u64, u64, u64) {
    let since = Utc::now() - chrono::Duration::hours(1);
    let minutes: Vec<MinuteCounts> = broker.throughput(queue, since).await.expect("throughput");
    minutes.iter().fold((0, 0, 0), |(p, f, d), m| {
        (p + m.processed, f + m.failed, d + m.dead)
    })
}

/// Runs the service on `broker` (`direct`: a connected clone for reading), publishes 4 jobs
/// that succeed and 1 that fails twice and is dead-lettered, and checks what the reports show.
async fn reports_on<B: Broker>(broker: B, direct: B) {
    let ran = Arc::new(Ran::default());
    let running: Running = service(broker, &ran)
        .start()
        .await
        .expect("the service starts");

    let started = wait_for(&direct, "the worker's first report is listed", |w| {
        w.iter().any(|r| r.app == "activity-test 9.9.9")
    })
    .await;
    let me = started
        .iter()
        .find(|r| r.app == "activity-test 9.9.9")
        .expect("listed")
        .clone();
    assert_eq!(me.pid, std::process::id());
    assert!(!me.host.is_empty(), "{me:?}");
    let good = me
        .queues
        .iter()
        .find(|q| q.queue == GOOD)
        .unwrap_or_else(|| panic!("queue {GOOD} is reported: {me:?}"));
    assert_eq!(good.subscribers, ["succeeds"]);
    assert_eq!(good.concurrency, 3);
    let bad = me
        .queues
        .iter()
        .find(|q| q.queue == BAD)
        .unwrap_or_else(|| panic!("queue {BAD} is reported: {me:?}"));
    assert_eq!(bad.subscribers, ["fails"]);

    for n in 0..4 {
        running
            .publish(Job::new(GOOD, &serde_json::json!({ "n": n })).expect("job"))
            .await
            .expect("publish");
    }
    running
        .publish(Job::new(BAD, &serde_json::json!({ "n": 9 })).expect("job"))
        .await
        .expect("publish");

    // 4 successes and 2 failed attempts, the second dead-lettered.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while ran.0.load(Ordering::SeqCst) < 6 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the jobs did not run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The next report carries the counts (within REPORT_EVERY).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let got = (totals(&direct, GOOD).await, totals(&direct, BAD).await);
        if got == ((4, 0, 0), (0, 2, 1)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "throughput (processed, failed, dead) of {GOOD} and {BAD}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let renewed = wait_for(&direct, "a later report renews the heartbeat", |w| {
        w.iter()
            .any(|r| r.id == me.id && r.heartbeat_at > me.heartbeat_at)
    })
    .await;
    let now = renewed.iter().find(|r| r.id == me.id).expect("listed");
    assert_eq!(now.started_at, me.started_at, "the same service start");
    let [schedule] = &now.schedules[..] else {
        panic!("one schedule is reported: {now:?}");
    };
    assert_eq!(
        (schedule.name.as_str(), schedule.queue.as_str()),
        ("act_daily", GOOD)
    );
    assert_eq!(
        (schedule.when.as_str(), schedule.missed.as_str()),
        ("every 1d", "skip")
    );
    assert_eq!(schedule.last_tick, None, "no tick yet");
    let next = schedule.next_tick.expect("the next tick is reported");
    assert!(
        next > now.heartbeat_at && next <= now.heartbeat_at + chrono::Duration::days(1),
        "{schedule:?}"
    );
    assert!(
        now.queues.iter().all(|q| q.in_flight == 0),
        "nothing runs now: {now:?}"
    );

    running.shutdown().await;
    wait_for(&direct, "the stopped worker's report is gone", |w| {
        w.iter().all(|r| r.id != me.id)
    })
    .await;
    assert_eq!(
        totals(&direct, GOOD).await,
        (4, 0, 0),
        "the counts stay after the worker is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_on_sqlite_reports_its_worker_and_counts() {
    let url = fresh_sqlite_url("activity");
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("create the database");
    sqlx::raw_sql(SQLITE_CONF_SCHEMA)
        .execute(&mut conn)
        .await
        .expect("create the table");
    conn.close().await.expect("close");
    let broker = SqlxBroker::from_url(url, sqlx::sqlite::SqlitePoolOptions::new())
        .poll_interval(Duration::from_millis(20));
    let route = broker.route::<ConfRow>("cf");
    let direct = route.clone();
    direct.connect().await.expect("connect");
    reports_on(route, direct).await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_on_redis_reports_its_worker_and_counts() {
    let ns = common_redis::fresh_namespace("act");
    let broker = RedisBroker::from_url(common_redis::env_url("REDIS_URL")).namespace(ns);
    let direct = broker.clone();
    direct.connect().await.expect("connect");
    reports_on(broker, direct).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_on_the_memory_broker_reports_its_worker_and_counts() {
    let broker = MemoryBroker::new();
    reports_on(broker.clone(), broker).await;
}

/// The messages of the reporter's events, with their level.
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<(tracing::Level, String)>>>);

impl Logged {
    fn count(&self, level: tracing::Level, starts: &str) -> usize {
        self.0
            .lock()
            .expect("log lock")
            .iter()
            .filter(|(l, m)| *l == level && m.starts_with(starts))
            .count()
    }
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Logged {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        if m.0.contains("worker report") {
            self.0
                .lock()
                .expect("log lock")
                .push((*event.metadata().level(), m.0));
        }
    }
}

/// A report the backend refuses (SQLite's `stagedoor_workers` has the wrong columns) is
/// logged once as a warning, then at debug level; its counts are sent again with the next
/// report, which the fixed table takes.
#[test]
fn a_failed_report_warns_once_and_keeps_its_counts() {
    use tracing_subscriber::layer::SubscriberExt;
    const FAILED: &str = "the worker report failed";
    let logged = Logged::default();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::Registry::default().with(logged.clone()),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let url = fresh_sqlite_url("activity_failing");
        let mut conn = sqlx::SqliteConnection::connect(&url)
            .await
            .expect("create the database");
        sqlx::raw_sql(SQLITE_CONF_SCHEMA)
            .execute(&mut conn)
            .await
            .expect("create the table");
        sqlx::raw_sql("CREATE TABLE stagedoor_workers (unrelated INTEGER)")
            .execute(&mut conn)
            .await
            .expect("create the wrong table");
        let broker = SqlxBroker::from_url(url, sqlx::sqlite::SqlitePoolOptions::new())
            .poll_interval(Duration::from_millis(20));
        let route = broker.route::<ConfRow>("cf");
        let direct = route.clone();
        let ran = Arc::new(Ran::default());
        let running = service(route, &ran).start().await.expect("starts");
        direct.connect().await.expect("connect");
        for n in 0..2 {
            running
                .publish(Job::new(GOOD, &serde_json::json!({ "n": n })).expect("job"))
                .await
                .expect("publish");
        }
        // Two failed reports (at start and 5 s later).
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while logged.count(tracing::Level::WARN, FAILED) + logged.count(tracing::Level::DEBUG, FAILED)
            < 2
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no second failed report: {:?}",
                logged.0.lock().expect("log lock")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(ran.0.load(Ordering::SeqCst), 2, "the jobs ran meanwhile");
        assert_eq!(
            logged.count(tracing::Level::WARN, FAILED),
            1,
            "one warning for the whole outage: {:?}",
            logged.0.lock().expect("log lock")
        );
        assert_eq!(totals(&direct, GOOD).await, (0, 0, 0), "nothing stored yet");

        sqlx::raw_sql(
            "DROP TABLE stagedoor_workers; CREATE TABLE stagedoor_workers (worker_id TEXT PRIMARY KEY, report TEXT NOT NULL, until_at TIMESTAMPTZ NOT NULL)",
        )
        .execute(&mut conn)
        .await
        .expect("fix the table");
        conn.close().await.expect("close");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while totals(&direct, GOOD).await != (2, 0, 0) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the counts of the failed reports were not sent with a later one: {:?}",
                totals(&direct, GOOD).await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            direct
                .workers()
                .await
                .expect("workers")
                .iter()
                .any(|w| w.app == "activity-test 9.9.9"),
            "the worker is listed again"
        );
        assert_eq!(
            logged.count(tracing::Level::INFO, "worker reports stored again"),
            1
        );
        running.shutdown().await;
    });
}
