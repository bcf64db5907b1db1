//! `POST /serviceRequest/{id}/retry` (beyond Clamp): a FAILED or CANCELLED request goes on
//! as the same request from the step that failed (`store::retry`), optionally with a new
//! request for that step: `{"payload": <JSON>}`. `POST /serviceRequests/retry` does so for
//! every request that the search filters in its body match.

use hyper::http::request::Parts;
use hyper::StatusCode;

use super::answers;
use super::body::Body;
use super::response::{error, json, op_error, Resp};
use crate::ops::control::Bulk;
use crate::state::Core;
use crate::status::RequestStatus;
use crate::tokens::Caller;

pub async fn retry(core: &Core, who: &Caller, id: &str, parts: &Parts, body: &mut Body) -> Resp {
    let id = or_answer!(super::service_requests::request_id(id));
    let app = &core.app;
    let body = or_answer!(body.read_request(parts, &app.config).await);
    let payload = match new_request(&body) {
        Ok(p) => p,
        Err(why) => return error(StatusCode::BAD_REQUEST, why),
    };
    match crate::ops::control::retry(core, who, id, payload.as_deref()).await {
        Ok(r) => json(
            StatusCode::OK,
            &answers::created_with(
                &id,
                RequestStatus::New.as_str(),
                &[("retries", r.retries.into())],
            ),
        ),
        Err(e) => op_error(e),
    }
}

/// The step's new request, as JSON text: none for an empty body or one without `payload`.
fn new_request(body: &[u8]) -> Result<Option<String>, &'static str> {
    const SHAPE: &str = "the body must be empty or a JSON object like {\"payload\": {…}}";
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let serde_json::Value::Object(mut o) =
        serde_json::from_slice::<serde_json::Value>(body).map_err(|_| SHAPE)?
    else {
        return Err(SHAPE);
    };
    let payload = o.remove("payload");
    if !o.is_empty() {
        return Err(SHAPE);
    }
    Ok(payload.map(|p| p.to_string()))
}

/// Most requests one bulk retry takes, and how many unless its `limit` says otherwise.
const MAX_BULK: i64 = 10_000;
const DEFAULT_BULK: i64 = 1_000;

/// `POST /serviceRequests/retry` with a body of search filters (`status` FAILED unless it
/// says CANCELLED or both; `workflow`, `createdAfter`, `createdBefore`, `limit`).
pub async fn retry_matching(core: &Core, who: &Caller, parts: &Parts, body: &mut Body) -> Resp {
    let app = &core.app;
    let body = or_answer!(body.read_request(parts, &app.config).await);
    let bulk = match bulk_filter(&body) {
        Ok(b) => b,
        Err(why) => return error(StatusCode::BAD_REQUEST, &why),
    };
    match crate::ops::control::retry_matching(core, who, &bulk).await {
        Ok(r) => json(
            StatusCode::OK,
            &serde_json::json!({"retried": r.retried, "more": r.more}),
        ),
        Err(e) => op_error(e),
    }
}

/// The body's filters; the error names the field at fault.
fn bulk_filter(body: &[u8]) -> Result<Bulk, String> {
    use serde_json::Value;
    let mut o = if body.iter().all(u8::is_ascii_whitespace) {
        serde_json::Map::new()
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(o)) => o,
            _ => return Err("the body must be empty or a JSON object of search filters".into()),
        }
    };
    let text = |v: Value, key: &str| match v {
        Value::String(s) if !s.is_empty() => Ok(s),
        _ => Err(format!("{key}: must be a non-empty string")),
    };
    let statuses = match o.remove("status") {
        None | Some(Value::Null) => vec![crate::ops::control::BULK_DEFAULT],
        Some(v) => {
            let list = match v {
                Value::Array(a) => a,
                one => vec![one],
            };
            let mut out = Vec::new();
            for v in list {
                let s = text(v, "status")?;
                for s in s.split(',').map(str::trim) {
                    let known = match RequestStatus::parse(&s.to_ascii_uppercase()) {
                        Some(k) if k.is_retryable() => k,
                        _ => {
                            return Err(format!(
                                "status: {s:?} is not retried (only FAILED and CANCELLED are)"
                            ))
                        }
                    };
                    if !out.contains(&known) {
                        out.push(known);
                    }
                }
            }
            out
        }
    };
    let workflow = o
        .remove("workflow")
        .map(|v| text(v, "workflow"))
        .transpose()?;
    let time = |v: Option<Value>, key: &str| {
        v.map(|v| crate::ops::lists::time(key, &text(v, key)?))
            .transpose()
    };
    let created_after = time(o.remove("createdAfter"), "createdAfter")?;
    let created_before = time(o.remove("createdBefore"), "createdBefore")?;
    if let (Some(a), Some(b)) = (created_after, created_before) {
        if a >= b {
            return Err("createdAfter: must be before createdBefore".into());
        }
    }
    let limit = match o.remove("limit") {
        None => DEFAULT_BULK,
        Some(v) => match v.as_i64() {
            Some(n) if (1..=MAX_BULK).contains(&n) => n,
            _ => return Err(format!("limit: must be a number from 1 to {MAX_BULK}")),
        },
    };
    if let Some(k) = o.keys().next() {
        return Err(format!(
            "{k}: unknown field (the filters are status, workflow, createdAfter, createdBefore and limit)"
        ));
    }
    Ok(Bulk {
        workflow,
        statuses,
        created_after,
        created_before,
        limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_empty_or_names_a_payload() {
        assert_eq!(new_request(b""), Ok(None));
        assert_eq!(new_request(b" {} "), Ok(None));
        assert_eq!(
            new_request(br#"{"payload": {"a": [1]}}"#),
            Ok(Some(r#"{"a":[1]}"#.into()))
        );
        assert_eq!(
            new_request(br#"{"payload": null}"#),
            Ok(Some("null".into()))
        );
        for bad in [&b"[1]"[..], b"{\"payload\": 1, \"x\": 2}", b"{", b"\"p\""] {
            assert!(new_request(bad).is_err());
        }
    }

    #[test]
    fn bulk_filters_default_to_failed_and_name_what_is_wrong() {
        let b = bulk_filter(b"").unwrap();
        assert_eq!((b.statuses, b.limit), (vec![RequestStatus::Failed], 1_000));
        let b = bulk_filter(
            br#"{"status": ["cancelled", "FAILED"], "workflow": "w", "limit": 10000,
            "createdAfter": "2026-12-01T00:00:00Z", "createdBefore": "2026-12-02T00:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(
            b.statuses,
            vec![RequestStatus::Cancelled, RequestStatus::Failed]
        );
        assert_eq!(b.workflow.as_deref(), Some("w"));
        let (lower, upper) = crate::store::search::id_bounds(b.created_after, b.created_before);
        assert!(lower < upper);
        for (body, field) in [
            (&br#"{"status": "COMPLETED"}"#[..], "status:"),
            (br#"{"status": 3}"#, "status:"),
            (br#"{"workflow": ""}"#, "workflow:"),
            (br#"{"limit": 10001}"#, "limit:"),
            (br#"{"limit": 0}"#, "limit:"),
            (br#"{"createdAfter": "soon"}"#, "createdAfter:"),
            (br#"{"cursor": "x"}"#, "cursor:"),
        ] {
            let why = bulk_filter(body).unwrap_err();
            assert!(why.starts_with(field), "{why}");
        }
    }
}
