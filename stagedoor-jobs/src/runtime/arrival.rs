//! The rules a delivery meets before it runs, the same for every backend: a job delivered
//! more than the poison count without being settled, and a job whose attempts already reach
//! its mount's cap, are dead-lettered without running. A backend only reports what it knows
//! ([`Delivery::delivered`], [`Delivery::spent_from`]); the decision is made here. A job
//! dead-lettered by the poison count or on arrival reports the attempts it spent, not this
//! delivery's number: this delivery never ran.

use crate::broker::{Delivery, MAX_ATTEMPT, Settlement};
use crate::mount::MountSpec;
use crate::outcome::{Failure, FailureCause};

/// The settlement of a delivery that must not run (its poison count passed, its cap spent),
/// or `None` for one that runs, with the attempts its dead letter reports when they are not the
/// delivery's number (the runtime gives its envelope that attempt before settling).
/// `default_dead_letter` is where a job whose mount declares no dead letter goes when the
/// poison count sends it away.
pub(super) fn refused<R>(
    spec: &MountSpec,
    delivery: &Delivery<R>,
    poison_count: u32,
    default_dead_letter: impl FnOnce() -> String,
) -> Option<(Settlement, Option<u32>)> {
    let env = &delivery.envelope;
    if let Some(d) = delivery.delivered.filter(|d| *d > poison_count) {
        let target = spec.dead_letter.clone().unwrap_or_else(default_dead_letter);
        let error = format!(
            "delivered {d} times without being settled (max_deliveries {poison_count}): its workers died while running it, so it is dead-lettered without running again"
        );
        // The deliveries before this one spent their attempts; this one never ran.
        let spent = spent_before(env.attempt(), 1);
        return Some((dead(target, error), Some(spent)));
    }
    let (cap, target) = (spec.max_attempts?.get(), spec.dead_letter.as_ref()?);
    let attempt = env.attempt();
    if attempt <= cap {
        return None;
    }
    // Cloned only for a refusal: this runs for every delivery.
    let target = target.clone();
    // The attempts spent before these deliveries, when the backend counts deliveries: they
    // alone reach the cap when the job arrived with them spent (no worker died here).
    let before = delivery
        .delivered
        .map(|d| (spent_before(attempt, d), d))
        .filter(|(spent, _)| *spent >= cap);
    Some(match before {
        Some((spent, d)) => {
            let error = arrival_message(spec, delivery, spent, d);
            (dead(target, error), Some(spent))
        }
        None => (dead(target, poison_message(attempt, cap)), None),
    })
}

/// The attempts spent before the last `delivered` deliveries of a job now at `attempt`. An
/// attempt counter saturated at [`MAX_ATTEMPT`] tells no more than that: it stays there.
fn spent_before(attempt: u32, delivered: u32) -> u32 {
    if attempt >= MAX_ATTEMPT {
        MAX_ATTEMPT
    } else {
        attempt.saturating_sub(delivered)
    }
}

fn dead(target: String, error: String) -> Settlement {
    let failure = Failure::new(FailureCause::Poison, error, String::new());
    tracing::error!(dead_letter = %target, "{}", failure.error);
    Settlement::DeadLetter { target, failure }
}

/// The error of a job that arrived with `spent` attempts spent, reaching its mount's cap, and
/// was delivered `delivered` times since.
fn arrival_message<R>(spec: &MountSpec, d: &Delivery<R>, spent: u32, delivered: u32) -> String {
    let from = d
        .spent_from
        .as_deref()
        .map_or_else(String::new, |f| format!(" {f}"));
    let before = if delivered > 1 {
        format!(
            "; it had been delivered {} times before without being settled",
            delivered - 1
        )
    } else {
        "; this was its first delivery: it never ran here".to_owned()
    };
    format!(
        "job {} arrived on `{}` having already spent {spent} attempts{from}, and max_attempts({}) of subscriber `{}` allows no more: dead-lettered without running{before}. Replay it to run it again from attempt 1",
        d.envelope.id(),
        spec.queue,
        spec.max_attempts.map_or(0, |c| c.get()),
        spec.subscriber,
    )
}

/// The error of a delivery claimed beyond its mount's cap, dead-lettered without running. The
/// runtime cannot tell why the count is past the cap, so it names every cause that leads there.
pub(super) fn poison_message(attempt: u32, cap: u32) -> String {
    format!(
        "this is delivery {attempt} of the job, past max_attempts({cap}), so it is dead-lettered without running again. \
         Possible causes: a worker died or lost its lease during its earlier deliveries (each claim spends an attempt), \
         the cap was lowered after those deliveries (a deploy), or the stored attempt count was edited. \
         Replay it once the cause is fixed (a replay resets its attempts)"
    )
}

#[cfg(test)]
mod tests {
    use super::poison_message;

    #[test]
    fn the_poison_message_names_the_delivery_the_cap_and_every_cause() {
        let m = poison_message(40, 3);
        for part in [
            "delivery 40 ",
            "max_attempts(3)",
            "a worker died",
            "cap was lowered",
            "stored attempt count was edited",
            "Replay",
        ] {
            assert!(m.contains(part), "{part:?} missing from {m:?}");
        }
        assert!(!m.contains("a worker died while running it"), "{m}");
    }
}
