//! A step response that arrived over a broker: parsed and applied by the engine exactly as
//! `POST /stepResponse` is, with the answer the consumer needs to decide whether to
//! acknowledge the message, dead-letter it, or try it again later.

use std::time::Duration;

use crate::backoff::Backoff;
use crate::ops::respond::{respond, Responded};
use crate::ops::OpError;
use crate::ops::StoreError;
use crate::state::Core;

/// What became of one broker message.
#[derive(Debug, PartialEq, Eq)]
pub enum Handled {
    /// The request resumed; the resume is committed.
    Resumed,
    /// The same answer was applied before (a redelivery): nothing changed.
    Duplicate,
    /// Not a step response at all; it can never apply.
    Malformed(String),
    /// A well-formed response that can never apply: no request waits for it (unknown id,
    /// wrong step), or its request's workflow is gone or no longer validates.
    Rejected(String),
    /// Postgres could not be reached: try the same message again later.
    Unavailable(String),
}

impl Handled {
    /// Whether the message is finished with (acknowledge or dead-letter it).
    pub fn is_final(&self) -> bool {
        !matches!(self, Handled::Unavailable(_))
    }

    /// The metric label for this outcome.
    pub fn label(&self) -> &'static str {
        match self {
            Handled::Resumed => "resumed",
            Handled::Duplicate => "duplicate",
            Handled::Malformed(_) => "malformed",
            Handled::Rejected(_) => "rejected",
            Handled::Unavailable(_) => "unavailable",
        }
    }
}

/// How long a response that came back before its step's pause was written is retried.
/// Brokers deliver answers fast; the pause is written within milliseconds of the send.
const PATIENCE: Duration = Duration::from_secs(10);

/// Applies one message body; `traceparent` is its header of that name, if any.
pub async fn handle(core: &Core, body: &[u8], traceparent: Option<&[u8]>) -> Handled {
    let mut answer = match crate::ops::respond::parse(body) {
        Ok(a) => a,
        Err(e) => return Handled::Malformed(e.to_string()),
    };
    answer.traceparent = traceparent.and_then(crate::telemetry::TraceParent::parse);
    match respond(core, &answer, PATIENCE).await {
        Ok(Responded::Resumed) => Handled::Resumed,
        Ok(Responded::Duplicate) => Handled::Duplicate,
        Err(OpError::Unavailable(m)) => Handled::Unavailable(m.to_string()),
        Err(OpError::Store {
            error: e @ StoreError::Unavailable(_),
            ..
        }) => Handled::Unavailable(e.to_string()),
        // The request named is not there: say which, for the dead-letter's reader.
        Err(OpError::NotFound(_)) => Handled::Rejected(format!("no service request {}", answer.id)),
        Err(OpError::Store { error, .. }) => Handled::Rejected(error.to_string()),
        Err(e) => Handled::Rejected(e.message()),
    }
}

/// Applies one message, retrying while Postgres is away, until it is final or `stop`
/// turns true (then None: leave the message unacknowledged for a redelivery).
pub async fn handle_until_final(
    core: &Core,
    broker: &'static str,
    body: &[u8],
    traceparent: Option<&[u8]>,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Option<Handled> {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        let h = handle(core, body, traceparent).await;
        core.app.metrics.count_broker_reply(broker, h.label());
        if h.is_final() {
            return Some(h);
        }
        if *stop.borrow() {
            return None;
        }
        backoff.wait().await;
    }
}
