//! Publishing: a job encoded as a row (its envelope in the headers column), one job in one
//! statement, many in one transaction (multi-row inserts), a job inside the caller's own
//! transaction, and `publish_once`'s job stored only with its guard.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::{BrokerError, Published};
use stagedoor_jobs::inbox::ColumnType;
use stagedoor_jobs::{Envelope, Inbox, Job, Priority};

use super::{SqlxRoute, fetch_in};
use crate::dialect::{Dialect, acquire, db_err};
use crate::due::BACKDATE;
use crate::headers::HeaderDoc;
use crate::locks::{create_bookkeeping_in, ensure_bookkeeping, lock_holder, take_lock};
use crate::publish::{chunks, keyed_by_row, reports};
use crate::rows::{Vals, params_rows, returned_ids};
use crate::sql::{Flavor, Many};

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    fn encode_job(
        &self,
        queue: &str,
        envelope: &Envelope,
        at: Option<DateTime<Utc>>,
    ) -> Result<Vals, BrokerError> {
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
        // Without a priority column, the claim cannot order by one: a job that asks for a level
        // is refused rather than run as a normal one (a batch is checked whole before any
        // insert, so nothing of it is stored).
        if t.priority.is_none() && envelope.priority() != Priority::NORMAL {
            return Err(BrokerError::Backend(format!(
                "table `{}` has no priority column to keep the job's priority {}: add a `priority SMALLINT NOT NULL DEFAULT 0` column and a `#[field(priority)] priority: i16` field, or publish at normal priority",
                t.name,
                envelope.priority()
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
            priority: i64::from(envelope.priority().get()),
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
    ///
    /// A unique job ([`Job::unique`]) takes its key in the same transaction, as
    /// [`publish`](Self::publish) does in its own: when the key is held, nothing is stored
    /// and the holder's id is returned (not stored); when the transaction rolls back, the
    /// key is free again. A unique job needs the route connected
    /// ([`connect`](stagedoor_jobs::broker::Inspect::connect)), for the bookkeeping table
    /// that keeps the keys.
    pub async fn publish_in(
        &self,
        conn: &mut DB::Connection,
        job: Job,
    ) -> Result<Published, BrokerError> {
        let stmts = Arc::clone(self.stmts()?);
        let now = self.broker.now();
        let (queue, envelope, at) = job.into_parts(now);
        let v = self.encode_job(&queue, &envelope, at)?;
        if let Some((guard, ttl)) =
            stagedoor_jobs::broker::unique_guard_of(&queue, &envelope, at, now)
        {
            let pool = self.pool()?;
            if self.broker.shared.bookkeeping.get().is_none() && DB::FLAVOR == Flavor::Sqlite {
                // SQLite has one writer: the caller's transaction may hold the write lock
                // already, so the tables are made (if missing) in it, not beside it.
                create_bookkeeping_in::<DB>(conn).await?;
            } else {
                ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
            }
            let until = now + stagedoor_jobs::broker::chrono_duration(ttl);
            if !take_lock::<DB>(conn, &guard, envelope.id().as_str(), until, now).await? {
                let holder = lock_holder::<DB>(conn, &guard).await?;
                let id = match holder {
                    Some(h) if !h.is_empty() => stagedoor_jobs::JobId::from_string(h),
                    _ => envelope.id().clone(),
                };
                return Ok(Published::already_there(id));
            }
        }
        let rows = fetch_in::<DB>(conn, &stmts.insert_notify, &v, self.table()).await?;
        let returned = returned_ids::<DB>(&rows)?;
        self.broker.wake_all();
        let mut out = reports(self.table(), &queue, &[&envelope], returned)?;
        out.pop()
            .ok_or_else(|| BrokerError::Backend("a publish of one job reported nothing".to_owned()))
    }

    pub(super) async fn publish_rows(
        &self,
        queue: &str,
        jobs: Vec<(Envelope, Option<DateTime<Utc>>)>,
    ) -> Result<Vec<Published>, BrokerError> {
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
            let rows = fetch_in::<DB>(&mut *conn, &stmts.insert_notify, v, self.table()).await?;
            returned = returned_ids::<DB>(&rows)?;
        } else {
            let mut conn = acquire(self.pool()?).await?;
            let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(db_err)?;
            let keyed = keyed_by_row(self.table());
            let mut matched = false;
            if !keyed || self.inner.rows_in_order.load(Ordering::Relaxed) {
                // Multi-row inserts of up to MAX_ROWS rows, all in one transaction.
                let mut rest = &vals[..];
                matched = true;
                for n in chunks(vals.len()) {
                    let (chunk, more) = rest.split_at(n);
                    rest = more;
                    let sql = stmts.many(Many::Insert, n, false).sql;
                    let template = stmts.insert_template();
                    let rows = DB::fetch(&mut tx, sql, params_rows(template, chunk, self.table()))
                        .await
                        .map_err(db_err)?;
                    let ids = returned_ids::<DB>(&rows)?;
                    if keyed && !in_row_order(&ids, n) {
                        matched = false;
                        break;
                    }
                    returned.extend(ids);
                }
                if keyed && !matched {
                    // The ids the database generated do not tell which row is which job:
                    // undo, and from now on insert this table's rows one statement each.
                    tracing::warn!(
                        table = %self.table().name,
                        "the ids a multi-row insert generated are not increasing in row order (a sequence with a negative increment, or a default that is not a sequence): publishing this table's batches one row per statement, which is slower"
                    );
                    self.inner.rows_in_order.store(false, Ordering::Relaxed);
                    tx.rollback().await.map_err(db_err)?;
                    tx = sqlx::Connection::begin(&mut *conn).await.map_err(db_err)?;
                    returned.clear();
                }
            }
            if keyed && !matched {
                // Each job's id is the row id the database generates: a statement per row
                // tells which is which.
                for v in &vals {
                    let rows = fetch_in::<DB>(&mut *tx, &stmts.insert, v, self.table()).await?;
                    returned.extend(returned_ids::<DB>(&rows)?);
                }
            }
            DB::notify(&self.broker, &mut tx, queue).await?;
            tx.commit().await.map_err(db_err)?;
        }
        self.broker.wake_all();
        let envelopes: Vec<&Envelope> = jobs.iter().map(|(e, _)| e).collect();
        reports(self.table(), queue, &envelopes, returned)
    }

    /// [`Broker::finish_guard`]: guard `guard` runs out `ttl` from now if `token` holds it.
    pub(super) async fn finish_lock(
        &self,
        guard: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let now = self.broker.now();
        let until = now + stagedoor_jobs::broker::chrono_duration(ttl);
        let mut conn = acquire(pool).await?;
        crate::locks::finish_lock::<DB>(&mut conn, guard, token, until, now).await
    }

    /// [`Broker::publish_once`]: in one transaction, takes `guard` in `stagedoor_locks`
    /// (a new row, or one whose `until_at` has passed) and inserts the job as
    /// [`publish`](Broker::publish) does; when the guard is held, stores nothing.
    pub(super) async fn publish_guarded(
        &self,
        queue: &str,
        job: (Envelope, Option<DateTime<Utc>>),
        guard: &str,
        ttl: Duration,
    ) -> Result<Published, BrokerError> {
        let stmts = Arc::clone(self.stmts()?);
        let (envelope, at) = job;
        let v = self.encode_job(queue, &envelope, at)?;
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let mut conn = acquire(pool).await?;
        let now = self.broker.now();
        let until = now + stagedoor_jobs::broker::chrono_duration(ttl);
        let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(db_err)?;
        let taken = take_lock::<DB>(&mut tx, guard, envelope.id().as_str(), until, now).await?;
        if !taken {
            let holder = lock_holder::<DB>(&mut tx, guard).await?;
            tx.rollback().await.map_err(db_err)?;
            // A guard kept by an earlier version holds no job id (an empty token).
            let id = match holder {
                Some(h) if !h.is_empty() => stagedoor_jobs::JobId::from_string(h),
                _ => envelope.id().clone(),
            };
            return Ok(Published::already_there(id));
        }
        let rows = fetch_in::<DB>(&mut *tx, &stmts.insert_notify, &v, self.table()).await?;
        let returned = returned_ids::<DB>(&rows)?;
        tx.commit().await.map_err(db_err)?;
        self.broker.wake_all();
        let mut out = reports(self.table(), queue, &[&envelope], returned)?;
        out.pop()
            .ok_or_else(|| BrokerError::Backend("a publish of one job reported nothing".to_owned()))
    }
}

/// Whether the ids one multi-row insert of `n` rows returned tell which row is which job: `n`
/// integers, strictly increasing in the order returned. A sequence (or an identity, or
/// SQLite's rowid) gives the rows of one statement increasing ids in row order, and both
/// databases return them in that order; anything else (a sequence counting down, a default
/// that is no sequence, rows returned in another order) fails the check, and the batch is
/// inserted again one row per statement.
fn in_row_order(ids: &[String], n: usize) -> bool {
    if ids.len() != n {
        return false;
    }
    let mut last: Option<i64> = None;
    for id in ids {
        let Ok(v) = id.parse::<i64>() else {
            return false;
        };
        if last.is_some_and(|l| v <= l) {
            return false;
        }
        last = Some(v);
    }
    true
}
