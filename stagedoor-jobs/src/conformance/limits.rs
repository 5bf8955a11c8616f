//! Global limits: the permit pools of [`Locks::take_permits`] hold a pool to its limit (also
//! under concurrent takers), give permits back, renew them and let them run out; a queue's
//! `.global_concurrency(n)` holds across two workers of the queue, and `.rate_limit(r, per)`
//! starts no more than `r` jobs per `per`; a job held back spends no attempt.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::fixture::Fixture;
use super::support::*;
use crate::Subscriber;
use crate::broker::{Broker, Locks};
use crate::testing::Outcome;

fn tokens(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}-{i}")).collect()
}

/// A pool of 3: five tokens offered, three taken; a full pool takes none and says when its
/// first permit runs out; a released permit frees a place; renewal counts the permits still
/// held; a permit not renewed runs out after its time; twenty takers at once on a pool of 5
/// take 5 in all.
pub async fn permits_hold_a_pool_to_its_limit<F: Fixture>(fixture: F) {
    let broker = connected(&fixture.broker().await).await;
    let ttl = Duration::from_secs(10);
    let key = "cf_permits";
    let t = tokens("a", 5);

    let first = broker
        .take_permits(key, 3, &t, ttl)
        .await
        .expect("take permits");
    assert_eq!(first.taken, 3, "three of five tokens fit a pool of 3");
    let full = broker
        .take_permits(key, 3, &t[3..], ttl)
        .await
        .expect("take from a full pool");
    assert_eq!(full.taken, 0, "a full pool gives no permit");
    let next = full
        .next_free
        .expect("a full pool says when its first permit runs out");
    assert!(
        next <= ttl && next > Duration::from_secs(5),
        "the first permit runs out within its ttl of 10 s, not long before: {next:?}"
    );
    let none = broker
        .take_permits(key, 3, &[], ttl)
        .await
        .expect("taking no permit is a valid probe");
    assert_eq!(none.taken, 0);

    broker
        .release_permits(key, &t[..1])
        .await
        .expect("release a permit");
    let again = broker
        .take_permits(key, 3, &t[3..], ttl)
        .await
        .expect("take after a release");
    assert_eq!(
        again.taken, 1,
        "the released place is taken by the first token offered"
    );
    let mut renew = t[1..4].to_vec();
    renew.push("never-taken".to_owned());
    let held = broker
        .renew_permits(key, &renew, ttl)
        .await
        .expect("renew permits");
    assert_eq!(
        held, 3,
        "a-2, a-3, a-4 are held; a token never taken is not"
    );
    permits_run_out_unless_renewed(&broker).await;
    twenty_takers_share_a_pool_of_five(&broker).await;
}

/// A permit not renewed runs out after its time (a pool of 1, permits of 300 ms).
async fn permits_run_out_unless_renewed<B: Broker>(broker: &B) {
    let short = "cf_permits_short";
    let s = tokens("s", 2);
    let ms300 = Duration::from_millis(300);
    let one = broker.take_permits(short, 1, &s[..1], ms300).await;
    assert_eq!(one.expect("take").taken, 1);
    let other = broker.take_permits(short, 1, &s[1..], ms300).await;
    assert_eq!(other.expect("take").taken, 0, "the pool of 1 is full");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        broker
            .renew_permits(short, &s[..1], ms300)
            .await
            .expect("renew"),
        0,
        "a permit past its time is not renewed"
    );
    let later = broker.take_permits(short, 1, &s[1..], ms300).await;
    assert_eq!(
        later.expect("take").taken,
        1,
        "a permit past its time frees its place"
    );
}

/// Twenty takers at once, each on its own clone, on a pool of 5, take 5 in all.
async fn twenty_takers_share_a_pool_of_five<B: Broker>(broker: &B) {
    let crowd = "cf_permits_crowd";
    let mut takers = tokio::task::JoinSet::new();
    for i in 0..20 {
        let b = broker.clone();
        takers.spawn(async move {
            b.take_permits(crowd, 5, &[format!("c-{i}")], Duration::from_secs(10))
                .await
                .expect("take")
                .taken
        });
    }
    let mut taken = 0;
    while let Some(n) = takers.join_next().await {
        taken += n.expect("taker task");
    }
    assert_eq!(taken, 5, "twenty takers at once share a pool of 5");
}

/// `.global_concurrency(2)` on a queue served by two workers (two routes of one service on
/// the same backend, each mount allowing 8 at once): with 8 slow jobs at most 2 run at once
/// across both, and 2 do; every job runs once, on its first attempt.
pub async fn global_concurrency_holds_across_workers<F: Fixture>(fixture: F) {
    const Q: &str = "cf_global_concurrency";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let other = broker.clone();
    let app = start(
        &fixture,
        service(&probe)
            .with_broker(broker, |b| {
                b.include(Subscriber::new(Q, slow).name("slow"))
                    .concurrency(8)
                    .global_concurrency(2);
            })
            .with_broker(other, |b| {
                b.include(Subscriber::new(Q, slow).name("slow2"))
                    .concurrency(8)
                    .global_concurrency(2);
            }),
    )
    .await;
    for n in 1..=8 {
        app.enqueue(job(Q, n)).await.expect("publish");
    }
    app.drain().await;

    assert_eq!(probe.finished.load(Ordering::SeqCst), 8, "every job ran");
    assert_eq!(
        probe.max_in_flight.load(Ordering::SeqCst),
        2,
        "at most (and, with 8 waiting, exactly) 2 at once across both workers"
    );
    assert_eq!(
        probe.attempts(),
        vec![Some(1); 8],
        "a job held back by the limit spends no attempt"
    );
    assert_empty(&app, Q, "after every job").await;
    app.stop().await;
}

/// `.rate_limit(3, 1 s)`: of 6 jobs published together, 3 start and the others wait (no
/// more start while the period has not passed); once it has, the other 3 run. Every job runs
/// on its first attempt.
pub async fn rate_limit_starts_no_more_than_its_rate_per_period<F: Fixture>(fixture: F) {
    const Q: &str = "cf_rate_limit";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"))
                .rate_limit(3, Duration::from_secs(1));
        }),
    )
    .await;
    for n in 1..=6 {
        app.enqueue(job(Q, n)).await.expect("publish");
    }
    eventually("three jobs start", || probe.runs() >= 3).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        probe.runs(),
        3,
        "no fourth job starts within the period of the first three"
    );
    app.advance(Duration::from_secs(1) + MARGIN).await;
    eventually("the other three run", || probe.runs() >= 6).await;
    app.drain().await;
    assert_eq!(probe.runs(), 6, "every job ran once");
    assert_eq!(
        probe.attempts(),
        vec![Some(1); 6],
        "a job held back by the limit spends no attempt"
    );
    assert!(
        outcomes(&app, "acks")
            .iter()
            .all(|(_, o)| *o == Outcome::Acked)
    );
    assert_empty(&app, Q, "after every job").await;
    app.stop().await;
}
