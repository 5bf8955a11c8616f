//! [`Fixture`]: what a backend provides to run the conformance suite.

use std::future::Future;
use std::time::Duration;

use crate::broker::Broker;

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
}
