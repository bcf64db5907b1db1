//! Request bodies: reading one with a size and a time limit, and settling what a handler
//! did not read, so that an early answer (404, 401, 413, 503, …) never breaks a
//! keep-alive connection. A body of a reasonable size (within the limit) is read and
//! discarded before the answer goes out, and the connection stays usable; anything else
//! (too large, too slow, cut short) is answered with `Connection: close` and a lingering
//! close (`conn.rs`), so the client still reads the answer.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as _, Incoming};
use hyper::header::{HeaderMap, HeaderValue, CONNECTION, CONTENT_LENGTH};
use hyper::StatusCode;

use super::conn::ConnState;
use super::response::{error, Resp};

/// A request's body, until a handler reads it (or the request is answered without it).
pub struct Body {
    unread: Option<Incoming>,
    /// Read in part and given up on (too large, too slow, cut short): what is left of it
    /// is still on the wire, so the connection cannot carry another request.
    spoiled: bool,
}

/// The body's declared length, if it declared one that parses.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

impl Body {
    /// `read_request`, parsed as one JSON value; 400 when it is not JSON.
    pub async fn read_json(
        &mut self,
        parts: &hyper::http::request::Parts,
        cfg: &crate::config::Config,
    ) -> Result<serde_json::Value, Resp> {
        let bytes = self.read_request(parts, cfg).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                &format!("the body is not valid JSON: {e}"),
            )
        })
    }

    /// `read` with the server's limits: its body size and its wait for the body.
    pub async fn read_request(
        &mut self,
        parts: &hyper::http::request::Parts,
        cfg: &crate::config::Config,
    ) -> Result<Bytes, Resp> {
        self.read(&parts.headers, cfg.body_limit, cfg.header_timeout)
            .await
    }

    pub fn new(b: Incoming) -> Body {
        Body {
            unread: Some(b),
            spoiled: false,
        }
    }

    /// Reads the whole body: 413 past `limit` (from Content-Length first, so a large
    /// upload is refused before it is read), 408 when it does not arrive within `timeout`.
    pub async fn read(
        &mut self,
        headers: &HeaderMap,
        limit: usize,
        timeout: Duration,
    ) -> Result<Bytes, Resp> {
        if content_length(headers).is_some_and(|n| n > limit as u64) {
            return Err(too_large(limit));
        }
        let Some(incoming) = self.unread.take() else {
            return Ok(Bytes::new());
        };
        let mut collect = std::pin::pin!(Limited::new(incoming, limit).collect());
        // A small body usually arrives with its head: when it is all here already, it is
        // read without arming a timer (one fewer timer-wheel entry per request).
        let read = match futures_util::FutureExt::now_or_never(collect.as_mut()) {
            Some(r) => Ok(r),
            None => tokio::time::timeout(timeout, collect).await,
        };
        let result = match read {
            // A copy of its own: the body as read is a slice of the connection's read
            // buffer, and a request kept in memory (a running job, a cached answer) would
            // pin that whole buffer and make hyper allocate a new one for the next read.
            Ok(Ok(collected)) => return Ok(Bytes::copy_from_slice(&collected.to_bytes())),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(limit)),
            Ok(Err(_)) => Err(error(
                StatusCode::BAD_REQUEST,
                "the request body could not be read",
            )),
            Err(_) => Err(error(
                StatusCode::REQUEST_TIMEOUT,
                "the request body did not arrive in time",
            )),
        };
        self.spoiled = true;
        result
    }

    /// After the handler answered: reads and discards what is left of a body within
    /// `limit` (for at most `timeout`) so the connection stays usable; otherwise marks the
    /// answer `Connection: close` and the connection's close as lingering.
    pub async fn settle(
        self,
        headers: &HeaderMap,
        resp: &mut Resp,
        conn: &ConnState,
        limit: usize,
        timeout: Duration,
    ) {
        let rest = match self.unread {
            _ if self.spoiled => None,
            None => return,
            Some(b) if b.is_end_stream() => return,
            Some(b) => Some(b),
        };
        if let Some(rest) = rest {
            if content_length(headers).is_none_or(|n| n <= limit as u64)
                && drain(rest, limit, timeout).await
            {
                return;
            }
        }
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        conn.linger();
    }
}

/// Reads `body` to its end and drops it; false when it is longer than `limit`, slower
/// than `timeout`, or cut short.
async fn drain(body: Incoming, limit: usize, timeout: Duration) -> bool {
    let mut body = Limited::new(body, limit);
    let all = async {
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(timeout, all).await.unwrap_or(false)
}

fn too_large(limit: usize) -> Resp {
    error(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("the request body is larger than {limit} bytes"),
    )
}
