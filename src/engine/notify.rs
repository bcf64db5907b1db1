//! Delivering notifications (beyond Clamp): one task per instance takes the due rows of
//! the outbox (`store::notifications`), each the oldest pending of its request so a
//! request's notifications go out in order, and tells each to its workflow's targets that
//! want its status (an HTTP POST, an AMQP publish confirmed, a Kafka record acknowledged),
//! with `Idempotency-Key: notification:<id>` and, for a target with a secret,
//! `X-Clamp-Signature-256` over the body. All targets answered 2xx: delivered;
//! else tried again with back-off, up to `MAX_ATTEMPTS`, then failed and kept as a dead
//! letter. At least once: a delivery whose outcome was not stored (a crash, an outage) is
//! made again once its hold runs out, with the same id.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use hyper::header::{HeaderName, HeaderValue};
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::sync::watch;

use super::Executor;
use crate::outbound::doc::Doc;
use crate::outbound::publish::{Of, StepMessage};
use crate::store::dead_letters::Origin;
use crate::store::notifications::{self as store, Due};
use crate::store::StoreError;
use crate::workflow::model::NotifyTo as To;

/// Notifications taken at a time (delivered at once, their outcomes stored together).
const BATCH: i64 = 256;
/// How long a taken notification is held before another deliverer may take it.
const HOLD: Duration = Duration::from_secs(30);
/// How often the outbox is looked at when it had nothing due.
const LOOK_EVERY: Duration = Duration::from_millis(200);
/// Attempts before a notification fails.
pub const MAX_ATTEMPTS: i32 = 12;
/// The first pause before another attempt; it doubles up to `MAX_PAUSE`.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// Delivers due notifications until `stop`.
pub async fn run(exec: Arc<Executor>, mut stop: watch::Receiver<bool>) {
    loop {
        let taken = match round(&exec).await {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "notifications not delivered now; trying again");
                0
            }
        };
        if *stop.borrow() {
            return;
        }
        if taken < BATCH as usize {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(LOOK_EVERY) => {}
            }
        }
    }
}

/// Takes the due notifications, delivers them at once, and stores what came of them:
/// the delivered ones in one statement (a round of a busy outbox costs two statements,
/// not one per notification), the others each with its next attempt or its failure.
/// How many it took.
async fn round(exec: &Executor) -> Result<usize, StoreError> {
    let due = {
        let conn = exec.looks.get().await?;
        store::claim(&conn, BATCH, HOLD.as_secs_f64() * 1000.0).await?
    };
    let n = due.len();
    let outcomes = futures_util::future::join_all(due.iter().map(|d| send(exec, d))).await;
    let delivered: Vec<i64> = due
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| o.is_ok())
        .map(|(d, _)| d.id)
        .collect();
    let m = &exec.app.metrics;
    let conn = exec.pool.get().await?;
    if !delivered.is_empty() {
        // Not stored: each comes due again after its hold, and is sent again, same id.
        store::delivered(&conn, &delivered).await?;
        m.notifications[0].inc_by(delivered.len() as u64);
    }
    for (d, o) in due.iter().zip(outcomes) {
        if let Err(Undelivered(why)) = o {
            if let Err(e) = not_taken(&conn, d, &why).await {
                tracing::debug!(notification = d.id, error = %e, "a notification's outcome was not stored; it is sent again");
                continue;
            }
            m.notifications[if d.attempts >= MAX_ATTEMPTS { 2 } else { 1 }].inc();
        }
    }
    Ok(n)
}

/// Stores a delivery that was not taken: another attempt later, or, its attempts used
/// up, failed and kept as a dead letter.
async fn not_taken(conn: &crate::store::PgConn, d: &Due, why: &str) -> Result<(), StoreError> {
    if d.attempts < MAX_ATTEMPTS {
        return store::again(conn, d.id, pause(d.attempts).as_secs_f64() * 1000.0, why).await;
    }
    store::failed(conn, d.id, why).await?;
    let origin = Origin {
        source: "notification",
        topic: &d.workflow_name,
        partition: None,
        offset: Some(d.id),
    };
    crate::store::dead_letters::insert(conn, &origin, body(d).as_bytes(), why).await
}

/// The pause after attempt `n` failed.
fn pause(n: i32) -> Duration {
    let factor = 1u32 << n.clamp(1, 16).saturating_sub(1);
    (FIRST_PAUSE * factor).min(MAX_PAUSE)
}

/// The notification's body: what happened to which request.
fn body(d: &Due) -> String {
    let response = d
        .response
        .as_deref()
        .and_then(|r| serde_json::from_str::<Value>(r).ok())
        .unwrap_or(Value::Null);
    json!({
        "id": d.id.to_string(),
        "serviceRequestId": d.service_request_id.to_string(),
        "workflow": d.workflow_name,
        "version": d.workflow_version,
        "status": d.status.as_str(),
        "reason": d.reason.as_deref().unwrap_or(""),
        "labels": d.labels.clone().unwrap_or_default(),
        "response": response,
        "createdAt": d.created_at,
        "finishedAt": d.finished_at,
    })
    .to_string()
}

/// Why a notification was not taken (kept as its last error).
struct Undelivered(String);

/// Tells `d` to each target of its workflow that wants its status; Err says why one did
/// not take it.
async fn send(exec: &Executor, d: &Due) -> Result<(), Undelivered> {
    let wf = exec
        .app
        .workflows
        .get_or_load_version(
            &exec.pool,
            &d.workflow_name,
            d.workflow_version.max(1) as u32,
        )
        .await
        .map_err(|e| Undelivered(format!("its workflow cannot be read now: {e}")))?
        .ok_or_else(|| Undelivered("its workflow version is gone".into()))?;
    let text = body(d);
    let key = format!("notification:{}", d.id);
    for t in wf.notify.iter().filter(|t| t.wants(d.status)) {
        let signature = match &t.secret {
            Some(secret) => Some(sign(exec, secret, &text)?),
            None => None,
        };
        let told = match &t.to {
            To::Http(val) => {
                let extra: Vec<(HeaderName, HeaderValue)> = signature
                    .iter()
                    .map(|sig| {
                        (
                            HeaderName::from_static(SIGNATURE),
                            HeaderValue::from_str(sig).expect("hex"),
                        )
                    })
                    .collect();
                let key = HeaderValue::from_str(&key).expect("digits");
                let doc = Doc::trusted(text.clone());
                exec.http.call(val, &doc, &extra, key, None).await.map(drop)
            }
            To::Amqp(val) => {
                let headers = signature.map(|s| (SIGNATURE.to_string(), s));
                let msg = message(exec, d, &text, headers.as_slice());
                super::step_io::publish_amqp(exec, val, &msg).await
            }
            To::Kafka(val) => {
                let headers = signature.map(|s| (SIGNATURE.to_string(), s));
                let msg = message(exec, d, &text, headers.as_slice());
                super::step_io::produce_kafka(exec, val, &msg).await
            }
        };
        told.map_err(|e| Undelivered(e.message))?;
    }
    Ok(())
}

/// The header a signed notification carries its signature in.
const SIGNATURE: &str = "x-clamp-signature-256";

/// `sha256=<hex>`: the HMAC-SHA256 of `text` with the secret `secret` names.
fn sign(exec: &Executor, secret: &str, text: &str) -> Result<String, Undelivered> {
    let k = exec
        .app
        .config
        .secrets
        .resolve(secret, crate::secrets::as_is)
        .map_err(|e| Undelivered(e.to_string()))?;
    let mut mac = Hmac::<Sha256>::new_from_slice(k.as_bytes()).expect("any key length");
    mac.update(text.as_bytes());
    Ok(format!(
        "sha256={}",
        hex::encode(mac.finalize().into_bytes())
    ))
}

/// The notification as a broker message: keyed by its request (Kafka keeps a request's
/// notifications on one partition, in order), `notificationId` and `Idempotency-Key`
/// (`notification:<id>`) among its headers.
fn message<'a>(
    exec: &Executor,
    d: &Due,
    text: &'a str,
    headers: &'a [(String, String)],
) -> StepMessage<'a> {
    StepMessage {
        service_request_id: d.service_request_id,
        of: Of::Notification(d.id),
        body: text.as_bytes(),
        headers,
        traceparent: None,
        tracestate: None,
        timeout: exec.app.config.http.timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_a_minute() {
        assert_eq!(pause(1), Duration::from_millis(500));
        assert_eq!(pause(2), Duration::from_secs(1));
        assert_eq!(pause(4), Duration::from_secs(4));
        assert_eq!(pause(12), MAX_PAUSE);
    }
}
