//! Values at their bounds: a delay too long to keep ([`MAX_DELAY`]: a handler's
//! `retry_after(Duration::MAX)`, `Job::after(Duration::MAX)`, `Job::at` of a far future) is
//! kept at the bound on every backend, and the service lives on.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::fixture::Fixture;
use super::support::{MARGIN, Msg, Probe, Seen, connected, job, outcomes, service, start};
use crate::broker::Activity;
use crate::testing::{Outcome, TestApp};
use crate::{Ctx, Data, HandlerOutcome, MAX_DELAY, Subscriber, keys};

/// How far a due time may sit from the one computed here: the live backends' clocks move
/// while the test runs.
const SLACK: chrono::Duration = chrono::Duration::minutes(1);

/// Message 1 asks, on its first attempt, to come back after the longest delay there is; every
/// other delivery acks.
async fn retries_after_forever_once(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    if msg.n == 1 && attempt == Some(1) {
        HandlerOutcome::retry_after(Duration::MAX)
    } else {
        HandlerOutcome::ack()
    }
}

/// `now` plus [`MAX_DELAY`].
fn at_the_bound(now: DateTime<Utc>) -> DateTime<Utc> {
    now + chrono::Duration::from_std(MAX_DELAY).expect("MAX_DELAY fits chrono")
}

/// The due times of `queue`'s delayed jobs, each checked to be [`MAX_DELAY`] after `now`.
async fn assert_delayed_at_the_bound<B: Activity>(
    direct: &B,
    queue: &str,
    now: DateTime<Utc>,
    jobs: usize,
) {
    let delayed = direct.delayed(queue, 10).await.expect("list delayed jobs");
    assert_eq!(delayed.len(), jobs, "{delayed:?}");
    for d in &delayed {
        assert!(
            (d.due - at_the_bound(now)).abs() < SLACK,
            "due at now + MAX_DELAY ({}), not {}: {d:?}",
            at_the_bound(now),
            d.due
        );
    }
}

/// A handler's `retry_after(Duration::MAX)` (a delay read from an upstream's `Retry-After`)
/// retries the job at [`MAX_DELAY`]: the job is kept, delayed, runs after that delay (on a
/// paused clock), and the service goes on running other jobs.
pub async fn a_huge_retry_after_is_kept_at_the_longest_delay<F: Fixture>(fixture: F) {
    const Q: &str = "cf_huge_retry_after";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_after_forever_once).name("forever"));
        }),
    )
    .await;
    let now = app.now();
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;
    assert_eq!(probe.attempts_of(1), [Some(1)]);
    let got = outcomes(&app, "forever");
    assert!(
        matches!(&got[..], [(1, Outcome::Retried { delay, .. })] if *delay == MAX_DELAY),
        "retried after MAX_DELAY: {got:?}"
    );
    let stats = app.stats(Q).await;
    assert_eq!(
        (stats.ready, stats.pending, stats.delayed),
        (0, 0, 1),
        "the job is kept, delayed: {stats:?}"
    );
    assert_delayed_at_the_bound(&direct, Q, now, 1).await;

    service_lives_on(&app, &probe, Q).await;
    if fixture.paused() {
        app.advance(MAX_DELAY).await;
        app.advance(MARGIN).await;
        assert_eq!(
            probe.attempts_of(1),
            [Some(1), Some(2)],
            "run again after MAX_DELAY"
        );
    }
    app.stop().await;
}

/// Another job of `queue` runs and acks.
async fn service_lives_on(app: &TestApp, probe: &Probe, queue: &str) {
    app.publish(job(queue, 2))
        .await
        .expect("publish another job");
    app.drain().await;
    assert_eq!(
        probe.attempts_of(2),
        [Some(1)],
        "the service runs other jobs"
    );
}

/// `Job::after(Duration::MAX)` and `Job::at` of a time past [`MAX_DELAY`] (the latest time
/// chrono holds) are published delayed at `now + MAX_DELAY`, and the service lives on.
pub async fn a_huge_delay_is_published_at_the_longest_delay<F: Fixture>(fixture: F) {
    const Q: &str = "cf_huge_delay";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_after_forever_once).name("forever"));
        }),
    )
    .await;
    let now = app.now();
    app.publish(job(Q, 3).after(Duration::MAX))
        .await
        .expect("publish after Duration::MAX");
    app.publish(job(Q, 4).at(DateTime::<Utc>::MAX_UTC))
        .await
        .expect("publish at the latest time");
    app.publish(job(Q, 5).at(at_the_bound(now) + chrono::Duration::days(365 * 100)))
        .await
        .expect("publish a century past the bound");
    app.drain().await;
    assert_eq!(probe.runs(), 0, "none runs now");
    let stats = app.stats(Q).await;
    assert_eq!((stats.ready, stats.delayed), (0, 3), "{stats:?}");
    assert_delayed_at_the_bound(&direct, Q, now, 3).await;
    service_lives_on(&app, &probe, Q).await;
    app.stop().await;
}
