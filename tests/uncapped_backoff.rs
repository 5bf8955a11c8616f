//! A mount without `max_attempts` never hot-loops (issue 12, item 1): every failed attempt
//! waits at least `UNCAPPED_FLOOR` (1 s doubling to 60 s), so the paused harness's `drain()`
//! returns at once and `advance` runs a bounded number of deliveries. (Every backend runs the
//! conformance row `uncapped_mount_retries_no_faster_than_the_floor`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use stagedoor_jobs::prelude::*;
use stagedoor_jobs::testing::Outcome;
use stagedoor_jobs::{Backoff, UNCAPPED_FLOOR};

#[derive(serde::Serialize, serde::Deserialize)]
struct Row {
    id: u64,
}

async fn review(_row: &Row, Data(runs): Data<Arc<AtomicU32>>) -> HandlerOutcome {
    runs.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::retry()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_always_failing_job_on_an_uncapped_mount_waits_the_floor() {
    let runs = Arc::new(AtomicU32::new(0));
    let service = Service::new(AppInfo::new("review", "0.1.0"))
        .state(Arc::clone(&runs))
        .with_broker(MemoryBroker::new(), |b| {
            // No cap, no backoff: the guide's `review` mount on `emails.dead`.
            b.include(Subscriber::new("emails.dead", review).name("review"));
        });
    let mut app = TestApp::start(service).await.expect("start");
    app.drain_timeout = Duration::from_secs(5);
    app.publish(Job::new("emails.dead", &Row { id: 1 }).expect("encode"))
        .await
        .expect("publish");
    // drain() returns: the failed job waits for its retry, it is not due again at once.
    app.drain().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one delivery, then a wait");

    // Ten minutes: deliveries at 0, 1, 3, 7, 15, 31, 63 s, then one a minute.
    app.advance(Duration::from_secs(600)).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        15,
        "{:?}",
        app.outcomes("review")
    );
    let delays: Vec<u64> = app
        .outcomes("review")
        .into_iter()
        .map(|r| match r.outcome {
            Outcome::Retried { delay, .. } => {
                assert_eq!(delay, UNCAPPED_FLOOR.delay(r.attempt));
                delay.as_secs()
            }
            other => panic!("every attempt fails and is retried: {other:?}"),
        })
        .collect();
    assert_eq!(
        delays,
        [1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60, 60, 60, 60, 60]
    );
    let stats = app.stats("emails.dead").await;
    assert_eq!((stats.ready, stats.delayed), (0, 1), "{stats:?}");
    app.stop().await;
}

/// A cap keeps today's semantics: `retry()` on a capped mount without a backoff is at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_mount_without_a_backoff_still_retries_at_once() {
    let runs = Arc::new(AtomicU32::new(0));
    let service = Service::new(AppInfo::new("review", "0.1.0"))
        .state(Arc::clone(&runs))
        .with_broker(MemoryBroker::new(), |b| {
            b.include(Subscriber::new("emails", review).name("review"))
                .max_attempts(nonzero!(3u32))
                .dead_letter("emails.dead");
        });
    let app = TestApp::start(service).await.expect("start");
    app.publish(Job::new("emails", &Row { id: 1 }).expect("encode"))
        .await
        .expect("publish");
    app.drain().await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "three attempts, no time passed"
    );
    assert_eq!(app.dead_letters("emails.dead").await.len(), 1);
    app.stop().await;
}
