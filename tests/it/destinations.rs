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
