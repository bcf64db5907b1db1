//! Compensation (beyond Clamp): when a request fails for good (a step fails after its
//! retries, its deadline passes, its answer times out), the `compensate` steps of the
//! main steps that completed run after the failed step's onFailure steps, the last to
//! complete first, each step's own in order, each once: they are steps of the request
//! like onFailure steps, so each is recorded, retried by its own policy, and resumed
//! where it was after a crash (the request's current step is the compensation it is at,
//! and which steps completed is read back from their records). A compensation that fails
//! is recorded and the next one still runs; the request then ends FAILED with its
//! original reason, naming the compensations that failed. Each receives what the step
//! it undoes answered.

use std::sync::Arc;

use uuid::Uuid;

use super::Executor;
use crate::backoff::Backoff;
use crate::outbound::doc::Doc;
use crate::status::StepStatus;
use crate::store::compensations::{self as store, last_records};
use crate::workflow::{CompiledStep, Workflow};

const WRITE_RETRY: std::time::Duration = std::time::Duration::from_millis(100);
const MAX_WRITE_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// A failing request's compensations, in the order they run.
#[derive(Debug, Default, Clone)]
pub struct Compensations {
    /// Each compensation step, and its request: the answer of the step it undoes.
    pub run: Vec<(u32, Doc)>,
    /// The names of those that failed so far.
    pub failed: Vec<Arc<str>>,
}

impl Compensations {
    /// The compensation after `step_id` (the first when `step_id` is not one).
    pub fn after(&self, step_id: u32) -> Option<u32> {
        match self.run.iter().position(|(c, _)| *c == step_id) {
            Some(pos) => self.run.get(pos + 1).map(|(c, _)| *c),
            None => self.run.first().map(|(c, _)| *c),
        }
    }

    /// Whether `step_id` is one of them.
    pub fn has(&self, step_id: u32) -> bool {
        self.run.iter().any(|(c, _)| *c == step_id)
    }

    /// The request compensation `step_id` receives.
    pub fn request(&self, step_id: u32) -> Option<&Doc> {
        self.run.iter().find(|(c, _)| *c == step_id).map(|(_, d)| d)
    }

    /// A failing request's final reason: its own, and the compensations that failed.
    pub fn reason(&self, reason: &str) -> String {
        if self.failed.is_empty() {
            return reason.to_string();
        }
        let names: Vec<String> = self.failed.iter().map(|n| format!("'{n}'")).collect();
        format!("{reason}; compensation failed: {}", names.join(", "))
    }
}

impl Executor {
    /// The compensations of request `id` of `wf` failing at step `failed` (0: asked to
    /// compensate, by its parent's failure or a cancel), read from its steps' last
    /// records (none read when the workflow has none).
    pub(super) async fn compensations(
        &self,
        wf: &Workflow,
        id: Uuid,
        failed: u32,
    ) -> crate::store::Result<Compensations> {
        if !wf.compensates {
            return Ok(Compensations::default());
        }
        let conn = self.pool.get().await?;
        let records = last_records(&conn, id).await?;
        let last = |step: u32| records.iter().find(|r| r.step_id == step);
        let run = wf
            .compensations(failed, |m| {
                last(m).is_some_and(|r| r.status == StepStatus::Completed)
            })
            .into_iter()
            .map(|(c, undone)| {
                let answer = last(undone)
                    .and_then(|r| r.response.clone())
                    .unwrap_or_else(|| "null".into());
                (c, Doc::trusted(answer))
            })
            .collect::<Vec<_>>();
        let failed = run
            .iter()
            .filter(|(c, _)| last(*c).is_some_and(|r| r.status == StepStatus::Failed))
            .filter_map(|(c, _)| wf.step(*c).map(|s| s.name.clone()))
            .collect();
        Ok(Compensations { run, failed })
    }

    /// The step request `id` goes to after `step` failed for good, outside its step loop
    /// (an answer, a timeout, a deadline): its first onFailure step, else its first
    /// compensation, else none (0: it fails).
    pub(crate) async fn after_failure(
        &self,
        wf: &Workflow,
        id: Uuid,
        step: &CompiledStep,
    ) -> crate::store::Result<u32> {
        if let Some(first) = step.on_failure.first() {
            return Ok(*first);
        }
        Ok(self
            .compensations(wf, id, step.id)
            .await?
            .after(0)
            .unwrap_or(0))
    }
}

/// What asking a fan-out step's children to compensate came to.
pub(super) enum Undo {
    /// Asked: the request waits for them, paused at the step.
    Waiting,
    /// None to ask: on to the next compensation at once.
    GoOn,
    /// The request is not this executor's to run any more (or the database stays away
    /// while stopping): its lease runs out and a sweeper continues it.
    Stop,
}

/// A failing request's fan-out step `step` at its place among the compensations: its
/// children that completed or were cancelled, and whose workflow compensates, are asked
/// to undo theirs (each then ends CANCELLED), and the request `id` (failing: `reason`)
/// waits for them at the step as it waited for their outcomes. Retried while the database
/// is away.
pub(super) async fn children(
    exec: &Arc<Executor>,
    id: Uuid,
    step: &CompiledStep,
    reason: &str,
) -> Undo {
    let mut backoff = Backoff::new(WRITE_RETRY, MAX_WRITE_RETRY);
    let listed = loop {
        let r = async {
            let conn = exec.pool.get().await?;
            store::undoable(&conn, id, step.id).await
        }
        .await;
        match r {
            Ok(l) => break l,
            Err(e) if e.is_transient() && !exec.is_stopping() => backoff.wait().await,
            Err(_) => return Undo::Stop,
        }
    };
    let mut ids = Vec::with_capacity(listed.len());
    for c in listed {
        let wf = exec
            .app
            .workflows
            .get_or_load_version(&exec.pool, &c.workflow, c.version.max(1) as u32)
            .await;
        // A workflow not readable now is asked anyway: with nothing to undo, its request
        // ends at once.
        if !matches!(wf, Ok(Some(ref wf)) if !wf.compensates) {
            ids.push(c.id);
        }
    }
    if ids.is_empty() {
        return Undo::GoOn;
    }
    let why = format!("compensated: its parent {id} failed: {reason}");
    let owner = exec.app.instance_id;
    loop {
        let r = async {
            let conn = exec.pool.get().await?;
            store::undo_children(&conn, id, step.id, owner, &ids, &why).await
        }
        .await;
        match r {
            Ok(Some(0)) => return Undo::GoOn,
            Ok(Some(_)) => {
                exec.app.changes.notify(&id);
                exec.wake();
                return Undo::Waiting;
            }
            Ok(None) => return Undo::Stop,
            Err(e) if e.is_transient() && !exec.is_stopping() => backoff.wait().await,
            Err(_) => return Undo::Stop,
        }
    }
}

impl Executor {
    /// A failing request's fan-out step whose children compensated (its join due): the
    /// request goes on to its next compensation, or ends; true when it did (or waits
    /// there no more).
    pub(super) async fn children_compensated(
        &self,
        parent: Uuid,
        step_id: u32,
        workflow: &str,
        version: u32,
        failed: u32,
    ) -> bool {
        let Ok(Some(wf)) = self
            .app
            .workflows
            .get_or_load_version(&self.pool, workflow, version)
            .await
        else {
            return false;
        };
        let went = async {
            let next = self
                .compensations(&wf, parent, failed)
                .await?
                .after(step_id)
                .unwrap_or(0);
            let conn = self.pool.get().await?;
            store::go_on(&conn, parent, step_id, next).await
        }
        .await;
        match went {
            Ok(moved) => {
                if moved {
                    self.app.changes.notify(&parent);
                    self.wake();
                }
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_each_once_in_order_and_names_the_failed_ones() {
        let c = Compensations {
            run: vec![(7, Doc::trusted("1")), (5, Doc::trusted("2"))],
            failed: vec!["void label".into()],
        };
        assert_eq!(c.after(0), Some(7));
        assert_eq!(c.after(3), Some(7), "after an onFailure step: the first");
        assert_eq!(c.after(7), Some(5));
        assert_eq!(c.after(5), None);
        assert_eq!(c.request(5).unwrap().as_str(), "2");
        assert_eq!(
            c.reason("step 'charge' failed: 500"),
            "step 'charge' failed: 500; compensation failed: 'void label'"
        );
        assert_eq!(Compensations::default().reason("r"), "r");
    }
}
