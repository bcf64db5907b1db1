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
use tokio::time::Instant;
use uuid::Uuid;

/// A step message as both brokers carry it: the step's request as the body, and who it
/// belongs to as properties and headers, so the service can answer and dedupe.
pub struct StepMessage<'a> {
    pub service_request_id: Uuid,
    pub step_id: u32,
    pub body: Vec<u8>,
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
