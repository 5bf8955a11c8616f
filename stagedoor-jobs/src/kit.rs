//! The kit for backend authors: the pieces every backend needs and that are easy to get
//! subtly wrong, written once here so that the Redis, SQL and in-memory backends (and a
//! backend of your own) share them.
//!
//! | piece | what it does |
//! |---|---|
//! | [`restart_on_panic`], [`spawn_consumer`] | a background task restarted whenever it panics; one that consumes a channel its runs share |
//! | [`lock`] | locks a `std::sync::Mutex` whatever a panic elsewhere left in it |
//! | [`Batchers`], [`run_batches`] | the restartable settlement batcher: a supervised task per key fed by a channel, started at its first request and again when found stopped, each request sent twice when its task died under it; the loop that batches what queued |
//! | [`ClockWatch`] | the wait for a manual clock to move (a claim, the scheduler) |
//! | [`encode_report`], [`decode_report`], [`counts_kept_from`] | a worker's report as stored (JSON), read back, and the oldest minute of counts kept |

mod batcher;
mod clock_watch;
mod lock;
mod report;
mod restart;

pub use batcher::{Batchers, Reply, run_batches};
pub use clock_watch::ClockWatch;
pub use lock::lock;
pub use report::{counts_kept_from, decode_report, encode_report};
pub(crate) use restart::BACKOFF;
pub use restart::{SharedReceiver, restart_on_panic, spawn_consumer};
