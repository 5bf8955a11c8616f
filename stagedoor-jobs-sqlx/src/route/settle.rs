//! Settling a delivery: acknowledgements (batched deletes, fenced on the lease), retries
//! (due again after the delay, keeping a FIFO row's place when at once) and dead-lettering (to a
//! group of the same table, or copied into a dead-letter table in one transaction).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use stagedoor_jobs::Inbox;
use stagedoor_jobs::broker::{BrokerError, Delivery, Settled, Settlement};

use super::{BACKDATE, SqlxRoute, run_in};
use crate::acks::{AckReq, ack_loop};
use crate::dialect::{Dialect, acquire, db_err};
use crate::headers::HeaderDoc;
use crate::receipt::{IdValue, SqlReceipt};
use crate::rows::Vals;

impl<DB: Dialect, Row: Inbox> SqlxRoute<DB, Row> {
    pub(super) async fn settle_row(
        &self,
        queue: &str,
        delivery: &Delivery<SqlReceipt>,
        settlement: Settlement,
    ) -> Result<Settled, BrokerError> {
        let stmts = self.stmts_for(queue)?;
        let now = self.broker.now();
        let receipt = &delivery.receipt;
        let leases = receipt.leases();
        let base = || Vals {
            id: Some(receipt.id.clone()),
            leases: Some(leases),
            now: Some(now),
            ..Vals::default()
        };
        if matches!(settlement, Settlement::Ack | Settlement::Drop)
            && Arc::ptr_eq(&stmts, self.stmts()?)
        {
            let n = u64::from(self.ack_batched(receipt.id.clone(), leases).await?);
            self.broker.wake_all();
            return Ok(if n == 1 {
                Settled::Done
            } else {
                Settled::LeaseLost
            });
        }
        let mut conn = acquire(self.pool()?).await?;
        let pool = &mut *conn;
        let n = match settlement {
            Settlement::Ack | Settlement::Drop => {
                run_in::<DB>(&mut *pool, &stmts.delete_fenced, &base(), &stmts.table).await?
            }
            Settlement::Retry { delay, failure } => {
                if stmts.table.retry_after.is_none() && !delay.is_zero() {
                    tracing::warn!(
                        table = stmts.table.name,
                        "no retry_after column: the row is due again at once instead of in {delay:?}"
                    );
                }
                let keep_place = stmts.table.fifo && delay.is_zero();
                let stmt = if keep_place {
                    &stmts.retry_keep_place
                } else {
                    &stmts.retry
                };
                let v = Vals {
                    due: Some(if delay.is_zero() {
                        now - BACKDATE
                    } else {
                        now + stagedoor_jobs::broker::chrono_duration(delay)
                    }),
                    error: Some(failure.error.clone()),
                    ..base()
                };
                run_in::<DB>(&mut *pool, stmt, &v, &stmts.table).await?
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
                    run_in::<DB>(&mut *pool, &stmts.dead_group, &v, &stmts.table).await?
                } else {
                    // The table form: copy into the dead table and delete, in one transaction.
                    let dead = self.dead_table(&target)?;
                    let mut tx = sqlx::Connection::begin(&mut *pool).await.map_err(db_err)?;
                    let copy = stmts.copy_into(&target, true);
                    let n = run_in::<DB>(&mut *tx, &copy, &v, &stmts.table).await?;
                    if n == 1 {
                        run_in::<DB>(&mut *tx, &dead.mark_dead, &v, &dead.table).await?;
                        run_in::<DB>(&mut *tx, &stmts.delete_by_id, &v, &stmts.table).await?;
                        tx.commit().await.map_err(db_err)?;
                    }
                    n
                }
            }
        };
        self.broker.wake_all();
        Ok(if n == 1 {
            Settled::Done
        } else {
            Settled::LeaseLost
        })
    }

    /// Deletes an acknowledged row in the route's next batched delete; `true` when
    /// the row was still leased to this delivery.
    async fn ack_batched(
        &self,
        id: IdValue,
        leases: [DateTime<Utc>; crate::sql::FENCES],
    ) -> Result<bool, BrokerError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let stopped =
            || BrokerError::Connection("the route's acknowledgement task stopped".to_owned());
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
        let mut slot = self
            .inner
            .acks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
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
            ack_loop::<DB>(pool.clone(), Arc::clone(&stmts), rx)
        });
        *slot = Some(tx.clone());
        Ok(tx)
    }
}
