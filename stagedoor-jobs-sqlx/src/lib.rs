#![cfg_attr(docsrs, feature(doc_cfg))]
//! # stagedoor-jobs-sqlx
//!
//! The SQL backend of stagedoor-jobs: jobs are rows of a table whose struct carries
//! `#[derive(Inbox)]`, on SQLite (embedded, no server) or Postgres, through sqlx.
//!
//! - A claim leases due rows (`locked_until = now + lease`) and counts the attempt in the same
//!   statement; Postgres claims in batches with `FOR UPDATE SKIP LOCKED`.
//! - Settlements are fenced on the lease the delivery holds: a worker whose lease was lost
//!   cannot overwrite the row's new owner. The lease defaults to
//!   [`DEFAULT_LEASE`](stagedoor_jobs::broker::DEFAULT_LEASE) (3 s) and is renewed from the claim
//!   until the settlement; a renewal whose reply was lost may have committed, so the fence also
//!   accepts the lease it tried to set.
//! - After a connection error, claims take only fresh rows until the broker has talked to the
//!   database for a whole lease without one: rows whose lease ran out during an outage are
//!   renewed by their owners first.
//! - Due times and leases follow the database's clock (Postgres `now()`, SQLite's `'now'`),
//!   measured by the runtime (`Broker::server_time`).
//! - `retry_after` hides a row until it is due; dead letters move to a group of the same table
//!   (`emails.dead`) or, for a table without a group column, to a table with the same columns.
//! - Postgres workers wake on `LISTEN/NOTIFY`; SQLite workers on their own process's publishes,
//!   and within milliseconds on other processes' commits (a watcher of the database files).
//! - Settlements are applied in batches: whatever settled while the previous batch ran (up to
//!   256 rows, each still fenced on its lease) in one transaction: acknowledged rows in one
//!   `DELETE`, retried ones in one `UPDATE`, dead letters one by one. A batch publish is
//!   multi-row `INSERT`s in one transaction.
//! - SQLite runs in WAL mode with `synchronous = NORMAL` (a commit survives the process
//!   crashing; a power loss may roll back the last commits, never corrupts). For `FULL`, pass
//!   your own pool ([`SqlxBroker::new`]).
//!
//! # The index a job table needs
//! The claim reads due rows of a group in `(retry_after, id)` order. Give the table the index
//! that serves it, or every claim sorts the whole backlog:
//!
//! ```sql
//! CREATE INDEX mail_jobs_due ON mail_jobs (name, retry_after, id); -- (group, due, id)
//! ```
//!
//! ```no_run
//! # use stagedoor_jobs_sqlx::{SqlxBroker, InboxQueue};
//! # use sqlx::sqlite::SqlitePoolOptions;
//! // Nothing connects here: the pool is built when the service starts.
//! let broker = SqlxBroker::from_url("sqlite://mail.db?mode=rwc", SqlitePoolOptions::new());
//! ```

mod batch;
mod broker;
mod catalog;
mod columns;
mod dialect;
mod floor;
mod headers;
mod locks;
mod publish;
mod queue;
mod receipt;
mod route;
mod rows;
mod sql;

pub use broker::SqlxBroker;
pub use dialect::Dialect;
pub use queue::InboxQueue;
pub use receipt::SqlReceipt;
pub use route::SqlxRoute;

/// The row type of a route whose table is described at run time
/// ([`SqlxBroker::route_with_table`]); its own `TABLE` is never read.
#[derive(Debug)]
pub struct AnyTable;

impl stagedoor_jobs::Inbox for AnyTable {
    const TABLE: stagedoor_jobs::inbox::Table = stagedoor_jobs::inbox::Table {
        schema: None,
        name: "any_table",
        id: stagedoor_jobs::inbox::Column {
            name: "id",
            generated: true,
            ty: stagedoor_jobs::inbox::ColumnType::Integer,
        },
        group: None,
        fifo: false,
        attempt: None,
        retry_after: None,
        locked_until: None,
        payload: stagedoor_jobs::inbox::Column {
            name: "payload",
            generated: false,
            ty: stagedoor_jobs::inbox::ColumnType::Bytes,
        },
        enqueued_at: None,
        last_error: None,
        headers: None,
        columns: &[],
    };
}
pub use stagedoor_jobs::Inbox;
// pub use stagedoor_jobs_macros::Inbox; (derive: lands with the macro)

/// Everything a mailer needs: `use stagedoor_jobs_sqlx::prelude::*;`.
///
/// Besides the core prelude it brings the traits a producer without a service calls:
/// [`Inspect`](stagedoor_jobs::Inspect) (`connect()`), [`Broker`](stagedoor_jobs::Broker)
/// and [`Publish`](stagedoor_jobs::Publish) (`publish_job`, `publish_jobs`).
pub mod prelude {
    pub use crate::{Inbox, InboxQueue, SqlxBroker};
    pub use chrono::{DateTime, Utc};
    pub use stagedoor_jobs::prelude::*;
    pub use stagedoor_jobs::{Broker, Inspect, Publish};
    pub use std::time::Duration;
}
