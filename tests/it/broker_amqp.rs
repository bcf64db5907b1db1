//! AMQP steps and step responses against the RabbitMQ on the machine: every test uses
//! queues of its own and deletes them.

use std::time::Duration;

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::downstream::Downstream;
use crate::support::*;

pub const RABBIT: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A channel to the test broker, and queue names no other test uses.
pub struct Rabbit {
    _conn: Connection,
    pub ch: Channel,
    pub tag: String,
    declared: Vec<String>,
}

impl Rabbit {
    pub async fn connect() -> Rabbit {
        let conn = Connection::connect(RABBIT, ConnectionProperties::default())
            .await
            .expect("RabbitMQ must run on 127.0.0.1:5672 (scripts/services.sh starts it)");
        let ch = conn.create_channel().await.unwrap();
        Rabbit {
            _conn: conn,
            ch,
            tag: Uuid::new_v4().simple().to_string()[..12].to_string(),
            declared: Vec::new(),
        }
    }

    /// A connection with a step queue, a response queue and its dead-letter queue of
    /// this test's own (all deleted by `cleanup`).
    pub async fn with_queues() -> (Rabbit, String, String) {
        let mut r = Rabbit::connect().await;
        let (steps, responses) = (r.name("steps"), r.name("responses"));
        r.declare(&steps).await;
        r.declare(&format!("{responses}.dead")).await;
        r.declare(&responses).await;
        (r, steps, responses)
    }

    /// `clamp_t_<tag>_<what>`.
    pub fn name(&self, what: &str) -> String {
        format!("clamp_t_{}_{what}", self.tag)
    }

    pub async fn declare(&mut self, queue: &str) {
        self.declare_with(queue, FieldTable::default()).await;
    }

    /// Declares `queue` durable with `args` (and an expiry), deleted at cleanup.
    pub async fn declare_with(&mut self, queue: &str, mut args: FieldTable) {
        // A test that fails before `cleanup` leaves its queues behind: they expire unused.
        args.insert("x-expires".into(), AMQPValue::LongLongInt(600_000));
        self.ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            )
            .await
            .unwrap();
        self.declared.push(queue.to_string());
    }

    /// Deletes `queue` at cleanup (one made some other way).
    pub fn track(&mut self, queue: &str) {
        self.declared.push(queue.to_string());
    }

    /// Takes the next message of `queue`, waiting up to 10 s.
    pub async fn next(&self, queue: &str) -> lapin::message::Delivery {
        wait_for(
            &format!("a message on {queue}"),
            Duration::from_secs(10),
            || async {
                self.ch
                    .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                    .await
                    .unwrap()
                    .map(|m| m.delivery)
            },
        )
        .await
    }

    /// Waits until the step message of request `id` is on `steps` and the request paused.
    pub async fn paused(&self, s: &TestServer, id: &str, steps: &str) {
        self.next(steps).await;
        wait_status(s, id, &["PAUSED"], Duration::from_secs(5)).await;
    }

    /// Messages ready in `queue`. A message delivered to a consumer and not acknowledged
    /// yet is not counted: it is counted again only once its consumer's channel closes
    /// and the broker requeues it (see `wait_no_consumers`).
    pub async fn depth(&self, queue: &str) -> u32 {
        self.passive(queue).await.message_count()
    }

    /// Consumers of `queue`.
    pub async fn consumers(&self, queue: &str) -> u32 {
        self.passive(queue).await.consumer_count()
    }

    async fn passive(&self, queue: &str) -> lapin::Queue {
        self.ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
    }

    /// Waits until `queue` has no consumer: their channels are closed, so every delivery
    /// they had not acknowledged is back in the queue, ready (and counted by `depth`).
    pub async fn wait_no_consumers(&self, queue: &str) {
        wait_for(
            &format!("no consumer on {queue}"),
            Duration::from_secs(10),
            || async { (self.consumers(queue).await == 0).then_some(()) },
        )
        .await;
    }

    pub async fn publish(&self, queue: &str, body: &[u8]) {
        self.ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    pub async fn cleanup(self) {
        for q in &self.declared {
            let _ = self
                .ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
}

/// A server consuming step responses from `response_queue`.
fn amqp_config(db: &TestDb, response_queue: &str) -> clamp::config::Config {
    let mut cfg = config(&db.url);
    cfg.brokers.amqp_enabled = true;
    cfg.brokers.amqp_url = RABBIT.into();
    cfg.brokers.amqp_response_queue = response_queue.into();
    cfg
}

fn header<'a>(d: &'a lapin::message::Delivery, name: &str) -> Option<&'a AMQPValue> {
    d.properties
        .headers()
        .as_ref()?
        .inner()
        .iter()
        .find(|(k, _)| k.as_str() == name)
        .map(|(_, v)| v)
}

/// An AMQP step then an HTTP step that receives the AMQP step's answer.
fn amqp_then_http(name: &str, queue: &str, d: &Downstream) -> Value {
    json!({"name": name, "steps": [
        {"name": "ask", "mode": "AMQP", "val": {"connection_url": RABBIT, "queue_name": queue}},
        {"name": "use", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]})
}

#[tokio::test]
async fn amqp_step_publishes_and_a_reply_on_the_response_queue_completes_it() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (r, steps, responses) = Rabbit::with_queues().await;
    let s = TestServer::start(amqp_config(&db, &responses)).await;
    let wf = s
        .create_workflow(&amqp_then_http("amqp1", &steps, &d))
        .await;
    // The reply queue is set at creation and shown with the workflow.
    assert_eq!(
        wf["steps"][0]["val"]["reply_to"],
        responses.as_str(),
        "{wf}"
    );

    let r1 = s
        .post("/serviceRequest/amqp1", r#"{"claim": 7}"#)
        .await
        .json();
    let id = r1["serviceRequestId"].as_str().unwrap().to_string();
    let m = r.next(&steps).await;
    let body: Value = serde_json::from_slice(&m.data).unwrap();
    assert_eq!(body, json!({"claim": 7}));
    let p = &m.properties;
    assert_eq!(p.reply_to().as_ref().unwrap().as_str(), responses);
    assert_eq!(p.correlation_id().as_ref().unwrap().as_str(), id);
    assert_eq!(p.message_id().as_ref().unwrap().as_str(), format!("{id}:1"));
    assert_eq!(p.delivery_mode(), &Some(2), "not persistent");
    assert_eq!(
        p.content_type().as_ref().unwrap().as_str(),
        "application/json"
    );
    assert!(matches!(
        header(&m, "stepId"),
        Some(AMQPValue::LongLongInt(1))
    ));
    assert!(
        matches!(header(&m, "serviceRequestId"), Some(AMQPValue::LongString(s)) if s.to_string() == id)
    );
    let v = wait_status(&s, &id, &["PAUSED"], Duration::from_secs(5)).await;
    assert_eq!(v["status"], "PAUSED", "{v}");

    let reply = step_reply(&id, json!({"approved": true}));
    r.publish(&responses, &reply).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    // The answer is the next step's request.
    let got = d.received("/api/echo");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, json!({"approved": true}));
    assert_eq!(
        v["steps"][1]["payload"]["response"],
        json!({"approved": true})
    );
    // Acknowledged: once the server's connection is closed, a delivery it had not
    // acknowledged would be back on the queue, ready.
    s.shutdown().await;
    r.wait_no_consumers(&responses).await;
    assert_eq!(
        r.depth(&responses).await,
        0,
        "the reply was not acknowledged"
    );
    r.cleanup().await;
}

#[tokio::test]
async fn a_reply_sent_while_the_server_is_stopped_is_applied_when_it_starts_again() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (r, steps, responses) = Rabbit::with_queues().await;
    let s = TestServer::start(amqp_config(&db, &responses)).await;
    s.create_workflow(&amqp_then_http("amqp2", &steps, &d))
        .await;
    let id = create_request(&s, "amqp2", &json!({"n": 1})).await;
    r.paused(&s, &id, &steps).await;
    s.shutdown().await;

    let reply = step_reply(&id, json!({"later": true}));
    r.publish(&responses, &reply).await;

    let s = TestServer::start(amqp_config(&db, &responses)).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.received("/api/echo")[0].body, json!({"later": true}));
    s.shutdown().await;
    r.cleanup().await;
}

#[tokio::test]
async fn malformed_and_unknown_replies_are_dead_lettered_and_later_ones_still_apply() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (r, steps, responses) = Rabbit::with_queues().await;
    let dead = format!("{responses}.dead");
    let s = TestServer::start(amqp_config(&db, &responses)).await;
    s.create_workflow(&amqp_then_http("amqp3", &steps, &d))
        .await;
    let id = create_request(&s, "amqp3", &json!({})).await;
    r.paused(&s, &id, &steps).await;

    r.publish(&responses, b"this is not json").await;
    r.publish(
        &responses,
        br#"{"serviceRequestId": "nope", "stepId": 1, "response": {}}"#,
    )
    .await;
    let stranger =
        json!({"serviceRequestId": Uuid::now_v7().to_string(), "stepId": 1, "response": {}});
    r.publish(&responses, stranger.to_string().as_bytes()).await;
    let reply = step_reply(&id, json!({"ok": 1}));
    r.publish(&responses, &reply).await;
    // A redelivered or repeated answer changes nothing.
    r.publish(&responses, &reply).await;

    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    wait_for(
        "the malformed and unknown replies to be parked",
        Duration::from_secs(5),
        || async { (r.depth(&dead).await >= 3).then_some(()) },
    )
    .await;
    assert_eq!(
        r.depth(&dead).await,
        3,
        "malformed and unknown replies are parked"
    );
    // Responses are applied concurrently, so the parked ones come in any order.
    let mut parked = Vec::new();
    for _ in 0..3 {
        let m = r.next(&dead).await;
        assert!(header(&m, "x-clamp-reason").is_some());
        parked.push(String::from_utf8(m.data).unwrap());
    }
    assert!(parked.iter().any(|b| b == "this is not json"), "{parked:?}");
    let m = s.get("/metrics").await.text();
    assert!(
        m.contains(r#"clamp_broker_replies_total{broker="amqp",outcome="malformed"} 2"#),
        "{m}"
    );
    assert!(m.contains(r#"clamp_broker_replies_total{broker="amqp",outcome="rejected"} 1"#));
    assert!(m.contains(r#"clamp_broker_replies_total{broker="amqp",outcome="resumed"} 1"#));
    // The duplicate is acknowledged, not parked, and nothing ran twice.
    assert!(m.contains(r#"clamp_broker_replies_total{broker="amqp",outcome="duplicate"} 1"#));
    assert_eq!(d.received("/api/echo").len(), 1);
    s.shutdown().await;
    r.cleanup().await;
}

#[tokio::test]
async fn an_error_reply_fails_the_request_through_its_on_failure_steps() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut r = Rabbit::connect().await;
    let (steps, responses) = (r.name("steps"), r.name("responses"));
    r.declare(&steps).await;
    // The response queue exists already, made with arguments of its operator's choosing
    // (declaring it again without them would be refused); its dead-letter queue does not
    // exist yet, and the server creates it.
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(100_000));
    r.declare_with(&responses, args).await;
    r.track(&format!("{responses}.dead"));
    let s = TestServer::start(amqp_config(&db, &responses)).await;
    s.create_workflow(&json!({"name": "amqp4", "steps": [
        {"name": "ask", "mode": "AMQP", "val": {"connection_url": RABBIT, "queue_name": steps},
         "onFailure": [{"name": "undo", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}]}))
    .await;
    let id = create_request(&s, "amqp4", &json!({"x": 1})).await;
    r.paused(&s, &id, &steps).await;
    let reply =
        json!({"serviceRequestId": id, "stepId": 1, "error": {"code": 422, "message": "declined"}});
    r.publish(&responses, reply.to_string().as_bytes()).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("declined"), "{v}");
    assert_eq!(d.received("/api/echo")[0].body, json!({"x": 1}));
    s.shutdown().await;
    r.cleanup().await;
}

#[tokio::test]
async fn an_unroutable_step_or_an_unreachable_broker_fails_with_the_reason() {
    let db = TestDb::new();
    let r = Rabbit::connect().await;
    let mut cfg = config(&db.url);
    cfg.http.timeout = Duration::from_millis(800);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "nowhere", "steps": [
        {"name": "ask", "mode": "AMQP", "val": {"connection_url": RABBIT, "queue_name": r.name("missing")}}]}))
    .await;
    s.create_workflow(&json!({"name": "down", "steps": [
        {"name": "ask", "mode": "AMQP", "val": {"connection_url": "amqp://guest:guest@127.0.0.1:1/%2f", "queue_name": "q"}}]}))
    .await;
    let a = create_request(&s, "nowhere", &json!({})).await;
    let b = create_request(&s, "down", &json!({})).await;
    let v = wait_status(&s, &a, &["FAILED", "PAUSED"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("unroutable"), "{v}");
    let v = wait_status(&s, &b, &["FAILED", "PAUSED"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let reason = v["reason"].as_str().unwrap();
    // An unreachable broker is a transient failure of the step's call: retried by the
    // step's policy (three attempts by default), then the step fails with the reason.
    assert!(
        reason.contains("after 3 attempts") && reason.contains("cannot connect"),
        "{v}"
    );
    assert!(
        !reason.contains("guest:guest"),
        "credentials leak: {reason}"
    );
    s.shutdown().await;
    r.cleanup().await;
}

#[tokio::test]
async fn consumer_and_publisher_reconnect_after_the_broker_connection_is_cut() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (r, steps, responses) = Rabbit::with_queues().await;
    let proxy = PgProxy::start_to("127.0.0.1:5672".parse().unwrap()).await;
    let mut cfg = amqp_config(&db, &responses);
    let via_proxy = format!("amqp://guest:guest@{}/%2f", proxy.addr);
    cfg.brokers.amqp_url = via_proxy.clone();
    let s = TestServer::start(cfg).await;
    let mut wf = amqp_then_http("amqp6", &steps, &d);
    wf["steps"][0]["val"]["connection_url"] = via_proxy.into();
    s.create_workflow(&wf).await;
    let id = create_request(&s, "amqp6", &json!({})).await;
    r.paused(&s, &id, &steps).await;
    wait_for(
        "the server to consume the response queue",
        Duration::from_secs(10),
        || async { (r.consumers(&responses).await > 0).then_some(()) },
    )
    .await;
    // The broker goes away (its consumers go with the connection); a reply is sent meanwhile.
    proxy.cut();
    r.wait_no_consumers(&responses).await;
    let reply = step_reply(&id, json!({"back": true}));
    r.publish(&responses, &reply).await;
    // Nobody can take it while the broker is away: it waits on the queue, ready.
    wait_for(
        "the reply to be on the queue",
        Duration::from_secs(5),
        || async { (r.depth(&responses).await == 1).then_some(()) },
    )
    .await;
    assert_eq!(r.consumers(&responses).await, 0);
    assert_eq!(
        s.get(&format!("/serviceRequest/{id}")).await.json()["status"],
        "PAUSED"
    );
    proxy.restore();
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(15)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    // The publisher's cached connection died with the cut: the next step opens a new one.
    let id2 = create_request(&s, "amqp6", &json!({"second": true})).await;
    let m = r.next(&steps).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&m.data).unwrap(),
        json!({"second": true})
    );
    let v = wait_status(&s, &id2, &["PAUSED", "FAILED"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "PAUSED", "{v}");
    s.shutdown().await;
    r.cleanup().await;
}

#[tokio::test]
async fn replies_that_race_the_pause_are_applied_not_rejected() {
    use futures_util::StreamExt;
    use lapin::options::{BasicAckOptions, BasicConsumeOptions};
    let db = TestDb::new();
    let (r, steps, responses) = Rabbit::with_queues().await;
    let s = TestServer::start(amqp_config(&db, &responses)).await;
    s.create_workflow(&json!({"name": "race", "steps": [
        {"name": "ask", "mode": "AMQP", "val": {"connection_url": RABBIT, "queue_name": steps}}]}))
        .await;
    // A service that answers the instant a message arrives, often before the request's
    // pause is written (the row still says step 0 for a request handed over at insert).
    let mut consumer =
        r.ch.basic_consume(
            steps.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let ch = r.ch.clone();
    let reply_q = responses.clone();
    let responder = tokio::spawn(async move {
        while let Some(Ok(d)) = consumer.next().await {
            let id = d.properties.correlation_id().as_ref().unwrap().to_string();
            let reply = step_reply(&id, json!({"fast": true}));
            ch.basic_publish(
                "".into(),
                reply_q.as_str().into(),
                BasicPublishOptions::default(),
                &reply,
                BasicProperties::default(),
            )
            .await
            .unwrap();
            d.acker.ack(BasicAckOptions::default()).await.unwrap();
        }
    });
    let mut ids = Vec::new();
    for i in 0..30 {
        ids.push(create_request(&s, "race", &json!({"i": i})).await);
    }
    for id in &ids {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], Duration::from_secs(15)).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
    }
    assert_eq!(r.depth(&format!("{responses}.dead")).await, 0);
    responder.abort();
    s.shutdown().await;
    r.cleanup().await;
}

/// Makes the stored definition of `workflow` invalid, as an upgrade that tightened
/// validation would (the server must be stopped: a running one has it in memory).
/// Makes a stored workflow invalid, every version of it (as a server that validates more
/// strictly would find it).
pub async fn break_workflow(db: &TestDb, workflow: &str) {
    let client = db.client().await;
    for table in ["workflows", "workflow_versions"] {
        let n = client
            .execute(
                &format!(
                    "UPDATE {table} SET definition = jsonb_set(definition, '{{steps,1,mode}}', '\"FTP\"') \
                     WHERE name = $1"
                ),
                &[&workflow],
            )
            .await
            .unwrap();
        assert_eq!(n, 1, "{table}");
    }
}

#[tokio::test]
async fn a_reply_whose_workflow_no_longer_validates_is_dead_lettered_and_the_next_applies() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (r, steps, responses) = Rabbit::with_queues().await;
    let dead = format!("{responses}.dead");
    let s = TestServer::start(amqp_config(&db, &responses)).await;
    s.create_workflow(&amqp_then_http("amqp7", &steps, &d))
        .await;
    s.create_workflow(&amqp_then_http("amqp7ok", &steps, &d))
        .await;
    let broken = create_request(&s, "amqp7", &json!({})).await;
    r.paused(&s, &broken, &steps).await;
    let fine = create_request(&s, "amqp7ok", &json!({})).await;
    r.paused(&s, &fine, &steps).await;
    s.shutdown().await;
    break_workflow(&db, "amqp7").await;

    let s = TestServer::start(amqp_config(&db, &responses)).await;
    r.publish(&responses, &step_reply(&broken, json!({"a": 1})))
        .await;
    r.publish(&responses, &step_reply(&fine, json!({"b": 2})))
        .await;
    let v = wait_status(&s, &fine, &["COMPLETED", "FAILED"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let m = r.next(&dead).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&m.data).unwrap()["serviceRequestId"],
        broken.as_str()
    );
    let why = match header(&m, "x-clamp-reason") {
        Some(AMQPValue::LongString(s)) => s.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(why.contains("no longer validates"), "{why}");
    // Its request waits, paused, for a fix.
    let v = s.get(&format!("/serviceRequest/{broken}")).await.json();
    assert_eq!(v["status"], "PAUSED", "{v}");
    // Over HTTP the same response is refused as one that can never apply.
    let msg = s
        .post(
            "/stepResponse",
            &String::from_utf8(step_reply(&broken, json!({"a": 1}))).unwrap(),
        )
        .await
        .expect_error(422);
    assert!(msg.contains("no longer validates"), "{msg}");
    // Both replies were acknowledged (one parked, one applied): with the server's
    // connection closed, nothing it had not acknowledged comes back to the queue.
    s.shutdown().await;
    r.wait_no_consumers(&responses).await;
    assert_eq!(r.depth(&responses).await, 0, "a reply was not acknowledged");
    r.cleanup().await;
}

#[tokio::test]
async fn a_late_reply_for_a_cancelled_request_is_dead_lettered() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (r, steps, responses) = Rabbit::with_queues().await;
    let dead = format!("{responses}.dead");
    let s = TestServer::start(amqp_config(&db, &responses)).await;
    s.create_workflow(&amqp_then_http("amqp8", &steps, &d))
        .await;
    let id = create_request(&s, "amqp8", &json!({})).await;
    r.paused(&s, &id, &steps).await;
    let c = s.post(&format!("/serviceRequest/{id}/cancel"), "").await;
    assert_eq!(c.status, 200, "{}", c.text());
    r.publish(&responses, &step_reply(&id, json!({"late": true})))
        .await;
    let m = r.next(&dead).await;
    let why = match header(&m, "x-clamp-reason") {
        Some(AMQPValue::LongString(s)) => s.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(why.contains("CANCELLED"), "{why}");
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "CANCELLED");
    assert!(d.received("/api/echo").is_empty());
    s.shutdown().await;
    r.cleanup().await;
}

#[tokio::test]
async fn an_amqp_step_carries_the_trace_context_as_message_headers() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (r, steps, responses) = Rabbit::with_queues().await;
    let s = TestServer::start(amqp_config(&db, &responses)).await;
    s.create_workflow(&amqp_then_http("amqptrace", &steps, &d))
        .await;
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let created = crate::support::send(
        s.addr,
        hyper::Method::POST,
        "/serviceRequest/amqptrace",
        Some(b"{}".to_vec()),
        &[
            ("traceparent", caller),
            ("tracestate", "rojo=00f067aa0ba902b7"),
        ],
    )
    .await;
    assert_eq!(created.status, 200, "{}", created.text());
    let m = r.next(&steps).await;
    // Tracing is off here: the caller's context goes on as it came.
    assert!(
        matches!(header(&m, "traceparent"), Some(AMQPValue::LongString(v)) if v.to_string() == caller),
        "{:?}",
        header(&m, "traceparent")
    );
    assert!(
        matches!(header(&m, "tracestate"), Some(AMQPValue::LongString(v)) if v.to_string() == "rojo=00f067aa0ba902b7")
    );
    s.shutdown().await;
    r.cleanup().await;
}

/// An AMQP step inside a MAP (beyond Clamp): each item publishes with its own child
/// request's id, pauses that item only, and the broker reply naming the child resumes
/// it; the MAP's answer is each item's last answer in item order.
#[tokio::test]
async fn an_amqp_step_in_each_map_item_is_resumed_by_its_broker_reply() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (r, steps, responses) = Rabbit::with_queues().await;
    let s = TestServer::start(amqp_config(&db, &responses)).await;
    s.create_workflow(&json!({"name": "fan-amqp", "steps": [
        {"name": "each", "mode": "MAP", "val": {"items": "each.request.claims", "maxConcurrency": 2,
            "steps": [
                {"name": "ask", "mode": "AMQP", "val": {"connection_url": RABBIT, "queue_name": steps}},
                {"name": "use", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}}]}))
    .await;
    let id = create_request(&s, "fan-amqp", &json!({"claims": [10, 11, 12]})).await;
    // Two items at once (maxConcurrency 2); each reply frees room for the third.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let m = r.next(&steps).await;
        let item: Value = serde_json::from_slice(&m.data).unwrap();
        let child = m.properties.correlation_id().as_ref().unwrap().to_string();
        assert_ne!(child, id, "published with the item's own request id");
        assert_eq!(
            m.properties.message_id().as_ref().unwrap().as_str(),
            format!("{child}:1")
        );
        seen.push(item.clone());
        // Waiting on its items: PAUSED while every item waits for its reply, IN_PROGRESS
        // while one is still on its way to publishing.
        let v = s.get(&format!("/serviceRequest/{id}")).await.json();
        assert!(
            matches!(v["status"].as_str(), Some("PAUSED" | "IN_PROGRESS")),
            "{v}"
        );
        r.publish(&responses, &step_reply(&child, json!({"approved": item})))
            .await;
    }
    seen.sort_by_key(|v| v.as_i64());
    assert_eq!(seen, [json!(10), json!(11), json!(12)]);
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(15)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(
        response_of(&v, "each"),
        json!([
            {"echo": {"approved": 10}},
            {"echo": {"approved": 11}},
            {"echo": {"approved": 12}}
        ]),
        "{v}"
    );
    assert_eq!(d.received("/api/echo").len(), 3);
    s.shutdown().await;
    r.cleanup().await;
}

/// An AMQP step's `answerTimeout`: no reply comes, so the message is published again as
/// its retry policy allows, then the step fails "no answer within" and its onFailure step
/// runs; a reply that comes after that changes nothing.
#[tokio::test]
async fn an_amqp_step_without_a_reply_in_time_is_sent_again_then_fails() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (r, steps, responses) = Rabbit::with_queues().await;
    let s = TestServer::start(amqp_config(&db, &responses)).await;
    s.create_workflow(&json!({"name": "amqp-timeout", "steps": [
        {"name": "ask", "mode": "AMQP", "answerTimeout": "PT1S", "retry": {"maxAttempts": 2},
         "val": {"connection_url": RABBIT, "queue_name": steps},
         "onFailure": [{"name": "undo", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}]}))
    .await;
    let id = create_request(&s, "amqp-timeout", &json!({"x": 1})).await;
    // Published, then published again once the first wait ran out.
    r.paused(&s, &id, &steps).await;
    let again = r.next(&steps).await;
    let body: Value = serde_json::from_slice(&again.data).unwrap();
    assert_eq!(body, json!({"x": 1}));
    assert!(matches!(
        header(&again, "stepId"),
        Some(AMQPValue::LongLongInt(1))
    ));
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(15)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("no answer within"),
        "{v}"
    );
    assert_eq!(d.received("/api/echo").len(), 1, "onFailure ran once");
    // Late: the step has its final record, so the reply is taken as a repeat and
    // changes nothing.
    let late = json!({"serviceRequestId": id, "stepId": 1, "response": {"late": true}});
    r.publish(&responses, late.to_string().as_bytes()).await;
    wait_for(
        "the late reply to be taken",
        Duration::from_secs(10),
        || async { (r.depth(&responses).await == 0).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "FAILED", "{v}");
    assert_eq!(d.received("/api/echo").len(), 1, "onFailure ran once");
    assert_eq!(r.depth(&steps).await, 0, "sent twice, no more");
    s.shutdown().await;
    r.cleanup().await;
}

/// A workflow's outcomes told on an AMQP queue (beyond Clamp): each notification is one
/// persistent message, confirmed by the broker, its id `notification:<id>`, signed with the
/// target's secret; a WORKFLOW step's child is told as its own workflow tells.
#[tokio::test]
async fn outcomes_are_told_on_a_queue_signed_and_keyed_by_notification() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut r = Rabbit::connect().await;
    let told = r.name("told");
    r.declare(&told).await;
    let dir = std::env::temp_dir().join(format!("clamp-secrets-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("NOTE"), "queue-key").unwrap();
    let mut cfg = config(&db.url);
    cfg.secrets = std::sync::Arc::new(clamp::secrets::Secrets::new(Some(dir)));
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "told", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}],
        "notify": [{"on": ["COMPLETED", "FAILED"],
                    "amqp": {"connection_url": RABBIT, "queue_name": told, "secret": "{{secret:NOTE}}"}}]}))
        .await;
    s.create_workflow(&json!({"name": "above", "steps": [
        {"name": "sub", "mode": "WORKFLOW", "val": {"workflow": "told"}}]}))
        .await;
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(create_request(&s, "told", &json!({"n": n})).await);
    }
    let above = create_request(&s, "above", &json!({"n": 9})).await;
    wait_status(&s, &above, &["COMPLETED"], Duration::from_secs(20)).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let m = r.next(&told).await;
        let body: Value = serde_json::from_slice(&m.data).unwrap();
        assert_eq!(body["status"], "COMPLETED", "{body}");
        assert_eq!(body["workflow"], "told");
        let p = &m.properties;
        assert_eq!(
            p.message_id().as_ref().unwrap().as_str(),
            format!("notification:{}", body["id"].as_str().unwrap())
        );
        assert_eq!(p.delivery_mode(), &Some(2), "not persistent");
        assert!(
            matches!(header(&m, "notificationId"), Some(AMQPValue::LongLongInt(n)) if n.to_string() == body["id"].as_str().unwrap())
        );
        let Some(AMQPValue::LongString(sig)) = header(&m, "x-clamp-signature-256") else {
            panic!("unsigned")
        };
        let mut mac =
            <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(b"queue-key").unwrap();
        hmac::Mac::update(&mut mac, &m.data);
        let want = format!(
            "sha256={}",
            hex::encode(hmac::Mac::finalize(mac).into_bytes())
        );
        assert_eq!(sig.to_string(), want);
        seen.push(body["serviceRequestId"].as_str().unwrap().to_string());
    }
    for id in &ids {
        assert!(seen.contains(id), "{id} not told");
    }
    assert!(!seen.contains(&above), "the parent was told");
    wait_for("all four delivered", Duration::from_secs(10), || async {
        (db.count("SELECT count(*) FROM notifications WHERE state = 'delivered'")
            .await
            == 4)
            .then_some(())
    })
    .await;
    s.shutdown().await;
    r.cleanup().await;
}
