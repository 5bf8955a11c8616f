//! The reference model's values: where each job is, a unique key's state, a delivery held,
//! and what a run answers (a failure, or what it did).

use std::future::Future;
use std::time::Duration;

use crate::broker::Delivery;

/// The queue every sequence runs on (each on a fresh broker of the fixture).
pub(super) const QUEUE: &str = "model";
/// How long one broker call may take before the run fails as hung.
const CALL_LIMIT: Duration = Duration::from_secs(15);

/// A failed run: which invariant (`kind`, what the shrinker keeps), at which step, and what
/// was seen.
#[derive(Clone, Debug)]
pub(in crate::conformance::model) struct Failed {
    pub(in crate::conformance::model) kind: &'static str,
    pub(in crate::conformance::model) step: Option<usize>,
    pub(in crate::conformance::model) message: String,
}

/// What a passing run did.
#[derive(Clone, Copy, Debug, Default)]
pub(in crate::conformance::model) struct Ran {
    pub(in crate::conformance::model) steps: usize,
    pub(in crate::conformance::model) skipped: usize,
    /// Server restarts made (not skipped).
    pub(in crate::conformance::model) restarts: usize,
    /// The longest a broker took to answer again after a restart.
    pub(in crate::conformance::model) slowest_recovery: Duration,
}

pub(super) fn fail(kind: &'static str, message: impl Into<String>) -> Failed {
    Failed {
        kind,
        step: None,
        message: message.into(),
    }
}

/// Where the model has a job. Times are since the run's start; a pair `lo, hi` brackets the
/// call that set it (the backend stamped it somewhere between).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum St {
    /// Never stored (its publish failed, or its transaction rolled back).
    NotStored,
    Ready,
    Delayed {
        lo: Duration,
        hi: Duration,
    },
    /// Held by a delivery of ours (in `held`).
    Held,
    /// Claimed and abandoned (a crash, a lost lease): claimable once the lease is over.
    Orphan {
        lo: Duration,
        hi: Duration,
    },
    Dead,
    Done,
    Cancelled,
}

impl St {
    pub(super) fn alive(self) -> bool {
        matches!(
            self,
            St::Ready | St::Delayed { .. } | St::Held | St::Orphan { .. }
        )
    }
}

pub(super) struct ModelJob {
    pub(super) id: String,
    pub(super) st: St,
    pub(super) attempts: u32,
    pub(super) key: Option<(char, Duration)>,
    pub(super) headers: usize,
}

/// A unique key's state in the model.
#[derive(Clone, Copy, Debug)]
pub(super) enum Key {
    Held(usize),
    /// Its job `owner` finished: free again between `lo` and `hi`. The guard still names
    /// `owner`: a replay of it settled starts the window again, a cancel of it frees the key.
    Until {
        lo: Duration,
        hi: Duration,
        owner: usize,
    },
}

pub(super) struct Held<R> {
    pub(super) job: usize,
    pub(super) delivery: Delivery<R>,
    /// The lease began between these (the claim's or the last renewal's call).
    pub(super) lo: Duration,
    pub(super) hi: Duration,
}

pub(super) async fn call<T>(what: &str, fut: impl Future<Output = T>) -> Result<T, Failed> {
    tokio::time::timeout(CALL_LIMIT, fut).await.map_err(|_| {
        fail(
            "hung",
            format!("{what} did not return within {CALL_LIMIT:?}"),
        )
    })
}
