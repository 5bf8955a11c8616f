//! The W3C trace context across the queue (feature `opentelemetry`).
//!
//! A publish that runs inside a span known to OpenTelemetry (a service with the
//! `tracing-opentelemetry` layer installed) writes that span's context into the job's headers as
//! [`TRACEPARENT`] and, when there is one, [`TRACESTATE`] (the W3C Trace Context headers, written
//! by OpenTelemetry's own `TraceContextPropagator`). The worker's `job` span takes the context it
//! finds there as its parent, so the handler's spans continue the publisher's trace, across
//! processes and retries. A job whose headers already hold a `traceparent` keeps it (the
//! application set it); without a layer, or outside any span, nothing is written.
//!
//! The headers travel with the job on every backend; an SQL table needs its `headers` column
//! for them (a table without one stores no headers, so its jobs start traces of their own).

use std::collections::BTreeMap;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header holding the W3C `traceparent` of the span that published the job.
pub const TRACEPARENT: &str = "traceparent";
/// The header holding the W3C `tracestate` of that span, when it has one.
pub const TRACESTATE: &str = "tracestate";

struct Inject<'a>(&'a mut BTreeMap<String, String>);

impl Injector for Inject<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

struct Extract<'a>(&'a BTreeMap<String, String>);

impl Extractor for Extract<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// Writes the current span's trace context into `headers` (a job's
/// [`Headers::extra`](crate::Headers::extra)), unless they hold one already or the current span
/// has none. The headers are taken as their map so that this file needs nothing of
/// `envelope.rs`, which calls it.
pub(crate) fn inject(headers: &mut BTreeMap<String, String>) {
    if headers.contains_key(TRACEPARENT) {
        return;
    }
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    TraceContextPropagator::new().inject_context(&cx, &mut Inject(headers));
}

/// Makes the trace context in `headers` (a job's [`Headers::extra`](crate::Headers::extra)), if
/// any, the parent of `span`.
pub(crate) fn set_parent(span: &tracing::Span, headers: &BTreeMap<String, String>) {
    if !headers.contains_key(TRACEPARENT) {
        return;
    }
    let cx = TraceContextPropagator::new().extract(&Extract(headers));
    if cx.span().span_context().is_valid() {
        // Fails only for a span that is already closed or unknown to the layer: nothing to do.
        let _ = span.set_parent(cx);
    }
}
