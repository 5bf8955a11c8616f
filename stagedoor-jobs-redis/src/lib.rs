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
//! | the stream (group `stagedoor`) | `{jobs}` | `XLEN {jobs}`, `XPENDING {jobs} stagedoor` |
//! | the dead stream | `{jobs}:dead` | `XRANGE {jobs}:dead - + COUNT 1` |
//! | delayed jobs and retries (score: due, ms) | `{jobs}:delayed` | `ZRANGE {jobs}:delayed 0 -1 WITHSCORES` |
//! | ids of the jobs in the queue | `{jobs}:ids` | `SCARD {jobs}:ids` |
//! | the delayed mover's lock | `{jobs}:mover` | `GET {jobs}:mover` |
//!
//! The dead letter of a mount on `jobs` is `jobs:dead`.

mod broker;
mod conn;
mod entry;
mod keys;
mod scripts;
mod stream;
mod value;

pub use broker::{RedisBroker, RedisReceipt};
pub use stream::Stream;
