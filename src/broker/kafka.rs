//! Kafka steps (produce, acknowledged by the broker) and the Kafka step-response consumer.
//!
//! The consumer keeps its position in Postgres (`kafka_offsets`), written after the
//! resumes of the records before it have committed, and reads from the oldest record the
//! first time: a response sent while no instance ran is applied when one starts. One
//! instance reads a partition at a time, under a Postgres advisory lock held by a
//! dedicated connection, so instances sharing a database share the partitions.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;
use rskafka::BackoffConfig;
use tokio::sync::{watch, OnceCell};
use tokio::time::Instant;

use super::reply::{self, Handled};
use super::{away, Attempt, ConsumerError, StepMessage};
use crate::backoff::Backoff;
use crate::engine::call::CallError;
use crate::metrics::Metrics;
use crate::state::Core;
use crate::store::{dead_letters, kafka_offsets, StoreError};
use crate::workflow::KafkaVal;

/// A topic's partitions, ready to produce to.
struct TopicWriter {
    partitions: Vec<PartitionClient>,
}

type Cell<T> = Arc<OnceCell<Arc<T>>>;

/// Produces Kafka steps: one client per bootstrap list and one writer per topic, reused
/// by every step of this runtime and rebuilt after a failure.
pub struct KafkaProducer {
    topics: Mutex<HashMap<(String, String), Cell<TopicWriter>>>,
    metrics: Arc<Metrics>,
}

/// Builds a client that gives up on an unreachable cluster instead of retrying forever.
async fn client(brokers: &str, deadline: Duration) -> Result<Client, KafkaError> {
    ClientBuilder::new(brokers.split(',').map(|b| b.trim().to_string()).collect())
        .client_id("clamp")
        .backoff_config(BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
            deadline: Some(deadline),
        })
        .build()
        .await
}

async fn open_topic(brokers: &str, topic: &str) -> Result<TopicWriter, Attempt> {
    let retry = |e: KafkaError| Attempt::Retry(e.to_string());
    let c = client(brokers, Duration::from_secs(5))
        .await
        .map_err(|e| Attempt::Retry(format!("cannot connect: {e}")))?;
    let topics = c.list_topics().await.map_err(retry)?;
    let Some(t) = topics.into_iter().find(|t| t.name == topic) else {
        return Err(Attempt::Refused(format!("topic '{topic}' does not exist")));
    };
    let mut partitions = Vec::with_capacity(t.partitions.len());
    for p in t.partitions {
        partitions.push(
            c.partition_client(topic, p, UnknownTopicHandling::Retry)
                .await
                .map_err(retry)?,
        );
    }
    if partitions.is_empty() {
        return Err(Attempt::Refused(format!(
            "topic '{topic}' has no partitions"
        )));
    }
    Ok(TopicWriter { partitions })
}

impl KafkaProducer {
    pub fn new(metrics: Arc<Metrics>) -> KafkaProducer {
        KafkaProducer {
            topics: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Produces a step's request keyed by its service request id and waits for the
    /// broker's acknowledgement (one attempt, bounded by `msg.timeout`).
    pub async fn produce(&self, val: &KafkaVal, msg: &StepMessage<'_>) -> Result<(), CallError> {
        let key = msg.service_request_id.to_string().into_bytes();
        super::publish_attempt(
            &self.metrics,
            "kafka",
            &format!("Kafka produce to topic '{}'", val.topic_name),
            "no acknowledgement from the broker",
            msg.timeout,
            self.produce_once(val, msg, &key),
        )
        .await
    }

    async fn produce_once(
        &self,
        val: &KafkaVal,
        msg: &StepMessage<'_>,
        key: &[u8],
    ) -> Result<(), Attempt> {
        let slot_key = (val.connection_url.clone(), val.topic_name.clone());
        let slot = self
            .topics
            .lock()
            .entry(slot_key.clone())
            .or_default()
            .clone();
        let writer = match slot
            .get_or_try_init(|| async {
                open_topic(&val.connection_url, &val.topic_name)
                    .await
                    .map(Arc::new)
            })
            .await
        {
            Ok(w) => w.clone(),
            Err(e) => {
                self.forget(&slot_key, &slot);
                return Err(e);
            }
        };
        let p = partition_for(key, writer.partitions.len());
        let record = record(val, msg, key);
        match writer.partitions[p]
            .produce(vec![record], Compression::NoCompression)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                self.forget(&slot_key, &slot);
                Err(Attempt::Retry(e.to_string()))
            }
        }
    }

    fn forget(&self, key: &(String, String), slot: &Cell<TopicWriter>) {
        let mut topics = self.topics.lock();
        if topics.get(key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            topics.remove(key);
        }
    }
}

fn record(val: &KafkaVal, msg: &StepMessage<'_>, key: &[u8]) -> Record {
    let mut headers = BTreeMap::new();
    for (k, v) in msg.headers {
        headers.insert(k.clone(), v.clone().into_bytes());
    }
    headers.insert("serviceRequestId".into(), key.to_vec());
    headers.insert("stepId".into(), msg.step_id.to_string().into_bytes());
    headers.insert("Idempotency-Key".into(), msg.idempotency_key().into_bytes());
    if !val.reply_to.is_empty() {
        headers.insert("reply_to".into(), val.reply_to.clone().into_bytes());
    }
    Record {
        key: Some(key.to_vec()),
        value: Some(msg.body.to_vec()),
        headers,
        timestamp: chrono::Utc::now(),
    }
}

/// The partition Kafka's default partitioner picks for a key (murmur2), so records of one
/// service request land where other clients would put them too.
fn partition_for(key: &[u8], n: usize) -> usize {
    (murmur2(key) & 0x7fff_ffff) as usize % n
}

/// Kafka's murmur2 (seed 0x9747b28c), as its Java client computes it.
fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

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

async fn session(core: &Arc<Core>, stop: &mut watch::Receiver<bool>) -> Result<(), ConsumerError> {
    let b = &core.app.config.brokers;
    let topic = b.kafka_response_topic.as_str();
    let c = client(&b.kafka_brokers, Duration::from_secs(10))
        .await
        .map_err(|e| ConsumerError::Away(format!("cannot connect to {}: {e}", b.kafka_brokers)))?;
    let partitions = ensure_topic(&c, topic).await?;
    // The partition locks live as long as this connection.
    let (locks, lock_conn) =
        tokio_postgres::connect(&core.app.config.database_url, tokio_postgres::NoTls)
            .await
            .map_err(StoreError::from)?;
    // The connection closes when `locks` is dropped, however the session ends, which
    // releases the locks for the next session or another instance.
    let lock_task = tokio::spawn(lock_conn);
    let mut owned: BTreeMap<i32, Owned> = BTreeMap::new();
    let mut next_lock_try = Instant::now();
    tracing::info!(
        topic,
        partitions = partitions.len(),
        "consuming step responses over Kafka"
    );
    let outcome = loop {
        if *stop.borrow() {
            break Ok(());
        }
        if lock_task.is_finished() {
            break Err(ConsumerError::Store(StoreError::Unavailable(
                "lost the Postgres connection holding the partition locks".into(),
            )));
        }
        if owned.len() < partitions.len() && Instant::now() >= next_lock_try {
            for &p in &partitions {
                if owned.contains_key(&p) {
                    continue;
                }
                let got: bool = locks
                    .query_one(
                        "SELECT pg_try_advisory_lock($1, $2)",
                        &[&lock_key(topic), &p],
                    )
                    .await
                    .map_err(StoreError::from)?
                    .get(0);
                if got {
                    let client = c
                        .partition_client(topic, p, UnknownTopicHandling::Retry)
                        .await
                        .map_err(away)?;
                    let next = start_offset(core, &client, topic, p).await?;
                    tracing::debug!(topic, partition = p, next, "reading a response partition");
                    owned.insert(p, Owned { client, next });
                }
            }
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
        // Long-polling: the broker answers as soon as records arrive, or after the wait.
        let wait_ms = (400 / owned.len() as i32).max(20);
        let round = Instant::now();
        let mut progressed = false;
        for (&p, o) in owned.iter_mut() {
            let fetched = tokio::select! {
                _ = stop.changed() => break,
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
                    // Records were deleted by retention before they were read.
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
                    continue;
                }
                Err(e) => return Err(away(e)),
            };
            let records: Vec<_> = records.into_iter().filter(|r| r.offset >= o.next).collect();
            let Some(last) = records.last().map(|r| r.offset) else {
                continue;
            };
            for chunk in records.chunks(APPLY_CONCURRENCY) {
                let applied = futures_util::future::join_all(chunk.iter().map(|r| {
                    let body = r.record.value.as_deref().unwrap_or_default();
                    apply_record(core, topic, p, r.offset, body, stop)
                }))
                .await;
                if applied.iter().any(|done| !done) {
                    // Stopping with Postgres away: keep the position; they are read again.
                    break;
                }
            }
            if *stop.borrow() {
                break;
            }
            store_offset(core, topic, p, last + 1).await?;
            o.next = last + 1;
            progressed = true;
        }
        // A broker that answers an empty fetch at once (not honouring the wait) must not
        // turn this loop into a busy one.
        if !progressed && round.elapsed() < MIN_EMPTY_ROUND {
            tokio::select! {
                _ = stop.changed() => {}
                _ = tokio::time::sleep(MIN_EMPTY_ROUND) => {}
            }
        }
    };
    outcome
}

/// Applies one record; false when stopping before it could be applied (or, for a record
/// that can never apply, before it was kept in `dead_letters`).
async fn apply_record(
    core: &Core,
    topic: &str,
    partition: i32,
    offset: i64,
    body: &[u8],
    stop: &watch::Receiver<bool>,
) -> bool {
    let why = match reply::handle_until_final(core, "kafka", body, stop).await {
        None => return false,
        Some(Handled::Malformed(why) | Handled::Rejected(why)) => why,
        Some(_) => return true,
    };
    tracing::warn!(topic, partition, offset, reason = %why, "dead-lettering a step response that cannot apply");
    let origin = dead_letters::Origin {
        source: "kafka",
        topic,
        partition: Some(partition),
        offset: Some(offset),
    };
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        let kept = async {
            let conn = core.pool.get().await.map_err(StoreError::from)?;
            dead_letters::insert(&conn, &origin, body, &why).await
        }
        .await;
        match kept {
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
    let conn = core.pool.get().await.map_err(StoreError::from)?;
    match kafka_offsets::get(&conn, topic, partition).await? {
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
    let conn = core.pool.get().await.map_err(StoreError::from)?;
    kafka_offsets::set(&conn, topic, partition, next).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_matches_kafkas_java_client() {
        // Values from Kafka's own UtilsTest.testMurmur2.
        assert_eq!(murmur2(b"21") as i32, -973932308);
        assert_eq!(murmur2(b"foobar") as i32, -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string") as i32, -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string") as i32, -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") as i32,
            -58897971
        );
        assert_eq!(murmur2(b"abc") as i32, 479470107);
    }

    #[test]
    fn partitions_spread_keys() {
        let mut seen = [0usize; 4];
        for i in 0..1000 {
            seen[partition_for(format!("key-{i}").as_bytes(), 4)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 150), "{seen:?}");
    }
}
