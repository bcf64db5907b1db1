//! Workflow versions (beyond Clamp): `PUT /workflow/{name}` stores the next version, reads
//! name the version; a request runs the version that was latest when it was stored,
//! through a pause, a retry wait, a restart and another instance; identical definitions
//! store nothing; concurrent versions are numbered without gaps or duplicates.

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(20);

fn step(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

/// A two-step workflow whose second step calls `second` (which tells versions apart).
fn def(name: &str, first: Value, d: &Downstream, second: &str) -> Value {
    json!({"name": name, "description": format!("second step {second}"),
           "steps": [first, step("b", d.url(second))]})
}

/// Which path step 2 of `id` called.
fn second_path(d: &Downstream, id: &str) -> Vec<String> {
    ["/api/echo", "/api/step1"]
        .iter()
        .filter(|p| {
            d.received(p)
                .iter()
                .any(|r| r.headers.get("idempotency-key") == Some(&format!("{id}:2")))
        })
        .map(|p| p.to_string())
        .collect()
}

async fn put(s: &TestServer, name: &str, def: &Value) -> Resp {
    send(
        s.addr,
        hyper::Method::PUT,
        &format!("/workflow/{name}"),
        Some(def.to_string().into_bytes()),
        &[],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_are_stored_read_and_listed() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let first = step("a", d.url("/api/echo"));
    let v1 = s
        .create_workflow(&def("w", first.clone(), &d, "/api/echo"))
        .await;
    assert_eq!(v1["version"], 1);
    let r = put(&s, "w", &def("w", first.clone(), &d, "/api/step1")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v2 = r.json();
    assert_eq!(v2["version"], 2);
    assert_eq!(v2["id"], v1["id"]);
    assert_eq!(v2["created_at"], v1["created_at"]);
    assert_eq!(s.get("/workflow/w").await.json()["version"], 2);
    let old = s.get("/workflow/w?version=1").await.json();
    assert_eq!(
        (old["version"].clone(), old["description"].clone()),
        (json!(1), json!("second step /api/echo"))
    );
    // The same definition again stores nothing.
    let same = put(&s, "w", &def("w", first.clone(), &d, "/api/step1")).await;
    assert_eq!(same.status, 200);
    assert_eq!(same.json()["version"], 2);
    let list = s.get("/workflow/w/versions").await.json();
    let numbers: Vec<i64> = list["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, vec![1, 2]);
    assert_eq!(list["versions"][1]["description"], "second step /api/step1");
    // Refusals.
    put(&s, "nope", &def("nope", first.clone(), &d, "/api/echo"))
        .await
        .expect_error(404);
    let why = put(&s, "w", &def("other", first.clone(), &d, "/api/echo"))
        .await
        .expect_error(400);
    assert!(why.starts_with("name:"), "{why}");
    put(&s, "w", &json!({"name": "w", "steps": []}))
        .await
        .expect_error(400);
    s.post_json("/workflow", &def("w", first, &d, "/api/echo"))
        .await
        .expect_error(409);
    s.get("/workflow/w?version=3").await.expect_error(404);
    s.get("/workflow/w?version=zero").await.expect_error(400);
    s.get("/workflow/nope/versions").await.expect_error(404);
    s.post("/serviceRequest/w?version=9", "{}")
        .await
        .expect_error(404);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_finish_on_the_version_they_started_with() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut ask = step("a", d.url("/api/accepted"));
    ask["type"] = json!("ASYNC");
    let slow = step("a", d.url("/slow/1500"));
    let mut flaky = step("a", d.url("/flaky/503"));
    flaky["retry"] = json!({"maxAttempts": 3, "initialIntervalMs": 1500});
    let shapes = [("paused", ask), ("running", slow), ("retrying", flaky)];
    let mut old = Vec::new();
    for (name, first) in &shapes {
        s.create_workflow(&def(name, first.clone(), &d, "/api/echo"))
            .await;
        old.push(create_request(&s, name, &json!({})).await);
    }
    // Each is paused, running its first step, or waiting to try it again.
    wait_status(&s, &old[0], &["PAUSED"], WAIT).await;
    wait_for_seen(&format!("a pending retry of {}", old[2]), WAIT, || async {
        let v = s.get(&format!("/serviceRequest/{}", old[2])).await.json();
        v.get("retrying").map(|_| ()).ok_or(v)
    })
    .await;
    for (name, first) in &shapes {
        let r = put(&s, name, &def(name, first.clone(), &d, "/api/step1")).await;
        assert_eq!(r.json()["version"], 2, "{}", r.text());
    }
    let mut new = Vec::new();
    for (name, _) in &shapes {
        new.push(create_request(&s, name, &json!({})).await);
    }
    let pinned = s
        .post("/serviceRequest/running?version=1", "{}")
        .await
        .json();
    let pinned = pinned["serviceRequestId"].as_str().unwrap().to_string();
    for id in [&old[0], &new[0]] {
        wait_status(&s, id, &["PAUSED"], WAIT).await;
        let r = s
            .post_json(
                "/stepResponse",
                &json!({"serviceRequestId": id, "stepId": 1, "response": {"ok": true}}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for (i, id) in old.iter().enumerate() {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(
            (v["status"].as_str(), v["workflow_version"].as_i64()),
            (Some("COMPLETED"), Some(1)),
            "{v}"
        );
        assert_eq!(second_path(&d, id), vec!["/api/echo"], "{}", shapes[i].0);
    }
    for (i, id) in new.iter().enumerate() {
        let v = wait_status(&s, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(
            (v["status"].as_str(), v["workflow_version"].as_i64()),
            (Some("COMPLETED"), Some(2)),
            "{v}"
        );
        assert_eq!(second_path(&d, id), vec!["/api/step1"], "{}", shapes[i].0);
    }
    let v = wait_status(&s, &pinned, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["workflow_version"], 1);
    assert_eq!(second_path(&d, &pinned), vec!["/api/echo"]);
    s.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_runs_the_new_version_at_once_and_a_restart_keeps_the_old() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let mut cfg = config(&db.url);
    cfg.lease = Duration::from_millis(900);
    let a = TestServer::start(cfg.clone()).await;
    let b = TestServer::start(cfg.clone()).await;
    let slow = step("a", d.url("/slow/1200"));
    a.create_workflow(&def("w", slow.clone(), &d, "/api/echo"))
        .await;
    // b knows version 1 (it created a request of it).
    let warm = create_request(&b, "w", &json!({})).await;
    // A request of version 1 in its first step on a, when a stops.
    let interrupted = create_request(&a, "w", &json!({})).await;
    let r = put(&a, "w", &def("w", slow, &d, "/api/step1")).await;
    assert_eq!(r.json()["version"], 2);
    // b has not heard of version 2; its next create runs it all the same.
    let fresh = create_request(&b, "w", &json!({})).await;
    a.shutdown().await;
    let c = TestServer::start(cfg).await;
    for (id, version, path) in [
        (&warm, 1, "/api/echo"),
        (&interrupted, 1, "/api/echo"),
        (&fresh, 2, "/api/step1"),
    ] {
        let v = wait_status(&c, id, &["COMPLETED", "FAILED"], WAIT).await;
        assert_eq!(
            (v["status"].as_str(), v["workflow_version"].as_i64()),
            (Some("COMPLETED"), Some(version)),
            "{v}"
        );
        assert_eq!(second_path(&d, id), vec![path]);
    }
    b.shutdown().await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_versions_are_numbered_without_gaps() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let first = step("a", d.url("/api/echo"));
    s.create_workflow(&def("w", first.clone(), &d, "/api/echo"))
        .await;
    let puts = (0..12).map(|i| {
        let body = def("w", first.clone(), &d, &format!("/api/echo?n={i}"));
        let s = &s;
        async move { put(s, "w", &body).await.json()["version"].as_i64().unwrap() }
    });
    let mut got = join_all(puts).await;
    got.sort_unstable();
    assert_eq!(got, (2..=13).collect::<Vec<i64>>());
    let list = s.get("/workflow/w/versions").await.json();
    assert_eq!(list["versions"].as_array().unwrap().len(), 13);
    s.shutdown().await;
}
