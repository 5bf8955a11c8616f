//! The model-based random test of the broker contract (`stagedoor_jobs::conformance::run_model`)
//! on Redis: standalone and on a 3-master Redis Cluster (`REDIS_CLUSTER_URLS`), each sequence
//! in a namespace of its own, with hand edits of the queue's keys (a junk member in
//! `{q}:delayed`, a junk stream entry, a key of the wrong type where a level's stream goes).
//!
//! The standalone test runs on a `redis-server` of its own (on a free port, in a temporary
//! directory, `appendonly yes` with `appendfsync always`; `redis-server` on PATH as under
//! `scripts/test-all`), so that its server restart step can `SHUTDOWN` it and start it again
//! on the same port and directory, the brokers under test keeping their connections' settings.
//! The Cluster test does not restart servers: its nodes are the shared servers, and a node's
//! restart in a Cluster without replicas leaves its slots unserved until it is back, which
//! `tests/redis_failover.rs` covers with a Cluster of its own (with replicas).
//!
//! Step kinds kept out of CI until the defects they find are fixed: `KNOWN`.

mod common_redis;

use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common_redis::{Raw, cluster_urls, env_url, fresh_namespace};
use redis::AsyncCommands;
use stagedoor_jobs::broker::Broker;
use stagedoor_jobs::conformance::{Fixture, Junk, ModelRun, Outage, run_model};
use stagedoor_jobs_redis::RedisBroker;

#[derive(Clone, Copy)]
enum On {
    Standalone,
    Cluster,
}

/// The longest the test waits for its own server to start or stop.
const PATIENCE: Duration = Duration::from_secs(30);

/// A redis-server of the test's own on a free port and a temporary directory, which it keeps
/// across a restart; killed and removed when dropped (a failing test included).
struct OwnServer {
    child: Mutex<Option<Child>>,
    port: u16,
    dir: std::path::PathBuf,
}

impl OwnServer {
    /// Starts the server and waits until it answers.
    async fn start() -> Result<Self, String> {
        let _ = env_url("REDIS_URL"); // under scripts/test-all, which puts redis-server on PATH
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free port: {e}"))?
            .port();
        let dir =
            std::env::temp_dir().join(format!("stagedoor-model-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let me = Self {
            child: Mutex::new(None),
            port,
            dir,
        };
        me.spawn()?;
        me.answering().await?;
        Ok(me)
    }

    /// Starts the server process (again) on the same port and directory; a process still
    /// running from before (its shutdown failed) is killed first, not left behind.
    fn spawn(&self) -> Result<(), String> {
        if let Some(mut old) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = old.kill();
            let _ = old.wait();
        }
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--daemonize", "no", "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server is on PATH (scripts/test-all installs it): {e}"))?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A plain connection (fresh each time: the server may have restarted).
    async fn conn(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    /// Waits until the server answers `PING` (not while it is still loading its data).
    async fn answering(&self) -> Result<(), String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(mut c) = self.conn().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the test's redis-server did not answer within {PATIENCE:?} (see {})",
                    self.dir.join("redis.log").display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `SHUTDOWN` (which writes the append-only file out), then waits for the process to exit.
    async fn shutdown(&self) -> Result<(), String> {
        let mut c = self.conn().await.map_err(|e| format!("connect: {e}"))?;
        // The server closes the connection instead of answering.
        let _ = redis::cmd("SHUTDOWN")
            .query_async::<redis::Value>(&mut c)
            .await;
        let deadline = Instant::now() + PATIENCE;
        loop {
            let status = {
                let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
                let Some(ch) = child.as_mut() else {
                    return Err("the server is not running".to_owned());
                };
                let status = ch.try_wait().map_err(|e| format!("its status: {e}"))?;
                if status.is_some() {
                    *child = None;
                }
                status
            };
            match status {
                Some(s) if s.success() => return Ok(()),
                Some(s) => return Err(format!("the server did not shut down cleanly: {s}")),
                None if Instant::now() > deadline => {
                    return Err(format!("the server did not exit within {PATIENCE:?}"));
                }
                None => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct RedisModel {
    on: On,
    /// Standalone: the test's own server. Cluster: `None`.
    server: Option<OwnServer>,
    /// Cluster: one connection for the hand edits (standalone opens one per edit: the server
    /// restarts).
    cluster: Option<Raw>,
}

impl RedisModel {
    async fn new(on: On) -> Self {
        match on {
            On::Standalone => Self {
                on,
                server: Some(OwnServer::start().await.expect("the test's redis-server")),
                cluster: None,
            },
            On::Cluster => {
                let client =
                    redis::cluster::ClusterClient::new(cluster_urls()).expect("cluster URLs");
                let raw = Raw::Cluster(
                    client
                        .get_async_connection()
                        .await
                        .expect("connect to the cluster"),
                );
                Self {
                    on,
                    server: None,
                    cluster: Some(raw),
                }
            }
        }
    }

    /// A plain connection for a hand edit.
    async fn raw(&self) -> Result<Raw, String> {
        match (&self.server, &self.cluster) {
            (Some(server), _) => server
                .conn()
                .await
                .map(Raw::Single)
                .map_err(|e| format!("connect to the test's server: {e}")),
            (None, Some(raw)) => Ok(raw.clone()),
            (None, None) => Err("no server".to_owned()),
        }
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
        let b = match (&self.on, &self.server) {
            (On::Standalone, Some(server)) => RedisBroker::from_url(server.url()),
            (On::Standalone, None) => unreachable!("a standalone model has its server"),
            (On::Cluster, _) => RedisBroker::cluster(cluster_urls()),
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
        let mut c = self.raw().await?;
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
            let mut c = self.raw().await.expect("connect for the repair");
            let _: () = c
                .del(level_key(broker, queue))
                .await
                .expect("delete the key of the wrong type");
        }
    }

    /// Standalone: `SHUTDOWN` of the test's own server (its data written out).
    async fn server_down(&self, _broker: &RedisBroker) -> Option<Result<Outage, String>> {
        let server = self.server.as_ref()?;
        Some(server.shutdown().await.map(|()| Outage::Down))
    }

    /// Starts it again on the same port and directory, and waits until it answers.
    async fn server_up(&self, _broker: &RedisBroker) -> Result<(), String> {
        let Some(server) = &self.server else {
            return Ok(());
        };
        server.spawn()?;
        server.answering().await
    }
}

const LEASE: Duration = Duration::from_secs(1);
const STEPS: usize = 40;

/// Step kinds left out of CI while a defect they find is open (none now: the publish whose
/// XADD failed, the junk delayed member and the SQL `publish_in` unique key, found by this
/// test on the code before issue 29's fixes, are fixed).
const KNOWN: &[&str] = &[];

/// The standalone server's known defects (kept out of CI, run by `scripts/soak`): none now.
/// `stats-after-restart` (after a restart the stats counted settled entries waiting for the
/// trim as ready: the reloaded group's `entries-read` is unknown, so `XINFO GROUPS` gives no
/// `lag`; seed 6762364471110044322, shrunk to 6 steps) is fixed: with no lag, `stats` counts
/// the entries after the group's last-delivered id.
const STANDALONE_KNOWN: &[&str] = &[];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Redis: run scripts/test-all"]
async fn standalone() {
    run_model(
        RedisModel::new(On::Standalone).await,
        ModelRun {
            backend: "redis",
            rerun: "--test model_redis standalone",
            seeds: &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            steps: STEPS,
            lease: LEASE,
            known_defects: STANDALONE_KNOWN,
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Redis Cluster: run scripts/test-all"]
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
