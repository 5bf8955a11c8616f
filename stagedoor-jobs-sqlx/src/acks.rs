//! Batched deletes of acknowledged rows: the request a settlement queues, the batch sizes, and
//! the task that runs the deletes.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use stagedoor_jobs::BrokerError;
use stagedoor_jobs::supervise::SharedReceiver;

use crate::dialect::sealed::{Driver, Value};
use crate::dialect::{acquire, db_err};
use crate::receipt::IdValue;
use crate::sql::Statements;

/// A settled delivery's row to delete, waiting for the route's next batched delete.
pub(crate) struct AckReq {
    pub(crate) id: IdValue,
    pub(crate) leases: [DateTime<Utc>; crate::sql::FENCES],
    pub(crate) reply: tokio::sync::oneshot::Sender<Result<bool, BrokerError>>,
}

/// Most acknowledgements one delete carries.
pub(crate) const ACK_BATCH: usize = 256;

/// The batch sizes statements are built for: powers of two, so that a connection's statement
/// cache holds them all.
pub(crate) fn bucket(n: usize) -> usize {
    n.next_power_of_two().min(ACK_BATCH)
}

/// Deletes acknowledged rows in batches: whatever queued while the previous delete ran goes in
/// the next one (one statement and one commit for many jobs). Each row stays fenced on its
/// lease; a row whose lease was lost is reported as such. Runs under `restart_on_panic`: the
/// receiver is shared so that a restarted loop reads the same channel (a panic fails only the
/// batch it interrupted; the runtime settles those again).
pub(crate) async fn ack_loop<DB: Driver>(
    pool: sqlx::Pool<DB>,
    stmts: Arc<Statements>,
    rx: SharedReceiver<AckReq>,
) {
    let mut rx = rx.lock().await;
    let mut batch = Vec::with_capacity(ACK_BATCH);
    while rx.recv_many(&mut batch, ACK_BATCH).await > 0 {
        let n = bucket(batch.len());
        let mut binds = Vec::with_capacity(n * (1 + crate::sql::FENCES));
        for i in 0..n {
            // Padding repeats the last row: a duplicate term deletes nothing more.
            let r = &batch[i.min(batch.len() - 1)];
            binds.push(r.id.value());
            binds.extend(r.leases.iter().map(|l| Value::Time(Some(*l))));
        }
        let done = match acquire(&pool).await {
            Ok(mut conn) => DB::fetch(&mut conn, stmts.delete_many(n), binds)
                .await
                .map_err(db_err),
            Err(e) => Err(e),
        };
        match done {
            Ok(rows) => {
                let gone: std::collections::HashSet<String> = rows
                    .iter()
                    .filter_map(|row| DB::text(row, 0).ok().flatten())
                    .collect();
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
