//! Intake batches: plain creates are written one row per flush; before a request has a
//! row of its own it is read, listed and cancelled from its batch; an executor on another
//! instance takes over batches nobody runs; the creating instance writes each request's
//! row once, at its first transition, and deletes its batches when they are settled.

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);

fn two_steps(d: &Downstream) -> Value {
    json!({"name": "two", "steps": [
        {"name": "a", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}},
        {"name": "b", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")}}]})
}

async fn create_many(s: &TestServer, workflow: &str, n: usize) -> Vec<String> {
    let payloads: Vec<Value> = (0..n).map(|i| json!({"n": i})).collect();
    join_all(payloads.iter().map(|p| create_request(s, workflow, p))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_nobody_runs_wait_in_batches_until_an_executor_takes_them_over() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut api = config(&db.url);
    api.max_running = 0;
    let api = TestServer::start(api).await;
    api.create_workflow(&two_steps(&d)).await;
    let ids = create_many(&api, "two", 40).await;
    // Acknowledged, and stored as batches: no request has a row of its own yet.
    assert_eq!(db.count("SELECT count(*) FROM intake_requests").await, 40);
    assert!(db.count("SELECT count(*) FROM intake_batches").await < 40);
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 0);

    // Read from its batch: a request nothing has happened to yet.
    let r = api.get(&format!("/serviceRequest/{}", ids[0])).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], "NEW");
    assert_eq!(v["workflow_name"], "two");
    assert_eq!(v["current_step_id"], 0);
    assert_eq!(v["steps"], json!([]));
    assert!(v["created_at"].as_str().unwrap().ends_with("+00:00"));
    // Listed with the rest.
    let list = api
        .get("/serviceRequests/two?pageNumber=0&pageSize=100")
        .await
        .json();
    let listed: Vec<&str> = list["serviceRequests"]
        .as_array()
        .unwrap_or_else(|| panic!("a list: {list}"))
        .iter()
        .filter_map(|e| e["id"].as_str())
        .collect();
    assert_eq!(listed.len(), 40, "{list}");
    assert!(listed.contains(&ids[39].as_str()));
    // Cancelled from its batch: it gets a row of its own, cancelled.
    let r = api
        .post(&format!("/serviceRequest/{}/cancel", ids[1]), "")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        db.count("SELECT count(*) FROM service_requests WHERE status = 'CANCELLED'")
            .await,
        1
    );
    let r = api.get(&format!("/serviceRequest/{}", ids[1])).await.json();
    assert_eq!(r["status"], "CANCELLED");
    // A 404 stays a 404, whether or not its id could name a batch.
    let unknown = uuid::Uuid::now_v7();
    api.get(&format!("/serviceRequest/{unknown}"))
        .await
        .expect_error(404);

    // An executor instance takes the batches over and runs every request once.
    let runner = TestServer::start(config(&db.url)).await;
    for (i, id) in ids.iter().enumerate() {
        let want = if i == 1 { "CANCELLED" } else { "COMPLETED" };
        wait_status(&runner, id, &[want], WAIT).await;
    }
    assert_eq!(db.count("SELECT count(*) FROM intake_batches").await, 0);
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 40);
    assert_eq!(d.received("/api/echo").len(), 39 * 2);
    assert!(
        d.received("/api/echo")
            .iter()
            .all(|r| r.body != json!({"n": 1})),
        "the cancelled request ran"
    );
    assert_eq!(d.max_calls_per_key(), 1);
    runner.shutdown().await;
    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_creator_writes_each_row_once_and_deletes_its_batches() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&two_steps(&d)).await;
    let ids = create_many(&s, "two", 60).await;
    for id in &ids {
        wait_status(&s, id, &["COMPLETED"], WAIT).await;
    }
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 60);
    assert_eq!(db.count("SELECT count(*) FROM steps_status").await, 120);
    // Run where they were created, from the batches' leases: nothing was claimed.
    let metrics = s.get("/metrics").await.text();
    assert_eq!(
        metric(&metrics, "clamp_leases_claimed_total"),
        0.0,
        "{metrics}"
    );
    assert_eq!(d.max_calls_per_key(), 1);
    // Each batch is deleted once all its requests have rows (with a later transition
    // statement, or by the renewer when none comes).
    wait_for("settled batches deleted", WAIT, || async {
        (db.count("SELECT count(*) FROM intake_batches").await == 0).then_some(())
    })
    .await;
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_executor_hands_its_batches_over() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut slow = two_steps(&d);
    slow["steps"][0]["val"]["url"] = json!(d.url("/slow/3000"));
    slow["name"] = json!("slow");
    let mut cfg = config(&db.url);
    cfg.shutdown_timeout = Duration::from_millis(200);
    let first = TestServer::start(cfg).await;
    first.create_workflow(&slow).await;
    let ids = create_many(&first, "slow", 10).await;
    d.wait_for("/slow/3000").await;
    // Stopped mid-step: its batches are released (nothing has a row yet) ...
    first.shutdown().await;
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 0);
    assert_eq!(
        db.count("SELECT count(*) FROM intake_batches WHERE lease_owner IS NULL")
            .await,
        db.count("SELECT count(*) FROM intake_batches").await
    );
    // ... and another instance continues every request at once.
    let second = TestServer::start(config(&db.url)).await;
    for id in &ids {
        wait_status(&second, id, &["COMPLETED"], WAIT).await;
    }
    assert_eq!(db.count("SELECT count(*) FROM intake_batches").await, 0);
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_response_finds_a_request_that_has_no_row_yet() {
    // An answer that arrives before the request's ASYNC step was written as sent (its
    // instance is still sending it) must be told "not yet", as for a request with a row,
    // not "no such request".
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut api = config(&db.url);
    api.max_running = 0;
    let api = TestServer::start(api).await;
    api.create_workflow(
        &json!({"name": "asks", "steps": [{"name": "ask", "type": "ASYNC",
        "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/accepted")}}]}),
    )
    .await;
    let id = create_request(&api, "asks", &json!({})).await;
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 0);
    let r = api
        .post_json(
            "/stepResponse",
            &json!({"serviceRequestId": id, "stepId": 1, "response": {}}),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(db.count("SELECT count(*) FROM service_requests").await, 0);
    api.shutdown().await;
}
