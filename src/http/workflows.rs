//! `POST /workflow`, `GET /workflow/{name}` and `GET /workflows`.

use std::sync::Arc;

use bytes::Bytes;
use hyper::http::request::Parts;
use hyper::StatusCode;

use super::body::Body;
use super::response::{error, json, json_bytes, store_error, Resp};
use super::service_requests::{find_workflow, page_param, MAX_PAGE_SIZE};
use crate::state::Core;
use crate::store::queries::{self, WorkflowSort};
use crate::store::StoreError;
use crate::workflow::{compile, set_default_reply_to, WorkflowDef};

/// `POST /workflow`: validate, compile, store, cache.
pub async fn create(core: &Core, parts: &Parts, body: &mut Body) -> Resp {
    let app = &core.app;
    let limits = (app.config.body_limit, app.config.header_timeout);
    let body = match body.read(&parts.headers, limits.0, limits.1).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let def: WorkflowDef = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(v @ serde_json::Value::Object(_)) => match serde_json::from_value(v) {
            Ok(d) => d,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("invalid workflow definition: {e}"),
                )
            }
        },
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "the workflow definition must be a JSON object",
            )
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("the body is not valid JSON: {e}"),
            )
        }
    };
    let mut def = def;
    let b = &app.config.brokers;
    set_default_reply_to(&mut def, &b.amqp_response_queue, &b.kafka_response_topic);
    let mut wf = match compile(def) {
        Ok(wf) => wf,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.0),
    };
    let id = crate::ids::new_v7();
    wf.def.id = id.to_string();
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "create workflow"),
    };
    match queries::insert_workflow(&conn, &wf.def, id).await {
        Ok(created_at) => {
            wf.def.created_at = created_at.clone();
            wf.def.updated_at = created_at;
            wf.json =
                Bytes::from(serde_json::to_vec(&wf.def).expect("a workflow always serializes"));
            let body = wf.json.clone();
            app.workflows.insert(Arc::new(wf));
            json_bytes(StatusCode::OK, body)
        }
        Err(StoreError::Conflict) => error(
            StatusCode::CONFLICT,
            &format!("a workflow named '{}' already exists", wf.def.name),
        ),
        Err(e) => store_error(e, "create workflow"),
    }
}

/// `GET /workflow/{name}`.
pub async fn get(core: &Core, name: &str) -> Resp {
    match find_workflow(core, name).await {
        Ok(Some(wf)) => json_bytes(StatusCode::OK, wf.json.clone()),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            &format!("No record exists with workflow name : {name}"),
        ),
        Err(r) => r,
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
    let page_number = match page_param(query, "pageNumber", 1, i64::from(i32::MAX)) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let page_size = match page_param(query, "pageSize", 1, MAX_PAGE_SIZE) {
        Ok(n) => n,
        Err(r) => return r,
    };
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
    let conn = match core.pool.get().await {
        Ok(c) => c,
        Err(e) => return store_error(e.into(), "list workflows"),
    };
    match queries::workflows_page(&conn, page_size, page_size * (page_number - 1), &sort).await {
        Ok((workflows, total)) => json(
            StatusCode::OK,
            &serde_json::json!({
                "workflows": workflows,
                "pageNumber": page_number,
                "pageSize": page_size,
                "totalWorkflowsCount": total,
            }),
        ),
        Err(e) => store_error(e, "list workflows"),
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
