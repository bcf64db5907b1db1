//! Kafka steps: produce, acknowledged by the broker, partitioned as Kafka's Java client
//! partitions (murmur2 of the key).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rskafka::client::error::Error as KafkaError;
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;
use rskafka::BackoffConfig;
use tokio::sync::OnceCell;

use super::{Attempt, StepMessage};
use crate::destinations::{Destinations, Relay};
use crate::metrics::Metrics;
use crate::outbound::call::CallError;
use crate::outbound::tls::{KafkaSteps, KafkaTransport};
use crate::workflow::brokers::KafkaTarget;
use crate::workflow::KafkaVal;

/// A topic's partitions, ready to produce to, and the relay their client reaches its
/// brokers through (it lives as long as the client).
struct TopicWriter {
    partitions: Vec<PartitionClient>,
    relay: Relay,
}

type Cell<T> = Arc<OnceCell<Arc<T>>>;

/// Produces Kafka steps: one client per bootstrap list and one writer per topic, reused
/// by every step of this runtime and rebuilt after a failure.
pub struct KafkaProducer {
    topics: Mutex<HashMap<(String, String), Cell<TopicWriter>>>,
    metrics: Arc<Metrics>,
    /// How steps' connections are secured (never with the server's credentials).
    steps: KafkaSteps,
    /// Where steps may call: a client's bootstrap brokers are judged before it is built,
    /// and every broker it then dials (those the cluster's metadata names too) by the
    /// relay it reaches them through.
    policy: Arc<Destinations>,
}

/// Builds a client that gives up on an unreachable cluster instead of retrying forever,
/// over TLS and with SASL as `transport` says, reaching its brokers through `proxy` when
/// one is given (a step's relay).
pub(crate) async fn client(
    brokers: Vec<String>,
    deadline: Duration,
    transport: &KafkaTransport,
    proxy: Option<String>,
) -> Result<Client, KafkaError> {
    let mut b = ClientBuilder::new(brokers)
        .client_id("clamp")
        .backoff_config(BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
            deadline: Some(deadline),
        });
    if let Some(tls) = &transport.tls {
        b = b.tls_config(tls.clone());
    }
    if let Some(sasl) = &transport.sasl {
        b = b.sasl_config(sasl.clone());
    }
    if let Some(proxy) = proxy {
        b = b.socks5_proxy(proxy);
    }
    b.build().await
}

/// Why a client could not be built: a failed TLS check or SASL authentication is
/// permanent (the next attempt meets the same certificate or credentials).
pub(crate) fn connect_error(e: &KafkaError) -> (bool, String) {
    if let Some(tls) = crate::tls::describe(e) {
        return (true, format!("TLS handshake failed: {tls}"));
    }
    let text = crate::error_chain::one_line(e);
    let lower = text.to_ascii_lowercase();
    let auth = lower.contains("sasl") || lower.contains("authenticat");
    (auth, format!("cannot connect: {text}"))
}

/// A client for a connection a definition gave (a step's, a trigger's), secured as it
/// says and never with the server's credentials: its bootstrap brokers are judged by the
/// destination policy first, and the client reaches every broker through a relay that
/// judges each (the relay lives as long as the client must).
pub(crate) async fn judged_client(
    connection: &str,
    steps: &KafkaSteps,
    policy: &Arc<Destinations>,
) -> Result<(Client, Relay), Attempt> {
    let target = KafkaTarget::read(connection).map_err(Attempt::Refused)?;
    for b in &target.brokers {
        policy
            .check_host(&b.host.as_str())
            .map_err(|e| Attempt::Refused(e.to_string()))?;
    }
    let relay = Relay::start(policy.clone())
        .await
        .map_err(|e| Attempt::Retry(format!("cannot start the broker relay: {e}")))?;
    let transport = steps.transport(&target);
    let c = client(
        target.bootstrap(),
        Duration::from_secs(5),
        &transport,
        Some(relay.proxy()),
    )
    .await
    .map_err(|e| failure(&relay, &e))?;
    Ok((c, relay))
}

/// What a failure of a judged client means: a broker the policy refused (permanent), an
/// authentication or TLS failure (permanent), or a retry.
pub(crate) fn failure(relay: &Relay, e: &KafkaError) -> Attempt {
    match relay.take_refusal() {
        Some(why) => Attempt::Refused(why.to_string()),
        None => match connect_error(e) {
            (true, why) => Attempt::Refused(why),
            (false, why) => Attempt::Retry(why),
        },
    }
}

/// A step's client for `connection` (read once, `workflow::brokers`) and its topic's
/// partitions. Its bootstrap brokers are judged first; the client then reaches every
/// broker through a relay that judges each, so a refusal there (a broker the cluster's
/// metadata names) fails the step permanently, naming that broker.
async fn open_topic(
    connection: &str,
    topic: &str,
    steps: &KafkaSteps,
    policy: &Arc<Destinations>,
) -> Result<TopicWriter, Attempt> {
    let (c, relay) = judged_client(connection, steps, policy).await?;
    let failed = |e: KafkaError| failure(&relay, &e);
    let topics = c.list_topics().await.map_err(failed)?;
    let Some(t) = topics.into_iter().find(|t| t.name == topic) else {
        return Err(Attempt::Refused(format!("topic '{topic}' does not exist")));
    };
    let mut partitions = Vec::with_capacity(t.partitions.len());
    for p in t.partitions {
        partitions.push(
            c.partition_client(topic, p, UnknownTopicHandling::Retry)
                .await
                .map_err(failed)?,
        );
    }
    if partitions.is_empty() {
        return Err(Attempt::Refused(format!(
            "topic '{topic}' has no partitions"
        )));
    }
    Ok(TopicWriter { partitions, relay })
}

impl KafkaProducer {
    pub fn new(
        metrics: Arc<Metrics>,
        steps: KafkaSteps,
        policy: Arc<Destinations>,
    ) -> KafkaProducer {
        KafkaProducer {
            topics: Mutex::new(HashMap::new()),
            metrics,
            steps,
            policy,
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
                open_topic(
                    &val.connection_url,
                    &val.topic_name,
                    &self.steps,
                    &self.policy,
                )
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
                // A leader that moved to a broker the policy refuses fails the step.
                Err(match writer.relay.take_refusal() {
                    Some(why) => Attempt::Refused(why.to_string()),
                    None => Attempt::Retry(e.to_string()),
                })
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
    for (k, v) in msg.trace_headers() {
        headers.insert(k.to_string(), v.as_bytes().to_vec());
    }
    headers.insert("serviceRequestId".into(), key.to_vec());
    let (of, n) = msg.of_header();
    headers.insert(of.into(), n.to_string().into_bytes());
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
pub(crate) fn murmur2(data: &[u8]) -> u32 {
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
