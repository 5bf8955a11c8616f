//! What a bad key or a big job does to the Redis scripts (issue 29), on Redis (`REDIS_URL`)
//! and, where the path differs, on a Redis Cluster (`REDIS_CLUSTER_URLS`):
//!
//! - a member of a queue's delayed set that is not a job (`ZADD {jobs}:delayed 0 junk`) is
//!   moved to the dead stream, with an error naming the key, by itself: the queue's other
//!   delayed jobs keep moving and its stream keeps being claimed;
//! - a delayed member scored past any time a job can be due (`+inf`) is dead-lettered the same
//!   way, saying so; one scored `-inf` is due at once and runs;
//! - a delayed set of the wrong type (a string) fails the mover with an error naming the key
//!   and the fix, logged; the queue's stream is still claimed;
//! - a publish, a replay or an acknowledgement that fails on a key of the wrong type leaves
//!   nothing behind: once the key is fixed, the same call succeeds (before, the job's id had
//!   been recorded already and the retry was told the job was there);
//! - a job with 5,000 headers (10,000 fields, past Lua's `unpack` limit of about 8,000
//!   values) publishes, is delayed, moved, retried, dead-lettered, replayed, reclaimed and
//!   runs, every header kept;
//! - settlements sent after `SCRIPT FLUSH` load the script again and settle every job once.
//!
//! A missing variable fails the test under `scripts/test-all`; a plain `cargo test` without
//! it lists the test as ignored.

mod common_redis;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chrono::Utc;
use common_redis::{Raw, cluster_urls, env_url};
use redis::{Cmd, Value, cmd};
use stagedoor_jobs::broker::{
    Broker, BrokerError, Claimed, DeadLetters, DeadSelector, Delivery, Inspect, Settled, Settlement,
};
use stagedoor_jobs::{Envelope, Failure, FailureCause, Headers};
use stagedoor_jobs_redis::{RedisBroker, RedisReceipt};

const QUEUE: &str = "jobs";
const DEAD: &str = "jobs:dead";
const KIND: &str = "charge";
const LEASE: Duration = Duration::from_millis(500);
/// Headers on a big job: 10,000 fields, past Lua's `unpack` limit.
const MANY: usize = 5_000;

#[derive(Clone, Copy, Debug)]
enum On {
    Standalone,
    Cluster,
}

/// One test's world: a connected broker in a fresh namespace, and a plain connection.
struct Fx {
    ns: String,
    raw: Raw,
    broker: RedisBroker,
    on: On,
}

impl Fx {
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
        let ns = common_redis::fresh_namespace("faults");
        let fx = Self {
            broker: Self::broker_for(on, &ns),
            ns,
            raw,
            on,
        };
        fx.broker.connect().await.expect("connect");
        fx.broker.prepare(QUEUE).await.expect("prepare");
        fx
    }

    fn broker_for(on: On, ns: &str) -> RedisBroker {
        let b = match on {
            On::Standalone => RedisBroker::from_url(env_url("REDIS_URL")),
            On::Cluster => RedisBroker::cluster(cluster_urls()),
        };
        b.namespace(ns).lease(LEASE)
    }

    /// A second broker (another worker) on the same namespace.
    async fn other_broker(&self, max_deliveries: u32) -> RedisBroker {
        let b = Self::broker_for(self.on, &self.ns).max_deliveries(max_deliveries);
        b.connect().await.expect("connect");
        b
    }

    fn key(&self, suffix: &str) -> String {
        format!("{{{}{QUEUE}}}{suffix}", self.ns)
    }

    async fn q<T: redis::FromRedisValue>(&self, c: &Cmd) -> T {
        let mut conn = self.raw.clone();
        c.query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{c:?}: {e}"))
    }

    async fn publish(&self, e: Envelope, delay: Option<Duration>) -> Result<bool, BrokerError> {
        let at = delay.map(|d| Utc::now() + chrono::Duration::from_std(d).expect("a delay"));
        let p = self.broker.publish(QUEUE, vec![(e, at)]).await?;
        Ok(p[0].is_stored())
    }

    /// Claims until `n` deliveries came (every claim must succeed), within `within`.
    async fn claim_n(&self, n: usize, within: Duration) -> Vec<Delivery<RedisReceipt>> {
        let deadline = tokio::time::Instant::now() + within;
        let mut out = Vec::new();
        while out.len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {n} jobs claimed within {within:?}: {:?}",
                out.len(),
                ids(&out)
            );
            let got = self
                .broker
                .claim(
                    QUEUE,
                    n - out.len(),
                    Duration::from_millis(200),
                    stagedoor_jobs::broker::ClaimOrder::Priority,
                )
                .await
                .unwrap_or_else(|e| panic!("every claim succeeds: {e}"));
            out.extend(got);
        }
        out
    }

    async fn ack(&self, d: &Delivery<RedisReceipt>) {
        let s = self
            .broker
            .settle(QUEUE, d, Settlement::Ack)
            .await
            .expect("ack");
        assert_eq!(s, Settled::Done);
    }

    /// The dead stream's entries, fields by name (lossy text).
    async fn dead(&self) -> Vec<BTreeMap<String, Vec<u8>>> {
        let v: Value = self
            .q(cmd("XRANGE").arg(self.key(":dead")).arg("-").arg("+"))
            .await;
        array(&v)
            .iter()
            .map(|e| {
                let f = &array(e)[1];
                array(f)
                    .chunks(2)
                    .map(|c| {
                        (
                            String::from_utf8_lossy(&bytes(&c[0])).into_owned(),
                            bytes(&c[1]),
                        )
                    })
                    .collect()
            })
            .collect()
    }
}

fn array(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) => a,
        _ => &[],
    }
}

fn bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        other => panic!("a bulk string: {other:?}"),
    }
}

fn text(f: &BTreeMap<String, Vec<u8>>, name: &str) -> String {
    String::from_utf8_lossy(
        f.get(name)
            .unwrap_or_else(|| panic!("no `{name}` field: {f:?}")),
    )
    .into_owned()
}

fn ids(ds: &[Delivery<RedisReceipt>]) -> Vec<String> {
    let mut v: Vec<String> = ds.iter().map(|d| d.envelope.id().to_string()).collect();
    v.sort();
    v
}

/// What a worker's runtime does with a claim's items that must not run (its rules are
/// `stagedoor-jobs/src/runtime/arrival.rs` and `unreadable.rs`): each unreadable item moved to
/// the queue's dead stream, each delivery past the broker's poison count dead-lettered. The
/// deliveries that run are returned; the first error is returned as it is.
async fn refuse_as_the_runtime(
    b: &RedisBroker,
    got: Claimed<RedisReceipt>,
) -> Result<Vec<Delivery<RedisReceipt>>, BrokerError> {
    let dead = b.default_dead_letter(QUEUE);
    for item in &got.unreadable {
        b.dead_letter_unreadable(QUEUE, item, &dead).await?;
    }
    let mut run = Vec::new();
    for d in got.deliveries {
        match d.delivered.filter(|n| *n > b.poison_count()) {
            Some(n) => {
                let error = format!("delivered {n} times without being settled");
                let failure = Failure::new(FailureCause::Poison, error, "");
                let target = dead.clone();
                b.settle(QUEUE, &d, Settlement::DeadLetter { target, failure })
                    .await?;
            }
            None => run.push(d),
        }
    }
    Ok(run)
}

fn job(id: &str) -> Envelope {
    Envelope::new(
        KIND,
        format!("{{\"job\":\"{id}\"}}").into_bytes(),
        Utc::now(),
    )
    .with_id(stagedoor_jobs::JobId::from_string(id.to_owned()))
}

/// A job with [`MANY`] headers.
fn big(id: &str) -> Envelope {
    let extra = (0..MANY)
        .map(|i| (format!("n{i:05}"), format!("v{i}")))
        .collect();
    job(id).with_headers(Headers {
        extra,
        ..Headers::default()
    })
}

fn assert_big(d: &Delivery<RedisReceipt>, id: &str) {
    assert_eq!(d.envelope.id().as_str(), id);
    let extra = &d.envelope.headers().extra;
    assert_eq!(extra.len(), MANY, "every header kept");
    assert_eq!(extra.get("n04999").map(String::as_str), Some("v4999"));
    assert_eq!(
        d.envelope.payload(),
        format!("{{\"job\":\"{id}\"}}").as_bytes()
    );
}

/// What the tests' process logged (every test of this file; each looks for its namespace).
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let w = Arc::clone(&buf);
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Sink(Arc::clone(&w)))
            .try_init();
        buf
    })
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("the log").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The lines logged that name `needle`.
fn logged(needle: &str) -> Vec<String> {
    let all = logs().lock().expect("the log").clone();
    String::from_utf8_lossy(&all)
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// One junk member in the delayed set used to fail every claim of the queue (the mover's
/// script failed, and the claim returned its error before reading the stream).
async fn a_junk_delayed_member_is_dead_lettered_alone(on: On) {
    let fx = Fx::new(on).await;
    let delayed = fx.key(":delayed");
    let _: i64 = fx.q(cmd("ZADD").arg(&delayed).arg(0).arg("junk")).await;
    // A MessagePack array that is not one of strings (an older version or another tool).
    let _: i64 = fx
        .q(cmd("ZADD")
            .arg(&delayed)
            .arg(1)
            .arg(&[0x92u8, 0x01, 0x02][..]))
        .await;
    assert!(
        fx.publish(job("late"), Some(Duration::from_millis(300)))
            .await
            .expect("publish")
    );
    for n in 0..20 {
        assert!(
            fx.publish(job(&format!("now-{n}")), None)
                .await
                .expect("publish")
        );
    }
    let got = fx.claim_n(21, Duration::from_secs(10)).await;
    let mut want: Vec<String> = (0..20).map(|n| format!("now-{n}")).collect();
    want.push("late".to_owned());
    want.sort();
    assert_eq!(
        ids(&got),
        want,
        "every good job is claimed, the delayed one too"
    );
    for d in &got {
        fx.ack(d).await;
    }
    let left: i64 = fx.q(cmd("ZCARD").arg(&delayed)).await;
    assert_eq!(left, 0, "the junk left the delayed set");
    let dead = fx.dead().await;
    assert_eq!(dead.len(), 2, "each junk member is dead-lettered: {dead:?}");
    let junk = dead
        .iter()
        .find(|f| f.get("member").map(Vec::as_slice) == Some(b"junk".as_slice()))
        .unwrap_or_else(|| panic!("the junk's bytes are kept: {dead:?}"));
    let error = text(junk, "error");
    assert!(
        error.contains(&delayed) && error.contains("not a delayed job"),
        "the error names the key and what is wrong: {error}"
    );
    assert_eq!(text(junk, "origin"), QUEUE);
    // The library reads it as a dead letter.
    let letters = fx
        .broker
        .dead_letters(DEAD, &DeadSelector::All, 10)
        .await
        .expect("dead letters");
    assert_eq!(letters.len(), 2, "{letters:?}");
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_a_junk_delayed_member_is_dead_lettered_alone() {
    a_junk_delayed_member_is_dead_lettered_alone(On::Standalone).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_junk_delayed_member_is_dead_lettered_alone() {
    a_junk_delayed_member_is_dead_lettered_alone(On::Cluster).await;
}

/// A member scored `-inf` is due at once and runs; one scored `+inf` (or past the year
/// 9999) would never be due: it is dead-lettered, the error naming the key and its score,
/// so that it is not kept forever unseen.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_members_scored_out_of_time() {
    let fx = Fx::new(On::Standalone).await;
    let delayed = fx.key(":delayed");
    for id in ["minus-inf", "plus-inf", "huge"] {
        assert!(
            fx.publish(job(id), Some(Duration::from_secs(3600)))
                .await
                .expect("publish")
        );
    }
    let members: Vec<Vec<u8>> = fx.q(cmd("ZRANGE").arg(&delayed).arg(0).arg(-1)).await;
    assert_eq!(members.len(), 3);
    for m in &members {
        let score = if m.windows(9).any(|w| w == b"minus-inf") {
            "-inf"
        } else if m.windows(8).any(|w| w == b"plus-inf") {
            "+inf"
        } else {
            "1e300"
        };
        let _: i64 = fx
            .q(cmd("ZADD").arg(&delayed).arg("XX").arg(score).arg(m))
            .await;
    }
    assert!(fx.publish(job("now"), None).await.expect("publish"));
    let got = fx.claim_n(2, Duration::from_secs(5)).await;
    assert_eq!(ids(&got), ["minus-inf", "now"]);
    for d in &got {
        fx.ack(d).await;
    }
    // The mover has looked: the others are dead letters now.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let dead = loop {
        let got = fx
            .broker
            .claim(
                QUEUE,
                1,
                Duration::from_millis(100),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .unwrap_or_else(|e| panic!("every claim succeeds: {e}"));
        assert!(got.is_empty(), "nothing else runs: {:?}", ids(&got));
        let dead = fx.dead().await;
        if dead.len() >= 2 || tokio::time::Instant::now() > deadline {
            break dead;
        }
    };
    let mut jobs: Vec<String> = dead.iter().map(|f| text(f, "job_id")).collect();
    jobs.sort();
    assert_eq!(jobs, ["huge", "plus-inf"], "{dead:?}");
    for f in &dead {
        let error = text(f, "error");
        assert!(
            error.contains(&delayed) && error.contains("score") && error.contains("replay"),
            "the error names the key, the score and the fix: {error}"
        );
        assert_eq!(text(f, "kind"), KIND, "the job's fields are kept");
    }
    let left: i64 = fx.q(cmd("ZCARD").arg(&delayed)).await;
    assert_eq!(left, 0);
    // Replayed, it runs.
    let r = fx
        .broker
        .replay(DEAD, &DeadSelector::All)
        .await
        .expect("replay");
    assert_eq!(r.replayed, 2, "{r:?}");
    let got = fx.claim_n(2, Duration::from_secs(5)).await;
    assert_eq!(ids(&got), ["huge", "plus-inf"]);
}

/// A delayed set that is a string fails the mover, which logs an error naming the key and the
/// fix; the queue's stream is still claimed (before, every claim failed), and once the key is
/// deleted delayed jobs move again.
async fn a_delayed_set_of_the_wrong_type(on: On) {
    logs();
    let fx = Fx::new(on).await;
    let delayed = fx.key(":delayed");
    let _: () = fx.q(cmd("SET").arg(&delayed).arg("not a sorted set")).await;
    for n in 0..5 {
        assert!(
            fx.publish(job(&format!("now-{n}")), None)
                .await
                .expect("publish")
        );
    }
    let got = fx.claim_n(5, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 5);
    let lines = logged(&delayed);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("ERROR") && l.contains("string") && l.contains("DEL")),
        "the mover's error is logged, naming the key, its type and the fix: {lines:#?}"
    );
    // A delayed publish says the same, and stores nothing.
    let e = fx
        .publish(job("later"), Some(Duration::from_millis(100)))
        .await
        .expect_err("a delayed publish to a string fails");
    assert!(e.to_string().contains(&delayed), "{e}");
    let _: i64 = fx.q(cmd("DEL").arg(&delayed)).await;
    assert!(
        fx.publish(job("later"), Some(Duration::from_millis(100)))
            .await
            .expect("publish"),
        "stored once the key is fixed"
    );
    let got = fx.claim_n(1, Duration::from_secs(5)).await;
    assert_eq!(ids(&got), ["later"]);
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_a_delayed_set_of_the_wrong_type() {
    a_delayed_set_of_the_wrong_type(On::Standalone).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_delayed_set_of_the_wrong_type() {
    a_delayed_set_of_the_wrong_type(On::Cluster).await;
}

/// A publish that fails (its stream is a string) records nothing: once the key is fixed the
/// same job publishes, and runs (before, its id was in `{q}:ids` already and the retry was
/// told it was there, with nothing stored).
async fn a_failed_publish_can_be_retried(on: On) {
    let fx = Fx::new(on).await;
    let stream = fx.key("");
    let _: i64 = fx.q(cmd("DEL").arg(&stream)).await;
    let _: () = fx.q(cmd("SET").arg(&stream).arg("oops")).await;
    fx.publish(job("x"), None)
        .await
        .expect_err("a stream that is a string fails the publish");
    let _: i64 = fx.q(cmd("DEL").arg(&stream)).await;
    fx.broker.prepare(QUEUE).await.expect("prepare");
    assert!(
        fx.publish(job("x"), None).await.expect("publish"),
        "the retry stores the job"
    );
    // The same for a delayed job.
    let delayed = fx.key(":delayed");
    let _: () = fx.q(cmd("SET").arg(&delayed).arg("oops")).await;
    fx.publish(job("y"), Some(Duration::from_millis(100)))
        .await
        .expect_err("a delayed set that is a string fails the publish");
    let _: i64 = fx.q(cmd("DEL").arg(&delayed)).await;
    assert!(
        fx.publish(job("y"), Some(Duration::from_millis(100)))
            .await
            .expect("publish"),
        "the retry stores the delayed job"
    );
    let got = fx.claim_n(2, Duration::from_secs(5)).await;
    assert_eq!(ids(&got), ["x", "y"]);
    for d in &got {
        fx.ack(d).await;
    }
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_a_failed_publish_can_be_retried() {
    a_failed_publish_can_be_retried(On::Standalone).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_failed_publish_can_be_retried() {
    a_failed_publish_can_be_retried(On::Cluster).await;
}

/// A replay that fails (the queue's stream is a string) leaves the dead letter replayable:
/// before, the job's id was recorded and every later replay skipped it.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_replay_can_be_retried() {
    let fx = Fx::new(On::Standalone).await;
    assert!(fx.publish(job("x"), None).await.expect("publish"));
    let got = fx.claim_n(1, Duration::from_secs(5)).await;
    let failure = Failure::new(FailureCause::Error, "boom", "");
    let dl = Settlement::DeadLetter {
        target: DEAD.to_owned(),
        failure,
    };
    assert_eq!(
        fx.broker.settle(QUEUE, &got[0], dl).await.expect("settle"),
        Settled::Done
    );
    let stream = fx.key("");
    let _: i64 = fx.q(cmd("DEL").arg(&stream)).await;
    let _: () = fx.q(cmd("SET").arg(&stream).arg("oops")).await;
    let r = fx
        .broker
        .replay(DEAD, &DeadSelector::All)
        .await
        .expect("replay");
    assert_eq!((r.replayed, r.failed), (0, 1), "{r:?}");
    let _: i64 = fx.q(cmd("DEL").arg(&stream)).await;
    fx.broker.prepare(QUEUE).await.expect("prepare");
    let r = fx
        .broker
        .replay(DEAD, &DeadSelector::All)
        .await
        .expect("replay");
    assert_eq!(
        r.replayed, 1,
        "the dead letter is replayed once fixed: {r:?}"
    );
    let got = fx.claim_n(1, Duration::from_secs(5)).await;
    assert_eq!(ids(&got), ["x"]);
}

/// An acknowledgement that fails (the ids set is a string) changes nothing: once the key is
/// fixed the same settlement takes effect (before, the entry was acknowledged before the
/// failing step, and the retry was told the lease was lost).
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_acknowledgement_can_be_retried() {
    let fx = Fx::new(On::Standalone).await;
    assert!(fx.publish(job("x"), None).await.expect("publish"));
    let got = fx.claim_n(1, Duration::from_secs(5)).await;
    let ids_key = fx.key(":ids");
    let _: i64 = fx.q(cmd("DEL").arg(&ids_key)).await;
    let _: () = fx.q(cmd("SET").arg(&ids_key).arg("oops")).await;
    let e = fx
        .broker
        .settle(QUEUE, &got[0], Settlement::Ack)
        .await
        .expect_err("an ids set that is a string fails the acknowledgement");
    assert!(e.to_string().contains(&ids_key), "names the key: {e}");
    let _: i64 = fx.q(cmd("DEL").arg(&ids_key)).await;
    assert_eq!(
        fx.broker
            .settle(QUEUE, &got[0], Settlement::Ack)
            .await
            .expect("settle"),
        Settled::Done,
        "the retried acknowledgement takes effect"
    );
}

/// A job with 5,000 headers publishes now and delayed, is claimed, retried now and later
/// (moved by the mover), dead-lettered, replayed and acknowledged, every header kept.
async fn a_job_with_thousands_of_headers_goes_everywhere(on: On) {
    let fx = Fx::new(on).await;
    assert!(fx.publish(big("now"), None).await.expect("publish now"));
    assert!(
        fx.publish(big("later"), Some(Duration::from_millis(200)))
            .await
            .expect("publish delayed")
    );
    let mut got = fx.claim_n(2, Duration::from_secs(10)).await;
    got.sort_by(|a, b| a.envelope.id().as_str().cmp(b.envelope.id().as_str()));
    assert_big(&got[0], "later");
    assert_big(&got[1], "now");
    let fail = || Failure::new(FailureCause::Error, "again", "");
    // Retried now, and later (through the delayed set and the mover).
    for (d, delay) in got.iter().zip([Duration::ZERO, Duration::from_millis(200)]) {
        let s = Settlement::Retry {
            delay,
            failure: fail(),
        };
        assert_eq!(
            fx.broker.settle(QUEUE, d, s).await.expect("retry"),
            Settled::Done
        );
    }
    let got = fx.claim_n(2, Duration::from_secs(10)).await;
    for d in &got {
        assert_big(d, d.envelope.id().as_str());
        let s = Settlement::DeadLetter {
            target: DEAD.to_owned(),
            failure: fail(),
        };
        assert_eq!(
            fx.broker.settle(QUEUE, d, s).await.expect("dead letter"),
            Settled::Done
        );
    }
    let r = fx
        .broker
        .replay(DEAD, &DeadSelector::All)
        .await
        .expect("replay");
    assert_eq!(r.replayed, 2, "{r:?}");
    let got = fx.claim_n(2, Duration::from_secs(10)).await;
    for d in &got {
        assert_big(d, d.envelope.id().as_str());
        fx.ack(d).await;
    }
    // Once, behind a guard.
    let p = fx
        .broker
        .publish_once(QUEUE, (big("once"), None), "tick", Duration::from_secs(60))
        .await
        .expect("publish_once");
    assert!(p.is_stored());
    let got = fx.claim_n(1, Duration::from_secs(10)).await;
    assert_big(&got[0], "once");
    fx.ack(&got[0]).await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_a_job_with_thousands_of_headers_goes_everywhere() {
    a_job_with_thousands_of_headers_goes_everywhere(On::Standalone).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_job_with_thousands_of_headers_goes_everywhere() {
    a_job_with_thousands_of_headers_goes_everywhere(On::Cluster).await;
}

/// A big job whose worker died is reclaimed with its delivery count and, past
/// `max_deliveries`, dead-lettered (the runtime's rule) with every header; a big entry added by
/// hand without a `kind` is returned unreadable and dead-lettered with every field. Neither
/// fails the claim.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_jobs_are_reclaimed_and_dead_lettered() {
    let fx = Fx::new(On::Standalone).await;
    assert!(fx.publish(big("orphan"), None).await.expect("publish"));
    let got = fx.claim_n(1, Duration::from_secs(5)).await;
    assert_big(&got[0], "orphan");
    // Its worker dies; another, allowing one delivery, reclaims it after the lease.
    tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
    let other = fx.other_broker(1).await;
    // A malformed big entry (no `kind`), added by hand.
    let mut add = cmd("XADD");
    add.arg(fx.key("")).arg("*").arg("job_id").arg("no-kind");
    for i in 0..MANY {
        add.arg(format!("h.n{i}")).arg("v");
    }
    let _: String = fx.q(&add).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while fx.dead().await.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            fx.dead().await.len()
        );
        let got = other
            .claim(
                QUEUE,
                10,
                Duration::from_millis(100),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .unwrap_or_else(|e| panic!("every claim succeeds: {e}"));
        if let Some(d) = got.deliveries.first() {
            assert_eq!(d.delivered, Some(2), "its second delivery");
            assert_big(d, "orphan");
        }
        let run = refuse_as_the_runtime(&other, got)
            .await
            .unwrap_or_else(|e| panic!("every dead letter is written: {e}"));
        assert!(run.is_empty(), "nothing runs: {:?}", ids(&run));
    }
    let dead = fx.dead().await;
    let by_job: BTreeMap<String, &BTreeMap<String, Vec<u8>>> =
        dead.iter().map(|f| (text(f, "job_id"), f)).collect();
    assert!(text(by_job["orphan"], "error").contains("delivered 2 times"));
    assert!(text(by_job["no-kind"], "error").contains("`kind`"));
    for f in by_job.values() {
        assert!(f.len() > MANY, "every field kept: {}", f.len());
    }
}

/// Adds a big job by hand (no script: `XADD` takes any number of fields) to `key`, with
/// `extra` fields after the job's own.
async fn xadd_big(fx: &Fx, key: &str, id: &str, extra: &[(&str, &str)]) {
    let mut add = cmd("XADD");
    add.arg(key)
        .arg("*")
        .arg("kind")
        .arg(KIND)
        .arg("job_id")
        .arg(id)
        .arg("payload")
        .arg(format!("{{\"job\":\"{id}\"}}"));
    for i in 0..MANY {
        add.arg(format!("h.n{i:05}")).arg(format!("v{i}"));
    }
    for (k, v) in extra {
        add.arg(*k).arg(*v);
    }
    let _: String = fx.q(&add).await;
}

/// Each path a big job takes, by itself (the test above stops at its first failure): a
/// big entry added by hand is retried now, retried later (the delayed set and the mover) and
/// dead-lettered; a big dead letter is replayed; a big delayed job is moved. Each failed on
/// Lua's `unpack` limit before.
async fn a_big_entry_takes(path: &str) {
    let fx = Fx::new(On::Standalone).await;
    let fail = || Failure::new(FailureCause::Error, "again", "");
    match path {
        "replay" => {
            xadd_big(&fx, &fx.key(":dead"), "big", &[("origin", QUEUE)]).await;
            let r = fx
                .broker
                .replay(DEAD, &DeadSelector::All)
                .await
                .expect("replay");
            assert_eq!((r.replayed, r.failed), (1, 0), "{r:?}");
        }
        "delayed" => {
            assert!(
                fx.publish(big("big"), Some(Duration::from_millis(100)))
                    .await
                    .expect("publish delayed")
            );
        }
        _ => {
            xadd_big(&fx, &fx.key(""), "big", &[]).await;
            let got = fx.claim_n(1, Duration::from_secs(5)).await;
            assert_big(&got[0], "big");
            let s = match path {
                "retry now" => Settlement::Retry {
                    delay: Duration::ZERO,
                    failure: fail(),
                },
                "retry later" => Settlement::Retry {
                    delay: Duration::from_millis(100),
                    failure: fail(),
                },
                _ => Settlement::DeadLetter {
                    target: DEAD.to_owned(),
                    failure: fail(),
                },
            };
            assert_eq!(
                fx.broker.settle(QUEUE, &got[0], s).await.expect(path),
                Settled::Done,
                "{path}"
            );
            if path == "dead letter" {
                let dead = fx.dead().await;
                assert_eq!(dead.len(), 1);
                assert!(dead[0].len() > MANY, "every field kept");
                return;
            }
        }
    }
    let got = fx.claim_n(1, Duration::from_secs(5)).await;
    assert_big(&got[0], "big");
    fx.ack(&got[0]).await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_entry_is_retried_now() {
    a_big_entry_takes("retry now").await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_entry_is_retried_later() {
    a_big_entry_takes("retry later").await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_entry_is_dead_lettered() {
    a_big_entry_takes("dead letter").await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_dead_letter_is_replayed() {
    a_big_entry_takes("replay").await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_delayed_job_is_moved() {
    a_big_entry_takes("delayed").await;
}

/// The reclaim script, facing a dead stream of the wrong type, used to claim the idle entries
/// (`XAUTOCLAIM`, their delivery counted) and then fail: every claim failed, and the entries
/// stayed with this consumer, never delivered, a delivery spent. Now the reclaim touches no
/// dead stream: the entry comes back with its delivery count, its dead letter (the runtime's
/// poison count) fails naming the key and writes nothing, and once the key is fixed it is
/// dead-lettered from the same delivery.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_facing_a_dead_stream_of_the_wrong_type() {
    let fx = Fx::new(On::Standalone).await;
    assert!(fx.publish(job("orphan"), None).await.expect("publish"));
    let got = fx.claim_n(1, Duration::from_secs(5)).await;
    assert_eq!(ids(&got), ["orphan"]);
    let dead = fx.key(":dead");
    let _: () = fx.q(cmd("SET").arg(&dead).arg("oops")).await;
    tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
    let other = fx.other_broker(1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let got = loop {
        assert!(tokio::time::Instant::now() < deadline, "reclaimed");
        let got = other
            .claim(
                QUEUE,
                10,
                Duration::from_millis(100),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .unwrap_or_else(|e| panic!("the claim goes on: {e}"));
        if !got.is_empty() {
            break got;
        }
    };
    assert_eq!(ids(&got), ["orphan"]);
    assert_eq!(
        got[0].delivered,
        Some(2),
        "no delivery spent by the reclaim"
    );
    let failure = Failure::new(FailureCause::Poison, "delivered 2 times", "");
    let target = other.default_dead_letter(QUEUE);
    let dead_letter = || Settlement::DeadLetter {
        target: target.clone(),
        failure: failure.clone(),
    };
    let e = other
        .settle(QUEUE, &got[0], dead_letter())
        .await
        .expect_err("the dead stream is not a stream");
    assert!(e.to_string().contains(&dead), "names the key: {e}");
    let _: i64 = fx.q(cmd("DEL").arg(&dead)).await;
    let settled = other
        .settle(QUEUE, &got[0], dead_letter())
        .await
        .expect("dead-lettered once the key is fixed");
    assert_eq!(settled, Settled::Done);
    let letters = fx.dead().await;
    assert_eq!(letters.len(), 1, "once");
    assert!(text(&letters[0], "error").contains("delivered 2 times"));
}

/// A mover's lock of the wrong type (a hash) used to read as a lock held forever: no delayed
/// job moved and nothing said why. Now the error is logged, naming the key.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mover_lock_of_the_wrong_type_is_reported() {
    logs();
    let fx = Fx::new(On::Standalone).await;
    let lock = fx.key(":mover");
    let _: i64 = fx.q(cmd("HSET").arg(&lock).arg("a").arg("b")).await;
    assert!(
        fx.publish(job("later"), Some(Duration::from_millis(50)))
            .await
            .expect("publish")
    );
    assert!(fx.publish(job("now"), None).await.expect("publish"));
    let got = fx.claim_n(1, Duration::from_secs(5)).await;
    assert_eq!(ids(&got), ["now"]);
    fx.ack(&got[0]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = fx
        .broker
        .claim(
            QUEUE,
            10,
            Duration::from_millis(100),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert!(got.is_empty(), "the delayed job cannot move yet");
    let lines = logged(&lock);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("ERROR") && l.contains("hash") && l.contains("DEL")),
        "logged, naming the key, its type and the fix: {lines:#?}"
    );
    let _: i64 = fx.q(cmd("DEL").arg(&lock)).await;
    let got = fx.claim_n(1, Duration::from_secs(5)).await;
    assert_eq!(ids(&got), ["later"]);
}

/// Dead-lettering a malformed entry, facing an ids set of the wrong type, used to write the
/// dead letter, acknowledge and delete the entry, then fail. Now the claim returns it as
/// unreadable, and its dead letter fails before writing anything, naming the key; once fixed,
/// the entry is dead-lettered once.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_claim_time_dead_letter_writes_nothing() {
    let fx = Fx::new(On::Standalone).await;
    let mut add = cmd("XADD");
    add.arg(fx.key(""))
        .arg("*")
        .arg("job_id")
        .arg("no-kind")
        .arg("payload")
        .arg("{}");
    let _: String = fx.q(&add).await;
    let ids_key = fx.key(":ids");
    let _: () = fx.q(cmd("SET").arg(&ids_key).arg("oops")).await;
    let got = fx
        .broker
        .claim(
            QUEUE,
            10,
            Duration::from_millis(100),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("the claim reads the entry");
    assert!(got.deliveries.is_empty(), "{:?}", ids(&got));
    let [item] = &got.unreadable[..] else {
        panic!("one unreadable item: {:?}", got.unreadable);
    };
    assert!(item.error.contains("`kind`"), "{}", item.error);
    let target = fx.broker.default_dead_letter(QUEUE);
    let e = fx
        .broker
        .dead_letter_unreadable(QUEUE, item, &target)
        .await
        .expect_err("the dead letter fails");
    assert!(fx.dead().await.is_empty(), "nothing was written: {e}");
    assert!(e.to_string().contains(&ids_key), "names the key: {e}");
    let _: i64 = fx.q(cmd("DEL").arg(&ids_key)).await;
    let settled = fx
        .broker
        .dead_letter_unreadable(QUEUE, item, &target)
        .await
        .expect("dead-lettered once the key is fixed");
    assert_eq!(settled, Settled::Done);
    let dead = fx.dead().await;
    assert_eq!(dead.len(), 1, "once");
    assert!(text(&dead[0], "error").contains("`kind`"));
}

/// Settlements sent after the server forgot its scripts (`SCRIPT FLUSH`, as a restart or a
/// failover to a replica that never ran them does): the settle batch's `NOSCRIPT` is answered by
/// loading the script and calling again, and every job is settled once.
async fn settles_after_the_scripts_are_flushed(on: On) {
    let fx = Fx::new(on).await;
    for i in 0..3 {
        assert!(
            fx.publish(job(&format!("f{i}")), None)
                .await
                .expect("publish")
        );
    }
    let ds = fx.claim_n(3, Duration::from_secs(5)).await;
    let _: Value = fx.q(cmd("SCRIPT").arg("FLUSH")).await;
    for d in &ds {
        fx.ack(d).await;
    }
    // Nothing is left to claim, and the acknowledged jobs are not delivered again after
    // their lease.
    tokio::time::sleep(LEASE * 2).await;
    let again = fx
        .broker
        .claim(
            QUEUE,
            10,
            Duration::from_millis(200),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert!(again.is_empty(), "settled once: {:?}", ids(&again));
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_settles_after_the_scripts_are_flushed() {
    settles_after_the_scripts_are_flushed(On::Standalone).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_settles_after_the_scripts_are_flushed() {
    settles_after_the_scripts_are_flushed(On::Cluster).await;
}
