//! `GET /audit` (beyond Clamp, admin): the audit trail newest first, `?limit=` (1 to
//! 1000, default 100) and `?before=<id>` to page back. The operations record themselves
//! (`ops::audit`).

use hyper::StatusCode;
use serde_json::{json, Value};

use super::query_param;
use super::response::{error, json as answer, op_error, Resp};
use crate::state::Core;

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
    match crate::ops::audit::list(&core.pool, before, limit).await {
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
