//! A webhook's delivery to its trigger (`POST /hooks/{trigger}`, beyond Clamp): no bearer
//! token; the body's HMAC-SHA256 with the trigger's secret is the proof (GitHub's
//! `X-Hub-Signature-256`, Stripe's `Stripe-Signature` with its time checked against
//! replays). A verified delivery is filtered by `when`, shaped by `transform`, labelled,
//! and created as any create is, with an idempotency key of the trigger and the
//! delivery's id, so a redelivery answers the request it started. It is answered after
//! the request's commit.
//!
//! A delivery that can never start a request (its body not JSON, its payload not an
//! object, its workflow gone, a label that cannot be read) is kept in `dead_letters` with
//! the reason and acknowledged (2xx): its sender would deliver it again and again for
//! nothing. Overload and outages are 503 with `Retry-After`: delivered again, it may start.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use uuid::Uuid;

use super::create::{Ask, Outcome};
use super::{OpError, Result};
use crate::state::Core;
use crate::store::dead_letters::Origin;
use crate::workflow::trigger::{self as def, CompiledTrigger, Source, Verify};

/// What a delivery did.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivered {
    /// A request was started (committed), or, for a delivery seen before, the one it
    /// started (`duplicate`).
    Started { id: Uuid, duplicate: bool },
    /// `when` said no: acknowledged, nothing started, nothing kept.
    Filtered,
    /// It can never start a request: kept in `dead_letters` with `reason`, acknowledged.
    DeadLettered(String),
}

/// A delivery as the carrier read it: its headers (lowercase names) and its body.
pub struct Delivery<'a> {
    pub headers: &'a [(String, String)],
    pub body: &'a [u8],
}

impl Delivery<'_> {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Delivers to trigger `name`: 404 unknown (or not a webhook), 503 paused (its sender
/// delivers again), 401 when the signature does not verify (counted in
/// `clamp_trigger_deliveries_total`).
pub async fn deliver(core: &Core, name: &str, d: &Delivery<'_>) -> Result<Delivered> {
    let stored = super::triggers::read(core, name).await?.stored;
    if stored.paused {
        return Err(OpError::Unavailable(
            "this trigger is paused; deliver again later",
        ));
    }
    let t = def::validate(&stored.definition).map_err(|e| {
        OpError::Unprocessable(format!("the stored trigger no longer reads: {}", e.0))
    })?;
    let Source::Webhook {
        verify,
        secret,
        tolerance,
        delivery_header,
    } = &t.source
    else {
        return Err(OpError::NotFound(format!(
            "trigger {name:?} is not a webhook"
        )));
    };
    let key = core
        .app
        .config
        .secrets
        .resolve(secret, crate::secrets::as_is)
        .map_err(|_| OpError::Unavailable("this trigger's secret is not set on this server"))?;
    if let Err(why) = verified(*verify, key.as_bytes(), d, *tolerance, SystemTime::now()) {
        core.app.metrics.trigger_deliveries[WEBHOOK][REFUSED].inc();
        return Err(OpError::Unauthorized(why.into()));
    }
    let id_of = |body: &Value| delivery_id(*verify, delivery_header.as_deref(), d, body);
    let outcome = start(core, &t, d.body, d.headers, id_of).await;
    let from = MessageFrom {
        source: SOURCES[WEBHOOK],
        topic: &t.name,
        partition: None,
        offset: None,
    };
    settle(core, &from, d.body, outcome).await
}

/// Where a broker source's message came from: its source (`"amqp"`, `"kafka"`), its
/// queue or topic, and for Kafka its partition and offset (kept with a dead letter).
pub struct MessageFrom<'a> {
    pub source: &'static str,
    pub topic: &'a str,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
}

/// A message of a broker source (`broker::triggers`, `broker::kafka`): its body, its id
/// (the key of the request it starts; None: none) and its headers.
pub async fn take(
    core: &Core,
    t: &CompiledTrigger,
    from: &MessageFrom<'_>,
    body: &[u8],
    id: Option<&str>,
    headers: &[(String, String)],
) -> Result<Delivered> {
    let id = id.filter(|s| !s.is_empty()).map(str::to_string);
    let outcome = start(core, t, body, headers, |_| id).await;
    settle(core, from, body, outcome).await
}

/// Counts what a message did, and keeps it as a dead letter when it can never start a
/// request (before it is acknowledged: an error here leaves it unacknowledged).
async fn settle(
    core: &Core,
    from: &MessageFrom<'_>,
    body: &[u8],
    outcome: Result<Delivered>,
) -> Result<Delivered> {
    let source = SOURCES
        .iter()
        .position(|s| *s == from.source)
        .unwrap_or(WEBHOOK);
    let counts = &core.app.metrics.trigger_deliveries[source];
    match &outcome {
        Ok(Delivered::Started { duplicate, .. }) => {
            counts[if *duplicate { DUPLICATE } else { STARTED }].inc();
        }
        Ok(Delivered::Filtered) => {
            counts[FILTERED].inc();
        }
        Ok(Delivered::DeadLettered(why)) => {
            counts[DEAD_LETTERED].inc();
            let origin = Origin {
                source: SOURCES[source],
                topic: from.topic,
                partition: from.partition,
                offset: from.offset,
            };
            super::consumers::dead_letter(&core.pool, &origin, body, why)
                .await
                .map_err(|error| OpError::Store {
                    error,
                    doing: "keep a dead letter",
                })?;
        }
        Err(_) => {}
    }
    outcome
}

/// The sources, as `dead_letters` and the metrics name them (`Metrics::trigger_deliveries`'
/// order).
const SOURCES: [&str; 3] = ["webhook", "amqp", "kafka"];
const WEBHOOK: usize = 0;
// A source's counters: started, duplicate, filtered, dead_lettered, refused.
const STARTED: usize = 0;
const DUPLICATE: usize = 1;
const FILTERED: usize = 2;
const DEAD_LETTERED: usize = 3;
const REFUSED: usize = 4;

/// A message to a request (or a filter, or a dead letter); `id_of` gives its id from
/// its parsed body.
async fn start(
    core: &Core,
    t: &CompiledTrigger,
    body: &[u8],
    headers: &[(String, String)],
    id_of: impl FnOnce(&Value) -> Option<String>,
) -> Result<Delivered> {
    let dead = |why: String| Ok(Delivered::DeadLettered(why));
    let body: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return dead(format!("the body is not JSON: {e}")),
    };
    let delivery_id = id_of(&body);
    let message = def::message(body, delivery_id.as_deref().unwrap_or(""), headers);
    if let Some(when) = &t.when {
        match when.eval(&message) {
            Ok(true) => {}
            Ok(false) => return Ok(Delivered::Filtered),
            Err(e) => return dead(format!("when: {}", e.0)),
        }
    }
    let payload = match &t.transform {
        Some(spec) => crate::workflow::transform::shift(spec, &Value::Object(message.clone())),
        None => message["body"].clone(),
    };
    if !payload.is_object() {
        return dead("the payload is not a JSON object (a create's body must be one)".into());
    }
    let mut labels: Vec<Cow<'_, str>> = vec![Cow::Owned(format!("trigger:{}", t.name))];
    for (k, expr) in &t.labels {
        match expr.eval(&message) {
            Ok(v) => labels.push(Cow::Owned(format!("{k}:{v}"))),
            Err(e) => return dead(format!("labels.{k}: {}", e.0)),
        }
    }
    let key = delivery_id.map(|id| idempotency_key(&t.name, &id));
    let version = t.version.map(|v| v.to_string());
    let ask = Ask {
        workflow: &t.workflow,
        version: version.as_deref(),
        key: key.as_deref().map(str::as_bytes),
        labels,
        after_commit: true,
        ..Ask::default()
    };
    let admitted = match super::create::admit(core, &ask).await {
        Ok(a) => a,
        Err(e @ (OpError::NotFound(_) | OpError::BadRequest(_))) => return dead(e.message()),
        Err(e) => return Err(e),
    };
    let body = Bytes::from(payload.to_string());
    match super::create::create(core, admitted, Bytes::from_static(b"[]"), body).await {
        Ok(Outcome::New(id)) | Ok(Outcome::Delayed { id, .. }) => Ok(Delivered::Started {
            id,
            duplicate: false,
        }),
        Ok(Outcome::Existing { id, .. }) => Ok(Delivered::Started {
            id,
            duplicate: true,
        }),
        Err(e @ (OpError::BadRequest(_) | OpError::Unprocessable(_))) => dead(e.message()),
        Err(e) => Err(e),
    }
}

/// The delivery's id: the trigger's header, else GitHub's `X-GitHub-Delivery` or the
/// Stripe event's `id`.
fn delivery_id(
    verify: Verify,
    header: Option<&str>,
    d: &Delivery<'_>,
    body: &Value,
) -> Option<String> {
    let id = match (header, verify) {
        (Some(h), _) => d.header(h).map(str::to_string),
        (None, Verify::Github) => d.header("x-github-delivery").map(str::to_string),
        (None, Verify::Stripe) => body.get("id").and_then(Value::as_str).map(str::to_string),
    };
    id.filter(|s| !s.is_empty())
}

/// The create's `Idempotency-Key` for a delivery: printable and short enough, whatever
/// the id (a long or odd one is kept by its digest).
fn idempotency_key(trigger: &str, id: &str) -> String {
    let key = format!("hook:{trigger}:{id}");
    if key.len() <= super::create::MAX_KEY_LEN
        && key.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
    {
        return key;
    }
    use sha2::Digest;
    let digest = hex::encode(Sha256::digest(id.as_bytes()));
    let trigger: String = trigger.chars().take(128).collect();
    format!("hook:{trigger}:sha256:{digest}")
}

/// Whether `d` carries a valid signature of its body with `key`; the error says what
/// was wrong (the answer's 401 message).
pub(crate) fn verified(
    verify: Verify,
    key: &[u8],
    d: &Delivery<'_>,
    tolerance: Duration,
    now: SystemTime,
) -> std::result::Result<(), &'static str> {
    match verify {
        Verify::Github => {
            let sig = d
                .header("x-hub-signature-256")
                .ok_or("no X-Hub-Signature-256 header")?;
            let hex_sig = sig
                .strip_prefix("sha256=")
                .ok_or("X-Hub-Signature-256 is not sha256=<hex>")?;
            matches(key, &[d.body], hex_sig)
        }
        Verify::Stripe => {
            let sig = d
                .header("stripe-signature")
                .ok_or("no Stripe-Signature header")?;
            let mut t: Option<&str> = None;
            let mut v1: Vec<&str> = Vec::new();
            for part in sig.split(',') {
                match part.trim().split_once('=') {
                    Some(("t", v)) => t = Some(v),
                    Some(("v1", v)) => v1.push(v),
                    _ => {}
                }
            }
            let t = t.ok_or("Stripe-Signature has no t=")?;
            let at: u64 = t
                .parse()
                .map_err(|_| "Stripe-Signature's t= is not a time")?;
            let now_s = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
            if now_s.abs_diff(at) > tolerance.as_secs() {
                return Err("Stripe-Signature's time is outside the tolerance (a replay?)");
            }
            let signed: [&[u8]; 3] = [t.as_bytes(), b".", d.body];
            if v1.iter().any(|s| matches(key, &signed, s).is_ok()) {
                Ok(())
            } else {
                Err("the signature does not match")
            }
        }
    }
}

/// Whether `hex_sig` is the HMAC-SHA256 of `parts` (in a constant time).
fn matches(key: &[u8], parts: &[&[u8]], hex_sig: &str) -> std::result::Result<(), &'static str> {
    let want = hex::decode(hex_sig.trim()).map_err(|_| "the signature is not hex")?;
    let mut mac = Hmac::<Sha256>::new_from_slice(key).map_err(|_| "the key cannot be used")?;
    for p in parts {
        mac.update(p);
    }
    mac.verify_slice(&want)
        .map_err(|_| "the signature does not match")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(key: &[u8], parts: &[&[u8]]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
        for p in parts {
            mac.update(p);
        }
        hex::encode(mac.finalize().into_bytes())
    }

    fn delivery<'a>(headers: &'a [(String, String)], body: &'a [u8]) -> Delivery<'a> {
        Delivery { headers, body }
    }

    const DAY: Duration = Duration::from_secs(300);

    #[test]
    fn a_github_signature_verifies_and_a_changed_body_does_not() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        let h = vec![(
            "x-hub-signature-256".to_string(),
            format!("sha256={}", sign(b"k", &[body])),
        )];
        let now = SystemTime::now();
        assert_eq!(
            verified(Verify::Github, b"k", &delivery(&h, body), DAY, now),
            Ok(())
        );
        assert!(verified(Verify::Github, b"k", &delivery(&h, b"{}"), DAY, now).is_err());
        assert!(verified(Verify::Github, b"other", &delivery(&h, body), DAY, now).is_err());
        assert!(verified(Verify::Github, b"k", &delivery(&[], body), DAY, now).is_err());
    }

    #[test]
    fn a_stripe_signature_verifies_within_its_tolerance_only() {
        let body = br#"{"id":"evt_1"}"#;
        let now = SystemTime::now();
        let t = now.duration_since(UNIX_EPOCH).unwrap().as_secs();
        let header = |t: u64, key: &[u8]| {
            let ts = t.to_string();
            vec![(
                "stripe-signature".to_string(),
                format!(
                    "t={ts},v1={},v0=abc",
                    sign(key, &[ts.as_bytes(), b".", body])
                ),
            )]
        };
        let ok = header(t - 10, b"k");
        assert_eq!(
            verified(Verify::Stripe, b"k", &delivery(&ok, body), DAY, now),
            Ok(())
        );
        let old = header(t - 301, b"k");
        let e = verified(Verify::Stripe, b"k", &delivery(&old, body), DAY, now).unwrap_err();
        assert!(e.contains("tolerance"), "{e}");
        let wrong = header(t, b"other");
        assert!(verified(Verify::Stripe, b"k", &delivery(&wrong, body), DAY, now).is_err());
    }

    #[test]
    fn keys_are_printable_and_bounded_whatever_the_id() {
        assert_eq!(idempotency_key("gh", "abc-1"), "hook:gh:abc-1");
        let long = "x".repeat(400);
        let k = idempotency_key("gh", &long);
        assert!(k.starts_with("hook:gh:sha256:") && k.len() <= super::super::create::MAX_KEY_LEN);
        assert!(idempotency_key("gh", "a\u{7}b").starts_with("hook:gh:sha256:"));
    }
}
