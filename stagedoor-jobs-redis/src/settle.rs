//! Settling a delivery: acknowledged, retried (a new entry, now or in the delayed set) or
//! dead-lettered, in batches by one task per stream (`settle_loop`, under the kit's
//! `Batchers`); and renewing its lease.

use std::sync::Arc;

use stagedoor_jobs::broker::{BrokerError, Delivery, Settled, Settlement};
use stagedoor_jobs::kit::{SharedReceiver, run_batches};

use crate::broker::{DEAD_MAXLEN, GROUP, RedisBroker, RedisReceipt, SettleOp, SettleReq, ms};
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
/// one (one script call for up to `SETTLE_BATCH` acknowledgements, retries and dead letters,
/// each fenced on its own; up to `CALLS_IN_FLIGHT` calls at once). The batching is the kit's
/// `run_batches`, under the kit's `Batchers`: a panic fails only the batches it interrupted
/// (the runtime settles those again).
async fn settle_loop(
    c: Conn,
    keys: Arc<Keys>,
    consumer: String,
    errors: Arc<Errors>,
    allow_oom: bool,
    rx: SharedReceiver<SettleReq>,
) {
    let (keys, consumer, errors) = (&*keys, consumer.as_str(), &*errors);
    let apart = |_: &SettleReq| None::<()>;
    run_batches(rx, scripts::SETTLE_BATCH, CALLS_IN_FLIGHT, apart, |batch| {
        settle_batch(c.clone(), keys, consumer, errors, allow_oom, batch)
    })
    .await;
}

/// One settlement call for `batch`; every delivery in it is answered.
async fn settle_batch(
    mut c: Conn,
    keys: &Keys,
    consumer: &str,
    errors: &Errors,
    allow_oom: bool,
    mut batch: Vec<SettleReq>,
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
    let mut call = scripts::ScriptCall::new(
        scripts::SETTLE_MANY.pick(allow_oom),
        &[&keys.stream, &keys.ids, &keys.delayed, &keys.dead],
    );
    call.arg(GROUP)
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
                call.arg("a").arg(&r.id).arg(r.deliveries).arg(job.as_str());
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
                    .arg(job.as_str())
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
    pub(crate) async fn redis_renew(
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
    /// in `broker.rs` calls this): in the stream's next batch.
    pub(crate) async fn redis_settle(
        &self,
        queue: &str,
        delivery: &Delivery<RedisReceipt>,
        settlement: Settlement,
    ) -> Result<Settled, BrokerError> {
        let r = &delivery.receipt;
        // The stream of the delivery's level: a retry due now goes back to it.
        let keys = self.keys_at(queue, r.level);
        let (op, delayed) = self.settle_op(queue, delivery, &keys, settlement)?;
        let req = |reply| SettleReq {
            id: r.id.clone(),
            deliveries: r.deliveries,
            op,
            reply,
        };
        // The stream's task: started at its first settlement and again whenever it is found
        // stopped (it ran on a tokio runtime that has shut down, say), so that one dead task
        // never makes every later settlement fail; a panic inside it restarts it in place.
        let c = self.conn()?;
        let start = || {
            let task = format!("redis settlements of `{}`", keys.stream);
            let (c, k, consumer) = (c.clone(), Arc::clone(&keys), self.inner.consumer.clone());
            let (errors, allow_oom) = (Arc::clone(&self.inner.errors), self.allow_oom());
            let run = move |rx| {
                let errors = Arc::clone(&errors);
                settle_loop(
                    c.clone(),
                    Arc::clone(&k),
                    consumer.clone(),
                    errors,
                    allow_oom,
                    rx,
                )
            };
            Ok((task, run))
        };
        let n = self.inner.settles.call(&keys.stream, start, req).await?;
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

    /// What settling `delivery` does in its stream `keys`, and the delay of a delayed retry.
    fn settle_op(
        &self,
        queue: &str,
        delivery: &Delivery<RedisReceipt>,
        keys: &Keys,
        settlement: Settlement,
    ) -> Result<(SettleOp, Option<std::time::Duration>), BrokerError> {
        let r = &delivery.receipt;
        // Shared, not copied.
        let job = delivery.envelope.id().clone();
        Ok(match settlement {
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
        })
    }
}
