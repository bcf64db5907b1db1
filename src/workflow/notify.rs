//! Notifications (beyond Clamp): a workflow may say where its requests' outcomes go,
//! `"notify": [{"on": ["FAILED", "COMPLETED", "CANCELLED"], "http": {"url", "headers",
//! "timeout_ms", "secret"}}]`, or `amqp` (an AMQP step's `val`: a queue, or an exchange
//! and routing key) or `kafka` (a Kafka step's: a topic) in place of `http`. Each target is
//! checked as that step's `val` is; `secret` (a `{{secret:NAME}}` reference) signs each
//! notification's body (HMAC-SHA256, `X-Clamp-Signature-256: sha256=<hex>`, a header of
//! the request or the message).

use serde_json::Value;

use super::model::{Mode, NotifyTarget as Target, NotifyTo as To, Val};
use super::ValidationError;
use crate::status::RequestStatus;

/// The statuses a notification may be for, and their bits in a request's `notify`.
const FINAL: [(RequestStatus, i16); 3] = [
    (RequestStatus::Completed, 1),
    (RequestStatus::Failed, 2),
    (RequestStatus::Cancelled, 4),
];

/// Most targets one workflow has.
const MAX_TARGETS: usize = 8;

impl Target {
    /// Whether it is told of `status`.
    pub fn wants(&self, status: RequestStatus) -> bool {
        bit(status).is_some_and(|b| self.on & b != 0)
    }
}

/// The bit of a final status.
pub fn bit(status: RequestStatus) -> Option<i16> {
    FINAL.iter().find(|(s, _)| *s == status).map(|(_, b)| *b)
}

/// The statuses any target is told of (None: no target).
pub fn mask(targets: &[Target]) -> Option<i16> {
    let m = targets.iter().fold(0, |m, t| m | t.on);
    (m != 0).then_some(m)
}

fn err<T>(msg: String) -> Result<T, ValidationError> {
    Err(ValidationError(msg))
}

/// The kinds of target, each with the fields of its step's `val` a target may set.
const KINDS: [(&str, Mode, &[&str]); 3] = [
    (
        "http",
        Mode::Http,
        &["url", "headers", "timeout_ms", "secret"],
    ),
    (
        "amqp",
        Mode::Amqp,
        &[
            "connection_url",
            "queue_name",
            "exchange_name",
            "routing_key",
            "content_type",
            "secret",
        ],
    ),
    (
        "kafka",
        Mode::Kafka,
        &["connection_url", "topic_name", "secret"],
    ),
];

/// Checks a definition's `notify`; `step_val` reads a target as a step's `val` of its
/// mode is read (`at` names it in messages).
pub fn compile(
    list: &[Value],
    step_val: impl Fn(Mode, &Value, &str) -> Result<Val, ValidationError>,
) -> Result<Vec<Target>, ValidationError> {
    if list.len() > MAX_TARGETS {
        return err(format!("notify: at most {MAX_TARGETS} targets"));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("notify[{i}]");
        let Some(obj) = t.as_object() else {
            return err(format!("{at}: an object with on and http, amqp or kafka"));
        };
        if let Some(k) = obj
            .keys()
            .find(|k| k.as_str() != "on" && !KINDS.iter().any(|(n, ..)| n == k))
        {
            return err(format!("{at}.{k}: unknown field (on, http, amqp, kafka)"));
        }
        let on = statuses(obj.get("on"), &at)?;
        let mut kinds = KINDS.iter().filter(|(n, ..)| obj.contains_key(*n));
        let (Some(&(kind, mode, fields)), None) = (kinds.next(), kinds.next()) else {
            return err(format!("{at}: one of http, amqp and kafka"));
        };
        let Some(Value::Object(v)) = obj.get(kind) else {
            return err(format!("{at}.{kind}: an object with its target's fields"));
        };
        if let Some(k) = v.keys().find(|k| !fields.contains(&k.as_str())) {
            return err(format!(
                "{at}.{kind}.{k}: unknown field ({})",
                fields.join(", ")
            ));
        }
        let mut val = Value::Object(v.clone());
        if mode == Mode::Http {
            val["method"] = Value::String("POST".into());
        }
        let here = format!("{at}.{kind}");
        let to = match step_val(mode, &val, &here)
            .map_err(|e| ValidationError(e.0.replace(&format!("{here}.val"), &here)))?
        {
            Val::Http(h) => To::Http(h),
            Val::Amqp(a) => To::Amqp(a),
            Val::Kafka(k) => To::Kafka(k),
            _ => unreachable!("a target's mode is HTTP, AMQP or KAFKA"),
        };
        let secret = secret(v.get("secret"), &here)?;
        out.push(Target { on, to, secret });
    }
    Ok(out)
}

/// A target's `on`: its statuses' bits.
fn statuses(on: Option<&Value>, at: &str) -> Result<i16, ValidationError> {
    let mut bits = 0;
    for s in on.and_then(Value::as_array).into_iter().flatten() {
        bits |= s
            .as_str()
            .and_then(RequestStatus::parse)
            .and_then(bit)
            .ok_or_else(|| {
                ValidationError(format!(
                    "{at}.on: {s} is not COMPLETED, FAILED or CANCELLED"
                ))
            })?;
    }
    if bits == 0 {
        return err(format!(
            "{at}.on: one or more of COMPLETED, FAILED and CANCELLED"
        ));
    }
    Ok(bits)
}

/// A target's `secret`: one `{{secret:NAME}}` reference, or none.
fn secret(v: Option<&Value>, at: &str) -> Result<Option<String>, ValidationError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => match crate::secrets::names(s) {
            Ok(n) if n.len() == 1 && s.trim() == format!("{{{{secret:{}}}}}", n[0]) => {
                Ok(Some(s.trim().to_string()))
            }
            _ => err(format!("{at}.secret: one {{{{secret:NAME}}}} reference")),
        },
        Some(_) => err(format!("{at}.secret: one {{{{secret:NAME}}}} reference")),
    }
}
