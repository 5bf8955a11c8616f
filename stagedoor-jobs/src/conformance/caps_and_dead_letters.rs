//! Caps and dead letters: a job reaches its dead letter at the cap (delayed retries
//! included), when its payload cannot be decoded, when no mount handles its kind, when it was
//! claimed beyond its cap, or when the broker cannot read it back; an uncapped mount keeps the
//! backoff's floor; the dead letter reports the attempts spent.

use std::time::Duration;

use super::fixture::Fixture;
use super::support::{
    DISK_FULL, LEASE, LEDGER_CLOSED, MARGIN, Msg, Probe, SHORT, acks, assert_empty, connected,
    eventually, fails_with_source, is_dead_lettered, is_retried, job, outcomes,
    retries_after_always, service, start,
};
use crate::broker::Broker;
use crate::broker::DeadLetters;
use crate::outcome::FailureCause;
use crate::testing::Outcome;
use crate::{Job, OnDecodeError, Subscriber};

/// The cap reached: the job moves to its dead letter with the error, the traceback,
/// `attempts == cap`, `failed_at`, `origin == queue` and the envelope as published (payload,
/// kind, id, request id, trace); the queue is empty and the handler ran exactly cap times.
pub async fn cap_reached_moves_the_job_to_its_dead_letter<F: Fixture>(fixture: F) {
    const Q: &str = "cf_cap";
    const CAP: u32 = 3;
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_with_source).name("fails_with_source"))
                .max_attempts(crate::nonzero!(CAP))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let slack = chrono::Duration::seconds(5);
    let before = app.now();
    let id = app
        .publish(
            job(Q, 7)
                .kind("invoice")
                .request_id("req-cap-7")
                .trace("trace-cap-7"),
        )
        .await
        .expect("publish")
        .into_id();
    app.drain().await;

    assert_eq!(
        probe.runs(),
        CAP as usize,
        "the handler runs exactly cap times: {:?}; records {:?}; stats {:?}",
        probe.seen(),
        app.records(),
        app.stats(Q).await
    );
    let got = outcomes(&app, "fails_with_source");
    assert_eq!(got.len(), CAP as usize, "{got:?}");
    assert!(
        got[..2]
            .iter()
            .all(|(_, o)| is_retried(o, FailureCause::Error))
    );
    assert!(
        matches!(&got[2], (3, Outcome::DeadLettered { target, .. }) if *target == dl),
        "the last attempt moves the job to `{dl}`: {got:?}"
    );
    assert_empty(&app, Q, "after the dead letter").await;

    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    let d = &letters[0];
    assert_eq!(d.error, LEDGER_CLOSED);
    assert!(
        d.traceback.contains(&format!("caused by: {DISK_FULL}")),
        "{d:?}"
    );
    assert_eq!(d.attempts, CAP, "attempts spent");
    assert_eq!(d.envelope.attempt(), CAP, "the envelope's attempts spent");
    assert_eq!(d.origin, Q, "the queue it failed on");
    assert!(
        d.failed_at >= before - slack && d.failed_at <= app.now() + slack,
        "failed_at {} should be about now ({before} .. {})",
        d.failed_at,
        app.now()
    );
    assert_cap_envelope_kept(d, &id);
    assert_eq!(direct.dead_len(&dl).await.expect("dead_len"), 1);
    app.stop().await;
}

/// The dead letter of [`cap_reached_moves_the_job_to_its_dead_letter`] holds the envelope as
/// published: its id, kind, payload, request id and trace.
fn assert_cap_envelope_kept(d: &crate::broker::DeadLetter, id: &crate::JobId) {
    assert_eq!(d.envelope.id(), id);
    assert_eq!(d.envelope.kind(), "invoice");
    assert_eq!(
        d.envelope.payload(),
        serde_json::to_vec(&Msg { n: 7 }).expect("encode"),
        "the payload is kept"
    );
    assert_eq!(
        d.envelope.headers().request_id.as_deref(),
        Some("req-cap-7")
    );
    assert_eq!(d.envelope.headers().trace.as_deref(), Some("trace-cap-7"));
}

/// A delayed retry counts against the cap like an immediate one: `retry_after` on every attempt
/// with a cap of 3 is dead-lettered after 3 runs.
pub async fn delayed_retries_count_against_the_cap<F: Fixture>(fixture: F) {
    const Q: &str = "cf_delayed_cap";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, retries_after_always).name("retries_after_always"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.drain().await;
    assert_eq!(probe.attempts(), [Some(1)], "the retry is delayed");

    app.advance(Duration::from_secs(1)).await;
    assert_eq!(probe.attempts(), [Some(1), Some(2), Some(3)]);
    let got = outcomes(&app, "retries_after_always");
    assert!(
        matches!(&got[..], [
            (1, Outcome::Retried { delay: d1, .. }),
            (2, Outcome::Retried { delay: d2, .. }),
            (3, Outcome::DeadLettered { .. }),
        ] if *d1 == SHORT && *d2 == SHORT),
        "two delayed retries, then the dead letter: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].attempts, 3);
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// An undecodable payload, default policy: failed attempts (the handler never runs) until the
/// cap; the dead letter's error is about decoding.
pub async fn undecodable_payload_fails_attempts_until_the_cap<F: Fixture>(fixture: F) {
    const Q: &str = "cf_decode_retry";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"))
                .max_attempts(crate::nonzero!(2u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let id = app
        .publish(Job::from_bytes(Q, b"not json".to_vec()))
        .await
        .expect("publish")
        .into_id();
    app.drain().await;

    assert_eq!(
        probe.runs(),
        0,
        "the handler never runs on undecodable bytes"
    );
    let got = outcomes(&app, "acks");
    assert!(
        matches!(&got[..], [(1, r), (2, d)]
            if is_retried(r, FailureCause::Decode) && is_dead_lettered(d, FailureCause::Decode)),
        "decode failures spend attempts until the cap: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].envelope.id(), &id);
    assert_eq!(letters[0].attempts, 2);
    assert_eq!(letters[0].envelope.payload(), b"not json");
    assert!(
        letters[0].error.to_lowercase().contains("decod"),
        "the error mentions decoding: {:?}",
        letters[0].error
    );
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// An undecodable payload with `.on_decode_error(OnDecodeError::DeadLetter)`: dead-lettered on
/// its first delivery, without spending further attempts.
pub async fn undecodable_payload_is_dead_lettered_at_once_when_asked<F: Fixture>(fixture: F) {
    const Q: &str = "cf_decode_dead";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).name("acks"))
                .max_attempts(crate::nonzero!(5u32))
                .dead_letter(dl.clone())
                .on_decode_error(OnDecodeError::DeadLetter);
        }),
    )
    .await;
    app.publish(Job::from_bytes(Q, b"not json".to_vec()))
        .await
        .expect("publish");
    app.drain().await;

    assert_eq!(probe.runs(), 0);
    let got = outcomes(&app, "acks");
    assert!(
        matches!(&got[..], [(1, d)] if is_dead_lettered(d, FailureCause::Decode)),
        "dead-lettered on the first delivery: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].attempts, 1, "no further attempt spent");
    assert!(
        letters[0].error.to_lowercase().contains("decod"),
        "{letters:?}"
    );
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// A job of a kind that no mount handles, on a queue whose mounts are kind-specific: dead-lettered
/// to the broker's default dead letter with an error naming the kind; no handler runs.
pub async fn unknown_kind_goes_to_the_default_dead_letter<F: Fixture>(fixture: F) {
    const Q: &str = "cf_unknown_kind";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks).kind("known").name("acks"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let id = app
        .publish(job(Q, 1).kind("mystery"))
        .await
        .expect("publish")
        .into_id();
    app.drain().await;

    assert_eq!(probe.runs(), 0, "no handler runs a kind nobody handles");
    let records = app.records();
    assert!(
        matches!(&records[..], [r] if r.job_id == id && matches!(
            &r.outcome,
            Outcome::DeadLettered { target, error, cause: FailureCause::UnknownKind, .. }
                if *target == dl && error.contains("mystery")
        )),
        "dead-lettered to `{dl}` naming the kind: {records:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].envelope.id(), &id);
    assert_eq!(letters[0].envelope.kind(), "mystery");
    assert_eq!(letters[0].origin, Q);
    assert!(letters[0].error.contains("mystery"), "{letters:?}");

    // The known kind still runs.
    app.publish(job(Q, 2).kind("known")).await.expect("publish");
    app.drain().await;
    assert_eq!(outcomes(&app, "acks"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after both jobs").await;
    app.stop().await;
}

/// A job claimed beyond its cap (its workers died with it, each claim spending an attempt) is
/// dead-lettered without running, its error naming the delivery number and the cap.
pub async fn job_claimed_beyond_its_cap_is_dead_lettered_without_running<F: Fixture>(fixture: F) {
    const Q: &str = "cf_poison";
    const CAP: u32 = 2;
    let probe = Probe::new();
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
    for attempt in 1..=CAP {
        let got = direct
            .claim(
                Q,
                1,
                Duration::from_secs(2),
                crate::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim");
        assert_eq!(got.len(), 1, "claim {attempt} gets the job");
        assert_eq!(got[0].envelope.id(), &id);
        assert_eq!(
            got[0].envelope.attempt(),
            attempt,
            "each claim spends an attempt"
        );
        // The worker dies: the delivery is never settled; its lease runs out.
        tokio::time::sleep(LEASE + MARGIN).await;
    }

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
        matches!(&got[..], [(3, d)] if is_dead_lettered(d, FailureCause::Poison)),
        "dead-lettered on its third claim: {got:?}"
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].envelope.id(), &id);
    assert_eq!(letters[0].attempts, CAP + 1, "every claim counted");
    assert!(
        letters[0].error.contains(&format!("delivery {} ", CAP + 1))
            && letters[0].error.contains(&format!("max_attempts({CAP})")),
        "the error names the delivery past the cap, and the cap: {:?}",
        letters[0].error
    );
    assert_eq!(letters[0].origin, Q);
    assert_empty(&app, Q, "after the dead letter").await;
    app.stop().await;
}

/// A mount without a cap never hot-loops: a job that always fails there waits at
/// least [`UNCAPPED_FLOOR`](crate::UNCAPPED_FLOOR) after each failed attempt (1 s after the
/// first, 2 s after the second, ...), whether the mount declares no backoff (`Err` returned)
/// or the handler asks for a shorter `retry_after`. On the paused clock the floor is exact (not
/// run again 1 ms before it, run at it); live, each job is delivered at most twice in 1.5 s.
pub async fn uncapped_mount_retries_no_faster_than_the_floor<F: Fixture>(fixture: F) {
    use crate::Backoff;
    const Q: &str = "cf_uncapped";
    const Q_AFTER: &str = "cf_uncapped_after";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_with_source).name("fails_with_source"));
            b.include(Subscriber::new(Q_AFTER, retries_after_always).name("retries_after_always"));
        }),
    )
    .await;
    app.publish(job(Q, 1)).await.expect("publish");
    app.publish(job(Q_AFTER, 2)).await.expect("publish");
    app.drain().await;
    let floor = |attempt: u32| crate::UNCAPPED_FLOOR.delay(attempt);
    let ms = Duration::from_millis;
    for n in [1, 2] {
        assert_eq!(
            probe.attempts_of(n),
            [Some(1)],
            "job {n} is not retried at once: {:?}",
            app.records()
        );
    }
    if fixture.paused() {
        assert_floor_exact(&app, &probe).await;
    } else {
        app.advance(ms(1500)).await;
        for n in [1, 2] {
            let runs = probe.attempts_of(n).len();
            assert!(
                (1..=2).contains(&runs),
                "job {n} delivered {runs} times in 1.5 s on a mount without a cap: {:?}",
                probe.attempts_of(n)
            );
        }
    }
    for subscriber in ["fails_with_source", "retries_after_always"] {
        let got = outcomes(&app, subscriber);
        assert!(!got.is_empty(), "{subscriber} ran");
        for (attempt, outcome) in &got {
            assert!(
                matches!(outcome, Outcome::Retried { delay, .. } if *delay == floor(*attempt)),
                "{subscriber}: failed attempt {attempt} waits the floor {:?}: {got:?}",
                floor(*attempt)
            );
        }
    }
    for q in [Q, Q_AFTER] {
        let stats = app.stats(q).await;
        assert_eq!(
            (stats.ready, stats.delayed),
            (0, 1),
            "`{q}`: the job waits, delayed, and is not lost: {stats:?}"
        );
    }
    app.stop().await;
}

/// On the paused clock, jobs 1 and 2 of [`uncapped_mount_retries_no_faster_than_the_floor`]
/// (each failed once) run again exactly at the floor: not 1 ms before 1 s, at 1 s, not 1 ms
/// before 2 s more, at 2 s more.
async fn assert_floor_exact(app: &crate::testing::TestApp, probe: &Probe) {
    use crate::Backoff;
    let floor = |attempt: u32| crate::UNCAPPED_FLOOR.delay(attempt);
    let ms = Duration::from_millis;
    app.advance(floor(1) - ms(1)).await;
    for n in [1, 2] {
        assert_eq!(probe.attempts_of(n), [Some(1)], "job {n}: not before 1 s");
    }
    app.advance(ms(1)).await;
    for n in [1, 2] {
        assert_eq!(probe.attempts_of(n), [Some(1), Some(2)], "job {n}: at 1 s");
    }
    app.advance(floor(2) - ms(1)).await;
    for n in [1, 2] {
        assert_eq!(
            probe.attempts_of(n),
            [Some(1), Some(2)],
            "job {n}: not before 2 s more"
        );
    }
    app.advance(ms(1)).await;
    for n in [1, 2] {
        assert_eq!(
            probe.attempts_of(n),
            [Some(1), Some(2), Some(3)],
            "job {n}: at 2 s more"
        );
    }
}

/// "A row that cannot be claimed is dead-lettered alone": a stored job the broker cannot read
/// (see [`Fixture::store_unreadable_job`]) published before 20 good ones goes to the queue's
/// dead letter by itself, with an error naming the field that holds the bad value; every good
/// job runs once, on its first attempt; no claim fails and the queue ends empty. A backend
/// whose fixture stores no unreadable job passes without checking anything.
pub async fn a_job_that_cannot_be_read_is_dead_lettered_alone<F: Fixture>(fixture: F) {
    const Q: &str = "cf_unreadable";
    const GOOD: u64 = 20;
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let Some(field) = fixture.store_unreadable_job(&direct, Q).await else {
        return;
    };
    for n in 1..=GOOD {
        let (queue, envelope, at) = job(Q, n).into_parts(direct.clock().now());
        direct
            .publish(&queue, vec![(envelope, at)])
            .await
            .expect("publish");
    }
    let dl = broker.default_dead_letter(Q);
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

    for n in 1..=GOOD {
        assert_eq!(
            probe.attempts_of(n),
            [Some(1)],
            "good job {n} runs once; records: {:?}",
            app.records()
        );
    }
    assert_eq!(probe.runs(), GOOD as usize, "only the good jobs ran");
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "the unreadable job alone: {letters:?}");
    let d = &letters[0];
    assert!(
        d.error.contains(&field),
        "the error names `{field}`: {}",
        d.error
    );
    assert_eq!(d.origin, Q, "{d:?}");
    assert_empty(&app, Q, "after the unreadable job was dead-lettered").await;
    for q in app.health().queues {
        assert_eq!(q.failed_claims_total, 0, "no claim failed: {q:?}");
    }
    app.stop().await;
}

/// A dead letter reports the attempts its job spent: after `N` failed deliveries under
/// `max_attempts(N)`, the dead letter's `attempts` and its envelope's attempt are `N` (not the
/// next delivery's number), and a subscriber that reads the dead letter (mounted on it, as seed
/// 002's `review`) sees `N` on its first delivery of it.
pub async fn dead_letter_reports_attempts_spent<F: Fixture>(fixture: F) {
    const Q: &str = "cf_dead_spent";
    const CAP: u32 = 4;
    let failing = Probe::new();
    let broker = fixture.broker().await;
    let same = broker.clone();
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&failing).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_with_source).name("fails_with_source"))
                .max_attempts(crate::nonzero!(CAP))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let id = app.publish(job(Q, 11)).await.expect("publish").into_id();
    app.drain().await;
    assert_eq!(
        failing.attempts(),
        (1..=CAP).map(Some).collect::<Vec<_>>(),
        "the job runs {CAP} times; records {:?}",
        app.records()
    );
    let letters = app.dead_letters(&dl).await;
    assert_eq!(letters.len(), 1, "one dead letter: {letters:?}");
    assert_eq!(letters[0].envelope.id(), &id);
    assert_eq!(
        letters[0].attempts, CAP,
        "the dead letter reports the attempts spent: {:?}",
        letters[0]
    );
    assert_eq!(
        letters[0].envelope.attempt(),
        CAP,
        "its envelope too: {:?}",
        letters[0]
    );
    app.stop().await;

    // The dead letter's reader, on the same backend.
    let reader = Probe::new();
    let app = start(
        &fixture,
        service(&reader).with_broker(same, |b| {
            b.include(Subscriber::new(dl.clone(), acks).name("reads_dead_letters"));
        }),
    )
    .await;
    app.drain().await;
    eventually("the dead letter's reader ran", || reader.runs() == 1).await;
    assert_eq!(
        reader.attempts_of(11),
        [Some(CAP)],
        "the reader's first delivery of the dead letter sees the attempts spent; records {:?}",
        app.records()
    );
    app.stop().await;
}
