//! A step response that arrived over a broker: parsed and applied exactly as
//! `POST /stepResponse` applies it, with the answer the consumer needs to decide whether
//! to acknowledge the message.

use std::time::Duration;

use crate::http::step_response::{self, Applied};
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
    /// A well-formed response no request waits for (unknown id, wrong step).
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

/// Applies one message body.
pub async fn handle(core: &Core, body: &[u8]) -> Handled {
    let (id, step, r) = match step_response::parse(body) {
        Ok(x) => x,
        Err(why) => return Handled::Malformed(why),
    };
    match step_response::apply_when_ready(core, id, step, &r, PATIENCE).await {
        Ok(Applied::Resumed) => Handled::Resumed,
        Ok(Applied::Duplicate) => Handled::Duplicate,
        Ok(Applied::NotWaiting(msg) | Applied::NotYet(msg)) => Handled::Rejected(msg),
        Ok(Applied::Unknown) => Handled::Rejected(format!("no service request {id}")),
        Err(e) => Handled::Unavailable(e.to_string()),
    }
}

/// Applies one message, retrying while Postgres is away, until it is final or `stop`
/// turns true (then None: leave the message unacknowledged for a redelivery).
pub async fn handle_until_final(
    core: &Core,
    broker: &'static str,
    body: &[u8],
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Option<Handled> {
    let mut wait = Duration::from_millis(100);
    loop {
        let h = handle(core, body).await;
        core.app.metrics.count_broker_reply(broker, h.label());
        if h.is_final() {
            return Some(h);
        }
        if *stop.borrow() {
            return None;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(2));
    }
}
