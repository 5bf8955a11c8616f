//! `SqlxRoute<DB, Row>`: one job table of a database, and the [`Broker`] implementation.
//!
//! The implementation is written once and stamped for SQLite and Postgres by a macro, so each
//! runs against its driver's concrete types. What each database does its own way (opening it,
//! waking workers) is in `route/sqlite.rs` and `route/postgres.rs`.

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Database, Row as _};
use stagedoor_jobs::broker::{
    Broker, BrokerError, DeadLetter, DeadSelector, Delivery, MountInfo, Problem, Published,
    QueueStats, ReplayReport, Settled, Settlement,
};
use stagedoor_jobs::inbox::{ColumnType, Table, is_plain_identifier};
use stagedoor_jobs::{Clock, Envelope, Failure, FailureCause, Inbox, Job, JobId};

use crate::acks::{ACK_BATCH, AckReq, bucket};
use crate::broker::SqlxBroker;
use crate::dialect::{Dialect, acquire, db_err, sealed};
use crate::floor::{Floors, Plan};
use crate::headers::HeaderDoc;
use crate::locks::ensure_bookkeeping;
use crate::publish::{chunks, keyed_by_row, reports};
use crate::receipt::{IdValue, SqlReceipt};
use crate::rows::{
    Role, RowRead, Vals, attempt_number, pg_time, shorten, shorten_bytes, unreadable,
};
use crate::sql::{Flavor, P, Statements, Stmt, validate};
use stagedoor_jobs::broker::{DeadLetters, Inspect, Locks};

mod postgres;
mod sqlite;

/// A queue whose last claim found nothing: until when there is no need to look again, unless
/// something wakes this process.
#[derive(Clone, Copy)]
struct Idle {
    until: tokio::time::Instant,
    wakes: u64,
}

struct RouteInner {
    /// The batched deletes of acknowledged rows: the channel to their task, started at the
    /// first acknowledgement and again whenever it is found stopped (see `ack_sender`).
    acks: Mutex<Option<tokio::sync::mpsc::UnboundedSender<AckReq>>>,
    table: Table,
    idle: Mutex<HashMap<String, Idle>>,
    stmts: Result<Arc<Statements>, Vec<String>>,
    dead_tables: Mutex<HashMap<String, Arc<Statements>>>,
    origins: Mutex<HashMap<String, String>>,
    /// Where each queue's bounded claims start (Postgres).
    floors: Floors,
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
            Ok(Arc::new(Statements::new(
                table,
                <DB as sealed::Sealed>::FLAVOR,
            )))
        } else {
            Err(problems)
        };
        Self {
            broker,
            default_group: Arc::from(group),
            inner: Arc::new(RouteInner {
                acks: Mutex::new(None),
                table,
                idle: Mutex::new(HashMap::new()),
                stmts,
                dead_tables: Mutex::new(HashMap::new()),
                origins: Mutex::new(HashMap::new()),
                floors: Floors::default(),
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

    /// The statements of the dead-letter table `name`, validated and cached.
    fn dead_table(&self, name: &str) -> Result<Arc<Statements>, BrokerError> {
        if let Some(s) = self
            .inner
            .dead_tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(name)
        {
            return Ok(Arc::clone(s));
        }
        if !is_plain_identifier(name) {
            return Err(BrokerError::UnknownQueue(format!(
                "{name} (a dead-letter table must be a plain SQL identifier)"
            )));
        }
        let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
        let s = Arc::new(
            self.stmts()?
                .for_table(leaked, <DB as sealed::Sealed>::FLAVOR),
        );
        self.inner
            .dead_tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_owned(), Arc::clone(&s));
        Ok(s)
    }

    /// The statements that read queue `name`: the table's own for a group (or for the table's
    /// own name), a dead-letter table's otherwise.
    fn stmts_for(&self, name: &str) -> Result<Arc<Statements>, BrokerError> {
        if self.grouped() || name == self.table().name || name == &*self.default_group {
            Ok(Arc::clone(self.stmts()?))
        } else {
            self.dead_table(name)
        }
    }

    fn origin_of(&self, dead: &str, doc: &HeaderDoc) -> Option<String> {
        doc.origin
            .clone()
            .or_else(|| {
                self.inner
                    .origins
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get(dead)
                    .cloned()
            })
            // A table without a group column has one queue: a dead letter of it failed there,
            // even when no service checked this route (an operator's replay) and the table
            // has no headers column to record the origin.
            .or_else(|| (!self.grouped()).then(|| self.default_group.to_string()))
            .or_else(|| dead.strip_suffix(".dead").map(str::to_owned))
    }

    fn envelope_of(&self, queue: &str, r: &RowRead, doc: &HeaderDoc) -> Envelope {
        let kind = doc.kind.clone().unwrap_or_else(|| queue.to_owned());
        let id = doc.job_id.clone().unwrap_or_else(|| r.id.clone());
        let enqueued = r.enqueued_at.or(r.due).unwrap_or_else(|| self.broker.now());
        Envelope::new(kind, r.payload.clone(), enqueued)
            .with_id(JobId::from_string(id))
            .with_attempt(attempt_number(r.attempt, 1))
            .with_headers(doc.headers())
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
}

/// How close to now a due time counts as now in queue stats: rows published by other tasks
/// carry their publisher's "now", a few microseconds off this one's.
const STATS_TOLERANCE: chrono::Duration = chrono::Duration::milliseconds(10);

/// A row due "now" (a publish without a delay, a retry at once) is written as due a second
/// earlier: another worker's clock, or a stats query that read its time just before the row
/// was committed, never sees it as delayed. Rows due now keep their order among themselves.
const BACKDATE: chrono::Duration = chrono::Duration::seconds(1);

macro_rules! impl_for {
    ($db:ty, $module:ident) => {
        mod $module {
            use super::*;

            type Q = sqlx::query::Query<'static, $db, <$db as Database>::Arguments>;

            pub(crate) fn query(stmt: &Stmt, v: &Vals, table: &Table) -> Q {
                let mut q: Q = sqlx::query(AssertSqlSafe(stmt.sql.clone()));
                for p in &stmt.params {
                    q = bind(q, *p, v, table);
                }
                q
            }

            /// A multi-row statement: `template`'s values for each of `rows`, in order (`None`
            /// entries are literals, nothing to bind).
            pub(crate) fn query_rows(sql: String, template: &[Option<P>], rows: &[Vals], table: &Table) -> Q {
                let mut q: Q = sqlx::query(AssertSqlSafe(sql));
                for v in rows {
                    for p in template.iter().flatten() {
                        q = bind(q, *p, v, table);
                    }
                }
                q
            }

            /// Deletes acknowledged rows in batches: whatever queued while the previous delete
            /// ran goes in the next one (one statement and one commit for many jobs). Each row
            /// stays fenced on its lease; a row whose lease was lost is reported as such. Runs
            /// under `restart_on_panic`: the receiver is shared so that a restarted loop reads
            /// the same channel (a panic fails only the batch it interrupted; the runtime
            /// settles those again).
            pub(crate) async fn ack_loop(pool: sqlx::Pool<$db>, stmts: Arc<Statements>, rx: stagedoor_jobs::supervise::SharedReceiver<AckReq>) {
                let mut rx = rx.lock().await;
                let mut batch = Vec::with_capacity(ACK_BATCH);
                while rx.recv_many(&mut batch, ACK_BATCH).await > 0 {
                    let n = bucket(batch.len());
                    let mut q: Q = sqlx::query(AssertSqlSafe(stmts.delete_many(n)));
                    for i in 0..n {
                        // Padding repeats the last row: a duplicate term deletes nothing more.
                        let r = &batch[i.min(batch.len() - 1)];
                        q = match &r.id {
                            IdValue::Int(v) => q.bind(*v),
                            IdValue::Text(v) => q.bind(v.clone()),
                        };
                        for l in r.leases {
                            q = q.bind(l);
                        }
                    }
                    let done = match acquire(&pool).await {
                        Ok(mut conn) => q.fetch_all(&mut *conn).await.map_err(db_err),
                        Err(e) => Err(e),
                    };
                    match done {
                        Ok(rows) => {
                            let gone: std::collections::HashSet<String> =
                                rows.iter().filter_map(|row| row.try_get::<String, _>(0).ok()).collect();
                            for r in batch.drain(..) {
                                let _ = r.reply.send(Ok(gone.contains(&r.id.text())));
                            }
                        }
                        Err(e) => {
                            for r in batch.drain(..) {
                                let _ = r.reply.send(Err(e.clone()));
                            }
                        }
                    }
                }
            }

            fn bind(q: Q, p: P, v: &Vals, table: &Table) -> Q {
                match p {
                    P::Id => match &v.id {
                        Some(IdValue::Int(i)) => q.bind(*i),
                        Some(IdValue::Text(s)) => q.bind(s.clone()),
                        None => q.bind(None::<String>),
                    },
                    P::Lease => q.bind(v.leases.map(|l| l[0])),
                    P::Fence1 => q.bind(v.leases.map(|l| l[1])),
                    P::Fence2 => q.bind(v.leases.map(|l| l[2])),
                    P::Fence3 => q.bind(v.leases.map(|l| l[3])),
                    P::Reclaim => q.bind(v.reclaim.or(v.now)),
                    P::NewLease => q.bind(v.new_lease),
                    P::Group => q.bind(v.group.clone()),
                    P::Target => q.bind(v.target.clone()),
                    P::Now => q.bind(v.now),
                    P::Due => q.bind(v.due),
                    P::Limit => q.bind(v.limit),
                    P::Error => q.bind(v.error.clone()),
                    P::Headers => q.bind(v.headers.clone()),
                    P::Payload => match table.payload.ty {
                        ColumnType::Bytes => q.bind(v.payload.clone()),
                        _ => q.bind(String::from_utf8_lossy(&v.payload).into_owned()),
                    },
                    P::EnqueuedAt => q.bind(v.enqueued_at),
                    P::JobId => q.bind(v.job_id.clone()),
                    P::Floor => q.bind(v.floor),
                    P::Attempt => q.bind(v.attempt),
                }
            }

            /// The ids (as text) an insert returned, one per stored row.
            pub(crate) fn returned_ids(rows: &[<$db as Database>::Row]) -> Result<Vec<String>, BrokerError> {
                rows.iter().map(|r| r.try_get::<String, _>(0).map_err(db_err)).collect()
            }

            /// How column `i` of `row` is shown in a message: its value, shortened, or its type.
            pub(crate) fn shown(row: &<$db as Database>::Row, i: usize) -> String {
                use sqlx::{TypeInfo as _, ValueRef as _};
                let Ok(raw) = row.try_get_raw(i) else {
                    return "a value that cannot be read".to_owned();
                };
                if raw.is_null() {
                    return "NULL".to_owned();
                }
                let ty = raw.type_info().name().to_owned();
                if <$db as sealed::Sealed>::FLAVOR == Flavor::Postgres && ty == "TIMESTAMPTZ" {
                    return match row.try_get_unchecked::<i64, _>(i) {
                        Ok(i64::MAX) => "'infinity'".to_owned(),
                        Ok(i64::MIN) => "'-infinity'".to_owned(),
                        _ => "a timestamp out of range".to_owned(),
                    };
                }
                if let Ok(s) = row.try_get::<String, _>(i) {
                    return format!("'{}'", shorten(&s));
                }
                if let Ok(v) = row.try_get::<i64, _>(i) {
                    return v.to_string();
                }
                if let Ok(v) = row.try_get::<f64, _>(i) {
                    return v.to_string();
                }
                if let Ok(b) = row.try_get::<Vec<u8>, _>(i) {
                    return shorten_bytes(&b);
                }
                format!("a value of type {ty}")
            }

            /// Column `i` of `row` as a timestamp; `Err` with the value shown when it is not
            /// one chrono can hold. Postgres timestamps are read from their stored microseconds
            /// (the driver's own conversion panics on `infinity`).
            pub(crate) fn time_at(row: &<$db as Database>::Row, i: usize) -> Result<Option<DateTime<Utc>>, String> {
                use sqlx::{TypeInfo as _, ValueRef as _};
                let raw = row.try_get_raw(i).map_err(|e| e.to_string())?;
                if raw.is_null() {
                    return Ok(None);
                }
                if <$db as sealed::Sealed>::FLAVOR == Flavor::Postgres && raw.type_info().name() == "TIMESTAMPTZ" {
                    return match row.try_get_unchecked::<i64, _>(i).ok().and_then(pg_time) {
                        Some(t) => Ok(Some(t)),
                        None => Err(shown(row, i)),
                    };
                }
                row.try_get::<DateTime<Utc>, _>(i).map(Some).map_err(|_| shown(row, i))
            }

            /// Reads a row column by column (see [`RowRead`]): never fails; what cannot be read
            /// is named in `problem`.
            pub(crate) fn read(row: &<$db as Database>::Row, table: &Table) -> RowRead {
                let mut problems = Vec::new();
                let lease_col = table.locked_until.map_or("locked_until", |c| c.name);
                let due_col = table.retry_after.map_or("retry_after", |c| c.name);
                let enq_col = table.enqueued_at.map_or("enqueued_at", |c| c.name);
                let id = match row.try_get::<Option<String>, _>(0) {
                    Ok(Some(id)) => id,
                    _ => {
                        problems.push(unreadable(table, table.id.name, &shown(row, 0), Role::Id));
                        String::new()
                    }
                };
                // Read as BIGINT by every statement; unreadable only as NULL (a fresh count).
                let attempt = row.try_get::<Option<i64>, _>(1).ok().flatten();
                // A NULL payload is no payload (some drivers read it as empty bytes).
                let null = row.try_get_raw(2).map_or(true, |v| sqlx::ValueRef::is_null(&v));
                let payload = match table.payload.ty {
                    _ if null => Err(sqlx::Error::Decode("NULL".into())),
                    ColumnType::Bytes => row.try_get::<Vec<u8>, _>(2),
                    _ => row.try_get::<String, _>(2).map(String::into_bytes),
                };
                let payload = payload.unwrap_or_else(|_| {
                    problems.push(unreadable(table, table.payload.name, &shown(row, 2), Role::Payload));
                    Vec::new()
                });
                let mut time = |i: usize, col: &str, nullable: bool| match time_at(row, i) {
                    Ok(t) => t,
                    Err(value) => {
                        problems.push(unreadable(table, col, &value, Role::Time { nullable }));
                        None
                    }
                };
                let lease = time(3, lease_col, true);
                let due = time(4, due_col, false);
                let enqueued_at = time(7, enq_col, false);
                // The last error is only shown: a value that is not text is shown as it is.
                let last_error = row
                    .try_get::<Option<String>, _>(5)
                    .unwrap_or_else(|_| Some(shown(row, 5)));
                let headers = row.try_get::<Option<String>, _>(6).unwrap_or_else(|_| {
                    let col = table.headers.map_or("headers", |c| c.name);
                    problems.push(unreadable(table, col, &shown(row, 6), Role::Text));
                    None
                });
                RowRead {
                    id,
                    attempt,
                    payload,
                    lease,
                    due,
                    last_error,
                    headers,
                    enqueued_at,
                    problem: (!problems.is_empty()).then(|| problems.join("; ")),
                }
            }

            impl<Row: Inbox> SqlxRoute<$db, Row> {
                pub(crate) fn pool(&self) -> Result<&sqlx::Pool<$db>, BrokerError> {
                    self.broker.connected_pool()
                }

                /// Deletes an acknowledged row in the route's next batched delete; `true` when
                /// the row was still leased to this delivery.
                pub(crate) async fn ack_batched(&self, id: IdValue, leases: [DateTime<Utc>; crate::sql::FENCES]) -> Result<bool, BrokerError> {
                    let (reply, answer) = tokio::sync::oneshot::channel();
                    let stopped = || BrokerError::Connection("the route's acknowledgement task stopped".to_owned());
                    let mut req = AckReq { id, leases, reply };
                    // A send fails only if the task stopped since `ack_sender` looked: the
                    // second look starts it again.
                    for _ in 0..2 {
                        match self.ack_sender()?.send(req) {
                            Ok(()) => return answer.await.map_err(|_| stopped())?,
                            Err(e) => req = e.0,
                        }
                    }
                    Err(stopped())
                }

                /// The channel to the acknowledgement task, which is started at the first
                /// acknowledgement and again whenever it is found stopped (it ran on a tokio
                /// runtime that has shut down, say): one dead task never makes every later
                /// acknowledgement fail. A panic inside it restarts it in place.
                fn ack_sender(&self) -> Result<tokio::sync::mpsc::UnboundedSender<AckReq>, BrokerError> {
                    let mut slot = self.inner.acks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Some(tx) = slot.as_ref().filter(|tx| !tx.is_closed()) {
                        return Ok(tx.clone());
                    }
                    let pool = self.pool()?.clone();
                    let stmts = Arc::clone(self.stmts()?);
                    let task = format!("sqlx acknowledgements of `{}`", self.table().name);
                    if slot.is_some() {
                        tracing::error!(task = %task, "the acknowledgement task had stopped: starting it again");
                    }
                    let tx = stagedoor_jobs::supervise::spawn_consumer(task, move |rx| {
                        ack_loop(pool.clone(), Arc::clone(&stmts), rx)
                    });
                    *slot = Some(tx.clone());
                    Ok(tx)
                }

                pub(crate) async fn exec(&self, stmt: &Stmt, v: &Vals) -> Result<u64, BrokerError> {
                    let mut conn = acquire(self.pool()?).await?;
                    let r = query(stmt, v, self.table()).execute(&mut *conn).await.map_err(db_err)?;
                    Ok(r.rows_affected())
                }

                pub(crate) async fn fetch(&self, stmts: &Statements, stmt: &Stmt, v: &Vals) -> Result<Vec<RowRead>, BrokerError> {
                    let mut conn = acquire(self.pool()?).await?;
                    let rows = query(stmt, v, &stmts.table).fetch_all(&mut *conn).await.map_err(db_err)?;
                    Ok(rows.iter().map(|r| read(r, &stmts.table)).collect())
                }

                /// The time in column 0 of a one-row answer (a `MIN` of due times); `None` when
                /// there is none or it is not a timestamp (a row with a bad due time is
                /// dead-lettered by the claim that takes it, and counted by `stats`).
                pub(crate) fn first_time(&self, row: &<$db as Database>::Row, what: &str) -> Option<DateTime<Utc>> {
                    self.first_time_at(row, 0, what)
                }

                /// [`first_time`](Self::first_time) of column `i`.
                pub(crate) fn first_time_at(&self, row: &<$db as Database>::Row, i: usize, what: &str) -> Option<DateTime<Utc>> {
                    match time_at(row, i) {
                        Ok(t) => t,
                        Err(value) => {
                            // Debug only: the claim loop asks for the next due time on every
                            // poll, and a row that is never due would repeat this each time.
                            tracing::debug!(table = self.table().name, "{what}: a row holds {value}, which is not a timestamp; ignored");
                            None
                        }
                    }
                }

                /// The dead letter of `queue`: the one a mount on it declares, else the default.
                pub(crate) fn dead_letter_for(&self, queue: &str) -> String {
                    self.inner
                        .origins
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .iter()
                        .filter(|(_, origin)| *origin == queue)
                        .map(|(dead, _)| dead.clone())
                        .min()
                        .unwrap_or_else(|| DeadLetters::default_dead_letter(self, queue))
                }

                /// A claimed row that cannot be read goes to its queue's dead letter by itself,
                /// with an error that names the column, its value and the fix: the rows claimed
                /// with it run, and it never comes back to fail a claim again. If the move
                /// fails, it stays leased and is claimed again after its lease.
                pub(crate) async fn dead_letter_unreadable(&self, queue: &str, r: RowRead, id: IdValue, lease: DateTime<Utc>, problem: &str) {
                    let doc = HeaderDoc::parse(r.headers.as_deref());
                    let envelope = self.envelope_of(queue, &r, &doc);
                    let target = self.dead_letter_for(queue);
                    let error = format!(
                        "the stored job (row {}) cannot be read, so it was dead-lettered without running: {problem}; then replay it",
                        r.id
                    );
                    tracing::error!(queue, row = %r.id, dead_letter = %target, "{error}");
                    let delivery = Delivery { envelope, receipt: SqlReceipt::new(id, r.lease.unwrap_or(lease)) };
                    let failure = Failure::new(FailureCause::Decode, error, String::new());
                    match Broker::settle(self, queue, &delivery, Settlement::DeadLetter { target, failure }).await {
                        Ok(Settled::Done) => {}
                        Ok(Settled::LeaseLost) => tracing::warn!(queue, row = %r.id, "an unreadable row was claimed by another worker before it could be dead-lettered"),
                        Err(e) => tracing::error!(queue, row = %r.id, error = %e, "could not move an unreadable row to its dead letter: it is claimed again after its lease"),
                    }
                }

                /// When the next row of `queue` becomes claimable; above the floor only when the
                /// claim just made looked only there (rows below wait for the next full claim).
                pub(crate) async fn next_due_from(&self, stmts: &Statements, queue: &str, plan: Plan) -> Option<DateTime<Utc>> {
                    match plan {
                        Plan::From(floor) if !Statements::lacks(&stmts.next_due_from) => {
                            let v = Vals { group: Some(queue.to_owned()), floor: Some(floor), ..Vals::default() };
                            let row = query(&stmts.next_due_from, &v, &stmts.table).fetch_one(self.pool().ok()?).await.ok()?;
                            self.first_time(&row, "next due time")
                        }
                        _ => Inspect::next_due(self, queue).await,
                    }
                }

                pub(crate) fn encode_job(&self, queue: &str, envelope: &Envelope, at: Option<DateTime<Utc>>) -> Result<Vals, BrokerError> {
                    let now = self.broker.now();
                    let t = self.table();
                    if t.headers.is_none() && envelope.kind() != queue {
                        return Err(BrokerError::Backend(format!(
                            "table `{}` has no headers column to carry the kind `{}`: add a `#[field(headers)]` text column, or publish without a kind",
                            t.name,
                            envelope.kind()
                        )));
                    }
                    if t.group.is_none() && queue != &*self.default_group && queue != t.name {
                        return Err(BrokerError::UnknownQueue(format!(
                            "{queue} (table `{}` has no group column: its one queue is `{}`)",
                            t.name, self.default_group
                        )));
                    }
                    let h = envelope.headers();
                    let doc = HeaderDoc {
                        kind: (envelope.kind() != queue).then(|| envelope.kind().to_owned()),
                        job_id: Some(envelope.id().to_string()),
                        request_id: h.request_id.clone(),
                        trace: h.trace.clone(),
                        extra: h.extra.clone(),
                        ..HeaderDoc::default()
                    };
                    if t.payload.ty != ColumnType::Bytes && std::str::from_utf8(envelope.payload()).is_err() {
                        return Err(BrokerError::Backend(format!(
                            "table `{}` keeps payloads as text, and this payload is not UTF-8: use a `Vec<u8>` payload column",
                            t.name
                        )));
                    }
                    Ok(Vals {
                        group: Some(queue.to_owned()),
                        payload: envelope.payload().to_vec(),
                        due: Some(at.map_or(now - BACKDATE, |a| a.max(now))),
                        enqueued_at: Some(envelope.enqueued_at()),
                        headers: Some(doc.to_json()),
                        job_id: Some(envelope.id().to_string()),
                        ..Vals::default()
                    })
                }

                /// Publishes `job` into this table now, at its time, or after its delay; into
                /// the route's group unless the job names its queue. Returns the job's id as
                /// stored and whether it was stored (see [`Published`]): on a table whose id
                /// the database generates and that has no headers column, the id is the new
                /// row's; a job whose id is already in a text id column is not stored again.
                pub async fn publish(&self, job: Job) -> Result<Published, BrokerError> {
                    stagedoor_jobs::broker::Publish::publish_job(self, job).await
                }

                /// Publishes `job` inside the caller's own transaction (pass `&mut *tx`): the
                /// job exists if and only if that transaction commits. Returns what
                /// [`publish`](Self::publish) returns.
                pub async fn publish_in(
                    &self,
                    conn: &mut <$db as Database>::Connection,
                    job: Job,
                ) -> Result<Published, BrokerError> {
                    let stmts = Arc::clone(self.stmts()?);
                    let (queue, envelope, at) = job.into_parts(self.broker.now());
                    let v = self.encode_job(&queue, &envelope, at)?;
                    let rows = query(&stmts.insert_notify, &v, self.table()).fetch_all(&mut *conn).await.map_err(db_err)?;
                    let returned = returned_ids(&rows)?;
                    self.broker.wake_all();
                    let mut out = reports(self.table(), &queue, &[&envelope], returned)?;
                    out.pop().ok_or_else(|| BrokerError::Backend("a publish of one job reported nothing".to_owned()))
                }
            }
        }
    };
}

impl_for!(sqlx::Sqlite, sqlite_impl);
impl_for!(sqlx::Postgres, postgres_impl);

macro_rules! impl_broker {
    ($db:ty, $module:ident) => {
        impl<Row: Inbox> Inspect for SqlxRoute<$db, Row> {
            fn backend(&self) -> &'static str {
                "sqlx"
            }

            async fn connect(&self) -> Result<(), BrokerError> {
                self.open().await
            }

            async fn stats(&self, queue: &str) -> Result<QueueStats, BrokerError> {
                let stmts = self.stmts_for(queue)?;
                // The connection first, then the time: a row published "now" by another task
                // while this query waited for a connection must not look delayed. A job due
                // within STATS_TOLERANCE counts as ready.
                let mut conn = self.pool()?.acquire().await.map_err(db_err)?;
                let now = self.broker.now();
                let v = Vals { group: Some(queue.to_owned()), now: Some(now + STATS_TOLERANCE), ..Vals::default() };
                let row = $module::query(&stmts.stats, &v, &stmts.table).fetch_one(&mut *conn).await.map_err(db_err)?;
                let n = |i: usize| -> Result<u64, BrokerError> {
                    Ok(u64::try_from(row.try_get::<i64, _>(i).map_err(db_err)?).unwrap_or(0))
                };
                // A row whose due time is not a timestamp is counted; the oldest is then unknown.
                let oldest = self.first_time_at(&row, 3, "queue stats");
                Ok(QueueStats {
                    ready: n(0)?,
                    pending: n(1)?,
                    delayed: n(2)?,
                    oldest: oldest.map(|o| (now - o).to_std().unwrap_or_default()),
                })
            }

            async fn queues(&self) -> Result<Vec<String>, BrokerError> {
                let table = *self.table();
                let mut names = match table.group {
                    Some(g) => {
                        let sql = format!("SELECT DISTINCT CAST(\"{}\" AS TEXT) FROM {}", g.name, table.qualified());
                        let rows = sqlx::query(AssertSqlSafe(sql)).fetch_all(self.pool()?).await.map_err(db_err)?;
                        // A group that is NULL names no queue; one that is not text (an SQLite
                        // blob) is shown as it reads.
                        rows.iter()
                            .filter_map(|r| match r.try_get::<Option<String>, _>(0) {
                                Ok(name) => name,
                                Err(_) => Some($module::shown(r, 0)),
                            })
                            .collect()
                    }
                    None => vec![self.default_group.to_string()],
                };
                for m in self.inner.origins.lock().unwrap_or_else(std::sync::PoisonError::into_inner).keys() {
                    names.push(m.clone());
                }
                names.sort();
                names.dedup();
                Ok(names)
            }

            async fn next_due(&self, queue: &str) -> Option<DateTime<Utc>> {
                let stmts = self.stmts_for(queue).ok()?;
                if Statements::lacks(&stmts.next_due) {
                    return None;
                }
                let v = Vals { group: Some(queue.to_owned()), ..Vals::default() };
                let row = $module::query(&stmts.next_due, &v, &stmts.table).fetch_one(self.pool().ok()?).await.ok()?;
                self.first_time(&row, "next due time")
            }
        }

                impl<Row: Inbox> DeadLetters for SqlxRoute<$db, Row> {
            async fn dead_letters(&self, dead: &str, selector: &DeadSelector, limit: usize) -> Result<Vec<DeadLetter>, BrokerError> {
                let stmts = self.stmts_for(dead)?;
                let v = Vals { group: Some(dead.to_owned()), ..Vals::default() };
                let rows = self.fetch(&stmts, &stmts.list, &v).await?;
                Ok(rows
                    .iter()
                    .map(|r| self.dead_letter_of(dead, r))
                    .filter(|d| selector.matches(d))
                    .take(limit)
                    .collect())
            }

            async fn replay(&self, dead: &str, selector: &DeadSelector) -> Result<ReplayReport, BrokerError> {
                let letters = self.dead_letters(dead, selector, usize::MAX).await?;
                let mut report = ReplayReport::default();
                let now = self.broker.now();
                let stmts = Arc::clone(self.stmts()?);
                for d in letters {
                    if d.origin.is_empty() {
                        tracing::error!(dead_letter = %d.id, "cannot tell which queue it failed on: not replayed");
                        report.failed += 1;
                        continue;
                    }
                    let env = &d.envelope;
                    let h = env.headers();
                    let doc = HeaderDoc {
                        kind: (env.kind() != d.origin).then(|| env.kind().to_owned()),
                        job_id: Some(env.id().to_string()),
                        request_id: h.request_id.clone(),
                        trace: h.trace.clone(),
                        extra: h.extra.clone(),
                        ..HeaderDoc::default()
                    };
                    let id = IdValue::parse(&stmts.table, &d.id)?;
                    let v = Vals {
                        id: Some(id),
                        group: Some(dead.to_owned()),
                        target: Some(d.origin.clone()),
                        now: Some(now),
                        headers: Some(doc.to_json()),
                        ..Vals::default()
                    };
                    let result = if self.grouped() {
                        self.exec(&stmts.replay_group, &v).await
                    } else {
                        // The table form: copy back into the origin table and delete, in one transaction.
                        let dead_stmts = self.dead_table(dead)?;
                        async {
                            let mut tx = self.pool()?.begin().await.map_err(db_err)?;
                            let copy = dead_stmts.copy_into(self.table().name, false);
                            let n = $module::query(&copy, &v, &dead_stmts.table).execute(&mut *tx).await.map_err(db_err)?.rows_affected();
                            if n == 1 {
                                $module::query(&stmts.clear_lease, &v, &stmts.table).execute(&mut *tx).await.map_err(db_err)?;
                                $module::query(&dead_stmts.delete_by_id, &v, &dead_stmts.table).execute(&mut *tx).await.map_err(db_err)?;
                                tx.commit().await.map_err(db_err)?;
                            }
                            Ok::<u64, BrokerError>(n)
                        }
                        .await
                    };
                    match result {
                        Ok(1) => report.replayed += 1,
                        Ok(_) => report.skipped += 1,
                        Err(e) => {
                            tracing::error!(dead_letter = %d.id, error = %e, "replay failed");
                            report.failed += 1;
                        }
                    }
                }
                if report.replayed > 0 {
                    self.broker.wake_all();
                }
                Ok(report)
            }

            async fn purge(&self, dead: &str, selector: &DeadSelector) -> Result<u64, BrokerError> {
                let letters = self.dead_letters(dead, selector, usize::MAX).await?;
                let stmts = self.stmts_for(dead)?;
                let mut n = 0;
                for d in letters {
                    let v = Vals {
                        id: Some(IdValue::parse(&stmts.table, &d.id)?),
                        group: Some(dead.to_owned()),
                        ..Vals::default()
                    };
                    n += $module::query(&stmts.purge, &v, &stmts.table).execute(self.pool()?).await.map_err(db_err)?.rows_affected();
                }
                Ok(n)
            }

            async fn dead_len(&self, dead: &str) -> Result<u64, BrokerError> {
                let s = self.stats(dead).await?;
                Ok(s.ready + s.pending + s.delayed)
            }

            fn default_dead_letter(&self, queue: &str) -> String {
                if self.grouped() { format!("{queue}.dead") } else { format!("{}_dead", self.table().name) }
            }
        }

                impl<Row: Inbox> Locks for SqlxRoute<$db, Row> {
            async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, BrokerError> {
                let pool = self.pool()?;
                ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
                let now = self.broker.now();
                let until = now + stagedoor_jobs::broker::chrono_duration(ttl);
                let n = sqlx::query("INSERT INTO stagedoor_locks (lock_key, token, until_at) VALUES ($1, $2, $3) ON CONFLICT (lock_key) DO UPDATE SET token = excluded.token, until_at = excluded.until_at WHERE stagedoor_locks.until_at <= $4")
                    .bind(key)
                    .bind(token)
                    .bind(until)
                    .bind(now)
                    .execute(pool)
                    .await
                    .map_err(db_err)?
                    .rows_affected();
                // Locks that ran out long ago are only history: keep the table small.
                sqlx::query("DELETE FROM stagedoor_locks WHERE until_at < $1")
                    .bind(now - chrono::Duration::hours(1))
                    .execute(pool)
                    .await
                    .map_err(db_err)?;
                Ok(n == 1)
            }

            async fn last_tick(&self, schedule: &str) -> Result<Option<DateTime<Utc>>, BrokerError> {
                let pool = self.pool()?;
                ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
                let t: Option<DateTime<Utc>> = sqlx::query_scalar("SELECT last_tick FROM stagedoor_schedules WHERE schedule = $1")
                    .bind(schedule)
                    .fetch_optional(pool)
                    .await
                    .map_err(db_err)?;
                Ok(t)
            }

            async fn mark_tick(&self, schedule: &str, tick: DateTime<Utc>) -> Result<(), BrokerError> {
                let pool = self.pool()?;
                ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
                sqlx::query("INSERT INTO stagedoor_schedules (schedule, last_tick) VALUES ($1, $2) ON CONFLICT (schedule) DO UPDATE SET last_tick = excluded.last_tick WHERE stagedoor_schedules.last_tick < excluded.last_tick")
                    .bind(schedule)
                    .bind(tick)
                    .execute(pool)
                    .await
                    .map_err(db_err)?;
                Ok(())
            }

            async fn unlock(&self, key: &str, token: &str) -> Result<(), BrokerError> {
                sqlx::query("DELETE FROM stagedoor_locks WHERE lock_key = $1 AND token = $2")
                    .bind(key)
                    .bind(token)
                    .execute(self.pool()?)
                    .await
                    .map_err(db_err)?;
                Ok(())
            }
        }

                impl<Row: Inbox> Broker for SqlxRoute<$db, Row> {
            type Receipt = SqlReceipt;

            async fn check(&self, mounts: &[MountInfo]) -> Vec<Problem> {
                let table = self.table();
                let who = |m: &MountInfo| format!("mount `{}` on queue `{}`", m.subscriber, m.queue);
                let mut problems = Vec::new();
                let stmts = match &self.inner.stmts {
                    Ok(s) => Arc::clone(s),
                    Err(ps) => {
                        return ps.iter().map(|p| Problem { mount: format!("table `{}`", table.name), message: p.clone() }).collect();
                    }
                };
                let Ok(pool) = self.pool() else {
                    return vec![Problem { mount: "*".to_owned(), message: "the broker is not connected".to_owned() }];
                };
                // Each role's column type against what the row's field needs, all at once; when
                // one is wrong, the statements' preparation below would only add the database's
                // first error about it.
                let column_problems = crate::columns::check::<$db>(pool, table).await;
                let columns_ok = column_problems.is_empty();
                problems.extend(column_problems.into_iter().map(|message| Problem { mount: format!("table `{}`", table.name), message }));
                // Every statement this route will run, prepared against the table now: a
                // missing or misspelt column stops the service with its name.
                let named: [(&str, &Stmt); 12] = [
                    ("claim", &stmts.claim),
                    ("renew", &stmts.renew),
                    ("ack", &stmts.delete_fenced),
                    ("retry", &stmts.retry),
                    ("retry in place", &stmts.retry_keep_place),
                    ("dead letter", &stmts.dead_group),
                    ("publish", &stmts.insert),
                    ("stats", &stmts.stats),
                    ("list", &stmts.list),
                    ("replay", &stmts.replay_group),
                    ("purge", &stmts.purge),
                    ("next due", &stmts.next_due),
                ];
                let named: &[(&str, &Stmt)] = if columns_ok { &named } else { &[] };
                for (name, stmt) in named {
                    if Statements::lacks(stmt) {
                        continue;
                    }
                    if let Err(e) = sqlx::Executor::prepare(pool, sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(stmt.sql.clone()))).await {
                        problems.push(Problem {
                            mount: format!("table `{}`", table.name),
                            message: format!(
                                "the {name} statement does not prepare against the table: {e}: create the table, or make its columns match the fields of `{}`",
                                std::any::type_name::<Row>()
                            ),
                        });
                        break;
                    }
                }
                for m in mounts {
                    if m.max_attempts.is_some() && table.attempt.is_none() {
                        problems.push(Problem {
                            mount: who(m),
                            message: format!(
                                "max_attempts needs an attempt column, and table `{}` has none: add an integer column with `#[field(attempt)]`",
                                table.name
                            ),
                        });
                    }
                    if m.kind.is_some() && table.headers.is_none() {
                        problems.push(Problem {
                            mount: who(m),
                            message: format!(
                                "subscribing to a kind needs a headers column to store it, and table `{}` has none: add `#[field(headers)]`, or give the kind its own group",
                                table.name
                            ),
                        });
                    }
                    if table.group.is_none() && m.queue != *self.default_group && m.queue != table.name {
                        problems.push(Problem {
                            mount: who(m),
                            message: format!(
                                "table `{}` has no group column, so its one queue is `{}`: subscribe to that name",
                                table.name, self.default_group
                            ),
                        });
                    }
                    if let Some(dead) = &m.dead_letter {
                        self.inner.origins.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(dead.clone(), m.queue.clone());
                        if !self.grouped() {
                            match self.dead_table(dead) {
                                Err(e) => problems.push(Problem { mount: who(m), message: format!("{e}") }),
                                Ok(dead_stmts) => {
                                    let copy = stmts.copy_into(dead, true);
                                    if let Err(e) = sqlx::Executor::prepare(pool, sqlx::SqlSafeStr::into_sql_str(AssertSqlSafe(copy.sql.clone()))).await {
                                        problems.push(Problem {
                                            mount: who(m),
                                            message: format!(
                                                "the dead-letter table `{dead}` cannot take rows of `{}`: {e}: create it with the same columns",
                                                table.name
                                            ),
                                        });
                                    } else {
                                        for message in crate::columns::check_dead_table::<$db>(pool, &dead_stmts.table).await {
                                            problems.push(Problem { mount: who(m), message: format!("dead-letter table `{dead}`: {message}") });
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                // A dead letter moved to another table keeps its id (a replay brings it back
                // with it). SQLite gives a new row the id of a deleted one unless the id column
                // is AUTOINCREMENT, so a later row could take the id of a dead letter: it could
                // then never be moved into the dead table (the copy conflicts; the row is claimed
                // again after every lease, forever), nor that dead letter be replayed.
                if <$db as sealed::Sealed>::FLAVOR == Flavor::Sqlite
                    && !self.grouped()
                    && table.id.generated
                    && table.id.ty == ColumnType::Integer
                    && mounts.iter().any(|m| m.dead_letter.is_some())
                {
                    let master = match table.schema {
                        Some(s) => format!("\"{s}\".sqlite_master"),
                        None => "sqlite_master".to_owned(),
                    };
                    let ddl: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
                        "SELECT sql FROM {master} WHERE type = 'table' AND name = $1"
                    )))
                    .bind(table.name)
                    .fetch_optional(pool)
                    .await
                    .ok()
                    .flatten();
                    if ddl.is_some_and(|d| !d.to_ascii_uppercase().contains("AUTOINCREMENT")) {
                        problems.push(Problem {
                            mount: format!("table `{}`", table.name),
                            message: format!(
                                "its dead letters move to another table with their ids, and SQLite gives new rows the ids of deleted ones unless the id is declared `{} INTEGER PRIMARY KEY AUTOINCREMENT`: a row that takes a dead letter's id could never be dead-lettered; declare the id column so",
                                table.id.name
                            ),
                        });
                    }
                }
                if table.retry_after.is_none() {
                    tracing::warn!(table = table.name, "no retry_after column: retry_after(d) and delayed jobs return the row at once");
                }
                problems
            }

            async fn prepare(&self, _queue: &str) -> Result<(), BrokerError> {
                Ok(())
            }

            async fn claim(&self, queue: &str, max: usize, wait: Duration) -> Result<Vec<Delivery<SqlReceipt>>, BrokerError> {
                let claimed = self.claim_rows(queue, max, wait).await;
                self.broker.noted(claimed)
            }

            async fn renew(&self, queue: &str, receipt: &SqlReceipt) -> Result<bool, BrokerError> {
                let renewed = self.renew_row(queue, receipt).await;
                self.broker.noted(renewed)
            }

            async fn settle(&self, queue: &str, delivery: &Delivery<SqlReceipt>, settlement: Settlement) -> Result<Settled, BrokerError> {
                let settled = self.settle_row(queue, delivery, settlement).await;
                if settled.is_err() {
                    delivery.receipt.settle_failed.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                self.broker.noted(settled)
            }

            async fn publish(&self, queue: &str, jobs: Vec<(Envelope, Option<DateTime<Utc>>)>) -> Result<Vec<Published>, BrokerError> {
                let published = self.publish_rows(queue, jobs).await;
                self.broker.noted(published)
            }

            async fn publish_once(&self, queue: &str, job: (Envelope, Option<DateTime<Utc>>), guard: &str, ttl: Duration) -> Result<Published, BrokerError> {
                let published = self.publish_guarded(queue, job, guard, ttl).await;
                self.broker.noted(published)
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

        impl<Row: Inbox> SqlxRoute<$db, Row> {
            async fn claim_rows(&self, queue: &str, max: usize, wait: Duration) -> Result<Vec<Delivery<SqlReceipt>>, BrokerError> {
                let stmts = self.stmts_for(queue)?;
                let deadline = tokio::time::Instant::now() + wait;
                let mut clock_rx = self.broker.clock().subscribe();
                let mut looked_again = false;
                loop {
                    let notified = self.broker.shared.wake.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    let wakes = self.broker.shared.wakes.load(std::sync::atomic::Ordering::SeqCst);
                    let idle = self.inner.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(queue).copied();
                    // Nothing woke this process since a claim found the queue empty, and the
                    // next row is not due yet: wait instead of asking again. A worker of an
                    // idle queue queries once per poll interval (Postgres NOTIFY and this
                    // process's own publishes wake it at once).
                    let quiet = idle.is_some_and(|i| i.wakes == wakes && tokio::time::Instant::now() < i.until);
                    if !quiet {
                    let now = self.broker.now();
                    let lease = now + stagedoor_jobs::broker::chrono_duration(self.broker.lease);
                    let plan = if Statements::lacks(&stmts.claim_from) { Plan::Full } else { self.inner.floors.plan(queue) };
                    let v = Vals {
                        new_lease: Some(lease),
                        group: Some(queue.to_owned()),
                        now: Some(now),
                        // After a connection error, rows whose lease ran out wait (their owners
                        // renew first): only rows never leased or settled are taken.
                        reclaim: self.broker.cautious().then_some(DateTime::<Utc>::UNIX_EPOCH),
                        limit: i64::try_from(max).unwrap_or(i64::MAX),
                        floor: match plan { Plan::From(f) => Some(f), Plan::Full => None },
                        ..Vals::default()
                    };
                    let started = tokio::time::Instant::now();
                    let rows = if stmts.table.fifo && <$db as sealed::Sealed>::FLAVOR == Flavor::Postgres {
                        // One row per group in work: claims of a FIFO group are serialised by a
                        // transaction-scoped advisory lock (SKIP LOCKED alone would let a second
                        // worker take the row behind a locked head).
                        let mut conn = acquire(self.pool()?).await?;
                        let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(db_err)?;
                        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                            .bind(format!("{}:{queue}", stmts.qualified))
                            .execute(&mut *tx)
                            .await
                            .map_err(db_err)?;
                        let rows = $module::query(&stmts.claim, &v, &stmts.table).fetch_all(&mut *tx).await.map_err(db_err)?;
                        tx.commit().await.map_err(db_err)?;
                        rows.iter().map(|r| $module::read(r, &stmts.table)).collect::<Vec<_>>()
                    } else {
                        let stmt = match plan { Plan::From(_) => &stmts.claim_from, Plan::Full => &stmts.claim };
                        self.fetch(&stmts, stmt, &v).await?
                    };
                    if !Statements::lacks(&stmts.claim_from) {
                        let earliest = rows.iter().filter_map(|r| r.due).min();
                        match plan {
                            Plan::Full => self.inner.floors.after_full(queue, earliest, now, started.elapsed()),
                            Plan::From(_) => self.inner.floors.after_bounded(queue, earliest),
                        }
                    }
                    // Nothing due: on SQLite, look for rows whose `retry_after` is no timestamp
                    // and would wait forever (see `Statements::claim_strays`).
                    let rows = if rows.is_empty() && !Statements::lacks(&stmts.claim_strays) {
                        self.fetch(&stmts, &stmts.claim_strays, &v).await?
                    } else {
                        rows
                    };
                    if !rows.is_empty() {
                        let mut out = Vec::with_capacity(rows.len());
                        for mut r in rows {
                            // An id the table's type does not describe (a text in an SQLite
                            // integer column) is fenced on as it reads.
                            let id = IdValue::parse(&stmts.table, &r.id).unwrap_or_else(|_| IdValue::Text(r.id.clone()));
                            // A row that cannot be read is dead-lettered by itself; the others
                            // of the claim run.
                            if let Some(problem) = r.problem.take() {
                                self.dead_letter_unreadable(queue, r, id, lease, &problem).await;
                                continue;
                            }
                            let doc = HeaderDoc::parse(r.headers.as_deref());
                            let envelope = self.envelope_of(queue, &r, &doc);
                            out.push(Delivery {
                                envelope,
                                receipt: SqlReceipt::new(id, r.lease.unwrap_or(lease)),
                            });
                        }
                        self.inner.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(queue);
                        if out.is_empty() {
                            // Every row claimed was unreadable, and is gone: claim again.
                            continue;
                        }
                        return Ok(out);
                    }
                    // Empty: look again at the next due time or after the poll interval. A row
                    // due already but not claimable (its FIFO group is busy) waits for a wake-up
                    // or the poll; one that became due just now is looked for once more at once.
                    let next = self.next_due_from(&stmts, queue, plan).await;
                    let mut until = tokio::time::Instant::now() + self.broker.poll;
                    if let Some(t) = next {
                        match (t - self.broker.now()).to_std() {
                            Ok(d) if !d.is_zero() => until = until.min(tokio::time::Instant::now() + d),
                            _ if !looked_again => {
                                looked_again = true;
                                continue;
                            }
                            _ => {}
                        }
                    }
                    self.inner.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(queue.to_owned(), Idle { until, wakes });
                    }
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        return Ok(Vec::new());
                    }
                    let clock_changed = async {
                        match clock_rx.as_mut() {
                            Some(rx) => {
                                if rx.changed().await.is_err() {
                                    std::future::pending::<()>().await;
                                }
                            }
                            None => std::future::pending::<()>().await,
                        }
                    };
                    let until = self.inner.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(queue).map(|i| i.until);
                    let nap = until.map_or(left, |u| left.min(u.saturating_duration_since(tokio::time::Instant::now())));
                    tokio::select! {
                        _ = notified => {}
                        _ = clock_changed => {
                            self.inner.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(queue);
                            self.inner.floors.reset(queue);
                        }
                        _ = tokio::time::sleep(nap) => {}
                    }
                }
            }

            async fn renew_row(&self, queue: &str, receipt: &SqlReceipt) -> Result<bool, BrokerError> {
                let stmts = self.stmts_for(queue)?;
                let mut conn = acquire(self.pool()?).await?;
                let new = self.broker.now() + stagedoor_jobs::broker::chrono_duration(self.broker.lease);
                let v = Vals { new_lease: Some(new), id: Some(receipt.id.clone()), leases: Some(receipt.leases()), ..Vals::default() };
                match query(&stmts.renew, &v, &stmts.table).execute(&mut *conn).await {
                    Ok(done) => {
                        let renewed = done.rows_affected() == 1;
                        if renewed {
                            receipt.confirmed(new);
                        } else if receipt.settle_failed.load(std::sync::atomic::Ordering::SeqCst) {
                            // Not "lost": the settlement tried before may have taken effect
                            // (released or deleted the row) and only its reply was lost. The
                            // settlement's next try tells.
                            return Err(BrokerError::Backend(
                                "the row is no longer leased to this delivery: the settlement tried before may have taken effect (its reply was lost)".to_owned(),
                            ));
                        }
                        Ok(renewed)
                    }
                    Err(e) => {
                        // Sent, and no reply: it may have committed. The fence accepts both.
                        receipt.maybe(new);
                        Err(db_err(e))
                    }
                }
            }

            async fn settle_row(&self, queue: &str, delivery: &Delivery<SqlReceipt>, settlement: Settlement) -> Result<Settled, BrokerError> {
                let stmts = self.stmts_for(queue)?;
                let now = self.broker.now();
                let receipt = &delivery.receipt;
                let leases = receipt.leases();
                let base = || Vals { id: Some(receipt.id.clone()), leases: Some(leases), now: Some(now), ..Vals::default() };
                if matches!(settlement, Settlement::Ack | Settlement::Drop) && Arc::ptr_eq(&stmts, self.stmts()?) {
                    let n = u64::from(self.ack_batched(receipt.id.clone(), leases).await?);
                    self.broker.wake_all();
                    return Ok(if n == 1 { Settled::Done } else { Settled::LeaseLost });
                }
                let mut conn = acquire(self.pool()?).await?;
                let pool = &mut *conn;
                let n = match settlement {
                    Settlement::Ack | Settlement::Drop => {
                        query(&stmts.delete_fenced, &base(), &stmts.table).execute(&mut *pool).await.map_err(db_err)?.rows_affected()
                    }
                    Settlement::Retry { delay, failure } => {
                        if stmts.table.retry_after.is_none() && !delay.is_zero() {
                            tracing::warn!(table = stmts.table.name, "no retry_after column: the row is due again at once instead of in {delay:?}");
                        }
                        let keep_place = stmts.table.fifo && delay.is_zero();
                        let stmt = if keep_place { &stmts.retry_keep_place } else { &stmts.retry };
                        let v = Vals {
                            due: Some(if delay.is_zero() {
                                now - BACKDATE
                            } else {
                                now + stagedoor_jobs::broker::chrono_duration(delay)
                            }),
                            error: Some(failure.error.clone()),
                            ..base()
                        };
                        query(stmt, &v, &stmts.table).execute(&mut *pool).await.map_err(db_err)?.rows_affected()
                    }
                    Settlement::DeadLetter { target, failure } => {
                        let env = &delivery.envelope;
                        let h = env.headers();
                        let doc = HeaderDoc {
                            kind: (env.kind() != queue).then(|| env.kind().to_owned()),
                            job_id: Some(env.id().to_string()),
                            request_id: h.request_id.clone(),
                            trace: h.trace.clone(),
                            extra: h.extra.clone(),
                            origin: Some(queue.to_owned()),
                            traceback: Some(failure.traceback.clone()),
                            error: Some(failure.error.clone()),
                            failed_at: Some(now),
                        };
                        let v = Vals {
                            target: Some(target.clone()),
                            error: Some(failure.error.clone()),
                            headers: Some(doc.to_json()),
                            // The attempts spent: this delivery's number.
                            attempt: i64::from(env.attempt()),
                            ..base()
                        };
                        if self.grouped() {
                            query(&stmts.dead_group, &v, &stmts.table).execute(&mut *pool).await.map_err(db_err)?.rows_affected()
                        } else {
                            // The table form: copy into the dead table and delete, in one transaction.
                            let dead = self.dead_table(&target)?;
                            let mut tx = sqlx::Connection::begin(&mut *pool).await.map_err(db_err)?;
                            let copy = stmts.copy_into(&target, true);
                            let n = query(&copy, &v, &stmts.table).execute(&mut *tx).await.map_err(db_err)?.rows_affected();
                            if n == 1 {
                                query(&dead.mark_dead, &v, &dead.table).execute(&mut *tx).await.map_err(db_err)?;
                                query(&stmts.delete_by_id, &v, &stmts.table).execute(&mut *tx).await.map_err(db_err)?;
                                tx.commit().await.map_err(db_err)?;
                            }
                            n
                        }
                    }
                };
                self.broker.wake_all();
                Ok(if n == 1 { Settled::Done } else { Settled::LeaseLost })
            }

            async fn publish_rows(&self, queue: &str, jobs: Vec<(Envelope, Option<DateTime<Utc>>)>) -> Result<Vec<Published>, BrokerError> {
                let stmts = Arc::clone(self.stmts()?);
                if jobs.is_empty() {
                    return Ok(Vec::new());
                }
                let mut vals = Vec::with_capacity(jobs.len());
                for (envelope, at) in &jobs {
                    vals.push(self.encode_job(queue, envelope, *at)?);
                }
                let mut returned = Vec::with_capacity(vals.len());
                if let [v] = &vals[..] {
                    // One job: one statement (its NOTIFY included on Postgres).
                    let mut conn = acquire(self.pool()?).await?;
                    let rows = $module::query(&stmts.insert_notify, v, self.table()).fetch_all(&mut *conn).await.map_err(db_err)?;
                    returned = $module::returned_ids(&rows)?;
                } else {
                    let mut conn = acquire(self.pool()?).await?;
                    let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(db_err)?;
                    if keyed_by_row(self.table()) {
                        // Each job's id is the row id the database generates: a statement per
                        // row tells which is which (a multi-row insert returns its ids in no
                        // promised order).
                        for v in &vals {
                            let rows = $module::query(&stmts.insert, v, self.table()).fetch_all(&mut *tx).await.map_err(db_err)?;
                            returned.extend($module::returned_ids(&rows)?);
                        }
                    } else {
                        // Multi-row inserts of up to MAX_ROWS rows, all in one transaction.
                        let mut rest = &vals[..];
                        for n in chunks(vals.len()) {
                            let (chunk, more) = rest.split_at(n);
                            rest = more;
                            let (sql, template) = stmts.insert_many(n);
                            let rows = $module::query_rows(sql, template, chunk, self.table()).fetch_all(&mut *tx).await.map_err(db_err)?;
                            returned.extend($module::returned_ids(&rows)?);
                        }
                    }
                    self.notify_in(&mut tx, queue).await?;
                    tx.commit().await.map_err(db_err)?;
                }
                self.broker.wake_all();
                let envelopes: Vec<&Envelope> = jobs.iter().map(|(e, _)| e).collect();
                reports(self.table(), queue, &envelopes, returned)
            }

            /// [`Broker::publish_once`]: in one transaction, takes `guard` in `stagedoor_locks`
            /// (a new row, or one whose `until_at` has passed) and inserts the job as
            /// [`publish`](Broker::publish) does; when the guard is held, stores nothing.
            async fn publish_guarded(&self, queue: &str, job: (Envelope, Option<DateTime<Utc>>), guard: &str, ttl: Duration) -> Result<Published, BrokerError> {
                let stmts = Arc::clone(self.stmts()?);
                let (envelope, at) = job;
                let v = self.encode_job(queue, &envelope, at)?;
                let pool = self.pool()?;
                ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
                let mut conn = acquire(pool).await?;
                let now = self.broker.now();
                let until = now + stagedoor_jobs::broker::chrono_duration(ttl);
                let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(db_err)?;
                let taken = sqlx::query("INSERT INTO stagedoor_locks (lock_key, token, until_at) VALUES ($1, $2, $3) ON CONFLICT (lock_key) DO UPDATE SET token = excluded.token, until_at = excluded.until_at WHERE stagedoor_locks.until_at <= $4")
                    .bind(guard)
                    .bind(envelope.id().as_str().to_owned())
                    .bind(until)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?
                    .rows_affected()
                    == 1;
                if !taken {
                    tx.rollback().await.map_err(db_err)?;
                    return Ok(Published::already_there(envelope.id().clone()));
                }
                let rows = $module::query(&stmts.insert_notify, &v, self.table()).fetch_all(&mut *tx).await.map_err(db_err)?;
                let returned = $module::returned_ids(&rows)?;
                tx.commit().await.map_err(db_err)?;
                self.broker.wake_all();
                let mut out = reports(self.table(), queue, &[&envelope], returned)?;
                out.pop().ok_or_else(|| BrokerError::Backend("a publish of one job reported nothing".to_owned()))
            }

            /// The database's clock: Postgres `now()` (autocommit: the statement's time),
            /// SQLite's `'now'` (this machine's clock as the database reads it, in
            /// milliseconds).
            async fn database_time(&self) -> Result<DateTime<Utc>, BrokerError> {
                let mut conn = acquire(self.pool()?).await?;
                if <$db as sealed::Sealed>::FLAVOR == Flavor::Postgres {
                    return sqlx::query_scalar::<$db, DateTime<Utc>>("SELECT now()")
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(db_err);
                }
                let text = sqlx::query_scalar::<$db, String>("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(db_err)?;
                DateTime::parse_from_rfc3339(&text)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|e| BrokerError::Backend(format!("the database's clock read `{text}`, which is not a time: {e}")))
            }

        }
    };
}

mod sqlite_broker {
    use super::sqlite_impl::query;
    use super::*;
    impl_broker!(sqlx::Sqlite, sqlite_impl);
}
mod postgres_broker {
    use super::postgres_impl::query;
    use super::*;
    impl_broker!(sqlx::Postgres, postgres_impl);
}
