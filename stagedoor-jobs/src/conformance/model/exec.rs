//! Runs one sequence against a fresh broker next to the reference model, checking the
//! invariants after each step and, at the end, that every job the model still holds comes out.

mod cancel;
mod deliver;
mod drain;
mod outage;
mod publish;
mod state;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::ops::Op;
use crate::broker::{Broker, DeadLetters, Delivery, Inspect};
use crate::clock::Clock;
use crate::conformance::fixture::Fixture;
pub(super) use state::{Failed, Ran};
use state::{Held, Key, ModelJob, QUEUE, St, call, fail};

/// One run: the broker, the model and the deliveries held.
pub(super) struct Exec<'f, F: Fixture> {
    fixture: &'f F,
    broker: F::Broker,
    dead: String,
    lease: Duration,
    slack: Duration,
    manual: Option<(Clock, DateTime<Utc>)>,
    started: Instant,
    jobs: Vec<ModelJob>,
    by_id: HashMap<String, usize>,
    keys: BTreeMap<char, Key>,
    held: Vec<Held<<F::Broker as Broker>::Receipt>>,
    junk_held: Vec<Delivery<<F::Broker as Broker>::Receipt>>,
    junk_stored: usize,
    /// The ids of the jobs published at [`Junk::WRONG_TYPE_LEVEL`]: while one of them is
    /// alive, that level's stream holds it, and a [`Junk::WrongTypeKey`] edit (a `SET` over the
    /// stream) would delete it by hand: such an edit is not made then.
    ///
    /// [`Junk::WRONG_TYPE_LEVEL`]: crate::conformance::fixture::Junk::WRONG_TYPE_LEVEL
    /// [`Junk::WrongTypeKey`]: crate::conformance::fixture::Junk::WrongTypeKey
    at_blocked_level: std::collections::HashSet<String>,
    claim_errors: usize,
    last_claim_error: Option<String>,
    /// When the server last answered again after a restart.
    restarted: Option<Duration>,
    ran: Ran,
    /// Step kinds (`Op::name`) and junk kinds (`Junk` by name) left out
    /// (`STAGEDOOR_MODEL_SKIP`).
    skip: Vec<String>,
}

impl<'f, F: Fixture> Exec<'f, F> {
    /// A fresh broker of `fixture` with `lease`, connected, the queue prepared; on a manual
    /// clock when the broker can follow one.
    pub(super) async fn new(
        fixture: &'f F,
        lease: Duration,
        skip: Vec<String>,
    ) -> Result<Self, Failed> {
        let broker = fixture.broker_with_lease(lease).await;
        call("connect", broker.connect())
            .await?
            .map_err(|e| fail("setup", format!("connect: {e}")))?;
        let start = Utc::now();
        let clock = Clock::manual(start);
        // Only a fixture on the paused clock moves time by hand: a server backend keeps its own.
        let manual = (fixture.paused() && broker.use_clock(&clock)).then_some((clock, start));
        call("prepare", broker.prepare(QUEUE))
            .await?
            .map_err(|e| fail("setup", format!("prepare: {e}")))?;
        let dead = broker.default_dead_letter(QUEUE);
        let slack = if manual.is_some() {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(300)
        };
        Ok(Self {
            fixture,
            broker,
            dead,
            lease,
            slack,
            manual,
            started: Instant::now(),
            jobs: Vec::new(),
            by_id: HashMap::new(),
            keys: BTreeMap::new(),
            held: Vec::new(),
            junk_held: Vec::new(),
            junk_stored: 0,
            at_blocked_level: std::collections::HashSet::new(),
            claim_errors: 0,
            last_claim_error: None,
            restarted: None,
            ran: Ran::default(),
            skip,
        })
    }

    fn now(&self) -> Duration {
        match &self.manual {
            Some((clock, start)) => (clock.now() - *start).to_std().unwrap_or_default(),
            None => self.started.elapsed(),
        }
    }

    async fn pass(&self, d: Duration) {
        match &self.manual {
            Some((clock, _)) => clock.advance(d),
            None => tokio::time::sleep(d).await,
        }
    }

    fn add_job(
        &mut self,
        id: &str,
        st: St,
        key: Option<(char, Duration)>,
        headers: usize,
    ) -> usize {
        let n = self.jobs.len();
        self.jobs.push(ModelJob {
            id: id.to_owned(),
            st,
            attempts: 0,
            key,
            headers,
        });
        self.by_id.insert(id.to_owned(), n);
        n
    }

    /// Runs `ops`, then drains the queue and compares what is left with the model.
    pub(super) async fn run(mut self, ops: &[Op]) -> Result<Ran, Failed> {
        let ran = self.run_steps(ops).await;
        self.fixture.release(&self.broker).await;
        ran
    }

    async fn run_steps(&mut self, ops: &[Op]) -> Result<Ran, Failed> {
        for (n, op) in ops.iter().enumerate() {
            self.step(op).await.map_err(|mut f| {
                f.step = Some(n);
                f
            })?;
            self.ran.steps += 1;
        }
        self.drain().await?;
        Ok(self.ran)
    }

    async fn step(&mut self, op: &Op) -> Result<(), Failed> {
        if self.skip.iter().any(|s| s == op.name()) {
            self.ran.skipped += 1;
            return Ok(());
        }
        if let Op::Junk { pick, .. } = op {
            let kinds = self.fixture.junk_kinds();
            if let Some(kind) = kinds.get(pick % kinds.len().max(1))
                && self.skip.iter().any(|s| *s == format!("{kind:?}"))
            {
                self.ran.skipped += 1;
                return Ok(());
            }
        }
        match op {
            Op::Publish {
                id,
                delay,
                priority,
            } => self.publish(id, *delay, *priority).await,
            Op::PublishDup { pick } => self.publish_dup(*pick).await,
            Op::PublishUnique {
                id,
                key,
                window,
                delay,
            } => self.publish_unique(id, *key, *window, *delay).await,
            Op::PublishIn { id, key, commit } => self.publish_in(id, *key, *commit).await,
            Op::PublishHuge { id, headers } => self.publish_huge(id, *headers).await,
            Op::Claim { max } => self.claim(*max).await.map(|_| ()),
            Op::Settle { pick, how } => {
                if self.held.is_empty() {
                    self.ran.skipped += 1;
                    return Ok(());
                }
                let h = self.held.remove(pick % self.held.len());
                self.settle(h, *how).await
            }
            Op::Renew { pick } => self.renew(*pick).await,
            Op::Crash { pick } => {
                if self.held.is_empty() {
                    self.ran.skipped += 1;
                    return Ok(());
                }
                let h = self.held.remove(pick % self.held.len());
                self.jobs[h.job].st = St::Orphan { lo: h.lo, hi: h.hi };
                Ok(())
            }
            Op::Cancel { pick } => self.cancel(*pick).await,
            Op::Replay { pick } => self.replay(*pick).await,
            Op::Sleep(d) => {
                self.pass(*d).await;
                Ok(())
            }
            Op::Stats => self.stats().await,
            Op::Junk { pick, id } => self.junk(*pick, id).await,
            Op::Restart { id, down } => self.restart(id, *down).await,
        }
    }
}
