#![cfg_attr(docsrs, feature(doc_cfg))]
//! # stagedoor-jobs
//!
//! Background jobs for Rust services: handlers you annotate, retries with a backoff per mount,
//! caps and dead letters that contain poison jobs, a scheduler, and a harness to test it all,
//! on Redis Streams (`stagedoor-jobs-redis`), an SQL table (`stagedoor-jobs-sqlx`, SQLite or
//! Postgres) or in memory.
//!
//! ```
//! use stagedoor_jobs::prelude::*;
//! # #[derive(serde::Deserialize)] struct Mail { to: String }
//!
//! #[subscriber("emails")]
//! async fn send(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
//!     let _ = (&mail.to, attempt);
//!     HandlerOutcome::ack()
//! }
//!
//! # fn build() -> Service {
//! let broker = MemoryBroker::new();
//! Service::new(AppInfo::new("mailer", "0.1.0")).with_broker(broker, |b| {
//!     b.include(send).max_attempts(nonzero!(5u32)).dead_letter("emails.dead");
//! })
//! # }
//! ```
//!
//! ## Outcomes
//!
//! | outcome | what happens |
//! |---|---|
//! | `ack()` | the job is done and leaves the queue |
//! | `retry()` | a failed attempt: the job comes back after the mount's backoff (none declared: at once; a mount without a cap waits at least [`UNCAPPED_FLOOR`]) |
//! | `retry_after(d)` | a failed attempt: the job comes back no earlier than now + d, durably |
//! | `drop()` | done without success: leaves the queue as `ack` does, logged; no dead letter |
//! | `Err(e)` returned | a failed attempt, like `retry()`, with `e` (and its source chain) kept as the error |
//! | panic in the handler | caught: a failed attempt, with the panic message and location as error and traceback; the worker lives on |
//! | payload does not decode | a failed attempt with a decoding error; `.on_decode_error(OnDecodeError::DeadLetter)` dead-letters at once |
//!
//! A failed attempt that reaches `max_attempts` is not retried: the job moves to its dead
//! letter with everything it had plus the error, traceback, attempts and the time it failed.
//! A mount without `max_attempts` never retries faster than [`UNCAPPED_FLOOR`] (1 s doubling
//! to 60 s), whatever its backoff or the handler's `retry_after` asked: a job that always fails
//! there costs a delivery a minute, not thousands a second.
//!
//! ## No silent stop
//!
//! The runtime never trusts a broker's answer with a panic (a claim returning more deliveries
//! than asked is processed and logged). Each queue's claim loop, the metrics monitor and the
//! scheduler run [supervised](supervise): a panic is logged at ERROR and the task restarted
//! with backoff, its running handlers left running; a task that keeps failing
//! ([`Service::restart_limit`]) stops the service with [`ServiceError::Failed`], which
//! [`Running::failed`] and `Service::run` report. [`Running::health`] tells a readiness probe
//! how every queue is doing.

// The macros name `::stagedoor_jobs::__private`; this makes that path work inside this crate.
#[allow(unused_extern_crates)]
extern crate self as stagedoor_jobs;

pub mod activity;
mod backoff;
pub mod broker;
mod clock;
mod counters;
mod envelope;
mod extract;
mod handler;
mod health;
pub mod inbox;
mod monitor;
mod mount;
mod outcome;
mod panic;
mod report;
mod runtime;
pub mod schedule;
mod service;
mod subscription;
pub mod supervise;
mod tally;

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "testing")]
pub mod memory;
#[cfg(feature = "testing")]
pub mod testing;

pub use backoff::{Backoff, Exponential, Fixed, FullJitter, Immediate, UNCAPPED_FLOOR};
pub use broker::{
    Activity, Broker, BrokerError, DeadLetter, DeadLetters, DeadSelector, Inspect, Locks, Publish,
    Published, QueueStats, ReplayReport,
};
pub use clock::{Clock, SYNC_EVERY};
pub use envelope::{Envelope, Headers, Job, JobId, RunAt};
pub use extract::{Ctx, Data, FromJob, JobContext, Key, Rejection, State, keys};
pub use handler::{BoxFuture, Handler, HandlerFn};
pub use health::{Health, LoopState, QueueHealth, ServiceState, TaskHealth};
pub use inbox::Inbox;
pub use monitor::DeadLetterAlert;
pub use mount::{
    DEFAULT_CONCURRENCY, Mount, OnDecodeError, RouteBuilder, Set, Undeclared, Unset, steps,
};
pub use outcome::{BoxError, Failure, FailureCause, HandlerOutcome, IntoOutcome};
pub use panic::{TRACEBACK_MAX_BYTES, TRACEBACK_MAX_FRAMES};
pub use schedule::{CronExpr, Missed, Schedule};
pub use service::{AppInfo, Running, Service, ServiceError};
/// `#[derive(Inbox)]`: describes a job table for the SQL backend (the trait of the same name).
pub use stagedoor_jobs_macros::Inbox;
pub use stagedoor_jobs_macros::{cron, subscriber};
pub use subscription::{ByName, IntoSubscriber, QueueDescriptor, QueueFor, Subscriber};

#[cfg(feature = "testing")]
pub use memory::MemoryBroker;
#[cfg(feature = "testing")]
pub use testing::TestApp;

/// A `NonZero` integer from a literal, checked when the program compiles: `nonzero!(5u32)`.
/// `nonzero!(0u32)` does not compile, so a mount cannot declare a cap of 0.
#[macro_export]
macro_rules! nonzero {
    ($n:expr) => {
        const {
            match ::core::num::NonZero::new($n) {
                ::core::option::Option::Some(n) => n,
                ::core::option::Option::None => {
                    ::core::panic!(
                        "nonzero!(0): a cap of 0 attempts would never run the job; use 1 or more"
                    )
                }
            }
        }
    };
}

/// Everything a handler file needs: `use stagedoor_jobs::prelude::*;`.
pub mod prelude {
    pub use crate::{
        AppInfo, Ctx, Data, Exponential, Fixed, FullJitter, HandlerOutcome, Immediate, Job, JobId,
        Missed, OnDecodeError, Schedule, Service, Subscriber, cron, keys, nonzero, subscriber,
    };
    #[cfg(feature = "testing")]
    pub use crate::{MemoryBroker, TestApp};
}

/// What the macros' expansions name. Not a public API: it changes without notice.
#[doc(hidden)]
pub mod __private {
    pub use crate::extract::FromJob;
    pub use crate::inbox::{Column, ColumnType, Inbox, Table, roles};
    pub use crate::outcome::IntoOutcome;
    pub use crate::schedule::CronExpr;
    pub use crate::subscription::{ByName, IntoSubscriber, QueueDescriptor, Subscriber};

    /// What a message type must be; its own trait so that the error names the fix.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be a job's message",
        label = "not a message",
        note = "a message is decoded from the job's payload: derive `serde::Deserialize` for `{Self}`; it is owned data (`Send + Sync + 'static`)"
    )]
    pub trait Message: serde::de::DeserializeOwned + Send + Sync + 'static {}
    impl<T: serde::de::DeserializeOwned + Send + Sync + 'static> Message for T {}

    /// What the type of a `#[subscriber(Type::new(..))]` queue must be; its own trait so that
    /// the error names the fix.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` is not a queue descriptor",
        label = "not a queue",
        note = "the queue is a name (`\"emails\"`) or a queue descriptor (`Stream::new(\"jobs\")`): implement `stagedoor_jobs::QueueDescriptor` for `{Self}`, or subscribe by name"
    )]
    pub trait Queue: QueueDescriptor {}
    impl<T: QueueDescriptor> Queue for T {}

    /// Compile-time check that `T` is an extractor (spanned on the argument by the macro).
    pub const fn assert_extractor<T: FromJob>() {}
    /// Compile-time check that `T` is a handler result (spanned on the return type).
    pub const fn assert_outcome<T: IntoOutcome>() {}
    /// Compile-time check that `T` can be a message.
    pub const fn assert_message<T: Message>() {}
    /// Compile-time check that `T` is a queue descriptor.
    pub const fn assert_queue<T: Queue>() {}
}
