//! [`Records`](stagedoor_jobs::broker::Records) on Redis: each record a hash
//! `stagedoor:records:{<namespace>records}:<key>` with fields `value` (the bytes as written)
//! and `version` (a decimal number, 1 at the first write), expiring by `PEXPIRE` (the server's
//! clock) or kept by `PERSIST`.
//!
//! Every record of a broker shares the hash tag `{<namespace>records}`, so a write of several
//! records is one script ([`WRITE_RECORDS`](crate::scripts::WRITE_RECORDS)) on one node of a
//! Redis Cluster too. The key starts with `stagedoor:records:`, which no other key of the broker
//! does (a queue's keys start with `{`, the locks', ticks' and permits' with
//! `stagedoor:lock:`, `stagedoor:sched:` and `stagedoor:permits:`), and a namespace holds no
//! brace, so the tag ends where the namespace's part does: a record's key, whatever bytes it
//! holds (braces, `:`, newlines), names no other key of the broker or of another namespace.
//!
//! A key holding something this library never writes there (a string, a hash without a
//! `version` or whose `version` is no whole number above 0, one without `value`) fails the read
//! or write that meets it with [`BrokerError::Malformed`] naming the key and the fix; a write
//! that meets one writes nothing.

use std::time::Duration;

use bytes::Bytes;
use redis::Value;
use stagedoor_jobs::broker::{BrokerError, Record, RecordWrite, check_record_writes};

use crate::broker::RedisBroker;
use crate::scripts::{READ_RECORD, ScriptCall, WRITE_RECORDS};
use crate::value;

/// The longest ttl given to `PEXPIRE`, in ms (about 146 million years): a longer one would
/// overflow the server's expiry time, which it refuses.
const LONGEST_TTL_MS: u128 = (i64::MAX / 2) as u128;

impl RedisBroker {
    /// The Redis key of record `key`: `stagedoor:records:{<namespace>records}:<key>` (see
    /// `records.rs`). What to give `redis-cli HGETALL` to look at a record, or `DEL` to remove
    /// one by hand.
    pub fn record_key(&self, key: &str) -> String {
        format!("stagedoor:records:{{{}records}}:{key}", self.namespace)
    }

    /// [`Records::read_record`](stagedoor_jobs::broker::Records::read_record) on Redis (the
    /// trait's impl in `broker.rs` calls this): one [`READ_RECORD`] script, which checks the
    /// record's shape as a write does (an expired key is absent to the server).
    pub(crate) async fn redis_read_record(&self, key: &str) -> Result<Option<Record>, BrokerError> {
        let rkey = self.record_key(key);
        let mut c = self.conn()?;
        let reply: Value = ScriptCall::new(&READ_RECORD, &[&rkey])
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        read_reply(reply, key, rkey)
    }

    /// [`Records::write_records`](stagedoor_jobs::broker::Records::write_records) on Redis
    /// (the trait's impl in `broker.rs` calls this): the bounds checked, then one
    /// [`WRITE_RECORDS`] script compares every expected version and applies every write.
    pub(crate) async fn redis_write_records(
        &self,
        writes: &[RecordWrite],
    ) -> Result<Option<Vec<u64>>, BrokerError> {
        check_record_writes(writes)?;
        if writes.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let rkeys: Vec<String> = writes.iter().map(|w| self.record_key(&w.key)).collect();
        let keys: Vec<&str> = rkeys.iter().map(String::as_str).collect();
        let mut call = ScriptCall::new(&WRITE_RECORDS, &keys);
        for w in writes {
            call.arg(if w.value.is_some() { "p" } else { "d" })
                .arg(w.expected.map(|v| v.to_string()).unwrap_or_default())
                .arg(w.ttl.map(|t| ttl_ms(t).to_string()).unwrap_or_default())
                .arg(w.value.as_deref().unwrap_or_default());
        }
        let mut c = self.conn()?;
        let reply: Value = call.invoke_async(&mut c).await.map_err(|e| self.err(e))?;
        read_write_reply(reply, writes, &rkeys)
    }
}

/// A ttl in whole milliseconds for `PEXPIRE`, rounded up (a ttl below a millisecond keeps the
/// record for one; a zero ttl removes it at once, as on every backend) and at most
/// [`LONGEST_TTL_MS`].
fn ttl_ms(ttl: Duration) -> u128 {
    ttl.as_nanos().div_ceil(1_000_000).min(LONGEST_TTL_MS)
}

/// The reply of [`READ_RECORD`] for record `key` at `rkey`: `{1, value, version}`, `{0}`, or
/// `{-1, 1, ..}` for a key holding something else. The value is taken, not copied.
fn read_reply(reply: Value, key: &str, rkey: String) -> Result<Option<Record>, BrokerError> {
    match (value::array(&reply).first().and_then(value::int), reply) {
        (Some(0), _) => Ok(None),
        (Some(1), Value::Array(mut items)) if items.len() == 3 => {
            let version = value::int(&items[2])
                .and_then(|v| u64::try_from(v).ok())
                .filter(|v| *v > 0);
            match (std::mem::replace(&mut items[1], Value::Nil), version) {
                (Value::BulkString(stored), Some(version)) => Ok(Some(Record {
                    value: Bytes::from(stored),
                    version,
                })),
                (stored, _) => {
                    items[1] = stored;
                    Err(unexpected(&Value::Array(items)))
                }
            }
        }
        (Some(-1), Value::Array(items)) => Err(malformed_reply(&items, &[key], &[rkey])),
        (_, reply) => Err(unexpected(&reply)),
    }
}

/// The reply of [`WRITE_RECORDS`]: `{1, versions..}`, `{0}`, or `{-1, index, ..}` for a key
/// holding something else.
fn read_write_reply(
    reply: Value,
    writes: &[RecordWrite],
    rkeys: &[String],
) -> Result<Option<Vec<u64>>, BrokerError> {
    let items = value::array(&reply);
    match items.first().and_then(value::int) {
        Some(1) if items.len() == writes.len() + 1 => items[1..]
            .iter()
            .map(|v| value::int(v).and_then(|n| u64::try_from(n).ok()))
            .collect::<Option<Vec<u64>>>()
            .map(Some)
            .ok_or_else(|| unexpected(&reply)),
        Some(0) => Ok(None),
        Some(-1) => {
            let keys: Vec<&str> = writes.iter().map(|w| w.key.as_str()).collect();
            Err(malformed_reply(items, &keys, rkeys))
        }
        _ => Err(unexpected(&reply)),
    }
}

/// The error for a reply of the records' scripts that is none of theirs.
fn unexpected(reply: &Value) -> BrokerError {
    let mut shown = format!("{reply:?}");
    if shown.len() > 300 {
        let cut = (0..=300)
            .rev()
            .find(|&i| shown.is_char_boundary(i))
            .unwrap_or(0);
        shown.truncate(cut);
        shown.push_str("..");
    }
    BrokerError::Backend(format!(
        "a records script answered {shown}, which is none of its replies: a bug of stagedoor-jobs-redis, report it with this message"
    ))
}

/// The error for a script's `{-1, index, type, version or false, has value}`: the record
/// `keys[index - 1]` (Redis key `rkeys[index - 1]`) holds something else.
fn malformed_reply(items: &[Value], keys: &[&str], rkeys: &[String]) -> BrokerError {
    let at = items
        .get(1)
        .and_then(value::int)
        .and_then(|i| usize::try_from(i - 1).ok());
    let (Some(key), Some(rkey)) = (at.and_then(|i| keys.get(i)), at.and_then(|i| rkeys.get(i)))
    else {
        return unexpected(&Value::Array(items.to_vec()));
    };
    let t = items.get(2).and_then(value::string).unwrap_or_default();
    let version = items.get(3).and_then(value::bytes);
    let has_value = items.get(4).and_then(value::int) == Some(1);
    let what = if t != "hash" {
        format!("is a {t}, not a hash of `value` and `version`")
    } else {
        match version {
            None => "is a hash without a `version` field".to_owned(),
            Some(v) if !is_version(&v) => format!(
                "has the `version` `{}`, not a whole number above 0 (1 to 15 digits)",
                String::from_utf8_lossy(&v).escape_debug()
            ),
            Some(_) if !has_value => "is a hash without a `value` field".to_owned(),
            Some(_) => "is not a record".to_owned(),
        }
    };
    malformed(key, rkey, &what)
}

/// Whether `v` is a version as the scripts write it: 1 to 15 digits, no leading 0.
fn is_version(v: &[u8]) -> bool {
    !v.is_empty() && v.len() <= 15 && v[0] != b'0' && v.iter().all(u8::is_ascii_digit)
}

/// The error for record `key` at Redis key `rkey`, which `what`: names both and the fix.
fn malformed(key: &str, rkey: &str, what: &str) -> BrokerError {
    BrokerError::Malformed {
        id: format!("`{}`", rkey.escape_debug()),
        reason: format!(
            "the record `{}` {what}: this library never writes it so (another tool or a hand did); DEL the key (RENAME it first to keep what it holds) and write the record again",
            key.escape_debug()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_ttls_are_read_as_the_script_does() {
        assert!(is_version(b"1") && is_version(b"999999999999999"));
        for bad in [
            &b""[..],
            b"0",
            b"01",
            b"-1",
            b"1e3",
            b" 1",
            b"abc",
            b"1234567890123456",
        ] {
            assert!(!is_version(bad), "{bad:?}");
        }
        assert_eq!(ttl_ms(Duration::ZERO), 0);
        assert_eq!(ttl_ms(Duration::from_micros(1)), 1);
        assert_eq!(ttl_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(ttl_ms(Duration::MAX), LONGEST_TTL_MS);
    }

    #[test]
    fn record_keys_share_one_tag_and_no_other_keys_shape() {
        let b = RedisBroker::from_url("redis://127.0.0.1:6379/").namespace("app1:");
        assert_eq!(
            b.record_key("a{b}:c\nd"),
            "stagedoor:records:{app1:records}:a{b}:c\nd"
        );
        let plain = RedisBroker::from_url("redis://127.0.0.1:6379/");
        assert_eq!(plain.record_key("x"), "stagedoor:records:{records}:x");
        assert_ne!(plain.record_key("dead"), plain.stream_key("records:dead"));
    }

    #[test]
    fn a_malformed_record_names_its_key_and_the_fix() {
        let s = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        let replies = [
            vec![
                Value::Int(-1),
                Value::Int(2),
                s("string"),
                Value::Nil,
                Value::Int(0),
            ],
            vec![
                Value::Int(-1),
                Value::Int(2),
                s("hash"),
                Value::Nil,
                Value::Int(1),
            ],
            vec![
                Value::Int(-1),
                Value::Int(2),
                s("hash"),
                s("abc"),
                Value::Int(1),
            ],
            vec![
                Value::Int(-1),
                Value::Int(2),
                s("hash"),
                s("3"),
                Value::Int(0),
            ],
        ];
        let rkeys = [
            "stagedoor:records:{records}:a".to_owned(),
            "stagedoor:records:{records}:k\n1".to_owned(),
        ];
        for reply in &replies {
            let e = malformed_reply(reply, &["a", "k\n1"], &rkeys).to_string();
            assert!(
                e.contains("`k\\n1`") && e.contains("{records}:k\\n1"),
                "{e}"
            );
            assert!(e.contains("DEL the key"), "{e}");
        }
        let e = malformed_reply(&[Value::Int(-1), Value::Int(9)], &["a"], &rkeys[..1]);
        assert!(
            matches!(e, BrokerError::Backend(_)),
            "an index out of range: {e}"
        );
    }
}
