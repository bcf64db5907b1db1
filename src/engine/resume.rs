//! Step responses: the answer to a paused ASYNC step, however it came (`POST
//! /stepResponse`, the AMQP response queue, the Kafka response topic); those three are
//! thin adapters over `Executor::apply_response`.
//!
//! The response is durable before it counts as applied: one statement records it on the
//! step and marks the request RESUMED at its next step, only if the request is PAUSED at
//! exactly this step. When the local executor has room, the same statement leases the
//! request to this instance and it continues at once (no sweep, no second update);
//! otherwise it is left unleased and the sweeper is woken. A response for a step already
//! answered is a harmless duplicate; one for a step the request is not waiting on is
//! refused; so is one for an unknown request.
//!
//! The answer's step and what follows it come from the request's workflow, read with the
//! request's row; for a request this process paused, the workflow is known from the
//! pause (`paused`) and the resume statement goes first, alone: only when it applies
//! nothing is the row read, to say why.

use crate::status::{RequestStatus, StepStatus};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::time::Instant;
use uuid::Uuid;

use super::{EngineError, Executor, Result};
use crate::backoff::Backoff;
use crate::store::leases::Claimed;
use crate::store::step_responses::{self, RequestState, Resume};
use crate::store::StoreError;
use crate::workflow::{CompiledStep, StepType, Workflow};

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

/// A parsed, checked step response.
#[derive(Debug)]
pub struct Answer {
    pub id: Uuid,
    pub step_id: u32,
    pub response: StepResponse,
    /// The outcome of a child request (a WORKFLOW step's answer); a WORKFLOW step takes
    /// no other.
    pub from_child: bool,
    /// The `traceparent` the answer came with (an HTTP header, a message header): linked
    /// from the request's `resume` span.
    pub traceparent: Option<crate::telemetry::TraceParent>,
}

/// Parses and checks a step response body; a body that can never apply is `BadInput`.
pub fn parse(body: &[u8]) -> Result<Answer> {
    let bad = |m: String| EngineError::BadInput(m);
    let r: StepResponse =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid step response: {e}")))?;
    let id = Uuid::parse_str(&r.service_request_id)
        .map_err(|_| bad("serviceRequestId is not a valid UUID".into()))?;
    let step_id = u32::try_from(r.step_id)
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| bad("stepId must be a positive integer".into()))?;
    if r.response.is_none() && r.failure().is_none() {
        return Err(bad("a step response needs a response or an error".into()));
    }
    Ok(Answer {
        traceparent: None,
        id,
        step_id,
        response: r,
        from_child: false,
    })
}

/// What applying a step response did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    Resumed,
    Duplicate,
    /// The request is at this ASYNC step but its pause is not written yet: the answer
    /// came back while the step was still being sent. Worth trying again shortly.
    NotYet(String),
    NotWaiting(String),
    Unknown,
}

/// How often a response that came back before its pause was written, for a request
/// running on another instance, looks again: no notification crosses instances, so this
/// one wait is a poll, growing from the first to the longest pause.
const REMOTE_FIRST_LOOK: Duration = Duration::from_millis(20);
const REMOTE_LONGEST_LOOK: Duration = Duration::from_millis(500);

impl Executor {
    /// Applies a step response, waiting up to `patience` while it came back before the
    /// step's pause was written (a fast service answers before the send returns). While
    /// the request still runs in this process, the wait is for its job to stop (a
    /// notification), not a poll of Postgres.
    pub async fn apply_response(
        self: &Arc<Self>,
        a: &Answer,
        patience: Duration,
    ) -> Result<Applied> {
        let deadline = Instant::now() + patience;
        let mut remote = Backoff::new(REMOTE_FIRST_LOOK, REMOTE_LONGEST_LOOK);
        loop {
            self.app.running.wait_gone(a.id, deadline).await;
            match self.apply_once(a).await? {
                Applied::NotYet(msg) if Instant::now() >= deadline => {
                    return Ok(Applied::NotWaiting(msg))
                }
                Applied::NotYet(_) if self.app.running.contains(&a.id) => {}
                Applied::NotYet(_) => {
                    let pause = remote.next_delay().min(deadline - Instant::now());
                    tokio::time::sleep(pause).await;
                }
                done => return Ok(done),
            }
        }
    }

    /// Applies a step response once: finds the step it answers, records it with the one
    /// resume statement, and, when that statement changed nothing, says why.
    async fn apply_once(self: &Arc<Self>, a: &Answer) -> Result<Applied> {
        let conn = self.pool.get().await.map_err(StoreError::from)?;
        // Paused here: its workflow is known, and the resume statement alone decides.
        if let Some(wf) = self.app.paused.take(&a.id) {
            if let Ok(step) = answered_step(&wf, &wf.name, a) {
                let after = self.after_answer(&wf, step, a).await?;
                let outcome = Outcome::of(&wf, step, a, after);
                if let Some(applied) = self.resume(&conn, a, &outcome).await? {
                    return Ok(applied);
                }
            }
            // Not applied as it is (a repeat, too early, another step): the long way says
            // why, and the hint is kept for an answer still to come.
            self.app.paused.insert(a.id, &wf);
        }
        let Some(state) = step_responses::request_state(&conn, a.id).await? else {
            return Ok(Applied::Unknown);
        };
        let wf = self
            .app
            .workflows
            .get_or_load_version(&self.pool, &state.workflow_name, state.workflow_version)
            .await?
            .ok_or_else(|| EngineError::WorkflowMissing(state.workflow_name.clone()))?;
        let step = match answered_step(&wf, &state.workflow_name, a) {
            Ok(step) => step,
            Err(refused) => return Ok(refused),
        };
        let after = self.after_answer(&wf, step, a).await?;
        let outcome = Outcome::of(&wf, step, a, after);
        if let Some(applied) = self.resume(&conn, a, &outcome).await? {
            self.app.paused.take(&a.id);
            return Ok(applied);
        }
        not_applied(&conn, a, step, &state).await
    }

    /// Where an answer that fails its step sends the request (0 for a success: unused).
    async fn after_answer(&self, wf: &Workflow, step: &CompiledStep, a: &Answer) -> Result<u32> {
        if a.response.failure().is_none() {
            return Ok(0);
        }
        Ok(self.after_failure(wf, a.id, step).await?)
    }

    /// The resume statement for `outcome`, leased to this executor when it has a slot
    /// (then continued here at once), else left for any sweeper; None when the request
    /// was not paused at that step (nothing written).
    async fn resume(
        self: &Arc<Self>,
        conn: &crate::store::PgConn,
        a: &Answer,
        outcome: &Outcome,
    ) -> Result<Option<Applied>> {
        let owner = (self.try_reserve(1) == 1).then_some(self.app.instance_id);
        let resumed = match self.record(conn, a, outcome, owner).await {
            Ok(r) => r,
            Err(e) => {
                if owner.is_some() {
                    self.unreserve(1);
                }
                return Err(e);
            }
        };
        if let Some(c) = &resumed {
            self.announce(a, c, outcome.step_status);
        }
        Ok(match (resumed, owner) {
            (Some(claimed), Some(_)) => {
                self.start_resumed(claimed);
                Some(Applied::Resumed)
            }
            (Some(_), None) => {
                self.wake();
                Some(Applied::Resumed)
            }
            (None, Some(_)) => {
                self.unreserve(1);
                None
            }
            (None, None) => None,
        })
    }

    /// The resume statement for `outcome`: the request leased to `owner` when given
    /// (this executor reserved a slot for it), else left free.
    async fn record(
        &self,
        conn: &crate::store::PgConn,
        a: &Answer,
        outcome: &Outcome,
        owner: Option<Uuid>,
    ) -> Result<Option<Claimed>> {
        let resume = Resume {
            id: a.id,
            step_id: a.step_id,
            next_step: outcome.next_step,
            next_request: outcome.next_request(),
            failed_step: outcome.failed_step,
            reason: outcome.reason.as_deref(),
            step_status: outcome.step_status,
            step_response: &outcome.response,
            // The step's reason is the request's: the failure that ended the step.
            step_reason: outcome.reason.as_deref(),
            owner,
            lease_ms: self.app.config.lease.as_secs_f64() * 1000.0,
        };
        Ok(step_responses::resume(conn, &resume).await?)
    }

    /// After a resume committed: wakes whoever waits on the request (step responses and
    /// long polls), and marks the resume on the request's trace, linked to the answer's.
    fn announce(&self, a: &Answer, resumed: &Claimed, step_status: StepStatus) {
        self.app.changes.notify(&a.id);
        if let Some((t, trace)) = self.app.traced(&resumed.headers) {
            t.mark_linked(
                &trace,
                &a.id,
                "resume",
                a.traceparent
                    .iter()
                    .map(crate::telemetry::link_to)
                    .collect(),
                vec![
                    opentelemetry::KeyValue::new("clamp.step.id", a.step_id as i64),
                    opentelemetry::KeyValue::new("clamp.step.status", step_status.as_str()),
                ],
            );
        }
    }
}

/// The step `a` answers, or why no step of the request's workflow takes it: a step that
/// does not exist, or an answer of the wrong kind (a WORKFLOW step takes only its child's
/// outcome, and no other step takes one).
fn answered_step<'w>(
    wf: &'w Workflow,
    workflow_name: &str,
    a: &Answer,
) -> Result<&'w CompiledStep, Applied> {
    let Some(step) = wf.step(a.step_id) else {
        return Err(Applied::NotWaiting(format!(
            "workflow {} has no step {}",
            workflow_name, a.step_id
        )));
    };
    if step.mode == crate::workflow::Mode::Event {
        return Err(Applied::NotWaiting(format!(
            "step {} of workflow {} waits for an event (POST /events/{{event}}), not for a step response",
            a.step_id, workflow_name
        )));
    }
    if step.mode.has_children() != a.from_child {
        return Err(Applied::NotWaiting(format!(
            "step {} of workflow {} {}",
            a.step_id,
            workflow_name,
            if a.from_child {
                "does not start child requests"
            } else {
                "waits for its child request, not for a step response"
            }
        )));
    }
    Ok(step)
}

/// What an answer makes of its step and of the request: a response completes the step
/// and feeds the next main step; an error fails it and goes to its first onFailure step.
struct Outcome {
    /// The step's response as stored (the error document for a failure).
    response: String,
    next_step: u32,
    failed_step: Option<u32>,
    reason: Option<String>,
    step_status: StepStatus,
}

impl Outcome {
    /// `after_failure`: the step a failure goes to (`Executor::after_failure`).
    fn of(wf: &Workflow, step: &CompiledStep, a: &Answer, after_failure: u32) -> Outcome {
        match a.response.failure() {
            None => Outcome {
                response: a
                    .response
                    .response
                    .clone()
                    .unwrap_or(Value::Null)
                    .to_string(),
                next_step: wf.next_main(a.step_id).unwrap_or(0),
                failed_step: None,
                reason: None,
                step_status: StepStatus::Completed,
            },
            Some(e) => Outcome {
                response: super::Doc::error(e.code, &e.message).as_str().to_string(),
                next_step: after_failure,
                failed_step: Some(a.step_id),
                reason: Some(format!(
                    "step '{}' failed: {} {}",
                    step.name, e.code, e.message
                )),
                step_status: StepStatus::Failed,
            },
        }
    }

    /// The next step's request: the response, after a success; after a failure the
    /// onFailure step gets the failed step's own request (None).
    fn next_request(&self) -> Option<&str> {
        (self.step_status == StepStatus::Completed).then_some(self.response.as_str())
    }
}

/// Why an answer the resume statement did not apply was not applied: a duplicate of an
/// answer already recorded, one that came before its step's pause was written, or one
/// for a step the request is not waiting on.
async fn not_applied(
    conn: &crate::store::PgConn,
    a: &Answer,
    step: &CompiledStep,
    state: &RequestState,
) -> Result<Applied> {
    let is_async = step.step_type == StepType::Async;
    if is_async && step_responses::answered(conn, a.id, a.step_id).await? {
        return Ok(Applied::Duplicate);
    }
    let (status, current) = (state.status, state.current_step_id);
    let msg = format!(
        "service request is {status} at step {current}, not waiting for a response to step {}",
        a.step_id
    );
    // Running (not paused, not finished) and not yet past this ASYNC step: it is being
    // sent now, or about to be. The stored step lags: a request handed to the executor
    // at insert still says step 0 until its first step is written.
    let sending = is_async
        && status != RequestStatus::Paused
        && !status.is_finished()
        && current <= a.step_id as i32;
    Ok(if sending {
        Applied::NotYet(msg)
    } else {
        Applied::NotWaiting(msg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_step_responses() {
        let id = "0190b8a0-0000-7000-8000-000000000000";
        let ok = |s: String| parse(s.as_bytes()).is_ok();
        assert!(ok(format!(
            r#"{{"serviceRequestId":"{id}","stepId":2,"response":{{"a":1}}}}"#
        )));
        assert!(ok(format!(
            r#"{{"serviceRequestId":"{id}","stepId":2,"error":{{"code":500,"message":"x"}}}}"#
        )));
        let bad = |s: &str| match parse(s.as_bytes()) {
            Err(e @ EngineError::BadInput(_)) => assert!(!e.is_transient()),
            other => panic!("{s}: {other:?}"),
        };
        bad(&format!(r#"{{"serviceRequestId":"{id}","stepId":2}}"#));
        bad(&format!(
            r#"{{"serviceRequestId":"{id}","stepId":0,"response":{{}}}}"#
        ));
        bad(r#"{"serviceRequestId":"nope","stepId":1,"response":{}}"#);
        bad("not json");
    }
}
