//! `GET /health`, `GET /ready` and `GET /metrics`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};

use super::response::{error, json_bytes, Resp};
use crate::state::Core;

/// Liveness: the process answers. Kept as cheap as a response can be, since it is also the
/// benchmark ceiling every other figure is compared with.
pub fn health() -> Resp {
    json_bytes(StatusCode::OK, Bytes::from_static(b"{\"status\":\"UP\"}"))
}

/// How long readiness waits for the database.
const READY_TIMEOUT: Duration = Duration::from_secs(1);

/// Readiness: migrations are done (the server only listens after them) and the database
/// answers a query now.
pub async fn ready(core: &Core) -> Resp {
    match crate::ops::system::ready(&core.pool, READY_TIMEOUT).await {
        true => json_bytes(
            StatusCode::OK,
            Bytes::from_static(b"{\"status\":\"READY\"}"),
        ),
        false => {
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, "database unreachable");
            r.headers_mut()
                .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("1"));
            r
        }
    }
}

/// The OpenAPI 3.1 document of every route, kept in the repository and served as it is.
pub fn openapi() -> Resp {
    json_bytes(StatusCode::OK, Bytes::from_static(OPENAPI))
}

/// `openapi.json` at the top of the repository.
static OPENAPI: &[u8] = include_bytes!("../../openapi.json");

/// Prometheus text exposition (`ops::system::metrics_text`).
pub async fn metrics(core: &Core) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(
        crate::ops::system::metrics_text(&core.app, &core.pool).await,
    )));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}
