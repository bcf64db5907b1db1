//! The Kafka step-response consumer.
//!
//! The consumer keeps its position in Postgres (`kafka_offsets`), written after the
//! resumes of the records before it have committed, and reads from the oldest record the
//! first time: a response sent while no instance ran is applied when one starts. One
//! instance reads a partition at a time, under a Postgres advisory lock held by a
//! dedicated connection, so instances sharing a database share the partitions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::Client;
use rskafka::record::RecordAndOffset;
use tokio::sync::watch;
use tokio::time::Instant;

use super::reply::{self, Handled};
use super::{away, ConsumerError};
use crate::backoff::Backoff;
use crate::ops::consumers::{self, Origin, PartitionLocks};
use crate::ops::StoreError;
use crate::outbound::publish::kafka::{client, murmur2};
use crate::state::Core;

/// The shortest a round of fetches that found nothing may take.
const MIN_EMPTY_ROUND: Duration = Duration::from_millis(20);

/// Records applied concurrently from one fetch.
const APPLY_CONCURRENCY: usize = 64;

/// Consumes step responses from the configured topic until `stop` turns true,
/// reconnecting with backoff whenever the cluster or the database goes away.
pub async fn consume(core: Arc<Core>, stop: watch::Receiver<bool>) {
    super::keep_consuming("Kafka", stop, |mut stop| {
        let core = core.clone();
        async move { session(&core, &mut stop).await }
    })
    .await
}

/// One partition this instance reads.
struct Owned {
    client: PartitionClient,
    next: i64,
}

/// The advisory-lock key of the response topic (its first key; the partition is the second).
fn lock_key(topic: &str) -> i32 {
    murmur2(format!("clamp:kafka:{topic}").as_bytes()) as i32
}

/// One connection to the cluster and the database: takes the partitions no other
/// instance reads and reads them until stopped, or until the cluster, the database or
/// the connection holding the partition locks goes away.
async fn session(core: &Arc<Core>, stop: &mut watch::Receiver<bool>) -> Result<(), ConsumerError> {
    let topic = core.app.config.brokers.kafka_response_topic.as_str();
    let c = connect(core).await?;
    let partitions = ensure_topic(&c, topic).await?;
    // The partition locks live as long as this connection, which closes when `locks` is
    // dropped, however the session ends: that releases them for the next session or
    // another instance.
    let locks = consumers::partition_locks(&core.app).await?;
    let mut owned: BTreeMap<i32, Owned> = BTreeMap::new();
    let mut next_lock_try = Instant::now();
    tracing::info!(
        topic,
        partitions = partitions.len(),
        "consuming step responses over Kafka"
    );
    loop {
        if *stop.borrow() {
            return Ok(());
        }
        if locks.is_lost() {
            return Err(ConsumerError::Store(StoreError::Unavailable(
                "lost the Postgres connection holding the partition locks".into(),
            )));
        }
        if owned.len() < partitions.len() && Instant::now() >= next_lock_try {
            take_free_partitions(core, &c, &locks, topic, &partitions, &mut owned).await?;
            // Another instance holds the rest; look again now and then.
            next_lock_try = Instant::now() + Duration::from_secs(2);
        }
        if owned.is_empty() {
            tokio::select! {
                _ = stop.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            continue;
        }
        let round = Instant::now();
        let progressed = fetch_round(core, topic, &mut owned, stop).await?;
        // A broker that answers an empty fetch at once (not honouring the wait) must not
        // turn this loop into a busy one.
        if !progressed && round.elapsed() < MIN_EMPTY_ROUND {
            tokio::select! {
                _ = stop.changed() => {}
                _ = tokio::time::sleep(MIN_EMPTY_ROUND) => {}
            }
        }
    }
}

/// A client of the configured brokers; an unreachable cluster is `Away`, with the reason.
async fn connect(core: &Core) -> Result<Client, ConsumerError> {
    let b = &core.app.config.brokers;
    client(
        b.kafka_brokers
            .split(',')
            .map(|b| b.trim().to_string())
            .collect(),
        Duration::from_secs(10),
        &core.app.outbound.kafka,
        None,
    )
    .await
    .map_err(|e| {
        let why = crate::outbound::publish::kafka::connect_error(&e).1;
        ConsumerError::Away(format!("{}: {why}", b.kafka_brokers))
    })
}

/// Takes the lock of each partition not read here whose lock is free (no other instance
/// reads it), and starts reading it from its stored position.
async fn take_free_partitions(
    core: &Core,
    c: &Client,
    locks: &PartitionLocks,
    topic: &str,
    partitions: &[i32],
    owned: &mut BTreeMap<i32, Owned>,
) -> Result<(), ConsumerError> {
    for &p in partitions {
        if owned.contains_key(&p) {
            continue;
        }
        if locks.try_lock(lock_key(topic), p).await? {
            let client = c
                .partition_client(topic, p, UnknownTopicHandling::Retry)
                .await
                .map_err(away)?;
            let next = start_offset(core, &client, topic, p).await?;
            tracing::debug!(topic, partition = p, next, "reading a response partition");
            owned.insert(p, Owned { client, next });
        }
    }
    Ok(())
}

/// One fetch from each partition read here, applying what came and then storing the
/// position after it; true when any position moved. Stopping ends the round early.
async fn fetch_round(
    core: &Core,
    topic: &str,
    owned: &mut BTreeMap<i32, Owned>,
    stop: &mut watch::Receiver<bool>,
) -> Result<bool, ConsumerError> {
    // Long-polling: the broker answers as soon as records arrive, or after the wait.
    let wait_ms = (400 / owned.len() as i32).max(20);
    let mut progressed = false;
    for (&p, o) in owned.iter_mut() {
        let Some(records) = fetch(topic, p, o, wait_ms, stop).await? else {
            break;
        };
        let Some(last) = records.last().map(|r| r.offset) else {
            continue;
        };
        apply_records(core, topic, p, &records, stop).await;
        if *stop.borrow() {
            break;
        }
        store_offset(core, topic, p, last + 1).await?;
        o.next = last + 1;
        progressed = true;
    }
    Ok(progressed)
}

/// The records of partition `p` from its position on, waiting up to `wait_ms` for some;
/// None when stopping. Records deleted by retention before they were read are skipped:
/// the position moves to the oldest left, and the fetch answers none.
async fn fetch(
    topic: &str,
    p: i32,
    o: &mut Owned,
    wait_ms: i32,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<Vec<RecordAndOffset>>, ConsumerError> {
    let fetched = tokio::select! {
        _ = stop.changed() => return Ok(None),
        f = o.client.fetch_records(o.next, 1..(1 << 20), wait_ms) => f,
    };
    let records = match fetched {
        Ok((records, high_watermark)) => {
            tracing::trace!(
                topic,
                partition = p,
                from = o.next,
                n = records.len(),
                high_watermark,
                "fetched"
            );
            records
        }
        Err(KafkaError::ServerError {
            protocol_error: ProtocolError::OffsetOutOfRange,
            ..
        }) => {
            let earliest = o
                .client
                .get_offset(OffsetAt::Earliest)
                .await
                .map_err(away)?;
            tracing::warn!(
                topic,
                partition = p,
                from = o.next,
                to = earliest,
                "response records expired unread; skipping ahead"
            );
            o.next = earliest;
            return Ok(Some(Vec::new()));
        }
        Err(e) => return Err(away(e)),
    };
    Ok(Some(
        records.into_iter().filter(|r| r.offset >= o.next).collect(),
    ))
}

/// Applies fetched records of partition `p`, `APPLY_CONCURRENCY` at a time. Stopping
/// with Postgres away leaves the rest unapplied (the caller keeps the position, so they
/// are read again).
async fn apply_records(
    core: &Core,
    topic: &str,
    p: i32,
    records: &[RecordAndOffset],
    stop: &watch::Receiver<bool>,
) {
    for chunk in records.chunks(APPLY_CONCURRENCY) {
        let applied = futures_util::future::join_all(chunk.iter().map(|r| {
            let body = r.record.value.as_deref().unwrap_or_default();
            let traceparent = r.record.headers.get("traceparent").map(Vec::as_slice);
            apply_record(core, topic, p, r.offset, body, traceparent, stop)
        }))
        .await;
        if applied.iter().any(|done| !done) {
            break;
        }
    }
}

/// Applies one record; false when stopping before it could be applied (or, for a record
/// that can never apply, before it was kept in `dead_letters`).
async fn apply_record(
    core: &Core,
    topic: &str,
    partition: i32,
    offset: i64,
    body: &[u8],
    traceparent: Option<&[u8]>,
    stop: &watch::Receiver<bool>,
) -> bool {
    let why = match reply::handle_until_final(core, "kafka", body, traceparent, stop).await {
        None => return false,
        Some(Handled::Malformed(why) | Handled::Rejected(why)) => why,
        Some(_) => return true,
    };
    tracing::warn!(topic, partition, offset, reason = %why, "dead-lettering a step response that cannot apply");
    let origin = Origin {
        source: "kafka",
        topic,
        partition: Some(partition),
        offset: Some(offset),
    };
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        match consumers::dead_letter(&core.pool, &origin, body, &why).await {
            Ok(()) => return true,
            Err(_) if *stop.borrow() => return false,
            Err(e) => {
                tracing::warn!(error = %e, "cannot keep a dead letter yet; retrying");
                backoff.wait().await;
            }
        }
    }
}

/// Creates the response topic when it is missing; returns its partitions.
async fn ensure_topic(c: &Client, topic: &str) -> Result<Vec<i32>, ConsumerError> {
    for _ in 0..10 {
        let topics = c.list_topics().await.map_err(away)?;
        if let Some(t) = topics.into_iter().find(|t| t.name == topic) {
            if !t.partitions.is_empty() {
                return Ok(t.partitions.into_iter().collect());
            }
        } else {
            let created = c
                .controller_client()
                .map_err(away)?
                .create_topic(topic, 1, 1, 5_000)
                .await;
            match created {
                Ok(())
                | Err(KafkaError::ServerError {
                    protocol_error: ProtocolError::TopicAlreadyExists,
                    ..
                }) => {}
                Err(e) => {
                    return Err(ConsumerError::Refused(format!(
                        "cannot create topic '{topic}': {e}"
                    )))
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(ConsumerError::Away(format!(
        "topic '{topic}' did not become available"
    )))
}

async fn start_offset(
    core: &Core,
    client: &PartitionClient,
    topic: &str,
    partition: i32,
) -> Result<i64, ConsumerError> {
    match consumers::offset(&core.pool, topic, partition).await? {
        Some(next) => Ok(next),
        // Never read before: from the oldest record, not the newest (nothing sent while
        // no instance was up is skipped).
        None => client.get_offset(OffsetAt::Earliest).await.map_err(away),
    }
}

async fn store_offset(
    core: &Core,
    topic: &str,
    partition: i32,
    next: i64,
) -> Result<(), ConsumerError> {
    Ok(consumers::set_offset(&core.pool, topic, partition, next).await?)
}
