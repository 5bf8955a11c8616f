#![cfg_attr(docsrs, feature(doc_cfg))]
//! # stagedoor-jobs-redis
//!
//! The Redis Streams backend of stagedoor-jobs (seed 000): one stream per queue read by a
//! consumer group, several job kinds per stream, delayed jobs and retries in a sorted set moved
//! to the stream by an atomic script, a dead stream `<stream>:dead` trimmed at about 10,000,
//! and poison entries (their workers died) contained by the group's delivery count.
//!
//! ## Keys
//!
//! Every key of a queue shares the stream's hash tag, so every multi-key step is one script on
//! one node of a Redis Cluster. For a queue `jobs`:
//!
//! | what | key | in `redis-cli` |
//! |---|---|---|
//! | the stream (group `stagedoor`) | `{jobs}` | `XINFO GROUPS {jobs}` (`lag`: ready), `XPENDING {jobs} stagedoor` |
//! | the dead stream | `{jobs}:dead` | `XRANGE {jobs}:dead - + COUNT 1` |
//! | delayed jobs and retries (score: due, ms) | `{jobs}:delayed` | `ZRANGE {jobs}:delayed 0 -1 WITHSCORES` |
//! | ids of the jobs in the queue | `{jobs}:ids` | `SCARD {jobs}:ids` |
//! | the delayed mover's lock | `{jobs}:mover` | `GET {jobs}:mover` |
//! | a scheduler tick's guard | `{jobs}:once:<guard>` | `SCAN 0 MATCH {jobs}:once:*` |
//!
//! The dead letter of a mount on `jobs` is `jobs:dead`.
//!
//! Settled entries leave the stream by `XTRIM MINID` below the group's oldest pending entry
//! (Redis 7 and later; on 6.2 each is deleted): the stream may hold up to about a second of
//! settled entries above a delivery still running, so `XLEN` counts those too, and the ready
//! count is the group's lag.
//!
//! Workers' reports and per-minute counts ([`Activity`](stagedoor_jobs::Activity)) share the
//! tag `{stagedoor:activity}`: `{stagedoor:activity}:worker:<id>` (a report, expiring),
//! `{stagedoor:activity}:workers` (the ids by expiry), `{stagedoor:activity}:minutes:<queue>`
//! (fields `<minute ms>:p|f|d`, kept two hours).
//!
//! ## Leases, outages, a full server
//!
//! A claim holds an entry for a lease of 3 s by default
//! ([`DEFAULT_LEASE`](stagedoor_jobs::broker::DEFAULT_LEASE)), renewed by the runtime every
//! second until the delivery is settled; entries idle past it are reclaimed (XAUTOCLAIM),
//! except after a connection error, until the broker has talked to the server for a whole
//! lease without one (the holders renew first). A full server (`maxmemory`, `noeviction`)
//! refuses publishing with [`BrokerError::Full`](stagedoor_jobs::BrokerError::Full) while
//! workers go on draining it: on Redis 7 the scripts that settle, reclaim and move jobs run
//! with `allow-oom`.

/// Everything a Redis worker needs: `use stagedoor_jobs_redis::prelude::*;`.
///
/// The core prelude, [`RedisBroker`], [`Stream`], and the traits a producer without a service
/// calls: [`Inspect`](stagedoor_jobs::Inspect) (`connect()`),
/// [`Broker`](stagedoor_jobs::Broker) and [`Publish`](stagedoor_jobs::Publish) (`publish_job`,
/// `publish_jobs`).
pub mod prelude {
    pub use crate::{RedisBroker, Stream};
    pub use stagedoor_jobs::prelude::*;
    pub use stagedoor_jobs::{Broker, Inspect, Publish};
    pub use std::time::Duration;
}

mod activity;
mod broker;
mod claim;
mod conn;
mod dead;
mod entry;
mod errors;
mod keys;
mod publish;
mod schedule;
mod scripts;
mod settle;
mod startup;
mod stats;
mod stream;
mod value;

pub use broker::{RedisBroker, RedisReceipt};
pub use stream::Stream;
