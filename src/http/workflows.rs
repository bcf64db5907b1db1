//! `POST /workflow`, `GET /workflow/{name}` and `GET /workflows`; beyond Clamp
//! `PUT /workflow/{name}`, `GET /workflow/{name}/versions` and `POST
//! /workflow/{name}/pause|resume`: read, call `ops::workflows` (`ops::pauses`), answer.

use hyper::http::request::Parts;
use hyper::StatusCode;

use super::body::Body;
use super::response::{error, json, json_bytes, op_error, Resp};
use super::service_requests::page_param;
use crate::ops::lists::MAX_PAGE_SIZE;
use crate::ops::workflows;
use crate::ops::workflows::WorkflowSort;
use crate::state::Core;
use crate::tokens::Caller;

/// `POST /workflow`: validate, compile, store (as version 1), cache.
pub async fn create(core: &Core, who: &Caller, parts: &Parts, body: &mut Body) -> Resp {
    let body = or_answer!(body.read_request(parts, &core.app.config).await);
    match workflows::define(&crate::ops::deps(core), who, &body).await {
        Ok(wf) => json_bytes(StatusCode::OK, wf.json.clone()),
        Err(e) => op_error(e),
    }
}

/// `PUT /workflow/{name}` (beyond Clamp): the definition becomes the workflow's next
/// version; the same definition as the latest stores nothing and answers the latest.
pub async fn put(core: &Core, who: &Caller, name: &str, parts: &Parts, body: &mut Body) -> Resp {
    let body = or_answer!(body.read_request(parts, &core.app.config).await);
    match workflows::replace(&crate::ops::deps(core), who, name, &body).await {
        Ok(wf) => json_bytes(StatusCode::OK, wf.json.clone()),
        Err(e) => op_error(e),
    }
}

/// `GET /workflow/{name}`: the latest version, or beyond Clamp `?version=N`.
pub async fn get(core: &Core, name: &str, query: Option<&str>) -> Resp {
    let version = match super::query_param(query, "version") {
        None => None,
        Some(v) => match v.parse::<u32>().ok().filter(|v| *v > 0) {
            Some(v) => Some(v),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "version: must be a whole number from 1",
                )
            }
        },
    };
    match workflows::read(&crate::ops::deps(core), name, version).await {
        // Beyond Clamp: a paused workflow says so (only then is its JSON read again).
        Ok(wf) if core.app.pauses.is(name) => {
            let mut v: serde_json::Value =
                serde_json::from_slice(&wf.json).expect("a stored definition is JSON");
            v["paused"] = serde_json::Value::Bool(true);
            json(StatusCode::OK, &v)
        }
        Ok(wf) => json_bytes(StatusCode::OK, wf.json.clone()),
        Err(e) => op_error(e),
    }
}

/// `POST /workflow/{name}/pause` (beyond Clamp): its requests wait, parked, before their
/// next step until `/resume`; answers the pause.
pub async fn pause(core: &Core, who: &Caller, name: &str) -> Resp {
    match crate::ops::pauses::pause(core, who, name).await {
        Ok(p) => json(
            StatusCode::OK,
            &serde_json::json!({"workflow": p.workflow, "paused": true,
                                "pausedAt": p.paused_at, "pausedBy": p.paused_by}),
        ),
        Err(e) => op_error(e),
    }
}

/// `POST /workflow/{name}/resume` (beyond Clamp): its parked requests run again.
pub async fn resume(core: &Core, who: &Caller, name: &str) -> Resp {
    match crate::ops::pauses::resume(core, who, name).await {
        Ok(r) => json(
            StatusCode::OK,
            &serde_json::json!({"workflow": name, "paused": false,
                                "wasPaused": r.was_paused, "freed": r.freed}),
        ),
        Err(e) => op_error(e),
    }
}

/// `GET /workflow/{name}/versions` (beyond Clamp): every version, oldest first.
pub async fn versions(core: &Core, name: &str) -> Resp {
    match workflows::versions(&crate::ops::deps(core), name).await {
        Ok(v) => json(
            StatusCode::OK,
            &serde_json::json!({
                "name": name,
                "versions": v.iter().map(|v| serde_json::json!({
                    "version": v.version, "created_at": v.created_at, "description": v.description,
                })).collect::<Vec<_>>(),
            }),
        ),
        Err(e) => op_error(e),
    }
}

/// A `sortBy` value outside Clamp's grammar.
#[derive(Debug, PartialEq, Eq)]
pub struct UnsupportedSort;

/// Parses Clamp's `sortBy` (`name:asc,created_at:desc`; keys id, name, created_at).
pub fn parse_sort(raw: &str) -> Result<Vec<(WorkflowSort, bool)>, UnsupportedSort> {
    let lower = raw.trim().to_ascii_lowercase();
    let lower = lower.strip_suffix(',').unwrap_or(&lower);
    if lower.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for pair in lower.split(',') {
        let (key, order) = pair.split_once(':').ok_or(UnsupportedSort)?;
        let key = match key.trim() {
            "id" => WorkflowSort::Id,
            "name" => WorkflowSort::Name,
            "created_at" => WorkflowSort::CreatedAt,
            _ => return Err(UnsupportedSort),
        };
        let desc = match order.trim() {
            "asc" => false,
            "desc" => true,
            _ => return Err(UnsupportedSort),
        };
        if out.iter().any(|(k, _)| *k == key) {
            return Err(UnsupportedSort);
        }
        out.push((key, desc));
    }
    Ok(out)
}

/// `GET /workflows?pageNumber=1&pageSize=10&sortBy=name:asc` (1-based, as Clamp).
pub async fn list(core: &Core, query: Option<&str>) -> Resp {
    let page_number = or_answer!(page_param(query, "pageNumber", 1, i64::from(i32::MAX)));
    let page_size = or_answer!(page_param(query, "pageSize", 1, MAX_PAGE_SIZE));
    let sort = match super::query_param(query, "sortBy") {
        None => Vec::new(),
        Some(raw) => match parse_sort(&raw) {
            Ok(s) => s,
            Err(UnsupportedSort) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "unsupported value provided for sortBy query",
                )
            }
        },
    };
    match workflows::list(&crate::ops::deps(core), page_number, page_size, &sort).await {
        Ok(page) => json(
            StatusCode::OK,
            &serde_json::json!({
                "workflows": page.definitions,
                "pageNumber": page_number,
                "pageSize": page_size,
                "totalWorkflowsCount": page.total,
            }),
        ),
        Err(e) => op_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sort_specs() {
        use WorkflowSort::*;
        assert_eq!(
            parse_sort("name:asc,created_at:desc"),
            Ok(vec![(Name, false), (CreatedAt, true)])
        );
        assert_eq!(parse_sort("NAME:DESC,"), Ok(vec![(Name, true)]));
        assert_eq!(parse_sort("id:asc"), Ok(vec![(Id, false)]));
        assert_eq!(parse_sort(""), Ok(vec![]));
        assert!(parse_sort("name").is_err());
        assert!(parse_sort("name:up").is_err());
        assert!(parse_sort("description:asc").is_err());
        assert!(parse_sort("name:asc,name:desc").is_err());
        assert!(parse_sort("name:asc;drop table").is_err());
    }
}
