//! Claiming rows: the claim statement (the highest priority first on a table with a priority
//! column, in due order every `FAIR_CLAIM_EVERY`-th claim; bounded by the queue's floor on
//! Postgres; serialised per group for FIFO tables), waiting when nothing is due (until a wake-up, the next due time
//! or the poll interval), dead-lettering rows that cannot be read, and renewing a delivery's
//! lease (its heartbeat).

use std::time::Duration;

use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::{Broker, BrokerError, Delivery, Inspect, Settled, Settlement};
use stagedoor_jobs::kit::{ClockWatch, lock};
use stagedoor_jobs::{Failure, FailureCause, Inbox};

use super::{Idle, SqlxRoute, fetch_in, run_in};
use crate::dialect::{Dialect, acquire, db_err};
use crate::floor::Plan;
use crate::headers::HeaderDoc;
use crate::receipt::{IdValue, SqlReceipt};
use crate::rows::{RowRead, Vals, read};
use crate::sql::Statements;

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    pub(super) async fn claim_rows(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Delivery<SqlReceipt>>, BrokerError> {
        let stmts = self.stmts_for(queue).await?;
        let deadline = tokio::time::Instant::now() + wait;
        let mut clock = ClockWatch::new(&self.broker.clock());
        let mut looked_again = false;
        loop {
            let notified = self.broker.shared.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wakes = self
                .broker
                .shared
                .wakes
                .load(std::sync::atomic::Ordering::SeqCst);
            let idle = lock(&self.inner.idle).get(queue).copied();
            // Nothing woke this process since a claim found the queue empty, and the
            // next row is not due yet: wait instead of asking again. A worker of an
            // idle queue queries once per poll interval (Postgres NOTIFY and this
            // process's own publishes wake it at once).
            let quiet =
                idle.is_some_and(|i| i.wakes == wakes && tokio::time::Instant::now() < i.until);
            if !quiet {
                let now = self.broker.now();
                let lease = now + stagedoor_jobs::broker::chrono_duration(self.broker.lease);
                // A table with a priority column claims the highest level first, except every
                // FAIR_CLAIM_EVERY-th claim, in due order alone (no level starves).
                let by_priority = !Statements::lacks(&stmts.claim_prio) && !self.fair_turn(queue);
                let plan = if Statements::lacks(&stmts.claim_from) {
                    Plan::Full
                } else {
                    self.inner.floors.plan(queue)
                };
                let v = Vals {
                    new_lease: Some(lease),
                    group: Some(queue.to_owned()),
                    now: Some(now),
                    // After a connection error, rows whose lease ran out wait (their owners
                    // renew first): only rows never leased or settled are taken.
                    reclaim: self
                        .broker
                        .cautious()
                        .then_some(DateTime::<Utc>::UNIX_EPOCH),
                    limit: i64::try_from(max).unwrap_or(i64::MAX),
                    floor: match plan {
                        Plan::From(f) => Some(f),
                        Plan::Full => None,
                    },
                    ..Vals::default()
                };
                let started = tokio::time::Instant::now();
                let rows = if stmts.table.fifo && DB::LOCKS_FIFO_GROUPS {
                    // One row per group in work: claims of a FIFO group are serialised by a
                    // transaction-scoped advisory lock (SKIP LOCKED alone would let a second
                    // worker take the row behind a locked head).
                    let mut conn = acquire(self.pool()?).await?;
                    let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(db_err)?;
                    DB::lock_fifo_group(&mut tx, format!("{}:{queue}", stmts.qualified)).await?;
                    let rows = fetch_in::<DB>(&mut *tx, &stmts.claim, &v, &stmts.table).await?;
                    tx.commit().await.map_err(db_err)?;
                    rows.iter()
                        .map(|r| read::<DB>(r, &stmts.table))
                        .collect::<Vec<_>>()
                } else {
                    let stmt = match (plan, by_priority) {
                        (Plan::From(_), false) => &stmts.claim_from,
                        (Plan::Full, false) => &stmts.claim,
                        (Plan::From(_), true) => &stmts.claim_prio_from,
                        (Plan::Full, true) => &stmts.claim_prio,
                    };
                    self.fetch(&stmts, stmt, &v).await?
                };
                if !rows.is_empty() && !Statements::lacks(&stmts.claim_prio) {
                    self.count_taken(queue);
                }
                if !Statements::lacks(&stmts.claim_from) {
                    let earliest = rows.iter().filter_map(|r| r.due).min();
                    // A claim by priority may leave rows of lower levels due earlier than any
                    // it took: the floor moves only after one that took every row it could
                    // reach (fewer than it asked for), as after a claim in due order. The
                    // others leave it where it is; the claims in due order (every
                    // FAIR_CLAIM_EVERY-th) and the full ones keep it up to date.
                    let moves = !by_priority || rows.len() < max;
                    match plan {
                        Plan::Full if moves => {
                            self.inner
                                .floors
                                .after_full(queue, earliest, now, started.elapsed())
                        }
                        Plan::From(_) if moves => {
                            self.inner.floors.after_bounded(queue, earliest, now)
                        }
                        _ => {}
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
                        let id = IdValue::parse(&stmts.table, &r.id)
                            .unwrap_or_else(|_| IdValue::Text(r.id.clone()));
                        // A row that cannot be read is dead-lettered by itself; the others
                        // of the claim run.
                        if let Some(problem) = r.problem.take() {
                            self.dead_letter_unreadable(queue, r, id, lease, &problem)
                                .await;
                            continue;
                        }
                        let doc = HeaderDoc::parse(r.headers.as_deref());
                        let envelope = self.envelope_of(queue, &r, &doc);
                        out.push(Delivery {
                            envelope,
                            receipt: SqlReceipt::new(id, r.lease.unwrap_or(lease), r.ctid.clone()),
                        });
                    }
                    lock(&self.inner.idle).remove(queue);
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
                lock(&self.inner.idle).insert(queue.to_owned(), Idle { until, wakes });
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(Vec::new());
            }
            let until = lock(&self.inner.idle).get(queue).map(|i| i.until);
            let nap = until.map_or(left, |u| {
                left.min(u.saturating_duration_since(tokio::time::Instant::now()))
            });
            // Counted while it waits: SQLite then watches for other processes' commits.
            let _idle = self.broker.idle_claim();
            tokio::select! {
                _ = notified => {}
                () = clock.changed() => {
                    lock(&self.inner.idle).remove(queue);
                    self.inner.floors.reset(queue);
                }
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }

    pub(super) async fn renew_row(
        &self,
        queue: &str,
        receipt: &SqlReceipt,
    ) -> Result<bool, BrokerError> {
        let stmts = self.stmts_for(queue).await?;
        let mut conn = acquire(self.pool()?).await?;
        let new = self.broker.now() + stagedoor_jobs::broker::chrono_duration(self.broker.lease);
        let v = Vals {
            new_lease: Some(new),
            id: Some(receipt.id.clone()),
            leases: Some(receipt.leases()),
            ctid: receipt.ctid(),
            ..Vals::default()
        };
        match renew_in::<DB>(&mut conn, &stmts, &v).await {
            Ok((n, at)) => {
                let renewed = n == 1;
                if renewed {
                    receipt.confirmed(new);
                    receipt.moved(at);
                } else if receipt
                    .settle_failed
                    .load(std::sync::atomic::Ordering::SeqCst)
                {
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
                // Sent, and no reply: it may have committed. The fence accepts both; where the
                // row's version is now is not known.
                receipt.maybe(new);
                receipt.moved(None);
                Err(e)
            }
        }
    }

    /// with an error that names the column, its value and the fix: the rows claimed
    /// with it run, and it never comes back to fail a claim again. If the move
    /// fails, it stays leased and is claimed again after its lease.
    async fn dead_letter_unreadable(
        &self,
        queue: &str,
        r: RowRead,
        id: IdValue,
        lease: DateTime<Utc>,
        problem: &str,
    ) {
        let doc = HeaderDoc::parse(r.headers.as_deref());
        let envelope = self.envelope_of(queue, &r, &doc);
        let target = self.dead_letter_for(queue);
        let error = format!(
            "the stored job (row {}) cannot be read, so it was dead-lettered without running: {problem}; then replay it",
            r.id
        );
        tracing::error!(queue, row = %r.id, dead_letter = %target, "{error}");
        let delivery = Delivery {
            envelope,
            receipt: SqlReceipt::new(id, r.lease.unwrap_or(lease), r.ctid.clone()),
        };
        let failure = Failure::new(FailureCause::Decode, error, String::new());
        match Broker::settle(
            self,
            queue,
            &delivery,
            Settlement::DeadLetter { target, failure },
        )
        .await
        {
            Ok(Settled::Done) => {}
            Ok(Settled::LeaseLost) => {
                tracing::warn!(queue, row = %r.id, "an unreadable row was claimed by another worker before it could be dead-lettered")
            }
            Err(e) => {
                tracing::error!(queue, row = %r.id, error = %e, "could not move an unreadable row to its dead letter: it is claimed again after its lease")
            }
        }
    }

    /// Whether the next claim of `queue` is its fair one (a table with a priority column): the
    /// [`FAIR_CLAIM_EVERY`](stagedoor_jobs::FAIR_CLAIM_EVERY)-th, 2×..-th claim of this route
    /// that takes rows is made in due order alone, the jobs that waited longest first. Claims
    /// that find nothing are not counted: a fair claim that finds nothing is tried again by
    /// the next claim.
    fn fair_turn(&self, queue: &str) -> bool {
        let taken = lock(&self.inner.taken).get(queue).copied().unwrap_or(0);
        (taken + 1) % stagedoor_jobs::FAIR_CLAIM_EVERY == 0
    }

    /// A claim of `queue` took rows (see [`fair_turn`](Self::fair_turn)).
    fn count_taken(&self, queue: &str) {
        let mut taken = lock(&self.inner.taken);
        let n = taken.entry(queue.to_owned()).or_default();
        *n = n.wrapping_add(1);
    }

    /// When the next row of `queue` becomes claimable; above the floor only when the
    /// claim just made looked only there (rows below wait for the next full claim).
    async fn next_due_from(
        &self,
        stmts: &Statements,
        queue: &str,
        plan: Plan,
    ) -> Option<DateTime<Utc>> {
        match plan {
            Plan::From(floor) if !Statements::lacks(&stmts.next_due_from) => {
                let v = Vals {
                    group: Some(queue.to_owned()),
                    floor: Some(floor),
                    ..Vals::default()
                };
                let mut conn = acquire(self.pool().ok()?).await.ok()?;
                let rows = fetch_in::<DB>(&mut conn, &stmts.next_due_from, &v, &stmts.table)
                    .await
                    .ok()?;
                self.first_time(rows.first()?, "next due time")
            }
            _ => Inspect::next_due(self, queue).await,
        }
    }
}

/// Runs the renewal `v` of a row: on Postgres at the row's known place first (a TID scan), by
/// id when it is not known or the row is no longer there; how many rows it renewed and, on
/// Postgres, where the renewed version is.
async fn renew_in<DB: Dialect>(
    conn: &mut DB::Connection,
    stmts: &Statements,
    v: &Vals,
) -> Result<(u64, Option<String>), BrokerError> {
    if Statements::lacks(&stmts.renew_at) {
        return Ok((
            run_in::<DB>(conn, &stmts.renew, v, &stmts.table).await?,
            None,
        ));
    }
    let moved = |rows: &[DB::Row]| rows.first().and_then(|r| DB::text(r, 0).ok().flatten());
    if v.ctid.is_some() {
        let rows = fetch_in::<DB>(&mut *conn, &stmts.renew_at, v, &stmts.table).await?;
        if !rows.is_empty() {
            return Ok((rows.len() as u64, moved(&rows)));
        }
    }
    let rows = fetch_in::<DB>(&mut *conn, &stmts.renew, v, &stmts.table).await?;
    Ok((rows.len() as u64, moved(&rows)))
}
