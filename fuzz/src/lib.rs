//! Fuzz targets of stagedoor-jobs: everything that reads bytes it does not control.
//!
//! Each target is a function of one input (`&[u8]`) that panics when an invariant breaks: no
//! panic in the code under test, no hang (the runner's watchdog), and where a round trip exists
//! (an envelope encoded then decoded) it is the identity. The same functions are driven by
//! AFL++ (`fuzz/afl`, coverage-guided) and by `cargo test -p stagedoor-jobs-fuzz` (the
//! committed corpus replayed, then a short batch of random mutations of it). See
//! `fuzz/README.md`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use stagedoor_jobs::{Envelope, Headers, JobId, Priority};

pub mod cron;
pub mod dashboard;
pub mod input;
pub mod redis;
pub mod run;
pub mod seeds;
pub mod sql;

/// A fuzz target: one input in, a panic when an invariant breaks.
pub type Target = fn(&[u8]);

/// Every target by name (the name of its corpus directory, `fuzz/corpus/<name>/`).
pub const TARGETS: &[(&str, Target)] = &[
    ("redis_entry", redis::entry),
    ("redis_member", redis::member),
    ("redis_reply", redis::reply),
    ("sql_headers", sql::headers),
    ("dashboard", dashboard::request),
    ("cron", cron::schedule),
];

/// The target named `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// An envelope built from the input, as a publisher could build one: any kind, id, payload,
/// headers, level, and an enqueue time in whole milliseconds (what every backend keeps).
pub fn envelope(inp: &mut input::Input<'_>) -> Envelope {
    let kind = inp.text();
    let id = inp.text();
    let payload = inp.chunk().to_vec();
    let ms = inp.i64() % 8_000_000_000_000_000;
    let enqueued = DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or(DateTime::UNIX_EPOCH);
    let flags = inp.u8();
    let mut headers = Headers {
        request_id: (flags & 1 != 0).then(|| inp.text()),
        trace: (flags & 2 != 0).then(|| inp.text()),
        extra: BTreeMap::new(),
    };
    for _ in 0..(flags >> 4) {
        let k = inp.text();
        let v = inp.text();
        headers.extra.insert(k, v);
    }
    let level = Priority::new((inp.u8() % 5) as i8 - 2).unwrap_or_default();
    Envelope::new(kind, payload, enqueued)
        .with_id(JobId::from_string(id))
        .with_headers(headers)
        .with_priority(level)
}
