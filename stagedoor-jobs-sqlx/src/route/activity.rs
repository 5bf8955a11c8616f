//! [`Activity`]: workers' reports and per-minute counts in the bookkeeping tables
//! (`stagedoor_workers`, `stagedoor_minutes`, created on first use with the others in
//! `locks.rs`), and a group's delayed rows.
//!
//! A report is one transaction: the worker's row (replaced), each queue's minutes (counts
//! added), and the rows that ran out (workers) or are older than `COUNTS_KEPT` (minutes)
//! deleted. Times are bound as the crate binds every time (on SQLite, RFC 3339 text in UTC,
//! which sorts as the times do).

use std::time::Duration;

use chrono::{DateTime, Utc};
use stagedoor_jobs::Activity;
use stagedoor_jobs::Inbox;
use stagedoor_jobs::activity::{DelayedJob, MinuteCounts, QueueCounts, WorkerReport, minute_of};
use stagedoor_jobs::broker::{BrokerError, chrono_duration};
use stagedoor_jobs::kit::{counts_kept_from, decode_report, encode_report};

use super::SqlxRoute;
use crate::dialect::sealed::Value;
use crate::dialect::{Dialect, acquire, db_err};
use crate::headers::HeaderDoc;
use crate::locks::ensure_bookkeeping;
use crate::rows::{Vals, attempt_number};
use crate::sql::Statements;

/// Stores report `$2` of worker `$1`, standing until `$3`.
const PUT_WORKER: &str = "INSERT INTO stagedoor_workers (worker_id, report, until_at) VALUES ($1, $2, $3) ON CONFLICT (worker_id) DO UPDATE SET report = excluded.report, until_at = excluded.until_at";

/// Deletes the reports that ran out at or before `$1`.
const DROP_GONE_WORKERS: &str = "DELETE FROM stagedoor_workers WHERE until_at <= $1";

/// Adds counts `$3, $4, $5` (processed, failed, dead) to queue `$1`'s minute `$2`.
const ADD_MINUTE: &str = "INSERT INTO stagedoor_minutes (queue, minute, processed, failed, dead) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (queue, minute) DO UPDATE SET processed = stagedoor_minutes.processed + excluded.processed, failed = stagedoor_minutes.failed + excluded.failed, dead = stagedoor_minutes.dead + excluded.dead";

/// Deletes the minutes before `$1`.
const DROP_OLD_MINUTES: &str = "DELETE FROM stagedoor_minutes WHERE minute < $1";

/// The reports standing after `$1`, by worker id.
const WORKERS: &str =
    "SELECT worker_id, report FROM stagedoor_workers WHERE until_at > $1 ORDER BY worker_id";

/// Queue `$1`'s minutes from `$2` on, oldest first.
const THROUGHPUT: &str = "SELECT minute, processed, failed, dead FROM stagedoor_minutes WHERE queue = $1 AND minute >= $2 ORDER BY minute";

/// A count as bound: saturating at `i64::MAX`.
fn count(n: u64) -> Value {
    Value::Int(Some(i64::try_from(n).unwrap_or(i64::MAX)))
}

impl<DB: Dialect, Row: Inbox> Activity for SqlxRoute<DB, Row> {
    async fn report(
        &self,
        worker: &WorkerReport,
        counts: &[QueueCounts],
        ttl: Duration,
    ) -> Result<(), BrokerError> {
        let json = encode_report(worker)?;
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let now = self.broker.now();
        let keep_from = counts_kept_from(now);
        let mut tx = pool.begin().await.map_err(db_err)?;
        let binds = vec![
            Value::Text(Some(worker.id.clone())),
            Value::Text(Some(json)),
            Value::Time(Some(now + chrono_duration(ttl))),
        ];
        DB::run(&mut tx, PUT_WORKER.to_owned(), binds)
            .await
            .map_err(db_err)?;
        for q in counts {
            for m in q.minutes.iter().filter(|m| !m.is_empty()) {
                let minute = minute_of(m.minute);
                if minute < keep_from {
                    continue;
                }
                let binds = vec![
                    Value::Text(Some(q.queue.clone())),
                    Value::Time(Some(minute)),
                    count(m.processed),
                    count(m.failed),
                    count(m.dead),
                ];
                DB::run(&mut tx, ADD_MINUTE.to_owned(), binds)
                    .await
                    .map_err(db_err)?;
            }
        }
        DB::run(
            &mut tx,
            DROP_GONE_WORKERS.to_owned(),
            vec![Value::Time(Some(now))],
        )
        .await
        .map_err(db_err)?;
        DB::run(
            &mut tx,
            DROP_OLD_MINUTES.to_owned(),
            vec![Value::Time(Some(keep_from))],
        )
        .await
        .map_err(db_err)?;
        tx.commit().await.map_err(db_err)
    }

    async fn workers(&self) -> Result<Vec<WorkerReport>, BrokerError> {
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let mut conn = acquire(pool).await?;
        let binds = vec![Value::Time(Some(self.broker.now()))];
        let rows = DB::fetch(&mut conn, WORKERS.to_owned(), binds)
            .await
            .map_err(db_err)?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let id = DB::text(row, 0).map_err(db_err)?.unwrap_or_default();
            let json = DB::text(row, 1).map_err(db_err)?.unwrap_or_default();
            // A row edited by hand: left out, said once per read.
            out.extend(decode_report(&id, &json, "stagedoor_workers"));
        }
        Ok(out)
    }

    async fn throughput(
        &self,
        queue: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteCounts>, BrokerError> {
        let pool = self.pool()?;
        ensure_bookkeeping(&self.broker.shared.bookkeeping, pool).await?;
        let mut conn = acquire(pool).await?;
        let binds = vec![
            Value::Text(Some(queue.to_owned())),
            Value::Time(Some(minute_of(since))),
        ];
        let rows = DB::fetch(&mut conn, THROUGHPUT.to_owned(), binds)
            .await
            .map_err(db_err)?;
        let n = |row: &DB::Row, i: usize| -> Result<u64, BrokerError> {
            let v = DB::int(row, i).map_err(db_err)?.unwrap_or(0);
            Ok(u64::try_from(v).unwrap_or(0))
        };
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let Some(minute) = DB::time(row, 0).map_err(db_err)? else {
                continue;
            };
            let m = MinuteCounts::new(minute, n(row, 1)?, n(row, 2)?, n(row, 3)?);
            if !m.is_empty() {
                out.push(m);
            }
        }
        Ok(out)
    }

    async fn delayed(&self, queue: &str, limit: usize) -> Result<Vec<DelayedJob>, BrokerError> {
        let stmts = self.stmts_for(queue).await?;
        if limit == 0 || Statements::lacks(&stmts.delayed) {
            return Ok(Vec::new());
        }
        let v = Vals {
            group: Some(queue.to_owned()),
            now: Some(self.broker.now()),
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            ..Vals::default()
        };
        let rows = self.fetch(&stmts, &stmts.delayed, &v).await?;
        Ok(rows
            .iter()
            // A row whose due time does not read has no place in the order: left out (the
            // claim that reaches it dead-letters it).
            .filter_map(|r| {
                let due = r.due?;
                let doc = HeaderDoc::parse(r.headers.as_deref());
                let kind = doc.kind.clone().unwrap_or_else(|| queue.to_owned());
                let id = doc.job_id.clone().unwrap_or_else(|| r.id.clone());
                Some(DelayedJob::new(id, kind, due, attempt_number(r.attempt, 1)))
            })
            .collect())
    }
}
