//! Brokers: AMQP and Kafka steps are published here, and step responses are consumed
//! here and applied exactly as `POST /stepResponse` applies them.
//!
//! Publishing: one reused connection per broker URL and runtime, a publish counts only
//! once the broker confirmed it (AMQP publisher confirms, Kafka acks from all in-sync
//! replicas), and a broker that is away is retried with backoff within the step's timeout;
//! after that the step fails with the reason.
//!
//! Consuming: a message is acknowledged (AMQP) or its offset stored (Kafka) only after
//! the resume it carries is committed in Postgres; a message that can never apply is
//! dead-lettered (AMQP) or skipped (Kafka), counted, and logged once.

pub mod amqp;
pub mod kafka;
pub mod reply;

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

use crate::metrics::Metrics;
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

/// Runs publish attempts with backoff until one is confirmed, one is refused, or
/// `timeout` has passed; counts the outcome. `what` names the publish in reasons
/// ("AMQP publish to queue 'q'"); `silent` is the reason when an attempt got no answer.
async fn publish_with_retries<F, Fut>(
    metrics: &Metrics,
    broker: &'static str,
    what: &str,
    silent: &str,
    timeout: Duration,
    mut attempt: F,
) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), Attempt>>,
{
    let deadline = Instant::now() + timeout;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let why = match tokio::time::timeout_at(deadline, attempt()).await {
            Ok(Ok(())) => {
                metrics.count_broker_publish(broker, true);
                return Ok(());
            }
            Ok(Err(Attempt::Refused(why))) => {
                metrics.count_broker_publish(broker, false);
                return Err(format!("{what} refused: {why}"));
            }
            Ok(Err(Attempt::Retry(why))) => why,
            Err(_) => silent.to_string(),
        };
        if Instant::now() + backoff >= deadline {
            metrics.count_broker_publish(broker, false);
            return Err(format!(
                "{what} failed within {} ms: {why}",
                timeout.as_millis()
            ));
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// First retry delay after a broker refused or was away; doubles up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Consumers wait this long at most between reconnection attempts.
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(5);

/// Runs consumer sessions until one ends because `stop` fired (Ok), starting a new one
/// with backoff after each that ended because the broker or the database went away (Err).
/// A failure is logged once per distinct message, not once per attempt.
async fn keep_consuming<F, Fut>(what: &'static str, mut stop: watch::Receiver<bool>, mut session: F)
where
    F: FnMut(watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut backoff = FIRST_BACKOFF;
    let mut last_error = String::new();
    loop {
        let began = Instant::now();
        match session(stop.clone()).await {
            Ok(()) => return,
            Err(e) => {
                if e != last_error {
                    tracing::warn!(error = %e, broker = what, "response consumer disconnected; reconnecting");
                    last_error = e;
                }
            }
        }
        // A session that ran for a while was healthy: start the backoff over.
        if began.elapsed() > Duration::from_secs(30) {
            backoff = FIRST_BACKOFF;
        }
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
    }
}
