//! The Kafka consumers: of step responses, and of Kafka triggers' topics (beyond Clamp).
//!
//! The consumer keeps its position in Postgres (`kafka_offsets`), written after the
//! resumes of the records before it have committed, and reads from the oldest record the
//! first time: a response sent while no instance ran is applied when one starts. One
//! instance reads a partition at a time, under a Postgres advisory lock held by a
//! dedicated connection, so instances sharing a database share the partitions. A
//! trigger's topic is read the same way (`consume_trigger`), with its own client (its
//! connection's TLS and credentials), its own locks and positions, and each record
//! created as a request (`ops::hooks::take`) before the position moves past it.

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
use crate::ops::hooks;
use crate::ops::StoreError;
use crate::outbound::publish::kafka::{client, murmur2};
use crate::state::Core;
use crate::workflow::trigger::{CompiledTrigger, Source};

/// The shortest a round of fetches that found nothing may take.
const MIN_EMPTY_ROUND: Duration = Duration::from_millis(20);

/// Step responses applied concurrently from one fetch.
const APPLY_CONCURRENCY: usize = 64;

/// A trigger's records created concurrently from one fetch: each create waits for its
/// batch's commit, so the records in flight are what one commit carries.
const TRIGGER_CONCURRENCY: usize = 1024;

/// Consumes step responses from the configured topic until `stop` turns true,
/// reconnecting with backoff whenever the cluster or the database goes away.
pub async fn consume(core: Arc<Core>, stop: watch::Receiver<bool>) {
    super::keep_consuming("Kafka", stop, |mut stop| {
        let core = core.clone();
        async move { session(&core, &mut stop).await }
    })
    .await
}

/// What a session reads, and what becomes of each record.
struct Feed {
    topic: String,
    /// Its positions' name in `kafka_offsets` (the topic itself for step responses).
    positions: String,
    /// The partition locks' first key (the partition is the second).
    lock: i32,
    /// None: step responses; else the trigger whose requests the records start.
    trigger: Option<Arc<CompiledTrigger>>,
}

/// Consumes a Kafka trigger's topic until `stop`, reconnecting with backoff whenever the
/// cluster or the database goes away.
pub async fn consume_trigger(
    core: Arc<Core>,
    t: Arc<CompiledTrigger>,
    stop: watch::Receiver<bool>,
) {
    super::keep_consuming("Kafka trigger", stop, |mut stop| {
        let (core, t) = (core.clone(), t.clone());
        async move { trigger_session(&core, &t, &mut stop).await }
    })
    .await
}

/// One client's worth of a trigger's topic: the trigger's own connection, judged by the
/// destination policy; the topic must exist (it is read, never created).
async fn trigger_session(
    core: &Arc<Core>,
    t: &Arc<CompiledTrigger>,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), ConsumerError> {
    let Source::Kafka {
        connection, topic, ..
    } = &t.source
    else {
        return Ok(());
    };
    let resolved = super::with_secrets(core, connection)?;
    let (c, _relay) = crate::outbound::publish::kafka::judged_client(
        &resolved,
        &core.app.outbound.kafka_steps,
        &core.app.config.destinations,
    )
    .await
    .map_err(|e| match e {
        crate::outbound::publish::Attempt::Refused(why) => ConsumerError::Refused(why),
        crate::outbound::publish::Attempt::Retry(why) => ConsumerError::Away(why),
    })?;
    let partitions = c
        .list_topics()
        .await
        .map_err(away)?
        .into_iter()
        .find(|x| &x.name == topic)
        .map(|x| x.partitions.into_iter().collect::<Vec<i32>>())
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ConsumerError::Refused(format!("topic '{topic}' does not exist")))?;
    let name = format!("trigger:{}:{topic}", t.name);
    let feed = Feed {
        topic: topic.clone(),
        lock: murmur2(format!("clamp:{name}").as_bytes()) as i32,
        positions: name,
        trigger: Some(t.clone()),
    };
    tracing::info!(trigger = %t.name, topic = %topic, partitions = partitions.len(), "consuming a trigger's topic");
    read_partitions(core, &c, &feed, &partitions, stop).await
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
    let feed = Feed {
        topic: topic.to_string(),
        positions: topic.to_string(),
        lock: lock_key(topic),
        trigger: None,
    };
    tracing::info!(
        topic,
        partitions = partitions.len(),
        "consuming step responses over Kafka"
    );
    read_partitions(core, &c, &feed, &partitions, stop).await
}

/// Takes the partitions no other instance reads and reads them until stopped, or until
/// the cluster, the database or the connection holding the partition locks goes away.
async fn read_partitions(
    core: &Arc<Core>,
    c: &Client,
    feed: &Feed,
    partitions: &[i32],
    stop: &mut watch::Receiver<bool>,
) -> Result<(), ConsumerError> {
    // The partition locks live as long as this connection, which closes when `locks` is
    // dropped, however the session ends: that releases them for the next session or
    // another instance.
    let locks = consumers::partition_locks(&core.app).await?;
    locks.join(feed.lock).await?;
    let mut owned: BTreeMap<i32, Owned> = BTreeMap::new();
    let mut next_lock_try = Instant::now();
    loop {
        if *stop.borrow() {
            return Ok(());
        }
        if locks.is_lost() {
            return Err(ConsumerError::Store(StoreError::Unavailable(
                "lost the Postgres connection holding the partition locks".into(),
            )));
        }
        if Instant::now() >= next_lock_try {
            share(core, c, &locks, feed, partitions, &mut owned).await?;
            // Instances come and go: look again now and then.
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
        let progressed = fetch_round(core, feed, &mut owned, stop).await?;
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

/// Reads this instance's share of the partitions: as many as the instances reading the
/// feed divide them into (rounded up). Over it (an instance joined), it gives back the
/// partitions past its share between two rounds, their positions stored; under it, it
/// takes free ones.
async fn share(
    core: &Core,
    c: &Client,
    locks: &PartitionLocks,
    feed: &Feed,
    partitions: &[i32],
    owned: &mut BTreeMap<i32, Owned>,
) -> Result<(), ConsumerError> {
    let members = locks.members(feed.lock).await?.max(1) as usize;
    let fair = partitions.len().div_ceil(members);
    while owned.len() > fair {
        let Some((&p, _)) = owned.iter().next_back() else {
            break;
        };
        owned.remove(&p);
        locks.unlock(feed.lock, p).await?;
        tracing::debug!(topic = %feed.topic, partition = p, "gave a partition back to share them");
    }
    if owned.len() < fair {
        take_free_partitions(core, c, locks, feed, partitions, fair, owned).await?;
    }
    Ok(())
}

/// Takes the lock of partitions not read here whose lock is free (no other instance
/// reads them), up to `fair` in all, and starts reading each from its stored position.
async fn take_free_partitions(
    core: &Core,
    c: &Client,
    locks: &PartitionLocks,
    feed: &Feed,
    partitions: &[i32],
    fair: usize,
    owned: &mut BTreeMap<i32, Owned>,
) -> Result<(), ConsumerError> {
    let topic = feed.topic.as_str();
    for &p in partitions {
        if owned.len() >= fair {
            break;
        }
        if owned.contains_key(&p) {
            continue;
        }
        if locks.try_lock(feed.lock, p).await? {
            let client = c
                .partition_client(topic, p, UnknownTopicHandling::Retry)
                .await
                .map_err(away)?;
            let next = start_offset(core, &client, &feed.positions, p).await?;
            tracing::debug!(topic, partition = p, next, "reading a partition");
            owned.insert(p, Owned { client, next });
        }
    }
    Ok(())
}

/// One fetch from each partition read here, applying what came and then storing the
/// position after it; true when any position moved. Stopping ends the round early.
async fn fetch_round(
    core: &Core,
    feed: &Feed,
    owned: &mut BTreeMap<i32, Owned>,
    stop: &mut watch::Receiver<bool>,
) -> Result<bool, ConsumerError> {
    let topic = feed.topic.as_str();
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
        apply_records(core, feed, p, &records, stop).await;
        if *stop.borrow() {
            break;
        }
        store_offset(core, &feed.positions, p, last + 1).await?;
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
    feed: &Feed,
    p: i32,
    records: &[RecordAndOffset],
    stop: &watch::Receiver<bool>,
) {
    let topic = feed.topic.as_str();
    let at_once = if feed.trigger.is_some() {
        TRIGGER_CONCURRENCY
    } else {
        APPLY_CONCURRENCY
    };
    for chunk in records.chunks(at_once) {
        let applied = futures_util::future::join_all(chunk.iter().map(|r| async move {
            let body = r.record.value.as_deref().unwrap_or_default();
            match &feed.trigger {
                Some(t) => take_record(core, t, topic, p, r, stop).await,
                None => {
                    let traceparent = r.record.headers.get("traceparent").map(Vec::as_slice);
                    apply_record(core, topic, p, r.offset, body, traceparent, stop).await
                }
            }
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

/// A trigger's record, created as a request (or filtered, or kept as a dead letter),
/// tried again while the database or the server cannot take it; false when stopping
/// first. Its topic, partition and offset are its id: read again after a crash, it finds
/// the request it started.
async fn take_record(
    core: &Core,
    t: &CompiledTrigger,
    topic: &str,
    partition: i32,
    r: &RecordAndOffset,
    stop: &watch::Receiver<bool>,
) -> bool {
    let body = r.record.value.as_deref().unwrap_or_default();
    let mut headers: Vec<(String, String)> = r
        .record
        .headers
        .iter()
        .map(|(k, v)| {
            (
                k.to_ascii_lowercase(),
                String::from_utf8_lossy(v).into_owned(),
            )
        })
        .collect();
    if let Some(key) = &r.record.key {
        // The record's key, beside its headers (`headers['kafka-key']`).
        headers.push((
            "kafka-key".into(),
            String::from_utf8_lossy(key).into_owned(),
        ));
    }
    let id = format!("{topic}:{partition}:{}", r.offset);
    let from = hooks::MessageFrom {
        source: "kafka",
        topic,
        partition: Some(partition),
        offset: Some(r.offset),
    };
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        match hooks::take(core, t, &from, body, Some(&id), &headers).await {
            Ok(_) => return true,
            Err(_) if *stop.borrow() => return false,
            Err(e) => {
                tracing::debug!(trigger = %t.name, error = %e.message(), "a trigger's record not taken yet; retrying");
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
    positions: &str,
    partition: i32,
) -> Result<i64, ConsumerError> {
    match consumers::offset(&core.pool, positions, partition).await? {
        Some(next) => Ok(next),
        // Never read before: from the oldest record, not the newest (nothing sent while
        // no instance was up is skipped).
        None => client.get_offset(OffsetAt::Earliest).await.map_err(away),
    }
}

async fn store_offset(
    core: &Core,
    positions: &str,
    partition: i32,
    next: i64,
) -> Result<(), ConsumerError> {
    Ok(consumers::set_offset(&core.pool, positions, partition, next).await?)
}
