//! Outcomes: what each answer of a handler does to its job (`ack`, `Ok(())`, `retry`
//! with and without a backoff, `retry_after`, `drop`, an error with its source chain, a panic)
//! and how attempts are numbered.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::fixture::Fixture;
use super::support::{
    DELAY, DISK_FULL, LEDGER_CLOSED, MARGIN, Msg, Probe, Seen, acks, assert_empty, connected,
    counts_to_four, drops, fails_with_source, job, ok_unit, outcomes, retries_after_once,
    retries_once, retries_until_third, service, start,
};
use crate::broker::DeadLetters;
use crate::outcome::FailureCause;
use crate::testing::Outcome;
use crate::{Ctx, Data, Fixed, HandlerOutcome, Subscriber, keys};

// The panicking handler lives here, not in `support.rs`: its row expects the panic's location
// in this file (`file!()`).

/// The message of the handler that panics.
const PANIC_MESSAGE: &str = "conformance: the handler panicked on purpose";

async fn panics_on_one(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    if msg.n == 1 {
        p.panic_line.store(line!() + 1, Ordering::SeqCst);
        panic!("{PANIC_MESSAGE}");
    }
    HandlerOutcome::ack()
}

/// `ack()`: the job leaves the queue (stats all zero), the handler ran once, with attempt
/// `Some(1)`.
pub async fn ack_removes_the_job<F: Fixture>(fixture: F) {
    const Q: &str = "cf_ack";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"));
        }),
    )
    .await;
    let id = app.publish(job(Q, 1)).await.expect("publish").into_id();
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1)], "the handler runs once");
    let records = app.outcomes("acks");
    assert_eq!(records.len(), 1, "one settled delivery: {records:?}");
    assert_eq!(records[0].outcome, Outcome::Acked);
    assert_eq!(records[0].attempt, 1);
    assert_eq!(records[0].job_id, id);
    assert_empty(&app, Q, "after ack").await;
    app.stop().await;
}

/// `Ok(())` from a handler returning `Result<(), E>` acks.
pub async fn ok_unit_result_acks<F: Fixture>(fixture: F) {
    const Q: &str = "cf_ok_unit";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, ok_unit).name("ok_unit"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1)], "the handler runs once");
    assert_eq!(outcomes(&app, "ok_unit"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after Ok(())").await;
    assert!(app.dead_letters(&dl).await.is_empty(), "no dead letter");
    app.stop().await;
}

/// `retry()` on a mount without a backoff: the job comes back at once (no time passes), and
/// the handler sees attempts 1, 2, 3.
pub async fn retry_without_backoff_comes_back_at_once<F: Fixture>(fixture: F) {
    const Q: &str = "cf_retry_now";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_until_third).name("retries_until_third"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1), Some(2), Some(3)]);
    let got = outcomes(&app, "retries_until_third");
    assert_eq!(got.len(), 3, "three deliveries: {got:?}");
    for (i, (attempt, outcome)) in got.iter().take(2).enumerate() {
        assert_eq!(*attempt as usize, i + 1);
        assert!(
            matches!(outcome, Outcome::Retried { delay, cause: FailureCause::Retry, .. } if delay.is_zero()),
            "attempt {attempt} is retried at once: {outcome:?}"
        );
    }
    assert_eq!(got[2], (3, Outcome::Acked));
    assert_empty(&app, Q, "after the third attempt acked").await;
    app.stop().await;
}

/// `retry()` on a mount with `Fixed(300 ms)`: the job is delayed (stats.delayed == 1) and not run
/// again before the delay; after it, it runs again.
pub async fn retry_waits_for_the_mount_backoff<F: Fixture>(fixture: F) {
    const Q: &str = "cf_retry_backoff";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_once).name("retries_once"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone())
                .backoff(Fixed::new(DELAY));
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(
        probe.attempts(),
        [Some(1)],
        "not run again before the backoff"
    );
    let stats = app.stats(Q).await;
    assert_eq!(
        (stats.ready, stats.pending, stats.delayed),
        (0, 0, 1),
        "the retry waits, delayed: {stats:?}"
    );
    let got = outcomes(&app, "retries_once");
    assert!(
        matches!(&got[..], [(1, Outcome::Retried { delay, cause: FailureCause::Retry, .. })] if *delay == DELAY),
        "retried after the mount's backoff: {got:?}"
    );

    app.advance(DELAY + MARGIN).await;
    assert_eq!(
        probe.attempts(),
        [Some(1), Some(2)],
        "run again after the backoff"
    );
    assert_eq!(outcomes(&app, "retries_once")[1], (2, Outcome::Acked));
    assert_empty(&app, Q, "after the retry acked").await;
    app.stop().await;
}

/// `retry_after(d)` overrides the mount's backoff (`Fixed(60 s)`: the job runs again after
/// about `d`, not a minute), and is durable: the delayed job is in the queue's stats.
pub async fn retry_after_overrides_the_backoff_durably<F: Fixture>(fixture: F) {
    const Q: &str = "cf_retry_after";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_after_once).name("retries_after_once"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone())
                .backoff(Fixed::new(Duration::from_secs(60)));
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(
        probe.attempts(),
        [Some(1)],
        "not run again before the delay"
    );
    let stats = app.stats(Q).await;
    assert_eq!(
        (stats.ready, stats.pending, stats.delayed),
        (0, 0, 1),
        "the retry is stored as a delayed job: {stats:?}"
    );
    let got = outcomes(&app, "retries_after_once");
    assert!(
        matches!(&got[..], [(1, Outcome::Retried { delay, cause: FailureCause::Retry, .. })] if *delay == DELAY),
        "retried after the handler's delay, not the mount's backoff: {got:?}"
    );

    app.advance(DELAY + MARGIN).await;
    assert_eq!(
        probe.attempts(),
        [Some(1), Some(2)],
        "run again after the handler's delay, long before the mount's backoff"
    );
    assert_eq!(outcomes(&app, "retries_after_once")[1], (2, Outcome::Acked));
    assert_empty(&app, Q, "after the retry acked").await;
    app.stop().await;
}

/// `drop()`: the job leaves the queue, is recorded as dropped and is not dead-lettered, even on
/// a mount whose cap is 1.
pub async fn drop_leaves_the_queue_without_a_dead_letter<F: Fixture>(fixture: F) {
    const Q: &str = "cf_drop";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, drops).name("drops"))
                .max_attempts(crate::nonzero!(1u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1)]);
    assert_eq!(outcomes(&app, "drops"), [(1, Outcome::Dropped)]);
    assert_empty(&app, Q, "after drop").await;
    assert!(
        app.dead_letters(&dl).await.is_empty(),
        "a dropped job is not a dead letter"
    );
    assert_eq!(direct.dead_len(&dl).await.expect("dead_len"), 0);
    app.stop().await;
}

/// `Err(e)` with a source: a failed attempt; at the cap, the dead letter's `error` is `e`'s
/// `Display` and its `traceback` has `caused by: <source>`.
pub async fn error_keeps_its_message_and_source_chain<F: Fixture>(fixture: F) {
    const Q: &str = "cf_error";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_with_source).name("fails_with_source"))
                .max_attempts(crate::nonzero!(2u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1), Some(2)]);
    let got = outcomes(&app, "fails_with_source");
    assert!(
        matches!(&got[..], [
            (1, Outcome::Retried { error, cause: FailureCause::Error, .. }),
            (2, Outcome::DeadLettered { error: last, traceback, cause: FailureCause::Error, .. }),
        ] if error == LEDGER_CLOSED && last == LEDGER_CLOSED
            && traceback.contains(&format!("caused by: {DISK_FULL}"))),
        "a failed attempt, then the dead letter at the cap: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    assert_eq!(letters[0].error, LEDGER_CLOSED, "the error is e's Display");
    assert!(
        letters[0]
            .traceback
            .contains(&format!("caused by: {DISK_FULL}")),
        "the traceback has the source chain: {:?}",
        letters[0].traceback
    );
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// A panic in the handler: a failed attempt whose error has the panic's message and whose
/// traceback has its `file:line`; the worker lives on (a job published afterwards is acked).
pub async fn panic_is_a_failed_attempt_and_the_worker_lives_on<F: Fixture>(fixture: F) {
    const Q: &str = "cf_panic";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, panics_on_one).name("panics_on_one"))
                .max_attempts(crate::nonzero!(2u32))
                .dead_letter(dl.clone())
                .concurrency(1);
        }),
    )
    .await;
    let panicking = app.publish(job(Q, 1)).await.expect("publish").into_id();
    app.drain().await;

    let location = format!("{}:{}:", file!(), probe.panic_line.load(Ordering::SeqCst));
    let got = outcomes(&app, "panics_on_one");
    assert!(
        matches!(&got[..], [
            (1, Outcome::Retried { error, cause: FailureCause::Panic, .. }),
            (2, Outcome::DeadLettered { error: last, traceback, cause: FailureCause::Panic, .. }),
        ] if error.contains(PANIC_MESSAGE) && last.contains(PANIC_MESSAGE)
            && traceback.contains(&location)),
        "a panic is a failed attempt with its message and location ({location}): {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    assert_eq!(letters[0].envelope.id(), &panicking);
    assert!(letters[0].error.contains(PANIC_MESSAGE), "{letters:?}");
    assert!(
        letters[0].traceback.contains(&location),
        "the traceback has the panic's location {location}: {:?}",
        letters[0].traceback
    );

    let after = app.publish(job(Q, 2)).await.expect("publish").into_id();
    app.drain().await;
    let last = app.outcomes("panics_on_one").pop().expect("a record");
    assert_eq!(last.job_id, after);
    assert_eq!(
        last.outcome,
        Outcome::Acked,
        "the worker lives on after a panic"
    );
    assert_empty(&app, Q, "after the panics").await;
    app.stop().await;
}

/// Attempt numbering: 1 for the first delivery, +1 per retry; `Ctx<keys::JobId>` is the same on
/// every attempt (the id `publish` returned).
pub async fn attempts_count_up_and_the_job_id_stays<F: Fixture>(fixture: F) {
    const Q: &str = "cf_attempts";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, counts_to_four).name("counts_to_four"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let id = app.publish(job(Q, 1)).await.expect("publish").into_id();
    app.drain().await;

    assert_eq!(probe.attempts(), [Some(1), Some(2), Some(3), Some(4)]);
    for seen in probe.seen() {
        assert_eq!(
            seen.job_id.as_ref(),
            Some(&id),
            "every attempt sees the job's id"
        );
    }
    let records = app.outcomes("counts_to_four");
    let attempts: Vec<u32> = records.iter().map(|r| r.attempt).collect();
    assert_eq!(attempts, [1, 2, 3, 4]);
    assert!(records.iter().all(|r| r.job_id == id));
    assert_eq!(records[3].outcome, Outcome::Acked);
    assert_empty(&app, Q, "after the fourth attempt acked").await;
    app.stop().await;
}
