//! The core's schedules: cron expressions (text from a configuration, at runtime) in a time
//! zone, and periods.

use std::time::Duration;

use chrono::{DateTime, Utc};
use stagedoor_jobs::__fuzz as core;
use stagedoor_jobs::Schedule;
use stagedoor_jobs::schedule::Tz;

use crate::input::Input;

/// Zones with daylight saving time, offsets that are not whole hours, and UTC.
const ZONES: &[&str] = &[
    "UTC",
    "Europe/Prague",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "Pacific/Chatham",
    "America/Santiago",
    "Africa/Casablanca",
];

/// Ticks walked from each start.
const WALK: usize = 24;

/// Target `cron`. First byte even: the rest after a zone and a time is a cron expression in
/// that zone; odd: a period in milliseconds. The startup check says whether the schedule can
/// run (no panic, no hang), its description is made, and from the given time each next tick is
/// strictly after the one before.
pub fn schedule(data: &[u8]) {
    let mut inp = Input::new(data);
    let mode = inp.u8();
    let zone = inp.u8();
    let tz: Tz = match ZONES.get(usize::from(zone)) {
        Some(z) => z.parse().unwrap_or(chrono_tz_utc()),
        None => inp.text().parse().unwrap_or(chrono_tz_utc()),
    };
    let secs = inp.i64() % 100_000_000_000;
    let from = DateTime::<Utc>::from_timestamp(secs, 0).unwrap_or(DateTime::UNIX_EPOCH);
    let s = if mode & 1 == 0 {
        let text = String::from_utf8_lossy(inp.rest()).into_owned();
        Schedule::cron("fuzz", text)
    } else {
        Schedule::every("fuzz", Duration::from_millis(inp.u64()))
    }
    .in_tz(tz)
    .on("jobs");
    let problems = core::schedule_problems(&s);
    for p in &problems {
        assert!(!p.message.is_empty());
    }
    let _ = core::schedule_described(&s);
    let mut t = from;
    for _ in 0..WALK {
        let Some(next) = s.next_after(t) else { break };
        assert!(next > t, "{s:?}: the tick after {t} is {next}");
        t = next;
    }
}

fn chrono_tz_utc() -> Tz {
    stagedoor_jobs::schedule::chrono_tz::UTC
}
