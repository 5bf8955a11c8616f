//! What every area of the suite shares: the timings, the test job and its payload, the
//! [`Probe`] the handlers report to, starting a service the way the fixture runs, polling and
//! the queue assertions, and the handlers (async fns: shared state comes through
//! `Data<Arc<Probe>>`).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::fixture::Fixture;
use crate::broker::{Broker, DeadLetter, QueueStats};
use crate::outcome::FailureCause;
use crate::service::{AppInfo, Service};
use crate::testing::{Outcome, TestApp};
use crate::{Ctx, Data, HandlerOutcome, Job, JobId, keys};

// ---------------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------------

/// A delay the tests wait for: long enough to see that nothing ran before it, short enough
/// for live runs.
pub(super) const DELAY: Duration = Duration::from_millis(300);
/// What `advance` adds to a delay so that a live broker has time to deliver the job.
pub(super) const MARGIN: Duration = Duration::from_millis(200);
/// The lease of the brokers of the lease tests.
pub(super) const LEASE: Duration = Duration::from_millis(300);
/// The longest a test polls for a condition before it fails.
pub(super) const PATIENCE: Duration = Duration::from_secs(10);
/// The `Display` of the handler error, and of its source.
pub(super) const LEDGER_CLOSED: &str = "the ledger is closed";
pub(super) const DISK_FULL: &str = "the disk is full";

/// The payload of every test job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Msg {
    pub(super) n: u64,
}

/// The error handlers return, with a source.
#[derive(Debug, thiserror::Error)]
#[error("{}", LEDGER_CLOSED)]
pub(super) struct LedgerClosed {
    source: DiskFull,
}

#[derive(Debug, thiserror::Error)]
#[error("{}", DISK_FULL)]
pub(super) struct DiskFull;

pub(super) fn ledger_closed() -> LedgerClosed {
    LedgerClosed { source: DiskFull }
}

/// One call of a handler, as the handler saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Seen {
    pub(super) n: u64,
    pub(super) attempt: Option<u32>,
    pub(super) job_id: Option<JobId>,
    pub(super) request_id: Option<String>,
    pub(super) trace: Option<String>,
}

impl Seen {
    pub(super) fn of(msg: &Msg, attempt: Option<u32>) -> Self {
        Self {
            n: msg.n,
            attempt,
            ..Self::default()
        }
    }
}

/// The state the handlers of a test share with it (through `Data<Arc<Probe>>`).
#[derive(Debug, Default)]
pub(super) struct Probe {
    pub(super) seen: Mutex<Vec<Seen>>,
    pub(super) in_flight: AtomicUsize,
    pub(super) max_in_flight: AtomicUsize,
    pub(super) finished: AtomicUsize,
    pub(super) healed: AtomicBool,
    pub(super) open: AtomicBool,
    pub(super) panic_line: AtomicU32,
    /// A handler saw its job's cancellation fire.
    pub(super) saw_cancel: AtomicBool,
}

impl Probe {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    pub(super) fn see(&self, seen: Seen) {
        self.seen.lock().expect("probe lock").push(seen);
    }
    pub(super) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("probe lock").clone()
    }
    pub(super) fn runs(&self) -> usize {
        self.seen.lock().expect("probe lock").len()
    }
    /// The attempts every call saw, in order.
    pub(super) fn attempts(&self) -> Vec<Option<u32>> {
        self.seen().iter().map(|s| s.attempt).collect()
    }
    /// The attempts the calls for message `n` saw, in order.
    pub(super) fn attempts_of(&self, n: u64) -> Vec<Option<u32>> {
        self.seen()
            .iter()
            .filter(|s| s.n == n)
            .map(|s| s.attempt)
            .collect()
    }
    pub(super) fn enter(&self) {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
    }
    pub(super) fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }
}

pub(super) fn job(queue: &str, n: u64) -> Job {
    Job::new(queue, &Msg { n }).expect("a Msg encodes")
}

pub(super) fn service(probe: &Arc<Probe>) -> Service {
    Service::new(AppInfo::new("conformance", env!("CARGO_PKG_VERSION"))).state(Arc::clone(probe))
}

/// Starts `service` as the fixture runs: on the paused clock or live.
pub(super) async fn start<F: Fixture>(fixture: &F, service: Service) -> TestApp {
    let started = if fixture.paused() {
        TestApp::start(service).await
    } else {
        TestApp::start_live(service).await
    };
    started.unwrap_or_else(|e| panic!("the service should start: {e}"))
}

/// A clone of `broker` for direct calls, connected (connecting is idempotent).
pub(super) async fn connected<B: Broker>(broker: &B) -> B {
    let direct = broker.clone();
    direct
        .connect()
        .await
        .unwrap_or_else(|e| panic!("the broker should connect: {e}"));
    direct
}

/// Polls `cond` (on the real clock) until it holds.
pub(super) async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
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
pub(super) fn outcomes(app: &TestApp, subscriber: &str) -> Vec<(u32, Outcome)> {
    app.outcomes(subscriber)
        .into_iter()
        .map(|r| (r.attempt, r.outcome))
        .collect()
}

pub(super) async fn assert_empty(app: &TestApp, queue: &str, context: &str) {
    let stats = app.stats(queue).await;
    assert_eq!(
        stats,
        QueueStats::default(),
        "{context}: queue `{queue}` should be empty; records: {:?}",
        app.records()
    );
}

pub(super) async fn assert_empty_direct<B: Broker>(broker: &B, queue: &str, context: &str) {
    let stats = broker.stats(queue).await.expect("queue stats");
    assert_eq!(
        stats,
        QueueStats::default(),
        "{context}: queue `{queue}` should be empty"
    );
}

/// The message numbers of `letters`, in order.
pub(super) fn numbers(letters: &[DeadLetter]) -> Vec<u64> {
    letters
        .iter()
        .map(|d| {
            serde_json::from_slice::<Msg>(d.envelope.payload())
                .expect("a dead letter keeps its payload")
                .n
        })
        .collect()
}

pub(super) fn is_retried(outcome: &Outcome, want: FailureCause) -> bool {
    matches!(outcome, Outcome::Retried { cause, .. } if *cause == want)
}

pub(super) fn is_dead_lettered(outcome: &Outcome, want: FailureCause) -> bool {
    matches!(outcome, Outcome::DeadLettered { cause, .. } if *cause == want)
}

// ---------------------------------------------------------------------------------------------
// Handlers (async fns: shared state comes through `Data<Arc<Probe>>`)
// ---------------------------------------------------------------------------------------------

pub(super) async fn acks(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    HandlerOutcome::ack()
}

pub(super) async fn ok_unit(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> Result<(), LedgerClosed> {
    p.see(Seen::of(msg, attempt));
    Ok(())
}

pub(super) async fn retries_until_third(
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

pub(super) async fn retries_once(
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

pub(super) async fn retries_after_once(
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
pub(super) const SHORT: Duration = Duration::from_millis(150);

pub(super) async fn retries_after_always(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    HandlerOutcome::retry_after(SHORT)
}

pub(super) async fn drops(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    HandlerOutcome::drop()
}

pub(super) async fn fails_with_source(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> Result<(), LedgerClosed> {
    p.see(Seen::of(msg, attempt));
    Err(ledger_closed())
}

pub(super) async fn counts_to_four(
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

pub(super) async fn slow(
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
pub(super) async fn hangs_first(
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
pub(super) async fn gated(
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
pub(super) async fn fails_until_healed(
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

pub(super) async fn reads_headers(
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
