//! A step attempt's part of the request's trace: the `traceparent` its call carries, and,
//! when tracing is on, its span (a client span for an HTTP call, a producer span for a
//! publish), written once the attempt's outcome is known.

use std::time::SystemTime;

use opentelemetry::trace::{Event, SpanKind, Status};
use opentelemetry::KeyValue;

use super::call::{CallError, CallErrorKind};
use crate::telemetry::{self, ChildSpan, RequestTrace, TraceParent, Tracing};
use crate::workflow::{CompiledStep, Val};

/// What one attempt carries and learns.
pub struct StepTrace {
    /// The attempt's own span, when tracing is on.
    span: Option<[u8; 8]>,
    /// The `traceparent` the call sends.
    pub header: [u8; telemetry::context::TRACEPARENT_LEN],
    pub tracestate: Option<String>,
    /// The HTTP status the call was answered with.
    pub status: Option<u16>,
    /// A `traceparent` the answer came back with (linked to the attempt's span).
    pub answered: Option<TraceParent>,
    start: SystemTime,
    /// The attempt is a PARALLEL lane's step: its span hangs under the PARALLEL step's
    /// span (when it has one), and names the branch.
    lane: Option<Lane>,
}

/// Where a lane's step attempt runs, for its span.
struct Lane {
    parent: Option<[u8; 8]>,
    fan_step: u32,
    branch: String,
}

/// How an attempt ended, for its span.
pub enum Ended<'a> {
    Done,
    /// Sent; the request waits for the answer.
    Paused,
    /// Failed, and tried again (true) or not.
    Failed(&'a CallError, bool),
}

impl StepTrace {
    /// The attempt's trace context; None when the request has no trace.
    pub fn begin(tracing: Option<&Tracing>, trace: Option<&RequestTrace>) -> Option<StepTrace> {
        let t = trace?;
        let span = tracing.map(|_| telemetry::new_span_id());
        Some(StepTrace {
            span,
            header: telemetry::step_traceparent(t, span).encode(),
            tracestate: t.tracestate.clone(),
            status: None,
            answered: None,
            start: SystemTime::now(),
            lane: None,
        })
    }

    /// The attempt's span id, when tracing is on.
    pub fn span_id(&self) -> Option<[u8; 8]> {
        self.span
    }

    /// Marks the attempt as a step of branch `branch` of PARALLEL step `fan_step` (span
    /// `parent`), run as a lane of the request.
    pub fn in_lane(&mut self, parent: Option<[u8; 8]>, fan_step: u32, branch: &str) {
        self.lane = Some(Lane {
            parent,
            fan_step,
            branch: branch.to_string(),
        });
    }

    /// The header value as text.
    pub fn traceparent(&self) -> &str {
        std::str::from_utf8(&self.header).expect("hex is ASCII")
    }

    /// Writes the attempt's span of request `id` (when tracing is on and the trace sampled).
    pub fn end(
        self,
        tracing: Option<&Tracing>,
        t: &RequestTrace,
        id: &uuid::Uuid,
        step: &CompiledStep,
        attempt: u32,
        how: Ended,
    ) {
        let (Some(tracing), Some(span_id)) = (tracing, self.span) else {
            return;
        };
        if !t.sampled() {
            return;
        }
        let end = SystemTime::now();
        let mut attributes = vec![
            KeyValue::new("clamp.service_request.id", id.to_string()),
            KeyValue::new("clamp.step.id", step.id as i64),
            KeyValue::new("clamp.step.name", step.name.clone()),
            KeyValue::new("clamp.step.attempt", attempt as i64),
        ];
        if let Some(l) = &self.lane {
            attributes.push(KeyValue::new("clamp.fan.step.id", l.fan_step as i64));
            attributes.push(KeyValue::new("clamp.fan.branch", l.branch.clone()));
        }
        let (kind, name) = describe(step, &mut attributes);
        if attempt > 1 {
            attributes.push(KeyValue::new(
                "http.request.resend_count",
                (attempt - 1) as i64,
            ));
        }
        if let Some(code) = self.status {
            attributes.push(KeyValue::new("http.response.status_code", code as i64));
        }
        let mut events = Vec::new();
        let status = match how {
            Ended::Done => Status::Unset,
            Ended::Paused => {
                events.push(Event::new("pause", end, Vec::new(), 0));
                Status::Unset
            }
            Ended::Failed(e, again) => {
                attributes.push(KeyValue::new("error.type", error_type(e)));
                if again {
                    events.push(Event::new(
                        "retry",
                        end,
                        vec![
                            KeyValue::new("clamp.retry.cause", e.cause()),
                            KeyValue::new("clamp.retry.next_attempt", (attempt + 1) as i64),
                        ],
                        0,
                    ));
                }
                Status::error(e.message.clone())
            }
        };
        let span = ChildSpan {
            span_id,
            kind,
            name: name.into(),
            start: self.start,
            end,
            attributes,
            events,
            links: self.answered.iter().map(telemetry::link_to).collect(),
            status,
        };
        match self.lane.and_then(|l| l.parent) {
            Some(parent) => tracing.child_of(t, parent, span),
            None => tracing.child(t, id, span),
        }
    }
}

/// The span kind and name of `step`'s attempts, and the attributes naming its call.
fn describe(step: &CompiledStep, attributes: &mut Vec<KeyValue>) -> (SpanKind, String) {
    match &step.val {
        Val::Http(v) => {
            attributes.push(KeyValue::new("http.request.method", v.method.to_string()));
            attributes.push(KeyValue::new(
                "url.full",
                telemetry::url_without_credentials(&v.url),
            ));
            if let Some(host) = v.url.host() {
                attributes.push(KeyValue::new("server.address", host.to_string()));
            }
            if let Some(port) = v.url.port_u16() {
                attributes.push(KeyValue::new("server.port", port as i64));
            }
            (SpanKind::Client, v.method.to_string())
        }
        Val::Amqp(v) => {
            let destination = if v.exchange_name.is_empty() {
                v.queue_name.clone()
            } else {
                v.exchange_name.clone()
            };
            messaging(attributes, "rabbitmq", "publish", &destination);
            if !v.routing_key.is_empty() {
                attributes.push(KeyValue::new(
                    "messaging.rabbitmq.destination.routing_key",
                    v.routing_key.clone(),
                ));
            }
            (SpanKind::Producer, format!("publish {destination}"))
        }
        Val::Kafka(v) => {
            messaging(attributes, "kafka", "send", &v.topic_name);
            (SpanKind::Producer, format!("send {}", v.topic_name))
        }
        Val::Workflow(v) => {
            attributes.push(KeyValue::new("clamp.child.workflow", v.workflow.clone()));
            (SpanKind::Internal, format!("start child {}", v.workflow))
        }
        Val::Parallel(p) => {
            attributes.push(KeyValue::new("clamp.fan.branches", p.branches.len() as i64));
            (
                SpanKind::Internal,
                format!("fan out {} branches", p.branches.len()),
            )
        }
        Val::Switch(sw) => {
            attributes.push(KeyValue::new("clamp.switch.on", sw.on.source().to_string()));
            (SpanKind::Internal, format!("switch on {}", sw.on.source()))
        }
        Val::Loop(l) => {
            attributes.push(KeyValue::new(
                "clamp.loop.while",
                l.while_.source().to_string(),
            ));
            attributes.push(KeyValue::new(
                "clamp.loop.max_iterations",
                i64::from(l.max_iterations),
            ));
            (
                SpanKind::Internal,
                format!("loop while {}", l.while_.source()),
            )
        }
        Val::Map(m) => {
            attributes.push(KeyValue::new("clamp.fan.items", m.items.clone()));
            (SpanKind::Internal, format!("map {}", m.items))
        }
        Val::Event(e) => {
            attributes.push(KeyValue::new("clamp.event.name", e.event.clone()));
            (SpanKind::Internal, format!("await event {}", e.event))
        }
        Val::Wait(w) => match w {
            crate::workflow::model::WaitVal::Duration(d) => {
                attributes.push(KeyValue::new("clamp.wait.ms", d.as_millis() as i64));
                (SpanKind::Internal, format!("wait {} ms", d.as_millis()))
            }
            crate::workflow::model::WaitVal::Until(p) => {
                attributes.push(KeyValue::new("clamp.wait.until", p.clone()));
                (SpanKind::Internal, format!("wait until {p}"))
            }
        },
    }
}

fn messaging(attributes: &mut Vec<KeyValue>, system: &'static str, op: &'static str, dest: &str) {
    attributes.push(KeyValue::new("messaging.system", system));
    attributes.push(KeyValue::new("messaging.operation.type", "send"));
    attributes.push(KeyValue::new("messaging.operation.name", op));
    attributes.push(KeyValue::new(
        "messaging.destination.name",
        dest.to_string(),
    ));
}

/// `error.type` as the conventions ask: the status code of an HTTP answer, else the cause.
fn error_type(e: &CallError) -> String {
    match e.kind {
        CallErrorKind::Status(code) => code.to_string(),
        _ => e.cause().to_string(),
    }
}
