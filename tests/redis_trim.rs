//! How settled entries leave a queue's stream on Redis 7: trimmed below the group's oldest
//! pending entry, deleted one by one once they sit more than about a second of entry time
//! above it, and counted out of `ready` meanwhile; and a batch of settlements, each fenced.

use std::time::Duration;

use chrono::Utc;
use redis::cmd;
use stagedoor_jobs::broker::{Broker, Inspect, Settled, Settlement};
use stagedoor_jobs::{Envelope, Failure, FailureCause, JobId};
use stagedoor_jobs_redis::RedisBroker;

/// `REDIS_URL`; a missing one fails the test.
fn redis_url() -> String {
    match std::env::var("REDIS_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "REDIS_URL is not set: run the tests with `scripts/test-all -- cargo test --workspace --test redis_trim -- --include-ignored`"
        ),
    }
}

const QUEUE: &str = "trim";

async fn setup() -> (RedisBroker, redis::aio::MultiplexedConnection) {
    let url = redis_url();
    let broker = RedisBroker::from_url(&url).namespace(format!("trim{}:", uuid_like()));
    broker.connect().await.expect("connect");
    broker.prepare(QUEUE).await.expect("prepare");
    let conn = redis::Client::open(url.as_str())
        .expect("a client")
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    (broker, conn)
}

async fn publish(broker: &RedisBroker, n: usize) {
    let jobs = (0..n)
        .map(|i| {
            let env = Envelope::new("k", format!("{i}").into_bytes(), Utc::now())
                .with_id(JobId::from_string(format!("job-{i}-{}", uuid_like())));
            (env, None)
        })
        .collect();
    broker.publish(QUEUE, jobs).await.expect("publish");
}

fn uuid_like() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

async fn xlen(broker: &RedisBroker, c: &mut redis::aio::MultiplexedConnection) -> i64 {
    cmd("XLEN")
        .arg(broker.stream_key(QUEUE))
        .query_async(c)
        .await
        .expect("XLEN")
}

async fn server_major(c: &mut redis::aio::MultiplexedConnection) -> u32 {
    let info: String = cmd("INFO")
        .arg("server")
        .query_async(c)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(0)
}

/// Entries settled above one still pending wait for the trim (Redis 7), are not counted as
/// ready meanwhile, and leave the stream once the pending one is settled.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test]
async fn settled_entries_wait_above_a_pending_one_and_leave_with_it() {
    let (broker, mut c) = setup().await;
    publish(&broker, 5).await;
    let mut ds = broker
        .claim(
            QUEUE,
            5,
            Duration::from_millis(100),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(ds.len(), 5);
    let first = ds.remove(0);
    for d in &ds {
        assert_eq!(
            broker.settle(QUEUE, d, Settlement::Ack).await.expect("ack"),
            Settled::Done
        );
    }
    let stats = broker.stats(QUEUE).await.expect("stats");
    assert_eq!((stats.ready, stats.pending), (0, 1), "{stats:?}");
    if server_major(&mut c).await >= 7 {
        // Trimmed below the oldest pending entry: the four settled after it wait.
        assert_eq!(xlen(&broker, &mut c).await, 5);
    } else {
        assert_eq!(xlen(&broker, &mut c).await, 1);
    }
    // A second settlement of a settled delivery changes nothing.
    assert_eq!(
        broker
            .settle(QUEUE, &ds[0], Settlement::Ack)
            .await
            .expect("ack again"),
        Settled::LeaseLost
    );
    publish(&broker, 2).await;
    let stats = broker.stats(QUEUE).await.expect("stats");
    assert_eq!((stats.ready, stats.pending), (2, 1), "{stats:?}");
    assert_eq!(
        broker
            .settle(QUEUE, &first, Settlement::Ack)
            .await
            .expect("ack"),
        Settled::Done
    );
    // Only the two new entries, not yet delivered, are left.
    assert_eq!(xlen(&broker, &mut c).await, 2);
    let rest = broker
        .claim(
            QUEUE,
            5,
            Duration::from_millis(100),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(rest.len(), 2);
    for d in &rest {
        broker.settle(QUEUE, d, Settlement::Ack).await.expect("ack");
    }
    assert_eq!(xlen(&broker, &mut c).await, 0, "the stream is empty");
    let stats = broker.stats(QUEUE).await.expect("stats");
    assert_eq!((stats.ready, stats.pending), (0, 0), "{stats:?}");
}

/// Entries settled more than about a second (of entry time) above a delivery still pending
/// are deleted at once: the stream stays bounded behind a long handler.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test]
async fn entries_far_above_a_pending_one_are_deleted_at_once() {
    let (broker, mut c) = setup().await;
    publish(&broker, 1).await;
    let held = broker
        .claim(
            QUEUE,
            1,
            Duration::from_millis(100),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(held.len(), 1);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    publish(&broker, 3).await;
    let later = broker
        .claim(
            QUEUE,
            3,
            Duration::from_millis(100),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(later.len(), 3);
    for d in &later {
        broker.settle(QUEUE, d, Settlement::Ack).await.expect("ack");
    }
    assert_eq!(
        xlen(&broker, &mut c).await,
        1,
        "only the held entry is left"
    );
    broker
        .settle(QUEUE, &held[0], Settlement::Ack)
        .await
        .expect("ack");
    assert_eq!(xlen(&broker, &mut c).await, 0);
}

/// Retries and acknowledgements settled together, each fenced: a retry made again after its
/// first took effect is refused and adds nothing.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test]
async fn a_retry_settled_twice_is_added_once() {
    let (broker, mut c) = setup().await;
    publish(&broker, 3).await;
    let ds = broker
        .claim(
            QUEUE,
            3,
            Duration::from_millis(100),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(ds.len(), 3);
    let retry = || Settlement::Retry {
        delay: Duration::ZERO,
        failure: Failure::new(FailureCause::Error, "boom", ""),
    };
    let (a, b, c2) = tokio::join!(
        broker.settle(QUEUE, &ds[0], retry()),
        broker.settle(QUEUE, &ds[1], Settlement::Ack),
        broker.settle(QUEUE, &ds[2], retry()),
    );
    for s in [a, b, c2] {
        assert_eq!(s.expect("settle"), Settled::Done);
    }
    assert_eq!(
        broker.settle(QUEUE, &ds[0], retry()).await.expect("settle"),
        Settled::LeaseLost
    );
    let again = broker
        .claim(
            QUEUE,
            10,
            Duration::from_millis(100),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    let mut ids: Vec<String> = again.iter().map(|d| d.envelope.id().to_string()).collect();
    ids.sort();
    let mut want = vec![
        ds[0].envelope.id().to_string(),
        ds[2].envelope.id().to_string(),
    ];
    want.sort();
    assert_eq!(ids, want, "each retried job once");
    assert!(again.iter().all(|d| d.envelope.attempt() == 2));
    for d in &again {
        broker.settle(QUEUE, d, Settlement::Ack).await.expect("ack");
    }
    assert_eq!(xlen(&broker, &mut c).await, 0);
}

/// A dead stream read as a queue deletes each settled entry at once (its length is the count
/// of its dead letters): nothing waits for a trim there.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test]
async fn a_dead_stream_read_as_a_queue_deletes_each_settled_entry() {
    use stagedoor_jobs::broker::DeadLetters;
    let (broker, _c) = setup().await;
    let dead = format!("{QUEUE}:dead");
    publish(&broker, 2).await;
    let ds = broker
        .claim(
            QUEUE,
            2,
            Duration::from_millis(100),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(ds.len(), 2);
    for d in &ds {
        let s = Settlement::DeadLetter {
            target: dead.clone(),
            failure: Failure::new(FailureCause::Error, "boom", ""),
        };
        assert_eq!(
            broker.settle(QUEUE, d, s).await.expect("dead"),
            Settled::Done
        );
    }
    assert_eq!(broker.dead_len(&dead).await.expect("dead_len"), 2);
    broker
        .prepare(&dead)
        .await
        .expect("prepare the dead stream");
    let held = broker
        .claim(
            &dead,
            2,
            Duration::from_millis(100),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim the dead stream");
    assert_eq!(held.len(), 2);
    assert_eq!(
        broker
            .settle(&dead, &held[1], Settlement::Ack)
            .await
            .expect("ack"),
        Settled::Done
    );
    assert_eq!(
        broker.dead_len(&dead).await.expect("dead_len"),
        1,
        "the settled dead letter is gone though an older one is pending"
    );
}
