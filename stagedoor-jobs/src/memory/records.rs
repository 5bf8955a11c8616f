//! The in-memory broker's [`Records`]: values by key with a version and an expiry, written
//! under the store's one lock.

use crate::broker::{BrokerError, Record, RecordWrite, Records, check_record_writes};
use crate::clock::later;

use super::MemoryBroker;

impl Records for MemoryBroker {
    async fn read_record(&self, key: &str) -> Result<Option<Record>, BrokerError> {
        let now = self.now();
        let mem = self.mem();
        Ok(match mem.records.get(key) {
            Some((r, until)) if until.is_none_or(|t| t > now) => Some(r.clone()),
            _ => None,
        })
    }

    async fn write_records(&self, writes: &[RecordWrite]) -> Result<Option<Vec<u64>>, BrokerError> {
        check_record_writes(writes)?;
        let now = self.now();
        let mut mem = self.mem();
        mem.records
            .retain(|_, (_, until)| until.is_none_or(|t| t > now));
        let current =
            |mem: &super::Mem, key: &str| mem.records.get(key).map_or(0, |(r, _)| r.version);
        if writes
            .iter()
            .any(|w| w.expected.is_some_and(|v| v != current(&mem, &w.key)))
        {
            return Ok(None);
        }
        let mut versions = Vec::with_capacity(writes.len());
        for w in writes {
            match &w.value {
                None => {
                    mem.records.remove(&w.key);
                    versions.push(0);
                }
                Some(value) => {
                    let version = current(&mem, &w.key) + 1;
                    let until = w.ttl.map(|ttl| later(now, ttl));
                    let record = Record {
                        value: value.clone(),
                        version,
                    };
                    mem.records.insert(w.key.clone(), (record, until));
                    versions.push(version);
                }
            }
        }
        Ok(Some(versions))
    }
}
