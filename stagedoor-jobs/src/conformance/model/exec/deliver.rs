//! Claims and what becomes of a delivery: each checked against the model, settled (a unique
//! job's window started), renewed.

use std::time::Duration;

use super::super::ops::How;
use super::Exec;
use super::state::{Failed, Held, Key, QUEUE, St, call, fail};
use crate::broker::{Broker, Delivery, Settled};
use crate::conformance::fixture::Fixture;
use crate::envelope::JobId;

impl<F: Fixture> Exec<'_, F> {
    /// Claims up to `max` and checks each delivery against the model. Returns how many.
    pub(super) async fn claim(&mut self, max: usize) -> Result<usize, Failed> {
        let t0 = self.now();
        let got = call(
            "claim",
            self.broker.claim(
                QUEUE,
                max,
                Duration::ZERO,
                crate::broker::ClaimOrder::Priority,
            ),
        )
        .await?;
        let t1 = self.now();
        let deliveries = match got {
            Ok(d) => d,
            Err(e) => {
                self.claim_errors += 1;
                self.last_claim_error = Some(e.to_string());
                return Ok(0);
            }
        };
        if deliveries.len() > max {
            return Err(fail(
                "claim over max",
                format!("claim of at most {max} returned {}", deliveries.len()),
            ));
        }
        let n = deliveries.len();
        for d in deliveries {
            self.delivered(d, t0, t1)?;
        }
        Ok(n)
    }

    /// Checks one delivery of a claim made between `t0` and `t1` against the model, and holds
    /// it (junk, when some was stored, is kept aside to be acknowledged at the end).
    pub(super) fn delivered(
        &mut self,
        d: Delivery<<F::Broker as Broker>::Receipt>,
        t0: Duration,
        t1: Duration,
    ) -> Result<(), Failed> {
        let id = d.envelope.id().as_str().to_owned();
        let Some(&j) = self.by_id.get(&id) else {
            if self.junk_stored > 0 {
                self.junk_held.push(d);
                return Ok(());
            }
            return Err(fail(
                "unknown job",
                format!("claim delivered {id}, which was never published"),
            ));
        };
        self.check_claimable(j, &id, t1)?;
        self.record_delivery(j, d, t0, t1)
    }

    /// Job `j` (`id`) may be delivered by a claim that returned at `t1`: it is due, no live
    /// lease of it is held (a delivery of ours past its lease is dropped), and it is not gone.
    fn check_claimable(&mut self, j: usize, id: &str, t1: Duration) -> Result<(), Failed> {
        let lease = self.lease;
        let surely_live = |lo: Duration| t1 + self.slack < lo + lease;
        match self.jobs[j].st {
            St::Ready => {}
            St::Delayed { lo, .. } => {
                if t1 + self.slack < lo {
                    return Err(fail(
                        "delivered early",
                        format!(
                            "{id} was delivered before it was due (due at {lo:?} at the earliest, claimed by {t1:?})"
                        ),
                    ));
                }
            }
            St::Held => {
                let h = self
                    .held
                    .iter()
                    .position(|h| h.job == j)
                    .ok_or_else(|| fail("model", format!("{id} held but no delivery of it")))?;
                if surely_live(self.held[h].lo) {
                    return Err(fail(
                        "delivered twice",
                        format!(
                            "{id} was delivered again while its lease (from {:?}, {lease:?}) was live and unsettled",
                            self.held[h].lo
                        ),
                    ));
                }
                self.held.remove(h);
            }
            St::Orphan { lo, .. } => {
                if surely_live(lo) {
                    return Err(fail(
                        "delivered twice",
                        format!(
                            "{id} was delivered again while the lease of its abandoned delivery (from {lo:?}, {lease:?}) was live"
                        ),
                    ));
                }
            }
            st @ (St::NotStored | St::Dead | St::Done | St::Cancelled) => {
                return Err(fail(
                    "delivered when gone",
                    format!("{id} was delivered although the model has it {st:?}"),
                ));
            }
        }
        Ok(())
    }

    /// Checks the delivery's attempt and headers against job `j`, and holds it.
    fn record_delivery(
        &mut self,
        j: usize,
        d: Delivery<<F::Broker as Broker>::Receipt>,
        t0: Duration,
        t1: Duration,
    ) -> Result<(), Failed> {
        let id = d.envelope.id().as_str();
        let job = &mut self.jobs[j];
        let attempt = d.envelope.attempt();
        if attempt != job.attempts + 1 {
            return Err(fail(
                "attempt",
                format!(
                    "{id} was delivered as attempt {attempt}; the model counts {} claims before",
                    job.attempts
                ),
            ));
        }
        if d.envelope.headers().extra.len() < job.headers {
            return Err(fail(
                "headers lost",
                format!(
                    "{id} was published with {} headers and delivered with {}",
                    job.headers,
                    d.envelope.headers().extra.len()
                ),
            ));
        }
        job.attempts = attempt;
        job.st = St::Held;
        self.held.push(Held {
            job: j,
            delivery: d,
            lo: t0,
            hi: t1,
        });
        Ok(())
    }

    pub(super) async fn settle(
        &mut self,
        h: Held<<F::Broker as Broker>::Receipt>,
        how: How,
    ) -> Result<(), Failed> {
        let j = h.job;
        let id = self.jobs[j].id.clone();
        let t0 = self.now();
        let surely_live = t0 + self.slack < h.lo + self.lease;
        let settled = call(
            "settle",
            self.broker
                .settle(QUEUE, &h.delivery, how.settlement(&self.dead)),
        )
        .await?
        .map_err(|e| fail("settle failed", format!("settle {how:?} of {id}: {e}")))?;
        let t1 = self.now();
        if settled == Settled::LeaseLost {
            if surely_live {
                return Err(fail(
                    "fenced while live",
                    format!("settle {how:?} of {id} was fenced (lease lost) within its lease"),
                ));
            }
            self.jobs[j].st = St::Orphan { lo: h.lo, hi: h.hi };
            return Ok(());
        }
        self.jobs[j].st = match how {
            How::Ack | How::Drop => St::Done,
            How::RetryNow => St::Ready,
            How::RetryAfter(d) => St::Delayed {
                lo: t0 + d,
                hi: t1 + d,
            },
            How::DeadLetter => St::Dead,
        };
        if matches!(how, How::Ack | How::Drop | How::DeadLetter) {
            self.finish_unique(j).await?;
        }
        Ok(())
    }

    /// Whether the guard of `key` names job `j` (held, or in the window after it finished).
    pub(super) fn owns(&self, key: char, j: usize) -> bool {
        matches!(self.keys.get(&key), Some(Key::Held(h) | Key::Until { owner: h, .. }) if *h == j)
    }

    /// What the runtime does at a unique job's settlement: its window starts.
    pub(super) async fn finish_unique(&mut self, j: usize) -> Result<(), Failed> {
        let Some((key, window)) = self.jobs[j].key else {
            return Ok(());
        };
        if !self.owns(key, j) {
            return Ok(());
        }
        let id = JobId::from_string(self.jobs[j].id.clone());
        let guard = crate::envelope::unique_guard(QUEUE, &key.to_string());
        let t0 = self.now();
        let held = matches!(self.keys.get(&key), Some(Key::Held(_)));
        let found = call(
            "finish_guard",
            self.broker.finish_guard(QUEUE, &guard, &id, window),
        )
        .await?
        .map_err(|e| fail("finish_guard failed", format!("finish_guard of {id}: {e}")))?;
        let t1 = self.now();
        if !found {
            if held {
                return Err(fail(
                    "unique key not held",
                    format!("finish_guard of {id} found no guard of key {key}, which it holds"),
                ));
            }
            // The window after an earlier settlement (before a replay) ran out: the key is free.
            self.keys.remove(&key);
            return Ok(());
        }
        self.keys.insert(
            key,
            Key::Until {
                lo: t0 + window,
                hi: t1 + window,
                owner: j,
            },
        );
        Ok(())
    }

    pub(super) async fn renew(&mut self, pick: usize) -> Result<(), Failed> {
        if self.held.is_empty() {
            self.ran.skipped += 1;
            return Ok(());
        }
        let h = pick % self.held.len();
        let id = self.jobs[self.held[h].job].id.clone();
        let t0 = self.now();
        let surely_live = t0 + self.slack < self.held[h].lo + self.lease;
        let ok = call(
            "renew",
            self.broker.renew(QUEUE, &self.held[h].delivery.receipt),
        )
        .await?
        .map_err(|e| fail("renew failed", format!("renew of {id}: {e}")))?;
        let t1 = self.now();
        if ok {
            self.held[h].lo = t0;
            self.held[h].hi = t1;
        } else if surely_live {
            return Err(fail(
                "renew refused while live",
                format!("renew of {id} was refused within its lease"),
            ));
        } else {
            let h = self.held.remove(h);
            self.jobs[h.job].st = St::Orphan { lo: h.lo, hi: h.hi };
        }
        Ok(())
    }
}
