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

/// Finding 1 (redis_entry, round trip), fixed. A job published with an empty kind
/// (`Job::kind("")`) was stored with `kind` empty, and the claim dead-lettered it as malformed
/// with "the entry has no `kind` field". Now every publish refuses it, naming the kind (the
/// conformance row `a_bad_queue_name_is_refused_at_startup_and_at_publish` checks it on every
/// backend); an entry so stored by another tool is still dead-lettered alone.
#[test]
fn a_job_with_an_empty_kind_is_refused_at_publish() {
    let job = stagedoor_jobs::Job::new("jobs", &1u8)
        .expect("encodes")
        .kind("");
    let refused = publish(job);
    assert!(
        matches!(&refused, Err(stagedoor_jobs::BrokerError::Invalid(m)) if m.contains("kind")),
        "{refused:?}"
    );
}

/// Finding 2 (redis_entry, round trip), fixed. A job published with an empty id was delivered
/// under another id (its entry's): the publisher's id was lost. Now every publish refuses it.
#[test]
fn a_job_with_an_empty_id_is_refused_at_publish() {
    let job = stagedoor_jobs::Job::new("jobs", &1u8)
        .expect("encodes")
        .id(JobId::from_string(""));
    let refused = publish(job);
    assert!(
        matches!(&refused, Err(stagedoor_jobs::BrokerError::Invalid(m)) if m.contains("id")),
        "{refused:?}"
    );
}

fn publish(
    job: stagedoor_jobs::Job,
) -> Result<stagedoor_jobs::broker::Published, stagedoor_jobs::BrokerError> {
    use stagedoor_jobs::{Inspect, Publish};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let b = stagedoor_jobs::MemoryBroker::new();
        b.connect().await.expect("connect");
        b.publish_job(job).await
    })
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
    let started = std::time::Instant::now();
    let next = s.next_after(t);
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(1),
        "the next tick after {t}: {next:?} took {took:?}"
    );
}
