//! Brokers: AMQP and Kafka steps are published here, and step responses are consumed
//! here and applied exactly as `POST /stepResponse` applies them.
//!
//! Publishing: one reused connection per broker URL and runtime, a publish counts only
//! once the broker confirmed it (AMQP publisher confirms, Kafka acks from all in-sync
//! replicas). One publish is one attempt of the step's call: a broker that is away fails
//! it with a transient error, which the step's retry policy tries again.
//!
//! Consuming: a message is acknowledged (AMQP) or its offset stored (Kafka) only after
//! the resume it carries is committed in Postgres; a message that can never apply is
//! dead-lettered (AMQP: `<queue>.dead`; Kafka: the `dead_letters` table), counted, and
//! logged once, and the consumer goes on.

pub mod amqp;
pub mod kafka;
pub mod reply;

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

use crate::backoff::Backoff;
use crate::engine::call::{CallError, CallErrorKind};
use crate::metrics::Metrics;
use crate::store::StoreError;
use tokio::time::Instant;
use uuid::Uuid;

/// A step message as both brokers carry it: the step's request as the body, and who it
/// belongs to as properties and headers, so the service can answer and dedupe.
pub struct StepMessage<'a> {
    pub service_request_id: Uuid,
    pub step_id: u32,
    /// The step's request, serialized once for both the record and the message.
    pub body: &'a [u8],
    /// The service request's forwardable headers.
    pub headers: &'a [(String, String)],
    /// How long the publish may take, retries included.
    pub timeout: Duration,
}

impl StepMessage<'_> {
    /// `<service-request-id>:<step-id>`, the same key HTTP steps send as `Idempotency-Key`.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.service_request_id, self.step_id)
    }
}

/// Why one publish attempt did not succeed.
enum Attempt {
    /// The broker is away or dropped the connection: worth retrying.
    Retry(String),
    /// The broker answered, and the answer is no (unroutable, no such topic): retrying
    /// changes nothing, so the step fails at once.
    Refused(String),
}

/// Runs one publish attempt, bounded by `timeout`, and counts its outcome. `what` names
/// the publish in reasons ("AMQP publish to queue 'q'"); `silent` is the reason when the
/// attempt got no answer. Trying again is the step's retry policy's decision.
async fn publish_attempt<Fut>(
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

/// First delay before a consumer reconnects; doubles up to `MAX_RECONNECT_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);

/// Consumers wait this long at most between reconnection attempts.
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(5);

/// Why a consumer session ended.
#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    /// The broker is away, dropped the connection or did not answer (transient).
    #[error("{0}")]
    Away(String),
    /// The broker refused what the consumer needs (a queue it will not declare, a topic it
    /// will not create, a permission): permanent until someone changes the broker.
    #[error("{0}")]
    Refused(String),
    /// Postgres, where positions, locks and dead letters are kept.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ConsumerError {
    pub fn is_transient(&self) -> bool {
        match self {
            ConsumerError::Away(_) => true,
            ConsumerError::Refused(_) => false,
            ConsumerError::Store(e) => e.is_transient(),
        }
    }
}

/// `ConsumerError::Away` from anything that prints.
fn away(e: impl std::fmt::Display) -> ConsumerError {
    ConsumerError::Away(e.to_string())
}

/// Runs consumer sessions until one ends because `stop` fired (Ok), starting a new one
/// with backoff after each that ended because the broker or the database failed (Err).
/// A failure is logged once per distinct message, not once per attempt; a permanent one
/// (the broker refuses) is logged as an error and retried at the longest interval, since
/// only an operator can fix it and the consumer must be there when they do.
async fn keep_consuming<F, Fut>(what: &'static str, mut stop: watch::Receiver<bool>, mut session: F)
where
    F: FnMut(watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = Result<(), ConsumerError>>,
{
    let mut backoff = Backoff::new(FIRST_BACKOFF, MAX_RECONNECT_BACKOFF);
    let mut last_error = String::new();
    loop {
        let began = Instant::now();
        let wait = match session(stop.clone()).await {
            Ok(()) => return,
            Err(e) => {
                let text = e.to_string();
                if text != last_error {
                    if e.is_transient() {
                        tracing::warn!(error = %e, broker = what, "response consumer disconnected; reconnecting");
                    } else {
                        tracing::error!(error = %e, broker = what, "the broker refused the response consumer; retrying");
                    }
                    last_error = text;
                }
                // A session that ran for a while was healthy: start the backoff over.
                if began.elapsed() > Duration::from_secs(30) {
                    backoff.reset();
                }
                if e.is_transient() {
                    backoff.next_delay()
                } else {
                    MAX_RECONNECT_BACKOFF
                }
            }
        };
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
