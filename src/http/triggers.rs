//! Triggers (beyond Clamp): `POST /triggers`, `GET /triggers`, `GET|PUT|DELETE
//! /triggers/{name}`, `POST /triggers/{name}/pause|resume`, and the webhook itself,
//! `POST /hooks/{name}`: read, call `ops::triggers` or `ops::hooks`, answer.

use hyper::http::request::Parts;
use hyper::StatusCode;
use serde_json::{json, Value};

use super::body::Body;
use super::response::{json, no_content, op_error, Resp};
use super::rfc3339;
use crate::ops::hooks::{self, Delivered, Delivery};
use crate::ops::triggers::{self, Trigger};
use crate::ops::OpError;
use crate::state::Core;
use crate::tokens::Caller;

/// A trigger as the answers show it: its definition, `paused`, and its stamps.
pub fn trigger_json(t: &Trigger) -> Value {
    let row = &t.stored;
    let mut v = row.definition.clone();
    v["paused"] = json!(row.paused);
    v["createdAt"] = json!(rfc3339(row.created_at));
    v["updatedAt"] = json!(rfc3339(row.updated_at));
    v
}

fn answer(status: StatusCode, r: Result<Trigger, OpError>) -> Resp {
    match r {
        Ok(t) => json(status, &trigger_json(&t)),
        Err(e) => op_error(e),
    }
}

/// `POST /triggers`: 201 with the trigger; 409 when the name is taken.
pub async fn create(core: &Core, who: &Caller, parts: &Parts, body: &mut Body) -> Resp {
    match body.read_json(parts, &core.app.config).await {
        Ok(v) => answer(
            StatusCode::CREATED,
            triggers::define(&crate::ops::deps(core), who, v).await,
        ),
        Err(r) => r,
    }
}

/// `GET /triggers`.
pub async fn list(core: &Core) -> Resp {
    match triggers::list(core).await {
        Ok(all) => json(
            StatusCode::OK,
            &json!({"triggers": all.iter().map(trigger_json).collect::<Vec<_>>()}),
        ),
        Err(e) => op_error(e),
    }
}

/// `GET /triggers/{name}`.
pub async fn get(core: &Core, name: &str) -> Resp {
    answer(StatusCode::OK, triggers::read(core, name).await)
}

/// `PUT /triggers/{name}`.
pub async fn put(core: &Core, who: &Caller, name: &str, parts: &Parts, body: &mut Body) -> Resp {
    match body.read_json(parts, &core.app.config).await {
        Ok(v) => answer(
            StatusCode::OK,
            triggers::replace(&crate::ops::deps(core), who, name, v).await,
        ),
        Err(r) => r,
    }
}

/// `DELETE /triggers/{name}`: 204.
pub async fn delete(core: &Core, who: &Caller, name: &str) -> Resp {
    match triggers::delete(core, who, name).await {
        Ok(()) => no_content(),
        Err(e) => op_error(e),
    }
}

/// `POST /triggers/{name}/pause` (`paused`) and `/resume`.
pub async fn set_paused(core: &Core, who: &Caller, name: &str, paused: bool) -> Resp {
    answer(
        StatusCode::OK,
        triggers::set_paused(core, who, name, paused).await,
    )
}

/// `POST /hooks/{name}`: 200 `{started: true, serviceRequestId, duplicate}` once the
/// request is committed; 200 `{started: false, filtered: true}`; 202 `{started: false,
/// deadLettered: true, reason}`; 401 for a signature that does not verify.
pub async fn hook(core: &Core, name: &str, parts: &Parts, body: &mut Body) -> Resp {
    let bytes = match body.read_request(parts, &core.app.config).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
        .collect();
    let d = Delivery {
        headers: &headers,
        body: &bytes,
    };
    match hooks::deliver(core, name, &d).await {
        Ok(Delivered::Started { id, duplicate }) => json(
            StatusCode::OK,
            &json!({"started": true, "serviceRequestId": id.to_string(), "duplicate": duplicate}),
        ),
        Ok(Delivered::Filtered) => {
            json(StatusCode::OK, &json!({"started": false, "filtered": true}))
        }
        Ok(Delivered::DeadLettered(reason)) => json(
            StatusCode::ACCEPTED,
            &json!({"started": false, "deadLettered": true, "reason": reason}),
        ),
        Err(e) => op_error(e),
    }
}
