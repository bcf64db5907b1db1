//! Fan-out steps (PARALLEL, MAP, SWITCH and LOOP, beyond Clamp; a LOOP's iterations in
//! `loops`): the step pauses its request and
//! starts a child request per branch or item (`store::fan`, one statement fenced on the
//! lease), and the step's answer is their outcomes joined: an object of each branch's
//! last answer by branch name, or the array of each item's in item order. The children
//! that may start at once are inserted leased to this instance and run here straight
//! away, as a create runs its request (a sweeper claims the rest, or any left when this
//! instance had no free slot or died). A MAP runs at most `maxConcurrency` items at once;
//! the rest wait in Postgres, held, and one starts as each finishes.
//!
//! Finished children are counted in batches (`count_loop`: one statement per batch that
//! marks each told once, adds them to their joins and releases as many held items, which
//! run here when there is room); when every child has finished, or more have failed than
//! the step tolerates (then the rest are cancelled), the joined answer is applied to the
//! parent through the step-response path, as a WORKFLOW step's child outcome is, and the
//! join marked done. The reporter that tells parents also looks for children finished
//! but untold and for joins due but not done (their teller stopped first), so a crash
//! anywhere loses nothing and repeats nothing that counts.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use serde_json::{Map, Value};
use uuid::Uuid;

use super::resume::{Answer, Applied, StepError, StepResponse};
use super::Executor;
use crate::backoff::Backoff;
use crate::status::RequestStatus;
use crate::store::fan::{self, Children, Counted, Part, Started};
use crate::workflow::fan::items;
use crate::workflow::model::{
    Branch, MapBody, MapVal, SwitchVal, DEFAULT_CASE, ITEM_BRANCH, LOOP_BODY,
};
use crate::workflow::{CompiledStep, Val};

/// Most due joins applied per look of the reporter.
const BATCH: i64 = 100;
const WRITE_RETRY: Duration = Duration::from_millis(100);
const MAX_WRITE_RETRY: Duration = Duration::from_secs(2);

/// A fan-out step about to start: its request's id and workflow, and the attempt.
pub struct Starting<'a> {
    pub id: Uuid,
    /// The request's workflow name as its children name theirs (`order`, `order/3/acme`).
    pub workflow: &'a str,
    pub version: u32,
    pub step: &'a CompiledStep,
    /// The step's request (a branch's first step receives it).
    pub request: &'a str,
    /// The context as the step sees it (a MAP's list is found in it).
    pub context: &'a Map<String, Value>,
    pub started_ms: f64,
    pub attempts: u32,
    /// The children's headers, when they are not the request's (`store::fan::Start`).
    pub headers: Option<String>,
}

/// Why a fan-out step cannot start its children (the step fails with it).
#[derive(Debug, thiserror::Error)]
pub enum FanError {
    #[error(transparent)]
    Items(#[from] crate::workflow::fan::ItemsError),
    /// A SWITCH's `on` could not be evaluated over the context.
    #[error("SWITCH {0}")]
    On(String),
    /// A SWITCH's value has no case, and it has no default.
    #[error("SWITCH on {on:?} is {value:?}: no case has that value, and there is no default")]
    NoCase { on: String, value: String },
    #[error("not a fan-out step")]
    NotFanOut,
}

/// The path a SWITCH takes over `context`, or why it takes none.
fn path<'a>(sw: &'a SwitchVal, context: &Map<String, Value>) -> Result<&'a Branch, FanError> {
    let value = sw.on.eval_case(context).map_err(|e| FanError::On(e.0))?;
    sw.path(&value).ok_or_else(|| FanError::NoCase {
        on: sw.on.source().to_string(),
        value,
    })
}

/// A MAP step's list, or why the step fails: checked before anything is written, so a
/// list that is missing or too long fails the step as a call that failed would.
pub fn check(step: &CompiledStep, context: &Map<String, Value>) -> Result<usize, FanError> {
    match &step.val {
        Val::Map(m) => Ok(items(context, &m.items)?.len()),
        Val::Parallel(p) => Ok(p.branches.len()),
        Val::Switch(sw) => path(sw, context).map(|_| 1),
        Val::Loop(_) => Ok(1),
        _ => Err(FanError::NotFanOut),
    }
}

/// What a fan-out step starts: its children, the failures it tolerates, and the branch
/// names its join keeps (a PARALLEL's; a SWITCH's case taken; None for a MAP).
struct Plan {
    children: Children,
    tolerated: u32,
    branches: Option<Vec<String>>,
}

/// The children of a fan-out step, in index order: a branch's first step receives the
/// step's request, an item's its item; a MAP's items beyond its concurrency are held.
fn children(s: &Starting) -> Result<Plan, FanError> {
    let mut c = Children::default();
    let mut push = |workflow: String, version: i32, payload: String, held: bool| {
        c.ids.push(crate::ids::new_v7());
        c.workflows.push(workflow);
        c.versions.push(version);
        c.payloads.push(payload);
        c.held.push(held);
    };
    let own = |branch: &str| format!("{}/{}/{branch}", s.workflow, s.step.id);
    match &s.step.val {
        Val::Parallel(p) => {
            for b in &p.branches {
                push(own(&b.name), s.version as i32, s.request.to_string(), false);
            }
            let names = p.branches.iter().map(|b| b.name.clone()).collect();
            Ok((c, 0, Some(names)))
        }
        Val::Switch(sw) => {
            let b = path(sw, s.context)?;
            push(own(&b.name), s.version as i32, s.request.to_string(), false);
            Ok((c, 0, Some(vec![b.name.clone()])))
        }
        // A LOOP's first iteration; the next ones are inserted one by one (`loops`).
        Val::Loop(_) => {
            push(
                own(LOOP_BODY),
                s.version as i32,
                s.request.to_string(),
                false,
            );
            Ok((c, 0, None))
        }
        Val::Map(m) => {
            let list = items(s.context, &m.items)?;
            for (i, item) in list.iter().enumerate() {
                let (workflow, version) = match &m.body {
                    MapBody::Steps(_) => (own(ITEM_BRANCH), s.version as i32),
                    MapBody::Workflow(w) => (w.workflow.clone(), w.version.unwrap_or(0) as i32),
                };
                let held = i >= m.max_concurrency as usize;
                push(workflow, version, item.to_string(), held);
            }
            Ok((c, m.tolerated_failures, None))
        }
        _ => Err(FanError::NotFanOut),
    }
    .map(|(children, tolerated, branches)| Plan {
        children,
        tolerated,
        branches,
    })
}

/// The statuses a MAP's children tell of when they are requests of a stored workflow,
/// by the version read now (its latest unless pinned; unreadable now: none). A
/// PARALLEL's branches and a MAP's own steps are parts of the request: they tell nothing.
async fn told_of(exec: &Executor, step: &CompiledStep) -> Option<i16> {
    let Val::Map(MapVal {
        body: MapBody::Workflow(w),
        ..
    }) = &step.val
    else {
        return None;
    };
    let map = &exec.app.workflows;
    let wf = match w.version {
        Some(v) => map.get_or_load_version(&exec.pool, &w.workflow, v).await,
        None => map.get_or_load(&exec.pool, &w.workflow).await,
    };
    wf.ok().flatten().and_then(|wf| wf.notify_mask)
}

/// The most children of the step running at once.
fn concurrency(step: &CompiledStep) -> u32 {
    match &step.val {
        Val::Map(m) => m.max_concurrency,
        _ => u32::MAX,
    }
}

/// Starts a fan-out step: the request pauses at it with its children stored, in one
/// statement; run again in place (a retry of the request, or of the step), it runs again
/// only the children that did not complete. Retried while the database is away;
/// abandoned when the lease is lost (its next holder runs the step again).
pub async fn start(exec: &Arc<Executor>, s: &Starting<'_>) {
    let plan = match children(s) {
        Ok(c) => c,
        // Checked before (`check`): the context did not change since.
        Err(_) => return,
    };
    let start = fan::Start {
        parent: s.id,
        owner: exec.app.instance_id,
        step_id: s.step.id,
        step_name: &s.step.name,
        request: s.request,
        started_ms: s.started_ms,
        attempts: s.attempts,
        children: plan.children,
        tolerated: plan.tolerated,
        branches: plan.branches,
        switch: matches!(s.step.val, Val::Switch(_)),
        max_iterations: match &s.step.val {
            Val::Loop(l) => Some(l.max_iterations),
            _ => None,
        },
        headers: s.headers.clone(),
        own: 0,
        lease_ms: exec.app.config.lease.as_secs_f64() * 1000.0,
        notify: told_of(exec, s.step).await,
    };
    // The branches and items of inline steps that start now run here at once, as a
    // create's request does, without waiting for a sweeper's claim (a child workflow's
    // version may not be loaded here: a sweeper claims those).
    let mut start = start;
    if inline(s.step) {
        let ready = start.children.held.iter().filter(|h| !**h).count();
        start.own = exec.try_reserve(ready) as u32;
    }
    let mut backoff = Backoff::new(WRITE_RETRY, MAX_WRITE_RETRY);
    let started = loop {
        let r = async {
            let conn = exec.pool.get().await?;
            fan::start(&conn, &start).await
        }
        .await;
        match r {
            Ok(started) => break started,
            Err(e) if e.is_transient() && !exec.is_stopping() => backoff.wait().await,
            Err(e) => {
                exec.unreserve(start.own as usize);
                tracing::warn!(service_request_id = %s.id, step_id = s.step.id, error = %e, "a fan-out step could not start its children; the step runs again later");
                return;
            }
        }
    };
    if !matches!(started, Started::Fresh { .. }) {
        exec.unreserve(start.own as usize);
    }
    match started {
        Started::Lost => return,
        Started::Fresh { headers } => run_own(exec, s, &start, headers).await,
        Started::Again => {
            let again = async {
                let mut conn = exec.pool.get().await?;
                fan::restart(&mut conn, s.id, s.step.id, concurrency(s.step)).await
            }
            .await;
            match again {
                // Nothing left to run: the joined answer is due now.
                Ok(true) => exec.apply_join(s.id, s.step.id).await,
                Ok(false) => {}
                // The join stays as it was; a later retry runs them.
                Err(e) => {
                    tracing::warn!(service_request_id = %s.id, step_id = s.step.id, error = %e, "a fan-out step's children could not run again")
                }
            }
        }
    }
    exec.app.changes.notify(&s.id);
    exec.wake();
}

/// Whether a fan-out step's children run the step's own steps (a PARALLEL, a SWITCH, or
/// a MAP of `steps`), whose workflow is the parent's version.
fn inline(step: &CompiledStep) -> bool {
    match &step.val {
        Val::Parallel(_) | Val::Switch(_) | Val::Loop(_) => true,
        Val::Map(m) => matches!(m.body, MapBody::Steps(_)),
        _ => false,
    }
}

/// Runs the children `start` leased to this executor (its first `own`), each in the slot
/// reserved for it, from their first step.
async fn run_own(exec: &Arc<Executor>, s: &Starting<'_>, start: &fan::Start<'_>, headers: String) {
    let c = &start.children;
    for i in 0..start.own as usize {
        let claimed = crate::store::leases::Claimed::fresh_child(
            c.ids[i],
            c.workflows[i].clone(),
            s.version,
            c.payloads[i].clone(),
            headers.clone(),
            s.id,
        );
        exec.run_claimed(claimed).await;
    }
}

/// Most finished children counted by one statement.
const COUNT_BATCH: usize = 256;

/// Counts the finished children `tell_fan` queues, a batch per statement, one batch at a
/// time per executor (its queue is bounded by the requests it can run), until the
/// executor is gone.
pub(super) async fn count_loop(exec: Weak<Executor>, rx: mpsc::Receiver<Uuid>) {
    crate::batches::drain(rx, COUNT_BATCH, 1, move |mut ids: Vec<Uuid>| {
        let exec = exec.clone();
        async move {
            if let Some(exec) = exec.upgrade() {
                ids.sort_unstable();
                ids.dedup();
                exec.count_children(&ids).await;
            }
        }
    })
    .await
}

impl Executor {
    /// A fan-out child finished: queued to be counted once (`count_loop`). Should the
    /// count not be taken, the reporter finds the child untold on its next look.
    pub(super) async fn tell_fan(self: &Arc<Self>, child: Uuid) {
        let _ = self.fan_told.send(child).await;
    }

    /// Counts finished fan-out children in one statement; runs the held items it released
    /// here when it could reserve a slot for each, and applies each joined answer due.
    async fn count_children(self: &Arc<Self>, ids: &[Uuid]) {
        let reserved = self.try_reserve(ids.len());
        let owner = (reserved == ids.len()).then_some(self.app.instance_id);
        if owner.is_none() {
            self.unreserve(reserved);
        }
        let lease_ms = self.app.config.lease.as_secs_f64() * 1000.0;
        let counted = async {
            let conn = self.pool.get().await?;
            fan::count(&conn, ids, owner, lease_ms).await
        }
        .await;
        let (steps, released) = match counted {
            Ok(c) => c,
            Err(e) => {
                if owner.is_some() {
                    self.unreserve(reserved);
                }
                tracing::debug!(n = ids.len(), error = %e, "fan-out children not counted; the reporter counts them");
                return;
            }
        };
        if owner.is_some() {
            self.unreserve(reserved - released.len());
            for c in released {
                self.run_claimed(c).await;
            }
        } else if !released.is_empty() {
            self.wake();
        }
        for step in steps {
            if let Counted::Due { parent, step_id } = step {
                let me = self.clone();
                tokio::spawn(async move { me.apply_join(parent, step_id).await });
            }
        }
    }

    /// Applies the joined answer of a fan-out step to its request, and marks the join
    /// done once it has reached it (or the request waits for it no more).
    pub(super) async fn apply_join(self: &Arc<Self>, parent: Uuid, step_id: u32) {
        let read = async {
            let conn = self.pool.get().await?;
            fan::parts(&conn, parent, step_id).await
        }
        .await;
        let Ok((join, parts)) = read else {
            return;
        };
        // Its children compensated, the request failing: it goes on with its own.
        if let Some(failed) = join.parent_failing {
            let version = join.parent_version.max(1) as u32;
            let wf = &join.parent_workflow;
            if self
                .children_compensated(parent, step_id, wf, version, failed)
                .await
            {
                if let Ok(conn) = self.pool.get().await {
                    let _ = fan::done(&conn, parent, step_id).await;
                }
            }
            return;
        }
        let a = match parts.last() {
            Some(last) if join.max_iterations.is_some() => {
                match self.after_iteration(parent, step_id, &join, last).await {
                    super::loops::Next::Answer(a) => a,
                    super::loops::Next::Nothing => return,
                }
            }
            _ => answer(parent, step_id, &join, &parts),
        };
        let applied = match self.apply_response(&a, Duration::ZERO).await {
            Ok(Applied::NotYet(_)) | Err(_) => false,
            Ok(_) => true,
        };
        if applied {
            if let Ok(conn) = self.pool.get().await {
                let _ = fan::done(&conn, parent, step_id).await;
            }
        }
    }

    /// Applies the joins that are due and not done (their teller stopped first).
    pub async fn report_joins(self: &Arc<Self>) {
        let due = async {
            let conn = self.looks.get().await?;
            fan::due(&conn, BATCH).await
        }
        .await;
        for (parent, step_id) in due.unwrap_or_default() {
            self.apply_join(parent, step_id).await;
        }
    }
}

/// The joined answer of a fan-out step: every branch's or item's last answer (null for a
/// tolerated failure), or, when more failed than tolerated, an error naming the first; a
/// SWITCH's, its path's last answer, or its path's failure.
fn answer(parent: Uuid, step_id: u32, join: &fan::Join, parts: &[Part]) -> Answer {
    // Finished without completing: failed, or cancelled (by a sibling's failure, or on
    // its own); a child still running is not a failure yet.
    let failed: Vec<&Part> = parts
        .iter()
        .filter(|p| p.status.is_finished() && p.status != RequestStatus::Completed)
        .collect();
    let failed_now = failed.len();
    let error = (failed_now > join.tolerated as usize).then(|| {
        // The one that failed before the ones its failure cancelled.
        let first = failed
            .iter()
            .find(|p| p.status == RequestStatus::Failed)
            .unwrap_or(&failed[0]);
        let branch = |b: &Vec<String>| {
            b.get(first.index as usize)
                .map_or("?", String::as_str)
                .to_string()
        };
        let name = match &join.branches {
            Some(b) if join.switch && b.first().is_some_and(|n| n == DEFAULT_CASE) => {
                "the default path".to_string()
            }
            Some(b) if join.switch => format!("case {:?}", branch(b)),
            Some(b) => format!("branch {}", branch(b)),
            None => format!("item {}", first.index),
        };
        StepError {
            code: 500,
            message: format!(
                "{name} ({}) is {}: {}{}",
                first.id,
                first.status,
                first.reason.as_deref().unwrap_or(""),
                if join.branches.is_none() && failed_now > 1 {
                    format!(" ({failed_now} items failed, {} tolerated)", join.tolerated)
                } else {
                    String::new()
                }
            ),
        }
    });
    let last = |p: &Part| {
        (p.status == RequestStatus::Completed)
            .then(|| {
                p.response
                    .as_deref()
                    .and_then(|t| serde_json::from_str::<Value>(t).ok())
            })
            .flatten()
            .unwrap_or(Value::Null)
    };
    let response = error.is_none().then(|| match &join.branches {
        // A SWITCH answers as its path's last step did.
        Some(_) if join.switch => parts.first().map_or(Value::Null, last),
        Some(names) => Value::Object(
            parts
                .iter()
                .map(|p| {
                    let name = names.get(p.index as usize).cloned().unwrap_or_default();
                    (name, last(p))
                })
                .collect(),
        ),
        None => Value::Array(parts.iter().map(last).collect()),
    });
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
