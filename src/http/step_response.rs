//! `POST /stepResponse`: the answer to a paused ASYNC step, applied (`ops::respond`)
//! exactly as the broker consumers apply theirs.

use std::time::Duration;

use hyper::http::request::Parts;
use hyper::StatusCode;

use super::body::Body;
use super::response::{json_bytes, op_error, Resp};
use crate::ops::respond as resume;
use crate::ops::respond::Responded;
use crate::ops::OpError;
use crate::state::Core;

/// How long `POST /stepResponse` waits for a pause still being written before it says 409.
const HTTP_PATIENCE: Duration = Duration::from_secs(2);

/// `POST /stepResponse`.
pub async fn post(core: &Core, parts: &Parts, body: &mut Body) -> Resp {
    let app = &core.app;
    let body = or_answer!(body.read_request(parts, &app.config).await);
    let mut answer = match resume::parse(&body) {
        Ok(a) => a,
        Err(e) => return op_error(OpError::engine("step response")(e)),
    };
    answer.traceparent = crate::telemetry::incoming(&parts.headers).map(|t| t.0);
    match crate::ops::respond::respond(core, &answer, HTTP_PATIENCE).await {
        Ok(Responded::Resumed) => ok("success"),
        Ok(Responded::Duplicate) => ok("duplicate response ignored"),
        Err(e) => op_error(e),
    }
}

fn ok(message: &'static str) -> Resp {
    json_bytes(
        StatusCode::OK,
        bytes::Bytes::from(format!("{{\"code\":200,\"message\":\"{message}\"}}")),
    )
}
