//! What a committed transition tells the readers of this process, applied by the step
//! writer right after the commit and before the job hears of it (so the window in which
//! a status read finds the row ahead of memory is as short as it can be):
//!
//! - long polls waiting on the request wake when its status (as reads show it) changed;
//! - a request run here from its first step keeps its committed step rows and where its
//!   row stands (`Running::live`), so a read needs only the row from Postgres;
//! - its answer once COMPLETED (which never changes again) is kept for the reads that
//!   come after; a FAILED one is not, as a retry may change it on any instance.

use crate::status::RequestStatus;
use std::sync::Arc;

use super::writer::{StepRecord, Transition};
use crate::engine::Shared;
use crate::outbound::doc::Doc;
use crate::store::status::{self, Head, Live, StepRow};
use crate::workflow::Workflow;

/// Starts keeping the step rows of a request this process runs from its first step.
pub fn start(
    app: &Shared,
    id: &uuid::Uuid,
    wf: &Workflow,
    created_us: i64,
    deadline_us: Option<i64>,
    priority: Option<i16>,
) {
    app.running.with_live(id, |live| {
        *live = Some(Arc::new(Live {
            workflow_name: wf.name.clone(),
            workflow_version: wf.def.version as i32,
            created_us,
            deadline_us,
            priority,
            // Room for the main steps (the common run), so pushing them never reallocates.
            steps: Vec::with_capacity(wf.main.len()),
            current_step_id: 0,
            step_attempts: 0,
        }))
    });
}

/// Applies one committed transition.
pub fn committed(app: &Shared, t: &Transition) {
    if t.status != RequestStatus::InProgress {
        app.changes.notify(&t.id);
    }
    let done = app.running.with_live(&t.id, |slot| {
        let live = Arc::make_mut(slot.as_mut()?);
        if let Some(rec) = &t.step {
            live.steps.push(step_row(rec));
        }
        match t.status {
            RequestStatus::InProgress => {
                live.current_step_id = t.next_step as i32;
                live.step_attempts = t.attempts as i32;
                None
            }
            // Paused, or finished: nothing more is written here for it.
            _ => slot.take(),
        }
    });
    let Some(Some(live)) = done else {
        return;
    };
    if t.status.never_changes() {
        let live = Arc::unwrap_or_clone(live);
        let head = Head {
            workflow_name: live.workflow_name,
            workflow_version: live.workflow_version,
            status: t.status,
            current_step_id: t.next_step as i32,
            reason: t.reason.clone(),
            created_at: status::pg_json_timestamp(live.created_us),
            step_attempts: t.attempts as i32,
            last_error: t.last_error.clone(),
            retry_at: None,
            // A delayed request is never run from memory: it is claimed, not handed over.
            start_at: None,
            // Only a request run here from its first step has a memory, and a retried one
            // never is (it continues from a later step).
            retries: 0,
            // Nor is a rerun: its first rows are copies; nor a child: it is never fresh.
            rerun_of: None,
            parent_id: None,
            fan_index: None,
            wait_event: None,
            wait_key: None,
            // Only admitted requests run: none waits for a slot.
            concurrency_key: None,
            slot_ahead: None,
            deadline: live.deadline_us.map(status::pg_json_timestamp),
            priority: live.priority,
        };
        app.finals.insert_parts(t.id, head, live.steps);
    }
}

/// A written step record as the status answer shows it, with its times as Postgres keeps
/// them (microseconds, rounded as it rounds).
fn step_row(rec: &StepRecord) -> StepRow {
    StepRow {
        step_id: rec.stored_id(),
        name: rec.step_name.clone(),
        status: rec.status,
        request: rec.request.as_ref().map(Doc::to_bytes),
        response: rec.response.as_ref().map(Doc::to_bytes),
        time_taken_ms: rec
            .finished_ms
            .map(|f| status::time_taken_ms(rec.started_ms, f)),
        reason: rec.reason.clone(),
        started_ms: status::roundtrip_ms(rec.started_ms),
        finished_ms: rec.finished_ms.map(status::roundtrip_ms),
        attempts: rec.attempts as i32,
        child_id: None,
    }
}
