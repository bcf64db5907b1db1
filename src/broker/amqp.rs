//! AMQP steps (publish with publisher confirms) and the AMQP step-response consumer.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Confirmation;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use parking_lot::Mutex;
use tokio::sync::{watch, OnceCell};
use tokio::task::JoinSet;

use super::reply::{self, Handled};
use super::{away, Attempt, ConsumerError, StepMessage};
use crate::engine::call::CallError;
use crate::metrics::Metrics;
use crate::state::Core;
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
}

async fn open_channel(url: &str) -> Result<(Connection, Channel), lapin::Error> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok((conn, ch))
}

impl AmqpPublisher {
    pub fn new(metrics: Arc<Metrics>) -> AmqpPublisher {
        AmqpPublisher {
            slots: Mutex::new(HashMap::new()),
            metrics,
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
        let ch = match slot.open.get_or_try_init(|| open_channel(url)).await {
            Ok((_, ch)) if ch.status().connected() => ch.clone(),
            Ok(_) => {
                self.forget(url, &slot);
                return Err(Attempt::Retry("the broker closed the channel".into()));
            }
            Err(e) => {
                self.forget(url, &slot);
                return Err(Attempt::Retry(format!("cannot connect: {e}")));
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
    let id = msg.service_request_id.to_string();
    headers.insert(
        "serviceRequestId".into(),
        AMQPValue::LongString(id.as_str().into()),
    );
    headers.insert(
        "stepId".into(),
        AMQPValue::LongLongInt(i64::from(msg.step_id)),
    );
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

/// Consumes step responses from the configured queue until `stop` turns true,
/// reconnecting with backoff whenever the broker goes away.
pub async fn consume(core: Arc<Core>, stop: watch::Receiver<bool>) {
    super::keep_consuming("AMQP", stop, |mut stop| {
        let core = core.clone();
        async move { session(&core, &mut stop).await }
    })
    .await
}

/// One connection's worth of consuming; Ok when stopped, Err when the broker went away.
async fn session(core: &Arc<Core>, stop: &mut watch::Receiver<bool>) -> Result<(), ConsumerError> {
    let b = &core.app.config.brokers;
    let queue = b.amqp_response_queue.as_str();
    let dead = format!("{queue}.dead");
    let conn = Connection::connect(&b.amqp_url, ConnectionProperties::default())
        .await
        .map_err(|e| ConsumerError::Away(format!("cannot connect: {e}")))?;
    let e = away;
    let ch = conn.create_channel().await.map_err(e)?;
    ensure_queue(&conn, queue).await?;
    ensure_queue(&conn, &dead).await?;
    let dead_ch = conn.create_channel().await.map_err(e)?;
    dead_ch
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(e)?;
    ch.basic_qos(b.amqp_prefetch, BasicQosOptions::default())
        .await
        .map_err(e)?;
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(e)?;
    tracing::info!(queue, "consuming step responses over AMQP");
    // At most `prefetch` deliveries are unacknowledged, so at most that many tasks run.
    let mut tasks = JoinSet::new();
    let outcome = loop {
        tokio::select! {
            _ = stop.changed() => break Ok(()),
            d = consumer.next() => match d {
                None => break Err(ConsumerError::Away("the broker ended the consumer".into())),
                Some(Err(err)) => break Err(away(err)),
                Some(Ok(delivery)) => {
                    let (core, dead_ch, dead, stop) =
                        (core.clone(), dead_ch.clone(), dead.clone(), stop.clone());
                    tasks.spawn(async move {
                        handle_delivery(&core, delivery, &dead_ch, &dead, &stop).await
                    });
                }
            }
        }
        while tasks.try_join_next().is_some() {}
    };
    // Let answers being applied finish (their acks need this connection), briefly.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    let _ = conn.close(200, "shutting down".into()).await;
    outcome
}

/// Uses the queue as it is when it exists (whatever arguments or policies it was made
/// with: declaring it again with others would be refused), else declares it durable.
async fn ensure_queue(conn: &Connection, queue: &str) -> Result<(), ConsumerError> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    // A failed passive declare closes its channel, so each check gets its own.
    let probe = conn.create_channel().await.map_err(away)?;
    if probe
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .is_ok()
    {
        let _ = probe.close(200, "OK".into()).await;
        return Ok(());
    }
    let ch = conn.create_channel().await.map_err(away)?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), durable, FieldTable::default())
        .await
        .map_err(|e| ConsumerError::Refused(format!("cannot declare queue '{queue}': {e}")))?;
    let _ = ch.close(200, "OK".into()).await;
    Ok(())
}

async fn handle_delivery(
    core: &Core,
    d: lapin::message::Delivery,
    dead_ch: &Channel,
    dead: &str,
    stop: &watch::Receiver<bool>,
) {
    // None: stopping while Postgres is away; the broker redelivers it later.
    let Some(h) = reply::handle_until_final(core, "amqp", &d.data, stop).await else {
        return;
    };
    match h {
        Handled::Resumed | Handled::Duplicate => {
            // If this ack is lost, the redelivery is a harmless duplicate.
            let _ = d.acker.ack(BasicAckOptions::default()).await;
        }
        Handled::Malformed(why) | Handled::Rejected(why) => {
            tracing::warn!(reason = %why, queue = dead, "dead-lettering a step response that cannot apply");
            let mut headers = d.properties.headers().clone().unwrap_or_default();
            headers.insert(
                "x-clamp-reason".into(),
                AMQPValue::LongString(why.as_str().into()),
            );
            let props = d.properties.clone().with_headers(headers);
            let parked = match dead_ch
                .basic_publish(
                    "".into(),
                    dead.into(),
                    BasicPublishOptions::default(),
                    &d.data,
                    props,
                )
                .await
            {
                Ok(confirm) => matches!(confirm.await, Ok(Confirmation::Ack(_))),
                Err(_) => false,
            };
            if parked {
                let _ = d.acker.ack(BasicAckOptions::default()).await;
            } else {
                // Not parked: give it back so it is not lost; it comes round again.
                let _ = d
                    .acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await;
            }
        }
        Handled::Unavailable(_) => {}
    }
}
