//! Runs one sequence against a fresh broker next to the reference model, checking the
//! invariants after each step and, at the end, that every job the model still holds comes out.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::ops::{How, Op};
use crate::broker::{Broker, Cancelled, DeadSelector, Delivery, Published, Settled};
use crate::broker::{DeadLetters, Inspect, Publish};
use crate::clock::Clock;
use crate::conformance::fixture::{Fixture, Junk, Outage};
use crate::envelope::{Job, JobId, Priority};

/// The queue every sequence runs on (each on a fresh broker of the fixture).
pub(super) const QUEUE: &str = "model";
/// How long one broker call may take before the run fails as hung.
const CALL_LIMIT: Duration = Duration::from_secs(15);
/// How long a call made while the server is down may take to fail.
const OUTAGE_LIMIT: Duration = Duration::from_secs(10);
/// How long the broker may take to answer again once the server is back (a worker retries
/// its calls meanwhile; so does the model).
const RECOVERY_LIMIT: Duration = Duration::from_secs(5);

/// A failed run: which invariant (`kind`, what the shrinker keeps), at which step, and what
/// was seen.
#[derive(Clone, Debug)]
pub(super) struct Failed {
    pub(super) kind: &'static str,
    pub(super) step: Option<usize>,
    pub(super) message: String,
}

/// What a passing run did.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Ran {
    pub(super) steps: usize,
    pub(super) skipped: usize,
    /// Server restarts made (not skipped).
    pub(super) restarts: usize,
    /// The longest a broker took to answer again after a restart.
    pub(super) slowest_recovery: Duration,
}

fn fail(kind: &'static str, message: impl Into<String>) -> Failed {
    Failed {
        kind,
        step: None,
        message: message.into(),
    }
}

/// Where the model has a job. Times are since the run's start; a pair `lo, hi` brackets the
/// call that set it (the backend stamped it somewhere between).
#[derive(Clone, Copy, Debug, PartialEq)]
enum St {
    /// Never stored (its publish failed, or its transaction rolled back).
    NotStored,
    Ready,
    Delayed {
        lo: Duration,
        hi: Duration,
    },
    /// Held by a delivery of ours (in `held`).
    Held,
    /// Claimed and abandoned (a crash, a lost lease): claimable once the lease is over.
    Orphan {
        lo: Duration,
        hi: Duration,
    },
    Dead,
    Done,
    Cancelled,
}

impl St {
    fn alive(self) -> bool {
        matches!(
            self,
            St::Ready | St::Delayed { .. } | St::Held | St::Orphan { .. }
        )
    }
}

struct ModelJob {
    id: String,
    st: St,
    attempts: u32,
    key: Option<(char, Duration)>,
    headers: usize,
}

/// A unique key's state in the model.
#[derive(Clone, Copy, Debug)]
enum Key {
    Held(usize),
    /// Its job `owner` finished: free again between `lo` and `hi`. The guard still names
    /// `owner`: a replay of it settled starts the window again, a cancel of it frees the key.
    Until {
        lo: Duration,
        hi: Duration,
        owner: usize,
    },
}

struct Held<R> {
    job: usize,
    delivery: Delivery<R>,
    /// The lease began between these (the claim's or the last renewal's call).
    lo: Duration,
    hi: Duration,
}

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

async fn call<T>(what: &str, fut: impl Future<Output = T>) -> Result<T, Failed> {
    tokio::time::timeout(CALL_LIMIT, fut).await.map_err(|_| {
        fail(
            "hung",
            format!("{what} did not return within {CALL_LIMIT:?}"),
        )
    })
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

    fn job(id: &str, delay: Duration, priority: Priority) -> Job {
        let mut job = Job::new(QUEUE, &serde_json::json!({ "id": id }))
            .unwrap_or_else(|e| panic!("a JSON value encodes: {e}"))
            .id(JobId::from_string(id))
            .priority(priority);
        if !delay.is_zero() {
            job = job.after(delay);
        }
        job
    }

    fn due_state(delay: Duration, lo: Duration, hi: Duration) -> St {
        if delay.is_zero() {
            St::Ready
        } else {
            St::Delayed {
                lo: lo + delay,
                hi: hi + delay,
            }
        }
    }

    fn check_new(id: &str, what: &str, p: &Published) -> Result<(), Failed> {
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

    async fn publish(
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

    async fn publish_dup(&mut self, pick: usize) -> Result<(), Failed> {
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
    fn unique_expect(
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

    fn check_unique(
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

    async fn publish_unique(
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

    async fn publish_in(
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

    async fn publish_huge(&mut self, id: &str, headers: usize) -> Result<(), Failed> {
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
    async fn publish_again(
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

    /// Claims up to `max` and checks each delivery against the model. Returns how many.
    async fn claim(&mut self, max: usize) -> Result<usize, Failed> {
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

    fn delivered(
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

    async fn settle(
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
    fn owns(&self, key: char, j: usize) -> bool {
        matches!(self.keys.get(&key), Some(Key::Held(h) | Key::Until { owner: h, .. }) if *h == j)
    }

    /// What the runtime does at a unique job's settlement: its window starts.
    async fn finish_unique(&mut self, j: usize) -> Result<(), Failed> {
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

    async fn renew(&mut self, pick: usize) -> Result<(), Failed> {
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

    async fn cancel(&mut self, pick: usize) -> Result<(), Failed> {
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

    async fn replay(&mut self, pick: usize) -> Result<(), Failed> {
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

    async fn stats(&mut self) -> Result<(), Failed> {
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

    async fn junk(&mut self, pick: usize, id: &str) -> Result<(), Failed> {
        let kinds = self.fixture.junk_kinds();
        if kinds.is_empty() {
            self.ran.skipped += 1;
            return Ok(());
        }
        let kind = kinds[pick % kinds.len()];
        if kind == Junk::WrongTypeKey
            && self
                .jobs
                .iter()
                .any(|j| j.st.alive() && self.at_blocked_level.contains(&j.id))
        {
            // The edit would delete a live job by hand (a SET over its stream): not the
            // machinery's loss to find.
            self.ran.skipped += 1;
            return Ok(());
        }
        call(
            "store_junk",
            self.fixture.store_junk(&self.broker, QUEUE, kind, id),
        )
        .await?
        .map_err(|e| {
            fail(
                "fixture",
                format!("the fixture could not store {kind:?}: {e}"),
            )
        })?;
        if kind != Junk::WrongTypeKey {
            self.junk_stored += 1;
            return Ok(());
        }
        // A job published at the blocked level while the bad key is there, then again
        // once it is repaired.
        let good = id.replacen("junk-", "w", 1);
        let level = Junk::WRONG_TYPE_LEVEL;
        self.at_blocked_level.insert(good.clone());
        let first = call(
            "publish",
            self.broker
                .publish_job(Self::job(&good, Duration::ZERO, level)),
        )
        .await?;
        call(
            "repair_junk",
            self.fixture.repair_junk(&self.broker, QUEUE, kind),
        )
        .await?;
        match first {
            Ok(p) => {
                Self::check_new(&good, "publish over a key of the wrong type", &p)?;
                self.add_job(&good, St::Ready, None, 0);
                Ok(())
            }
            Err(e) => self.publish_again(&good, level, &e.to_string()).await,
        }
    }

    /// The server goes away for `down` (or its connections are cut) and comes back: calls made
    /// meanwhile fail (bounded by [`OUTAGE_LIMIT`]), the same broker answers again within
    /// [`RECOVERY_LIMIT`], the queue holds what the model has, and the publish that failed
    /// meanwhile stores its job when retried. Held deliveries stay held (their settlement is
    /// checked as any other's: it takes effect, or is fenced once the lease may have lapsed),
    /// and no job is delivered again while a lease of it is live (checked at each claim).
    async fn restart(&mut self, id: &str, down: Duration) -> Result<(), Failed> {
        let Some(gone) = call("server_down", self.fixture.server_down(&self.broker)).await? else {
            self.ran.skipped += 1;
            return Ok(());
        };
        let outage = gone.map_err(|e| {
            fail(
                "fixture",
                format!("the fixture could not take the server down: {e}"),
            )
        })?;
        let meanwhile = match outage {
            Outage::Down => self.while_down(id).await,
            _ => Ok(false),
        };
        self.pass(down).await;
        // The server comes back even when a call failed a check meanwhile, so that the
        // shrinker's next run finds it.
        call("server_up", self.fixture.server_up(&self.broker))
            .await?
            .map_err(|e| {
                fail(
                    "fixture",
                    format!("the fixture could not bring the server back: {e}"),
                )
            })?;
        let published_meanwhile = meanwhile?;
        let back = self.now();
        self.restarted = Some(back);
        self.ran.restarts += 1;
        loop {
            let last = match call("stats", self.broker.stats(QUEUE)).await? {
                Ok(_) => break,
                Err(e) => e.to_string(),
            };
            if self.now() > back + RECOVERY_LIMIT {
                return Err(fail(
                    "not recovered",
                    format!(
                        "the broker did not answer within {RECOVERY_LIMIT:?} of the server's return ({outage:?}); last error: {last}"
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.ran.slowest_recovery = self.ran.slowest_recovery.max(self.now() - back);
        if published_meanwhile {
            self.publish_again(id, Priority::NORMAL, "the server was down")
                .await?;
        }
        self.stats().await
    }

    /// Calls made while the server is down: a claim and a publish of `id` must each fail
    /// within [`OUTAGE_LIMIT`]. Returns whether the publish was made (it stored nothing).
    async fn while_down(&mut self, id: &str) -> Result<bool, Failed> {
        let hung = |what: &str| {
            fail(
                "hung while down",
                format!(
                    "{what} made while the server was down did not return within {OUTAGE_LIMIT:?}"
                ),
            )
        };
        let claimed = tokio::time::timeout(
            OUTAGE_LIMIT,
            self.broker.claim(
                QUEUE,
                1,
                Duration::ZERO,
                crate::broker::ClaimOrder::Priority,
            ),
        )
        .await
        .map_err(|_| hung("a claim"))?;
        if let Ok(d) = claimed {
            return Err(fail(
                "answered while down",
                format!(
                    "a claim made while the server was down answered {} deliveries instead of an error",
                    d.len()
                ),
            ));
        }
        if self.skip.iter().any(|s| s == "publish") {
            return Ok(false);
        }
        let published = tokio::time::timeout(
            OUTAGE_LIMIT,
            self.broker
                .publish_job(Self::job(id, Duration::ZERO, Priority::NORMAL)),
        )
        .await
        .map_err(|_| hung("a publish"))?;
        if let Ok(p) = published {
            return Err(fail(
                "answered while down",
                format!("a publish of {id} made while the server was down answered {p:?}"),
            ));
        }
        Ok(true)
    }

    fn alive_list(&self) -> String {
        let alive: Vec<String> = self
            .jobs
            .iter()
            .filter(|j| j.st.alive())
            .map(|j| format!("{} {:?}", j.id, j.st))
            .collect();
        format!("[{}]", alive.join(", "))
    }

    /// The latest time the model allows for job `j` to become claimable.
    fn claimable_by(&self, j: usize) -> Duration {
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
    async fn drain(&mut self) -> Result<(), Failed> {
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
