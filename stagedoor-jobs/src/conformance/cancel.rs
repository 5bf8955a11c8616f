//! Cancellation ([`DeadLetters::cancel`]): a waiting or delayed job is removed; a running
//! job's handler sees its [`Cancellation`] fire and the job is dropped, recorded as cancelled,
//! never retried; a job not in the queue is reported as not found.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::fixture::Fixture;
use super::support::*;
use crate::broker::{Broker, Cancelled, DeadLetters, Inspect, Publish};
use crate::testing::Outcome;
use crate::{Cancellation, Ctx, Data, HandlerOutcome, JobId, Subscriber, keys};

/// Waits until its job is cancelled (at most [`PATIENCE`]), notes it, and answers `ack`: the
/// runtime must drop the job all the same.
async fn waits_for_cancel(
    msg: &Msg,
    Data(p): Data<Arc<Probe>>,
    Ctx(attempt): Ctx<keys::Attempt>,
    cancel: Cancellation,
) -> HandlerOutcome {
    p.see(Seen::of(msg, attempt));
    p.enter();
    tokio::select! {
        _ = cancel.cancelled() => p.saw_cancel.store(true, Ordering::SeqCst),
        _ = tokio::time::sleep(PATIENCE) => {}
    }
    p.leave();
    HandlerOutcome::ack()
}

/// A job waiting and a job delayed an hour are removed by `cancel` (nothing left in the
/// queue); cancelling either again, or an id never published, finds nothing.
pub async fn cancel_removes_waiting_and_delayed_jobs<F: Fixture>(fixture: F) {
    const Q: &str = "cf_cancel_waiting";
    let direct = connected(&fixture.broker().await).await;
    direct.prepare(Q).await.expect("prepare");
    let now = direct.publish_job(job(Q, 1)).await.expect("publish");
    let later = direct
        .publish_job(job(Q, 2).after(Duration::from_secs(3600)))
        .await
        .expect("publish");
    let kept = direct.publish_job(job(Q, 3)).await.expect("publish");
    let stats = direct.stats(Q).await.expect("stats");
    assert_eq!((stats.ready, stats.delayed), (2, 1), "{stats:?}");

    let c = direct.cancel(Q, now.id()).await.expect("cancel");
    assert_eq!(c, Cancelled::Removed, "a waiting job is removed");
    let c = direct.cancel(Q, later.id()).await.expect("cancel");
    assert_eq!(c, Cancelled::Removed, "a delayed job is removed");
    let stats = direct.stats(Q).await.expect("stats");
    assert_eq!(
        (stats.ready, stats.delayed),
        (1, 0),
        "only the job not cancelled is left: {stats:?}"
    );
    let again = direct.cancel(Q, now.id()).await.expect("cancel");
    assert_eq!(again, Cancelled::NotFound, "a job cancelled already");
    let never = direct
        .cancel(Q, &JobId::from_string(format!("never-{}", JobId::new())))
        .await
        .expect("cancel");
    assert_eq!(never, Cancelled::NotFound, "an id never published");
    let republished = direct
        .publish_job(job(Q, 1).id(now.id().clone()))
        .await
        .expect("publish");
    assert!(
        republished.is_stored(),
        "a cancelled job's id is free again: {republished:?}"
    );
    let _ = kept;

    // A unique job cancelled before it ran frees its key at once.
    let key = format!("cf-cancel-{}", JobId::new());
    let unique = direct
        .publish_job(
            job(Q, 4)
                .unique(&key, Duration::from_secs(3600))
                .after(Duration::from_secs(3600)),
        )
        .await
        .expect("publish");
    assert!(unique.is_stored());
    let c = direct.cancel(Q, unique.id()).await.expect("cancel");
    assert_eq!(c, Cancelled::Removed);
    let next = direct
        .publish_job(job(Q, 5).unique(&key, Duration::from_secs(3600)))
        .await
        .expect("publish");
    assert!(
        next.is_stored() && next.id() != unique.id(),
        "the key of a unique job cancelled before it ran takes a new job: {next:?}"
    );
}

/// A running job cancelled: its handler's `Cancellation` fires, and although the handler
/// answers `ack`, the job is dropped, recorded as cancelled, not retried and not
/// dead-lettered.
pub async fn cancel_of_a_running_job_fires_its_cancellation<F: Fixture>(fixture: F) {
    const Q: &str = "cf_cancel_running";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let dl = broker.default_dead_letter(Q);
    let direct = connected(&broker).await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, waits_for_cancel).name("waits"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let p = app.enqueue(job(Q, 1)).await.expect("publish");
    eventually("the handler runs", || probe.in_flight() == 1).await;
    let c = app.cancel(Q, p.id()).await.expect("cancel");
    assert_eq!(c, Cancelled::Running, "the job is running");
    eventually("the handler sees its cancellation", || {
        probe.saw_cancel.load(Ordering::SeqCst)
    })
    .await;
    app.drain().await;
    assert_eq!(
        outcomes(&app, "waits"),
        vec![(1, Outcome::Cancelled)],
        "dropped as cancelled, whatever the handler answered"
    );
    assert_eq!(probe.runs(), 1, "not retried");
    assert_empty(&app, Q, "after the cancelled job").await;
    assert_eq!(
        direct.dead_len(&dl).await.expect("dead len"),
        0,
        "no dead letter"
    );
    let after = direct.cancel(Q, p.id()).await.expect("cancel");
    assert_eq!(after, Cancelled::NotFound, "the job is gone");
    app.stop().await;
}
