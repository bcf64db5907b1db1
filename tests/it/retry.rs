//! Retry (`POST /serviceRequest/{id}/retry`, beyond Clamp): a FAILED or CANCELLED request
//! continues as the same request from the step that failed, with its recorded request or
//! a new one; the steps that completed are not called again (the downstream counts calls
//! per step key); concurrent retries start it once; everything else is a clear 4xx.

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);

fn down_at_b(d: &Downstream) -> Value {
    json!({"name": "two", "description": "retry", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}},
        {"name": "b", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/until-fixed")}}]})
}

/// The bodies step b received, oldest first.
fn b_bodies(d: &Downstream, id: &str) -> Vec<Value> {
    d.received("/until-fixed")
        .into_iter()
        .filter(|r| {
            r.headers.get("idempotency-key").map(String::as_str) == Some(&format!("{id}:2"))
        })
        .map(|r| r.body)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_goes_on_from_its_failed_step_once_retried() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&down_at_b(&d)).await;
    let id = create_request(&s, "two", &json!({"claim": 7})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert_eq!(v.get("retries"), None);

    d.fix();
    let r = s.post(&format!("/serviceRequest/{id}/retry"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let a = r.json();
    assert_eq!(a["serviceRequestId"], id.as_str());
    assert_eq!(a["retries"], 1);
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(v["retries"], 1);
    assert_eq!(v["reason"], "");
    // Step a is not called again; step b got its recorded request (a's response) twice.
    assert_eq!(d.calls_for_key(&format!("{id}:1")), 1);
    assert_eq!(d.calls_for_key(&format!("{id}:2")), 2);
    let bodies = b_bodies(&d, &id);
    assert_eq!(bodies.len(), 2);
    assert_eq!(bodies[0], bodies[1]);
    assert_eq!(bodies[0], json!({"echo": {"claim": 7}}));
    // The history keeps every entry: a, b's failure, then b's new attempt.
    let entries: Vec<(i64, String)> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["id"].as_i64().unwrap(),
                e["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(i64, String)> = [
        (1, "STARTED"),
        (1, "COMPLETED"),
        (2, "STARTED"),
        (2, "FAILED"),
        (2, "STARTED"),
        (2, "COMPLETED"),
    ]
    .iter()
    .map(|(i, s)| (*i, s.to_string()))
    .collect();
    assert_eq!(entries, want, "{v}");
    // A completed request is not retried.
    let why = s
        .post(&format!("/serviceRequest/{id}/retry"), "")
        .await
        .expect_error(409);
    assert!(why.contains("COMPLETED"), "{why}");
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_may_give_the_failed_step_a_new_request() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&down_at_b(&d)).await;
    let id = create_request(&s, "two", &json!({"claim": 1})).await;
    wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    d.fix();
    let r = s
        .post(
            &format!("/serviceRequest/{id}/retry"),
            r#"{"payload": {"corrected": true}}"#,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(b_bodies(&d, &id).last(), Some(&json!({"corrected": true})));
    assert_eq!(d.calls_for_key(&format!("{id}:1")), 1);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_start_a_request_once() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let other = TestServer::start(config(&db.url)).await;
    s.create_workflow(&down_at_b(&d)).await;
    let id = create_request(&s, "two", &json!({})).await;
    wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    d.fix();
    let path = format!("/serviceRequest/{id}/retry");
    let answers = join_all((0..8).map(|i| {
        let (s, path) = (if i % 2 == 0 { &s } else { &other }, path.clone());
        async move { s.post(&path, "").await.status.as_u16() }
    }))
    .await;
    assert_eq!(
        answers.iter().filter(|&&c| c == 200).count(),
        1,
        "{answers:?}"
    );
    assert_eq!(
        answers.iter().filter(|&&c| c == 409).count(),
        7,
        "{answers:?}"
    );
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(v["retries"], 1);
    assert_eq!(d.calls_for_key(&format!("{id}:2")), 2);
    other.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_request_goes_on_from_the_step_that_was_next() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut api = config(&db.url);
    api.max_running = 0;
    let api = TestServer::start(api).await;
    api.create_workflow(&json!({"name": "one", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let id = create_request(&api, "one", &json!({"n": 1})).await;
    let r = api.post(&format!("/serviceRequest/{id}/cancel"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = api.post(&format!("/serviceRequest/{id}/retry"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Retried, it waits like any new request: not yet COMPLETED with nothing running it,
    // and a second retry is refused.
    let v = api.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "IN_PROGRESS", "{v}");
    api.post(&format!("/serviceRequest/{id}/retry"), "")
        .await
        .expect_error(409);
    let runner = TestServer::start(config(&db.url)).await;
    let v = wait_status(&runner, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.calls_for_key(&format!("{id}:1")), 1);
    runner.shutdown().await;
    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_retries_are_clear_4xx() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    s.post("/serviceRequest/not-a-uuid/retry", "")
        .await
        .expect_error(400);
    s.post(
        &format!("/serviceRequest/{}/retry", uuid::Uuid::now_v7()),
        "",
    )
    .await
    .expect_error(404);
    let mut api = config(&db.url);
    api.max_running = 0;
    let api = TestServer::start(api).await;
    api.create_workflow(&simple_workflow("wf")).await;
    let id = create_request(&api, "wf", &json!({})).await;
    for body in ["[1]", "{\"payload\": 1, \"other\": 2}", "{"] {
        api.post(&format!("/serviceRequest/{id}/retry"), body)
            .await
            .expect_error(400);
    }
    let why = api
        .post(&format!("/serviceRequest/{id}/retry"), "")
        .await
        .expect_error(409);
    assert!(why.contains("NEW"), "{why}");
    api.shutdown().await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_retry_takes_the_matches_once_and_nothing_else() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&down_at_b(&d)).await;
    s.create_workflow(&json!({"name": "fine", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]}))
        .await;
    let fine = create_request(&s, "fine", &json!({})).await;
    let mut failed = Vec::new();
    for i in 0..12 {
        failed.push(create_request(&s, "two", &json!({"i": i})).await);
    }
    for id in failed.iter().chain(std::iter::once(&fine)) {
        wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
    }
    d.fix();
    // Another workflow's, a completed one's: nothing to take.
    let r = s
        .post_json("/serviceRequests/retry", &json!({"workflow": "fine"}))
        .await;
    assert_eq!(r.json(), json!({"retried": 0, "more": false}));
    let r = s
        .post_json("/serviceRequests/retry", &json!({"limit": 5}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"retried": 5, "more": true}));
    let r = s.post("/serviceRequests/retry", "").await;
    assert_eq!(r.json(), json!({"retried": 7, "more": false}));
    // Repeated at once, it takes none of them again.
    let r = s.post("/serviceRequests/retry", "").await;
    assert_eq!(r.json(), json!({"retried": 0, "more": false}));
    for id in &failed {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        assert_eq!(v["retries"], 1, "{v}");
        assert_eq!(
            d.calls_for_key(&format!("{id}:1")),
            1,
            "step a not called again"
        );
        assert_eq!(d.calls_for_key(&format!("{id}:2")), 2);
    }
    let v = s.get(&format!("/serviceRequest/{fine}")).await.json();
    assert_eq!(v.get("retries"), None, "{v}");
    for (body, field) in [
        (json!({"limit": 10001}), "limit"),
        (json!({"status": "COMPLETED"}), "status"),
        (json!({"pageSize": 3}), "pageSize"),
    ] {
        let why = s
            .post_json("/serviceRequests/retry", &body)
            .await
            .expect_error(400);
        assert!(why.starts_with(&format!("{field}:")), "{why}");
    }
    s.shutdown().await;
}

#[tokio::test]
async fn a_first_step_retried_receives_the_payload_again() {
    // The first step's record marks its request as the payload (it stores no copy); the
    // retry turns the mark back into the payload.
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "first", "description": "retry", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/until-fixed")}}]}))
        .await;
    let id = create_request(&s, "first", &json!({"claim": 9})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    d.fix();
    let r = s.post(&format!("/serviceRequest/{id}/retry"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let bodies: Vec<Value> = d
        .received("/until-fixed")
        .into_iter()
        .map(|r| r.body)
        .collect();
    assert_eq!(bodies, [json!({"claim": 9}), json!({"claim": 9})]);
    assert_eq!(
        v["steps"][3]["payload"]["request"],
        json!({"claim": 9}),
        "{v}"
    );
    s.shutdown().await;
}
