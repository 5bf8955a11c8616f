//! Mounting subscribers on a broker: the cap, the dead letter, the backoff, the concurrency.
//!
//! Each step can be declared once per mount; declaring one twice is a compile error. What needs
//! the whole service to judge (a cap without a dead letter, two subscribers on one queue and
//! kind) is checked at startup, where every problem is listed at once.

use std::marker::PhantomData;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::backoff::{Backoff, Immediate};
use crate::broker::Broker;
use crate::handler::ErasedHandler;
use crate::subscription::{IntoSubscriber, QueueDescriptor, QueueFor};

/// What happens to a delivery whose payload does not decode into the handler's message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnDecodeError {
    /// A failed attempt like any other (it spends attempts and reaches the dead letter at the
    /// cap).
    #[default]
    Retry,
    /// Dead-letter at once: another attempt would decode the same bytes. Needs a
    /// dead letter on the mount.
    DeadLetter,
}

/// The default number of handlers of one mount running at once (8 slots).
pub const DEFAULT_CONCURRENCY: usize = 8;

/// One mounted subscriber, as the runtime runs it.
#[derive(Clone)]
pub(crate) struct MountSpec {
    pub(crate) subscriber: String,
    pub(crate) queue: String,
    pub(crate) kind: Option<String>,
    pub(crate) backend: Option<&'static str>,
    pub(crate) handler: Arc<dyn ErasedHandler>,
    pub(crate) max_attempts: Option<NonZeroU32>,
    pub(crate) dead_letter: Option<String>,
    pub(crate) backoff: Arc<dyn Backoff>,
    pub(crate) concurrency: usize,
    pub(crate) on_decode_error: OnDecodeError,
    pub(crate) global_concurrency: Option<u32>,
    pub(crate) rate_limit: Option<(u32, Duration)>,
    /// How long results and progress are kept.
    pub(crate) keep_results: Duration,
}

/// The subscribers mounted on one broker; [`Service::with_broker`](crate::Service::with_broker)
/// hands it to your closure.
pub struct RouteBuilder<B> {
    pub(crate) broker: B,
    pub(crate) mounts: Vec<MountSpec>,
}

impl<B: Broker> RouteBuilder<B> {
    pub(crate) fn new(broker: B) -> Self {
        Self {
            broker,
            mounts: Vec::new(),
        }
    }

    /// Mounts a subscriber: `b.include(send).max_attempts(nonzero!(5u32)).dead_letter("x.dead")`.
    pub fn include<S>(&mut self, subscriber: S) -> Mount<'_, B>
    where
        S: IntoSubscriber,
        S::Queue: QueueFor<B>,
    {
        let s = subscriber.into_subscriber();
        let idx = self.mounts.len();
        self.mounts.push(MountSpec {
            subscriber: s.name,
            queue: s.queue.queue_name(),
            kind: s.kind,
            backend: s.queue.backend(),
            handler: s.handler,
            max_attempts: None,
            dead_letter: None,
            backoff: Arc::new(Immediate),
            concurrency: DEFAULT_CONCURRENCY,
            on_decode_error: OnDecodeError::Retry,
            global_concurrency: None,
            rate_limit: None,
            keep_results: crate::results::DEFAULT_RESULT_RETENTION,
        });
        Mount {
            route: self,
            idx,
            _steps: PhantomData,
        }
    }

    /// The broker.
    pub fn broker(&self) -> &B {
        &self.broker
    }
}

/// A step of a mount has not been declared yet.
#[derive(Debug)]
pub struct Unset;
/// A step of a mount has been declared.
#[derive(Debug)]
pub struct Set;

/// The names of a mount's steps, as compile errors show them.
pub mod steps {
    /// `.max_attempts(..)`
    #[derive(Debug)]
    pub struct MaxAttempts;
    /// `.dead_letter(..)`
    #[derive(Debug)]
    pub struct DeadLetter;
    /// `.backoff(..)`
    #[derive(Debug)]
    pub struct Backoff;
    /// `.concurrency(..)`
    #[derive(Debug)]
    pub struct Concurrency;
    /// `.on_decode_error(..)`
    #[derive(Debug)]
    pub struct OnDecodeError;
    /// `.global_concurrency(..)`
    #[derive(Debug)]
    pub struct GlobalConcurrency;
    /// `.rate_limit(..)`
    #[derive(Debug)]
    pub struct RateLimit;
    /// `.keep_results(..)`
    #[derive(Debug)]
    pub struct KeepResults;
}

/// Holds for a step that a mount has not declared yet.
#[diagnostic::on_unimplemented(
    message = "`{Step}` is declared twice on this mount",
    label = "already declared earlier in this chain",
    note = "each step of a mount is declared once: remove one of the two calls"
)]
pub trait Undeclared<Step> {}
impl<Step> Undeclared<Step> for Unset {}

/// One mounted subscriber being configured. Each method is a step that may be declared once.
pub struct Mount<
    'r,
    B,
    C = Unset,
    D = Unset,
    P = Unset,
    N = Unset,
    E = Unset,
    G = Unset,
    R = Unset,
    K = Unset,
> {
    route: &'r mut RouteBuilder<B>,
    idx: usize,
    // One type parameter a step: the typestate that refuses a step declared twice.
    #[allow(clippy::type_complexity)]
    _steps: PhantomData<(C, D, P, N, E, G, R, K)>,
}

impl<'r, B, C, D, P, N, E, G, R, K> Mount<'r, B, C, D, P, N, E, G, R, K> {
    fn spec(&mut self) -> &mut MountSpec {
        &mut self.route.mounts[self.idx]
    }
    fn next<C2, D2, P2, N2, E2, G2, R2, K2>(self) -> Mount<'r, B, C2, D2, P2, N2, E2, G2, R2, K2> {
        Mount {
            route: self.route,
            idx: self.idx,
            _steps: PhantomData,
        }
    }

    /// Deliveries of a job, the first included: the failure of the last one moves the job to
    /// the dead letter. Declared together with [`dead_letter`](Self::dead_letter). A cap of 0
    /// cannot be written: `nonzero!(0u32)` does not compile; a cap above
    /// [`MAX_ATTEMPT`](crate::broker::MAX_ATTEMPT) (32,767, where every backend's attempt
    /// counter stops) could never be reached, and the service refuses to start with it.
    ///
    /// A mount without a cap retries a failing job forever, so its retries never come faster
    /// than [`UNCAPPED_FLOOR`](crate::UNCAPPED_FLOOR) (1 s, doubling to 60 s), whatever its
    /// [`backoff`](Self::backoff) or the handler's `retry_after` asks.
    pub fn max_attempts(mut self, n: NonZeroU32) -> Mount<'r, B, Set, D, P, N, E, G, R, K>
    where
        C: Undeclared<steps::MaxAttempts>,
    {
        self.spec().max_attempts = Some(n);
        self.next()
    }

    /// Where a job goes when it fails its last attempt: a queue, group or table name of the same
    /// broker (`"emails.dead"`, `"jobs:dead"`). Declared together with
    /// [`max_attempts`](Self::max_attempts).
    pub fn dead_letter(
        mut self,
        target: impl Into<String>,
    ) -> Mount<'r, B, C, Set, P, N, E, G, R, K>
    where
        D: Undeclared<steps::DeadLetter>,
    {
        self.spec().dead_letter = Some(target.into());
        self.next()
    }

    /// How long a failed attempt waits before the next: [`Immediate`] (the default),
    /// [`Fixed`](crate::Fixed), [`Exponential`](crate::Exponential),
    /// [`FullJitter`](crate::FullJitter). `retry_after(d)` from a handler overrides it. On a
    /// mount without [`max_attempts`](Self::max_attempts) either is raised to at least
    /// [`UNCAPPED_FLOOR`](crate::UNCAPPED_FLOOR) for that attempt.
    pub fn backoff(mut self, policy: impl Backoff) -> Mount<'r, B, C, D, Set, N, E, G, R, K>
    where
        P: Undeclared<steps::Backoff>,
    {
        self.spec().backoff = Arc::new(policy);
        self.next()
    }

    /// How many of this subscriber's handlers run at once (default 8).
    pub fn concurrency(mut self, n: usize) -> Mount<'r, B, C, D, P, Set, E, G, R, K>
    where
        N: Undeclared<steps::Concurrency>,
    {
        self.spec().concurrency = n;
        self.next()
    }

    /// What an undecodable payload does: a failed attempt (the default) or an immediate dead
    /// letter.
    pub fn on_decode_error(
        mut self,
        policy: OnDecodeError,
    ) -> Mount<'r, B, C, D, P, N, Set, G, R, K>
    where
        E: Undeclared<steps::OnDecodeError>,
    {
        self.spec().on_decode_error = policy;
        self.next()
    }

    /// At most `n` jobs of this mount's queue held at once by every worker of every process
    /// together (claimed and running), enforced through the backend: a permit per job, taken
    /// before the claim, renewed with the job's lease and given back at its settlement (a
    /// worker that dies gives its permits back within a lease). A job held back waits in its
    /// queue without spending an attempt. The limit is the queue's: every mount of the queue
    /// that declares one must declare the same (checked at startup). `.concurrency(..)` still
    /// bounds this process.
    ///
    /// `n` must be at least 1 (checked at startup).
    pub fn global_concurrency(mut self, n: u32) -> Mount<'r, B, C, D, P, N, E, Set, R, K>
    where
        G: Undeclared<steps::GlobalConcurrency>,
    {
        self.spec().global_concurrency = Some(n);
        self.next()
    }

    /// At most `r` jobs of this mount's queue started in any window of `per`, by every worker
    /// of every process together, enforced through the backend: a permit per started job,
    /// held for `per` by the backend's clock. A job held back waits in its queue without
    /// spending an attempt. The limit is the queue's: every mount of the queue that declares
    /// one must declare the same (checked at startup). A rate-limited queue claims nothing
    /// ahead: a claimed job starts at once (when its mount has a free slot).
    ///
    /// `r` must be at least 1 and `per` at least 1 ms (checked at startup).
    pub fn rate_limit(mut self, r: u32, per: Duration) -> Mount<'r, B, C, D, P, N, E, G, Set, K>
    where
        R: Undeclared<steps::RateLimit>,
    {
        self.spec().rate_limit = Some((r, per));
        self.next()
    }

    /// How long this mount's results ([`HandlerOutcome::ack_with`](crate::HandlerOutcome::ack_with),
    /// `Ok(value)`) and its jobs' last progress ([`JobProgress`](crate::JobProgress)) are kept,
    /// by the backend's clock (default
    /// [`DEFAULT_RESULT_RETENTION`](crate::results::DEFAULT_RESULT_RETENTION), 24 hours). After
    /// it, [`Results::result`](crate::Results::result) reads `None`.
    pub fn keep_results(mut self, retention: Duration) -> Mount<'r, B, C, D, P, N, E, G, R, Set>
    where
        K: Undeclared<steps::KeepResults>,
    {
        self.spec().keep_results = retention;
        self.next()
    }
}
