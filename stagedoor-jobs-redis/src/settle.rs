//! Settling a delivery: acknowledged in batches by one task per stream (`ack_loop`), retried
//! (a new entry, now or in the delayed set), or dead-lettered; and renewing its lease.

use std::sync::Arc;

use stagedoor_jobs::broker::{BrokerError, Delivery, Settled, Settlement};
use stagedoor_jobs::kit::lock;

use crate::broker::{AckReq, DEAD_MAXLEN, GROUP, RedisBroker, RedisReceipt, SettleOp, ms};
use crate::conn::Conn;
use crate::entry;
use crate::errors::Errors;
use crate::keys::{DEAD_SUFFIX, Keys};
use crate::scripts;

/// How far (in entry time) settled entries may sit above a delivery still pending before
/// they are deleted one by one instead of waiting for the trim below it: the stream holds at
/// most about this much of settled entries.
const TRIM_WINDOW_MS: u64 = 1_000;

/// An entry id's order in its stream: `(ms, seq)` (an id that does not parse sorts last).
fn id_order(id: &str) -> (u64, u64) {
    id.split_once('-')
        .and_then(|(m, s)| Some((m.parse().ok()?, s.parse().ok()?)))
        .unwrap_or((u64::MAX, u64::MAX))
}

/// Settlement calls of one stream in flight at once: the next batch is sent while the
/// previous one runs, so that deliveries settled meanwhile do not wait for its answer.
const CALLS_IN_FLIGHT: usize = 2;

/// Settles deliveries in batches: what settled while the previous calls ran goes in the next
/// one (one script call for up to `ACK_BATCH` acknowledgements, retries and dead letters, each
/// fenced on its own; up to `CALLS_IN_FLIGHT` calls at once). Runs under `restart_on_panic`:
/// the receiver is shared so that a restarted loop reads the same channel (a panic fails only
/// the batches it interrupted; the runtime settles those again).
async fn ack_loop(
    c: Conn,
    keys: Keys,
    consumer: String,
    errors: Arc<Errors>,
    allow_oom: bool,
    rx: stagedoor_jobs::supervise::SharedReceiver<AckReq>,
) {
    type Call<'a> = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
    let mut rx = rx.lock().await;
    let mut calls: [Option<Call<'_>>; CALLS_IN_FLIGHT] = [None, None];
    let mut open = true;
    while open || calls.iter().any(Option::is_some) {
        let free = calls.iter().position(Option::is_none).filter(|_| open);
        let mut batch = Vec::new();
        let [a, b] = &mut calls;
        tokio::select! {
            n = rx.recv_many(&mut batch, scripts::ACK_BATCH), if free.is_some() => {
                if n == 0 {
                    open = false;
                } else if let Some(i) = free {
                    let call = settle_batch(c.clone(), &keys, &consumer, &errors, allow_oom, batch);
                    calls[i] = Some(Box::pin(call));
                }
            }
            () = async { if let Some(f) = a { f.await } }, if a.is_some() => calls[0] = None,
            () = async { if let Some(f) = b { f.await } }, if b.is_some() => calls[1] = None,
        }
    }
}

/// One settlement call for `batch`; every delivery in it is answered.
async fn settle_batch(
    mut c: Conn,
    keys: &Keys,
    consumer: &str,
    errors: &Errors,
    allow_oom: bool,
    mut batch: Vec<AckReq>,
) {
    let (mut lo, mut hi) = ((u64::MAX, u64::MAX), (0, 0));
    let (mut lo_id, mut hi_id) = ("+", "-");
    for r in &batch {
        let o = id_order(&r.id);
        if o <= lo {
            (lo, lo_id) = (o, &r.id);
        }
        if o >= hi {
            (hi, hi_id) = (o, &r.id);
        }
    }
    let mut call = scripts::SETTLE_MANY.pick(allow_oom).key(&keys.stream);
    call.key(&keys.ids)
        .key(&keys.delayed)
        .key(&keys.dead)
        .arg(GROUP)
        .arg(consumer)
        .arg(DEAD_MAXLEN)
        .arg(lo_id)
        .arg(hi_id)
        // This consumer's pending entries in the range: the batch, and others still
        // running (a range that comes back full is completed id by id).
        .arg(batch.len() * 2 + 64)
        // Redis 7 (script flags) has the group's lag to count ready entries from: settled
        // entries are trimmed there, deleted one by one on Redis 6.2 and on a dead stream
        // (whose length is the dead letters' count, and whose entries the CLI lists).
        .arg(if allow_oom && !Keys::is_dead(&keys.name) {
            TRIM_WINDOW_MS
        } else {
            0
        });
    for r in &batch {
        match &r.op {
            SettleOp::Ack { job } => {
                call.arg("a").arg(&r.id).arg(r.deliveries).arg(job);
            }
            SettleOp::Retry { due, items } => {
                call.arg("r")
                    .arg(&r.id)
                    .arg(r.deliveries)
                    .arg(*due)
                    .arg(items.len())
                    .arg(items);
            }
            SettleOp::Dead { job, items } => {
                call.arg("x")
                    .arg(&r.id)
                    .arg(r.deliveries)
                    .arg(job)
                    .arg(items.len())
                    .arg(items);
            }
        }
    }
    match call.invoke_async::<Vec<i64>>(&mut c).await {
        Ok(done) => {
            for (i, r) in batch.drain(..).enumerate() {
                let _ = r.reply.send(Ok(done.get(i).copied().unwrap_or(0)));
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

impl RedisBroker {
    /// [`Broker::renew`](stagedoor_jobs::broker::Broker::renew) on Redis (the trait's impl
    /// in `broker.rs` calls this).
    pub(crate) async fn renew(
        &self,
        queue: &str,
        receipt: &RedisReceipt,
    ) -> Result<bool, BrokerError> {
        let keys = self.keys_at(queue, receipt.level);
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
        let r = &delivery.receipt;
        // The stream of the delivery's level: a retry due now goes back to it.
        let keys = self.keys_at(queue, r.level);
        let job = delivery.envelope.id().to_string();
        let (op, delayed) = match settlement {
            Settlement::Ack | Settlement::Drop => (SettleOp::Ack { job }, None),
            Settlement::Retry { delay, .. } => {
                // The next entry carries the attempts spent so far (its next delivery is this
                // one's number + 1).
                let spent =
                    entry::attempts_after(delivery.envelope.attempt(), Keys::is_dead(queue));
                let fields = entry::with(&r.fields, "attempts", spent.to_string());
                if delay.is_zero() {
                    let items = entry::flat(&fields);
                    (SettleOp::Retry { due: 0, items }, None)
                } else {
                    let due = ms(stagedoor_jobs::broker::later(self.now(), delay)).max(1);
                    let items = vec![entry::member(&fields)];
                    (
                        SettleOp::Retry {
                            due: due as u64,
                            items,
                        },
                        Some(delay),
                    )
                }
            }
            Settlement::DeadLetter { target, failure } => {
                let target_keys = self.keys(&target);
                if target_keys.dead != keys.dead {
                    return Err(BrokerError::Backend(format!(
                        "dead letter `{target}` is not the dead stream of `{queue}` (`{}`)",
                        keys.name.clone() + DEAD_SUFFIX
                    )));
                }
                let f = self.dead_fields(
                    &r.fields,
                    Some(delivery.envelope.attempt()),
                    &failure.error,
                    &failure.traceback,
                    &keys.name,
                );
                let items = entry::flat(&f);
                (SettleOp::Dead { job, items }, None)
            }
        };
        let (reply, answer) = tokio::sync::oneshot::channel();
        let stopped = || BrokerError::Connection("the settlement task stopped".to_owned());
        let mut req = AckReq {
            id: r.id.clone(),
            deliveries: r.deliveries,
            op,
            reply,
        };
        // A send fails only if the task stopped since `ack_sender` looked: the second look
        // starts it again.
        let c = self.conn()?;
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
        let n = answer.await.map_err(|_| stopped())??;
        let done = n > 0;
        if done && let Some(delay) = delayed {
            self.look_within(queue, delay);
        }
        if n > 1 {
            self.note_trimmed(&keys.dead, n - 1);
        }
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
        let mut acks = lock(&self.inner.acks);
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
