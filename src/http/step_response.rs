//! `POST /stepResponse`: the answer to a paused ASYNC step.
//!
//! The response is durable before the 200: one statement records it on the step and
//! marks the request RESUMED with its next step and that step's request, and only if the
//! request is PAUSED at exactly this step. When the local executor has room, the same
//! statement leases the request to this instance and it continues at once (no sweep, no
//! second update); otherwise it is left unleased and the sweeper is woken.
//! A response for a step already answered is a harmless duplicate (200, "duplicate
//! ignored"); one for a step the request is not waiting on is 409; an unknown request 404.

use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::body;
use super::response::{error, json_bytes, store_error, Resp};
use crate::state::Core;
use crate::store::StoreError;

/// The error form of a step response.
#[derive(Debug, Deserialize)]
pub struct StepError {
    #[serde(default)]
    pub code: i64,
    #[serde(default)]
    pub message: String,
}

/// The body of `POST /stepResponse` (and of broker replies).
#[derive(Debug, Deserialize)]
pub struct StepResponse {
    #[serde(rename = "serviceRequestId")]
    pub service_request_id: String,
    #[serde(rename = "stepId")]
    pub step_id: i64,
    #[serde(default)]
    pub response: Option<Value>,
    #[serde(default)]
    pub error: Option<StepError>,
}

impl StepResponse {
    /// The error form, when one was posted (an all-empty `error` object counts as none).
    pub fn failure(&self) -> Option<&StepError> {
        self.error
            .as_ref()
            .filter(|e| e.code != 0 || !e.message.is_empty())
    }
}

/// What applying a step response did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    Resumed,
    Duplicate,
    /// The request is at this ASYNC step but its pause is not written yet: the answer
    /// came back while the step was still being sent. Worth retrying shortly.
    NotYet(String),
    NotWaiting(String),
    Unknown,
}

/// How often a response for a request still running in this process looks again.
const LOCAL_RETRY: Duration = Duration::from_millis(2);

/// How often a response that came too early is tried again.
const NOT_YET_RETRY: Duration = Duration::from_millis(20);

const RESUME: &str = "\
WITH resumed AS (
    UPDATE service_requests SET status = 'RESUMED', current_step_id = $3,
        step_request = COALESCE($4, (SELECT request FROM steps_status
                                     WHERE service_request_id = $1 AND step_id = $2 ORDER BY id DESC LIMIT 1)),
        failed_step_id = $5, reason = $6, updated_at = now(),
        -- Leased to this instance when it has room to continue the request at once;
        -- otherwise free for any sweeper.
        lease_owner = $10,
        lease_until = CASE WHEN $10::uuid IS NULL THEN '-infinity'::timestamptz
                           ELSE now() + $11::float8 * interval '1 millisecond' END
    WHERE id = $1 AND status = 'PAUSED' AND current_step_id = $2
    RETURNING id, workflow_name, status, payload, headers, current_step_id, step_request,
              failed_step_id, reason
), answered AS (
    UPDATE steps_status SET status = $7, response = $8, reason = $9, finished_at = now(),
        time_taken_ms = round(extract(epoch FROM now() - started_at) * 1000)::bigint
    WHERE service_request_id = $1 AND step_id = $2 AND status = 'STARTED'
      AND EXISTS (SELECT 1 FROM resumed)
)
SELECT * FROM resumed";

/// Parses and checks a step response body.
pub fn parse(body: &[u8]) -> Result<(Uuid, u32, StepResponse), String> {
    let r: StepResponse =
        serde_json::from_slice(body).map_err(|e| format!("invalid step response: {e}"))?;
    let id = Uuid::parse_str(&r.service_request_id)
        .map_err(|_| "serviceRequestId is not a valid UUID".to_string())?;
    let step = u32::try_from(r.step_id)
        .ok()
        .filter(|s| *s > 0)
        .ok_or("stepId must be a positive integer")?;
    let has_error = r.failure().is_some();
    if r.response.is_none() && !has_error {
        return Err("a step response needs a response or an error".into());
    }
    Ok((id, step, r))
}

/// Applies a step response; shared by the HTTP handler and the broker consumers.
pub async fn apply(
    core: &Core,
    id: Uuid,
    step_id: u32,
    r: &StepResponse,
) -> Result<Applied, StoreError> {
    let conn = core.pool.get().await?;
    let Some(row) = conn
        .client
        .query_opt(
            "SELECT workflow_name, status, current_step_id FROM service_requests WHERE id = $1",
            &[&id],
        )
        .await?
    else {
        return Ok(Applied::Unknown);
    };
    let wf_name: String = row.get(0);
    let status: String = row.get(1);
    let current: i32 = row.get(2);
    let wf = match crate::http::service_requests::find_workflow(core, &wf_name).await {
        Ok(Some(wf)) => wf,
        _ => {
            return Err(StoreError::Unavailable(format!(
                "workflow {wf_name} not found"
            )))
        }
    };
    let Some(step) = wf.step(step_id) else {
        return Ok(Applied::NotWaiting(format!(
            "workflow {wf_name} has no step {step_id}"
        )));
    };
    let failure = r.failure();
    let (next, next_request, failed_step, reason, rec_status, rec_response, rec_reason) =
        match failure {
            None => {
                let resp = r.response.clone().unwrap_or(Value::Null).to_string();
                let next = wf.next_main(step_id).unwrap_or(0);
                (
                    next,
                    Some(resp.clone()),
                    None,
                    None,
                    "COMPLETED",
                    resp,
                    None,
                )
            }
            Some(e) => {
                let why = format!("step '{}' failed: {} {}", step.name, e.code, e.message);
                let next = step.on_failure.first().copied().unwrap_or(0);
                let errors = json!({"errors": {"code": e.code, "message": e.message}}).to_string();
                (
                    next,
                    None,
                    Some(step_id as i32),
                    Some(why.clone()),
                    "FAILED",
                    errors,
                    Some(why),
                )
            }
        };
    let stmt = conn.stmt(RESUME).await?;
    let exec = &core.executor;
    let owner = (exec.try_reserve(1) == 1).then_some(core.app.instance_id);
    let lease_ms = core.app.config.lease.as_secs_f64() * 1000.0;
    let resumed = conn
        .client
        .query_opt(
            &stmt,
            &[
                &id,
                &(step_id as i32),
                &(next as i32),
                &next_request,
                &failed_step,
                &reason,
                &rec_status,
                &rec_response,
                &rec_reason,
                &owner,
                &lease_ms,
            ],
        )
        .await;
    let resumed = match resumed {
        Ok(r) => r,
        Err(e) => {
            if owner.is_some() {
                exec.unreserve(1);
            }
            return Err(e.into());
        }
    };
    match (resumed, owner) {
        (Some(row), Some(_)) => {
            exec.start_resumed(crate::engine::claim::Claimed::from_row(&row));
            return Ok(Applied::Resumed);
        }
        (Some(_), None) => {
            exec.wake();
            return Ok(Applied::Resumed);
        }
        (None, Some(_)) => exec.unreserve(1),
        (None, None) => {}
    }
    // Not applied: a duplicate of an answer already recorded, or not the paused step.
    let answered: bool = conn
        .client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM steps_status WHERE service_request_id = $1 AND step_id = $2 \
             AND status IN ('COMPLETED', 'FAILED'))",
            &[&id, &(step_id as i32)],
        )
        .await?
        .get(0);
    if answered && step.step_type == crate::workflow::StepType::Async {
        return Ok(Applied::Duplicate);
    }
    let msg = format!(
        "service request is {status} at step {current}, not waiting for a response to step {step_id}"
    );
    // Running (not paused, not finished) and not yet past this ASYNC step: it is being
    // sent now, or about to be. The stored step lags: a request handed to the executor
    // at insert still says step 0 until its first step is written.
    let sending = step.step_type == crate::workflow::StepType::Async
        && !matches!(status.as_str(), "PAUSED" | "COMPLETED" | "FAILED")
        && current <= step_id as i32;
    Ok(if sending {
        Applied::NotYet(msg)
    } else {
        Applied::NotWaiting(msg)
    })
}

/// Applies a step response, trying again for up to `patience` while it came back before
/// the step's pause was written (a fast service answers before the send returns).
pub async fn apply_when_ready(
    core: &Core,
    id: Uuid,
    step_id: u32,
    r: &StepResponse,
    patience: Duration,
) -> Result<Applied, StoreError> {
    let until = tokio::time::Instant::now() + patience;
    loop {
        // Still running in this process (its pause not yet written): wait for that in
        // memory rather than asking Postgres again and again.
        while core.app.running_here.lock().contains(&id) && tokio::time::Instant::now() < until {
            tokio::time::sleep(LOCAL_RETRY).await;
        }
        match apply(core, id, step_id, r).await? {
            Applied::NotYet(msg) if tokio::time::Instant::now() >= until => {
                return Ok(Applied::NotWaiting(msg))
            }
            Applied::NotYet(_) => tokio::time::sleep(NOT_YET_RETRY).await,
            done => return Ok(done),
        }
    }
}

/// How long `POST /stepResponse` waits for a pause still being written before it says 409.
const HTTP_PATIENCE: Duration = Duration::from_secs(2);

/// `POST /stepResponse`.
pub async fn post(core: &Core, req: Request<Incoming>) -> Resp {
    let app = &core.app;
    let body = match body::read(req, app.config.body_limit, app.config.header_timeout).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (id, step_id, r) = match parse(&body) {
        Ok(x) => x,
        Err(msg) => return error(StatusCode::BAD_REQUEST, &msg),
    };
    match apply_when_ready(core, id, step_id, &r, HTTP_PATIENCE).await {
        Ok(Applied::Resumed) => ok("success"),
        Ok(Applied::Duplicate) => ok("duplicate response ignored"),
        Ok(Applied::NotWaiting(msg) | Applied::NotYet(msg)) => error(StatusCode::CONFLICT, &msg),
        Ok(Applied::Unknown) => error(StatusCode::NOT_FOUND, "no service request with this id"),
        Err(e) => store_error(e, "step response"),
    }
}

fn ok(message: &'static str) -> Resp {
    json_bytes(
        StatusCode::OK,
        bytes::Bytes::from(format!("{{\"code\":200,\"message\":\"{message}\"}}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_step_responses() {
        let id = "0190b8a0-0000-7000-8000-000000000000";
        assert!(parse(
            format!(r#"{{"serviceRequestId":"{id}","stepId":2,"response":{{"a":1}}}}"#).as_bytes()
        )
        .is_ok());
        assert!(parse(
            format!(
                r#"{{"serviceRequestId":"{id}","stepId":2,"error":{{"code":500,"message":"x"}}}}"#
            )
            .as_bytes()
        )
        .is_ok());
        assert!(parse(format!(r#"{{"serviceRequestId":"{id}","stepId":2}}"#).as_bytes()).is_err());
        assert!(parse(
            format!(r#"{{"serviceRequestId":"{id}","stepId":0,"response":{{}}}}"#).as_bytes()
        )
        .is_err());
        assert!(parse(br#"{"serviceRequestId":"nope","stepId":1,"response":{}}"#).is_err());
        assert!(parse(b"not json").is_err());
    }
}
