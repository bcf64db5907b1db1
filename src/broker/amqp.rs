//! The AMQP step-response consumer.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::Confirmation;
use lapin::{Channel, Connection};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::reply::{self, Handled};
use super::{away, ConsumerError};
use crate::state::Core;

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
    let conn = crate::outbound::publish::amqp::connect(&b.amqp_url, &core.app.outbound.amqp)
        .await
        .map_err(|e| ConsumerError::Away(crate::outbound::publish::amqp::connect_error(&e).1))?;
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
    let traceparent = d.properties.headers().as_ref().and_then(|h| {
        h.inner()
            .iter()
            .find(|(k, _)| k.as_str() == "traceparent")
            .and_then(|(_, v)| match v {
                lapin::types::AMQPValue::LongString(s) => Some(s.as_bytes().to_vec()),
                _ => None,
            })
    });
    let Some(h) =
        reply::handle_until_final(core, "amqp", &d.data, traceparent.as_deref(), stop).await
    else {
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
