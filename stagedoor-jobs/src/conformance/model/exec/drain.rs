//! The end of a run and the queue's counts: what is held settled, the queue claimed until
//! the model holds nothing, the stats and the dead letter compared with the model.

use std::collections::BTreeSet;
use std::time::Duration;

use super::super::ops::How;
use super::Exec;
use super::state::{Failed, QUEUE, St, call, fail};
use crate::broker::{Broker, DeadLetters, DeadSelector, Inspect};
use crate::conformance::fixture::Fixture;

impl<F: Fixture> Exec<'_, F> {
    pub(super) async fn stats(&mut self) -> Result<(), Failed> {
        let after_restart =
            self.restarted.is_some() && self.skip.iter().any(|s| s == "stats-after-restart");
        if self.junk_stored > 0 || after_restart {
            self.ran.skipped += 1;
            return Ok(());
        }
        let want = self.jobs.iter().filter(|j| j.st.alive()).count() as u64;
        let mut tries = 0;
        loop {
            let s = call("stats", self.broker.stats(QUEUE))
                .await?
                .map_err(|e| fail("stats failed", format!("stats: {e}")))?;
            let got = s.ready + s.pending + s.delayed;
            if got == want {
                return Ok(());
            }
            tries += 1;
            if self.manual.is_some() || tries > 10 {
                return Err(fail(
                    "stats",
                    format!(
                        "stats count {got} jobs ({s:?}); the model has {want} in the queue: {}",
                        self.alive_list()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(super) fn alive_list(&self) -> String {
        let alive: Vec<String> = self
            .jobs
            .iter()
            .filter(|j| j.st.alive())
            .map(|j| format!("{} {:?}", j.id, j.st))
            .collect();
        format!("[{}]", alive.join(", "))
    }

    /// The latest time the model allows for job `j` to become claimable.
    pub(super) fn claimable_by(&self, j: usize) -> Duration {
        match self.jobs[j].st {
            St::Delayed { hi, .. } => hi + self.slack,
            St::Orphan { hi, .. } => {
                // After a restart a backend may hold back reclaims for a lease (Redis: until
                // the new server process has served the queue for one, so that live holders
                // renew first; and a lease after the broker's last connection error).
                let after = self
                    .restarted
                    .map_or(Duration::ZERO, |b| b + 2 * self.lease);
                (hi + self.lease).max(after) + self.slack
            }
            _ => Duration::ZERO,
        }
    }

    /// Acknowledges what is held, then claims and acknowledges until the model holds no job:
    /// every job not finished must come out within its due time or lease (plus a margin).
    pub(super) async fn drain(&mut self) -> Result<(), Failed> {
        while let Some(h) = self.held.pop() {
            self.settle(h, How::Ack).await?;
        }
        let margin = if self.manual.is_some() {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(4)
        };
        let latest = (0..self.jobs.len())
            .filter(|&j| self.jobs[j].st.alive())
            .map(|j| self.claimable_by(j))
            .max()
            .unwrap_or_default()
            .max(self.now());
        let deadline = latest + margin;
        loop {
            let got = self.claim(32).await?;
            while let Some(h) = self.held.pop() {
                self.settle(h, How::Ack).await?;
            }
            for d in std::mem::take(&mut self.junk_held) {
                // The junk is acknowledged if the broker lets us; it may refuse.
                let _ = call(
                    "settle",
                    self.broker
                        .settle(QUEUE, &d, How::Ack.settlement(&self.dead)),
                )
                .await?;
            }
            let alive = self.jobs.iter().any(|j| j.st.alive());
            if !alive && got == 0 {
                break;
            }
            if self.now() > deadline {
                return Err(fail(
                    "lost jobs",
                    format!(
                        "the queue did not give back every job within its due time or lease (+{margin:?}): still in the model {}; claims failed {} times{}",
                        self.alive_list(),
                        self.claim_errors,
                        self.last_claim_error
                            .as_ref()
                            .map(|e| format!(", last: {e}"))
                            .unwrap_or_default()
                    ),
                ));
            }
            if got == 0 {
                self.pass(Duration::from_millis(50)).await;
            }
        }
        if self.junk_stored == 0 {
            self.stats().await?;
        }
        self.check_dead_letters().await
    }

    /// The dead letter holds exactly the jobs the model has dead (plus at most the junk
    /// stored), and `dead_len` counts what it lists.
    async fn check_dead_letters(&self) -> Result<(), Failed> {
        let letters = call(
            "dead_letters",
            self.broker
                .dead_letters(&self.dead, &DeadSelector::All, 100_000),
        )
        .await?
        .map_err(|e| fail("dead_letters failed", format!("dead_letters: {e}")))?;
        let listed: BTreeSet<String> = letters
            .iter()
            .map(|d| d.envelope.id().as_str().to_owned())
            .filter(|id| self.by_id.contains_key(id))
            .collect();
        let want: BTreeSet<String> = self
            .jobs
            .iter()
            .filter(|j| j.st == St::Dead)
            .map(|j| j.id.clone())
            .collect();
        let known = letters
            .iter()
            .filter(|d| self.by_id.contains_key(d.envelope.id().as_str()))
            .count();
        let extra = letters.len() - known;
        if listed != want || known != listed.len() || extra > self.junk_stored {
            return Err(fail(
                "dead letters",
                format!(
                    "the dead letter holds {listed:?} ({known} letters, +{extra} not published by the model); the model has {want:?} dead"
                ),
            ));
        }
        let len = call("dead_len", self.broker.dead_len(&self.dead))
            .await?
            .map_err(|e| fail("dead_len failed", format!("dead_len: {e}")))?;
        if len != letters.len() as u64 {
            return Err(fail(
                "dead letters",
                format!("dead_len says {len}; the list has {}", letters.len()),
            ));
        }
        Ok(())
    }
}
