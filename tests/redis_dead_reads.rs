//! Dead-letter reads sized by the request, not by the dead stream (issue 29, item 5), on Redis
//! (`REDIS_URL`) and on a Redis Cluster (`REDIS_CLUSTER_URLS`), with a dead stream of 2,000
//! letters (a few of them junk: entries with no kind, job id or payload, or a bad `attempts`):
//!
//! - one dead letter by its entry id reads that entry only; by the job id of a recent letter,
//!   at most a page; a listing of 10 of a kind among the newest letters, at most a page; a
//!   listing of every letter holds at most a page at a time;
//! - a replay or a purge of every letter moves or deletes each one once, reading each entry
//!   once (plus at most one page) and holding at most a page at a time; the junk ones go too;
//! - a replay of every letter while another client keeps adding dead letters finishes, and
//!   every letter ends up in the queue or in the dead stream, once.
//!
//! The broker counts the entries the server sends it for these reads
//! (`RedisBroker::dead_entries_read`) and the most one read sent (`dead_largest_read`): each
//! measured call below runs on a broker of its own, so both start at 0.
//!
//! A missing variable fails the test under `scripts/test-all`; a plain `cargo test` without
//! it lists the test as ignored.

mod common_redis;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common_redis::{Raw, cluster_urls, env_url};
use redis::{Cmd, Value, cmd};
use stagedoor_jobs::DeadLetter;
use stagedoor_jobs::broker::{Broker, DeadLetters, DeadSelector, Inspect, ReplayReport};
use stagedoor_jobs_redis::RedisBroker;

const QUEUE: &str = "jobs";
const DEAD: &str = "jobs:dead";
/// The dead letters each test starts with.
const LETTERS: usize = 2_000;
/// The newest this many letters are of kind `recent`, the others of kind `old`.
const RECENT: usize = 20;
/// The entries one read of a dead stream asks for (the broker's page).
const PAGE: u64 = 500;

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

/// A dead letter as [`Fx::fill`] added it.
#[derive(Clone, Debug)]
struct Added {
    /// Its entry's id.
    entry: String,
    /// Its job id: the `job_id` field, or the entry's id for a junk entry (which has none).
    job: String,
    /// Whether it is junk.
    junk: bool,
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
        let fx = Self {
            on,
            ns: common_redis::fresh_namespace("deadreads"),
            raw,
        };
        fx.broker().await.prepare(QUEUE).await.expect("prepare");
        fx
    }

    /// A connected broker of its own: its read counters start at 0.
    async fn broker(&self) -> RedisBroker {
        let b = match self.on {
            On::Standalone => RedisBroker::from_url(env_url("REDIS_URL")),
            On::Cluster => RedisBroker::cluster(cluster_urls()),
        }
        .namespace(&self.ns);
        b.connect().await.expect("connect");
        assert_eq!((b.dead_entries_read(), b.dead_largest_read()), (0, 0));
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

    /// Adds `n` dead letters, oldest first, as the broker writes them (job ids `<prefix>-<i>`;
    /// the newest [`RECENT`] of kind `recent`, the others `old`), every 400th (from the 8th)
    /// a junk entry instead.
    async fn fill(&self, prefix: &str, n: usize) -> Vec<Added> {
        let mut out = Vec::with_capacity(n);
        for start in (0..n).step_by(250) {
            let mut pipe = redis::pipe();
            let mut jobs = Vec::new();
            for i in start..(start + 250).min(n) {
                let junk = i % 400 == 7;
                pipe.add_command(letter(&self.key(":dead"), prefix, i, n, junk));
                jobs.push((junk, format!("{prefix}-{i}")));
            }
            let mut conn = self.raw.clone();
            let ids: Vec<String> = pipe.query_async(&mut conn).await.expect("XADD letters");
            assert_eq!(ids.len(), jobs.len());
            for (entry, (junk, job)) in ids.into_iter().zip(jobs) {
                let job = if junk { entry.clone() } else { job };
                out.push(Added { entry, job, junk });
            }
        }
        out
    }

    async fn xlen(&self, suffix: &str) -> usize {
        self.q(cmd("XLEN").arg(self.key(suffix))).await
    }

    /// The `job_id` field of every entry of a stream, how many times each appears (read 1,000
    /// entries at a time).
    async fn job_ids(&self, suffix: &str) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        let mut start = "-".to_owned();
        loop {
            let v: Value = self
                .q(cmd("XRANGE")
                    .arg(self.key(suffix))
                    .arg(&start)
                    .arg("+")
                    .arg("COUNT")
                    .arg(1000))
                .await;
            for e in array(&v) {
                let [id, f] = array(e) else {
                    panic!("an XRANGE entry: {e:?}")
                };
                let job = array(f)
                    .chunks(2)
                    .find(|c| bytes(&c[0]) == b"job_id")
                    .map(|c| String::from_utf8_lossy(&bytes(&c[1])).into_owned())
                    .unwrap_or_else(|| panic!("an entry without a job id: {e:?}"));
                *out.entry(job).or_insert(0) += 1;
                start = format!("({}", String::from_utf8_lossy(&bytes(id)));
            }
            if array(&v).len() < 1000 {
                return out;
            }
        }
    }
}

/// The XADD of dead letter `i` of `n` to `key`.
fn letter(key: &str, prefix: &str, i: usize, n: usize, junk: bool) -> Cmd {
    let mut c = cmd("XADD");
    c.arg(key).arg("*");
    if junk {
        // No kind, job id or payload, a bad `attempts`, bytes that are not UTF-8.
        c.arg("attempts")
            .arg("abc")
            .arg("junk")
            .arg(&b"\xff\xfe"[..]);
        return c;
    }
    let kind = if i + RECENT >= n { "recent" } else { "old" };
    c.arg("kind")
        .arg(kind)
        .arg("job_id")
        .arg(format!("{prefix}-{i}"))
        .arg("attempts")
        .arg("1")
        .arg("payload")
        .arg(format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(64)))
        .arg("error")
        .arg("boom")
        .arg("traceback")
        .arg("")
        .arg("origin")
        .arg(QUEUE);
    c
}

fn array(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) => a,
        other => panic!("not an array: {other:?}"),
    }
}

fn bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        other => panic!("not a bulk string: {other:?}"),
    }
}

fn ids(letters: &[DeadLetter]) -> Vec<String> {
    letters.iter().map(|d| d.id.clone()).collect()
}

/// What one measured call read: entries in all, and the most in one read.
fn reads(b: &RedisBroker) -> (u64, u64) {
    (b.dead_entries_read(), b.dead_largest_read())
}

/// One letter by its entry id reads that entry; by the job id of a recent letter, at most a
/// page; an id of no letter (a job id, or one shaped like an entry id) finds nothing; an old
/// letter is found by its job id too (past the first page).
async fn one_letter_reads_its_entry(on: On) {
    let fx = Fx::new(on).await;
    let added = fx.fill("job", LETTERS).await;
    let middle = &added[LETTERS / 2 + 1];
    assert!(!middle.junk);

    let b = fx.broker().await;
    let found = b
        .dead_letters(DEAD, &DeadSelector::Id(middle.entry.clone()), 1)
        .await
        .expect("one by entry id");
    assert_eq!(ids(&found), std::slice::from_ref(&middle.entry));
    assert_eq!(found[0].envelope.id().as_str(), middle.job);
    assert_eq!(found[0].envelope.kind(), "old");
    assert_eq!(
        reads(&b),
        (1, 1),
        "one letter by its entry id read that entry only"
    );

    let recent = &added[LETTERS - 10];
    let b = fx.broker().await;
    let found = b
        .dead_letters(DEAD, &DeadSelector::Id(recent.job.clone()), 1)
        .await
        .expect("one by job id");
    assert_eq!(ids(&found), std::slice::from_ref(&recent.entry));
    assert_eq!(found[0].envelope.kind(), "recent");
    let (read, largest) = reads(&b);
    assert!(
        read <= PAGE && largest <= PAGE,
        "a recent letter by its job id read {read} entries of {LETTERS} (at most {largest} at once)"
    );

    // The same, from the dashboard's and the CLI's side: a junk letter by its entry id.
    let junk = added.iter().find(|a| a.junk).expect("a junk letter");
    let b = fx.broker().await;
    let found = b
        .dead_letters(DEAD, &DeadSelector::Id(junk.entry.clone()), 1)
        .await
        .expect("a junk letter by entry id");
    assert_eq!(ids(&found), std::slice::from_ref(&junk.entry));
    assert_eq!(found[0].envelope.id().as_str(), junk.entry);
    assert_eq!(reads(&b), (1, 1));

    // An old letter by its job id: found past the first pages, each read at most a page.
    let old = &added[3];
    let b = fx.broker().await;
    let found = b
        .dead_letters(DEAD, &DeadSelector::Id(old.job.clone()), 1)
        .await
        .expect("an old one by job id");
    assert_eq!(ids(&found), std::slice::from_ref(&old.entry));
    let (read, largest) = reads(&b);
    assert!(
        read <= LETTERS as u64 && largest <= PAGE,
        "{read}, {largest}"
    );

    for missing in ["no-such-job", "1-1", "99999999999999-0"] {
        let b = fx.broker().await;
        let found = b
            .dead_letters(DEAD, &DeadSelector::Id(missing.to_owned()), 1)
            .await
            .expect("an unknown id");
        assert!(found.is_empty(), "{missing}: {found:?}");
        assert!(b.dead_largest_read() <= PAGE, "{missing}");
    }
    assert_eq!(fx.xlen(":dead").await, LETTERS, "reads remove nothing");
}

/// A listing of 10 of a kind among the newest letters reads at most a page, and returns that
/// kind's newest 10; a listing of every letter returns them all, newest first, junk included,
/// reading each once and at most a page at a time; a listing of 25 reads 25.
async fn listings_read_what_they_return(on: On) {
    let fx = Fx::new(on).await;
    let added = fx.fill("job", LETTERS).await;

    let b = fx.broker().await;
    let all = b
        .dead_letters(DEAD, &DeadSelector::All, usize::MAX)
        .await
        .expect("list all");
    let newest_first: Vec<String> = added.iter().rev().map(|a| a.entry.clone()).collect();
    assert_eq!(ids(&all), newest_first, "every letter, newest first");
    let (read, largest) = reads(&b);
    assert!(
        read <= LETTERS as u64 + 1 && largest <= PAGE,
        "a listing of all {LETTERS} letters read {read} entries, {largest} at once"
    );

    let b = fx.broker().await;
    let recent = b
        .dead_letters(DEAD, &DeadSelector::Kind("recent".to_owned()), 10)
        .await
        .expect("by kind");
    let expected: Vec<String> = all
        .iter()
        .filter(|d| d.envelope.kind() == "recent")
        .take(10)
        .map(|d| d.id.clone())
        .collect();
    assert_eq!(ids(&recent), expected, "the kind's newest 10");
    let (read, largest) = reads(&b);
    assert!(
        read <= PAGE && largest <= PAGE,
        "a listing of 10 of a recent kind read {read} entries of {LETTERS}"
    );

    let b = fx.broker().await;
    let page = b
        .dead_letters(DEAD, &DeadSelector::All, 25)
        .await
        .expect("a page");
    assert_eq!(ids(&page), newest_first[..25]);
    assert_eq!(reads(&b), (25, 25));

    let b = fx.broker().await;
    let none = b
        .dead_letters(DEAD, &DeadSelector::Kind("nobody".to_owned()), 10)
        .await
        .expect("a kind of no letter");
    assert!(none.is_empty());
    assert!(b.dead_largest_read() <= PAGE);
}

/// A replay of every letter moves each to the queue once (the junk ones too, each with its
/// entry's id as its job id), reading each entry once and at most a page at a time.
async fn a_replay_of_all_reads_each_entry_once(on: On) {
    let fx = Fx::new(on).await;
    let added = fx.fill("job", LETTERS).await;
    let b = fx.broker().await;
    let report = b.replay(DEAD, &DeadSelector::All).await.expect("replay");
    assert_eq!(
        report,
        ReplayReport {
            replayed: LETTERS as u64,
            ..ReplayReport::default()
        }
    );
    let (read, largest) = reads(&b);
    assert!(
        read <= LETTERS as u64 + PAGE && largest <= PAGE,
        "a replay of {LETTERS} letters read {read} entries, {largest} at once"
    );
    assert_eq!(fx.xlen(":dead").await, 0);
    let queued = fx.job_ids("").await;
    let expected: BTreeMap<String, usize> = added.iter().map(|a| (a.job.clone(), 1)).collect();
    assert_eq!(queued, expected, "each letter is in the queue once");
}

/// A purge of one kind, then of every letter, deletes each selected letter once, reading each
/// entry once and at most a page at a time.
async fn a_purge_reads_each_entry_once(on: On) {
    let fx = Fx::new(on).await;
    fx.fill("job", LETTERS).await;
    let b = fx.broker().await;
    let purged = b
        .purge(DEAD, &DeadSelector::Kind("recent".to_owned()))
        .await
        .expect("purge a kind");
    assert_eq!(purged, RECENT as u64);
    let (read, largest) = reads(&b);
    assert!(
        read <= LETTERS as u64 + PAGE && largest <= PAGE,
        "a purge of a kind read {read} entries, {largest} at once"
    );
    assert_eq!(fx.xlen(":dead").await, LETTERS - RECENT);

    let b = fx.broker().await;
    let purged = b.purge(DEAD, &DeadSelector::All).await.expect("purge all");
    assert_eq!(purged, (LETTERS - RECENT) as u64);
    let (read, largest) = reads(&b);
    assert!(
        read <= LETTERS as u64 + PAGE && largest <= PAGE,
        "a purge of {} letters read {read} entries, {largest} at once",
        LETTERS - RECENT
    );
    assert_eq!(fx.xlen(":dead").await, 0);
    assert_eq!(fx.xlen("").await, 0, "a purge does not touch the queue");
}

/// A replay of every letter while another client keeps adding dead letters finishes; every
/// letter there was is replayed once, and each added one is in the queue or the dead stream,
/// once; each entry is read once.
async fn a_replay_while_letters_keep_coming_loses_nothing(on: On) {
    let fx = Arc::new(Fx::new(on).await);
    let added = fx.fill("job", LETTERS).await;
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let adder = {
        let (fx, stop, count) = (fx.clone(), stop.clone(), count.clone());
        tokio::spawn(async move {
            let mut late = Vec::new();
            // One letter about every millisecond, at most 5,000.
            while !stop.load(Ordering::SeqCst) && late.len() < 5_000 {
                let i = late.len();
                let entry: String = fx
                    .q(&letter(&fx.key(":dead"), "late", i, usize::MAX, false))
                    .await;
                late.push((entry, format!("late-{i}")));
                count.store(late.len(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            late
        })
    };
    // The adder is under way before the replay starts.
    while count.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let b = fx.broker().await;
    let at_start = count.load(Ordering::SeqCst);
    let report = b.replay(DEAD, &DeadSelector::All).await.expect("replay");
    let at_end = count.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    let late = adder.await.expect("the adder");
    assert!(
        at_end > at_start,
        "letters were added while the replay ran ({at_start} before it, {at_end} after)"
    );
    assert_eq!((report.skipped, report.failed), (0, 0), "{report:?}");

    let queued = fx.job_ids("").await;
    let dead = fx.job_ids(":dead").await;
    for a in &added {
        assert_eq!(queued.get(&a.job), Some(&1), "{a:?} is replayed once");
        assert!(!dead.contains_key(&a.job), "{a:?} left the dead stream");
    }
    for (_, job) in &late {
        let n = queued.get(job).copied().unwrap_or(0) + dead.get(job).copied().unwrap_or(0);
        assert_eq!(n, 1, "{job} is in the queue or the dead stream, once");
    }
    assert_eq!(queued.len() + dead.len(), LETTERS + late.len());
    assert_eq!(
        queued.values().sum::<usize>() + dead.values().sum::<usize>(),
        LETTERS + late.len()
    );
    assert_eq!(report.replayed as usize, queued.len());
    let (read, largest) = reads(&b);
    assert!(
        read <= (LETTERS + late.len()) as u64 + PAGE && largest <= PAGE,
        "a replay of {LETTERS} letters ({} added meanwhile) read {read} entries, {largest} at once",
        late.len()
    );
}

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod standalone {
            $(
                #[ignore = "needs Redis: run scripts/test-all"]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::On::Standalone).await;
                }
            )*
        }
        mod cluster {
            $(
                #[ignore = "needs a Redis Cluster: run scripts/test-all"]
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::On::Cluster).await;
                }
            )*
        }
    };
}

on_both!(
    one_letter_reads_its_entry,
    listings_read_what_they_return,
    a_replay_of_all_reads_each_entry_once,
    a_purge_reads_each_entry_once,
    a_replay_while_letters_keep_coming_loses_nothing,
);
