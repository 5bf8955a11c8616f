//! A delivery's settlement: tried again on a connection error (renewing the lease between
//! tries) until it takes effect or its fence says the lease was lost. (The lease while the
//! handler runs: `renewals.rs`.)

use std::time::Duration;

use super::renewals::MIN_RENEW_EVERY;
use super::worker::Worker;
use crate::broker::{Broker, Delivery, Settled, Settlement};

/// The longest wait between two tries of a settlement that failed on the connection.
const SETTLE_RETRY_MAX: Duration = Duration::from_secs(1);

impl<B: Broker> Worker<B> {
    /// A unique job that finished: its key stays held for its window from now.
    async fn finish_unique(&self, envelope: &crate::Envelope) {
        let Some((key, window)) = crate::envelope::unique_of(envelope.headers()) else {
            return;
        };
        let guard = crate::envelope::unique_guard(&self.queue.name, key);
        let q = &self.queue.name;
        match Box::pin(self.broker.finish_guard(q, &guard, envelope.id(), window)).await {
            Ok(_) => {}
            Err(e) => tracing::warn!(
                error = %e,
                unique = key,
                "could not start the unique key's window: the key stays held until its hold runs out (at most UNIQUE_PENDING_MAX)"
            ),
        }
    }

    pub(super) async fn settle(
        &self,
        subscriber: &str,
        delivery: &Delivery<B::Receipt>,
        settlement: Settlement,
    ) {
        self.flow_settling(&delivery.envelope, &settlement).await;
        // Observers see the settlement before it is made, so they see settlements in the
        // order they happen; one that turns out fenced is taken back.
        for o in self.ctx.observers.iter() {
            o.settled(
                subscriber,
                &self.queue.name,
                &delivery.envelope,
                &settlement,
            );
        }
        // A settlement that fails on a connection error is tried again until it takes effect
        // or its fence says the lease was lost, renewing the lease between tries: a server
        // restarting for a few seconds must not make a finished job run again. (Renewals run
        // between tries, never beside one: a backend that moves its fence on renewal settles
        // with the fence it last renewed.) The shutdown deadline ends the tries (the task is
        // aborted); the job is then delivered again after its lease. An error that is not about
        // the connection is tried 5 times.
        let every = (self.broker.lease() / 3).max(MIN_RENEW_EVERY);
        // The last renewal between tries, and whether one found the lease gone (then no more).
        let (mut renewed, mut lost_renewal) = (None::<tokio::time::Instant>, false);
        let (mut wait, mut failures) = (Duration::from_millis(50), 0u32);
        loop {
            // Boxed, as the renewal above: one allocation instead of a task the size of the
            // backend's largest future.
            match Box::pin(
                self.broker
                    .settle(&self.queue.name, delivery, settlement.clone()),
            )
            .await
            {
                Ok(Settled::Done) => {
                    if failures > 0 {
                        tracing::info!("settled after {failures} failed tries");
                    }
                    self.took_effect(delivery, &settlement).await;
                    return;
                }
                Ok(Settled::LeaseLost) => {
                    self.fenced(subscriber, delivery, failures > 0);
                    return;
                }
                Err(e) if e.is_transient() || failures < 4 => {
                    failures += 1;
                    // The first failure, then one line every 10 tries (about every 10 s).
                    if failures == 1 || failures.is_multiple_of(10) {
                        tracing::warn!(error = %e, "could not settle ({failures} tries): trying again, the lease renewed meanwhile");
                    }
                    // Renewed at once (the handler's last renewal may be most of a third of
                    // the lease ago), then every third of the lease, until a renewal says the
                    // lease is gone. That alone decides nothing: an earlier try may have taken
                    // effect with only its reply lost (the row released, the entry acked), so
                    // the settlement is tried again and its fence tells which.
                    if !lost_renewal && renewed.is_none_or(|t| t.elapsed() >= every) {
                        renewed = Some(tokio::time::Instant::now());
                        if let Ok(false) =
                            Box::pin(self.broker.renew(&self.queue.name, &delivery.receipt)).await
                        {
                            lost_renewal = true;
                            tracing::debug!(
                                "the lease was no longer held while the settlement waited for the server: trying the settlement again, whose fence tells whether an earlier try took effect"
                            );
                        }
                    }
                    tokio::time::sleep(wait.min(every)).await;
                    wait = (wait * 2).min(SETTLE_RETRY_MAX);
                }
                Err(e) => {
                    tracing::error!(error = %e, "could not settle after {} tries: the job will be delivered again after its lease", failures + 1);
                    return;
                }
            }
        }
    }

    /// A settlement that took effect: counted, a unique job's window started, a dead letter
    /// announced to the monitor.
    async fn took_effect(&self, delivery: &Delivery<B::Receipt>, settlement: &Settlement) {
        self.queue.metrics.count(
            &self.queue.name,
            self.kind_label(delivery.envelope.kind()),
            settlement,
        );
        if !matches!(settlement, Settlement::Retry { .. }) {
            self.finish_unique(&delivery.envelope).await;
        }
        self.tally.count(settlement, self.broker.clock().now());
        if matches!(settlement, Settlement::DeadLetter { .. }) {
            self.ctx.dead_lettered.notify_one();
        }
    }

    /// A settlement its fence refused (the lease was lost): the observers take it back.
    /// `retried`: it was not the first try.
    fn fenced(&self, subscriber: &str, delivery: &Delivery<B::Receipt>, retried: bool) {
        for o in self.ctx.observers.iter() {
            o.lease_lost(subscriber, &self.queue.name, &delivery.envelope);
        }
        if retried {
            tracing::warn!(
                "the job was no longer held when its settlement was tried again: either an earlier try took effect before the connection broke (nothing more to do), or its lease ran out meanwhile and another worker took it (its outcome stands)"
            );
        } else {
            tracing::warn!(
                "the lease was lost before settling: the job was reclaimed by another worker, whose outcome stands; nothing changed"
            );
        }
    }
}

impl<B: Broker> Worker<B> {
    /// Keeps a handler's result before its job is acknowledged: tried again while the backend
    /// is unreachable (the lease is renewed meanwhile; a shutdown's deadline ends the tries and
    /// the job comes back), given up with an error line on any other failure (the job is still
    /// acknowledged: its result is then missing).
    pub(super) async fn keep_result(
        &self,
        spec: &crate::mount::MountSpec,
        env: &crate::Envelope,
        json: &bytes::Bytes,
    ) {
        let record = crate::results::JobResult::encode(self.broker.clock().now(), json);
        if json.len() > crate::results::MAX_RESULT_BYTES {
            tracing::warn!(
                bytes = json.len(),
                "the handler's result is past the limit of {} bytes: not kept (its result reads as too large)",
                crate::results::MAX_RESULT_BYTES
            );
        }
        let key = crate::results::result_key(env.id().as_str());
        let mut wait = Duration::from_millis(50);
        let mut failures = 0u32;
        loop {
            let put = self
                .records
                .put(key.clone(), record.clone(), spec.keep_results);
            match put.await {
                Ok(()) => return,
                Err(e) if e.is_transient() => {
                    failures += 1;
                    if failures == 1 || failures.is_multiple_of(10) {
                        tracing::warn!(error = %e, "could not keep the job's result ({failures} tries): trying again");
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(SETTLE_RETRY_MAX);
                }
                Err(e) => {
                    tracing::error!(error = %e, "could not keep the job's result: the job is acknowledged without it");
                    return;
                }
            }
        }
    }
}
