//! Answer timeouts of ASYNC steps (beyond Clamp): every sweeper looks, once a second, for
//! paused requests whose step has waited past its `answerTimeout` (`store::deadlines`),
//! and times each out with one statement: the step's attempt is recorded FAILED ("no
//! answer within …"), and the request goes on as a call that timed out would: the step
//! is sent again when its retry policy allows another attempt (a timeout is retryable,
//! at once, as a call's is), else its onFailure steps run, else it fails. The statement
//! applies only while the request still waits at that step past its deadline, so an
//! answer racing the timeout, a cancel, or a second instance's look leaves one outcome.
//!
//! Request deadlines (beyond Clamp) are ended here too, for the requests no executor
//! holds (paused, asleep, or waiting out a back-off): the step each is at fails with the
//! deadline as its reason, its children are cancelled, and the request goes on to the
//! step's onFailure steps, or fails. An executor ends the requests it holds itself
//! (`job`), dropping the call in flight.

use std::sync::Arc;

use crate::engine::Executor;
use crate::outbound::call::{CallError, CallErrorKind};
use crate::outbound::doc::Doc;
use crate::store::deadlines::{self, End, Expire, Overdue};

/// Most overdue requests timed out per look.
const BATCH: i64 = 100;

impl Executor {
    /// Times out the answers that are overdue.
    pub async fn expire_answers(self: &Arc<Self>) {
        let due = async {
            let conn = self.looks.get().await?;
            deadlines::due(&conn, BATCH).await
        }
        .await;
        let mut woke = false;
        for o in due.unwrap_or_default() {
            if let Ok(true) = self.expire(&o).await {
                self.app.metrics.answer_timeouts.inc();
                self.app.changes.notify(&o.id);
                woke = true;
            }
        }
        let past = async {
            let conn = self.looks.get().await?;
            deadlines::past_deadline(&conn, BATCH).await
        }
        .await;
        for p in past.unwrap_or_default() {
            if let Ok(true) = self.end_at_deadline(&p).await {
                self.app.metrics.deadlines_passed.inc();
                self.app.changes.notify(&p.id);
                woke = true;
            }
        }
        if woke {
            self.wake();
        }
    }

    /// Ends one request at its deadline; true when this look did (not another instance, an
    /// answer or a claim first).
    async fn end_at_deadline(self: &Arc<Self>, p: &Overdue) -> crate::store::Result<bool> {
        let wf = match self
            .app
            .workflows
            .get_or_load_version(&self.pool, &p.workflow_name, p.workflow_version)
            .await
        {
            Ok(Some(wf)) => wf,
            _ => return Ok(false),
        };
        let step = wf.step(p.step_id);
        let name = step.map_or("", |s| &s.name);
        let reason = format!(
            "step '{name}' failed: {}",
            crate::engine::step_io::DEADLINE_PASSED
        );
        let response = Doc::error(504, crate::engine::step_io::DEADLINE_PASSED);
        let next_step = match step {
            Some(s) => self.after_failure(&wf, p.id, s).await?,
            None => 0,
        };
        let end = End {
            id: p.id,
            step_id: p.step_id,
            step_name: name,
            next_step,
            reason: &reason,
            step_response: response.as_str(),
            step_reason: crate::engine::step_io::DEADLINE_PASSED,
        };
        let conn = self.pool.get().await?;
        deadlines::end(&conn, &end).await
    }

    /// Times out one overdue answer; true when this look did (not an answer or another
    /// instance first).
    async fn expire(self: &Arc<Self>, o: &Overdue) -> crate::store::Result<bool> {
        let wf = match self
            .app
            .workflows
            .get_or_load_version(&self.pool, &o.workflow_name, o.workflow_version)
            .await
        {
            Ok(Some(wf)) => wf,
            // Its workflow is gone: nothing here can say what its timeout does.
            _ => return Ok(false),
        };
        let Some(step) = wf.step(o.step_id) else {
            return Ok(false);
        };
        let within = step
            .answer_timeout
            .map_or_else(String::new, crate::workflow::wait::iso);
        let message = format!("no answer within {within}");
        let e = CallError::new(CallErrorKind::Timeout, message.clone());
        let policy = crate::engine::step_io::policy(self, step);
        let attempts = o.attempts.max(1);
        // An EVENT step's timeout is its end: waiting again would only wait longer.
        let again = step.mode != crate::workflow::Mode::Event
            && e.retryable(&policy)
            && attempts < policy.max_attempts;
        let response = Doc::error(504, &message);
        let reason = format!("step '{}' failed: {message}", step.name);
        let last_error = format!("attempt {attempts} failed: {message}");
        // Sent again at once (a timeout already waited), or failed: its onFailure steps,
        // else the end of the request.
        let expire = Expire {
            id: o.id,
            step_id: o.step_id,
            next_step: if again {
                o.step_id
            } else {
                self.after_failure(&wf, o.id, step).await?
            },
            retry: again.then_some((attempts, last_error.as_str(), 0.0)),
            failed_step: (!again).then_some(o.step_id),
            reason: (!again).then_some(reason.as_str()),
            step_response: response.as_str(),
            step_reason: &message,
        };
        if again {
            self.app.metrics.count_retry(e.cause());
        }
        let conn = self.pool.get().await?;
        deadlines::expire(&conn, &expire).await
    }
}
