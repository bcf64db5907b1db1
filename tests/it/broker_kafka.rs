//! Kafka steps and step responses against a real Kafka-protocol broker: `tansu` (memory
//! storage), started once for this test process on a free port and stopped with it.
//! `scripts/services.sh` installs the binary.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::downstream::Downstream;
use crate::support::*;

/// The broker binary: `$TANSU`, else cargo's bin directory, else `PATH`.
pub fn tansu_bin() -> String {
    if let Ok(p) = std::env::var("TANSU") {
        return p;
    }
    let home = std::env::var("CARGO_HOME")
        .unwrap_or_else(|_| format!("{}/.cargo", std::env::var("HOME").unwrap_or_default()));
    let p = format!("{home}/bin/tansu");
    if std::path::Path::new(&p).exists() {
        p
    } else {
        "tansu".into()
    }
}

/// Starts a tansu broker with memory storage on `port` and waits until it listens.
/// The broker gets SIGKILL when the thread that started it ends.
fn start_tansu(port: u16) -> std::process::Child {
    start_tansu_advertising(port, &format!("tcp://127.0.0.1:{port}"))
}

/// The same, telling clients in its metadata that it is at `advertised`.
pub fn start_tansu_advertising(port: u16, advertised: &str) -> std::process::Child {
    let url = format!("tcp://127.0.0.1:{port}");
    let mut cmd = std::process::Command::new(tansu_bin());
    cmd.args([
        "broker",
        "--listener-url",
        &url,
        "--advertised-listener-url",
        advertised,
        "--storage-engine",
        "memory://tansu/",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap_or_else(|e| {
        panic!("cannot start the tansu Kafka broker ({e}); scripts/services.sh installs it")
    });
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // A blocking wait: the shared broker is started from a plain thread.
    wait_for_blocking(
        &format!("tansu to listen on {addr}"),
        Duration::from_secs(20),
        || std::net::TcpStream::connect(addr).ok().map(drop),
    );
    child
}

/// The shared broker's address, starting it on first use.
pub fn broker() -> SocketAddr {
    static BROKER: OnceLock<SocketAddr> = OnceLock::new();
    *BROKER.get_or_init(|| {
        // A broker already running (to watch its log, say) instead of starting one.
        if let Ok(addr) = std::env::var("CLAMP_TEST_KAFKA") {
            return addr.parse().expect("CLAMP_TEST_KAFKA is host:port");
        }
        let port = free_port();
        // It must live as long as the test process, so it is started from a thread that
        // does (the death signal follows the thread that started the child).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let child = start_tansu(port);
            let _ = tx.send(());
            let _keep = child;
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("the broker thread panicked");
        format!("127.0.0.1:{port}").parse().unwrap()
    })
}

/// Kills a broker when dropped, also when a test fails.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Kafka {
    client: Client,
    tag: String,
}

impl Kafka {
    async fn connect() -> Kafka {
        let client = ClientBuilder::new(vec![broker().to_string()])
            .build()
            .await
            .unwrap();
        Kafka {
            client,
            tag: Uuid::new_v4().simple().to_string()[..12].to_string(),
        }
    }

    /// A client, a step topic of this test's own, and the name of its response topic
    /// (created by the server's consumer, or by the test).
    async fn with_step_topic() -> (Kafka, String, String) {
        let k = Kafka::connect().await;
        let (steps, responses) = (k.name("steps"), k.name("responses"));
        k.create_topic(&steps).await;
        (k, steps, responses)
    }

    /// Waits until the step record of a request is on `steps` and the request `id` paused.
    async fn paused(&self, s: &TestServer, id: &str, steps: &str) {
        self.records(steps, 1).await;
        wait_status(s, id, &["PAUSED"], Duration::from_secs(5)).await;
    }

    fn name(&self, what: &str) -> String {
        format!("clamp_t_{}_{what}", self.tag)
    }

    async fn create_topic(&self, topic: &str) {
        self.client
            .controller_client()
            .unwrap()
            .create_topic(topic, 1, 1, 5_000)
            .await
            .unwrap();
    }

    async fn partition(&self, topic: &str) -> PartitionClient {
        self.client
            .partition_client(topic, 0, UnknownTopicHandling::Retry)
            .await
            .unwrap()
    }

    async fn produce(&self, topic: &str, value: &[u8]) {
        let p = self.partition(topic).await;
        p.produce(
            vec![Record {
                key: None,
                value: Some(value.to_vec()),
                headers: BTreeMap::new(),
                timestamp: chrono::Utc::now(),
            }],
            Compression::NoCompression,
        )
        .await
        .unwrap();
    }

    /// Every record of `topic` from offset 0, waiting until there are `n`.
    async fn records(&self, topic: &str, n: usize) -> Vec<Record> {
        let p = self.partition(topic).await;
        let p = &p;
        wait_for(
            &format!("{n} records on {topic}"),
            Duration::from_secs(10),
            || async move {
                let (got, _) = p.fetch_records(0, 1..1_000_000, 200).await.unwrap();
                (got.len() >= n).then(|| got.into_iter().map(|r| r.record).collect())
            },
        )
        .await
    }
}

fn kafka_config(db: &TestDb, response_topic: &str) -> clamp::config::Config {
    let mut cfg = config(&db.url);
    cfg.brokers.kafka_enabled = true;
    cfg.brokers.kafka_brokers = broker().to_string();
    cfg.brokers.kafka_response_topic = response_topic.into();
    cfg
}

fn kafka_then_http(name: &str, topic: &str, d: &Downstream) -> Value {
    json!({"name": name, "steps": [
        {"name": "ask", "mode": "KAFKA", "val": {"connection_url": broker().to_string(), "topic_name": topic}},
        {"name": "use", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]})
}

#[tokio::test]
async fn kafka_step_produces_and_a_reply_on_the_response_topic_completes_it() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (k, steps, responses) = Kafka::with_step_topic().await;
    let s = TestServer::start(kafka_config(&db, &responses)).await;
    let wf = s
        .create_workflow(&kafka_then_http("kafka1", &steps, &d))
        .await;
    assert_eq!(
        wf["steps"][0]["val"]["reply_to"],
        responses.as_str(),
        "{wf}"
    );
    let id = create_request(&s, "kafka1", &json!({"claim": 9})).await;

    let r = k.records(&steps, 1).await.remove(0);
    assert_eq!(
        r.key.as_deref(),
        Some(id.as_bytes()),
        "keyed by the request id"
    );
    assert_eq!(
        serde_json::from_slice::<Value>(r.value.as_deref().unwrap()).unwrap(),
        json!({"claim": 9})
    );
    assert_eq!(r.headers["reply_to"], responses.as_bytes());
    assert_eq!(r.headers["stepId"], b"1");
    assert_eq!(r.headers["Idempotency-Key"], format!("{id}:1").as_bytes());
    let v = wait_status(&s, &id, &["PAUSED"], Duration::from_secs(5)).await;
    assert_eq!(v["status"], "PAUSED", "{v}");

    let reply = step_reply(&id, json!({"approved": true}));
    k.produce(&responses, &reply).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(15)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.received("/api/echo")[0].body, json!({"approved": true}));
    // The position is stored after the resume committed.
    let sql = format!(
        "SELECT coalesce(max(next_offset), 0) FROM kafka_offsets WHERE topic = '{responses}'"
    );
    wait_for(
        "the position to be stored",
        Duration::from_secs(5),
        || async { (db.count(&sql).await >= 1).then_some(()) },
    )
    .await;
    assert_eq!(db.count(&sql).await, 1);
    s.shutdown().await;
}

#[tokio::test]
async fn a_reply_sent_while_no_server_runs_is_applied_when_one_starts() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (k, steps, responses) = Kafka::with_step_topic().await;
    // Without Kafka consuming, so no position is stored yet: the next start must read
    // from the oldest record, not the newest (Clamp lost these).
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&kafka_then_http("kafka2", &steps, &d))
        .await;
    let id = create_request(&s, "kafka2", &json!({})).await;
    k.paused(&s, &id, &steps).await;
    s.shutdown().await;

    k.create_topic(&responses).await;
    let reply = step_reply(&id, json!({"later": true}));
    k.produce(&responses, &reply).await;

    let s = TestServer::start(kafka_config(&db, &responses)).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(15)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.received("/api/echo")[0].body, json!({"later": true}));
    s.shutdown().await;
}

#[tokio::test]
async fn malformed_unknown_and_duplicate_replies_do_not_stop_later_ones() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (k, steps, responses) = Kafka::with_step_topic().await;
    let s = TestServer::start(kafka_config(&db, &responses)).await;
    s.create_workflow(&kafka_then_http("kafka3", &steps, &d))
        .await;
    let id = create_request(&s, "kafka3", &json!({})).await;
    k.paused(&s, &id, &steps).await;

    k.produce(&responses, b"{not json").await;
    let stranger =
        json!({"serviceRequestId": Uuid::now_v7().to_string(), "stepId": 1, "response": {}});
    k.produce(&responses, stranger.to_string().as_bytes()).await;
    let reply = step_reply(&id, json!({"ok": 1}));
    k.produce(&responses, &reply).await;
    k.produce(&responses, &reply).await;

    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(15)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let outcomes = ["malformed", "rejected", "resumed", "duplicate"];
    let m = wait_for(
        "every reply to be counted",
        Duration::from_secs(5),
        || async {
            let m = s.get("/metrics").await.text();
            outcomes
                .iter()
                .all(|o| {
                    m.contains(&format!(
                        r#"clamp_broker_replies_total{{broker="kafka",outcome="{o}"}}"#
                    ))
                })
                .then_some(m)
        },
    )
    .await;
    for outcome in outcomes {
        assert!(
            m.contains(&format!(
                r#"clamp_broker_replies_total{{broker="kafka",outcome="{outcome}"}} 1"#
            )),
            "{outcome}: {m}"
        );
    }
    assert_eq!(d.received("/api/echo").len(), 1);
    s.shutdown().await;
}

#[tokio::test]
async fn a_missing_topic_or_an_unreachable_cluster_fails_the_step_with_the_reason() {
    let db = TestDb::new();
    let k = Kafka::connect().await;
    let mut cfg = config(&db.url);
    cfg.http.timeout = Duration::from_millis(800);
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "nowhere", "steps": [
        {"name": "ask", "mode": "KAFKA", "val": {"connection_url": broker().to_string(), "topic_name": k.name("missing")}}]}))
    .await;
    s.create_workflow(&json!({"name": "down", "steps": [
        {"name": "ask", "mode": "KAFKA", "val": {"connection_url": "127.0.0.1:1", "topic_name": "t"}}]}))
    .await;
    let a = create_request(&s, "nowhere", &json!({})).await;
    let b = create_request(&s, "down", &json!({})).await;
    let v = wait_status(&s, &a, &["FAILED", "PAUSED"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("refused: topic") && reason.contains("does not exist"),
        "{v}"
    );
    // Refused, not retried until the step timeout (800 ms here).
    assert!(v["steps"][0]["time_taken"].as_i64().unwrap() < 600, "{v}");
    let v = wait_status(&s, &b, &["FAILED", "PAUSED"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("failed within 800 ms") && reason.contains("after 3 attempts"),
        "{v}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn responses_arrive_after_a_short_broker_restart() {
    broker_restart(Duration::from_millis(1500)).await;
}

/// Longer than the client's own retries (10 s): the consumer's session fails and a new one
/// must take the partition again (its lock is released with the old session).
#[tokio::test]
async fn responses_arrive_after_a_broker_outage_longer_than_the_client_retries() {
    broker_restart(Duration::from_secs(13)).await;
}

async fn broker_restart(downtime: Duration) {
    let db = TestDb::new();
    let d = Downstream::start().await;
    // A broker of its own: this test stops it.
    let port = free_port();
    let mut own = Killed(start_tansu(port));
    let addr = format!("127.0.0.1:{port}");
    let tag = &Uuid::new_v4().simple().to_string()[..12];
    let (steps, responses) = (
        format!("clamp_t_{tag}_steps"),
        format!("clamp_t_{tag}_responses"),
    );
    let admin = ClientBuilder::new(vec![addr.clone()])
        .build()
        .await
        .unwrap();
    admin
        .controller_client()
        .unwrap()
        .create_topic(steps.as_str(), 1, 1, 5_000)
        .await
        .unwrap();
    let mut cfg = config(&db.url);
    cfg.brokers.kafka_enabled = true;
    cfg.brokers.kafka_brokers = addr.clone();
    cfg.brokers.kafka_response_topic = responses.clone();
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "kafka5", "steps": [
        {"name": "ask", "mode": "KAFKA", "val": {"connection_url": addr, "topic_name": steps}},
        {"name": "use", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let id = create_request(&s, "kafka5", &json!({})).await;
    wait_status(&s, &id, &["PAUSED"], Duration::from_secs(5)).await;

    // The broker goes away for a while and comes back empty (memory storage).
    drop(admin);
    own = {
        drop(own);
        // time is what is tested: how long the broker stays away (see the callers).
        tokio::time::sleep(downtime).await;
        Killed(start_tansu(port))
    };
    // The consumer reconnects and creates its response topic again.
    let admin = ClientBuilder::new(vec![addr.clone()])
        .build()
        .await
        .unwrap();
    wait_for(
        "the consumer to come back and create its topic",
        Duration::from_secs(20),
        || async {
            admin
                .list_topics()
                .await
                .unwrap()
                .iter()
                .any(|t| t.name == responses)
                .then_some(())
        },
    )
    .await;
    let reply = step_reply(&id, json!({"back": true}));
    admin
        .partition_client(responses.as_str(), 0, UnknownTopicHandling::Retry)
        .await
        .unwrap()
        .produce(
            vec![Record {
                key: None,
                value: Some(reply),
                headers: BTreeMap::new(),
                timestamp: chrono::Utc::now(),
            }],
            Compression::NoCompression,
        )
        .await
        .unwrap();
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(15)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.received("/api/echo")[0].body, json!({"back": true}));
    s.shutdown().await;
    drop(own);
}

#[tokio::test]
async fn a_reply_whose_workflow_no_longer_validates_is_dead_lettered_and_the_next_applies() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (k, steps, responses) = Kafka::with_step_topic().await;
    let s = TestServer::start(kafka_config(&db, &responses)).await;
    s.create_workflow(&kafka_then_http("kafka7", &steps, &d))
        .await;
    s.create_workflow(&kafka_then_http("kafka7ok", &steps, &d))
        .await;
    let broken = create_request(&s, "kafka7", &json!({})).await;
    k.paused(&s, &broken, &steps).await;
    let fine = create_request(&s, "kafka7ok", &json!({})).await;
    wait_status(&s, &fine, &["PAUSED"], Duration::from_secs(5)).await;
    s.shutdown().await;
    crate::broker_amqp::break_workflow(&db, "kafka7").await;

    let s = TestServer::start(kafka_config(&db, &responses)).await;
    k.produce(&responses, &step_reply(&broken, json!({"a": 1})))
        .await;
    k.produce(&responses, &step_reply(&fine, json!({"b": 2})))
        .await;
    // The one behind it on the same partition is applied: nothing blocks the partition.
    let v = wait_status(&s, &fine, &["COMPLETED", "FAILED"], Duration::from_secs(15)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let c = db.client().await;
    let row = c
        .query_one(
            "SELECT source, topic, record_offset, convert_from(body, 'UTF8'), reason FROM dead_letters",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "kafka");
    assert_eq!(row.get::<_, &str>(1), responses);
    assert_eq!(row.get::<_, i64>(2), 0);
    assert!(row.get::<_, &str>(3).contains(&broken));
    assert!(row.get::<_, &str>(4).contains("no longer validates"));
    s.shutdown().await;
}

#[tokio::test]
async fn a_kafka_step_carries_the_trace_context_as_record_headers() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (k, steps, responses) = Kafka::with_step_topic().await;
    let s = TestServer::start(kafka_config(&db, &responses)).await;
    s.create_workflow(&kafka_then_http("kafkatrace", &steps, &d))
        .await;
    let caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let created = crate::support::send(
        s.addr,
        hyper::Method::POST,
        "/serviceRequest/kafkatrace",
        Some(b"{}".to_vec()),
        &[("traceparent", caller)],
    )
    .await;
    assert_eq!(created.status, 200, "{}", created.text());
    let r = k.records(&steps, 1).await.remove(0);
    // Tracing is off here: the caller's context goes on as it came.
    assert_eq!(r.headers["traceparent"], caller.as_bytes());
    s.shutdown().await;
}

/// A KAFKA step in a PARALLEL branch (beyond Clamp): its record is keyed by the branch's
/// own request, pauses that branch only (the other completes), and the reply naming the
/// branch's request resumes it; the step joins both answers by branch name.
#[tokio::test]
async fn a_kafka_step_in_a_branch_is_resumed_by_its_reply_while_the_other_completes() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (k, steps, responses) = Kafka::with_step_topic().await;
    let s = TestServer::start(kafka_config(&db, &responses)).await;
    s.create_workflow(&json!({"name": "split", "steps": [
        {"name": "both", "mode": "PARALLEL", "val": {"branches": [
            {"name": "broker", "steps": [
                {"name": "ask", "mode": "KAFKA", "val": {"connection_url": broker().to_string(), "topic_name": steps}}]},
            {"name": "web", "steps": [
                {"name": "call", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}]}}]}))
    .await;
    let id = create_request(&s, "split", &json!({"claim": 3})).await;
    let r = k.records(&steps, 1).await.remove(0);
    let branch = String::from_utf8(r.key.clone().unwrap()).unwrap();
    assert_ne!(branch, id, "keyed by the branch's own request");
    assert_eq!(
        r.headers["Idempotency-Key"],
        format!("{branch}:1").as_bytes()
    );
    d.wait_for("/api/echo").await;
    // PAUSED once the other branch has finished and only the waiting one is left.
    let v = wait_status(&s, &id, &["PAUSED"], Duration::from_secs(5)).await;
    assert_eq!(v["status"], "PAUSED", "{v}");
    k.produce(&responses, &step_reply(&branch, json!({"approved": true})))
        .await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(15)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(
        response_of(&v, "both"),
        json!({"broker": {"approved": true}, "web": {"echo": {"claim": 3}}}),
        "{v}"
    );
    s.shutdown().await;
}

/// A Kafka step's `answerTimeout`: no reply comes, so the record is produced again as
/// its retry policy allows, then the step fails "no answer within" and its onFailure step
/// runs; a reply that comes after that changes nothing.
#[tokio::test]
async fn a_kafka_step_without_a_reply_in_time_is_sent_again_then_fails() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let (k, steps, responses) = Kafka::with_step_topic().await;
    let s = TestServer::start(kafka_config(&db, &responses)).await;
    s.create_workflow(&json!({"name": "kafka-timeout", "steps": [
        {"name": "ask", "mode": "KAFKA", "answerTimeout": "PT1S", "retry": {"maxAttempts": 2},
         "val": {"connection_url": broker().to_string(), "topic_name": steps},
         "onFailure": [{"name": "undo", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}]}))
    .await;
    let id = create_request(&s, "kafka-timeout", &json!({"x": 1})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(15)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("no answer within"),
        "{v}"
    );
    assert_eq!(d.received("/api/echo").len(), 1, "onFailure ran once");
    // Produced twice: the first attempt and the one its timeout sent again.
    let sent = k.records(&steps, 2).await;
    assert_eq!(sent.len(), 2, "sent twice, no more");
    for r in &sent {
        assert_eq!(r.key.as_deref(), Some(id.as_bytes()));
        assert_eq!(r.headers["stepId"], b"1");
    }
    // Late: the step has its final record, so the reply is a repeat that changes nothing.
    k.produce(&responses, &step_reply(&id, json!({"late": true})))
        .await;
    // Its position is stored once it was taken.
    let sql = format!(
        "SELECT coalesce(max(next_offset), 0) FROM kafka_offsets WHERE topic = '{responses}'"
    );
    wait_for(
        "the late reply to be taken",
        Duration::from_secs(10),
        || async { (db.count(&sql).await >= 1).then_some(()) },
    )
    .await;
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "FAILED", "{v}");
    assert_eq!(d.received("/api/echo").len(), 1);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_the_clusters_metadata_names_is_judged_before_it_is_dialled() {
    // A broker that tells clients, in its metadata, to reach it as localhost:<front>; the
    // front records every connection and forwards it to the broker.
    let port = free_port();
    let upstream: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let front = Recorder::start("127.0.0.1:0", Some(upstream)).await;
    let advertised = format!("localhost:{}", front.addr.port());
    let _broker = Killed(start_tansu_advertising(
        port,
        &format!("tcp://{advertised}"),
    ));
    let admin = ClientBuilder::new(vec![upstream.to_string()])
        .build()
        .await
        .unwrap();
    admin
        .controller_client()
        .unwrap()
        .create_topic("advertised", 1, 1, 5_000)
        .await
        .unwrap();
    let step = |name: &str| {
        json!({"name": name, "steps": [{"name": "call", "mode": "KAFKA",
            "val": {"connection_url": upstream.to_string(), "topic_name": "advertised"}}]})
    };
    // The name the metadata gives is denied; the bootstrap address is not.
    front.reset();
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.destinations = std::sync::Arc::new(
        clamp::destinations::Destinations::new::<&str>(&[], &["localhost"]).unwrap(),
    );
    let s = TestServer::start(cfg).await;
    s.create_workflow(&step("meta")).await;
    let id = create_request(&s, "meta", &json!({})).await;
    let v = wait_status(&s, &id, &["FAILED", "PAUSED"], Duration::from_secs(30)).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("refused by the destination policy")
            && reason.contains(&advertised)
            && reason.contains("that the cluster named"),
        "{reason}"
    );
    assert_eq!(front.dialled(), 0, "the advertised broker was dialled");
    s.shutdown().await;
    // With nothing denied, the same step reaches the broker where its metadata says.
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&step("meta")).await;
    let id = create_request(&s, "meta", &json!({})).await;
    wait_status(&s, &id, &["PAUSED"], Duration::from_secs(30)).await;
    assert!(front.dialled() > 0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_step_to_another_broker_gets_none_of_the_servers_credentials() {
    let (k, steps, _) = Kafka::with_step_topic().await;
    // Every byte a step's client sends to the broker passes the recorder.
    let front = Recorder::start("127.0.0.1:0", Some(broker())).await;
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.brokers.kafka_security = clamp::config::KafkaSecurity {
        tls: false,
        ca_file: None,
        sasl: Some(clamp::config::KafkaSasl {
            // SCRAM's first message names the user before the broker can refuse it.
            mechanism: clamp::config::SaslMechanism::ScramSha256,
            username: "server-own-user-5b1c".into(),
            password: "server-own-password-8d2e".into(),
        }),
    };
    let s = TestServer::start(cfg).await;
    s.create_workflow(
        &json!({"name": "k", "steps": [{"name": "call", "mode": "KAFKA",
        "val": {"connection_url": front.addr.to_string(), "topic_name": steps}}]}),
    )
    .await;
    let id = create_request(&s, "k", &json!({"n": 1})).await;
    let v = wait_status(&s, &id, &["PAUSED", "FAILED"], Duration::from_secs(30)).await;
    assert!(front.dialled() > 0);
    assert!(
        !front.heard(b"server-own-user-5b1c"),
        "the server's user was sent"
    );
    assert!(!front.heard(b"server-own-password-8d2e"));
    assert_eq!(v["status"], "PAUSED", "{v}");
    k.paused(&s, &id, &steps).await;
    s.shutdown().await;
}

/// A workflow's outcomes told on a Kafka topic (beyond Clamp): one record per
/// notification, keyed by its request (a request's notifications share a partition, in
/// order), with `notificationId` and `Idempotency-Key: notification:<id>` headers; a
/// FAILED request and the COMPLETED of its retry are both told, in that order.
#[tokio::test]
async fn outcomes_are_told_on_a_topic_keyed_by_request_in_order() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let k = Kafka::connect().await;
    let told = k.name("told");
    k.create_topic(&told).await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "told", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/flaky/500")}}],
        "notify": [{"on": ["COMPLETED", "FAILED"],
                    "kafka": {"connection_url": broker().to_string(), "topic_name": told}}]}))
        .await;
    let id = create_request(&s, "told", &json!({"n": 1})).await;
    wait_status(&s, &id, &["FAILED"], Duration::from_secs(20)).await;
    let r = s.post(&format!("/serviceRequest/{id}/retry"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    wait_status(&s, &id, &["COMPLETED"], Duration::from_secs(20)).await;
    let records = k.records(&told, 2).await;
    let statuses: Vec<String> = records
        .iter()
        .map(|r| {
            let body: Value = serde_json::from_slice(r.value.as_ref().unwrap()).unwrap();
            assert_eq!(body["serviceRequestId"], id.as_str());
            assert_eq!(r.key.as_deref(), Some(id.as_bytes()));
            let n = body["id"].as_str().unwrap();
            assert_eq!(r.headers["notificationId"], n.as_bytes());
            assert_eq!(
                r.headers["Idempotency-Key"],
                format!("notification:{n}").as_bytes()
            );
            body["status"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(statuses, ["FAILED", "COMPLETED"]);
    s.shutdown().await;
}
