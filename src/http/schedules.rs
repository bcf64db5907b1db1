//! Schedules (beyond Clamp): `POST /schedules`, `GET /schedules`, `GET|PUT|DELETE
//! /schedules/{name}`, `POST /schedules/{name}/trigger|pause|resume`: read, call
//! `ops::schedules`, answer with the schedule as `schedule_json` shows it.

use hyper::http::request::Parts;
use hyper::StatusCode;
use serde_json::{json, Value};

use super::body::Body;
use super::response::{json, no_content, op_error, Resp};
use super::rfc3339;
use crate::ops::schedules::{self, Schedule};
use crate::ops::OpError;
use crate::state::Core;
use crate::tokens::Caller;

/// A schedule as the answers show it: its definition, `paused`, its next fire times
/// (none while paused), its stamps, and its last fires when read with them.
pub fn schedule_json(s: &Schedule) -> Value {
    let row = &s.stored;
    let mut v = row.definition.clone();
    v["paused"] = json!(row.paused);
    v["nextFires"] = s
        .next
        .iter()
        .map(|(t, local)| json!({"at": rfc3339(*t), "local": local}))
        .collect();
    v["createdAt"] = json!(rfc3339(row.created_at));
    v["updatedAt"] = json!(rfc3339(row.updated_at));
    if let Some(fires) = &s.runs {
        v["lastRuns"] = fires
            .iter()
            .map(|f| {
                json!({
                    "fireAt": rfc3339(f.fire_at),
                    "serviceRequestId": f.service_request_id.map(|id| id.to_string()),
                    "status": f.status.map(|s| s.as_str()),
                    "skipped": f.skipped,
                })
            })
            .collect();
    }
    v
}

fn answer(status: StatusCode, r: Result<Schedule, OpError>) -> Resp {
    match r {
        Ok(s) => json(status, &schedule_json(&s)),
        Err(e) => op_error(e),
    }
}

/// `POST /schedules`: 201 with the schedule; 409 when the name is taken.
pub async fn create(core: &Core, who: &Caller, parts: &Parts, body: &mut Body) -> Resp {
    match body.read_json(parts, &core.app.config).await {
        Ok(v) => answer(StatusCode::CREATED, schedules::define(core, who, v).await),
        Err(r) => r,
    }
}

/// `GET /schedules`: every schedule, without their fires.
pub async fn list(core: &Core) -> Resp {
    match schedules::list(core, None).await {
        Ok(all) => json(
            StatusCode::OK,
            &json!({"schedules": all.iter().map(schedule_json).collect::<Vec<_>>()}),
        ),
        Err(e) => op_error(e),
    }
}

/// `GET /schedules/{name}`: the schedule, its next fire times and its last runs.
pub async fn get(core: &Core, name: &str) -> Resp {
    answer(StatusCode::OK, schedules::read(core, name).await)
}

/// `PUT /schedules/{name}`: replaces the definition (`ops::schedules::replace`).
pub async fn put(core: &Core, who: &Caller, name: &str, parts: &Parts, body: &mut Body) -> Resp {
    match body.read_json(parts, &core.app.config).await {
        Ok(v) => answer(StatusCode::OK, schedules::replace(core, who, name, v).await),
        Err(r) => r,
    }
}

/// `DELETE /schedules/{name}`: 204.
pub async fn delete(core: &Core, who: &Caller, name: &str) -> Resp {
    match schedules::delete(core, who, name).await {
        Ok(()) => no_content(),
        Err(e) => op_error(e),
    }
}

/// `POST /schedules/{name}/trigger`: one run now, answered like a create.
pub async fn trigger(core: &Core, who: &Caller, name: &str) -> Resp {
    match schedules::trigger(core, who, name).await {
        Ok(run) => json(
            StatusCode::OK,
            &super::answers::created_with(
                &run.id,
                crate::status::RequestStatus::New.as_str(),
                &[("fireAt", rfc3339(run.fire_at).into())],
            ),
        ),
        Err(e) => op_error(e),
    }
}

/// `POST /schedules/{name}/pause`: no fires until resumed; the schedule.
pub async fn pause(core: &Core, who: &Caller, name: &str) -> Resp {
    answer(StatusCode::OK, schedules::pause(core, who, name).await)
}

/// `POST /schedules/{name}/resume`: fires again from the first fire time after now.
pub async fn resume(core: &Core, who: &Caller, name: &str) -> Resp {
    answer(StatusCode::OK, schedules::resume(core, who, name).await)
}
