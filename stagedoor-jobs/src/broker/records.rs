//! [`Records`]: small values kept by key, with a version for compare-and-set and a time to
//! live. The runtime keeps jobs' results and progress in them; the backend only stores what it
//! is told.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use super::{BrokerError, Inspect};

/// The longest key [`Records`] accepts, in bytes.
pub const MAX_RECORD_KEY: usize = 512;

/// The largest value [`Records`] accepts, in bytes (a job's result is held to a limit of its
/// own, at most this).
pub const MAX_RECORD_BYTES: usize = 4 * 1024 * 1024;

/// A stored record: its value and its version (1 when first written, one more at each write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The value as written.
    pub value: Bytes,
    /// The version: 1 for a record first written, one more at every write since.
    pub version: u64,
}

/// One write of [`Records::write_records`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordWrite {
    /// The key (at most [`MAX_RECORD_KEY`] bytes).
    pub key: String,
    /// The value (at most [`MAX_RECORD_BYTES`]); `None` deletes the record.
    pub value: Option<Bytes>,
    /// The version the record must have for the write to happen: `Some(0)` when it must not
    /// exist (an expired record does not), `None` for any.
    pub expected: Option<u64>,
    /// How long the record is kept from this write (by the backend's clock); `None`: until it
    /// is deleted.
    pub ttl: Option<Duration>,
}

impl RecordWrite {
    /// Writes `value` under `key`, whatever is there.
    pub fn put(key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        Self {
            key: key.into(),
            value: Some(value.into()),
            expected: None,
            ttl: None,
        }
    }
    /// Deletes `key`, whatever is there.
    pub fn delete(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: None,
            expected: None,
            ttl: None,
        }
    }
    /// Only when the record's version is `version` (`0`: when there is none).
    pub fn if_version(mut self, version: u64) -> Self {
        self.expected = Some(version);
        self
    }
    /// Kept for `ttl` from this write.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
}

/// Small values kept by key, each with a version (compare-and-set) and a time to live: where
/// the runtime keeps jobs' results and progress. A backend stores and returns them, and applies
/// a list of writes all together or not at all; it decides nothing about what they mean.
///
/// The defaults keep nothing and fail, naming the fix.
pub trait Records: Inspect {
    /// The record under `key`, if there is one that has not expired.
    fn read_record(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Record>, BrokerError>> + Send {
        let _ = key;
        async { Err(no_records(self.backend())) }
    }

    /// Applies `writes` all together, or none of them when any one's expected version does not
    /// match. `Ok(Some(versions))`: each write's new version (`0` for a delete), in order;
    /// `Ok(None)`: a version did not match and nothing was written. A key or value past its
    /// bound ([`MAX_RECORD_KEY`], [`MAX_RECORD_BYTES`]) is an error and nothing is written;
    /// one key written twice in one call is an error too.
    fn write_records(
        &self,
        writes: &[RecordWrite],
    ) -> impl Future<Output = Result<Option<Vec<u64>>, BrokerError>> + Send {
        let _ = writes;
        async { Err(no_records(self.backend())) }
    }
}

/// The check every backend makes before writing: keys and values within their bounds, no key
/// twice. `Err` names the bound and the fix.
pub fn check_record_writes(writes: &[RecordWrite]) -> Result<(), BrokerError> {
    let mut seen = std::collections::HashSet::with_capacity(writes.len());
    for w in writes {
        if w.key.is_empty() || w.key.len() > MAX_RECORD_KEY {
            return Err(BrokerError::Invalid(format!(
                "a record's key must be 1 to {MAX_RECORD_KEY} bytes, not {}: shorten it",
                w.key.len()
            )));
        }
        if w.key.contains('\0') {
            return Err(BrokerError::Invalid(format!(
                "the record key `{}` holds a NUL character, which no SQL text column can keep: leave it out",
                w.key.escape_debug()
            )));
        }
        if let Some(v) = &w.value
            && v.len() > MAX_RECORD_BYTES
        {
            return Err(BrokerError::Invalid(format!(
                "the record `{}` is {} bytes, past the limit of {MAX_RECORD_BYTES}: keep large values elsewhere and store a reference",
                w.key.escape_debug(),
                v.len()
            )));
        }
        if !seen.insert(w.key.as_str()) {
            return Err(BrokerError::Invalid(format!(
                "the record `{}` is written twice in one call: write it once",
                w.key.escape_debug()
            )));
        }
    }
    Ok(())
}

fn no_records(backend: &str) -> BrokerError {
    BrokerError::Backend(format!(
        "the {backend} broker keeps no records, so it cannot keep jobs' results or progress: implement `Records::read_record` and `write_records`"
    ))
}
