//! The scheduler on the in-memory broker, on the harness's paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use stagedoor_jobs::prelude::*;
use stagedoor_jobs::testing::Outcome;

#[derive(serde::Serialize, serde::Deserialize)]
struct Sweep {}

async fn expire_holds(
    _: &Sweep,
    Ctx(id): Ctx<keys::JobId>,
    Data(seen): Data<Arc<Mutex<Vec<String>>>>,
) -> HandlerOutcome {
    seen.lock().unwrap().push(id.to_string());
    HandlerOutcome::ack()
}

fn service(broker: MemoryBroker, seen: Arc<Mutex<Vec<String>>>) -> Service {
    Service::new(AppInfo::new("sched", "0.1.0"))
        .state(seen)
        .schedule(
            Schedule::every("expire_holds", Duration::from_secs(60))
                .on("jobs")
                .payload(&Sweep {}),
        )
        .with_broker(broker, |b| {
            b.include(Subscriber::new("jobs", expire_holds).kind("expire_holds"));
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_minute_for_five_minutes_is_five_ticks() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = TestApp::start(service(MemoryBroker::new(), seen.clone()))
        .await
        .unwrap();
    app.advance(Duration::from_secs(300)).await;
    let ids = seen.lock().unwrap().clone();
    assert_eq!(ids.len(), 5, "{ids:?}");
    assert!(
        ids.iter().all(|i| i.starts_with("expire_holds@")),
        "{ids:?}"
    );
    assert!(
        app.outcomes("expire_holds")
            .iter()
            .all(|r| r.outcome == Outcome::Acked)
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_cron_expression_or_a_missing_queue_stops_the_service() {
    let service = Service::new(AppInfo::new("sched", "0.1.0"))
        .schedule(Schedule::cron("reconcile_payments", "0 25 * * *").on("jobs"))
        .schedule(Schedule::hourly("purge_idempotency_keys"))
        .with_broker(MemoryBroker::new(), |_| {});
    let err = service.start().await.expect_err("refused").to_string();
    assert!(
        err.contains(
            "schedule `reconcile_payments`: the cron expression \"0 25 * * *\" does not parse"
        ),
        "{err}"
    );
    assert!(
        err.contains("schedule `purge_idempotency_keys`: it names no queue"),
        "{err}"
    );
}

#[test]
fn a_cron_literal_is_checked_when_the_program_compiles() {
    let s = Schedule::cron("reconcile_payments", cron!("0 3 * * *")).on("jobs");
    assert_eq!(s.name(), "reconcile_payments");
}
