//! The claim's own read connection on a standalone server (`read_conn.rs` of
//! stagedoor-jobs-redis, which reads `XREADGROUP` replies without redis-rs): it logs in as the
//! URL's user, reads the URL's database, and a connection killed between claims or during a
//! blocked read is opened again at the next claim, with nothing lost or read twice; a password
//! changed under it answers an error that says so.
//!
//! The server is `REDIS_URL` (under `scripts/test-all`); the test makes an ACL user of its own
//! and kills only that user's connections (`CLIENT KILL USER`), so the tests running beside it
//! are untouched.

#[allow(dead_code)]
mod common_redis;

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::Utc;
use common_redis::env_url;
use redis::{Value, cmd};
use stagedoor_jobs::Envelope;
use stagedoor_jobs::broker::{Broker, ClaimOrder, Delivery, Inspect, Settled, Settlement};
use stagedoor_jobs_redis::{RedisBroker, RedisReceipt};

const QUEUE: &str = "reads";
const DB: u8 = 7;

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("a URL")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

async fn q<T: redis::FromRedisValue>(
    c: &mut redis::aio::MultiplexedConnection,
    c2: &redis::Cmd,
) -> T {
    c2.query_async(c)
        .await
        .unwrap_or_else(|e| panic!("{c2:?}: {e}"))
}

/// Claims until `n` deliveries came, for up to 10 s; a failed claim (a killed connection) is
/// tried again, and the failures are returned too.
async fn claim_n(b: &RedisBroker, n: usize) -> (Vec<Delivery<RedisReceipt>>, Vec<String>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let (mut out, mut errors) = (Vec::new(), Vec::new());
    while out.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} claimed; errors: {errors:?}",
            out.len()
        );
        match b
            .claim(
                QUEUE,
                n - out.len(),
                Duration::from_millis(200),
                ClaimOrder::Priority,
            )
            .await
        {
            Ok(got) => out.extend(got.deliveries),
            Err(e) => {
                errors.push(e.to_string());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    (out, errors)
}

/// Acknowledges `d`, tried again while the broker's shared connection (killed with the
/// claim's) comes back, as the runtime does.
async fn ack(b: &RedisBroker, d: &Delivery<RedisReceipt>) -> Settled {
    let mut last = None;
    for _ in 0..40 {
        match b.settle(QUEUE, d, Settlement::Ack).await {
            Ok(s) => return s,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the acknowledgement never went through: {last:?}")
}

fn ids(ds: &[Delivery<RedisReceipt>]) -> BTreeSet<String> {
    ds.iter().map(|d| d.envelope.id().to_string()).collect()
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_own_connection_logs_in_reads_its_database_and_comes_back_after_a_kill() {
    let base = env_url("REDIS_URL");
    let ns = common_redis::fresh_namespace("reads");
    let user = format!("reader-{}", ns.trim_end_matches(':'));
    let mut admin = raw(&base).await;
    let _: Value = q(
        &mut admin,
        cmd("ACL")
            .arg("SETUSER")
            .arg(&user)
            .arg("on")
            .arg(">s3cret")
            .arg("~*")
            .arg("&*")
            .arg("+@all"),
    )
    .await;
    let hostport = base
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let url = format!("redis://{user}:s3cret@{hostport}/{DB}");
    let broker = RedisBroker::from_url(&url)
        .namespace(&ns)
        .lease(Duration::from_millis(500));
    broker.connect().await.expect("connect as the user");
    broker.prepare(QUEUE).await.expect("prepare");
    let mut published = BTreeSet::new();
    for i in 0..4 {
        let e = Envelope::new("read", format!("{{\"n\":{i}}}").into_bytes(), Utc::now());
        published.insert(e.id().to_string());
        broker
            .publish(QUEUE, vec![(e, None)])
            .await
            .expect("publish");
    }

    // The URL's database holds the queue, and the claim reads it there.
    let stream = format!("{{{ns}{QUEUE}}}");
    let mut in_db = raw(&format!("redis://{hostport}/{DB}")).await;
    let len: u64 = q(&mut in_db, cmd("XLEN").arg(&stream)).await;
    assert_eq!(len, 4, "the jobs are in database {DB}");
    let in_zero: u64 = q(&mut admin, cmd("EXISTS").arg(&stream)).await;
    assert_eq!(in_zero, 0, "nothing of the queue in database 0");
    let (first, errors) = claim_n(&broker, 2).await;
    assert!(errors.is_empty(), "{errors:?}");

    // Killed between claims: the next claim opens it again (a claim may fail on the dead one).
    let _: Value = q(&mut admin, cmd("CLIENT").arg("KILL").arg("USER").arg(&user)).await;
    let (rest, _) = claim_n(&broker, 2).await;
    let mut all = ids(&first);
    all.extend(ids(&rest));
    assert_eq!(all, published, "every job claimed once");
    for d in first.iter().chain(&rest) {
        assert_eq!(ack(&broker, d).await, Settled::Done);
    }

    // Killed while blocked on an empty queue: the read ends with an error at once instead of
    // waiting out its block, and the next claim reads what came meanwhile.
    let b2 = broker.clone();
    let blocked = tokio::spawn(async move {
        let t = tokio::time::Instant::now();
        let r = b2
            .claim(QUEUE, 1, Duration::from_secs(8), ClaimOrder::Priority)
            .await;
        (r.map(|c| c.deliveries.len()), t.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _: Value = q(&mut admin, cmd("CLIENT").arg("KILL").arg("USER").arg(&user)).await;
    let (r, took) = blocked.await.expect("the claim task");
    assert!(
        took < Duration::from_secs(5),
        "a killed read ended after {took:?}: {r:?}"
    );
    assert!(
        matches!(r, Err(_) | Ok(0)),
        "a killed read returned entries: {r:?}"
    );
    let late = Envelope::new("read", b"{}".to_vec(), Utc::now());
    let late_id = late.id().to_string();
    // (The broker's shared connection, killed too, comes back at its next command.)
    let mut stored = false;
    for _ in 0..40 {
        if broker
            .publish(QUEUE, vec![(late.clone(), None)])
            .await
            .is_ok()
        {
            stored = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stored, "the late job was published");
    let (got, _) = claim_n(&broker, 1).await;
    assert_eq!(ids(&got), BTreeSet::from([late_id]));
    assert_eq!(ack(&broker, &got[0]).await, Settled::Done);

    // The password changed: the claim's error says the server refused the login.
    let _: Value = q(
        &mut admin,
        cmd("ACL")
            .arg("SETUSER")
            .arg(&user)
            .arg("resetpass")
            .arg(">changed"),
    )
    .await;
    let _: Value = q(&mut admin, cmd("CLIENT").arg("KILL").arg("USER").arg(&user)).await;
    // (The first claim may meet the killed connection; the next ones log in again.)
    let mut errors = Vec::new();
    for _ in 0..20 {
        if let Err(e) = broker
            .claim(QUEUE, 1, Duration::from_millis(100), ClaimOrder::Priority)
            .await
        {
            errors.push(e.to_string());
        }
    }
    let refused = errors
        .iter()
        .find(|e| e.contains("WRONGPASS"))
        .unwrap_or_else(|| panic!("no claim said the login was refused: {errors:?}"));
    assert!(
        refused.contains(&format!("refused the login of user `{user}`"))
            && refused.contains(&hostport)
            && refused.contains("check the user and password of the URL")
            && !refused.contains("s3cret")
            && !refused.contains("changed"),
        "{refused}"
    );
    let _: Value = q(&mut admin, cmd("ACL").arg("DELUSER").arg(&user)).await;
    let _: Value = q(&mut in_db, cmd("DEL").arg(&stream)).await;
}
