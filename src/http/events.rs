//! `POST /events/{event}` (beyond Clamp): `{"key": "<key>", "payload": <any JSON>,
//! "id"?: "<event id>", "keepFor"?: "<ISO 8601>"}` (the id may come as the
//! `Idempotency-Key` header instead), delivered by `ops::events`. Answered 200 whether
//! it resumed requests or none (then it is kept for those to come, and says so).

use hyper::http::request::Parts;
use hyper::StatusCode;
use serde_json::{json, Map, Value};

use super::body::Body;
use super::response::{json, op_error, Resp};
use crate::ops::events::Event;
use crate::ops::OpError;
use crate::state::Core;

/// A string field of the body: absent is None; present, it must be a string (null too).
fn text<'a>(body: &'a Map<String, Value>, field: &str) -> Result<Option<&'a str>, OpError> {
    match body.get(field) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(OpError::BadRequest(format!("{field} must be a string"))),
    }
}

pub async fn post(core: &Core, parts: &Parts, event: &str, body: &mut Body) -> Resp {
    let body = or_answer!(body.read_request(parts, &core.app.config).await);
    let posted: Map<String, Value> = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => return op_error(OpError::BadRequest(format!("invalid event: {e}"))),
    };
    let fields = (
        text(&posted, "key"),
        text(&posted, "id"),
        text(&posted, "keepFor"),
    );
    let (key, id, keep_for) = match fields {
        (Ok(k), Ok(i), Ok(w)) => (k, i, w),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return op_error(e),
    };
    let Some(key) = key else {
        return op_error(OpError::BadRequest(
            "key is required: the key the waiting requests name".into(),
        ));
    };
    let keep_for = match keep_for.map(crate::workflow::wait::duration) {
        None => None,
        Some(Ok(d)) => Some(d),
        Some(Err(why)) => return op_error(OpError::BadRequest(format!("keepFor {why}"))),
    };
    let payload = posted
        .get("payload")
        .map_or_else(|| "null".to_string(), Value::to_string);
    let header_id = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok());
    let traceparent = parts
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok());
    let e = Event {
        event,
        key,
        id: id.or(header_id),
        payload: &payload,
        traceparent,
        keep_for,
    };
    match crate::ops::events::deliver(core, &e).await {
        Ok(o) => match o.keep_until {
            None => json(
                StatusCode::OK,
                &json!({"event": event, "id": o.id, "duplicate": true, "matched": 0}),
            ),
            Some(until) => json(
                StatusCode::OK,
                &json!({"event": event, "id": o.id, "matched": o.resumed.len(),
                        "resumed": o.resumed.iter().map(|u| u.to_string()).collect::<Vec<_>>(),
                        "keptUntil": until}),
            ),
        },
        Err(e) => op_error(e),
    }
}
