//! What running one step needs, whether in a request's step loop (`job`) or in a
//! PARALLEL's lanes (`lanes`): the clock, the failure a deadline makes, the step's retry
//! policy, the calls of HTTP, AMQP and Kafka steps, and the transition write that retries
//! while the database is away.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use uuid::Uuid;

use super::writer::{Transition, WriteError};
use super::Executor;
use crate::backoff::Backoff;
use crate::outbound::call::{CallError, CallErrorKind};
use crate::outbound::doc::Doc;
use crate::outbound::step_trace::StepTrace;
use crate::status::RequestStatus;
use crate::workflow::{CompiledStep, RetryPolicy, Val};

/// The failure of the step a request is at when its deadline passes (the same words
/// whichever instance, executor or sweeper, ends it).
pub const DEADLINE_PASSED: &str = "the request's deadline passed";

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// How long to wait before retrying a write the database did not take, at first and at most.
pub const WRITE_RETRY: Duration = Duration::from_millis(100);
pub const MAX_WRITE_RETRY: Duration = Duration::from_secs(2);

/// The failure of a step the request's deadline ended.
pub fn passed() -> CallError {
    CallError::new(CallErrorKind::Deadline, DEADLINE_PASSED)
}

/// An HTTP step's call: the turn at its host taken before the call and given back after
/// it (the wait for it does not count against the call's own timeout).
pub async fn call_http(
    exec: &Executor,
    forwarded: &[(hyper::header::HeaderName, hyper::header::HeaderValue)],
    val: &crate::workflow::model::HttpVal,
    body: &Doc,
    key: hyper::header::HeaderValue,
    trace: Option<&mut StepTrace>,
) -> Result<Doc, CallError> {
    let _turn = exec.app.downstream.acquire(&val.host_key).await?;
    exec.http.call(val, body, forwarded, key, trace).await
}

/// A broker step's publish (AMQP or Kafka; any other step fails), boxed: a future is as
/// large as its largest await and is moved whole wherever it is built, so with the
/// brokers' clients inline the step loop's and a lane's futures grew to 10 and 19 KB and
/// every HTTP step copied them (docs/decisions.md, "The fixed cost on a fresh database").
/// An allocation beside a publish costs nothing.
pub fn publish<'a>(
    exec: &'a Executor,
    id: Uuid,
    headers: &'a [(String, String)],
    step: &'a CompiledStep,
    body: &'a Doc,
    trace: Option<&'a StepTrace>,
) -> futures_util::future::BoxFuture<'a, Result<(), CallError>> {
    Box::pin(async move {
        match &step.val {
            Val::Amqp(val) => send_amqp(exec, id, headers, step, val, body, trace).await,
            Val::Kafka(val) => send_kafka(exec, id, headers, step, val, body, trace).await,
            _ => Err(CallError::new(CallErrorKind::Other, "not a broker step")),
        }
    })
}

/// An AMQP step's message, published.
async fn send_amqp(
    exec: &Executor,
    id: Uuid,
    headers: &[(String, String)],
    step: &CompiledStep,
    val: &crate::workflow::model::AmqpVal,
    body: &Doc,
    trace: Option<&StepTrace>,
) -> Result<(), CallError> {
    let msg = step_message(exec, id, headers, step, body, trace);
    publish_amqp(exec, val, &msg).await
}

/// A message published to an AMQP step's (or notification target's) `val`.
pub async fn publish_amqp(
    exec: &Executor,
    val: &crate::workflow::model::AmqpVal,
    msg: &crate::outbound::publish::StepMessage<'_>,
) -> Result<(), CallError> {
    // A connection string that names a secret is filled in for this call.
    let filled =
        with_secrets(exec, &val.connection_url)?.map(|url| crate::workflow::model::AmqpVal {
            connection_url: url,
            ..val.clone()
        });
    exec.amqp.publish(filled.as_ref().unwrap_or(val), msg).await
}

/// A Kafka step's message, produced.
async fn send_kafka(
    exec: &Executor,
    id: Uuid,
    headers: &[(String, String)],
    step: &CompiledStep,
    val: &crate::workflow::model::KafkaVal,
    body: &Doc,
    trace: Option<&StepTrace>,
) -> Result<(), CallError> {
    let msg = step_message(exec, id, headers, step, body, trace);
    produce_kafka(exec, val, &msg).await
}

/// A record produced to a Kafka step's (or notification target's) `val`.
pub async fn produce_kafka(
    exec: &Executor,
    val: &crate::workflow::model::KafkaVal,
    msg: &crate::outbound::publish::StepMessage<'_>,
) -> Result<(), CallError> {
    let filled =
        with_secrets(exec, &val.connection_url)?.map(|url| crate::workflow::model::KafkaVal {
            connection_url: url,
            ..val.clone()
        });
    exec.kafka
        .produce(filled.as_ref().unwrap_or(val), msg)
        .await
}

/// A broker connection string with its secrets filled in, percent-encoded so that each
/// stays one user, password or virtual host (None: it names none); a secret gone since
/// the workflow was defined fails the step, naming it.
fn with_secrets(exec: &Executor, text: &str) -> Result<Option<String>, CallError> {
    if !crate::secrets::refers(text) {
        return Ok(None);
    }
    exec.app
        .config
        .secrets
        .resolve(text, crate::workflow::brokers::encode_secret)
        .map(Some)
        .map_err(|e| CallError::new(CallErrorKind::Other, e.to_string()))
}

fn step_message<'a>(
    exec: &Executor,
    id: Uuid,
    headers: &'a [(String, String)],
    step: &CompiledStep,
    body: &'a Doc,
    trace: Option<&'a StepTrace>,
) -> crate::outbound::publish::StepMessage<'a> {
    crate::outbound::publish::StepMessage {
        service_request_id: id,
        of: crate::outbound::publish::Of::Step(step.id),
        body: body.as_bytes(),
        headers,
        traceparent: trace.map(StepTrace::traceparent),
        tracestate: trace.and_then(|t| t.tracestate.as_deref()),
        timeout: exec.app.config.http.timeout,
    }
}

/// The step's retry policy: its own `retry` over the server default.
pub fn policy<'a>(exec: &'a Executor, step: &CompiledStep) -> std::borrow::Cow<'a, RetryPolicy> {
    let default = &exec.app.config.retry;
    match &step.retry {
        Some(spec) => std::borrow::Cow::Owned(spec.over(default)),
        None => std::borrow::Cow::Borrowed(default),
    }
}

/// Writes a transition, retrying while the database is away (the step's outcome is in
/// memory only until then); false when the lease is lost or the executor is stopping
/// (the request is someone else's now, or later: its lease runs out and it is continued
/// from its last committed step). A transition Postgres refuses outright fails the
/// request with the reason instead, and is false too.
pub async fn write(exec: &Executor, mut t: Transition) -> bool {
    let mut backoff = Backoff::new(WRITE_RETRY, MAX_WRITE_RETRY);
    loop {
        let outcome = exec.writer.write(t.clone()).await;
        match outcome {
            Ok(()) => return true,
            Err(WriteError::LeaseLost) => return false,
            Err(WriteError::Unavailable) => {
                if exec.is_stopping() {
                    return false;
                }
                backoff.wait().await;
            }
            Err(WriteError::Rejected(why))
                if t.step.is_some() || t.status != RequestStatus::Failed =>
            {
                tracing::error!(service_request_id = %t.id, step_id = t.step.as_ref().map(|s| s.step_id), error = %why, "a step transition was refused; failing the request");
                t = Transition::failed(
                    t.id,
                    format!("the outcome of a step could not be stored: {why}"),
                );
                if write_failed(exec, t).await {
                    exec.count_finished(RequestStatus::Failed, None);
                }
                return false;
            }
            Err(WriteError::Rejected(why)) => {
                tracing::error!(service_request_id = %t.id, error = %why, "a request's failure could not be stored");
                return false;
            }
        }
    }
}

/// `write` for a bare failure (boxed: `write` calls it, and it calls `write`).
fn write_failed(
    exec: &Executor,
    t: Transition,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
    Box::pin(write(exec, t))
}
