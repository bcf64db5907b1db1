//! `POST /serviceRequest/{workflow}` (the hot path), `GET /serviceRequest/{id}` and
//! `GET /serviceRequests/{workflow}`.
//!
//! The create handler never logs and allocates only what leaves with the row: the body
//! (already one buffer from hyper in the common case), the forwarded headers and the
//! answer. Validation copies the body into a per-thread scratch buffer because
//! simd-json parses in place.

use std::cell::RefCell;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Request, StatusCode};
use tokio::sync::oneshot;

use super::body;
use super::response::{error, json, json_bytes, store_error, unavailable, Resp};
use crate::config::AckMode;
use crate::state::Core;
use crate::store::buffer::PushError;
use crate::store::{queries, AckError, LoadError, PendingRow};
use crate::workflow::Workflow;

thread_local! {
    /// simd-json mutates its input and wants scratch buffers; both are reused per thread.
    static SCRATCH: RefCell<(Vec<u8>, simd_json::Buffers)> =
        RefCell::new((Vec::with_capacity(4096), simd_json::Buffers::default()));
}

/// The stored payload for an empty body.
const EMPTY_OBJECT: &[u8] = b"{}";

/// Checks that `body` is empty or one JSON object that Postgres can store.
pub fn validate_payload(body: &[u8]) -> Result<(), &'static str> {
    SCRATCH.with(|s| {
        let (scratch, buffers) = &mut *s.borrow_mut();
        scratch.clear();
        scratch.extend_from_slice(body);
        let tape = simd_json::to_tape_with_buffers(scratch, buffers)
            .map_err(|_| "the body is not valid JSON")?;
        match tape.0.first() {
            Some(simd_json::Node::Object { .. }) => {}
            _ => return Err("the body must be a JSON object"),
        }
        // jsonb cannot store U+0000; refuse it here rather than fail a whole batch.
        for node in &tape.0 {
            if let simd_json::Node::String(s) = node {
                if s.as_bytes().contains(&0) {
                    return Err("the body contains \\u0000, which cannot be stored");
                }
            }
        }
        Ok(())
    })
}

fn is_blank(b: &[u8]) -> bool {
    b.iter().all(|c| c.is_ascii_whitespace())
}

/// The forwardable headers as a JSON array of `[name, value]` pairs (order and
/// repeats kept). Values that are not UTF-8 are dropped.
pub fn forwardable_headers(deny: &[&str], headers: &HeaderMap) -> Bytes {
    let mut out = Vec::with_capacity(64);
    out.push(b'[');
    for (name, value) in headers {
        let n = name.as_str();
        if deny.contains(&n) {
            continue;
        }
        let Ok(v) = value.to_str() else { continue };
        if out.len() > 1 {
            out.push(b',');
        }
        out.extend_from_slice(b"[\"");
        // Header names are lower-case tokens: nothing to escape.
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b"\",");
        serde_json::to_writer(&mut out, v).expect("strings serialize");
        out.push(b']');
    }
    out.push(b']');
    Bytes::from(out)
}

/// Finds a workflow: the map first, then Postgres once (another instance may have made
/// it). A stored workflow that no longer validates is answered as unknown (and logged).
pub async fn find_workflow(core: &Core, name: &str) -> Result<Option<Arc<Workflow>>, Resp> {
    match core.app.workflows.get_or_load(&core.pool, name).await {
        Ok(found) => Ok(found),
        Err(LoadError::Invalid { reason, .. }) => {
            tracing::error!(workflow = name, %reason, "stored workflow no longer validates");
            Ok(None)
        }
        Err(LoadError::Store(e)) => Err(store_error(e, "workflow lookup")),
    }
}

fn unknown_workflow(name: &str) -> Resp {
    error(
        StatusCode::NOT_FOUND,
        &format!("No record found with given workflow name : {name}"),
    )
}

/// `POST /serviceRequest/{workflow}`.
pub async fn create(core: &Core, name: &str, req: Request<Incoming>) -> Resp {
    let app = &core.app;
    let wf = match find_workflow(core, name).await {
        Ok(Some(wf)) => wf,
        Ok(None) => return unknown_workflow(name),
        Err(resp) => return resp,
    };
    if core.buffer.presumed_down() {
        app.metrics.rejected_overload.inc();
        return unavailable("database unavailable, retry later");
    }
    let headers = forwardable_headers(&app.header_denylist, req.headers());
    let body = match body::read(req, app.config.body_limit, app.config.header_timeout).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let payload = if is_blank(&body) {
        Bytes::from_static(EMPTY_OBJECT)
    } else {
        if let Err(msg) = validate_payload(&body) {
            return error(StatusCode::BAD_REQUEST, msg);
        }
        body
    };
    let id = crate::ids::new_v7();
    let (ack, done) = match app.config.ack {
        AckMode::Commit => {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        }
        AckMode::Accept => (None, None),
    };
    let row = PendingRow {
        id,
        workflow: wf,
        payload,
        headers,
        ack,
    };
    match core.buffer.push(row, app.config.enqueue_wait).await {
        Ok(()) => {}
        Err(PushError::Overloaded) => {
            app.metrics.rejected_overload.inc();
            return unavailable("too many requests in flight, retry later");
        }
        Err(PushError::Closed) => return unavailable("shutting down"),
    }
    if let Some(done) = done {
        match done.await {
            Ok(Ok(())) => {}
            Ok(Err(AckError::Invalid(msg))) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("the payload cannot be stored: {msg}"),
                )
            }
            Ok(Err(AckError::Unavailable)) | Err(_) => {
                app.metrics.rejected_overload.inc();
                return unavailable("database unavailable, retry later");
            }
        }
    }
    json_bytes(StatusCode::OK, created_body(&id))
}

/// `{"pollUrl":"/serviceRequest/<id>","status":"NEW","serviceRequestId":"<id>"}` without serde.
fn created_body(id: &uuid::Uuid) -> Bytes {
    let mut idbuf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let id = id.hyphenated().encode_lower(&mut idbuf);
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"{\"pollUrl\":\"/serviceRequest/");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\",\"status\":\"NEW\",\"serviceRequestId\":\"");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\"}");
    Bytes::from(out)
}

/// `GET /serviceRequest/{id}`.
pub async fn get(core: &Core, id: &str) -> Resp {
    let Ok(id) = uuid::Uuid::parse_str(id) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the service request id is not a valid UUID",
        );
    };
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "service request status"),
    };
    match queries::service_request_status(&conn, id).await {
        Ok(Some(v)) => json(StatusCode::OK, &v),
        Ok(None) => error(StatusCode::NOT_FOUND, "no service request with this id"),
        Err(e) => store_error(e, "service request status"),
    }
}

/// Parses one paging parameter: required, an integer, at least `min`, at most `max`.
pub fn page_param(query: Option<&str>, key: &str, min: i64, max: i64) -> Result<i64, Resp> {
    let Some(v) = super::query_param(query, key) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "page number or page size has not been defined",
        ));
    };
    match v.trim().parse::<i64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(error(
            StatusCode::BAD_REQUEST,
            "page number or page size is not in proper format",
        )),
    }
}

/// Largest page a list endpoint returns.
pub const MAX_PAGE_SIZE: i64 = 1000;

/// `GET /serviceRequests/{workflow}?pageNumber=0&pageSize=10` (0-based, as Clamp).
pub async fn list(core: &Core, name: &str, query: Option<&str>) -> Resp {
    let page_number = match page_param(query, "pageNumber", 0, i64::from(i32::MAX)) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let page_size = match page_param(query, "pageSize", 1, MAX_PAGE_SIZE) {
        Ok(n) => n,
        Err(r) => return r,
    };
    match find_workflow(core, name).await {
        Ok(Some(_)) => {}
        Ok(None) => return unknown_workflow(name),
        Err(r) => return r,
    }
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "list service requests"),
    };
    match queries::service_requests_page(&conn, name, page_size, page_size * page_number).await {
        Ok(items) => json(
            StatusCode::OK,
            &serde_json::json!({"serviceRequests": items, "pageNumber": page_number, "pageSize": page_size}),
        ),
        Err(e) => store_error(e, "list service requests"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_payloads() {
        let check = |body: &str, ok: bool| {
            assert_eq!(validate_payload(body.as_bytes()).is_ok(), ok, "{body}")
        };
        check(r#"{"a": 1, "b": [1, 2, {"c": null}]}"#, true);
        check(r#"  {"nested": {"deep": "x"}}  "#, true);
        check("{}", true);
        check("[1, 2]", false);
        check("\"text\"", false);
        check("42", false);
        check("null", false);
        check("{\"a\": }", false);
        check("{\"a\": 1", false);
        check("{\"a\": 1} trailing", false);
        check(r#"{"bad": "nul \u0000 here"}"#, false);
        check("{\"k\": \"\u{e9}t\u{e9}\"}", true);
    }

    #[test]
    fn headers_are_filtered_and_encoded() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", "abc".parse().unwrap());
        h.insert("authorization", "secret".parse().unwrap());
        h.insert("host", "x".parse().unwrap());
        h.append("x-multi", "1".parse().unwrap());
        h.append("x-multi", "2 \"q\"".parse().unwrap());
        let b = forwardable_headers(crate::state::DEFAULT_HEADER_DENYLIST, &h);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                ["x-request-id", "abc"],
                ["x-multi", "1"],
                ["x-multi", "2 \"q\""]
            ])
        );
        assert_eq!(&forwardable_headers(&[], &HeaderMap::new())[..], b"[]");
    }

    #[test]
    fn created_body_shape() {
        let id = uuid::Uuid::nil();
        let v: serde_json::Value = serde_json::from_slice(&created_body(&id)).unwrap();
        assert_eq!(v["pollUrl"], format!("/serviceRequest/{id}"));
        assert_eq!(v["status"], "NEW");
        assert_eq!(v["serviceRequestId"], id.to_string());
    }
}
