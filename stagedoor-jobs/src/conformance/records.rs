//! Records ([`Records`]): compare-and-set by version, writes applied all together or not at
//! all, a time to live, keys and values at their bounds and hostile, and writers racing on one
//! key (each increment lands once).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::fixture::Fixture;
use super::support::*;
use crate::broker::{
    BrokerError, MAX_RECORD_BYTES, MAX_RECORD_KEY, RecordWrite, Records, check_record_writes,
};

/// A key of this row's own, so that runs on a shared server never meet.
fn key(row: &str) -> String {
    format!("cf_{row}_{}", crate::JobId::new().as_str())
}

async fn write<B: Records>(broker: &B, writes: &[RecordWrite]) -> Option<Vec<u64>> {
    broker.write_records(writes).await.expect("write records")
}

async fn value<B: Records>(broker: &B, key: &str) -> Option<(Bytes, u64)> {
    broker
        .read_record(key)
        .await
        .expect("read a record")
        .map(|r| (r.value, r.version))
}

/// A record written where none is (`if_version(0)`) gets version 1; a second such write is
/// refused; a write at the current version moves it on and one at an old version is refused;
/// a write without a version always lands; a delete at the current version removes it.
pub async fn records_compare_and_set_by_version<F: Fixture>(fixture: F) {
    let broker = connected(&fixture.broker().await).await;
    let k = key("cas");
    assert_eq!(
        value(&broker, &k).await,
        None,
        "no record before the first write"
    );
    let put = |v: &'static str| RecordWrite::put(k.clone(), v);
    assert_eq!(
        write(&broker, &[put("a").if_version(0)]).await,
        Some(vec![1])
    );
    assert_eq!(
        write(&broker, &[put("b").if_version(0)]).await,
        None,
        "a record that exists is not created again"
    );
    assert_eq!(value(&broker, &k).await, Some((Bytes::from("a"), 1)));
    assert_eq!(
        write(&broker, &[put("b").if_version(1)]).await,
        Some(vec![2])
    );
    assert_eq!(
        write(&broker, &[put("c").if_version(1)]).await,
        None,
        "a write at a version that has moved on is refused"
    );
    assert_eq!(value(&broker, &k).await, Some((Bytes::from("b"), 2)));
    assert_eq!(write(&broker, &[put("c")]).await, Some(vec![3]));
    assert_eq!(
        write(&broker, &[RecordWrite::delete(k.clone()).if_version(2)]).await,
        None,
        "a delete at an old version is refused"
    );
    assert_eq!(
        write(&broker, &[RecordWrite::delete(k.clone()).if_version(3)]).await,
        Some(vec![0])
    );
    assert_eq!(value(&broker, &k).await, None, "deleted");
    assert_eq!(
        write(&broker, &[put("d").if_version(0)]).await,
        Some(vec![1]),
        "a deleted record is written again from version 1"
    );
}

/// Writes are applied all together or not at all: one expected version that does not match
/// leaves every other key of the call as it was; when all match, every one lands.
pub async fn record_writes_are_all_or_nothing<F: Fixture>(fixture: F) {
    let broker = connected(&fixture.broker().await).await;
    let (a, b, c) = (key("all_a"), key("all_b"), key("all_c"));
    assert_eq!(
        write(
            &broker,
            &[
                RecordWrite::put(a.clone(), "a1"),
                RecordWrite::put(c.clone(), "c1")
            ]
        )
        .await,
        Some(vec![1, 1])
    );
    let refused = [
        RecordWrite::put(b.clone(), "b1").if_version(0),
        RecordWrite::delete(c.clone()),
        RecordWrite::put(a.clone(), "a2").if_version(7),
    ];
    assert_eq!(write(&broker, &refused).await, None);
    assert_eq!(
        value(&broker, &b).await,
        None,
        "nothing written when one version differs"
    );
    assert_eq!(
        value(&broker, &c).await,
        Some((Bytes::from("c1"), 1)),
        "nor deleted"
    );
    assert_eq!(value(&broker, &a).await, Some((Bytes::from("a1"), 1)));
    let taken = [
        RecordWrite::put(b.clone(), "b1").if_version(0),
        RecordWrite::delete(c.clone()).if_version(1),
        RecordWrite::put(a.clone(), "a2").if_version(1),
    ];
    assert_eq!(write(&broker, &taken).await, Some(vec![1, 0, 2]));
    assert_eq!(value(&broker, &a).await, Some((Bytes::from("a2"), 2)));
    assert_eq!(value(&broker, &b).await, Some((Bytes::from("b1"), 1)));
    assert_eq!(value(&broker, &c).await, None);
}

/// A record with a time to live is read until it runs out, then not at all, and a write that
/// expects no record then lands (from version 1). A write without a ttl keeps the record for
/// good, also over one that had a ttl.
pub async fn records_expire_after_their_ttl<F: Fixture>(fixture: F) {
    let broker = connected(&fixture.broker().await).await;
    let (k, kept) = (key("ttl"), key("ttl_kept"));
    let ttl = Duration::from_millis(1500);
    write(&broker, &[RecordWrite::put(k.clone(), "soon").ttl(ttl)]).await;
    write(&broker, &[RecordWrite::put(kept.clone(), "x").ttl(ttl)]).await;
    write(&broker, &[RecordWrite::put(kept.clone(), "y")]).await;
    assert!(value(&broker, &k).await.is_some(), "read within its ttl");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(value(&broker, &k).await, None, "gone after its ttl");
    assert_eq!(
        value(&broker, &kept).await,
        Some((Bytes::from("y"), 2)),
        "a write without a ttl keeps the record"
    );
    assert_eq!(
        write(
            &broker,
            &[RecordWrite::put(k.clone(), "again").if_version(0)]
        )
        .await,
        Some(vec![1]),
        "an expired record counts as none"
    );
}

/// Hostile keys and values round trip exactly (braces, quotes, separators, newlines,
/// non-ASCII, every byte value, an empty value, the longest key, the largest value); a key or
/// value past its bound, an empty key, a NUL in a key and one key twice in a call are refused
/// with an error naming the fix, and nothing of the call is written.
pub async fn record_keys_and_values_at_their_bounds<F: Fixture>(fixture: F) {
    let broker = connected(&fixture.broker().await).await;
    let base = key("bounds");
    let hostile = [
        format!("{base}{{q}}:ids"),
        format!("{base}'; DROP TABLE x; --"),
        format!("{base}\nline\r\ttab"),
        format!("{base} é ✓ 𝄞"),
        format!("{base}%_\\*?[]"),
    ];
    let every_byte: Bytes = (0..=255u8).collect::<Vec<_>>().into();
    for k in &hostile {
        write(&broker, &[RecordWrite::put(k.clone(), every_byte.clone())]).await;
        assert_eq!(
            value(&broker, k).await,
            Some((every_byte.clone(), 1)),
            "key {k:?}"
        );
    }
    let empty = key("empty");
    write(&broker, &[RecordWrite::put(empty.clone(), Bytes::new())]).await;
    assert_eq!(value(&broker, &empty).await, Some((Bytes::new(), 1)));
    let longest = format!("{base}{}", "k".repeat(MAX_RECORD_KEY - base.len()));
    let largest = Bytes::from(vec![7u8; MAX_RECORD_BYTES]);
    write(
        &broker,
        &[RecordWrite::put(longest.clone(), largest.clone())],
    )
    .await;
    assert_eq!(
        value(&broker, &longest).await.map(|(v, _)| v),
        Some(largest)
    );

    let witness = key("bounds_witness");
    let refused = [
        vec![RecordWrite::put(format!("{longest}k"), "x")],
        vec![RecordWrite::put(String::new(), "x")],
        vec![RecordWrite::put(format!("{base}\0nul"), "x")],
        vec![RecordWrite::put(
            key("big"),
            vec![0u8; MAX_RECORD_BYTES + 1],
        )],
        vec![
            RecordWrite::put(base.clone(), "a"),
            RecordWrite::put(base.clone(), "b"),
        ],
    ];
    for writes in refused {
        let mut writes = writes;
        writes.insert(0, RecordWrite::put(witness.clone(), "w"));
        let err = broker
            .write_records(&writes)
            .await
            .expect_err("a write past a bound is refused");
        assert!(
            matches!(err, BrokerError::Invalid(_)),
            "refused before the backend: {err}"
        );
        assert_eq!(
            check_record_writes(&writes).map_err(|e| e.to_string()),
            Err(err.to_string())
        );
        assert_eq!(
            value(&broker, &witness).await,
            None,
            "nothing of a refused call is written"
        );
    }
}

/// Twenty writers increment one counter at once by compare-and-set, each trying again when its
/// version was taken: the counter ends at 20 and its version at 21; no increment is lost or
/// applied twice.
pub async fn concurrent_compare_and_set_lets_one_writer_win<F: Fixture>(fixture: F) {
    let broker = Arc::new(connected(&fixture.broker().await).await);
    let k = key("race");
    write(&*broker, &[RecordWrite::put(k.clone(), "0")]).await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (broker, k) = (Arc::clone(&broker), k.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let (v, version) = value(&*broker, &k).await.expect("the counter exists");
                let n: u64 = std::str::from_utf8(&v).unwrap().parse().unwrap();
                let next = RecordWrite::put(k.clone(), (n + 1).to_string()).if_version(version);
                if write(&*broker, &[next]).await.is_some() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("a writer panicked");
    }
    assert_eq!(value(&*broker, &k).await, Some((Bytes::from("20"), 21)));
}
