//! Records ([`Records`]) on Redis (`REDIS_URL`) and on a Redis Cluster (`REDIS_CLUSTER_URLS`)
//! whose keys were written by hand with what the library never writes there:
//!
//! - a string, a hash without `version`, a hash whose `version` is not a number (or is `0`),
//!   a hash without `value`: reading or writing the record fails with `BrokerError::Malformed`
//!   naming the record, its Redis key and the fix (no panic); a call that writes it and other
//!   records writes none of them, and the junk stays as it was;
//! - the other records of the namespace read and write as ever, and once the junk key is
//!   deleted (the fix the error names) the record is written again from version 1;
//! - every record of a broker is in one hash slot (one tag), whatever its key holds.
//!
//! A missing variable fails the test under `scripts/test-all`; a plain `cargo test`
//! without it lists the test as ignored.

mod common_redis;

use common_redis::{Raw, cluster_urls, env_url, fresh_namespace};
use redis::{Cmd, cmd};
use stagedoor_jobs::broker::{BrokerError, Inspect, RecordWrite, Records};
use stagedoor_jobs_redis::RedisBroker;

#[derive(Clone, Copy, Debug)]
enum On {
    Standalone,
    Cluster,
}

/// A connected broker in a namespace of its own, and a plain connection to edit its keys.
async fn setup(on: On) -> (RedisBroker, Raw) {
    let ns = fresh_namespace("rec");
    let (broker, raw) = match on {
        On::Standalone => {
            let url = env_url("REDIS_URL");
            let client = redis::Client::open(url.as_str()).expect("REDIS_URL");
            let raw = client
                .get_multiplexed_async_connection()
                .await
                .expect("connect to REDIS_URL");
            (RedisBroker::from_url(url), Raw::Single(raw))
        }
        On::Cluster => {
            let client = redis::cluster::ClusterClient::new(cluster_urls()).expect("cluster URLs");
            let raw = client
                .get_async_connection()
                .await
                .expect("connect to the cluster");
            (RedisBroker::cluster(cluster_urls()), Raw::Cluster(raw))
        }
    };
    let broker = broker.namespace(ns);
    broker.connect().await.expect("connect the broker");
    (broker, raw)
}

async fn q<T: redis::FromRedisValue>(raw: &Raw, c: &Cmd) -> T {
    let mut conn = raw.clone();
    c.query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{c:?}: {e}"))
}

/// Asserts `e` is the malformed-record error for `key` at `rkey`, naming the fix and `what`.
fn assert_names_the_key(e: &BrokerError, key: &str, rkey: &str, what: &str) {
    let text = e.to_string();
    assert!(matches!(e, BrokerError::Malformed { .. }), "{e:?}");
    assert!(text.contains(&format!("the record `{key}`")), "{text}");
    assert!(text.contains(rkey), "names the Redis key {rkey}: {text}");
    assert!(text.contains("DEL the key"), "names the fix: {text}");
    assert!(text.contains(what), "says what is wrong ({what}): {text}");
}

/// Each kind of junk at a record's key fails its read and every write that touches it
/// (nothing of such a call written), while other records work; deleting the key heals it.
async fn junk_at_a_record_key_is_an_error_naming_it(on: On) {
    let (broker, raw) = setup(on).await;
    let good = "good:{tag}\nkey";
    let witness = "witness";
    assert_eq!(
        broker
            .write_records(&[RecordWrite::put(good, "g")])
            .await
            .expect("a good record"),
        Some(vec![1])
    );
    // Each record's key, the command that writes junk there (the key goes after its name)
    // and what the error says of it.
    let junk: [(&str, &[&str], &str); 5] = [
        ("string", &["SET", "x"], "is a string"),
        ("no-version", &["HSET", "value", "v"], "without a `version`"),
        (
            "bad-version",
            &["HSET", "value", "v", "version", "abc"],
            "`abc`",
        ),
        (
            "zero-version",
            &["HSET", "value", "v", "version", "0"],
            "`0`",
        ),
        ("no-value", &["HSET", "version", "3"], "without a `value`"),
    ];
    for (key, write, what) in junk {
        let rkey = broker.record_key(key);
        let _: redis::Value = q(&raw, cmd(write[0]).arg(&rkey).arg(&write[1..])).await;
        let before: redis::Value = q(&raw, cmd("DUMP").arg(&rkey)).await;

        let e = broker.read_record(key).await.expect_err("a junk read");
        assert_names_the_key(&e, key, &rkey, what);
        for writes in [
            vec![RecordWrite::put(key, "new")],
            vec![RecordWrite::delete(key)],
            vec![
                RecordWrite::put(witness, "w"),
                RecordWrite::put(key, "new").if_version(0),
            ],
        ] {
            let e = broker
                .write_records(&writes)
                .await
                .expect_err("a junk write");
            assert_names_the_key(&e, key, &rkey, what);
        }
        let after: redis::Value = q(&raw, cmd("DUMP").arg(&rkey)).await;
        assert_eq!(before, after, "{key}: the junk is left as it was");
        assert_eq!(
            broker.read_record(witness).await.expect("read"),
            None,
            "{key}: nothing of a call that met junk is written"
        );

        let r = broker.read_record(good).await.expect("other records read");
        assert_eq!(r.map(|r| r.value.to_vec()), Some(b"g".to_vec()));
        let _: i64 = q(&raw, cmd("DEL").arg(&rkey)).await;
        assert_eq!(
            broker
                .write_records(&[RecordWrite::put(key, "healed").if_version(0)])
                .await
                .expect("written once the junk is deleted"),
            Some(vec![1])
        );
    }
    let again = broker
        .write_records(&[RecordWrite::put(good, "g2").if_version(1)])
        .await
        .expect("other records write");
    assert_eq!(again, Some(vec![2]));
}

/// Every record of a broker is in one slot (so a call's writes are one script on a Cluster),
/// whatever braces its key holds, and a record's key is no queue's.
async fn records_share_one_slot(on: On) {
    let (broker, raw) = setup(on).await;
    let mut slots = Vec::new();
    for key in ["a", "{b}", "}c{", "d:{e}:f", "{}"] {
        let rkey = broker.record_key(key);
        assert!(rkey.starts_with("stagedoor:records:{"), "{rkey}");
        if let On::Cluster = on {
            let slot: i64 = q(&raw, cmd("CLUSTER").arg("KEYSLOT").arg(&rkey)).await;
            slots.push(slot);
        }
    }
    slots.dedup();
    assert!(slots.len() <= 1, "one slot: {slots:?}");
    let writes: Vec<RecordWrite> = ["a", "{b}", "}c{", "d:{e}:f", "{}"]
        .iter()
        .map(|k| RecordWrite::put(*k, *k).if_version(0))
        .collect();
    assert_eq!(
        broker.write_records(&writes).await.expect("one call"),
        Some(vec![1; 5])
    );
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_at_a_record_key_is_an_error_naming_it_standalone() {
    junk_at_a_record_key_is_an_error_naming_it(On::Standalone).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_at_a_record_key_is_an_error_naming_it_cluster() {
    junk_at_a_record_key_is_an_error_naming_it(On::Cluster).await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_share_one_slot_standalone() {
    records_share_one_slot(On::Standalone).await;
}

#[ignore = "needs a Redis Cluster: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_share_one_slot_cluster() {
    records_share_one_slot(On::Cluster).await;
}
