//! The model-based random test of the broker contract (`stagedoor_jobs::conformance::run_model`)
//! on Redis: standalone (`REDIS_URL`) and on a 3-master Redis Cluster (`REDIS_CLUSTER_URLS`),
//! each sequence in a namespace of its own, with hand edits of the queue's keys (a junk member
//! in `{q}:delayed`, a junk stream entry, a key of the wrong type where a level's stream goes).
//!
//! Step kinds kept out of CI until the defects they find are fixed: `KNOWN`.

mod common_redis;

use std::time::Duration;

use common_redis::{Raw, cluster_urls, env_url, fresh_namespace};
use redis::AsyncCommands;
use stagedoor_jobs::broker::Broker;
use stagedoor_jobs::conformance::{Fixture, Junk, ModelRun, run_model};
use stagedoor_jobs_redis::RedisBroker;

#[derive(Clone, Copy)]
enum On {
    Standalone,
    Cluster,
}

struct RedisModel {
    on: On,
    raw: Raw,
}

impl RedisModel {
    async fn new(on: On) -> Self {
        let raw = match on {
            On::Standalone => {
                let client = redis::Client::open(env_url("REDIS_URL")).expect("REDIS_URL");
                Raw::Single(
                    client
                        .get_multiplexed_async_connection()
                        .await
                        .expect("connect to REDIS_URL"),
                )
            }
            On::Cluster => {
                let client =
                    redis::cluster::ClusterClient::new(cluster_urls()).expect("cluster URLs");
                Raw::Cluster(
                    client
                        .get_async_connection()
                        .await
                        .expect("connect to the cluster"),
                )
            }
        };
        Self { on, raw }
    }
}

/// The key of `queue`'s stream at the level a [`Junk::WrongTypeKey`] blocks.
fn level_key(broker: &RedisBroker, queue: &str) -> String {
    format!("{}:p{}", broker.stream_key(queue), Junk::WRONG_TYPE_LEVEL)
}

impl Fixture for RedisModel {
    type Broker = RedisBroker;

    async fn broker(&self) -> RedisBroker {
        self.broker_with_lease(stagedoor_jobs::broker::DEFAULT_LEASE)
            .await
    }

    /// A broker in a fresh namespace. Many deliveries allowed before an entry counts as
    /// poison: the model does not model that cap, only crashes.
    async fn broker_with_lease(&self, lease: Duration) -> RedisBroker {
        let b = match self.on {
            On::Standalone => RedisBroker::from_url(env_url("REDIS_URL")),
            On::Cluster => RedisBroker::cluster(cluster_urls()),
        };
        b.namespace(fresh_namespace("model"))
            .max_deliveries(1000)
            .lease(lease)
    }

    fn paused(&self) -> bool {
        false
    }

    fn junk_kinds(&self) -> Vec<Junk> {
        vec![Junk::DelayedMember, Junk::StreamEntry, Junk::WrongTypeKey]
    }

    async fn store_junk(
        &self,
        broker: &RedisBroker,
        queue: &str,
        junk: Junk,
        id: &str,
    ) -> Result<(), String> {
        let mut c = self.raw.clone();
        let stream = broker.stream_key(queue);
        let done: redis::RedisResult<()> = match junk {
            Junk::DelayedMember => {
                let now_ms = chrono::Utc::now().timestamp_millis();
                c.zadd(
                    format!("{stream}:delayed"),
                    format!("{id}: not a job"),
                    now_ms - 1000,
                )
                .await
            }
            Junk::StreamEntry => {
                broker.prepare(queue).await.map_err(|e| e.to_string())?;
                redis::cmd("XADD")
                    .arg(&stream)
                    .arg("*")
                    .arg("job_id")
                    .arg(id)
                    .arg("junk")
                    .arg("not a job")
                    .query_async::<String>(&mut c)
                    .await
                    .map(drop)
            }
            Junk::WrongTypeKey => c.set(level_key(broker, queue), "junk").await,
            other => return Err(format!("{other:?} is not a Redis edit")),
        };
        done.map_err(|e| e.to_string())
    }

    async fn repair_junk(&self, broker: &RedisBroker, queue: &str, junk: Junk) {
        if junk == Junk::WrongTypeKey {
            let mut c = self.raw.clone();
            let _: () = c
                .del(level_key(broker, queue))
                .await
                .expect("delete the key of the wrong type");
        }
    }
}

const LEASE: Duration = Duration::from_secs(1);
const STEPS: usize = 40;

/// Step kinds left out of CI while a defect they find is open (none now: the publish whose
/// XADD failed, the junk delayed member and the SQL `publish_in` unique key, found by this
/// test on the code before issue 29's fixes, are fixed).
const KNOWN: &[&str] = &[];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(stagedoor_redis), ignore = "needs Redis: run scripts/test-all")]
async fn standalone() {
    run_model(
        RedisModel::new(On::Standalone).await,
        ModelRun {
            backend: "redis",
            rerun: "--test model_redis standalone",
            seeds: &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            steps: STEPS,
            lease: LEASE,
            known_defects: KNOWN,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(stagedoor_cluster),
    ignore = "needs a Redis Cluster: run scripts/test-all"
)]
async fn cluster() {
    run_model(
        RedisModel::new(On::Cluster).await,
        ModelRun {
            backend: "redis-cluster",
            rerun: "--test model_redis cluster",
            seeds: &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            steps: STEPS,
            lease: LEASE,
            known_defects: KNOWN,
        },
    )
    .await;
}
