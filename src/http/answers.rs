//! The JSON of answers: Clamp's shapes for a request's status, lists and creates, and
//! the shapes beyond Clamp, rendered from what the operations (`ops`) return. The one
//! place answers are built: the store below returns rows, the operations typed results.

use bytes::Bytes;
use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::ops::read::{Child, Head, RequestRow, StepRow, Waits};
use crate::status::StepStatus;

/// Stored JSON text as a value (validated before it was written); text that does not
/// parse is shown as a string rather than failing the answer.
pub fn parsed(text: Option<&str>) -> Option<Value> {
    text.map(|t| serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.to_string())))
}

fn text(b: &Option<Bytes>) -> Option<&str> {
    b.as_deref()
        .map(|b| std::str::from_utf8(b).unwrap_or("null"))
}

/// A lane step's record (`engine::lanes`): where it ran, its branch's name and its own
/// name (stored as `<branch>/<step>`).
pub fn lane_place(s: &StepRow) -> Option<(crate::workflow::fan::LaneStep, &str, &str)> {
    let lane = crate::workflow::fan::lane_of(s.step_id)?;
    let (branch, step) = s.name.split_once('/').unwrap_or(("", &s.name));
    Some((lane, branch, step))
}

fn place_in_lane(entry: &mut Value, lane: &Option<(crate::workflow::fan::LaneStep, &str, &str)>) {
    if let Some((l, branch, _)) = lane {
        entry["branch"] = Value::String((*branch).to_string());
        entry["fanStepId"] = json!(l.fan);
    }
}

/// A status answer with `"workflowPaused": true` when its workflow is paused and it has
/// not finished (it waits, parked, before its next step); the answer as it is otherwise,
/// read again only while some workflow is paused.
pub fn with_pause(pauses: &crate::ops::pauses::Pauses, body: Bytes) -> Bytes {
    if !pauses.any() {
        return body;
    }
    let Ok(Value::Object(mut v)) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    let waiting = v
        .get("status")
        .and_then(Value::as_str)
        .and_then(crate::status::RequestStatus::parse)
        .is_some_and(|s| !s.is_final() && s != crate::status::RequestStatus::Paused);
    let paused = v
        .get("workflow_name")
        .and_then(Value::as_str)
        .is_some_and(|w| pauses.is(w));
    if !(waiting && paused) {
        return body;
    }
    v.insert("workflowPaused".into(), Value::Bool(true));
    Bytes::from(serde_json::to_vec(&Value::Object(v)).expect("values serialize"))
}

/// `GET /serviceRequest/{id}`'s answer: Clamp's fields, a STARTED and a final entry per
/// step attempt, and the fields beyond Clamp where they apply. Given to the `App` as its
/// renderer, so answers from memory and from reads come from here alike.
pub fn status(id: Uuid, head: &Head, steps: &[StepRow]) -> Bytes {
    let (entries, total) = step_entries(steps);
    let mut out = Map::new();
    out.insert("service_request_id".into(), Value::String(id.to_string()));
    out.insert(
        "workflow_name".into(),
        Value::String(head.workflow_name.to_string()),
    );
    // Beyond Clamp: the version of the workflow it runs.
    out.insert("workflow_version".into(), json!(head.workflow_version));
    out.insert("status".into(), Value::String(head.status.as_str().into()));
    out.insert("total_time_in_ms".into(), json!(total));
    out.insert("current_step_id".into(), json!(head.current_step_id));
    out.insert("steps".into(), Value::Array(entries));
    out.insert(
        "reason".into(),
        Value::String(head.reason.clone().unwrap_or_default()),
    );
    out.insert("created_at".into(), Value::String(head.created_at.clone()));
    beyond_clamp(&mut out, head);
    if let Some((k, v)) = waits(head) {
        out.insert(k.into(), v);
    }
    Bytes::from(serde_json::to_vec(&Value::Object(out)).expect("values serialize"))
}

/// A STARTED entry and a final one per step attempt, and the time from the first start
/// to the last end (Clamp's `total_time_in_ms`).
fn step_entries(steps: &[StepRow]) -> (Vec<Value>, i64) {
    let mut entries = Vec::with_capacity(steps.len() * 2);
    let mut first_start: Option<f64> = None;
    let mut last_end: Option<f64> = None;
    for s in steps {
        let request = parsed(text(&s.request));
        let response = parsed(text(&s.response));
        let started = s.started_ms;
        first_start = Some(first_start.map_or(started, |f: f64| f.min(started)));
        last_end = Some(last_end.map_or(started, |l: f64| l.max(started)));
        // Beyond Clamp: a PARALLEL branch's step run as a lane of this request is named
        // by its id and name within the branch, with the branch and the PARALLEL step.
        let lane = lane_place(s);
        let (id, name) = match &lane {
            Some((l, _, step)) => (l.step as i32, *step),
            None => (s.step_id, &*s.name),
        };
        let mut started = json!({
            "id": id, "name": name, "status": StepStatus::Started.as_str(), "time_taken": 0,
            "payload": {"request": request.clone().unwrap_or(Value::Null), "response": Value::Null},
            "attempts": s.attempts,
        });
        place_in_lane(&mut started, &lane);
        if let Some(c) = s.child_id {
            started["childServiceRequestId"] = Value::String(c.to_string());
        }
        entries.push(started);
        if s.status == StepStatus::Started {
            continue;
        }
        if let Some(f) = s.finished_ms {
            last_end = Some(last_end.map_or(f, |l: f64| l.max(f)));
        }
        let mut entry = json!({
            "id": id, "name": name, "status": s.status.as_str(),
            "time_taken": s.time_taken_ms.unwrap_or(0),
            "payload": {"request": request.unwrap_or(Value::Null), "response": response.unwrap_or(Value::Null)},
            "attempts": s.attempts,
        });
        place_in_lane(&mut entry, &lane);
        if let Some(reason) = &s.reason {
            entry["reason"] = Value::String(reason.clone());
        }
        if let Some(c) = s.child_id {
            entry["childServiceRequestId"] = Value::String(c.to_string());
        }
        entries.push(entry);
    }
    let total = match (first_start, last_end) {
        (Some(a), Some(b)) => (b - a).max(0.0).round() as i64,
        _ => 0,
    };
    (entries, total)
}

/// The request's fields beyond Clamp, each where it applies.
fn beyond_clamp(out: &mut Map<String, Value>, head: &Head) {
    // How often the request was retried after it failed or was cancelled.
    if head.retries > 0 {
        out.insert("retries".into(), json!(head.retries));
    }
    // The request this one reruns (its reruns: search's `rerunOf`).
    if let Some(of) = head.rerun_of {
        out.insert("rerunOf".into(), Value::String(of.to_string()));
    }
    // The start a delayed create asked for.
    if let Some(at) = &head.start_at {
        out.insert("startAt".into(), Value::String(at.clone()));
    }
    // The request whose WORKFLOW step started this one.
    if let Some(p) = head.parent_id {
        out.insert("parentId".into(), Value::String(p.to_string()));
    }
    // A fan-out step's branch (named by its workflow, `order/3/acme`) or item (its index
    // in the list).
    if let Some((k, v)) = fan_place(&head.workflow_name, head.fan_index) {
        out.insert(k.into(), v);
    }
    // Waiting for a slot under its workflow's concurrency limit.
    if let (Some(key), Some(ahead)) = (&head.concurrency_key, head.slot_ahead) {
        out.insert("waitingForSlot".into(), json!({"key": key, "ahead": ahead}));
    }
    // Its priority, when created with one.
    if let Some(p) = head.priority {
        out.insert("priority".into(), json!(p));
    }
    // When it must have finished by.
    if let Some(d) = &head.deadline {
        out.insert("deadline".into(), Value::String(d.clone()));
    }
}

/// Beyond Clamp: what a request that is not running waits for, as the field that says it.
fn waits(head: &Head) -> Option<(&'static str, Value)> {
    let step_id = head.current_step_id;
    match head.waits() {
        Waits::Event { event, key, until } => {
            let mut w = json!({"step_id": step_id, "event": event, "key": key});
            if let Some(by) = until {
                w["timesOutAt"] = Value::String(by.to_string());
            }
            Some(("awaitingEvent", w))
        }
        Waits::Answer { by } => Some(("answerDue", json!({"step_id": step_id, "by": by}))),
        Waits::Sleep { until } => Some(("waiting", json!({"step_id": step_id, "until": until}))),
        Waits::Retry => Some((
            "retrying",
            json!({
                "step_id": step_id,
                "attempts": head.step_attempts,
                "last_error": head.last_error.as_deref().unwrap_or(""),
                "next_attempt_at": head.retry_at,
            }),
        )),
        Waits::Nothing => None,
    }
}

/// A create's answer without serde: `{"pollUrl":"/serviceRequest/<id>","status":"<status>","serviceRequestId":"<id>"}`.
pub fn created(id: &Uuid, status: &str) -> Bytes {
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

/// A create's answer with fields beyond Clamp's (a delayed start, a retry's count).
pub fn created_with(id: &Uuid, status: &str, extra: &[(&str, Value)]) -> Value {
    let mut v = json!({
        "pollUrl": format!("/serviceRequest/{id}"),
        "status": status,
        "serviceRequestId": id.to_string(),
    });
    for (k, x) in extra {
        v[*k] = x.clone();
    }
    v
}

/// One request as lists show it (Clamp's list by workflow, and search).
/// What a child request is to its parent: a branch (its workflow's last segment), an
/// item index, or a LOOP's iteration (from 1), when a fan-out step started it.
pub fn fan_place(workflow_name: &str, fan_index: Option<i32>) -> Option<(&'static str, Value)> {
    use crate::workflow::model::{ITEM_BRANCH, ITERATION, LOOP_BODY};
    let i = fan_index?;
    Some(match workflow_name.rsplit_once('/') {
        Some((_, LOOP_BODY)) => (ITERATION, json!(i + 1)),
        Some((_, b)) if b != ITEM_BRANCH => ("branch", Value::String(b.to_string())),
        _ => ("index", json!(i)),
    })
}

/// `GET /serviceRequest/{id}/children` (beyond Clamp).
pub fn children(page: &[Child], total: i64) -> Value {
    let items: Vec<Value> = page
        .iter()
        .map(|c| {
            let mut o = json!({
                "serviceRequestId": c.id.to_string(),
                "stepId": c.step_id,
                "workflow_name": c.workflow_name,
                "status": c.status.as_str(),
            });
            if let Some((k, v)) = fan_place(&c.workflow_name, c.fan_index) {
                o[k] = v;
            }
            o
        })
        .collect();
    json!({"children": items, "totalChildren": total})
}

/// A request's notifications (beyond Clamp).
pub fn notifications(all: &[crate::ops::read::Notification]) -> Value {
    json!({"notifications": all.iter().map(|n| json!({
        "id": n.id.to_string(),
        "status": n.status.as_str(),
        "state": n.state,
        "attempts": n.attempts,
        "lastError": n.last_error,
        "finishedAt": n.finished_at,
        "deliveredAt": n.delivered_at,
    })).collect::<Vec<_>>()})
}

pub fn request_item(r: &RequestRow) -> Value {
    let mut item = json!({
        "id": r.id.to_string(),
        "workflow_name": r.workflow_name,
        "status": r.status.as_str(),
        "created_at": r.created_at,
        "payload": parsed(r.payload.as_deref()).unwrap_or(Value::Null),
        "current_step_id": r.current_step_id,
        "reason": r.reason.as_deref().unwrap_or(""),
    });
    // Beyond Clamp, and only when there are some: Clamp's item keeps its shape.
    if !r.labels.is_empty() {
        item["labels"] = json!(r.labels);
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_body_shape() {
        let id = uuid::Uuid::nil();
        let v: serde_json::Value = serde_json::from_slice(&created(&id, "NEW")).unwrap();
        assert_eq!(v["pollUrl"], format!("/serviceRequest/{id}"));
        assert_eq!(v["status"], "NEW");
        assert_eq!(v["serviceRequestId"], id.to_string());
    }
}
