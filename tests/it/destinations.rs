//! Where steps may call (beyond Clamp): link-local and metadata destinations are refused
//! when a workflow is defined; a name that resolves to a denied address is refused when
//! the call is made (permanently, saying which rule), and an allow-list lets only what
//! it names through.

use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);

fn http(url: &str) -> Value {
    json!({"name": "call", "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

/// A server with this destination policy.
async fn with_policy(db: &TestDb, allow: &[&str], deny: &[&str]) -> TestServer {
    let mut cfg = config(&db.url);
    cfg.destinations =
        std::sync::Arc::new(clamp::destinations::Destinations::new(allow, deny).unwrap());
    TestServer::start(cfg).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_and_link_local_steps_are_refused_at_definition() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    for (step, needle) in [
        (
            http("http://169.254.169.254/latest/meta-data/"),
            "169.254.169.254 is in 169.254.0.0/16",
        ),
        (
            http("http://metadata.google.internal/computeMetadata/v1/"),
            "metadata.google.internal is denied",
        ),
        (http("http://[fe80::1]:8080/"), "fe80::/10"),
        (
            json!({"name": "call", "mode": "AMQP", "val": {"connection_url": "amqp://guest:guest@169.254.169.254:5672/%2f", "queue_name": "q"}}),
            "169.254.169.254",
        ),
        (
            json!({"name": "fan", "mode": "PARALLEL", "val": {"branches": [
                {"name": "a", "steps": [http("http://169.254.169.254/")]}]}}),
            "destination policy",
        ),
    ] {
        let r = s
            .post_json("/workflow", &json!({"name": "w", "steps": [step]}))
            .await;
        let msg = r.expect_error(400);
        assert!(
            msg.contains("refused by the destination policy") && msg.contains(needle),
            "{msg}"
        );
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_resolving_to_a_denied_address_is_refused_at_call_time() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    // `localhost` resolves to loopback on every machine: denied here, for this server.
    let s = with_policy(&db, &[], &["127.0.0.0/8", "::1"]).await;
    let url = format!("http://localhost:{}/api/echo", d.addr.port());
    // A name is not refused at definition: only its addresses can say.
    s.create_workflow(&json!({"name": "w", "steps": [http(&url)]}))
        .await;
    let id = create_request(&s, "w", &json!({})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("refused by the destination policy")
            && reason.contains("localhost (")
            && reason.contains("--deny-destinations"),
        "{reason}"
    );
    // Permanent: one attempt, and nothing reached the downstream.
    assert_eq!(step_entry(&v, "call", "FAILED")["attempts"], 1, "{v}");
    assert!(d.received("/api/echo").is_empty());
    // A literal denied address is refused at definition.
    let r = s
        .post_json(
            "/workflow",
            &json!({"name": "w2", "steps": [http(&d.url("/api/echo"))]}),
        )
        .await;
    assert!(r.expect_error(400).contains("127.0.0.0/8"));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_list_lets_only_what_it_names_through() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = with_policy(&db, &["127.0.0.1"], &[]).await;
    s.create_workflow(&json!({"name": "w", "steps": [http(&d.url("/api/echo"))]}))
        .await;
    let id = create_request(&s, "w", &json!({"n": 1})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let r = s
        .post_json(
            "/workflow",
            &json!({"name": "w2", "steps": [http("http://10.255.255.1/x")]}),
        )
        .await;
    assert!(r.expect_error(400).contains("not in --allow-destinations"));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_whose_name_resolves_to_a_denied_address_is_refused_before_connecting() {
    let db = TestDb::new();
    let s = with_policy(&db, &[], &["127.0.0.0/8", "::1"]).await;
    s.create_workflow(
        &json!({"name": "w", "steps": [{"name": "call", "mode": "AMQP",
        "val": {"connection_url": "amqp://guest:guest@localhost:5672/%2f", "queue_name": "q"}}]}),
    )
    .await;
    let id = create_request(&s, "w", &json!({})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("refused by the destination policy") && reason.contains("localhost"),
        "{reason}"
    );
    assert_eq!(step_entry(&v, "call", "FAILED")["attempts"], 1, "{v}");
    s.shutdown().await;
}

/// A step of `mode` to `url`.
fn broker(mode: &str, url: &str) -> Value {
    match mode {
        "AMQP" => json!({"name": "call", "mode": "AMQP",
            "val": {"connection_url": url, "queue_name": "q"}}),
        _ => json!({"name": "call", "mode": "KAFKA",
            "val": {"connection_url": url, "topic_name": "t"}}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_denied_broker_or_address_is_refused_at_definition() {
    let db = TestDb::new();
    let s = with_policy(&db, &[], &["127.0.0.0/8", "::1"]).await;
    for (step, needle) in [
        // Read as the AMQP client reads it: the escapes decode to 127.0.0.1.
        (
            broker("AMQP", "amqp://guest:guest@127%2E0%2E0%2E1:5672/%2f"),
            "127.0.0.0/8",
        ),
        // The URL's authority ends at '#': its host is 127.0.0.1, not example.com.
        (
            broker("AMQP", "amqp://guest:guest@127.0.0.1:5672#@example.com/"),
            "#fragment",
        ),
        // Two brokers to the Kafka client, so two brokers to the policy.
        (broker("KAFKA", "x://example.com:1,127.0.0.1:9092"), "x://"),
        (
            broker("KAFKA", "kafka://example.com:1,127.0.0.1:9092"),
            "127.0.0.0/8",
        ),
        (broker("KAFKA", "example.com:1,0.0.0.0:9092"), "127.0.0.0/8"),
        (
            broker("AMQP", "amqp://g:g@[64:ff9b::7f00:1]:5672/"),
            "127.0.0.0/8",
        ),
        (
            broker("AMQP", "amqp://g:g@{{secret:broker_host}}:5672/"),
            "not a host",
        ),
        (http("http://0.0.0.0:8080/"), "127.0.0.0/8"),
        (http("http://[::]:8080/"), "::1"),
        (http("http://[::ffff:127.0.0.1]:8080/"), "127.0.0.0/8"),
        (http("http://[64:ff9b::127.0.0.1]:8080/"), "127.0.0.0/8"),
        (http("http://[64:ff9b:1::7f00:1]:8080/"), "127.0.0.0/8"),
        (http("http://[2002:7f00:1::1]:8080/"), "127.0.0.0/8"),
    ] {
        let r = s
            .post_json("/workflow", &json!({"name": "w", "steps": [step]}))
            .await;
        let msg = r.expect_error(400);
        assert!(msg.contains(needle), "{step}: {msg}");
    }
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_denied_address_is_refused_at_call_time_before_it_is_dialled() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = d.addr.port();
    let recorder = Recorder::start("127.0.0.1:0", None).await;
    let six = Recorder::start("[::1]:0", None).await;
    let (r, r6) = (recorder.addr.port(), six.addr.port());
    // Defined where nothing but the built-in rules applies (an earlier policy, say).
    let open = TestServer::start(config(&db.url)).await;
    let steps = [
        http(&format!("http://0.0.0.0:{port}/api/echo")),
        http(&format!("http://[::]:{r6}/x")),
        broker(
            "AMQP",
            &format!("amqp://guest:guest@127%2E0%2E0%2E1:{r}/%2f"),
        ),
        broker("AMQP", &format!("amqp://guest:guest@0.0.0.0:{r}/%2f")),
        broker("KAFKA", &format!("kafka://example.invalid:1,127.0.0.1:{r}")),
        broker("KAFKA", &format!("0.0.0.0:{r}")),
        broker("KAFKA", &format!("[::ffff:127.0.0.1]:{r}")),
    ];
    for (i, step) in steps.iter().enumerate() {
        open.create_workflow(&json!({"name": format!("w{i}"), "steps": [step]}))
            .await;
    }
    // Under that policy, 0.0.0.0 reaches this host's downstream.
    let id = create_request(&open, "w0", &json!({})).await;
    let v = wait_status(&open, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.received("/api/echo").len(), 1);
    open.shutdown().await;
    // Now loopback is denied: every one of them fails, and nothing was dialled.
    let s = with_policy(&db, &[], &["127.0.0.0/8", "::1"]).await;
    for (i, step) in steps.iter().enumerate() {
        let id = create_request(&s, &format!("w{i}"), &json!({})).await;
        let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "FAILED", "{step}: {v}");
        let reason = v["reason"].as_str().unwrap();
        assert!(
            reason.contains("refused by the destination policy"),
            "{step}: {reason}"
        );
        assert_eq!(step_entry(&v, "call", "FAILED")["attempts"], 1, "{v}");
    }
    assert_eq!(d.received("/api/echo").len(), 1, "no second call");
    assert_eq!(recorder.dialled(), 0);
    assert_eq!(six.dialled(), 0);
    s.shutdown().await;
}
