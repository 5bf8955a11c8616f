//! The attempt counter and the cap (issue 12, item 12, the core's part): a cap the counter can
//! never reach is refused at startup; the memory broker's counter saturates at `MAX_ATTEMPT`;
//! a job delivered past its cap is dead-lettered with an honest error.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use stagedoor_jobs::broker::Inspect;
use stagedoor_jobs::broker::{Broker, MAX_ATTEMPT};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::testing::Outcome;
use stagedoor_jobs::{Envelope, FailureCause, ServiceError};

#[derive(serde::Serialize, serde::Deserialize)]
struct Row {
    id: u64,
}

async fn fails(_row: &Row, Data(runs): Data<Arc<AtomicU32>>) -> HandlerOutcome {
    runs.fetch_add(1, Ordering::SeqCst);
    HandlerOutcome::retry()
}

async fn ok(_row: &Row) -> HandlerOutcome {
    HandlerOutcome::ack()
}

/// A stored job of `queue` whose attempt count says `attempts` deliveries were made.
async fn stored_with_attempts(broker: &MemoryBroker, queue: &str, attempts: u32) {
    let envelope = Envelope::new(
        "row",
        serde_json::to_vec(&Row { id: 1 }).expect("encode"),
        chrono::Utc::now(),
    )
    .with_attempt(attempts);
    broker
        .publish(queue, vec![(envelope, None)])
        .await
        .expect("publish");
}

#[tokio::test]
async fn a_cap_above_max_attempt_is_refused_at_startup() {
    let err = Service::new(AppInfo::new("caps", "0.1.0"))
        .with_broker(MemoryBroker::new(), |b| {
            b.include(Subscriber::new("emails", ok).name("send"))
                .max_attempts(nonzero!(40_000u32))
                .dead_letter("emails.dead");
            b.include(Subscriber::new("invoices", ok).name("bill"))
                .max_attempts(nonzero!(32_767u32))
                .dead_letter("invoices.dead");
        })
        .start()
        .await
        .expect_err("a cap of 40000 can never be reached");
    let ServiceError::Refused { problems, .. } = &err else {
        panic!("refused with the list of problems: {err}");
    };
    assert_eq!(problems.len(), 1, "only the cap above 32767: {problems:?}");
    let p = &problems[0];
    assert!(
        p.mount.contains("send") && p.mount.contains("emails"),
        "{p:?}"
    );
    for part in ["max_attempts(40000)", "32767", "at most"] {
        assert!(p.message.contains(part), "{part:?} missing: {}", p.message);
    }
}

#[tokio::test]
async fn the_memory_counter_saturates_at_max_attempt() {
    for (stored, want) in [
        (0, 1),
        (MAX_ATTEMPT - 1, MAX_ATTEMPT),
        (MAX_ATTEMPT, MAX_ATTEMPT),
        (u32::MAX, MAX_ATTEMPT),
    ] {
        let broker = MemoryBroker::new();
        broker.connect().await.expect("connect");
        stored_with_attempts(&broker, "q", stored).await;
        let got = broker
            .claim(
                "q",
                1,
                Duration::from_millis(100),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim");
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[0].envelope.attempt(),
            want,
            "a job stored with {stored} attempts"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncapped_job_at_the_counter_ceiling_keeps_running_a_minute_apart() {
    let runs = Arc::new(AtomicU32::new(0));
    let broker = MemoryBroker::new();
    let service = Service::new(AppInfo::new("ceiling", "0.1.0"))
        .state(Arc::clone(&runs))
        .with_broker(broker.clone(), |b| {
            b.include(Subscriber::new("q", fails).name("fails"));
        });
    let app = TestApp::start(service).await.expect("start");
    stored_with_attempts(&broker, "q", MAX_ATTEMPT).await;
    app.drain().await;
    app.advance(Duration::from_secs(61)).await;
    let got: Vec<(u32, Outcome)> = app
        .outcomes("fails")
        .into_iter()
        .map(|r| (r.attempt, r.outcome))
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    for (attempt, outcome) in &got {
        assert_eq!(*attempt, MAX_ATTEMPT, "the counter stays at its ceiling");
        assert!(
            matches!(outcome, Outcome::Retried { delay, .. } if *delay == Duration::from_secs(60)),
            "{outcome:?}"
        );
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_delivered_past_its_cap_gets_an_honest_error() {
    let runs = Arc::new(AtomicU32::new(0));
    let broker = MemoryBroker::new();
    let service = Service::new(AppInfo::new("poison", "0.1.0"))
        .state(Arc::clone(&runs))
        .with_broker(broker.clone(), |b| {
            b.include(Subscriber::new("q", fails).name("fails"))
                .max_attempts(nonzero!(3u32))
                .dead_letter("q.dead");
        });
    let app = TestApp::start(service).await.expect("start");
    // Never delivered, but its stored count says 5 (edited by hand, or a cap lowered from 10).
    stored_with_attempts(&broker, "q", 5).await;
    app.drain().await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "not run past its cap");
    let letters = app.dead_letters("q.dead").await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let error = &letters[0].error;
    // The memory broker counts deliveries: the runtime tells the 5 attempts were spent before
    // this first delivery, so no worker died here.
    for part in [
        "arrived on `q` having already spent 5 attempts",
        "max_attempts(3)",
        "subscriber `fails`",
        "this was its first delivery",
        "Replay it",
    ] {
        assert!(error.contains(part), "{part:?} missing from: {error}");
    }
    assert!(
        !error.contains("a worker died"),
        "it was never delivered: {error}"
    );
    assert!(matches!(
        &app.outcomes("fails")[..],
        [r] if matches!(&r.outcome, Outcome::DeadLettered { cause: FailureCause::Poison, .. })
    ));
    app.stop().await;
}
