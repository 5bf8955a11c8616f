//! The runtime's rules, through the runtime, on a backend that only reports what it knows: a
//! job arriving with its cap spent and a job delivered past the poison count are dead-lettered
//! without running, an unreadable item goes raw to the dead letter the runtime picks, and every
//! [`FAIR_CLAIM_EVERY`]-th claim the runtime makes is in due order. The naive broker
//! ([`NaiveBroker`](super::NaiveBroker)), which knows none of these rules, passes every row:
//! a backend of a user's own gets them for free.
//!
//! The first three rows check the runtime's own messages, so they run only on a fixture whose
//! backend leaves every fate to the runtime ([`Fixture::leaves_fates_to_the_runtime`]).

use std::time::Duration;

use super::fixture::Fixture;
use super::support::{
    LEASE, MARGIN, PATIENCE, Probe, acks, assert_empty, connected, is_dead_lettered, job, outcomes,
    service, start,
};
use crate::broker::{Broker, ClaimOrder, DeadLetter, DeadLetters, Publish};
use crate::outcome::FailureCause;
use crate::testing::TestApp;
use crate::{FAIR_CLAIM_EVERY, Priority, Subscriber};

/// A job published with its attempts already spent to its mount's cap (an import, a replay by
/// hand) is dead-lettered on its first delivery without running, with the runtime's message:
/// it arrived with them spent, this was its first delivery.
pub async fn a_job_arriving_with_its_cap_spent_is_dead_lettered_without_running<F: Fixture>(
    fixture: F,
) {
    const Q: &str = "cf_arrival_cap";
    const CAP: u32 = 3;
    if !fixture.leaves_fates_to_the_runtime() || !fixture.publish_keeps_spent_attempts() {
        return;
    }
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    direct.prepare(Q).await.expect("prepare");
    let (_, envelope, at) = job(Q, 1).into_parts(direct.clock().now());
    let envelope = envelope.with_attempt(CAP);
    let id = envelope.id().clone();
    direct
        .publish(Q, vec![(envelope, at)])
        .await
        .expect("publish");
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"))
                .max_attempts(crate::nonzero!(CAP))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.drain().await;

    assert_eq!(probe.runs(), 0, "the handler never runs");
    let got = outcomes(&app, "acks");
    assert!(
        // It reports the attempts it spent (it never ran here), not this delivery's number.
        matches!(&got[..], [(a, d)] if *a == CAP && is_dead_lettered(d, FailureCause::Poison)),
        "dead-lettered on its first delivery: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let error = &letters[0].error;
    for part in [
        format!("job {id} arrived on `{Q}` having already spent {CAP} attempts"),
        format!("max_attempts({CAP}) of subscriber `acks` allows no more"),
        "this was its first delivery".to_owned(),
    ] {
        assert!(error.contains(&part), "{part:?} missing from {error:?}");
    }
    assert_eq!(letters[0].envelope.id(), &id);
    assert_eq!(letters[0].origin, Q);
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// A job whose workers die with it (claimed directly, never settled, its lease left to lapse)
/// as many times as the broker's poison count is dead-lettered on the next delivery without
/// running, to the queue's default dead letter when its mount (uncapped) declares none. A
/// backend that does not count deliveries ([`Delivery::delivered`](crate::broker::Delivery))
/// passes without checking anything.
pub async fn a_job_delivered_past_the_poison_count_is_dead_lettered_without_running<F: Fixture>(
    fixture: F,
) {
    const Q: &str = "cf_poison_count";
    if !fixture.leaves_fates_to_the_runtime() {
        return;
    }
    let probe = Probe::new();
    let broker = fixture.broker_with_lease(LEASE).await;
    let direct = connected(&broker).await;
    direct.prepare(Q).await.expect("prepare");
    let id = direct
        .publish_job(job(Q, 1))
        .await
        .expect("publish")
        .into_id();
    let poison = direct.poison_count();
    for n in 1..=poison {
        let got = direct
            .claim(Q, 1, Duration::from_secs(2), ClaimOrder::Priority)
            .await
            .expect("claim");
        assert_eq!(got.len(), 1, "claim {n} gets the job");
        let Some(delivered) = got[0].delivered else {
            return;
        };
        assert_eq!(delivered, n, "each claim counts a delivery");
        // The worker dies: the delivery is never settled; its lease runs out.
        tokio::time::sleep(LEASE + MARGIN).await;
    }
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    app.drain().await;

    assert_eq!(probe.runs(), 0, "the handler never runs");
    let got = outcomes(&app, "acks");
    assert!(
        matches!(&got[..], [(_, d)] if is_dead_lettered(d, FailureCause::Poison)),
        "dead-lettered on its next delivery: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let want = format!(
        "delivered {} times without being settled (max_deliveries {poison})",
        poison + 1
    );
    assert!(
        letters[0].error.contains(&want),
        "{want:?} missing from {:?}",
        letters[0].error
    );
    assert_eq!(letters[0].envelope.id(), &id);
    assert_eq!(letters[0].origin, Q);
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// An item the broker cannot read as a job (stored by the fixture,
/// [`Fixture::store_raw_unreadable`]) goes to the dead letter its queue's mount declares (here
/// another queue's default dead letter, so the pick is the runtime's, not the backend's
/// default), with its content as it came and the backend's error; a good job beside it runs
/// once. A fixture that stores no such item passes without checking anything.
pub async fn an_unreadable_item_goes_raw_to_its_mounts_dead_letter<F: Fixture>(fixture: F) {
    const Q: &str = "cf_unreadable_raw";
    const RAW: &[u8] = b"{\"n\": \"not a number\"";
    if !fixture.leaves_fates_to_the_runtime() {
        return;
    }
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    direct.prepare(Q).await.expect("prepare");
    let Some(words) = fixture.store_raw_unreadable(&direct, Q, RAW).await else {
        return;
    };
    direct.publish_job(job(Q, 1)).await.expect("publish");
    let dl = broker.default_dead_letter("cf_unreadable_raw_elsewhere");
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.drain().await;
    let letters = letters_once_there(&app, &dl).await;

    assert_eq!(probe.attempts_of(1), [Some(1)], "the good job runs once");
    assert_eq!(probe.runs(), 1, "only the good job ran");
    assert_eq!(letters.len(), 1, "the unreadable item alone: {letters:?}");
    let d = &letters[0];
    assert_eq!(d.envelope.payload(), RAW, "its content as it came: {d:?}");
    assert!(d.error.contains(&words), "{words:?} missing from {d:?}");
    assert_eq!(d.origin, Q, "{d:?}");
    let default = app.dead_letters(&direct.default_dead_letter(Q)).await;
    assert!(
        default.is_empty(),
        "not the default dead letter: {default:?}"
    );
    assert_empty(&app, Q, "after the unreadable item was dead-lettered").await;
    app.stop().await;
}

/// The dead letters of `dl` once there is one (the move of an unreadable item runs beside the
/// claim loop), or what is there after [`PATIENCE`].
async fn letters_once_there(app: &TestApp, dl: &str) -> Vec<DeadLetter> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let letters = app.dead_letters(dl).await;
        if !letters.is_empty() || tokio::time::Instant::now() >= deadline {
            return letters;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Through the runtime, one job at a time: an older low job published before a flood of
/// high ones runs within the first [`FAIR_CLAIM_EVERY`] jobs (every such claim is in due
/// order), and, where the fixture records the orders the broker was asked for
/// ([`Fixture::claim_orders`]), exactly every [`FAIR_CLAIM_EVERY`]-th claim that took a job
/// asked for [`ClaimOrder::Due`], every other one for [`ClaimOrder::Priority`].
pub async fn every_fair_turn_of_the_runtime_claims_in_due_order<F: Fixture>(fixture: F) {
    const Q: &str = "cf_fair_turn";
    const OLDER: u64 = 1_000;
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    direct.prepare(Q).await.expect("prepare");
    direct
        .publish_job(job(Q, OLDER).priority(Priority::LOW))
        .await
        .expect("publish");
    let flood = 2 * FAIR_CLAIM_EVERY;
    for n in 1..=flood {
        direct
            .publish_job(job(Q, n).priority(Priority::HIGHEST))
            .await
            .expect("publish");
    }
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"))
                .concurrency(1);
        }),
    )
    .await;
    app.drain().await;

    let ran: Vec<u64> = probe.seen().iter().map(|s| s.n).collect();
    assert_eq!(ran.len() as u64, flood + 1, "every job runs once: {ran:?}");
    let older_at = ran.iter().position(|n| *n == OLDER).map(|p| p as u64 + 1);
    assert!(
        older_at.is_some_and(|at| at <= FAIR_CLAIM_EVERY),
        "the older low job runs within {FAIR_CLAIM_EVERY} jobs: {ran:?}"
    );
    if let Some(orders) = fixture.claim_orders(&direct, Q) {
        let took: Vec<ClaimOrder> = (orders.iter().filter(|(_, n)| *n > 0))
            .map(|(o, _)| *o)
            .collect();
        assert_eq!(took.len() as u64, flood + 1, "one job a claim: {orders:?}");
        for (i, order) in (1..).zip(&took) {
            let want = if i % FAIR_CLAIM_EVERY == 0 {
                ClaimOrder::Due
            } else {
                ClaimOrder::Priority
            };
            assert_eq!(*order, want, "claim {i} that took a job: {took:?}");
        }
    }
    assert_empty(&app, Q, "after the flood").await;
    app.stop().await;
}
