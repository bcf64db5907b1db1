//! PARALLEL branches that only call run as lanes of their request (beyond Clamp): each
//! branch step's record commits before that branch's next step starts, so a kill -9 calls
//! again only the steps that were in flight; a cancel or a deadline stops every lane;
//! `when` and transforms see the request's context and the branch's own steps; the
//! console draws each lane step. (The shared fan-out semantics, with branches as lanes
//! and as child requests side by side, are in `fanout.rs`.)

use std::time::Duration;

use serde_json::{json, Value};

use crate::downstream::Downstream;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);

fn http(name: &str, url: String) -> Value {
    json!({"name": name, "mode": "HTTP", "val": {"method": "POST", "url": url}})
}

fn parallel(name: &str, branches: Value) -> Value {
    json!({"name": name, "mode": "PARALLEL", "val": {"branches": branches}})
}

fn key(id: &str, fan: u32, branch: &str, step: u32) -> String {
    format!("{id}:{fan}/{branch}/{step}")
}

/// No child request was made for request `id`.
async fn no_children(db: &TestDb, id: &str) {
    let c = db.client().await;
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM service_requests WHERE parent_id = $1",
            &[&uuid::Uuid::parse_str(id).unwrap()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "children of {id}");
}

/// Eight branches of two steps; the server is killed (SIGKILL) while every branch's
/// second step is in flight. On the next instance the request completes with every
/// branch's answer; each first step, recorded before the kill, was never called again,
/// and each second step at most once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_lanes_calls_again_only_the_steps_in_flight() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let port = free_port();
    let mut server = spawn_binary(&db.url, port);
    wait_healthy(port).await;
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let names: Vec<String> = (0..8).map(|b| format!("b{b}")).collect();
    let branches: Vec<Value> = names
        .iter()
        .map(|n| json!({"name": n, "steps": [http("first", d.url("/api/echo")), http("second", d.url("/held"))]}))
        .collect();
    let r = send(
        addr,
        hyper::Method::POST,
        "/workflow",
        Some(
            json!({"name": "fan8", "steps": [parallel("all", Value::Array(branches)), http("after", d.url("/api/step1"))]})
                .to_string()
                .into_bytes(),
        ),
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        addr,
        hyper::Method::POST,
        "/serviceRequest/fan8",
        Some(json!({"n": 8}).to_string().into_bytes()),
        &[],
    )
    .await;
    let id = r.json()["serviceRequestId"].as_str().unwrap().to_string();
    wait_for_seen("every second step to be in flight", WAIT, || async {
        let n = d.received("/held").len();
        (n >= 8).then_some(()).ok_or(n)
    })
    .await;
    server.kill().unwrap();
    server.wait().unwrap();
    // The next instance's calls are answered at once.
    d.release();
    let port2 = free_port();
    let _again = spawn_binary(&db.url, port2);
    wait_healthy(port2).await;
    let addr2: std::net::SocketAddr = format!("127.0.0.1:{port2}").parse().unwrap();
    let v = wait_status_at(
        addr2,
        &id,
        &["COMPLETED", "FAILED"],
        Duration::from_secs(60),
        &[],
    )
    .await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    let joined = response_of(&v, "all");
    assert_eq!(joined.as_object().unwrap().len(), 8, "{v}");
    for n in &names {
        assert_eq!(joined[n], json!({"echo": {"echo": {"n": 8}}}), "{v}");
        assert_eq!(d.calls_for_key(&key(&id, 1, n, 1)), 1, "{n}'s first step");
        let second = d.calls_for_key(&key(&id, 1, n, 2));
        assert!((1..=2).contains(&second), "{n}'s second step: {second}");
    }
    assert_eq!(d.calls_for_key(&format!("{id}:2")), 1);
    no_children(&db, &id).await;
}

/// A cancel while the lanes' first steps are in flight: the request ends CANCELLED, no
/// lane step starts after, and the fan-out step's onFailure steps do not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_every_lane() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut step = parallel(
        "both",
        json!([
            {"name": "x", "steps": [http("x1", d.url("/held")), http("x2", d.url("/api/echo"))]},
            {"name": "y", "steps": [http("y1", d.url("/held")), http("y2", d.url("/api/echo"))]}]),
    );
    step["onFailure"] = json!([http("undo", d.url("/api/step1"))]);
    s.create_workflow(&json!({"name": "stopped", "steps": [step]}))
        .await;
    let id = create_request(&s, "stopped", &json!({"c": 1})).await;
    wait_for_seen("both lanes to call", WAIT, || async {
        let n = d.received("/held").len();
        (n >= 2).then_some(()).ok_or(n)
    })
    .await;
    let r = s.post(&format!("/serviceRequest/{id}/cancel"), "").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = wait_status(&s, &id, &["CANCELLED"], WAIT).await;
    assert_eq!(v["status"], "CANCELLED");
    d.release();
    wait_for_seen("the held calls to end", WAIT, || async {
        let f = d.in_flight();
        (f == 0).then_some(()).ok_or(f)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await; // time is what is tested
    assert!(d.received("/api/echo").is_empty(), "no second step started");
    assert!(
        d.received("/api/step1").is_empty(),
        "no onFailure after a cancel"
    );
    let v = s.get(&format!("/serviceRequest/{id}")).await.json();
    assert_eq!(v["status"], "CANCELLED", "{v}");
    s.shutdown().await;
}

/// A request's deadline that passes while its lanes call ends the fan-out step (the calls
/// in flight dropped), runs its onFailure steps, and starts nothing after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_ends_every_lane() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut step = parallel(
        "both",
        json!([
            {"name": "x", "steps": [http("x1", d.url("/held"))]},
            {"name": "y", "steps": [http("y1", d.url("/api/echo")), http("y2", d.url("/held"))]}]),
    );
    step["onFailure"] = json!([http("undo", d.url("/api/step1"))]);
    s.create_workflow(&json!({"name": "late", "deadline": "PT1S", "steps": [
        step, http("after", d.url("/api/step2"))]}))
        .await;
    let id = create_request(&s, "late", &json!({"l": 1})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "FAILED", "{v}");
    assert_eq!(
        v["reason"], "step 'both' failed: the request's deadline passed",
        "{v}"
    );
    assert_eq!(d.received("/api/step1").len(), 1, "onFailure ran once");
    assert!(d.received("/api/step2").is_empty(), "{v}");
    // The calls in flight were dropped; the downstream saw them go.
    wait_for_seen("the dropped calls to be seen", WAIT, || async {
        let f = d.in_flight();
        (f == 0).then_some(()).ok_or(f)
    })
    .await;
    assert_eq!(d.abandoned(), 2);
    s.shutdown().await;
}

/// Inside a lane, `when` and transforms see the request's steps and the branch's own
/// steps before them (a name in the branch hides the same outside); a skipped step passes
/// its request on and makes no call; the console draws each lane step under its branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lane_steps_see_the_outer_context_and_their_own_branch() {
    let db = TestDb::new();
    let d = Downstream::start().await;
    let s = TestServer::start(config(&db.url)).await;
    let mut skipped = http("skipped", d.url("/api/echo"));
    skipped["when"] = json!("order.response.echo.kind == 'none'");
    let mut picked = http("picked", d.url("/api/echo"));
    picked["transform"] = json!(true);
    picked["requestTransform"] =
        json!({"spec": {"kind": "order.response.echo.kind", "mine": "first.response.echo.echo.n"}});
    let mut only = http("only", d.url("/api/echo"));
    only["when"] = json!("order.response.echo.n == 3");
    s.create_workflow(&json!({"name": "ctx", "steps": [
        http("order", d.url("/api/echo")),
        parallel("both", json!([
            {"name": "cond", "steps": [http("first", d.url("/api/echo")), skipped, picked]},
            {"name": "other", "steps": [only]}])),
        http("after", d.url("/api/echo"))]}))
        .await;
    let id = create_request(&s, "ctx", &json!({"kind": "box", "n": 2})).await;
    let v = wait_status(&s, &id, &["COMPLETED", "FAILED"], WAIT).await;
    assert_eq!(v["status"], "COMPLETED", "{v}");
    assert_eq!(
        response_of(&v, "both"),
        json!({"cond": {"echo": {"kind": "box", "mine": 2}},
               // Its condition is false: skipped, with its request passed on.
               "other": {"echo": {"kind": "box", "n": 2}}}),
        "{v}"
    );
    assert_eq!(d.calls_for_key(&key(&id, 2, "cond", 2)), 0, "skipped");
    assert_eq!(d.calls_for_key(&key(&id, 2, "cond", 3)), 1);
    assert_eq!(d.calls_for_key(&key(&id, 2, "other", 1)), 0, "skipped");
    no_children(&db, &id).await;
    let skipped = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["status"] == "SKIPPED")
        .map(|e| (e["branch"].as_str().unwrap(), e["name"].as_str().unwrap()))
        .collect::<Vec<_>>();
    assert_eq!(skipped.len(), 2, "{v}");
    let page = s
        .get(&format!("/console/serviceRequests/{id}"))
        .await
        .text();
    let svg = &page[page.find("<svg").unwrap()..page.find("</svg>").unwrap()];
    for label in [
        "↳ branch cond · 1 · first",
        "↳ branch cond · 3 · picked",
        "↳ branch other · 1 · only",
    ] {
        assert!(svg.contains(&format!(">{label}<")), "no {label} in {svg}");
    }
    s.shutdown().await;
}
