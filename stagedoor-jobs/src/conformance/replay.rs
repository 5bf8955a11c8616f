//! Dead letters after the fact: listing (newest first, by kind, by id, up to a limit), replay
//! by id and by kind, purge, and a replay that skips a letter whose job is already back in its
//! queue.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::fixture::Fixture;
use super::support::{
    Probe, assert_empty, connected, fails_until_healed, job, numbers, service, start,
};
use crate::broker::DeadLetters;
use crate::broker::{Broker, DeadSelector, Inspect, Publish, QueueStats, ReplayReport};
use crate::testing::{Outcome, TestApp};
use crate::{JobId, Subscriber};

/// The kinds of the five jobs [`letters`] dead-letters, message `n` at index `n - 1`.
const KINDS: [&str; 5] = ["alpha", "beta", "beta", "alpha", "gamma"];

/// A running service whose dead letter holds five jobs, failed in the order 1..=5 with the
/// kinds of [`KINDS`].
struct Letters<B> {
    app: TestApp,
    direct: B,
    probe: Arc<Probe>,
    queue: &'static str,
    dl: String,
    /// The job ids, message `n` at index `n - 1`.
    ids: Vec<JobId>,
}

async fn letters<F: Fixture>(fixture: &F, queue: &'static str) -> Letters<F::Broker> {
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(queue);
    let app = start(
        fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(queue, fails_until_healed).name("fails_until_healed"))
                .max_attempts(crate::nonzero!(1u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let mut ids = Vec::new();
    for (n, kind) in (1..).zip(KINDS) {
        ids.push(
            app.publish(job(queue, n).kind(kind))
                .await
                .expect("publish")
                .into_id(),
        );
        app.drain().await;
        // Apart in time, so that "newest first" is well defined on every backend.
        app.advance(Duration::from_millis(20)).await;
    }
    let listed = app.dead_letters(&dl).await;
    assert_eq!(
        listed.len(),
        5,
        "five dead letters: {listed:?}; records: {:?}",
        app.records()
    );
    Letters {
        app,
        direct,
        probe,
        queue,
        dl,
        ids,
    }
}

/// Dead letters are listed newest first, each with its origin and attempts; by kind, by id
/// (the dead letter's or the job's) and up to a limit.
pub async fn dead_letters_are_listed_newest_first_and_by_kind<F: Fixture>(fixture: F) {
    let l = letters(&fixture, "cf_dead_list").await;
    let all = l.app.dead_letters(&l.dl).await;
    assert_eq!(numbers(&all), [5, 4, 3, 2, 1], "newest first");
    for d in &all {
        let n = numbers(std::slice::from_ref(d))[0];
        assert_eq!(d.envelope.kind(), KINDS[n as usize - 1]);
        assert_eq!(d.envelope.id(), &l.ids[n as usize - 1]);
        assert_eq!(d.origin, l.queue);
        assert_eq!(d.attempts, 1);
    }
    let list = |selector: DeadSelector, limit: usize| {
        let direct = l.direct.clone();
        let dl = l.dl.clone();
        async move {
            numbers(
                &direct
                    .dead_letters(&dl, &selector, limit)
                    .await
                    .expect("dead_letters"),
            )
        }
    };
    assert_eq!(list(DeadSelector::Kind("alpha".into()), 10).await, [4, 1]);
    assert_eq!(list(DeadSelector::Kind("beta".into()), 10).await, [3, 2]);
    assert_eq!(
        list(DeadSelector::Kind("delta".into()), 10).await,
        [0u64; 0]
    );
    assert_eq!(
        list(DeadSelector::All, 2).await,
        [5, 4],
        "newest first, limited"
    );
    assert_eq!(
        list(DeadSelector::Id(l.ids[2].to_string()), 10).await,
        [3],
        "by job id"
    );
    let third = all
        .iter()
        .find(|d| d.envelope.id() == &l.ids[2])
        .expect("listed");
    assert_eq!(
        list(DeadSelector::Id(third.id.clone()), 10).await,
        [3],
        "by dead-letter id"
    );
    assert_eq!(l.direct.dead_len(&l.dl).await.expect("dead_len"), 5);
    let oldest = l
        .direct
        .oldest_dead_letter(&l.dl)
        .await
        .expect("oldest_dead_letter");
    assert_eq!(
        numbers(oldest.as_slice()),
        [1],
        "the oldest dead letter is the one listed last"
    );
    l.app.stop().await;
}

/// Replay by id: the job goes back to its queue with its attempts reset (it runs with attempt
/// 1, keeping its id) and leaves the dead letter; the other letters stay.
pub async fn dead_letter_replay_by_id_resets_the_attempts<F: Fixture>(fixture: F) {
    let l = letters(&fixture, "cf_dead_replay_id").await;
    let all = l.app.dead_letters(&l.dl).await;
    let first = all
        .iter()
        .find(|d| d.envelope.id() == &l.ids[0])
        .expect("job 1 is dead-lettered");
    l.probe.healed.store(true, Ordering::SeqCst);
    let report = l
        .app
        .replay(&l.dl, DeadSelector::Id(first.id.clone()))
        .await;
    assert_eq!(
        report,
        ReplayReport {
            replayed: 1,
            ..ReplayReport::default()
        }
    );
    assert_eq!(
        numbers(&l.app.dead_letters(&l.dl).await),
        [5, 4, 3, 2],
        "the replayed job left the dead letter; the others stay"
    );
    l.app.drain().await;

    assert_eq!(
        l.probe.attempts_of(1),
        [Some(1), Some(1)],
        "the replayed job runs with attempt 1"
    );
    let last = l
        .app
        .outcomes("fails_until_healed")
        .pop()
        .expect("a record");
    assert_eq!(last.job_id, l.ids[0], "the replayed job keeps its id");
    assert_eq!((last.attempt, last.outcome), (1, Outcome::Acked));
    assert_eq!(l.probe.runs(), 6, "nothing else ran");
    assert_empty(&l.app, l.queue, "after the replayed job ran").await;
    assert_eq!(l.direct.dead_len(&l.dl).await.expect("dead_len"), 4);
    l.app.stop().await;
}

/// Replay by kind: only that kind's letters go back to the queue (and run with attempt 1);
/// the others stay.
pub async fn dead_letter_replay_by_kind_moves_only_that_kind<F: Fixture>(fixture: F) {
    let l = letters(&fixture, "cf_dead_replay_kind").await;
    l.probe.healed.store(true, Ordering::SeqCst);
    let report = l.app.replay(&l.dl, DeadSelector::Kind("beta".into())).await;
    assert_eq!(
        report,
        ReplayReport {
            replayed: 2,
            ..ReplayReport::default()
        }
    );
    assert_eq!(
        numbers(&l.app.dead_letters(&l.dl).await),
        [5, 4, 1],
        "only the beta letters moved"
    );
    l.app.drain().await;

    for n in [2, 3] {
        assert_eq!(
            l.probe.attempts_of(n),
            [Some(1), Some(1)],
            "job {n} ran again with attempt 1"
        );
    }
    for n in [1, 4, 5] {
        assert_eq!(l.probe.attempts_of(n), [Some(1)], "job {n} stayed dead");
    }
    let acked: Vec<JobId> = l
        .app
        .outcomes("fails_until_healed")
        .into_iter()
        .filter(|r| r.outcome == Outcome::Acked)
        .map(|r| r.job_id)
        .collect();
    assert_eq!(acked.len(), 2);
    assert!(acked.contains(&l.ids[1]) && acked.contains(&l.ids[2]));
    assert_empty(&l.app, l.queue, "after the replayed jobs ran").await;
    assert_eq!(l.direct.dead_len(&l.dl).await.expect("dead_len"), 3);
    l.app.stop().await;
}

/// Purge removes the selected dead letters (by id, by kind, all) and returns how many.
pub async fn dead_letter_purge_removes_the_selected<F: Fixture>(fixture: F) {
    let l = letters(&fixture, "cf_dead_purge").await;
    let purged = l
        .app
        .purge(&l.dl, DeadSelector::Id(l.ids[4].to_string()))
        .await;
    assert_eq!(purged, 1);
    assert_eq!(numbers(&l.app.dead_letters(&l.dl).await), [4, 3, 2, 1]);
    assert_eq!(
        l.app.purge(&l.dl, DeadSelector::Kind("beta".into())).await,
        2
    );
    assert_eq!(numbers(&l.app.dead_letters(&l.dl).await), [4, 1]);
    assert_eq!(
        l.app.purge(&l.dl, DeadSelector::Kind("delta".into())).await,
        0,
        "nothing selected, nothing purged"
    );
    assert_eq!(l.app.purge(&l.dl, DeadSelector::All).await, 2);
    assert!(l.app.dead_letters(&l.dl).await.is_empty());
    assert_eq!(l.direct.dead_len(&l.dl).await.expect("dead_len"), 0);
    assert_eq!(l.probe.runs(), 5, "purged jobs do not run");
    assert_empty(&l.app, l.queue, "purging does not touch the queue").await;
    l.app.stop().await;
}

/// A replay or purge of a name that is not a dead letter (a live queue's, as a dashboard URL or
/// a script may hand it) is refused with an error naming the queue's dead letter, and touches
/// none of its jobs: waiting, delayed or running (whose delivery then settles as usual). The
/// service's dead letter is purged as before.
pub async fn replay_and_purge_refuse_a_name_that_is_no_dead_letter<F: Fixture>(fixture: F) {
    const LIVE: &str = "cf_dead_live";
    let l = letters(&fixture, "cf_dead_refuse").await;
    let direct = &l.direct;
    direct.prepare(LIVE).await.expect("prepare");
    let waiting = direct.publish_job(job(LIVE, 1)).await.expect("publish");
    direct
        .publish_job(job(LIVE, 2).after(Duration::from_secs(3600)))
        .await
        .expect("publish delayed");
    let mut claimed = direct
        .claim(
            LIVE,
            1,
            Duration::from_secs(2),
            crate::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1, "the first job is claimed");
    let running = claimed.remove(0);
    let before = direct.stats(LIVE).await.expect("stats");
    assert_eq!((before.pending, before.delayed), (1, 1), "{before:?}");
    let expected_dead = direct.default_dead_letter(LIVE);
    let selectors = [
        DeadSelector::All,
        DeadSelector::Kind(LIVE.to_owned()),
        DeadSelector::Id(waiting.id().to_string()),
        DeadSelector::Id(running.envelope.id().to_string()),
    ];
    for sel in &selectors {
        for (what, result) in [
            (
                "purge",
                direct.purge(LIVE, sel).await.map(|n| n.to_string()),
            ),
            (
                "replay",
                direct.replay(LIVE, sel).await.map(|r| format!("{r:?}")),
            ),
        ] {
            match result {
                Err(crate::BrokerError::Invalid(msg)) => assert!(
                    msg.contains(&format!("`{LIVE}`")) && msg.contains(&expected_dead),
                    "the refusal of a {what} names the queue and its dead letter `{expected_dead}`: {msg}"
                ),
                other => {
                    panic!("a {what} of live queue `{LIVE}` ({sel:?}) is refused, got {other:?}")
                }
            }
        }
    }
    let after = direct.stats(LIVE).await.expect("stats");
    assert_eq!(
        after,
        QueueStats {
            oldest: after.oldest,
            ..before
        },
        "nothing of `{LIVE}` moved"
    );
    let settled = direct
        .settle(LIVE, &running, crate::broker::Settlement::Ack)
        .await
        .expect("settle");
    assert_eq!(
        settled,
        crate::broker::Settled::Done,
        "the running job settles as usual"
    );
    assert_eq!(
        direct
            .purge(&l.dl, &DeadSelector::All)
            .await
            .expect("purge the dead letter"),
        5
    );
    l.app.stop().await;
}

/// Replaying a dead letter whose job id is back in its queue (published again meanwhile) skips
/// it and leaves it where it was, as `ReplayReport::skipped` says.
///
/// Not yet in [`conformance_tests!`](crate::conformance_tests): the in-memory broker removes
/// the letter from the dead letter before it finds the id taken, and then drops it.
pub async fn replay_skips_a_letter_whose_job_is_back_in_its_queue<F: Fixture>(fixture: F) {
    const Q: &str = "cf_replay_taken";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, fails_until_healed).name("fails_until_healed"))
                .max_attempts(crate::nonzero!(1u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let id = JobId::from_string(format!("cf-taken-{}", JobId::new()));
    app.publish(job(Q, 1).id(id.clone()))
        .await
        .expect("publish");
    app.drain().await;
    assert_eq!(app.dead_letters(&dl).await.len(), 1);
    // The same id again, waiting in the queue (far in the future).
    app.publish(job(Q, 2).id(id.clone()).after(Duration::from_secs(3600)))
        .await
        .expect("publish");

    // A backend whose job ids are unique across a table (SQL, where the dead letter is the same
    // row) refuses the second publish instead: then the replay moves the letter back. Either
    // way a job id never has two live copies.
    let waiting = app.stats(Q).await.delayed;
    // Healed first: a replayed job may run before the letters are read again, and must not
    // land back in the dead letter when it does.
    probe.healed.store(true, Ordering::SeqCst);
    let report = app.replay(&dl, DeadSelector::Id(id.to_string())).await;
    if waiting == 1 {
        assert_eq!(
            report,
            ReplayReport {
                skipped: 1,
                ..ReplayReport::default()
            }
        );
        let letters = app.dead_letters(&dl).await;
        assert_eq!(
            numbers(&letters),
            [1],
            "a skipped letter is left where it was"
        );
    } else {
        assert_eq!(waiting, 0, "{:?}", app.stats(Q).await);
        assert_eq!(
            report,
            ReplayReport {
                replayed: 1,
                ..ReplayReport::default()
            }
        );
        assert!(app.dead_letters(&dl).await.is_empty());
    }
    app.stop().await;
}
