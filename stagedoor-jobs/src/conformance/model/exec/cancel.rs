//! Cancels and replays, checked against where the model has the job.

use super::Exec;
use super::state::{Failed, QUEUE, St, call, fail};
use crate::broker::{Broker, Cancelled, DeadLetters, DeadSelector};
use crate::conformance::fixture::Fixture;
use crate::envelope::JobId;
use std::time::Duration;

impl<F: Fixture> Exec<'_, F> {
    pub(super) async fn cancel(&mut self, pick: usize) -> Result<(), Failed> {
        if self.jobs.is_empty() {
            self.ran.skipped += 1;
            return Ok(());
        }
        let j = pick % self.jobs.len();
        let id = JobId::from_string(self.jobs[j].id.clone());
        let st = self.jobs[j].st;
        let t0 = self.now();
        let got = call("cancel", self.broker.cancel(QUEUE, &id))
            .await?
            .map_err(|e| fail("cancel failed", format!("cancel of {id} ({st:?}): {e}")))?;
        let lo = match st {
            St::Held => self
                .held
                .iter()
                .find(|h| h.job == j)
                .map(|h| h.lo)
                .unwrap_or_default(),
            St::Orphan { lo, .. } => lo,
            _ => Duration::ZERO,
        };
        let surely_live = t0 + self.slack < lo + self.lease;
        let allowed: &[Cancelled] = match st {
            St::Ready | St::Delayed { .. } => &[Cancelled::Removed],
            St::Held | St::Orphan { .. } if surely_live => &[Cancelled::Running],
            St::Held | St::Orphan { .. } => &[Cancelled::Running, Cancelled::Removed],
            St::NotStored | St::Dead | St::Done | St::Cancelled => &[Cancelled::NotFound],
        };
        if !allowed.contains(&got) {
            return Err(fail(
                "cancel",
                format!(
                    "cancel of {id}, {st:?} in the model, answered {got:?}; expected one of {allowed:?}"
                ),
            ));
        }
        match got {
            Cancelled::Removed => {
                if st == St::Held {
                    self.held.retain(|h| h.job != j);
                }
                self.jobs[j].st = St::Cancelled;
                if let Some((key, _)) = self.jobs[j].key
                    && self.owns(key, j)
                {
                    self.keys.remove(&key);
                }
            }
            Cancelled::Running => {
                let marked = call(
                    "cancelled",
                    self.broker.cancelled(QUEUE, std::slice::from_ref(&id)),
                )
                .await?
                .map_err(|e| fail("cancelled failed", format!("cancelled of {id}: {e}")))?;
                if !marked.contains(&id) {
                    return Err(fail(
                        "cancel",
                        format!(
                            "cancel of the running {id} answered Running, but `cancelled` does not list it"
                        ),
                    ));
                }
            }
            Cancelled::NotFound => {}
        }
        Ok(())
    }

    pub(super) async fn replay(&mut self, pick: usize) -> Result<(), Failed> {
        let dead: Vec<usize> = (0..self.jobs.len())
            .filter(|&j| self.jobs[j].st == St::Dead)
            .collect();
        if dead.is_empty() {
            self.ran.skipped += 1;
            return Ok(());
        }
        let j = dead[pick % dead.len()];
        let id = self.jobs[j].id.clone();
        let report = call(
            "replay",
            self.broker
                .replay(&self.dead, &DeadSelector::Id(id.clone())),
        )
        .await?
        .map_err(|e| fail("replay failed", format!("replay of {id}: {e}")))?;
        if report.replayed != 1 {
            return Err(fail(
                "replay",
                format!("replay of the dead {id} reported {report:?}"),
            ));
        }
        self.jobs[j].st = St::Ready;
        self.jobs[j].attempts = 0;
        Ok(())
    }
}
