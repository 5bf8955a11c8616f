//! One module per system. Each exposes the same five items, used through [`System`]:
//!
//! ```text
//! pub fn supports(backend: Backend) -> bool;
//! pub const HAS_BULK: bool;                 // the system has a bulk enqueue API
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
pub mod graphile;
pub mod raw;
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
    /// ruststream-sqlx / ruststream-fred.
    Ruststream,
    /// The server's raw limit: a hand-written loop doing only the protocol work.
    Raw,
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
            System::Ruststream => {
                use ruststream as $m;
                $e
            }
            System::Raw => {
                use raw as $m;
                $e
            }
        }
    };
}

impl System {
    /// Every system, in table order.
    pub const ALL: [System; 5] = [
        System::Stagedoor,
        System::Apalis,
        System::Graphile,
        System::Ruststream,
        System::Raw,
    ];

    /// The name in tables.
    pub fn name(self) -> &'static str {
        match self {
            System::Stagedoor => "stagedoor-jobs",
            System::Apalis => "apalis",
            System::Graphile => "graphile_worker",
            System::Ruststream => "ruststream",
            System::Raw => "raw limit",
        }
    }

    /// The flag value (`--systems`).
    pub fn flag(self) -> &'static str {
        match self {
            System::Stagedoor => "stagedoor",
            System::Apalis => "apalis",
            System::Graphile => "graphile",
            System::Ruststream => "ruststream",
            System::Raw => "raw",
        }
    }

    /// Whether the system runs on `b`.
    pub fn supports(self, b: Backend) -> bool {
        each!(self, m => m::supports(b))
    }

    /// Whether it has a bulk enqueue.
    pub fn has_bulk(self) -> bool {
        each!(self, m => m::HAS_BULK)
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
            System::Ruststream => Producer::Ruststream(ruststream::Producer::connect(t).await?),
            System::Raw => Producer::Raw(raw::Producer::connect(t).await?),
        })
    }

    /// Runs a worker until the process is killed.
    pub async fn work(self, t: &Target, hook: Arc<Hook>) -> anyhow::Result<()> {
        each!(self, m => m::work(t, hook).await)
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
    /// ruststream.
    Ruststream(ruststream::Producer),
    /// raw.
    Raw(raw::Producer),
}

macro_rules! each_producer {
    ($p:expr, $x:ident => $e:expr) => {
        match $p {
            Producer::Stagedoor($x) => $e,
            Producer::Apalis($x) => $e,
            Producer::Graphile($x) => $e,
            Producer::Ruststream($x) => $e,
            Producer::Raw($x) => $e,
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
