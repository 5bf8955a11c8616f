#![cfg_attr(docsrs, feature(doc_cfg))]
//! # stagedoor-jobs
//!
//! Background jobs for Rust services: handlers you annotate, retries with a backoff per mount,
//! caps and dead letters that contain poison jobs, a scheduler, health and metrics, and a
//! harness to test it all, on Redis Streams (`stagedoor-jobs-redis`), an SQL table
//! (`stagedoor-jobs-sqlx`, SQLite or Postgres) or in memory (feature `testing`).
//!
//! ```
//! use stagedoor_jobs::prelude::*;
//! use stagedoor_jobs::{Broker, RouteBuilder};
//!
//! #[derive(serde::Deserialize)]
//! struct Mail {
//!     to: String,
//! }
//!
//! #[subscriber("emails")]
//! async fn send(mail: &Mail, Ctx(attempt): Ctx<keys::Attempt>) -> HandlerOutcome {
//!     tracing::info!(to = %mail.to, ?attempt, "sending");
//!     HandlerOutcome::ack()
//! }
//!
//! fn mount<B: Broker>(b: &mut RouteBuilder<B>) {
//!     b.include(send).max_attempts(nonzero!(5u32)).dead_letter("emails.dead");
//! }
//!
//! /// The service on any backend: `RedisBroker`, an SQL table's route, or `MemoryBroker`.
//! fn service<B: Broker>(broker: B) -> Service {
//!     Service::new(AppInfo::new("mailer", "0.1.0")).with_broker(broker, mount)
//! }
//! // main: service(broker).run().await?  (until SIGINT/SIGTERM, then a graceful stop)
//! ```
//!
//! ## The guide
//!
//! The [`guide`] module is the manual, one chapter per page:
//!
//! - [handlers and mounts](guide::handlers): the message, extractors (`Ctx`, `Data<T>`),
//!   `#[subscriber]`, mount steps, a mount function generic over backends;
//! - [outcomes](guide::outcomes): ack, retry, retry after, drop, errors and panics, caps, dead
//!   letters, backoff;
//! - [publishing](guide::publishing): jobs, request ids and traces, publishing with or without
//!   a service;
//! - [the scheduler](guide::scheduler): schedules, missed ticks, the keys and tables it writes;
//! - [testing](guide::testing): `MemoryBroker` and `TestApp`;
//! - [operations](guide::operations): health, metrics, the dead-letter alert, dead letters, the
//!   command line.
//!
//! The backends' guides are their crates' front pages: `stagedoor-jobs-sqlx` (job tables,
//! `#[derive(Inbox)]`, SQLite and Postgres) and `stagedoor-jobs-redis` (streams, keys, Cluster,
//! TLS).
//!
//! ## Cargo features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `testing` | no | `MemoryBroker` and `TestApp`, for your tests |
//! | `conformance` | no | the suite every backend runs (`conformance_tests!`) |
//! | `opentelemetry` | no | a publish injects the current span's W3C trace context (`traceparent`, `tracestate`) into the job's headers; the job's span takes it as its parent (`tracing-opentelemetry`) |
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

#[doc(hidden)]
pub mod __fuzz;
pub mod activity;
mod backoff;
pub mod broker;
mod claim_order;
mod clock;
mod counters;
mod envelope;
mod extract;
pub mod flow;
pub mod guide;
mod handler;
mod health;
pub mod inbox;
pub mod kit;
mod monitor;
mod mount;
#[cfg(feature = "opentelemetry")]
pub mod otel;
mod outcome;
mod panic;
mod report;
pub mod results;
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
    Activity, Broker, BrokerError, Cancelled, ClaimOrder, DeadLetter, DeadLetters, DeadSelector,
    Inspect, Locks, Permits, Publish, Published, QueueStats, ReplayReport,
};
pub use clock::{Clock, MAX_DELAY, SYNC_EVERY};
pub use envelope::{
    Envelope, FAIR_CLAIM_EVERY, Headers, Job, JobId, Priority, RunAt, UNIQUE_HEADER,
    UNIQUE_PENDING_MAX,
};
pub use extract::{
    Cancellation, Ctx, Data, FlowInfo, FromJob, JobContext, JobProgress, Key, Rejection, State,
    keys,
};
pub use flow::{Batch, Flow, Flows, OnParentFailure};
pub use handler::{BoxFuture, Handler, HandlerFn};
pub use health::{Health, LoopState, QueueHealth, ServiceState, TaskHealth};
pub use inbox::Inbox;
pub use monitor::DeadLetterAlert;
pub use mount::{
    DEFAULT_CONCURRENCY, Mount, OnDecodeError, RouteBuilder, Set, Undeclared, Unset, steps,
};
pub use outcome::{BoxError, Failure, FailureCause, HandlerOutcome, IntoOutcome};
pub use panic::{TRACEBACK_MAX_BYTES, TRACEBACK_MAX_FRAMES};
pub use results::{JobResult, Progress, ResultError, Results};
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
        AppInfo, Batch, Ctx, Data, Exponential, Fixed, Flow, FlowInfo, Flows, FullJitter,
        HandlerOutcome, Immediate, Job, JobId, JobProgress, Missed, OnDecodeError, OnParentFailure,
        Priority, Results, Schedule, Service, Subscriber, cron, keys, nonzero, subscriber,
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
