//! The model's publishes: plain, again under a known id, unique, in the caller's
//! transaction, with many headers, and a failed publish tried again.

use std::time::Duration;

use super::Exec;
use super::state::{Failed, Key, QUEUE, St, call, fail};
use crate::broker::{Publish, Published};
use crate::conformance::fixture::{Fixture, Junk};
use crate::envelope::{Job, JobId, Priority};

impl<F: Fixture> Exec<'_, F> {
    pub(super) fn job(id: &str, delay: Duration, priority: Priority) -> Job {
        let mut job = Job::new(QUEUE, &serde_json::json!({ "id": id }))
            .unwrap_or_else(|e| panic!("a JSON value encodes: {e}"))
            .id(JobId::from_string(id))
            .priority(priority);
        if !delay.is_zero() {
            job = job.after(delay);
        }
        job
    }

    pub(super) fn due_state(delay: Duration, lo: Duration, hi: Duration) -> St {
        if delay.is_zero() {
            St::Ready
        } else {
            St::Delayed {
                lo: lo + delay,
                hi: hi + delay,
            }
        }
    }

    pub(super) fn check_new(id: &str, what: &str, p: &Published) -> Result<(), Failed> {
        if !p.is_stored() {
            return Err(fail(
                "new job not stored",
                format!("{what} of the new id {id} was told the id is already there"),
            ));
        }
        if p.id().as_str() != id {
            return Err(fail(
                "wrong id",
                format!("{what} of {id} reported id {}", p.id()),
            ));
        }
        Ok(())
    }

    pub(super) async fn publish(
        &mut self,
        id: &str,
        delay: Duration,
        priority: Priority,
    ) -> Result<(), Failed> {
        let t0 = self.now();
        let p = call(
            "publish",
            self.broker.publish_job(Self::job(id, delay, priority)),
        )
        .await?
        .map_err(|e| fail("publish failed", format!("publish of {id}: {e}")))?;
        let t1 = self.now();
        Self::check_new(id, "publish", &p)?;
        if priority == Junk::WRONG_TYPE_LEVEL {
            self.at_blocked_level.insert(id.to_owned());
        }
        self.add_job(id, Self::due_state(delay, t0, t1), None, 0);
        Ok(())
    }

    pub(super) async fn publish_dup(&mut self, pick: usize) -> Result<(), Failed> {
        let candidates: Vec<usize> = (0..self.jobs.len())
            .filter(|&j| self.jobs[j].st != St::Dead)
            .collect();
        if candidates.is_empty() {
            self.ran.skipped += 1;
            return Ok(());
        }
        let j = candidates[pick % candidates.len()];
        let id = self.jobs[j].id.clone();
        let before = self.jobs[j].st;
        let p = call(
            "publish",
            self.broker
                .publish_job(Self::job(&id, Duration::ZERO, Priority::NORMAL)),
        )
        .await?
        .map_err(|e| fail("publish failed", format!("publish again of {id}: {e}")))?;
        if before.alive() && p.is_stored() {
            return Err(fail(
                "duplicate stored",
                format!(
                    "{id} is {before:?} in the model, yet publishing its id again stored a second job"
                ),
            ));
        }
        if matches!(before, St::NotStored | St::Cancelled) && !p.is_stored() {
            return Err(fail(
                "lost job",
                format!(
                    "{id} is {before:?} (not in the queue), yet publishing it was told it is already there: the job is lost"
                ),
            ));
        }
        if p.is_stored() {
            let job = &mut self.jobs[j];
            job.st = St::Ready;
            job.attempts = 0;
            job.key = None;
            job.headers = 0;
        }
        Ok(())
    }

    /// What a unique publish of `key` must do now: `Some(true)` store, `Some(false)` not store
    /// (with the holder's id), `None` either (at the edge of a window).
    pub(super) fn unique_expect(
        &self,
        key: char,
        t0: Duration,
        t1: Duration,
    ) -> (Option<bool>, Option<String>) {
        match self.keys.get(&key) {
            None => (Some(true), None),
            Some(Key::Held(j)) => {
                let job = &self.jobs[*j];
                if job.st.alive() {
                    (Some(false), Some(job.id.clone()))
                } else {
                    (None, None)
                }
            }
            Some(Key::Until { lo, hi, .. }) => {
                if t1 + self.slack < *lo {
                    (Some(false), None)
                } else if t0 > *hi + self.slack {
                    (Some(true), None)
                } else {
                    (None, None)
                }
            }
        }
    }

    pub(super) fn check_unique(
        &mut self,
        id: &str,
        what: &str,
        (key, window): (char, Duration),
        p: &Published,
        expect: (Option<bool>, Option<String>),
        st: St,
    ) -> Result<(), Failed> {
        match expect {
            (Some(false), holder) if p.is_stored() => {
                return Err(fail(
                    "unique key not held",
                    format!(
                        "{what} of {id} with unique key {key} stored a second job while {} holds the key",
                        holder.unwrap_or_else(|| "a job finished within its window".to_owned())
                    ),
                ));
            }
            (Some(false), Some(holder)) if p.id().as_str() != holder => {
                return Err(fail(
                    "wrong id",
                    format!(
                        "{what} of {id} with unique key {key} named {} as the holder, not {holder}",
                        p.id()
                    ),
                ));
            }
            (Some(true), _) if !p.is_stored() => {
                return Err(fail(
                    "unique key held too long",
                    format!(
                        "{what} of {id} with unique key {key} (free in the model) stored nothing: told {} holds it",
                        p.id()
                    ),
                ));
            }
            _ => {}
        }
        if p.is_stored() {
            Self::check_new(id, what, p)?;
            let j = self.add_job(id, st, Some((key, window)), 0);
            self.keys.insert(key, Key::Held(j));
        } else {
            self.add_job(id, St::NotStored, None, 0);
        }
        Ok(())
    }

    pub(super) async fn publish_unique(
        &mut self,
        id: &str,
        key: char,
        window: Duration,
        delay: Duration,
    ) -> Result<(), Failed> {
        let job = Self::job(id, delay, Priority::NORMAL).unique(key.to_string(), window);
        let t0 = self.now();
        let p = call("publish", self.broker.publish_job(job))
            .await?
            .map_err(|e| fail("publish failed", format!("unique publish of {id}: {e}")))?;
        let t1 = self.now();
        let expect = self.unique_expect(key, t0, t1);
        let st = Self::due_state(delay, t0, t1);
        self.check_unique(id, "publish", (key, window), &p, expect, st)
    }

    pub(super) async fn publish_in(
        &mut self,
        id: &str,
        key: Option<char>,
        commit: bool,
    ) -> Result<(), Failed> {
        const WINDOW: Duration = Duration::from_millis(2000);
        let mut job = Self::job(id, Duration::ZERO, Priority::NORMAL);
        if let Some(k) = key {
            job = job.unique(k.to_string(), WINDOW);
        }
        let t0 = self.now();
        let Some(got) = call(
            "publish_in",
            self.fixture.publish_in(&self.broker, job, commit),
        )
        .await?
        else {
            self.ran.skipped += 1;
            return Ok(());
        };
        let t1 = self.now();
        let p = got.map_err(|e| fail("publish failed", format!("publish_in of {id}: {e}")))?;
        if !commit {
            self.add_job(id, St::NotStored, None, 0);
            return Ok(());
        }
        match key {
            None => {
                Self::check_new(id, "publish_in", &p)?;
                self.add_job(id, St::Ready, None, 0);
                Ok(())
            }
            Some(k) => {
                let expect = self.unique_expect(k, t0, t1);
                self.check_unique(
                    id,
                    "publish_in (committed)",
                    (k, WINDOW),
                    &p,
                    expect,
                    St::Ready,
                )
            }
        }
    }

    pub(super) async fn publish_huge(&mut self, id: &str, headers: usize) -> Result<(), Failed> {
        let mut job = Self::job(id, Duration::ZERO, Priority::NORMAL);
        for h in 0..headers {
            job = job.header(format!("h{h}"), "v");
        }
        match call("publish", self.broker.publish_job(job)).await? {
            Ok(p) => {
                Self::check_new(id, &format!("publish with {headers} headers"), &p)?;
                self.add_job(id, St::Ready, None, headers);
                Ok(())
            }
            Err(first) => {
                self.publish_again(id, Priority::NORMAL, &first.to_string())
                    .await
            }
        }
    }

    /// After a publish of `id` failed with `first`: the same job published again (plainly)
    /// must be stored, since nothing was.
    pub(super) async fn publish_again(
        &mut self,
        id: &str,
        priority: Priority,
        first: &str,
    ) -> Result<(), Failed> {
        let p = call(
            "publish",
            self.broker
                .publish_job(Self::job(id, Duration::ZERO, priority)),
        )
        .await?
        .map_err(|e| {
            fail(
                "publish failed",
                format!("publish of {id} failed ({first}), and so did its retry: {e}"),
            )
        })?;
        if !p.is_stored() {
            return Err(fail(
                "lost job",
                format!(
                    "publish of {id} failed ({first}); publishing it again was told the id is already there, yet nothing was stored: the job is lost"
                ),
            ));
        }
        self.add_job(id, St::Ready, None, 0);
        Ok(())
    }
}
