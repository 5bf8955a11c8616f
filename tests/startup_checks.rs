//! The service refuses to start on a bad configuration and lists every problem at once, each
//! naming its mount and the fix.

use std::time::Duration;

use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{ServiceError, broker::Problem};

async fn ok(_: &String) -> HandlerOutcome {
    HandlerOutcome::ack()
}
async fn other(_: &String) -> HandlerOutcome {
    HandlerOutcome::ack()
}

fn problems(err: ServiceError) -> Vec<Problem> {
    match err {
        ServiceError::Refused { problems, .. } => problems,
        other => panic!("expected a refusal, got {other}"),
    }
}

#[tokio::test]
async fn every_problem_is_listed_at_once() {
    let service =
        Service::new(AppInfo::new("checks", "0.1.0")).with_broker(MemoryBroker::new(), |b| {
            // cap without dead letter
            b.include(Subscriber::new("a", ok))
                .max_attempts(nonzero!(3u32));
            // dead letter without cap
            b.include(Subscriber::new("b", ok)).dead_letter("b.dead");
            // dead letter equal to its source
            b.include(Subscriber::new("c", ok))
                .max_attempts(nonzero!(3u32))
                .dead_letter("c");
            // two subscribers on one queue and kind
            b.include(Subscriber::new("d", ok));
            b.include(Subscriber::new("d", other));
            // decode policy without a dead letter
            b.include(Subscriber::new("e", ok))
                .on_decode_error(OnDecodeError::DeadLetter);
            // concurrency 0
            b.include(Subscriber::new("f", ok)).concurrency(0);
        });
    let err = service
        .start()
        .await
        .expect_err("the service must refuse to start");
    let text = err.to_string();
    let problems = problems(err);
    assert_eq!(problems.len(), 6, "{text}");
    let find = |queue: &str| {
        problems
            .iter()
            .find(|p| p.mount.contains(&format!("queue `{queue}`")))
            .unwrap_or_else(|| panic!("no problem for queue {queue} in:\n{text}"))
            .message
            .clone()
    };
    assert!(
        find("a").contains("add `.dead_letter(\"a.dead\")`"),
        "{text}"
    );
    assert!(
        find("b").contains("add `.max_attempts(nonzero!(5u32))`"),
        "{text}"
    );
    assert!(
        find("c").contains("the dead letter is the queue itself"),
        "{text}"
    );
    assert!(
        find("d").contains("`ok` already subscribes to every kind"),
        "{text}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.mount == "mount `other` on queue `d`"),
        "{text}"
    );
    assert!(find("e").contains("needs a dead letter"), "{text}");
    assert!(find("f").contains("concurrency(0)"), "{text}");
    assert!(
        text.starts_with("the service `checks` refuses to start:"),
        "{text}"
    );
}

#[tokio::test]
async fn global_limits_are_checked_at_startup() {
    let service =
        Service::new(AppInfo::new("limits", "0.1.0")).with_broker(MemoryBroker::new(), |b| {
            b.include(Subscriber::new("g", ok)).global_concurrency(0);
            b.include(Subscriber::new("h", ok))
                .rate_limit(0, Duration::ZERO);
            // Two mounts of one queue declaring different limits: the limit is the queue's.
            b.include(Subscriber::new("i", ok).kind("a"))
                .global_concurrency(2);
            b.include(Subscriber::new("i", other).kind("b"))
                .global_concurrency(5);
            // The same limit on both is fine.
            b.include(Subscriber::new("j", ok).kind("a"))
                .rate_limit(10, Duration::from_secs(1));
            b.include(Subscriber::new("j", other).kind("b"))
                .rate_limit(10, Duration::from_secs(1));
        });
    let err = service
        .start()
        .await
        .expect_err("the service must refuse to start");
    let text = err.to_string();
    let problems = problems(err);
    let on = |queue: &str| -> Vec<String> {
        problems
            .iter()
            .filter(|p| p.mount.contains(&format!("queue `{queue}`")))
            .map(|p| p.message.clone())
            .collect()
    };
    assert_eq!(on("g").len(), 1, "{text}");
    assert!(
        on("g")[0].contains("global_concurrency(0) would never run a job"),
        "{text}"
    );
    assert_eq!(on("h").len(), 2, "{text}");
    assert!(
        on("h")
            .iter()
            .any(|m| m.contains("rate_limit(0, ..) would never start a job")),
        "{text}"
    );
    assert!(
        on("h").iter().any(|m| m.contains("at least 1 ms")),
        "{text}"
    );
    assert_eq!(on("i").len(), 1, "one line for the disagreement: {text}");
    assert!(
        on("i")[0].contains("global_concurrency(5) differs from `ok`'s global_concurrency(2)"),
        "{text}"
    );
    assert!(on("j").is_empty(), "the same limit twice is fine: {text}");
    assert_eq!(problems.len(), 4, "{text}");
}

#[tokio::test]
async fn different_kinds_on_one_queue_are_fine() {
    let service =
        Service::new(AppInfo::new("kinds", "0.1.0")).with_broker(MemoryBroker::new(), |b| {
            b.include(Subscriber::new("jobs", ok).kind("send_email"));
            b.include(Subscriber::new("jobs", other).kind("render_tickets"));
        });
    let running = service.start().await.expect("two kinds on one queue start");
    running.shutdown().await;
}

#[tokio::test]
async fn a_failing_startup_hook_stops_the_start() {
    let service = Service::new(AppInfo::new("hook", "0.1.0"))
        .on_startup(async move |()| Err::<(), _>(std::io::Error::other("no table")))
        .with_broker(MemoryBroker::new(), |b| {
            b.include(Subscriber::new("x", ok));
        });
    let err = service
        .start()
        .await
        .expect_err("a failed hook stops the start");
    assert!(matches!(err, ServiceError::Startup { .. }), "{err}");
    assert!(err.to_string().contains("no table"), "{err}");
}

#[tokio::test]
async fn run_until_stops_gracefully() {
    let broker = MemoryBroker::new();
    let service = Service::new(AppInfo::new("run", "0.1.0"))
        .shutdown_timeout(Duration::from_secs(5))
        .with_broker(broker.clone(), |b| {
            b.include(Subscriber::new("x", ok));
        });
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(service.run_until(async {
        let _ = rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(50)).await;
    tx.send(()).expect("the service is running");
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the service stops within its deadline")
        .expect("no panic")
        .expect("a clean stop");
}
