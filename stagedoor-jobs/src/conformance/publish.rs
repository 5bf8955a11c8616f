//! Publishing: delayed jobs (`Job::after`, `Job::at`), job ids (one job per id, the id the
//! handler and the dead letter see, duplicates reported not stored), publishing on a paused
//! app, and [`Broker::publish_once`](crate::broker::Broker::publish_once), the scheduler's
//! guarded publish.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::fixture::Fixture;
use super::support::{
    DELAY, LedgerClosed, MARGIN, Msg, Probe, Seen, acks, assert_empty, connected, eventually,
    gated, job, ledger_closed, outcomes, retries_once, service, start,
};
use crate::broker::{Broker, DeadSelector};
use crate::broker::{DeadLetters, Inspect};
use crate::testing::Outcome;
use crate::{Ctx, Data, JobId, Subscriber, keys};

/// `Job::after(d)`: not run before `d` (delayed in the stats), run after it.
pub async fn delayed_publish_runs_after_its_delay<F: Fixture>(fixture: F) {
    const Q: &str = "cf_after";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    app.publish(job(Q, 1).after(DELAY)).await.expect("publish");
    app.drain().await;
    assert_eq!(probe.runs(), 0, "not run before its delay");
    let stats = app.stats(Q).await;
    assert_eq!((stats.ready, stats.delayed), (0, 1), "{stats:?}");

    app.advance(DELAY + MARGIN).await;
    assert_eq!(probe.attempts(), [Some(1)], "run after its delay");
    assert_eq!(outcomes(&app, "acks"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after the delayed job ran").await;
    app.stop().await;
}

/// `Job::at(t)`: not run before `t` (delayed in the stats), run after it.
pub async fn publish_at_runs_at_its_time<F: Fixture>(fixture: F) {
    const Q: &str = "cf_at";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    let at = app.now() + chrono::Duration::from_std(DELAY).expect("a small delay");
    app.publish(job(Q, 1).at(at)).await.expect("publish");
    app.drain().await;
    assert_eq!(probe.runs(), 0, "not run before its time");
    let stats = app.stats(Q).await;
    assert_eq!((stats.ready, stats.delayed), (0, 1), "{stats:?}");

    app.advance(DELAY + MARGIN).await;
    assert_eq!(probe.attempts(), [Some(1)], "run at its time");
    assert_eq!(outcomes(&app, "acks"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after the job ran").await;
    app.stop().await;
}

/// Publishing the same job id twice (`Job::id`) while the first is waiting stores and runs it
/// once.
pub async fn same_job_id_published_twice_runs_once<F: Fixture>(fixture: F) {
    const Q: &str = "cf_dup_waiting";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    // Delayed, so that the first is surely still in the queue when the second is published.
    let id = JobId::from_string(format!("cf-dup-{}", JobId::new()));
    for n in [1, 2] {
        let got = app
            .publish(job(Q, n).id(id.clone()).after(DELAY))
            .await
            .expect("publishing a duplicate is not an error");
        assert_eq!(got.id(), &id);
        assert_eq!(got.is_stored(), n == 1, "only the first is stored");
    }
    let stats = app.stats(Q).await;
    assert_eq!(
        (stats.ready, stats.delayed),
        (0, 1),
        "stored once: {stats:?}"
    );

    app.advance(DELAY + MARGIN).await;
    assert_eq!(probe.attempts(), [Some(1)], "run once");
    assert_eq!(probe.seen()[0].n, 1, "the first publication stands");
    assert_eq!(outcomes(&app, "acks"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after the job ran").await;
    app.stop().await;
}

/// Publishing a job id again while its job runs adds nothing: the job runs once.
pub async fn job_id_published_while_running_is_not_added<F: Fixture>(fixture: F) {
    const Q: &str = "cf_dup_running";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, gated).name("gated"));
        }),
    )
    .await;
    let id = JobId::from_string(format!("cf-dup-{}", JobId::new()));
    // `enqueue`: the handler waits for the gate the test opens below.
    app.enqueue(job(Q, 1).id(id.clone()))
        .await
        .expect("publish");
    eventually("the job runs", || probe.in_flight() == 1).await;
    let again = app
        .enqueue(job(Q, 2).id(id.clone()))
        .await
        .expect("publishing a duplicate is not an error");
    assert_eq!(
        (again.id(), again.is_stored()),
        (&id, false),
        "reported as already there"
    );
    let stats = app.stats(Q).await;
    assert_eq!(
        (stats.ready, stats.pending, stats.delayed),
        (0, 1, 0),
        "only the running delivery: {stats:?}"
    );
    probe.open.store(true, Ordering::SeqCst);
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1)], "run once");
    assert_eq!(probe.seen()[0].n, 1);
    assert_eq!(outcomes(&app, "gated"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after the job ran").await;
    app.stop().await;
}

/// Fails every attempt, recording the job id it sees (`Ctx<keys::JobId>`).
async fn fails_seeing_id(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    Ctx(job_id): Ctx<keys::JobId>,
) -> Result<(), LedgerClosed> {
    p.see(Seen {
        job_id: Some(job_id),
        ..Seen::of(msg, attempt)
    });
    Err(ledger_closed())
}

/// One id per job: the id `publish` returns is the id every attempt's handler sees
/// (`Ctx<keys::JobId>`), the harness records, and the job's dead letter keeps
/// (`envelope.id()`), which the CLI shows and a replay selects by.
pub async fn published_id_is_the_handlers_and_the_dead_letters<F: Fixture>(fixture: F) {
    const Q: &str = "cf_one_id";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_seeing_id).name("fails_seeing_id"))
                .max_attempts(crate::nonzero!(2u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let published = app.publish(job(Q, 1)).await.expect("publish");
    assert!(published.is_stored(), "{published:?}");
    let id = published.into_id();
    app.drain().await;

    let seen: Vec<Option<JobId>> = probe.seen().into_iter().map(|s| s.job_id).collect();
    assert_eq!(
        seen,
        [Some(id.clone()), Some(id.clone())],
        "each attempt's handler sees the id publish returned"
    );
    let records = app.outcomes("fails_seeing_id");
    assert!(
        records.len() == 2 && records.iter().all(|r| r.job_id == id),
        "{records:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(
        letters[0].envelope.id(),
        &id,
        "the dead letter keeps the id publish returned"
    );
    assert!(DeadSelector::Id(id.to_string()).matches(&letters[0]));
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// A publish tells which jobs it stored: a job id published twice is stored once (the second
/// report says "not stored"), and so is an id repeated inside one batch or already waiting;
/// each stored job runs once, the first publication of its id.
pub async fn duplicate_publishes_are_reported_not_stored<F: Fixture>(fixture: F) {
    const Q: &str = "cf_dup_report";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    // Delayed, so that the first publication is surely still in the queue.
    let id = JobId::from_string(format!("cf-dup-report-{}", JobId::new()));
    let first = app
        .publish(job(Q, 1).id(id.clone()).after(DELAY))
        .await
        .expect("publish");
    let second = app
        .publish(job(Q, 2).id(id.clone()).after(DELAY))
        .await
        .expect("publishing a duplicate is not an error");
    assert_eq!((first.id(), first.is_stored()), (&id, true), "the first");
    assert_eq!(
        (second.id(), second.is_stored()),
        (&id, false),
        "the second: already there"
    );

    // One batch: a new id twice, and the id already waiting.
    let other = JobId::from_string(format!("cf-dup-report-{}", JobId::new()));
    let batch = crate::broker::Publish::publish_jobs(
        &direct,
        [
            job(Q, 3).id(other.clone()).after(DELAY),
            job(Q, 4).id(other.clone()).after(DELAY),
            job(Q, 5).id(id.clone()).after(DELAY),
        ],
    )
    .await
    .expect("publishing a batch with duplicates is not an error");
    let got: Vec<(JobId, bool)> = batch
        .iter()
        .map(|p| (p.id().clone(), p.is_stored()))
        .collect();
    assert_eq!(
        got,
        [(other.clone(), true), (other, false), (id, false)],
        "one report per job, in order"
    );
    let stats = app.stats(Q).await;
    assert_eq!(stats.delayed, 2, "two jobs stored: {stats:?}");

    app.advance(DELAY + MARGIN).await;
    let mut ran: Vec<(u64, Option<u32>)> = probe.seen().iter().map(|s| (s.n, s.attempt)).collect();
    ran.sort_unstable();
    assert_eq!(
        ran,
        [(1, Some(1)), (3, Some(1))],
        "each stored job runs once, its first publication"
    );
    assert_empty(&app, Q, "after the jobs ran").await;
    app.stop().await;
}

/// On the paused harness ([`TestApp::start`]), `publish` of a job due now returns once the job
/// has settled, and whatever it caused at the same instant with it (a retry without delay),
/// the clock unmoved: a test reads the outcome right after publishing. A delayed job is only
/// stored. On a live fixture `publish` returns once the job is stored; `drain` settles it.
///
/// [`TestApp::start`]: crate::testing::TestApp::start
pub async fn paused_publish_returns_once_the_job_has_settled<F: Fixture>(fixture: F) {
    const Q: &str = "cf_publish_settles";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_once).name("retries_once"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let before = app.now();
    app.publish(job(Q, 1)).await.expect("publish");
    if !fixture.paused() {
        app.drain().await;
    }
    let got = outcomes(&app, "retries_once");
    assert!(
        matches!(&got[..], [(1, Outcome::Retried { delay, .. }), (2, Outcome::Acked)] if delay.is_zero()),
        "the job and its retry at once have settled when publish returns: {got:?}"
    );
    if fixture.paused() {
        assert_eq!(app.now(), before, "the clock did not move");
    }

    app.publish(job(Q, 2).after(DELAY)).await.expect("publish");
    assert_eq!(
        outcomes(&app, "retries_once").len(),
        2,
        "a delayed job is only stored"
    );
    assert_eq!(app.stats(Q).await.delayed, 1);
    app.advance(DELAY + MARGIN).await;
    assert_eq!(probe.attempts_of(2), [Some(1), Some(2)], "run at its time");
    assert_empty(&app, Q, "after both jobs").await;
    assert!(app.dead_letters(&dl).await.is_empty());
    app.stop().await;
}

/// Publishes message `n` of id `id` to `queue` through [`Broker::publish_once`] with `guard`,
/// due `after` from now (`None`: now).
async fn publish_once_n<B: Broker>(
    broker: &B,
    queue: &str,
    (n, id): (u64, &JobId),
    after: Option<Duration>,
    guard: &str,
) -> crate::broker::Published {
    let mut j = job(queue, n).id(id.clone());
    if let Some(d) = after {
        j = j.after(d);
    }
    let (q, envelope, at) = j.into_parts(broker.clock().now());
    broker
        .publish_once(&q, (envelope, at), guard, Duration::from_secs(3600))
        .await
        .unwrap_or_else(|e| panic!("publish_once of message {n}: {e}"))
}

/// [`Broker::publish_once`] (how the scheduler enqueues a tick) takes its guard and publishes
/// its job in one step: a second call with the same guard stores nothing, even a job of
/// another id, and reports it as already there; a call with another guard publishes again; a
/// job due later waits delayed as any other; a job whose id is already in the queue is not
/// stored twice, whatever its guard.
pub async fn publish_once_stores_a_job_once_per_guard<F: Fixture>(fixture: F) {
    const Q: &str = "cf_publish_once";
    let direct = connected(&fixture.broker().await).await;
    direct.prepare(Q).await.expect("prepare");
    // Guards of their own: a shared server keeps them after the test.
    let run = JobId::new();
    let (tick_1, tick_2, tick_3, tick_4) = (
        format!("cf-once:{run}:1"),
        format!("cf-once:{run}:2"),
        format!("cf-once:{run}:3"),
        format!("cf-once:{run}:4"),
    );
    let ids: Vec<JobId> = (0..5)
        .map(|i| JobId::from_string(format!("cf-once-{run}-{i}")))
        .collect();

    let first = publish_once_n(&direct, Q, (1, &ids[0]), None, &tick_1).await;
    assert_eq!(
        (first.id(), first.is_stored()),
        (&ids[0], true),
        "the first"
    );
    let again = publish_once_n(&direct, Q, (2, &ids[1]), None, &tick_1).await;
    assert_eq!(
        (again.id(), again.is_stored()),
        (&ids[0], false),
        "the same guard again, another job id: nothing stored, and the id is the holder's"
    );
    let other = publish_once_n(&direct, Q, (3, &ids[2]), None, &tick_2).await;
    assert_eq!(
        (other.id(), other.is_stored()),
        (&ids[2], true),
        "another guard publishes"
    );
    let stats = direct.stats(Q).await.expect("stats");
    assert_eq!(
        (stats.ready, stats.delayed),
        (2, 0),
        "two jobs stored, one per guard: {stats:?}"
    );

    let later = publish_once_n(
        &direct,
        Q,
        (4, &ids[3]),
        Some(Duration::from_secs(3600)),
        &tick_3,
    )
    .await;
    assert!(later.is_stored(), "a job due later is stored");
    let later_again = publish_once_n(
        &direct,
        Q,
        (5, &ids[4]),
        Some(Duration::from_secs(3600)),
        &tick_3,
    )
    .await;
    assert!(!later_again.is_stored(), "its guard holds as well");
    let known = publish_once_n(&direct, Q, (6, &ids[0]), None, &tick_4).await;
    assert_eq!(
        (known.id(), known.is_stored()),
        (&ids[0], false),
        "an id already in the queue is not stored again under a new guard"
    );
    let stats = direct.stats(Q).await.expect("stats");
    assert_eq!(
        (stats.ready, stats.delayed),
        (2, 1),
        "two jobs ready and one delayed, nothing more: {stats:?}"
    );
}
