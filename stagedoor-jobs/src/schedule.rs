//! The scheduler: jobs enqueued at times, every N or by a cron expression in a time zone,
//! exactly once per tick however many workers run it.
//!
//! A scheduler runs inside every worker and wakes every second. For each due tick of each
//! schedule it takes a lock per schedule and tick in the broker (Redis `SET NX` with a token,
//! SQL a unique row) and enqueues the job with an id derived from the schedule and the tick
//! (`expire_holds@1764411360`), so a clock a few seconds off cannot enqueue a tick twice.
//! Ticks missed while every worker was down are handled by the schedule's [`Missed`] policy.
//! A tick the broker failed to enqueue (unreachable at 03:00) is tried again on every wake until
//! it is enqueued; failed ticks that a newer tick overtakes are missed ticks, kept by
//! [`Missed::RunAll`] only.
//!
//! The lock of a tick is kept for at least an hour (cron: 25 hours), and it is what stops a
//! second enqueue: the derived job id stops one too while the first is still in the queue (a
//! lock lost early, an eviction), but not once it has run.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;
use tokio::sync::watch;

use crate::broker::{Problem, tick_job_id};
use crate::clock::Clock;
use crate::envelope::Job;
use crate::runtime::ErasedRoute;

/// The time zone database [`Schedule::in_tz`] reads, re-exported so that an application names
/// its zones with the same version the scheduler uses: `schedule::chrono_tz::Europe::Prague`.
pub use chrono_tz;
/// A time zone for [`Schedule::in_tz`] (`chrono_tz::Europe::Prague`, or `"Europe/Prague".parse()`).
pub use chrono_tz::Tz;

/// What a schedule does about ticks that passed while no worker ran (every worker was down at
/// 03:00). Each is logged as a warning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Missed {
    /// Enqueue nothing for them.
    Skip,
    /// Enqueue the latest missed tick once (the default).
    #[default]
    RunOnce,
    /// Enqueue every missed tick (at most 1,000).
    RunAll,
}

/// A cron expression literal checked when the program compiles: `cron!("0 3 * * *")`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CronExpr(&'static str);

impl CronExpr {
    /// Used by the `cron!` macro, which has checked the expression.
    #[doc(hidden)]
    pub const fn __checked(expr: &'static str) -> Self {
        Self(expr)
    }
}

/// What a schedule's times are given as.
pub trait IntoCron {
    /// The expression's text.
    fn into_cron_text(self) -> String;
}
impl IntoCron for &str {
    fn into_cron_text(self) -> String {
        self.to_owned()
    }
}
impl IntoCron for String {
    fn into_cron_text(self) -> String {
        self
    }
}
impl IntoCron for CronExpr {
    fn into_cron_text(self) -> String {
        self.0.to_owned()
    }
}

#[derive(Clone)]
enum When {
    Every(Duration),
    Cron {
        text: String,
        parsed: Option<Box<croner::Cron>>,
    },
}

type Payload = Arc<dyn Fn(DateTime<Utc>) -> Result<Vec<u8>, serde_json::Error> + Send + Sync>;

/// A job enqueued at times: `Schedule::every("expire_holds", Duration::from_secs(60)).on("jobs")`.
#[derive(Clone)]
pub struct Schedule {
    name: String,
    queue: Option<String>,
    kind: Option<String>,
    when: When,
    tz: chrono_tz::Tz,
    payload: Payload,
    missed: Missed,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let when = match &self.when {
            When::Every(d) => format!("every {d:?}"),
            When::Cron { text, .. } => format!("cron {text:?}"),
        };
        f.debug_struct("Schedule")
            .field("name", &self.name)
            .field("queue", &self.queue)
            .field("kind", &self.kind)
            .field("when", &when)
            .field("tz", &self.tz)
            .field("missed", &self.missed)
            .finish()
    }
}

impl Schedule {
    fn new(name: impl Into<String>, when: When) -> Self {
        Self {
            name: name.into(),
            queue: None,
            kind: None,
            when,
            tz: chrono_tz::UTC,
            payload: Arc::new(|_| Ok(b"{}".to_vec())),
            missed: Missed::default(),
        }
    }

    /// Every `period`, on ticks aligned to the Unix epoch (every worker agrees on them): every
    /// minute ticks at :00 of each minute.
    pub fn every(name: impl Into<String>, period: Duration) -> Self {
        Self::new(name, When::Every(period))
    }

    /// At the times of a cron expression (`"0 3 * * *"`: 03:00 every day), in UTC unless
    /// [`in_tz`](Self::in_tz) names a zone. A literal checked when the program compiles is
    /// `cron!("0 3 * * *")`; an expression built at runtime is checked at startup.
    pub fn cron(name: impl Into<String>, expr: impl IntoCron) -> Self {
        let text = expr.into_cron_text();
        let parsed = croner::Cron::from_str(&text).ok().map(Box::new);
        Self::new(name, When::Cron { text, parsed })
    }

    /// At minute 0 of every hour.
    pub fn hourly(name: impl Into<String>) -> Self {
        Self::cron(name, "0 * * * *")
    }

    /// Every day at `hour:minute` (in UTC unless [`in_tz`](Self::in_tz) names a zone).
    pub fn daily_at(name: impl Into<String>, hour: u32, minute: u32) -> Self {
        Self::cron(name, format!("{minute} {hour} * * *"))
    }

    /// Reads the cron expression's times in `tz` ([`chrono_tz::Europe::Prague`]). An every-N
    /// schedule ticks on the epoch's grid whatever the zone.
    pub fn in_tz(mut self, tz: Tz) -> Self {
        self.tz = tz;
        self
    }

    /// The queue the jobs go on, like every other job of their kind (required).
    pub fn on(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// The jobs' kind (default: the schedule's name).
    pub fn kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(kind.into());
        self
    }

    /// The same payload for every tick (default `{}`).
    pub fn payload<T: Serialize>(mut self, value: &T) -> Self {
        let bytes = serde_json::to_vec(value);
        self.payload = match bytes {
            Ok(b) => Arc::new(move |_| Ok(b.clone())),
            Err(e) => {
                let msg = e.to_string();
                Arc::new(move |_| Err(serde::ser::Error::custom(msg.clone())))
            }
        };
        self
    }

    /// A payload made for each tick from its time.
    pub fn payload_with<T: Serialize, F>(mut self, make: F) -> Self
    where
        F: Fn(DateTime<Utc>) -> T + Send + Sync + 'static,
    {
        self.payload = Arc::new(move |tick| serde_json::to_vec(&make(tick)));
        self
    }

    /// What to do about missed ticks (default [`Missed::RunOnce`]).
    pub fn missed(mut self, policy: Missed) -> Self {
        self.missed = policy;
        self
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue its jobs go on.
    pub fn queue(&self) -> Option<&str> {
        self.queue.as_deref()
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.when {
            When::Every(period) => {
                let p = i64::try_from(period.as_millis()).ok().filter(|p| *p > 0)?;
                let ms = t.timestamp_millis();
                DateTime::<Utc>::from_timestamp_millis((ms.div_euclid(p) + 1) * p)
            }
            When::Cron { parsed, .. } => {
                let local = self.tz.from_utc_datetime(&t.naive_utc());
                let next = parsed.as_ref()?.find_next_occurrence(&local, false).ok()?;
                Some(next.with_timezone(&Utc))
            }
        }
    }

    /// The next tick strictly after `t` (a schedule whose expression would not move forward
    /// stops, logged, rather than enqueue one tick forever).
    fn tick_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let next = self.next_after(t)?;
        if next > t {
            Some(next)
        } else {
            tracing::error!(schedule = %self.name, %t, %next, "the schedule's next tick is not after its last: it stops");
            None
        }
    }

    /// The ticks after `last` and no later than `now`: how many, and the latest
    /// [`MAX_BACKLOG`] of them, oldest first.
    fn missed_between(
        &self,
        last: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> (u64, VecDeque<DateTime<Utc>>) {
        let mut kept = VecDeque::new();
        if let When::Every(period) = &self.when
            && let Ok(p) = i64::try_from(period.as_millis())
            && p > 0
        {
            // On the epoch's grid: counted, not walked.
            let first = last.timestamp_millis().div_euclid(p) + 1;
            let latest = now.timestamp_millis().div_euclid(p);
            if latest < first {
                return (0, kept);
            }
            let count = u64::try_from(latest - first + 1).unwrap_or(u64::MAX);
            let from = first.max(latest - MAX_BACKLOG as i64 + 1);
            kept.extend((from..=latest).filter_map(|n| DateTime::from_timestamp_millis(n * p)));
            return (count, kept);
        }
        let mut count = 0;
        let mut t = self.tick_after(last);
        while let Some(tick) = t
            && tick <= now
        {
            count += 1;
            kept.push_back(tick);
            if kept.len() > MAX_BACKLOG {
                kept.pop_front();
            }
            t = self.tick_after(tick);
        }
        (count, kept)
    }

    /// Problems that stop the service.
    pub(crate) fn problems(&self) -> Vec<Problem> {
        let who = format!("schedule `{}`", self.name);
        let mut out = Vec::new();
        match &self.when {
            When::Every(d) if d.as_millis() == 0 => out.push(Problem {
                mount: who.clone(),
                message:
                    "a period of zero would tick forever: give it a period of a second or more"
                        .to_owned(),
            }),
            When::Every(d) if *d < Duration::from_secs(1) => out.push(Problem {
                mount: who.clone(),
                message: format!(
                    "a period of {d:?} is under a second, but the scheduler wakes every second and a tick's job id is the schedule and its second (`{}@<unix seconds>`), so two ticks would share one: give it a period of a second or more",
                    self.name
                ),
            }),
            When::Cron {
                text,
                parsed: Some(_),
            } if self.next_after(Utc::now()).is_none() => out.push(Problem {
                mount: who.clone(),
                message: format!(
                    "the cron expression {text:?} never fires (no date matches it): check its day and month fields"
                ),
            }),
            When::Cron { text, parsed: None } => {
                let why = croner::Cron::from_str(text)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                out.push(Problem {
                    mount: who.clone(),
                    message: format!("the cron expression {text:?} does not parse ({why}): write five fields, minute hour day month weekday, e.g. \"0 3 * * *\""),
                });
            }
            _ => {}
        }
        if self.queue.is_none() {
            out.push(Problem {
                mount: who,
                message: "it names no queue: add `.on(\"jobs\")`, the queue its kind's jobs go on"
                    .to_owned(),
            });
        }
        out
    }

    fn kind_name(&self) -> &str {
        self.kind.as_deref().unwrap_or(&self.name)
    }

    fn queue_name(&self) -> &str {
        self.queue.as_deref().unwrap_or("")
    }

    /// When it ticks, as written (`every 5m`; `0 3 * * * (Europe/Prague)`), and what it does
    /// with missed ticks (`skip`, `run once`, `run all`): what a worker reports of it.
    pub(crate) fn described(&self) -> (String, String) {
        let when = match &self.when {
            When::Every(d) => format!("every {}", short_duration(*d)),
            When::Cron { text, .. } => format!("{text} ({})", self.tz),
        };
        let missed = match self.missed {
            Missed::Skip => "skip",
            Missed::RunOnce => "run once",
            Missed::RunAll => "run all",
        };
        (when, missed.to_owned())
    }

    /// How long a tick's guard is kept: the record that the tick was enqueued.
    fn lock_ttl(&self) -> Duration {
        match &self.when {
            When::Every(p) => (*p * 2).max(Duration::from_secs(3600)),
            When::Cron { .. } => Duration::from_secs(25 * 3600),
        }
    }
}

/// `d` as a schedule is written: `90s`, `5m`, `2h`, `1d`, `250ms`.
fn short_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 || secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    match secs {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// A schedule bound to the route that enqueues its jobs.
#[derive(Clone)]
pub(crate) struct Bound {
    pub(crate) schedule: Schedule,
    pub(crate) route: Arc<dyn ErasedRoute>,
}

/// The scheduler's progress, for the test harness: the clock time it has caught up to, and its
/// next tick.
#[derive(Clone, Debug, Default)]
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) struct Progress {
    pub(crate) caught_up_to: Option<DateTime<Utc>>,
    pub(crate) next_tick: Option<DateTime<Utc>>,
    /// Each schedule's next tick, in the order the scheduler was given them (what workers
    /// report).
    pub(crate) ticks: Vec<Option<DateTime<Utc>>>,
}

/// The most missed (or failed) ticks of one schedule kept to be enqueued.
const MAX_BACKLOG: usize = 1_000;

/// One schedule's state in the loop: its next tick, and the due ticks whose enqueue failed (the
/// broker was unreachable), oldest first, retried on every wake.
struct Pending {
    next: Option<DateTime<Utc>>,
    failed: VecDeque<DateTime<Utc>>,
}

/// The scheduler loop of one service.
pub(crate) async fn run(
    bound: Vec<Bound>,
    clock: Clock,
    mut stop: watch::Receiver<bool>,
    progress: Arc<watch::Sender<Progress>>,
) {
    // The time of a schedule is its broker's clock (the backend's, see `Clock::sync`), unless
    // the test harness moves a manual clock.
    let now_of = |b: &Bound| {
        if clock.is_manual() {
            clock.now()
        } else {
            b.route.clock().now()
        }
    };
    let start = bound.first().map_or_else(|| clock.now(), now_of);
    let mut pending: Vec<Pending> = Vec::with_capacity(bound.len());
    for b in &bound {
        let (missed, next) = catch_up(b, now_of(b)).await;
        let mut p = Pending {
            next,
            failed: VecDeque::new(),
        };
        enqueue_due(b, &mut p, missed).await;
        pending.push(p);
    }
    publish_progress(&progress, start, &pending);
    let mut clock_rx = clock.subscribe();
    loop {
        let nap = bound
            .iter()
            .zip(&pending)
            .filter_map(|(b, p)| p.next.map(|t| (t - now_of(b)).to_std().unwrap_or_default()))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        let clock_changed = async {
            match clock_rx.as_mut() {
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(nap) => {}
            _ = clock_changed => {}
            _ = stop.changed() => return,
        }
        let mut now = start;
        for (b, p) in bound.iter().zip(pending.iter_mut()) {
            now = now_of(b);
            let mut due = Vec::new();
            while let Some(t) = p.next
                && t <= now
            {
                due.push(t);
                p.next = b.schedule.tick_after(t);
            }
            enqueue_due(b, p, due).await;
        }
        publish_progress(&progress, now, &pending);
    }
}

/// Enqueues `due` (in order) after the ticks that failed before. Failed ticks that a newer tick
/// has overtaken are missed ticks: the schedule's policy decides (`RunAll` keeps them, the
/// others keep only the newest). A tick that fails now waits, with every tick after it, for
/// the next wake.
async fn enqueue_due(b: &Bound, p: &mut Pending, due: Vec<DateTime<Utc>>) {
    if due.is_empty() && p.failed.is_empty() {
        return;
    }
    let s = &b.schedule;
    let retried = p.failed.len();
    if retried > 0 && !due.is_empty() && s.missed != Missed::RunAll {
        tracing::warn!(
            schedule = %s.name,
            dropped = retried,
            policy = ?s.missed,
            "ticks not enqueued while the broker failed were overtaken by a newer tick: dropped"
        );
        p.failed.clear();
    }
    let mut queue: VecDeque<DateTime<Utc>> = p.failed.drain(..).collect();
    queue.extend(due);
    while let Some(tick) = queue.pop_front() {
        if let Enqueued::Failed = enqueue(b, tick).await {
            p.failed.push_back(tick);
            p.failed.extend(queue);
            while p.failed.len() > MAX_BACKLOG {
                p.failed.pop_front();
            }
            return;
        }
    }
}

fn publish_progress(progress: &watch::Sender<Progress>, now: DateTime<Utc>, pending: &[Pending]) {
    progress.send_replace(Progress {
        caught_up_to: Some(now),
        next_tick: pending.iter().filter_map(|p| p.next).min(),
        ticks: pending.iter().map(|p| p.next).collect(),
    });
}

/// Applies the missed-tick policy at start: returns the missed ticks to enqueue (none, the
/// latest, or up to the latest 1,000) and the first tick to wait for.
async fn catch_up(b: &Bound, now: DateTime<Utc>) -> (Vec<DateTime<Utc>>, Option<DateTime<Utc>>) {
    let s = &b.schedule;
    let next = s.tick_after(now);
    // A broker that is briefly unreachable at start should not cost the catch-up.
    let mut wait = Duration::from_millis(100);
    let last = loop {
        match b.route.last_tick(&s.name).await {
            Ok(l) => break l,
            Err(e) if wait < Duration::from_secs(1) => {
                tracing::warn!(schedule = %s.name, error = %e, "cannot read the schedule's last tick; trying again in {wait:?}");
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            Err(e) => {
                tracing::warn!(schedule = %s.name, error = %e, "cannot read the schedule's last tick: missed ticks are not caught up");
                break None;
            }
        }
    };
    let Some(last) = last else {
        return (Vec::new(), next);
    };
    let (count, missed) = s.missed_between(last, now);
    if count == 0 {
        return (Vec::new(), next);
    }
    tracing::warn!(
        schedule = %s.name,
        last = %last,
        missed = count,
        policy = ?s.missed,
        "ticks were missed while no worker ran"
    );
    let enqueue = match s.missed {
        Missed::Skip => Vec::new(),
        Missed::RunOnce => missed.back().copied().into_iter().collect(),
        Missed::RunAll => missed.into_iter().collect(),
    };
    (enqueue, next)
}

/// What became of one tick.
enum Enqueued {
    /// Enqueued here, or by another worker (its lock is taken), or never to be (its payload
    /// does not encode).
    Done,
    /// The broker failed: try again.
    Failed,
}

/// Enqueues one tick unless another worker has: the tick's job and its guard go to the broker
/// in one atomic step ([`publish_once`](crate::Broker::publish_once)), so a worker dying at any
/// point leaves the tick either enqueued or free for another worker (or this one's retry),
/// never taken and lost.
async fn enqueue(b: &Bound, tick: DateTime<Utc>) -> Enqueued {
    let s = &b.schedule;
    let payload = match (s.payload)(tick) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(schedule = %s.name, %tick, error = %e, "the payload does not encode: tick not enqueued");
            return Enqueued::Done;
        }
    };
    let job = Job::from_bytes(s.queue_name(), payload)
        .kind(s.kind_name())
        .id(tick_job_id(&s.name, tick));
    let guard = format!("sched:{}:{}", s.name, tick.timestamp_millis());
    match b.route.publish_once(job, &guard, s.lock_ttl()).await {
        Ok(p) => {
            if p.is_stored() {
                tracing::info!(schedule = %s.name, %tick, queue = s.queue_name(), "tick enqueued");
            }
            if let Err(e) = b.route.mark_tick(&s.name, tick).await {
                tracing::warn!(schedule = %s.name, error = %e, "cannot record the tick");
            }
            Enqueued::Done
        }
        Err(e) => {
            tracing::error!(schedule = %s.name, %tick, error = %e, "the tick could not be enqueued: trying again in a second");
            Enqueued::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("a time")
            .with_timezone(&Utc)
    }

    #[test]
    fn a_schedule_is_described_as_written() {
        let d = |s: Schedule| s.described();
        let every = |secs: u64| Schedule::every("s", Duration::from_secs(secs));
        assert_eq!(d(every(300)).0, "every 5m");
        assert_eq!(d(every(90)).0, "every 90s");
        assert_eq!(d(every(7_200)).0, "every 2h");
        assert_eq!(d(every(86_400)).0, "every 1d");
        assert_eq!(
            d(Schedule::every("s", Duration::from_millis(250))).0,
            "every 250ms"
        );
        assert_eq!(
            d(Schedule::cron("s", "0 3 * * *").in_tz(chrono_tz::Europe::Prague)),
            (
                "0 3 * * * (Europe/Prague)".to_owned(),
                "run once".to_owned()
            )
        );
        assert_eq!(d(every(60).missed(Missed::Skip)).1, "skip");
        assert_eq!(d(every(60).missed(Missed::RunAll)).1, "run all");
    }

    #[test]
    fn every_minute_ticks_on_the_minute() {
        let s = Schedule::every("expire_holds", Duration::from_secs(60));
        assert_eq!(
            s.next_after(utc("2026-11-29T10:15:42Z")),
            Some(utc("2026-11-29T10:16:00Z"))
        );
        assert_eq!(
            s.next_after(utc("2026-11-29T10:16:00Z")),
            Some(utc("2026-11-29T10:17:00Z"))
        );
    }

    #[test]
    fn cron_in_a_time_zone_keeps_its_wall_clock_time_across_dst() {
        // 03:00 in Prague: 02:00 UTC in winter (CET), 01:00 UTC in summer (CEST). Summer time
        // starts on 2026-03-29 at 02:00 local.
        let s = Schedule::daily_at("reconcile_payments", 3, 0).in_tz(chrono_tz::Europe::Prague);
        assert_eq!(
            s.next_after(utc("2026-03-27T12:00:00Z")),
            Some(utc("2026-03-28T02:00:00Z"))
        );
        assert_eq!(
            s.next_after(utc("2026-03-28T02:00:00Z")),
            Some(utc("2026-03-29T01:00:00Z"))
        );
        assert_eq!(
            s.next_after(utc("2026-03-29T01:00:00Z")),
            Some(utc("2026-03-30T01:00:00Z"))
        );
        // And back on 2026-10-25.
        assert_eq!(
            s.next_after(utc("2026-10-24T12:00:00Z")),
            Some(utc("2026-10-25T02:00:00Z"))
        );
    }

    #[test]
    fn hourly_is_on_the_hour() {
        let s = Schedule::hourly("purge_idempotency_keys");
        assert_eq!(
            s.next_after(utc("2026-11-29T10:15:42Z")),
            Some(utc("2026-11-29T11:00:00Z"))
        );
    }

    #[test]
    fn a_bad_expression_or_no_queue_is_a_startup_problem() {
        let p = Schedule::cron("x", "61 * * * *").problems();
        assert!(
            p.iter().any(|p| p.message.contains("does not parse")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|p| p.message.contains("names no queue")),
            "{p:?}"
        );
        assert!(
            Schedule::every("y", Duration::ZERO).on("q").problems()[0]
                .message
                .contains("period of zero")
        );
        assert!(Schedule::hourly("z").on("jobs").problems().is_empty());
    }

    #[test]
    fn a_period_under_a_second_or_a_cron_that_never_fires_is_a_startup_problem() {
        let p = Schedule::every("half", Duration::from_millis(500))
            .on("q")
            .problems();
        assert!(
            p.len() == 1 && p[0].message.contains("under a second"),
            "{p:?}"
        );
        assert!(
            Schedule::every("s", Duration::from_millis(1_500))
                .on("q")
                .problems()
                .is_empty()
        );
        let p = Schedule::cron("feb30", "0 0 30 2 *").on("q").problems();
        assert!(
            p.len() == 1 && p[0].message.contains("never fires"),
            "{p:?}"
        );
    }

    #[test]
    fn missed_ticks_are_counted_all_and_kept_up_to_a_thousand() {
        let every = Schedule::every("e", Duration::from_secs(1));
        let (n, kept) =
            every.missed_between(utc("2026-11-29T08:00:00Z"), utc("2026-11-29T10:00:00.5Z"));
        assert_eq!(n, 7_200);
        assert_eq!(kept.len(), 1_000);
        assert_eq!(kept.front(), Some(&utc("2026-11-29T09:43:21Z")));
        assert_eq!(kept.back(), Some(&utc("2026-11-29T10:00:00Z")));
        let (n, kept) =
            every.missed_between(utc("2026-11-29T10:00:00Z"), utc("2026-11-29T10:00:00.9Z"));
        assert_eq!((n, kept.len()), (0, 0));
        // Off the grid (the period changed): the grid's ticks after it.
        let (n, kept) = Schedule::every("m", Duration::from_secs(60))
            .missed_between(utc("2026-11-29T10:00:30Z"), utc("2026-11-29T10:03:00Z"));
        assert_eq!(n, 3);
        assert_eq!(kept.front(), Some(&utc("2026-11-29T10:01:00Z")));
        // Cron ticks are walked: the same count and the same latest thousand.
        let cron = Schedule::cron("c", "* * * * * *");
        let (n, kept) =
            cron.missed_between(utc("2026-11-29T08:00:00Z"), utc("2026-11-29T10:00:00.5Z"));
        assert_eq!(n, 7_200);
        assert_eq!(kept.len(), 1_000);
        assert_eq!(kept.front(), Some(&utc("2026-11-29T09:43:21Z")));
    }
}
