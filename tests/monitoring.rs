//! Metrics (through a test recorder) and the dead-letter alert, on the in-memory broker.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use stagedoor_jobs::DeadLetterAlert;
use stagedoor_jobs::prelude::*;

/// One test at a time: a snapshot drains what every test recorded.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        snapshotter
    })
}

/// Everything recorded since the last look. (A snapshot drains counters and histograms: the
/// tests read what they need from one, and each test uses queues of its own.)
fn take() -> Vec<(metrics_util::CompositeKey, DebugValue)> {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect()
}

/// The value of a counter (or gauge) with these labels, summed over matches.
fn value_in(
    snapshot: &[(metrics_util::CompositeKey, DebugValue)],
    name: &str,
    labels: &[(&str, &str)],
) -> f64 {
    let mut total = 0.0;
    for (key, v) in snapshot {
        let k = key.key();
        if k.name() != name {
            continue;
        }
        let all = labels
            .iter()
            .all(|(ln, lv)| k.labels().any(|l| l.key() == *ln && l.value() == *lv));
        if !all {
            continue;
        }
        total += match v {
            DebugValue::Counter(c) => *c as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(h) => h.len() as f64,
        };
    }
    total
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Task {
    what: String,
}

async fn work(t: &Task) -> HandlerOutcome {
    match t.what.as_str() {
        "ok" => HandlerOutcome::ack(),
        "drop" => HandlerOutcome::drop(),
        _ => HandlerOutcome::retry(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_are_counted_per_queue_and_kind() {
    let _serial = SERIAL.lock().await;
    take();
    let q = "m_counts";
    let service =
        Service::new(AppInfo::new("metrics", "0.1.0")).with_broker(MemoryBroker::new(), |b| {
            b.include(Subscriber::new(q, work))
                .max_attempts(nonzero!(2u32))
                .dead_letter("m_counts.dead");
        });
    let app = TestApp::start(service).await.unwrap();
    for what in ["ok", "ok", "drop", "fail"] {
        app.publish(
            Job::new(q, &Task { what: what.into() })
                .unwrap()
                .kind("task"),
        )
        .await
        .unwrap();
    }
    app.drain().await;
    let snap = take();
    let value = |n: &str, l: &[(&str, &str)]| value_in(&snap, n, l);
    let l = [("queue", q), ("kind", "task")];
    assert_eq!(
        value("stagedoor_jobs_processed_total", &l),
        5.0,
        "2 acks, 1 drop, 2 attempts of the failing one"
    );
    assert_eq!(value("stagedoor_jobs_dropped_total", &l), 1.0);
    assert_eq!(value("stagedoor_jobs_failed_total", &l), 2.0);
    assert_eq!(value("stagedoor_jobs_retried_total", &l), 1.0);
    assert_eq!(value("stagedoor_jobs_dead_lettered_total", &l), 1.0);
    assert_eq!(
        value("stagedoor_jobs_handler_duration_seconds", &l),
        5.0,
        "one duration per run"
    );
    app.stop().await;
}

/// The series of `queue` in `snap`.
fn series_of(snap: &[(metrics_util::CompositeKey, DebugValue)], queue: &str) -> Vec<String> {
    let set: std::collections::BTreeSet<String> = snap
        .iter()
        .filter(|(k, _)| {
            k.key()
                .labels()
                .any(|l| l.key() == "queue" && l.value() == queue)
        })
        .map(|(k, _)| format!("{:?}", k.key()))
        .collect();
    set.into_iter().collect()
}

/// Kinds come from the entries, whoever wrote them: jobs of 1,000 distinct kinds make a bounded
/// number of series. On a queue whose mounts name their kinds, a kind none names (dead-lettered
/// unrun) is counted under `kind="unknown"`; on a queue with a mount for every kind, the first
/// `KIND_LABELS_MAX` kinds keep their label and the rest are counted under `kind="other"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_kinds_make_a_bounded_number_of_series() {
    let _serial = SERIAL.lock().await;
    take();
    let (named, every) = ("m_named_kinds", "m_every_kind");
    let service =
        Service::new(AppInfo::new("metrics", "0.1.0")).with_broker(MemoryBroker::new(), |b| {
            b.include(Subscriber::new(named, work).kind("task"));
            b.include(Subscriber::new(every, work));
        });
    let app = TestApp::start(service).await.unwrap();
    let job = |q: &str, kind: String| Job::new(q, &Task { what: "ok".into() }).unwrap().kind(kind);
    for q in [named, every] {
        app.publish(job(q, "task".into())).await.unwrap();
        for n in 0..1000 {
            app.enqueue(job(q, format!("kind_{n}"))).await.unwrap();
        }
    }
    app.drain().await;
    let snap = take();
    let value = |n: &str, l: &[(&str, &str)]| value_in(&snap, n, l);

    // Five series of the two labels, and the queue's gauges.
    let series = series_of(&snap, named);
    assert!(
        series.len() <= 12,
        "{} series: {:?}",
        series.len(),
        &series[..series.len().min(20)]
    );
    let unknown = [("queue", named), ("kind", "unknown")];
    assert_eq!(
        value("stagedoor_jobs_processed_total", &unknown),
        1000.0,
        "every unknown kind is counted, under one label"
    );
    assert_eq!(
        value("stagedoor_jobs_dead_lettered_total", &unknown),
        1000.0
    );
    assert_eq!(
        value(
            "stagedoor_jobs_processed_total",
            &[("queue", named), ("kind", "task")]
        ),
        1.0,
        "the mount's kind keeps its label"
    );

    let series = series_of(&snap, every);
    // Two series (processed, duration) per label (the first 100 kinds and `other`), and the
    // queue's gauges.
    assert!(
        series.len() <= 2 * 101 + 6,
        "{} series: {:?}",
        series.len(),
        &series[..series.len().min(20)]
    );
    let total = value("stagedoor_jobs_processed_total", &[("queue", every)]);
    assert_eq!(total, 1001.0, "every job is counted");
    assert_eq!(
        value(
            "stagedoor_jobs_processed_total",
            &[("queue", every), ("kind", "task")]
        ),
        1.0,
        "a kind seen early keeps its label"
    );
    assert_eq!(
        value(
            "stagedoor_jobs_processed_total",
            &[("queue", every), ("kind", "other")]
        ),
        1001.0 - 100.0,
        "past the first 100 kinds, one label"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alert_fires_when_a_dead_letter_goes_from_empty_to_not_empty() {
    let _serial = SERIAL.lock().await;
    take();
    let q = "m_alert";
    let alerts: Arc<Mutex<Vec<DeadLetterAlert>>> = Arc::default();
    let seen = Arc::clone(&alerts);
    let service = Service::new(AppInfo::new("alert", "0.1.0"))
        .metrics_interval(Duration::from_millis(50))
        .on_dead_letter(move |a| seen.lock().unwrap().push(a.clone()))
        .with_broker(MemoryBroker::new(), |b| {
            b.include(Subscriber::new(q, work))
                .max_attempts(nonzero!(1u32))
                .dead_letter("m_alert.dead");
        });
    let app = TestApp::start_live(service).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await; // the empty dead letter is seen
    assert!(alerts.lock().unwrap().is_empty());
    app.publish(
        Job::new(
            q,
            &Task {
                what: "fail".into(),
            },
        )
        .unwrap(),
    )
    .await
    .unwrap();
    app.drain().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    {
        let got = alerts.lock().unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].dead_letter, "m_alert.dead");
        assert_eq!(got[0].queues, ["m_alert"]);
        assert_eq!(got[0].length, 1);
    }
    // A second dead letter is not a new page: the length went from 1 to 2.
    app.publish(
        Job::new(
            q,
            &Task {
                what: "fail".into(),
            },
        )
        .unwrap(),
    )
    .await
    .unwrap();
    app.drain().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(alerts.lock().unwrap().len(), 1);
    let snap = take();
    assert_eq!(
        value_in(
            &snap,
            "stagedoor_jobs_dead_letter_length",
            &[("dead_letter", "m_alert.dead")]
        ),
        2.0
    );
    // Emptied and filled again: a new page.
    app.purge("m_alert.dead", stagedoor_jobs::DeadSelector::All)
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    app.publish(
        Job::new(
            q,
            &Task {
                what: "fail".into(),
            },
        )
        .unwrap(),
    )
    .await
    .unwrap();
    app.drain().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(alerts.lock().unwrap().len(), 2);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_gauges_are_sampled() {
    let _serial = SERIAL.lock().await;
    take();
    let q = "m_gauges";
    let service = Service::new(AppInfo::new("gauges", "0.1.0"))
        .metrics_interval(Duration::from_millis(50))
        .with_broker(MemoryBroker::new(), |b| {
            b.include(Subscriber::new(q, work))
                .max_attempts(nonzero!(3u32))
                .dead_letter("m_gauges.dead");
        });
    let app = TestApp::start_live(service).await.unwrap();
    app.publish(
        Job::new(q, &Task { what: "ok".into() })
            .unwrap()
            .after(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let snap = take();
    assert_eq!(
        value_in(&snap, "stagedoor_jobs_queue_delayed", &[("queue", q)]),
        1.0
    );
    assert_eq!(
        value_in(&snap, "stagedoor_jobs_queue_depth", &[("queue", q)]),
        0.0
    );
    app.stop().await;
}
