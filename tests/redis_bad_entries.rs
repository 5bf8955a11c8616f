//! Entries added by hand (`XADD` with raw fields, as `redis-cli` or another producer would)
//! whose `attempts` field is bad, next to good entries, on Redis (`REDIS_URL`) and on a Redis
//! Cluster (`REDIS_CLUSTER_URLS`):
//!
//! - a field that is not a whole number of 0 or more (`-1`, `abc`) is a malformed entry: it is
//!   dead-lettered alone, every original field kept as bytes (its `attempts` too), with an
//!   error naming the field, its value and the fix; it never runs as a fresh job;
//! - a number above `MAX_ATTEMPT` (`99999999999`, `4294967295`) saturates there, and an entry
//!   whose field alone reaches its mount's cap (`5` under `max_attempts(3)`) is dead-lettered
//!   by the runtime before it runs, saying it arrived with those attempts spent (not that a
//!   worker died), its dead letter reporting them;
//! - the good entries of the same claim run, with the attempt their field says;
//! - the same holds on the reclaim path (entries a dead worker left pending), where the
//!   runtime's poison count (`max_deliveries`) counts spent attempts without wrapping;
//! - the attempt counter stops at `MAX_ATTEMPT`: a retry at the ceiling is delivered at the
//!   ceiling again.
//!
//! A missing variable fails the test under `scripts/test-all`; a plain `cargo test`
//! without it lists the test as ignored.

mod common_redis;

use std::collections::BTreeMap;
use std::time::Duration;

use common_redis::{Raw, cluster_urls, env_url};
use redis::{Cmd, Value, cmd};
use stagedoor_jobs::broker::MAX_ATTEMPT;
use stagedoor_jobs::broker::{DeadLetters, Inspect};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::testing::{Outcome, TestApp};
use stagedoor_jobs_redis::RedisBroker;

const QUEUE: &str = "jobs";
const DEAD: &str = "jobs:dead";
const GROUP: &str = "stagedoor";
const KIND: &str = "charge";
const CAP: u32 = 3;
const LEASE: Duration = Duration::from_millis(400);
/// The runtime's message for a job claimed beyond its cap because its workers died.
const WORKER_DIED: &str = "a worker died";

fn fresh_namespace() -> String {
    common_redis::fresh_namespace("bad")
}

#[derive(Clone, Copy, Debug)]
enum On {
    Standalone,
    Cluster,
}

/// One test's world: where it runs, its namespace, a plain connection.
struct Fx {
    on: On,
    ns: String,
    raw: Raw,
}

/// A dead entry's fields, names and values as the server holds them.
type RawFields = BTreeMap<Vec<u8>, Vec<u8>>;

impl Fx {
    async fn new(on: On) -> Self {
        let raw = match on {
            On::Standalone => {
                let url = env_url("REDIS_URL");
                let client = redis::Client::open(url.as_str()).expect("REDIS_URL");
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
        Self {
            on,
            ns: fresh_namespace(),
            raw,
        }
    }

    fn broker(&self) -> RedisBroker {
        let b = match self.on {
            On::Standalone => RedisBroker::from_url(env_url("REDIS_URL")),
            On::Cluster => RedisBroker::cluster(cluster_urls()),
        };
        b.namespace(&self.ns).lease(LEASE)
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

    async fn create_group(&self) {
        let mut conn = self.raw.clone();
        let r: redis::RedisResult<Value> = cmd("XGROUP")
            .arg("CREATE")
            .arg(self.key(""))
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        if let Err(e) = r {
            assert!(e.to_string().contains("BUSYGROUP"), "XGROUP CREATE: {e}");
        }
    }

    /// XADDs an entry with raw fields (names and values as bytes).
    async fn xadd(&self, fields: &[(&[u8], &[u8])]) -> String {
        let mut c = cmd("XADD");
        c.arg(self.key("")).arg("*");
        for (k, v) in fields {
            c.arg(*k).arg(*v);
        }
        self.q(&c).await
    }

    /// A job entry of kind [`KIND`] as a producer writes it, with `attempts` as given (`None`:
    /// no such field).
    async fn job(&self, job_id: &str, attempts: Option<&str>) -> String {
        let payload = format!("{{\"job\":\"{job_id}\"}}");
        let mut f: Vec<(&[u8], &[u8])> = vec![
            (b"kind", KIND.as_bytes()),
            (b"job_id", job_id.as_bytes()),
            (b"payload", payload.as_bytes()),
        ];
        if let Some(a) = attempts {
            f.push((b"attempts", a.as_bytes()));
        }
        self.xadd(&f).await
    }

    /// The dead stream's entries by `job_id`, raw.
    async fn dead(&self) -> BTreeMap<String, RawFields> {
        let v: Value = self
            .q(cmd("XRANGE").arg(self.key(":dead")).arg("-").arg("+"))
            .await;
        let mut out = BTreeMap::new();
        for e in array(&v) {
            let [_, f] = array(e) else {
                panic!("an XRANGE entry: {e:?}")
            };
            let fields: RawFields = array(f)
                .chunks(2)
                .map(|c| (bytes(&c[0]), bytes(&c[1])))
                .collect();
            let job = String::from_utf8_lossy(&fields[b"job_id".as_slice()]).into_owned();
            out.insert(job, fields);
        }
        out
    }

    async fn xlen(&self, key: &str) -> i64 {
        self.q(cmd("XLEN").arg(key)).await
    }

    async fn pending(&self) -> i64 {
        let v: Value = self.q(cmd("XPENDING").arg(self.key("")).arg(GROUP)).await;
        match array(&v).first() {
            Some(Value::Int(n)) => *n,
            other => panic!("XPENDING: {other:?}"),
        }
    }

    async fn wait_until_settled(&self, dead: i64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (len, pending, d) = (
                self.xlen(&self.key("")).await,
                self.pending().await,
                self.xlen(&self.key(":dead")).await,
            );
            if len == 0 && pending == 0 && d == dead {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "stream {len} entries, {pending} pending, dead {d} (want 0, 0, {dead}); dead: {:#?}",
                self.dead().await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

fn field(f: &RawFields, name: &str) -> String {
    String::from_utf8_lossy(
        f.get(name.as_bytes())
            .unwrap_or_else(|| panic!("no `{name}` field: {f:?}")),
    )
    .into_owned()
}

async fn charge(_job: &serde_json::Value) -> HandlerOutcome {
    HandlerOutcome::ack()
}

async fn app(fx: &Fx, broker: RedisBroker) -> TestApp {
    let _ = fx;
    let service = Service::new(AppInfo::new("bad-entries", "0.1.0")).with_broker(broker, |b| {
        b.include(Subscriber::new(QUEUE, charge).kind(KIND).name("charge"))
            .max_attempts(std::num::NonZeroU32::new(CAP).expect("non-zero"))
            .dead_letter(DEAD);
    });
    TestApp::start_live(service)
        .await
        .unwrap_or_else(|e| panic!("the service starts: {e}"))
}

/// The attempt each job the handler ran saw, by job id. The jobs the runtime refused before
/// they ran (their cap spent on arrival, past the poison count) are not runs.
fn runs(app: &TestApp) -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for r in app.outcomes("charge") {
        if matches!(
            r.outcome,
            Outcome::DeadLettered {
                cause: stagedoor_jobs::FailureCause::Poison,
                ..
            }
        ) {
            continue;
        }
        assert!(matches!(r.outcome, Outcome::Acked), "{r:?}");
        out.entry(r.job_id.to_string()).or_default().push(r.attempt);
    }
    out
}

/// A field name that is not UTF-8 (it must come back as these bytes, not U+FFFD).
const BINARY_NAME: &[u8] = b"h.\xffraw";
const BINARY_VALUE: &[u8] = b"\x00\xfe\xff";

async fn bad_attempts_are_dead_lettered_alone(on: On) {
    let fx = Fx::new(on).await;
    fx.create_group().await;
    fx.job("good-fresh", Some("0")).await;
    fx.xadd(&[
        (b"kind", KIND.as_bytes()),
        (b"job_id", b"bad-negative"),
        (b"payload", b"{}"),
        (b"attempts", b"-1"),
        (BINARY_NAME, BINARY_VALUE),
    ])
    .await;
    fx.job("good-no-field", None).await;
    fx.job("bad-abc", Some("abc")).await;
    fx.job("bad-huge", Some("99999999999")).await;
    fx.job("bad-u32-max", Some("4294967295")).await;
    fx.job("bad-five", Some("5")).await;
    fx.job("good-two-spent", Some("2")).await;

    let app = app(&fx, fx.broker()).await;
    fx.wait_until_settled(5).await;
    app.drain().await;

    let ran = runs(&app);
    let want: BTreeMap<String, Vec<u32>> = [
        ("good-fresh".to_owned(), vec![1]),
        ("good-no-field".to_owned(), vec![1]),
        ("good-two-spent".to_owned(), vec![3]),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        ran, want,
        "only the good entries run, with the attempt their field says; nothing bad runs as fresh"
    );

    let dead = fx.dead().await;
    assert_eq!(
        dead.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "bad-abc",
            "bad-five",
            "bad-huge",
            "bad-negative",
            "bad-u32-max"
        ],
        "each bad entry is dead-lettered alone: {dead:#?}"
    );
    for (job, value) in [("bad-negative", "-1"), ("bad-abc", "abc")] {
        let d = &dead[job];
        let error = field(d, "error");
        assert!(
            error.contains("`attempts` field")
                && error.contains(&format!("`{value}`"))
                && error.contains("whole number"),
            "{job}: the error names the field, its value and the fix: {error}"
        );
        assert_eq!(
            field(d, "attempts"),
            value,
            "{job}: the malformed field is kept as it was"
        );
        assert_eq!(field(d, "kind"), KIND);
        assert_eq!(field(d, "origin"), QUEUE);
    }
    let negative = &dead["bad-negative"];
    assert_eq!(field(negative, "payload"), "{}");
    assert_eq!(
        negative.get(BINARY_NAME).map(Vec::as_slice),
        Some(BINARY_VALUE),
        "a field whose name is not UTF-8 is kept byte for byte: {negative:?}"
    );
    for (job, value, spent) in [
        ("bad-huge", "99999999999", MAX_ATTEMPT),
        ("bad-u32-max", "4294967295", MAX_ATTEMPT),
        ("bad-five", "5", 5),
    ] {
        let d = &dead[job];
        let error = field(d, "error");
        assert!(
            error.contains(&format!("already spent {spent} attempts"))
                && error.contains(&format!("`{value}`"))
                && error.contains(&format!("max_attempts({CAP})"))
                && error.contains("first delivery"),
            "{job}: the error tells the true story: {error}"
        );
        assert!(
            !error.contains(WORKER_DIED),
            "{job}: it was never delivered before, no worker died: {error}"
        );
        assert_eq!(
            field(d, "attempts"),
            spent.to_string(),
            "{job}: the attempts it reports, saturated at MAX_ATTEMPT"
        );
        assert_eq!(
            field(d, "payload"),
            format!("{{\"job\":\"{job}\"}}"),
            "{job}: fields kept"
        );
    }
    // The library's view of the same dead letters.
    let letters = app.dead_letters(DEAD).await;
    let five = letters
        .iter()
        .find(|d| d.envelope.id().as_str() == "bad-five")
        .expect("the dead letter of bad-five");
    assert_eq!(five.attempts, 5);
    assert_eq!(five.envelope.attempt(), 5);
    app.stop().await;
}

/// Entries a dead worker left pending, reclaimed after the lease: a malformed one is
/// dead-lettered as malformed (not counted as 0 and dead-lettered for its deliveries); the
/// `max_deliveries` script counts a huge field as `MAX_ATTEMPT`, never wrapping or printing
/// `1e+11`; a good one that reaches `max_deliveries` reports its attempts spent.
async fn reclaimed_bad_entries_are_dead_lettered_truthfully(on: On) {
    let fx = Fx::new(on).await;
    fx.create_group().await;
    fx.job("bad-abc", Some("abc")).await;
    fx.job("bad-negative", Some("-1")).await;
    fx.job("bad-huge", Some("99999999999")).await;
    fx.job("good-one-spent", Some("1")).await;
    // A worker reads them all and dies.
    let _: Value = fx
        .q(cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg("ghost")
            .arg("COUNT")
            .arg(10)
            .arg("STREAMS")
            .arg(fx.key(""))
            .arg(">"))
        .await;
    assert_eq!(fx.pending().await, 4);
    tokio::time::sleep(LEASE + Duration::from_millis(200)).await;

    // One delivery without settling is the most: each comes back as delivery 2 and goes to
    // the dead stream without running (or, malformed, as malformed).
    let app = app(&fx, fx.broker().max_deliveries(1)).await;
    fx.wait_until_settled(4).await;
    app.drain().await;
    assert_eq!(runs(&app), BTreeMap::new(), "nothing runs");

    let dead = fx.dead().await;
    for (job, value) in [("bad-abc", "abc"), ("bad-negative", "-1")] {
        let error = field(&dead[job], "error");
        assert!(
            error.contains("`attempts` field") && error.contains(&format!("`{value}`")),
            "{job}: dead-lettered as malformed, naming the field and value: {error}"
        );
        assert_eq!(
            field(&dead[job], "attempts"),
            value,
            "{job}: kept as it was"
        );
    }
    assert_eq!(
        field(&dead["bad-huge"], "attempts"),
        MAX_ATTEMPT.to_string(),
        "saturated, not wrapped: {:?}",
        dead["bad-huge"]
    );
    assert_eq!(
        field(&dead["good-one-spent"], "attempts"),
        "2",
        "1 spent before + 1 delivery that never settled"
    );
    assert!(field(&dead["good-one-spent"], "error").contains("delivered 2 times"));
    app.stop().await;
}

/// The attempt counter of an entry stops at `MAX_ATTEMPT`: an entry that has spent
/// `MAX_ATTEMPT - 1` is delivered as attempt `MAX_ATTEMPT`, and after a retry it is delivered
/// as `MAX_ATTEMPT` again (its field says `MAX_ATTEMPT`), never one more, never wrapped.
async fn the_attempt_counter_stops_at_the_ceiling(on: On) {
    use stagedoor_jobs::broker::{Broker, Settled, Settlement};
    use stagedoor_jobs::{Failure, FailureCause};

    let fx = Fx::new(on).await;
    fx.create_group().await;
    let below = (MAX_ATTEMPT - 1).to_string();
    fx.job("at-the-ceiling", Some(&below)).await;
    let broker = fx.broker();
    broker.connect().await.expect("connect");
    broker.prepare(QUEUE).await.expect("prepare");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let got = broker
            .claim(
                QUEUE,
                1,
                Duration::from_secs(2),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim");
        assert_eq!(got.len(), 1, "the entry is delivered");
        seen.push(got[0].envelope.attempt());
        let failure = Failure::new(FailureCause::Error, "once more", "");
        let settled = broker
            .settle(
                QUEUE,
                &got[0],
                Settlement::Retry {
                    delay: Duration::ZERO,
                    failure,
                },
            )
            .await
            .expect("settle");
        assert_eq!(settled, Settled::Done);
    }
    assert_eq!(seen, [MAX_ATTEMPT; 3], "saturated, never above");
    let v: Value = fx.q(cmd("XRANGE").arg(fx.key("")).arg("-").arg("+")).await;
    let entries = array(&v);
    assert_eq!(entries.len(), 1, "{v:?}");
    let fields: RawFields = array(&array(&entries[0])[1])
        .chunks(2)
        .map(|c| (bytes(&c[0]), bytes(&c[1])))
        .collect();
    assert_eq!(field(&fields, "attempts"), MAX_ATTEMPT.to_string());
}

/// One id per job: an entry added without a `job_id` field is delivered with its entry id as
/// its job id, the same id on its retry (a new entry) and in its dead letter.
async fn an_entry_without_a_job_id_keeps_one_id(on: On) {
    use stagedoor_jobs::broker::{Broker, Settled, Settlement};
    use stagedoor_jobs::{Failure, FailureCause};

    let fx = Fx::new(on).await;
    fx.create_group().await;
    let entry = fx
        .xadd(&[(b"kind", KIND.as_bytes()), (b"payload", b"{}".as_slice())])
        .await;
    let broker = fx.broker();
    broker.connect().await.expect("connect");
    broker.prepare(QUEUE).await.expect("prepare");
    let mut seen = Vec::new();
    for n in 0..2 {
        let got = broker
            .claim(
                QUEUE,
                1,
                Duration::from_secs(2),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim");
        assert_eq!(got.len(), 1, "the entry is delivered");
        seen.push(got[0].envelope.id().to_string());
        let failure = Failure::new(FailureCause::Error, "fails", "");
        let settlement = if n == 0 {
            Settlement::Retry {
                delay: Duration::ZERO,
                failure,
            }
        } else {
            Settlement::DeadLetter {
                target: DEAD.to_owned(),
                failure,
            }
        };
        let settled = broker
            .settle(QUEUE, &got[0], settlement)
            .await
            .expect("settle");
        assert_eq!(settled, Settled::Done);
    }
    assert_eq!(seen, [entry.clone(), entry.clone()], "the entry id, twice");
    let dead = broker
        .dead_letters(DEAD, &stagedoor_jobs::broker::DeadSelector::All, 10)
        .await
        .expect("dead letters");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].envelope.id().as_str(), entry, "{dead:?}");
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_an_entry_without_a_job_id_keeps_one_id() {
    an_entry_without_a_job_id_keeps_one_id(On::Standalone).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_an_entry_without_a_job_id_keeps_one_id() {
    an_entry_without_a_job_id_keeps_one_id(On::Cluster).await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_the_attempt_counter_stops_at_the_ceiling() {
    the_attempt_counter_stops_at_the_ceiling(On::Standalone).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_the_attempt_counter_stops_at_the_ceiling() {
    the_attempt_counter_stops_at_the_ceiling(On::Cluster).await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_bad_attempts_are_dead_lettered_alone() {
    bad_attempts_are_dead_lettered_alone(On::Standalone).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_bad_attempts_are_dead_lettered_alone() {
    bad_attempts_are_dead_lettered_alone(On::Cluster).await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_reclaimed_bad_entries_are_dead_lettered_truthfully() {
    reclaimed_bad_entries_are_dead_lettered_truthfully(On::Standalone).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_reclaimed_bad_entries_are_dead_lettered_truthfully() {
    reclaimed_bad_entries_are_dead_lettered_truthfully(On::Cluster).await;
}
