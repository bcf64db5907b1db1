//! Triggers' broker sources (beyond Clamp): every instance consumes the queue of each
//! AMQP trigger that is not paused (the broker shares the messages among instances:
//! competing consumers), at most `prefetch` messages unacknowledged at a time, and the
//! partitions of each Kafka trigger's topic that no other instance reads
//! (`broker::kafka::consume_trigger`). A message
//! is acknowledged only after what it did is committed (`ops::hooks::take`): its request
//! stored, or it filtered out, or it kept as a dead letter; an outage leaves it
//! unacknowledged and it is delivered again. Each message is its own create, so the
//! creates of a prefetch window go to Postgres in the write buffer's batches.
//!
//! The set of triggers is read every `LOOK_EVERY`: a trigger defined, paused, resumed,
//! replaced or deleted on any instance is followed by every instance within that time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{away, ConsumerError};
use crate::ops::hooks::{self, Delivered};
use crate::ops::OpError;
use crate::state::Core;
use crate::workflow::brokers::AmqpTarget;
use crate::workflow::trigger::{self as def, CompiledTrigger, Source};

/// How often the set of triggers is read.
pub const LOOK_EVERY: Duration = Duration::from_secs(2);

/// How long an unacknowledged message waits before it is handed back after an outage.
const REQUEUE_AFTER: Duration = Duration::from_secs(1);

/// A consuming trigger: the version of its row it runs, and how to stop it.
struct Running {
    updated_at: DateTime<Utc>,
    stop: watch::Sender<bool>,
}

/// Runs a consumer per AMQP trigger until `stop`, following the triggers' table.
pub async fn run(core: Arc<Core>, mut stop: watch::Receiver<bool>) {
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut tasks = JoinSet::new();
    loop {
        match crate::ops::triggers::list(&core).await {
            Ok(all) => {
                let wanted: HashMap<String, (DateTime<Utc>, CompiledTrigger)> = all
                    .into_iter()
                    .filter(|t| !t.stored.paused)
                    .filter_map(|t| {
                        let c = def::validate(&t.stored.definition).ok()?;
                        matches!(c.source, Source::Amqp { .. } | Source::Kafka { .. })
                            .then(|| (c.name.clone(), (t.stored.updated_at, c)))
                    })
                    .collect();
                running.retain(|name, r| {
                    let keep = wanted.get(name).is_some_and(|(at, _)| *at == r.updated_at);
                    if !keep {
                        let _ = r.stop.send(true);
                    }
                    keep
                });
                for (name, (updated_at, t)) in wanted {
                    if running.contains_key(&name) {
                        continue;
                    }
                    let (tx, rx) = watch::channel(false);
                    running.insert(
                        name,
                        Running {
                            updated_at,
                            stop: tx,
                        },
                    );
                    let (core, t) = (core.clone(), Arc::new(t));
                    if matches!(t.source, Source::Kafka { .. }) {
                        tasks.spawn(super::kafka::consume_trigger(core, t, rx));
                    } else {
                        tasks.spawn(consume(core, t, rx));
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e.message(), "triggers not read; trying again"),
        }
        while tasks.try_join_next().is_some() {}
        tokio::select! {
            _ = stop.changed() => break,
            _ = core.app.triggers_changed.notified() => {}
            _ = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
    for r in running.values() {
        let _ = r.stop.send(true);
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
}

/// Consumes one trigger's queue until `stop`, reconnecting with back-off.
async fn consume(core: Arc<Core>, t: Arc<CompiledTrigger>, stop: watch::Receiver<bool>) {
    super::keep_consuming("AMQP trigger", stop, |mut stop| {
        let (core, t) = (core.clone(), t.clone());
        async move { session(&core, &t, &mut stop).await }
    })
    .await
}

/// One connection's worth of consuming; Ok when stopped, Err when the broker went away.
async fn session(
    core: &Arc<Core>,
    t: &Arc<CompiledTrigger>,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), ConsumerError> {
    let Source::Amqp {
        url,
        queue,
        prefetch,
        ..
    } = &t.source
    else {
        return Ok(());
    };
    let resolved = super::with_secrets(core, url)?;
    let target = AmqpTarget::read(&resolved).map_err(ConsumerError::Refused)?;
    let conn = crate::outbound::publish::amqp::connect_checked(
        &target,
        &core.app.outbound.amqp,
        &core.app.config.destinations,
    )
    .await
    .map_err(|e| ConsumerError::Away(crate::outbound::publish::amqp::connect_error(&e).1))?;
    let ch = conn.create_channel().await.map_err(away)?;
    ch.basic_qos(*prefetch, BasicQosOptions::default())
        .await
        .map_err(away)?;
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            format!("clamp-trigger-{}", t.name).as_str().into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| ConsumerError::Refused(format!("cannot consume queue '{queue}': {e}")))?;
    tracing::info!(trigger = %t.name, queue = %queue, "consuming a trigger's queue");
    // At most `prefetch` deliveries are unacknowledged, so at most that many tasks run.
    let mut tasks = JoinSet::new();
    let outcome = loop {
        tokio::select! {
            _ = stop.changed() => break Ok(()),
            d = consumer.next() => match d {
                None => break Err(ConsumerError::Away("the broker ended the consumer".into())),
                Some(Err(err)) => break Err(away(err)),
                Some(Ok(delivery)) => {
                    let (core, t, queue) = (core.clone(), t.clone(), queue.clone());
                    tasks.spawn(async move { handle(&core, &t, &queue, delivery).await });
                }
            }
        }
        while tasks.try_join_next().is_some() {}
    };
    // Messages being created finish (their acks need this connection), briefly; any
    // left unacknowledged are delivered again, and their ids keep them from starting twice.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    let _ = conn.close(200, "trigger stopped".into()).await;
    outcome
}

/// One message: created (or filtered, or dead-lettered), then acknowledged; handed back
/// after a pause when the database or the server could not take it now.
async fn handle(core: &Core, t: &CompiledTrigger, queue: &str, d: lapin::message::Delivery) {
    let id = d
        .properties
        .message_id()
        .as_ref()
        .map(|s| s.as_str().to_string());
    let headers: Vec<(String, String)> = d
        .properties
        .headers()
        .as_ref()
        .map(|h| {
            h.inner()
                .iter()
                .filter_map(|(k, v)| match v {
                    AMQPValue::LongString(s) => Some((
                        k.as_str().to_ascii_lowercase(),
                        String::from_utf8_lossy(s.as_bytes()).into_owned(),
                    )),
                    AMQPValue::ShortString(s) => {
                        Some((k.as_str().to_ascii_lowercase(), s.as_str().to_string()))
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let from = hooks::MessageFrom {
        source: "amqp",
        topic: queue,
        partition: None,
        offset: None,
    };
    match hooks::take(core, t, &from, &d.data, id.as_deref(), &headers).await {
        Ok(Delivered::Started { .. } | Delivered::Filtered | Delivered::DeadLettered(_)) => {
            // If this ack is lost, the redelivery finds its request by its id.
            let _ = d.acker.ack(BasicAckOptions::default()).await;
        }
        Err(e) => {
            if !matches!(e, OpError::Unavailable(_)) {
                tracing::warn!(trigger = %t.name, error = %e.message(), "a trigger's message was not taken; it is delivered again");
            }
            tokio::time::sleep(REQUEUE_AFTER).await;
            let _ = d
                .acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                })
                .await;
        }
    }
}
