//! Entry points for the fuzz targets (`fuzz/` in the repository): the decoders of what this
//! crate reads from the server, re-exported as they are. Not a public API: it changes without
//! notice.

use chrono::{DateTime, Utc};
use stagedoor_jobs::{Envelope, Priority};

use crate::{entry, value};

/// Fields of one stream entry, in order, as bytes.
pub type Fields = entry::Fields;

/// A stream's entries: (id, fields).
pub type Entries = Vec<(String, Fields)>;

/// The field names the broker writes for a job.
pub const JOB_FIELDS: [&str; 8] = entry::JOB_FIELDS;

/// The fields of `envelope`, whose job has spent `attempts` (what a publish adds).
pub fn encode(envelope: &Envelope, attempts: u32) -> Fields {
    entry::encode(envelope, attempts)
}

/// An envelope from entry fields (what a claim reads), or what is missing or malformed.
pub fn decode(fields: &Fields, attempt: u32, added: DateTime<Utc>) -> Result<Envelope, String> {
    entry::decode(fields, attempt, added)
}

/// The attempts an entry says were spent, or why its `attempts` field is malformed.
pub fn attempts(fields: &Fields) -> Result<u32, String> {
    entry::attempts(fields)
}

/// The attempt number of delivery `deliveries` of an entry that says `spent` were spent.
pub fn attempt_of(spent: u32, deliveries: u64, dead_stream: bool) -> u32 {
    entry::attempt_of(spent, deliveries, dead_stream)
}

/// The `attempts` field a retry of delivery `attempt` gets.
pub fn attempts_after(attempt: u32, dead_stream: bool) -> u32 {
    entry::attempts_after(attempt, dead_stream)
}

/// The level an entry's `priority` field names (normal when it names none).
pub fn level(fields: &Fields) -> Priority {
    entry::level(fields)
}

/// `fields` with its `priority` field saying `level`.
pub fn at_level(fields: Fields, level: Priority) -> Fields {
    entry::at_level(fields, level)
}

/// The value of field `name`.
pub fn get<'a>(fields: &'a Fields, name: &str) -> Option<&'a [u8]> {
    entry::get(fields, name)
}

/// `fields` with field `name` set to `value`.
pub fn with(fields: &Fields, name: &str, value: impl Into<Vec<u8>>) -> Fields {
    entry::with(fields, name, value)
}

/// The text of field `name` (not UTF-8: replaced).
pub fn text(fields: &Fields, name: &str) -> Option<String> {
    entry::text(fields, name)
}

/// Bytes shown in a message (bytes that are not UTF-8 escaped).
pub fn shown(bytes: &[u8]) -> String {
    entry::shown(bytes)
}

/// When stream entry `id` was added.
pub fn id_time(id: &str) -> DateTime<Utc> {
    entry::id_time(id)
}

/// A delayed job's member of the `{q}:delayed` sorted set, from its fields.
pub fn member(fields: &Fields) -> Vec<u8> {
    entry::member(fields)
}

/// The fields of a `{q}:delayed` member, `None` when it is not one [`member`] makes.
pub fn unmember(bytes: &[u8]) -> Option<Fields> {
    entry::unmember(bytes)
}

/// A server reply in RESP bytes, read as a claim reads an `XREADGROUP` reply: each stream's
/// key and its entries (id, fields). `None` when the bytes are not one RESP value.
pub fn streams_reply(resp: &[u8]) -> Option<Vec<(String, Entries)>> {
    let v = redis::parse_redis_value(resp).ok()?;
    Some(value::into_streams_reply(v))
}

/// A server reply in RESP bytes, read as a claim on a plain connection reads an
/// `XREADGROUP` reply (`read_conn.rs`, without redis-rs): each stream's key and its entries.
/// `None` when the bytes are not one whole reply of that shape (or are the server's error).
pub fn claim_read(resp: &[u8]) -> Option<Vec<(String, Entries)>> {
    crate::read_conn::read_reply(resp).ok().flatten()
}

/// A server reply in RESP bytes, read as the dead-letter listing reads an `XRANGE` reply (by
/// reference, then taken), and as the claim script's `{entries, trimmed}` reply is read: the
/// entries of each reading. `None` when the bytes are not one RESP value.
pub fn range_reply(resp: &[u8]) -> Option<RangeReads> {
    let v = redis::parse_redis_value(resp).ok()?;
    let entries = value::entries(&v);
    let claimed = value::array(&v)
        .iter()
        .flat_map(|item| match value::array(item) {
            [id, f, d] => Some((value::string(id)?, value::fields(f), value::int(d)?)),
            _ => None,
        })
        .collect();
    let fields = value::fields(&v);
    let taken = value::into_fields(v);
    Some(RangeReads {
        entries,
        claimed,
        fields,
        taken,
    })
}

/// What [`range_reply`] read.
#[derive(Debug)]
pub struct RangeReads {
    /// As an `XRANGE` reply: (id, fields).
    pub entries: Entries,
    /// As the claim script's entries: (id, fields, deliveries).
    pub claimed: Vec<(String, Fields, i64)>,
    /// As one entry's fields, by reference.
    pub fields: Fields,
    /// As one entry's fields, taken.
    pub taken: Fields,
}
