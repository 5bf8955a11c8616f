#![cfg_attr(docsrs, feature(doc_cfg))]
//! # stagedoor-jobs-sqlx
//!
//! The SQL backend of stagedoor-jobs: jobs are rows of your own table, described by a struct with
//! `#[derive(Inbox)]`, on SQLite (embedded, no server) or Postgres, through sqlx. The handler
//! model, outcomes, the scheduler and testing are in the core's guide
//! ([`stagedoor_jobs::guide`]); this page is what is particular to SQL.
//!
//! ## Cargo features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `sqlite` | yes | SQLite (builds `libsqlite3-sys`) |
//! | `postgres` | no | Postgres |
//!
//! A Postgres-only service builds no SQLite:
//!
//! ```toml
//! stagedoor-jobs-sqlx = { version = "0.1", default-features = false, features = ["postgres"] }
//! ```
//!
//! ## A job table
//!
//! The table is yours: create it in your migrations. Each column plays a role, named on the
//! struct's field:
//!
//! | field | role | SQLite | Postgres |
//! |---|---|---|---|
//! | `#[field(id)]` (`generated`: the database fills it) | the row id; `i64`, or a `String` the publisher mints (a job id published twice is then stored once) | `INTEGER PRIMARY KEY` (exactly; `INT PRIMARY KEY` is no row id), or `TEXT` | `BIGSERIAL`, an identity, or `TEXT` |
//! | `#[field(group)]` (`group, fifo`: one row of a group in work at a time) | the queue a row waits in; optional (a table without it is one queue) | `TEXT` | `TEXT` |
//! | `#[field(attempt, generated)]` | the number of the row's next delivery; needed for a cap | `INTEGER ... DEFAULT 1` | `SMALLINT ... DEFAULT 1` |
//! | `#[field(retry_after)]` | when the row is due | `TEXT` | `TIMESTAMPTZ` (not `timestamp`) |
//! | `#[field(locked_until)]` | the lease of a claimed row; nullable | `TEXT` | `TIMESTAMPTZ` |
//! | `#[field(payload)]` | the job's message: `Vec<u8>` or `String` (JSON text) | `BLOB` / `TEXT` | `BYTEA` / `TEXT` |
//! | `#[field(enqueued_at)]`, `#[field(last_error)]`, `#[field(headers)]` | optional: when it was published, the last error, the job's kind, id, request id and trace (JSON text; needed for kinds) | `TEXT` | `TIMESTAMPTZ`, `TEXT`, `TEXT` |
//!
//! At start the broker prepares every statement it will run against the table and compares each
//! role column's type with its field: a missing table, a misspelt column, a wrong type, a cap on
//! a table without an attempt column stop the service, each named with the fix.
//!
//! **Give the table the index the claim reads**, `(group, retry_after, id)`, or every claim sorts
//! the whole backlog. The mailer's table on SQLite:
//!
//! ```sql
//! CREATE TABLE mail_jobs (
//!     id INTEGER PRIMARY KEY,
//!     name TEXT NOT NULL,
//!     attempt INTEGER NOT NULL DEFAULT 1,
//!     retry_after TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%f+00:00', 'now')),
//!     locked_until TEXT,
//!     payload BLOB NOT NULL
//! );
//! CREATE INDEX mail_jobs_due ON mail_jobs (name, retry_after, id);
//! ```
//!
//! and on Postgres:
//!
//! ```sql
//! CREATE TABLE mail_jobs (
//!     id BIGSERIAL PRIMARY KEY,
//!     name TEXT NOT NULL,
//!     attempt SMALLINT NOT NULL DEFAULT 1,
//!     retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
//!     locked_until TIMESTAMPTZ,
//!     payload BYTEA NOT NULL
//! );
//! CREATE INDEX mail_jobs_due ON mail_jobs (name, retry_after, id);
//! ```
//!
//! ## A service
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")] // the examples are SQLite's
//! # mod example {
//! use sqlx::sqlite::SqlitePoolOptions;
//! use stagedoor_jobs_sqlx::prelude::*;
//!
//! #[derive(Inbox)]
//! #[inbox(table = "mail_jobs")] // optional: schema = "jobs"
//! struct SendMail {
//!     #[field(id, generated)]
//!     id: i64,
//!     #[field(group)]
//!     name: String,
//!     #[field(attempt, generated)]
//!     attempt: i16,
//!     #[field(retry_after)]
//!     retry_after: DateTime<Utc>,
//!     #[field(locked_until)]
//!     locked_until: Option<DateTime<Utc>>,
//!     #[field(payload)]
//!     payload: Vec<u8>,
//! }
//!
//! #[derive(serde::Deserialize)]
//! struct Mail {
//!     to: String,
//! }
//!
//! #[subscriber(InboxQueue::<SendMail>::new("emails"))]
//! async fn send(mail: &Mail) -> HandlerOutcome {
//!     println!("sending to {}", mail.to);
//!     HandlerOutcome::ack()
//! }
//!
//! /// Reads the dead letters: the `emails.dead` group of the same table.
//! #[subscriber(InboxQueue::<SendMail>::new("emails.dead"))]
//! async fn review(mail: &Mail) -> HandlerOutcome {
//!     eprintln!("not sent to {}: needs a person", mail.to);
//!     HandlerOutcome::ack()
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // Nothing connects here: the pool is built when the service starts.
//! let broker = SqlxBroker::from_url("sqlite://mail.db?mode=rwc", SqlitePoolOptions::new());
//! Service::new(AppInfo::new("mailer", "0.1.0"))
//!     .with_broker(broker.route::<SendMail>("emails"), |b| {
//!         b.include(send).max_attempts(nonzero!(5u32)).dead_letter("emails.dead");
//!         b.include(review);
//!     })
//!     .run()
//!     .await?;
//! # Ok(()) }
//! # }
//! # fn main() {}
//! ```
//!
//! A subscriber on `InboxQueue::<SendMail>` can only be mounted on a route of `SendMail`'s table:
//! on another table or backend it does not compile. With a pool of your own (SQLite's
//! `synchronous = FULL`, your migrations' pool), use [`SqlxBroker::new`].
//!
//! ## One mount function for SQLite and Postgres
//!
//! The subscriptions, written once for both databases, state the bound the compiler checks:
//! [`QueueFor<B>`](stagedoor_jobs::QueueFor), which `InboxQueue<Row>` implements for the routes
//! of `Row` on every database (`SqlxRoute<Sqlite, Row>`, `SqlxRoute<Postgres, Row>`):
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")] // the examples are SQLite's
//! # mod example {
//! use sqlx::sqlite::SqlitePoolOptions;
//! use stagedoor_jobs::{QueueFor, RouteBuilder};
//! use stagedoor_jobs_sqlx::prelude::*;
//! # #[derive(Inbox)]
//! # #[inbox(table = "mail_jobs")]
//! # struct SendMail {
//! #     #[field(id, generated)] id: i64,
//! #     #[field(group)] name: String,
//! #     #[field(attempt, generated)] attempt: i16,
//! #     #[field(retry_after)] retry_after: DateTime<Utc>,
//! #     #[field(locked_until)] locked_until: Option<DateTime<Utc>>,
//! #     #[field(payload)] payload: Vec<u8>,
//! # }
//!
//! #[subscriber(InboxQueue::<SendMail>::new("emails"))]
//! async fn send(to: &String) -> HandlerOutcome {
//!     println!("sending to {to}");
//!     HandlerOutcome::ack()
//! }
//!
//! fn mount<B: Broker>(b: &mut RouteBuilder<B>)
//! where
//!     InboxQueue<SendMail>: QueueFor<B>,
//! {
//!     b.include(send).max_attempts(nonzero!(5u32)).dead_letter("emails.dead");
//! }
//!
//! fn service(url: &str) -> Service {
//!     let app = Service::new(AppInfo::new("mailer", "0.1.0"));
//!     #[cfg(feature = "postgres")]
//!     if url.starts_with("postgres") {
//!         let pg = SqlxBroker::from_url(url, sqlx::postgres::PgPoolOptions::new());
//!         return app.with_broker(pg.route::<SendMail>("emails"), mount);
//!     }
//!     let lite = SqlxBroker::from_url(url, SqlitePoolOptions::new());
//!     app.with_broker(lite.route::<SendMail>("emails"), mount)
//! }
//! # }
//! # fn main() {}
//! ```
//!
//! ## Publishing
//!
//! A table's route publishes: [`SqlxRoute::publish`] is one `INSERT` (with its `NOTIFY` on
//! Postgres), [`SqlxRoute::publish_in`] publishes inside your own transaction, so the job exists
//! if and only if it commits. A batch (`publish_jobs`) is one transaction. A producer that runs no service connects the route first; the prelude brings the
//! traits it needs ([`Inspect`](stagedoor_jobs::Inspect) for `connect()`,
//! [`Publish`](stagedoor_jobs::Publish), [`Broker`](stagedoor_jobs::Broker)):
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")] // the examples are SQLite's
//! # mod example {
//! use sqlx::sqlite::SqlitePool;
//! use stagedoor_jobs_sqlx::prelude::*;
//! # #[derive(Inbox)]
//! # #[inbox(table = "mail_jobs")]
//! # struct SendMail {
//! #     #[field(id, generated)] id: i64,
//! #     #[field(group)] name: String,
//! #     #[field(attempt, generated)] attempt: i16,
//! #     #[field(retry_after)] retry_after: DateTime<Utc>,
//! #     #[field(locked_until)] locked_until: Option<DateTime<Utc>>,
//! #     #[field(payload)] payload: Vec<u8>,
//! # }
//!
//! #[derive(serde::Serialize)]
//! struct Mail {
//!     to: String,
//! }
//!
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = SqlitePool::connect("sqlite://mail.db").await?;
//! let route = SqlxBroker::new(pool.clone()).route::<SendMail>("emails");
//! route.connect().await?;
//!
//! // One job, now or later.
//! let job = Job::new("emails", &Mail { to: "ada@example.com".into() })?;
//! let published = route.publish_job(job.after(Duration::from_secs(60))).await?;
//! println!("stored as {}", published.id());
//!
//! // A job that exists only if the order does.
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES (?)").bind(4471).execute(&mut *tx).await?;
//! route.publish_in(&mut *tx, Job::new("emails", &Mail { to: "ada@example.com".into() })?).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! # }
//! # fn main() {}
//! ```
//!
//! Postgres workers wake on `LISTEN/NOTIFY` (a connection of its own, outside the pool); SQLite
//! workers wake at once on their own process's publishes, and within milliseconds on other
//! processes' commits (a thread watching the database files), otherwise every poll interval
//! ([`SqlxBroker::poll_interval`], 200 ms).
//!
//! ## Dead letters
//!
//! A mount's dead letter is either
//!
//! - a group of the same table (`.dead_letter("emails.dead")`): the row stays where it is, its
//!   group renamed, its payload as it was; a subscriber of that group reads it; or
//! - for a table without a group column, another table with the same columns
//!   (`.dead_letter("plain_jobs_dead")`; a job no mount can take, such as one of an unknown
//!   kind, goes to `<table>_dead`): the row is copied there with all its columns, **its id included**, and
//!   deleted, in one transaction; a replay copies it back.
//!
//! A dead-letter table needs every column of the row; its id needs no default (the id is
//! copied), and must not take ids of its own. On SQLite the job table's id must be
//! `INTEGER PRIMARY KEY AUTOINCREMENT` (the service refuses to start otherwise): without it SQLite
//! gives a new row the id of the last row moved out, which could then never be dead-lettered. On
//! Postgres, **do not** write `CREATE TABLE t_dead (LIKE t INCLUDING DEFAULTS)`
//! alone: with a `serial` id the copy's id keeps the default `nextval('t_id_seq')`, so the dead
//! table depends on `t`'s sequence and `DROP TABLE t` then fails ("cannot drop table t because
//! other objects depend on it"). Drop the copied id default:
//!
//! ```sql
//! CREATE TABLE plain_jobs (
//!     id BIGSERIAL PRIMARY KEY,
//!     attempt SMALLINT NOT NULL DEFAULT 1,
//!     retry_after TIMESTAMPTZ NOT NULL DEFAULT now(),
//!     locked_until TIMESTAMPTZ,
//!     payload BYTEA NOT NULL
//! );
//! CREATE INDEX plain_jobs_due ON plain_jobs (retry_after, id);
//! CREATE TABLE plain_jobs_dead (LIKE plain_jobs INCLUDING DEFAULTS, PRIMARY KEY (id));
//! ALTER TABLE plain_jobs_dead ALTER COLUMN id DROP DEFAULT;  -- the id comes with the row
//! ```
//!
//! (An identity id, `GENERATED ALWAYS AS IDENTITY`, is not copied by `INCLUDING DEFAULTS`: the
//! `ALTER` is then not needed.) A dead letter's `attempt` is the attempts it spent, and
//! `last_error` (where the table has one) its error.
//!
//! ## Bookkeeping tables
//!
//! The backend creates its own tables on first use, in the job table's database: `stagedoor_locks`
//! (scheduler ticks' guards and other locks: `lock_key`, `token`, `until_at`),
//! `stagedoor_schedules` (each schedule's last tick), `stagedoor_workers` and `stagedoor_minutes`
//! (the workers' reports and per-minute counts the dashboard shows). `stagedoor_records` (the
//! [`Records`](stagedoor_jobs::broker::Records): `record_key`, `value`, `version`,
//! `expires_at`, with an index of the expiries, `stagedoor_records_expiry`) is created at the
//! first use of records.
//!
//! ## How it works
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

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!(
    "stagedoor-jobs-sqlx speaks no database: enable its feature `sqlite` (the default) or `postgres`, or both"
);

#[doc(hidden)]
pub mod __fuzz;
mod batch;
mod broker;
mod catalog;
mod columns;
mod dead_move;
mod dialect;
mod due;
mod exec;
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
        priority: None,
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
