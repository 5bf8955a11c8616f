//! Settling a delivery: acknowledgements (deletes, fenced on the lease), retries (due again
//! after the delay, keeping a FIFO row's place when at once) and dead-lettering (to a group of
//! the same table, or copied into a dead-letter table in one transaction). Rows of the route's
//! table are settled by its settlement task, in batches (`batch.rs`); rows of a dead-letter
//! table one at a time.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use stagedoor_jobs::broker::{BrokerError, Delivery, Settled, Settlement};
use stagedoor_jobs::{Failure, Inbox};

use super::SqlxRoute;
use crate::batch::{Op, SettleReq, settle_loop};
use crate::dead_move::move_dead;
use crate::dialect::{Dialect, acquire, db_err};
use crate::due::BACKDATE;
use crate::headers::HeaderDoc;
use crate::receipt::{IdValue, SqlReceipt};
use crate::rows::Vals;
use crate::sql::Statements;

/// When a retried row is due again (`delay` after `now`, or at once, backdated), and whether it
/// keeps its place (a FIFO row retried at once). Warns when the table cannot delay it.
fn retry_due(
    stmts: &Statements,
    now: DateTime<Utc>,
    delay: std::time::Duration,
) -> (DateTime<Utc>, bool) {
    if stmts.table.retry_after.is_none() && !delay.is_zero() {
        tracing::warn!(
            table = stmts.table.name,
            "no retry_after column: the row is due again at once instead of in {delay:?}"
        );
    }
    let keep_place = stmts.table.fifo && delay.is_zero();
    let due = if delay.is_zero() {
        now - BACKDATE
    } else {
        stagedoor_jobs::broker::later(now, delay)
    };
    (due, keep_place)
}

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    pub(super) async fn settle_row(
        &self,
        queue: &str,
        delivery: &Delivery<SqlReceipt>,
        settlement: Settlement,
    ) -> Result<Settled, BrokerError> {
        let stmts = self.stmts_for(queue).await?;
        let now = self.broker.now();
        let receipt = &delivery.receipt;
        let leases = receipt.leases();
        let base = || Vals {
            id: Some(receipt.id.clone()),
            leases: Some(leases),
            now: Some(now),
            ..Vals::default()
        };
        // The route's own table: settled in the route's next batch (see `settle_loop`).
        let batched = Arc::ptr_eq(&stmts, self.stmts()?);
        let op = match settlement {
            Settlement::Ack | Settlement::Drop => {
                if batched {
                    Op::Ack
                } else {
                    let n = self.exec(&stmts.delete_fenced, &base()).await?;
                    return Ok(self.settled(n == 1));
                }
            }
            Settlement::Retry { delay, failure } => {
                let (due, keep_place) = retry_due(&stmts, now, delay);
                if batched {
                    Op::Retry {
                        due: (!keep_place).then_some(due),
                        error: failure.error,
                    }
                } else {
                    let stmt = if keep_place {
                        &stmts.retry_keep_place
                    } else {
                        &stmts.retry
                    };
                    let v = Vals {
                        due: Some(due),
                        error: Some(failure.error),
                        ..base()
                    };
                    let n = self.exec(stmt, &v).await?;
                    return Ok(self.settled(n == 1));
                }
            }
            Settlement::DeadLetter { target, failure } => {
                let v = dead_vals(queue, delivery, &target, &failure, base());
                let table = if self.grouped() {
                    None
                } else {
                    Some((target.clone(), self.dead_table(&target).await?))
                };
                if batched {
                    Op::Dead {
                        v: Box::new(v),
                        table,
                    }
                } else {
                    let n = self.dead_letter_alone(&stmts, &v, table).await?;
                    return Ok(self.settled(n == 1));
                }
            }
        };
        let done = self
            .settle_batched(receipt.id.clone(), leases, receipt.ctid(), op)
            .await?;
        Ok(self.settled(done))
    }

    /// The answer of a settlement that took effect (`done`) or found its lease lost; wakes
    /// this process's idle claims (a retried row is due, a slot is free).
    fn settled(&self, done: bool) -> Settled {
        self.broker.wake_all();
        if done {
            Settled::Done
        } else {
            Settled::LeaseLost
        }
    }

    /// A dead letter of a row of another table than the route's (a dead-letter table's
    /// queue): moved by itself, to a group or (the table form) copied into the dead table and
    /// deleted, in one transaction.
    async fn dead_letter_alone(
        &self,
        stmts: &Statements,
        v: &Vals,
        table: Option<(String, Arc<Statements>)>,
    ) -> Result<u64, BrokerError> {
        let mut conn = acquire(self.pool()?).await?;
        if table.is_none() {
            return move_dead::<DB>(&mut conn, stmts, v, None).await;
        }
        let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(db_err)?;
        let n = move_dead::<DB>(&mut tx, stmts, v, table.as_ref()).await?;
        if n == 1 {
            tx.commit().await.map_err(db_err)?;
        }
        Ok(n)
    }

    /// Settles a row in the route's next batch; `true` when the row was still leased to this
    /// delivery.
    async fn settle_batched(
        &self,
        id: IdValue,
        leases: [DateTime<Utc>; crate::sql::FENCES],
        ctid: Option<String>,
        op: Op,
    ) -> Result<bool, BrokerError> {
        // The route's task: started at the first settlement and again whenever it is found
        // stopped (it ran on a tokio runtime that has shut down, say), so that one dead task
        // never makes every later settlement fail; a panic inside it restarts it in place.
        let start = || {
            let pool = self.pool()?.clone();
            let stmts = Arc::clone(self.stmts()?);
            let task = format!("sqlx settlements of `{}`", self.table().name);
            let run = move |rx| settle_loop::<DB>(pool.clone(), Arc::clone(&stmts), rx);
            Ok((task, run))
        };
        let req = |reply| SettleReq {
            id,
            leases,
            op,
            ctid,
            reply,
        };
        self.inner.settles.call("", start, req).await
    }
}

/// The values of `delivery`'s move to dead letter `target` from `queue`: `base` (the row and
/// its lease, the time), the failure, and the headers that say where it came from and why.
fn dead_vals(
    queue: &str,
    delivery: &Delivery<SqlReceipt>,
    target: &str,
    failure: &Failure,
    base: Vals,
) -> Vals {
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
        failed_at: base.now,
    };
    Vals {
        target: Some(target.to_owned()),
        error: Some(failure.error.clone()),
        headers: Some(doc.to_json()),
        // The attempts spent: this delivery's number.
        attempt: i64::from(env.attempt()),
        ..base
    }
}
