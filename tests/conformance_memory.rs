//! The conformance suite on the in-memory broker, on the harness's paused clock, and (in
//! `live`) on the real clock, the way the Redis and SQL backends run it.

use std::time::Duration;

use stagedoor_jobs::MemoryBroker;
use stagedoor_jobs::conformance::Fixture;

/// The in-memory broker on the paused clock: every test gets a broker of its own.
struct MemoryFixture;

impl Fixture for MemoryFixture {
    type Broker = MemoryBroker;

    async fn broker(&self) -> MemoryBroker {
        MemoryBroker::new()
    }

    async fn broker_with_lease(&self, lease: Duration) -> MemoryBroker {
        MemoryBroker::with_lease(lease)
    }

    fn paused(&self) -> bool {
        true
    }

    fn leaves_fates_to_the_runtime(&self) -> bool {
        true
    }

    fn publish_keeps_spent_attempts(&self) -> bool {
        true
    }
}

stagedoor_jobs::conformance_tests!(MemoryFixture);

/// The same suite on the real clock (`TestApp::start_live`), as a server backend runs it: it
/// checks that every row holds without the paused clock.
mod live {
    use super::*;

    /// The in-memory broker on the real clock.
    struct LiveMemoryFixture;

    impl Fixture for LiveMemoryFixture {
        type Broker = MemoryBroker;

        async fn broker(&self) -> MemoryBroker {
            MemoryBroker::new()
        }

        async fn broker_with_lease(&self, lease: Duration) -> MemoryBroker {
            MemoryBroker::with_lease(lease)
        }

        fn paused(&self) -> bool {
            false
        }

        fn leaves_fates_to_the_runtime(&self) -> bool {
            true
        }

        fn publish_keeps_spent_attempts(&self) -> bool {
            true
        }
    }

    stagedoor_jobs::conformance_tests!(LiveMemoryFixture);
}
