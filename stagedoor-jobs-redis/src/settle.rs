//! Settling a delivery: acknowledged in batches by one task per stream (`ack_loop`), retried
//! (a new entry, now or in the delayed set), or dead-lettered; and renewing its lease.

use std::sync::Arc;

use stagedoor_jobs::broker::{BrokerError, Delivery, Settled, Settlement};

use crate::broker::{AckReq, GROUP, RedisBroker, RedisReceipt, ms};
use crate::conn::Conn;
use crate::entry;
use crate::errors::Errors;
use crate::keys::{DEAD_SUFFIX, Keys};
use crate::scripts;

/// Acknowledges deliveries in batches: what settled while the previous call ran goes in the
/// next one (one script call for up to `ACK_BATCH` deliveries, each fenced on its own). Runs
/// under `restart_on_panic`: the receiver is shared so that a restarted loop reads the same
/// channel (a panic fails only the batch it interrupted; the runtime settles those again).
async fn ack_loop(
    mut c: Conn,
    keys: Keys,
    consumer: String,
    errors: Arc<Errors>,
    allow_oom: bool,
    rx: stagedoor_jobs::supervise::SharedReceiver<AckReq>,
) {
    let mut rx = rx.lock().await;
    let mut batch = Vec::with_capacity(scripts::ACK_BATCH);
    while rx.recv_many(&mut batch, scripts::ACK_BATCH).await > 0 {
        let mut call = scripts::ACK_MANY.pick(allow_oom).key(&keys.stream);
        call.key(&keys.ids).arg(GROUP).arg(&consumer);
        for r in &batch {
            call.arg(&r.id).arg(r.deliveries).arg(&r.job);
        }
        match call.invoke_async::<Vec<i64>>(&mut c).await {
            Ok(done) => {
                for (i, r) in batch.drain(..).enumerate() {
                    let _ = r.reply.send(Ok(done.get(i) == Some(&1)));
                }
            }
            Err(e) => {
                let e = errors.of(e);
                for r in batch.drain(..) {
                    let _ = r.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

impl RedisBroker {
    /// [`Broker::renew`](stagedoor_jobs::broker::Broker::renew) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn renew(
        &self,
        queue: &str,
        receipt: &RedisReceipt,
    ) -> Result<bool, BrokerError> {
        let keys = self.keys(queue);
        let mut c = self.conn()?;
        let r: i64 = scripts::RENEW
            .pick(self.allow_oom())
            .key(&keys.stream)
            .arg(GROUP)
            .arg(&self.inner.consumer)
            .arg(&receipt.id)
            .arg(receipt.deliveries)
            .invoke_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        Ok(r == 1)
    }

    /// [`Broker::settle`](stagedoor_jobs::broker::Broker::settle) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn settle(
        &self,
        queue: &str,
        delivery: &Delivery<RedisReceipt>,
        settlement: Settlement,
    ) -> Result<Settled, BrokerError> {
        let keys = self.keys(queue);
        let r = &delivery.receipt;
        let job = delivery.envelope.id().to_string();
        let mut c = self.conn()?;
        let done = match settlement {
            Settlement::Ack | Settlement::Drop => {
                let (reply, answer) = tokio::sync::oneshot::channel();
                let stopped =
                    || BrokerError::Connection("the acknowledgement task stopped".to_owned());
                let mut req = AckReq {
                    id: r.id.clone(),
                    deliveries: r.deliveries,
                    job,
                    reply,
                };
                // A send fails only if the task stopped since `ack_sender` looked: the second
                // look starts it again.
                let mut sent = false;
                for _ in 0..2 {
                    match self.ack_sender(&c, &keys).send(req) {
                        Ok(()) => {
                            sent = true;
                            break;
                        }
                        Err(e) => req = e.0,
                    }
                }
                if !sent {
                    return Err(stopped());
                }
                answer.await.map_err(|_| stopped())??
            }
            Settlement::Retry { delay, .. } => {
                // The next entry carries the attempts spent so far (its next delivery is this
                // one's number + 1).
                let spent =
                    entry::attempts_after(delivery.envelope.attempt(), Keys::is_dead(queue));
                let fields = entry::with(&r.fields, "attempts", spent.to_string());
                let due = if delay.is_zero() {
                    0
                } else {
                    ms(self.now() + stagedoor_jobs::broker::chrono_duration(delay)).max(1)
                };
                let n: i64 = scripts::RETRY
                    .pick(self.allow_oom())
                    .key(&keys.stream)
                    .key(&keys.delayed)
                    .arg(GROUP)
                    .arg(&self.inner.consumer)
                    .arg(&r.id)
                    .arg(r.deliveries)
                    .arg(due)
                    .arg(entry::member(&fields))
                    .arg(entry::flat(&fields))
                    .invoke_async(&mut c)
                    .await
                    .map_err(|e| self.err(e))?;
                if n == 1 && due > 0 {
                    // The mover should look by then.
                    let at = tokio::time::Instant::now() + delay;
                    if let Some(h) = self
                        .inner
                        .housekeeping
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .get_mut(queue)
                    {
                        h.next_delayed = Some(h.next_delayed.map_or(at, |t| t.min(at)));
                    }
                }
                n == 1
            }
            Settlement::DeadLetter { target, failure } => {
                let target_keys = self.keys(&target);
                if target_keys.dead != keys.dead {
                    return Err(BrokerError::Backend(format!(
                        "dead letter `{target}` is not the dead stream of `{queue}` (`{}`)",
                        keys.name.clone() + DEAD_SUFFIX
                    )));
                }
                self.dead_letter_held(
                    &keys,
                    (&r.id, r.deliveries, &r.fields),
                    Some(delivery.envelope.attempt()),
                    &failure.error,
                    &failure.traceback,
                )
                .await?
            }
        };
        Ok(if done {
            Settled::Done
        } else {
            Settled::LeaseLost
        })
    }

    /// The channel to the task that acknowledges `keys`' stream, which is started at the
    /// stream's first acknowledgement and again whenever it is found stopped (it ran on a tokio
    /// runtime that has shut down, say): one dead task never makes every later acknowledgement
    /// fail. A panic inside it restarts it in place.
    pub(crate) fn ack_sender(
        &self,
        c: &Conn,
        keys: &Keys,
    ) -> tokio::sync::mpsc::UnboundedSender<AckReq> {
        let mut acks = self
            .inner
            .acks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tx) = acks.get(&keys.stream).filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let task = format!("redis acknowledgements of `{}`", keys.stream);
        if acks.contains_key(&keys.stream) {
            tracing::error!(task = %task, "the acknowledgement task had stopped: starting it again");
        }
        let (c, k, consumer) = (c.clone(), keys.clone(), self.inner.consumer.clone());
        let (errors, allow_oom) = (Arc::clone(&self.inner.errors), self.allow_oom());
        let tx = stagedoor_jobs::supervise::spawn_consumer(task, move |rx| {
            ack_loop(
                c.clone(),
                k.clone(),
                consumer.clone(),
                Arc::clone(&errors),
                allow_oom,
                rx,
            )
        });
        acks.insert(keys.stream.clone(), tx.clone());
        tx
    }
}
