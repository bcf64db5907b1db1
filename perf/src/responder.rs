//! `clamp-bench amqp-responder`: the service behind an AMQP step, as fast as it can be.
//! It takes each step message from a queue and answers it on the message's `reply_to`
//! with `{serviceRequestId, stepId, response}`, so end-to-end runs of a workflow with an
//! AMQP step measure the orchestrator, not a slow service.

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

/// Serves until the process is stopped; returns an error if the broker goes away.
pub async fn run(url: &str, queue: &str, prefetch: u16) -> anyhow::Result<()> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), durable, FieldTable::default())
        .await?;
    ch.basic_qos(prefetch, BasicQosOptions::default()).await?;
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "clamp-bench-responder".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    eprintln!("amqp-responder: answering step messages from {queue}");
    let mut answered: u64 = 0;
    while let Some(d) = consumer.next().await {
        let d = d?;
        let reply_to = d
            .properties
            .reply_to()
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_default();
        let (id, step) = ids(&d.properties);
        if !reply_to.is_empty() && !id.is_empty() {
            let body = format!(
                r#"{{"serviceRequestId":"{id}","stepId":{step},"response":{{"approved":true}}}}"#
            );
            // Not waiting for a confirm: the harness answers as fast as it can.
            ch.basic_publish(
                "".into(),
                reply_to.as_str().into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default().with_content_type("application/json".into()),
            )
            .await?;
        }
        d.acker.ack(BasicAckOptions::default()).await?;
        answered += 1;
        if answered.is_multiple_of(100_000) {
            eprintln!("amqp-responder: {answered} answered");
        }
    }
    anyhow::bail!("the broker ended the consumer")
}

/// The service-request id and step id from the message headers.
fn ids(p: &BasicProperties) -> (String, i64) {
    let mut id = String::new();
    let mut step = 0;
    if let Some(h) = p.headers() {
        for (k, v) in h.inner() {
            match (k.as_str(), v) {
                ("serviceRequestId", AMQPValue::LongString(s)) => id = s.to_string(),
                ("stepId", AMQPValue::LongLongInt(n)) => step = *n,
                _ => {}
            }
        }
    }
    (id, step)
}
