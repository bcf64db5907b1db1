//! Publishing AMQP and Kafka steps, beside the HTTP step client: one reused connection
//! per broker URL and runtime, and a publish counts only once the broker confirmed it
//! (AMQP publisher confirms, Kafka acks from all in-sync replicas). One publish is one
//! attempt of the step's call: a broker that is away fails it with a transient error,
//! which the step's retry policy tries again.

pub(crate) mod amqp;
pub(crate) mod kafka;

use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

use super::call::{CallError, CallErrorKind};
use crate::metrics::Metrics;

/// A step message as both brokers carry it: the step's request as the body, and who it
/// belongs to as properties and headers, so the service can answer and dedupe. A
/// notification (`engine::notify`) travels the same way, its outcome as the body.
pub struct StepMessage<'a> {
    pub service_request_id: Uuid,
    pub of: Of,
    /// The step's request (or the notification), serialized once for both the record and
    /// the message.
    pub body: &'a [u8],
    /// The service request's forwardable headers.
    pub headers: &'a [(String, String)],
    /// The attempt's `traceparent` and `tracestate`, as message headers.
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
    /// How long the publish may take, retries included.
    pub timeout: Duration,
}

impl StepMessage<'_> {
    /// The trace context headers the message carries.
    pub fn trace_headers(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("traceparent", self.traceparent),
            ("tracestate", self.tracestate),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
    }

    /// `<service-request-id>:<step-id>`, the same key HTTP steps send as `Idempotency-Key`
    /// (`notification:<id>` for a notification, as its HTTP target gets it).
    pub fn idempotency_key(&self) -> String {
        match self.of {
            Of::Step(step) => format!("{}:{step}", self.service_request_id),
            Of::Notification(n) => format!("notification:{n}"),
        }
    }

    /// The header naming what the message is of: `stepId` or `notificationId`.
    pub fn of_header(&self) -> (&'static str, i64) {
        match self.of {
            Of::Step(step) => ("stepId", i64::from(step)),
            Of::Notification(n) => ("notificationId", n),
        }
    }
}

/// What a message carries: a step's request, or a notification of a request's outcome.
#[derive(Debug, Clone, Copy)]
pub enum Of {
    Step(u32),
    Notification(i64),
}

/// Why one publish attempt did not succeed.
pub(crate) enum Attempt {
    /// The broker is away or dropped the connection: worth retrying.
    Retry(String),
    /// The broker answered, and the answer is no (unroutable, no such topic): retrying
    /// changes nothing, so the step fails at once.
    Refused(String),
}

/// Runs one publish attempt, bounded by `timeout`, and counts its outcome. `what` names
/// the publish in reasons ("AMQP publish to queue 'q'"); `silent` is the reason when the
/// attempt got no answer. Trying again is the step's retry policy's decision.
pub(crate) async fn publish_attempt<Fut>(
    metrics: &Metrics,
    broker: &'static str,
    what: &str,
    silent: &str,
    timeout: Duration,
    attempt: Fut,
) -> Result<(), CallError>
where
    Fut: Future<Output = Result<(), Attempt>>,
{
    let result = match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(Attempt::Refused(why))) => Err(CallError::new(
            CallErrorKind::Refused,
            format!("{what} refused: {why}"),
        )),
        Ok(Err(Attempt::Retry(why))) => Err(CallError::new(
            CallErrorKind::BrokerAway,
            format!("{what} failed: {why}"),
        )),
        Err(_) => Err(CallError::new(
            CallErrorKind::Timeout,
            format!("{what} failed within {} ms: {silent}", timeout.as_millis()),
        )),
    };
    metrics.count_broker_publish(broker, result.is_ok());
    result
}
