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
//!
//! This file says what a schedule is and when it ticks; the loop that enqueues the ticks is in
//! `schedule/scheduler.rs`.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;

use crate::broker::Problem;

pub(crate) mod scheduler;

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

/// The most missed (or failed) ticks of one schedule kept to be enqueued.
const MAX_BACKLOG: usize = 1_000;

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
        let parsed = if empty_cron_item(&text).is_some() {
            None
        } else {
            croner::Cron::from_str(&text).ok().map(Box::new)
        };
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
            When::Cron { text, parsed: None } if empty_cron_item(text).is_some() => {
                let field = empty_cron_item(text).unwrap_or("a");
                out.push(Problem {
                    mount: who.clone(),
                    message: format!("the cron expression {text:?} has an empty item in its {field} field (a comma with nothing on one side of it), which would match no time: remove the comma or write the missing value"),
                });
            }
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
/// The field of cron expression `text` holding an empty list item (`", 3 * * *"`: a comma with
/// nothing on one side), which croner reads as an empty list: a schedule that never fires, and
/// whose next tick is searched for seconds (found by the fuzzer, fuzz/README.md finding 3).
fn empty_cron_item(text: &str) -> Option<&'static str> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let names: &[&'static str] = if fields.len() >= 6 {
        &[
            "second", "minute", "hour", "day", "month", "weekday", "year",
        ]
    } else {
        &["minute", "hour", "day", "month", "weekday"]
    };
    fields
        .iter()
        .position(|f| f.split(',').any(str::is_empty))
        .map(|i| names.get(i).copied().unwrap_or("last"))
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
