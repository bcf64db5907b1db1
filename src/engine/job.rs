//! One service request's execution: steps in order, conditions, transforms, failure
//! handling and pauses, each step's outcome written (fenced by the lease) before the
//! next step starts, so a crash repeats at most the step that was running.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use uuid::Uuid;

use super::attempt::{attempt, end_paused, Attempt, Attempted, Made, Outcome, Place};
use super::step_io::{call_http, now_ms, passed, publish, write, MAX_WRITE_RETRY, WRITE_RETRY};
use super::stored::headers_and_trace;
use super::writer::{StepRecord, Transition};
use super::Executor;
use crate::backoff::Backoff;
use crate::outbound::call::{CallError, CallErrorKind};
use crate::outbound::doc::Doc;
use crate::outbound::step_trace::StepTrace;
use crate::status::{RequestStatus, StepStatus};
use crate::telemetry::RequestTrace;
use crate::workflow::model::WaitVal;
use crate::workflow::{CompiledStep, Mode, RetryPolicy, StepType, Val, Workflow};

/// What a request needs to continue.
pub struct Job {
    pub id: Uuid,
    pub wf: Arc<Workflow>,
    /// Forwardable headers of the original request.
    pub headers: Vec<(String, String)>,
    /// The same, as an HTTP step sends them, parsed once per job (`workflow::header_pairs`).
    pub http_headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    /// The step to run next; None when no step is left.
    pub next: Option<u32>,
    /// The request the next step receives.
    pub request: Doc,
    /// The request's payload (shared with `request` until the first step answers): a step
    /// record whose request is this text stores a mark instead of a copy.
    pub payload: Doc,
    /// The failed step whose onFailure steps are running, and why it failed.
    pub failing: Option<(u32, String)>,
    /// `{step_context_name: {request, response}}` of the steps run so far.
    pub context: Map<String, Value>,
    /// Attempts the next step has had already (a retry continues the count).
    pub attempts: u32,
    /// This job starts the request from its first step, so every step row of it is
    /// written here (and readers of this process can keep them: `live`).
    pub fresh: bool,
    /// When the request was created, in microseconds since the Unix epoch.
    pub created_us: i64,
    /// A WORKFLOW step of another request started this one, which waits for its outcome.
    pub has_parent: bool,
    /// The trace it belongs to (its stored `traceparent`), if any.
    pub trace: Option<RequestTrace>,
    /// Times it was retried (`POST /serviceRequest/{id}/retry`): names its span.
    pub retries: i32,
    /// When its deadline passes (beyond Clamp): the step then running is abandoned and
    /// fails, and none starts after it but its onFailure steps. None: it has none, or its
    /// onFailure steps are running (they run to their end).
    pub deadline: Option<tokio::time::Instant>,
    /// The same in microseconds since the Unix epoch, for a fresh job's status memory.
    pub deadline_us: Option<i64>,
    /// Its priority as created (None: the default), for a fresh job's status memory.
    pub priority: Option<i16>,
    /// While it fails: the compensations it runs after the onFailure steps (none read
    /// unless its workflow has any).
    pub compensations: super::compensate::Compensations,
}

/// A deadline `ms` from now (None: none).
pub fn deadline_in(ms: Option<f64>) -> Option<tokio::time::Instant> {
    ms.map(|ms| tokio::time::Instant::now() + Duration::from_micros((ms.max(0.0) * 1000.0) as u64))
}

/// The `Idempotency-Key` of a request's step, `<request id>:<step id>`, written straight
/// into the header (it is sent with every HTTP step call).
fn step_key(id: &Uuid, step: u32) -> hyper::header::HeaderValue {
    let mut buf = [0u8; 36 + 1 + 10];
    id.hyphenated().encode_lower(&mut buf[..36]);
    buf[36] = b':';
    let mut n = itoa::Buffer::new();
    let digits = n.format(step).as_bytes();
    buf[37..37 + digits.len()].copy_from_slice(digits);
    hyper::header::HeaderValue::from_bytes(&buf[..37 + digits.len()]).expect("hex, '-', ':'")
}

impl Job {
    /// A job at the start of its request: its first step next, its payload that step's
    /// request, its forwarded headers and trace read from their stored text; nothing run,
    /// failing or timed yet (the callers say what else they know).
    pub(super) fn at_start(id: Uuid, wf: Arc<Workflow>, payload: Doc, headers: &[u8]) -> Job {
        let (headers, trace) = headers_and_trace(headers);
        Job {
            id,
            next: wf.main.first().copied(),
            wf,
            http_headers: crate::workflow::header_pairs(&headers),
            headers,
            request: payload.clone(),
            payload,
            failing: None,
            context: Map::new(),
            attempts: 0,
            fresh: false,
            created_us: 0,
            has_parent: false,
            trace,
            retries: 0,
            deadline: None,
            deadline_us: None,
            priority: None,
            compensations: Default::default(),
        }
    }

    /// Its trace id in hex, for log lines.
    pub fn trace_id(&self) -> Option<String> {
        self.trace
            .as_ref()
            .map(|t| crate::telemetry::context::hex(&t.parent.trace_id))
    }

    /// The step after `step_id` while handling `parent`'s failure: its next onFailure
    /// step, then the compensations, each once.
    fn next_on_failure(&self, parent: u32, step_id: u32) -> Option<u32> {
        if self.compensations.has(step_id) {
            return self.compensations.after(step_id);
        }
        let list = &self.wf.step(parent)?.on_failure;
        let next = if step_id == parent {
            list.first().copied()
        } else {
            let pos = list.iter().position(|&s| s == step_id)?;
            list.get(pos + 1).copied()
        };
        next.or_else(|| self.compensations.after(0))
    }

    /// The status a failing request ends with: FAILED, or CANCELLED when it was asked to
    /// compensate (its parent failed, or a cancel asked: failed step 0).
    fn failed_status(&self) -> RequestStatus {
        match self.failing {
            Some((0, _)) => RequestStatus::Cancelled,
            _ => RequestStatus::Failed,
        }
    }

    /// The reason a failing request ends with: its failure's, and the compensations
    /// that failed.
    fn final_reason(&self) -> Option<String> {
        let (_, reason) = self.failing.as_ref()?;
        Some(self.compensations.reason(reason))
    }

    /// Records what a step received and answered, for the conditions and transforms of
    /// later steps; skipped when the workflow has none (copying every step's request and
    /// response would be work nobody reads).
    fn remember(&mut self, step: &CompiledStep, request: &Doc, response: &Doc) {
        if self.wf.uses_context {
            self.context.insert(
                step.context_name.clone(),
                crate::outbound::doc::context_entry(request.value(), response.value()),
            );
        }
    }

    /// The context as a condition or transform of `step` sees it: the steps so far, plus
    /// this step with its request.
    pub(super) fn context_for(&self, step: &CompiledStep, request: &Doc) -> Map<String, Value> {
        let mut ctx = self.context.clone();
        ctx.insert(
            step.context_name.clone(),
            crate::outbound::doc::context_entry(request.value(), Value::Null),
        );
        ctx
    }
}

/// What the step loop does after a step's outcome was written.
enum Flow {
    /// Run the job's next step.
    Next,
    /// The request finished or paused, or is not this executor's to run any more.
    Stop,
}

impl From<bool> for Flow {
    fn from(go_on: bool) -> Flow {
        if go_on {
            Flow::Next
        } else {
            Flow::Stop
        }
    }
}

/// Runs `job` to completion, to a pause, or until its lease is lost.
pub async fn run(exec: &Arc<Executor>, mut job: Job) {
    loop {
        let Some(step_id) = job.next else {
            finish(exec, &job).await;
            return;
        };
        // Its workflow paused: it waits, parked, before this step (one atomic load while
        // no workflow is paused).
        if exec.app.pauses.is(&job.wf.name) && park(exec, &job).await {
            return;
        }
        // The workflow is shared (an Arc), so the step is borrowed from it, not copied.
        let wf = job.wf.clone();
        let Some(step) = wf.step(step_id) else {
            let t = Transition::failed(
                job.id,
                format!("step {step_id} is not part of workflow {}", job.wf.def.name),
            );
            let reason = t.reason.clone();
            if write(exec, t).await {
                ended(exec, &job, RequestStatus::Failed, reason.as_deref());
            }
            return;
        };
        // A compensation receives what the step it undoes answered; a fan-out step's
        // place among them stands for its children's.
        if let Some(undone) = job.compensations.request(step_id) {
            if step.mode.fans_out() {
                use super::compensate::{children, Undo};
                let Some((failed, reason)) = &job.failing else {
                    return;
                };
                match children(exec, job.id, step, reason).await {
                    Undo::GoOn => job.next = job.next_on_failure(*failed, step.id),
                    Undo::Waiting | Undo::Stop => return,
                }
                continue;
            }
            job.request = undone.clone();
        }
        if let Flow::Stop = run_step(exec, &mut job, step).await {
            return;
        }
    }
}

/// Parks `job` before its next step, its workflow paused (`store::pauses`); true when
/// it is parked or no longer this executor's, false when the workflow was resumed
/// meanwhile (the step runs). Retried while the database is away.
async fn park(exec: &Executor, job: &Job) -> bool {
    use crate::store::pauses::{self, Parked};
    let mut backoff = Backoff::new(WRITE_RETRY, MAX_WRITE_RETRY);
    loop {
        let parked = async {
            let conn = exec
                .pool
                .get()
                .await
                .map_err(crate::store::StoreError::from)?;
            pauses::park(&conn, job.id, exec.app.instance_id, &job.wf.name).await
        }
        .await;
        match parked {
            Ok(Parked::Yes) => {
                exec.app.changes.notify(&job.id);
                return true;
            }
            Ok(Parked::Lost) => return true,
            Ok(Parked::NotPaused) => return false,
            Err(e) if e.is_transient() && !exec.is_stopping() => backoff.wait().await,
            // Not parked, not run: its lease runs out and a sweeper takes it again.
            Err(_) => return true,
        }
    }
}

/// A request resumed with no step left (e.g. after a final ASYNC step): it completes,
/// or fails if it was running onFailure steps.
async fn finish(exec: &Executor, job: &Job) {
    let (status, reason) = match &job.failing {
        Some(_) => (job.failed_status(), job.final_reason()),
        None => (RequestStatus::Completed, None),
    };
    let t = Transition {
        id: job.id,
        status,
        next_step: 0,
        next_request: None,
        failed_step: job.failing.as_ref().map(|f| f.0),
        reason,
        release: true,
        step: None,
        attempts: 0,
        retry_in_ms: None,
        last_error: None,
        notify: false,
    };
    let reason = t.reason.clone();
    if write(exec, t).await {
        ended(exec, job, status, reason.as_deref());
    }
}

/// One attempt of `step` (`attempt`), and the transition its outcome makes.
async fn run_step(exec: &Arc<Executor>, job: &mut Job, step: &CompiledStep) -> Flow {
    // A WAIT's `attempts` marks its sleep, not a failed try.
    let n = if step.mode == Mode::Wait {
        1
    } else {
        job.attempts + 1
    };
    let place = InLoop {
        exec,
        job,
        is_async: step.step_type == StepType::Async && job.failing.is_none(),
        deadline: job.deadline.filter(|_| job.failing.is_none()),
    };
    let made = match attempt(exec, step, &place, job.request.clone(), n).await {
        Attempted::Skipped { request, started } => {
            return skip(exec, job, step, request, started).await
        }
        Attempted::Made(made) => made,
    };
    let Made {
        body,
        outcome,
        attempt,
        retry: verdict,
        trace,
    } = made;
    if attempt.finished - attempt.started > 1000.0 {
        tracing::debug!(service_request_id = %job.id, step_id = step.id, trace_id = job.trace_id().as_deref(), ms = attempt.finished - attempt.started, "slow step");
    }
    let paused = |trace| end_paused(exec, (job.id, job.trace.as_ref()), step, n, trace);
    match outcome {
        Outcome::Sent if step.mode == crate::workflow::Mode::Workflow => {
            paused(trace);
            start_child(exec, job, step, &body, &attempt).await;
            Flow::Stop
        }
        Outcome::Sent if step.mode.fans_out() => {
            // Its children are traced under this step's span.
            let headers = trace
                .as_ref()
                .map(|t| children_headers(job, t.traceparent()));
            paused(trace);
            fan_out(exec, job, step, &body, &attempt, headers).await;
            Flow::Stop
        }
        Outcome::Sent => {
            paused(trace);
            sent(exec, job, step, &body, &attempt).await;
            Flow::Stop
        }
        Outcome::Paused => {
            paused(trace);
            Flow::Stop
        }
        Outcome::Lost => Flow::Stop,
        Outcome::Wait(due) => {
            paused(trace);
            sleep(exec, job, step, &body, &attempt, due).await;
            Flow::Stop
        }
        Outcome::Done(response) => completed(exec, job, step, body, response, &attempt).await,
        Outcome::Failed(e) => {
            let (policy, again) = verdict.expect("a failed attempt has its policy's word");
            tracing::debug!(service_request_id = %job.id, step_id = step.id, trace_id = job.trace_id().as_deref(), attempt = attempt.n, again, error = %e.message, "step attempt failed");
            if again {
                return retry(exec, job, step.id, attempt.n, &policy, &e)
                    .await
                    .into();
            }
            failed(exec, job, step, body, e, &attempt).await
        }
    }
}

/// A fan-out step's children started (`fan::start`), where its pause is written.
async fn fan_out(
    exec: &Arc<Executor>,
    job: &Job,
    step: &CompiledStep,
    body: &Doc,
    attempt: &Attempt,
    headers: Option<String>,
) {
    let context = job.context_for(step, body);
    let starting = super::fan::Starting {
        id: job.id,
        workflow: &job.wf.name,
        version: job.wf.def.version,
        step,
        request: body.as_str(),
        context: &context,
        started_ms: attempt.started,
        attempts: attempt.n,
        headers,
    };
    super::fan::start(exec, &starting).await;
}

/// A step in its request's step loop: the request's context, its condition read unless
/// the request handles a failure, and its call ended at the request's deadline.
struct InLoop<'a> {
    exec: &'a Arc<Executor>,
    job: &'a Job,
    is_async: bool,
    deadline: Option<tokio::time::Instant>,
}

impl Place for InLoop<'_> {
    fn request(&self) -> (Uuid, Option<&RequestTrace>) {
        (self.job.id, self.job.trace.as_ref())
    }

    fn context(&self, step: &CompiledStep, request: &Doc) -> Map<String, Value> {
        self.job.context_for(step, request)
    }

    fn reads_condition(&self) -> bool {
        self.job.failing.is_none()
    }

    async fn call(
        &self,
        step: &CompiledStep,
        body: &Doc,
        trace: Option<&mut StepTrace>,
    ) -> Outcome {
        // Past the request's deadline the step fails unstarted; reached while it runs,
        // the call is dropped (its connection closed), and it fails the same way.
        if self
            .deadline
            .is_some_and(|at| at <= tokio::time::Instant::now())
        {
            return Outcome::Failed(passed());
        }
        let (exec, job) = (self.exec, self.job);
        let call = execute(exec, job, step, body, self.is_async, trace);
        // Lanes end themselves at the deadline (`lanes`): their writes are waited for.
        let lanes = matches!(&step.val, Val::Parallel(p) if p.lanes) && self.is_async;
        let outcome = match self.deadline.filter(|_| !lanes) {
            None => call.await,
            Some(at) => tokio::select! {
                o = call => o,
                _ = tokio::time::sleep_until(at) => Outcome::Failed(passed()),
            },
        };
        exec.app.metrics.steps_executed.inc();
        outcome
    }
}

/// A request's forwarded headers as its fan-out step's children get them: the step's
/// `traceparent` (its span, so each branch hangs under it) and the request's `tracestate`.
fn children_headers(job: &Job, traceparent: &str) -> String {
    let mut h = job.headers.clone();
    h.push(("traceparent".into(), traceparent.to_string()));
    if let Some(state) = job.trace.as_ref().and_then(|t| t.tracestate.clone()) {
        h.push(("tracestate".into(), state));
    }
    serde_json::to_string(&h).expect("headers serialize")
}

/// `step`'s condition was false: it is recorded SKIPPED and its request passed on.
async fn skip(
    exec: &Executor,
    job: &mut Job,
    step: &CompiledStep,
    request: Doc,
    started: f64,
) -> Flow {
    let next = job.wf.next_main(step.id);
    let rec = record(
        job,
        step,
        StepStatus::Skipped,
        &request,
        Some(&request),
        started,
        None,
    );
    let t = transition(job, next, Some(request.clone()), rec);
    job.remember(step, &request, &request);
    if !advance(exec, job, t).await {
        return Flow::Stop;
    }
    job.next = next;
    Flow::Next
}

/// A WORKFLOW step: the request pauses at it and its child request is stored, in one
/// statement fenced on the lease (`store::children::start`); any sweeper runs the child,
/// and its outcome resumes this request as the step's answer (`children`). Retried while
/// the database is away; abandoned when the lease is lost (its next holder runs the step
/// again, and starts the child then).
async fn start_child(exec: &Executor, job: &Job, step: &CompiledStep, body: &Doc, a: &Attempt) {
    let Val::Workflow(val) = &step.val else {
        return;
    };
    let request = String::from_utf8_lossy(body.as_bytes()).into_owned();
    // The child runs within its own workflow's deadline, from now (the parent's, if it
    // has one, ends the child with the step).
    let version = val.version.unwrap_or(0);
    let workflows = &exec.app.workflows;
    let child_wf = match version {
        0 => workflows.get_or_load(&exec.pool, &val.workflow).await,
        v => {
            workflows
                .get_or_load_version(&exec.pool, &val.workflow, v)
                .await
        }
    };
    let child_wf = child_wf.ok().flatten();
    let deadline_ms = child_wf
        .as_ref()
        .and_then(|wf| wf.deadline)
        .map(|d| d.as_millis() as f64);
    let start = crate::store::children::Start {
        parent: job.id,
        owner: exec.app.instance_id,
        step_id: step.id,
        step_name: &step.name,
        request: &request,
        started_ms: a.started,
        attempts: a.n,
        child: crate::ids::new_v7(),
        workflow: &val.workflow,
        version,
        deadline_ms,
        // Told as its workflow tells (by the version read here: a newer one stored
        // meanwhile tells by its own targets, of the statuses this one named).
        notify: child_wf.and_then(|wf| wf.notify_mask),
    };
    let mut backoff = Backoff::new(WRITE_RETRY, MAX_WRITE_RETRY);
    loop {
        let started = async {
            let conn = exec
                .pool
                .get()
                .await
                .map_err(crate::store::StoreError::from)?;
            crate::store::children::start(&conn, &start).await
        }
        .await;
        match started {
            Ok(true) => {
                exec.app.changes.notify(&job.id);
                exec.wake();
                return;
            }
            Ok(false) => return,
            Err(e) if e.is_transient() && !exec.is_stopping() => backoff.wait().await,
            Err(e) => {
                tracing::warn!(service_request_id = %job.id, step_id = step.id, trace_id = job.trace_id().as_deref(), error = %e, "a child request could not be started; the step runs again later");
                return;
            }
        }
    }
}

/// An ASYNC step was sent: the request pauses until its response arrives.
async fn sent(exec: &Executor, job: &Job, step: &CompiledStep, body: &Doc, a: &Attempt) {
    let t = Transition {
        id: job.id,
        status: RequestStatus::Paused,
        next_step: step.id,
        next_request: None,
        failed_step: None,
        reason: None,
        release: true,
        step: Some(StepRecord {
            attempts: a.n,
            ..record(job, step, StepStatus::Started, body, None, a.started, None)
        }),
        // With an answer timeout, the paused row keeps its deadline as `lease_until`
        // (no claim takes a PAUSED row; `deadlines` finds it) and the attempt it is, so
        // a timeout is retried as the step's policy says.
        attempts: if step.answer_timeout.is_some() {
            a.n
        } else {
            0
        },
        retry_in_ms: step.answer_timeout.map(|d| d.as_secs_f64() * 1000.0),
        last_error: None,
        notify: false,
    };
    if write(exec, t).await && step.step_type == crate::workflow::StepType::Async {
        // Its answer, when it comes here, needs no read of the row for the workflow.
        exec.app.paused.insert(job.id, &job.wf);
    }
}

/// A WAIT step sleeps: its record STARTED, the request unleased until `due` (a timer
/// any instance's claim fires: `lease_until`), at the same step with the same request,
/// and `attempts` 1, which marks the wait as entered (`wait_outcome`). Its `last_error`
/// stays empty: that is what tells a wait from a pending retry (`http::answers`).
async fn sleep(exec: &Executor, job: &Job, step: &CompiledStep, body: &Doc, a: &Attempt, due: f64) {
    let t = Transition {
        id: job.id,
        status: RequestStatus::InProgress,
        next_step: step.id,
        next_request: Some(job.request.clone()),
        failed_step: job.failing.as_ref().map(|f| f.0),
        reason: job.failing.as_ref().map(|f| f.1.clone()),
        release: true,
        step: Some(StepRecord {
            attempts: a.n,
            ..record(job, step, StepStatus::Started, body, None, a.started, None)
        }),
        attempts: 1,
        retry_in_ms: Some((due - now_ms()).max(1.0)),
        last_error: None,
        notify: false,
    };
    write(exec, t).await;
}

/// What a WAIT step does now: sleep until its time, or, once that has come (it is in the
/// past, or the request was claimed again after sleeping), pass its request on as its
/// response. A time from the context is checked again when claimed after the sleep, with
/// a second's allowance for clocks that differ between instances and Postgres.
fn wait_outcome(job: &Job, step: &CompiledStep, wait: &WaitVal, body: &Doc) -> Outcome {
    let now = now_ms();
    let slept = job.attempts > 0;
    match crate::workflow::wait::due_ms(wait, &job.context_for(step, body), now) {
        Err(why) => Outcome::Failed(CallError::new(CallErrorKind::Other, why.to_string())),
        Ok(_) if slept && matches!(wait, WaitVal::Duration(_)) => Outcome::Done(body.clone()),
        Ok(due) if due <= now + if slept { 1000.0 } else { 0.0 } => Outcome::Done(body.clone()),
        Ok(due) => Outcome::Wait(due),
    }
}

/// An EVENT step: its key from the context, then an event kept for it answers it now,
/// or the request pauses waiting for one (`store::events::wait`, under the event's lock,
/// fenced on the lease). A database away is retried as a step write is; a lost lease
/// ends the job (its next holder runs the step again).
async fn await_event(
    exec: &Executor,
    job: &Job,
    step: &CompiledStep,
    ev: &crate::workflow::model::EventVal,
    body: &Doc,
) -> Outcome {
    let key = match ev.key.eval(&job.context_for(step, body)) {
        Ok(k) => k,
        Err(e) => return Outcome::Failed(CallError::new(CallErrorKind::Other, e.0)),
    };
    let w = crate::store::events::Waiting {
        id: job.id,
        step_id: step.id,
        step_name: &step.name,
        owner: exec.app.instance_id,
        event: &ev.event,
        key: &key,
        request: body.as_str(),
        started_ms: now_ms(),
        timeout: step.answer_timeout,
        next_step: job.wf.next_main(step.id).unwrap_or(0),
    };
    let mut backoff = crate::backoff::Backoff::new(WRITE_RETRY, MAX_WRITE_RETRY);
    loop {
        let r = async {
            let mut conn = exec.pool.get().await?;
            crate::store::events::wait(&mut conn, &w).await
        }
        .await;
        match r {
            Ok(crate::store::events::AtStep::Kept(payload)) => {
                exec.app.metrics.events_kept_taken.inc();
                return Outcome::Done(Doc::trusted(payload));
            }
            Ok(crate::store::events::AtStep::Paused) => {
                exec.app.changes.notify(&job.id);
                return Outcome::Paused;
            }
            Ok(crate::store::events::AtStep::Lost) => return Outcome::Paused,
            Err(e) if e.is_transient() && !exec.is_stopping() => backoff.wait().await,
            Err(e) => return Outcome::Failed(CallError::new(CallErrorKind::Other, e.to_string())),
        }
    }
}

/// The compensations of a failing job, read back (retried while the database is away;
/// None when it stays away while stopping).
async fn read_compensations(
    exec: &Executor,
    job: &Job,
    failed: u32,
) -> Option<super::compensate::Compensations> {
    let mut backoff = Backoff::new(WRITE_RETRY, MAX_WRITE_RETRY);
    loop {
        match exec.compensations(&job.wf, job.id, failed).await {
            Ok(c) => return Some(c),
            Err(e) if e.is_transient() && !exec.is_stopping() => backoff.wait().await,
            Err(_) => return None,
        }
    }
}

/// `step` answered: on to the next step with its response (or, among onFailure steps,
/// with the failed step's request).
async fn completed(
    exec: &Executor,
    job: &mut Job,
    step: &CompiledStep,
    body: Doc,
    response: Doc,
    a: &Attempt,
) -> Flow {
    let rec = StepRecord {
        attempts: a.n,
        ..record(
            job,
            step,
            StepStatus::Completed,
            &body,
            Some(&response),
            a.started,
            Some(a.finished),
        )
    };
    job.remember(step, &body, &response);
    let (next, next_request) = match &job.failing {
        // onFailure steps all receive the failed step's request.
        Some((parent, _)) => (job.next_on_failure(*parent, step.id), job.request.clone()),
        None => (job.wf.next_main(step.id), response),
    };
    let t = transition(job, next, Some(next_request.clone()), rec);
    if !advance(exec, job, t).await {
        return Flow::Stop;
    }
    job.next = next;
    job.request = next_request;
    job.attempts = 0;
    Flow::Next
}

/// `step` failed for good: its onFailure steps run next (then the request fails), or,
/// when it is itself an onFailure step, the next of those.
async fn failed(
    exec: &Executor,
    job: &mut Job,
    step: &CompiledStep,
    body: Doc,
    e: CallError,
    a: &Attempt,
) -> Flow {
    if a.n > 1 {
        exec.app.metrics.step_retries_exhausted.inc();
    }
    if e.kind == CallErrorKind::Deadline {
        exec.app.metrics.deadlines_passed.inc();
    }
    let reason = if a.n > 1 {
        format!("after {} attempts: {}", a.n, e.message)
    } else {
        e.message
    };
    let error = Doc::error(500, &reason);
    let rec = StepRecord {
        attempts: a.n,
        reason: Some(reason.clone()),
        ..record(
            job,
            step,
            StepStatus::Failed,
            &body,
            Some(&error),
            a.started,
            Some(a.finished),
        )
    };
    job.remember(step, &body, &error);
    if job.compensations.has(step.id) {
        job.compensations.failed.push(step.name.clone());
    }
    if job.failing.is_none() && job.wf.compensates {
        match read_compensations(exec, job, step.id).await {
            Some(c) => job.compensations = c,
            // Not this executor's any more, or stopping: the step runs again later.
            None => return Flow::Stop,
        }
    }
    let next = match &job.failing {
        Some((parent, _)) => job.next_on_failure(*parent, step.id),
        None => {
            let why = if a.n > 1 {
                format!("step '{}' failed {reason}", step.name)
            } else {
                format!("step '{}' failed: {reason}", step.name)
            };
            job.failing = Some((step.id, why));
            job.request = body;
            job.next_on_failure(step.id, step.id)
        }
    };
    let t = transition(job, next, Some(job.request.clone()), rec);
    if !advance(exec, job, t).await {
        return Flow::Stop;
    }
    job.next = next;
    job.attempts = 0;
    Flow::Next
}

async fn execute(
    exec: &Executor,
    job: &Job,
    step: &CompiledStep,
    body: &Doc,
    is_async: bool,
    trace: Option<&mut StepTrace>,
) -> Outcome {
    // Every future below but the HTTP call's is boxed (`step_io::publish` says why): this
    // one is built and moved whole for every step.
    match (&step.val, step.mode) {
        (Val::Http(val), Mode::Http) => {
            let key = step_key(&job.id, step.id);
            match call_http(exec, &job.http_headers, val, body, key, trace).await {
                Ok(_) if is_async => Outcome::Sent,
                Ok(v) => Outcome::Done(v),
                Err(e) => Outcome::Failed(e),
            }
        }
        (Val::Amqp(_), Mode::Amqp) | (Val::Kafka(_), Mode::Kafka) => {
            let t = trace.as_deref();
            published(
                publish(exec, job.id, &job.headers, step, body, t).await,
                is_async,
            )
        }
        // A PARALLEL whose branches only call runs them here, as lanes of this request.
        (Val::Parallel(p), Mode::Parallel) if is_async && p.lanes => {
            Box::pin(in_lanes(exec, job, step, p, body, trace)).await
        }
        // The child is started where the pause is written (`children::start`), in one
        // statement with it.
        (Val::Workflow(_), Mode::Workflow) if is_async => Outcome::Sent,
        (Val::Workflow(_), Mode::Workflow) => {
            cannot("a WORKFLOW step cannot run as an onFailure step".into())
        }
        // Its children are started where the pause is written (`fan::start`); a MAP
        // whose list is missing or too long fails here, one with no items is done.
        // A SWITCH whose value has no case (and no default) fails here, naming it.
        (Val::Parallel(_), Mode::Parallel)
        | (Val::Map(_), Mode::Map)
        | (Val::Switch(_), Mode::Switch)
        | (Val::Loop(_), Mode::Loop)
            if is_async =>
        {
            match super::fan::check(step, &job.context_for(step, body)) {
                Ok(0) => Outcome::Done(Doc::trusted("[]")),
                Ok(_) => Outcome::Sent,
                Err(why) => Outcome::Failed(CallError::new(CallErrorKind::Other, why.to_string())),
            }
        }
        (Val::Wait(w), Mode::Wait) => wait_outcome(job, step, w, body),
        (Val::Event(ev), Mode::Event) if is_async => {
            Box::pin(await_event(exec, job, step, ev, body)).await
        }
        (Val::Event(_), Mode::Event) => {
            cannot("an EVENT step cannot run as an onFailure step".into())
        }
        (_, mode) => cannot(format!(
            "step {} has a val that does not fit its mode {}",
            step.id,
            mode.as_str()
        )),
    }
}

/// A broker step's publish, as its outcome (`sent_or_done`, or the failure).
fn published(sent: Result<(), CallError>, is_async: bool) -> Outcome {
    match sent {
        Ok(()) => sent_or_done(is_async),
        Err(reason) => Outcome::Failed(reason),
    }
}

/// A step that cannot run as it stands: it fails, and no retry can help it.
fn cannot(why: String) -> Outcome {
    Outcome::Failed(CallError::new(CallErrorKind::Other, why))
}

/// A PARALLEL step whose branches only call, run as lanes of this request (`lanes`).
async fn in_lanes(
    exec: &Executor,
    job: &Job,
    step: &CompiledStep,
    p: &crate::workflow::model::ParallelVal,
    body: &Doc,
    trace: Option<&mut StepTrace>,
) -> Outcome {
    let span = trace.as_deref().and_then(StepTrace::span_id);
    let lanes = super::lanes::InRequest {
        id: job.id,
        payload: &job.payload,
        request: &job.request,
        attempts: job.attempts,
        fresh: job.fresh,
        deadline: job.deadline,
        trace: job.trace.as_ref(),
        headers: &job.headers,
        http_headers: &job.http_headers,
        outer: p
            .branches
            .iter()
            .any(|b| b.sub.0.uses_context)
            .then(|| job.context_for(step, body)),
    };
    match super::lanes::run(exec, &lanes, step, p, body, span).await {
        super::lanes::Joined::Done(doc) => Outcome::Done(doc),
        super::lanes::Joined::Failed(e) => Outcome::Failed(e),
        super::lanes::Joined::Lost => Outcome::Lost,
    }
}

/// A broker step's message is out: the request waits for the answer. (An onFailure step
/// is not waited for: it was sent, and that is all it can do.)
fn sent_or_done(is_async: bool) -> Outcome {
    if is_async {
        Outcome::Sent
    } else {
        Outcome::Done(Doc::trusted(&b"{\"sent\":true}"[..]))
    }
}

fn record(
    job: &Job,
    step: &CompiledStep,
    status: StepStatus,
    request: &Doc,
    response: Option<&Doc>,
    started: f64,
    finished: Option<f64>,
) -> StepRecord {
    StepRecord {
        step_id: step.id,
        step_name: step.name.clone(),
        status,
        request: Some(request.clone()),
        request_is_payload: request.same(&job.payload),
        response: response.cloned(),
        started_ms: started,
        finished_ms: finished,
        reason: None,
        attempts: 1,
        lane: None,
    }
}

/// Schedules the next attempt of `step_id` after `attempts` failed ones. The count and
/// when the next attempt is due are written to the request row (so a restart neither
/// loses nor repeats the retry); a wait gives the lease and the executor slot up, and
/// the sweeper of any instance claims the row when it is due. An attempt that timed out
/// already waited, so the next one follows at once, on this executor. False when the
/// request is not this executor's to continue now.
async fn retry(
    exec: &Arc<Executor>,
    job: &mut Job,
    step_id: u32,
    attempts: u32,
    policy: &RetryPolicy,
    e: &CallError,
) -> bool {
    exec.app.metrics.count_retry(e.cause());
    let wait = if e.backs_off() {
        policy.backoff(attempts, fastrand::f64(), e.retry_after)
    } else {
        Duration::ZERO
    };
    let at_once = wait.is_zero();
    let t = Transition {
        id: job.id,
        status: RequestStatus::InProgress,
        next_step: step_id,
        next_request: Some(job.request.clone()),
        failed_step: job.failing.as_ref().map(|f| f.0),
        reason: job.failing.as_ref().map(|f| f.1.clone()),
        release: !at_once,
        step: None,
        attempts,
        retry_in_ms: (!at_once).then_some(wait.as_secs_f64() * 1000.0),
        last_error: Some(format!("attempt {attempts} failed: {}", e.message)),
        notify: false,
    };
    if !write(exec, t).await {
        return false;
    }
    if at_once {
        job.attempts = attempts;
        return true;
    }
    exec.wake_after(wait);
    false
}

/// The transition after a step: on to `next`, or finished when none is left.
fn transition(
    job: &Job,
    next: Option<u32>,
    next_request: Option<Doc>,
    rec: StepRecord,
) -> Transition {
    let (status, reason) = match (next, &job.failing) {
        (Some(_), _) => (RequestStatus::InProgress, None),
        (None, Some(_)) => (job.failed_status(), job.final_reason()),
        (None, None) => (RequestStatus::Completed, None),
    };
    Transition {
        id: job.id,
        status,
        next_step: next.unwrap_or(0),
        next_request: if next.is_some() { next_request } else { None },
        failed_step: job.failing.as_ref().map(|f| f.0),
        reason,
        release: next.is_none(),
        step: Some(rec),
        attempts: 0,
        retry_in_ms: None,
        last_error: None,
        notify: false,
    }
}

/// Writes a step's transition; true when the request goes on to another step (false when
/// it finished, paused, or is no longer this instance's to run).
async fn advance(exec: &Executor, job: &Job, mut t: Transition) -> bool {
    let status = t.status;
    // A final status its workflow tells of: written with its notification.
    t.notify = job
        .wf
        .notify_mask
        .zip(crate::workflow::notify::bit(status))
        .is_some_and(|(m, b)| m & b != 0);
    let reason = if status == RequestStatus::InProgress {
        None
    } else {
        t.reason.clone()
    };
    if !write(exec, t).await {
        return false;
    }
    if status != RequestStatus::InProgress {
        ended(exec, job, status, reason.as_deref());
        return false;
    }
    true
}

/// `job`'s request reached its final `status`: counted, and its span written.
fn ended(exec: &Executor, job: &Job, status: RequestStatus, reason: Option<&str>) {
    exec.count_finished(status, Some((&job.wf.def.name, job.created_us)));
    if job.wf.concurrency.is_some() {
        // Its slot is free: the admitter gives it to the next request of its key.
        exec.app.freed.freed(job.id);
    }
    if let (Some(tracing), Some(t)) = (&exec.app.tracing, &job.trace) {
        tracing.end_request(
            t,
            &job.id,
            job.retries,
            &job.wf.def.name,
            job.created_us,
            status,
            reason,
            Vec::new(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_key_is_request_id_colon_step_id() {
        let id = Uuid::now_v7();
        for step in [1, 42, u32::MAX] {
            assert_eq!(step_key(&id, step), format!("{id}:{step}").as_str());
        }
    }
}
