//! Priorities ([`Job::priority`](crate::Job::priority)): of the due jobs, the highest
//! priority is claimed first, in due order among equals; a job keeps its level through a
//! delay, a retry and a dead letter's replay; and every [`FAIR_CLAIM_EVERY`]th claim takes
//! the job that waited longest, so no level starves.

use std::time::Duration;

use super::fixture::Fixture;
use super::support::*;
use crate::broker::{
    Broker, Cancelled, DeadLetters, DeadSelector, Delivery, FairTurn, Inspect, Publish, Settlement,
};
use crate::{FAIR_CLAIM_EVERY, Failure, FailureCause, Priority};

/// Claims one job (waiting up to [`PATIENCE`] for one) in the order `turn` gives, as the
/// runtime does, and counts it there; returns its number, priority and delivery.
async fn claim_one<B: Broker>(
    direct: &B,
    queue: &str,
    turn: &FairTurn,
) -> (u64, Priority, Delivery<B::Receipt>) {
    let mut got = direct
        .claim(queue, 1, PATIENCE, turn.order())
        .await
        .expect("claim");
    turn.claimed(got.len());
    assert_eq!(got.len(), 1, "one job is claimed");
    let d = got.remove(0);
    let msg: Msg = serde_json::from_slice(d.envelope.payload()).expect("a Msg");
    (msg.n, d.envelope.priority(), d)
}

async fn ack<B: Broker>(direct: &B, queue: &str, d: &Delivery<B::Receipt>) {
    direct
        .settle(queue, d, Settlement::Ack)
        .await
        .expect("settle");
}

/// Jobs published in mixed priorities are claimed highest first, in publish order among
/// equals; each delivery carries the priority it was published with. A delayed job joins its
/// level when due; a retried job and a dead letter's replay come back at their level.
pub async fn priority_claims_higher_first_and_fifo_among_equals<F: Fixture>(fixture: F) {
    const Q: &str = "cf_priority_order";
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    direct.prepare(Q).await.expect("prepare");
    let levels = [
        (1, Priority::NORMAL),
        (2, Priority::LOW),
        (3, Priority::HIGHEST),
        (4, Priority::NORMAL),
        (5, Priority::HIGH),
        (6, Priority::LOWEST),
        (7, Priority::HIGHEST),
    ];
    for (n, p) in levels {
        direct
            .publish_job(job(Q, n).priority(p))
            .await
            .expect("publish");
    }
    // One more, cancelled before any claim: found at its level and removed.
    let cancelled = direct
        .publish_job(job(Q, 8).priority(Priority::HIGH))
        .await
        .expect("publish");
    let stats = direct.stats(Q).await.expect("stats");
    assert_eq!(stats.ready, 8, "every level counts: {stats:?}");
    assert_eq!(
        direct.cancel(Q, cancelled.id()).await.expect("cancel"),
        Cancelled::Removed,
        "a job waiting at a level other than normal is cancelled"
    );
    let queues = direct.queues().await.expect("queues");
    assert!(
        !queues.iter().any(|q| q.starts_with(&format!("{Q}:p"))),
        "the levels are not queues of their own: {queues:?}"
    );
    let mut order = Vec::new();
    let turn = FairTurn::default();
    for _ in 0..levels.len() {
        let (n, p, d) = claim_one(&direct, Q, &turn).await;
        let published = levels.iter().find(|l| l.0 == n).expect("a published job").1;
        assert_eq!(p, published, "job {n} is delivered with its priority");
        order.push(n);
        ack(&direct, Q, &d).await;
    }
    assert_eq!(
        order,
        [3, 7, 5, 1, 4, 2, 6],
        "highest first, publish order among equals"
    );

    assert_empty_direct(&direct, Q, "after the priorities").await;
    level_kept_through_delay_retry_and_replay(&broker, &direct, &format!("{Q}_kept")).await;
}

/// On queue `kept` (its claims counted afresh: none of these is the fair one), a delayed
/// high job, due after two normal ones are published: once due, it goes first; retried at
/// once, and replayed from its dead letter, it comes back at its level, ahead of them.
async fn level_kept_through_delay_retry_and_replay<B: Broker>(broker: &B, direct: &B, kept: &str) {
    let (q, dead) = (kept, broker.default_dead_letter(kept));
    let turn = FairTurn::default();
    direct.prepare(q).await.expect("prepare");
    direct
        .publish_job(job(q, 10).priority(Priority::HIGH).after(DELAY))
        .await
        .expect("publish");
    direct.publish_job(job(q, 11)).await.expect("publish");
    direct.publish_job(job(q, 12)).await.expect("publish");
    tokio::time::sleep(DELAY + MARGIN).await;
    let (n, p, d) = claim_one(direct, q, &turn).await;
    assert_eq!(
        (n, p),
        (10, Priority::HIGH),
        "the delayed job, once due, is claimed before the normal ones"
    );
    // Retried at once: back at its level, ahead of the normal jobs still waiting.
    let failure = Failure::new(FailureCause::Error, "again", "");
    direct
        .settle(
            q,
            &d,
            Settlement::Retry {
                delay: Duration::ZERO,
                failure: failure.clone(),
            },
        )
        .await
        .expect("settle");
    let (n, p, d) = claim_one(direct, q, &turn).await;
    assert_eq!(
        (n, p, d.envelope.attempt()),
        (10, Priority::HIGH, 2),
        "the retry is claimed first, at its level"
    );
    // Dead-lettered, then replayed: back at its level, ahead of the normal jobs.
    direct
        .settle(
            q,
            &d,
            Settlement::DeadLetter {
                target: dead.clone(),
                failure,
            },
        )
        .await
        .expect("settle");
    let report = direct
        .replay(&dead, &DeadSelector::Id(d.envelope.id().to_string()))
        .await
        .expect("replay");
    assert_eq!(report.replayed, 1, "{report:?}");
    let (n, p, d) = claim_one(direct, q, &turn).await;
    assert_eq!(
        (n, p),
        (10, Priority::HIGH),
        "the replayed job is claimed first, at its level"
    );
    ack(direct, q, &d).await;
    for want in [11, 12] {
        let (n, p, d) = claim_one(direct, q, &turn).await;
        assert_eq!((n, p), (want, Priority::NORMAL));
        ack(direct, q, &d).await;
    }
    assert_empty_direct(direct, q, "after the delay, the retry and the replay").await;
}

/// Two low jobs published before a flood of high ones are not starved: the older (at the
/// higher of the two low levels) is taken by one of the first [`FAIR_CLAIM_EVERY`] claims (one
/// at a time), the other by one of the first two × that, though the first claim takes a high
/// one: a fair claim takes the job that waited longest, not the lowest level's.
pub async fn no_priority_starves_under_a_flood_of_higher_ones<F: Fixture>(fixture: F) {
    const Q: &str = "cf_priority_fair";
    let direct = connected(&fixture.broker().await).await;
    direct.prepare(Q).await.expect("prepare");
    const OLDER: u64 = 1_000;
    const LOWEST: u64 = 1_001;
    direct
        .publish_job(job(Q, OLDER).priority(Priority::LOW))
        .await
        .expect("publish");
    direct
        .publish_job(job(Q, LOWEST).priority(Priority::LOWEST))
        .await
        .expect("publish");
    let flood = 2 * FAIR_CLAIM_EVERY;
    for n in 1..=flood {
        direct
            .publish_job(job(Q, n).priority(Priority::HIGHEST))
            .await
            .expect("publish");
    }
    let (mut older_at, mut lowest_at) = (None, None);
    let turn = FairTurn::default();
    for claim in 1..=flood + 2 {
        let (n, _, d) = claim_one(&direct, Q, &turn).await;
        ack(&direct, Q, &d).await;
        match n {
            OLDER => older_at = Some(claim),
            LOWEST => lowest_at = Some(claim),
            _ => {}
        }
        if claim == 1 {
            assert!(n <= flood, "the first claim takes a high job, not {n}");
        }
    }
    let older_at = older_at.expect("the older low job is claimed");
    let lowest_at = lowest_at.expect("the lowest job is claimed");
    assert!(
        older_at <= FAIR_CLAIM_EVERY,
        "the older low job is claimed within {FAIR_CLAIM_EVERY} claims, not at claim {older_at}"
    );
    assert!(
        lowest_at <= 2 * FAIR_CLAIM_EVERY && older_at < lowest_at,
        "the lowest job is claimed after the older one ({older_at}), within {} claims, not at claim {lowest_at}",
        2 * FAIR_CLAIM_EVERY
    );
    assert_empty_direct(&direct, Q, "after the flood").await;
}
