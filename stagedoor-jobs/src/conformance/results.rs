//! Results and progress: a handler's value kept with its job and read by id from the broker
//! (`Ok(value)`, `ack_with`; `Ok(())` keeps none), gone after the mount's retention, a value
//! past the limit read as too large (the job still acknowledged), progress readable while the
//! job runs, and a wait for a result that returns once the job finishes or times out.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::fixture::Fixture;
use super::support::*;
use crate::broker::{Broker, DeadLetters};
use crate::results::{MAX_RESULT_BYTES, ResultError, Results};
use crate::testing::Outcome;
use crate::{Data, HandlerOutcome, JobProgress, Subscriber};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Rendered {
    n: u64,
    pages: Vec<String>,
}

async fn renders(msg: &Msg, Data(p): Data<Arc<Probe>>) -> Result<Rendered, LedgerClosed> {
    p.finished.fetch_add(1, Ordering::SeqCst);
    Ok(Rendered {
        n: msg.n,
        pages: vec!["a\n{b}".into(), "ünï".into()],
    })
}

async fn acks_with(msg: &Msg) -> HandlerOutcome {
    match msg.n {
        // Past the limit: a JSON string of the limit's length, plus its quotes.
        0 => HandlerOutcome::ack_with(&"x".repeat(MAX_RESULT_BYTES)),
        n => HandlerOutcome::ack_with(&serde_json::json!({ "n": n })),
    }
}

/// Reports progress, then waits for the probe to open before it finishes.
async fn reports_progress(
    _msg: &Msg,
    progress: JobProgress,
    Data(p): Data<Arc<Probe>>,
) -> Result<u32, LedgerClosed> {
    progress
        .set(0.5, "half of the pages")
        .await
        .expect("progress is kept");
    p.in_flight.fetch_add(1, Ordering::SeqCst);
    while !p.open.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    progress.set(7.0, "x".repeat(5000)).await.expect("kept");
    Ok(42)
}

/// `Ok(value)` keeps the value as the job's result, read back by id (JSON kept whole: newlines,
/// braces, non-ASCII) with when it finished; `ack_with` too; `Ok(())` keeps none; a job that
/// has not run has none.
pub async fn a_result_is_kept_and_read_by_id<F: Fixture>(fixture: F) {
    const Q: &str = "cf_results";
    const UNIT: &str = "cf_results_unit";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, renders).name("renders"));
            b.include(Subscriber::new(UNIT, ok_unit).name("ok_unit"));
        }),
    )
    .await;
    let never = crate::JobId::new();
    assert_eq!(direct.result(never.as_str()).await.expect("read"), None);
    let id = app.publish(job(Q, 7)).await.expect("publish").id().clone();
    let unit = app
        .publish(job(UNIT, 1))
        .await
        .expect("publish")
        .id()
        .clone();
    app.drain().await;
    let before = direct.clock().now();

    let kept = direct
        .result(id.as_str())
        .await
        .expect("read the result")
        .expect("a result was kept");
    assert_eq!(kept.job_id(), id.as_str());
    let rendered: Rendered = kept.get().expect("decodes as the handler's type");
    assert_eq!(
        rendered,
        Rendered {
            n: 7,
            pages: vec!["a\n{b}".into(), "ünï".into()]
        }
    );
    assert!(kept.finished_at() <= before + chrono::Duration::seconds(1));
    assert!(matches!(
        kept.get::<Vec<u8>>(),
        Err(ResultError::Decode { .. })
    ));
    assert_eq!(
        direct.result(unit.as_str()).await.expect("read"),
        None,
        "Ok(()) keeps no result"
    );
    assert_eq!(outcomes(&app, "renders"), [(1, Outcome::Acked)]);
    assert_empty(&app, Q, "after the result").await;
    app.stop().await;
}

/// A value past [`MAX_RESULT_BYTES`] is not kept: the job is acknowledged (no retry, no dead
/// letter) and its result reads as too large, with its size and the limit; a value within the
/// limit from `ack_with` beside it is kept.
pub async fn a_result_past_the_limit_reads_as_too_large<F: Fixture>(fixture: F) {
    const Q: &str = "cf_results_large";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let dl = broker.default_dead_letter(Q);
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, acks_with).name("acks_with"))
                .max_attempts(crate::nonzero!(3u32))
                .dead_letter(dl.clone());
        }),
    )
    .await;
    let big = app.publish(job(Q, 0)).await.expect("publish").id().clone();
    let small = app.publish(job(Q, 5)).await.expect("publish").id().clone();
    app.drain().await;
    let r = direct
        .result(big.as_str())
        .await
        .expect("read")
        .expect("a marker is kept");
    match r.json() {
        Err(ResultError::TooLarge { bytes, limit, .. }) => {
            assert_eq!((bytes, limit), (MAX_RESULT_BYTES + 2, MAX_RESULT_BYTES));
        }
        other => panic!("expected too large, got {other:?}"),
    }
    let v: serde_json::Value = direct
        .result(small.as_str())
        .await
        .expect("read")
        .expect("kept")
        .get()
        .expect("json");
    assert_eq!(v, serde_json::json!({ "n": 5 }));
    assert_eq!(
        outcomes(&app, "acks_with"),
        [(1, Outcome::Acked), (1, Outcome::Acked)]
    );
    assert!(app.dead_letters(&dl).await.is_empty(), "no dead letter");
    app.stop().await;
}

/// Results and progress are gone after the mount's `keep_results`.
pub async fn results_past_retention_are_gone<F: Fixture>(fixture: F) {
    const Q: &str = "cf_results_kept";
    let probe = Probe::new();
    probe.open.store(true, Ordering::SeqCst);
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, reports_progress).name("reports_progress"))
                .keep_results(Duration::from_millis(1500));
        }),
    )
    .await;
    let id = app.publish(job(Q, 1)).await.expect("publish").id().clone();
    app.drain().await;
    let kept = direct.result(id.as_str()).await.expect("read");
    assert_eq!(kept.expect("kept").get::<u32>().expect("u32"), 42);
    assert!(direct.progress(id.as_str()).await.expect("read").is_some());
    app.advance(Duration::from_millis(2500)).await;
    assert_eq!(
        direct.result(id.as_str()).await.expect("read"),
        None,
        "past retention"
    );
    assert_eq!(
        direct.progress(id.as_str()).await.expect("read"),
        None,
        "progress too"
    );
    app.stop().await;
}

/// Progress reported by a running handler is read by id while it runs (fraction and message);
/// the last report wins, its fraction kept within 0..=1 and its message cut at the limit;
/// `wait_result` returns once the job finishes, and times out for a job that never does.
pub async fn progress_is_read_while_the_job_runs<F: Fixture>(fixture: F) {
    const Q: &str = "cf_progress";
    let probe = Probe::new();
    let broker = fixture.broker().await;
    let direct = connected(&broker).await;
    let app = start(
        &fixture,
        service(&probe).with_broker(broker, |b| {
            b.include(Subscriber::new(Q, reports_progress).name("reports_progress"));
        }),
    )
    .await;
    let id = app.enqueue(job(Q, 1)).await.expect("publish").id().clone();
    let waiter = {
        let (direct, id) = (direct.clone(), id.clone());
        tokio::spawn(async move {
            direct
                .wait_result(id.as_str(), Duration::from_secs(30))
                .await
        })
    };
    for _ in 0..500 {
        if probe.in_flight.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let p = direct
        .progress(id.as_str())
        .await
        .expect("read")
        .expect("reported while running");
    assert_eq!((p.fraction, p.message.as_str()), (0.5, "half of the pages"));
    assert!(!waiter.is_finished(), "no result while the job runs");
    probe.open.store(true, Ordering::SeqCst);
    let r = waiter
        .await
        .expect("the waiter")
        .expect("a result within the timeout");
    assert_eq!(r.get::<u32>().expect("u32"), 42);
    let p = direct
        .progress(id.as_str())
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(p.fraction, 1.0);
    assert_eq!(
        p.message.chars().count(),
        crate::results::MAX_PROGRESS_MESSAGE
    );
    let never = crate::JobId::new();
    match direct
        .wait_result(never.as_str(), Duration::from_millis(300))
        .await
    {
        Err(ResultError::TimedOut { waited, .. }) => {
            assert_eq!(waited, Duration::from_millis(300));
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    app.drain().await;
    app.stop().await;
}
