//! Each fuzz target over its committed corpus (`fuzz/corpus/<target>/`), then over random
//! mutations of it: a fixed number (a second or so, in the workspace's `cargo test`), or for
//! `STAGEDOOR_FUZZ_SECS` seconds per target (`scripts/test-all`'s fuzz step: 5). The seed of
//! the mutations is `STAGEDOOR_FUZZ_SEED`, random unless set, printed either way. The
//! coverage-guided runs are AFL++'s (`fuzz/README.md`).

use std::time::Duration;

fn budget() -> Duration {
    let secs = std::env::var("STAGEDOOR_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    Duration::from_secs_f64(secs)
}

fn seed() -> u64 {
    std::env::var("STAGEDOOR_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..))
}

fn replay(name: &str, min_runs: usize) {
    let target = stagedoor_jobs_fuzz::target(name).expect("a target of that name");
    let seed = seed();
    let (files, runs) =
        stagedoor_jobs_fuzz::run::replay_and_mutate(name, target, budget(), min_runs, seed);
    println!("{name}: {files} corpus files, then {runs} mutations (STAGEDOOR_FUZZ_SEED={seed})");
    assert!(files > 0, "fuzz/corpus/{name}/ holds no inputs");
}

#[test]
fn redis_entry() {
    replay("redis_entry", 1_000);
}

#[test]
fn redis_member() {
    replay("redis_member", 1_000);
}

#[test]
fn redis_reply() {
    replay("redis_reply", 1_000);
}

#[test]
fn sql_headers() {
    replay("sql_headers", 1_000);
}

#[test]
fn dashboard() {
    replay("dashboard", 50);
}

#[test]
fn cron() {
    replay("cron", 200);
}
