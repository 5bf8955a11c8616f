//! Concurrency, shutdown and leases: a mount's concurrency limit, graceful shutdown, a job
//! abandoned at shutdown or by a dead worker coming back after its lease, the fence on a
//! settlement after a lost lease, and a job waiting for a mount slot keeping its lease.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::fixture::Fixture;
use super::support::{
    LEASE, MARGIN, Probe, acks, assert_empty, assert_empty_direct, connected, eventually,
    hangs_first, job, outcomes, service, slow, start,
};
use crate::Subscriber;
use crate::broker::{Broker, Settled, Settlement};
use crate::broker::{DeadLetters, Inspect};
use crate::outcome::{Failure, FailureCause};
use crate::testing::Outcome;

/// `.concurrency(2)`: with 8 slow jobs, at most 2 handlers of the mount run at once (and 2 do).
pub async fn concurrency_limit_is_respected<F: Fixture>(fixture: F) {
    const Q: &str = "cf_concurrency";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, slow).name("slow"))
                .concurrency(2);
        }),
    )
    .await;
    // `enqueue`: on the paused harness `publish` would wait for each job to settle, and the
    // jobs would run one after the other.
    for n in 1..=8 {
        app.enqueue(job(Q, n)).await.expect("publish");
    }
    app.drain().await;

    assert_eq!(probe.finished.load(Ordering::SeqCst), 8, "every job ran");
    assert_eq!(
        probe.max_in_flight.load(Ordering::SeqCst),
        2,
        "at most (and, with 8 waiting, exactly) 2 at once"
    );
    assert!(
        outcomes(&app, "slow")
            .iter()
            .all(|(_, o)| *o == Outcome::Acked)
    );
    assert_empty(&app, Q, "after every job").await;
    app.stop().await;
}

/// Graceful shutdown loses nothing: handlers running when the service stops finish (the
/// shutdown timeout is long) and their jobs are acked.
pub async fn shutdown_lets_running_handlers_finish<F: Fixture>(fixture: F) {
    const Q: &str = "cf_shutdown";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe)
            .shutdown_timeout(Duration::from_secs(20))
            .with_broker(broker, |b| {
                b.include(Subscriber::new(Q, slow).name("slow"))
                    .max_attempts(crate::nonzero!(3u32))
                    .dead_letter(dl.clone());
            }),
    )
    .await;
    for n in 1..=3 {
        app.enqueue(job(Q, n)).await.expect("publish");
    }
    eventually("the three handlers run", || probe.in_flight() == 3).await;
    app.stop().await;

    assert_eq!(
        probe.finished.load(Ordering::SeqCst),
        3,
        "the running handlers finish"
    );
    assert_eq!(probe.runs(), 3, "each ran once");
    assert_empty_direct(&direct, Q, "after the shutdown, the jobs are acked").await;
    assert_eq!(direct.dead_len(&dl).await.expect("dead_len"), 0);
}

/// Graceful shutdown loses nothing: a handler still running at a short shutdown deadline is
/// abandoned, but its job stays in the queue and a second service on the same broker runs it
/// once its lease has run out.
pub async fn job_abandoned_at_shutdown_comes_back_after_its_lease<F: Fixture>(fixture: F) {
    const Q: &str = "cf_abandoned";
    let probe = Probe::new();
    let broker = fixture.broker_with_lease(LEASE).await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    let mount = |b: &mut crate::RouteBuilder<F::Broker>| {
        b.include(Subscriber::new(Q, hangs_first).name("hangs_first"))
            .max_attempts(crate::nonzero!(3u32))
            .dead_letter(dl.clone());
    };
    let first = start(
        &fixture,
        service(&probe)
            .shutdown_timeout(Duration::from_millis(100))
            .with_broker(broker.clone(), mount),
    )
    .await;
    // `enqueue`: the first attempt hangs until the shutdown abandons it.
    let id = first.enqueue(job(Q, 1)).await.expect("publish").into_id();
    eventually("the first attempt runs", || probe.in_flight() == 1).await;
    first.stop().await;

    let stats = direct.stats(Q).await.expect("stats");
    assert_eq!(
        stats.ready + stats.pending + stats.delayed,
        1,
        "the abandoned job is still in its queue: {stats:?}"
    );
    // Its lease runs out (it was renewed at most until the shutdown).
    tokio::time::sleep(LEASE + MARGIN).await;

    let second = start(&fixture, service(&probe).with_broker(broker, mount)).await;
    second.drain().await;
    assert_eq!(
        probe.attempts(),
        [Some(1), Some(2)],
        "the second service runs the abandoned job"
    );
    let records = second.outcomes("hangs_first");
    assert!(
        matches!(&records[..], [r] if r.job_id == id && r.attempt == 2 && r.outcome == Outcome::Acked),
        "{records:?}"
    );
    assert_empty(&second, Q, "after the second service ran it").await;
    assert!(second.dead_letters(&dl).await.is_empty());
    second.stop().await;
}

/// A settlement after a lost lease is fenced: claim, let the lease run out, claim again (a new
/// receipt); the first receipt does not renew (alone or in `renew_many`, which answers per
/// receipt in order), settling it is `LeaseLost` and changes nothing, settling the second is
/// `Done`.
pub async fn settlement_after_a_lost_lease_is_fenced<F: Fixture>(fixture: F) {
    const Q: &str = "cf_fenced";
    let broker = fixture.broker_with_lease(LEASE).await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    direct.prepare(Q).await.expect("prepare");
    let (_, envelope, at) = job(Q, 1).into_parts(direct.clock().now());
    let id = envelope.id().clone();
    direct
        .publish(Q, vec![(envelope, at)])
        .await
        .expect("publish");

    let mut first = direct
        .claim(
            Q,
            1,
            Duration::from_secs(2),
            crate::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(first.len(), 1, "the first claim gets the job");
    let first = first.remove(0);
    tokio::time::sleep(LEASE + MARGIN).await;
    let mut second = direct
        .claim(
            Q,
            1,
            Duration::from_secs(2),
            crate::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(second.len(), 1, "the expired lease makes the job claimable");
    let second = second.remove(0);
    assert_eq!(second.envelope.id(), &id);
    assert_eq!(second.envelope.attempt(), 2);

    assert!(
        !direct.renew(Q, &first.receipt).await.expect("renew"),
        "a lost lease cannot be renewed"
    );
    renew_many_answers_in_order(&direct, Q, &first.receipt, &second.receipt).await;
    let before = direct.stats(Q).await.expect("stats");
    let failure = Failure::new(FailureCause::Error, "stale worker", "");
    let settled = direct
        .settle(
            Q,
            &first,
            Settlement::DeadLetter {
                target: dl.clone(),
                failure,
            },
        )
        .await
        .expect("settle");
    assert_eq!(settled, Settled::LeaseLost, "the stale receipt is fenced");
    let after = direct.stats(Q).await.expect("stats");
    assert_eq!(
        (after.ready, after.pending, after.delayed),
        (before.ready, before.pending, before.delayed),
        "nothing changed"
    );
    assert_eq!(after.pending, 1, "the second delivery still holds the job");
    assert_eq!(direct.dead_len(&dl).await.expect("dead_len"), 0);

    assert!(
        direct.renew(Q, &second.receipt).await.expect("renew"),
        "the live lease renews"
    );
    let settled = direct
        .settle(Q, &second, Settlement::Ack)
        .await
        .expect("settle");
    assert_eq!(settled, Settled::Done);
    assert_empty_direct(&direct, Q, "after the second receipt acked").await;
}

/// `renew_many` (the runtime's call) of a lost lease and a live one: one answer per receipt,
/// in order.
async fn renew_many_answers_in_order<B: Broker>(
    direct: &B,
    q: &str,
    lost: &B::Receipt,
    live: &B::Receipt,
) {
    // A conformance row (the `conformance` feature, run by a backend's tests, never by a
    // worker): a panic here is the row failing, with the backend's error in its message.
    let many = direct
        .renew_many(q, &[lost, live])
        .await
        .into_iter()
        .map(|r| r.expect("renew_many"))
        .collect::<Vec<_>>();
    assert_eq!(
        many,
        [false, true],
        "renew_many: the lost lease is not renewed, the live one is"
    );
}

/// A job abandoned at shutdown comes back when the harness moves time past its lease: the
/// second service is started at once and `advance(lease + margin)` runs the job, on the paused
/// clock as on the live one.
///
/// Not yet in [`conformance_tests!`](crate::conformance_tests): on the paused clock
/// `TestApp::advance` first drains, and `drain` waits for the abandoned delivery (counted as
/// `pending`) whose lease only the advance itself would end, until `drain_timeout`.
pub async fn abandoned_job_comes_back_when_advancing_past_its_lease<F: Fixture>(fixture: F) {
    const Q: &str = "cf_abandoned_advance";
    // Longer than a shutdown takes, so that the lease is still held when the second service
    // starts.
    const LONG_LEASE: Duration = Duration::from_secs(2);
    let probe = Probe::new();
    let broker = fixture.broker_with_lease(LONG_LEASE).await;
    let dl = broker.default_dead_letter(Q);
    let mount = |b: &mut crate::RouteBuilder<F::Broker>| {
        b.include(Subscriber::new(Q, hangs_first).name("hangs_first"))
            .max_attempts(crate::nonzero!(3u32))
            .dead_letter(dl.clone());
    };
    let first = start(
        &fixture,
        service(&probe)
            .shutdown_timeout(Duration::from_millis(100))
            .with_broker(broker.clone(), mount),
    )
    .await;
    // `enqueue`: the first attempt hangs until the shutdown abandons it.
    first.enqueue(job(Q, 1)).await.expect("publish");
    eventually("the first attempt runs", || probe.in_flight() == 1).await;
    first.stop().await;

    let mut second = start(&fixture, service(&probe).with_broker(broker, mount)).await;
    second.drain_timeout = Duration::from_secs(3);
    second.advance(LONG_LEASE + MARGIN).await;
    assert_eq!(
        probe.attempts(),
        [Some(1), Some(2)],
        "the abandoned job runs once its lease is over"
    );
    assert_empty(&second, Q, "after the second service ran it").await;
    second.stop().await;
}

/// A delivery waiting for a slot of its mount (several kinds share a queue; one kind's
/// concurrency is full) keeps its lease: every job runs exactly once, on its first attempt.
/// Meaningful on the live clock (the paused clock does not move while handlers run).
///
/// Not yet in [`conformance_tests!`](crate::conformance_tests): the runtime claims up to the
/// queue's total slots, then waits for the mount's permit without renewing the lease; a job
/// that waits longer than its lease is claimed again (attempt 2) and runs twice.
pub async fn waiting_for_a_mount_slot_keeps_the_lease<F: Fixture>(fixture: F) {
    const Q: &str = "cf_mount_slot";
    const JOBS: u64 = 6;
    let probe = Probe::new();
    let broker = fixture.broker_with_lease(LEASE).await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, slow).kind("one_at_a_time").name("slow"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone())
                .concurrency(1);
            b.include(Subscriber::new(Q, acks).kind("many").name("acks"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone())
                .concurrency(8);
        }),
    )
    .await;
    for n in 1..=JOBS {
        app.publish(job(Q, n).kind("one_at_a_time"))
            .await
            .expect("publish");
    }
    app.drain().await;

    for n in 1..=JOBS {
        assert_eq!(
            probe.attempts_of(n),
            [Some(1)],
            "job {n} runs once; records: {:?}",
            app.records()
        );
    }
    assert_eq!(probe.max_in_flight.load(Ordering::SeqCst), 1);
    assert_empty(&app, Q, "after every job").await;
    app.stop().await;
}
