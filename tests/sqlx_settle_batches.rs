//! Settlements of the SQL backend are applied in batches (acknowledgements, retries and dead
//! letters queued together, one transaction): each reply still tells about its own row, each
//! row stays fenced on its lease, and two settlements of one row (a delivery that lost its
//! lease and the one that took the row over) in one batch are told apart. On SQLite and
//! Postgres; Postgres reads `DATABASE_URL` (under `scripts/test-all` a missing URL is a failure; a plain
//! `cargo test` without it lists the test as ignored).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{ConfRow, Db, conf_ddl, on_both};
use serde::{Deserialize, Serialize};
use stagedoor_jobs::broker::{Delivery, Inspect, Publish, Settled, Settlement};
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{Broker, DeadLetters, Failure, FailureCause};

const Q: &str = "batch";

#[derive(Serialize, Deserialize)]
struct Msg {
    n: u64,
}

fn n_of<R>(d: &Delivery<R>) -> u64 {
    serde_json::from_slice::<Msg>(d.envelope.payload())
        .expect("a Msg")
        .n
}

fn failure(n: u64) -> Failure {
    Failure::new(FailureCause::Error, format!("boom {n}"), "at batch.rs:1")
}

/// Twelve rows settled all at once: two taken over by another delivery after their lease ran
/// out (the stale deliveries retry, the new ones acknowledge), four acknowledged, four retried
/// (two at once, two in an hour), two dead-lettered.
async fn mixed_settlements_in_one_batch_answer_each_row<D: Db>() {
    let db = D::fresh("batches", conf_ddl::<D>()).await;
    // A short lease, never renewed here: its rows can be taken over.
    let short = D::route::<ConfRow>(&db.broker().lease(Duration::from_millis(300)), Q);
    let route = D::route::<ConfRow>(&db.broker(), Q);
    short.connect().await.expect("connect");
    for n in 0..2 {
        D::publish(&route, Job::new(Q, &Msg { n }).expect("a Msg")).await;
    }
    let stale = short
        .claim(
            Q,
            2,
            Duration::from_secs(2),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(stale.len(), 2);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let fresh = route
        .claim(
            Q,
            2,
            Duration::from_secs(2),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim again");
    assert_eq!(
        fresh.len(),
        2,
        "the rows whose lease ran out are claimed again"
    );
    for n in 2..12 {
        D::publish(&route, Job::new(Q, &Msg { n }).expect("a Msg")).await;
    }
    let mut rest = Vec::new();
    while rest.len() < 10 {
        let got = route
            .claim(
                Q,
                10 - rest.len(),
                Duration::from_secs(2),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim");
        assert!(!got.is_empty(), "the other ten rows are claimed");
        rest.extend(got);
    }

    // Every settlement at once, so that they queue together.
    let dead = route.default_dead_letter(Q);
    let mut tasks = tokio::task::JoinSet::new();
    let mut expect: HashMap<(u64, &'static str), Settled> = HashMap::new();
    let jobs = stale
        .into_iter()
        .map(|d| (d, "stale"))
        .chain(fresh.into_iter().map(|d| (d, "fresh")))
        .chain(rest.into_iter().map(|d| (d, "rest")));
    for (d, who) in jobs {
        let n = n_of(&d);
        let settlement = match (who, n) {
            ("stale", _) => Settlement::Retry {
                delay: Duration::ZERO,
                failure: failure(n),
            },
            ("fresh", _) | (_, 2..=5) => Settlement::Ack,
            (_, 6 | 7) => Settlement::Retry {
                delay: Duration::ZERO,
                failure: failure(n),
            },
            (_, 8 | 9) => Settlement::Retry {
                delay: Duration::from_secs(3600),
                failure: failure(n),
            },
            _ => Settlement::DeadLetter {
                target: dead.clone(),
                failure: failure(n),
            },
        };
        expect.insert(
            (n, who),
            if who == "stale" {
                Settled::LeaseLost
            } else {
                Settled::Done
            },
        );
        let r = route.clone();
        tasks.spawn(async move { ((n, who), r.settle(Q, &d, settlement).await) });
    }
    let mut got = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        let (key, answer) = done.expect("a settle task");
        got.insert(key, answer.expect("the settlement succeeds"));
    }
    assert_eq!(got, expect, "each reply tells about its own row");

    // The rows as the settlements left them.
    let rows = db
        .rows("SELECT payload, queue, locked_until, last_error, attempt FROM conf_jobs".to_owned())
        .await;
    let mut left: HashMap<u64, (String, bool, Option<String>, i64)> = HashMap::new();
    for r in rows {
        let n = serde_json::from_slice::<Msg>(&r[0].bytes())
            .expect("a Msg")
            .n;
        left.insert(
            n,
            (
                r[1].text().expect("a queue"),
                r[2].is_null(),
                r[3].text(),
                r[4].int(),
            ),
        );
    }
    let mut ns: Vec<u64> = left.keys().copied().collect();
    ns.sort_unstable();
    assert_eq!(
        ns,
        [6, 7, 8, 9, 10, 11],
        "acknowledged rows are deleted (the taken-over ones by their new delivery)"
    );
    for n in 6..10 {
        let (queue, unleased, error, _) = &left[&n];
        assert_eq!(
            (queue.as_str(), *unleased, error.clone()),
            (Q, true, Some(format!("boom {n}"))),
            "row {n} is released with its error"
        );
    }
    for n in 10..12 {
        let (queue, unleased, error, attempt) = &left[&n];
        assert_eq!(
            (queue.as_str(), *unleased, error.as_deref(), *attempt),
            (dead.as_str(), true, Some(format!("boom {n}").as_str()), 1),
            "row {n} is dead-lettered, with the attempts it spent"
        );
    }
    assert_eq!(route.dead_len(&dead).await.expect("dead_len"), 2);
    // The retries at once are due now, those in an hour are not.
    let again = route
        .claim(
            Q,
            10,
            Duration::from_millis(500),
            stagedoor_jobs::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    let mut again: Vec<u64> = again.iter().map(n_of).collect();
    again.sort_unstable();
    assert_eq!(again, [6, 7], "only the retries at once are due");
    let stats = route.stats(Q).await.expect("stats");
    assert_eq!(stats.delayed, 2, "the retries in an hour wait: {stats:?}");
}

/// Many retries at once (more than one batch holds) each come back Done, and each row is due
/// again with its own error.
async fn many_retries_at_once<D: Db>() {
    const N: u64 = 300;
    let db = D::fresh("batches_many", conf_ddl::<D>()).await;
    let route = D::route::<ConfRow>(&db.broker(), Q);
    route.connect().await.expect("connect");
    let jobs: Vec<Job> = (0..N)
        .map(|n| Job::new(Q, &Msg { n }).expect("a Msg"))
        .collect();
    route.publish_jobs(jobs).await.expect("publish");
    let mut claimed = Vec::new();
    while (claimed.len() as u64) < N {
        let got = route
            .claim(
                Q,
                100,
                Duration::from_secs(2),
                stagedoor_jobs::broker::ClaimOrder::Priority,
            )
            .await
            .expect("claim");
        assert!(!got.is_empty());
        claimed.extend(got);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for d in claimed {
        let r = route.clone();
        tasks.spawn(async move {
            let n = n_of(&d);
            let s = Settlement::Retry {
                delay: Duration::ZERO,
                failure: failure(n),
            };
            r.settle(Q, &d, s).await
        });
    }
    while let Some(done) = tasks.join_next().await {
        assert_eq!(
            done.expect("a settle task").expect("the retry succeeds"),
            Settled::Done
        );
    }
    let rows = db
        .rows("SELECT payload, last_error, locked_until FROM conf_jobs".to_owned())
        .await;
    assert_eq!(rows.len() as u64, N);
    for r in rows {
        let n = serde_json::from_slice::<Msg>(&r[0].bytes())
            .expect("a Msg")
            .n;
        assert_eq!(
            r[1].text(),
            Some(format!("boom {n}")),
            "row {n}'s own error"
        );
        assert!(r[2].is_null(), "row {n} is released");
    }
}

on_both!(
    mixed_settlements_in_one_batch_answer_each_row,
    many_retries_at_once
);
