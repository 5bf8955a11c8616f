//! `SqlxRoute<DB, Row>`: one job table of a database, and its broker traits.
//!
//! Written once for every [`Dialect`]: what SQLite and Postgres do their own way is in
//! `dialect/` (opening, waking workers, the driver calls) and in the statement text (`sql`).
//! This file holds the route, what its parts share (the pool, running a statement, reading a
//! dead letter) and the [`Broker`] impl, whose work is in files along the job's path:
//!
//! - `route/claim.rs`: claiming rows (and waiting when there are none), renewing leases;
//! - `route/unreadable.rs`: rows a claim cannot read, returned as unreadable items and moved
//!   to the dead letter the runtime picks;
//! - `route/settle.rs`: acknowledgements, retries and dead-lettering (batched, see `batch.rs`);
//! - `route/publish.rs`: publishing, in a batch, in the caller's transaction, once per guard;
//! - `route/check.rs`: the startup check of the table against the mounts;
//! - `route/dead.rs`: [`DeadLetters`](stagedoor_jobs::broker::DeadLetters): listing, replaying and purging dead letters;
//! - `route/schedule.rs`: [`Locks`](stagedoor_jobs::broker::Locks): the scheduler's locks and ticks;
//! - `route/records.rs`: [`Records`](stagedoor_jobs::broker::Records): values by key with a
//!   version and a time to live (`stagedoor_records`);
//! - `route/inspect.rs`: [`Inspect`](stagedoor_jobs::broker::Inspect): connecting, queue stats, queues, the next due time;
//! - `route/activity.rs`: [`Activity`](stagedoor_jobs::Activity): workers' reports, per-minute
//!   counts, delayed rows.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Database;
use stagedoor_jobs::broker::{
    Broker, BrokerError, ClaimOrder, Claimed, DeadLetter, Delivery, MountInfo, Problem, Published,
    Settled, Settlement, Unreadable,
};
use stagedoor_jobs::inbox::{Table, is_plain_identifier};
use stagedoor_jobs::kit::lock;
use stagedoor_jobs::{Clock, Envelope, Inbox, JobId};

use crate::batch::SettleReq;
use crate::broker::SqlxBroker;
use crate::dialect::sealed::Value;
use crate::dialect::{Dialect, acquire, db_err};
pub(crate) use crate::exec::{fetch_in, run_in};
use crate::floor::Floors;
use crate::headers::HeaderDoc;
use crate::receipt::SqlReceipt;
use crate::rows::{RowRead, Vals, attempt_number, read, read_claimed, time_at};
use crate::sql::{Flavor, Statements, Stmt, validate};

mod activity;
mod check;
mod claim;
mod dead;
mod inspect;
mod publish;
mod records;
mod schedule;
mod settle;
mod unreadable;

/// A queue whose last claim found nothing: until when there is no need to look again, unless
/// something wakes this process.
#[derive(Clone, Copy)]
struct Idle {
    until: tokio::time::Instant,
    wakes: u64,
}

struct RouteInner {
    /// The batched settlements: the channel to their task, started at the first settlement
    /// and again whenever it is found stopped (see `settle_batched`).
    settles: stagedoor_jobs::kit::Batchers<SettleReq>,
    table: Table,
    idle: Mutex<HashMap<String, Idle>>,
    stmts: Result<Arc<Statements>, Vec<String>>,
    dead_tables: Mutex<HashMap<String, Arc<Statements>>>,
    /// The dead letters the mounts declare (recorded by `check`), each with its mount's
    /// queue: data for listings (a declared dead letter is a queue to list and a name to
    /// replay or purge; the queue a dead letter came from when its row does not say). Which
    /// dead letter a job goes to is the runtime's choice, never read from here.
    declared_dead: Mutex<HashMap<String, String>>,
    /// Where each queue's bounded claims start (Postgres).
    floors: Floors,
    /// The rows [`SqlxRoute::fetch`] has read, for tests.
    rows_read: std::sync::atomic::AtomicU64,
    /// The most rows one [`SqlxRoute::fetch`] has returned, for tests.
    largest_read: std::sync::atomic::AtomicU64,
    /// Whether a multi-row insert into a table whose id the database generates returns ids
    /// that tell its rows apart (see `publish.rs`): true until one does not.
    rows_in_order: std::sync::atomic::AtomicBool,
}

/// One job table of a [`SqlxBroker`]: mount subscribers on it, publish into it.
pub struct SqlxRoute<DB: Database, Row> {
    broker: SqlxBroker<DB>,
    default_group: Arc<str>,
    inner: Arc<RouteInner>,
    _row: PhantomData<fn() -> Row>,
}

impl<DB: Database, Row> Clone for SqlxRoute<DB, Row> {
    fn clone(&self) -> Self {
        Self {
            broker: self.broker.clone(),
            default_group: Arc::clone(&self.default_group),
            inner: Arc::clone(&self.inner),
            _row: PhantomData,
        }
    }
}

impl<DB: Database, Row> fmt::Debug for SqlxRoute<DB, Row> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxRoute")
            .field("row", &std::any::type_name::<Row>())
            .field("group", &self.default_group)
            .field("broker", &self.broker)
            .finish()
    }
}

/// Routes are made from their broker.
impl<DB: Dialect> SqlxBroker<DB> {
    /// A route for the job table of `Row`: mount subscribers on it with
    /// `Service::with_broker(broker.route::<Row>("emails"), |b| ..)`. `group` is the queue that
    /// [`SqlxRoute::publish`] uses when a job names none of its own.
    pub fn route<Row: Inbox>(&self, group: impl Into<String>) -> SqlxRoute<DB, Row> {
        SqlxRoute::new(self.clone(), group.into())
    }

    /// A route for a table described at run time (an operator's tool reading any job table);
    /// services use [`route`](Self::route) with their row type.
    pub fn route_with_table(
        &self,
        table: stagedoor_jobs::inbox::Table,
        group: impl Into<String>,
    ) -> SqlxRoute<DB, crate::AnyTable> {
        SqlxRoute::with_table(self.clone(), group.into(), table)
    }
}

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    pub(crate) fn new(broker: SqlxBroker<DB>, group: String) -> Self {
        Self::with_table(broker, group, Row::TABLE)
    }

    pub(crate) fn with_table(broker: SqlxBroker<DB>, group: String, table: Table) -> Self {
        let problems = validate(&table);
        let stmts = if problems.is_empty() {
            Ok(Arc::new(Statements::new(table, DB::FLAVOR)))
        } else {
            Err(problems)
        };
        Self {
            broker,
            default_group: Arc::from(group),
            inner: Arc::new(RouteInner {
                settles: stagedoor_jobs::kit::Batchers::new(),
                table,
                idle: Mutex::new(HashMap::new()),
                stmts,
                dead_tables: Mutex::new(HashMap::new()),
                declared_dead: Mutex::new(HashMap::new()),
                floors: Floors::default(),
                rows_read: std::sync::atomic::AtomicU64::new(0),
                largest_read: std::sync::atomic::AtomicU64::new(0),
                rows_in_order: std::sync::atomic::AtomicBool::new(true),
            }),
            _row: PhantomData,
        }
    }

    /// The broker.
    pub fn broker(&self) -> &SqlxBroker<DB> {
        &self.broker
    }

    /// The group jobs go to when they name none (the route's name).
    pub fn default_group(&self) -> &str {
        &self.default_group
    }

    fn stmts(&self) -> Result<&Arc<Statements>, BrokerError> {
        self.inner
            .stmts
            .as_ref()
            .map_err(|p| BrokerError::Backend(p.join("; ")))
    }

    /// The table's layout.
    pub fn table(&self) -> &Table {
        &self.inner.table
    }

    /// Whether the table has a group column (dead letters are groups), or dead letters are
    /// other tables.
    fn grouped(&self) -> bool {
        self.table().group.is_some()
    }

    /// The statements of the dead-letter table `name`, validated and cached. Only a table
    /// the catalog shows is cached (its name kept for good): asking about names of no table
    /// (an operator's typo, a dashboard's URL) keeps nothing.
    async fn dead_table(&self, name: &str) -> Result<Arc<Statements>, BrokerError> {
        if let Some(s) = lock(&self.inner.dead_tables).get(name) {
            return Ok(Arc::clone(s));
        }
        if !is_plain_identifier(name) {
            return Err(BrokerError::UnknownQueue(format!(
                "{name} (a dead-letter table must be a plain SQL identifier)"
            )));
        }
        let stmts = Arc::clone(self.stmts()?);
        if !self.table_exists(name).await? {
            return Err(BrokerError::UnknownQueue(format!(
                "{name} (there is no table `{name}`: create it with the columns of `{}`)",
                self.table().name
            )));
        }
        let mut cache = lock(&self.inner.dead_tables);
        let s = cache.entry(name.to_owned()).or_insert_with(|| {
            let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
            Arc::new(stmts.for_table(leaked, DB::FLAVOR))
        });
        Ok(Arc::clone(s))
    }

    /// Whether the database has a table (or view) `name` in this route's schema.
    async fn table_exists(&self, name: &str) -> Result<bool, BrokerError> {
        let schema = self.table().schema;
        let (sql, bind) = match DB::FLAVOR {
            Flavor::Postgres => {
                // `to_regclass` resolves the name as the statements do (the search path, or
                // the schema given).
                let qualified = match schema {
                    Some(s) => format!("\"{s}\".\"{name}\""),
                    None => format!("\"{name}\""),
                };
                ("SELECT CAST(to_regclass($1) AS TEXT)".to_owned(), qualified)
            }
            Flavor::Sqlite => {
                let master = match schema {
                    Some(s) => format!("\"{s}\".sqlite_master"),
                    None => "sqlite_master".to_owned(),
                };
                (
                    format!(
                        "SELECT name FROM {master} WHERE type IN ('table', 'view') AND name = $1 COLLATE NOCASE"
                    ),
                    name.to_owned(),
                )
            }
        };
        let mut conn = acquire(self.pool()?).await?;
        let rows = DB::fetch(&mut conn, sql, vec![Value::Text(Some(bind))])
            .await
            .map_err(db_err)?;
        Ok(match rows.first() {
            Some(row) => DB::text(row, 0).map_err(db_err)?.is_some(),
            None => false,
        })
    }

    /// How many dead-letter tables' statements this route keeps (each for a table that
    /// exists). For tests.
    #[doc(hidden)]
    pub fn cached_dead_tables(&self) -> usize {
        lock(&self.inner.dead_tables).len()
    }

    /// The statements that read queue `name`: the table's own for a group (or for the table's
    /// own name), a dead-letter table's otherwise.
    async fn stmts_for(&self, name: &str) -> Result<Arc<Statements>, BrokerError> {
        if self.grouped() || name == self.table().name || name == &*self.default_group {
            Ok(Arc::clone(self.stmts()?))
        } else {
            self.dead_table(name).await
        }
    }

    fn origin_of(&self, dead: &str, doc: &HeaderDoc) -> Option<String> {
        doc.origin
            .clone()
            .or_else(|| lock(&self.inner.declared_dead).get(dead).cloned())
            // A table without a group column has one queue: a dead letter of it failed there,
            // even when no service checked this route (an operator's replay) and the table
            // has no headers column to record the origin.
            .or_else(|| (!self.grouped()).then(|| self.default_group.to_string()))
            .or_else(|| dead.strip_suffix(".dead").map(str::to_owned))
    }

    fn envelope_of(&self, queue: &str, r: &RowRead, doc: &HeaderDoc) -> Envelope {
        let kind = doc.kind.as_deref().unwrap_or(queue);
        let id = doc.job_id.as_deref().unwrap_or(&r.id);
        let enqueued = r.enqueued_at.or(r.due).unwrap_or_else(|| self.broker.now());
        Envelope::stored(JobId::from(id), kind, r.payload.clone(), enqueued)
            .with_attempt(attempt_number(r.attempt, 1))
            .with_headers(doc.headers())
            .with_priority(r.priority)
    }

    fn dead_letter_of(&self, dead: &str, r: &RowRead) -> DeadLetter {
        let doc = HeaderDoc::parse(r.headers.as_deref());
        let origin = self.origin_of(dead, &doc).unwrap_or_default();
        let envelope = self.envelope_of(&origin, r, &doc);
        // A dead letter's row stores the attempts it spent (see `Statements::dead_group`).
        let attempts = attempt_number(r.attempt, 0);
        let error = doc
            .error
            .clone()
            .or_else(|| r.last_error.clone())
            .unwrap_or_default();
        // A row that cannot be read whole is listed with what could be read and its problem.
        let error = match &r.problem {
            Some(p) if error.is_empty() => format!("this row cannot be read: {p}"),
            Some(p) => format!("this row cannot be read: {p} (its last error: {error})"),
            None => error,
        };
        DeadLetter {
            id: r.id.clone(),
            envelope: envelope.with_attempt(attempts),
            origin,
            error,
            traceback: doc.traceback.clone().unwrap_or_default(),
            attempts,
            failed_at: doc.failed_at.or(r.due).unwrap_or_else(|| self.broker.now()),
        }
    }

    /// The pool, once the service has started.
    pub(crate) fn pool(&self) -> Result<&sqlx::Pool<DB>, BrokerError> {
        self.broker.connected_pool()
    }

    /// Runs `stmt` on a connection of the pool; the rows it changed.
    pub(crate) async fn exec(&self, stmt: &Stmt, v: &Vals) -> Result<u64, BrokerError> {
        let mut conn = acquire(self.pool()?).await?;
        run_in::<DB>(&mut conn, stmt, v, self.table()).await
    }

    /// Runs `stmt` (one of `stmts`) on a connection of the pool; the rows it returned, read.
    pub(crate) async fn fetch(
        &self,
        stmts: &Statements,
        stmt: &Stmt,
        v: &Vals,
    ) -> Result<Vec<RowRead>, BrokerError> {
        let rows = self.fetch_counted(stmts, stmt, v).await?;
        Ok(rows.iter().map(|r| read::<DB>(r, &stmts.table)).collect())
    }

    /// [`fetch`](Self::fetch) of a claim statement, whose rows also say where their versions
    /// are (see [`read_claimed`]).
    pub(crate) async fn fetch_claimed(
        &self,
        stmts: &Statements,
        stmt: &Stmt,
        v: &Vals,
    ) -> Result<Vec<RowRead>, BrokerError> {
        let rows = self.fetch_counted(stmts, stmt, v).await?;
        Ok(rows
            .iter()
            .map(|r| read_claimed::<DB>(r, &stmts.table))
            .collect())
    }

    /// Runs `stmt` on a connection of the pool; the rows it returned, counted in
    /// [`rows_read`](Self::rows_read) and [`take_largest_read`](Self::take_largest_read).
    async fn fetch_counted(
        &self,
        stmts: &Statements,
        stmt: &Stmt,
        v: &Vals,
    ) -> Result<Vec<DB::Row>, BrokerError> {
        let mut conn = acquire(self.pool()?).await?;
        let rows = fetch_in::<DB>(&mut conn, stmt, v, &stmts.table).await?;
        self.inner
            .rows_read
            .fetch_add(rows.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.inner
            .largest_read
            .fetch_max(rows.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(rows)
    }

    /// How many rows this route has read from the database through
    /// [`fetch`](Self::fetch): claims, listings and lookups (dead letters, cancels, delayed
    /// rows). For tests.
    #[doc(hidden)]
    pub fn rows_read(&self) -> u64 {
        self.inner
            .rows_read
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The most rows one read through [`fetch`](Self::fetch) returned since the last call
    /// (what a read held at once); resets it. For tests.
    #[doc(hidden)]
    pub fn take_largest_read(&self) -> u64 {
        self.inner
            .largest_read
            .swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// The time in column 0 of a one-row answer (a `MIN` of due times); `None` when there is
    /// none or it is not a timestamp (a row with a bad due time is returned unreadable by the
    /// claim that takes it, for the runtime to dead-letter, and counted by `stats`).
    pub(crate) fn first_time(&self, row: &DB::Row, what: &str) -> Option<DateTime<Utc>> {
        self.first_time_at(row, 0, what)
    }

    /// [`first_time`](Self::first_time) of column `i`.
    pub(crate) fn first_time_at(
        &self,
        row: &DB::Row,
        i: usize,
        what: &str,
    ) -> Option<DateTime<Utc>> {
        match time_at::<DB>(row, i) {
            Ok(t) => t,
            Err(value) => {
                // Debug only: the claim loop asks for the next due time on every poll, and a
                // row that is never due would repeat this each time.
                tracing::debug!(
                    table = self.table().name,
                    "{what}: a row holds {value}, which is not a timestamp; ignored"
                );
                None
            }
        }
    }
}

/// Moving jobs: each method is in the file of its step (see the module's documentation).
/// Every answer passes `SqlxBroker::noted`, which remembers connection errors (the outage
/// rule of the claim).
impl<DB: Dialect, Row: Inbox> Broker for SqlxRoute<DB, Row> {
    type Receipt = SqlReceipt;

    async fn check(&self, mounts: &[MountInfo]) -> Vec<Problem> {
        self.check_mounts(mounts).await
    }

    async fn prepare(&self, _queue: &str) -> Result<(), BrokerError> {
        Ok(())
    }

    fn flow_problem(&self, _queue: &str) -> Option<String> {
        let t = self.table();
        if t.headers.is_none() {
            Some(format!(
                "table `{}` has no headers column to carry a flow's id: add a `#[field(headers)]` text column to run flows on it",
                t.name
            ))
        } else if t.id.generated {
            Some(format!(
                "table `{}` has ids the database generates, so a job published twice would be stored twice: run flows on a table whose id is the job's id (a text `#[field(id)]` column)",
                t.name
            ))
        } else {
            None
        }
    }

    async fn claim(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        order: ClaimOrder,
    ) -> Result<Claimed<SqlReceipt>, BrokerError> {
        let claimed = self.claim_rows(queue, max, wait, order).await;
        self.broker.noted(claimed)
    }

    async fn dead_letter_unreadable(
        &self,
        queue: &str,
        item: &Unreadable<SqlReceipt>,
        target: &str,
    ) -> Result<Settled, BrokerError> {
        let moved = self.move_unreadable(queue, item, target).await;
        self.broker.noted(moved)
    }

    async fn renew(&self, queue: &str, receipt: &SqlReceipt) -> Result<bool, BrokerError> {
        let renewed = self.renew_row(queue, receipt).await;
        self.broker.noted(renewed)
    }

    async fn settle(
        &self,
        queue: &str,
        delivery: &Delivery<SqlReceipt>,
        settlement: Settlement,
    ) -> Result<Settled, BrokerError> {
        let settled = self.settle_row(queue, delivery, settlement).await;
        self.broker.noted(settled)
    }

    async fn publish(
        &self,
        queue: &str,
        jobs: Vec<(Envelope, Option<DateTime<Utc>>)>,
    ) -> Result<Vec<Published>, BrokerError> {
        let published = self.publish_rows(queue, jobs).await;
        self.broker.noted(published)
    }

    async fn publish_once(
        &self,
        queue: &str,
        job: (Envelope, Option<DateTime<Utc>>),
        guard: &str,
        ttl: Duration,
    ) -> Result<Published, BrokerError> {
        let published = self.publish_guarded(queue, job, guard, ttl).await;
        self.broker.noted(published)
    }

    async fn finish_guard(
        &self,
        _queue: &str,
        guard: &str,
        job_id: &stagedoor_jobs::JobId,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        let done = self.finish_lock(guard, job_id.as_str(), ttl).await;
        self.broker.noted(done)
    }

    async fn cancelled(
        &self,
        queue: &str,
        ids: &[stagedoor_jobs::JobId],
    ) -> Result<Vec<stagedoor_jobs::JobId>, BrokerError> {
        let found = self.cancel_marks(queue, ids).await;
        self.broker.noted(found)
    }

    async fn server_time(&self) -> Result<Option<DateTime<Utc>>, BrokerError> {
        let t = self.database_time().await;
        self.broker.noted(t).map(Some)
    }

    fn lease(&self) -> Duration {
        self.broker.lease
    }

    fn clock(&self) -> Clock {
        self.broker.clock()
    }

    fn use_clock(&self, clock: &Clock) -> bool {
        self.broker.set_clock(clock);
        true
    }
}

/// How close to now a due time counts as now in queue stats: rows published by other tasks
/// carry their publisher's "now", a few microseconds off this one's.
const STATS_TOLERANCE: chrono::Duration = chrono::Duration::milliseconds(10);
