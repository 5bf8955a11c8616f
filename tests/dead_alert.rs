//! The dead-letter alert pages once per incident across workers (issue 12, item 11): two
//! services (two workers) on the same backend, each with an `on_dead_letter` hook counting pages
//! into one counter; a dead letter going from empty to not empty is one page in total, and after
//! a purge, the next dead letter is one more. On memory, SQLite, Postgres, Redis and a Redis
//! Cluster.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{ConfRow, PG_CONF_SCHEMA, SQLITE_CONF_SCHEMA, fresh_sqlite_url, postgres_url};
use sqlx::Connection;
use stagedoor_jobs::broker::Broker;
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{DeadSelector, Running};
use stagedoor_jobs_redis::RedisBroker;
use stagedoor_jobs_sqlx::SqlxBroker;

const QUEUE: &str = "alerts";
/// How often each worker's monitor samples the dead letter.
const INTERVAL: Duration = Duration::from_millis(50);
/// Long enough for both monitors to sample several times (20 intervals).
const SETTLE: Duration = Duration::from_secs(1);

#[derive(serde::Serialize, serde::Deserialize)]
struct Order {
    n: u64,
}

async fn fails(_order: &Order) -> HandlerOutcome {
    HandlerOutcome::retry()
}

async fn worker<B: Broker>(name: &str, broker: B, dead: &str, pages: &Arc<AtomicUsize>) -> Running {
    let pages = Arc::clone(pages);
    Service::new(AppInfo::new(name, "0.1.0"))
        .metrics_interval(INTERVAL)
        .on_dead_letter(move |_| {
            pages.fetch_add(1, Ordering::SeqCst);
        })
        .with_broker(broker, |b| {
            b.include(Subscriber::new(QUEUE, fails).name("fails"))
                .max_attempts(nonzero!(1u32))
                .dead_letter(dead);
        })
        .start()
        .await
        .unwrap_or_else(|e| panic!("worker {name} starts: {e}"))
}

async fn wait_for(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two workers on `a` and `b` (two brokers of one backend, the same queues).
async fn one_page_per_incident<B: Broker>(a: B, b: B) {
    let dead = a.default_dead_letter(QUEUE);
    let direct = a.clone();
    direct.connect().await.expect("connect");
    let pages = Arc::new(AtomicUsize::new(0));
    let first = worker("worker-1", a, &dead, &pages).await;
    let second = worker("worker-2", b, &dead, &pages).await;
    // Both monitors see the dead letter empty before anything fails.
    tokio::time::sleep(SETTLE).await;
    assert_eq!(pages.load(Ordering::SeqCst), 0, "nothing to page yet");

    for incident in 1..=2usize {
        first
            .publish(Job::new(QUEUE, &Order { n: incident as u64 }).expect("encode"))
            .await
            .expect("publish");
        wait_for("the job is dead-lettered", async || {
            direct.dead_len(&dead).await.unwrap_or(0) == 1
        })
        .await;
        wait_for("a page", async || pages.load(Ordering::SeqCst) >= incident).await;
        // Both monitors have seen the dead letter go from empty to 1 by now.
        tokio::time::sleep(SETTLE).await;
        assert_eq!(
            pages.load(Ordering::SeqCst),
            incident,
            "incident {incident}: one page across the two workers"
        );
        // The operator deals with it: the dead letter is empty again, and both monitors see it.
        let purged = direct
            .purge(&dead, &DeadSelector::All)
            .await
            .expect("purge");
        assert_eq!(purged, 1);
        tokio::time::sleep(SETTLE).await;
    }
    assert_eq!(pages.load(Ordering::SeqCst), 2, "two incidents, two pages");
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_two_workers_page_once_per_incident() {
    let broker = MemoryBroker::new();
    one_page_per_incident(broker.clone(), broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_two_workers_page_once_per_incident() {
    let url = fresh_sqlite_url("dead-alert");
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("create the database");
    sqlx::raw_sql(SQLITE_CONF_SCHEMA)
        .execute(&mut conn)
        .await
        .expect("create the table");
    conn.close().await.expect("close");
    let route = || {
        SqlxBroker::from_url(url.clone(), sqlx::sqlite::SqlitePoolOptions::new())
            .poll_interval(Duration::from_millis(20))
            .route::<ConfRow>(QUEUE)
    };
    one_page_per_incident(route(), route()).await;
}

#[ignore = "needs Postgres: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_workers_page_once_per_incident() {
    let url = postgres_url();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let schema = format!("alert_{}_{}", std::process::id(), nanos % 1_000_000_000);
    let mut conn = sqlx::PgConnection::connect(&url)
        .await
        .expect("connect to DATABASE_URL");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {schema}; SET search_path TO {schema}; {PG_CONF_SCHEMA}"
    )))
    .execute(&mut conn)
    .await
    .expect("create the schema and table");
    conn.close().await.expect("close");
    let route = || {
        let search_path = schema.clone();
        let options = sqlx::postgres::PgPoolOptions::new()
            .max_connections(5)
            .after_connect(move |conn, _| {
                let sql = format!("SET search_path TO {search_path}");
                Box::pin(async move {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(conn)
                        .await?;
                    Ok(())
                })
            });
        SqlxBroker::from_url(url.clone(), options)
            .poll_interval(Duration::from_millis(50))
            .route::<ConfRow>(QUEUE)
    };
    one_page_per_incident(route(), route()).await;
}

fn redis_url(var: &str) -> String {
    match std::env::var(var) {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "{var} is not set: run the tests with `scripts/test-all`, which starts Redis and exports it"
        ),
    }
}

fn namespace() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("alert{}-{}:", std::process::id(), nanos % 1_000_000_000)
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_two_workers_page_once_per_incident() {
    let ns = namespace();
    let broker = || RedisBroker::from_url(redis_url("REDIS_URL")).namespace(ns.clone());
    one_page_per_incident(broker(), broker()).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_two_workers_page_once_per_incident() {
    let ns = namespace();
    let urls: Vec<String> = redis_url("REDIS_CLUSTER_URLS")
        .split(',')
        .map(str::to_owned)
        .collect();
    let broker = || RedisBroker::cluster(urls.clone()).namespace(ns.clone());
    one_page_per_incident(broker(), broker()).await;
}
