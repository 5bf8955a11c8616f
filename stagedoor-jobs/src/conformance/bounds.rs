//! Values at their bounds: a delay too long to keep ([`MAX_DELAY`]: a handler's
//! `retry_after(Duration::MAX)`, `Job::after(Duration::MAX)`, `Job::at` of a far future) is
//! kept at the bound on every backend, and the service lives on. A lease or a queue name out
//! of bounds is refused; a unique window past the bound is kept at it.

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

/// The problems of a service that was refused, or a panic naming what started.
fn refusal(started: Result<TestApp, crate::ServiceError>) -> Vec<crate::broker::Problem> {
    match started {
        Err(crate::ServiceError::Refused { problems, .. }) => problems,
        Err(other) => panic!("expected a refusal listing the problems, got {other}"),
        Ok(_) => panic!("expected a refusal, but the service started"),
    }
}

/// Starts `service` as the fixture runs, returning what the start returned.
async fn try_start<F: Fixture>(
    fixture: &F,
    service: crate::Service,
) -> Result<TestApp, crate::ServiceError> {
    if fixture.paused() {
        TestApp::start(service).await
    } else {
        TestApp::start_live(service).await
    }
}

/// A lease of zero (a job claimed again while its handler runs, so run twice) or of more than
/// [`MAX_LEASE`](crate::broker::MAX_LEASE) (a dead worker's jobs held that long, and lease
/// arithmetic that overflows) is refused at startup, naming the lease and the bounds.
pub async fn a_lease_out_of_bounds_is_refused_at_startup<F: Fixture>(fixture: F) {
    const Q: &str = "cf_lease_bounds";
    for lease in [
        Duration::ZERO,
        Duration::from_secs(2 * 24 * 3600),
        Duration::MAX,
    ] {
        let probe = Probe::new();
        let broker = fixture.broker_with_lease(lease).await;
        let started = try_start(
            &fixture,
            service(&probe).with_broker(broker, |b| {
                b.include(Subscriber::new(Q, retries_after_forever_once).name("forever"));
            }),
        )
        .await;
        let problems = refusal(started);
        assert_eq!(problems.len(), 1, "{lease:?}: {problems:?}");
        let text = &problems[0].message;
        assert!(
            text.contains(&format!("{lease:?}"))
                && text.contains("MIN_LEASE")
                && text.contains("MAX_LEASE"),
            "names the lease and the bounds: {text}"
        );
    }
}

/// A queue name no backend takes (empty, a NUL, longer than
/// [`MAX_QUEUE_NAME_LEN`](crate::broker::MAX_QUEUE_NAME_LEN)) is refused at startup, every
/// one listed at once, and at publish with [`BrokerError::Invalid`](crate::BrokerError)
/// naming it; nothing is stored, and a good name is published as before.
pub async fn a_bad_queue_name_is_refused_at_startup_and_at_publish<F: Fixture>(fixture: F) {
    use crate::broker::{BrokerError, Inspect, Publish};
    let long = "q".repeat(crate::broker::MAX_QUEUE_NAME_LEN + 1);
    let bad = [String::new(), "cf_nul\0name".to_owned(), long];
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let started = try_start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            for (i, q) in bad.iter().enumerate() {
                b.include(
                    Subscriber::new(q.clone(), retries_after_forever_once).name(format!("bad{i}")),
                );
            }
        }),
    )
    .await;
    let problems = refusal(started);
    for (i, want) in ["empty", "NUL", "bytes long"].iter().enumerate() {
        assert!(
            problems
                .iter()
                .any(|p| p.mount.contains(&format!("bad{i}")) && p.message.contains(want)),
            "a problem of mount bad{i} says `{want}`: {problems:?}"
        );
    }
    for q in &bad {
        match direct.publish_job(job(q, 1)).await {
            Err(BrokerError::Invalid(m)) => assert!(m.contains("queue name"), "{m}"),
            other => panic!("publishing to {q:?} is refused, not {other:?}"),
        }
        match direct
            .publish_jobs([job("cf_bad_names_ok", 1), job(q, 2)])
            .await
        {
            Err(BrokerError::Invalid(m)) => assert!(m.contains("queue name"), "{m}"),
            other => panic!("a batch with {q:?} is refused, not {other:?}"),
        }
    }
    let stats = direct.stats("cf_bad_names_ok").await.expect("stats");
    assert_eq!(
        (stats.ready, stats.delayed),
        (0, 0),
        "a refused batch stores nothing: {stats:?}"
    );
    // An empty kind or id (found by the fuzzer: Redis dead-lettered the first as having no
    // kind, and gave the second another id) is refused the same way, alone or in a batch.
    for (bad, what) in [
        (job("cf_bad_names_ok", 4).kind(""), "kind"),
        (
            job("cf_bad_names_ok", 5).id(crate::JobId::from_string("")),
            "id",
        ),
    ] {
        match direct.publish_job(bad.clone()).await {
            Err(BrokerError::Invalid(m)) => assert!(m.contains(what), "{m}"),
            other => panic!("a job with an empty {what} is refused, not {other:?}"),
        }
        match direct.publish_jobs([job("cf_bad_names_ok", 6), bad]).await {
            Err(BrokerError::Invalid(m)) => assert!(m.contains(what), "{m}"),
            other => panic!("a batch with an empty {what} is refused, not {other:?}"),
        }
    }
    let stats = direct.stats("cf_bad_names_ok").await.expect("stats");
    assert_eq!(
        (stats.ready, stats.delayed),
        (0, 0),
        "a refused job stores nothing: {stats:?}"
    );
    let got = direct
        .publish_job(job("cf_bad_names_ok", 3))
        .await
        .expect("a good name is published");
    assert!(got.is_stored());
}

/// A unique window past [`MAX_DELAY`] (`Duration::MAX`, 2^64 ms and more) keeps the job
/// unique (the window is kept at the bound): before, it did not fit its header and the job
/// was silently not unique.
pub async fn a_unique_window_past_the_bound_keeps_the_job_unique<F: Fixture>(fixture: F) {
    use crate::broker::Publish;
    const Q: &str = "cf_unique_huge";
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    for window in [Duration::MAX, Duration::from_millis(u64::MAX)] {
        let key = format!("k-{}", window.as_secs());
        let first = direct
            .publish_job(
                job(Q, 1)
                    .after(Duration::from_secs(60))
                    .unique(&key, window),
            )
            .await
            .expect("publish");
        assert!(first.is_stored());
        let second = direct
            .publish_job(
                job(Q, 2)
                    .after(Duration::from_secs(60))
                    .unique(&key, window),
            )
            .await
            .expect("publish");
        assert!(
            !second.is_stored(),
            "a window of {window:?} keeps the key: the second is not stored"
        );
        assert_eq!(second.id(), first.id());
    }
}
