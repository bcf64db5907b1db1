//! LOOP steps (beyond Clamp): the body runs as a child request per iteration, through
//! the fan-out machinery with one child at a time. When an iteration completes, its join
//! is due as any fan-out step's is; applying it reads `while` over the parent's context,
//! the iteration's answers and `iteration` (counted from 1): while it holds, the next
//! iteration is inserted (fenced on the join's total, so a join applied twice starts it
//! once) and run here at once when there is room; else the step answers as the last
//! iteration's last step did. An iteration that fails fails the step; the bound reached
//! with `while` still holding fails it too, saying so. Each iteration is a row of its
//! own, so a crash resumes the one it was in where it stopped, and none that finished
//! runs again.

use std::sync::Arc;

use serde_json::{Map, Value};
use uuid::Uuid;

use super::resume::{Answer, StepError, StepResponse};
use super::Executor;
use crate::status::RequestStatus;
use crate::store::fan::{self, Iteration, Join, Part};
use crate::workflow::model::{LoopVal, ITERATION};
use crate::workflow::Val;

/// What a LOOP's finished iteration leads to.
pub(super) enum Next {
    /// The step's answer (the loop is over, or failed).
    Answer(Answer),
    /// Nothing to apply now: the next iteration runs (here, or another applier started
    /// it), or the last has not finished.
    Nothing,
}

impl Executor {
    /// After a LOOP's iteration `last`: the next iteration started, or the step's answer.
    pub(super) async fn after_iteration(
        self: &Arc<Self>,
        parent: Uuid,
        step_id: u32,
        join: &Join,
        last: &Part,
    ) -> Next {
        if !last.status.is_finished() {
            return Next::Nothing;
        }
        let iteration = last.index.max(0) as u32 + 1;
        if last.status != RequestStatus::Completed {
            return Next::Answer(failed(
                parent,
                step_id,
                format!(
                    "iteration {iteration} ({}) is {}: {}",
                    last.id,
                    last.status,
                    last.reason.as_deref().unwrap_or("")
                ),
            ));
        }
        let answer = last
            .response
            .as_deref()
            .and_then(|t| serde_json::from_str::<Value>(t).ok())
            .unwrap_or(Value::Null);
        let holds = match self
            .read_while(parent, step_id, join, last, iteration)
            .await
        {
            Ok(h) => h,
            // Not read now (the database, or the definition away): the reporter applies
            // the join again later.
            Err(Retry) => return Next::Nothing,
        };
        match holds {
            Ok(false) => Next::Answer(done(parent, step_id, answer)),
            Err(e) => Next::Answer(failed(
                parent,
                step_id,
                format!("LOOP while after iteration {iteration}: {e}"),
            )),
            Ok(true) if iteration >= join.max_iterations.unwrap_or(0) => Next::Answer(failed(
                parent,
                step_id,
                format!(
                    "LOOP ran its maxIterations ({iteration}) and its while condition still holds"
                ),
            )),
            Ok(true) => {
                self.start_iteration(parent, step_id, join.total, &answer)
                    .await;
                Next::Nothing
            }
        }
    }

    /// `while` over the parent's context, the iteration's steps and `iteration`; the
    /// outer Err when it could not be read now, the inner when it does not evaluate.
    async fn read_while(
        &self,
        parent: Uuid,
        step_id: u32,
        join: &Join,
        last: &Part,
        iteration: u32,
    ) -> Result<Result<bool, String>, Retry> {
        let wf = self
            .app
            .workflows
            .get_or_load_version(
                &self.pool,
                &join.parent_workflow,
                join.parent_version as u32,
            )
            .await
            .map_err(|_| Retry)?
            .ok_or(Retry)?;
        let Some(Val::Loop(LoopVal { while_, .. })) = wf.step(step_id).map(|s| &s.val) else {
            return Ok(Err("the step is not a LOOP in its version".into()));
        };
        let mut ctx = if join.parent_workflow.contains('/') {
            super::outer::outer_context(self, parent, &join.parent_workflow, &join.parent_payload)
                .await
                .map_err(|_| Retry)?
        } else {
            Map::new()
        };
        let conn = self.pool.get().await.map_err(|_| Retry)?;
        for id in [parent, last.id] {
            let steps = crate::store::leases::load_context(&conn, id)
                .await
                .map_err(|_| Retry)?;
            for r in steps {
                ctx.insert(
                    crate::workflow::expr::context_name(&r.step_name),
                    crate::outbound::doc::context_entry(
                        r.request.unwrap_or_default(),
                        r.response.unwrap_or_default(),
                    ),
                );
            }
        }
        ctx.insert(ITERATION.into(), Value::from(iteration));
        Ok(while_.eval(&ctx).map_err(|e| e.0))
    }

    /// Inserts iteration `index` (from 0) of a LOOP, its first step receiving the last
    /// iteration's answer, leased here and run at once when a slot is free (else left
    /// for a sweeper's claim); nothing when another applier inserted it first.
    async fn start_iteration(
        self: &Arc<Self>,
        parent: Uuid,
        step_id: u32,
        index: u32,
        payload: &Value,
    ) {
        let own = self.try_reserve(1) == 1;
        let id = crate::ids::new_v7();
        let payload = payload.to_string();
        let it = Iteration {
            parent,
            step_id,
            index,
            id,
            payload: &payload,
            owner: own.then_some(self.app.instance_id),
            lease_ms: self.app.config.lease.as_secs_f64() * 1000.0,
        };
        let inserted = async {
            let conn = self.pool.get().await?;
            fan::next_iteration(&conn, &it).await
        }
        .await;
        let (headers, version, workflow) = match inserted {
            Ok(Some((headers, version, workflow))) => (headers, version, workflow),
            Ok(None) | Err(_) => {
                if own {
                    self.unreserve(1);
                }
                // Not inserted: another applier did, or the reporter applies it again.
                return;
            }
        };
        if !own {
            self.wake();
            return;
        }
        let version = version.max(0) as u32;
        let claimed = crate::store::leases::Claimed::fresh_child(
            id, workflow, version, payload, headers, parent,
        );
        self.run_claimed(claimed).await;
    }
}

/// The join could not be read whole now; applied again later.
pub(super) struct Retry;

fn done(parent: Uuid, step_id: u32, response: Value) -> Answer {
    answer(parent, step_id, Some(response), None)
}

fn failed(parent: Uuid, step_id: u32, message: String) -> Answer {
    answer(
        parent,
        step_id,
        None,
        Some(StepError { code: 500, message }),
    )
}

fn answer(parent: Uuid, step_id: u32, response: Option<Value>, error: Option<StepError>) -> Answer {
    Answer {
        traceparent: None,
        id: parent,
        step_id,
        response: StepResponse {
            service_request_id: parent.to_string(),
            step_id: step_id as i64,
            response,
            error,
        },
        from_child: true,
    }
}
