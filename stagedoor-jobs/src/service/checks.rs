//! The checks before starting that need no I/O: each broker's lease, each mount's caps, dead
//! letter, limits and names, two mounts taking the same jobs, the schedules; and the warning
//! logged for a mount without a cap.

use std::sync::Arc;

use super::builder::Service;
use crate::backoff::{Backoff, UNCAPPED_FLOOR};
use crate::broker::{MAX_ATTEMPT, MAX_LEASE, MIN_LEASE, Problem};
use crate::mount::{MountSpec, OnDecodeError};
use crate::runtime::ErasedRoute;
use crate::runtime::limits::QueueLimits;

/// A mount already checked: its route's index, queue, kind (`None`: every kind) and subscriber.
type SeenMount<'a> = (usize, &'a str, Option<&'a str>, &'a str);

impl Service {
    /// Problems visible without any I/O: leases, caps and dead letters, duplicates, schedules.
    pub(super) fn static_problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut seen: Vec<SeenMount<'_>> = Vec::new();
        let mut reported_limits: Vec<(usize, &str)> = Vec::new();
        for (r, route) in self.routes.iter().enumerate() {
            problems.extend(lease_problem(route));
            for m in route.mounts() {
                let mut found = mount_problems(route.as_ref(), m);
                if let Err(p) = QueueLimits::of(&m.queue, route.mounts().iter())
                    && (m.global_concurrency.is_some() || m.rate_limit.is_some())
                    && !reported_limits.contains(&(r, m.queue.as_str()))
                {
                    reported_limits.push((r, &m.queue));
                    found.push(p);
                }
                let kind = m.kind.as_deref();
                found.extend(duplicate_problem(&seen, r, &m.queue, kind));
                seen.push((r, &m.queue, kind, &m.subscriber));
                let who = format!("mount `{}` on queue `{}`", m.subscriber, m.queue);
                problems.extend(found.into_iter().map(|message| Problem {
                    mount: who.clone(),
                    message,
                }));
            }
        }
        problems.extend(self.schedule_problems());
        problems
    }

    /// Each schedule's own problems, two schedules of one name, schedules without a broker.
    fn schedule_problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut names: Vec<&str> = Vec::new();
        for s in &self.schedules {
            problems.extend(s.problems());
            if names.contains(&s.name()) {
                problems.push(Problem {
                    mount: format!("schedule `{}`", s.name()),
                    message:
                        "two schedules share this name, and the name keys its ticks: rename one"
                            .to_owned(),
                });
            }
            names.push(s.name());
        }
        if !self.schedules.is_empty() && self.routes.is_empty() {
            problems.push(Problem {
                mount: "*".to_owned(),
                message: "the service has schedules but no broker to enqueue them on: add `.with_broker(..)`".to_owned(),
            });
        }
        problems
    }

    /// Logs a warning for each mount without a cap: a job that always fails there is retried
    /// forever.
    pub(super) fn warn_uncapped(&self) {
        for route in &self.routes {
            for m in route.mounts() {
                if m.max_attempts.is_none() {
                    tracing::warn!(
                        subscriber = %m.subscriber,
                        queue = %m.queue,
                        "no max_attempts on this mount: a job that always fails is retried forever, at least {:?} apart (doubling to {:?}: UNCAPPED_FLOOR); declare `.max_attempts(..)` with a `.dead_letter(..)`",
                        UNCAPPED_FLOOR.delay(1),
                        UNCAPPED_FLOOR.delay(u32::MAX)
                    );
                }
            }
        }
    }
}

/// The route's lease outside [`MIN_LEASE`] to [`MAX_LEASE`].
fn lease_problem(route: &Arc<dyn ErasedRoute>) -> Option<Problem> {
    let lease = route.lease();
    if (MIN_LEASE..=MAX_LEASE).contains(&lease) {
        return None;
    }
    Some(Problem {
        mount: "*".to_owned(),
        message: format!(
            "the {} broker's lease is {lease:?}, outside {MIN_LEASE:?} (MIN_LEASE) to {MAX_LEASE:?} (MAX_LEASE): a shorter one has a job claimed again while its handler runs, a longer one holds a dead worker's jobs that long (the runtime renews a lease every third of it, so a long handler needs no long lease): set `.lease(Duration::from_secs(3))`, the default",
            route.backend()
        ),
    })
}

/// What is wrong with mount `m` alone: its queue's and dead letter's names, its cap and dead
/// letter, its decode rule, its concurrency and its limits.
fn mount_problems(route: &dyn ErasedRoute, m: &MountSpec) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(p) = route.queue_name_problem(&m.queue) {
        found.push(p);
    }
    if let Some(p) = m
        .dead_letter
        .as_deref()
        .and_then(|d| route.queue_name_problem(d))
    {
        found.push(format!("its dead letter: {p}"));
    }
    match (&m.max_attempts, &m.dead_letter) {
        (Some(n), None) => found.push(format!(
            "max_attempts({n}) is declared without a dead letter, so a job failing its last attempt would have nowhere to go: add `.dead_letter(\"{}\")`",
            route.default_dead_letter(&m.queue)
        )),
        (None, Some(d)) => found.push(format!(
            "dead_letter(\"{d}\") is declared without max_attempts, so nothing would ever reach it: add `.max_attempts(nonzero!(5u32))`"
        )),
        _ => {}
    }
    if let Some(n) = m.max_attempts
        && n.get() > MAX_ATTEMPT
    {
        found.push(format!(
            "max_attempts({n}) can never be reached: every backend's attempt counter stops at {MAX_ATTEMPT} (stagedoor_jobs::broker::MAX_ATTEMPT), so a failing job would be retried forever: declare a cap of at most {MAX_ATTEMPT}, such as `.max_attempts(nonzero!(25u32))`"
        ));
    }
    if m.dead_letter.as_deref() == Some(m.queue.as_str()) {
        found.push(format!(
            "the dead letter is the queue itself (`{}`), so a dead job would run again: name another, such as `{}`",
            m.queue,
            route.default_dead_letter(&m.queue)
        ));
    }
    if m.on_decode_error == OnDecodeError::DeadLetter && m.dead_letter.is_none() {
        found.push("on_decode_error(OnDecodeError::DeadLetter) needs a dead letter: add `.max_attempts(..)` and `.dead_letter(..)`".to_owned());
    }
    if m.concurrency == 0 {
        found.push("concurrency(0) would never run a handler: use 1 or more".to_owned());
    }
    found.extend(QueueLimits::problems(m));
    found
}

/// A mount of route `r` on `queue` for `kind` when an earlier one already takes those jobs.
fn duplicate_problem(
    seen: &[SeenMount<'_>],
    r: usize,
    queue: &str,
    kind: Option<&str>,
) -> Option<String> {
    let (_, _, _, other) = seen
        .iter()
        .find(|(r2, q, k, _)| *r2 == r && *q == queue && *k == kind)?;
    Some(format!(
        "`{other}` already subscribes to {} on this queue: a job must have one handler; give one of them another queue or `kind = \"..\"`",
        match kind {
            Some(k) => format!("kind `{k}`"),
            None => "every kind".to_owned(),
        }
    ))
}
