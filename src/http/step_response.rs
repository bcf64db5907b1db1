//! `POST /stepResponse`: the answer to a paused ASYNC step, applied by the engine
//! (`engine::resume`) exactly as the broker consumers apply theirs.

use std::time::Duration;

use hyper::http::request::Parts;
use hyper::StatusCode;

use super::body::Body;
use super::response::{engine_error, error, json_bytes, Resp};
use crate::engine::resume::{self, Applied};
use crate::state::Core;

/// How long `POST /stepResponse` waits for a pause still being written before it says 409.
const HTTP_PATIENCE: Duration = Duration::from_secs(2);

/// `POST /stepResponse`.
pub async fn post(core: &Core, parts: &Parts, body: &mut Body) -> Resp {
    let app = &core.app;
    let body = match body.read_request(parts, &app.config).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut answer = match resume::parse(&body) {
        Ok(a) => a,
        Err(e) => return engine_error(e, "step response"),
    };
    answer.traceparent = crate::telemetry::incoming(&parts.headers).map(|t| t.0);
    match core.executor.apply_response(&answer, HTTP_PATIENCE).await {
        Ok(Applied::Resumed) => ok("success"),
        Ok(Applied::Duplicate) => ok("duplicate response ignored"),
        Ok(Applied::NotWaiting(msg) | Applied::NotYet(msg)) => error(StatusCode::CONFLICT, &msg),
        Ok(Applied::Unknown) => error(StatusCode::NOT_FOUND, "no service request with this id"),
        Err(e) => engine_error(e, "step response"),
    }
}

fn ok(message: &'static str) -> Resp {
    json_bytes(
        StatusCode::OK,
        bytes::Bytes::from(format!("{{\"code\":200,\"message\":\"{message}\"}}")),
    )
}
