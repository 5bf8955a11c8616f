//! What the fuzzers found, one test each, with the input that found it. A finding still open
//! is `#[ignore]`d with its number in `fuzz/README.md` (Findings), and its target skips it so
//! that the fuzzer looks for new ones: `cargo test -p stagedoor-jobs-fuzz --test findings --
//! --ignored` shows which are still open (they fail). Once fixed, drop the `ignore` and the skip.

use chrono::{DateTime, Utc};
use stagedoor_jobs::{Envelope, JobId};
use stagedoor_jobs_redis::__fuzz as r;

fn published(kind: &str, id: &str) -> Envelope {
    Envelope::new(kind, b"{}".to_vec(), DateTime::<Utc>::UNIX_EPOCH).with_id(JobId::from_string(id))
}

/// Finding 1 (redis_entry, round trip). A job published with an empty kind (`Job::kind("")`,
/// which every publish accepts) is stored with `kind` empty, and the claim dead-letters it as
/// malformed with "the entry has no `kind` field", which it has. Either the publish refuses an
/// empty kind with an error naming the fix, or the claim delivers it as it was published.
#[test]
#[ignore = "finding 1, open: see fuzz/README.md"]
fn a_job_published_with_an_empty_kind_reads_back_as_published() {
    let env = published("", "j-1");
    let back = r::decode(&r::encode(&env, 0), 1, DateTime::<Utc>::UNIX_EPOCH);
    assert_eq!(back, Ok(env.with_attempt(1)));
}

/// Finding 2 (redis_entry, round trip). A job published with an empty id
/// (`Job::id(JobId::from_string(""))`, accepted) is delivered, retried and dead-lettered under
/// another id (its entry's): the publisher's id is lost. Either the publish refuses an empty id,
/// or the claim keeps it.
#[test]
#[ignore = "finding 2, open: see fuzz/README.md"]
fn a_job_published_with_an_empty_id_reads_back_as_published() {
    let env = published("k", "");
    let back = r::decode(&r::encode(&env, 0), 1, DateTime::<Utc>::UNIX_EPOCH);
    assert_eq!(back, Ok(env.with_attempt(1)));
}

/// The fuzz target skips exactly the open findings: a job with a kind and an id round-trips.
#[test]
fn a_job_with_a_kind_and_an_id_round_trips() {
    let env = published("k", "j-1");
    assert!(!stagedoor_jobs_fuzz::redis::known_round_trip_finding(&env));
    let back = r::decode(&r::encode(&env, 0), 1, DateTime::<Utc>::UNIX_EPOCH);
    assert_eq!(back, Ok(env.with_attempt(1)));
}

/// Finding 3 (cron, hang: AFL's input was mode 0, zone UTC, time 1764411295, `", 3 * * *"`).
/// A cron expression whose minute field is a lone comma parses (an empty list), matches no
/// minute, and the search for its next tick walks until croner's limits: the startup check took
/// 1.5 s (release build; 4-18 s under AFL on the shared machine), and then says "never fires
/// ... check its day and month fields", naming the wrong fields. Either such an expression is
/// refused as not parsing (naming the empty list item), or the search is bounded.
#[test]
#[ignore = "finding 3, open: see fuzz/README.md"]
fn a_cron_field_that_is_a_lone_comma_is_refused_at_once() {
    use stagedoor_jobs::Schedule;
    let s = Schedule::cron("s", ", 3 * * *").on("jobs");
    let started = std::time::Instant::now();
    let problems = stagedoor_jobs::__fuzz::schedule_problems(&s);
    let took = started.elapsed();
    println!("{problems:?} in {took:?}");
    assert!(
        took < std::time::Duration::from_secs(1),
        "the startup check took {took:?}: {problems:?}"
    );
    assert!(
        !problems.is_empty(),
        "an expression that never fires is a problem"
    );
    assert!(
        !problems[0].message.contains("day and month"),
        "the minute field is the one at fault: {problems:?}"
    );
    let t = DateTime::<Utc>::from_timestamp(1_764_411_295, 0).unwrap_or_default();
    assert!(stagedoor_jobs_fuzz::cron::known_finding(", 3 * * *"));
    assert!(!stagedoor_jobs_fuzz::cron::known_finding("0,30 3 * * *"));
    let started = std::time::Instant::now();
    let next = s.next_after(t);
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(1),
        "the next tick after {t}: {next:?} took {took:?}"
    );
}
