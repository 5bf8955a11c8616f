//! Every job runs in a `job` span with its queue, kind, job id, attempt, request id and trace;
//! a handler's own events are inside it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use stagedoor_jobs::prelude::*;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber as TracingSubscriber};
use tracing_subscriber::Registry;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Default)]
struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Records, for every event named "inside the handler", the fields of its `job` span.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<HashMap<String, String>>>>);

impl<S: TracingSubscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut f = Fields::default();
        attrs.record(&mut f);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(f);
        }
    }
    fn on_record(&self, id: &Id, values: &tracing::span::Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(f) = span.extensions_mut().get_mut::<Fields>()
        {
            values.record(f);
        }
    }
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut msg = Fields::default();
        event.record(&mut msg);
        if msg.0.get("message").map(String::as_str) != Some("inside the handler") {
            return;
        }
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        for span in scope {
            if span.name() == "job"
                && let Some(f) = span.extensions().get::<Fields>()
            {
                self.0.lock().unwrap().push(f.0.clone());
            }
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Render {
    order_id: u64,
}

async fn render(_: &Render) -> HandlerOutcome {
    tracing::info!("inside the handler");
    HandlerOutcome::ack()
}

#[test]
fn a_job_runs_in_a_span_that_carries_its_publishers_request_id_and_trace() {
    let capture = Capture::default();
    let subscriber = Registry::default().with(capture.clone());
    tracing::subscriber::set_global_default(subscriber)
        .expect("the only subscriber of this test binary");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let service =
            Service::new(AppInfo::new("traced", "0.1.0")).with_broker(MemoryBroker::new(), |b| {
                b.include(Subscriber::new("jobs", render).kind("render_tickets"));
            });
        let app = TestApp::start(service).await.unwrap();
        let id = app
            .publish(
                Job::new("jobs", &Render { order_id: 4471 })
                    .unwrap()
                    .kind("render_tickets")
                    .request_id("7f3a9c2e")
                    .trace("4bf92f35"),
            )
            .await
            .unwrap()
            .into_id();
        app.drain().await;
        let seen = capture.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        let f = &seen[0];
        assert_eq!(f["queue"], "jobs");
        assert_eq!(f["kind"], "render_tickets");
        assert_eq!(f["job_id"], id.to_string());
        assert_eq!(f["attempt"], "1");
        assert_eq!(f["request_id"], "7f3a9c2e");
        assert_eq!(f["trace"], "4bf92f35");
        assert_eq!(f["subscriber"], "render");
        app.stop().await;
    });
}
