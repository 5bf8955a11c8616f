//! The `opentelemetry` feature of the core: a job published inside a span continues that
//! span's trace in its handler. A tracing subscriber with the `tracing-opentelemetry` layer
//! over an in-memory exporter records every span; a `request` span publishes a job, and the
//! worker's `job` span must be its child (same trace id, parent span id = the request's), on
//! the memory broker, SQLite and Postgres (where the `traceparent` header goes through a
//! table's `headers` column) and Redis (an entry's `h.traceparent` field). A job published
//! outside any span starts a trace of its own.

mod common;
#[allow(dead_code)]
mod common_redis;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{ConfRow, Db, Lite, Pg, conf_ddl};
use common_redis::{env_url, fresh_namespace};
use opentelemetry::trace::{SpanId, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde::{Deserialize, Serialize};
use stagedoor_jobs::otel::TRACEPARENT;
use stagedoor_jobs::prelude::*;
use stagedoor_jobs::{Broker, FromJob, Publish};
use stagedoor_jobs_redis::RedisBroker;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

#[derive(Debug, Serialize, Deserialize)]
struct Mail {
    n: u32,
}

/// What a handler saw: (n, trace id of its span, the `traceparent` header).
type Seen = Arc<Mutex<Vec<(u32, TraceId, Option<String>)>>>;

async fn send(mail: &Mail, Data(seen): Data<Seen>, job: Traceparent) -> HandlerOutcome {
    let trace = tracing::Span::current()
        .context()
        .span()
        .span_context()
        .trace_id();
    seen.lock().expect("lock").push((mail.n, trace, job.0));
    HandlerOutcome::ack()
}

/// The job's `traceparent` header, as the handler sees it.
struct Traceparent(Option<String>);

impl FromJob for Traceparent {
    fn from_job(ctx: &stagedoor_jobs::JobContext) -> Result<Self, stagedoor_jobs::Rejection> {
        Ok(Self(
            ctx.envelope().headers().extra.get(TRACEPARENT).cloned(),
        ))
    }
}

/// The process's one exporter and provider: the subscriber is global (the runtime's tasks run
/// on its worker threads).
fn exporter() -> &'static (InMemorySpanExporter, SdkTracerProvider) {
    static OTEL: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    OTEL.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let tracer = provider.tracer("stagedoor-jobs-test");
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        (exporter, provider)
    })
}

fn finished() -> Vec<SpanData> {
    let (exporter, provider) = exporter();
    provider.force_flush().expect("flush");
    exporter.get_finished_spans().expect("spans")
}

/// Publishes job `n` inside a `request` span (and job `n + 100` outside any span), waits for
/// both handlers, and checks the job spans' parents.
async fn continues_the_trace<B: Broker + Publish>(name: &str, broker: B, publisher: B) {
    exporter();
    let seen = Seen::default();
    let service = Service::new(AppInfo::new("otel", "0.1.0"))
        .state(Arc::clone(&seen))
        .with_broker(broker, |b| {
            b.include(Subscriber::new("cf", send).name("send"));
        });
    let running = service.start().await.expect("start");
    publisher.connect().await.expect("connect");
    let request = tracing::info_span!("request", backend = name);
    let request_ids = {
        let cx = request.context();
        let sc = cx.span().span_context().clone();
        (sc.trace_id(), sc.span_id())
    };
    assert_ne!(
        request_ids.0,
        TraceId::INVALID,
        "the layer gives the request span a trace"
    );
    async {
        publisher
            .publish_job(Job::new("cf", &Mail { n: 1 }).expect("encodes"))
            .await
            .expect("publish");
    }
    .instrument(request.clone())
    .await;
    drop(request);
    publisher
        .publish_job(Job::new("cf", &Mail { n: 101 }).expect("encodes"))
        .await
        .expect("publish outside a span");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.lock().expect("lock").len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: both jobs ran: {:?}",
            seen.lock()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.shutdown().await;

    let seen = seen.lock().expect("lock").clone();
    let (_, in_trace, header) = seen.iter().find(|s| s.0 == 1).expect("job 1 ran").clone();
    let header = header.expect("job 1 carries a traceparent header");
    assert!(
        header.starts_with("00-") && header.contains(&request_ids.0.to_string()),
        "{name}: the W3C traceparent of the request: {header}"
    );
    assert_eq!(
        in_trace, request_ids.0,
        "{name}: the handler runs in the publisher's trace"
    );
    let (_, own_trace, none) = seen
        .iter()
        .find(|s| s.0 == 101)
        .expect("job 101 ran")
        .clone();
    assert_eq!(
        none, None,
        "{name}: a publish outside any span writes no traceparent"
    );
    assert_ne!(
        own_trace, request_ids.0,
        "{name}: and its job starts a trace of its own"
    );

    let spans = finished();
    let job_span = spans
        .iter()
        .find(|s| s.name == "job" && s.span_context.trace_id() == request_ids.0)
        .unwrap_or_else(|| panic!("{name}: a `job` span in the request's trace: {spans:#?}"));
    assert_eq!(
        job_span.parent_span_id, request_ids.1,
        "{name}: the job span's parent is the request span"
    );
    assert_ne!(job_span.parent_span_id, SpanId::INVALID);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_broker_continues_the_publishers_trace() {
    let broker = MemoryBroker::new();
    continues_the_trace("memory", broker.clone(), broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_continues_the_publishers_trace() {
    let db = Lite::fresh("otel", conf_ddl::<Lite>()).await;
    let route = Lite::route::<ConfRow>(&db.broker(), "cf");
    continues_the_trace("sqlite", route.clone(), route).await;
}

#[ignore = "needs Postgres: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_continues_the_publishers_trace() {
    let db = Pg::fresh("otel", conf_ddl::<Pg>()).await;
    let route = Pg::route::<ConfRow>(&db.broker(), "cf");
    continues_the_trace("postgres", route.clone(), route).await;
}

#[ignore = "needs Redis: run scripts/test-all"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_continues_the_publishers_trace() {
    let broker = RedisBroker::from_url(env_url("REDIS_URL")).namespace(fresh_namespace("otel-"));
    continues_the_trace("redis", broker.clone(), broker).await;
}
