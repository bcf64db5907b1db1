//! `POST /serviceRequest/{workflow}` (the hot path), `GET /serviceRequest/{id}` and
//! `GET /serviceRequests/{workflow}`.
//!
//! The create handler never logs and allocates only what leaves with the row: the body
//! (already one buffer from hyper in the common case), the forwarded headers and the
//! answer. Validation copies the body into a per-thread scratch buffer because
//! simd-json parses in place.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::http::request::Parts;
use hyper::StatusCode;
use tokio::sync::oneshot;

use super::body::Body;
use super::response::{error, json, json_bytes, store_error, unavailable, Resp};
use crate::backoff::Backoff;
use crate::config::AckMode;
use crate::state::Core;
use crate::store::buffer::PushError;
use crate::store::cancel::Cancelled;
use crate::store::reader::Want;
use crate::store::status;
use crate::store::{queries, AckError, Created, LoadError, PendingRow};
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
/// repeats kept). Values that are not UTF-8 are dropped. With a server span (tracing on),
/// the trace context kept is that span's instead of the caller's: the request's span is
/// its child (`telemetry::request_span_id`).
pub fn forwardable_headers(
    deny: &[&str],
    headers: &HeaderMap,
    server: Option<&crate::telemetry::ServerSpan>,
) -> Bytes {
    let mut out = Vec::with_capacity(64);
    out.push(b'[');
    if let Some(s) = server {
        out.extend_from_slice(b"[\"traceparent\",\"");
        out.extend_from_slice(&s.ctx.encode());
        out.extend_from_slice(b"\"]");
        if let Some(state) = &s.tracestate {
            out.extend_from_slice(b",[\"tracestate\",");
            serde_json::to_writer(&mut out, state).expect("strings serialize");
            out.push(b']');
        }
    }
    for (name, value) in headers {
        let n = name.as_str();
        if deny.contains(&n) || (server.is_some() && (n == "traceparent" || n == "tracestate")) {
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
        // Logged once, where it was found (`WorkflowMap::get_or_load`).
        Err(LoadError::Invalid { .. }) => Ok(None),
        Err(LoadError::Store(e)) => Err(store_error(e, "workflow lookup")),
    }
}

fn unknown_workflow(name: &str) -> Resp {
    error(
        StatusCode::NOT_FOUND,
        &format!("No record found with given workflow name : {name}"),
    )
}

/// Longest `Idempotency-Key` accepted.
pub const MAX_KEY_LEN: usize = 255;

/// The `Idempotency-Key` header, as the digest it is kept by (scoped to `workflow`): None
/// without one; 400 for one that is empty, too long, or not printable ASCII.
fn idempotency_key(parts: &Parts, workflow: &str) -> Result<Option<uuid::Uuid>, Resp> {
    let Some(v) = parts.headers.get(&IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    match v.to_str() {
        Ok(k)
            if !k.is_empty()
                && k.len() <= MAX_KEY_LEN
                && k.bytes().all(|b| b.is_ascii_graphic() || b == b' ') =>
        {
            Ok(Some(crate::store::idempotency::key_hash(workflow, k)))
        }
        _ => Err(error(
            StatusCode::BAD_REQUEST,
            &format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} printable ASCII characters"),
        )),
    }
}

static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// `POST /serviceRequest/{workflow}`. With an `Idempotency-Key` (beyond Clamp), a repeat
/// of a create for the same workflow within the window answers the original request
/// (200) instead of creating another, or 422 when its payload differs; a keyed create is
/// answered after its commit whatever the `ack` mode.
///
/// Beyond Clamp, `?version=N` runs version N of the workflow; without it the request runs
/// the latest version as its insert finds it (`store::pool::sql::INSERT_REQUESTS`).
pub async fn create(
    core: &Core,
    name: &str,
    parts: &Parts,
    body: &mut Body,
    server: Option<&crate::telemetry::ServerSpan>,
) -> Resp {
    let app = &core.app;
    let pinned = match parts
        .uri
        .query()
        .map(|q| super::query_param(Some(q), "version"))
    {
        None | Some(None) => None,
        Some(Some(v)) => match v.parse::<u32>() {
            Ok(n) if n > 0 => Some(n),
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "version: must be a whole number from 1",
                )
            }
        },
    };
    // Beyond Clamp: `?startAt=` / `?delayMs=` (read only when there is a query).
    let start = match parts.uri.query() {
        None => None,
        Some(q) => match super::delayed::start_time(q, std::time::SystemTime::now()) {
            Ok(s) => s,
            Err(resp) => return resp,
        },
    };
    let wf = match pinned {
        None => match find_workflow(core, name).await {
            Ok(Some(wf)) => wf,
            Ok(None) => return unknown_workflow(name),
            Err(resp) => return resp,
        },
        Some(v) => match app.workflows.get_or_load_version(&core.pool, name, v).await {
            Ok(Some(wf)) => wf,
            Ok(None) => {
                return error(
                    StatusCode::NOT_FOUND,
                    &format!("No record found with given workflow name : {name} (version {v})"),
                )
            }
            Err(LoadError::Invalid { .. }) => return unknown_workflow(name),
            Err(LoadError::Store(e)) => return store_error(e, "workflow lookup"),
        },
    };
    let key = match idempotency_key(parts, &wf.def.name) {
        Ok(k) => k,
        Err(resp) => return resp,
    };
    if core.buffer.presumed_down() {
        app.metrics.rejected_overload.inc();
        return unavailable("database unavailable, retry later");
    }
    let headers = forwardable_headers(&app.config.header_denylist, &parts.headers, server);
    let body = match body.read_request(parts, &app.config).await {
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
    if let Some(start) = start {
        if key.is_some() {
            return error(
                StatusCode::BAD_REQUEST,
                "Idempotency-Key cannot be combined with startAt or delayMs",
            );
        }
        // Boxed: the create future every request allocates stays the size of the hot path.
        return Box::pin(super::delayed::create(
            core,
            &wf,
            pinned.is_some(),
            &payload,
            &headers,
            start,
        ))
        .await;
    }
    let id = crate::ids::new_v7();
    let created_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let (ack, done) = if app.config.ack == AckMode::Commit || key.is_some() {
        let (tx, rx) = oneshot::channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let row = PendingRow {
        id,
        workflow: wf,
        pinned: pinned.is_some(),
        payload,
        headers,
        key,
        created_us,
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
    let Some(done) = done else {
        return json_bytes(StatusCode::OK, created_body(&id, "NEW"));
    };
    match done.await {
        Ok(Ok(Created::New(id))) => json_bytes(StatusCode::OK, created_body(&id, "NEW")),
        Ok(Ok(Created::Existing { id, status })) => {
            // A request deleted by retention since: its final status is not known any more.
            let status = status.as_deref().unwrap_or("DELETED");
            let mut r = json_bytes(StatusCode::OK, created_body(&id, status));
            r.headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            r
        }
        Ok(Ok(Created::Mismatch { id })) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!(
                "this Idempotency-Key was used for workflow {name} with another payload \
                 (service request {id})"
            ),
        ),
        Ok(Err(AckError::Invalid(msg))) => error(
            StatusCode::BAD_REQUEST,
            &format!("the payload cannot be stored: {msg}"),
        ),
        Ok(Err(AckError::Unavailable)) | Err(_) => {
            app.metrics.rejected_overload.inc();
            unavailable("database unavailable, retry later")
        }
    }
}

/// `{"pollUrl":"/serviceRequest/<id>","status":"<status>","serviceRequestId":"<id>"}` without serde.
fn created_body(id: &uuid::Uuid, status: &str) -> Bytes {
    let mut idbuf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let id = id.hyphenated().encode_lower(&mut idbuf);
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"{\"pollUrl\":\"/serviceRequest/");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\",\"status\":\"");
    out.extend_from_slice(status.as_bytes());
    out.extend_from_slice(b"\",\"serviceRequestId\":\"");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b"\"}");
    Bytes::from(out)
}

/// Longest cancel reason kept.
const MAX_REASON_LEN: usize = 1024;

/// `POST /serviceRequest/{id}/cancel` (beyond Clamp), with an optional body
/// `{"reason": "…"}`: no further step starts, a paused step stops waiting, `onFailure`
/// steps do not run. Idempotent; 409 once the request finished.
pub async fn cancel(core: &Core, id: &str, parts: &Parts, body: &mut Body) -> Resp {
    let id = match request_id(id) {
        Ok(id) => id,
        Err(resp) => return resp,
    };
    let app = &core.app;
    let body = match body.read_request(parts, &app.config).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let reason = if is_blank(&body) {
        None
    } else {
        match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(serde_json::Value::Object(o)) => match o.get("reason") {
                None | Some(serde_json::Value::Null) => None,
                Some(serde_json::Value::String(r)) if r.len() <= MAX_REASON_LEN => Some(r.clone()),
                Some(_) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        &format!("reason must be a string of at most {MAX_REASON_LEN} bytes"),
                    )
                }
            },
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "the body must be empty or a JSON object like {\"reason\": \"…\"}",
                )
            }
        }
    };
    cancel_with(core, id, reason).await
}

/// Cancels `id` (the console's cancel too), with `reason` or the default one.
pub(crate) async fn cancel_with(core: &Core, id: uuid::Uuid, reason: Option<String>) -> Resp {
    let app = &core.app;
    let reason = reason.unwrap_or_else(|| "cancelled by a client".into());
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "cancel service request"),
    };
    let answer = |reason: &str| {
        json(
            StatusCode::OK,
            &serde_json::json!({"serviceRequestId": id.to_string(), "status": "CANCELLED", "reason": reason}),
        )
    };
    match crate::store::cancel::cancel(&conn, id, &reason).await {
        Ok(Cancelled::Now(rows)) => {
            trace_cancelled(app, &rows);
            app.metrics.cancelled.inc();
            app.changes.notify(&id);
            answer(&reason)
        }
        Ok(Cancelled::Already { reason }) => answer(reason.as_deref().unwrap_or("")),
        Ok(Cancelled::Finished { status }) => error(
            StatusCode::CONFLICT,
            &format!("the service request is {status} and can no longer be cancelled"),
        ),
        Ok(Cancelled::Unknown) => error(StatusCode::NOT_FOUND, "no service request with this id"),
        Err(e) => store_error(e, "cancel service request"),
    }
}

/// Ends the spans of the requests a cancel finished, each with the cancel as its event.
fn trace_cancelled(app: &crate::engine::App, rows: &[crate::store::cancel::CancelledRow]) {
    for r in rows {
        let Some((t, trace)) = app.traced(&r.headers) else {
            continue;
        };
        let event = opentelemetry::trace::Event::new(
            "cancel",
            std::time::SystemTime::now(),
            vec![opentelemetry::KeyValue::new(
                "clamp.cancel.reason",
                r.reason.clone(),
            )],
            0,
        );
        t.end_request(
            &trace,
            &r.id,
            r.retries,
            &r.workflow_name,
            r.created_us,
            "CANCELLED",
            Some(&r.reason),
            vec![event],
        );
    }
}

/// A service request id from the path; 400 when it is not a UUID.
pub(crate) fn request_id(id: &str) -> Result<uuid::Uuid, Resp> {
    uuid::Uuid::parse_str(id).map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            "the service request id is not a valid UUID",
        )
    })
}

/// `GET /serviceRequest/{id}`, and beyond Clamp `?waitMs=N` (a long poll: answered when
/// the status changes, or after N ms with the status as it is).
///
/// A final answer (COMPLETED, FAILED) never changes once committed: it is kept in memory
/// (by the executor that finished the request, or after a database read) and answers
/// later reads without Postgres; anything else is read in one statement.
pub async fn get(core: &Core, id: &str, query: Option<&str>) -> Resp {
    let id = match request_id(id) {
        Ok(id) => id,
        Err(resp) => return resp,
    };
    let app = &core.app;
    let wait = match super::query_param(query, "waitMs") {
        None => None,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(0) => None,
            Ok(ms) if ms <= app.config.max_wait.as_millis() as u64 => {
                Some(Duration::from_millis(ms))
            }
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "waitMs must be a number of milliseconds from 0 to {}",
                        app.config.max_wait.as_millis()
                    ),
                )
            }
        },
    };
    if let Some(body) = app.status_cache.get(&id) {
        app.metrics.status_reads[0].inc();
        return json_bytes(StatusCode::OK, body);
    }
    // Registered before anything is read, so a change committed meanwhile is not missed.
    let mut watch = wait.map(|_| app.changes.watch(id));
    let (Some(wait), Some(watch)) = (wait, watch.as_mut()) else {
        return match read_status(core, id).await {
            Ok(r) => json_bytes(StatusCode::OK, r.body),
            Err(resp) => resp,
        };
    };
    let deadline = tokio::time::Instant::now() + wait;
    // The status at the start. A request running here exists and shows no final status;
    // its next status change wakes this wait, with no read before it (None).
    let mut baseline: Option<std::borrow::Cow<'static, str>> = None;
    if !app.running.contains(&id) {
        let r = match read_status(core, id).await {
            Ok(r) => r,
            Err(resp) => return resp,
        };
        if status::is_final(&r.status) {
            return json_bytes(StatusCode::OK, r.body);
        }
        baseline = Some(r.status);
    }
    // A request run by another instance changes without telling this one: look again,
    // a little less often each time.
    let mut elsewhere = Backoff::new(Duration::from_millis(25), Duration::from_millis(500));
    loop {
        if app.running.contains(&id) {
            // Returns on a status change, or at the deadline.
            watch.changed(deadline).await;
        } else {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(elsewhere.next_delay().min(left)).await;
        }
        if let Some(body) = app.status_cache.get(&id) {
            app.metrics.status_reads[0].inc();
            return json_bytes(StatusCode::OK, body);
        }
        let r = match read_status(core, id).await {
            Ok(r) => r,
            Err(resp) => return resp,
        };
        let changed = baseline.as_ref() != Some(&r.status);
        if changed || tokio::time::Instant::now() >= deadline {
            return json_bytes(StatusCode::OK, r.body);
        }
    }
}

/// How long a status read waits for this process's memory of a request to catch up with
/// the request row it read (a transition committed and not yet applied here).
const CATCH_UP: Duration = Duration::from_millis(50);

/// A status answer read from Postgres.
struct Read {
    body: bytes::Bytes,
    status: std::borrow::Cow<'static, str>,
}

/// Reads a request's answer from Postgres (batched with concurrent reads), keeping it
/// when it is final; 404 or 503.
///
/// Running here from its first step, its step rows are here and only its row is read:
/// found where the last committed transition left it, the row goes with exactly those
/// step rows; found anywhere else (moved on, paused, cancelled), the whole read follows.
async fn read_status(core: &Core, id: uuid::Uuid) -> Result<Read, Resp> {
    let app = &core.app;
    let fail = |e| store_error(e, "service request status");
    if let Some(live) = app.running.live(&id) {
        let f = match core.reader.read(id, Want::Row).await {
            Ok(Some(f)) => f,
            Ok(None) => {
                return Err(error(
                    StatusCode::NOT_FOUND,
                    "no service request with this id",
                ))
            }
            Err(e) => return Err(fail(e)),
        };
        // The row may be ahead of memory: a transition committed and the step writer has
        // not applied it yet (it will within moments). The row is what the answer shows,
        // so wait for memory to catch up with it rather than read everything.
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        let mut live = Some(live);
        loop {
            if let Some(l) = &live {
                if f.head.current_step_id == l.current_step_id
                    && f.head.step_attempts == l.step_attempts
                    && matches!(&*f.head.status, "NEW" | "IN_PROGRESS")
                {
                    app.metrics.status_reads[2].inc();
                    return Ok(Read {
                        body: status::render(id, &f.head, &l.steps),
                        status: f.head.status,
                    });
                }
            }
            if status::is_final(&f.head.status) {
                if let Some(body) = app.status_cache.get(&id) {
                    app.metrics.status_reads[0].inc();
                    return Ok(Read {
                        body,
                        status: f.head.status,
                    });
                }
            }
            if tokio::time::Instant::now() >= deadline || !app.running.contains(&id) {
                break;
            }
            app.running.live_changed(id, deadline).await;
            live = app.running.live(&id);
        }
    }
    match core.reader.read(id, Want::Whole).await {
        Ok(Some(f)) => {
            app.metrics.status_reads[1].inc();
            let body = status::render(id, &f.head, &f.steps);
            if status::never_changes(&f.head.status) {
                app.status_cache.insert(id, body.clone(), f.finished_ms);
            }
            Ok(Read {
                body,
                status: f.head.status,
            })
        }
        Ok(None) => Err(error(
            StatusCode::NOT_FOUND,
            "no service request with this id",
        )),
        Err(e) => Err(fail(e)),
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
        let b = forwardable_headers(crate::config::DEFAULT_HEADER_DENYLIST, &h, None);
        let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                ["x-request-id", "abc"],
                ["x-multi", "1"],
                ["x-multi", "2 \"q\""]
            ])
        );
        assert_eq!(
            &forwardable_headers(&[], &HeaderMap::new(), None)[..],
            b"[]"
        );
    }

    #[test]
    fn created_body_shape() {
        let id = uuid::Uuid::nil();
        let v: serde_json::Value = serde_json::from_slice(&created_body(&id, "NEW")).unwrap();
        assert_eq!(v["pollUrl"], format!("/serviceRequest/{id}"));
        assert_eq!(v["status"], "NEW");
        assert_eq!(v["serviceRequestId"], id.to_string());
    }
}
