//! The conformance suite on the naive broker (`stagedoor_jobs::conformance::NaiveBroker`), a
//! backend that knows nothing of the runtime's rules (no cap, no poison count, no fair turn, no
//! choice of dead letter) and only reports what it knows: the rows of the runtime's rules pass
//! on it, so a backend of a user's own gets them for free. On the harness's paused clock, and
//! (in `live`) on the real clock.

use std::time::Duration;

use stagedoor_jobs::broker::ClaimOrder;
use stagedoor_jobs::conformance::{Fixture, NaiveBroker};

/// The words the naive broker's error for an unreadable item carries.
const NOT_A_JOB: &str = "the item is no job: its payload is not a message";

/// Stores `content` in `queue` as an item the naive broker cannot read.
fn store_raw(broker: &NaiveBroker, queue: &str, content: &[u8]) -> Option<String> {
    broker.store_unreadable(queue, content, None, NOT_A_JOB);
    Some(NOT_A_JOB.to_owned())
}

/// The naive broker on the paused clock: every test gets a broker of its own.
struct NaiveFixture;

impl Fixture for NaiveFixture {
    type Broker = NaiveBroker;

    async fn broker(&self) -> NaiveBroker {
        NaiveBroker::new()
    }

    async fn broker_with_lease(&self, lease: Duration) -> NaiveBroker {
        NaiveBroker::with_lease(lease)
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

    async fn store_unreadable_job(&self, broker: &NaiveBroker, queue: &str) -> Option<String> {
        store_raw(broker, queue, b"\xff not even text")
    }

    async fn store_raw_unreadable(
        &self,
        broker: &NaiveBroker,
        queue: &str,
        content: &[u8],
    ) -> Option<String> {
        store_raw(broker, queue, content)
    }

    fn claim_orders(&self, broker: &NaiveBroker, queue: &str) -> Option<Vec<(ClaimOrder, usize)>> {
        Some(broker.claim_orders(queue))
    }
}

stagedoor_jobs::conformance_tests!(NaiveFixture);

/// The same suite on the real clock (`TestApp::start_live`).
mod live {
    use super::*;

    /// The naive broker on the real clock.
    struct LiveNaiveFixture;

    impl Fixture for LiveNaiveFixture {
        type Broker = NaiveBroker;

        async fn broker(&self) -> NaiveBroker {
            NaiveBroker::new()
        }

        async fn broker_with_lease(&self, lease: Duration) -> NaiveBroker {
            NaiveBroker::with_lease(lease)
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

        async fn store_unreadable_job(&self, broker: &NaiveBroker, queue: &str) -> Option<String> {
            store_raw(broker, queue, b"\xff not even text")
        }

        async fn store_raw_unreadable(
            &self,
            broker: &NaiveBroker,
            queue: &str,
            content: &[u8],
        ) -> Option<String> {
            store_raw(broker, queue, content)
        }

        fn claim_orders(
            &self,
            broker: &NaiveBroker,
            queue: &str,
        ) -> Option<Vec<(ClaimOrder, usize)>> {
            Some(broker.claim_orders(queue))
        }
    }

    stagedoor_jobs::conformance_tests!(LiveNaiveFixture);
}
