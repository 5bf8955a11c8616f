//! The conformance suite every broker runs (feature `conformance`).
//!
//! One set of behavioural tests, written once against the [`Broker`] contract and the runtime's
//! outcome rules (DESIGN sections 3 and 4), that every backend runs unchanged: the in-memory
//! broker on the harness's paused clock ([`TestApp::start`]), Redis and SQL against real servers
//! on the real clock ([`TestApp::start_live`]). A backend provides a [`Fixture`] and invokes
//! [`conformance_tests!`](crate::conformance_tests) once; each row becomes a `#[tokio::test]`
//! named after the behaviour it checks.
//!
//! ```ignore
//! use std::time::Duration;
//! use stagedoor_jobs::MemoryBroker;
//! use stagedoor_jobs::conformance::Fixture;
//!
//! struct MemoryFixture;
//!
//! impl Fixture for MemoryFixture {
//!     type Broker = MemoryBroker;
//!     async fn broker(&self) -> MemoryBroker {
//!         MemoryBroker::new()
//!     }
//!     async fn broker_with_lease(&self, lease: Duration) -> MemoryBroker {
//!         MemoryBroker::with_lease(lease)
//!     }
//!     fn paused(&self) -> bool {
//!         true
//!     }
//! }
//!
//! stagedoor_jobs::conformance_tests!(MemoryFixture);
//! ```
//!
//! Every test works in both modes: delays are a few hundred milliseconds, and "not before `d`"
//! is checked right after publishing (the job is delayed, the handler has not run) and then
//! after `advance(d + margin)`, never with a tighter timing than the semantics promise. A few
//! tests (leases, shutdown) wait out a short lease on the real clock in both modes.
//!
//! Each test uses queues of its own (named `cf_<row>`); a fixture on a shared server namespaces
//! them so that parallel tests and repeated runs do not meet. Dead letters are always named
//! with [`DeadLetters::default_dead_letter`](crate::DeadLetters::default_dead_letter), so the names are valid on every backend.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::broker::{
    Broker, DeadLetter, DeadSelector, QueueStats, ReplayReport, Settled, Settlement,
};
use crate::broker::{DeadLetters, Inspect};
use crate::outcome::{Failure, FailureCause};
use crate::service::{AppInfo, Service};
use crate::testing::{Outcome, TestApp};
use crate::{Ctx, Data, Fixed, HandlerOutcome, Job, JobId, OnDecodeError, Subscriber, keys};

/// What a backend provides to run the suite.
pub trait Fixture: Send + Sync + 'static {
    /// The broker under test.
    type Broker: Broker;

    /// A fresh broker whose queues no other test uses (tests run in parallel; on a shared
    /// server the fixture namespaces them). Its lease is the backend's default.
    fn broker(&self) -> impl Future<Output = Self::Broker> + Send;

    /// Like [`broker`](Fixture::broker), but claims hold a job for `lease` only (a few hundred
    /// milliseconds), so that the tests of abandoned and reclaimed deliveries run quickly.
    fn broker_with_lease(&self, lease: Duration) -> impl Future<Output = Self::Broker> + Send;

    /// Whether the broker follows the harness's paused clock ([`TestApp::start`]) or runs live
    /// ([`TestApp::start_live`]).
    fn paused(&self) -> bool;

    /// Stores in `queue` of `broker` (connected) one job the broker cannot read back: a stored
    /// value of the wrong kind, as a hand edit leaves it (on SQL a column value that does not
    /// decode). Returns the name of the field or column holding it, which the dead letter's
    /// error must name. The default stores nothing and returns `None`: the row
    /// [`a_job_that_cannot_be_read_is_dead_lettered_alone`] does not apply to the backend.
    fn store_unreadable_job(
        &self,
        broker: &Self::Broker,
        queue: &str,
    ) -> impl Future<Output = Option<String>> + Send {
        let _ = (broker, queue);
        async { None }
    }
}

/// Runs the whole conformance suite against a [`Fixture`]: one
/// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` per row, named after the row's
/// function in [`conformance`](crate::conformance), each calling it with `$fixture` (evaluated
/// once per test).
///
/// Attributes written after the fixture and a comma are put on every generated test:
/// `conformance_tests!(RedisFixture, #[ignore = "needs a server"])`. The invoking crate depends
/// on `tokio` with the `macros` and `rt-multi-thread` features. To run the suite for several
/// fixtures in one file, invoke it once inside a `mod` per fixture.
///
/// ```ignore
/// stagedoor_jobs::conformance_tests!(MemoryFixture);
/// ```
#[macro_export]
macro_rules! conformance_tests {
    (@one [$(#[$attr:meta])*] ($fixture:expr) $name:ident) => {
        $(#[$attr])*
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $crate::conformance::$name($fixture).await;
        }
    };
    (@rows $attrs:tt ($fixture:expr)) => {};
    (@rows $attrs:tt ($fixture:expr) $name:ident $($rest:ident)*) => {
        $crate::conformance_tests!(@one $attrs ($fixture) $name);
        $crate::conformance_tests!(@rows $attrs ($fixture) $($rest)*);
    };
    (@all $attrs:tt ($fixture:expr)) => {
        $crate::conformance_tests!(@rows $attrs ($fixture)
            ack_removes_the_job
            ok_unit_result_acks
            retry_without_backoff_comes_back_at_once
            retry_waits_for_the_mount_backoff
            retry_after_overrides_the_backoff_durably
            drop_leaves_the_queue_without_a_dead_letter
            error_keeps_its_message_and_source_chain
            panic_is_a_failed_attempt_and_the_worker_lives_on
            attempts_count_up_and_the_job_id_stays
            cap_reached_moves_the_job_to_its_dead_letter
            delayed_retries_count_against_the_cap
            undecodable_payload_fails_attempts_until_the_cap
            undecodable_payload_is_dead_lettered_at_once_when_asked
            unknown_kind_goes_to_the_default_dead_letter
            concurrency_limit_is_respected
            shutdown_lets_running_handlers_finish
            job_abandoned_at_shutdown_comes_back_after_its_lease
            job_claimed_beyond_its_cap_is_dead_lettered_without_running
            settlement_after_a_lost_lease_is_fenced
            delayed_publish_runs_after_its_delay
            publish_at_runs_at_its_time
            same_job_id_published_twice_runs_once
            job_id_published_while_running_is_not_added
            dead_letters_are_listed_newest_first_and_by_kind
            dead_letter_replay_by_id_resets_the_attempts
            dead_letter_replay_by_kind_moves_only_that_kind
            dead_letter_purge_removes_the_selected
            request_id_and_trace_reach_the_handler_and_the_dead_letter
            stats_never_count_a_due_job_as_delayed
            abandoned_job_comes_back_when_advancing_past_its_lease
            replay_skips_a_letter_whose_job_is_back_in_its_queue
            waiting_for_a_mount_slot_keeps_the_lease
            published_id_is_the_handlers_and_the_dead_letters
            duplicate_publishes_are_reported_not_stored
            paused_publish_returns_once_the_job_has_settled
            a_job_that_cannot_be_read_is_dead_lettered_alone
            dead_letter_reports_attempts_spent
            uncapped_mount_retries_no_faster_than_the_floor
            publish_once_stores_a_job_once_per_guard
        );
    };
    ($fixture:expr $(,)?) => {
        $crate::conformance_tests!(@all [] ($fixture));
    };
    ($fixture:expr, $(#[$attr:meta])+ $(,)?) => {
        $crate::conformance_tests!(@all [$(#[$attr])+] ($fixture));
    };
}

// ---------------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------------

/// A delay the tests wait for: long enough to see that nothing ran before it, short enough
/// for live runs.
const DELAY: Duration = Duration::from_millis(300);
/// What `advance` adds to a delay so that a live broker has time to deliver the job.
const MARGIN: Duration = Duration::from_millis(200);
/// The lease of the brokers of the lease tests.
const LEASE: Duration = Duration::from_millis(300);
/// The longest a test polls for a condition before it fails.
const PATIENCE: Duration = Duration::from_secs(10);
/// The message of the handler that panics.
const PANIC_MESSAGE: &str = "conformance: the handler panicked on purpose";
/// The `Display` of the handler error, and of its source.
const LEDGER_CLOSED: &str = "the ledger is closed";
const DISK_FULL: &str = "the disk is full";

/// The payload of every test job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Msg {
    n: u64,
}

/// The error handlers return, with a source.
#[derive(Debug, thiserror::Error)]
#[error("{}", LEDGER_CLOSED)]
struct LedgerClosed {
    source: DiskFull,
}

#[derive(Debug, thiserror::Error)]
#[error("{}", DISK_FULL)]
struct DiskFull;

fn ledger_closed() -> LedgerClosed {
    LedgerClosed { source: DiskFull }
}

/// One call of a handler, as the handler saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Seen {
    n: u64,
    attempt: Option<u32>,
    job_id: Option<JobId>,
    request_id: Option<String>,
    trace: Option<String>,
}

impl Seen {
    fn of(msg: &Msg, attempt: Option<u32>) -> Self {
        Self {
            n: msg.n,
            attempt,
            ..Self::default()
        }
    }
}

/// The state the handlers of a test share with it (through `Data<Arc<Probe>>`).
#[derive(Debug, Default)]
struct Probe {
    seen: Mutex<Vec<Seen>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    finished: AtomicUsize,
    healed: AtomicBool,
    open: AtomicBool,
    panic_line: AtomicU32,
}

impl Probe {
    fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    fn see(&self, seen: Seen) {
        self.seen.lock().expect("probe lock").push(seen);
    }
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("probe lock").clone()
    }
    fn runs(&self) -> usize {
        self.seen.lock().expect("probe lock").len()
    }
    /// The attempts every call saw, in order.
    fn attempts(&self) -> Vec<Option<u32>> {
        self.seen().iter().map(|s| s.attempt).collect()
    }
    /// The attempts the calls for message `n` saw, in order.
    fn attempts_of(&self, n: u64) -> Vec<Option<u32>> {
        self.seen()
            .iter()
            .filter(|s| s.n == n)
            .map(|s| s.attempt)
            .collect()
    }
    fn enter(&self) {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

fn job(queue: &str, n: u64) -> Job {
    Job::new(queue, &Msg { n }).expect("a Msg encodes")
}

fn service(probe: &Arc<Probe>) -> Service {
    Service::new(AppInfo::new("conformance", env!("CARGO_PKG_VERSION"))).state(Arc::clone(probe))
}

/// Starts `service` as the fixture runs: on the paused clock or live.
async fn start<F: Fixture>(fixture: &F, service: Service) -> TestApp {
    let started = if fixture.paused() {
        TestApp::start(service).await
    } else {
        TestApp::start_live(service).await
    };
    started.unwrap_or_else(|e| panic!("the service should start: {e}"))
}

/// A clone of `broker` for direct calls, connected (connecting is idempotent).
async fn connected<B: Broker>(broker: &B) -> B {
    let direct = broker.clone();
    direct
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the broker should connect: {e}"));
    direct
}

/// Polls `cond` (on the real clock) until it holds.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `(attempt, outcome)` of every settled delivery of `subscriber`, in order.
fn outcomes(app: &TestApp, subscriber: &str) -> Vec<(u32, Outcome)> {
    app.outcomes(subscriber)
        .into_iter()
        .map(|r| (r.attempt, r.outcome))
        .collect()
}

async fn assert_empty(app: &TestApp, queue: &str, context: &str) {
    let stats = app.stats(queue).await;
    assert_eq!(
        stats,
        QueueStats::default(),
        "{context}: queue `{queue}` should be empty; records: {:?}",
        app.records()
    );
}

async fn assert_empty_direct<B: Broker>(broker: &B, queue: &str, context: &str) {
    let stats = broker.stats(queue).await.expect("queue stats");
    assert_eq!(
        stats,
        QueueStats::default(),
        "{context}: queue `{queue}` should be empty"
    );
}

/// The message numbers of `letters`, in order.
fn numbers(letters: &[DeadLetter]) -> Vec<u64> {
    letters
        .iter()
        .map(|d| {
            serde_json::from_slice::<Msg>(d.envelope.payload())
                .expect("a dead letter keeps its payload")
                .n
        })
        .collect()
}

fn is_retried(outcome: &Outcome, want: FailureCause) -> bool {
    matches!(outcome, Outcome::Retried { cause, .. } if *cause == want)
}

fn is_dead_lettered(outcome: &Outcome, want: FailureCause) -> bool {
    matches!(outcome, Outcome::DeadLettered { cause, .. } if *cause == want)
}

// ---------------------------------------------------------------------------------------------
// Handlers (async fns: shared state comes through `Data<Arc<Probe>>`)
// ---------------------------------------------------------------------------------------------

async fn acks(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    HandlerOutcome::ack()
}

async fn ok_unit(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> Result<(), LedgerClosed> {
    p.see(Seen::of(msg, attempt));
    Ok(())
}

async fn retries_until_third(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    if attempt < Some(3) {
        HandlerOutcome::retry()
    } else {
        HandlerOutcome::ack()
    }
}

async fn retries_once(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    if attempt == Some(1) {
        HandlerOutcome::retry()
    } else {
        HandlerOutcome::ack()
    }
}

async fn retries_after_once(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    if attempt == Some(1) {
        HandlerOutcome::retry_after(DELAY)
    } else {
        HandlerOutcome::ack()
    }
}

/// The delay of [`retries_after_always`].
const SHORT: Duration = Duration::from_millis(150);

async fn retries_after_always(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    HandlerOutcome::retry_after(SHORT)
}

async fn drops(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    HandlerOutcome::drop()
}

async fn fails_with_source(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> Result<(), LedgerClosed> {
    p.see(Seen::of(msg, attempt));
    Err(ledger_closed())
}

async fn panics_on_one(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    if msg.n == 1 {
        p.panic_line.store(line!() + 1, Ordering::SeqCst);
        panic!("{PANIC_MESSAGE}");
    }
    HandlerOutcome::ack()
}

async fn counts_to_four(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(job_id): Ctx<keys::JobId>,
) -> HandlerOutcome {
    p.see(Seen {
        job_id: Some(job_id),
        ..Seen::of(msg, attempt)
    });
    if attempt < Some(4) {
        HandlerOutcome::retry()
    } else {
        HandlerOutcome::ack()
    }
}

async fn slow(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.enter();
    p.see(Seen::of(msg, attempt));
    tokio::time::sleep(Duration::from_millis(100)).await;
    p.leave();
    p.finished.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::ack()
}

/// Hangs on its first attempt (until the shutdown deadline abandons it); acks later ones.
async fn hangs_first(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    if attempt == Some(1) {
        p.enter();
        std::future::pending::<()>().await;
    }
    HandlerOutcome::ack()
}

/// Waits until the test opens the gate, then acks.
async fn gated(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    p.enter();
    while !p.open.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    p.leave();
    HandlerOutcome::ack()
}

/// Fails until the test heals it.
async fn fails_until_healed(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> Result<(), LedgerClosed> {
    p.see(Seen::of(msg, attempt));
    if p.healed.load(Ordering::SeqCst) {
        Ok(())
    } else {
        Err(ledger_closed())
    }
}

async fn reads_headers(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(request_id): Ctx<keys::RequestId>,
    Ctx(trace): Ctx<keys::Trace>,
) -> Result<(), LedgerClosed> {
    p.see(Seen {
        request_id,
        trace,
        ..Seen::of(msg, attempt)
    });
    Err(ledger_closed())
}

// ---------------------------------------------------------------------------------------------
// DESIGN 3: outcomes
// ---------------------------------------------------------------------------------------------

/// `ack()`: the job leaves the queue (stats all zero), the handler ran once, with attempt
/// `Some(1)`.
pub async fn ack_removes_the_job<F: Fixture>(fixture: F) {
    const Q: &str = "cf_ack";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    let id = app.publish(job(Q, 1)).await.expect("publish").into_id();
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1)], "the handler runs once");
    let records = app.outcomes("acks");
    assert_eq!(records.len(), 1, "one settled delivery: {records:?}");
    assert_eq!(records[0].outcome, Outcome::Acked);
    assert_eq!(records[0].attempt, 1);
    assert_eq!(records[0].job_id, id);
    assert_empty(&app, Q, "after ack").await;
    app.stop().await;
}

/// `Ok(())` from a handler returning `Result<(), E>` acks.
pub async fn ok_unit_result_acks<F: Fixture>(fixture: F) {
    const Q: &str = "cf_ok_unit";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, ok_unit).name("ok_unit"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1)], "the handler runs once");
    assert_eq!(outcomes(&app, "ok_unit"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after Ok(())").await;
    assert!(app.dead_letters(&dl).await.is_empty(), "no dead letter");
    app.stop().await;
}

/// `retry()` on a mount without a backoff: the job comes back at once (no time passes), and
/// the handler sees attempts 1, 2, 3.
pub async fn retry_without_backoff_comes_back_at_once<F: Fixture>(fixture: F) {
    const Q: &str = "cf_retry_now";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_until_third).name("retries_until_third"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1), Some(2), Some(3)]);
    let got = outcomes(&app, "retries_until_third");
    assert_eq!(got.len(), 3, "three deliveries: {got:?}");
    for (i, (attempt, outcome)) in got.iter().take(2).enumerate() {
        assert_eq!(*attempt as usize, i + 1);
        assert!(
            matches!(outcome, Outcome::Retried { delay, cause: FailureCause::Retry, .. } if delay.is_zero()),
            "attempt {attempt} is retried at once: {outcome:?}"
        );
    }
    assert_eq!(got[2], (3, Outcome::Acked));
    assert_empty(&app, Q, "after the third attempt acked").await;
    app.stop().await;
}

/// `retry()` on a mount with `Fixed(300 ms)`: the job is delayed (stats.delayed == 1) and not run
/// again before the delay; after it, it runs again.
pub async fn retry_waits_for_the_mount_backoff<F: Fixture>(fixture: F) {
    const Q: &str = "cf_retry_backoff";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_once).name("retries_once"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone())
                .backoff(Fixed::new(DELAY));
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(
        probe.attempts(),
        [Some(1)],
        "not run again before the backoff"
    );
    let stats = app.stats(Q).await;
    assert_eq!(
        (stats.ready, stats.pending, stats.delayed),
        (0, 0, 1),
        "the retry waits, delayed: {stats:?}"
    );
    let got = outcomes(&app, "retries_once");
    assert!(
        matches!(&got[..], [(1, Outcome::Retried { delay, cause: FailureCause::Retry, .. })] if *delay == DELAY),
        "retried after the mount's backoff: {got:?}"
    );

    app.advance(DELAY + MARGIN).await;
    assert_eq!(
        probe.attempts(),
        [Some(1), Some(2)],
        "run again after the backoff"
    );
    assert_eq!(outcomes(&app, "retries_once")[1], (2, Outcome::Acked));
    assert_empty(&app, Q, "after the retry acked").await;
    app.stop().await;
}

/// `retry_after(d)` overrides the mount's backoff (`Fixed(60 s)`: the job runs again after
/// about `d`, not a minute), and is durable: the delayed job is in the queue's stats.
pub async fn retry_after_overrides_the_backoff_durably<F: Fixture>(fixture: F) {
    const Q: &str = "cf_retry_after";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_after_once).name("retries_after_once"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone())
                .backoff(Fixed::new(Duration::from_secs(60)));
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(
        probe.attempts(),
        [Some(1)],
        "not run again before the delay"
    );
    let stats = app.stats(Q).await;
    assert_eq!(
        (stats.ready, stats.pending, stats.delayed),
        (0, 0, 1),
        "the retry is stored as a delayed job: {stats:?}"
    );
    let got = outcomes(&app, "retries_after_once");
    assert!(
        matches!(&got[..], [(1, Outcome::Retried { delay, cause: FailureCause::Retry, .. })] if *delay == DELAY),
        "retried after the handler's delay, not the mount's backoff: {got:?}"
    );

    app.advance(DELAY + MARGIN).await;
    assert_eq!(
        probe.attempts(),
        [Some(1), Some(2)],
        "run again after the handler's delay, long before the mount's backoff"
    );
    assert_eq!(outcomes(&app, "retries_after_once")[1], (2, Outcome::Acked));
    assert_empty(&app, Q, "after the retry acked").await;
    app.stop().await;
}

/// `drop()`: the job leaves the queue, is recorded as dropped and is not dead-lettered, even on
/// a mount whose cap is 1.
pub async fn drop_leaves_the_queue_without_a_dead_letter<F: Fixture>(fixture: F) {
    const Q: &str = "cf_drop";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, drops).name("drops"))
                .max_attempts(crate::nonzero!(1u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1)]);
    assert_eq!(outcomes(&app, "drops"), [(1, Outcome::Dropped)]);
    assert_empty(&app, Q, "after drop").await;
    assert!(
        app.dead_letters(&dl).await.is_empty(),
        "a dropped job is not a dead letter"
    );
    assert_eq!(direct.dead_len(&dl).await.expect("dead_len"), 0);
    app.stop().await;
}

/// `Err(e)` with a source: a failed attempt; at the cap, the dead letter's `error` is `e`'s
/// `Display` and its `traceback` has `caused by: <source>`.
pub async fn error_keeps_its_message_and_source_chain<F: Fixture>(fixture: F) {
    const Q: &str = "cf_error";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_with_source).name("fails_with_source"))
                .max_attempts(crate::nonzero!(2u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1), Some(2)]);
    let got = outcomes(&app, "fails_with_source");
    assert!(
        matches!(&got[..], [
            (1, Outcome::Retried { error, cause: FailureCause::Error, .. }),
            (2, Outcome::DeadLettered { error: last, traceback, cause: FailureCause::Error, .. }),
        ] if error == LEDGER_CLOSED && last == LEDGER_CLOSED
            && traceback.contains(&format!("caused by: {DISK_FULL}"))),
        "a failed attempt, then the dead letter at the cap: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    assert_eq!(letters[0].error, LEDGER_CLOSED, "the error is e's Display");
    assert!(
        letters[0]
            .traceback
            .contains(&format!("caused by: {DISK_FULL}")),
        "the traceback has the source chain: {:?}",
        letters[0].traceback
    );
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// A panic in the handler: a failed attempt whose error has the panic's message and whose
/// traceback has its `file:line`; the worker lives on (a job published afterwards is acked).
pub async fn panic_is_a_failed_attempt_and_the_worker_lives_on<F: Fixture>(fixture: F) {
    const Q: &str = "cf_panic";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, panics_on_one).name("panics_on_one"))
                .max_attempts(crate::nonzero!(2u32))
                .dead_letter(dl.clone())
                .concurrency(1);
        }),
    )
    .await;
    let panicking = app.publish(job(Q, 1)).await.expect("publish").into_id();
    app.drain().await;

    let location = format!("{}:{}:", file!(), probe.panic_line.load(Ordering::SeqCst));
    let got = outcomes(&app, "panics_on_one");
    assert!(
        matches!(&got[..], [
            (1, Outcome::Retried { error, cause: FailureCause::Panic, .. }),
            (2, Outcome::DeadLettered { error: last, traceback, cause: FailureCause::Panic, .. }),
        ] if error.contains(PANIC_MESSAGE) && last.contains(PANIC_MESSAGE)
            && traceback.contains(&location)),
        "a panic is a failed attempt with its message and location ({location}): {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    assert_eq!(letters[0].envelope.id(), &panicking);
    assert!(letters[0].error.contains(PANIC_MESSAGE), "{letters:?}");
    assert!(
        letters[0].traceback.contains(&location),
        "the traceback has the panic's location {location}: {:?}",
        letters[0].traceback
    );

    let after = app.publish(job(Q, 2)).await.expect("publish").into_id();
    app.drain().await;
    let last = app.outcomes("panics_on_one").pop().expect("a record");
    assert_eq!(last.job_id, after);
    assert_eq!(
        last.outcome,
        Outcome::Acked,
        "the worker lives on after a panic"
    );
    assert_empty(&app, Q, "after the panics").await;
    app.stop().await;
}

/// Attempt numbering: 1 for the first delivery, +1 per retry; `Ctx<keys::JobId>` is the same on
/// every attempt (the id `publish` returned).
pub async fn attempts_count_up_and_the_job_id_stays<F: Fixture>(fixture: F) {
    const Q: &str = "cf_attempts";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, counts_to_four).name("counts_to_four"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let id = app.publish(job(Q, 1)).await.expect("publish").into_id();
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1), Some(2), Some(3), Some(4)]);
    for seen in probe.seen() {
        assert_eq!(
            seen.job_id.as_ref(),
            Some(&id),
            "every attempt sees the job's id"
        );
    }
    let records = app.outcomes("counts_to_four");
    let attempts: Vec<u32> = records.iter().map(|r| r.attempt).collect();
    assert_eq!(attempts, [1, 2, 3, 4]);
    assert!(records.iter().all(|r| r.job_id == id));
    assert_eq!(records[3].outcome, Outcome::Acked);
    assert_empty(&app, Q, "after the fourth attempt acked").await;
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// DESIGN 4: caps, dead letters, leases, delays
// ---------------------------------------------------------------------------------------------

/// The cap reached: the job moves to its dead letter with the error, the traceback,
/// `attempts == cap`, `failed_at`, `origin == queue` and the envelope as published (payload,
/// kind, id, request id, trace); the queue is empty and the handler ran exactly cap times.
pub async fn cap_reached_moves_the_job_to_its_dead_letter<F: Fixture>(fixture: F) {
    const Q: &str = "cf_cap";
    const CAP: u32 = 3;
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_with_source).name("fails_with_source"))
                .max_attempts(crate::nonzero!(CAP))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let slack = chrono::Duration::seconds(5);
    let before = app.now();
    let id = app
        .publish(
            job(Q, 7)
                .kind("invoice")
                .request_id("req-cap-7")
                .trace("trace-cap-7"),
        )
        .await
        .expect("publish")
        .into_id();
    app.drain().await;

    assert_eq!(
        probe.runs(),
        CAP as usize,
        "the handler runs exactly cap times: {:?}; records {:?}; stats {:?}",
        probe.seen(),
        app.records(),
        app.stats(Q).await
    );
    let got = outcomes(&app, "fails_with_source");
    assert_eq!(got.len(), CAP as usize, "{got:?}");
    assert!(
        got[..2]
            .iter()
            .all(|(_, o)| is_retried(o, FailureCause::Error))
    );
    assert!(
        matches!(&got[2], (3, Outcome::DeadLettered { target, .. }) if *target == dl),
        "the last attempt moves the job to `{dl}`: {got:?}"
    );
    assert_empty(&app, Q, "after the dead letter").await;

    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    let d = &letters[0];
    assert_eq!(d.error, LEDGER_CLOSED);
    assert!(
        d.traceback.contains(&format!("caused by: {DISK_FULL}")),
        "{d:?}"
    );
    assert_eq!(d.attempts, CAP, "attempts spent");
    assert_eq!(d.envelope.attempt(), CAP, "the envelope's attempts spent");
    assert_eq!(d.origin, Q, "the queue it failed on");
    assert!(
        d.failed_at >= before - slack && d.failed_at <= app.now() + slack,
        "failed_at {} should be about now ({before} .. {})",
        d.failed_at,
        app.now()
    );
    assert_eq!(d.envelope.id(), &id);
    assert_eq!(d.envelope.kind(), "invoice");
    assert_eq!(
        d.envelope.payload(),
        serde_json::to_vec(&Msg { n: 7 }).expect("encode"),
        "the payload is kept"
    );
    assert_eq!(
        d.envelope.headers().request_id.as_deref(),
        Some("req-cap-7")
    );
    assert_eq!(d.envelope.headers().trace.as_deref(), Some("trace-cap-7"));
    assert_eq!(direct.dead_len(&dl).await.expect("dead_len"), 1);
    app.stop().await;
}

/// A delayed retry counts against the cap like an immediate one: `retry_after` on every attempt
/// with a cap of 3 is dead-lettered after 3 runs.
pub async fn delayed_retries_count_against_the_cap<F: Fixture>(fixture: F) {
    const Q: &str = "cf_delayed_cap";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_after_always).name("retries_after_always"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;
    assert_eq!(probe.attempts(), [Some(1)], "the retry is delayed");

    app.advance(Duration::from_secs(1)).await;
    assert_eq!(probe.attempts(), [Some(1), Some(2), Some(3)]);
    let got = outcomes(&app, "retries_after_always");
    assert!(
        matches!(&got[..], [
            (1, Outcome::Retried { delay: d1, .. }),
            (2, Outcome::Retried { delay: d2, .. }),
            (3, Outcome::DeadLettered { .. }),
        ] if *d1 == SHORT && *d2 == SHORT),
        "two delayed retries, then the dead letter: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].attempts, 3);
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// An undecodable payload, default policy: failed attempts (the handler never runs) until the
/// cap; the dead letter's error is about decoding.
pub async fn undecodable_payload_fails_attempts_until_the_cap<F: Fixture>(fixture: F) {
    const Q: &str = "cf_decode_retry";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"))
                .max_attempts(crate::nonzero!(2u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let id = app
        .publish(Job::from_bytes(Q, b"not json".to_vec()))
        .await
        .expect("publish")
        .into_id();
    app.drain().await;

    assert_eq!(
        probe.runs(),
        0,
        "the handler never runs on undecodable bytes"
    );
    let got = outcomes(&app, "acks");
    assert!(
        matches!(&got[..], [(1, r), (2, d)]
            if is_retried(r, FailureCause::Decode) && is_dead_lettered(d, FailureCause::Decode)),
        "decode failures spend attempts until the cap: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].envelope.id(), &id);
    assert_eq!(letters[0].attempts, 2);
    assert_eq!(letters[0].envelope.payload(), b"not json");
    assert!(
        letters[0].error.to_lowercase().contains("decod"),
        "the error mentions decoding: {:?}",
        letters[0].error
    );
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// An undecodable payload with `.on_decode_error(OnDecodeError::DeadLetter)`: dead-lettered on
/// its first delivery, without spending further attempts.
pub async fn undecodable_payload_is_dead_lettered_at_once_when_asked<F: Fixture>(fixture: F) {
    const Q: &str = "cf_decode_dead";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone())
                .on_decode_error(OnDecodeError::DeadLetter);
        }),
    )
    .await;
    app.publish(Job::from_bytes(Q, b"not json".to_vec()))
        .await
        .expect("publish");
    app.drain().await;

    assert_eq!(probe.runs(), 0);
    let got = outcomes(&app, "acks");
    assert!(
        matches!(&got[..], [(1, d)] if is_dead_lettered(d, FailureCause::Decode)),
        "dead-lettered on the first delivery: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].attempts, 1, "no further attempt spent");
    assert!(
        letters[0].error.to_lowercase().contains("decod"),
        "{letters:?}"
    );
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// A job of a kind that no mount handles, on a queue whose mounts are kind-specific: dead-lettered
/// to the broker's default dead letter with an error naming the kind; no handler runs.
pub async fn unknown_kind_goes_to_the_default_dead_letter<F: Fixture>(fixture: F) {
    const Q: &str = "cf_unknown_kind";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).kind("known").name("acks"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let id = app
        .publish(job(Q, 1).kind("mystery"))
        .await
        .expect("publish")
        .into_id();
    app.drain().await;

    assert_eq!(probe.runs(), 0, "no handler runs a kind nobody handles");
    let records = app.records();
    assert!(
        matches!(&records[..], [r] if r.job_id == id && matches!(
            &r.outcome,
            Outcome::DeadLettered { target, error, cause: FailureCause::UnknownKind, .. }
                if *target == dl && error.contains("mystery")
        )),
        "dead-lettered to `{dl}` naming the kind: {records:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].envelope.id(), &id);
    assert_eq!(letters[0].envelope.kind(), "mystery");
    assert_eq!(letters[0].origin, Q);
    assert!(letters[0].error.contains("mystery"), "{letters:?}");

    // The known kind still runs.
    app.publish(job(Q, 2).kind("known")).await.expect("publish");
    app.drain().await;
    assert_eq!(outcomes(&app, "acks"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after both jobs").await;
    app.stop().await;
}

/// `.concurrency(2)`: with 8 slow jobs, at most 2 handlers of the mount run at once (and 2 do).
pub async fn concurrency_limit_is_respected<F: Fixture>(fixture: F) {
    const Q: &str = "cf_concurrency";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, slow).name("slow"))
                .concurrency(2);
        }),
    )
    .await;
    // `enqueue`: on the paused harness `publish` would wait for each job to settle, and the
    // jobs would run one after the other.
    for n in 1..=8 {
        app.enqueue(job(Q, n)).await.expect("publish");
    }
    app.drain().await;

    assert_eq!(probe.finished.load(Ordering::SeqCst), 8, "every job ran");
    assert_eq!(
        probe.max_in_flight.load(Ordering::SeqCst),
        2,
        "at most (and, with 8 waiting, exactly) 2 at once"
    );
    assert!(
        outcomes(&app, "slow")
            .iter()
            .all(|(_, o)| *o == Outcome::Acked)
    );
    assert_empty(&app, Q, "after every job").await;
    app.stop().await;
}

/// Graceful shutdown loses nothing: handlers running when the service stops finish (the
/// shutdown timeout is long) and their jobs are acked.
pub async fn shutdown_lets_running_handlers_finish<F: Fixture>(fixture: F) {
    const Q: &str = "cf_shutdown";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe)
            .shutdown_timeout(Duration::from_secs(20))
            .with_broker(broker, |b| {
                b.include(Subscriber::new(Q, slow).name("slow"))
                    .max_attempts(crate::nonzero!(3u32))
                    .dead_letter(dl.clone());
            }),
    )
    .await;
    for n in 1..=3 {
        app.enqueue(job(Q, n)).await.expect("publish");
    }
    eventually("the three handlers run", || probe.in_flight() == 3).await;
    app.stop().await;

    assert_eq!(
        probe.finished.load(Ordering::SeqCst),
        3,
        "the running handlers finish"
    );
    assert_eq!(probe.runs(), 3, "each ran once");
    assert_empty_direct(&direct, Q, "after the shutdown, the jobs are acked").await;
    assert_eq!(direct.dead_len(&dl).await.expect("dead_len"), 0);
}

/// Graceful shutdown loses nothing: a handler still running at a short shutdown deadline is
/// abandoned, but its job stays in the queue and a second service on the same broker runs it
/// once its lease has run out.
pub async fn job_abandoned_at_shutdown_comes_back_after_its_lease<F: Fixture>(fixture: F) {
    const Q: &str = "cf_abandoned";
    let probe = Probe::new();
    let broker = fixture.broker_with_lease(LEASE).await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    let mount = |b: &mut crate::RouteBuilder<F::Broker>| {
        b.include(Subscriber::new(Q, hangs_first).name("hangs_first"))
            .max_attempts(crate::nonzero!(3u32))
            .dead_letter(dl.clone());
    };
    let first = start(
        &fixture,
        service(&probe)
            .shutdown_timeout(Duration::from_millis(100))
            .with_broker(broker.clone(), mount),
    )
    .await;
    // `enqueue`: the first attempt hangs until the shutdown abandons it.
    let id = first.enqueue(job(Q, 1)).await.expect("publish").into_id();
    eventually("the first attempt runs", || probe.in_flight() == 1).await;
    first.stop().await;

    let stats = direct.stats(Q).await.expect("stats");
    assert_eq!(
        stats.ready + stats.pending + stats.delayed,
        1,
        "the abandoned job is still in its queue: {stats:?}"
    );
    // Its lease runs out (it was renewed at most until the shutdown).
    tokio::time::sleep(LEASE + MARGIN).await;

    let second = start(&fixture, service(&probe).with_broker(broker, mount)).await;
    second.drain().await;
    assert_eq!(
        probe.attempts(),
        [Some(1), Some(2)],
        "the second service runs the abandoned job"
    );
    let records = second.outcomes("hangs_first");
    assert!(
        matches!(&records[..], [r] if r.job_id == id && r.attempt == 2 && r.outcome == Outcome::Acked),
        "{records:?}"
    );
    assert_empty(&second, Q, "after the second service ran it").await;
    assert!(second.dead_letters(&dl).await.is_empty());
    second.stop().await;
}

/// A job claimed beyond its cap (its workers died with it, each claim spending an attempt) is
/// dead-lettered without running, its error naming the delivery number and the cap.
pub async fn job_claimed_beyond_its_cap_is_dead_lettered_without_running<F: Fixture>(fixture: F) {
    const Q: &str = "cf_poison";
    const CAP: u32 = 2;
    let probe = Probe::new();
    let broker = fixture.broker_with_lease(LEASE).await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    direct.prepare(Q).await.expect("prepare");
    let (_, envelope, at) = job(Q, 1).into_parts(direct.clock().now());
    let id = envelope.id().clone();
    direct
        .publish(Q, vec![(envelope, at)])
        .await
        .expect("publish");
    for attempt in 1..=CAP {
        let got = direct
            .claim(Q, 1, Duration::from_secs(2))
            .await
            .expect("claim");
        assert_eq!(got.len(), 1, "claim {attempt} gets the job");
        assert_eq!(got[0].envelope.id(), &id);
        assert_eq!(
            got[0].envelope.attempt(),
            attempt,
            "each claim spends an attempt"
        );
        // The worker dies: the delivery is never settled; its lease runs out.
        tokio::time::sleep(LEASE + MARGIN).await;
    }

    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"))
                .max_attempts(crate::nonzero!(CAP))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.drain().await;

    assert_eq!(probe.runs(), 0, "the handler never runs");
    let got = outcomes(&app, "acks");
    assert!(
        matches!(&got[..], [(3, d)] if is_dead_lettered(d, FailureCause::Poison)),
        "dead-lettered on its third claim: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].envelope.id(), &id);
    assert_eq!(letters[0].attempts, CAP + 1, "every claim counted");
    assert!(
        letters[0].error.contains(&format!("delivery {} ", CAP + 1))
            && letters[0].error.contains(&format!("max_attempts({CAP})")),
        "the error names the delivery past the cap, and the cap: {:?}",
        letters[0].error
    );
    assert_eq!(letters[0].origin, Q);
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// A settlement after a lost lease is fenced: claim, let the lease run out, claim again (a new
/// receipt); settling the first receipt is `LeaseLost` and changes nothing, settling the second
/// is `Done`.
pub async fn settlement_after_a_lost_lease_is_fenced<F: Fixture>(fixture: F) {
    const Q: &str = "cf_fenced";
    let broker = fixture.broker_with_lease(LEASE).await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    direct.prepare(Q).await.expect("prepare");
    let (_, envelope, at) = job(Q, 1).into_parts(direct.clock().now());
    let id = envelope.id().clone();
    direct
        .publish(Q, vec![(envelope, at)])
        .await
        .expect("publish");

    let mut first = direct
        .claim(Q, 1, Duration::from_secs(2))
        .await
        .expect("claim");
    assert_eq!(first.len(), 1, "the first claim gets the job");
    let first = first.remove(0);
    tokio::time::sleep(LEASE + MARGIN).await;
    let mut second = direct
        .claim(Q, 1, Duration::from_secs(2))
        .await
        .expect("claim");
    assert_eq!(second.len(), 1, "the expired lease makes the job claimable");
    let second = second.remove(0);
    assert_eq!(second.envelope.id(), &id);
    assert_eq!(second.envelope.attempt(), 2);

    assert!(
        !direct.renew(Q, &first.receipt).await.expect("renew"),
        "a lost lease cannot be renewed"
    );
    let before = direct.stats(Q).await.expect("stats");
    let failure = Failure::new(FailureCause::Error, "stale worker", "");
    let settled = direct
        .settle(
            Q,
            &first,
            Settlement::DeadLetter {
                target: dl.clone(),
                failure,
            },
        )
        .await
        .expect("settle");
    assert_eq!(settled, Settled::LeaseLost, "the stale receipt is fenced");
    let after = direct.stats(Q).await.expect("stats");
    assert_eq!(
        (after.ready, after.pending, after.delayed),
        (before.ready, before.pending, before.delayed),
        "nothing changed"
    );
    assert_eq!(after.pending, 1, "the second delivery still holds the job");
    assert_eq!(direct.dead_len(&dl).await.expect("dead_len"), 0);

    assert!(
        direct.renew(Q, &second.receipt).await.expect("renew"),
        "the live lease renews"
    );
    let settled = direct
        .settle(Q, &second, Settlement::Ack)
        .await
        .expect("settle");
    assert_eq!(settled, Settled::Done);
    assert_empty_direct(&direct, Q, "after the second receipt acked").await;
}

/// `Job::after(d)`: not run before `d` (delayed in the stats), run after it.
pub async fn delayed_publish_runs_after_its_delay<F: Fixture>(fixture: F) {
    const Q: &str = "cf_after";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    app.publish(job(Q, 1).after(DELAY)).await.expect("publish");
    app.drain().await;
    assert_eq!(probe.runs(), 0, "not run before its delay");
    let stats = app.stats(Q).await;
    assert_eq!((stats.ready, stats.delayed), (0, 1), "{stats:?}");

    app.advance(DELAY + MARGIN).await;
    assert_eq!(probe.attempts(), [Some(1)], "run after its delay");
    assert_eq!(outcomes(&app, "acks"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after the delayed job ran").await;
    app.stop().await;
}

/// `Job::at(t)`: not run before `t` (delayed in the stats), run after it.
pub async fn publish_at_runs_at_its_time<F: Fixture>(fixture: F) {
    const Q: &str = "cf_at";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    let at = app.now() + chrono::Duration::from_std(DELAY).expect("a small delay");
    app.publish(job(Q, 1).at(at)).await.expect("publish");
    app.drain().await;
    assert_eq!(probe.runs(), 0, "not run before its time");
    let stats = app.stats(Q).await;
    assert_eq!((stats.ready, stats.delayed), (0, 1), "{stats:?}");

    app.advance(DELAY + MARGIN).await;
    assert_eq!(probe.attempts(), [Some(1)], "run at its time");
    assert_eq!(outcomes(&app, "acks"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after the job ran").await;
    app.stop().await;
}

/// Publishing the same job id twice (`Job::id`) while the first is waiting stores and runs it
/// once.
pub async fn same_job_id_published_twice_runs_once<F: Fixture>(fixture: F) {
    const Q: &str = "cf_dup_waiting";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    // Delayed, so that the first is surely still in the queue when the second is published.
    let id = JobId::from_string(format!("cf-dup-{}", JobId::new()));
    for n in [1, 2] {
        let got = app
            .publish(job(Q, n).id(id.clone()).after(DELAY))
            .await
            .expect("publishing a duplicate is not an error");
        assert_eq!(got.id(), &id);
        assert_eq!(got.is_stored(), n == 1, "only the first is stored");
    }
    let stats = app.stats(Q).await;
    assert_eq!(
        (stats.ready, stats.delayed),
        (0, 1),
        "stored once: {stats:?}"
    );

    app.advance(DELAY + MARGIN).await;
    assert_eq!(probe.attempts(), [Some(1)], "run once");
    assert_eq!(probe.seen()[0].n, 1, "the first publication stands");
    assert_eq!(outcomes(&app, "acks"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after the job ran").await;
    app.stop().await;
}

/// Publishing a job id again while its job runs adds nothing: the job runs once.
pub async fn job_id_published_while_running_is_not_added<F: Fixture>(fixture: F) {
    const Q: &str = "cf_dup_running";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, gated).name("gated"));
        }),
    )
    .await;
    let id = JobId::from_string(format!("cf-dup-{}", JobId::new()));
    // `enqueue`: the handler waits for the gate the test opens below.
    app.enqueue(job(Q, 1).id(id.clone()))
        .await
        .expect("publish");
    eventually("the job runs", || probe.in_flight() == 1).await;
    let again = app
        .enqueue(job(Q, 2).id(id.clone()))
        .await
        .expect("publishing a duplicate is not an error");
    assert_eq!(
        (again.id(), again.is_stored()),
        (&id, false),
        "reported as already there"
    );
    let stats = app.stats(Q).await;
    assert_eq!(
        (stats.ready, stats.pending, stats.delayed),
        (0, 1, 0),
        "only the running delivery: {stats:?}"
    );
    probe.open.store(true, Ordering::SeqCst);
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1)], "run once");
    assert_eq!(probe.seen()[0].n, 1);
    assert_eq!(outcomes(&app, "gated"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after the job ran").await;
    app.stop().await;
}

/// The kinds of the five jobs [`letters`] dead-letters, message `n` at index `n - 1`.
const KINDS: [&str; 5] = ["alpha", "beta", "beta", "alpha", "gamma"];

/// A running service whose dead letter holds five jobs, failed in the order 1..=5 with the
/// kinds of [`KINDS`].
struct Letters<B> {
    app: TestApp,
    direct: B,
    probe: Arc<Probe>,
    queue: &'static str,
    dl: String,
    /// The job ids, message `n` at index `n - 1`.
    ids: Vec<JobId>,
}

async fn letters<F: Fixture>(fixture: &F, queue: &'static str) -> Letters<F::Broker> {
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(queue);
    let app = start(
        fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(queue, fails_until_healed).name("fails_until_healed"))
                .max_attempts(crate::nonzero!(1u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let mut ids = Vec::new();
    for (n, kind) in (1..).zip(KINDS) {
        ids.push(
            app.publish(job(queue, n).kind(kind))
                .await
                .expect("publish")
                .into_id(),
        );
        app.drain().await;
        // Apart in time, so that "newest first" is well defined on every backend.
        app.advance(Duration::from_millis(20)).await;
    }
    let listed = app.dead_letters(&dl).await;
    assert_eq!(
        listed.len(),
        5,
        "five dead letters: {listed:?}; records: {:?}",
        app.records()
    );
    Letters {
        app,
        direct,
        probe,
        queue,
        dl,
        ids,
    }
}

/// Dead letters are listed newest first, each with its origin and attempts; by kind, by id
/// (the dead letter's or the job's) and up to a limit.
pub async fn dead_letters_are_listed_newest_first_and_by_kind<F: Fixture>(fixture: F) {
    let l = letters(&fixture, "cf_dead_list").await;
    let all = l.app.dead_letters(&l.dl).await;
    assert_eq!(numbers(&all), [5, 4, 3, 2, 1], "newest first");
    for d in &all {
        let n = numbers(std::slice::from_ref(d))[0];
        assert_eq!(d.envelope.kind(), KINDS[n as usize - 1]);
        assert_eq!(d.envelope.id(), &l.ids[n as usize - 1]);
        assert_eq!(d.origin, l.queue);
        assert_eq!(d.attempts, 1);
    }
    let list = |selector: DeadSelector, limit: usize| {
        let direct = l.direct.clone();
        let dl = l.dl.clone();
        async move {
            numbers(
                &direct
                    .dead_letters(&dl, &selector, limit)
                    .await
                    .expect("dead_letters"),
            )
        }
    };
    assert_eq!(list(DeadSelector::Kind("alpha".into()), 10).await, [4, 1]);
    assert_eq!(list(DeadSelector::Kind("beta".into()), 10).await, [3, 2]);
    assert_eq!(
        list(DeadSelector::Kind("delta".into()), 10).await,
        [0u64; 0]
    );
    assert_eq!(
        list(DeadSelector::All, 2).await,
        [5, 4],
        "newest first, limited"
    );
    assert_eq!(
        list(DeadSelector::Id(l.ids[2].to_string()), 10).await,
        [3],
        "by job id"
    );
    let third = all
        .iter()
        .find(|d| d.envelope.id() == &l.ids[2])
        .expect("listed");
    assert_eq!(
        list(DeadSelector::Id(third.id.clone()), 10).await,
        [3],
        "by dead-letter id"
    );
    assert_eq!(l.direct.dead_len(&l.dl).await.expect("dead_len"), 5);
    l.app.stop().await;
}

/// Replay by id: the job goes back to its queue with its attempts reset (it runs with attempt
/// 1, keeping its id) and leaves the dead letter; the other letters stay.
pub async fn dead_letter_replay_by_id_resets_the_attempts<F: Fixture>(fixture: F) {
    let l = letters(&fixture, "cf_dead_replay_id").await;
    let all = l.app.dead_letters(&l.dl).await;
    let first = all
        .iter()
        .find(|d| d.envelope.id() == &l.ids[0])
        .expect("job 1 is dead-lettered");
    l.probe.healed.store(true, Ordering::SeqCst);
    let report = l
        .app
        .replay(&l.dl, DeadSelector::Id(first.id.clone()))
        .await;
    assert_eq!(
        report,
        ReplayReport {
            replayed: 1,
            ..ReplayReport::default()
        }
    );
    assert_eq!(
        numbers(&l.app.dead_letters(&l.dl).await),
        [5, 4, 3, 2],
        "the replayed job left the dead letter; the others stay"
    );
    l.app.drain().await;

    assert_eq!(
        l.probe.attempts_of(1),
        [Some(1), Some(1)],
        "the replayed job runs with attempt 1"
    );
    let last = l
        .app
        .outcomes("fails_until_healed")
        .pop()
        .expect("a record");
    assert_eq!(last.job_id, l.ids[0], "the replayed job keeps its id");
    assert_eq!((last.attempt, last.outcome), (1, Outcome::Acked));
    assert_eq!(l.probe.runs(), 6, "nothing else ran");
    assert_empty(&l.app, l.queue, "after the replayed job ran").await;
    assert_eq!(l.direct.dead_len(&l.dl).await.expect("dead_len"), 4);
    l.app.stop().await;
}

/// Replay by kind: only that kind's letters go back to the queue (and run with attempt 1);
/// the others stay.
pub async fn dead_letter_replay_by_kind_moves_only_that_kind<F: Fixture>(fixture: F) {
    let l = letters(&fixture, "cf_dead_replay_kind").await;
    l.probe.healed.store(true, Ordering::SeqCst);
    let report = l.app.replay(&l.dl, DeadSelector::Kind("beta".into())).await;
    assert_eq!(
        report,
        ReplayReport {
            replayed: 2,
            ..ReplayReport::default()
        }
    );
    assert_eq!(
        numbers(&l.app.dead_letters(&l.dl).await),
        [5, 4, 1],
        "only the beta letters moved"
    );
    l.app.drain().await;

    for n in [2, 3] {
        assert_eq!(
            l.probe.attempts_of(n),
            [Some(1), Some(1)],
            "job {n} ran again with attempt 1"
        );
    }
    for n in [1, 4, 5] {
        assert_eq!(l.probe.attempts_of(n), [Some(1)], "job {n} stayed dead");
    }
    let acked: Vec<JobId> = l
        .app
        .outcomes("fails_until_healed")
        .into_iter()
        .filter(|r| r.outcome == Outcome::Acked)
        .map(|r| r.job_id)
        .collect();
    assert_eq!(acked.len(), 2);
    assert!(acked.contains(&l.ids[1]) && acked.contains(&l.ids[2]));
    assert_empty(&l.app, l.queue, "after the replayed jobs ran").await;
    assert_eq!(l.direct.dead_len(&l.dl).await.expect("dead_len"), 3);
    l.app.stop().await;
}

/// Purge removes the selected dead letters (by id, by kind, all) and returns how many.
pub async fn dead_letter_purge_removes_the_selected<F: Fixture>(fixture: F) {
    let l = letters(&fixture, "cf_dead_purge").await;
    let purged = l
        .app
        .purge(&l.dl, DeadSelector::Id(l.ids[4].to_string()))
        .await;
    assert_eq!(purged, 1);
    assert_eq!(numbers(&l.app.dead_letters(&l.dl).await), [4, 3, 2, 1]);
    assert_eq!(
        l.app.purge(&l.dl, DeadSelector::Kind("beta".into())).await,
        2
    );
    assert_eq!(numbers(&l.app.dead_letters(&l.dl).await), [4, 1]);
    assert_eq!(
        l.app.purge(&l.dl, DeadSelector::Kind("delta".into())).await,
        0,
        "nothing selected, nothing purged"
    );
    assert_eq!(l.app.purge(&l.dl, DeadSelector::All).await, 2);
    assert!(l.app.dead_letters(&l.dl).await.is_empty());
    assert_eq!(l.direct.dead_len(&l.dl).await.expect("dead_len"), 0);
    assert_eq!(l.probe.runs(), 5, "purged jobs do not run");
    assert_empty(&l.app, l.queue, "purging does not touch the queue").await;
    l.app.stop().await;
}

/// The request id and the trace travel from the publisher into the handler
/// (`Ctx<keys::RequestId>`, `Ctx<keys::Trace>`) and into the dead letter.
pub async fn request_id_and_trace_reach_the_handler_and_the_dead_letter<F: Fixture>(fixture: F) {
    const Q: &str = "cf_headers";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, reads_headers).name("reads_headers"))
                .max_attempts(crate::nonzero!(1u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1).request_id("req-42").trace("trace-42"))
        .await
        .expect("publish");
    app.publish(job(Q, 2)).await.expect("publish");
    app.drain().await;

    let mut seen = probe.seen();
    seen.sort_by_key(|s| s.n);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].request_id.as_deref(), Some("req-42"));
    assert_eq!(seen[0].trace.as_deref(), Some("trace-42"));
    assert_eq!(seen[1].request_id, None, "no header, no value");
    assert_eq!(seen[1].trace, None);

    let letters = app.dead_letters(&dl).await;
    let with = letters
        .iter()
        .find(|d| numbers(std::slice::from_ref(d)) == [1])
        .expect("job 1 is dead-lettered");
    assert_eq!(
        with.envelope.headers().request_id.as_deref(),
        Some("req-42")
    );
    assert_eq!(with.envelope.headers().trace.as_deref(), Some("trace-42"));
    let without = letters
        .iter()
        .find(|d| numbers(std::slice::from_ref(d)) == [2])
        .expect("job 2 is dead-lettered");
    assert_eq!(without.envelope.headers().request_id, None);
    assert_eq!(without.envelope.headers().trace, None);
    assert_empty(&app, Q, "after the dead letters").await;
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Rows the current core fails (not yet in `conformance_tests!`): each names the bug it shows.
// Move a row into the macro's list once its bug is fixed.
// ---------------------------------------------------------------------------------------------

/// `QueueStats::delayed` counts only jobs waiting for a time in the future: while jobs without
/// a delay are being published, the stats never count one of them as delayed.
///
/// Not yet in [`conformance_tests!`](crate::conformance_tests): the in-memory broker reads its
/// clock before taking its lock in `stats`, so a job published (or a retry settled) between
/// the two looks delayed, and `TestApp::drain` on a live app can return before the job ran.
pub async fn stats_never_count_a_due_job_as_delayed<F: Fixture>(fixture: F) {
    const Q: &str = "cf_stats_due";
    const JOBS: u64 = 2_000;
    let direct = connected(&fixture.broker().await).await;
    direct.prepare(Q).await.expect("prepare");
    let publisher = tokio::spawn({
        let broker = direct.clone();
        async move {
            for n in 0..JOBS {
                let (_, envelope, at) = job(Q, n).into_parts(broker.clock().now());
                broker
                    .publish(Q, vec![(envelope, at)])
                    .await
                    .expect("publish");
            }
        }
    });
    let mut wrong = Vec::new();
    while !publisher.is_finished() {
        let stats = direct.stats(Q).await.expect("stats");
        if stats.delayed > 0 {
            wrong.push(stats);
        }
        tokio::task::yield_now().await;
    }
    publisher.await.expect("the publisher finishes");
    let last = direct.stats(Q).await.expect("stats");
    assert_eq!((last.ready, last.delayed), (JOBS, 0), "{last:?}");
    assert!(
        wrong.is_empty(),
        "{} stats counted a due job as delayed, e.g. {:?}",
        wrong.len(),
        wrong.first()
    );
}

/// A job abandoned at shutdown comes back when the harness moves time past its lease: the
/// second service is started at once and `advance(lease + margin)` runs the job, on the paused
/// clock as on the live one.
///
/// Not yet in [`conformance_tests!`](crate::conformance_tests): on the paused clock
/// `TestApp::advance` first drains, and `drain` waits for the abandoned delivery (counted as
/// `pending`) whose lease only the advance itself would end, until `drain_timeout`.
pub async fn abandoned_job_comes_back_when_advancing_past_its_lease<F: Fixture>(fixture: F) {
    const Q: &str = "cf_abandoned_advance";
    // Longer than a shutdown takes, so that the lease is still held when the second service
    // starts.
    const LONG_LEASE: Duration = Duration::from_secs(2);
    let probe = Probe::new();
    let broker = fixture.broker_with_lease(LONG_LEASE).await;
    let dl = broker.default_dead_letter(Q);
    let mount = |b: &mut crate::RouteBuilder<F::Broker>| {
        b.include(Subscriber::new(Q, hangs_first).name("hangs_first"))
            .max_attempts(crate::nonzero!(3u32))
            .dead_letter(dl.clone());
    };
    let first = start(
        &fixture,
        service(&probe)
            .shutdown_timeout(Duration::from_millis(100))
            .with_broker(broker.clone(), mount),
    )
    .await;
    // `enqueue`: the first attempt hangs until the shutdown abandons it.
    first.enqueue(job(Q, 1)).await.expect("publish");
    eventually("the first attempt runs", || probe.in_flight() == 1).await;
    first.stop().await;

    let mut second = start(&fixture, service(&probe).with_broker(broker, mount)).await;
    second.drain_timeout = Duration::from_secs(3);
    second.advance(LONG_LEASE + MARGIN).await;
    assert_eq!(
        probe.attempts(),
        [Some(1), Some(2)],
        "the abandoned job runs once its lease is over"
    );
    assert_empty(&second, Q, "after the second service ran it").await;
    second.stop().await;
}

/// Replaying a dead letter whose job id is back in its queue (published again meanwhile) skips
/// it and leaves it where it was, as `ReplayReport::skipped` says.
///
/// Not yet in [`conformance_tests!`](crate::conformance_tests): the in-memory broker removes
/// the letter from the dead letter before it finds the id taken, and then drops it.
pub async fn replay_skips_a_letter_whose_job_is_back_in_its_queue<F: Fixture>(fixture: F) {
    const Q: &str = "cf_replay_taken";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_until_healed).name("fails_until_healed"))
                .max_attempts(crate::nonzero!(1u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let id = JobId::from_string(format!("cf-taken-{}", JobId::new()));
    app.publish(job(Q, 1).id(id.clone()))
        .await
        .expect("publish");
    app.drain().await;
    assert_eq!(app.dead_letters(&dl).await.len(), 1);
    // The same id again, waiting in the queue (far in the future).
    app.publish(job(Q, 2).id(id.clone()).after(Duration::from_secs(3600)))
        .await
        .expect("publish");

    // A backend whose job ids are unique across a table (SQL, where the dead letter is the same
    // row) refuses the second publish instead: then the replay moves the letter back. Either
    // way a job id never has two live copies.
    let waiting = app.stats(Q).await.delayed;
    // Healed first: a replayed job may run before the letters are read again, and must not
    // land back in the dead letter when it does.
    probe.healed.store(true, Ordering::SeqCst);
    let report = app.replay(&dl, DeadSelector::Id(id.to_string())).await;
    if waiting == 1 {
        assert_eq!(
            report,
            ReplayReport {
                skipped: 1,
                ..ReplayReport::default()
            }
        );
        let letters = app.dead_letters(&dl).await;
        assert_eq!(
            numbers(&letters),
            [1],
            "a skipped letter is left where it was"
        );
    } else {
        assert_eq!(waiting, 0, "{:?}", app.stats(Q).await);
        assert_eq!(
            report,
            ReplayReport {
                replayed: 1,
                ..ReplayReport::default()
            }
        );
        assert!(app.dead_letters(&dl).await.is_empty());
    }
    app.stop().await;
}

/// A delivery waiting for a slot of its mount (several kinds share a queue; one kind's
/// concurrency is full) keeps its lease: every job runs exactly once, on its first attempt.
/// Meaningful on the live clock (the paused clock does not move while handlers run).
///
/// Not yet in [`conformance_tests!`](crate::conformance_tests): the runtime claims up to the
/// queue's total slots, then waits for the mount's permit without renewing the lease; a job
/// that waits longer than its lease is claimed again (attempt 2) and runs twice.
pub async fn waiting_for_a_mount_slot_keeps_the_lease<F: Fixture>(fixture: F) {
    const Q: &str = "cf_mount_slot";
    const JOBS: u64 = 6;
    let probe = Probe::new();
    let broker = fixture.broker_with_lease(LEASE).await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, slow).kind("one_at_a_time").name("slow"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone())
                .concurrency(1);
            b.include(Subscriber::new(Q, acks).kind("many").name("acks"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone())
                .concurrency(8);
        }),
    )
    .await;
    for n in 1..=JOBS {
        app.publish(job(Q, n).kind("one_at_a_time"))
            .await
            .expect("publish");
    }
    app.drain().await;

    for n in 1..=JOBS {
        assert_eq!(
            probe.attempts_of(n),
            [Some(1)],
            "job {n} runs once; records: {:?}",
            app.records()
        );
    }
    assert_eq!(probe.max_in_flight.load(Ordering::SeqCst), 1);
    assert_empty(&app, Q, "after every job").await;
    app.stop().await;
}

/// Fails every attempt, recording the job id it sees (`Ctx<keys::JobId>`).
async fn fails_seeing_id(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(job_id): Ctx<keys::JobId>,
) -> Result<(), LedgerClosed> {
    p.see(Seen {
        job_id: Some(job_id),
        ..Seen::of(msg, attempt)
    });
    Err(ledger_closed())
}

/// One id per job: the id `publish` returns is the id every attempt's handler sees
/// (`Ctx<keys::JobId>`), the harness records, and the job's dead letter keeps
/// (`envelope.id()`), which the CLI shows and a replay selects by.
pub async fn published_id_is_the_handlers_and_the_dead_letters<F: Fixture>(fixture: F) {
    const Q: &str = "cf_one_id";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_seeing_id).name("fails_seeing_id"))
                .max_attempts(crate::nonzero!(2u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let published = app.publish(job(Q, 1)).await.expect("publish");
    assert!(published.is_stored(), "{published:?}");
    let id = published.into_id();
    app.drain().await;

    let seen: Vec<Option<JobId>> = probe.seen().into_iter().map(|s| s.job_id).collect();
    assert_eq!(
        seen,
        [Some(id.clone()), Some(id.clone())],
        "each attempt's handler sees the id publish returned"
    );
    let records = app.outcomes("fails_seeing_id");
    assert!(
        records.len() == 2 && records.iter().all(|r| r.job_id == id),
        "{records:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(
        letters[0].envelope.id(),
        &id,
        "the dead letter keeps the id publish returned"
    );
    assert!(DeadSelector::Id(id.to_string()).matches(&letters[0]));
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// A publish tells which jobs it stored: a job id published twice is stored once (the second
/// report says "not stored"), and so is an id repeated inside one batch or already waiting;
/// each stored job runs once, the first publication of its id.
pub async fn duplicate_publishes_are_reported_not_stored<F: Fixture>(fixture: F) {
    const Q: &str = "cf_dup_report";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    // Delayed, so that the first publication is surely still in the queue.
    let id = JobId::from_string(format!("cf-dup-report-{}", JobId::new()));
    let first = app
        .publish(job(Q, 1).id(id.clone()).after(DELAY))
        .await
        .expect("publish");
    let second = app
        .publish(job(Q, 2).id(id.clone()).after(DELAY))
        .await
        .expect("publishing a duplicate is not an error");
    assert_eq!((first.id(), first.is_stored()), (&id, true), "the first");
    assert_eq!(
        (second.id(), second.is_stored()),
        (&id, false),
        "the second: already there"
    );

    // One batch: a new id twice, and the id already waiting.
    let other = JobId::from_string(format!("cf-dup-report-{}", JobId::new()));
    let batch = crate::broker::Publish::publish_jobs(
        &direct,
        [
            job(Q, 3).id(other.clone()).after(DELAY),
            job(Q, 4).id(other.clone()).after(DELAY),
            job(Q, 5).id(id.clone()).after(DELAY),
        ],
    )
    .await
    .expect("publishing a batch with duplicates is not an error");
    let got: Vec<(JobId, bool)> = batch
        .iter()
        .map(|p| (p.id().clone(), p.is_stored()))
        .collect();
    assert_eq!(
        got,
        [(other.clone(), true), (other, false), (id, false)],
        "one report per job, in order"
    );
    let stats = app.stats(Q).await;
    assert_eq!(stats.delayed, 2, "two jobs stored: {stats:?}");

    app.advance(DELAY + MARGIN).await;
    let mut ran: Vec<(u64, Option<u32>)> = probe.seen().iter().map(|s| (s.n, s.attempt)).collect();
    ran.sort_unstable();
    assert_eq!(
        ran,
        [(1, Some(1)), (3, Some(1))],
        "each stored job runs once, its first publication"
    );
    assert_empty(&app, Q, "after the jobs ran").await;
    app.stop().await;
}

/// On the paused harness ([`TestApp::start`]), `publish` of a job due now returns once the job
/// has settled, and whatever it caused at the same instant with it (a retry without delay),
/// the clock unmoved: a test reads the outcome right after publishing. A delayed job is only
/// stored. On a live fixture `publish` returns once the job is stored; `drain` settles it.
pub async fn paused_publish_returns_once_the_job_has_settled<F: Fixture>(fixture: F) {
    const Q: &str = "cf_publish_settles";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_once).name("retries_once"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let before = app.now();
    app.publish(job(Q, 1)).await.expect("publish");
    if !fixture.paused() {
        app.drain().await;
    }
    let got = outcomes(&app, "retries_once");
    assert!(
        matches!(&got[..], [(1, Outcome::Retried { delay, .. }), (2, Outcome::Acked)] if delay.is_zero()),
        "the job and its retry at once have settled when publish returns: {got:?}"
    );
    if fixture.paused() {
        assert_eq!(app.now(), before, "the clock did not move");
    }

    app.publish(job(Q, 2).after(DELAY)).await.expect("publish");
    assert_eq!(
        outcomes(&app, "retries_once").len(),
        2,
        "a delayed job is only stored"
    );
    assert_eq!(app.stats(Q).await.delayed, 1);
    app.advance(DELAY + MARGIN).await;
    assert_eq!(probe.attempts_of(2), [Some(1), Some(2)], "run at its time");
    assert_empty(&app, Q, "after both jobs").await;
    assert!(app.dead_letters(&dl).await.is_empty());
    app.stop().await;
}

/// "A row that cannot be claimed is dead-lettered alone": a stored job the broker cannot read
/// (see [`Fixture::store_unreadable_job`]) published before 20 good ones goes to the queue's
/// dead letter by itself, with an error naming the field that holds the bad value; every good
/// job runs once, on its first attempt; no claim fails and the queue ends empty. A backend
/// whose fixture stores no unreadable job passes without checking anything.
pub async fn a_job_that_cannot_be_read_is_dead_lettered_alone<F: Fixture>(fixture: F) {
    const Q: &str = "cf_unreadable";
    const GOOD: u64 = 20;
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let Some(field) = fixture.store_unreadable_job(&direct, Q).await else {
        return;
    };
    for n in 1..=GOOD {
        let (queue, envelope, at) = job(Q, n).into_parts(direct.clock().now());
        direct
            .publish(&queue, vec![(envelope, at)])
            .await
            .expect("publish");
    }
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.drain().await;

    for n in 1..=GOOD {
        assert_eq!(
            probe.attempts_of(n),
            [Some(1)],
            "good job {n} runs once; records: {:?}",
            app.records()
        );
    }
    assert_eq!(probe.runs(), GOOD as usize, "only the good jobs ran");
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "the unreadable job alone: {letters:?}");
    let d = &letters[0];
    assert!(
        d.error.contains(&field),
        "the error names `{field}`: {}",
        d.error
    );
    assert_eq!(d.origin, Q, "{d:?}");
    assert_empty(&app, Q, "after the unreadable job was dead-lettered").await;
    for q in app.health().queues {
        assert_eq!(q.failed_claims_total, 0, "no claim failed: {q:?}");
    }
    app.stop().await;
}

/// A dead letter reports the attempts its job spent: after `N` failed deliveries under
/// `max_attempts(N)`, the dead letter's `attempts` and its envelope's attempt are `N` (not the
/// next delivery's number), and a subscriber that reads the dead letter (mounted on it, as seed
/// 002's `review`) sees `N` on its first delivery of it.
pub async fn dead_letter_reports_attempts_spent<F: Fixture>(fixture: F) {
    const Q: &str = "cf_dead_spent";
    const CAP: u32 = 4;
    let failing = Probe::new();
    let broker = fixture.broker().await;
    let same = broker.clone();
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&failing).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_with_source).name("fails_with_source"))
                .max_attempts(crate::nonzero!(CAP))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let id = app.publish(job(Q, 11)).await.expect("publish").into_id();
    app.drain().await;
    assert_eq!(
        failing.attempts(),
        (1..=CAP).map(Some).collect::<Vec<_>>(),
        "the job runs {CAP} times; records {:?}",
        app.records()
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    assert_eq!(letters[0].envelope.id(), &id);
    assert_eq!(
        letters[0].attempts, CAP,
        "the dead letter reports the attempts spent: {:?}",
        letters[0]
    );
    assert_eq!(
        letters[0].envelope.attempt(),
        CAP,
        "its envelope too: {:?}",
        letters[0]
    );
    app.stop().await;

    // The dead letter's reader, on the same backend.
    let reader = Probe::new();
    let app = start(
        &fixture,
        service(&reader).with_broker(same, |b| {
            b.include(Subscriber::new(dl.clone(), acks).name("reads_dead_letters"));
        }),
    )
    .await;
    app.drain().await;
    eventually("the dead letter's reader ran", || reader.runs() == 1).await;
    assert_eq!(
        reader.attempts_of(11),
        [Some(CAP)],
        "the reader's first delivery of the dead letter sees the attempts spent; records {:?}",
        app.records()
    );
    app.stop().await;
}

/// A mount without a cap never hot-loops (DESIGN 9): a job that always fails there waits at
/// least [`UNCAPPED_FLOOR`](crate::UNCAPPED_FLOOR) after each failed attempt (1 s after the
/// first, 2 s after the second, ...), whether the mount declares no backoff (`Err` returned)
/// or the handler asks for a shorter `retry_after`. On the paused clock the floor is exact (not
/// run again 1 ms before it, run at it); live, each job is delivered at most twice in 1.5 s.
pub async fn uncapped_mount_retries_no_faster_than_the_floor<F: Fixture>(fixture: F) {
    use crate::Backoff;
    const Q: &str = "cf_uncapped";
    const Q_AFTER: &str = "cf_uncapped_after";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_with_source).name("fails_with_source"));
            b.include(Subscriber::new(Q_AFTER, retries_after_always).name("retries_after_always"));
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.publish(job(Q_AFTER, 2)).await.expect("publish");
    app.drain().await;
    let floor = |attempt: u32| crate::UNCAPPED_FLOOR.delay(attempt);
    let ms = Duration::from_millis;
    for n in [1, 2] {
        assert_eq!(
            probe.attempts_of(n),
            [Some(1)],
            "job {n} is not retried at once: {:?}",
            app.records()
        );
    }
    if fixture.paused() {
        app.advance(floor(1) - ms(1)).await;
        for n in [1, 2] {
            assert_eq!(probe.attempts_of(n), [Some(1)], "job {n}: not before 1 s");
        }
        app.advance(ms(1)).await;
        for n in [1, 2] {
            assert_eq!(probe.attempts_of(n), [Some(1), Some(2)], "job {n}: at 1 s");
        }
        app.advance(floor(2) - ms(1)).await;
        for n in [1, 2] {
            assert_eq!(
                probe.attempts_of(n),
                [Some(1), Some(2)],
                "job {n}: not before 2 s more"
            );
        }
        app.advance(ms(1)).await;
        for n in [1, 2] {
            assert_eq!(
                probe.attempts_of(n),
                [Some(1), Some(2), Some(3)],
                "job {n}: at 2 s more"
            );
        }
    } else {
        app.advance(ms(1500)).await;
        for n in [1, 2] {
            let runs = probe.attempts_of(n).len();
            assert!(
                (1..=2).contains(&runs),
                "job {n} delivered {runs} times in 1.5 s on a mount without a cap: {:?}",
                probe.attempts_of(n)
            );
        }
    }
    for subscriber in ["fails_with_source", "retries_after_always"] {
        let got = outcomes(&app, subscriber);
        assert!(!got.is_empty(), "{subscriber} ran");
        for (attempt, outcome) in &got {
            assert!(
                matches!(outcome, Outcome::Retried { delay, .. } if *delay == floor(*attempt)),
                "{subscriber}: failed attempt {attempt} waits the floor {:?}: {got:?}",
                floor(*attempt)
            );
        }
    }
    for q in [Q, Q_AFTER] {
        let stats = app.stats(q).await;
        assert_eq!(
            (stats.ready, stats.delayed),
            (0, 1),
            "`{q}`: the job waits, delayed, and is not lost: {stats:?}"
        );
    }
    app.stop().await;
}

/// Publishes message `n` of id `id` to `queue` through [`Broker::publish_once`] with `guard`,
/// due `after` from now (`None`: now).
async fn publish_once_n<B: Broker>(
    broker: &B,
    queue: &str,
    (n, id): (u64, &JobId),
    after: Option<Duration>,
    guard: &str,
) -> crate::broker::Published {
    let mut j = job(queue, n).id(id.clone());
    if let Some(d) = after {
        j = j.after(d);
    }
    let (q, envelope, at) = j.into_parts(broker.clock().now());
    broker
        .publish_once(&q, (envelope, at), guard, Duration::from_secs(3600))
        .await
        .unwrap_or_else(|e| panic!("publish_once of message {n}: {e}"))
}

/// [`Broker::publish_once`] (how the scheduler enqueues a tick) takes its guard and publishes
/// its job in one step: a second call with the same guard stores nothing, even a job of
/// another id, and reports it as already there; a call with another guard publishes again; a
/// job due later waits delayed as any other; a job whose id is already in the queue is not
/// stored twice, whatever its guard.
pub async fn publish_once_stores_a_job_once_per_guard<F: Fixture>(fixture: F) {
    const Q: &str = "cf_publish_once";
    let direct = connected(&fixture.broker().await).await;
    direct.prepare(Q).await.expect("prepare");
    // Guards of their own: a shared server keeps them after the test.
    let run = JobId::new();
    let (tick_1, tick_2, tick_3, tick_4) = (
        format!("cf-once:{run}:1"),
        format!("cf-once:{run}:2"),
        format!("cf-once:{run}:3"),
        format!("cf-once:{run}:4"),
    );
    let ids: Vec<JobId> = (0..5)
        .map(|i| JobId::from_string(format!("cf-once-{run}-{i}")))
        .collect();

    let first = publish_once_n(&direct, Q, (1, &ids[0]), None, &tick_1).await;
    assert_eq!(
        (first.id(), first.is_stored()),
        (&ids[0], true),
        "the first"
    );
    let again = publish_once_n(&direct, Q, (2, &ids[1]), None, &tick_1).await;
    assert_eq!(
        (again.id(), again.is_stored()),
        (&ids[1], false),
        "the same guard again, another job id: nothing stored"
    );
    let other = publish_once_n(&direct, Q, (3, &ids[2]), None, &tick_2).await;
    assert_eq!(
        (other.id(), other.is_stored()),
        (&ids[2], true),
        "another guard publishes"
    );
    let stats = direct.stats(Q).await.expect("stats");
    assert_eq!(
        (stats.ready, stats.delayed),
        (2, 0),
        "two jobs stored, one per guard: {stats:?}"
    );

    let later = publish_once_n(
        &direct,
        Q,
        (4, &ids[3]),
        Some(Duration::from_secs(3600)),
        &tick_3,
    )
    .await;
    assert!(later.is_stored(), "a job due later is stored");
    let later_again = publish_once_n(
        &direct,
        Q,
        (5, &ids[4]),
        Some(Duration::from_secs(3600)),
        &tick_3,
    )
    .await;
    assert!(!later_again.is_stored(), "its guard holds as well");
    let known = publish_once_n(&direct, Q, (6, &ids[0]), None, &tick_4).await;
    assert_eq!(
        (known.id(), known.is_stored()),
        (&ids[0], false),
        "an id already in the queue is not stored again under a new guard"
    );
    let stats = direct.stats(Q).await.expect("stats");
    assert_eq!(
        (stats.ready, stats.delayed),
        (2, 1),
        "two jobs ready and one delayed, nothing more: {stats:?}"
    );
}
