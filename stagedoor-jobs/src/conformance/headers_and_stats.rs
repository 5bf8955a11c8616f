//! Headers and stats: the request id and the trace reach the handler and the dead letter, and
//! the queue stats never count a due job as delayed.

use super::fixture::Fixture;
use super::support::{Probe, assert_empty, connected, job, numbers, reads_headers, service, start};
use crate::Subscriber;
use crate::broker::Broker;
use crate::broker::{DeadLetters, Inspect};

/// The request id and the trace travel from the publisher into the handler
/// (`Ctx<keys::RequestId>`, `Ctx<keys::Trace>`) and into the dead letter.
pub async fn request_id_and_trace_reach_the_handler_and_the_dead_letter<F: Fixture>(fixture: F) {
    const Q: &str = "cf_headers";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, reads_headers).name("reads_headers"))
                .max_attempts(crate::nonzero!(1u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    app.publish(job(Q, 1).request_id("req-42").trace("trace-42"))
        .await
        .expect("publish");
    app.publish(job(Q, 2)).await.expect("publish");
    app.drain().await;

    let mut seen = probe.seen();
    seen.sort_by_key(|s| s.n);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].request_id.as_deref(), Some("req-42"));
    assert_eq!(seen[0].trace.as_deref(), Some("trace-42"));
    assert_eq!(seen[1].request_id, None, "no header, no value");
    assert_eq!(seen[1].trace, None);

    let letters = app.dead_letters(&dl).await;
    let with = letters
        .iter()
        .find(|d| numbers(std::slice::from_ref(d)) == [1])
        .expect("job 1 is dead-lettered");
    assert_eq!(
        with.envelope.headers().request_id.as_deref(),
        Some("req-42")
    );
    assert_eq!(with.envelope.headers().trace.as_deref(), Some("trace-42"));
    let without = letters
        .iter()
        .find(|d| numbers(std::slice::from_ref(d)) == [2])
        .expect("job 2 is dead-lettered");
    assert_eq!(without.envelope.headers().request_id, None);
    assert_eq!(without.envelope.headers().trace, None);
    assert_empty(&app, Q, "after the dead letters").await;
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Rows the current core fails (not yet in `conformance_tests!`): each names the bug it shows.
// Move a row into the macro's list once its bug is fixed.
// ---------------------------------------------------------------------------------------------

/// `QueueStats::delayed` counts only jobs waiting for a time in the future: while jobs without
/// a delay are being published, the stats never count one of them as delayed.
///
/// Not yet in [`conformance_tests!`](crate::conformance_tests): the in-memory broker reads its
/// clock before taking its lock in `stats`, so a job published (or a retry settled) between
/// the two looks delayed, and `TestApp::drain` on a live app can return before the job ran.
pub async fn stats_never_count_a_due_job_as_delayed<F: Fixture>(fixture: F) {
    const Q: &str = "cf_stats_due";
    const JOBS: u64 = 2_000;
    let direct = connected(&fixture.broker().await).await;
    direct.prepare(Q).await.expect("prepare");
    let publisher = tokio::spawn({
        let broker = direct.clone();
        async move {
            for n in 0..JOBS {
                let (_, envelope, at) = job(Q, n).into_parts(broker.clock().now());
                broker
                    .publish(Q, vec![(envelope, at)])
                    .await
                    .expect("publish");
            }
        }
    });
    let mut wrong = Vec::new();
    while !publisher.is_finished() {
        let stats = direct.stats(Q).await.expect("stats");
        if stats.delayed > 0 {
            wrong.push(stats);
        }
        tokio::task::yield_now().await;
    }
    publisher.await.expect("the publisher finishes");
    let last = direct.stats(Q).await.expect("stats");
    assert_eq!((last.ready, last.delayed), (JOBS, 0), "{last:?}");
    assert!(
        wrong.is_empty(),
        "{} stats counted a due job as delayed, e.g. {:?}",
        wrong.len(),
        wrong.first()
    );
}
