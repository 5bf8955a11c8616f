//! Where a queue's claims start on Postgres: a remembered due time below which claims do not
//! look, except for a full claim now and then.
//!
//! Postgres keeps an index entry for every row version until VACUUM removes it, and VACUUM
//! cannot remove a version that an open transaction might still see. With a transaction held
//! open anywhere on the server (a forgotten `BEGIN` in a console, a long report), every job
//! acknowledged since then leaves its entries in the due-time index, at the front, where a claim
//! ordered by due time starts. An unbounded claim visits every one of them, every time: at 800
//! jobs/s, after a minute, about 100,000 entries and 20 ms per claim, growing.
//!
//! So a claim starts at a floor: a little below the earliest due time the last claims returned.
//! Rows due before the floor are those a full claim did not take because they were leased (a
//! running job, or one whose worker died), locked by another worker's claim, or committed late
//! by a long transaction; a full claim, at least every [`FULL_EVERY`] (longer when full claims
//! are slow, so that they never take more than about a twentieth of the time), takes them. Rows
//! published or retried now are due a second before now (the route's `BACKDATE`): the floor
//! never rises above that less [`SLACK`], so that they are always above it.
//!
//! The slack is short because a deep backlog makes it expensive. The rows a bounded claim
//! passes over are the acknowledged ones between the floor and the front of the queue (each
//! claimed row leaves two dead index entries, its claimed version and its deletion), and their
//! number is the slack times the rate at which the backlog was published. A million jobs
//! published in bulk in eight seconds put 125,000 rows in each second of due times. With a
//! slack of 2 s, each claim of 100 rows read about 2,000 index pages, and the drain of that
//! backlog ran at 0.6 of the drain of a small one (`EXPLAIN (ANALYZE, BUFFERS)` of the claim,
//! and a server-side loop of claim and delete, on this project's benchmark table). With 250 ms
//! it ran at the same rate. The cost of a short slack falls on a publishing transaction
//! that commits more than the slack after it stamped its rows (a publish in a long caller's
//! transaction) while the queue's claims are ahead of it: its rows wait for the next full
//! claim, at most about a second later while full claims are fast.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// How far below the earliest due time seen a bounded claim starts: rows committed out of due
/// order by up to this much (a publishing transaction that took a while, clocks a little apart)
/// are still found by the next bounded claim. See the module's notes for why it is short.
pub(crate) const SLACK: chrono::Duration = chrono::Duration::milliseconds(250);

/// The highest a floor goes at `now`: [`SLACK`] below the due time of a row published or
/// retried at `now` (`now - BACKDATE`). A row due at `now` exactly (a delayed job whose time
/// came) never lifts the floor above the jobs being published.
fn highest(now: DateTime<Utc>) -> DateTime<Utc> {
    now - crate::due::BACKDATE - SLACK
}

/// The longest a row below the floor waits for a full claim, when full claims are fast.
pub(crate) const FULL_EVERY: Duration = Duration::from_secs(1);

/// Full claims take at most about 1/FULL_SHARE of the time.
const FULL_SHARE: u32 = 20;

/// The longest the floor lets a row below it wait, however slow full claims are.
const FULL_EVERY_MAX: Duration = Duration::from_secs(10);

/// How a claim should look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// At every row of the queue.
    Full,
    /// At rows due at or after this.
    From(DateTime<Utc>),
}

#[derive(Clone, Copy, Debug)]
struct Floor {
    at: DateTime<Utc>,
    full_at: Instant,
}

/// The floors of a route's queues.
#[derive(Debug, Default)]
pub(crate) struct Floors {
    by_queue: Mutex<HashMap<String, Floor>>,
}

impl Floors {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Floor>) -> T) -> T {
        // A panic while the lock was held left a map that is still whole (every update is one
        // insert or remove): use it.
        let mut map = stagedoor_jobs::kit::lock(&self.by_queue);
        f(&mut map)
    }

    /// How the next claim of `queue` looks.
    pub(crate) fn plan(&self, queue: &str) -> Plan {
        self.with(|m| match m.get(queue) {
            Some(f) if Instant::now() < f.full_at => Plan::From(f.at),
            _ => Plan::Full,
        })
    }

    /// A full claim of `queue` took `took` and returned rows whose earliest due time is
    /// `earliest` (`None`: it returned none, so nothing due by `now` is claimable).
    pub(crate) fn after_full(
        &self,
        queue: &str,
        earliest: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
        took: Duration,
    ) {
        let at = earliest.map_or(now, |e| e - SLACK).min(highest(now));
        let every = took
            .saturating_mul(FULL_SHARE)
            .clamp(FULL_EVERY, FULL_EVERY_MAX);
        self.with(|m| {
            m.insert(
                queue.to_owned(),
                Floor {
                    at,
                    full_at: Instant::now() + every,
                },
            )
        });
    }

    /// A bounded claim of `queue` at `now` returned rows whose earliest due time is `earliest`:
    /// the floor moves up to [`SLACK`] below it, at most to [`highest`] (never down: rows below
    /// are the full claim's).
    pub(crate) fn after_bounded(
        &self,
        queue: &str,
        earliest: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) {
        let Some(e) = earliest else { return };
        let to = (e - SLACK).min(highest(now));
        self.with(|m| {
            if let Some(f) = m.get_mut(queue) {
                f.at = f.at.max(to);
            }
        });
    }

    /// The next claim of `queue` looks at every row (the test clock moved, say).
    pub(crate) fn reset(&self, queue: &str) {
        self.with(|m| m.remove(queue));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_claim_sets_the_floor_below_what_it_took_and_expires() {
        let f = Floors::default();
        assert_eq!(f.plan("q"), Plan::Full, "nothing known yet");
        f.after_full("q", Some(t(10)), t(20), Duration::from_millis(1));
        assert_eq!(f.plan("q"), Plan::From(t(10) - SLACK));
        assert_eq!(f.plan("other"), Plan::Full, "per queue");
        tokio::time::advance(FULL_EVERY).await;
        assert_eq!(
            f.plan("q"),
            Plan::Full,
            "a full claim at least every second"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_empty_full_claim_starts_the_floor_below_what_is_published_now() {
        let f = Floors::default();
        let fresh = t(20) - crate::due::BACKDATE;
        f.after_full("q", None, t(20), Duration::ZERO);
        assert_eq!(f.plan("q"), Plan::From(fresh - SLACK));
        // A row due in the future (a delayed job) returned by a later full claim never lifts
        // the floor above the rows published now.
        f.after_full("q", Some(t(99)), t(20), Duration::ZERO);
        assert_eq!(f.plan("q"), Plan::From(fresh - SLACK));
        // Nor does a delayed row whose time came just now.
        f.after_full("q", Some(t(20)), t(20), Duration::ZERO);
        assert_eq!(f.plan("q"), Plan::From(fresh - SLACK));
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_claims_only_raise_the_floor() {
        let f = Floors::default();
        f.after_bounded("q", Some(t(5)), t(20));
        assert_eq!(f.plan("q"), Plan::Full, "no floor without a full claim");
        f.after_full("q", Some(t(10)), t(20), Duration::ZERO);
        f.after_bounded("q", Some(t(15)), t(20));
        assert_eq!(f.plan("q"), Plan::From(t(15) - SLACK));
        f.after_bounded("q", Some(t(12)), t(20));
        assert_eq!(f.plan("q"), Plan::From(t(15) - SLACK), "never down");
        f.after_bounded("q", None, t(20));
        assert_eq!(f.plan("q"), Plan::From(t(15) - SLACK));
        // A delayed row due at the claim's time lifts the floor only to below the rows
        // published at that time.
        f.after_bounded("q", Some(t(30)), t(30));
        assert_eq!(
            f.plan("q"),
            Plan::From(t(30) - crate::due::BACKDATE - SLACK)
        );
        f.reset("q");
        assert_eq!(f.plan("q"), Plan::Full);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_full_claims_come_less_often_but_at_least_every_ten_seconds() {
        let f = Floors::default();
        f.after_full("q", Some(t(10)), t(20), Duration::from_millis(200));
        tokio::time::advance(Duration::from_millis(3900)).await;
        assert!(matches!(f.plan("q"), Plan::From(_)), "200 ms x 20 = 4 s");
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(f.plan("q"), Plan::Full);
        f.after_full("q", Some(t(10)), t(20), Duration::from_secs(5));
        tokio::time::advance(FULL_EVERY_MAX).await;
        assert_eq!(f.plan("q"), Plan::Full, "capped at 10 s");
    }
}
