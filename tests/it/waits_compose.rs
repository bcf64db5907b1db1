//! Waits composed with the rest (beyond Clamp): a WAIT in a MAP item sleeps that item
//! only; an EVENT in a PARALLEL branch holds the join until it is delivered; a request
//! retried after its EVENT timed out waits again; a cancel ends an answer's deadline (no
//! timeout after it); a rerun gets its deadline anew; a rerun from an EVENT step waits
//! for a new event, and from the step after it takes the recorded one; a WAIT in a child
//! workflow sleeps the child while its parent's step waits for it.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);

fn http(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

fn event(name: &str, key: &str, timeout: Option<&str>) -> Value {
    let mut val = json!({"event": "ok", "key": key});
    if let Some(t) = timeout {
        val["timeout"] = json!(t);
    }
    json!({"name": name, "mode": "EVENT", "val": val})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_in_a_map_item_sleeps_each_item_and_the_map_joins_after() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "lines", "steps": [
        {"name": "each", "mode": "MAP", "val": {"items": "each.request.items", "maxConcurrency": 2,
            "steps": [{"name": "nap", "mode": "WAIT", "val": {"duration": "PT1S"}},
                      http("ship", d.url("/api/echo"))]}}]}))
        .await;
    let t0 = Instant::now();
    let id = create_request(&s, "lines", &json!({"items": [1, 2, 3]})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    // Two at a time, each asleep a second: at least two seconds for three items.
    assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
    let joined = response_of(&v, "each");
    assert_eq!(joined.as_array().map(Vec::len), Some(3), "{v}");
    assert_eq!(d.received("/api/echo").len(), 3);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_in_a_parallel_branch_holds_the_join_until_it_is_delivered() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "both", "steps": [
        {"name": "fan", "mode": "PARALLEL", "val": {"branches": [
            {"name": "approval", "steps": [event("ask", "fan.request.k", None)]},
            {"name": "quote", "steps": [http("price", d.url("/api/echo"))]}]}},
        http("after", d.url("/api/step1"))]}))
        .await;
    let id = create_request(&s, "both", &json!({"k": "K1"})).await;
    // The other branch finishes; the request waits for the event in the first.
    wait_for_seen("the quote branch to be called", WAIT, || async {
        (d.received("/api/echo").len() == 1).then_some(()).ok_or(0)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "PAUSED", "{v}");
    assert!(d.received("/api/step1").is_empty());
    let r = s
        .post_json(
            "/events/ok",
            &json!({"key": "K1", "payload": {"approved": true}}),
        )
        .await;
    assert_eq!(r.json()["matched"], 1, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let joined = response_of(&v, "fan");
    assert_eq!(joined["approval"], json!({"approved": true}), "{v}");
    assert!(joined["quote"]["echo"].is_object(), "{v}");
    assert_eq!(d.received("/api/step1").len(), 1);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_retried_after_its_event_timed_out_waits_again() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "approve", "steps": [
        event("ask", "ask.request.k", Some("PT1S")), http("after", d.url("/api/echo"))]}))
        .await;
    let id = create_request(&s, "approve", &json!({"k": "R1"})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("no answer within"),
        "{v}"
    );
    let r = s.post(&format!("/serviceRequest/{id}/retry"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_for_seen(
        "the retried request to wait for its event",
        WAIT,
        || async {
            let v = s.get(&format!("/serviceRequest/{id}")).await.json();
            v.get("awaitingEvent")
                .is_some()
                .then_some(v.clone())
                .ok_or(v)
        },
    )
    .await;
    assert_eq!(v["awaitingEvent"]["key"], "R1", "{v}");
    let r = s
        .post_json("/events/ok", &json!({"key": "R1", "payload": {"go": 1}}))
        .await;
    assert_eq!(r.json()["matched"], 1, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.received("/api/echo")[0].body, json!({"go": 1}));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_ends_an_answers_deadline_and_no_timeout_follows() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut ask = http("ask", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    ask["answerTimeout"] = json!("PT1S");
    ask["onFailure"] = json!([http("undo", d.url("/api/echo"))]);
    s.create_workflow(&json!({"name": "w", "steps": [ask]}))
        .await;
    let id = create_request(&s, "w", &json!({})).await;
    let v = wait_status(&s, &id, &["PAUSED"], WAIT).await;
    assert!(v["answerDue"].is_object(), "{v}");
    let r = s.post(&format!("/serviceRequest/{id}/cancel"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Past the deadline: still cancelled, no timeout recorded, no onFailure step run.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "CANCELLED", "{v}");
    assert!(v.get("answerDue").is_none(), "{v}");
    assert!(d.received("/api/echo").is_empty());
    let m = s.get("/metrics").await.text();
    assert_eq!(metric(&m, "clamp_answer_timeouts_total"), 0.0);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_gets_its_deadline_anew() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "bounded", "deadline": "PT1S",
        "steps": [http("slow", d.url("/held"))]}))
        .await;
    let id = create_request(&s, "bounded", &json!({})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let first = v["deadline"].as_str().unwrap().to_string();
    d.release();
    let r = s.post(&format!("/serviceRequest/{id}/rerun"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let again = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let v = wait_status(&s, &again, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert!(v["deadline"].as_str().unwrap() > first.as_str(), "{v}");
    s.shutdown().await;
}

async fn deliver(s: &TestServer, key: &str, payload: Value, keep_for: &str) {
    let r = s
        .post_json(
            "/events/ok",
            &json!({"key": key, "payload": payload, "keepFor": keep_for}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_from_an_event_step_waits_again_and_from_after_it_takes_the_recorded_event() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "approved", "steps": [
        http("ask", d.url("/api/step1")),
        event("approval", "approval.request.user.id", None),
        http("after", d.url("/api/echo"))]}))
        .await;
    let id = create_request(&s, "approved", &json!({})).await;
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    // Not kept: the rerun must wait for an event of its own.
    deliver(&s, "7", json!({"v": 1}), "PT0S").await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");

    let path = format!("/serviceRequest/{id}/rerun");
    let r = s.post(&path, r#"{"fromStep": 2}"#).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let again = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let v = wait_status(&s, &again, &["PAUSED"], WAIT).await;
    assert_eq!(v["awaitingEvent"]["key"], "7", "{v}");
    // The step before it is the original's outcome, not called again.
    assert_eq!(d.received("/api/step1").len(), 1);
    deliver(&s, "7", json!({"v": 2}), "PT0S").await;
    let v = wait_status(&s, &again, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let echoed: Vec<Value> = d
        .received("/api/echo")
        .into_iter()
        .map(|r| r.body)
        .collect();
    assert_eq!(echoed, vec![json!({"v": 1}), json!({"v": 2})]);

    // From the step after it: the recorded event answers, nothing waits.
    let r = s.post(&path, r#"{"fromStep": 3}"#).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let third = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    let v = wait_status(&s, &third, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.received("/api/echo")[2].body, json!({"v": 1}));
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_in_a_child_workflow_sleeps_the_child_and_the_parent_goes_on_after_it() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "nap", "steps": [
        {"name": "sleep", "mode": "WAIT", "val": {"duration": "PT2S"}},
        http("woke", d.url("/api/echo"))]}))
        .await;
    s.create_workflow(&json!({"name": "parent", "steps": [
        {"name": "child", "mode": "WORKFLOW", "val": {"workflow": "nap"}},
        http("after", d.url("/api/step1"))]}))
        .await;
    let t0 = Instant::now();
    let id = create_request(&s, "parent", &json!({"order": 9})).await;
    // While the child sleeps, the parent waits at its WORKFLOW step, and neither calls on.
    wait_status(&s, &id, &["PAUSED"], WAIT).await;
    assert!(d.received("/api/echo").is_empty());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert!(t0.elapsed() >= Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(d.received("/api/echo")[0].body, json!({"order": 9}));
    assert_eq!(d.received("/api/step1").len(), 1);
    s.shutdown().await;
}
