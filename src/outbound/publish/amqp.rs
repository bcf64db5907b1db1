//! AMQP steps: publish with publisher confirms.

use std::collections::HashMap;
use std::sync::Arc;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::{AMQPValue, FieldTable};
use lapin::Confirmation;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use parking_lot::Mutex;
use tokio::sync::OnceCell;

use super::{Attempt, StepMessage};
use crate::destinations::{Destinations, DialError};
use crate::metrics::Metrics;
use crate::outbound::call::CallError;
use crate::workflow::brokers::AmqpTarget;
use crate::workflow::AmqpVal;

/// A confirm-mode channel on its own connection, opened on first use.
#[derive(Default)]
struct Slot {
    open: OnceCell<(Connection, Channel)>,
}

/// Publishes AMQP steps: one connection and confirm-mode channel per broker URL, reused
/// by every step of this runtime and replaced when the broker drops it.
pub struct AmqpPublisher {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    metrics: Arc<Metrics>,
    tls: OwnedTLSConfig,
    /// Where steps may call: every connection a step's broker needs dials only what it
    /// allows.
    policy: Arc<Destinations>,
}

/// Connects to the server's own broker at `url` (`amqp://`, or `amqps://` with `tls`'s
/// extra CA): the response consumer's, which the operator configured, not a step's.
pub(crate) async fn connect(url: &str, tls: &OwnedTLSConfig) -> Result<Connection, lapin::Error> {
    Connection::connect_with_config(
        url,
        ConnectionProperties::default(),
        tls.clone(),
        lapin::runtime::default_runtime()?,
    )
    .await
}

/// Why a connection could not be made, with the failed TLS check where there was one.
pub(crate) fn connect_error(e: &lapin::Error) -> (bool, String) {
    match crate::tls::describe(e) {
        Some(tls) => (true, format!("TLS handshake failed: {tls}")),
        None => (false, format!("cannot connect: {e}")),
    }
}

/// Connects a step to its broker: the host the URL's one reading gives
/// (`workflow::brokers`), dialled at an address the policy judged, so that neither a
/// second reading of the URL nor a second resolution of the name can reach another.
/// Every reconnection the client makes goes through the same dial.
pub(crate) async fn connect_checked(
    target: &AmqpTarget,
    tls: &OwnedTLSConfig,
    policy: &Arc<Destinations>,
) -> Result<Connection, lapin::Error> {
    let (host, port, secure) = (
        target.endpoint.host.as_str().into_owned(),
        target.endpoint.port,
        target.tls,
    );
    let (tls, policy) = (tls.clone(), policy.clone());
    Connection::connector(
        target.uri.clone(),
        lapin::runtime::default_runtime()?,
        async move |_uri, runtime| {
            let addrs = policy
                .addrs(&host, port)
                .await
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))?;
            let stream = lapin::tcp::AsyncTcpStream::connect(&runtime, addrs).await?;
            Ok(if secure {
                stream.into_tls(&host, tls.as_ref()).await?
            } else {
                stream
            })
        },
        ConnectionProperties::default(),
    )
    .await
}

async fn open_channel(
    url: &str,
    tls: &OwnedTLSConfig,
    policy: &Arc<Destinations>,
) -> Result<(Connection, Channel), Attempt> {
    let target = AmqpTarget::read(url).map_err(Attempt::Refused)?;
    let conn = match connect_checked(&target, tls, policy).await {
        Ok(c) => c,
        Err(e) => return Err(refusal(&e).unwrap_or_else(|| attempt_error(&e))),
    };
    let confirmed = async {
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        Ok::<_, lapin::Error>(ch)
    };
    match confirmed.await {
        Ok(ch) => Ok((conn, ch)),
        Err(e) => Err(Attempt::Retry(e.to_string())),
    }
}

/// A dial the policy refused: permanent, said as the policy says it.
fn refusal(e: &lapin::Error) -> Option<Attempt> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        // The dial's error travels inside an io::Error, whose `source` skips it.
        let inner = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|i| i.downcast_ref::<DialError>());
        if let Some(DialError::Refused(why)) = inner {
            return Some(Attempt::Refused(why.to_string()));
        }
        source = err.source();
    }
    None
}

/// A failed connection: a failed certificate check is permanent (it fails the same way
/// next time), anything else transient.
fn attempt_error(e: &lapin::Error) -> Attempt {
    match connect_error(e) {
        (true, why) => Attempt::Refused(why),
        (false, why) => Attempt::Retry(why),
    }
}

impl AmqpPublisher {
    pub fn new(
        metrics: Arc<Metrics>,
        tls: OwnedTLSConfig,
        policy: Arc<Destinations>,
    ) -> AmqpPublisher {
        AmqpPublisher {
            slots: Mutex::new(HashMap::new()),
            metrics,
            tls,
            policy,
        }
    }

    /// Publishes a step's request and waits for the broker's confirm (one attempt,
    /// bounded by `msg.timeout`).
    pub async fn publish(&self, val: &AmqpVal, msg: &StepMessage<'_>) -> Result<(), CallError> {
        let (exchange, routing_key) = if val.exchange_name.is_empty() {
            ("", val.queue_name.as_str())
        } else {
            (val.exchange_name.as_str(), val.routing_key.as_str())
        };
        let target = if exchange.is_empty() {
            format!("queue '{routing_key}'")
        } else {
            format!("exchange '{exchange}' (routing key '{routing_key}')")
        };
        let props = properties(val, msg);
        super::publish_attempt(
            &self.metrics,
            "amqp",
            &format!("AMQP publish to {target}"),
            "no confirm from the broker",
            msg.timeout,
            self.publish_once(&val.connection_url, exchange, routing_key, msg.body, &props),
        )
        .await
    }

    async fn publish_once(
        &self,
        url: &str,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: &BasicProperties,
    ) -> Result<(), Attempt> {
        let slot = self
            .slots
            .lock()
            .entry(url.to_string())
            .or_default()
            .clone();
        let ch = match slot
            .open
            .get_or_try_init(|| open_channel(url, &self.tls, &self.policy))
            .await
        {
            Ok((_, ch)) if ch.status().connected() => ch.clone(),
            Ok(_) => {
                self.forget(url, &slot);
                return Err(Attempt::Retry("the broker closed the channel".into()));
            }
            Err(e) => {
                self.forget(url, &slot);
                return Err(e);
            }
        };
        // `mandatory`: a message no queue takes comes back instead of vanishing.
        let opts = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let confirm = match ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                opts,
                body,
                props.clone(),
            )
            .await
        {
            Ok(c) => c,
            Err(e) => {
                self.forget(url, &slot);
                return Err(Attempt::Retry(e.to_string()));
            }
        };
        match confirm.await {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) => Err(Attempt::Refused(format!(
                "unroutable ({} {})",
                returned.reply_code, returned.reply_text
            ))),
            Ok(Confirmation::Nack(_)) => Err(Attempt::Retry("the broker nacked it".into())),
            Ok(Confirmation::NotRequested) => Ok(()),
            Err(e) => {
                self.forget(url, &slot);
                Err(Attempt::Retry(e.to_string()))
            }
        }
    }

    /// Drops a broken connection so the next publish opens a new one.
    fn forget(&self, url: &str, slot: &Arc<Slot>) {
        let mut slots = self.slots.lock();
        if slots.get(url).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            slots.remove(url);
        }
    }
}

/// The message properties: JSON, persistent, the reply queue, and whose step it is.
fn properties(val: &AmqpVal, msg: &StepMessage<'_>) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (k, v) in msg.headers {
        headers.insert(k.as_str().into(), AMQPValue::LongString(v.as_str().into()));
    }
    for (k, v) in msg.trace_headers() {
        headers.insert(k.into(), AMQPValue::LongString(v.into()));
    }
    let id = msg.service_request_id.to_string();
    headers.insert(
        "serviceRequestId".into(),
        AMQPValue::LongString(id.as_str().into()),
    );
    let (of, n) = msg.of_header();
    headers.insert(of.into(), AMQPValue::LongLongInt(n));
    let mut props = BasicProperties::default()
        .with_content_type(val.content_type.as_str().into())
        .with_delivery_mode(2)
        .with_correlation_id(id.as_str().into())
        .with_message_id(msg.idempotency_key().as_str().into())
        .with_app_id("clamp".into())
        .with_headers(headers);
    if !val.reply_to.is_empty() {
        props = props.with_reply_to(val.reply_to.as_str().into());
    }
    props
}
