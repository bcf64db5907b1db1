//! A PARALLEL step whose branches only call (beyond Clamp; `workflow::fan::fits_lanes`)
//! runs its branches here, as lanes of its own request, instead of as child requests:
//! every branch at once, each a sequence of steps run as a workflow's are (its first step
//! receives the step's request; `when`, transforms and retry policies apply), all within
//! the executor job that holds the request's lease.
//!
//! Each branch step's outcome is a transition of the request like any step's (batched,
//! fenced on the lease), that records it under a lane id (`workflow::fan::lane_step_id`)
//! and leaves the request at the PARALLEL step, so it commits before that branch's next
//! step starts. Run again (after a crash, on another instance, or by a retry of the
//! request), the step reads its lanes' records back and calls only the branch steps that
//! have no final record. When every branch completed, the step completes with an object
//! of each branch's last answer by branch name. When one fails (its retries spent), the
//! step fails naming it: the other branches' calls in flight are abandoned (dropped, with
//! no record; a retry of the request calls them again) and no branch step starts after.
//! The request's deadline ends every lane the same way (here, not by the step loop: a
//! branch record being written is waited for, so none commits after the step's outcome).
//!
//! A child request per branch costs a row insert, a claim, its own step writes and a
//! count at the join, about three times a step call (docs/decisions.md); a lane costs its
//! step writes only. Branches with a step that waits (ASYNC, WAIT, EVENT, WORKFLOW, a
//! nested fan-out) or onFailure steps of their own need a row to wait in, and stay
//! child requests (`engine::fan`).

use std::future::Future;

use parking_lot::Mutex;
use serde_json::{Map, Value};
use tokio::sync::watch;

use super::attempt::{attempt, Attempt, Attempted, Outcome, Place};
use super::step_io;
use super::writer::{StepRecord, Transition};
use super::Executor;
use crate::outbound::call::{CallError, CallErrorKind};
use crate::outbound::doc::{context_entry, Doc};
use crate::outbound::step_trace::StepTrace;
use crate::status::{RequestStatus, StepStatus};
use crate::store::lanes::LaneRecord;
use crate::workflow::fan::lane_of;
use crate::workflow::model::ParallelVal;
use crate::workflow::{CompiledStep, Mode, Val, Workflow};

/// How a PARALLEL step's lanes ended.
pub enum Joined {
    /// Every branch completed: the joined answer.
    Done(Doc),
    /// A branch failed: the step fails with this.
    Failed(CallError),
    /// The request is not this executor's any more (lease lost, cancelled, stopping).
    Lost,
}

/// How one branch ended, when it did not complete.
enum LaneEnd {
    Failed(String),
    Lost,
    /// Another branch ended the step (or the request's deadline passed): its call in
    /// flight or its back-off was abandoned. A write it had begun was waited for.
    Stopped,
}

/// What ends every lane early: the first branch that fails, a lost lease, the deadline.
struct Stop {
    tx: watch::Sender<bool>,
    /// The branch that failed first, or `DEADLINE` (None: none did).
    first: Mutex<Option<usize>>,
}

/// `Stop::first` when the request's deadline ended the step.
const DEADLINE: usize = usize::MAX;

impl Stop {
    /// Ends every lane; `who` is remembered if it is the first.
    fn stop(&self, who: usize) {
        self.first.lock().get_or_insert(who);
        self.tx.send_replace(true);
    }
}

/// What the lanes need of the request whose PARALLEL step runs them (the step loop's
/// job, `job::Job`, lends it).
pub struct InRequest<'a> {
    pub id: uuid::Uuid,
    /// Its payload (a record whose request is this text stores a mark, not a copy).
    pub payload: &'a Doc,
    /// The request the PARALLEL step received, which its row keeps while lanes run.
    pub request: &'a Doc,
    /// Attempts of the PARALLEL step so far, which its row keeps.
    pub attempts: u32,
    /// The job started the request here, so it wrote every record: none to read back.
    pub fresh: bool,
    pub deadline: Option<tokio::time::Instant>,
    pub trace: Option<&'a crate::telemetry::RequestTrace>,
    /// Its forwardable headers, as broker messages and HTTP calls carry them.
    pub headers: &'a [(String, String)],
    pub http_headers: &'a [(hyper::header::HeaderName, hyper::header::HeaderValue)],
    /// The context every branch starts from (the request's steps, with the PARALLEL
    /// step's request), when any branch reads it.
    pub outer: Option<Map<String, Value>>,
}

/// What a lane knows of the request and the step it runs in.
struct Fan<'a> {
    exec: &'a Executor,
    job: &'a InRequest<'a>,
    step: &'a CompiledStep,
    /// The PARALLEL step's span, under which each lane step's span hangs.
    span: Option<[u8; 8]>,
    stop: Stop,
}

/// Where a branch stands: the step it runs next (an index into its main sequence), the
/// request that step receives, and its own steps' context entries so far.
struct Progress {
    next: usize,
    request: Doc,
    context: Map<String, Value>,
}

/// Runs a PARALLEL step's branches as lanes of `job`'s request.
pub async fn run(
    exec: &Executor,
    job: &InRequest<'_>,
    step: &CompiledStep,
    p: &ParallelVal,
    body: &Doc,
    span: Option<[u8; 8]>,
) -> Joined {
    // A job that started the request wrote every record of it: there is nothing to read.
    let records = if job.fresh {
        Vec::new()
    } else {
        match read(exec, job, step.id).await {
            Some(r) => r,
            None => return Joined::Lost,
        }
    };
    let fan = Fan {
        exec,
        job,
        step,
        span,
        stop: Stop {
            tx: watch::channel(false).0,
            first: Mutex::new(None),
        },
    };
    // Every lane runs to its end, or to the stop: a lane stopped abandons its call in
    // flight or its back-off, never a write it began, so no branch record commits after
    // the step's own outcome.
    let lanes = p.branches.iter().enumerate().map(|(i, b)| {
        let progress = progress(&b.sub.0, i as u32, &records, body);
        let fan = &fan;
        async move {
            let end = lane(fan, i as u32, &b.name, &b.sub.0, progress).await;
            if end.is_err() {
                fan.stop.stop(i);
            }
            end
        }
    });
    let ends = futures_util::future::join_all(lanes).await;
    let mut answers = Vec::with_capacity(ends.len());
    let mut why = vec![None; ends.len()];
    for (i, end) in ends.into_iter().enumerate() {
        match end {
            Ok(a) => answers.push(a),
            Err(LaneEnd::Lost) => return Joined::Lost,
            Err(LaneEnd::Failed(w)) => why[i] = Some(w),
            Err(LaneEnd::Stopped) => {}
        }
    }
    let first = *fan.stop.first.lock();
    match first {
        None => Joined::Done(joined(p, &answers)),
        Some(DEADLINE) => Joined::Failed(step_io::passed()),
        Some(i) => Joined::Failed(CallError::new(
            CallErrorKind::Other,
            format!(
                "branch '{}' failed: {}",
                p.branches[i].name,
                why[i].take().unwrap_or_default()
            ),
        )),
    }
}

/// Runs `f` unless the lanes are stopped or the request's deadline passes first (then
/// the stop: the deadline ends every lane).
async fn unless_stopped<T>(fan: &Fan<'_>, f: impl Future<Output = T>) -> Result<T, LaneEnd> {
    let mut stopped = fan.stop.tx.subscribe();
    let deadline = async {
        match fan.job.deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        v = f => Ok(v),
        _ = stopped.wait_for(|s| *s) => Err(LaneEnd::Stopped),
        _ = deadline => {
            fan.stop.stop(DEADLINE);
            Err(LaneEnd::Stopped)
        }
    }
}

/// The lanes' records, read again while the database is away; None when the executor
/// stops meanwhile (the request is continued later, elsewhere).
async fn read(exec: &Executor, job: &InRequest<'_>, fan: u32) -> Option<Vec<LaneRecord>> {
    let mut backoff = crate::backoff::Backoff::new(step_io::WRITE_RETRY, step_io::MAX_WRITE_RETRY);
    loop {
        let r = async {
            let conn = exec.pool.get().await?;
            crate::store::lanes::records(&conn, job.id, fan).await
        }
        .await;
        match r {
            Ok(r) => return Some(r),
            Err(e) if e.is_transient() && !exec.is_stopping() => backoff.wait().await,
            Err(e) => {
                tracing::warn!(service_request_id = %job.id, step_id = fan, error = %e, "a PARALLEL step's branch records could not be read; the step runs again later");
                return None;
            }
        }
    }
}

/// Where branch `index` stands after its records: past each of its main steps whose
/// last record is final and done (completed, or skipped), in order.
fn progress(wf: &Workflow, index: u32, records: &[LaneRecord], body: &Doc) -> Progress {
    let mut p = Progress {
        next: 0,
        request: body.clone(),
        context: Map::new(),
    };
    for &id in &wf.main {
        let last = records
            .iter()
            .rev()
            .find(|r| lane_of(r.step_id).is_some_and(|l| l.branch == index && l.step == id));
        let Some(rec) = last.filter(|r| r.status.is_done()) else {
            break;
        };
        let response = rec.response.clone().unwrap_or_else(|| "null".into());
        if wf.uses_context {
            if let Some(step) = wf.step(id) {
                let parse = |t: &Option<String>| {
                    t.as_deref()
                        .and_then(|t| serde_json::from_str(t).ok())
                        .unwrap_or(Value::Null)
                };
                p.context.insert(
                    step.context_name.clone(),
                    context_entry(parse(&rec.request), parse(&rec.response)),
                );
            }
        }
        p.request = Doc::trusted(response);
        p.next += 1;
    }
    p
}

/// `{"<branch>": <its last answer>, …}`, in branch order, written as text from the
/// answers as they are (each is JSON already).
fn joined(p: &ParallelVal, answers: &[Doc]) -> Doc {
    let mut out = Vec::with_capacity(
        2 + answers
            .iter()
            .map(|a| a.as_bytes().len() + 16)
            .sum::<usize>(),
    );
    out.push(b'{');
    for (k, (b, a)) in p.branches.iter().zip(answers).enumerate() {
        if k > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, &b.name).expect("strings serialize");
        out.push(b':');
        out.extend_from_slice(a.as_bytes());
    }
    out.push(b'}');
    Doc::trusted(out)
}

/// One branch, from where it stands to its end: its last answer.
async fn lane(
    fan: &Fan<'_>,
    index: u32,
    name: &str,
    wf: &Workflow,
    mut at: Progress,
) -> Result<Doc, LaneEnd> {
    while let Some(step) = wf.main.get(at.next).and_then(|&id| wf.step(id)) {
        if *fan.stop.tx.borrow() {
            return Err(LaneEnd::Stopped);
        }
        at.request = lane_step(fan, index, name, wf, step, &mut at).await?;
        at.next += 1;
    }
    Ok(at.request)
}

/// One step of a branch, its attempts included (each an `attempt`, retried here, in the
/// job that holds the lease, while the other branches go on): what it passes on.
async fn lane_step(
    fan: &Fan<'_>,
    index: u32,
    branch: &str,
    wf: &Workflow,
    step: &CompiledStep,
    at: &mut Progress,
) -> Result<Doc, LaneEnd> {
    let exec = fan.exec;
    let mut n = 0;
    loop {
        n += 1;
        let place = InLane {
            fan,
            index,
            branch,
            context: &at.context,
        };
        let made = match attempt(exec, step, &place, at.request.clone(), n).await {
            Attempted::Skipped { request, started } => {
                write(fan, place.skipped(step, &request, started)).await?;
                remember(wf, at, step, &request, &request);
                return Ok(request);
            }
            Attempted::Made(made) => made,
        };
        let (body, attempt) = (&made.body, &made.attempt);
        let e = match made.outcome {
            Outcome::Done(response) => {
                write(
                    fan,
                    place.record(step, StepStatus::Completed, body, &response, attempt),
                )
                .await?;
                remember(wf, at, step, body, &response);
                return Ok(response);
            }
            Outcome::Failed(e) => e,
            // Stopped while it ran: its call was abandoned, with no record.
            Outcome::Lost => return Err(LaneEnd::Stopped),
            // A lane's calls only answer or fail (`call`).
            Outcome::Sent | Outcome::Wait(_) | Outcome::Paused => {
                unreachable!("a lane step only calls")
            }
        };
        let (policy, again) = made.retry.expect("a failed attempt has its policy's word");
        if again {
            back_off(fan, &policy, &e, n).await?;
            continue;
        }
        let (reason, why) = failure(step, n, e.message);
        if n > 1 {
            exec.app.metrics.step_retries_exhausted.inc();
        }
        write(fan, place.failed(step, body, attempt, reason)).await?;
        return Err(LaneEnd::Failed(why));
    }
}

/// A branch step's failure, its attempts spent: the reason its record keeps, and the one
/// the PARALLEL step fails with.
fn failure(step: &CompiledStep, n: u32, message: String) -> (String, String) {
    if n > 1 {
        let reason = format!("after {n} attempts: {message}");
        let why = format!("step '{}' failed {reason}", step.name);
        (reason, why)
    } else {
        let why = format!("step '{}' failed: {message}", step.name);
        (message, why)
    }
}

/// A retry's back-off, waited out here, in the job that holds the lease: the other
/// branches go on meanwhile.
async fn back_off(
    fan: &Fan<'_>,
    policy: &crate::workflow::RetryPolicy,
    e: &CallError,
    n: u32,
) -> Result<(), LaneEnd> {
    fan.exec.app.metrics.count_retry(e.cause());
    if e.backs_off() {
        let wait = policy.backoff(n, fastrand::f64(), e.retry_after);
        unless_stopped(fan, tokio::time::sleep(wait)).await?;
    }
    Ok(())
}

/// A step in a branch run as a lane: the context every branch starts from with the
/// branch's steps so far, its span under the PARALLEL step's, its call abandoned when
/// the lanes are stopped.
struct InLane<'a, 'f> {
    fan: &'a Fan<'f>,
    index: u32,
    branch: &'a str,
    context: &'a Map<String, Value>,
}

impl InLane<'_, '_> {
    /// A skipped step's record: its request passed on as its response.
    fn skipped(&self, step: &CompiledStep, request: &Doc, started: f64) -> StepRecord {
        let at = Attempt {
            started,
            finished: started,
            n: 1,
        };
        StepRecord {
            finished_ms: None,
            ..self.record(step, StepStatus::Skipped, request, request, &at)
        }
    }

    /// A failed step's record: its reason, and as its response the error it was answered.
    fn failed(&self, step: &CompiledStep, body: &Doc, at: &Attempt, reason: String) -> StepRecord {
        let error = Doc::error(500, &reason);
        StepRecord {
            reason: Some(reason),
            ..self.record(step, StepStatus::Failed, body, &error, at)
        }
    }

    /// A branch step's record as written under its lane: its step id and name within the
    /// branch, the PARALLEL step's id and the branch's index.
    fn record(
        &self,
        step: &CompiledStep,
        status: StepStatus,
        body: &Doc,
        response: &Doc,
        attempt: &Attempt,
    ) -> StepRecord {
        StepRecord {
            step_id: step.id,
            step_name: format!("{}/{}", self.branch, step.name).into(),
            status,
            request: Some(body.clone()),
            request_is_payload: body.same(self.fan.job.payload),
            response: Some(response.clone()),
            started_ms: attempt.started,
            finished_ms: Some(attempt.finished),
            reason: None,
            attempts: attempt.n,
            lane: Some((self.fan.step.id, self.index)),
        }
    }
}

impl Place for InLane<'_, '_> {
    fn request(&self) -> (uuid::Uuid, Option<&crate::telemetry::RequestTrace>) {
        (self.fan.job.id, self.fan.job.trace)
    }

    /// The request's (with the PARALLEL step's request), the branch's steps so far, and
    /// this step's request.
    fn context(&self, step: &CompiledStep, request: &Doc) -> Map<String, Value> {
        let mut ctx = self.fan.job.outer.clone().unwrap_or_default();
        ctx.extend(self.context.iter().map(|(k, v)| (k.clone(), v.clone())));
        ctx.insert(
            step.context_name.clone(),
            context_entry(request.value(), Value::Null),
        );
        ctx
    }

    fn place_span(&self, span: &mut StepTrace) {
        span.in_lane(self.fan.span, self.fan.step.id, self.branch);
    }

    async fn call(
        &self,
        step: &CompiledStep,
        body: &Doc,
        trace: Option<&mut StepTrace>,
    ) -> Outcome {
        let (fan, index, branch) = (self.fan, self.index, self.branch);
        match unless_stopped(fan, call(fan, index, branch, step, body, trace)).await {
            Ok(called) => {
                fan.exec.app.metrics.steps_executed.inc();
                match called {
                    Ok(response) => Outcome::Done(response),
                    Err(e) => Outcome::Failed(e),
                }
            }
            Err(_) => Outcome::Lost,
        }
    }
}

/// A step's call, with an `Idempotency-Key` that names the branch:
/// `<request id>:<PARALLEL step id>/<branch>/<step id>` (the branch's index in place of a
/// name that cannot be a header's text).
async fn call(
    fan: &Fan<'_>,
    index: u32,
    branch: &str,
    step: &CompiledStep,
    body: &Doc,
    trace: Option<&mut StepTrace>,
) -> Result<Doc, CallError> {
    let (exec, job) = (fan.exec, fan.job);
    match (&step.val, step.mode) {
        (Val::Http(val), Mode::Http) => {
            let key = |place: &dyn std::fmt::Display| {
                format!("{}:{}/{place}/{}", job.id, fan.step.id, step.id)
            };
            let key = hyper::header::HeaderValue::from_str(&key(&branch))
                .or_else(|_| hyper::header::HeaderValue::from_str(&key(&index)))
                .expect("ids and digits");
            step_io::call_http(exec, job.http_headers, val, body, key, trace).await
        }
        (Val::Amqp(_), Mode::Amqp) | (Val::Kafka(_), Mode::Kafka) => {
            step_io::publish(exec, job.id, job.headers, step, body, trace.as_deref())
                .await
                .map(|()| Doc::trusted(&b"{\"sent\":true}"[..]))
        }
        (_, mode) => Err(CallError::new(
            CallErrorKind::Other,
            format!("a {} step cannot run in a lane", mode.as_str()),
        )),
    }
}

/// Keeps what a branch step received and answered for the branch's later steps.
fn remember(wf: &Workflow, at: &mut Progress, step: &CompiledStep, request: &Doc, response: &Doc) {
    if wf.uses_context {
        at.context.insert(
            step.context_name.clone(),
            context_entry(request.value(), response.value()),
        );
    }
}

/// Writes a branch step's record as a transition that leaves the request at its PARALLEL
/// step (fenced on the lease like every step's); its branch's next step starts only
/// after it committed.
async fn write(fan: &Fan<'_>, rec: StepRecord) -> Result<(), LaneEnd> {
    let job = fan.job;
    let t = Transition {
        id: job.id,
        status: RequestStatus::InProgress,
        next_step: fan.step.id,
        next_request: Some(job.request.clone()),
        failed_step: None,
        reason: None,
        release: false,
        step: Some(rec),
        attempts: job.attempts,
        retry_in_ms: None,
        last_error: None,
        notify: false,
    };
    if step_io::write(fan.exec, t).await {
        Ok(())
    } else {
        Err(LaneEnd::Lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::fan::{lane_step_id, LaneStep};
    use std::sync::Arc;

    fn wf(steps: serde_json::Value) -> Arc<Workflow> {
        let def = serde_json::json!({"name": "w", "steps": steps});
        Arc::new(crate::workflow::validate::compile(serde_json::from_value(def).unwrap()).unwrap())
    }

    fn rec(branch: u32, step: u32, status: StepStatus, response: &str) -> LaneRecord {
        LaneRecord {
            step_id: lane_step_id(LaneStep {
                fan: 2,
                branch,
                step,
            }),
            status,
            request: None,
            response: Some(response.into()),
        }
    }

    #[test]
    fn a_branch_goes_on_after_its_last_done_step_in_order() {
        let http = |n: &str| serde_json::json!({"name": n, "mode": "HTTP", "val": {"method": "POST", "url": "http://127.0.0.1:9/x"}});
        let w = wf(serde_json::json!([http("a"), http("b"), http("c")]));
        let body = Doc::trusted("{\"in\":1}");
        let none = progress(&w, 0, &[], &body);
        assert_eq!((none.next, none.request.as_str()), (0, "{\"in\":1}"));
        let records = [
            rec(0, 1, StepStatus::Completed, "1"),
            rec(1, 1, StepStatus::Completed, "9"),
            rec(0, 2, StepStatus::Failed, "{}"),
            rec(0, 2, StepStatus::Completed, "2"),
            rec(0, 3, StepStatus::Failed, "{}"),
        ];
        let p = progress(&w, 0, &records, &body);
        assert_eq!((p.next, p.request.as_str()), (2, "2"));
        let other = progress(&w, 1, &records, &body);
        assert_eq!((other.next, other.request.as_str()), (1, "9"));
    }

    #[test]
    fn the_join_is_an_object_by_branch_name_in_order() {
        let w = wf(
            serde_json::json!([{"name": "p", "mode": "PARALLEL", "val": {"branches": [
            {"name": "b\"1", "steps": [{"name": "s", "mode": "HTTP", "val": {"method": "POST", "url": "http://127.0.0.1:9/x"}}]},
            {"name": "b2", "steps": [{"name": "s", "mode": "HTTP", "val": {"method": "POST", "url": "http://127.0.0.1:9/x"}}]}]}}]),
        );
        let Val::Parallel(p) = &w.steps[0].val else {
            panic!("a PARALLEL step")
        };
        assert!(p.lanes);
        let d = joined(p, &[Doc::trusted("{\"a\":1}"), Doc::trusted("null")]);
        let v: Value = serde_json::from_str(d.as_str()).unwrap();
        assert_eq!(v, serde_json::json!({"b\"1": {"a": 1}, "b2": null}));
        assert!(d.as_str().starts_with("{\"b\\\"1\":{"), "{}", d.as_str());
    }
}
