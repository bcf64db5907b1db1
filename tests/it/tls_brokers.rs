//! Brokers over TLS: `amqps://` against a RabbitMQ node of the test's own that speaks TLS
//! only (`scripts/rabbitmq-tls.sh`), and Kafka over TLS with SCRAM against tansu. tansu
//! 0.6 authenticates SASL but does not serve TLS (its `--cert` is read and not used), so
//! the test puts a TLS terminator of its own in front of it, as a load balancer would be:
//! TLS runs from clamp to the terminator, SCRAM from clamp to the broker.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, Credentials, SaslConfig};
use rskafka::record::Record;
use serde_json::{json, Value};

use crate::pki::Ca;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);
const ODD_PASSWORD: &str = "p@ss:w/rd %x?#";

/// A RabbitMQ node with a TLS listener only, stopped and removed on drop.
struct TlsRabbit {
    dir: String,
    port: u16,
}

impl TlsRabbit {
    fn script() -> String {
        format!("{}/scripts/rabbitmq-tls.sh", env!("CARGO_MANIFEST_DIR"))
    }

    fn start(ca: &Ca) -> TlsRabbit {
        let pair = ca.server("rabbit", &["localhost", "127.0.0.1"]);
        let dir = format!(
            "/tmp/clamp-it-rabbit-tls-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        );
        let out = std::process::Command::new(Self::script())
            .args(["start", &dir])
            .arg(ca.ca_file())
            .arg(&pair.cert)
            .arg(&pair.key)
            .output()
            .expect("rabbitmq-tls.sh runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        TlsRabbit { dir, port }
    }

    fn url(&self) -> String {
        format!("amqps://guest:guest@localhost:{}/%2f", self.port)
    }
}

impl Drop for TlsRabbit {
    fn drop(&mut self) {
        let _ = std::process::Command::new(Self::script())
            .args(["stop", &self.dir])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_steps_and_responses_go_over_tls() {
    let ca = Ca::new("amqps");
    let rabbit = TlsRabbit::start(&ca);
    let url = rabbit.url();
    let tls = OwnedTLSConfig {
        identity: None,
        cert_chain: Some(std::fs::read_to_string(ca.ca_file()).unwrap()),
    };
    let conn = Connection::connect_with_config(
        &url,
        ConnectionProperties::default(),
        tls,
        lapin::runtime::default_runtime().unwrap(),
    )
    .await
    .expect("the test connects over TLS");
    let ch = conn.create_channel().await.unwrap();
    for q in ["steps", "responses", "responses.dead"] {
        ch.queue_declare(
            q.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    }
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.brokers.amqp_enabled = true;
    cfg.brokers.amqp_url = url.clone();
    cfg.brokers.amqp_response_queue = "responses".into();
    cfg.brokers.amqp_ca_file = Some(ca.ca_file());
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "amqps", "steps": [
        {"name": "ask", "mode": "AMQP", "val": {"connection_url": url, "queue_name": "steps"}}]}))
        .await;
    let id = create_request(&s, "amqps", &json!({"claim": 5})).await;
    let m = wait_for("the step message over TLS", WAIT, || async {
        ch.basic_get("steps".into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
            .map(|m| m.delivery)
    })
    .await;
    assert_eq!(
        serde_json::from_slice::<Value>(&m.data).unwrap(),
        json!({"claim": 5})
    );
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    ch.basic_publish(
        "".into(),
        "responses".into(),
        BasicPublishOptions::default(),
        &step_reply(&id, json!({"approved": true})),
        BasicProperties::default(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let v = wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    assert_eq!(v["steps"][1]["payload"]["response"]["approved"], true);
    s.shutdown().await;

    // Without the CA, the certificate is not trusted: the step fails once, saying so.
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "amqps-untrusted", "steps": [
        {"name": "ask", "mode": "AMQP", "val": {"connection_url": rabbit.url(), "queue_name": "steps"}}]}))
    .await;
    let id = create_request(&s, "amqps-untrusted", &json!({})).await;
    let v = wait_status(&s, &id, &["FAILED"], WAIT).await;
    let why = v["reason"].as_str().unwrap();
    assert!(why.contains("TLS handshake failed"), "{why}");
    assert!(why.contains("trusted CA"), "{why}");
    assert_eq!(v["steps"][1]["attempts"], 1, "{v}");
    s.shutdown().await;
}

/// tansu with SQLite storage (which keeps SCRAM credentials) behind a TLS terminator,
/// which reaches it through a recorder (what clients say inside TLS, SASL included).
struct SecureKafka {
    dir: std::path::PathBuf,
    _broker: Spawned,
    /// Where clients connect: the terminator, as `localhost:<port>`.
    pub bootstrap: String,
    tls: Arc<rustls::ClientConfig>,
    pub inside: Recorder,
}

fn tansu(dir: &std::path::Path, port: u16, advertised: &str, auth: bool) -> Spawned {
    let mut cmd = std::process::Command::new(crate::broker_kafka::tansu_bin());
    cmd.current_dir(dir)
        .args([
            "broker",
            "--listener-url",
            &format!("tcp://127.0.0.1:{port}"),
        ])
        .args(["--advertised-listener-url", advertised])
        .args(["--storage-engine", "sqlite://tansu.db"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if auth {
        cmd.arg("--authentication");
    }
    let child = Spawned(
        cmd.spawn()
            .expect("tansu starts (scripts/services.sh installs it)"),
    );
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // A blocking wait, as `broker_kafka`'s: this function is not async.
    wait_for_blocking(
        &format!("tansu to listen on {addr}"),
        Duration::from_secs(20),
        || std::net::TcpStream::connect(addr).ok().map(drop),
    );
    child
}

impl SecureKafka {
    async fn start(ca: &Ca) -> SecureKafka {
        let dir = std::env::temp_dir().join(format!(
            "clamp-it-kafka-tls-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        // Users first, on a broker without authentication over the same storage.
        {
            let port = free_port();
            let url = format!("tcp://127.0.0.1:{port}");
            let _setup = tansu(&dir, port, &url, false);
            for (user, password, mechanism) in [
                ("clamp256", "secret-256", "scram256"),
                ("clamp512", "secret-512", "scram512"),
                // A password that must be percent-encoded into a connection string.
                ("clamp-odd", ODD_PASSWORD, "scram256"),
            ] {
                let out = std::process::Command::new(crate::broker_kafka::tansu_bin())
                    .current_dir(&dir)
                    .args(["user", "create", "--broker", &url, user, password])
                    .args(["--mechanism", mechanism])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let terminator = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = terminator.local_addr().unwrap().port();
        let port = free_port();
        let broker = tansu(&dir, port, &format!("tcp://localhost:{front}"), true);
        let inside = Recorder::start(
            "127.0.0.1:0",
            Some(format!("127.0.0.1:{port}").parse().unwrap()),
        )
        .await;
        let through = inside.addr;
        let acceptor = tokio_rustls::TlsAcceptor::from(Ca::server_config(
            &ca.server("kafka", &["localhost", "127.0.0.1"]),
            None,
        ));
        tokio::spawn(async move {
            while let Ok((client, _)) = terminator.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut client) = acceptor.accept(client).await else {
                        return;
                    };
                    let Ok(mut upstream) = tokio::net::TcpStream::connect(through).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                });
            }
        });
        SecureKafka {
            dir,
            _broker: broker,
            bootstrap: format!("localhost:{front}"),
            tls: ca.client_config_plain(),
            inside,
        }
    }

    async fn client(&self, sasl: SaslConfig) -> Result<Client, rskafka::client::error::Error> {
        ClientBuilder::new(vec![self.bootstrap.clone()])
            .tls_config(self.tls.clone())
            .sasl_config(sasl)
            .build()
            .await
    }
}

impl Drop for SecureKafka {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn scram256(password: &str) -> SaslConfig {
    SaslConfig::ScramSha256(Credentials::new("clamp256".into(), password.into()))
}

fn security(
    ca: &Ca,
    mechanism: clamp::config::SaslMechanism,
    user: &str,
    password: &str,
) -> clamp::config::KafkaSecurity {
    clamp::config::KafkaSecurity {
        tls: true,
        ca_file: Some(ca.ca_file()),
        sasl: Some(clamp::config::KafkaSasl {
            mechanism,
            username: user.into(),
            password: password.into(),
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_steps_and_responses_go_over_tls_with_scram() {
    let ca = Ca::new("kafka");
    let kafka = SecureKafka::start(&ca).await;
    let admin = kafka
        .client(scram256("secret-256"))
        .await
        .expect("the test connects over TLS and SCRAM");
    let controller = admin.controller_client().unwrap();
    for topic in ["tls-steps", "tls-responses"] {
        controller.create_topic(topic, 1, 1, 5_000).await.unwrap();
    }
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.brokers.kafka_enabled = true;
    cfg.brokers.kafka_brokers = kafka.bootstrap.clone();
    cfg.brokers.kafka_response_topic = "tls-responses".into();
    cfg.brokers.kafka_security = security(
        &ca,
        clamp::config::SaslMechanism::ScramSha256,
        "clamp256",
        "secret-256",
    );
    // The step's credentials are its own, from its connection string and a secret.
    let secrets =
        std::env::temp_dir().join(format!("clamp-it-kafka-secrets-{}", fastrand::u32(..)));
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::write(secrets.join("kafka_512"), "secret-512\n").unwrap();
    std::fs::write(secrets.join("kafka_odd"), ODD_PASSWORD).unwrap();
    cfg.secrets = Arc::new(clamp::secrets::Secrets::new(Some(secrets.clone())));
    let own = |user: &str, secret: &str, mechanism: &str| {
        format!(
            "kafka://{user}:{{{{secret:{secret}}}}}@{}?security.protocol=SASL_SSL&sasl.mechanism={mechanism}",
            kafka.bootstrap
        )
    };
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "kafka-tls", "steps": [
        {"name": "ask", "mode": "KAFKA", "val": {"connection_url": own("clamp512", "kafka_512", "SCRAM-SHA-512"), "topic_name": "tls-steps"}}]}))
    .await;
    let id = create_request(&s, "kafka-tls", &json!({"claim": 11})).await;
    let steps = admin
        .partition_client("tls-steps", 0, UnknownTopicHandling::Retry)
        .await
        .unwrap();
    let record = wait_for("the step record over TLS", WAIT, || async {
        let (got, _) = steps.fetch_records(0, 1..1_000_000, 200).await.unwrap();
        got.into_iter().next().map(|r| r.record)
    })
    .await;
    assert_eq!(record.key.as_deref(), Some(id.as_bytes()));
    assert_eq!(
        serde_json::from_slice::<Value>(record.value.as_deref().unwrap()).unwrap(),
        json!({"claim": 11})
    );
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    let responses = admin
        .partition_client("tls-responses", 0, UnknownTopicHandling::Retry)
        .await
        .unwrap();
    responses
        .produce(
            vec![Record {
                key: None,
                value: Some(step_reply(&id, json!({"approved": true}))),
                headers: BTreeMap::new(),
                timestamp: chrono::Utc::now(),
            }],
            Compression::NoCompression,
        )
        .await
        .unwrap();
    let v = wait_status(&s, &id, &["COMPLETED"], WAIT).await;
    assert_eq!(v["steps"][1]["payload"]["response"]["approved"], true);
    s.shutdown().await;

    // A step never carries the server's own credentials (the consumer's, SCRAM-SHA-256 as
    // clamp256 here, with no consumer running): only its own. Its password needs
    // percent-encoding into the connection string; SCRAM authenticates only if the
    // step's client got it back exactly. (A wrong password is not tried: tansu 0.6 leaves
    // a client with a wrong SCRAM proof waiting instead of answering that it failed.)
    let db = TestDb::new();
    let mut cfg = config(&db.url);
    cfg.brokers.kafka_security = security(
        &ca,
        clamp::config::SaslMechanism::ScramSha256,
        "clamp256",
        "secret-256",
    );
    cfg.secrets = Arc::new(clamp::secrets::Secrets::new(Some(secrets.clone())));
    let s = TestServer::start(cfg).await;
    kafka.inside.reset();
    s.create_workflow(&json!({"name": "kafka-tls-own", "steps": [
        {"name": "ask", "mode": "KAFKA", "val": {"connection_url": own("clamp-odd", "kafka_odd", "SCRAM-SHA-256"), "topic_name": "tls-steps"}}]}))
    .await;
    let id = create_request(&s, "kafka-tls-own", &json!({"user": "clamp-odd"})).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    let (records, _) = steps.fetch_records(0, 1..1_000_000, 200).await.unwrap();
    assert!(records
        .iter()
        .any(|r| r.record.key.as_deref() == Some(id.as_bytes())));
    assert!(kafka.inside.heard(b"n=clamp-odd,"), "the step's own user");
    assert!(
        !kafka.inside.heard(b"clamp256"),
        "the server's user went to a step's broker"
    );
    s.shutdown().await;
    std::fs::remove_dir_all(&secrets).unwrap();

    // Without TLS the terminator answers nothing a Kafka client understands.
    let plain = ClientBuilder::new(vec![kafka.bootstrap.clone()])
        .sasl_config(scram256("secret-256"))
        .backoff_config(rskafka::BackoffConfig {
            deadline: Some(Duration::from_secs(3)),
            ..Default::default()
        })
        .build();
    assert!(tokio::time::timeout(Duration::from_secs(10), plain)
        .await
        .map_or(true, |r| r.is_err()));
}

/// A Kafka trigger (beyond Clamp) reads its topic over TLS with its own SCRAM-SHA-512
/// credentials (a secret), not the server's: every record starts its request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_trigger_reads_over_tls_with_its_own_scram_credentials() {
    let ca = Ca::new("kafka");
    let kafka = SecureKafka::start(&ca).await;
    let admin = kafka
        .client(scram256("secret-256"))
        .await
        .expect("the test connects over TLS and SCRAM");
    admin
        .controller_client()
        .unwrap()
        .create_topic("tls-orders", 2, 1, 5_000)
        .await
        .unwrap();
    let db = TestDb::new();
    let d = crate::downstream::Downstream::start().await;
    let mut cfg = config(&db.url);
    // The server's own Kafka settings give the CA; their credentials (clamp256) are the
    // server's, and the trigger must not use them.
    cfg.brokers.kafka_security = security(
        &ca,
        clamp::config::SaslMechanism::ScramSha256,
        "clamp256",
        "secret-256",
    );
    let secrets =
        std::env::temp_dir().join(format!("clamp-it-kafka-secrets-{}", fastrand::u32(..)));
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::write(secrets.join("kafka_512"), "secret-512\n").unwrap();
    cfg.secrets = Arc::new(clamp::secrets::Secrets::new(Some(secrets.clone())));
    let s = TestServer::start(cfg).await;
    s.create_workflow(&json!({"name": "orders", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let connection = format!(
        "kafka://clamp512:{{{{secret:kafka_512}}}}@{}?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-512",
        kafka.bootstrap
    );
    let r = s
        .post_json(
            "/triggers",
            &json!({"name": "tls-in", "workflow": "orders",
                    "source": {"kafka": {"connection": connection, "topic": "tls-orders"}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    for n in 0..10 {
        admin
            .partition_client("tls-orders", n % 2, UnknownTopicHandling::Retry)
            .await
            .unwrap()
            .produce(
                vec![Record {
                    key: None,
                    value: Some(json!({"n": n}).to_string().into_bytes()),
                    headers: BTreeMap::new(),
                    timestamp: chrono::Utc::now(),
                }],
                Compression::NoCompression,
            )
            .await
            .unwrap();
    }
    wait_for("10 requests COMPLETED", WAIT, || async {
        (db.count("SELECT count(*) FROM service_requests WHERE status = 'COMPLETED'")
            .await
            == 10)
            .then_some(())
    })
    .await;
    // It authenticated as its own user (SCRAM-SHA-512, clamp512).
    assert!(kafka.inside.heard(b"clamp512"));
    s.shutdown().await;
    let _ = std::fs::remove_dir_all(&secrets);
}
