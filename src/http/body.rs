//! Reading request bodies with a size limit and a time limit.

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::CONTENT_LENGTH;
use hyper::{Request, StatusCode};

use super::response::{error, Resp};

/// Reads the whole body: 413 past `limit` (checked from Content-Length first, so a large
/// upload is refused before it is read), 408 when it does not arrive within `timeout`.
pub async fn read(
    req: Request<Incoming>,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, Resp> {
    if let Some(len) = req.headers().get(CONTENT_LENGTH) {
        match len.to_str().ok().and_then(|s| s.parse::<u64>().ok()) {
            Some(n) if n > limit as u64 => return Err(too_large(limit)),
            Some(_) => {}
            None => return Err(error(StatusCode::BAD_REQUEST, "invalid Content-Length")),
        }
    }
    let body = Limited::new(req.into_body(), limit);
    match tokio::time::timeout(timeout, body.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(limit)),
        Ok(Err(_)) => Err(error(
            StatusCode::BAD_REQUEST,
            "the request body could not be read",
        )),
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            "the request body did not arrive in time",
        )),
    }
}

fn too_large(limit: usize) -> Resp {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("the request body is larger than {limit} bytes"),
    )
}
