//! LOOP steps (beyond Clamp): the body runs as a child request per iteration, one after
//! another, while `while` (read after each over the context, the body's answers and
//! `iteration` included) holds, at most `maxIterations`; each iteration's first step
//! receives the last one's answer, and the step answers as the last iteration did. A
//! crash resumes the iteration it was in; `maxIterations` stops a loop that never ends.

use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);

fn http(name: &str, method: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": method, "url": url}})
}

/// submit → (poll … while not ready, at most `max`) → after.
fn polling(d: &Downstream, name: &str, ready_after: u32, max: u32) -> Value {
    json!({"name": name, "steps": [
        http("submit", "POST", d.url("/api/echo")),
        {"name": "wait for job", "mode": "LOOP", "val": {
            "steps": [http("poll", "POST", d.url(&format!("/ready-after/{ready_after}")))],
            "while": "poll.response.status != 'ready'",
            "maxIterations": max}},
        http("after", "POST", d.url("/api/echo"))]})
}

async fn children(s: &TestServer, id: &str) -> Value {
    s.get(&format!(
        "/serviceRequest/{id}/children?pageNumber=0&pageSize=100"
    ))
    .await
    .json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_polls_until_ready_and_stops_there() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let created = s.create_workflow(&polling(&d, "job", 5, 20)).await;
    assert_eq!(created["steps"][1]["mode"], "LOOP");
    assert_eq!(created["steps"][1]["val"]["steps"][0]["id"], 1, "{created}");
    let id = create_request(&s, "job", &json!({"job": 42})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let polls = d.received("/ready-after/5");
    assert_eq!(polls.len(), 5, "polled until ready, and no more");
    // The first iteration receives the step's request; each later one the last answer.
    assert_eq!(polls[0].body, json!({"echo": {"job": 42}}));
    assert_eq!(polls[1].body, json!({"status": "pending", "call": 1}));
    assert_eq!(polls[4].body, json!({"status": "pending", "call": 4}));
    // One request per iteration: its own key, never sent twice.
    let keys: std::collections::HashSet<_> = polls
        .iter()
        .map(|r| r.headers["idempotency-key"].clone())
        .collect();
    assert_eq!(keys.len(), 5);
    // The step answers as the last iteration did.
    let after = step_entry(&v, "after", "COMPLETED");
    assert_eq!(
        after["payload"]["request"],
        json!({"status": "ready", "call": 5})
    );
    let c = children(&s, &id).await;
    assert_eq!(c["totalChildren"], 5, "{c}");
    let iterations: Vec<Value> = c["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["iteration"].clone())
        .collect();
    assert_eq!(iterations, [1, 2, 3, 4, 5].map(Value::from).to_vec(), "{c}");
    assert!(c["children"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["status"] == "COMPLETED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_iterations_stops_a_loop_that_never_ends_and_iteration_is_read() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&polling(&d, "never", 1000, 3)).await;
    let id = create_request(&s, "never", &json!({})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let reason = v["reason"].as_str().unwrap();
    assert!(
        reason.contains("maxIterations (3)") && reason.contains("still holds"),
        "{reason}"
    );
    assert_eq!(d.received("/ready-after/1000").len(), 3);
    assert!(d.received("/api/echo").len() == 1, "after never ran");

    // `iteration` counts from 1 in the body and in `while`: three runs, the body's
    // second step only in the second.
    s.create_workflow(&json!({"name": "count", "steps": [
        {"name": "thrice", "mode": "LOOP", "val": {
            "steps": [http("tick", "POST", d.url("/api/echo")),
                      {"name": "second", "mode": "HTTP", "when": "iteration == 2",
                       "val": {"method": "POST", "url": d.url("/traced")}}],
            "while": "iteration < 3", "maxIterations": 10}}]}))
        .await;
    let id = create_request(&s, "count", &json!({"n": 1})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(d.received("/traced").len(), 1);
    assert_eq!(d.received("/api/echo").len(), 1 + 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_iteration_fails_the_step_and_a_retry_goes_on_in_it() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    // The second iteration's call fails until the downstream is fixed.
    s.create_workflow(&json!({"name": "flaky", "steps": [
        {"name": "loop", "mode": "LOOP", "val": {
            "steps": [{"name": "call", "mode": "HTTP", "retry": {"maxAttempts": 1},
                       "when": "iteration == 2",
                       "val": {"method": "POST", "url": d.url("/until-fixed")}},
                      http("tick", "POST", d.url("/api/echo"))],
            "while": "iteration < 3", "maxIterations": 5}}]}))
        .await;
    let id = create_request(&s, "flaky", &json!({})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("iteration 2 ("),
        "{v}"
    );
    assert_eq!(
        d.received("/api/echo").len(),
        1,
        "iteration 1 ran, 2 stopped"
    );
    d.fix();
    let r = s.post(&format!("/serviceRequest/{id}/retry"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    // Iteration 1 did not run again; 2 went on from its failed step, then 3 ran.
    assert_eq!(d.received("/api/echo").len(), 3);
    assert_eq!(children(&s, &id).await["totalChildren"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loops_are_checked_at_definition() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let step =
        |val: Value| json!({"name": "l", "steps": [{"name": "loop", "mode": "LOOP", "val": val}]});
    let body = json!([{"name": "poll", "mode": "HTTP",
                       "val": {"method": "GET", "url": "http://127.0.0.1:9/x"}}]);
    for (val, needle) in [
        (
            json!({"steps": body, "while": "poll.response.ok"}),
            "maxIterations is required",
        ),
        (
            json!({"steps": body, "while": "poll.response.ok", "maxIterations": 10001}),
            "from 1 to 10000",
        ),
        (
            json!({"steps": body, "while": "nosuch.response.ok", "maxIterations": 3}),
            "val.while",
        ),
        (
            json!({"steps": body, "while": "poll.response.ok +", "maxIterations": 3}),
            "val.while",
        ),
        (
            json!({"while": "true", "maxIterations": 3}),
            "val.steps is required",
        ),
    ] {
        let r = s.post_json("/workflow", &step(val.clone())).await;
        assert_eq!(r.status, 400, "{val}: {}", r.text());
        assert!(r.text().contains(needle), "{val}: {}", r.text());
    }
}

/// kill -9 while iteration 3 sleeps in its WAIT: the next instance resumes iteration 3
/// there (its call is not made again, nor 1's and 2's), and runs 4 and 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_in_iteration_three_resumes_there() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = free_port();
    let mut server = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let def = json!({"name": "ticks", "steps": [
        {"name": "loop", "mode": "LOOP", "val": {
            "steps": [http("tick", "POST", d.url("/api/echo")),
                      {"name": "nap", "mode": "WAIT", "val": {"duration": "PT2S"}}],
            "while": "iteration < 5", "maxIterations": 10}}]});
    let r = send(
        addr,
        hyper::Method::POST,
        "/workflow",
        Some(def.to_string().into_bytes()),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        addr,
        hyper::Method::POST,
        "/serviceRequest/ticks",
        Some(b"{}".to_vec()),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_for_seen("iteration 3's call", WAIT, || async {
        let n = d.received("/api/echo").len();
        if n >= 3 {
            Ok(n)
        } else {
            Err(n)
        }
    })
    .await;
    // Its call answered is not yet its record written: the kill lands in the 2 s WAIT
    // (a call in flight at a kill is made again, as any step's is).
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill().unwrap();
    server.wait().unwrap();
    assert_eq!(
        d.received("/api/echo").len(),
        3,
        "killed in iteration 3's WAIT"
    );
    let port2 = free_port();
    let _again = spawn_binary(&db.url, port2);
    wait_healthy(port2).await;
    let addr2: std::net::SocketAddr = format!("127.0.0.1:{port2}").parse().unwrap();
    let v = wait_status_at(addr2, &id, &["COMPLETED", "FAILED"], WAIT, &[]).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let ticks = d.received("/api/echo");
    let keys: Vec<String> = ticks
        .iter()
        .map(|r| r.headers["idempotency-key"].clone())
        .collect();
    let c = send(
        addr2,
        hyper::Method::GET,
        &format!("/serviceRequest/{id}/children?pageNumber=0&pageSize=20"),
        None,
        &[],
    )
    .await
    .json();
    assert_eq!(ticks.len(), 5, "each iteration's call once: {keys:?} {c}");
    assert_eq!(d.max_calls_per_key(), 1);
}
