//! Traces: W3C Trace Context in and out, and spans exported over OTLP.
//!
//! Spans are built as the SDK's `SpanData` and handed to `opentelemetry-otlp`'s exporter
//! through a bounded queue (`export`). They are not made through the SDK's `Tracer`
//! because a service request's span outlives the process that opened it: it runs from
//! the create to the final status, maybe ended by another instance after a restart. Its
//! parent is stored with the request (as its `traceparent` header), its id is derived
//! from the request (`request_span_id`), its start is the request's creation time, so
//! whoever ends it writes it whole. Sampling is the SDK's `Sampler`, decided once at the
//! span a trace enters clamp by; every span under it follows that decision.
//!
//! With tracing off the request path does nothing for it but look for a `traceparent`
//! header, which it then stores and passes on to the steps unchanged.

pub(crate) mod context;
pub(crate) mod export;
pub(crate) mod http_client;
pub(crate) mod settings;

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::header::HeaderMap;
use opentelemetry::trace::{
    Event, Link, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::SamplingDecision;
use opentelemetry_sdk::trace::{Sampler, ShouldSample, SpanData, SpanEvents, SpanLinks};
use opentelemetry_sdk::Resource;

use crate::metrics::TraceCounters;
pub use context::{RequestTrace, TraceParent};
use export::Queue;
pub use settings::{LogFormat, Protocol, SamplerSpec, TraceArgs, TraceSettings};

/// The `traceparent` and `tracestate` a request came with, if valid (spec: ignore
/// otherwise). A header lookup and nothing else when there is none.
pub fn incoming(headers: &HeaderMap) -> Option<(TraceParent, Option<&str>)> {
    let tp = TraceParent::parse(headers.get("traceparent")?.as_bytes())?;
    let state = headers
        .get("tracestate")
        .and_then(|v| context::valid_tracestate(v.as_bytes()));
    Some((tp, state))
}

/// Tracing, when it is on: the sampler and the export queue.
pub struct Tracing {
    queue: Queue,
    sampler: Sampler,
    scope: InstrumentationScope,
}

/// A server span being answered.
pub struct ServerSpan {
    /// This span's own context (its children's parent).
    pub ctx: TraceParent,
    parent: Option<[u8; 8]>,
    pub tracestate: Option<String>,
    start: SystemTime,
}

/// One child span of a service request, written when it ends.
pub struct ChildSpan {
    pub span_id: [u8; 8],
    pub kind: SpanKind,
    pub name: Cow<'static, str>,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<KeyValue>,
    pub events: Vec<Event>,
    pub links: Vec<Link>,
    pub status: Status,
}

/// A fresh, non-zero span id.
pub fn new_span_id() -> [u8; 8] {
    loop {
        let id = fastrand::u64(..).to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

fn new_trace_id() -> [u8; 16] {
    loop {
        let id = fastrand::u128(..).to_be_bytes();
        if id != [0; 16] {
            return id;
        }
    }
}

/// A time in microseconds since the Unix epoch.
pub fn time_us(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us.max(0) as u64)
}

fn span_context(tp: &TraceParent, state: Option<&str>, remote: bool) -> SpanContext {
    SpanContext::new(
        TraceId::from_bytes(tp.trace_id),
        SpanId::from_bytes(tp.span_id),
        TraceFlags::new(tp.flags & context::SAMPLED),
        remote,
        state
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default(),
    )
}

/// A link to a span of another party that sent a `traceparent` back.
pub fn link_to(tp: &TraceParent) -> Link {
    Link::with_context(span_context(tp, None, true))
}

impl Tracing {
    /// Starts the exporter; spans go to `s.endpoint`.
    pub fn start(s: &TraceSettings, counters: TraceCounters) -> Result<Tracing, String> {
        let resource = Resource::builder()
            .with_service_name(s.service_name.clone())
            .build();
        Ok(Tracing {
            queue: Queue::start(s, resource, counters)?,
            sampler: s.sampler.build(),
            scope: InstrumentationScope::builder("clamp")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        })
    }

    /// Exports what is queued; at shutdown.
    pub async fn shutdown(&self, within: Duration) {
        self.queue.shutdown(within).await;
    }

    /// Opens the server span of an API request: a child of the caller's span when it sent
    /// a valid `traceparent`, else the root of a new trace, sampled as configured.
    pub fn server(&self, name: &str, incoming: Option<(TraceParent, Option<&str>)>) -> ServerSpan {
        let (trace_id, parent, state) = match incoming {
            Some((tp, state)) => (tp.trace_id, Some(tp), state),
            None => (new_trace_id(), None, None),
        };
        let parent_cx = parent.map(|p| {
            opentelemetry::Context::new().with_remote_span_context(span_context(&p, state, true))
        });
        let decision = self
            .sampler
            .should_sample(
                parent_cx.as_ref(),
                TraceId::from_bytes(trace_id),
                name,
                &SpanKind::Server,
                &[],
                &[],
            )
            .decision;
        let sampled = decision == SamplingDecision::RecordAndSample;
        ServerSpan {
            ctx: TraceParent {
                trace_id,
                span_id: new_span_id(),
                flags: if sampled { context::SAMPLED } else { 0 },
            },
            parent: parent.map(|p| p.span_id),
            tracestate: state.map(str::to_string),
            start: SystemTime::now(),
        }
    }

    /// Ends a server span (written only when sampled).
    pub fn end_server(
        &self,
        s: ServerSpan,
        name: String,
        mut attributes: Vec<KeyValue>,
        code: u16,
    ) {
        if !s.ctx.sampled() {
            return;
        }
        attributes.push(KeyValue::new("http.response.status_code", code as i64));
        let status = if code >= 500 {
            Status::error("")
        } else {
            Status::Unset
        };
        self.queue.push(self.data(
            &s.ctx,
            s.tracestate.as_deref(),
            s.parent.map(|p| (p, true)),
            SpanKind::Server,
            name.into(),
            s.start,
            SystemTime::now(),
            attributes,
            Vec::new(),
            Vec::new(),
            status,
        ));
    }

    /// Writes the span of service request `id`, from its create to `status`, its final
    /// status after `retries` retries (each final status is a span of its own; the first
    /// has the id its steps' spans name as their parent).
    #[allow(clippy::too_many_arguments)]
    pub fn end_request(
        &self,
        t: &RequestTrace,
        id: &uuid::Uuid,
        retries: i32,
        workflow: &str,
        created_us: i64,
        status: crate::status::RequestStatus,
        reason: Option<&str>,
        events: Vec<Event>,
    ) {
        if !t.sampled() {
            return;
        }
        let ctx = t.parent.child(request_span_id(t, id, retries));
        let mut attributes = vec![
            KeyValue::new("clamp.service_request.id", id.to_string()),
            KeyValue::new("clamp.workflow.name", workflow.to_string()),
            KeyValue::new("clamp.service_request.status", status.as_str()),
        ];
        if retries > 0 {
            attributes.push(KeyValue::new(
                "clamp.service_request.retries",
                retries as i64,
            ));
        }
        let span_status = match status {
            crate::status::RequestStatus::Failed => Status::error(reason.unwrap_or("").to_string()),
            _ => Status::Unset,
        };
        if let Some(r) = reason {
            attributes.push(KeyValue::new("clamp.service_request.reason", r.to_string()));
        }
        self.queue.push(self.data(
            &ctx,
            t.tracestate.as_deref(),
            Some((t.parent.span_id, false)),
            SpanKind::Internal,
            format!("service request {workflow}").into(),
            time_us(created_us),
            SystemTime::now(),
            attributes,
            events,
            Vec::new(),
            span_status,
        ));
    }

    /// Writes a finished child span of service request `id`'s span (a step attempt, a
    /// publish, a cancel), when the request's trace is sampled.
    pub fn child(&self, t: &RequestTrace, id: &uuid::Uuid, span: ChildSpan) {
        self.child_of(t, request_span_id(t, id, 0), span)
    }

    /// Writes a finished span under span `parent` of the request's trace (a PARALLEL
    /// lane's step attempt under its PARALLEL step's span).
    pub fn child_of(&self, t: &RequestTrace, parent: [u8; 8], span: ChildSpan) {
        if !t.sampled() {
            return;
        }
        let ctx = t.parent.child(span.span_id);
        self.queue.push(self.data(
            &ctx,
            t.tracestate.as_deref(),
            Some((parent, false)),
            span.kind,
            span.name,
            span.start,
            span.end,
            span.attributes,
            span.events,
            span.links,
            span.status,
        ));
    }

    /// A moment in a request's life (a cancel, a retry, a step response) as a span of no
    /// length under the request's span, with the event it is named for.
    pub fn mark(
        &self,
        t: &RequestTrace,
        id: &uuid::Uuid,
        name: &'static str,
        attributes: Vec<KeyValue>,
    ) {
        self.mark_linked(t, id, name, Vec::new(), attributes);
    }

    /// `mark`, with links (to the span of a step response's sender, say).
    pub fn mark_linked(
        &self,
        t: &RequestTrace,
        id: &uuid::Uuid,
        name: &'static str,
        links: Vec<Link>,
        attributes: Vec<KeyValue>,
    ) {
        let now = SystemTime::now();
        self.child(
            t,
            id,
            ChildSpan {
                span_id: new_span_id(),
                kind: SpanKind::Internal,
                name: name.into(),
                start: now,
                end: now,
                attributes: Vec::new(),
                events: vec![Event::new(name, now, attributes, 0)],
                links,
                status: Status::Unset,
            },
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn data(
        &self,
        ctx: &TraceParent,
        state: Option<&str>,
        parent: Option<([u8; 8], bool)>,
        kind: SpanKind,
        name: Cow<'static, str>,
        start: SystemTime,
        end: SystemTime,
        attributes: Vec<KeyValue>,
        events: Vec<Event>,
        links: Vec<Link>,
        status: Status,
    ) -> SpanData {
        let mut ev = SpanEvents::default();
        ev.events = events;
        let mut ln = SpanLinks::default();
        ln.links = links;
        SpanData {
            span_context: span_context(ctx, state, false),
            parent_span_id: parent.map_or(SpanId::INVALID, |p| SpanId::from_bytes(p.0)),
            parent_span_is_remote: parent.is_some_and(|p| p.1),
            span_kind: kind,
            name,
            start_time: start,
            end_time: end.max(start),
            attributes,
            dropped_attributes_count: 0,
            events: ev,
            links: ln,
            status,
            instrumentation_scope: self.scope.clone(),
        }
    }
}

/// The id of service request `id`'s span after `retries` retries: derived from the trace,
/// the stored parent and the request, so that every instance names it alike, a rerun or a
/// child request (which keep their original's trace) gets its own, and each retry too.
pub fn request_span_id(t: &RequestTrace, id: &uuid::Uuid, retries: i32) -> [u8; 8] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(t.parent.trace_id);
    h.update(t.parent.span_id);
    h.update(id.as_bytes());
    h.update(retries.to_be_bytes());
    let d = h.finalize();
    let mut span = [0u8; 8];
    span.copy_from_slice(&d[..8]);
    if span == [0; 8] {
        span[7] = 1;
    }
    span
}

/// The outgoing `traceparent` of a step attempt: a child of the request's span whose
/// parent is the attempt's own span when tracing is on (`span`), else the stored one as
/// it came.
pub fn step_traceparent(t: &RequestTrace, span: Option<[u8; 8]>) -> TraceParent {
    match span {
        Some(s) => t.parent.child(s),
        None => t.parent,
    }
}

/// A URL as a span attribute: without user name and password.
pub fn url_without_credentials(uri: &hyper::Uri) -> String {
    match uri.authority() {
        Some(a) if a.as_str().contains('@') => {
            let host = a.as_str().rsplit('@').next().unwrap_or("");
            let scheme = uri.scheme_str().unwrap_or("http");
            let path = uri.path_and_query().map_or("", |p| p.as_str());
            format!("{scheme}://{host}{path}")
        }
        _ => uri.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials() {
        let u: hyper::Uri = "http://user:secret@svc:8080/claims?x=1".parse().unwrap();
        assert_eq!(url_without_credentials(&u), "http://svc:8080/claims?x=1");
        let u: hyper::Uri = "http://svc/claims".parse().unwrap();
        assert_eq!(url_without_credentials(&u), "http://svc/claims");
    }

    #[test]
    fn each_retry_names_its_own_request_span() {
        let t = RequestTrace {
            parent: TraceParent {
                trace_id: [7; 16],
                span_id: [9; 8],
                flags: 1,
            },
            tracestate: None,
        };
        let (a, b) = (uuid::Uuid::from_u128(1), uuid::Uuid::from_u128(2));
        let first = request_span_id(&t, &a, 0);
        assert_eq!(first, request_span_id(&t, &a, 0));
        assert_ne!(first, request_span_id(&t, &a, 1));
        assert_ne!(first, request_span_id(&t, &b, 0));
    }
}
