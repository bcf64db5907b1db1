//! AMQP triggers (beyond Clamp) against the RabbitMQ on the machine: 1,000 messages on a
//! queue consumed by two instances while one is killed -9 start exactly 1,000 requests
//! (a redelivered message finds its request by its id), all COMPLETED, and a poison
//! message is dead-lettered while the rest go on; pausing and deleting a trigger release
//! its consumers.

use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::BasicProperties;
use serde_json::json;

use crate::broker_amqp::{Rabbit, RABBIT};
use crate::downstream::Downstream;
use crate::support::*;

fn trigger(name: &str, queue: &str) -> serde_json::Value {
    json!({"name": name, "workflow": "orders",
           "source": {"amqp": {"url": RABBIT, "queue": queue, "prefetch": 50}},
           "labels": {"order": "string(body.n)"}})
}

async fn publish(r: &Rabbit, queue: &str, id: &str, body: &[u8]) {
    r.ch.basic_publish(
        "".into(),
        queue.into(),
        BasicPublishOptions::default(),
        body,
        BasicProperties::default()
            .with_message_id(id.into())
            .with_delivery_mode(2),
    )
    .await
    .unwrap()
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_messages_start_a_thousand_requests_while_an_instance_is_killed() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut r = Rabbit::connect().await;
    let queue = r.name("orders");
    r.declare(&queue).await;
    // The other instance: the real binary, killed -9 half-way.
    let port = free_port();
    let mut other = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "orders", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let created = s
        .post_json("/triggers", &trigger("orders-in", &queue))
        .await;
    assert_eq!(created.status, 201, "{}", created.text());
    // Both instances consume it (each reads the triggers every 2 s).
    wait_for("two consumers", Duration::from_secs(15), || async {
        (r.consumers(&queue).await == 2).then_some(())
    })
    .await;

    for n in 0..500 {
        publish(
            &r,
            &queue,
            &format!("m-{n}"),
            json!({"n": n}).to_string().as_bytes(),
        )
        .await;
    }
    publish(&r, &queue, "poison", b"not json").await;
    for n in 500..1000 {
        publish(
            &r,
            &queue,
            &format!("m-{n}"),
            json!({"n": n}).to_string().as_bytes(),
        )
        .await;
    }
    wait_for("some requests", Duration::from_secs(30), || async {
        (db.count("SELECT count(*) FROM service_requests").await >= 200).then_some(())
    })
    .await;
    other.0.kill().unwrap(); // SIGKILL: its unacknowledged messages go back to the queue.
    other.0.wait().unwrap();

    wait_for(
        "1,000 requests COMPLETED",
        Duration::from_secs(90),
        || async {
            (db.count("SELECT count(*) FROM service_requests WHERE status = 'COMPLETED'")
                .await
                == 1000)
                .then_some(())
        },
    )
    .await;
    // Exactly one request per message: none doubled, none lost.
    assert_eq!(
        db.count("SELECT count(*) FROM service_requests").await,
        1000
    );
    assert_eq!(
        db.count("SELECT count(DISTINCT payload::jsonb->>'n') FROM service_requests")
            .await,
        1000
    );
    // The poison message kept with its reason; the queue drained.
    assert_eq!(
        db.count("SELECT count(*) FROM dead_letters WHERE source = 'amqp' AND body = 'not json' AND reason LIKE 'the body is not JSON%'")
            .await,
        1
    );
    wait_for("the queue drained", Duration::from_secs(10), || async {
        (r.depth(&queue).await == 0).then_some(())
    })
    .await;
    // Labelled by the trigger and by the message.
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
    r.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_and_deleting_a_trigger_release_its_consumer() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut r = Rabbit::connect().await;
    let queue = r.name("paused");
    r.declare(&queue).await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "orders", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let consumers = |n: u32| {
        let (r, queue) = (&r, &queue);
        async move {
            wait_for(
                &format!("{n} consumers"),
                Duration::from_secs(10),
                || async { (r.consumers(queue).await == n).then_some(()) },
            )
            .await
        }
    };
    assert_eq!(
        s.post_json("/triggers", &trigger("t", &queue)).await.status,
        201
    );
    consumers(1).await;
    assert_eq!(s.post("/triggers/t/pause", "").await.status, 200);
    consumers(0).await;
    // Paused: a message waits in the queue, nothing starts.
    publish(&r, &queue, "w-1", br#"{"n": 1}"#).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 0);
    assert_eq!(s.post("/triggers/t/resume", "").await.status, 200);
    consumers(1).await;
    wait_for(
        "the waiting message's request",
        Duration::from_secs(10),
        || async { (db.count("SELECT count(*) FROM service_requests").await == 1).then_some(()) },
    )
    .await;
    let deleted = send(s.addr, hyper::Method::DELETE, "/triggers/t", None, &[]).await;
    assert_eq!(deleted.status, 204);
    consumers(0).await;
    s.shutdown().await;
    r.cleanup().await;
}
