//! Brokers: step responses consumed from AMQP and Kafka and applied exactly as
//! `POST /stepResponse` applies them (publishing steps is the outside world's room:
//! `outbound::publish`).
//!
//! A message is acknowledged (AMQP) or its offset stored (Kafka) only after
//! the resume it carries is committed in Postgres; a message that can never apply is
//! dead-lettered (AMQP: `<queue>.dead`; Kafka: the `dead_letters` table), counted, and
//! logged once, and the consumer goes on.

pub(crate) mod amqp;
pub(crate) mod kafka;
pub(crate) mod reply;
pub(crate) mod triggers;

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

use crate::backoff::Backoff;
use crate::ops::StoreError;
use tokio::time::Instant;

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

/// A trigger's connection string with its `{{secret:…}}` references filled in (each
/// value encoded as a connection string takes it); a secret not set is `Refused`.
fn with_secrets(core: &crate::state::Core, text: &str) -> Result<String, ConsumerError> {
    core.app
        .config
        .secrets
        .resolve(text, crate::workflow::brokers::encode_secret)
        .map_err(|e| ConsumerError::Refused(e.to_string()))
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
