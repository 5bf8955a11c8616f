//! The bounds every backend shares: the attempt counter's top, the lease's default and its
//! limits, and what a queue (or dead letter) name may be.

use std::time::Duration;

/// The highest attempt number any backend counts to. The counter saturates here on every
/// backend, so it fits the smallest attempt column the SQL derive accepts (`SMALLINT`, `i16`) and
/// can never overflow a column or stop a claim; a cap (`max_attempts`) above it could never be
/// reached and is refused at startup.
pub const MAX_ATTEMPT: u32 = 32_767;

/// The lease of the backends here unless configured: a claimed job not renewed within it is
/// claimable again. The runtime renews what it holds every third of it (1 s), so a worker
/// killed with jobs in hand gives them back within about 3 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(3);

/// The shortest lease a service starts with: 100 ms. A shorter one (zero) would have a job
/// claimed again while its handler runs, and run twice.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// The longest lease a service starts with: one day. The runtime renews a lease every third of
/// it, so a long handler needs no long lease; a longer one would keep the jobs of a worker that
/// died from running again for that long.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest queue (or dead letter) name, in bytes: 200.
pub const MAX_QUEUE_NAME_LEN: usize = 200;

/// What is wrong with `queue` as a queue or dead letter name on any backend, with the fix: an empty
/// name, a NUL, or a name longer than [`MAX_QUEUE_NAME_LEN`] bytes.
/// [`Broker::queue_name_problem`](super::Broker::queue_name_problem) adds what a backend refuses
/// besides.
pub fn queue_name_problem(queue: &str) -> Option<String> {
    if queue.is_empty() {
        Some("the queue name is empty: name the queue, such as `emails`".to_owned())
    } else if queue.contains('\0') {
        Some(format!(
            "the queue name {queue:?} holds a NUL character, which backends cannot store: remove it"
        ))
    } else if queue.len() > MAX_QUEUE_NAME_LEN {
        Some(format!(
            "the queue name `{}…` is {} bytes long, more than the {MAX_QUEUE_NAME_LEN} a queue name may have (stagedoor_jobs::broker::MAX_QUEUE_NAME_LEN): shorten it",
            queue.chars().take(40).collect::<String>(),
            queue.len()
        ))
    } else {
        None
    }
}
