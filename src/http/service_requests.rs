//! `POST /serviceRequest/{workflow}` (the hot path), `GET /serviceRequest/{id}`,
//! `GET /serviceRequests/{workflow}` and `POST /serviceRequest/{id}/cancel`: their
//! input read from the request, the operation called (`ops`), its result answered.
//!
//! The create handler never logs and allocates only what leaves with the row: the body
//! (already one buffer from hyper in the common case), the forwarded headers and the
//! answer.

use std::time::Duration;

use bytes::Bytes;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use hyper::http::request::Parts;
use hyper::StatusCode;

use super::answers;
use super::body::Body;
use super::response::{error, json, json_bytes, op_error, Resp};
use crate::ops::create::{Ask, Outcome};
use crate::ops::lists::MAX_PAGE_SIZE;
use crate::state::Core;
use crate::status::{RequestStatus, DELETED};
use crate::tokens::Caller;

/// The forwardable headers as a JSON array of `[name, value]` pairs (order and
/// repeats kept). Values that are not UTF-8 are dropped. With a server span (tracing on),
/// the trace context kept is that span's instead of the caller's: the request's span is
/// its child (`telemetry::request_span_id`). An `Authorization` the operator forwards is
/// kept only when it is not one of clamp's own bearer tokens (`tokens`): clamp's token
/// is never stored with a request nor sent to a step.
pub fn forwardable_headers(
    deny: &[&str],
    headers: &HeaderMap,
    server: Option<&crate::telemetry::ServerSpan>,
    tokens: &crate::tokens::ApiTokens,
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
        if name == AUTHORIZATION && is_clamps_token(tokens, v) {
            continue;
        }
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

/// Whether an `Authorization` value presents one of clamp's own tokens (in force now, or
/// any bearer token while tokens are on, since it was presented to clamp).
fn is_clamps_token(tokens: &crate::tokens::ApiTokens, value: &str) -> bool {
    let Some((scheme, token)) = value.trim().split_once(' ') else {
        return false;
    };
    scheme.eq_ignore_ascii_case("bearer")
        && (tokens.is_on() || tokens.current().find(token.trim().as_bytes()).is_some())
}

static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
static LABELS: HeaderName = HeaderName::from_static(crate::labels::HEADER);

/// `POST /serviceRequest/{workflow}`. With an `Idempotency-Key` (beyond Clamp), a repeat
/// of a create for the same workflow within the window answers the original request
/// (200) instead of creating another, or 422 when its payload differs; a keyed create is
/// answered after its commit whatever the `ack` mode.
///
/// Beyond Clamp, `?version=N` runs version N of the workflow, `?startAt=` or
/// `?delayMs=` starts it later (`http::delayed`), `?deadline=` (ISO 8601) bounds how
/// long it may run, over its workflow's `deadline`, and `?priority=` (1 to 9, default 5)
/// puts it before requests of lower priorities waiting to run.
pub async fn create(
    core: &Core,
    name: &str,
    parts: &Parts,
    body: &mut Body,
    server: Option<&crate::telemetry::ServerSpan>,
) -> Resp {
    let app = &core.app;
    // The query is read only when there is one.
    let query = parts.uri.query();
    let param = |k: &str| query.and_then(|q| super::query_param(Some(q), k));
    let (version, start_at, delay_ms) = (param("version"), param("startAt"), param("delayMs"));
    let (deadline, priority) = (param("deadline"), param("priority"));
    let ask = Ask {
        workflow: name,
        version: version.as_deref(),
        start_at: start_at.as_deref(),
        delay_ms: delay_ms.as_deref(),
        deadline: deadline.as_deref(),
        priority: priority.as_deref(),
        key: parts
            .headers
            .get(&IDEMPOTENCY_KEY)
            .map(HeaderValue::as_bytes),
        labels: super::query_params(query, "label"),
        labels_header: parts.headers.get(&LABELS).map(HeaderValue::as_bytes),
        after_commit: false,
    };
    let admitted = or_answer!(crate::ops::create::admit(core, &ask)
        .await
        .map_err(op_error));
    let headers = forwardable_headers(
        &app.config.header_denylist,
        &parts.headers,
        server,
        &app.config.api_tokens,
    );
    let body = or_answer!(body.read_request(parts, &app.config).await);
    match crate::ops::create::create(core, admitted, headers, body).await {
        Ok(Outcome::New(id)) => json_bytes(
            StatusCode::OK,
            answers::created(&id, crate::status::RequestStatus::New.as_str()),
        ),
        Ok(Outcome::Delayed { id, start }) => json(
            StatusCode::OK,
            &answers::created_with(
                &id,
                RequestStatus::New.as_str(),
                &[("startAt", super::rfc3339(start).into())],
            ),
        ),
        Ok(Outcome::Existing { id, status }) => {
            // A request deleted by retention since: its final status is not known any more.
            let status = status.map_or(DELETED, RequestStatus::as_str);
            let mut r = json_bytes(StatusCode::OK, answers::created(&id, status));
            r.headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            r
        }
        Err(e) => op_error(e),
    }
}

/// A cancel's body: `{"reason": "…"}`, optional (other fields are let be, as they were).
#[derive(serde::Deserialize, Default)]
struct CancelBody {
    reason: Option<String>,
}

/// `POST /serviceRequest/{id}/cancel` (beyond Clamp), with an optional body
/// `{"reason": "…"}`: no further step starts, a paused step stops waiting, `onFailure`
/// steps do not run. Idempotent; 409 once the request finished.
pub async fn cancel(core: &Core, who: &Caller, id: &str, parts: &Parts, body: &mut Body) -> Resp {
    let id = or_answer!(request_id(id));
    let body = or_answer!(body.read_request(parts, &core.app.config).await);
    // Its length is the operation's to judge (`ops::control::cancel`).
    const SHAPE: &str = "the body must be empty or a JSON object like {\"reason\": \"…\"}";
    let reason = match super::input::typed::<CancelBody>(&body, SHAPE) {
        Ok(b) => b.reason,
        Err(e) => return op_error(e),
    };
    let compensate = match parts.uri.query().map(compensate_asked) {
        None => None,
        Some(Ok(c)) => c,
        Some(Err(msg)) => return error(StatusCode::BAD_REQUEST, msg),
    };
    match crate::ops::control::cancel(core, who, id, reason, compensate).await {
        // Its compensations run first: accepted, CANCELLED when they have.
        Ok(c) if c.compensating => json(
            StatusCode::ACCEPTED,
            &serde_json::json!({
                "serviceRequestId": id.to_string(),
                "status": RequestStatus::InProgress.as_str(),
                "compensating": true,
                "reason": c.reason,
            }),
        ),
        Ok(c) => json(
            StatusCode::OK,
            &serde_json::json!({
                "serviceRequestId": id.to_string(),
                "status": RequestStatus::Cancelled.as_str(),
                "reason": c.reason,
            }),
        ),
        Err(e) => op_error(e),
    }
}

/// A cancel's query: `compensate=true|false` (beyond Clamp), nothing else.
fn compensate_asked(query: &str) -> Result<Option<bool>, &'static str> {
    const SHAPE: &str = "the cancel's query takes compensate=true or compensate=false";
    let mut asked = None;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        asked = match (k.as_ref(), v.as_ref()) {
            ("compensate", "true") => Some(true),
            ("compensate", "false") => Some(false),
            _ => return Err(SHAPE),
        };
    }
    Ok(asked)
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
pub async fn get(core: &Core, id: &str, query: Option<&str>) -> Resp {
    let id = or_answer!(request_id(id));
    let max_wait = core.app.config.max_wait;
    let wait = match super::query_param(query, "waitMs") {
        None => None,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(0) => None,
            Ok(ms) if ms <= max_wait.as_millis() as u64 => Some(Duration::from_millis(ms)),
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!(
                        "waitMs must be a number of milliseconds from 0 to {}",
                        max_wait.as_millis()
                    ),
                )
            }
        },
    };
    match crate::ops::read::status(core, id, wait).await {
        Ok(body) => json_bytes(StatusCode::OK, answers::with_pause(&core.app.pauses, body)),
        Err(e) => op_error(e),
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

/// `GET /serviceRequests/{workflow}?pageNumber=0&pageSize=10` (0-based, as Clamp).
pub async fn list(core: &Core, name: &str, query: Option<&str>) -> Resp {
    let page_number = or_answer!(page_param(query, "pageNumber", 0, i64::from(i32::MAX)));
    let page_size = or_answer!(page_param(query, "pageSize", 1, MAX_PAGE_SIZE));
    match crate::ops::lists::by_workflow(core, name, page_number, page_size).await {
        Ok(page) => json(
            StatusCode::OK,
            &serde_json::json!({
                "serviceRequests": page.items.iter().map(answers::request_item).collect::<Vec<_>>(),
                "pageNumber": page.number,
                "pageSize": page.size,
            }),
        ),
        Err(e) => op_error(e),
    }
}

/// `GET /serviceRequest/{id}/children?pageNumber=0&pageSize=100` (beyond Clamp): the
/// child requests its WORKFLOW, PARALLEL and MAP steps started, by step and then branch
/// or item index, each with its status.
pub async fn children(core: &Core, id: &str, query: Option<&str>) -> Resp {
    let id = or_answer!(request_id(id));
    let number = or_answer!(page_param(query, "pageNumber", 0, i64::from(i32::MAX)));
    let size = or_answer!(page_param(query, "pageSize", 1, MAX_PAGE_SIZE));
    match crate::ops::read::children(core, id, number, size).await {
        Ok((page, total)) => json(StatusCode::OK, &answers::children(&page, total)),
        Err(e) => op_error(e),
    }
}

/// `GET /serviceRequest/{id}/notifications` (beyond Clamp): its notifications, oldest
/// first, with how far each got.
pub async fn notifications(core: &Core, id: &str) -> Resp {
    let id = or_answer!(request_id(id));
    match crate::ops::read::notifications(core, id).await {
        Ok(all) => json(StatusCode::OK, &answers::notifications(&all)),
        Err(e) => op_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_payloads() {
        let check = |body: &str, ok: bool| {
            assert_eq!(
                crate::ops::create::validate_payload(body.as_bytes()).is_ok(),
                ok,
                "{body}"
            )
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
        let off = crate::tokens::ApiTokens::default();
        let b = forwardable_headers(crate::config::DEFAULT_HEADER_DENYLIST, &h, None, &off);
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
            &forwardable_headers(&[], &HeaderMap::new(), None, &off)[..],
            b"[]"
        );
        // Forwarded on purpose: a downstream's credentials go on, clamp's own never.
        let on = crate::tokens::ApiTokens::from_list(&["clamp-token-0123456789"]);
        for (value, tokens, kept) in [
            ("Basic dXNlcjpwdw==", &*on, true),
            ("Bearer clamp-token-0123456789", &*on, false),
            ("bearer some-other-bearer-token", &*on, false),
            ("Bearer downstream-token", &off, true),
        ] {
            let mut h = HeaderMap::new();
            h.insert("authorization", value.parse().unwrap());
            let b = forwardable_headers(&[], &h, None, tokens);
            let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
            assert_eq!(v.as_array().unwrap().len(), usize::from(kept), "{value}");
        }
    }
}
