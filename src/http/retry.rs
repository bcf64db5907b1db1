//! `POST /serviceRequest/{id}/retry` (beyond Clamp): a FAILED or CANCELLED request goes on
//! as the same request from the step that failed (`store::retry`), optionally with a new
//! request for that step: `{"payload": <JSON>}`. `POST /serviceRequests/retry` does so for
//! every request that the search filters in its body match.

use hyper::http::request::Parts;
use hyper::StatusCode;
use serde::Deserialize;

use super::answers;
use super::body::Body as RequestBody;
use super::input;
use super::response::{json, op_error, Resp};
use crate::ops::control::Bulk;
use crate::ops::OpError;
use crate::state::Core;
use crate::status::RequestStatus;
use crate::tokens::Caller;

pub async fn retry(
    core: &Core,
    who: &Caller,
    id: &str,
    parts: &Parts,
    body: &mut RequestBody,
) -> Resp {
    let id = or_answer!(super::service_requests::request_id(id));
    let app = &core.app;
    let body = or_answer!(body.read_request(parts, &app.config).await);
    let payload = match new_request(&body) {
        Ok(p) => p,
        Err(e) => return op_error(e),
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

/// `POST /serviceRequest/{id}/retry`'s body: `{"payload": <JSON>}`, optional.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RetryBody {
    #[serde(default, deserialize_with = "input::present")]
    payload: Option<String>,
}

/// The step's new request, as JSON text: none for an empty body or one without `payload`.
fn new_request(body: &[u8]) -> Result<Option<String>, OpError> {
    const SHAPE: &str = "the body must be empty or a JSON object like {\"payload\": {…}}";
    Ok(input::typed::<RetryBody>(body, SHAPE)?.payload)
}

/// Most requests one bulk retry takes, and how many unless its `limit` says otherwise.
const MAX_BULK: i64 = 10_000;
const DEFAULT_BULK: i64 = 1_000;

/// `POST /serviceRequests/retry` with a body of search filters (`status` FAILED unless it
/// says CANCELLED or both; `workflow`, `createdAfter`, `createdBefore`, `limit`).
pub async fn retry_matching(
    core: &Core,
    who: &Caller,
    parts: &Parts,
    body: &mut RequestBody,
) -> Resp {
    let app = &core.app;
    let body = or_answer!(body.read_request(parts, &app.config).await);
    let bulk = match bulk_filter(&body) {
        Ok(b) => b,
        Err(e) => return op_error(e),
    };
    match crate::ops::control::retry_matching(core, who, &bulk).await {
        Ok(r) => json(
            StatusCode::OK,
            &serde_json::json!({"retried": r.retried, "more": r.more}),
        ),
        Err(e) => op_error(e),
    }
}

/// A bulk retry's filters, as posted.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct BulkBody {
    /// `null` is the default (FAILED), as it was.
    status: Option<OneOrMany>,
    #[serde(default, deserialize_with = "input::some")]
    workflow: Option<String>,
    #[serde(default, deserialize_with = "input::some")]
    created_after: Option<String>,
    #[serde(default, deserialize_with = "input::some")]
    created_before: Option<String>,
    #[serde(default, deserialize_with = "input::some")]
    limit: Option<i64>,
}

/// A status, or a list of them (each may list several, separated by commas).
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// The body's filters; the error names the field at fault.
fn bulk_filter(body: &[u8]) -> Result<Bulk, OpError> {
    const SHAPE: &str = "the body must be empty or a JSON object of search filters";
    let b: BulkBody = input::typed(body, SHAPE)?;
    let bad = |why: String| OpError::BadRequest(why);
    let statuses = match b.status {
        None => vec![crate::ops::control::BULK_DEFAULT],
        Some(s) => retried_statuses(s)?,
    };
    if b.workflow.as_deref() == Some("") {
        return Err(bad("workflow: must be a non-empty string".into()));
    }
    let time =
        |v: Option<String>, key: &str| v.map(|v| crate::ops::lists::time(key, &v)).transpose();
    let created_after = time(b.created_after, "createdAfter")?;
    let created_before = time(b.created_before, "createdBefore")?;
    if let (Some(a), Some(b)) = (created_after, created_before) {
        if a >= b {
            return Err(bad("createdAfter: must be before createdBefore".into()));
        }
    }
    let limit = match b.limit {
        None => DEFAULT_BULK,
        Some(n) if (1..=MAX_BULK).contains(&n) => n,
        Some(_) => return Err(bad(format!("limit: must be a number from 1 to {MAX_BULK}"))),
    };
    Ok(Bulk {
        workflow: b.workflow,
        statuses,
        created_after,
        created_before,
        limit,
    })
}

/// The statuses a bulk retry names: FAILED, CANCELLED or both, in any case, each once.
fn retried_statuses(s: OneOrMany) -> Result<Vec<RequestStatus>, OpError> {
    let list = match s {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(list) => list,
    };
    let mut out = Vec::new();
    for s in list.iter().flat_map(|s| s.split(',')).map(str::trim) {
        let known = match RequestStatus::parse(&s.to_ascii_uppercase()) {
            Some(k) if k.is_retryable() => k,
            _ => {
                return Err(OpError::BadRequest(format!(
                    "status: {s:?} is not retried (only FAILED and CANCELLED are)"
                )))
            }
        };
        if !out.contains(&known) {
            out.push(known);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_empty_or_names_a_payload() {
        assert_eq!(new_request(b"").unwrap(), None);
        assert_eq!(new_request(b" {} ").unwrap(), None);
        assert_eq!(
            new_request(br#"{"payload": {"a": [1]}}"#).unwrap(),
            Some(r#"{"a":[1]}"#.into())
        );
        assert_eq!(
            new_request(br#"{"payload": null}"#).unwrap(),
            Some("null".into())
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
            (br#"{"createdBefore": null}"#, "createdBefore:"),
            (br#"{"limit": null}"#, "limit:"),
        ] {
            let why = bulk_filter(body).unwrap_err().message();
            assert!(why.starts_with(field), "{why}");
        }
    }
}
