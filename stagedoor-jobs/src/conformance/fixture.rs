//! [`Fixture`]: what a backend provides to run the conformance suite.

use std::future::Future;
use std::time::Duration;

use crate::broker::{Broker, BrokerError, Published};
use crate::envelope::Job;

/// A hand edit the model test ([`run_model`](super::run_model)) asks a fixture to make in the
/// keys, entries or rows its backend owns, to check that each bad item costs only itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Junk {
    /// Redis: a member of `{q}:delayed` that is no job, due now.
    DelayedMember,
    /// Redis: a stream entry without the fields of a job.
    StreamEntry,
    /// Redis: a key of the wrong type (a string) where a priority level's stream belongs. The
    /// model publishes at that level while it is there, then calls
    /// [`Fixture::repair_junk`] and publishes the same job again.
    WrongTypeKey,
    /// SQL: a row whose due time does not decode as a timestamp.
    BadTimestamp,
    /// SQL: a row whose headers column is not JSON.
    BadHeaders,
    /// SQL: a row whose attempt count is out of range (beyond the cap any mount may have).
    AttemptOutOfRange,
    /// SQL: a row whose priority is out of range (outside `Priority::LOWEST..=HIGHEST`).
    PriorityOutOfRange,
}

impl Junk {
    /// The priority level [`Junk::WrongTypeKey`] blocks (its stream is made a string).
    pub const WRONG_TYPE_LEVEL: crate::Priority = crate::Priority::HIGHEST;
}

/// What a [`Fixture::server_down`] did, so that the model knows what to expect before
/// [`Fixture::server_up`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outage {
    /// The server is gone until `server_up` (a Redis server shut down): every call in between
    /// must fail with an error, neither hang nor panic, and store nothing.
    Down,
    /// Every connection the broker held was cut, and the server accepts new ones at once
    /// (Postgres backends terminated): there is no time in between to call in.
    Cut,
}

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
    ///
    /// [`TestApp::start`]: crate::testing::TestApp::start
    /// [`TestApp::start_live`]: crate::testing::TestApp::start_live
    fn paused(&self) -> bool;

    /// Stores in `queue` of `broker` (connected) one job the broker cannot read back: a stored
    /// value of the wrong kind, as a hand edit leaves it (on SQL a column value that does not
    /// decode). Returns the name of the field or column holding it, which the dead letter's
    /// error must name. The default stores nothing and returns `None`: the row
    /// [`a_job_that_cannot_be_read_is_dead_lettered_alone`](super::a_job_that_cannot_be_read_is_dead_lettered_alone) does not apply to the backend.
    fn store_unreadable_job(
        &self,
        broker: &Self::Broker,
        queue: &str,
    ) -> impl Future<Output = Option<String>> + Send {
        let _ = (broker, queue);
        async { None }
    }

    /// Whether the backend leaves every fate to the runtime (the cap on arrival, the poison
    /// count, the dead letter of an unreadable item) and only reports what it knows. The rows
    /// of `runtime_rules.rs` that check the runtime's own messages run only when it does. The
    /// default: `false` (the row passes without checking anything).
    fn leaves_fates_to_the_runtime(&self) -> bool {
        false
    }

    /// Whether a job published with attempts already spent ([`Envelope::with_attempt`](crate::Envelope::with_attempt))
    /// keeps them. The in-memory broker does; Redis and SQL start every published job afresh,
    /// so a job reaches them with its attempts spent only by a hand edit of its `attempts`
    /// field or column (their own tests cover that: `tests/redis_bad_entries.rs`,
    /// `tests/attempt_limits.rs`). The row
    /// [`a_job_arriving_with_its_cap_spent_is_dead_lettered_without_running`](super::a_job_arriving_with_its_cap_spent_is_dead_lettered_without_running)
    /// runs only when it does. The default: `false`.
    fn publish_keeps_spent_attempts(&self) -> bool {
        false
    }

    /// Stores in `queue` of `broker` (connected) an item whose content is `content`, as it
    /// came, which the broker cannot read as a job, so that a claim returns it as
    /// [`Unreadable`](crate::broker::Unreadable). Returns words the dead letter's error must
    /// contain. The default stores nothing and returns `None`: the row
    /// [`an_unreadable_item_goes_raw_to_its_mounts_dead_letter`](super::an_unreadable_item_goes_raw_to_its_mounts_dead_letter)
    /// does not apply.
    fn store_raw_unreadable(
        &self,
        broker: &Self::Broker,
        queue: &str,
        content: &[u8],
    ) -> impl Future<Output = Option<String>> + Send {
        let _ = (broker, queue, content);
        async { None }
    }

    /// The order of every claim `broker` was asked to make of `queue`, with how many items each
    /// took, when the broker records them (the naive broker does); `None` (the default): the
    /// row of the fair turn checks only what the handlers saw.
    fn claim_orders(
        &self,
        broker: &Self::Broker,
        queue: &str,
    ) -> Option<Vec<(crate::broker::ClaimOrder, usize)>> {
        let _ = (broker, queue);
        None
    }

    /// Publishes `job` in a transaction of the caller's own (on SQL,
    /// `SqlxRoute::publish_in`), then commits it when `commit` or rolls it back. `None`: the
    /// backend has no such publish (the default); the model test skips the step.
    fn publish_in(
        &self,
        broker: &Self::Broker,
        job: Job,
        commit: bool,
    ) -> impl Future<Output = Option<Result<Published, BrokerError>>> + Send {
        let _ = (broker, job, commit);
        async { None }
    }

    /// The hand edits of [`Junk`] this backend's fixture can make (the default: none).
    fn junk_kinds(&self) -> Vec<Junk> {
        Vec::new()
    }

    /// Stores one bad item of kind `junk` in `queue` of `broker` (connected, the queue
    /// prepared), its job id (if it has one) `id`. The default cannot and says so.
    fn store_junk(
        &self,
        broker: &Self::Broker,
        queue: &str,
        junk: Junk,
        id: &str,
    ) -> impl Future<Output = Result<(), String>> + Send {
        let _ = (broker, queue, junk, id);
        async { Err("this fixture makes no hand edits".to_owned()) }
    }

    /// Undoes a hand edit that blocks a key (only [`Junk::WrongTypeKey`]), as an operator
    /// would. The default does nothing.
    fn repair_junk(
        &self,
        broker: &Self::Broker,
        queue: &str,
        junk: Junk,
    ) -> impl Future<Output = ()> + Send {
        let _ = (broker, queue, junk);
        async {}
    }

    /// Lets go of a broker the model test is done with (closes an SQL pool, whose connections
    /// a server counts), so that thousands of sequences do not exhaust the server. The
    /// default: nothing (the broker is dropped).
    fn release(&self, broker: &Self::Broker) -> impl Future<Output = ()> + Send {
        let _ = broker;
        async {}
    }

    /// The first half of the model test's server restart: the server `broker` talks to goes
    /// away (or every connection it holds is cut), its data kept. The model goes on with the
    /// same broker value afterwards, as a long-running service keeps its broker. `None`: the
    /// backend has no server to restart (the default; the model skips the step).
    fn server_down(
        &self,
        broker: &Self::Broker,
    ) -> impl Future<Output = Option<Result<Outage, String>>> + Send {
        let _ = broker;
        async { None }
    }

    /// The second half: the server answers again, with the data it had (for
    /// [`Outage::Cut`], nothing to do: the default).
    fn server_up(&self, broker: &Self::Broker) -> impl Future<Output = Result<(), String>> + Send {
        let _ = broker;
        async { Ok(()) }
    }
}
