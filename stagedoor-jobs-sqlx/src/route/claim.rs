//! Claiming rows: the claim statement (the highest priority first on a table with a priority
//! column, in due order when the runtime asks; bounded by the queue's floor on
//! Postgres; serialised per group for FIFO tables), waiting when nothing is due (until a wake-up, the next due time
//! or the poll interval), returning rows that cannot be read as unreadable items (see
//! `route/unreadable.rs`), and renewing a delivery's lease (its heartbeat).

use std::time::Duration;

use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;
use stagedoor_jobs::broker::{BrokerError, ClaimOrder, Claimed, Delivery, Inspect};
use stagedoor_jobs::kit::{ClockWatch, lock};

use super::{Idle, SqlxRoute, fetch_in, run_in};
use crate::dialect::{Dialect, acquire, db_err};
use crate::floor::Plan;
use crate::headers::HeaderDoc;
use crate::receipt::{IdValue, SqlReceipt};
use crate::rows::{RowRead, Vals, read_claimed};
use crate::sql::Statements;

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    pub(super) async fn claim_rows(
        &self,
        queue: &str,
        max: usize,
        wait: Duration,
        order: ClaimOrder,
    ) -> Result<Claimed<SqlReceipt>, BrokerError> {
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
                match self.claim_once(&stmts, queue, max, order).await? {
                    Taken::Rows(out) => return Ok(out),
                    Taken::None(plan) => {
                        if self
                            .idle_until(&stmts, queue, plan, wakes, &mut looked_again)
                            .await
                        {
                            continue;
                        }
                    }
                }
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(Claimed::of(Vec::new()));
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

    /// One claim statement: the rows it took made deliveries (an unreadable one an
    /// unreadable item), or, when it took none, the plan it was made with.
    async fn claim_once(
        &self,
        stmts: &Statements,
        queue: &str,
        max: usize,
        order: ClaimOrder,
    ) -> Result<Taken, BrokerError> {
        let now = self.broker.now();
        let lease = now + stagedoor_jobs::broker::chrono_duration(self.broker.lease);
        // A table with a priority column claims the highest level first, unless the runtime
        // asks for due order alone (its fair turn: no level starves).
        let by_priority = !Statements::lacks(&stmts.claim_prio) && order == ClaimOrder::Priority;
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
        let rows = self
            .fetch_claim(stmts, queue, &v, plan, by_priority)
            .await?;
        if !Statements::lacks(&stmts.claim_from) {
            let earliest = rows.iter().filter_map(|r| r.due).min();
            // A claim by priority may leave rows of lower levels due earlier than any
            // it took: the floor moves only after one that took every row it could
            // reach (fewer than it asked for), as after a claim in due order. The
            // others leave it where it is; the claims in due order (the fair turns) and
            // the full ones keep it up to date.
            let moves = !by_priority || rows.len() < max;
            match plan {
                Plan::Full if moves => {
                    self.inner
                        .floors
                        .after_full(queue, earliest, now, started.elapsed())
                }
                Plan::From(_) if moves => self.inner.floors.after_bounded(queue, earliest, now),
                _ => {}
            }
        }
        // Nothing due: on SQLite, look for rows whose `retry_after` is no timestamp
        // and would wait forever (see `Statements::claim_strays`).
        let rows = if rows.is_empty() && !Statements::lacks(&stmts.claim_strays) {
            self.fetch_claimed(stmts, &stmts.claim_strays, &v).await?
        } else {
            rows
        };
        if rows.is_empty() {
            return Ok(Taken::None(plan));
        }
        let out = self.deliveries_of(stmts, queue, rows, lease);
        lock(&self.inner.idle).remove(queue);
        Ok(Taken::Rows(out))
    }

    /// Runs the claim statement `v` of `plan`, by priority or in due order.
    async fn fetch_claim(
        &self,
        stmts: &Statements,
        queue: &str,
        v: &Vals,
        plan: Plan,
        by_priority: bool,
    ) -> Result<Vec<RowRead>, BrokerError> {
        if stmts.table.fifo && DB::LOCKS_FIFO_GROUPS {
            // One row per group in work: claims of a FIFO group are serialised by a
            // transaction-scoped advisory lock (SKIP LOCKED alone would let a second
            // worker take the row behind a locked head).
            let mut conn = acquire(self.pool()?).await?;
            let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(db_err)?;
            DB::lock_fifo_group(&mut tx, format!("{}:{queue}", stmts.qualified)).await?;
            let rows = fetch_in::<DB>(&mut *tx, &stmts.claim, v, &stmts.table).await?;
            tx.commit().await.map_err(db_err)?;
            return Ok(rows
                .iter()
                .map(|r| read_claimed::<DB>(r, &stmts.table))
                .collect::<Vec<_>>());
        }
        let stmt = match (plan, by_priority) {
            (Plan::From(_), false) => &stmts.claim_from,
            (Plan::Full, false) => &stmts.claim,
            (Plan::From(_), true) => &stmts.claim_prio_from,
            (Plan::Full, true) => &stmts.claim_prio,
        };
        self.fetch_claimed(stmts, stmt, v).await
    }

    /// The deliveries of the rows a claim took; a row that cannot be read is an unreadable
    /// item (the runtime dead-letters it by itself), and the others of the claim run.
    fn deliveries_of(
        &self,
        stmts: &Statements,
        queue: &str,
        rows: Vec<RowRead>,
        lease: DateTime<Utc>,
    ) -> Claimed<SqlReceipt> {
        let mut out = Claimed::of(Vec::with_capacity(rows.len()));
        for mut r in rows {
            // An id the table's type does not describe (a text in an SQLite
            // integer column) is fenced on as it reads.
            let id =
                IdValue::parse(&stmts.table, &r.id).unwrap_or_else(|_| IdValue::Text(r.id.clone()));
            if let Some(problem) = r.problem.take() {
                let item = self.unreadable_of(queue, &r, id, lease, &problem);
                out.unreadable.push(item);
                continue;
            }
            let doc = HeaderDoc::parse(r.headers.as_deref());
            let envelope = self.envelope_of(queue, &r, &doc);
            out.deliveries.push(Delivery::new(
                envelope,
                SqlReceipt::new(id, r.lease.unwrap_or(lease), r.ctid.clone()),
            ));
        }
        out
    }

    /// A claim that took nothing: when to look again, at the next due time or after the poll
    /// interval, recorded as the queue's idle time. A row due already but not claimable (its
    /// FIFO group is busy) waits for a wake-up or the poll; one that became due just now is
    /// looked for once more at once: `true` then (`looked_again` records it).
    async fn idle_until(
        &self,
        stmts: &Statements,
        queue: &str,
        plan: Plan,
        wakes: u64,
        looked_again: &mut bool,
    ) -> bool {
        let next = self.next_due_from(stmts, queue, plan).await;
        let mut until = tokio::time::Instant::now() + self.broker.poll;
        if let Some(t) = next {
            match (t - self.broker.now()).to_std() {
                Ok(d) if !d.is_zero() => until = until.min(tokio::time::Instant::now() + d),
                _ if !*looked_again => {
                    *looked_again = true;
                    return true;
                }
                _ => {}
            }
        }
        lock(&self.inner.idle).insert(queue.to_owned(), Idle { until, wakes });
        false
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
                // A renewal answers renewed or lost, nothing else: after a settlement whose
                // reply was lost, "lost" may mean that settlement took effect, and the
                // runtime's settle path tries it again to tell (its fence answers).
                let renewed = n == 1;
                if renewed {
                    receipt.confirmed(new);
                    receipt.moved(at);
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

/// What one claim statement took.
enum Taken {
    /// The deliveries and unreadable items of the rows it took (at least one).
    Rows(Claimed<SqlReceipt>),
    /// Nothing: the plan it was made with.
    None(Plan),
}
