//! Building responses: JSON bodies, Clamp's `{"code","message"}` errors, and the one
//! mapping from internal errors to HTTP.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Response, StatusCode};

use crate::ops::OpError;
use crate::store::StoreError;

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

/// Maps an operation's error to a response, the one mapping: its class is the status,
/// its message the answer's. A database failure's detail is logged here, once, and never
/// sent.
pub fn op_error(e: OpError) -> Resp {
    let message = e.message();
    match e {
        OpError::BadRequest(_) => error(StatusCode::BAD_REQUEST, &message),
        OpError::Forbidden(_) => error(StatusCode::FORBIDDEN, &message),
        OpError::NotFound(_) => error(StatusCode::NOT_FOUND, &message),
        OpError::Conflict(_) => error(StatusCode::CONFLICT, &message),
        OpError::Unprocessable(_) => error(StatusCode::UNPROCESSABLE_ENTITY, &message),
        OpError::Unavailable(m) => unavailable(m),
        OpError::Store { error, doing } => store_error(error, doing),
        OpError::Internal(detail) => {
            tracing::error!(%detail, "internal error");
            error(StatusCode::INTERNAL_SERVER_ERROR, &message)
        }
    }
}

/// Maps a store error to a response. Details are logged here, once, and never sent: the
/// client of a refused row gets a fixed message.
pub fn store_error(e: StoreError, context: &'static str) -> Resp {
    match e {
        StoreError::Conflict => error(StatusCode::CONFLICT, "already exists"),
        StoreError::Invalid(detail) => {
            tracing::info!(%detail, "{context}: the database refused the data");
            error(
                StatusCode::BAD_REQUEST,
                "invalid data: the database refused it",
            )
        }
        StoreError::Unavailable(detail) => {
            crate::http::outage::warn(context, &detail.to_string());
            unavailable("database unavailable, retry later")
        }
        StoreError::Internal(detail) => {
            tracing::error!(%detail, "{context}: database error");
            error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }
    }
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
