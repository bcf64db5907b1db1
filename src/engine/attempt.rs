//! One attempt of a step, made the same way wherever the step runs: in its request's
//! step loop (`job`) or in a branch of a PARALLEL step run as lanes (`lanes`). An attempt
//! reads the step's condition, shapes the request it sends (`transform`), opens its span,
//! makes its call, and on a failure asks the step's retry policy whether to try again,
//! ending the span with the answer.
//!
//! What differs between the two is data the caller gives (`Place`): the context the step
//! reads, whether its condition is read, how the call is made, where its span hangs. What
//! is done with the outcome stays with the caller: the step loop writes the request's
//! transition (a retry waits in the database, for any sweeper); a branch writes its
//! step's record and waits out a retry in place, in the job that holds the lease.

use std::borrow::Cow;

use serde_json::{Map, Value};
use uuid::Uuid;

use super::step_io::{self, now_ms};
use super::Executor;
use crate::outbound::call::{CallError, CallErrorKind};
use crate::outbound::doc::Doc;
use crate::outbound::step_trace::{Ended, StepTrace};
use crate::telemetry::RequestTrace;
use crate::workflow::{transform, CompiledStep, RetryPolicy};

/// What one attempt's call came to.
pub(super) enum Outcome {
    Done(Doc),
    Failed(CallError),
    /// An ASYNC step was sent; the request waits for its response.
    Sent,
    /// A WAIT step sleeps until this time (ms since the Unix epoch).
    Wait(f64),
    /// The request paused at an EVENT step (written already).
    Paused,
    /// The request is no longer this executor's to run (its lease was lost, or it was
    /// cancelled), or its lanes were stopped, while the step ran: nothing more is
    /// written for it.
    Lost,
}

/// When an attempt ran, and which it was.
pub(super) struct Attempt {
    pub started: f64,
    pub finished: f64,
    pub n: u32,
}

/// Where a step runs, as its attempt needs to know it.
pub(super) trait Place {
    /// The request's id, and its trace when it is traced.
    fn request(&self) -> (Uuid, Option<&RequestTrace>);
    /// The context the step's condition and transform read, given the step's request.
    fn context(&self, step: &CompiledStep, request: &Doc) -> Map<String, Value>;
    /// Whether the step's condition is read (not while its request handles a failure).
    fn reads_condition(&self) -> bool {
        true
    }
    /// Hangs the attempt's span where it belongs (a lane's, under its PARALLEL step's).
    fn place_span(&self, _span: &mut StepTrace) {}
    /// Makes the call with `body` (and counts it, when it was made).
    async fn call(&self, step: &CompiledStep, body: &Doc, trace: Option<&mut StepTrace>)
        -> Outcome;
}

/// An attempt that was made.
pub(super) struct Made<'e> {
    /// The request the step was sent (its transform applied).
    pub body: Doc,
    pub outcome: Outcome,
    pub attempt: Attempt,
    /// For a failure: the step's retry policy, and whether it tries again.
    pub retry: Option<(Cow<'e, RetryPolicy>, bool)>,
    /// The span, still open when the outcome is neither done nor failed (the caller ends
    /// it, as a pause); ended otherwise.
    pub trace: Option<StepTrace>,
}

/// What an attempt came to. Returned once per attempt and taken apart at once: boxing
/// its larger variant would cost an allocation per step.
#[allow(clippy::large_enum_variant)]
pub(super) enum Attempted<'e> {
    /// The condition was false: the step is skipped, and passes its request on.
    Skipped {
        request: Doc,
        started: f64,
    },
    Made(Made<'e>),
}

/// Makes attempt `n` of `step` at `place`, sending `request` (shaped by the transform).
pub(super) async fn attempt<'e, P: Place>(
    exec: &'e Executor,
    step: &CompiledStep,
    place: &P,
    request: Doc,
    n: u32,
) -> Attempted<'e> {
    let started = now_ms();
    // A false condition skips the step and passes its request on; one that cannot be
    // evaluated to a boolean fails the step.
    let mut failure = None;
    if let (true, Some(cond)) = (place.reads_condition(), &step.when) {
        match cond.eval(&place.context(step, &request)) {
            Ok(true) => {}
            Ok(false) => return Attempted::Skipped { request, started },
            Err(why) => failure = Some(CallError::new(CallErrorKind::Other, why.0)),
        }
    }
    let body = match &step.transform {
        Some(spec) => Doc::from_value(&transform::shift(
            spec,
            &Value::Object(place.context(step, &request)),
        )),
        None => request,
    };
    let (id, request_trace) = place.request();
    let mut trace = StepTrace::begin(exec.app.tracing.as_ref(), request_trace);
    if let Some(t) = trace.as_mut() {
        place.place_span(t);
    }
    let outcome = match failure {
        Some(e) => Outcome::Failed(e),
        None => place.call(step, &body, trace.as_mut()).await,
    };
    let attempt = Attempt {
        started,
        finished: now_ms(),
        n,
    };
    let end = |trace: Option<StepTrace>, how: Ended| {
        if let (Some(t), Some(rt)) = (trace, request_trace) {
            t.end(exec.app.tracing.as_ref(), rt, &id, step, n, how);
        }
    };
    let mut retry = None;
    match &outcome {
        Outcome::Done(_) => end(trace.take(), Ended::Done),
        Outcome::Failed(e) => {
            let policy = step_io::policy(exec, step);
            let again = e.retryable(&policy) && n < policy.max_attempts;
            end(trace.take(), Ended::Failed(e, again));
            retry = Some((policy, again));
        }
        Outcome::Lost => trace = None,
        Outcome::Sent | Outcome::Wait(_) | Outcome::Paused => {}
    }
    Attempted::Made(Made {
        body,
        outcome,
        attempt,
        retry,
        trace,
    })
}

/// Ends an attempt's span that `attempt` left open, as a pause (the request waits: for an
/// answer, a time, an event, its children).
pub(super) fn end_paused(
    exec: &Executor,
    request: (Uuid, Option<&RequestTrace>),
    step: &CompiledStep,
    n: u32,
    trace: Option<StepTrace>,
) {
    if let (Some(t), (id, Some(rt))) = (trace, request) {
        t.end(exec.app.tracing.as_ref(), rt, &id, step, n, Ended::Paused);
    }
}
