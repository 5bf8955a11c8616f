//! The conformance suite every broker runs (feature `conformance`).
//!
//! One set of behavioural tests, written once against the [`Broker`](crate::Broker) contract and the runtime's
//! outcome rules (what each handler outcome does to a job: ack, retry, drop, dead letter, and the caps and backoff that decide between them), that every backend runs unchanged: the in-memory
//! broker on the harness's paused clock ([`TestApp::start`]), Redis and SQL against real servers
//! on the real clock ([`TestApp::start_live`]). A backend provides a [`Fixture`] and invokes
//! [`conformance_tests!`](crate::conformance_tests) once; each row becomes a `#[tokio::test]`
//! named after the behaviour it checks.
//!
//! [`TestApp::start`]: crate::testing::TestApp::start
//! [`TestApp::start_live`]: crate::testing::TestApp::start_live
//!
//! ```ignore
//! use std::time::Duration;
//! use stagedoor_jobs::MemoryBroker;
//! use stagedoor_jobs::conformance::Fixture;
//!
//! struct MemoryFixture;
//!
//! impl Fixture for MemoryFixture {
//!     type Broker = MemoryBroker;
//!     async fn broker(&self) -> MemoryBroker {
//!         MemoryBroker::new()
//!     }
//!     async fn broker_with_lease(&self, lease: Duration) -> MemoryBroker {
//!         MemoryBroker::with_lease(lease)
//!     }
//!     fn paused(&self) -> bool {
//!         true
//!     }
//! }
//!
//! stagedoor_jobs::conformance_tests!(MemoryFixture);
//! ```
//!
//! Every test works in both modes: delays are a few hundred milliseconds, and "not before `d`"
//! is checked right after publishing (the job is delayed, the handler has not run) and then
//! after `advance(d + margin)`, never with a tighter timing than the semantics promise. A few
//! tests (leases, shutdown) wait out a short lease on the real clock in both modes.
//!
//! Each test uses queues of its own (named `cf_<row>`); a fixture on a shared server namespaces
//! them so that parallel tests and repeated runs do not meet. Dead letters are always named
//! with [`DeadLetters::default_dead_letter`](crate::DeadLetters::default_dead_letter), so the names are valid on every backend.
//!
//! The rows live in one file per area, all re-exported here (the macro calls them as
//! `conformance::<row>`):
//!
//! - `outcomes.rs`: what each handler outcome does to its job (ack, `Ok(())`, retry with and
//!   without a backoff, `retry_after`, drop, an error and its source chain, a panic) and
//!   attempt numbering;
//! - `caps_and_dead_letters.rs`: the cap and when a job goes to its dead letter (delayed
//!   retries, undecodable payloads, unknown kinds, claims beyond the cap, unreadable jobs), the
//!   uncapped backoff floor, the attempts a dead letter reports;
//! - `replay.rs`: listing, replaying and purging dead letters, and a replay that skips a letter
//!   whose job is back in its queue;
//! - `publish.rs`: delayed publishes, job ids and duplicates, publishing on a paused app,
//!   `publish_once`;
//! - `crash_and_lease.rs`: concurrency, shutdown, abandoned jobs, leases and their fence;
//! - `headers_and_stats.rs`: the request id and trace, the queue stats;
//! - `cancel.rs`: cancelling waiting, delayed and running jobs;
//! - `priority.rs`: priorities: highest first, FIFO among equals, kept through a delay, a retry
//!   and a replay; no level starved;
//! - `records.rs`: records (results' and progress' store): compare-and-set, all-or-nothing
//!   writes, a time to live, bounds and hostile keys, racing writers;
//! - `results.rs`: results and progress: kept and read by id, past the size limit, gone after
//!   the retention, progress while the job runs, waiting for a result;
//! - `flows.rs`: flows and batches: dependency order with fan-out and fan-in, a failed
//!   parent under each policy, a job whose node is done not run again, a batch's callbacks
//!   once, a flow published all or nothing;
//! - `unique.rs`: unique jobs, their window, racing publishes, keys by payload;
//! - `limits.rs`: permit pools, global concurrency across workers, rate limits;
//! - `bounds.rs`: values at their bounds: delays past `MAX_DELAY`, leases, queue names,
//!   unique windows;
//! - `activity.rs`: workers' reports and their time to live, per-minute counts, delayed jobs;
//! - `model.rs` (and `model/`): [`run_model`], the model-based random test of the broker
//!   contract each backend runs from its own test file (`tests/model_*.rs`);
//! - `runtime_rules.rs`: the runtime's rules on a backend that only reports what it knows (a
//!   job arriving with its cap spent, a job delivered past the poison count, an unreadable
//!   item's dead letter, the fair turn);
//! - `naive.rs`: [`NaiveBroker`], a broker for tests that knows none of those rules, which
//!   passes them all (`tests/conformance_naive.rs`);
//! - `fixture.rs`: [`Fixture`], what a backend provides to run the suite.
//! - `support.rs`: what the rows share (timings, the test job, the probe, the handlers).

mod activity;
mod bounds;
mod cancel;
mod caps_and_dead_letters;
mod crash_and_lease;
mod fixture;
mod flows;
mod headers_and_stats;
mod limits;
mod model;
mod naive;
mod outcomes;
mod priority;
mod publish;
mod records;
mod replay;
mod results;
mod runtime_rules;
mod support;
mod unique;

pub use activity::{
    delayed_lists_future_jobs_soonest_first, reported_counts_add_up_per_queue_and_minute,
    worker_report_not_renewed_within_its_ttl_is_gone, worker_reports_are_listed_and_replaced,
};
pub use bounds::{
    a_bad_queue_name_is_refused_at_startup_and_at_publish,
    a_huge_delay_is_published_at_the_longest_delay,
    a_huge_retry_after_is_kept_at_the_longest_delay, a_lease_out_of_bounds_is_refused_at_startup,
    a_unique_window_past_the_bound_keeps_the_job_unique,
};
pub use cancel::{
    cancel_of_a_running_job_fires_its_cancellation, cancel_removes_waiting_and_delayed_jobs,
};
pub use caps_and_dead_letters::{
    a_job_that_cannot_be_read_is_dead_lettered_alone, cap_reached_moves_the_job_to_its_dead_letter,
    dead_letter_reports_attempts_spent, delayed_retries_count_against_the_cap,
    job_claimed_beyond_its_cap_is_dead_lettered_without_running,
    uncapped_mount_retries_no_faster_than_the_floor,
    undecodable_payload_fails_attempts_until_the_cap,
    undecodable_payload_is_dead_lettered_at_once_when_asked,
    unknown_kind_goes_to_the_default_dead_letter,
};
pub use crash_and_lease::{
    abandoned_job_comes_back_when_advancing_past_its_lease, concurrency_limit_is_respected,
    job_abandoned_at_shutdown_comes_back_after_its_lease, settlement_after_a_lost_lease_is_fenced,
    shutdown_lets_running_handlers_finish, waiting_for_a_mount_slot_keeps_the_lease,
};
pub use flows::{
    a_batch_calls_back_once_with_its_counts,
    a_batch_settled_by_two_workers_at_once_calls_back_once,
    a_cancelled_flow_job_counts_as_failed_for_its_children,
    a_dead_lettered_parent_skips_runs_or_holds_its_children,
    a_flow_runs_in_dependency_order_with_fan_out_and_fan_in,
    a_job_whose_node_is_done_is_not_run_again, publishing_a_flow_is_all_or_nothing,
};
pub use headers_and_stats::{
    request_id_and_trace_reach_the_handler_and_the_dead_letter,
    stats_never_count_a_due_job_as_delayed,
};
pub use limits::{
    global_concurrency_holds_across_workers, permits_hold_a_pool_to_its_limit,
    rate_limit_starts_no_more_than_its_rate_per_period,
};
pub use outcomes::{
    ack_removes_the_job, attempts_count_up_and_the_job_id_stays,
    drop_leaves_the_queue_without_a_dead_letter, error_keeps_its_message_and_source_chain,
    ok_unit_result_acks, panic_is_a_failed_attempt_and_the_worker_lives_on,
    retry_after_overrides_the_backoff_durably, retry_waits_for_the_mount_backoff,
    retry_without_backoff_comes_back_at_once,
};
pub use priority::{
    no_priority_starves_under_a_flood_of_higher_ones,
    priority_claims_higher_first_and_fifo_among_equals,
};
pub use publish::{
    delayed_publish_runs_after_its_delay, duplicate_publishes_are_reported_not_stored,
    job_id_published_while_running_is_not_added, paused_publish_returns_once_the_job_has_settled,
    publish_at_runs_at_its_time, publish_once_stores_a_job_once_per_guard,
    published_id_is_the_handlers_and_the_dead_letters, same_job_id_published_twice_runs_once,
};
pub use records::{
    concurrent_compare_and_set_lets_one_writer_win, record_keys_and_values_at_their_bounds,
    record_writes_are_all_or_nothing, records_compare_and_set_by_version,
    records_expire_after_their_ttl,
};
pub use replay::{
    dead_letter_purge_removes_the_selected, dead_letter_replay_by_id_resets_the_attempts,
    dead_letter_replay_by_kind_moves_only_that_kind,
    dead_letters_are_listed_newest_first_and_by_kind,
    replay_and_purge_refuse_a_name_that_is_no_dead_letter,
    replay_skips_a_letter_whose_job_is_back_in_its_queue,
};
pub use results::{
    a_result_is_kept_and_read_by_id, a_result_past_the_limit_reads_as_too_large,
    progress_is_read_while_the_job_runs, results_past_retention_are_gone,
};
pub use runtime_rules::{
    a_job_arriving_with_its_cap_spent_is_dead_lettered_without_running,
    a_job_delivered_past_the_poison_count_is_dead_lettered_without_running,
    an_unreadable_item_goes_raw_to_its_mounts_dead_letter,
    every_fair_turn_of_the_runtime_claims_in_due_order,
};
pub use unique::{
    unique_by_payload_stores_a_message_once, unique_job_is_held_until_its_window_after_it_finished,
    unique_publishes_at_once_store_one_job,
};

pub use fixture::{Fixture, Junk, Outage};
pub use model::{ModelRun, run_model};
pub use naive::{NaiveBroker, NaiveReceipt};

/// Runs the whole conformance suite against a [`Fixture`]: one
/// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` per row, named after the row's
/// function in [`conformance`](crate::conformance), each calling it with `$fixture` (evaluated
/// once per test).
///
/// Attributes written after the fixture and a comma are put on every generated test:
/// `conformance_tests!(RedisFixture, #[ignore = "needs a server"])`. The invoking crate depends
/// on `tokio` with the `macros` and `rt-multi-thread` features. To run the suite for several
/// fixtures in one file, invoke it once inside a `mod` per fixture.
///
/// ```ignore
/// stagedoor_jobs::conformance_tests!(MemoryFixture);
/// ```
#[macro_export]
macro_rules! conformance_tests {
    (@one [$(#[$attr:meta])*] ($fixture:expr) $name:ident) => {
        $(#[$attr])*
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $crate::conformance::$name($fixture).await;
        }
    };
    (@rows $attrs:tt ($fixture:expr)) => {};
    (@rows $attrs:tt ($fixture:expr) $name:ident $($rest:ident)*) => {
        $crate::conformance_tests!(@one $attrs ($fixture) $name);
        $crate::conformance_tests!(@rows $attrs ($fixture) $($rest)*);
    };
    (@all $attrs:tt ($fixture:expr)) => {
        $crate::conformance_tests!(@rows $attrs ($fixture)
            ack_removes_the_job
            ok_unit_result_acks
            retry_without_backoff_comes_back_at_once
            retry_waits_for_the_mount_backoff
            retry_after_overrides_the_backoff_durably
            drop_leaves_the_queue_without_a_dead_letter
            error_keeps_its_message_and_source_chain
            panic_is_a_failed_attempt_and_the_worker_lives_on
            attempts_count_up_and_the_job_id_stays
            cap_reached_moves_the_job_to_its_dead_letter
            delayed_retries_count_against_the_cap
            undecodable_payload_fails_attempts_until_the_cap
            undecodable_payload_is_dead_lettered_at_once_when_asked
            unknown_kind_goes_to_the_default_dead_letter
            concurrency_limit_is_respected
            shutdown_lets_running_handlers_finish
            job_abandoned_at_shutdown_comes_back_after_its_lease
            job_claimed_beyond_its_cap_is_dead_lettered_without_running
            settlement_after_a_lost_lease_is_fenced
            delayed_publish_runs_after_its_delay
            publish_at_runs_at_its_time
            same_job_id_published_twice_runs_once
            job_id_published_while_running_is_not_added
            dead_letters_are_listed_newest_first_and_by_kind
            dead_letter_replay_by_id_resets_the_attempts
            dead_letter_replay_by_kind_moves_only_that_kind
            dead_letter_purge_removes_the_selected
            replay_and_purge_refuse_a_name_that_is_no_dead_letter
            request_id_and_trace_reach_the_handler_and_the_dead_letter
            stats_never_count_a_due_job_as_delayed
            abandoned_job_comes_back_when_advancing_past_its_lease
            replay_skips_a_letter_whose_job_is_back_in_its_queue
            waiting_for_a_mount_slot_keeps_the_lease
            published_id_is_the_handlers_and_the_dead_letters
            duplicate_publishes_are_reported_not_stored
            paused_publish_returns_once_the_job_has_settled
            a_job_that_cannot_be_read_is_dead_lettered_alone
            dead_letter_reports_attempts_spent
            uncapped_mount_retries_no_faster_than_the_floor
            publish_once_stores_a_job_once_per_guard
            worker_reports_are_listed_and_replaced
            worker_report_not_renewed_within_its_ttl_is_gone
            reported_counts_add_up_per_queue_and_minute
            delayed_lists_future_jobs_soonest_first
            permits_hold_a_pool_to_its_limit
            global_concurrency_holds_across_workers
            rate_limit_starts_no_more_than_its_rate_per_period
            unique_job_is_held_until_its_window_after_it_finished
            unique_publishes_at_once_store_one_job
            unique_by_payload_stores_a_message_once
            cancel_removes_waiting_and_delayed_jobs
            cancel_of_a_running_job_fires_its_cancellation
            priority_claims_higher_first_and_fifo_among_equals
            no_priority_starves_under_a_flood_of_higher_ones
            a_huge_retry_after_is_kept_at_the_longest_delay
            a_huge_delay_is_published_at_the_longest_delay
            a_lease_out_of_bounds_is_refused_at_startup
            a_bad_queue_name_is_refused_at_startup_and_at_publish
            a_unique_window_past_the_bound_keeps_the_job_unique
            a_job_arriving_with_its_cap_spent_is_dead_lettered_without_running
            a_job_delivered_past_the_poison_count_is_dead_lettered_without_running
            an_unreadable_item_goes_raw_to_its_mounts_dead_letter
            every_fair_turn_of_the_runtime_claims_in_due_order
            records_compare_and_set_by_version
            record_writes_are_all_or_nothing
            records_expire_after_their_ttl
            record_keys_and_values_at_their_bounds
            concurrent_compare_and_set_lets_one_writer_win
            a_result_is_kept_and_read_by_id
            a_result_past_the_limit_reads_as_too_large
            results_past_retention_are_gone
            progress_is_read_while_the_job_runs
            a_flow_runs_in_dependency_order_with_fan_out_and_fan_in
            a_dead_lettered_parent_skips_runs_or_holds_its_children
            a_job_whose_node_is_done_is_not_run_again
            a_batch_calls_back_once_with_its_counts
            publishing_a_flow_is_all_or_nothing
            a_batch_settled_by_two_workers_at_once_calls_back_once
            a_cancelled_flow_job_counts_as_failed_for_its_children
        );
    };
    ($fixture:expr $(,)?) => {
        $crate::conformance_tests!(@all [] ($fixture));
    };
    ($fixture:expr, $(#[$attr:meta])+ $(,)?) => {
        $crate::conformance_tests!(@all [$(#[$attr])+] ($fixture));
    };
}
