//! The model-based random test of the broker contract (`stagedoor_jobs::conformance::run_model`)
//! on the in-memory broker, on a manual clock that the model moves.

use std::time::Duration;

use stagedoor_jobs::MemoryBroker;
use stagedoor_jobs::conformance::{Fixture, ModelRun, run_model};

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
}

/// No known defect on this backend.
const KNOWN: &[&str] = &[];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model() {
    run_model(
        MemoryFixture,
        ModelRun {
            backend: "memory",
            rerun: "--test model_memory model",
            seeds: &[
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
            ],
            steps: 120,
            lease: Duration::from_secs(1),
            known_defects: KNOWN,
        },
    )
    .await;
}
