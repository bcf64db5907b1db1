//! Workflows inside workflows (a step of mode WORKFLOW, beyond Clamp): the step starts a
//! child request of another workflow with its request as payload; the parent goes on with
//! the child's last answer, or fails at the step (onFailure as for any step) when the
//! child fails; cancelling the parent cancels the child; a circle of workflows is
//! refused; and a kill -9 while the child runs loses nothing and runs nothing twice.

use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);

fn http(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

fn child_step(name: &str, workflow: &str) -> Value {
    json!({"name": name, "mode": "WORKFLOW", "val": {"workflow": workflow}})
}

/// The child id the parent's WORKFLOW step names.
fn child_of(parent: &Value, step: i64) -> String {
    parent["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == step && e.get("childServiceRequestId").is_some())
        .and_then(|e| e["childServiceRequestId"].as_str())
        .unwrap_or_else(|| panic!("no child at step {step}: {parent}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_goes_on_with_its_childs_answer() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "inner", "steps": [
        http("i1", d.url("/api/echo")), http("i2", d.url("/api/echo"))]}))
        .await;
    s.create_workflow(&json!({"name": "outer", "steps": [
        http("o1", d.url("/api/echo")), child_step("sub", "inner"), http("o3", d.url("/api/echo"))]}))
    .await;
    let id = create_request(&s, "outer", &json!({"n": 1})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let child = child_of(&v, 2);
    let c = s.get(&format!("/serviceRequest/{child}")).await.json();
    assert_eq!(
        (c["status"].as_str(), c["parentId"].as_str()),
        (Some("COMPLETED"), Some(id.as_str()))
    );
    assert_eq!(c["workflow_name"], "inner");
    // The child got step 2's request (o1's answer) as its payload; the parent's step 2
    // answered the child's last answer; step 3 received it.
    let o1 = json!({"echo": {"n": 1}});
    let last = json!({"echo": {"echo": o1.clone()}});
    assert_eq!(c["steps"][1]["payload"]["response"], json!({"echo": o1}));
    assert_eq!(v["steps"][3]["payload"]["response"], last, "{v}");
    assert_eq!(v["steps"][5]["payload"]["response"], json!({"echo": last}));
    // Each step called once.
    for (rid, step) in [(&id, 1), (&child, 1), (&child, 2), (&id, 3)] {
        assert_eq!(d.calls_for_key(&format!("{rid}:{step}")), 1);
    }
    // A WORKFLOW step takes no answer from outside.
    s.post_json(
        "/stepResponse",
        &json!({"serviceRequestId": id, "stepId": 2, "response": {}}),
    )
    .await
    .expect_error(409);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_child_fails_the_step_and_a_cancelled_parent_cancels_its_child() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    s.create_workflow(&json!({"name": "breaks", "steps": [http("b1", d.url("/until-fixed"))]}))
        .await;
    let mut sub = child_step("sub", "breaks");
    sub["onFailure"] = json!([http("tidy", d.url("/api/echo"))]);
    s.create_workflow(&json!({"name": "calls-breaks", "steps": [sub]}))
        .await;
    let id = create_request(&s, "calls-breaks", &json!({})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    let child = child_of(&v, 1);
    assert!(v["reason"].as_str().unwrap().contains(&child), "{v}");
    assert_eq!(d.calls_for_key(&format!("{id}:2")), 1, "onFailure ran");

    let mut ask = http("ask", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    s.create_workflow(&json!({"name": "waits", "steps": [ask]}))
        .await;
    s.create_workflow(&json!({"name": "calls-waits", "steps": [child_step("sub", "waits")]}))
        .await;
    let id = create_request(&s, "calls-waits", &json!({})).await;
    let v = wait_status(&s, &id, &["PAUSED"], WAIT).await;
    let child = child_of(&v, 1);
    wait_status(&s, &child, &["PAUSED"], WAIT).await;
    let r = s.post(&format!("/serviceRequest/{id}/cancel"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let c = wait_status(&s, &child, &["CANCELLED"], WAIT).await;
    assert!(
        c["reason"]
            .as_str()
            .unwrap()
            .starts_with("its parent was cancelled"),
        "{c}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circles_and_unknown_workflows_are_refused() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let why = s
        .post_json(
            "/workflow",
            &json!({"name": "a", "steps": [child_step("x", "nowhere")]}),
        )
        .await
        .expect_error(400);
    assert!(
        why.contains("steps[0].val.workflow: no workflow nowhere"),
        "{why}"
    );
    let why = s
        .post_json(
            "/workflow",
            &json!({"name": "me", "steps": [child_step("x", "me")]}),
        )
        .await
        .expect_error(400);
    assert!(why.contains("me → me"), "{why}");
    let leaf = |n: &str| json!({"name": n, "steps": [http("h", d.url("/api/echo"))]});
    s.create_workflow(&leaf("c")).await;
    s.create_workflow(&json!({"name": "b", "steps": [child_step("to-c", "c")]}))
        .await;
    s.create_workflow(&json!({"name": "a", "steps": [child_step("to-b", "b")]}))
        .await;
    // c including a closes the circle a → b → c → a.
    let r = send(
        s.addr,
        hyper::Method::PUT,
        "/workflow/c",
        Some(
            json!({"name": "c", "steps": [child_step("to-a", "a")]})
                .to_string()
                .into_bytes(),
        ),
        &[],
    )
    .await;
    let why = r.expect_error(400);
    assert!(why.contains("c → a → b → c"), "{why}");
    let why = s
        .post_json(
            "/workflow",
            &json!({"name": "f", "steps": [http("h", d.url("/api/echo")),
            {"name": "g", "mode": "HTTP", "val": {"method": "POST", "url": d.url("/api/echo")},
             "onFailure": [child_step("x", "c")]}]}),
        )
        .await
        .expect_error(400);
    assert!(
        why.contains("WORKFLOW cannot be an onFailure step"),
        "{why}"
    );
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_while_the_child_runs_loses_nothing_and_repeats_nothing() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = free_port();
    let mut server = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let post = |path: &str, body: Value| {
        let path = path.to_string();
        async move {
            send(
                addr,
                hyper::Method::POST,
                &path,
                Some(body.to_string().into_bytes()),
                &[],
            )
            .await
        }
    };
    let r = post(
        "/workflow",
        json!({"name": "slow-inner", "steps": [
        http("i1", d.url("/slow/1500")), http("i2", d.url("/api/echo"))]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post("/workflow", json!({"name": "outer", "steps": [
        http("o1", d.url("/api/echo")), child_step("sub", "slow-inner"), http("o3", d.url("/api/echo"))]}))
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let mut ids = Vec::new();
    for i in 0..5 {
        let r = post("/serviceRequest/outer", json!({"i": i})).await;
        ids.push(r.json()["serviceRequestId"].as_str().unwrap().to_string());
    }
    // Every child is in its slow first step (so every parent waits at step 2).
    wait_for_seen("every child to start its slow step", WAIT, || async {
        let started = d.received("/slow/1500").len();
        (started >= ids.len())
            .then_some(())
            .ok_or_else(|| format!("{started} of {} started", ids.len()))
    })
    .await;
    server.kill().unwrap();
    server.wait().unwrap();
    let port2 = free_port();
    let _again = spawn_binary(&db.url, port2);
    wait_healthy(port2).await;
    let addr2: std::net::SocketAddr = format!("127.0.0.1:{port2}").parse().unwrap();
    for id in &ids {
        let v = wait_status_at(
            addr2,
            id,
            &["COMPLETED", "FAILED"],
            Duration::from_secs(30),
            &[],
        )
        .await;
        assert_eq!(v["status"], "COMPLETED", "{v}");
        let children: Vec<&str> = v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["childServiceRequestId"].as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(children.len(), 1, "one child per parent: {v}");
        // Only the running step (the child's slow one) may have run twice.
        assert_eq!(d.calls_for_key(&format!("{}:2", children[0])), 1);
        assert_eq!(d.calls_for_key(&format!("{id}:3")), 1);
        assert_eq!(d.calls_for_key(&format!("{id}:1")), 1);
    }
    // One child row per parent in all.
    let n = db
        .count("SELECT count(*) FROM service_requests WHERE parent_id IS NOT NULL")
        .await;
    assert_eq!(n, 5);
}
