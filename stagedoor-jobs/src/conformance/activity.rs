//! Activity: what services report through the backend and what a dashboard reads back (the
//! workers' reports and their time to live, the per-minute counts, the delayed jobs).
//!
//! These rows call the broker directly, on the real clock: the in-memory broker reads the
//! system clock until a test harness gives it its own, so a short time to live runs out the
//! same way on every backend.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::fixture::Fixture;
use super::support::{connected, job};
use crate::activity::{
    MinuteCounts, QueueCounts, ScheduleReport, WorkerQueue, WorkerReport, minute_of,
};
use crate::broker::Activity;
use crate::broker::{Broker, Settlement};
use crate::clock::chrono_duration;
use crate::outcome::{Failure, FailureCause};

/// A time to live that does not run out during a row.
const LONG_TTL: Duration = Duration::from_secs(60);

/// The prefix of this row's worker ids, which no other test's reports share (servers are
/// shared): `<prefix>_1`, `<prefix>_2`.
fn worker_prefix(row: &str) -> String {
    format!("cf_{row}_{}", crate::JobId::new().as_str())
}

/// The workers listed whose id starts with `prefix`.
async fn listed<B: Activity>(broker: &B, prefix: &str) -> Vec<WorkerReport> {
    broker
        .workers()
        .await
        .unwrap_or_else(|e| panic!("workers() should answer: {e}"))
        .into_iter()
        .filter(|w| w.id.starts_with(prefix))
        .collect()
}

/// A report with one queue and one schedule, every field set.
fn full_report(id: &str, now: DateTime<Utc>) -> WorkerReport {
    let mut report = WorkerReport::new(id, "host-a", 4242, now - chrono::Duration::hours(1), now);
    report.app = "conformance 1.2.3".to_owned();
    let mut queue = WorkerQueue::new("cf_activity", 8, 3);
    queue.subscribers = vec!["send_email".to_owned(), "send_sms".to_owned()];
    report.queues = vec![queue];
    let mut schedule = ScheduleReport::new("nightly", "cf_activity", "0 3 * * * (UTC)", "run once");
    schedule.last_tick = Some(now - chrono::Duration::hours(5));
    schedule.next_tick = Some(now + chrono::Duration::hours(19));
    report.schedules = vec![schedule];
    report
}

async fn report<B: Activity>(
    broker: &B,
    worker: &WorkerReport,
    counts: &[QueueCounts],
    ttl: Duration,
) {
    broker
        .report(worker, counts, ttl)
        .await
        .unwrap_or_else(|e| panic!("report() should store the report: {e}"));
}

/// A worker's report is listed by `workers()` as it was sent (every field), and the next
/// report of the same id replaces it; reports of other ids are listed beside it, by id.
pub async fn worker_reports_are_listed_and_replaced<F: Fixture>(fixture: F) {
    let direct = connected(&fixture.broker().await).await;
    let now = direct.clock().now();
    let prefix = worker_prefix("replaced");
    let a = format!("{prefix}_1");
    assert_eq!(listed(&direct, &prefix).await, [], "nothing reported yet");

    let first = full_report(&a, now);
    report(&direct, &first, &[], LONG_TTL).await;
    assert_eq!(
        listed(&direct, &prefix).await,
        std::slice::from_ref(&first),
        "the report as it was sent"
    );

    let mut second = first.clone();
    second.heartbeat_at = now + chrono::Duration::seconds(5);
    second.queues[0].in_flight = 7;
    second.schedules.clear();
    report(&direct, &second, &[], LONG_TTL).await;
    assert_eq!(
        listed(&direct, &prefix).await,
        [second.clone()],
        "the next report of the same id replaces the first"
    );

    let b = format!("{prefix}_2");
    let other = WorkerReport::new(&b, "host-b", 7, now, now);
    report(&direct, &other, &[], LONG_TTL).await;
    assert_eq!(
        listed(&direct, &prefix).await,
        [second, other],
        "two workers, by id"
    );
}

/// A report not renewed within its time to live is gone; one renewed in time stays.
pub async fn worker_report_not_renewed_within_its_ttl_is_gone<F: Fixture>(fixture: F) {
    const TTL: Duration = Duration::from_secs(2);
    let direct = connected(&fixture.broker().await).await;
    let now = direct.clock().now();
    let prefix = worker_prefix("ttl");
    let a = format!("{prefix}_1");
    let b = format!("{prefix}_2");
    let report_a = WorkerReport::new(&a, "host-a", 1, now, now);
    report(&direct, &report_a, &[], TTL).await;
    report(
        &direct,
        &WorkerReport::new(&b, "host-b", 2, now, now),
        &[],
        TTL,
    )
    .await;
    assert_eq!(listed(&direct, &prefix).await.len(), 2, "both are listed");

    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = direct.clock().now();
    let renewed = WorkerReport::new(&b, "host-b", 2, now, later);
    report(&direct, &renewed, &[], TTL).await;

    // `a` ran out at 2 s; `b`, renewed at 1 s, runs until 3 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        listed(&direct, &prefix).await,
        [renewed],
        "the report not renewed within its ttl is gone, the renewed one stays"
    );
}

/// Counts of two reports add up per queue and minute; `throughput(q, since)` lists the
/// minutes of `q` from the one holding `since` on, oldest first, without earlier minutes,
/// other queues or minutes with nothing counted.
pub async fn reported_counts_add_up_per_queue_and_minute<F: Fixture>(fixture: F) {
    const Q: &str = "cf_counts";
    const OTHER: &str = "cf_counts_other";
    let direct = connected(&fixture.broker().await).await;
    let now = direct.clock().now();
    let m0 = minute_of(now) - chrono::Duration::minutes(10);
    let at = |m: i64| m0 + chrono::Duration::minutes(m);
    let earlier = at(-5);
    let prefix = worker_prefix("counts");
    let a = WorkerReport::new(format!("{prefix}_1"), "host-a", 1, now, now);
    let b = WorkerReport::new(format!("{prefix}_2"), "host-b", 2, now, now);

    // Counted within the minute (seconds in): stored under the minute's start.
    report(
        &direct,
        &a,
        &[
            QueueCounts::new(
                Q,
                vec![
                    MinuteCounts::new(earlier, 9, 9, 9),
                    MinuteCounts::new(at(0) + chrono::Duration::seconds(12), 3, 1, 0),
                    MinuteCounts::new(at(1), 2, 0, 0),
                ],
            ),
            QueueCounts::new(OTHER, vec![MinuteCounts::new(at(0), 7, 7, 7)]),
        ],
        LONG_TTL,
    )
    .await;
    report(
        &direct,
        &b,
        &[QueueCounts::new(
            Q,
            vec![
                MinuteCounts::new(at(1) + chrono::Duration::seconds(59), 1, 2, 1),
                MinuteCounts::new(at(2), 0, 0, 0),
                MinuteCounts::new(at(3), 0, 4, 4),
            ],
        )],
        LONG_TTL,
    )
    .await;

    let since = at(0) + chrono::Duration::seconds(30);
    let got = direct.throughput(Q, since).await.expect("throughput");
    assert_eq!(
        got,
        [
            MinuteCounts::new(at(0), 3, 1, 0),
            MinuteCounts::new(at(1), 3, 2, 1),
            MinuteCounts::new(at(3), 0, 4, 4),
        ],
        "from the minute holding `since`, added up, oldest first, empty minutes left out"
    );
    for m in &got {
        assert_eq!(m.minute, minute_of(m.minute), "a minute's start: {m:?}");
    }
    let all = direct.throughput(Q, earlier).await.expect("throughput");
    assert_eq!(
        all.first(),
        Some(&MinuteCounts::new(earlier, 9, 9, 9)),
        "the earlier minute is kept: {all:?}"
    );
    assert_eq!(all.len(), 4, "{all:?}");
    assert_eq!(
        direct.throughput(OTHER, at(0)).await.expect("throughput"),
        [MinuteCounts::new(at(0), 7, 7, 7)],
        "the other queue keeps its own counts"
    );
    assert_eq!(
        direct
            .throughput("cf_counts_never", earlier)
            .await
            .expect("throughput"),
        [],
        "a queue nothing was counted for"
    );
}

/// Publishes `j` straight to `broker`, stamped at the broker's time; returns its id.
async fn publish_direct<B: Broker>(broker: &B, j: crate::Job) -> String {
    let queue = j.queue().to_owned();
    let (_, envelope, at) = j.into_parts(broker.clock().now());
    let id = envelope.id().to_string();
    broker
        .publish(&queue, vec![(envelope, at)])
        .await
        .expect("publish");
    id
}

/// Claims the one due job of `queue`, which must be `id`, and settles it as a retry in
/// `delay`.
async fn claim_and_retry<B: Broker>(broker: &B, queue: &str, id: &str, delay: Duration) {
    let mut claimed = broker
        .claim(
            queue,
            1,
            Duration::from_secs(2),
            crate::broker::ClaimOrder::Priority,
        )
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1, "the due job is claimed");
    let delivery = claimed.remove(0);
    assert_eq!(delivery.envelope.id().to_string(), id);
    let failure = Failure::new(FailureCause::Error, "try again", "");
    broker
        .settle(queue, &delivery, Settlement::Retry { delay, failure })
        .await
        .expect("settle");
}

/// `delayed(q, limit)` lists only the jobs of `q` due later than now (delayed publishes and
/// delayed retries), soonest first, at most `limit`, each with its id, kind, due time and the
/// attempt it will run as.
pub async fn delayed_lists_future_jobs_soonest_first<F: Fixture>(fixture: F) {
    const Q: &str = "cf_delayed_list";
    const OTHER: &str = "cf_delayed_other";
    let direct = connected(&fixture.broker().await).await;
    for q in [Q, OTHER] {
        direct.prepare(q).await.expect("prepare");
    }
    let now = direct.clock().now();
    let publish = |j: crate::Job| publish_direct(&direct, j);
    // A job to retry: claimed at once, then retried in 45 s (it runs again as attempt 2).
    let retried = publish(job(Q, 5)).await;
    claim_and_retry(&direct, Q, &retried, Duration::from_secs(45)).await;

    let due_now = publish(job(Q, 1)).await;
    let in_60 = publish(job(Q, 2).after(Duration::from_secs(60))).await;
    let in_30 = publish(job(Q, 3).after(Duration::from_secs(30))).await;
    let in_90 = publish(job(Q, 4).kind("other_kind").after(Duration::from_secs(90))).await;
    publish(job(OTHER, 6).after(Duration::from_secs(10))).await;

    let listed = direct.delayed(Q, 10).await.expect("delayed");
    let ids: Vec<&str> = listed.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            in_30.as_str(),
            retried.as_str(),
            in_60.as_str(),
            in_90.as_str()
        ],
        "soonest first, without the job due now ({due_now}) or the other queue's: {listed:?}"
    );
    let kinds: Vec<&str> = listed.iter().map(|d| d.kind.as_str()).collect();
    assert_eq!(kinds, [Q, Q, Q, "other_kind"]);
    let attempts: Vec<u32> = listed.iter().map(|d| d.attempt).collect();
    assert_eq!(attempts, [1, 2, 1, 1], "the retry runs as attempt 2");
    let close = |d: &crate::activity::DelayedJob, secs: i64| {
        let want = now + chrono::Duration::seconds(secs);
        (d.due - want).abs() < chrono_duration(Duration::from_secs(5))
    };
    assert!(close(&listed[0], 30), "{:?}", listed[0]);
    assert!(close(&listed[1], 45), "{:?}", listed[1]);
    assert!(close(&listed[2], 60), "{:?}", listed[2]);
    assert!(close(&listed[3], 90), "{:?}", listed[3]);

    let first_two = direct.delayed(Q, 2).await.expect("delayed");
    assert_eq!(first_two, listed[..2], "at most `limit`");
    assert_eq!(
        direct
            .delayed("cf_delayed_never", 10)
            .await
            .expect("delayed"),
        [],
        "a queue with no jobs"
    );
}
