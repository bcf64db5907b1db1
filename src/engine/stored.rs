//! A request's stored headers (`service_requests.headers`, `[[name, value], …]`): the
//! forwardable headers its steps are sent, and the trace context they carry. Read by the
//! step loop, by the shared state's `traced`, and by the status answer.

use crate::telemetry::{RequestTrace, TraceParent};

/// Parses persisted forwardable headers (`[[name, value], …]`).
pub fn parse_headers(text: &[u8]) -> Vec<(String, String)> {
    serde_json::from_slice::<Vec<(String, String)>>(text).unwrap_or_default()
}

/// The forwardable headers without the trace context, and the trace context: each step
/// gets a `traceparent` of its own (`telemetry::step_traceparent`).
pub fn headers_and_trace(text: &[u8]) -> (Vec<(String, String)>, Option<RequestTrace>) {
    let mut headers = parse_headers(text);
    if !headers
        .iter()
        .any(|(k, _)| k == "traceparent" || k == "tracestate")
    {
        return (headers, None);
    }
    let mut parent = None;
    let mut tracestate = None;
    headers.retain(|(k, v)| match k.as_str() {
        "traceparent" => {
            parent = parent.or_else(|| TraceParent::parse(v.as_bytes()));
            false
        }
        "tracestate" => {
            tracestate = Some(v.clone());
            false
        }
        _ => true,
    });
    let trace = parent.map(|parent| RequestTrace { parent, tracestate });
    (headers, trace)
}
