//! The core's conformance suite, unchanged, on Redis: standalone (`REDIS_URL`) and on a
//! 3-master Redis Cluster (`REDIS_CLUSTER_URLS`), each test in a namespace of its own.

use std::time::Duration;

use stagedoor_jobs::broker::Broker;
use stagedoor_jobs::conformance::Fixture;
use stagedoor_jobs_redis::RedisBroker;

fn url(var: &str) -> String {
    match std::env::var(var) {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "{var} is not set: run the tests with `scripts/test-all`, which starts Redis and exports it"
        ),
    }
}

fn namespace() -> String {
    format!("t{}:", uuid_like())
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn configure(b: RedisBroker, lease: Option<Duration>) -> RedisBroker {
    let b = b.namespace(namespace()).max_deliveries(10);
    match lease {
        Some(l) => b.lease(l),
        None => b,
    }
}

/// Adds to `queue` an entry as a hand edit leaves it: its `attempts` field is not a number.
/// The consumer group is created first (from the stream's start), so the entry is delivered.
async fn store_unreadable<C: redis::aio::ConnectionLike>(
    broker: &RedisBroker,
    mut conn: C,
    queue: &str,
) -> Option<String> {
    broker
        .prepare(queue)
        .await
        .expect("create the consumer group");
    let _: String = redis::cmd("XADD")
        .arg(broker.stream_key(queue))
        .arg("*")
        .arg("kind")
        .arg("cf")
        .arg("job_id")
        .arg("unreadable-1")
        .arg("payload")
        .arg("{\"n\":0}")
        .arg("attempts")
        .arg("abc")
        .query_async(&mut conn)
        .await
        .expect("add the unreadable entry");
    Some("attempts".to_owned())
}

struct Standalone;

impl Fixture for Standalone {
    /// The backend decides no fate of its own: the runtime's rules hold on it.
    fn leaves_fates_to_the_runtime(&self) -> bool {
        true
    }

    type Broker = RedisBroker;
    async fn broker(&self) -> RedisBroker {
        configure(RedisBroker::from_url(url("REDIS_URL")), None)
    }
    async fn broker_with_lease(&self, lease: Duration) -> RedisBroker {
        configure(RedisBroker::from_url(url("REDIS_URL")), Some(lease))
    }
    fn paused(&self) -> bool {
        false
    }
    async fn store_unreadable_job(&self, broker: &RedisBroker, queue: &str) -> Option<String> {
        let client = redis::Client::open(url("REDIS_URL")).expect("a Redis URL");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect to Redis");
        store_unreadable(broker, conn, queue).await
    }
}

stagedoor_jobs::conformance_tests!(
    Standalone,
    #[ignore = "needs Redis: run scripts/test-all"]
);

mod cluster {
    use super::*;

    struct Cluster;

    fn urls() -> Vec<String> {
        url("REDIS_CLUSTER_URLS")
            .split(',')
            .map(str::to_owned)
            .collect()
    }

    impl Fixture for Cluster {
        /// The backend decides no fate of its own: the runtime's rules hold on it.
        fn leaves_fates_to_the_runtime(&self) -> bool {
            true
        }

        type Broker = RedisBroker;
        async fn broker(&self) -> RedisBroker {
            configure(RedisBroker::cluster(urls()), None)
        }
        async fn broker_with_lease(&self, lease: Duration) -> RedisBroker {
            configure(RedisBroker::cluster(urls()), Some(lease))
        }
        fn paused(&self) -> bool {
            false
        }
        async fn store_unreadable_job(&self, broker: &RedisBroker, queue: &str) -> Option<String> {
            let client = redis::cluster::ClusterClient::new(urls()).expect("cluster URLs");
            let conn = client
                .get_async_connection()
                .await
                .expect("connect to the cluster");
            store_unreadable(broker, conn, queue).await
        }
    }

    stagedoor_jobs::conformance_tests!(
        Cluster,
        #[ignore = "needs a Redis Cluster: run scripts/test-all"]
    );
}
