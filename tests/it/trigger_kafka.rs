//! Kafka triggers (beyond Clamp) against a real Kafka-protocol broker (tansu): 1,000
//! records on a 4-partition topic, read by two instances that share its partitions, one
//! of them killed -9 half-way, start exactly 1,000 requests (a record read again finds
//! its request by its topic, partition and offset), all COMPLETED; a poison record is
//! dead-lettered while its partition goes on; every partition's stored position ends
//! past its last record.

use std::collections::BTreeMap;
use std::time::Duration;

use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::client::ClientBuilder;
use rskafka::record::Record;
use serde_json::json;
use uuid::Uuid;

use crate::broker_kafka::broker;
use crate::downstream::Downstream;
use crate::support::*;

const PARTITIONS: i32 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_records_on_four_partitions_start_a_thousand_requests_while_an_instance_is_killed(
) {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let kafka = ClientBuilder::new(vec![broker().to_string()])
        .build()
        .await
        .unwrap();
    let topic = format!(
        "clamp_t_{}_orders",
        &Uuid::new_v4().simple().to_string()[..12]
    );
    kafka
        .controller_client()
        .unwrap()
        .create_topic(&topic, PARTITIONS, 1, 5_000)
        .await
        .unwrap();

    let port = free_port();
    let mut other = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "orders", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let r = s
        .post_json(
            "/triggers",
            &json!({"name": "orders-in", "workflow": "orders",
                    "source": {"kafka": {"connection": broker().to_string(), "topic": topic}},
                    "labels": {"order": "string(body.n)"}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    // The two instances share the partitions (two each): both hold locks of the feed.
    wait_for("both instances reading", Duration::from_secs(20), || async {
        let readers = db
            .count("SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND objid::int8 < 4 AND granted")
            .await;
        (readers == 2).then_some(())
    })
    .await;

    let mut produced = [0i64; PARTITIONS as usize];
    for n in 0..1000 {
        let p = n % PARTITIONS;
        let value = if n == 501 {
            b"not json".to_vec()
        } else {
            json!({"n": n}).to_string().into_bytes()
        };
        kafka
            .partition_client(&topic, p, UnknownTopicHandling::Retry)
            .await
            .unwrap()
            .produce(
                vec![Record {
                    key: None,
                    value: Some(value),
                    headers: BTreeMap::new(),
                    timestamp: chrono::Utc::now(),
                }],
                Compression::NoCompression,
            )
            .await
            .unwrap();
        produced[p as usize] += 1;
        if n == 400 {
            other.0.kill().unwrap(); // SIGKILL, while it reads its partitions.
            other.0.wait().unwrap();
        }
    }

    wait_for(
        "999 requests COMPLETED",
        Duration::from_secs(90),
        || async {
            (db.count("SELECT count(*) FROM service_requests WHERE status = 'COMPLETED'")
                .await
                == 999)
                .then_some(())
        },
    )
    .await;
    // One request per record, the poison one aside: none doubled, none lost.
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 999);
    assert_eq!(
        db.count("SELECT count(DISTINCT payload::jsonb->>'n') FROM service_requests")
            .await,
        999
    );
    let poison = db
        .count(&format!(
            "SELECT count(*) FROM dead_letters WHERE source = 'kafka' AND topic = '{topic}' \
             AND partition = 1 AND body = 'not json' AND reason LIKE 'the body is not JSON%'"
        ))
        .await;
    assert_eq!(poison, 1);
    // Each partition's position is past its last record.
    for (p, n) in produced.iter().enumerate() {
        let sql = format!(
            "SELECT coalesce(max(next_offset), -1) FROM kafka_offsets \
             WHERE topic = 'trigger:orders-in:{topic}' AND partition = {p}"
        );
        wait_for("the positions stored", Duration::from_secs(10), || async {
            (db.count(&sql).await == *n).then_some(())
        })
        .await;
    }
    let found = s
        .get("/serviceRequests?label=trigger:orders-in&label=order:777")
        .await
        .json();
    assert_eq!(
        found["serviceRequests"].as_array().unwrap().len(),
        1,
        "{found}"
    );
    s.shutdown().await;
}
