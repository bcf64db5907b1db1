//! `GET /audit` (beyond Clamp, admin): the audit trail newest first, `?limit=` (1 to
//! 1000, default 100) and `?before=<id>` to page back; and the recording of a change the
//! API made, once its answer is known.

use http_body_util::{BodyExt, Full};
use hyper::StatusCode;
use serde_json::{json, Value};

use super::response::{error, json as answer, op_error, Resp};
use super::{decode, query_param};
use crate::routes::Route;
use crate::state::Core;
use crate::tokens::Caller;

pub async fn list(core: &Core, query: Option<&str>) -> Resp {
    let limit = match query_param(query, "limit").map(|v| v.parse::<i64>()) {
        None => 100,
        Some(Ok(n)) if (1..=1000).contains(&n) => n,
        Some(_) => return error(StatusCode::BAD_REQUEST, "limit: must be 1 to 1000"),
    };
    let before = match query_param(query, "before").map(|v| v.parse::<i64>()) {
        None => None,
        Some(Ok(n)) if n > 0 => Some(n),
        Some(_) => return error(StatusCode::BAD_REQUEST, "before: must be an entry id"),
    };
    match crate::ops::audit::list(core, before, limit).await {
        Ok(entries) => {
            let next = (entries.len() as i64 == limit).then(|| entries.last().map(|e| e.id));
            let entries: Vec<Value> = entries
                .into_iter()
                .map(|e| {
                    json!({"id": e.id, "at": e.at, "actor": e.actor, "action": e.action,
                           "target": e.target, "outcome": e.outcome})
                })
                .collect();
            answer(
                StatusCode::OK,
                &json!({"entries": entries, "before": next.flatten()}),
            )
        }
        Err(e) => op_error(e),
    }
}

/// Records the change `route` made for `caller` (its target: the path's argument, or the
/// name the answer gives a new workflow or schedule), with its outcome: `ok`, or the
/// status and message it was answered with. Returns the answer as it was.
pub async fn after(core: &Core, caller: &Caller, route: Route, arg: &str, resp: Resp) -> Resp {
    let Some(action) = crate::ops::access::audited(route.op()) else {
        return resp;
    };
    let (parts, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let target = match route {
        Route::CreateWorkflow | Route::CreateSchedule => answer["name"]
            .as_str()
            .unwrap_or("(not created)")
            .to_string(),
        Route::RetryServiceRequests => "the requests matching its filters".to_string(),
        _ => decode(arg).into_owned(),
    };
    let outcome = if parts.status.is_success() {
        match route {
            Route::RetryServiceRequests => format!("ok: {} retried", answer["retried"]),
            _ => "ok".to_string(),
        }
    } else {
        format!(
            "{}: {}",
            parts.status.as_u16(),
            answer["message"].as_str().unwrap_or("")
        )
    };
    crate::ops::audit::record(core, caller, action, &target, &outcome).await;
    hyper::Response::from_parts(parts, Full::new(bytes))
}
