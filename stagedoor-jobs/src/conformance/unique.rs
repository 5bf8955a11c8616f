//! Unique jobs ([`Job::unique`](crate::Job::unique)): a key held while its job waits, runs and
//! for its window after it finished; a second publish learns the first job's id; publishes at
//! once store one job; a key made of the kind and the payload.

use std::time::Duration;

use super::fixture::Fixture;
use super::support::*;
use crate::broker::{Broker, Inspect, Publish};
use crate::{JobId, Subscriber};

/// `unique("order-7", 600 ms)`: a second publish while the first job waits is not stored and
/// returns the first's id; after the job ran, a publish within the window is not stored
/// either; another key is independent; once the window has passed, the key takes a new job.
pub async fn unique_job_is_held_until_its_window_after_it_finished<F: Fixture>(fixture: F) {
    const Q: &str = "cf_unique";
    let window = Duration::from_millis(600);
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    let key = format!("order-7-{}", JobId::new());
    let first = app
        .enqueue(job(Q, 1).unique(&key, window))
        .await
        .expect("publish");
    assert!(first.is_stored(), "the first job of a key is stored");
    let second = app
        .enqueue(job(Q, 2).unique(&key, window))
        .await
        .expect("publish");
    assert_eq!(
        (second.id(), second.is_stored()),
        (first.id(), false),
        "a second job of the key is not stored; its publisher learns the first job's id"
    );
    app.drain().await;
    assert_eq!(probe.runs(), 1, "one job ran");
    let within = app
        .enqueue(job(Q, 3).unique(&key, window))
        .await
        .expect("publish");
    assert_eq!(
        (within.id(), within.is_stored()),
        (first.id(), false),
        "within the window after the job finished, the key is still held"
    );
    let other = app
        .enqueue(job(Q, 4).unique(format!("{key}-other"), window))
        .await
        .expect("publish");
    assert!(other.is_stored(), "another key is independent");
    app.drain().await;
    app.advance(window + MARGIN).await;
    let after = app
        .enqueue(job(Q, 5).unique(&key, window))
        .await
        .expect("publish");
    assert!(
        after.is_stored() && after.id() != first.id(),
        "once the window has passed the key takes a new job: {after:?}"
    );
    app.drain().await;
    let mut ran: Vec<u64> = probe.seen().iter().map(|s| s.n).collect();
    ran.sort_unstable();
    assert_eq!(ran, vec![1, 4, 5], "jobs 2 and 3 were never stored");
    assert_empty(&app, Q, "after every job").await;
    app.stop().await;
}

/// Ten publishes of one key at once, each through its own clone of the broker: one job is
/// stored, and every publisher gets its id.
pub async fn unique_publishes_at_once_store_one_job<F: Fixture>(fixture: F) {
    const Q: &str = "cf_unique_race";
    let direct = connected(&fixture.broker().await).await;
    direct.prepare(Q).await.expect("prepare");
    let key = format!("race-{}", JobId::new());
    let mut racers = tokio::task::JoinSet::new();
    for n in 0..10 {
        let b = direct.clone();
        let j = job(Q, n).unique(&key, Duration::from_secs(3600));
        racers.spawn(async move { b.publish_job(j).await.expect("publish") });
    }
    let mut results = Vec::new();
    while let Some(p) = racers.join_next().await {
        results.push(p.expect("publisher task"));
    }
    let stored: Vec<_> = results.iter().filter(|p| p.is_stored()).collect();
    assert_eq!(stored.len(), 1, "one of ten stored: {results:?}");
    let id = stored[0].id().clone();
    assert!(
        results.iter().all(|p| *p.id() == id),
        "every publisher learns the stored job's id: {results:?}"
    );
    let stats = direct.stats(Q).await.expect("stats");
    assert_eq!(stats.ready, 1, "one job in the queue: {stats:?}");
}

/// `unique_by_payload`: the same message of the same kind is stored once; another payload,
/// or the same payload of another kind, is another key.
pub async fn unique_by_payload_stores_a_message_once<F: Fixture>(fixture: F) {
    const Q: &str = "cf_unique_payload";
    let direct = connected(&fixture.broker().await).await;
    direct.prepare(Q).await.expect("prepare");
    // A number of its own: a shared server keeps the keys after the test.
    let n = u64::from(std::process::id()) * 1_000_000
        + u64::from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .subsec_micros(),
        );
    let window = Duration::from_secs(3600);
    let publish = |j: crate::Job| {
        let d = direct.clone();
        async move { d.publish_job(j).await.expect("publish") }
    };
    let first = publish(job(Q, n).unique_by_payload(window)).await;
    assert!(first.is_stored());
    let same = publish(job(Q, n).unique_by_payload(window)).await;
    assert_eq!(
        (same.id(), same.is_stored()),
        (first.id(), false),
        "the same message is stored once"
    );
    let other = publish(job(Q, n + 1).unique_by_payload(window)).await;
    assert!(other.is_stored(), "another payload is another key");
    let kind = publish(job(Q, n).kind("cf_other_kind").unique_by_payload(window)).await;
    assert!(kind.is_stored(), "another kind is another key");
    let stats = direct.stats(Q).await.expect("stats");
    assert_eq!(stats.ready, 3, "three jobs stored: {stats:?}");
}
