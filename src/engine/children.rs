//! Telling parents: a finished child request's outcome becomes the answer of the
//! WORKFLOW step that waits for it, through the step-response path (one statement that
//! records the answer and resumes the parent only if it is paused at that step). The
//! executor that finished a child tells at once; every sweeper also looks every second
//! for children whose parent has not heard (their executor stopped first), so a crash on
//! either side loses nothing, and a repeat is a harmless duplicate.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::resume::{Answer, Applied, StepError, StepResponse};
use super::Executor;
use crate::store::children::{self, Untold};

/// Most children told per look.
const BATCH: i64 = 100;

impl Executor {
    /// Tells the parents of finished children that have not heard.
    pub async fn report_children(self: &Arc<Self>) {
        let untold = async {
            let conn = self
                .looks
                .get()
                .await
                .map_err(crate::store::StoreError::from)?;
            children::untold(&conn, BATCH).await
        }
        .await;
        let Ok(untold) = untold else {
            // The database is away: the next look finds them.
            return;
        };
        for c in untold {
            if c.fan_index.is_some() {
                // Counted by its fan-out step's join, which tells it.
                self.tell_fan(c.id).await;
                continue;
            }
            let told = match self.apply_response(&answer(&c), Duration::ZERO).await {
                Ok(Applied::NotYet(_)) | Err(_) => false,
                Ok(_) => true,
            };
            if told {
                if let Ok(conn) = self.pool.get().await {
                    let _ = children::told(&conn, c.id).await;
                }
            }
        }
    }
}

/// A child's outcome as its parent's step response: its last answer when it completed,
/// an error naming it and its reason when it failed or was cancelled.
fn answer(c: &Untold) -> Answer {
    let completed = c.status == crate::status::RequestStatus::Completed;
    let response = completed.then(|| {
        c.response
            .as_deref()
            .and_then(|t| serde_json::from_str::<Value>(t).ok())
            .unwrap_or(Value::Null)
    });
    let error = (!completed).then(|| StepError {
        code: 500,
        message: format!(
            "child service request {} is {}: {}",
            c.id,
            c.status,
            c.reason.as_deref().unwrap_or("")
        ),
    });
    Answer {
        traceparent: None,
        id: c.parent,
        step_id: c.parent_step,
        response: StepResponse {
            service_request_id: c.parent.to_string(),
            step_id: c.parent_step as i64,
            response: Some(response.unwrap_or(Value::Null)).filter(|_| completed),
            error,
        },
        from_child: true,
    }
}
