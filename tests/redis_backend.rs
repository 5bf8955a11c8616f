//! The Redis backend against seed 000 (the Stagedoor worker), checked with plain Redis commands.
//!
//! Every test runs in a namespace of its own (`RedisBroker::namespace`), so its keys are
//! `{<ns>jobs}`, `{<ns>jobs}:dead`, `{<ns>jobs}:delayed`, ... and tests never meet. Servers come
//! from `scripts/test-all`: `REDIS_URL` (standalone) and `REDIS_CLUSTER_URLS` (a 3-master
//! cluster); a missing variable fails the test.
//!
//! | seed 000 behaviour | tests |
//! |---|---|
//! | one stream `jobs`, four kinds, each with its own handler, cap, dead letter and backoff; an unknown kind is dead-lettered naming it | [`each_kind_reaches_its_own_handler`] |
//! | the dead entry: every original field plus `error`, `traceback`, `attempts`, `failed_at`; the render dead after its 2 attempts | [`a_poison_render_is_dead_lettered_as_the_seed_shows_it`], [`a_panic_is_dead_lettered_with_its_location`] |
//! | a malformed entry is dead-lettered at the loop's edge | [`malformed_entries_are_dead_lettered_naming_the_missing_field`] |
//! | delayed jobs in the sorted set, retries with attempts + 1, the mover's lock, no duplicates | [`delayed_jobs_wait_in_the_sorted_set`], [`a_failed_attempt_waits_in_the_delayed_set_and_is_acked`], [`the_movers_lock_is_released_only_by_its_owner`], [`three_workers_moving_one_due_set_run_each_job_once`] |
//! | the dead stream trimmed at about 10,000 | [`the_dead_stream_is_trimmed_at_about_ten_thousand`] |
//! | poison: deleted entries forgotten, max deliveries | [`an_entry_deleted_while_pending_is_forgotten`], [`an_entry_delivered_max_deliveries_times_is_dead_lettered_without_running`], [`claims_never_settled_end_in_the_dead_stream`] |
//! | reconnects | [`the_worker_lives_on_through_a_server_restart`] |
//! | bad input at startup | [`an_unreachable_server_fails_start_in_one_line`], [`a_queue_name_with_braces_is_refused`], ... |
//!
//! The flows of items 1, 2 and 4 run on the cluster too (`cluster::*`).

mod common_redis;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common_redis::{Raw, cluster_urls, env_url};
use redis::{Cmd, Value, cmd};
use serde_json::{Value as Json, json};
use stagedoor_jobs::broker::Delivery;
use stagedoor_jobs::broker::{DeadLetters, Inspect, Locks};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{Broker, DeadSelector, Envelope, Publish, Running, ServiceError};
use stagedoor_jobs_redis::{RedisBroker, RedisReceipt, Stream};

/// The stream of seed 000.
const QUEUE: &str = "jobs";
/// Its dead letter.
const DEAD: &str = "jobs:dead";
/// The consumer group of the backend.
const GROUP: &str = "stagedoor";
/// The lease of every broker here.
const LEASE: Duration = Duration::from_millis(500);
/// How long a test waits for something the worker does.
const PATIENCE: Duration = Duration::from_secs(20);
/// The render's backoff: long enough to see the retry in the delayed set.
const RENDER_BACKOFF: Duration = Duration::from_millis(400);
/// The four kinds of seed 000's stream.
const KINDS: [&str; 4] = [
    "expire_holds",
    "render_tickets",
    "send_email",
    "reconcile_payments",
];
const SEAT_ERROR: &str = "SeatLabelInvalid: '14-C' is not a row letter and a seat number";

// ---------------------------------------------------------------------------------------------
// Servers, namespaces, plain Redis
// ---------------------------------------------------------------------------------------------

fn fresh_namespace() -> String {
    common_redis::fresh_namespace("rb")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum On {
    Standalone,
    Cluster,
}

async fn raw_single(url: &str) -> Raw {
    let client = redis::Client::open(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    Raw::Single(
        client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("connecting to {url}: {e}")),
    )
}

/// One test's world: where it runs, its namespace and a plain connection.
struct Fx {
    on: On,
    ns: String,
    raw: Raw,
}

impl Fx {
    async fn new(on: On) -> Self {
        let raw = match on {
            On::Standalone => raw_single(&env_url("REDIS_URL")).await,
            On::Cluster => {
                let client = redis::cluster::ClusterClient::new(cluster_urls())
                    .unwrap_or_else(|e| panic!("REDIS_CLUSTER_URLS: {e}"));
                Raw::Cluster(
                    client
                        .get_async_connection()
                        .await
                        .unwrap_or_else(|e| panic!("connecting to the cluster: {e}")),
                )
            }
        };
        Self {
            on,
            ns: fresh_namespace(),
            raw,
        }
    }

    /// A broker of this test's namespace, lease [`LEASE`].
    fn broker(&self) -> RedisBroker {
        let b = match self.on {
            On::Standalone => RedisBroker::from_url(env_url("REDIS_URL")),
            On::Cluster => RedisBroker::cluster(cluster_urls()),
        };
        b.namespace(&self.ns).lease(LEASE)
    }

    /// The key of the queue `jobs` with `suffix` (`""`, `":dead"`, `":delayed"`, `":mover"`).
    fn key(&self, suffix: &str) -> String {
        format!("{{{}{QUEUE}}}{suffix}", self.ns)
    }

    async fn q<T: redis::FromRedisValue>(&self, c: &Cmd) -> T {
        let mut conn = self.raw.clone();
        c.query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{c:?}: {e}"))
    }

    async fn xlen(&self, key: &str) -> i64 {
        self.q(cmd("XLEN").arg(key)).await
    }

    async fn zcard(&self, key: &str) -> i64 {
        self.q(cmd("ZCARD").arg(key)).await
    }

    /// The group's pending count (0 when the stream or group does not exist).
    async fn pending(&self) -> i64 {
        let mut conn = self.raw.clone();
        let r: redis::RedisResult<Value> = cmd("XPENDING")
            .arg(self.key(""))
            .arg(GROUP)
            .query_async(&mut conn)
            .await;
        match r {
            Ok(v) => array(&v).first().map_or(0, int),
            Err(e) if e.to_string().contains("NOGROUP") => 0,
            Err(e) => panic!("XPENDING: {e}"),
        }
    }

    /// `(id, consumer, idle ms, deliveries)` of every pending entry.
    async fn pending_entries(&self) -> Vec<(String, String, i64, i64)> {
        let v: Value = self
            .q(cmd("XPENDING")
                .arg(self.key(""))
                .arg(GROUP)
                .arg("-")
                .arg("+")
                .arg(100))
            .await;
        array(&v)
            .iter()
            .map(|e| match array(e) {
                [id, consumer, idle, n] => (text(id), text(consumer), int(idle), int(n)),
                other => panic!("an XPENDING entry: {other:?}"),
            })
            .collect()
    }

    /// XRANGE of a stream: `(id, fields in order)`.
    async fn xrange(&self, key: &str) -> Vec<(String, Vec<(String, String)>)> {
        let v: Value = self.q(cmd("XRANGE").arg(key).arg("-").arg("+")).await;
        array(&v)
            .iter()
            .map(|e| match array(e) {
                [id, fields] => (text(id), pairs(fields)),
                other => panic!("an XRANGE entry: {other:?}"),
            })
            .collect()
    }

    /// The dead stream's entries, as maps.
    async fn dead(&self) -> Vec<BTreeMap<String, String>> {
        self.xrange(&self.key(":dead"))
            .await
            .into_iter()
            .map(|(_, f)| f.into_iter().collect())
            .collect()
    }

    /// The delayed set: `(fields of the member, score)`.
    async fn delayed(&self) -> Vec<(Vec<(String, String)>, f64)> {
        let v: Value = self
            .q(cmd("ZRANGE")
                .arg(self.key(":delayed"))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES"))
            .await;
        array(&v)
            .chunks(2)
            .map(|c| match c {
                [Value::BulkString(m), score] => {
                    (unpack(m), text(score).parse().expect("a numeric score"))
                }
                other => panic!("a ZRANGE pair: {other:?}"),
            })
            .collect()
    }

    /// XADDs an entry by hand (as another producer would); its id.
    async fn xadd(&self, key: &str, fields: &[(&str, &str)]) -> String {
        let mut c = cmd("XADD");
        c.arg(key).arg("*");
        for (k, v) in fields {
            c.arg(*k).arg(*v);
        }
        self.q(&c).await
    }

    /// Creates the group (as a worker's start would) if it is not there.
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

    /// Asserts that nothing is left on the stream (no entry, nothing pending), once the
    /// settlements under way (a handler has returned, its ack is on the wire) have landed.
    async fn assert_stream_empty(&self, context: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::time::Instant::now() < deadline
            && (self.xlen(&self.key("")).await != 0 || self.pending().await != 0)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            self.xrange(&self.key("")).await,
            Vec::new(),
            "{context}: the stream should be empty"
        );
        assert_eq!(self.pending().await, 0, "{context}: nothing pending");
    }
}

fn array(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => &[],
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Double(d) => d.to_string(),
        Value::VerbatimString { text, .. } => text.clone(),
        other => panic!("not a string: {other:?}"),
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => text(other).parse().expect("an integer"),
    }
}

fn pairs(v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Map(m) => m.iter().map(|(k, v)| (text(k), text(v))).collect(),
        other => array(other)
            .chunks(2)
            .map(|c| (text(&c[0]), text(&c[1])))
            .collect(),
    }
}

/// A delayed member (a MessagePack array of strings: field, value, ...) as field pairs.
fn unpack(m: &[u8]) -> Vec<(String, String)> {
    fn be(b: &[u8]) -> usize {
        b.iter().fold(0, |n, x| (n << 8) | usize::from(*x))
    }
    let (n, mut i) = match m[0] {
        b if b & 0xf0 == 0x90 => (usize::from(b & 0x0f), 1),
        0xdc => (be(&m[1..3]), 3),
        0xdd => (be(&m[1..5]), 5),
        other => panic!("not a MessagePack array: {other:#x}"),
    };
    let mut items = Vec::with_capacity(n);
    for _ in 0..n {
        let (len, header) = match m[i] {
            b if b & 0xe0 == 0xa0 => (usize::from(b & 0x1f), 1),
            0xd9 => (be(&m[i + 1..i + 2]), 2),
            0xda => (be(&m[i + 1..i + 3]), 3),
            0xdb => (be(&m[i + 1..i + 5]), 5),
            other => panic!("not a MessagePack string: {other:#x}"),
        };
        i += header;
        items.push(String::from_utf8_lossy(&m[i..i + len]).into_owned());
        i += len;
    }
    assert_eq!(i, m.len(), "the whole member is read");
    items
        .chunks(2)
        .map(|c| (c[0].clone(), c[1].clone()))
        .collect()
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
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

// ---------------------------------------------------------------------------------------------
// Seed 000's worker: four kinds on one stream
// ---------------------------------------------------------------------------------------------

/// One handler call.
#[derive(Clone, Debug)]
struct Run {
    handler: &'static str,
    kind: String,
    job: String,
    attempt: u32,
    at: DateTime<Utc>,
}

/// Every handler call of a service (or of several sharing it).
#[derive(Default)]
struct Log {
    runs: Mutex<Vec<Run>>,
}

impl Log {
    fn record(&self, handler: &'static str, kind: String, job: &JobId, attempt: Option<u32>) {
        self.runs.lock().expect("log").push(Run {
            handler,
            kind,
            job: job.to_string(),
            attempt: attempt.expect("Redis counts attempts"),
            at: Utc::now(),
        });
    }
    fn runs(&self) -> Vec<Run> {
        self.runs.lock().expect("log").clone()
    }
    fn runs_of(&self, job: &str) -> Vec<Run> {
        self.runs().into_iter().filter(|r| r.job == job).collect()
    }
}

/// The barcode encoder's refusal: the source of the render's error.
#[derive(Debug, thiserror::Error)]
#[error("barcode_for: the encoder refused the label '{0}'")]
struct BarcodeRefused(String);

/// The render's error, as seed 000 prints it.
#[derive(Debug, thiserror::Error)]
#[error("SeatLabelInvalid: '{label}' is not a row letter and a seat number")]
struct SeatLabelInvalid {
    label: String,
    #[source]
    source: BarcodeRefused,
}

/// The mail provider's 503.
#[derive(Debug, thiserror::Error)]
#[error("mail provider returned 503")]
struct ProviderUnavailable;

/// Where the reconciliation's panic happens (its traceback names the line).
static PANIC_LINE: AtomicU32 = AtomicU32::new(0);

async fn expire_holds(
    _: &Json,
    Data(log): Data<Arc<Log>>,
    Ctx(kind): Ctx<keys::Kind>,
    Ctx(job): Ctx<keys::JobId>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    log.record("expire_holds", kind, &job, attempt);
    HandlerOutcome::ack()
}

/// Fails on seat `14-C` on every attempt; renders anything else.
async fn render_tickets(
    msg: &Json,
    Data(log): Data<Arc<Log>>,
    Ctx(kind): Ctx<keys::Kind>,
    Ctx(job): Ctx<keys::JobId>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> Result<HandlerOutcome, SeatLabelInvalid> {
    log.record("render_tickets", kind, &job, attempt);
    match msg.get("seat").and_then(Json::as_str) {
        Some(label) if label.contains('-') => Err(SeatLabelInvalid {
            label: label.to_owned(),
            source: BarcodeRefused(label.to_owned()),
        }),
        _ => Ok(HandlerOutcome::ack()),
    }
}

/// `{"fail_first": n}` fails its first n attempts (with `"retry_after_ms"`: asks for that delay).
async fn send_email(
    msg: &Json,
    Data(log): Data<Arc<Log>>,
    Ctx(kind): Ctx<keys::Kind>,
    Ctx(job): Ctx<keys::JobId>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> Result<HandlerOutcome, ProviderUnavailable> {
    log.record("send_email", kind, &job, attempt);
    let fail_first = msg.get("fail_first").and_then(Json::as_u64).unwrap_or(0);
    if u64::from(attempt.unwrap_or(0)) <= fail_first {
        return match msg.get("retry_after_ms").and_then(Json::as_u64) {
            Some(ms) => Ok(HandlerOutcome::retry_after(Duration::from_millis(ms))),
            None => Err(ProviderUnavailable),
        };
    }
    Ok(HandlerOutcome::ack())
}

/// `{"panic": true}` panics (no retry: the next night's run covers it).
async fn reconcile_payments(
    msg: &Json,
    Data(log): Data<Arc<Log>>,
    Ctx(kind): Ctx<keys::Kind>,
    Ctx(job): Ctx<keys::JobId>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    log.record("reconcile_payments", kind, &job, attempt);
    if msg.get("panic").and_then(Json::as_bool) == Some(true) {
        PANIC_LINE.store(line!() + 1, Ordering::SeqCst);
        panic!("Payrail statement has no closing balance");
    }
    HandlerOutcome::ack()
}

fn on_jobs(kind: &str) -> Stream {
    Stream::new(QUEUE).kind(kind)
}

/// Seed 000's worker: one stream, four kinds, each with its handler, cap, dead letter and
/// backoff (shortened for the tests).
fn seed_worker(broker: RedisBroker, log: &Arc<Log>) -> Service {
    Service::new(AppInfo::new("stagedoor-worker", "0.1.0"))
        .state(Arc::clone(log))
        .shutdown_timeout(Duration::from_secs(5))
        .with_broker(broker, |b| {
            b.include(Subscriber::new(on_jobs("expire_holds"), expire_holds).name("expire_holds"))
                .max_attempts(nonzero!(3u32))
                .dead_letter(DEAD)
                .backoff(Fixed::new(Duration::from_millis(50)));
            // "The PDF render retries once."
            b.include(
                Subscriber::new(on_jobs("render_tickets"), render_tickets).name("render_tickets"),
            )
            .max_attempts(nonzero!(2u32))
            .dead_letter(DEAD)
            .backoff(Fixed::new(RENDER_BACKOFF));
            // "The email send retries 5 times with the full-jitter backoff."
            b.include(Subscriber::new(on_jobs("send_email"), send_email).name("send_email"))
                .max_attempts(nonzero!(5u32))
                .dead_letter(DEAD)
                .backoff(FullJitter::new(
                    Duration::from_millis(10),
                    Duration::from_millis(100),
                ));
            // "The reconciliation does not retry at all."
            b.include(
                Subscriber::new(on_jobs("reconcile_payments"), reconcile_payments)
                    .name("reconcile_payments"),
            )
            .max_attempts(nonzero!(1u32))
            .dead_letter(DEAD);
        })
}

async fn start(service: Service) -> Running {
    service
        .start()
        .await
        .unwrap_or_else(|e| panic!("the worker should start: {e}"))
}

fn job(kind: &str, payload: Json) -> Job {
    Job::new(QUEUE, &payload).expect("encodes").kind(kind)
}

async fn publish(running: &Running, job: Job) -> String {
    running
        .publish(job)
        .await
        .unwrap_or_else(|e| panic!("publish: {e}"))
        .id()
        .to_string()
}

// ---------------------------------------------------------------------------------------------
// 1. One stream, four kinds
// ---------------------------------------------------------------------------------------------

/// Each kind's jobs reach its handler only, once; a kind with no handler is dead-lettered with
/// an error naming it.
async fn each_kind_reaches_its_own_handler(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    let running = start(seed_worker(fx.broker(), &log)).await;

    let mut published: HashMap<&str, HashSet<String>> = HashMap::new();
    for n in 0..5 {
        for kind in KINDS {
            let id = publish(&running, job(kind, json!({ "n": n, "seat": "14C" }))).await;
            published.entry(kind).or_default().insert(id);
        }
    }
    let stray = publish(
        &running,
        job("purge_idempotency_keys", json!({ "older_than_hours": 24 })).request_id("9c1d"),
    )
    .await;

    eventually("20 jobs ran and 1 was dead-lettered", PATIENCE, || async {
        log.runs().len() >= 20 && fx.xlen(&fx.key(":dead")).await >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let runs = log.runs();
    assert_eq!(runs.len(), 20, "each job ran once: {runs:#?}");
    for kind in KINDS {
        let ran: Vec<&Run> = runs.iter().filter(|r| r.handler == kind).collect();
        assert!(
            ran.iter().all(|r| r.kind == kind && r.attempt == 1),
            "the {kind} handler saw only its kind, first attempts: {ran:#?}"
        );
        let ids: HashSet<String> = ran.iter().map(|r| r.job.clone()).collect();
        assert_eq!(ids, published[kind], "every {kind} job reached its handler");
    }
    assert!(
        runs.iter().all(|r| r.job != stray),
        "no handler ran the unknown kind"
    );

    let dead = fx.dead().await;
    assert_eq!(dead.len(), 1, "{dead:#?}");
    let d = &dead[0];
    assert_eq!(d["kind"], "purge_idempotency_keys");
    assert_eq!(d["job_id"], stray);
    assert_eq!(d["request_id"], "9c1d");
    assert!(
        d["error"].contains("`purge_idempotency_keys`") && d["error"].contains("no handler"),
        "the error names the kind: {}",
        d["error"]
    );
    assert_eq!(d["attempts"], "1");
    fx.assert_stream_empty("after the run").await;
    assert_eq!(fx.zcard(&fx.key(":delayed")).await, 0);
    running.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 2. The dead entry
// ---------------------------------------------------------------------------------------------

/// The seat label that crashes the renderer: an entry added by the relay (with its own fields
/// `order_id` and `outbox_id`) and one published through the API fail on both of their 2
/// attempts, wait in the delayed set in between, and reach `jobs:dead` as seed 000 shows it:
/// every original field, plus `error`, `traceback`, `attempts`, `failed_at`.
async fn a_poison_render_is_dead_lettered_as_the_seed_shows_it(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    let broker = fx.broker();
    let running = start(seed_worker(broker.clone(), &log)).await;
    let started = Utc::now();

    // As the relay adds it (seed 000: `XADD jobs kind render_tickets order_id 4471 ...`).
    let relay_job = JobId::new().to_string();
    let enqueued = Utc::now().timestamp_millis().to_string();
    let relay_fields: Vec<(&str, &str)> = vec![
        ("kind", "render_tickets"),
        ("order_id", "4471"),
        ("outbox_id", "88210"),
        ("job_id", &relay_job),
        ("attempts", "0"),
        ("payload", r#"{"order_id":4471,"seat":"14-C"}"#),
        ("enqueued_at", &enqueued),
        ("request_id", "7f3a9c2e"),
        ("trace", "4bf92f35"),
    ];
    fx.xadd(&fx.key(""), &relay_fields).await;
    // Through the API.
    let api_job = publish(
        &running,
        job(
            "render_tickets",
            json!({ "order_id": 4472, "seat": "14-C" }),
        )
        .request_id("8e4b0d3f")
        .trace("5ca03a46"),
    )
    .await;

    // Between its attempts, each job is a member of the delayed set, not a stream entry.
    eventually(
        "the first attempts failed and wait in the delayed set",
        PATIENCE,
        || async { fx.zcard(&fx.key(":delayed")).await == 2 },
    )
    .await;
    for (member, _) in fx.delayed().await {
        assert_eq!(field(&member, "attempts"), Some("1"), "{member:?}");
        assert_eq!(field(&member, "kind"), Some("render_tickets"));
    }

    eventually("both renders are dead", PATIENCE, || async {
        fx.xlen(&fx.key(":dead")).await == 2
    })
    .await;
    let dead = fx.xrange(&fx.key(":dead")).await;
    let by_job = |id: &str| -> Vec<(String, String)> {
        dead.iter()
            .find(|(_, f)| field(f, "job_id") == Some(id))
            .unwrap_or_else(|| panic!("no dead entry for {id}: {dead:#?}"))
            .1
            .clone()
    };

    let relay_dead = by_job(&relay_job);
    for (k, v) in &relay_fields {
        if *k != "attempts" {
            assert_eq!(
                field(&relay_dead, k),
                Some(*v),
                "the dead entry keeps the original field {k}: {relay_dead:#?}"
            );
        }
    }
    let names: HashSet<&str> = relay_dead.iter().map(|(k, _)| k.as_str()).collect();
    for added in ["error", "traceback", "attempts", "failed_at"] {
        assert!(names.contains(added), "`{added}` is added: {relay_dead:#?}");
    }

    for (id, request_id, trace) in [
        (relay_job.as_str(), "7f3a9c2e", "4bf92f35"),
        (api_job.as_str(), "8e4b0d3f", "5ca03a46"),
    ] {
        let d = by_job(id);
        assert_eq!(field(&d, "kind"), Some("render_tickets"));
        assert_eq!(field(&d, "attempts"), Some("2"), "tried twice: {d:#?}");
        assert_eq!(field(&d, "error"), Some(SEAT_ERROR));
        assert_eq!(
            field(&d, "traceback"),
            Some("caused by: barcode_for: the encoder refused the label '14-C'"),
            "the error's source chain"
        );
        assert_eq!(field(&d, "request_id"), Some(request_id));
        assert_eq!(field(&d, "trace"), Some(trace));
        let failed_at = DateTime::parse_from_rfc3339(field(&d, "failed_at").expect("failed_at"))
            .expect("failed_at is RFC 3339")
            .with_timezone(&Utc);
        assert!(
            failed_at >= started - chrono::Duration::seconds(1) && failed_at <= Utc::now(),
            "failed_at {failed_at} is the time it failed"
        );
        let runs: Vec<(u32, &str)> = log
            .runs_of(id)
            .iter()
            .map(|r| (r.attempt, r.handler))
            .collect();
        assert_eq!(
            runs,
            [(1, "render_tickets"), (2, "render_tickets")],
            "2 attempts"
        );
        let times: Vec<DateTime<Utc>> = log.runs_of(id).iter().map(|r| r.at).collect();
        assert!(
            times[1] - times[0] >= chrono::Duration::from_std(RENDER_BACKOFF).expect("fits"),
            "the retry waited its backoff: {times:?}"
        );
    }
    assert_eq!(
        field(&by_job(&api_job), "payload"),
        Some(r#"{"order_id":4472,"seat":"14-C"}"#)
    );

    // The broker reads it back the same way.
    let letters = broker
        .dead_letters(DEAD, &DeadSelector::Id(relay_job.clone()), 10)
        .await
        .expect("dead letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].origin, QUEUE);
    assert_eq!(letters[0].attempts, 2);
    assert_eq!(letters[0].error, SEAT_ERROR);
    fx.assert_stream_empty("after the renders").await;
    assert_eq!(fx.zcard(&fx.key(":delayed")).await, 0);
    running.shutdown().await;
}

/// A panic's traceback is its location; the reconciliation (no retries) dies on its first
/// attempt.
async fn a_panic_is_dead_lettered_with_its_location(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    let running = start(seed_worker(fx.broker(), &log)).await;
    let id = publish(
        &running,
        job(
            "reconcile_payments",
            json!({ "panic": true, "date": "2025-09-18" }),
        ),
    )
    .await;
    eventually("the reconciliation is dead", PATIENCE, || async {
        fx.xlen(&fx.key(":dead")).await == 1
    })
    .await;
    let d = &fx.dead().await[0];
    assert_eq!(d["job_id"], id);
    assert_eq!(d["attempts"], "1", "no retry");
    assert_eq!(
        d["error"],
        "panic: Payrail statement has no closing balance"
    );
    let line = PANIC_LINE.load(Ordering::SeqCst);
    assert!(
        d["traceback"].contains(&format!("redis_backend.rs:{line}:")),
        "the traceback names the panic's line {line}: {}",
        d["traceback"]
    );
    assert_eq!(log.runs_of(&id).len(), 1);
    fx.assert_stream_empty("after the panic").await;
    assert_eq!(
        fx.zcard(&fx.key(":delayed")).await,
        0,
        "not retried: nothing delayed"
    );
    running.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 3. Malformed entries
// ---------------------------------------------------------------------------------------------

/// An entry without `kind` and one without `payload`, added by hand, go to the dead stream with
/// an error naming the missing field; neither is acked silently nor left pending.
async fn malformed_entries_are_dead_lettered_naming_the_missing_field(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    let running = start(seed_worker(fx.broker(), &log)).await;
    fx.xadd(
        &fx.key(""),
        &[
            ("job_id", "no-kind"),
            ("attempts", "0"),
            ("payload", "{}"),
            ("request_id", "r-no-kind"),
        ],
    )
    .await;
    fx.xadd(
        &fx.key(""),
        &[
            ("kind", "expire_holds"),
            ("job_id", "no-payload"),
            ("attempts", "0"),
        ],
    )
    .await;
    // A good one after them still runs.
    let good = publish(&running, job("expire_holds", json!({}))).await;

    eventually("both malformed entries are dead", PATIENCE, || async {
        fx.xlen(&fx.key(":dead")).await == 2
    })
    .await;
    eventually("the good job ran", PATIENCE, || async {
        log.runs_of(&good).len() == 1
    })
    .await;
    let dead = fx.dead().await;
    let of = |id: &str| {
        dead.iter()
            .find(|d| d.get("job_id").map(String::as_str) == Some(id))
            .unwrap_or_else(|| panic!("no dead entry for {id}: {dead:#?}"))
    };
    let no_kind = of("no-kind");
    assert!(
        no_kind["error"].contains("no `kind` field"),
        "{}",
        no_kind["error"]
    );
    assert_eq!(no_kind["request_id"], "r-no-kind", "its fields are kept");
    assert_eq!(no_kind["payload"], "{}");
    let no_payload = of("no-payload");
    assert!(
        no_payload["error"].contains("no `payload` field"),
        "{}",
        no_payload["error"]
    );
    assert_eq!(no_payload["kind"], "expire_holds");
    assert_eq!(log.runs().len(), 1, "no handler ran a malformed entry");
    fx.assert_stream_empty("after the malformed entries").await;
    running.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 4. Delayed jobs
// ---------------------------------------------------------------------------------------------

/// `Job::after` and `Job::at` wait in the sorted set, not on the stream, and move to the stream
/// when due.
async fn delayed_jobs_wait_in_the_sorted_set(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    let running = start(seed_worker(fx.broker(), &log)).await;
    let published = Utc::now();
    let delay = Duration::from_millis(1500);
    let due = published + chrono::Duration::from_std(delay).expect("fits");
    let after = publish(&running, job("send_email", json!({})).after(delay)).await;
    let at = publish(&running, job("expire_holds", json!({})).at(due)).await;
    let now = publish(&running, job("expire_holds", json!({}))).await;

    eventually("the job due now ran", PATIENCE, || async {
        log.runs_of(&now).len() == 1
    })
    .await;
    assert!(Utc::now() < due, "the test is too slow to see the wait");
    assert_eq!(
        fx.zcard(&fx.key(":delayed")).await,
        2,
        "both wait in the set"
    );
    let members = fx.delayed().await;
    let ids: HashSet<&str> = members
        .iter()
        .filter_map(|(m, _)| field(m, "job_id"))
        .collect();
    assert_eq!(ids, HashSet::from([after.as_str(), at.as_str()]));
    for (m, score) in &members {
        assert_eq!(field(m, "attempts"), Some("0"));
        assert!(
            (*score - due.timestamp_millis() as f64).abs() < 1_000.0,
            "scored by its due time (ms): {score} vs {due}"
        );
    }
    // The job due now left the stream once acknowledged (its handler's end is logged before
    // that); the delayed ones are not on it yet.
    eventually("the job due now settled", PATIENCE, || async {
        fx.xlen(&fx.key("")).await == 0
    })
    .await;
    assert!(Utc::now() < due, "the test is too slow to see the wait");
    assert_eq!(fx.xlen(&fx.key("")).await, 0, "not on the stream yet");
    assert!(log.runs_of(&after).is_empty() && log.runs_of(&at).is_empty());

    eventually("the delayed jobs ran", PATIENCE, || async {
        log.runs_of(&after).len() == 1 && log.runs_of(&at).len() == 1
    })
    .await;
    for id in [&after, &at] {
        let r = &log.runs_of(id)[0];
        assert!(r.at >= due, "not before it was due: ran {} due {due}", r.at);
        assert_eq!(r.attempt, 1);
    }
    assert_eq!(fx.zcard(&fx.key(":delayed")).await, 0);
    fx.assert_stream_empty("after the delayed jobs").await;
    running.shutdown().await;
}

/// A failed attempt under the cap becomes a member of the delayed set with attempts + 1, and the
/// original entry is acknowledged and gone from the stream; it runs again when due.
async fn a_failed_attempt_waits_in_the_delayed_set_and_is_acked(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    let running = start(seed_worker(fx.broker(), &log)).await;
    let id = publish(
        &running,
        job(
            "send_email",
            json!({ "to": "ada@example.com", "fail_first": 1, "retry_after_ms": 1500 }),
        )
        .request_id("7f3a9c2e"),
    )
    .await;
    let original = fx.xrange(&fx.key("")).await;
    let original_id = original
        .iter()
        .find(|(_, f)| field(f, "job_id") == Some(id.as_str()))
        .map(|(entry, _)| entry.clone());

    eventually("the first attempt failed", PATIENCE, || async {
        fx.zcard(&fx.key(":delayed")).await == 1
    })
    .await;
    let failed_at = Utc::now();
    assert_eq!(log.runs_of(&id).len(), 1);
    let (member, score) = fx.delayed().await.remove(0);
    assert_eq!(field(&member, "job_id"), Some(id.as_str()));
    assert_eq!(field(&member, "attempts"), Some("1"), "attempts + 1");
    assert_eq!(field(&member, "kind"), Some("send_email"));
    assert_eq!(field(&member, "request_id"), Some("7f3a9c2e"));
    assert!(
        field(&member, "payload").is_some_and(|p| p.contains("ada@example.com")),
        "{member:?}"
    );
    let due = score as i64 - failed_at.timestamp_millis();
    assert!(
        (1_000..=1_600).contains(&due),
        "due 1.5 s after the failure, as the handler asked: {due} ms"
    );
    // Acknowledged: nothing pending, the original entry gone.
    assert_eq!(fx.pending().await, 0, "the failed delivery is acked");
    assert_eq!(fx.xlen(&fx.key("")).await, 0, "the original entry is gone");
    if let Some(entry) = original_id {
        let v: Value = fx
            .q(cmd("XRANGE").arg(fx.key("")).arg(&entry).arg(&entry))
            .await;
        assert!(array(&v).is_empty(), "{entry} is deleted");
    }

    eventually("the second attempt ran", PATIENCE, || async {
        log.runs_of(&id).len() == 2
    })
    .await;
    let runs = log.runs_of(&id);
    assert_eq!(runs[1].attempt, 2);
    assert!(runs[1].at - runs[0].at >= chrono::Duration::milliseconds(1_500));
    eventually("the job is done", PATIENCE, || async {
        fx.pending().await == 0 && fx.xlen(&fx.key("")).await == 0
    })
    .await;
    assert_eq!(fx.zcard(&fx.key(":delayed")).await, 0);
    assert_eq!(fx.xlen(&fx.key(":dead")).await, 0);
    running.shutdown().await;
}

/// The mover's lock: while another token holds it, due jobs are not moved and the lock is left
/// alone; once released, the worker moves them and releases its own lock. The scheduler's
/// locks (`try_lock`/`unlock`) likewise release only for their owner.
async fn the_movers_lock_is_released_only_by_its_owner(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    let mover = fx.key(":mover");
    let _: () = fx
        .q(cmd("SET")
            .arg(&mover)
            .arg("worker-02")
            .arg("PX")
            .arg(60_000))
        .await;
    let broker = fx.broker();
    let running = start(seed_worker(broker.clone(), &log)).await;
    let id = publish(
        &running,
        job("expire_holds", json!({})).after(Duration::from_millis(100)),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        log.runs_of(&id).is_empty(),
        "not moved under another's lock"
    );
    assert_eq!(fx.zcard(&fx.key(":delayed")).await, 1);
    let holder: Option<String> = fx.q(cmd("GET").arg(&mover)).await;
    assert_eq!(
        holder.as_deref(),
        Some("worker-02"),
        "another token's lock is left alone"
    );
    let ttl: i64 = fx.q(cmd("PTTL").arg(&mover)).await;
    assert!(ttl > 50_000, "and its expiry too: {ttl} ms");

    // worker-02 releases it.
    let _: i64 = fx.q(cmd("DEL").arg(&mover)).await;
    eventually("the job is moved and runs", PATIENCE, || async {
        log.runs_of(&id).len() == 1
    })
    .await;
    eventually("the worker released its own lock", PATIENCE, || async {
        let holder: Option<String> = fx.q(cmd("GET").arg(&mover)).await;
        holder.is_none()
    })
    .await;

    // The scheduler's lock: `SET sched:expire_holds worker-01 NX EX 55`.
    let ttl = Duration::from_secs(55);
    assert!(
        broker
            .try_lock("sched:expire_holds", "worker-01", ttl)
            .await
            .expect("try_lock")
    );
    assert!(
        !broker
            .try_lock("sched:expire_holds", "worker-02", ttl)
            .await
            .expect("try_lock"),
        "exactly one worker wins"
    );
    broker
        .unlock("sched:expire_holds", "worker-02")
        .await
        .expect("unlock");
    assert!(
        !broker
            .try_lock("sched:expire_holds", "worker-03", ttl)
            .await
            .expect("try_lock"),
        "another token's unlock left worker-01's lock alone"
    );
    broker
        .unlock("sched:expire_holds", "worker-01")
        .await
        .expect("unlock");
    assert!(
        broker
            .try_lock("sched:expire_holds", "worker-03", ttl)
            .await
            .expect("try_lock"),
        "the owner's unlock released it"
    );
    // The lock lives in the broker's namespace: another namespace does not see it.
    if on == On::Standalone {
        let other = RedisBroker::from_url(env_url("REDIS_URL")).namespace(fresh_namespace());
        other.connect().await.expect("connect");
        assert!(
            other
                .try_lock("sched:expire_holds", "worker-04", ttl)
                .await
                .expect("try_lock"),
            "a lock of another namespace is another lock"
        );
        other
            .unlock("sched:expire_holds", "worker-04")
            .await
            .expect("unlock");
    }
    broker
        .unlock("sched:expire_holds", "worker-03")
        .await
        .expect("unlock");
    running.shutdown().await;
}

/// Three workers (three brokers, three consumers) on one stream; 200 delayed jobs due at the
/// same moment: every job runs exactly once.
async fn three_workers_moving_one_due_set_run_each_job_once(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(start(seed_worker(fx.broker(), &log)).await);
    }
    let due = Utc::now() + chrono::Duration::milliseconds(2_000);
    let mut ids = HashSet::new();
    for n in 0..200 {
        let kind = if n % 2 == 0 {
            "expire_holds"
        } else {
            "send_email"
        };
        ids.insert(publish(&workers[n % 3], job(kind, json!({ "n": n })).at(due)).await);
    }
    assert!(Utc::now() < due, "publishing took too long to see the wait");
    assert_eq!(
        fx.zcard(&fx.key(":delayed")).await,
        200,
        "all wait in the set"
    );
    eventually("200 jobs ran", PATIENCE, || async {
        log.runs().len() >= 200
    })
    .await;
    // Time for a duplicate to show up, if the movers made one.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let runs = log.runs();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for r in &runs {
        *count.entry(r.job.as_str()).or_default() += 1;
        assert!(r.at >= due, "not before due");
    }
    let twice: Vec<_> = count.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "run more than once: {twice:?}");
    assert_eq!(runs.len(), 200);
    assert_eq!(
        count
            .keys()
            .map(|k| (*k).to_owned())
            .collect::<HashSet<_>>(),
        ids
    );
    assert_eq!(fx.zcard(&fx.key(":delayed")).await, 0);
    fx.assert_stream_empty("after the 200 jobs").await;
    for w in workers {
        w.shutdown().await;
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Dead stream trimming
// ---------------------------------------------------------------------------------------------

/// The dead stream is trimmed at about 10,000 entries, and the trim is counted.
async fn the_dead_stream_is_trimmed_at_about_ten_thousand(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    let dead = fx.key(":dead");
    let mut pipe = redis::pipe();
    for n in 0..10_100 {
        pipe.cmd("XADD")
            .arg(&dead)
            .arg("*")
            .arg("kind")
            .arg("dummy")
            .arg("n")
            .arg(n)
            .ignore();
    }
    let mut conn = fx.raw.clone();
    let _: () = pipe
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("filling the dead stream: {e}"));
    assert_eq!(fx.xlen(&dead).await, 10_100);

    let broker = fx.broker();
    let running = start(seed_worker(broker.clone(), &log)).await;
    assert_eq!(broker.trimmed(), 0);
    let id = publish(
        &running,
        job("reconcile_payments", json!({ "panic": true })),
    )
    .await;
    eventually("the job was dead-lettered", PATIENCE, || async {
        !log.runs_of(&id).is_empty() && fx.pending().await == 0
    })
    .await;
    let len = fx.xlen(&dead).await;
    assert!(
        (10_000..10_101).contains(&len),
        "trimmed to about 10,000: {len}"
    );
    assert!(len < 10_101, "not 10,101");
    assert_eq!(
        broker.trimmed(),
        (10_101 - len) as u64,
        "the trim is counted"
    );
    let last = fx
        .q::<Value>(
            cmd("XREVRANGE")
                .arg(&dead)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1),
        )
        .await;
    let newest = pairs(&array(&array(&last)[0])[1]);
    assert_eq!(
        field(&newest, "job_id"),
        Some(id.as_str()),
        "the newest is kept"
    );

    // A poison entry dead-lettered by the reclaim (its workers died) is trimmed and counted too.
    // (The worker is stopped while the entry is delivered to the ghosts.)
    running.shutdown().await;
    let before = broker.trimmed();
    let mut pipe = redis::pipe();
    for n in 0..200 {
        pipe.cmd("XADD")
            .arg(&dead)
            .arg("*")
            .arg("kind")
            .arg("dummy")
            .arg("n")
            .arg(n)
            .ignore();
    }
    let _: () = pipe
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("filling the dead stream: {e}"));
    let filled = fx.xlen(&dead).await;
    fx.xadd(
        &fx.key(""),
        &[
            ("kind", "expire_holds"),
            ("job_id", "poison"),
            ("attempts", "0"),
            ("payload", "{}"),
        ],
    )
    .await;
    deliver_to_ghosts(&fx, 3).await;
    let running = start(seed_worker(broker.clone(), &log)).await;
    eventually("the poison entry is dead", PATIENCE, || async {
        fx.pending().await == 0 && fx.xlen(&fx.key("")).await == 0
    })
    .await;
    let len = fx.xlen(&dead).await;
    assert!((10_000..10_101).contains(&len), "trimmed again: {len}");
    assert_eq!(
        broker.trimmed() - before,
        (filled + 1 - len) as u64,
        "the reclaim's trim is counted"
    );
    assert!(
        log.runs_of("poison").is_empty(),
        "the poison entry did not run"
    );
    running.shutdown().await;
}

/// Delivers the stream's undelivered entry to `n` consumers that die at once (`ghost-1`, ...):
/// XREADGROUP by the first, XCLAIM by the others.
async fn deliver_to_ghosts(fx: &Fx, n: usize) {
    let v: Value = fx
        .q(cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg("ghost-1")
            .arg("COUNT")
            .arg(1)
            .arg("STREAMS")
            .arg(fx.key(""))
            .arg(">"))
        .await;
    // [[stream, [[id, fields]]]]
    let entries = array(&v)
        .first()
        .and_then(|s| array(s).get(1))
        .map(array)
        .unwrap_or_default();
    let [entry] = entries else {
        panic!("ghost-1 read one entry: {v:?}")
    };
    let id = text(&array(entry)[0]);
    for g in 2..=n {
        let _: Value = fx
            .q(cmd("XCLAIM")
                .arg(fx.key(""))
                .arg(GROUP)
                .arg(format!("ghost-{g}"))
                .arg(0)
                .arg(&id))
            .await;
    }
    let p = fx.pending_entries().await;
    assert_eq!(p.len(), 1);
    assert_eq!(
        (p[0].1.clone(), p[0].3),
        (format!("ghost-{n}"), n as i64),
        "delivered {n} times"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Poison
// ---------------------------------------------------------------------------------------------

/// An entry deleted (XDEL) while pending with another consumer: once its idle time passes the
/// lease, XAUTOCLAIM reports it as deleted and the worker acknowledges and forgets it.
async fn an_entry_deleted_while_pending_is_forgotten(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    fx.create_group().await;
    let id = fx
        .xadd(
            &fx.key(""),
            &[
                ("kind", "expire_holds"),
                ("job_id", "deleted"),
                ("attempts", "0"),
                ("payload", "{}"),
            ],
        )
        .await;
    deliver_to_ghosts(&fx, 1).await;
    let deleted: i64 = fx.q(cmd("XDEL").arg(fx.key("")).arg(&id)).await;
    assert_eq!(deleted, 1);
    assert_eq!(fx.pending().await, 1, "still pending with ghost-1");

    let running = start(seed_worker(fx.broker(), &log)).await;
    eventually("the deleted entry is forgotten", PATIENCE, || async {
        fx.pending().await == 0
    })
    .await;
    // The worker lives on.
    let good = publish(&running, job("expire_holds", json!({}))).await;
    eventually("a new job runs", PATIENCE, || async {
        log.runs_of(&good).len() == 1
    })
    .await;
    assert!(log.runs_of("deleted").is_empty(), "nothing ran for it");
    assert_eq!(fx.xlen(&fx.key(":dead")).await, 0, "not dead-lettered");
    fx.assert_stream_empty("after the deleted entry").await;
    running.shutdown().await;
}

/// An entry delivered `max_deliveries` (3) times without being settled (three consumers that
/// read it and died) goes to the dead stream on its next claim, without running; the error
/// names the delivery count.
async fn an_entry_delivered_max_deliveries_times_is_dead_lettered_without_running(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    fx.create_group().await;
    let id = fx
        .xadd(
            &fx.key(""),
            &[
                ("kind", "render_tickets"),
                ("job_id", "poison"),
                ("attempts", "0"),
                ("payload", r#"{"order_id":4471}"#),
                ("request_id", "7f3a9c2e"),
            ],
        )
        .await;
    deliver_to_ghosts(&fx, 3).await;
    assert_eq!(fx.pending_entries().await[0].0, id);

    let broker = fx.broker().max_deliveries(3);
    let running = start(seed_worker(broker, &log)).await;
    eventually("the poison entry is dead", PATIENCE, || async {
        fx.xlen(&fx.key(":dead")).await == 1
    })
    .await;
    let d = &fx.dead().await[0];
    assert_eq!(d["job_id"], "poison");
    assert_eq!(d["request_id"], "7f3a9c2e");
    assert!(
        d["error"].contains("delivered 4 times") && d["error"].contains("max_deliveries 3"),
        "the error names the delivery count: {}",
        d["error"]
    );
    assert_eq!(d["attempts"], "3", "3 deliveries spent");
    assert!(log.runs_of("poison").is_empty(), "it did not run");
    fx.assert_stream_empty("after the poison entry").await;
    running.shutdown().await;
}

/// The same through the broker's own claims: claimed 3 times (each lease left to expire) and
/// never settled, the job's 4th delivery reports its count (`delivered` 4, past the broker's
/// poison count 3), and a worker's runtime dead-lettered it without running it.
async fn claims_never_settled_end_in_the_dead_stream(on: On) {
    let fx = Fx::new(on).await;
    let log = Arc::new(Log::default());
    let broker = fx.broker().max_deliveries(3);
    broker.connect().await.expect("connect");
    broker.prepare(QUEUE).await.expect("prepare");
    assert_eq!(
        broker.poison_count(),
        3,
        "max_deliveries sets the poison count"
    );
    let env = Envelope::new("send_email", b"{}".to_vec(), Utc::now());
    let id = env.id().to_string();
    broker
        .publish(QUEUE, vec![(env, None)])
        .await
        .expect("publish");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let got = claim_one(&broker).await;
        assert_eq!(got.envelope.id().as_str(), id);
        seen.push((got.envelope.attempt(), got.delivered));
        // Not settled: the lease lapses, as if the worker died.
        tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    }
    assert_eq!(
        seen,
        [(1, Some(1)), (2, Some(2)), (3, Some(3))],
        "each claim is one attempt and one delivery more"
    );
    let running = start(seed_worker(broker, &log)).await;
    eventually("the job is dead", PATIENCE, || async {
        fx.xlen(&fx.key(":dead")).await == 1
    })
    .await;
    assert!(log.runs_of(&id).is_empty(), "not run a 4th time");
    let d = &fx.dead().await[0];
    assert_eq!(d["job_id"], id);
    assert!(d["error"].contains("delivered 4 times"), "{}", d["error"]);
    assert_eq!(d["attempts"], "3", "3 deliveries spent");
    fx.assert_stream_empty("after the claims").await;
    running.shutdown().await;
}

async fn claim_one(broker: &RedisBroker) -> Delivery<RedisReceipt> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut got = broker
            .claim(
                QUEUE,
                1,
                Duration::from_millis(200),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim");
        if let Some(d) = got.pop() {
            return d;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing claimed within {PATIENCE:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 7. Reconnects
// ---------------------------------------------------------------------------------------------

/// A redis-server of the test's own, killed with the test.
struct OwnServer {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl OwnServer {
    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .expect("a free port")
            .local_addr()
            .expect("its address")
            .port()
    }

    async fn start(port: u16, dir: &std::path::Path) -> Self {
        std::fs::create_dir_all(dir).expect("the server's dir");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is on PATH (scripts/test-all installs it)");
        let me = Self {
            child,
            port,
            dir: dir.to_owned(),
        };
        let url = me.url();
        let client = redis::Client::open(url.as_str()).expect("a URL");
        eventually("the own server answers PING", PATIENCE, || {
            let client = client.clone();
            async move {
                match client.get_multiplexed_async_connection().await {
                    Ok(mut c) => cmd("PING").query_async::<String>(&mut c).await.is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
        me
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the server");
        self.child.wait().expect("reap the server");
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server is killed and restarted under a running worker (without persistence its jobs
/// are lost with it); the worker reconnects and runs the jobs published after the restart.
#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_worker_lives_on_through_a_server_restart() {
    let _ = env_url("REDIS_URL"); // runs under scripts/test-all, which puts redis-server on PATH
    let port = OwnServer::free_port();
    let dir = std::env::temp_dir().join(format!("stagedoor-redis-restart-{}", std::process::id()));
    let mut server = OwnServer::start(port, &dir).await;
    let log = Arc::new(Log::default());
    let broker = RedisBroker::from_url(server.url())
        .namespace(fresh_namespace())
        .lease(LEASE);
    let running = start(seed_worker(broker, &log)).await;
    let before = publish(&running, job("expire_holds", json!({}))).await;
    eventually("a job runs before the restart", PATIENCE, || async {
        log.runs_of(&before).len() == 1
    })
    .await;

    server.kill();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let _server = OwnServer::start(port, &dir).await;

    // Publishing may fail while the connection comes back.
    let mut after = Vec::new();
    for kind in ["expire_holds", "send_email", "render_tickets"] {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            match running.publish(job(kind, json!({ "seat": "14C" }))).await {
                Ok(published) => {
                    after.push(published.id().to_string());
                    break;
                }
                Err(e) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "publish after the restart: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    eventually(
        "the jobs published after the restart run",
        PATIENCE,
        || async { after.iter().all(|id| log.runs_of(id).len() == 1) },
    )
    .await;
    running.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 8. Bad input
// ---------------------------------------------------------------------------------------------

async fn ok(_: &Json) -> HandlerOutcome {
    HandlerOutcome::ack()
}

fn one_mount(broker: RedisBroker, dead: &str) -> Service {
    Service::new(AppInfo::new("bad-input", "0.1.0")).with_broker(broker, |b| {
        b.include(Subscriber::new(on_jobs("send_email"), ok).name("send_email"))
            .max_attempts(nonzero!(5u32))
            .dead_letter(dead);
    })
}

async fn start_err(service: Service) -> ServiceError {
    match tokio::time::timeout(Duration::from_secs(60), service.start()).await {
        Ok(Ok(_)) => panic!("the service should not start"),
        Ok(Err(e)) => e,
        Err(_) => panic!("start neither failed nor succeeded within 60 s"),
    }
}

#[tokio::test]
async fn an_unreachable_server_fails_start_in_one_line() {
    let url = "redis://127.0.0.1:1/";
    let started = tokio::time::Instant::now();
    let err = start_err(one_mount(RedisBroker::from_url(url), DEAD)).await;
    let text = err.to_string();
    assert!(matches!(err, ServiceError::Connect { .. }), "{err:?}");
    assert!(!text.contains('\n'), "one line: {text:?}");
    assert!(text.contains(url), "names the URL: {text}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "fails fast: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_malformed_url_fails_start_naming_the_expected_form() {
    let err = start_err(one_mount(RedisBroker::from_url("not a url"), DEAD)).await;
    let text = err.to_string();
    assert!(!text.contains('\n'), "one line: {text:?}");
    assert!(
        text.contains("not a url") && text.contains("redis://[user:password@]host:port/db"),
        "names the expected form: {text}"
    );
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test]
async fn a_dead_letter_that_is_not_the_dead_stream_refuses_to_start() {
    let broker = RedisBroker::from_url(env_url("REDIS_URL")).namespace(fresh_namespace());
    let err = start_err(one_mount(broker, "jobs.dead")).await;
    let text = err.to_string();
    let ServiceError::Refused { problems, .. } = err else {
        panic!("a refusal: {text}");
    };
    assert_eq!(problems.len(), 1, "{text}");
    assert!(
        problems[0].mount.contains("send_email") && problems[0].mount.contains("`jobs`"),
        "{text}"
    );
    assert!(
        problems[0]
            .message
            .contains(r#"write `.dead_letter("jobs:dead")`"#),
        "names the fix: {text}"
    );
}

/// A queue name holding `{` or `}` would end its keys' hash tag early (`{ns}a{b}` is tagged
/// `ns}a{b`'s first braces: on a Cluster its keys would land in other slots, CROSSSLOT, and
/// `queues()` would misread the name). It is refused at startup, naming the fix, and at
/// publish; nothing is stored, and the Redis broker goes on publishing good names.
async fn a_queue_name_with_braces_is_refused(on: On) {
    let fx = Fx::new(on).await;
    let service = Service::new(AppInfo::new("bad-input", "0.1.0")).with_broker(fx.broker(), |b| {
        b.include(Subscriber::new("mail{eu}", ok).name("braces"));
    });
    let err = start_err(service).await;
    let text = err.to_string();
    let ServiceError::Refused { problems, .. } = err else {
        panic!("a refusal: {text}");
    };
    assert_eq!(problems.len(), 1, "{text}");
    assert!(
        problems[0].mount.contains("braces")
            && problems[0].message.contains("`mail{eu}`")
            && problems[0].message.contains("such as `maileu`"),
        "names the name and the fix: {text}"
    );

    let broker = fx.broker();
    broker.connect().await.expect("connect");
    for q in ["mail{eu}", "{mail}", "mail}", ""] {
        match broker.publish_job(job_on(q)).await {
            Err(stagedoor_jobs::BrokerError::Invalid(m)) => {
                assert!(m.contains("queue name"), "{m}")
            }
            other => panic!("publishing to {q:?} is refused, not {other:?}"),
        }
    }
    let got = broker
        .publish_job(job_on("mail_eu"))
        .await
        .expect("a good name");
    assert!(got.is_stored());
    assert_eq!(broker.stats("mail_eu").await.expect("stats").ready, 1);
    if on == On::Standalone {
        // (A Cluster connection's SCAN answers for one node.)
        let names = broker.queues().await.expect("queues");
        assert_eq!(names, ["mail_eu"], "nothing else stored");
    }
}

/// A namespace holding `{` or `}` would end every key's hash tag early, as a queue name
/// would: connecting refuses it, naming the fix, before anything is stored.
#[tokio::test]
async fn a_namespace_with_braces_is_refused_at_connect() {
    for ns in ["app{1}:", "{app", "app}"] {
        let broker = RedisBroker::from_url("redis://127.0.0.1:1/").namespace(ns);
        match broker.connect().await {
            Err(stagedoor_jobs::BrokerError::Invalid(m)) => assert!(
                m.contains(&format!("`{ns}`")) && m.contains("namespace without braces"),
                "names the namespace and the fix: {m}"
            ),
            other => panic!("namespace {ns:?} is refused at connect, not {other:?}"),
        }
    }
}

fn job_on(queue: &str) -> Job {
    Job::new(queue, &json!({ "n": 1 })).expect("encode")
}

// ---------------------------------------------------------------------------------------------
// Standalone and cluster
// ---------------------------------------------------------------------------------------------

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod standalone {
            $(
                #[ignore = "needs Redis: run scripts/test-all"]
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::On::Standalone).await;
                }
            )*
        }
        mod cluster {
            $(
                #[ignore = "needs a Redis Cluster: run scripts/test-all"]
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::On::Cluster).await;
                }
            )*
        }
    };
}

on_both!(
    each_kind_reaches_its_own_handler,
    a_poison_render_is_dead_lettered_as_the_seed_shows_it,
    a_panic_is_dead_lettered_with_its_location,
    malformed_entries_are_dead_lettered_naming_the_missing_field,
    delayed_jobs_wait_in_the_sorted_set,
    a_failed_attempt_waits_in_the_delayed_set_and_is_acked,
    the_movers_lock_is_released_only_by_its_owner,
    three_workers_moving_one_due_set_run_each_job_once,
    the_dead_stream_is_trimmed_at_about_ten_thousand,
    an_entry_deleted_while_pending_is_forgotten,
    an_entry_delivered_max_deliveries_times_is_dead_lettered_without_running,
    claims_never_settled_end_in_the_dead_stream,
    a_queue_name_with_braces_is_refused,
);

// ---------------------------------------------------------------------------------------------
// Batches
// ---------------------------------------------------------------------------------------------

/// One `publish` of 1,200 jobs, more than one script call carries (so several calls in one
/// transaction): every job arrives exactly once, those due now in the stream in the batch's
/// order and the delayed ones in the delayed set. A job whose id was already in the queue and
/// one repeated later in the batch (in another call's share, and delayed this time) are not
/// added twice: the first of each stays as it was.
async fn a_batch_of_many_calls_arrives_exactly_once(on: On) {
    let fx = Fx::new(on).await;
    let broker = fx.broker();
    broker.connect().await.expect("connect");
    broker.prepare(QUEUE).await.expect("prepare");
    let payload = |n: i64| format!("{{\"n\":{n}}}").into_bytes();
    let earlier = Envelope::new("send_email", payload(-1), Utc::now());
    broker
        .publish(QUEUE, vec![(earlier.clone(), None)])
        .await
        .expect("publish the earlier job");

    let later = Utc::now() + chrono::Duration::hours(1);
    let mut batch = Vec::new();
    let (mut due_now, mut delayed) = (Vec::new(), HashSet::new());
    for n in 0..1_200 {
        let mut env = Envelope::new(KINDS[n % 4], payload(n as i64), Utc::now());
        if n % 7 == 0 {
            // Some jobs carry more fields than others.
            env.headers_mut().request_id = Some(format!("req-{n}"));
            env.headers_mut()
                .extra
                .insert("tenant".into(), format!("t{n}"));
        }
        if n % 3 == 0 {
            delayed.insert(env.id().to_string());
            batch.push((env, Some(later)));
        } else {
            due_now.push(env.id().to_string());
            batch.push((env, None));
        }
    }
    // Job 1 (due now, in the first call's share) again near the end, delayed and changed.
    let first = batch[1].0.clone();
    let repeat = Envelope::new("send_email", payload(-2), Utc::now()).with_id(first.id().clone());
    batch.insert(1_100, (repeat, Some(later)));
    // The earlier job again, in the middle.
    let again = Envelope::new("send_email", payload(-3), Utc::now()).with_id(earlier.id().clone());
    batch.insert(600, (again, None));
    assert_eq!(batch.len(), 1_202);
    broker
        .publish(QUEUE, batch)
        .await
        .expect("publish the batch");

    let entries = fx.xrange(&fx.key("")).await;
    let ids: Vec<String> = entries
        .iter()
        .map(|(_, f)| field(f, "job_id").expect("a job_id").to_owned())
        .collect();
    let mut expected = vec![earlier.id().to_string()];
    expected.extend(due_now.iter().cloned());
    assert_eq!(
        ids.len(),
        expected.len(),
        "every job due now once, the earlier one too"
    );
    assert!(ids == expected, "in the batch's order, each once");
    let payload_of = |id: &str| {
        let (_, f) = entries
            .iter()
            .find(|(_, f)| field(f, "job_id") == Some(id))
            .expect("in the stream");
        field(f, "payload").expect("a payload").to_owned()
    };
    assert_eq!(
        payload_of(earlier.id().as_str()),
        "{\"n\":-1}",
        "not replaced"
    );
    assert_eq!(payload_of(first.id().as_str()), "{\"n\":1}", "not replaced");
    let tagged = entries
        .iter()
        .find(|(_, f)| field(f, "payload") == Some("{\"n\":7}"))
        .expect("job 7 due now");
    assert_eq!(field(&tagged.1, "request_id"), Some("req-7"));
    assert_eq!(field(&tagged.1, "h.tenant"), Some("t7"));

    let waiting = fx.delayed().await;
    let waiting_ids: Vec<String> = waiting
        .iter()
        .map(|(f, _)| field(f, "job_id").expect("a job_id").to_owned())
        .collect();
    assert_eq!(waiting_ids.len(), delayed.len(), "every delayed job once");
    assert_eq!(waiting_ids.into_iter().collect::<HashSet<_>>(), delayed);
    assert!(
        waiting
            .iter()
            .all(|(_, score)| *score as i64 == later.timestamp_millis()),
        "each scored by its due time"
    );
    let members: i64 = fx.q(cmd("SCARD").arg(fx.key(":ids"))).await;
    assert_eq!(members, 1 + 1_200, "the ids of the queue, each once");
}

mod batches {
    #[ignore = "needs Redis: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn standalone() {
        super::a_batch_of_many_calls_arrives_exactly_once(super::On::Standalone).await;
    }

    #[ignore = "needs a Redis Cluster: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn cluster() {
        super::a_batch_of_many_calls_arrives_exactly_once(super::On::Cluster).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Priorities
// ---------------------------------------------------------------------------------------------

/// A worker that is already claiming sees the priority levels another process publishes at:
/// the jobs land in their levels' streams (`{jobs}:p2`, `{jobs}:p-1`), the worker makes each
/// level's group when it first finds its stream (the publisher made it without one), and
/// claims the high job first. An entry added by hand to a level's
/// stream without a `priority` field runs at that stream's level, and its retry goes back there.
async fn levels_published_by_another_process_are_claimed_in_order(on: On) {
    let fx = Fx::new(on).await;
    let worker = fx.broker();
    worker.connect().await.expect("connect");
    worker.prepare(QUEUE).await.expect("prepare");
    let none = worker
        .claim(
            QUEUE,
            4,
            Duration::from_millis(50),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert!(none.is_empty(), "nothing yet");

    let publisher = fx.broker();
    publisher.connect().await.expect("connect");
    let publish = |n: u32, p: Priority| {
        let publisher = publisher.clone();
        async move {
            let job = Job::new(QUEUE, &json!({ "n": n }))
                .expect("json")
                .kind("send_email")
                .priority(p);
            publisher.publish_job(job).await.expect("publish")
        }
    };
    publish(1, Priority::LOW).await;
    publish(2, Priority::NORMAL).await;
    publish(3, Priority::HIGHEST).await;
    assert_eq!(fx.xlen(&fx.key(":p2")).await, 1, "the highest job's stream");
    assert_eq!(fx.xlen(&fx.key(":p-1")).await, 1, "the low job's stream");
    assert_eq!(
        fx.xlen(&fx.key("")).await,
        1,
        "the normal job in the queue's stream"
    );
    for (suffix, exists) in [(":p1", 0), (":p-2", 0), (":levels", 0)] {
        let n: i64 = fx.q(cmd("EXISTS").arg(fx.key(suffix))).await;
        assert_eq!(
            n, exists,
            "no key `{suffix}`: only the levels published at have a stream"
        );
    }

    // One at a time, as a worker of concurrency 1 claims: within the second it looks for the
    // levels' streams again, then claims highest first.
    let mut order = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while order.len() < 3 && tokio::time::Instant::now() < deadline {
        for d in worker
            .claim(
                QUEUE,
                1,
                Duration::from_millis(200),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim")
        {
            let n = serde_json::from_slice::<Json>(d.envelope.payload()).expect("json")["n"]
                .as_u64()
                .expect("n");
            order.push((n, d.envelope.priority()));
            worker
                .settle(QUEUE, &d, stagedoor_jobs::broker::Settlement::Ack)
                .await
                .expect("settle");
        }
    }
    // The first claims may come before the worker looked again (the normal job first); once
    // it has, the highest goes before the low one.
    let pos = |n: u64| order.iter().position(|o| o.0 == n).expect("claimed");
    assert!(pos(3) < pos(1), "the highest before the low: {order:?}");
    assert!(order.contains(&(3, Priority::HIGHEST)) && order.contains(&(1, Priority::LOW)));

    // By hand, to the high stream, with no `priority` field (and a level the worker knows).
    fx.xadd(
        &fx.key(":p2"),
        &[
            ("kind", "send_email"),
            ("job_id", "by-hand"),
            ("attempts", "0"),
            ("payload", r#"{"n":9}"#),
        ],
    )
    .await;
    let mut got = Vec::new();
    while got.is_empty() && tokio::time::Instant::now() < deadline {
        got = worker
            .claim(
                QUEUE,
                1,
                Duration::from_millis(200),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim")
            .deliveries;
    }
    let d = got.pop().expect("the entry added by hand");
    assert_eq!(
        d.envelope.priority(),
        Priority::HIGHEST,
        "its stream's level"
    );
    worker
        .settle(
            QUEUE,
            &d,
            stagedoor_jobs::broker::Settlement::Retry {
                delay: Duration::ZERO,
                failure: stagedoor_jobs::Failure::new(
                    stagedoor_jobs::FailureCause::Error,
                    "again",
                    "",
                ),
            },
        )
        .await
        .expect("settle");
    let back = fx.xrange(&fx.key(":p2")).await;
    assert!(
        back.iter().any(
            |(_, f)| f.contains(&("job_id".to_owned(), "by-hand".to_owned()))
                && f.contains(&("priority".to_owned(), "2".to_owned()))
        ),
        "the retry is back in the high stream, its level written down: {back:?}"
    );
}

mod priorities {
    #[ignore = "needs Redis: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn standalone() {
        super::levels_published_by_another_process_are_claimed_in_order(super::On::Standalone)
            .await;
    }

    #[ignore = "needs a Redis Cluster: run scripts/test-all"]
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn cluster() {
        super::levels_published_by_another_process_are_claimed_in_order(super::On::Cluster).await;
    }
}
