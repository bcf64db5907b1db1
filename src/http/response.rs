//! Building responses: JSON bodies, Clamp's `{"code","message"}` errors, and the one
//! mapping from internal errors to HTTP.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};

use crate::ops::OpError;
use crate::ops::StoreError;

/// Every response body is a single buffer.
pub type Resp = Response<Full<Bytes>>;

static JSON: HeaderValue = HeaderValue::from_static("application/json");

/// A JSON response from bytes already serialized.
#[inline]
pub fn json_bytes(status: StatusCode, body: Bytes) -> Resp {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, JSON.clone());
    r
}

/// A JSON response from a serde value.
pub fn json<T: serde::Serialize>(status: StatusCode, body: &T) -> Resp {
    json_bytes(
        status,
        Bytes::from(serde_json::to_vec(body).expect("response values serialize")),
    )
}

/// 204, no body.
pub fn no_content() -> Resp {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::NO_CONTENT;
    r
}

/// Clamp's error shape: `{"code": <status>, "message": "<why>"}`.
pub fn error(status: StatusCode, message: &str) -> Resp {
    let mut body = Vec::with_capacity(message.len() + 32);
    body.extend_from_slice(b"{\"code\":");
    body.extend_from_slice(itoa::Buffer::new().format(status.as_u16()).as_bytes());
    body.extend_from_slice(b",\"message\":");
    serde_json::to_writer(&mut body, message).expect("strings serialize");
    body.push(b'}');
    json_bytes(status, Bytes::from(body))
}

/// 503 with `Retry-After`, for overload and outages.
pub fn unavailable(message: &str) -> Resp {
    let mut r = error(StatusCode::SERVICE_UNAVAILABLE, message);
    r.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Maps an operation's error to a response: its status and message are `OpError`'s own
/// (the one table, which the console reads too). A database failure's or an internal
/// error's detail is logged here, once, and never sent.
pub fn op_error(e: OpError) -> Resp {
    let message = e.message();
    let status = status_of(&e);
    match e {
        OpError::Unavailable(_) => return unavailable(&message),
        OpError::Store { error, doing } => match error {
            StoreError::Conflict => {}
            StoreError::Invalid(detail) => {
                tracing::info!(%detail, "{doing}: the database refused the data")
            }
            StoreError::Unavailable(detail) => {
                crate::http::outage::warn(doing, &detail.to_string());
                return unavailable(&message);
            }
            StoreError::Internal(detail) => tracing::error!(%detail, "{doing}: database error"),
        },
        OpError::Internal(detail) => tracing::error!(%detail, "internal error"),
        _ => {}
    }
    error(status, &message)
}

/// The status `e` is answered with (`OpError::status`).
pub fn status_of(e: &OpError) -> StatusCode {
    StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn error_shape() {
        let r = error(StatusCode::NOT_FOUND, "no \"such\" thing");
        assert_eq!(r.status(), 404);
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"code": 404, "message": "no \"such\" thing"})
        );
        let r = unavailable("x");
        assert_eq!(r.headers()[RETRY_AFTER], "1");
    }
}
