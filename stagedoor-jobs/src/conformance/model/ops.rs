//! The steps of a model sequence, drawn from a seed, and how they print.

use std::fmt;
use std::time::Duration;

use crate::broker::Settlement;
use crate::envelope::Priority;

/// How a held delivery is settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum How {
    Ack,
    Drop,
    RetryNow,
    RetryAfter(Duration),
    DeadLetter,
}

impl How {
    pub(super) fn settlement(self, dead: &str) -> Settlement {
        use crate::outcome::{Failure, FailureCause};
        let failure = || Failure::new(FailureCause::Error, "model test failure", "");
        match self {
            How::Ack => Settlement::Ack,
            How::Drop => Settlement::Drop,
            How::RetryNow => Settlement::Retry {
                delay: Duration::ZERO,
                failure: failure(),
            },
            How::RetryAfter(delay) => Settlement::Retry {
                delay,
                failure: failure(),
            },
            How::DeadLetter => Settlement::DeadLetter {
                target: dead.to_owned(),
                failure: failure(),
            },
        }
    }
}

/// One step. `pick` fields choose among what exists when the step runs (modulo its count),
/// so that a step stays meaningful when the shrinker removes others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// Publishes a new job `id`, due after `delay` (zero: now), at `priority`.
    Publish {
        id: String,
        delay: Duration,
        priority: Priority,
    },
    /// Publishes again the id of a job published earlier (not one in the dead letter).
    PublishDup { pick: usize },
    /// Publishes a unique job `id` with key `key` and window `window`.
    PublishUnique {
        id: String,
        key: char,
        window: Duration,
        delay: Duration,
    },
    /// Publishes job `id` in the caller's transaction (unique by `key` if any), committed or
    /// rolled back.
    PublishIn {
        id: String,
        key: Option<char>,
        commit: bool,
    },
    /// Publishes job `id` with `headers` extra headers; if that fails, publishes it again
    /// without them: the retry must store it.
    PublishHuge { id: String, headers: usize },
    /// Claims up to `max` jobs.
    Claim { max: usize },
    /// Settles a held delivery.
    Settle { pick: usize, how: How },
    /// Renews a held delivery's lease.
    Renew { pick: usize },
    /// The worker holding a delivery dies: the receipt is dropped unsettled.
    Crash { pick: usize },
    /// Cancels a job published earlier (in whatever state the model has it).
    Cancel { pick: usize },
    /// Replays a dead letter by its job's id.
    Replay { pick: usize },
    /// Time passes.
    Sleep(Duration),
    /// Compares the queue's stats with the model.
    Stats,
    /// A hand edit: the fixture's `pick`-th kind of junk.
    Junk { pick: usize, id: String },
    /// The server goes away for `down` and comes back ([`Fixture::server_down`], then
    /// `server_up`); while it is down, a claim and a publish of job `id` must fail (and store
    /// nothing).
    ///
    /// [`Fixture::server_down`]: crate::conformance::Fixture::server_down
    Restart { id: String, down: Duration },
}

impl Op {
    /// The step's kind, as `STAGEDOOR_MODEL_SKIP` names it.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Op::Publish { .. } => "publish",
            Op::PublishDup { .. } => "publish-dup",
            Op::PublishUnique { .. } => "publish-unique",
            Op::PublishIn { key: Some(_), .. } => "publish-in-unique",
            Op::PublishIn { .. } => "publish-in",
            Op::PublishHuge { .. } => "publish-huge",
            Op::Claim { .. } => "claim",
            Op::Settle { .. } => "settle",
            Op::Renew { .. } => "renew",
            Op::Crash { .. } => "crash",
            Op::Cancel { .. } => "cancel",
            Op::Replay { .. } => "replay",
            Op::Sleep(_) => "sleep",
            Op::Stats => "stats",
            Op::Junk { .. } => "junk",
            Op::Restart { .. } => "restart",
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Publish {
                id,
                delay,
                priority,
            } => write!(f, "publish {id} delay={} priority={priority}", ms(*delay)),
            Op::PublishDup { pick } => write!(f, "publish-duplicate of published #{pick}"),
            Op::PublishUnique {
                id,
                key,
                window,
                delay,
            } => write!(
                f,
                "publish {id} unique key={key} window={} delay={}",
                ms(*window),
                ms(*delay)
            ),
            Op::PublishIn { id, key, commit } => write!(
                f,
                "publish_in {id}{} then {}",
                key.map(|k| format!(" unique key={k}")).unwrap_or_default(),
                if *commit { "commit" } else { "rollback" }
            ),
            Op::PublishHuge { id, headers } => write!(f, "publish {id} with {headers} headers"),
            Op::Claim { max } => write!(f, "claim max={max}"),
            Op::Settle { pick, how } => write!(f, "settle held #{pick} {how:?}"),
            Op::Renew { pick } => write!(f, "renew held #{pick}"),
            Op::Crash { pick } => write!(f, "crash holding held #{pick}"),
            Op::Cancel { pick } => write!(f, "cancel published #{pick}"),
            Op::Replay { pick } => write!(f, "replay dead #{pick}"),
            Op::Sleep(d) => write!(f, "time passes {}", ms(*d)),
            Op::Stats => write!(f, "stats"),
            Op::Junk { pick, id } => write!(f, "hand edit: junk kind #{pick} ({id})"),
            Op::Restart { id, down } => write!(
                f,
                "server restart, down for {} (publish {id} while down)",
                ms(*down)
            ),
        }
    }
}

/// A sequence of `len` steps drawn from `seed`. `live`: on a real clock (delays and sleeps in
/// hundreds of milliseconds, fewer of them).
pub(super) fn generate(seed: u64, len: usize) -> Vec<Op> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut ops = Vec::with_capacity(len);
    for step in 0..len {
        let id = format!("j{step}");
        let roll = rng.u32(0..100);
        let op = match roll {
            0..=24 => Op::Publish {
                id,
                delay: delay(&mut rng),
                priority: Priority::ALL[rng.usize(0..Priority::ALL.len())],
            },
            25..=27 => Op::PublishDup {
                pick: rng.usize(0..64),
            },
            28..=34 => Op::PublishUnique {
                id,
                key: ['a', 'b'][rng.usize(0..2)],
                window: Duration::from_millis([0, 400, 2000][rng.usize(0..3)]),
                delay: delay(&mut rng),
            },
            35..=39 => Op::PublishIn {
                id,
                key: if rng.bool() {
                    Some(['a', 'b'][rng.usize(0..2)])
                } else {
                    None
                },
                commit: rng.u8(0..4) != 0,
            },
            40..=41 => Op::PublishHuge {
                id,
                headers: [50, 5_000][rng.usize(0..2)],
            },
            42..=59 => Op::Claim {
                max: rng.usize(1..=5),
            },
            60..=74 => Op::Settle {
                pick: rng.usize(0..64),
                how: how(&mut rng),
            },
            75..=77 => Op::Renew {
                pick: rng.usize(0..64),
            },
            78..=81 => Op::Crash {
                pick: rng.usize(0..64),
            },
            82..=86 => Op::Cancel {
                pick: rng.usize(0..64),
            },
            87..=89 => Op::Replay {
                pick: rng.usize(0..64),
            },
            90..=94 => Op::Sleep(Duration::from_millis(100 * rng.u64(1..=8))),
            // A restart takes the place of a stats step (no draw of its own), so that the
            // other steps of every seed stay as they were before it was added.
            95 => Op::Stats,
            // Down for no time, or longer than the model's leases (1 s): every lease held
            // lapses, and delayed jobs come due, while the server is away.
            96 => Op::Restart {
                id: format!("down{step}"),
                down: Duration::from_millis([0, 1500][rng.usize(0..2)]),
            },
            _ => Op::Junk {
                pick: rng.usize(0..64),
                id: format!("junk-{step}"),
            },
        };
        ops.push(op);
    }
    ops
}

/// A publish's delay: none half the time, else 100 ms to 1.2 s.
fn delay(rng: &mut fastrand::Rng) -> Duration {
    match rng.u8(0..4) {
        0 | 1 => Duration::ZERO,
        _ => Duration::from_millis(100 * rng.u64(1..=12)),
    }
}

/// A settlement's outcome, each equally likely.
fn how(rng: &mut fastrand::Rng) -> How {
    match rng.u8(0..5) {
        0 => How::Ack,
        1 => How::Drop,
        2 => How::RetryNow,
        3 => How::RetryAfter(Duration::from_millis(100 * rng.u64(1..=10))),
        _ => How::DeadLetter,
    }
}
