//! A workflow's `inputSchema` (beyond Clamp): a create whose payload does not meet it is
//! 400 naming each failing path, and nothing is stored or called; the same schema holds
//! for every create path (batched, delayed, limited), a trigger's messages (dead-lettered
//! with the reason) and a schedule's payload (refused at definition).

use std::time::Duration;

use hmac::{Hmac, Mac};
use hyper::Method;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::downstream::Downstream;
use crate::support::*;

fn schema() -> Value {
    json!({"type": "object", "required": ["amount", "currency"],
           "properties": {"amount": {"type": "number", "minimum": 0},
                          "currency": {"enum": ["EUR", "USD"]},
                          "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}},
           "$defs": {"line": {"type": "object", "required": ["sku"]}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_that_fails_the_schema_is_refused_on_every_path_and_nothing_is_stored() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let dir = std::env::temp_dir().join(format!("clamp-secrets-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("HOOK"), "schema-hook-key").unwrap();
    let mut cfg = config(&db.url);
    cfg.secrets = std::sync::Arc::new(clamp::secrets::Secrets::new(Some(dir)));
    let s = TestServer::start(cfg).await;
    let step = json!({"name": "pay", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}});
    let created = s
        .create_workflow(&json!({"name": "pay", "inputSchema": schema(), "steps": [step.clone()]}))
        .await;
    assert_eq!(created["inputSchema"], schema(), "shown as given");
    s.create_workflow(&json!({"name": "pay-limited", "inputSchema": schema(),
        "concurrency": {"key": "payload.currency", "limit": 2}, "steps": [step.clone()]}))
        .await;

    let bad = json!({"currency": "GBP", "lines": [{"sku": "a"}, {}]});
    for path in [
        "/serviceRequest/pay",
        "/serviceRequest/pay?delayMs=1000",
        "/serviceRequest/pay-limited",
    ] {
        let r = s.post(path, &bad.to_string()).await;
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        let why = r.json()["message"].as_str().unwrap_or_default().to_string();
        assert!(why.contains("inputSchema"), "{path}: {why}");
        assert!(
            why.contains("/: \"amount\" is a required property"),
            "{why}"
        );
        assert!(why.contains("/currency: "), "{why}");
        assert!(
            why.contains("/lines/1: \"sku\" is a required property"),
            "{why}"
        );
    }
    // An empty body is the payload {}: refused too.
    assert_eq!(s.post("/serviceRequest/pay", "").await.status, 400);
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 0);
    assert!(d.received("/api/echo").is_empty());

    let good = json!({"amount": 12.5, "currency": "EUR", "lines": [{"sku": "a"}]});
    let id = create_request(&s, "pay", &good).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], Duration::from_secs(20)).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");

    // A schedule whose payload fails is refused at definition.
    let r = s
        .post_json(
            "/schedules",
            &json!({"name": "nightly-pay", "workflow": "pay",
            "cron": "0 30 2 * * *", "payload": {"amount": -1, "currency": "EUR"}}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("payload: "), "{}", r.text());
    assert!(r.text().contains("/amount"), "{}", r.text());

    // A trigger's message that fails it is kept as a dead letter, and acknowledged.
    let r = s
        .post_json(
            "/triggers",
            &json!({"name": "pay-in", "workflow": "pay",
            "source": {"webhook": {"verify": "github", "secret": "{{secret:HOOK}}"}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    let body = br#"{"amount": "twelve", "currency": "EUR"}"#;
    let mut mac = Hmac::<Sha256>::new_from_slice(b"schema-hook-key").unwrap();
    mac.update(body);
    let sig = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    let r = send(
        s.addr,
        Method::POST,
        "/hooks/pay-in",
        Some(body.to_vec()),
        &[
            ("X-GitHub-Delivery", "d-1"),
            ("X-Hub-Signature-256", sig.as_str()),
            ("Content-Type", "application/json"),
        ],
    )
    .await;
    assert!(r.status.is_success(), "{}: {}", r.status, r.text());
    let c = db.client().await;
    let reasons: Vec<String> = c
        .query("SELECT reason FROM dead_letters", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert!(reasons[0].contains("/amount"), "{reasons:?}");
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 1);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_that_is_not_one_or_reads_outside_is_refused_at_definition() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    for (schema, needle) in [
        (
            json!({"type": "nonsense"}),
            "inputSchema: not a valid JSON Schema",
        ),
        (json!(["a"]), "inputSchema: a JSON Schema"),
        (
            json!({"$ref": "https://schemas.example/order.json"}),
            "inputSchema: not a valid JSON Schema",
        ),
    ] {
        let why = s
            .post_json("/workflow", &json!({"name": "bad", "inputSchema": schema,
                "steps": [{"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": "http://127.0.0.1:9/"}}]}))
            .await
            .expect_error(400);
        assert!(why.contains(needle), "{schema}: {why}");
    }
    s.shutdown().await;
}
