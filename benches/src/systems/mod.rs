//! One module per system. Each exposes the same items, used through [`System`]:
//!
//! ```text
//! pub fn supports(backend: Backend) -> bool;
//! pub fn has_bulk(b: Backend) -> bool;      // a bulk, batch or transaction enqueue on b
//! pub fn remaining(t: &Target) -> probe::Remaining;      // where its unfinished jobs are
//! pub fn legend(b: Backend) -> String;      // how it runs, for the legend under the tables
//! pub async fn reset(t: &Target) -> anyhow::Result<()>;   // schema/migrations + no jobs left
//! pub struct Producer;                      // one connection (pool) that enqueues
//! impl Producer {
//!     pub async fn connect(t: &Target) -> anyhow::Result<Self>;
//!     pub async fn one(&mut self, job: BenchJob) -> anyhow::Result<()>;     // one API call
//!     pub async fn bulk(&mut self, jobs: &[BenchJob]) -> anyhow::Result<()>; // one bulk call
//! }
//! pub async fn work(t: &Target, hook: Arc<Hook>) -> anyhow::Result<()>;   // runs until killed
//! ```
//!
//! A worker runs [`Target::concurrency`] jobs at once (`CONCURRENCY` unless the scenario sets
//! another; the raw loops run one batch at a time), fetches `BATCH` at a time where the system
//! has that knob, polls at most every 50 ms where it polls, and retries a failed job right away
//! (or after the shortest delay the system allows), up to 3 attempts.

pub mod apalis;
pub mod awa_pg;
pub mod bull;
pub mod graphile;
pub mod probe;
pub mod raw;
pub mod raw_guarded;
pub mod river;
pub mod ruststream;
pub mod stagedoor;

use std::sync::Arc;

use crate::common::{Backend, BenchJob, Hook, Target};

/// A system under measurement.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, clap::ValueEnum,
)]
pub enum System {
    /// stagedoor-jobs.
    Stagedoor,
    /// apalis 1.0.
    Apalis,
    /// graphile_worker (Rust).
    Graphile,
    /// bullmq-official 1.4 (BullMQ's Rust port).
    Bullmq,
    /// awa 0.6.
    Awa,
    /// riverqueue 0.5 (River's official Rust client).
    River,
    /// ruststream-sqlx / ruststream-fred.
    Ruststream,
    /// ruststream with its batch handler (`batch(n)`, a body over `[T]`).
    RuststreamBatch,
    /// A hand-written minimal loop: only the protocol work, none of the guarantees.
    Raw,
    /// A hand-written loop with stagedoor-jobs' guarantees: fenced acknowledgement, attempt
    /// counted at claim, and (Redis) an id set against duplicates.
    RawGuarded,
}

macro_rules! each {
    ($sys:expr, $m:ident => $e:expr) => {
        match $sys {
            System::Stagedoor => {
                use stagedoor as $m;
                $e
            }
            System::Apalis => {
                use apalis as $m;
                $e
            }
            System::Graphile => {
                use graphile as $m;
                $e
            }
            System::Bullmq => {
                use bull as $m;
                $e
            }
            System::Awa => {
                use awa_pg as $m;
                $e
            }
            System::River => {
                use river as $m;
                $e
            }
            System::Ruststream | System::RuststreamBatch => {
                use ruststream as $m;
                $e
            }
            System::Raw => {
                use raw as $m;
                $e
            }
            System::RawGuarded => {
                use raw_guarded as $m;
                $e
            }
        }
    };
}

impl System {
    /// Every system, in table order.
    pub const ALL: [System; 10] = [
        System::Stagedoor,
        System::Apalis,
        System::Graphile,
        System::Bullmq,
        System::Awa,
        System::River,
        System::Ruststream,
        System::RuststreamBatch,
        System::Raw,
        System::RawGuarded,
    ];

    /// The name in tables.
    pub fn name(self) -> &'static str {
        match self {
            System::Stagedoor => "stagedoor-jobs",
            System::Apalis => "apalis",
            System::Graphile => "graphile_worker",
            System::Bullmq => "bullmq-official",
            System::Awa => "awa",
            System::River => "riverqueue",
            System::Ruststream => "ruststream",
            System::RuststreamBatch => "ruststream batch",
            System::Raw => "raw, minimal loop",
            System::RawGuarded => "raw, same guarantees",
        }
    }

    /// The flag value (`--systems`).
    pub fn flag(self) -> &'static str {
        match self {
            System::Stagedoor => "stagedoor",
            System::Apalis => "apalis",
            System::Graphile => "graphile",
            System::Bullmq => "bullmq",
            System::Awa => "awa",
            System::River => "river",
            System::Ruststream => "ruststream",
            System::RuststreamBatch => "ruststream-batch",
            System::Raw => "raw",
            System::RawGuarded => "raw-guarded",
        }
    }

    /// Whether the system runs on `b`.
    pub fn supports(self, b: Backend) -> bool {
        each!(self, m => m::supports(b))
    }

    /// Whether it has a bulk (or batch, or transaction) enqueue on `b`.
    pub fn has_bulk(self, b: Backend) -> bool {
        each!(self, m => m::has_bulk(b))
    }

    /// Where the harness looks to see that none of this system's jobs is left in the queue
    /// (ready, in flight, or delayed).
    pub fn remaining(self, t: &Target) -> probe::Remaining {
        each!(self, m => m::remaining(t))
    }

    /// What a reader must know about how this system runs on `b` (the legend under the tables).
    pub fn legend(self, b: Backend) -> String {
        match self {
            System::RuststreamBatch => ruststream::legend_batch(b),
            _ => each!(self, m => m::legend(b)),
        }
    }

    /// Creates the schema and removes every job.
    pub async fn reset(self, t: &Target) -> anyhow::Result<()> {
        each!(self, m => m::reset(t).await)
    }

    /// A producer.
    pub async fn producer(self, t: &Target) -> anyhow::Result<Producer> {
        Ok(match self {
            System::Stagedoor => Producer::Stagedoor(stagedoor::Producer::connect(t).await?),
            System::Apalis => Producer::Apalis(apalis::Producer::connect(t).await?),
            System::Graphile => Producer::Graphile(graphile::Producer::connect(t).await?),
            System::Bullmq => Producer::Bullmq(bull::Producer::connect(t).await?),
            System::Awa => Producer::Awa(awa_pg::Producer::connect(t).await?),
            System::River => Producer::River(river::Producer::connect(t).await?),
            System::Ruststream | System::RuststreamBatch => {
                Producer::Ruststream(ruststream::Producer::connect(t).await?)
            }
            System::Raw => Producer::Raw(raw::Producer::connect(t).await?),
            System::RawGuarded => Producer::RawGuarded(raw_guarded::Producer::connect(t).await?),
        })
    }

    /// Runs a worker until the process is killed.
    pub async fn work(self, t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
        match self {
            System::RuststreamBatch => ruststream::work_batch(t, hook).await,
            _ => each!(self, m => m::work(t, hook).await),
        }
    }
}

/// Any system's producer.
#[allow(clippy::large_enum_variant)]
pub enum Producer {
    /// stagedoor-jobs.
    Stagedoor(stagedoor::Producer),
    /// apalis.
    Apalis(apalis::Producer),
    /// graphile_worker.
    Graphile(graphile::Producer),
    /// bullmq-official.
    Bullmq(bull::Producer),
    /// awa.
    Awa(awa_pg::Producer),
    /// riverqueue.
    River(river::Producer),
    /// ruststream.
    Ruststream(ruststream::Producer),
    /// raw, minimal loop.
    Raw(raw::Producer),
    /// raw, same guarantees.
    RawGuarded(raw_guarded::Producer),
}

macro_rules! each_producer {
    ($p:expr, $x:ident => $e:expr) => {
        match $p {
            Producer::Stagedoor($x) => $e,
            Producer::Apalis($x) => $e,
            Producer::Graphile($x) => $e,
            Producer::Bullmq($x) => $e,
            Producer::Awa($x) => $e,
            Producer::River($x) => $e,
            Producer::Ruststream($x) => $e,
            Producer::Raw($x) => $e,
            Producer::RawGuarded($x) => $e,
        }
    };
}

impl Producer {
    /// One job, one API call.
    pub async fn one(&mut self, job: BenchJob) -> anyhow::Result<()> {
        each_producer!(self, p => p.one(job).await)
    }
    /// Jobs in one bulk call.
    pub async fn bulk(&mut self, jobs: &[BenchJob]) -> anyhow::Result<()> {
        each_producer!(self, p => p.bulk(jobs).await)
    }
}
